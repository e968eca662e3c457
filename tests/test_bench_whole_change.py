"""The floor arithmetic of ``benchmarks/bench_whole_change.py`` (issue 16 point 2): the rolling floor ⌈N/c⌉·T, the
rollout's batches recovered from the journal's upgrade calls, and the cluster time of a step (overlapping waits
counted once).  The journal entries are shaped as the runbook journals them (``at`` is when the entry was
written, at the command's end; ``duration_s`` its length), as read from a record of ``runbook run --apply``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.bench_whole_change import (
    Run,
    batches_by_start,
    cluster_time,
    cpu_bound_floor,
    failed_checks,
    failure_event_time,
    failure_line_time,
    in_batches,
    label_phase,
    merged_figures,
    node_spans,
    outcomes,
    rolling_floor,
    start_of,
)
from benchmarks.real_fleet import union_seconds
from runbook_lib.notebook.live_events import event_line


def test_the_rolling_floor_counts_a_partial_last_batch_as_a_whole_one() -> None:
    assert rolling_floor(1000, 125, 6.0) == 8 * 6.0
    assert rolling_floor(1000, 300, 6.0) == 4 * 6.0  # 300, 300, 300, 100
    assert rolling_floor(10, 50, 6.0) == 6.0


@pytest.mark.parametrize(("nodes", "concurrency", "t"), [(0, 5, 1.0), (5, 0, 1.0), (5, 5, -1.0)])
def test_the_rolling_floor_refuses_what_is_no_fleet(nodes: int, concurrency: int, t: float) -> None:
    with pytest.raises(ValueError, match="must be"):
        rolling_floor(nodes, concurrency, t)


def test_on_few_cores_a_wide_batch_is_as_long_as_its_talosctl_processes_cpu() -> None:
    # 125 upgrades of 0.3 s CPU each on 2 cores: 18.75 s per batch, longer than T = 6 s; 8 batches
    assert cpu_bound_floor(1000, 125, 6.0, 0.3, 2) == pytest.approx(8 * 18.75)
    # 25 at once need 3.75 s of the 2 cores: T bounds the batch
    assert cpu_bound_floor(100, 25, 6.0, 0.3, 2) == pytest.approx(4 * 6.0)
    # a batch wider than the fleet only runs the fleet's nodes
    assert cpu_bound_floor(10, 50, 6.0, 0.3, 2) == pytest.approx(6.0)


def test_batches_are_recovered_from_call_starts_whatever_order_the_journal_holds_them_in() -> None:
    # batch 1 starts at 0 s, batch 2 after batch 1's slowest node (6.4 s); the journal lists calls as they end
    starts = [0.03, 0.01, 0.02, 6.41, 6.40, 6.43, 12.9]
    assert batches_by_start(starts, 3) == [[0.01, 0.02, 0.03], [6.40, 6.41, 6.43], [12.9]]


def test_overlapping_spans_count_once() -> None:
    assert union_seconds([(0.0, 2.0), (1.0, 3.0), (5.0, 6.0)]) == pytest.approx(4.0)
    assert union_seconds([]) == 0.0


def entry(kind: str, summary: str, argv: list[str], at: float, duration: float) -> dict[str, Any]:
    return {"kind": kind, "summary": summary, "argv": argv, "at": at, "duration_s": duration}


def test_a_steps_cluster_time_is_its_helm_wait_and_its_waits_not_its_other_calls(tmp_path: Path) -> None:
    helm = "/s/bin/helm"
    journal = [
        entry("command", f"{helm} list -n kube-system", [helm, "list", "-n", "kube-system"], 10.0, 0.1),
        entry(
            "command", f"{helm} upgrade --install", [helm, "upgrade", "--install", "x", "--wait"], 12.0, 1.5
        ),
        entry("api", "wait: pods of nvidia-device-plugin until ready", [], 13.0, 1.0),
        entry("api", "create RuntimeClass nvidia (handler nvidia)", [], 13.1, 0.0),
        entry(
            "api", "wait: every GPU node advertises nvidia.com/gpu", [], 13.5, 1.0
        ),  # overlaps the one above
    ]
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "kubernetes.json").write_text(json.dumps({"journal": journal}))
    run = Run(0, 0.0, 20.0, [], tmp_path)
    assert start_of(journal[1]) == pytest.approx(10.5)
    assert cluster_time(run, "kubernetes") == pytest.approx(1.5 + 1.5)  # 10.5-12.0 and 12.0-13.5
    assert cluster_time(run, "cuda-test") == 0.0  # no journal: no cluster time


def test_the_first_failure_is_timed_by_its_live_line_not_by_the_step_line_at_the_end() -> None:
    """``runbook run`` prints a node's failure as the image step learns it (``runbook_lib/cli/live.py``) and the
    step lines when the run ends; the benchmark's "time to the first failure report" is the first one's time."""
    failed = {"step": "image", "kind": "node_failed", "node": "gpu-0050", "address": "10.5.0.53"}
    failed["reason"] = "talosctl upgrade failed: sequence: upgrade action: NOOP error: install failed"
    batch = {"step": "image", "kind": "batch_done", "batch": 2, "batches": 2, "ok": 49, "failed": 1}
    batch |= {"nodes_done": 100, "nodes_total": 100, "failed_total": 1}
    lines = [
        (10.0, event_line(failed)),
        (14.0, event_line(batch)),
        (30.0, "preflight     ok            2.1 s  3 ok"),
        (30.0, "image         failed       20.5 s  99 changed, 1 failed"),
    ]
    run = Run(1, 0.0, 31.0, lines, None)
    assert failure_line_time(run, "gpu-0050") == 10.0
    assert failure_line_time(run, "gpu-0005") is None
    assert run.line_time("image") == 30.0
    assert outcomes(run) == {"preflight": "ok", "image": "failed"}  # the live lines are not step lines


def test_the_failures_emission_is_read_from_the_records_events_file(tmp_path: Path) -> None:
    """The line's delay splits into the step's (its kernel emits the event, ``at``) and the delivery's."""
    (tmp_path / "results").mkdir()
    batch = {"step": "image", "at": 5.0, "kind": "batch_done", "batch": 1, "batches": 2}
    failed = {"step": "image", "at": 7.5, "kind": "node_failed", "node": "gpu-0050", "address": "10.5.0.53"}
    lines = [json.dumps(batch), json.dumps(failed | {"reason": "talosctl upgrade failed: x"})]
    (tmp_path / "results" / "image.events.jsonl").write_text("\n".join(lines) + "\n")
    run = Run(1, 0.0, 31.0, [], tmp_path)
    assert failure_event_time(run, "gpu-0050") == 7.5
    assert failure_event_time(run, "gpu-0049") is None
    assert failure_event_time(Run(1, 0.0, 1.0, [], None), "gpu-0050") is None


def test_an_upgrade_call_over_a_chunk_counts_for_each_of_its_nodes() -> None:
    """Since 2 Dec 2026 one talosctl process upgrades a chunk of a batch (``-n a,b,c``): two batches of 3 nodes at
    c = 3, the first as one call of 3 nodes, the second as calls of 2 and 1."""

    def call(nodes: str, start: float, end: float, rc: int = 0) -> dict[str, Any]:
        argv = ["talosctl", "-n", nodes, "upgrade"]
        return {"argv": argv, "at": end, "duration_s": end - start, "exit_code": rc}

    entries = [call("a,b,c", 0.0, 6.0), call("d,e", 7.0, 13.5, 1), call("f", 7.1, 13.0)]
    spans = node_spans(entries)
    assert [s[0] for s in spans] == ["a", "b", "c", "d", "e", "f"]
    assert [s[3] for s in spans] == [0, 0, 0, 1, 1, 0]
    assert in_batches(entries, 3) == pytest.approx(6.0 + 6.5)


def test_a_failed_run_says_which_checks_failed_and_keeps_its_record(tmp_path: Path) -> None:
    record = tmp_path / "records" / "20261202T123130Z-whole1000-x"
    record.mkdir(parents=True)
    checks = [
        {"name": "helm release", "ok": True},
        {"name": "GPUs advertised", "ok": False, "message": "900 of 1000"},
    ]
    steps = [
        {"name": "verify", "status": "ok", "result": {"checks": [{"name": "x", "ok": False}]}},
        {"name": "kubernetes", "status": "failed", "result": {"checks": checks}},
    ]
    (record / "record.json").write_text(json.dumps({"steps": steps}))
    run = Run(1, 0.0, 1.0, [], record)
    assert failed_checks(run) == ["kubernetes: GPUs advertised: 900 of 1000"]


def test_the_kubernetes_steps_label_phase_and_helm_wait_are_read_from_its_journal(tmp_path: Path) -> None:
    """The 1,000-node run of 2 Dec 2026 failed in the kubernetes step after 1,000 labels took 227 s and helm's
    ``--wait`` 304 s; both figures now come with every run. Each label is journaled as its call ends
    (``Kube.label_node``: ``label Node <name> {labels}``, no duration)."""
    helm = "/s/bin/helm"
    journal = [
        entry("api", "label Node gpu-0001 {'nvidia.com/gpu.present': 'true'}", [], 100.0, 0.0),
        entry("api", "label Node gpu-0000 {'nvidia.com/gpu.present': 'true'}", [], 99.0, 0.0),
        entry("api", "label Node gpu-0002 {'nvidia.com/gpu.present': 'true'}", [], 103.5, 0.0),
        entry("command", f"{helm} repo update", [helm, "repo", "update"], 98.0, 2.0),
        entry(
            "command", f"{helm} upgrade --install", [helm, "upgrade", "--install", "x", "--wait"], 120.0, 16.0
        ),
    ]
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "kubernetes.json").write_text(json.dumps({"journal": journal}))
    run = Run(0, 0.0, 200.0, [], tmp_path)
    assert label_phase(run) == {"labels": 3, "label_s": 4.5, "helm_wait_s": 16.0}
    assert label_phase(Run(0, 0.0, 1.0, [], None)) == {"labels": 0, "label_s": 0.0, "helm_wait_s": 0.0}


def _figures(nodes: int, *concurrency: int, failure: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {
        "settings": {"nodes": nodes, "concurrency": list(concurrency)},
        "runs": [{"concurrency": c, "ratio_to_floor": 2.0 + c / 1000} for c in concurrency],
        "measured_at": f"run with c={concurrency}",
    }
    return out | ({"first_failure": {"concurrency": max(concurrency), "reported_s": 9.9}} if failure else {})


def test_a_run_at_another_concurrency_keeps_the_earlier_runs_of_the_same_fleet_size() -> None:
    """One 1,000-node run takes ~12 min per c, so the issue's two values of c come from two runs: the second must
    not drop the first's figures from results.json."""
    first = merged_figures({}, _figures(1000, 250))
    both = merged_figures(first, _figures(1000, 100, failure=True))
    assert [r["concurrency"] for r in both["1000"]["runs"]] == [100, 250]
    assert both["1000"]["settings"]["concurrency"] == [100, 250]
    assert both["1000"]["first_failure"]["concurrency"] == 100
    assert both["1000"]["runs"][1]["measured_at"] == "run with c=(250,)"  # each run says when it was measured
    rerun = _figures(1000, 250)
    rerun["runs"][0]["ratio_to_floor"], rerun["measured_at"] = 9.9, "the re-run"
    again = merged_figures(both, rerun)  # a re-run of c = 250 replaces that run only
    assert [(r["concurrency"], r["ratio_to_floor"]) for r in again["1000"]["runs"]] == [
        (100, 2.1),
        (250, 9.9),
    ]
    assert again["1000"]["runs"][1]["measured_at"] == "the re-run"
    assert again["1000"]["first_failure"]["concurrency"] == 100  # kept: the new run measured no failure
    assert merged_figures(again, _figures(100, 50))["1000"] == again["1000"]  # another size leaves it alone


def test_a_run_stored_before_runs_had_their_own_date_takes_its_sizes_date() -> None:
    """results.json of 4 Dec 01:21 has one date for the size, none per run: the run keeps that date."""
    stored = _figures(1000, 250)
    stored["measured_at"] = "2026-12-04T01:21:05Z"
    merged = merged_figures({"1000": stored}, _figures(1000, 100))
    assert merged["1000"]["runs"][1]["measured_at"] == "2026-12-04T01:21:05Z"
