"""The batch schedule and failure budget of a rollout (image and config-patch steps); pure, no I/O.

Why a canary and growing batches: the first batch is where a bad image, schematic or patch shows itself,
so it should cost as few GPU nodes as possible; once it went through, batches double up to
``rollout_concurrency`` so a large fleet does not take ``n`` round trips.  With a canary of 1 and
``rollout_concurrency`` 8, 20 nodes go as 1, 2, 4, 8, 5.  Without a canary every batch is
``rollout_concurrency`` nodes (the behaviour before these controls existed).

Why a failure budget: on a large fleet one flaky node should not stop a maintenance window, but ten failed
nodes should.  ``max_failures`` is a count (``0``: stop after the first failure, the default) or a
percentage of the nodes this run changes (``"5%"``, rounded down).  The batch in flight always finishes;
no new batch starts once more nodes failed than the budget allows.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")

_PERCENT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*$")


def parse_budget(value: int | str) -> int | float:
    """``max_failures`` as a count (int) or a fraction of the nodes (float, ``"5%"`` -> 0.05).

    Raises ValueError with what would be valid: a count ≥ 0 or a percentage from 0% to 100%.
    """
    if isinstance(value, bool):
        raise ValueError("must be a count of nodes (e.g. 2) or a percentage (e.g. '5%'), not true or false")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("must not be negative: 0 stops after the first failed node")
        return value
    match = _PERCENT.match(value)
    if not match:
        raise ValueError("must be a count of nodes (e.g. 2) or a percentage from 0% to 100% (e.g. '5%')")
    percent = float(match.group(1))
    if percent > 100:
        raise ValueError("a percentage must be from 0% to 100%")
    return percent / 100


def failure_budget(max_failures: int | str, total: int) -> int:
    """How many nodes may fail before no new batch starts; a percentage counts ``total`` (rounded down)."""
    budget = parse_budget(max_failures)
    if isinstance(budget, float):
        return int(budget * total + 1e-9)
    return budget


def batch_sizes(total: int, concurrency: int, canary: int | None) -> list[int]:
    """Sizes of the batches for ``total`` nodes: ``canary`` first, doubling up to ``concurrency``."""
    if concurrency < 1 or (canary is not None and canary < 1):
        raise ValueError("batch sizes must be at least 1")
    size = min(canary, concurrency) if canary is not None else concurrency
    sizes: list[int] = []
    left = total
    while left > 0:
        sizes.append(min(size, left))
        left -= sizes[-1]
        size = min(size * 2, concurrency)
    return sizes


def split(items: Sequence[T], sizes: Sequence[int]) -> list[list[T]]:
    """``items`` cut into consecutive batches of ``sizes``."""
    batches: list[list[T]] = []
    start = 0
    for size in sizes:
        batches.append(list(items[start : start + size]))
        start += size
    return batches


#: How the schedule's line begins: a step's note in its plan, which a run that went on to roll out repeats in
#: its batch lines (``record_content.step_notes`` leaves it out).
NOTE_PREFIX = "rollout: "


@dataclass(frozen=True)
class Schedule:
    """One run's rollout plan: batch sizes, failure budget and pause, and how to say it in a plan."""

    sizes: tuple[int, ...]
    budget: int
    pause_seconds: float
    canary: int | None
    concurrency: int

    @property
    def total(self) -> int:
        return sum(self.sizes)

    def batches(self, items: Sequence[T]) -> list[list[T]]:
        """``items`` (in rollout order) cut into this schedule's batches."""
        if len(items) != self.total:
            raise ValueError(f"the schedule is for {self.total} nodes, not {len(items)}")
        return split(items, self.sizes)

    def exhausted(self, failures: int) -> bool:
        """True when ``failures`` used up the budget: no new batch may start."""
        return failures > self.budget

    def describe(self) -> str:
        """One line for the plan: the batch sizes, how they grow, the budget and the pause."""
        if not self.sizes:
            return f"{NOTE_PREFIX}no node to change"
        count = len(self.sizes)
        growth = (
            f"canary {self.canary}, then doubling up to rollout_concurrency {self.concurrency}"
            if self.canary is not None
            else f"rollout_concurrency {self.concurrency} each"
        )
        budget = (
            "stops after the first failed node"
            if self.budget == 0
            else f"no new batch once more than {self.budget} node(s) failed"
        )
        pause = (
            f"; {self.pause_seconds:g} s pause between batches" if self.pause_seconds and count > 1 else ""
        )
        return (
            f"{NOTE_PREFIX}{self.total} node(s) in {count} batch(es) of {', '.join(map(str, self.sizes))} "
            f"({growth}); {budget}{pause}"
        )


def schedule(
    total: int, *, concurrency: int, canary: int | None, max_failures: int | str, pause_seconds: float
) -> Schedule:
    """The schedule for ``total`` nodes from the ``rollout`` parameters."""
    return Schedule(
        sizes=tuple(batch_sizes(total, concurrency, canary)),
        budget=failure_budget(max_failures, total),
        pause_seconds=pause_seconds,
        canary=canary,
        concurrency=concurrency,
    )
