"""The critical path of ``benchmarks/bench_small_run.py`` (issue 16 point 5): the run's talosctl calls, as the step
journals give them (``at`` written at the call's end, ``duration_s`` its length), fall into sequential waves, each
as long as its slowest call alone."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.bench_small_run import talosctl_calls, wave_seconds
from benchmarks.bench_whole_change import Run


def test_overlapping_calls_are_one_wave_and_an_upgrade_wave_costs_an_upgrade() -> None:
    calls = [(0.0, 0.1, False), (0.05, 0.2, False), (1.0, 7.0, True), (1.1, 7.5, True), (8.0, 8.1, False)]
    assert wave_seconds(calls, round_trip_s=0.03, upgrade_s=6.0) == 0.03 + 6.0 + 0.03


def test_calls_one_after_another_each_cost_a_round_trip() -> None:
    calls = [(float(i), i + 0.5, False) for i in range(4)]
    assert wave_seconds(calls, round_trip_s=0.02, upgrade_s=6.0) == 4 * 0.02
    assert wave_seconds([], round_trip_s=0.02, upgrade_s=6.0) == 0.0


def test_the_calls_are_read_from_every_steps_journal_and_helm_is_left_out(tmp_path: Path) -> None:
    results = tmp_path / "results"
    results.mkdir()
    talosctl = "/state/bin/talosctl"
    image = [
        {
            "kind": "command",
            "argv": [talosctl, "get", "extensions", "-n", "10.5.0.3"],
            "at": 10.5,
            "duration_s": 0.5,
        },
        {
            "kind": "command",
            "argv": [talosctl, "upgrade", "--image", "x", "-n", "10.5.0.3"],
            "at": 17,
            "duration_s": 6,
        },
    ]
    kube = [{"kind": "command", "argv": ["/state/bin/helm", "list", "-A"], "at": 20.0, "duration_s": 0.2}]
    (results / "image.json").write_text(json.dumps({"journal": image}))
    (results / "kubernetes.json").write_text(json.dumps({"journal": kube}))
    run = Run(0, 0.0, 30.0, [], tmp_path)
    assert sorted(talosctl_calls(run)) == [(10.0, 10.5, False), (11.0, 17.0, True)]
