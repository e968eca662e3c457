"""Rollback evidence and the removal patches: where the runbook found each GPU node, from its change records.

Why from the records and not from the parameters: the parameters say what the runbook *wants*; only a
record says what it *did* to each node (the journal's ``talosctl patch mc`` calls with the patch as their
diff, the ``talosctl upgrade`` calls, and the image step's per-node ``before`` version and schematic), and
only the earliest record that changed a node says where the runbook *found* it.  A node the records do not
show changed is left alone; a node whose evidence is incomplete is refused with the reason, never guessed.

Why removal patches are computed against the node's current config: ``talosctl patch mc`` loads a
strategic-merge patch with deletes allowed (talos@v1.12.0 pkg/machinery/config/configpatcher/load.go
``LoadPatch``: ``configloader.WithAllowPatchDelete()``), and Talos applies a ``$patch: delete``
selector only to something that exists ("lookup failed" otherwise: talos@v1.12.0
pkg/machinery/config/configloader/internal/decoder/selector.go ``deleteForPath``/``deleteStructFrom``),
and a list-item selector removes the *first* item whose first key matches (``makeSequenceSelector`` in
decoder/delete.go: "collect the first key:val aside from $patch:delete as selector").  The config-patch
step only ever adds what a node lacks (``machineconfig.remaining_patch``), so the recorded patch is exactly
what the runbook added, and deleting those items keeps everything the node had before.  A sysctl the
runbook overwrote is set back to the value the record says it had.  Strategic-merge ``$patch: delete`` is
used rather than JSON6902 ``remove``: Talos refuses JSON6902 patches on multi-document configs
(talos@v1.12.0 pkg/machinery/config/configpatcher/json6902.go), which every Talos 1.14 GPU node has
(``KernelModuleConfig`` documents).  Pure functions only.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from .machineconfig import Doc, merge_into, parse_documents

DELETE = {"$patch": "delete"}
#: Document kinds removed before the image goes back (the others after it): containerd refuses a default
#: runtime the old image has no definition for (see ``steps.patch.nodes_with_nvidia_runtime``).
BEFORE_IMAGE_KINDS = frozenset({"CRICustomizationConfig"})
Phase = Literal["before-image", "after-image"]


@dataclass(frozen=True)
class FoundImage:
    """What a node ran before the runbook's first upgrade of it (the image step's ``before``)."""

    record: str
    version: str
    schematic_id: str | None


@dataclass
class NodeEvidence:
    """What the records say the runbook did to one node, oldest record first."""

    name: str
    address: str
    patches: list[tuple[str, list[Doc]]] = field(default_factory=list)
    """(record, patch documents) of every successful ``talosctl patch mc`` on the node."""
    sysctls_before: dict[str, str | None] = field(default_factory=dict)
    """Each sysctl the patches set, and its value before the first of them (None: it was not set)."""
    image: FoundImage | None = None
    missing: list[str] = field(default_factory=list)
    """Why the evidence is incomplete: the node is refused, nothing is changed on it."""

    @property
    def changed(self) -> bool:
        return bool(self.patches or self.image or self.missing)

    def added_documents(self) -> list[Doc]:
        return [doc for _record, docs in self.patches for doc in docs]


@dataclass(frozen=True)
class KubeCreated:
    """What one record's Kubernetes step created (``data.created``): Helm releases and a RuntimeClass."""

    record: str
    releases: tuple[tuple[str, str], ...]
    runtime_class: bool


@dataclass
class Evidence:
    records: list[str]
    nodes: dict[str, NodeEvidence]
    """By node name; only nodes some record changed."""
    kubernetes: list[KubeCreated] = field(default_factory=list)
    kubernetes_missing: list[str] = field(default_factory=list)
    not_undone: list[str] = field(default_factory=list)
    """What those runs changed that the rollback does not undo (the device plugin removed before Talos 1.13,
    namespace and node labels): the plan lists it, for a person to put back if needed."""
    suggest: Callable[[], dict[str, list[str]]] | None = None
    """Reads, by node name, the records of the same cluster in the records folder that changed the node and were
    not named: what a refusal asks to name too (found by an operator walkthrough: a run split into two records by
    ``--steps`` and ``--from`` was refused with the config-patch record alone, and the hint named neither). Called
    at the first refusal only (:meth:`unnamed`): a rollback refusing nothing reads no other record."""
    _unnamed: dict[str, list[str]] | None = field(default=None, repr=False)
    continued: dict[str, list[str]] = field(default_factory=dict)
    """By node name, the earlier runs the named records follow (``continues``: the cluster's run before each)
    that are not named and changed the node: not evidence the rollback acts on, but its plan names them, and the
    Kubernetes layer stays while a node they upgraded keeps the NVIDIA image (operator walkthrough: a rollback
    from a resumed run's record said nothing of what the interrupted run did, and removed the layer)."""
    labelled: list[tuple[str, list[dict[str, Any]]]] = field(default_factory=list)
    """Per record, the node labels its Kubernetes step set with each one's value before (``data.labelled``): the
    rollback step says how to put back those of the nodes that go back, or of all when the layer goes too."""

    def unnamed(self, node: str) -> list[str]:
        """The records :attr:`suggest` reads for ``node`` (none without it), read once."""
        if self._unnamed is None:
            self._unnamed = self.suggest() if self.suggest is not None else {}
        return self._unnamed.get(node, [])

    def releases(self) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        for created in self.kubernetes:
            out += [r for r in created.releases if r not in out]
        return out

    def runtime_class(self) -> bool:
        return any(c.runtime_class for c in self.kubernetes)


# -- reading records (already-loaded record.json mappings) ---------------------------------------------------


def _mappings(value: Any) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def node_results(result: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """A step result's per-node outcomes by name, from the full ``nodes`` list or the record's
    ``node_groups`` (``record_content.group_nodes``)."""
    out = {str(n.get("node")): n for n in _mappings(result.get("nodes"))}
    for group in _mappings(result.get("node_groups")):
        common = {k: v for k, v in group.items() if k != "nodes"}
        for name in group.get("nodes") or []:
            out[str(name)] = {"node": name, **common}
    return out


def _step_results(record: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        str(s.get("name")): s["result"]
        for s in _mappings(record.get("steps"))
        if isinstance(s.get("result"), dict)
    }


def _nodes_of(argv: Sequence[str]) -> list[str]:
    if "-n" in argv and argv.index("-n") + 1 < len(argv):
        return [a for a in str(argv[argv.index("-n") + 1]).split(",") if a]
    return []


def talosctl_nodes(argv: Sequence[str]) -> list[str]:
    """The node addresses of a talosctl call's ``-n`` (a batch names several); none for another tool's argv, whose
    ``-n`` means something else (helm's and kubectl's namespace)."""
    return _nodes_of(argv) if argv and Path(str(argv[0])).name.startswith("talosctl") else []


def _calls(record: Mapping[str, Any], words: tuple[str, ...]) -> Iterator[tuple[dict[str, Any], list[str]]]:
    """The record's cluster changes whose talosctl argv holds ``words`` in order, with their nodes."""
    for change in _mappings(record.get("changes")):
        argv = [str(a) for a in change.get("argv") or []]
        if not argv or "--dry-run" in argv:
            continue
        start = next((i for i, a in enumerate(argv) if a == words[0]), None)
        if start is not None and tuple(argv[start : start + len(words)]) == words:
            yield change, _nodes_of(argv)


def _add_patches(
    evidence: dict[str, NodeEvidence], name: str, record: Mapping[str, Any], steps: dict[str, dict[str, Any]]
) -> None:
    by_address = {n.address: n for n in evidence.values()}
    for change, addresses in _calls(record, ("patch", "machineconfig")):
        step = str(change.get("step"))
        outcomes = node_results(steps.get(step) or {})
        docs = parse_documents(str(change.get("diff") or ""))
        for address in addresses:
            node = by_address.get(address)
            if node is None:
                continue
            # a failed call may still have patched the nodes before the one talosctl stopped at: the step's
            # result says which (``PatchCall.outcome``)
            if change.get("exit_code") != 0 and outcomes.get(node.name, {}).get("status") != "changed":
                continue
            if not docs:
                node.missing.append(f"{name}: a patch of this node is recorded without its content")
                continue
            node.patches.append((name, docs))
            _sysctls_before(node, name, docs, outcomes.get(node.name, {}))


def _sysctls_before(node: NodeEvidence, record: str, docs: list[Doc], outcome: Mapping[str, Any]) -> None:
    """The values the patch overwrote, from the config-patch step's ``data.sysctls_before``."""
    set_now = {k for d in docs for k in ((d.get("machine") or {}).get("sysctls") or {})}
    before = (outcome.get("data") or {}).get("sysctls_before")
    for key in sorted(set_now - set(node.sysctls_before)):
        if not isinstance(before, dict) or key not in before:
            node.missing.append(
                f"{record}: the record does not say what sysctl {key} was before the runbook set it"
            )
            continue
        value = before[key]
        node.sysctls_before[key] = None if value is None else str(value)


def _add_images(
    evidence: dict[str, NodeEvidence], name: str, record: Mapping[str, Any], steps: dict[str, dict[str, Any]]
) -> None:
    by_address = {n.address: n for n in evidence.values()}
    outcomes = node_results(steps.get("image") or {})
    found = node_results(steps.get("preflight") or {})
    for _change, addresses in _calls(record, ("upgrade",)):
        for address in addresses:
            node = by_address.get(address)
            if node is None or node.image is not None:
                continue  # the earliest record that upgraded a node says where the runbook found it
            before = (outcomes.get(node.name, {}).get("data") or {}).get("before") or _preflight_saw(
                found.get(node.name, {})
            )
            if not before.get("version"):
                node.missing.append(f"{name}: the node was upgraded but the record lacks its image before")
                continue
            schematic = before.get("schematic_id")
            node.image = FoundImage(name, str(before["version"]), str(schematic) if schematic else None)


#: How the rollback's notes begin that name what it does not undo (``cmd_rollback`` prints them as a list).
NOT_UNDONE_NOTE = "not undone, put back by hand if needed: "

#: How the kubernetes step words the changes the rollback undoes (``steps.kubernetes``); the others are kept.
UNDONE = ("helm upgrade --install ", "RuntimeClass nvidia (handler nvidia)")


def _add_not_undone(out: Evidence, name: str, steps: dict[str, dict[str, Any]]) -> None:
    image = steps.get("image") or {}
    if image.get("applied"):
        out.not_undone += [f"{name}: {c}" for c in (image.get("data") or {}).get("before_upgrade") or []]
    kube = steps.get("kubernetes") or {}
    if kube.get("applied"):
        data = kube.get("data") or {}
        labelled = list(_mappings(data.get("labelled")))
        # created by this run or by an earlier record of the same rollback, which removes it (review)
        created = {(str(c.get("name")), str(c.get("namespace"))) for c in _mappings(data.get("created"))}
        created |= {r for k in out.kubernetes for r in k.releases}
        changes = [_upgrade_back(str(c)) for c in data.get("changes") or [] if _kept(str(c), created)]
        if labelled:  # said as the commands that put the labels back (records since 6 Dec 2026 keep them)
            changes = [c for c in changes if not c.startswith("label node ")]
            out.labelled.append((name, labelled))
        out.not_undone += [f"{name}: {c}" for c in changes]


def _kept(change: str, created: set[tuple[str, str]]) -> bool:
    """Whether the rollback leaves this change of the kubernetes step. A ``helm upgrade --install`` of a release
    no record of the rollback created (``data.created``) is an upgrade the rollback does not undo: it removes
    only what a run created. Before, it was counted as undone and the rollback of such a run said nothing of it
    (operator walkthrough, 6 Dec 2026)."""
    if change.startswith(UNDONE[0]):
        return _release_of(change) not in created
    return not change.startswith(UNDONE)


def _release_of(change: str) -> tuple[str, str]:
    """(release, namespace) of a ``helm upgrade --install <release> <chart> … -n <namespace>`` change."""
    words = change.split()
    release = words[3] if len(words) > 3 else "<release>"
    namespace = words[words.index("-n") + 1] if "-n" in words[:-1] else "<namespace>"
    return release, namespace


def _upgrade_back(change: str) -> str:
    """A release upgrade as the rollback leaves it: with the helm commands that go back by hand."""
    if not change.startswith(UNDONE[0]):
        return change
    release, namespace = _release_of(change)
    return (
        f"{change}: an upgrade of a release the run did not create; to go back: helm history {release} -n "
        f"{namespace}, then helm rollback {release} <revision> -n {namespace}"
    )


def _preflight_saw(outcome: Mapping[str, Any]) -> dict[str, Any]:
    """The image the same run's preflight found the node on (``talos_version``, ``schematic_id``), as the image
    step's ``before``: the step's own result is missing when the run was interrupted during it (SIGTERM seals
    the record with the upgrades it made in its journal, not the step's result), and the node was refused
    ("the record lacks its image before") though the run had read it (operator walkthrough, 6 Dec 2026).
    Records from before 6 Dec 2026 have no ``schematic_id`` there: {} then, as before."""
    data = outcome.get("data") or {}
    if outcome.get("status") != "ok" or not data.get("talos_version") or "schematic_id" not in data:
        return {}
    return {"version": data["talos_version"], "schematic_id": data["schematic_id"]}


def label_undo(labelled: Iterable[Mapping[str, Any]], only: Collection[str] | None = None) -> list[str]:
    """What the Kubernetes step's node labels were, as the ``kubectl label`` commands that put them back: one per
    label and earlier value, naming its nodes (``kubectl label node A B C key-`` removes the label from each;
    ``key=old --overwrite`` sets it back). ``only``: the nodes the commands name (those a rollback takes back);
    the count stays the run's, which a partial rollback's line had given as the nodes going back ("added to 2
    node(s)" of a run that labelled 3: operator walkthrough, 7 Dec 2026). A group none of ``only`` is in is said
    to be kept, with the command that undoes it anyway: it was left out, and a rollback of a run that only labelled
    nodes said nothing of the label (README audit, stop 50)."""
    groups: dict[tuple[str, str | None], list[str]] = {}
    for item in labelled:
        before = item.get("before")
        key = (str(item.get("label")), None if before is None else str(before))
        groups.setdefault(key, []).append(str(item.get("node")))
    lines = []
    for (label, before), nodes in groups.items():
        named = nodes if only is None else [n for n in nodes if n in only]
        what = (
            f"label {label} added to {len(nodes)} node(s) that had none"
            if before is None
            else f"label {label} changed from {before!r} on {len(nodes)} node(s)"
        )
        verb, value = (
            ("remove it", [f"{label}-"])
            if before is None
            else ("put it back", [f"{label}={before}", "--overwrite"])
        )
        if not named:  # none goes back: the device plugin stays and schedules only where the label is set
            command = shlex.join(["kubectl", "label", "node", *nodes, *value])
            lines.append(
                f"{what}; kept, as none of them goes back (a device plugin schedules only where it is set: "
                f"{verb} only where the GPUs are no longer used: {command})"
            )
            continue
        which = "" if named == nodes else f" on the {len(named)} that go back"
        why = (
            "" if only is None else " (only the nodes that go back: the others keep it while the plugin runs)"
        )
        lines.append(
            f"{what}; to {verb}{which}: " + shlex.join(["kubectl", "label", "node", *named, *value]) + why
        )
    return lines


def _add_kubernetes(
    out: Evidence, name: str, steps: dict[str, dict[str, Any]], record: Mapping[str, Any]
) -> None:
    _add_not_undone(out, name, steps)
    result = steps.get("kubernetes")
    if not result:
        _journal_only(out, name, record)
        return
    data = result.get("data") or {}
    created = data.get("created")
    if not isinstance(created, list):
        if data.get("changed"):
            out.kubernetes_missing.append(
                f"{name}: the Kubernetes step changed the cluster but its record does not say what it created"
            )
        return
    releases = tuple(
        (str(c.get("name")), str(c.get("namespace")))
        for c in _mappings(created)
        if c.get("kind") == "helm-release"
    )
    runtime_class = any(c.get("kind") == "RuntimeClass" for c in _mappings(created))
    out.kubernetes.append(KubeCreated(name, releases, runtime_class))


def _journal_only(out: Evidence, name: str, record: Mapping[str, Any]) -> None:
    """A Kubernetes step that changed the cluster but left no result (killed, or an aborted run's step):
    its journal's changes are all the record holds, which cannot say what to remove, so rollback says so
    instead of passing over them.

    Why the wording asks a person to check: a journalled ``helm upgrade --install`` may have installed the
    release or upgraded one the site had before, which only the lost result told apart.  What the step removed
    (the device plugin it retired for the GPU Operator) is nothing to remove: it is listed as not undone."""
    changes = [c for c in _mappings(record.get("changes")) if c.get("step") == "kubernetes"]
    removals = [c for c in changes if _removes(c)]
    out.not_undone += [f"{name}: {_change_text(c)} (from its journal)" for c in removals]
    changes = [c for c in changes if not _removes(c)]
    if not changes:
        return
    texts = [_change_text(c) for c in changes]
    # what rollback removes when a result says it was created first (helm installs, the RuntimeClass)
    texts.sort(key=lambda text: 0 if "helm upgrade" in text or "RuntimeClass" in text else 1)
    shown = "; ".join(texts[:3]) + (" …" if len(texts) > 3 else "")
    out.kubernetes_missing.append(
        f"{name}: the Kubernetes step changed the cluster ({len(changes)} change(s): {shown}) but left no "
        "result that says what it created (a release it installed, or one the site had that it upgraded)"
    )


def _removes(change: Mapping[str, Any]) -> bool:
    """A journalled removal: ``helm uninstall`` or an API ``delete`` (``clients.kube``'s wording)."""
    argv = [str(a) for a in change.get("argv") or []]
    return "uninstall" in argv[1:3] or str(change.get("summary") or "").startswith("delete ")


def _change_text(change: Mapping[str, Any]) -> str:
    argv = change.get("argv")
    if isinstance(argv, list) and argv:
        return " ".join([str(argv[0]).rsplit("/", 1)[-1], *(str(a) for a in argv[1:6])])
    return str(change.get("summary") or change.get("kind") or "a change")


def evidence_from_records(records: Sequence[tuple[str, Mapping[str, Any]]]) -> Evidence:
    """The evidence of ``records`` (name, record.json), oldest first, for the nodes each record names."""
    out = Evidence(records=[name for name, _data in records], nodes={})
    for name, record in records:
        params = record.get("params") or {}
        seen = {n.address: n for n in out.nodes.values()}
        current: dict[str, NodeEvidence] = {}
        for entry in _mappings(params.get("nodes")):
            address = str(entry.get("address"))
            current[address] = seen.get(address) or NodeEvidence(str(entry.get("name")), address)
        steps = _step_results(record)
        _add_patches(current, name, record, steps)
        _add_images(current, name, record, steps)
        _add_kubernetes(out, name, steps, record)
        for node in current.values():
            if node.changed:
                out.nodes.setdefault(node.name, node)
    return out


# -- removal patches -----------------------------------------------------------------------------------------


def _v1alpha1(docs: Sequence[Doc]) -> Doc:
    return next((d for d in docs if "machine" in d or d.get("version") == "v1alpha1"), {})


def _items(doc: Doc, *path: str) -> list[dict[str, Any]]:
    node: Any = doc
    for key in path:
        node = node.get(key) if isinstance(node, dict) else None
    return _mappings(node)


def _item_deletes(added: Doc, current: Doc, path: tuple[str, ...], key: str) -> list[dict[str, Any]]:
    """``{key: value, $patch: delete}`` for each added list item still in the current config (first key is
    the selector Talos matches on)."""
    have = [i.get(key) for i in _items(current, *path)]
    out = []
    for item in _items(added, *path):
        if item.get(key) in have:
            have.remove(item.get(key))
            out.append({key: item.get(key), **DELETE})
    return out


def _sysctl_changes(added: Doc, current: Doc, before: Mapping[str, str | None]) -> dict[str, Any]:
    """Each sysctl the runbook set, still at its value: deleted, or set back to the value it had."""
    have = (current.get("machine") or {}).get("sysctls") or {}
    out: dict[str, Any] = {}
    for key, value in ((added.get("machine") or {}).get("sysctls") or {}).items():
        if key in have and str(have[key]) == str(value) and key in before:
            out[key] = dict(DELETE) if before[key] is None else before[key]
    return out


def _nest(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    for key in reversed(path):
        value = {key: value}
    return value  # type: ignore[no-any-return]


def removal_documents(
    added: Sequence[Doc], current: Sequence[Doc], sysctls_before: Mapping[str, str | None], phase: Phase
) -> list[Doc]:
    """The strategic-merge patch that removes, of ``added``, what ``phase`` removes and ``current`` still has.

    ``before-image``: the default-runtime file or document (the old image has no ``nvidia`` runtime) and
    ``machine.install.extensions`` (before Talos 1.5 the installer installs what that list names).
    ``after-image``: the modules (``machine.kernel.modules`` or ``KernelModuleConfig``) and sysctls: an
    NVIDIA image without them in the config hangs at boot (``notebook.steps``, the config-patch spec).
    """
    docs: list[Doc] = []
    base = _v1alpha1(current)
    machine: dict[str, Any] = {}
    for doc in added:
        if "kind" in doc and "machine" not in doc:
            if (str(doc["kind"]) in BEFORE_IMAGE_KINDS) != (phase == "before-image"):
                continue
            if any(d.get("kind") == doc["kind"] and d.get("name") == doc.get("name") for d in current):
                docs.append({k: doc[k] for k in ("apiVersion", "kind", "name") if k in doc} | DELETE)
            continue
        lists = (
            [(("machine", "files"), "path"), (("machine", "install", "extensions"), "image")]
            if phase == "before-image"
            else [(("machine", "kernel", "modules"), "name")]
        )
        for path, key in lists:
            deletes = _item_deletes(doc, base, path, key)
            if deletes:
                merge_into(machine, _nest(path[1:], deletes))
        if phase == "after-image":
            sysctls = _sysctl_changes(doc, base, sysctls_before)
            if sysctls:
                merge_into(machine, {"sysctls": sysctls})
    if machine:
        docs.insert(0, {"machine": machine})
    return docs


def runs_nvidia_image(extensions: Mapping[str, str]) -> bool:
    """True when a node's extensions include an NVIDIA kernel-module extension (which blacklists the
    modules: without them in the config its next boot hangs)."""
    return any("nvidia" in name and ("kmod" in name or "kernel-modules" in name) for name in extensions)


def sysctls_before(patch: Sequence[Doc], current: Sequence[Doc]) -> dict[str, str | None]:
    """The current value (None: not set) of each sysctl ``patch`` sets: what a rollback sets back."""
    have = (_v1alpha1(current).get("machine") or {}).get("sysctls") or {}
    keys = [k for doc in patch for k in ((doc.get("machine") or {}).get("sysctls") or {})]
    return {key: None if have.get(key) is None else str(have[key]) for key in keys}
