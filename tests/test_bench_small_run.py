"""The critical path of ``benchmarks/bench_small_run.py`` (issue 16 point 5): the run's talosctl and helm calls, as
the step journals give them (``at`` written at the call's end, ``duration_s`` its length), fall into sequential
waves, each as long as its slowest call alone, and never shorter than the CPU its calls need on this machine's
cores."""

from __future__ import annotations

import json
import time
from pathlib import Path

from benchmarks.bench_small_run import (
    TALOSCTL,
    UPGRADE,
    Cost,
    alone,
    alone_kind,
    external_calls,
    tool_costs,
    verdict,
    wave_seconds,
)
from benchmarks.bench_whole_change import Run

COSTS = {TALOSCTL: Cost(0.03, 0.0), UPGRADE: Cost(6.0, 0.0)}


def test_overlapping_calls_are_one_wave_and_an_upgrade_wave_costs_an_upgrade() -> None:
    calls = [(0.0, 0.1, TALOSCTL), (0.05, 0.2, TALOSCTL), (1.0, 7.0, UPGRADE), (1.1, 7.5, UPGRADE)]
    calls.append((8.0, 8.1, TALOSCTL))
    assert wave_seconds(calls, COSTS, cores=2) == 0.03 + 6.0 + 0.03


def test_calls_one_after_another_each_cost_a_round_trip() -> None:
    calls = [(float(i), i + 0.5, TALOSCTL) for i in range(4)]
    assert wave_seconds(calls, COSTS, cores=2) == 4 * 0.03
    assert wave_seconds([], COSTS, cores=2) == 0.0


def test_a_wave_of_many_calls_costs_at_least_their_cpu_spread_over_the_cores() -> None:
    """verify starts 13 talosctl processes at once on 8 nodes: on 2 cores they cannot all end within one call's
    time alone when each needs 0.05 s of CPU (the real tool's start-up and mTLS, not the runbook's)."""
    costs = {TALOSCTL: Cost(0.09, 0.05)}
    wave = [(0.0, 1.0, TALOSCTL)] * 13
    assert wave_seconds(wave, costs, cores=2) == 13 * 0.05 / 2
    assert wave_seconds(wave[:2], costs, cores=2) == 0.09  # two calls fit in one call's time


def _journal(results: Path, step: str, entries: list[dict[str, object]]) -> None:
    (results / f"{step}.json").write_text(json.dumps({"journal": entries}))


def test_helm_calls_are_waves_too_but_its_waiting_install_is_the_kubernetes_steps_cluster_time(
    tmp_path: Path,
) -> None:
    """``helm repo add``, ``repo update`` and ``list`` are the real helm's round trips, which a run cannot skip: until
    2 Dec afternoon they counted as the runbook's own time.  ``helm upgrade --install --wait`` is counted once, as the time the
    cluster took (``cluster_time``).  Entries as an 8-node run of 2 Dec journaled them."""
    results = tmp_path / "results"
    results.mkdir()
    talosctl, helm = "/state/bin/talosctl", "/state/bin/helm"
    kubeconfig = ["--kubeconfig", "/state/kubeconfig"]
    _journal(
        results,
        "image",
        [
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
        ],
    )
    repo_add = [helm, "repo", "add", "nvdp", "http://127.0.0.1:39197", *kubeconfig]
    install = [
        helm,
        "upgrade",
        "--install",
        "nvidia-device-plugin",
        "nvdp/nvidia-device-plugin",
        "--wait",
        *kubeconfig,
    ]
    _journal(
        results,
        "kubernetes",
        [
            {"kind": "command", "argv": repo_add, "at": 20.0, "duration_s": 0.2},
            {"kind": "api", "summary": "create RuntimeClass nvidia (handler nvidia)", "at": 20.1},
            {"kind": "command", "argv": install, "at": 23.0, "duration_s": 2.0},
        ],
    )
    run = Run(0, 0.0, 30.0, [], tmp_path)
    assert sorted(external_calls(run)) == [
        (10.0, 10.5, alone_kind([talosctl, "get", "extensions", "-n", "10.5.0.3"])),
        (11.0, 17.0, UPGRADE),
        (19.8, 20.0, " ".join(repo_add)),
    ]


def test_a_call_alone_costs_its_fastest_sample_because_load_only_ever_adds_time() -> None:
    """Each "alone" cost is measured after the run on a shared machine; a sample slowed by another process inflates
    the critical path and so flatters the runbook (a round trip of 0.48 s under load turned 0.55x into 0.08x on
    2 Dec). The fastest sample is the one nearest what the tool needs."""
    pauses = iter([0.3, 0.0, 0.3])
    cost = alone(lambda: time.sleep(next(pauses)), 3)
    assert cost.alone_s < 0.15


def test_a_run_on_a_machine_busier_than_its_cores_is_not_settled_whatever_its_ratio() -> None:
    assert verdict(0.05, load_max=1.5, cores=2) == "met"
    assert verdict(0.05, load_max=7.0, cores=2).startswith("not settled")
    assert "7.0" in verdict(0.05, load_max=7.0, cores=2)
    assert verdict(0.4, load_max=7.0, cores=2) == "NOT MET"


def test_a_reading_talosctl_call_costs_its_own_command_line_alone_not_one_round_trip(tmp_path: Path) -> None:
    """The real ``talosctl get -n a,b,…`` asks its nodes one after another (reality-gaps.md §2 row 3; talos v1.12.0
    cmd/talosctl/cmd/talos/get.go), so where each node answers with latency an 8-node get alone lasts about 8 round
    trips, not R: counting it as R put the rest in the runbook's own time.  A reading call (and a dry-run patch) is
    run again alone after the run, as the run made it; a call that changes a node (an applied patch, upgrade,
    reboot) keeps R or T, and so does ``service … restart``."""
    results = tmp_path / "results"
    results.mkdir()
    fake = tmp_path / "bin" / "talosctl"
    fake.parent.mkdir()
    # stands in for a slow multi-node get; only its duration matters
    fake.write_text("#!/bin/sh\nsleep 0.3\n")
    fake.chmod(0o755)
    get8 = [str(fake), "--talosconfig", "/state/talosconfig", "-n", "10.5.0.3,10.5.0.4", "get", "extensions"]
    patch = [str(fake), "--talosconfig", "/state/talosconfig", "-n", "10.5.0.3", "patch", "mc", "-p", "@x"]
    _journal(
        results,
        "preflight",
        [
            {"kind": "command", "argv": get8, "at": 1.3, "duration_s": 0.3},
            {"kind": "command", "argv": patch, "at": 2.0, "duration_s": 0.1},
        ],
    )
    run = Run(0, 0.0, 3.0, [], tmp_path)
    assert [kind for _s, _e, kind in external_calls(run)] == [alone_kind(get8), TALOSCTL]
    dry = [*patch, "--dry-run"]
    restart = [
        str(fake),
        "--talosconfig",
        "/state/talosconfig",
        "-n",
        "10.5.0.3",
        "service",
        "kubelet",
        "restart",
    ]
    follow = [str(fake), "--talosconfig", "/state/talosconfig", "-n", "10.5.0.3", "logs", "-f", "kubelet"]
    entries = [
        {"kind": "command", "argv": a, "at": 5.0 + i, "duration_s": 0.1}
        for i, a in enumerate([dry, restart, follow])
    ]
    _journal(results, "verify", entries)
    assert [kind for _s, _e, kind in external_calls(run)][2:] == [alone_kind(dry), TALOSCTL, TALOSCTL]
    _journal(results, "verify", [])

    class NoCli:
        def call(self, args: list[str], nodes: list[str]) -> None:  # R: one get of one node
            time.sleep(0.01)

    costs = tool_costs(run, NoCli(), "10.5.0.3", (6.0, 0.1))  # type: ignore[arg-type]
    assert costs[alone_kind(get8)].alone_s >= 0.3 > costs[TALOSCTL].alone_s
    calls = external_calls(run)
    assert wave_seconds(calls, costs, 2) >= 0.3 + costs[TALOSCTL].alone_s
