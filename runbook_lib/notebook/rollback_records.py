"""The rollback step's evidence: the change records named by ``rollback.records``, checked, then read.

Why here and not in the step: records are this layer's (``records``: sealing, manifests); the step gets the
evidence already read.  Why the checks: a record is evidence only while its seal holds (an edited
``record.json`` could point the rollback at any image) and its place in the chain holds (a copy re-sealed
with a fresh manifest is intact on its own: ``records verify`` names it as inserted), and only for the
cluster it was made on.  Every
problem names the parameter and the record, and nothing runs (exit 2 from the CLI).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from runbook_lib.errors import PermanentError
from runbook_lib.model.params import Params
from runbook_lib.model.rollback import Evidence, evidence_from_records

from . import continues, records

PARAMETER = "rollback.records"
HINT = "runbook rollback -p PARAMS --from RECORD (`runbook records list` shows the names)"


def record_path(ref: str, root: Path) -> Path:
    """A record by path, or by (a unique prefix or suffix of) its name in ``root``."""
    path = Path(ref).expanduser()
    if path.is_dir():
        return path.resolve()
    if "/" in ref:
        raise PermanentError(f"{PARAMETER}: {ref} is not a record directory", hint=HINT)
    try:
        return records.resolve(root, ref).resolve()
    except PermanentError as exc:
        raise PermanentError(f"{PARAMETER}: {exc.message}", hint=exc.hint or HINT) from None


def checked_record(path: Path, cluster: str) -> dict[str, Any]:
    """``record.json`` of a sealed, intact record of ``cluster``; anything else is an error naming it."""
    problems = records.intact_problems(path)
    if problems:
        raise PermanentError(
            f"{PARAMETER}: {path.name} is not intact ({problems[0]}): it cannot serve as evidence",
            hint="`runbook records verify` names every problem; roll back from intact records only",
        )
    data = records.load_record(path)
    if any(step.get("name") == "rollback" for step in records.listed(data, "steps")):
        raise PermanentError(
            f"{PARAMETER}: {path.name} is the record of a rollback: it undid changes and does not say where "
            "the runbook found the nodes",
            hint="name the records of the runs that changed the nodes (`runbook records list`)",
        )
    if data.get("cluster") != cluster:
        raise PermanentError(
            f"{PARAMETER}: {path.name} is a record of cluster {data.get('cluster')!r}, not {cluster!r}",
            hint="name records of this cluster (`runbook records list`)",
        )
    return data


def load_evidence(params: Params, root: Path | None = None, *, suggest: bool = False) -> Evidence:
    """The evidence of the records ``rollback.records`` names (paths or names in ``root``), oldest first.

    ``suggest``: the folder's other records may be read for ``Evidence.unnamed``, which only the step's refusals
    use, and then only at the first (a rollback refusing no node reads none); the CLI's check before the run
    reads none (it read every newer record a second time)."""
    refs = list(params.rollback.records)
    if not refs:
        raise PermanentError(f"{PARAMETER} is empty: name the change record(s) to roll back", hint=HINT)
    if root is None:
        from .interactive_record import default_root  # noqa: PLC0415 - lazy: it imports the runner

        root = default_root()
    loaded: dict[Path, tuple[str, str, dict[str, Any]]] = {}
    for ref in refs:
        path = record_path(ref, root)
        data = checked_record(path, params.cluster)
        loaded[path] = (str(data.get("started", "")), path.name, data)
    # every folder a named record is in; the hint names records by path when they are not in the records folder,
    # where a bare name is looked up (review of 5466089)
    named = {n for _s, n, _d in loaded.values()}
    for folder in sorted({path.parent for path in loaded}):
        by_path = folder.resolve() != Path(root).resolve()
        _refuse_later_continuations(folder, params.cluster, named, by_path=by_path)
    evidence = evidence_from_records(
        [(name, data) for _s, name, data in sorted(loaded.values(), key=lambda t: t[:2])]
    )
    evidence.continued = _continued(loaded)
    if not suggest:
        return evidence
    # the folder the named records are in: a notebook's kernel may have another default root than the CLI's
    first = min(loaded, key=lambda p: p.name)
    evidence.suggest = functools.partial(_unnamed, first.parent, params.cluster, set(loaded), first.name)
    return evidence


def _refuse_later_continuations(
    folder: Path, cluster: str, named: set[str], *, by_path: bool = False
) -> None:
    """Refuse a rollback of records that later runs went on from (``continues``, transitively) and changed the
    cluster in (a call that did not fail), unless those are named too or a later rollback undid them together
    with the named ones: rolled back alone, the named records took the nodes back while what the later runs made
    stayed. Why: after an interrupted run and the ``--from image --apply`` that finished it, the interrupt's
    printed rollback took the nodes back to stock Talos and left the GPU Operator the second run had installed on
    nodes without drivers, saying nothing of it (operator walkthrough, stop 52). A rollback of the later run
    alone does not count: it keeps the Kubernetes layer while the earlier run's nodes keep the NVIDIA image
    (review of 5466089)."""
    chain, later, undone = set(named), [], set()
    for path in records.sealed_records(folder):
        if path.name <= min(named) or path.name in named or records.is_unsealed(path):
            continue
        data = _linked(path, chain)
        if data is None or data.get("cluster") != cluster:
            continue
        if any(step.get("name") == "rollback" for step in records.listed(data, "steps")):
            refs = set(_rolled_back(data))
            if data.get("outcome") in ("changed", "unchanged") and named <= refs:
                undone |= refs
            continue
        if data.get(continues.FIELD) in chain:
            chain.add(path.name)
            # a run whose every changing call failed changed nothing that stays (its report says so too)
            if any(c.get("exit_code") in (0, None) for c in records.listed(data, "changes")):
                later.append(path)
    later = [path for path in later if path.name not in undone]
    if later:
        add = " ".join(f"--from {path if by_path else path.name}" for path in later)
        raise PermanentError(
            f"{PARAMETER}: later runs went on with the change {', '.join(sorted(named))} began and changed the "
            f"cluster too: {', '.join(p.name for p in later)}; rolled back without them, what they changed (a "
            "Kubernetes layer they installed, nodes they upgraded) would stay",
            hint=f"roll them back together: add {add} to this rollback",
        )


def _linked(path: Path, chain: set[str]) -> dict[str, Any] | None:
    """``record.json`` of a record that goes on from one of ``chain`` or is a rollback; None for the others, which
    are not parsed (a 1,000-node record is large: stop 45's note) and for one that cannot be read."""
    try:
        text = (path / records.RECORD_JSON).read_text(encoding="utf-8")
        links = (json.dumps({continues.FIELD: name})[1:-1] for name in chain)  # as record.json writes it
        rollback = json.dumps({"name": "rollback"})[1:-1]  # its step, as a rollback's record lists it
        if rollback not in text and not any(link in text for link in links):
            return None
        return records.load_record(path)
    except (PermanentError, OSError, ValueError):
        return None


def _rolled_back(data: dict[str, Any]) -> list[str]:
    """The records a rollback's record names (``rollback.records``, each a name, a prefix or a path)."""
    params: Any = data.get("params")
    rollback: Any = params.get("rollback") if isinstance(params, dict) else None
    refs: Any = rollback.get("records") if isinstance(rollback, dict) else None
    return [Path(str(ref)).name for ref in refs if str(ref)] if isinstance(refs, list) else []


def _continued(loaded: dict[Path, tuple[str, str, dict[str, Any]]]) -> dict[str, list[str]]:
    """By node, the unnamed earlier runs the named records follow (``continues.chain``) that changed it."""
    named = {name for _s, name, _d in loaded.values()}
    out: dict[str, list[str]] = {}
    for path, (_started, _name, data) in sorted(loaded.items()):
        for name, earlier in continues.chain(path.parent, data):
            if name in named or records.verify_record(path.parent / name):
                continue  # an edited record is no hint either (review)
            try:
                changed = evidence_from_records([(name, earlier)]).nodes
            except (AttributeError, TypeError, ValueError):
                continue  # malformed, yet sealed so: only a hint, the rollback goes on without it
            for node in changed:
                if name not in out.setdefault(node, []):
                    out[node].append(name)
    return out


def _unnamed(root: Path, cluster: str, named: set[Path], since: str) -> dict[str, list[str]]:
    """By node, the sealed records of ``cluster`` in ``root`` from the earliest named one on that changed it and
    are not named (rollbacks and other clusters' records left out)."""
    out: dict[str, list[str]] = {}
    for path in records.sealed_records(root):
        if path.resolve() in named or path.name < since or records.is_unsealed(path):
            continue
        try:
            data = records.load_record(path)
        except (PermanentError, OSError, ValueError):
            continue  # only a suggestion: a record that cannot be read (or is being sealed) is not one
        if data.get("cluster") != cluster or data.get("outcome") in ("planned", "unchanged"):
            continue
        if any(step.get("name") == "rollback" for step in records.listed(data, "steps")):
            continue
        for node in evidence_from_records([(path.name, data)]).nodes:
            out.setdefault(node, []).append(path.name)
    return out
