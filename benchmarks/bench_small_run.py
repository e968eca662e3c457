"""A small change's own time (issue 16 point 5): ``runbook run --apply`` on 8 fresh GPU nodes, all six steps, on the
simulated cluster as ``runbook run`` brings it up by default, against the run's critical path.

The issue's definition: "on 8 nodes at the DEFAULT time scale, the runbook's own time (wall minus the simulated
critical path of talosctl round trips, upgrades, reboots and pod runs) ≤ 10% of the critical path".  So the
cluster is the default one: the real talosctl v1.12.0 against simnode at its default time factor
(``RUNBOOK_SIM_TIME_SCALE`` unset: ``realtalos.DEFAULT_TIME_FACTOR``, 0.05, an upgrade's installer pull and install
2 s and the reboot 3 s), and the Kubernetes control plane ``runbook run`` starts (``RUNBOOK_SIM_KUBE`` unset: the
real one where ``make kube-tools`` built it, its pods on kwok stages at the same factor).  Until 2 Dec this figure
came from ``bench_fleet.py`` on the Python simulator, whose upgrades, reboots and pods take no time, at 50 ms per
call: a critical path of round trips only (1.1 s), which is not what the issue defines.

- **wall**: ``runbook run -p <8 nodes, scenario fresh> --apply --no-progress`` from start to exit, after ``runbook sim
  up -p`` (the simulator's own start is not the run's);
- **critical path**: the run's talosctl calls (every step's journal) grouped into sequential waves (calls whose
  spans overlap ran together, :func:`wave_seconds`), each wave as long as its slowest call can be alone: an
  upgrade ``T`` (one node's ``upgrade --wait`` alone after the run, median of 3), any other call ``R`` (one
  ``get extensions`` of one node alone, median of 5: the binary's start, mTLS and simnode's answer); plus the
  Kubernetes and cuda-test steps' cluster time (``helm upgrade --install --wait`` and the ``wait: …`` entries:
  the device plugin rolling out, GPUs appearing, the test pods running to completion);
- **own time** = wall − critical path (the run's one kernel start-up, papermill, the CLI, sealing the record, the
  library's work); target ≤ 0.10 × the critical path;
- **CPU**: user + system seconds of ``runbook run`` and every process it waited for (its kernel, the talosctl and
  helm calls, the HTML process), which a loaded machine inflates far less than the wall time.

``python -m benchmarks small_run``; ``BENCH_SMALL_NODES`` (default 8).  Figures in ``benchmarks/results.json``
under ``small_run``.  Skips without Go.
"""

from __future__ import annotations

import functools
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.bench_fleet import kernel_startup
from benchmarks.bench_whole_change import (
    EXPECTED,
    STEPS,
    Run,
    checked,
    cluster_time,
    installer,
    run_apply,
    runbook,
    start_of,
    step_walls,
    upgrade_alone,
    write_params,
)
from benchmarks.real_fleet import Cli, go_on_path, timed, update_results
from tests.sim.test_library_real_talosctl import TALOS
from tests.sim.test_real_talosctl import build

RESULTS = Path(__file__).resolve().parent / "results.json"
TARGET_OWN = 0.10
SLOW_CALLS = ("upgrade", "reboot")  # calls that last a node's upgrade or reboot, not one round trip


def wave_seconds(calls: Sequence[tuple[float, float, bool]], round_trip_s: float, upgrade_s: float) -> float:
    """The talosctl part of the critical path: calls ``(start, end, slow)`` sorted by start fall into sequential
    waves (a call that starts before the wave's last end ran with it); each wave costs what its slowest call
    costs alone (``upgrade_s`` for an upgrade or reboot, else ``round_trip_s``), since the calls of a wave could
    all run at once while a wave that starts after another ended may depend on its answer."""
    total, end, cost = 0.0, float("-inf"), 0.0
    for start, stop, slow in sorted(calls):
        if start >= end:
            total += cost
            end, cost = stop, 0.0
        end = max(end, stop)
        cost = max(cost, upgrade_s if slow else round_trip_s)
    return total + cost


def talosctl_calls(run: Run) -> list[tuple[float, float, bool]]:
    """Every talosctl call of the run as ``(start, end, slow)``, from the step journals as written."""
    return [
        (start_of(e), float(e["at"]), any(word in e["argv"] for word in SLOW_CALLS))
        for step in STEPS
        for e in run.journal(step)
        if e.get("kind") == "command" and str(e.get("argv", [""])[0]).endswith("talosctl")
    ]


def round_trip(cli: Cli, node: str) -> float:
    """R: one ``get extensions`` of one node alone, median of 5."""
    return statistics.median(
        timed(functools.partial(cli.call, ["get", "extensions"], [node])) for _ in range(5)
    )


def measure(work: Path, nodes: int, kernels: Callable[[], float]) -> dict[str, Any]:
    addresses = write_params(work, nodes, nodes, 0)
    runbook(work, None, "sim", "up", "-p", str(work / "params.json"))
    try:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        run = checked(run_apply(work, None), work, EXPECTED)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cli = Cli(work / "state" / "bin" / "talosctl", work / "state" / "talosconfig")
        upgrade_s, _cpu = upgrade_alone(cli, addresses, installer(run))
        trip = round_trip(cli, addresses[0])
        kube_plane = json.loads((work / "state" / "endpoints.json").read_text()).get("kube", "")
    finally:
        runbook(work, None, "sim", "down")
    calls = talosctl_calls(run)
    talos = wave_seconds(calls, trip, upgrade_s)
    kube, cuda = cluster_time(run, "kubernetes"), cluster_time(run, "cuda-test")
    critical = talos + kube + cuda
    walls = step_walls(run)
    return {
        "nodes": nodes,
        "kubernetes_api": "real control plane"
        if str(kube_plane).startswith("https://")
        else "Python simulator",
        "wall_s": round(run.wall_s, 2),
        "critical_path_s": round(critical, 2),
        "own_time_s": round(run.wall_s - critical, 2),
        "own_time_ratio": round((run.wall_s - critical) / critical, 2),
        "run_cpu_s": round(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, 2),
        "talosctl_calls": len(calls),
        "talosctl_waves_s": round(talos, 2),
        "round_trip_s": round(trip, 3),
        "upgrade_alone_s": round(upgrade_s, 2),
        "kubernetes_cluster_s": round(kube, 2),
        "cuda_test_cluster_s": round(cuda, 2),
        "kernel_startup_s_each": round(kernels(), 2),
        "step_wall_s": walls,
    }


def report(fig: dict[str, Any]) -> None:
    met = "met" if fig["own_time_ratio"] <= TARGET_OWN else "NOT MET"
    print(
        f"-- {fig['nodes']} nodes, default time scale, Kubernetes: {fig['kubernetes_api']}: runbook run --apply "
        f"{fig['wall_s']:.1f} s; critical path {fig['critical_path_s']:.1f} s = talosctl waves "
        f"{fig['talosctl_waves_s']:.1f} s ({fig['talosctl_calls']} calls; a round trip {fig['round_trip_s']:.3f} s, "
        f"an upgrade T {fig['upgrade_alone_s']:.1f} s) + kubernetes {fig['kubernetes_cluster_s']:.1f} s + "
        f"cuda-test {fig['cuda_test_cluster_s']:.1f} s\n"
        f"   own time {fig['own_time_s']:.1f} s = {fig['own_time_ratio']:.2f}× the critical path (target ≤ "
        f"{TARGET_OWN:.2f}×: {met}); CPU of the run and its processes {fig['run_cpu_s']:.1f} s; a kernel "
        f"start-up alone {fig['kernel_startup_s_each']:.2f} s; steps: "
        + ", ".join(f"{k} {v:.1f} s" for k, v in fig["step_wall_s"].items()),
        flush=True,
    )


def main() -> int:
    if not go_on_path():
        return 0
    nodes = int(os.environ.get("BENCH_SMALL_NODES", "8"))
    build("build-talosctl.sh", TALOS)
    build("build-simnode.sh")
    with tempfile.TemporaryDirectory(prefix="bench-small-") as tmp:
        fig = measure(Path(tmp), nodes, kernel_startup)
    fig["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    report(fig)
    update_results(RESULTS, "small_run", fig)
    return 0 if fig["own_time_ratio"] <= TARGET_OWN else 1


if __name__ == "__main__":
    if (rc := main()) != 0:
        sys.exit(rc)
