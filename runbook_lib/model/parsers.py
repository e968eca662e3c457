"""Parsers for the text a Talos GPU node gives back: pure functions, text in, typed values out.

Why one module: the verify step reads these outputs through ``talosctl``/``kubectl`` and ``runbook diagnose``
reads the same outputs pasted by hand into a ticket, so both must agree on what a line means.  Each parser
accepts every form the real tools print (facts §3 and §6 of ``talos-nvidia.md``):

* ``/proc/modules`` (and ``lsmod``, which people paste just as often);
* ``/proc/driver/nvidia/version`` in the open (``NVIDIA UNIX Open Kernel Module for x86_64``) and the
  proprietary (``NVIDIA UNIX x86_64 Kernel Module``) format: the flavour is what tells a nonfree/open mix-up;
* ``talosctl get extensions|modules|services`` as a table, a ``---``-separated YAML stream or a stream of
  4-space-indented JSON objects (not an array), old ``000.ghcr.io-…`` IDs and factory ``0``/``1`` IDs
  alike (so extensions are keyed on their manifest name, never on their ID);
* ``nvidia-smi`` (the 79-column header of older drivers and the wide one of recent ones, several GPUs,
  the MIG table), ``nvidia-smi -L`` and ``nvidia-smi --query-gpu=… --format=csv[,noheader][,nounits]``.

Unparseable input raises :class:`OutputParseError` naming what was expected, because a half-parsed
support paste that silently reports "no modules" would send the user after the wrong fix.
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import yaml

from runbook_lib.errors import PermanentError

from . import safeload

DriverFlavor = Literal["open", "proprietary"]

#: The kernel modules the NVIDIA stack needs loaded (facts §1.3, Talos CI check 1).
NVIDIA_MODULES: tuple[str, ...] = ("nvidia", "nvidia_uvm", "nvidia_drm", "nvidia_modeset")


class OutputParseError(PermanentError):
    """The text is not the output it was said to be (or is truncated beyond use)."""


# --------------------------------------------------------------------------------------------------------------
# /proc/modules


@dataclass(frozen=True)
class KernelModule:
    """One loaded module, from ``/proc/modules``, ``lsmod`` or ``talosctl get modules``."""

    name: str
    state: str
    """``Live``, ``Loading`` or ``Unloading`` (``lsmod`` and ``talosctl`` tables without a state say ``Live``)."""
    size: int | None = None
    refcount: int | None = None
    dependents: tuple[str, ...] = ()
    taints: str = ""
    """Taint letters, e.g. ``PO``; informational only (facts §6: the OSS flags are uncertain)."""
    node: str | None = None


_PROC_MODULES_RE = re.compile(
    r"^(?P<name>\S+)\s+(?P<size>\d+)\s+(?P<ref>-?\d+|-)\s+(?P<deps>\S+)\s+(?P<state>Live|Loading|Unloading)"
    # the flags: taint letters, then "+" while loading or "-" while unloading (linux kernel/module/main.c
    # module_flags, no tag checked): "(O+)", or "(+)" for an untainted module being loaded
    r"(?:\s+(?P<addr>0x[0-9a-fA-F]+))?(?:\s+\((?P<taints>[A-Z]*)[+-]?\))?\s*$"
)
_LSMOD_RE = re.compile(r"^(?P<name>\S+)\s+(?P<size>\d+)\s+(?P<ref>\d+)(?:\s+(?P<deps>\S+))?\s*$")


def parse_proc_modules(text: str) -> dict[str, KernelModule]:
    """Parse ``/proc/modules`` (``talosctl read /proc/modules``) or ``lsmod`` into modules by name.

    Format (proc(5)): name, size, reference count, dependent modules (``-`` or ``a,b,``), state, load
    address, optional taint flags such as ``(PO)``.  Empty input is a valid "nothing loaded".
    """
    modules: dict[str, KernelModule] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or (line.startswith("Module ") and "Used by" in line):
            continue
        match = _PROC_MODULES_RE.match(line)
        if match:
            deps = tuple(d for d in match["deps"].split(",") if d and d != "-")
            ref = match["ref"]
            modules[match["name"]] = KernelModule(
                name=match["name"],
                state=match["state"],
                size=int(match["size"]),
                refcount=int(ref) if ref not in ("-", "") else None,
                dependents=deps,
                taints=match["taints"] or "",
            )
            continue
        lsmod = _LSMOD_RE.match(line)
        if lsmod:
            deps = tuple(d for d in (lsmod["deps"] or "").split(",") if d)
            modules[lsmod["name"]] = KernelModule(
                name=lsmod["name"],
                state="Live",
                size=int(lsmod["size"]),
                refcount=int(lsmod["ref"]),
                dependents=deps,
            )
            continue
        raise OutputParseError(
            f"line {number} is not a /proc/modules line: {line[:80]!r}",
            hint="expected e.g. 'nvidia_uvm 1146880 - - Live 0xffffffffc2733000 (PO)' "
            "(the output of `talosctl read /proc/modules`)",
        )
    return modules


# --------------------------------------------------------------------------------------------------------------
# /proc/driver/nvidia/version


@dataclass(frozen=True)
class DriverInfo:
    """What the loaded ``nvidia`` kernel module says about itself."""

    version: str
    flavor: DriverFlavor
    """``open`` for the open GPU kernel modules, ``proprietary`` for the nonfree ones."""
    arch: str | None = None
    gcc_version: str | None = None


_OPEN_RE = re.compile(r"NVIDIA UNIX Open Kernel Module for (?P<arch>\S+)\s+(?P<version>\d+\.\d+(?:\.\d+)?)")
_PROPRIETARY_RE = re.compile(
    r"NVIDIA UNIX (?:(?P<arch>\S+) )?Kernel Module\s+(?P<version>\d+\.\d+(?:\.\d+)?)"
)
_GCC_RE = re.compile(r"GCC version:\s+gcc version (?P<gcc>\S+)")


def parse_driver_version(text: str) -> DriverInfo:
    """Parse ``/proc/driver/nvidia/version`` (or the matching ``NVRM: loading …`` dmesg line).

    Open modules print ``NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build …``;
    proprietary ones ``NVIDIA UNIX x86_64 Kernel Module  510.60.02  Wed Mar 16 …`` (facts §6).
    """
    match = _OPEN_RE.search(text)
    flavor: DriverFlavor = "open"
    if not match:
        match = _PROPRIETARY_RE.search(text)
        flavor = "proprietary"
    if not match:
        first = text.strip().splitlines()[0][:80] if text.strip() else ""
        raise OutputParseError(
            f"no NVRM version line found (got {first!r})" if first else "the driver version file is empty",
            hint="expected the content of /proc/driver/nvidia/version, e.g. 'NVRM version: NVIDIA UNIX Open "
            "Kernel Module for x86_64  580.95.05  Release Build …'; an absent file means the nvidia "
            "module is not loaded",
        )
    gcc = _GCC_RE.search(text)
    return DriverInfo(
        version=match["version"],
        flavor=flavor,
        arch=match["arch"],
        gcc_version=gcc["gcc"] if gcc else None,
    )


# --------------------------------------------------------------------------------------------------------------
# talosctl get <resource> (table, YAML stream, JSON stream)


@dataclass(frozen=True)
class TalosResource:
    """One resource from ``talosctl get``, whatever the output format was.

    Tables carry only the print columns, YAML/JSON the whole spec; the typed parsers below read either.
    """

    node: str | None
    namespace: str
    type: str
    id: str
    version: str
    columns: Mapping[str, str] = field(default_factory=dict)
    """Print columns after the standard five (table output only), e.g. ``NAME``/``VERSION`` for extensions."""
    spec: Mapping[str, Any] | None = None
    """The resource spec (YAML/JSON output only)."""
    spec_text: str | None = None
    """The spec when talosctl prints it as text (``MachineConfig``: the config YAML as one string)."""


_STANDARD_COLUMNS = ("NODE", "NAMESPACE", "TYPE", "ID", "VERSION")
_NOISE_RE = re.compile(r"^(WARNING:|\d+ errors? occurred:|\*\s|error )")


def _detect_format(text: str) -> Literal["json", "yaml", "table"]:
    stripped = text.lstrip()
    if stripped.startswith(("{", "[")):
        return "json"
    for line in text.splitlines():
        if not line.strip() or _NOISE_RE.match(line.strip()):
            continue
        head = line.strip()
        if head == "---" or head.startswith(("node:", "metadata:", "spec:")):
            return "yaml"
        return "table"
    return "table"


def _json_stream(text: str) -> Iterator[Any]:
    """Decode concatenated JSON values: ``talosctl -o json`` prints one object per resource, not an array."""
    decoder = json.JSONDecoder()
    index, end = 0, len(text)
    while True:
        while index < end and text[index].isspace():
            index += 1
        if index >= end:
            return
        try:
            value, index = decoder.raw_decode(text, index)
        except json.JSONDecodeError as exc:
            raise OutputParseError(
                f"invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}",
                hint="paste the complete output of `talosctl get … -o json`",
            ) from exc
        if isinstance(value, list):  # tolerate an array, e.g. after `jq -s`
            yield from value
        else:
            yield value


def _resource_from_doc(doc: Any) -> TalosResource:
    if not isinstance(doc, dict) or not isinstance(doc.get("metadata"), dict):
        raise OutputParseError(
            "a document has no 'metadata' mapping, so it is not a talosctl resource",
            hint="expected the output of `talosctl get <type> -o yaml` or `-o json`",
        )
    meta = doc["metadata"]
    spec = doc.get("spec")
    node = doc.get("node")
    if spec is not None and not isinstance(spec, dict | str):
        raise OutputParseError(
            f"resource {meta.get('id')!r}: 'spec' is a {type(spec).__name__}, not a mapping",
            hint="paste the complete, unedited output of `talosctl get <type> -o yaml` or `-o json`",
        )
    return TalosResource(
        node=str(node) if node not in (None, "") else None,
        namespace=str(meta.get("namespace", "")),
        type=str(meta.get("type", "")),
        id=str(meta.get("id", "")),
        version=str(meta.get("version", "")),
        spec=spec if isinstance(spec, dict) else {},
        spec_text=spec if isinstance(spec, str) else None,
    )


def _header_columns(header: str) -> list[tuple[str, int]]:
    """Column names and start offsets; names may hold one space (``HEALTH UNKNOWN``), gaps hold two or more."""
    return [(m.group(0), m.start()) for m in re.finditer(r"\S+(?: \S+)*", header)]


def _split_row(row: str, columns: list[tuple[str, int]]) -> list[str]:
    """Cut a row at the header's column offsets (tabwriter alignment); fall back to whitespace splitting.

    Offsets keep empty cells in place; the fallback accepts pastes whose alignment got lost.
    """
    starts = [start for _, start in columns]
    aligned = all(start == 0 or start >= len(row) or row[start - 1] == " " for start in starts)
    if aligned:
        cells = []
        for i, start in enumerate(starts):
            stop = starts[i + 1] if i + 1 < len(starts) else None
            cells.append(row[start:stop].strip())
        if all(" " not in cell for cell in cells) or len(row.split()) != len(columns):
            return cells
    parts = row.split()
    if len(parts) == len(columns):
        return parts
    raise OutputParseError(
        f"table row does not fit the header's {len(columns)} columns: {row.strip()[:100]!r}",
        hint="paste the table exactly as talosctl printed it, or use `-o yaml`",
    )


def _parse_table(text: str) -> list[TalosResource]:
    lines = [line.rstrip() for line in text.splitlines()]
    header_index = next(
        (i for i, line in enumerate(lines) if line.lstrip().startswith(("NODE ", "NAMESPACE "))), None
    )
    if header_index is None:
        if not any(line.strip() and not _NOISE_RE.match(line.strip()) for line in lines):
            return []
        raise OutputParseError(
            "no talosctl table header (NODE  NAMESPACE  TYPE  ID  VERSION …) found",
            hint="paste the output of `talosctl get <type>` including its header line",
        )
    header = lines[header_index]
    indent = len(header) - len(header.lstrip())
    columns = _header_columns(header[indent:])
    names = [name for name, _ in columns]
    has_node = names[0] == "NODE"
    standard = list(_STANDARD_COLUMNS if has_node else _STANDARD_COLUMNS[1:])
    if names[: len(standard)] != standard:
        raise OutputParseError(
            f"unexpected table header {header.strip()!r}",
            hint="expected the columns NODE NAMESPACE TYPE ID VERSION followed by the resource's own columns",
        )
    extra = names[len(standard) :]
    resources: list[TalosResource] = []
    for line in lines[header_index + 1 :]:
        row = line[indent:] if line[:indent].strip() == "" else line
        if not row.strip() or _NOISE_RE.match(row.strip()):
            continue
        if row.strip() == header.strip():  # a second header, e.g. two pastes concatenated
            continue
        cells = _split_row(row, columns)
        values = dict(zip(standard, cells[: len(standard)], strict=True))
        resources.append(
            TalosResource(
                node=(values.get("NODE") or None),
                namespace=values["NAMESPACE"],
                type=values["TYPE"],
                id=values["ID"],
                version=values["VERSION"],
                columns=dict(zip(extra, cells[len(standard) :], strict=True)),
            )
        )
    return resources


def parse_talosctl_get(text: str) -> list[TalosResource]:
    """Parse any ``talosctl get <type>`` output (table, ``-o yaml`` or ``-o json``) into resources."""
    fmt = _detect_format(text)
    if fmt == "json":
        return [_resource_from_doc(doc) for doc in _json_stream(text)]
    if fmt == "yaml":
        try:
            docs = [doc for doc in safeload.load_all(text) if doc is not None]
        except yaml.YAMLError as exc:
            raise OutputParseError(
                f"invalid YAML: {exc}", hint="paste the complete output of `talosctl get … -o yaml`"
            ) from exc
        return [_resource_from_doc(doc) for doc in docs]
    return _parse_table(text)


def _require_type(resources: Iterable[TalosResource], wanted: tuple[str, ...], what: str) -> None:
    for res in resources:
        kind = res.type.split(".")[0]
        if kind and kind not in wanted:
            raise OutputParseError(
                f"this is `talosctl get` output for {res.type}, not for {what}",
                hint=f"collect it with `talosctl -n <node> get {what}`",
            )


# --- extensions ---


@dataclass(frozen=True)
class Extension:
    """An installed system extension, keyed on its manifest name (IDs differ between installs)."""

    name: str
    version: str
    id: str = ""
    node: str | None = None
    image: str | None = None
    author: str | None = None
    description: str | None = None

    @property
    def is_schematic(self) -> bool:
        """The factory's pseudo-extension whose version is the node's schematic ID (facts §2.1)."""
        return self.name == "schematic"


def parse_extensions(text: str) -> list[Extension]:
    """Parse ``talosctl get extensions`` (any output format) into extensions, in output order."""
    resources = parse_talosctl_get(text)
    _require_type(resources, ("ExtensionStatus", "ExtensionStatuses"), "extensions")
    return extensions_from_resources(resources)


def extensions_from_resources(resources: Iterable[TalosResource]) -> list[Extension]:
    """Extensions from already-parsed resources (e.g. one node's share of a fan-out call)."""
    result: list[Extension] = []
    for res in resources:
        if res.spec is not None:
            meta = _extension_metadata(res)
            result.append(
                Extension(
                    name=meta["name"],
                    version=meta["version"],
                    id=res.id,
                    node=res.node,
                    image=str(res.spec["image"]) if res.spec.get("image") else None,
                    author=str(meta["author"]) if meta.get("author") else None,
                    description=str(meta["description"]).strip() if meta.get("description") else None,
                )
            )
        else:
            result.append(
                Extension(
                    name=res.columns.get("NAME", ""),
                    version=res.columns.get("VERSION", ""),
                    id=res.id,
                    node=res.node,
                )
            )
    return result


def _typed_spec(res: TalosResource, what: str, types: Mapping[str, type]) -> Mapping[str, Any]:
    """The spec of a ``what`` resource, refused when it is text or a field has another type than talosctl
    prints (``state: [Live]``, ``running: [true]``): a guess from such a document would be a wrong diagnosis."""
    spec = res.spec if res.spec is not None and res.spec_text is None else None
    bad = [
        key
        for key, kind in types.items()
        if spec is not None and spec.get(key) is not None and not isinstance(spec[key], kind)
    ]
    if spec is None or bad:
        problem = "'spec' is text" if spec is None else f"spec.{bad[0]} is not a {types[bad[0]].__name__}"
        raise OutputParseError(
            f"{what} {res.id!r}: {problem}, so it is not a resource as talosctl prints it",
            hint=f"paste the complete, unedited output of `talosctl -n <node> get {what}s -o yaml`",
        )
    return spec


def _extension_metadata(res: TalosResource) -> Mapping[str, Any]:
    """``spec.metadata`` of an ExtensionStatus, whose ``name`` and ``version`` must be text.

    talosctl prints them as strings (quoted when they look like numbers), so ``name: 123`` or ``spec: hello``
    is an edited or foreign document; listing it as extension ``123`` would make every check below wrong.
    """
    meta = res.spec.get("metadata") if res.spec is not None and res.spec_text is None else None
    name = meta.get("name") if isinstance(meta, dict) else None
    version = meta.get("version") if isinstance(meta, dict) else None
    if not isinstance(meta, dict) or not isinstance(name, str) or not name or not isinstance(version, str):
        got = f"name {type(name).__name__}, version {type(version).__name__}"
        raise OutputParseError(
            f"extension {res.id!r}: spec.metadata needs a text name and version ({got}), so it is not "
            "an ExtensionStatus as talosctl prints it",
            hint="paste the complete, unedited output of `talosctl -n <node> get extensions -o yaml`",
        )
    return meta


def extension_versions(extensions: Iterable[Extension], *, include_schematic: bool = False) -> dict[str, str]:
    """Extension name → version (``siderolabs/`` prefixes dropped), the shape checks and reports use."""
    return {
        ext.name.removeprefix("siderolabs/"): ext.version
        for ext in extensions
        if include_schematic or not ext.is_schematic
    }


def schematic_id(extensions: Iterable[Extension]) -> str | None:
    """The node's schematic ID, from the ``schematic`` pseudo-extension (``None`` on non-factory installs)."""
    return next((ext.version for ext in extensions if ext.is_schematic), None)


# --- modules ---


def talosctl_nodes(text: str) -> list[str]:
    """The nodes a ``talosctl get`` output covers, in order of appearance (empty for non-talosctl text)."""
    if _detect_format(text) == "table" and not text.lstrip().startswith(("NODE ", "NAMESPACE ")):
        return []
    return list(dict.fromkeys(res.node for res in parse_talosctl_get(text) if res.node))


def _for_node(resources: list[TalosResource], node: str | None) -> list[TalosResource]:
    return resources if node is None else [res for res in resources if res.node in (node, None)]


def parse_talos_modules(text: str, node: str | None = None) -> dict[str, KernelModule]:
    """Parse ``talosctl get modules`` (``LoadedKernelModule``; 1.14's ``KernelModuleStatus``) by module name.

    The ID is the module name; the state is the ``STATE`` print column or ``spec.state``.  Pass ``node``
    when the output covers several nodes, or the last node's row wins.
    """
    resources = _for_node(parse_talosctl_get(text), node)
    _require_type(
        resources,
        ("LoadedKernelModule", "LoadedKernelModules", "KernelModuleStatus", "KernelModuleStatuses"),
        "modules",
    )
    return modules_from_resources(resources)


def modules_from_resources(resources: Iterable[TalosResource]) -> dict[str, KernelModule]:
    """Loaded modules by name from already-parsed ``LoadedKernelModule``/``KernelModuleStatus`` resources."""
    modules: dict[str, KernelModule] = {}
    for res in resources:
        if res.spec is not None:
            spec = _typed_spec(res, "module", {"name": str, "state": str, "dependencies": list})
            name = str(spec.get("name") or res.id)
            ref = spec.get("referenceCount", spec.get("instances"))
            deps = spec.get("dependencies") or []
            modules[name] = KernelModule(
                name=name,
                state=str(spec.get("state", "")),
                size=int(spec["size"]) if isinstance(spec.get("size"), int) else None,
                refcount=int(ref) if isinstance(ref, int) else None,
                dependents=tuple(str(d) for d in deps),
                node=res.node,
            )
        else:
            modules[res.id] = KernelModule(name=res.id, state=res.columns.get("STATE", ""), node=res.node)
    return modules


def is_talosctl_output(text: str) -> bool:
    """True for ``talosctl get`` output in any format (as opposed to a raw ``/proc`` file)."""
    return text.lstrip().startswith(("NODE ", "NAMESPACE ", "{", "node:", "metadata:", "---"))


def parse_modules(text: str, node: str | None = None) -> dict[str, KernelModule]:
    """Parse loaded modules from ``/proc/modules``, ``lsmod`` or ``talosctl get modules``, whichever it is."""
    if is_talosctl_output(text):
        return parse_talos_modules(text, node)
    return parse_proc_modules(text)


# --- services ---


@dataclass(frozen=True)
class ServiceStatus:
    """A Talos service as ``talosctl get services`` or ``talosctl services`` shows it."""

    id: str
    running: bool | None = None
    healthy: bool | None = None
    health_unknown: bool | None = None
    state: str | None = None
    """``Running``/``Finished``/``Waiting``/… (``talosctl services`` only; the resource has booleans)."""
    node: str | None = None

    @property
    def up(self) -> bool:
        """Running, or finished for one-shot services such as ``ext-nvidia-cdi-gen``."""
        if self.state is not None:
            return self.state in ("Running", "Finished")
        return bool(self.running)


def _as_bool(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    return None


def parse_services(text: str, node: str | None = None) -> dict[str, ServiceStatus]:
    """Parse ``talosctl get services`` (any format) or the ``talosctl services`` table, by service ID."""
    stripped = text.lstrip()
    if stripped.startswith("NODE") and re.match(r"NODE\s+SERVICE\s+STATE", stripped):
        return {svc.id: svc for svc in _parse_services_command(stripped) if node is None or svc.node == node}
    resources = _for_node(parse_talosctl_get(text), node)
    _require_type(resources, ("Service", "Services"), "services")
    return services_from_resources(resources)


def parse_services_by_node(text: str) -> dict[str, dict[str, ServiceStatus]]:
    """``talosctl services`` over several nodes: services by ID, per node (the NODE column).

    The list comes from the ServiceList API, which shows every state (Finished one-shots included),
    unlike the ``Service`` resource of ``talosctl get services``.
    """
    out: dict[str, dict[str, ServiceStatus]] = {}
    if not text.strip():
        return out
    for svc in _parse_services_command(text.lstrip()):
        out.setdefault(svc.node or "", {})[svc.id] = svc
    return out


def services_from_resources(resources: Iterable[TalosResource]) -> dict[str, ServiceStatus]:
    """Services by ID from already-parsed ``Service`` resources."""
    services: dict[str, ServiceStatus] = {}
    for res in resources:
        src: Mapping[str, Any] = (
            _typed_spec(res, "service", {"running": bool, "healthy": bool, "unknown": bool})
            if res.spec is not None
            else {}
        )
        if res.spec is None:
            src = {
                "running": res.columns.get("RUNNING"),
                "healthy": res.columns.get("HEALTHY"),
                "unknown": res.columns.get("HEALTH UNKNOWN"),
            }
        services[res.id] = ServiceStatus(
            id=res.id,
            running=_as_bool(src.get("running")),
            healthy=_as_bool(src.get("healthy")),
            health_unknown=_as_bool(src.get("unknown")),
            node=res.node,
        )
    return services


def _parse_services_command(text: str) -> list[ServiceStatus]:
    lines = text.splitlines()
    columns = _header_columns(lines[0])
    services: list[ServiceStatus] = []
    for line in lines[1:]:
        if not line.strip() or _NOISE_RE.match(line.strip()):
            continue
        parts = line.split()
        if len(parts) < 3:
            raise OutputParseError(f"not a `talosctl services` row: {line.strip()[:80]!r}")
        node, service, state = parts[0], parts[1], parts[2]
        health = parts[3] if len(parts) > 3 and len(columns) > 3 else None
        services.append(
            ServiceStatus(
                id=service,
                running=state == "Running",
                healthy=True if health == "OK" else (False if health == "Fail" else None),
                health_unknown=health == "?" if health else None,
                state=state,
                node=node,
            )
        )
    return services


# --------------------------------------------------------------------------------------------------------------
# nvidia-smi


@dataclass(frozen=True)
class Gpu:
    """One physical GPU as nvidia-smi lists it."""

    index: int | None
    name: str
    """As printed; the table view truncates long names (``NVIDIA A100-SXM...``), ``-L`` and CSV do not."""
    bus_id: str | None = None
    memory_mib: int | None = None
    """Total memory."""
    uuid: str | None = None
    mig_mode: str | None = None
    """``Enabled``/``Disabled``/``N/A`` from the table's ``MIG M.`` cell."""


@dataclass(frozen=True)
class MigDevice:
    """One MIG instance (the table's ``MIG devices:`` block or a ``-L`` ``MIG …`` line)."""

    gpu_index: int
    gpu_instance: int | None = None
    compute_instance: int | None = None
    device_index: int | None = None
    memory_mib: int | None = None
    profile: str | None = None
    uuid: str | None = None


@dataclass(frozen=True)
class NvidiaSmi:
    """Everything one nvidia-smi output says; fields its form does not carry stay ``None``/empty."""

    gpus: tuple[Gpu, ...] = ()
    driver_version: str | None = None
    cuda_version: str | None = None
    smi_version: str | None = None
    mig_devices: tuple[MigDevice, ...] = ()
    error: str | None = None
    """nvidia-smi's own failure message (e.g. ``Failed to initialize NVML: Driver/library version mismatch``)."""
    source: Literal["table", "list", "csv", "error"] = "table"


_SMI_ERRORS = (
    re.compile(r"NVIDIA-SMI has failed because.*", re.IGNORECASE),
    re.compile(r"Failed to initialize NVML:.*"),
    re.compile(r"No devices were found"),
    re.compile(r"(?:exec: )?\"?nvidia-smi\"?:? executable file not found in \$PATH.*"),
    re.compile(r"nvidia-smi: (?:command )?not found"),
)
_HEADER_RE = re.compile(
    r"NVIDIA-SMI\s+(?P<smi>\S+)\s+Driver Version:\s+(?P<driver>\S+)(?:\s+CUDA Version:\s+(?P<cuda>[\d.]+|N/A))?"
)
_BUS_ID_RE = re.compile(r"^(?P<bus>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\b")
_GPU_CELL_RE = re.compile(r"^(?P<index>\d+)\s+(?P<name>.+?)\s+(?:On|Off)$")
_MEM_RE = re.compile(r"(?P<used>\d+)\s*MiB\s*/\s*(?P<total>\d+)\s*MiB")
_MIG_ROW_RE = re.compile(r"^(?P<gpu>\d+)\s+(?P<gi>\d+)\s+(?P<ci>\d+)\s+(?P<dev>\d+)$")
_L_GPU_RE = re.compile(r"^GPU (?P<index>\d+): (?P<name>.+?)(?: \(UUID: (?P<uuid>[^)]+)\))?$")
_L_MIG_RE = re.compile(r"^MIG (?P<profile>\S+)\s+Device\s+(?P<dev>\d+): \(UUID: (?P<uuid>[^)]+)\)$")


def parse_nvidia_smi(text: str) -> NvidiaSmi:
    """Parse nvidia-smi output in whichever form it is: the default table, ``-L``, or ``--query-gpu`` CSV.

    A failure message from nvidia-smi itself (no driver, NVML mismatch, binary missing in the pod) is
    returned in :attr:`NvidiaSmi.error` rather than raised: it is evidence the diagnosis table matches on.
    """
    stripped = text.strip()
    if not stripped:
        raise OutputParseError("the nvidia-smi output is empty", hint="paste what `nvidia-smi` printed")
    if "NVIDIA-SMI" in stripped and "Driver Version" in stripped:
        return _parse_smi_table(stripped)
    for pattern in _SMI_ERRORS:
        match = pattern.search(stripped)
        if match:
            return NvidiaSmi(error=match.group(0).strip(), source="error")
    first = stripped.splitlines()[0].strip()
    if _L_GPU_RE.match(first):
        return parse_nvidia_smi_list(stripped)
    first_field = re.sub(r"\s*\[.*\]$", "", first)
    if "," in first or first_field in _FIELD_ALIASES or _DRIVER_VALUE_RE.match(first):
        return parse_query_gpu_csv(stripped)
    raise OutputParseError(
        f"not nvidia-smi output: {first[:80]!r}",
        hint="paste the output of `nvidia-smi`, `nvidia-smi -L` or `nvidia-smi --query-gpu=… --format=csv`",
    )


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def _parse_smi_table(text: str) -> NvidiaSmi:
    header = _HEADER_RE.search(text)
    if not header:
        raise OutputParseError("nvidia-smi table without its 'NVIDIA-SMI … Driver Version:' header line")
    cuda = header["cuda"] if header["cuda"] and header["cuda"] != "N/A" else None
    table = _SmiTable()
    for line in text.splitlines():
        table.read(line)
    table.flush()
    return NvidiaSmi(
        gpus=tuple(table.gpus),
        driver_version=header["driver"],
        cuda_version=cuda,
        smi_version=header["smi"],
        mig_devices=tuple(table.migs),
        source="table",
    )


@dataclass
class _SmiTable:
    """The nvidia-smi table read line by line: the section a line is in (GPUs, MIG devices, processes) and the
    GPU block being read. A GPU block is three lines: index/name/bus-id, fan/power/memory, then the MIG-mode
    cell; a block is complete at its third line or at the border after its second (tables without MIG mode)."""

    gpus: list[Gpu] = field(default_factory=list)
    migs: list[MigDevice] = field(default_factory=list)
    section: Literal["gpus", "mig", "processes"] = "gpus"
    pending: dict[str, Any] | None = None
    pending_line: int = 0

    def flush(self) -> None:
        if self.pending is not None:
            self.gpus.append(Gpu(**self.pending))
            self.pending = None

    def read(self, line: str) -> None:
        body = line.strip()
        if "MIG devices:" in body:
            self.flush()
            self.section = "mig"
            return
        if body.startswith("| Processes") or "Processes:" in body:
            self.flush()
            self.section = "processes"
            return
        if not body.startswith("|") or set(body) <= set("|+-=: "):
            if body.startswith("+") and self.pending is not None and self.pending_line >= 2:
                self.flush()
            return
        cells = _cells(body)
        if self.section == "gpus":
            self._gpu_line(cells)
        elif self.section == "mig" and len(cells) >= 2:
            self._mig_line(cells)

    def _gpu_line(self, cells: list[str]) -> None:
        if len(cells) >= 2:
            gpu_cell = _GPU_CELL_RE.match(cells[0])
            bus = _BUS_ID_RE.match(cells[1])
            if gpu_cell and bus:
                self.flush()
                self.pending = {
                    "index": int(gpu_cell["index"]),
                    "name": gpu_cell["name"],
                    "bus_id": bus["bus"],
                }
                self.pending_line = 1
                return
        if self.pending is None:
            return
        if self.pending_line == 1 and len(cells) >= 2:
            memory = _MEM_RE.search(cells[1])
            if memory:
                self.pending["memory_mib"] = int(memory["total"])
            self.pending_line = 2
        elif self.pending_line == 2 and len(cells) >= 3:
            last = cells[-1].split()
            if last and last[-1] in ("Enabled", "Disabled", "N/A"):
                self.pending["mig_mode"] = last[-1]
            self.pending_line = 3
            self.flush()

    def _mig_line(self, cells: list[str]) -> None:
        row = _MIG_ROW_RE.match(cells[0])
        if row is None:
            return
        memory = _MEM_RE.search(cells[1])
        self.migs.append(
            MigDevice(
                gpu_index=int(row["gpu"]),
                gpu_instance=int(row["gi"]),
                compute_instance=int(row["ci"]),
                device_index=int(row["dev"]),
                memory_mib=int(memory["total"]) if memory else None,
            )
        )


def parse_nvidia_smi_list(text: str) -> NvidiaSmi:
    """Parse ``nvidia-smi -L``: ``GPU 0: <name> (UUID: GPU-…)`` lines, each followed by its MIG lines."""
    gpus: list[Gpu] = []
    migs: list[MigDevice] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        gpu = _L_GPU_RE.match(line)
        if gpu:
            gpus.append(Gpu(index=int(gpu["index"]), name=gpu["name"], uuid=gpu["uuid"]))
            continue
        mig = _L_MIG_RE.match(line)
        if mig and gpus:
            migs.append(
                MigDevice(
                    gpu_index=gpus[-1].index or 0,
                    device_index=int(mig["dev"]),
                    profile=mig["profile"],
                    uuid=mig["uuid"],
                )
            )
            continue
        raise OutputParseError(
            f"line {number} is not an `nvidia-smi -L` line: {line[:80]!r}",
            hint="expected 'GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-…)'",
        )
    return NvidiaSmi(gpus=tuple(gpus), mig_devices=tuple(migs), source="list")


_FIELD_ALIASES = {
    "name": "name",
    "gpu_name": "name",
    "index": "index",
    "uuid": "uuid",
    "gpu_uuid": "uuid",
    "pci.bus_id": "bus_id",
    "gpu_bus_id": "bus_id",
    "memory.total": "memory",
    "driver_version": "driver",
    "mig.mode.current": "mig_mode",
}
_DRIVER_VALUE_RE = re.compile(r"^\d{3}\.\d+(?:\.\d+)?$")
_MIB_VALUE_RE = re.compile(r"^(?P<n>\d+)(?:\s*MiB)?$")


def _guess_field(value: str) -> str:
    """Name a headerless CSV value by its shape (``--format=csv,noheader`` drops the field names)."""
    if _DRIVER_VALUE_RE.match(value):
        return "driver"
    if _BUS_ID_RE.match(value):
        return "bus_id"
    if value.startswith(("GPU-", "MIG-")):
        return "uuid"
    if re.fullmatch(r"\d+\s*MiB", value):
        return "memory"
    if value.isdigit():
        return "index"
    if value in ("Enabled", "Disabled", "[N/A]", "N/A"):
        return "mig_mode"
    return "name"


def parse_query_gpu_csv(text: str, fields: Iterable[str] | None = None) -> NvidiaSmi:
    """Parse ``nvidia-smi --query-gpu=<fields> --format=csv[,noheader][,nounits]``.

    With a header the field names come from it (``memory.total [MiB]``); with ``noheader`` pass the
    ``fields`` you queried, or each value is named by its shape (driver version, bus ID, UUID, MiB, name).
    """
    rows = [row for row in csv.reader(text.strip().splitlines(), skipinitialspace=True) if row]
    if not rows:
        raise OutputParseError("the nvidia-smi CSV output is empty")
    names: list[str] | None = None
    if fields is not None:
        names = [f.strip() for f in fields]
    elif any(re.sub(r"\s*\[.*\]$", "", cell.strip()) in _FIELD_ALIASES for cell in rows[0]):
        names = [re.sub(r"\s*\[.*\]$", "", cell.strip()) for cell in rows[0]]
        rows = rows[1:]
    gpus: list[Gpu] = []
    drivers: set[str] = set()
    for position, row in enumerate(rows):
        if names is not None and len(row) != len(names):
            raise OutputParseError(
                f"CSV row {position + 1} has {len(row)} values for {len(names)} fields: {row!r}"
            )
        values: dict[str, str] = {}
        for i, raw in enumerate(row):
            value = raw.strip()
            key = _FIELD_ALIASES.get(names[i], names[i]) if names is not None else _guess_field(value)
            values.setdefault(key, value)
        if "driver" in values:
            drivers.add(values["driver"])
        memory = _MIB_VALUE_RE.match(values.get("memory", ""))
        index = values.get("index")
        gpus.append(
            Gpu(
                index=int(index) if index and index.isdigit() else None,
                name=values.get("name", ""),
                bus_id=values.get("bus_id"),
                memory_mib=int(memory["n"]) if memory else None,
                uuid=values.get("uuid"),
                mig_mode=values.get("mig_mode"),
            )
        )
    return NvidiaSmi(
        gpus=tuple(gpus),
        driver_version=next(iter(drivers)) if len(drivers) == 1 else None,
        source="csv",
    )
