"""Which earlier run of the cluster a run follows (``record.json``'s ``continues``), and the chain of such
links a rollback and an interrupted run's report follow back.

Why: an ``--apply`` run interrupted in its image step and resumed with ``--from image --apply`` leaves two
records, each with part of the work, and so does a failed run followed by the fix its report prints
(``--steps image --apply``) and then ``--from image``. A rollback named with the last record alone planned the
nodes it changed and said of the nodes the first had upgraded "no record shows the runbook changed this node",
and removed the Kubernetes layer those nodes still needed (operator walkthrough, 6 Dec 2026). Every run (not a
rollback) now records the run it follows, so what reads it can say which record holds the rest; so does a
JupyterLab approval's record (``interactive_record``), which finishes a change as often as a resumed run does.

Which run that is: the newest record of the same cluster that changed it (its journal lists changes), passing
over plans and checks-only runs, which change nothing, and only while that run left the change unfinished: it
failed, was interrupted, or passed without reaching the runbook's last step (``--steps config-patch,image``).
A run that went through to the CUDA test, passing on every node the chain changed that its parameters list
(:func:`_covers_chain`), finished a change, and a rollback undid one: after either, a run
follows none, so a ``--from verify`` weeks after a finished run does not chain a rollback to it (review: the
printed rollback then took every node back to before that run). A chain is at most :data:`CHAIN_MAX` long.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from runbook_lib.errors import PermanentError
from runbook_lib.model.rollback import node_results, talosctl_nodes

from . import records
from .steps import STEP_NAMES

FIELD = records.CONTINUES
#: The runbook's last step: a run that passed through it finished its change.
LAST_STEP = STEP_NAMES[-1]
#: Links a chain follows at most.
CHAIN_MAX = 20


def _is_rollback(data: dict[str, Any]) -> bool:
    return any(step.get("name") == "rollback" for step in records.listed(data, "steps"))


def continued_run(root: Path, cluster: str) -> str | None:
    """The name of the run a new run of ``cluster`` follows, None when there is none (see the module).

    Reads few records however many the folder holds: another cluster's are passed over by name, and a record
    that changed nothing but says which run it follows answers for the runs before it (an hourly CI plan gate
    leaves hundreds of plans, and a 1,000-node record.json is about 1 MB), except for a run sealed since that
    record began: a plan takes no lock, and an ``--apply`` run it overlapped was not sealed when it looked."""
    ours = [
        p
        for p in records.sealed_records(root)
        if _cluster_in_name(p.name) in (cluster, f"{cluster}-interactive")
    ]
    for path in reversed(ours):
        data = _read(path, cluster)
        if data is None:
            continue
        decided, answer = _verdict(path, data)
        if decided:
            return answer
        if FIELD in data:  # written since this field exists: what it follows is what this run follows
            earlier = data[FIELD] if isinstance(data[FIELD], str) and data[FIELD] else None
            decided, answer = _sealed_meanwhile(ours, path, earlier, cluster)
            return answer if decided else earlier
    return None


def _read(path: Path, cluster: str) -> dict[str, Any] | None:
    """A sealed record of ``cluster``, None for anything else (a record that cannot be read is not one to follow;
    `records verify` names it)."""
    if records.is_unsealed(path):
        return None
    try:
        data = records.load_record(path)
    except PermanentError:
        return None
    return data if data.get("cluster") == cluster else None


def _verdict(path: Path, data: dict[str, Any]) -> tuple[bool, str | None]:
    """(whether this record decides what a new run follows, and what): a rollback ends the chain, a run that
    changed the cluster is followed unless it finished its change; a run that changed nothing decides nothing,
    except an ``--apply`` one that went through the last step: an approval of the CUDA test changes nothing (its
    pods are not changes) and still finishes the change (review: the chain went on past it, and a run a month
    later was chained to the approvals before it). Finished means on every node of the runs it follows
    (:func:`_covers_chain`)."""
    if _is_rollback(data):
        return True, None
    done = _finished(data) and _covers_chain(path, data)
    if data.get("apply") is True and done:
        return True, None
    if records.listed(data, "changes"):
        return True, None if done else path.name
    return False, None


def _sealed_meanwhile(
    ours: list[Path], plan: Path, earlier: str | None, cluster: str
) -> tuple[bool, str | None]:
    """:func:`_verdict` of the newest record that decides one, started between ``earlier`` and ``plan`` and
    sealed after ``plan`` began (its ``record.json`` is newer than the second in ``plan``'s name)."""
    try:
        begun = datetime.strptime(plan.name[:16], "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return False, None
    for path in reversed([p for p in ours if (earlier or "") < p.name < plan.name]):
        try:
            sealed_after = (path / records.RECORD_JSON).stat().st_mtime >= begun
        except OSError:
            continue
        data = _read(path, cluster) if sealed_after else None
        verdict = _verdict(path, data) if data is not None else (False, None)
        if verdict[0]:
            return verdict
    return False, None


def _covers_chain(path: Path, data: dict[str, Any]) -> bool:
    """Whether the CUDA test of this run passed on every node the runs it follows (``continues``, the whole chain)
    changed that this run's parameters still list, or it follows none.

    Why: after a run that failed on gpu-worker-2, a CUDA test of gpu-worker-1 alone through the JupyterLab picker
    (an approval records every node and applies the picked ones) ended the chain, and the resume that fixed
    gpu-worker-2 followed no run, so its rollback knew nothing of the failed run's changes (reviews of stop 53 and
    of 29edd31). The nodes are the test's own results and the talosctl calls of the links' changes. A node this
    run's parameters no longer list is out of the change: taken out of `nodes:` (the runbook's own fix for a node
    that is gone), it could never be tested, and the chain stayed open for 20 runs (review of f44b2b1); a
    parameter file that lists some nodes is read the same way, and the rollback of such a resume still names a
    node whose modules patch no named record applied (rollback's note). A link that cannot be read ends the chain
    there (:func:`chain`)."""
    followed: set[str] = set()
    for _name, earlier in chain(path.parent, data):
        followed |= _changed_nodes(earlier)
    return followed & _node_names(data) <= _tested(data)


def _node_names(data: dict[str, Any]) -> set[str]:
    return set(_names_by_address(data).values())


def _names_by_address(data: dict[str, Any]) -> dict[str, str]:
    params = data.get("params")
    nodes = params.get("nodes") if isinstance(params, dict) else None
    return {str(n.get("address")): str(n.get("name")) for n in nodes or [] if isinstance(n, dict)}


def _changed_nodes(data: dict[str, Any]) -> set[str]:
    """The GPU nodes a record's talosctl calls changed (``-n`` of its changes; a batch names several)."""
    names = _names_by_address(data)
    changed: set[str] = set()
    for change in records.listed(data, "changes"):
        changed |= {names.get(a, a) for a in talosctl_nodes([str(a) for a in change.get("argv") or []])}
    return changed


def _tested(data: dict[str, Any]) -> set[str]:
    """The nodes the record's CUDA test step passed (none when it has no such result)."""
    step = next((s for s in records.listed(data, "steps") if s.get("name") == LAST_STEP), None)
    result = step.get("result") if step is not None else None
    if not isinstance(result, dict):
        return set()
    return {name for name, node in node_results(result).items() if node.get("status") == "ok"}


def _finished(data: dict[str, Any]) -> bool:
    """A run that passed through the runbook's last step: the change it belongs to is complete."""
    steps = data.get("steps_requested")
    return data.get("outcome") in ("changed", "unchanged") and isinstance(steps, list) and LAST_STEP in steps


def _cluster_in_name(name: str) -> str:
    """The cluster a record's name gives (``records.record_name``: ``<UTC time>-<cluster>-<run id>``; a
    JupyterLab approval's cluster part ends in ``-interactive``)."""
    return name.split("-", 1)[-1].rsplit("-", 1)[0]


def chain(folder: Path, data: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """The runs ``data`` follows, newest first, each as (name, record.json), read from ``folder``.

    Stops at a link that cannot be followed (a record moved or deleted, unreadable, of another cluster, or a
    loop): what follows a link is a hint for a person, never evidence a rollback acts on unnamed."""
    seen: set[str] = set()
    cluster = data.get("cluster")
    name = data.get(FIELD)
    while isinstance(name, str) and name and name not in seen and "/" not in name and len(seen) < CHAIN_MAX:
        seen.add(name)
        try:
            earlier = records.load_record(folder / name)
        except PermanentError:
            return
        if earlier.get("cluster") != cluster:
            return
        yield name, earlier
        name = earlier.get(FIELD)
