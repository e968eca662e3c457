"""Result objects every step returns: what was checked, found and changed, per node, with the evidence.

Why objects and not printing: the same result is rendered in a notebook cell (a summary, failing nodes
first), stored in ``record.json`` (full per-node data), and asserted on by tests.  At 1,000 nodes the
rendering shows counts and the failures, while the record keeps everything.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Status = Literal["ok", "changed", "planned", "unchanged", "failed", "skipped"]
#: Order in which node states are listed: what needs attention first.
STATUS_ORDER: tuple[Status, ...] = ("failed", "planned", "changed", "unchanged", "ok", "skipped")


@dataclass
class Check:
    """One check on one node.  A failed check carries the diagnosis: cause and the command that fixes it."""

    name: str
    ok: bool
    message: str
    fix: str = ""
    cause: str = ""
    evidence: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v not in ("", None)}


@dataclass
class NodeResult:
    node: str
    address: str
    status: Status = "ok"
    message: str = ""
    checks: list[Check] = field(default_factory=list)
    diff: str = ""
    """The change shown or applied (unified diff of the machine config, a command line, ...)."""
    needs_reboot: bool = False
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def failed_checks(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"node": self.node, "address": self.address, "status": self.status}
        if self.message:
            out["message"] = self.message
        if self.checks:
            # Passing checks are summarised by name only: records stay small at fleet scale.
            out["passed"] = [c.name for c in self.checks if c.ok]
            failed = [c.to_dict() for c in self.checks if not c.ok]
            if failed:
                out["failed"] = failed
        if self.diff:
            out["diff"] = self.diff
        if self.needs_reboot:
            out["needs_reboot"] = True
        if self.data:
            out["data"] = self.data
        return out


@dataclass
class StepResult:
    """The outcome of one runbook step."""

    step: str
    applied: bool
    """False for a plan/dry-run, True when changes were allowed."""
    nodes: list[NodeResult] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    """Cluster-wide checks (tool versions, RuntimeClass, Helm release, ...)."""
    notes: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    started: float = field(default_factory=time.time)
    duration_s: float = 0.0

    # -- outcome ------------------------------------------------------------------------------------------
    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks) and not any(n.status == "failed" for n in self.nodes)

    @property
    def status(self) -> str:
        if not self.ok:
            return "failed"
        if any(n.status == "changed" for n in self.nodes) or self.data.get("changed"):
            return "changed"
        if any(n.status == "planned" for n in self.nodes) or self.data.get("planned"):
            return "planned"
        return "ok"

    def counts(self) -> dict[str, int]:
        counter = Counter(n.status for n in self.nodes)
        return {s: counter[s] for s in STATUS_ORDER if counter[s]}

    def failing(self) -> list[NodeResult]:
        return [n for n in self.nodes if n.status == "failed"]

    def sorted_nodes(self) -> list[NodeResult]:
        return sorted(self.nodes, key=lambda n: (STATUS_ORDER.index(n.status), n.node))

    def node(self, name: str) -> NodeResult:
        return next(n for n in self.nodes if name in (n.node, n.address))

    def finish(self) -> StepResult:
        self.duration_s = round(time.time() - self.started, 3)
        return self

    def summary(self) -> str:
        counts = ", ".join(f"{n} {s}" for s, n in self.counts().items()) or "no nodes"
        failed_checks = [c.name for c in self.checks if not c.ok]
        extra = f"; failed: {', '.join(failed_checks)}" if failed_checks else ""
        return f"{self.step}: {self.status} ({counts}{extra})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "status": self.status,
            "applied": self.applied,
            "duration_s": self.duration_s,
            "counts": self.counts(),
            "checks": [c.to_dict() | {"ok": c.ok} for c in self.checks],
            "nodes": [n.to_dict() for n in self.sorted_nodes()],
            "notes": self.notes,
            "data": self.data,
        }


def rewrite_runnable(result: StepResult, change: Callable[[str], str]) -> None:
    """Apply ``change`` to what a person runs: every check's fix and cause, the step's and its nodes', the notes,
    and the rollback's list of what it does not undo (messages quote what the step ran, as it ran it). A cause
    too, since a cause may name a command to read it with; no cause in the runbook does today (the unsupported
    GPU's ``dmesg | grep NVRM`` is in its message, built with the run's talosctl: image_diagnosis)."""
    for check in [*result.checks, *(c for n in result.nodes for c in n.checks)]:
        check.fix = change(check.fix)
        check.cause = change(check.cause)
    result.notes = [change(note) for note in result.notes]
    if isinstance(result.data.get("not_undone"), list):
        result.data["not_undone"] = [change(str(item)) for item in result.data["not_undone"]]


def checks_from_findings(findings: Iterable[Any]) -> list[Check]:
    """Turn diagnosis findings (``runbook_lib.model.diagnosis.Finding``) into checks."""
    return [Check(name=f.check, ok=f.ok, message=f.message, fix=f.fix, cause=f.cause) for f in findings]
