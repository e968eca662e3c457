"""The overview notebook's plan table (issue 17 point 4): the rollout row says how the GPU nodes will be
changed (canary, batch sizes, failure budget, pause), not only ``rollout_concurrency``.  These controls are
the project's own (runbook_lib/model/rollout.py); no upstream source defines them."""

from __future__ import annotations

import html
import re
from pathlib import Path

from runbook_lib.notebook.steps import overview

PARAMS = str(Path(__file__).resolve().parents[1] / "params" / "simulated.yaml")


def rollout_row(*overrides: str) -> str:
    table = overview(PARAMS, overrides=overrides, show=False)
    row = re.search(r"<tr><th>rollout</th><td>(.*?)</td></tr>", table)
    assert row is not None, table
    return html.unescape(row[1])


def test_rollout_row_shows_canary_batches_failure_budget_and_pause() -> None:
    row = rollout_row(
        "rollout_concurrency=2", "rollout.canary=1", "rollout.max_failures=1", "rollout.pause_seconds=30"
    )
    assert "3 node(s) in 2 batch(es) of 1, 2" in row
    assert "canary 1, then doubling up to rollout_concurrency 2" in row
    assert "no new batch once more than 1 node(s) failed" in row and "30 s pause between batches" in row
    assert "apply: False" in row


def test_rollout_row_with_the_defaults_says_one_node_at_a_time_and_stop_at_the_first_failure() -> None:
    row = rollout_row()
    assert "3 node(s) in 3 batch(es) of 1, 1, 1 (rollout_concurrency 1 each)" in row
    assert "stops after the first failed node" in row and "pause" not in row


def test_a_percentage_budget_is_shown_with_the_nodes_it_allows() -> None:
    row = rollout_row("rollout.max_failures=50%")
    assert "50%" in row and "no new batch once more than 1 node(s) failed" in row
