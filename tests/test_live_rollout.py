"""Live rollout reporting (issue 16): a node that fails its upgrade is reported while the rollout goes on, not when
the step ends, and each batch says when it ended.  The steps hand events to ``Context.events``
(``runbook_lib/steps/events.py``); ``runbook run`` prints them as they come (``tests/test_run_live_events.py``).

The failing upgrade is the simulator's ``upgrade_fails`` (the real talosctl against simnode: the installer exits
non-zero, simnode/faults.go; the Python talosctl: its own wording, no source).  Batches, budgets and the lines are
this project's own design: no upstream tool defines them.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from runbook_lib.model.params import validate
from runbook_lib.notebook.live_events import file_sink, following
from runbook_lib.notebook.runner import scrubbed
from runbook_lib.sim.state import load_nodes
from runbook_lib.steps.context import Context, connect
from runbook_lib.steps.events import BatchDone, Events, NodeFailed, RolloutEvent, one_line
from runbook_lib.steps.image import image_upgrade
from tests.simcluster import factory_only, inject_fault


def _six_nodes(state: Path, **extra: Any) -> Context:
    """A context for the GPU workers of ``state`` (made by ``factory_only``), applying, with ``extra`` parameters."""
    nodes = [{"name": n.name, "address": n.address} for n in load_nodes(state) if n.gpus]
    data = {"cluster": "sim-gpu", "talos_version": "v1.12.7", "nodes": nodes, "track": "lts", "apply": True}
    return connect(validate(data | extra, source="test"), state_dir=state)


@pytest.mark.slow
def test_a_failed_upgrade_is_reported_before_its_batch_mate_is_confirmed_and_every_batch_when_it_ends(
    tmp_path: Path,
) -> None:
    state = tmp_path / "sim"
    seen: list[tuple[RolloutEvent, list[tuple[str, ...]]]] = []
    # config-patched: the image step refuses nodes whose config lacks the modules patch
    with factory_only(state, workers=6, scenario="config-patched"):
        ctx = _six_nodes(state, rollout_concurrency=2, rollout={"max_failures": 1})
        middle, mate = ctx.params.nodes[2], ctx.params.nodes[3]  # batch 2 of 3
        inject_fault(state, middle.name, "upgrade_fails")
        ctx.events = Events(lambda event: seen.append((event, [e.argv for e in ctx.journal.entries])))
        result = image_upgrade(ctx, settle_timeout=5.0, poll_interval=0.1)

    assert result.data["failed"] == [middle.name] and len(result.data["done"]) == 5
    events = [event for event, _journal in seen]
    assert [type(e).__name__ for e in events] == ["BatchDone", "NodeFailed", "BatchDone", "BatchDone"]
    failed = events[1]
    assert isinstance(failed, NodeFailed) and failed.node == middle.name and failed.address == middle.address
    assert "upgrade failed" in failed.reason and "\n" not in failed.reason
    assert [
        (e.batch, e.batches, e.ok, e.failed, e.nodes_done, e.failed_total)
        for e in events
        if isinstance(e, BatchDone)
    ] == [
        (1, 3, 2, 0, 2, 0),
        (2, 3, 1, 1, 4, 1),
        (3, 3, 2, 0, 6, 1),
    ]
    # reported as soon as its upgrade returned: its batch-mate was not yet read back after its own upgrade
    journal = seen[1][1]
    # the mate's upgrade call: its own, or one talosctl over its batch's chunk (-n a,b; steps/image.py _groups), which
    # is journalled only once every node of it ended: not there yet is earlier still
    upgraded = [i for i, argv in enumerate(journal) if "upgrade" in argv and mate.address in " ".join(argv)]
    after = journal[upgraded[0] + 1 :] if upgraded else []
    assert not [argv for argv in after if mate.address in " ".join(argv)], (
        "reported only after the batch ended"
    )


def test_a_reason_is_one_line_and_bounded() -> None:
    assert one_line("\n  talosctl upgrade failed: boom\n(last phase: x)") == "talosctl upgrade failed: boom"
    assert len(one_line("x" * 1000)) == 300
    assert one_line("") == "no reason given"


def test_a_line_for_the_terminal_has_the_runs_secrets_scrubbed_like_the_record() -> None:
    """A talosctl error can quote a config value; the record is scrubbed at its seal, a terminal line must be too."""
    secret = "c2VjcmV0LWNsaWVudC1rZXktbWF0ZXJpYWwtMDEyMzQ1Njc4OQ=="
    got: list[dict[str, Any]] = []
    deliver = scrubbed(got.append, [secret])
    assert deliver is not None
    deliver(
        {"step": "image", "kind": "node_failed", "node": "gpu-3", "reason": f"bad key {secret} in config"}
    )
    assert (
        secret not in json.dumps(got) and got[0]["node"] == "gpu-3" and got[0]["reason"].startswith("bad key")
    )
    deliver(
        {"step": "image", "kind": "other", "nodes": [{"reason": f"key {secret}"}]}
    )  # nested: review of 8521977
    assert secret not in json.dumps(got[1]) and got[1]["nodes"][0]["reason"].startswith("key ")


def test_the_follower_hands_on_whole_lines_in_order_and_the_rest_at_the_end(tmp_path: Path) -> None:
    """The kernel appends while the runner reads: a line cut short is left for the next read, never lost or doubled."""
    path, got = tmp_path / "image.events.jsonl", list[dict[str, Any]]()
    with following(path, got.append), path.open("a") as out:
        out.write('{"batch": 1}\n{"bat')
        out.flush()
        deadline = time.monotonic() + 60
        while not got and time.monotonic() < deadline:  # the follower's thread reads it
            time.sleep(0.01)
        assert got == [{"batch": 1}]
        out.write('ch": 2}\n')
    assert got == [{"batch": 1}, {"batch": 2}]


def test_the_kernels_sink_appends_the_event_and_prints_its_line_for_the_executed_notebook(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """In a ``runbook run`` kernel the line printed is the step cell's output, so the executed notebook in the record
    shows it as the terminal did; the JSON line is what ``runbook run`` follows."""
    path = tmp_path / "image.events.jsonl"
    file_sink(path, "image")(NodeFailed("gpu-3", "10.5.0.5", "talosctl upgrade failed: install failed"))
    kept = json.loads(path.read_text())
    assert (kept["step"], kept["kind"], kept["node"]) == ("image", "node_failed", "gpu-3")
    printed = "image: gpu-3 (10.5.0.5) failed: talosctl upgrade failed: install failed\n"
    assert capsys.readouterr().out == printed
