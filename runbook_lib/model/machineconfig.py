"""Machine-config patch arithmetic: what the profile needs *minus* what the node already has.

Why: Talos's strategic merge **appends** lists (``machine.kernel.modules``, ``machine.files``,
``machine.install.extensions``; facts §3), so re-applying the docs' patch duplicates every module and a
second ``op: create`` of the same file fails.  The runbook therefore never applies the profile's patch as
is: it subtracts what the node's current config already contains, and an empty remainder means "nothing
to do".  Pure functions only; the config comes in as parsed documents.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

import yaml

from runbook_lib.errors import PermanentError

Doc = dict[str, Any]


#: libyaml's safe loader where PyYAML has it: the same documents ~25x faster (a 20 KB worker config from
#: ``talosctl gen config``: 0.24 ms against 6.7 ms), which is most of the config-patch step's own CPU on a big
#: fleet (1,000 configs: ~7 s with the pure-Python loader; tests/test_fleet_cpu.py).
_SAFE_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def parse_documents(text: str) -> list[Doc]:
    """A (multi-document) machine config or patch as a list of mappings; empty documents dropped."""
    return [d for d in yaml.load_all(text, Loader=_SAFE_LOADER) if isinstance(d, dict)]


def config_documents(spec: Any) -> list[Doc]:
    """The documents of a ``MachineConfig`` resource spec, whether talosctl gave it as text or a mapping."""
    if isinstance(spec, str):
        return parse_documents(spec)
    if isinstance(spec, dict):
        return [spec]
    if isinstance(spec, list):
        return [d for d in spec if isinstance(d, dict)]
    return []


def _v1alpha1(docs: Iterable[Doc]) -> Doc:
    return next((d for d in docs if "machine" in d or d.get("version") == "v1alpha1"), {})


def _named_doc(docs: Iterable[Doc], kind: str, name: str) -> Doc | None:
    return next((d for d in docs if d.get("kind") == kind and d.get("name") == name), None)


def _get(doc: Doc, *path: str) -> Any:
    node: Any = doc
    for key in path:
        if not isinstance(node, dict):
            return None
        node = node.get(key)
    return node


class FileConflict(ValueError):
    """A ``machine.files`` entry exists at the path with other content: ``op: create`` would fail."""


class UnhandledPatchKey(PermanentError):
    """A wanted patch document has a key :func:`remaining_patch` cannot subtract, which it would drop."""


#: What :func:`remaining_patch` subtracts from a ``machine:`` document, key by key: a mapping's keys, ``None``
#: for any value (each sysctl is compared), a frozenset for a list of entries with these keys.
_SUBTRACTED: Mapping[str, Any] = {
    "machine": {
        "kernel": {"modules": frozenset({"name"})},
        "sysctls": None,
        "files": frozenset({"path", "content", "op"}),
        "install": {"extensions": frozenset({"image"})},
    }
}


def _unhandled_keys(value: Any, spec: Any, path: str) -> list[str]:
    """The dotted paths in ``value`` that ``spec`` (see ``_SUBTRACTED``) does not cover."""
    if isinstance(spec, Mapping) and isinstance(value, dict):
        found: list[str] = []
        for key, sub in value.items():
            where = f"{path}.{key}" if path else str(key)
            found += _unhandled_keys(sub, spec[key], where) if key in spec else [where]
        return found
    if isinstance(spec, frozenset) and isinstance(value, list):
        return [
            f"{path}[{index}].{key}"
            for index, entry in enumerate(value)
            if isinstance(entry, dict)
            for key in entry
            if key not in spec
        ]
    return []


def refuse_unhandled_keys(wanted: list[Doc]) -> None:
    """Raise :class:`UnhandledPatchKey` naming every key of ``wanted`` the subtraction would drop.

    Why: :func:`remaining_patch` builds the patch from the keys it can compare with the node's config, so any
    other key (a typo such as ``modlues``, a module's ``parameters`` compared by name only) would silently be
    left out of what the node gets, and a node lacking only that key would read as already patched. Checked on
    the documents alone, so every node of a fleet is refused alike, before the first is patched. Documents with
    a ``kind`` (``KernelModuleConfig``…) are compared whole, so any key of theirs is carried.
    """
    problems = [
        f"patch document {number} (machine:) has key {key}"
        for number, doc in enumerate(wanted, start=1)
        if not ("kind" in doc and "machine" not in doc)
        for key in _unhandled_keys(doc, _SUBTRACTED, "")
    ]
    if problems:
        raise UnhandledPatchKey(
            "; ".join(problems)
            + ", which the runbook cannot compare with a node's machine config: the patch "
            "would go out without it, so nothing was patched",
            hint="the keys it subtracts are machine.kernel.modules[].name, machine.sysctls, "
            "machine.files[].path/content/op and machine.install.extensions[].image, and whole documents "
            "with a kind; a profile that needs another key needs its subtraction in model/machineconfig.py",
        )


def remaining_patch(wanted: list[Doc], current: list[Doc]) -> list[Doc]:
    """The part of ``wanted`` (profile patch documents) that ``current`` does not contain yet.

    Raises :class:`FileConflict` when a wanted file path already exists with different content, because
    neither appending nor creating it again would give the node the intended configuration; and
    :class:`UnhandledPatchKey` for a key of ``wanted`` it cannot subtract (:func:`refuse_unhandled_keys`).
    """
    refuse_unhandled_keys(wanted)
    base = _v1alpha1(current)
    out: list[Doc] = []
    machine_remaining: Doc = {}  # one v1alpha1 document for all of ``wanted``'s (see :func:`merge_into`)
    for doc in wanted:
        if "kind" in doc and "machine" not in doc:
            existing = _named_doc(current, str(doc["kind"]), str(doc.get("name")))
            if existing is None and _module_in_legacy_form(doc, base):
                continue
            if existing is None or any(existing.get(k) != v for k, v in doc.items()):
                out.append(copy.deepcopy(doc))
            continue
        machine = doc.get("machine") or {}
        remaining: Doc = {}
        modules = _get(machine, "kernel", "modules") or []
        have_modules = {
            m.get("name") for m in (_get(base, "machine", "kernel", "modules") or []) if isinstance(m, dict)
        }
        missing_modules = [m for m in modules if m.get("name") not in have_modules]
        if missing_modules:
            remaining.setdefault("kernel", {})["modules"] = missing_modules
        sysctls = machine.get("sysctls") or {}
        have_sysctls = _get(base, "machine", "sysctls") or {}
        changed = {k: v for k, v in sysctls.items() if str(have_sysctls.get(k)) != str(v)}
        if changed:
            remaining["sysctls"] = changed
        files = machine.get("files") or []
        have_files = {f.get("path"): f for f in (_get(base, "machine", "files") or []) if isinstance(f, dict)}
        new_files = []
        for file in files:
            present = have_files.get(file.get("path"))
            if present is None:
                new_files.append(file)
            elif present.get("content") != file.get("content"):
                raise FileConflict(
                    f"{file.get('path')} already exists in the machine config with other content; "
                    "merge the NVIDIA default-runtime lines into it by hand (a second `op: create` fails)"
                )
        if new_files:
            remaining["files"] = new_files
        images = _get(machine, "install", "extensions") or []
        have_images = {
            e.get("image")
            for e in (_get(base, "machine", "install", "extensions") or [])
            if isinstance(e, dict)
        }
        missing_images = [e for e in images if e.get("image") not in have_images]
        if missing_images:
            remaining["install"] = {"extensions": missing_images}
        if remaining:
            if not machine_remaining:
                out.append({"machine": machine_remaining})
            merge_into(machine_remaining, remaining)
    return out


def _module_in_legacy_form(doc: Doc, base: Doc) -> bool:
    """A ``KernelModuleConfig`` that names a module and nothing more is met by the same module in
    ``machine.kernel.modules``: Talos 1.14 loads both forms, merged (talos@v1.14.0-rc.1
    pkg/machinery/config/container/container.go:355-372), and a node patched before it ran 1.14 has the older one
    (``GpuProfile.machine_config_patch_documents``'s ``legacy_modules``)."""
    if doc.get("kind") != "KernelModuleConfig" or not set(doc) <= {"apiVersion", "kind", "name"}:
        return False
    legacy = _get(base, "machine", "kernel", "modules") or []
    return any(isinstance(m, dict) and m.get("name") == doc.get("name") for m in legacy)


def merge_into(target: Doc, more: Mapping[str, Any]) -> None:
    """Deep-merge ``more`` into ``target``: mappings key by key, lists joined, other values replaced (copied).

    Why one document: talosctl loads a patch file with the config decoder, which refuses a second v1alpha1
    document ("duplicate document /v1alpha1/ is not allowed", talos@v1.12.0
    pkg/machinery/config/configloader/internal/decoder/decoder.go:108-109), so every ``machine:`` part of a
    patch (the modules, the default-runtime file, a rollback's deletes) is merged into one.
    """
    for key, value in more.items():
        present = target.get(key)
        if isinstance(present, dict) and isinstance(value, dict):
            merge_into(present, value)
        elif isinstance(present, list) and isinstance(value, list):
            present.extend(copy.deepcopy(value))
        else:
            target[key] = copy.deepcopy(value)


def contains(current: list[Doc], wanted: list[Doc]) -> bool:
    """True when the node's config already holds everything in ``wanted`` (so the step is done)."""
    try:
        return not remaining_patch(wanted, current)
    except FileConflict:
        return False


def duplicate_modules(current: list[Doc]) -> list[str]:
    """Modules listed more than once: the tell-tale of a patch applied twice by hand."""
    names = [
        m.get("name")
        for m in (_get(_v1alpha1(current), "machine", "kernel", "modules") or [])
        if isinstance(m, dict)
    ]
    return sorted({n for n in names if n and names.count(n) > 1})


def configured_modules(current: list[Doc]) -> set[str]:
    """Kernel modules the config asks Talos to load (``machine.kernel.modules`` or ``KernelModuleConfig``)."""
    names = {
        str(m.get("name"))
        for m in (_get(_v1alpha1(current), "machine", "kernel", "modules") or [])
        if isinstance(m, dict)
    }
    names |= {str(d.get("name")) for d in current if d.get("kind") == "KernelModuleConfig"}
    return names
