"""What a rollout tells its watcher while it runs: a node failed, a batch ended.

Why events and not only the result: a rollout over 1,000 GPU nodes runs for an hour in one step, and the step's
result arrives when the step ends.  An operator (``runbook run`` on a terminal, a CI log) must learn that a node
failed its upgrade when the library learns it, to stop the run or look at the node while the rest goes on
(issue 16).  Steps never print (the CLI and the notebook render): they hand each event to ``Context.events``,
whose sink the caller chooses.  Without a sink (library use, the JupyterLab gate) the events go nowhere and the
step behaves exactly as before.

Each failed node is reported once: as soon as its failure is known (the image step: when its ``talosctl
upgrade`` returns, before its batch-mates finish), else at the end of its batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from .results import NodeResult

#: At most this many characters of a node's failure reason go into its event (the full text is in the result).
REASON_CHARS = 300


@dataclass(frozen=True)
class NodeFailed:
    """A node failed in the rollout; ``reason`` is one line (the first of the node's message)."""

    node: str
    address: str
    reason: str
    kind: Literal["node_failed"] = "node_failed"


@dataclass(frozen=True)
class BatchDone:
    """Batch ``batch`` of ``batches`` ended: its nodes ok and failed, and the rollout's totals so far."""

    batch: int
    batches: int
    ok: int
    failed: int
    nodes_done: int
    nodes_total: int
    failed_total: int
    kind: Literal["batch_done"] = "batch_done"


RolloutEvent = NodeFailed | BatchDone
Sink = Callable[[RolloutEvent], None]


def one_line(text: str) -> str:
    """The first non-empty line of ``text``, cut to ``REASON_CHARS``: a terminal line per node, not a report."""
    first = next((line.strip() for line in text.splitlines() if line.strip()), "no reason given")
    return first if len(first) <= REASON_CHARS else first[: REASON_CHARS - 1] + "…"


@dataclass
class Events:
    """The rollout's event sink, with each failed node reported once (see the module docstring)."""

    sink: Sink | None = None
    _reported: set[str] = field(default_factory=set, repr=False)

    def node_failed(self, res: NodeResult) -> None:
        """Report ``res`` (a failed node) unless it was reported already."""
        if self.sink is None or res.node in self._reported:
            return
        self._reported.add(res.node)
        self.sink(NodeFailed(res.node, res.address, one_line(res.message)))

    def batch_done(self, log: Sequence[dict[str, Any]], total: int, members: Sequence[NodeResult]) -> None:
        """The batch ``log[-1]`` (``patch.log_batch``'s entry) ended: its failed nodes not reported yet, then
        the batch line with the totals of every batch in ``log``."""
        if self.sink is None or not log:
            return
        for res in members:
            if res.status == "failed":
                self.node_failed(res)
        last = log[-1]
        failed = len(last["failed"])
        self.sink(
            BatchDone(
                batch=int(last["batch"]),
                batches=int(last["of"]),
                ok=len(last["nodes"]) - failed,
                failed=failed,
                nodes_done=sum(len(entry["nodes"]) for entry in log),
                nodes_total=total,
                failed_total=sum(len(entry["failed"]) for entry in log),
            )
        )
