"""The simulated cluster on the real Kubernetes control plane at fleet size (issue 15): how long ``runbook sim up``
takes until every Node is Ready, how much memory each control-plane process holds, and ``runbook sim down``.

Per size N (``BENCH_REAL_PLANE_SIZES``, default ``10,100,1000``), on a fresh state dir, with
``RUNBOOK_SIM_KUBE=real`` (simkube: etcd, kube-apiserver, kube-controller-manager, kube-scheduler; kwok; the
supervisor's node agent, kubelet API and GPU Operator controller) and the Python Talos simulator
(``RUNBOOK_SIM_TALOSCTL=python``: simnode's start is not what this measures):

- **up**: ``runbook sim up --nodes N`` from its start to its exit (N GPU workers and one control-plane node, so
  N + 1 Node objects, registered before it returns);
- **ready**: from the same start until the real API server lists N + 1 Nodes, all ``Ready=True`` (kwok posts
  their status), polled with the state's kubectl; the budget applies to this figure;
- **peak RSS** of each process of the cluster (``VmHWM`` in ``/proc/<pid>/status``, read after the nodes were
  Ready and ``BENCH_REAL_PLANE_HOLD_S`` more seconds of lease renewals), their sum (an upper bound of the peak of
  the sum) and the control plane's part (all but the simulator daemon: Image Factory and tool server);
- **down**: ``runbook sim down`` from its start to its exit, and every process that still names the state dir
  right after it returned (must be none);
- **again** (``BENCH_REAL_PLANE_AGAIN``, default on; ``0`` leaves it out): ``sim up``, Ready and ``sim down`` once
  more on the same state dir, which keeps simkube's CA, tokens, keys and port (a warm start; not budgeted).

Figures go to ``benchmarks/results.json`` under ``real_plane``. Skips, saying what to build, when the control
plane is not built (``make kube-tools``). Exits 1 when a budget is missed or anything is left running.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from runbook_lib.sim import realkube

RESULTS = Path(__file__).resolve().parent / "results.json"
ROOT = Path(__file__).resolve().parents[1]
KUBERNETES = "1.35.0"  # Talos 1.12's, what `runbook sim up` runs by default
#: seconds from `runbook sim up`'s start until every Node is Ready, per N: about 3x what 2 Dec 2026 measured on the
#: shared 2-core machine at load 8-15 (10: 12 s, 100: 15 s, 1,000: 41 s; benchmarks/README.md)
BUDGET_S = {10: 45.0, 100: 45.0, 1000: 120.0}
#: the simulator's own processes: the supervisor runs the node agent (the kubelets' GPU side), the kubelet API
#: and the GPU Operator controller; the daemon the Image Factory and tool server (not Kubernetes)
SIMULATOR = {"runbook_lib.sim.realkube": "realkube supervisor", "runbook_lib.sim.daemon": "simulator daemon"}
KUBE_BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "simkube", "kwok")
#: what the control plane's memory figure sums: the Kubernetes binaries, kwok and the supervisor
CONTROL_PLANE = (*KUBE_BINARIES, "realkube supervisor")


# -- pure parts (tests/test_bench_real_plane.py) ---------------------------------------------------------------


def ready_nodes(node_list: Mapping[str, Any]) -> tuple[int, int]:
    """(Nodes whose ``Ready`` condition is ``True``, all Nodes) in a ``kubectl get nodes -o json`` List."""
    items = node_list.get("items") or []
    ready = sum(
        1
        for node in items
        if any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in (node.get("status") or {}).get("conditions") or []
        )
    )
    return ready, len(items)


def memory_kb(status: str) -> dict[str, int]:
    """``VmHWM`` (peak RSS) and ``VmRSS`` in kB from ``/proc/<pid>/status`` (absent for a kernel thread: 0)."""
    found = {"VmHWM": 0, "VmRSS": 0}
    for line in status.splitlines():
        key, _, value = line.partition(":")
        if key in found:
            found[key] = int(value.split()[0])
    return found


def component(argv: Sequence[str]) -> str | None:
    """Which part of the simulated cluster a process is, from its command line; None for anything else."""
    if not argv:
        return None
    name = Path(argv[0]).name
    if name in KUBE_BINARIES:
        return name
    for module, label in SIMULATOR.items():
        if module in argv:
            return label
    return None


def sizes_from(text: str) -> list[int]:
    """``BENCH_REAL_PLANE_SIZES``: comma-separated positive node counts; anything else is an error naming it."""
    try:
        sizes = [int(n) for n in text.split(",")]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise ValueError(f"BENCH_REAL_PLANE_SIZES={text!r}: give positive node counts, e.g. 10,100,1000")
    return sizes


def budget_for(nodes: int) -> float:
    """The budget of the largest listed size not above ``nodes`` (linear in N above 1,000)."""
    if nodes > max(BUDGET_S):
        return BUDGET_S[max(BUDGET_S)] * nodes / max(BUDGET_S)
    return BUDGET_S[max((n for n in BUDGET_S if n <= nodes), default=min(BUDGET_S))]


def verdict(ready_s: float | None, budget_s: float, left_running: Sequence[str]) -> tuple[bool, str]:
    """Met when every Node was Ready within the budget and ``sim down`` left nothing running; why not."""
    why = []
    if ready_s is None:
        why.append("the Nodes never all became Ready")
    elif ready_s > budget_s:
        why.append(f"Ready after {ready_s:.1f} s > {budget_s:.0f} s")
    if left_running:
        why.append(f"left running after sim down: {', '.join(left_running)}")
    return not why, "; ".join(why)


def summed(peaks: Mapping[str, Iterable[int]], names: Iterable[str]) -> int:
    """Sum of the peak RSS (kB) of every process of the named components."""
    return sum(sum(peaks.get(name, ())) for name in names)


# -- measuring ------------------------------------------------------------------------------------------------


def env() -> dict[str, str]:
    return {**os.environ, "RUNBOOK_SIM_KUBE": "real", "RUNBOOK_SIM_TALOSCTL": "python"}


def sim(state: Path, *args: str) -> float:
    """``runbook sim ARGS --state STATE``, which must succeed; its wall time."""
    started = time.perf_counter()
    argv = [sys.executable, "-m", "runbook_lib", "sim", *args, "--state", str(state)]
    proc = subprocess.run(
        argv, capture_output=True, text=True, env=env(), timeout=1800, check=False, cwd=ROOT
    )
    if proc.returncode != 0:
        raise RuntimeError(f"runbook sim {' '.join(args)} failed: {proc.stdout[-1000:]}{proc.stderr[-2000:]}")
    return time.perf_counter() - started


def processes_of(state: Path) -> dict[int, list[str]]:
    """pid -> argv of every process whose command line names the state dir."""
    found: dict[int, list[str]] = {}
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            argv = [os.fsdecode(a) for a in (proc / "cmdline").read_bytes().split(b"\0") if a]
        except OSError:
            continue
        if any(str(state) in a for a in argv):
            found[int(proc.name)] = argv
    return found


def peak_rss(state: Path) -> dict[str, list[int]]:
    """component -> peak RSS (kB) of each of its processes alive now."""
    peaks: dict[str, list[int]] = {}
    for pid, argv in processes_of(state).items():
        name = component(argv)
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        if name is not None:
            peaks.setdefault(name, []).append(memory_kb(status)["VmHWM"])
    return peaks


def wait_ready(state: Path, want: int, deadline_s: float, started: float) -> float | None:
    """Seconds from ``started`` until the API server lists ``want`` Nodes, all Ready; None past the deadline."""
    kubectl = [str(state / "bin" / "kubectl"), "--kubeconfig", str(state / "kubeconfig"), "get", "nodes"]
    while time.perf_counter() - started < deadline_s:
        proc = subprocess.run(
            [*kubectl, "-o", "json"], capture_output=True, text=True, check=False, timeout=120
        )
        if proc.returncode == 0 and ready_nodes(json.loads(proc.stdout)) == (want, want):
            return time.perf_counter() - started
        time.sleep(0.5)
    return None


def cycle(state: Path, nodes: int, deadline_s: float, hold_s: float) -> dict[str, Any]:
    """One ``sim up``, wait until every Node is Ready, hold, read the peaks, ``sim down``: the timings and peaks."""
    started = time.perf_counter()
    up_s = sim(state, "up", "--nodes", str(nodes))
    try:
        ready_s = wait_ready(state, nodes + 1, deadline_s, started)
        time.sleep(hold_s)
        peaks = peak_rss(state)
        # simkube's own start (etcd and kube-apiserver up and serving), part of up_s
        simkube_s = float(json.loads((state / "kube" / "simkube.json").read_text())["startup_seconds"])
    finally:
        down_s = sim(state, "down")
    return {"up_s": up_s, "ready_s": ready_s, "down_s": down_s, "peaks": peaks, "simkube_s": simkube_s}


def measure(work: Path, nodes: int, hold_s: float, again: bool) -> dict[str, Any]:
    """A fresh state dir (cold: simkube writes its PKI), then, with ``again``, ``sim up`` on the same state dir
    (warm: CA, tokens, keys and port kept, etcd emptied for the new cluster)."""
    state, budget = work / "state", budget_for(nodes)
    first = cycle(state, nodes, max(3 * budget, 600.0), hold_s)
    left = sorted({component(argv) or argv[0] for argv in processes_of(state).values()})
    met, why = verdict(first["ready_s"], budget, left)
    peaks = first["peaks"]
    fig = {
        "nodes": nodes,
        "node_objects": nodes + 1,
        "up_s": round(first["up_s"], 1),
        "simkube_start_s": rounded(first["simkube_s"]),
        "ready_s": rounded(first["ready_s"]),
        "budget_s": budget,
        "peak_rss_mb": {k: round(sum(v) / 1024, 1) for k, v in sorted(peaks.items())},
        "control_plane_peak_rss_mb": round(summed(peaks, CONTROL_PLANE) / 1024, 1),
        "all_peak_rss_mb": round(summed(peaks, peaks) / 1024, 1),
        "down_s": round(first["down_s"], 1),
        "left_running": left,
        "met": met,
        "why_not": why,
        "load_average_1m": round(os.getloadavg()[0], 1),
    }
    if again:
        second = cycle(state, nodes, max(3 * budget, 600.0), 0.0)
        fig["again"] = {k: rounded(second[k]) for k in ("up_s", "simkube_s", "ready_s", "down_s")}
        if still := sorted({component(argv) or argv[0] for argv in processes_of(state).values()}):
            fig["met"], fig["why_not"] = verdict(first["ready_s"], budget, sorted({*left, *still}))
    return fig


def rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 1)


def report(fig: Mapping[str, Any]) -> None:
    ready = "never" if fig["ready_s"] is None else f"{fig['ready_s']:.1f} s"
    state = "met" if fig["met"] else f"NOT MET ({fig['why_not']})"
    memory = ", ".join(f"{k} {v:.0f}" for k, v in fig["peak_rss_mb"].items())
    print(
        f"{fig['nodes']:>5} nodes: sim up {fig['up_s']:.1f} s (simkube {fig['simkube_start_s']} s), all {fig['node_objects']} Nodes Ready after {ready} "
        f"(budget {fig['budget_s']:.0f} s: {state}); sim down {fig['down_s']:.1f} s, left running: "
        f"{', '.join(fig['left_running']) or 'nothing'}\n"
        f"       peak RSS MB: control plane {fig['control_plane_peak_rss_mb']:.0f} (all {fig['all_peak_rss_mb']:.0f}): "
        f"{memory}; load {fig['load_average_1m']}",
        flush=True,
    )
    if "again" in fig:
        again = fig["again"]
        print(
            f"       again on the same state dir: sim up {again['up_s']} s (simkube {again['simkube_s']} s), Nodes Ready after {again['ready_s']} s, "
            f"sim down {again['down_s']} s",
            flush=True,
        )


def merge(figures: Mapping[str, Any]) -> None:
    """Into results.json beside the other benchmarks' figures, per size: a run of other sizes keeps these."""
    data = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    data.setdefault("real_plane", {}).update(figures)
    RESULTS.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def main() -> int:
    found = realkube.find_tools(KUBERNETES)
    if isinstance(found, str):
        print(f"SKIP: the real control plane is {found}")
        return 0
    try:
        sizes = sizes_from(os.environ.get("BENCH_REAL_PLANE_SIZES", "10,100,1000"))
        hold_s = float(os.environ.get("BENCH_REAL_PLANE_HOLD_S", "10"))
    except ValueError as exc:
        print(
            f"{exc} (BENCH_REAL_PLANE_SIZES: node counts; BENCH_REAL_PLANE_HOLD_S: seconds)", file=sys.stderr
        )
        return 2
    again = os.environ.get("BENCH_REAL_PLANE_AGAIN", "1") != "0"
    print(
        f"real control plane v{KUBERNETES} with kwok {realkube.KWOK_VERSION}, {os.cpu_count()} cores",
        flush=True,
    )
    figures: dict[str, Any] = {}
    for nodes in sizes:
        with tempfile.TemporaryDirectory(prefix=f"bench-real-plane-{nodes}-") as tmp:
            fig = measure(Path(tmp), nodes, hold_s, again)
        fig["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        figures[str(nodes)] = fig
        report(fig)
    merge(figures)
    print(f"figures in {RESULTS} under 'real_plane'")
    return 0 if all(f["met"] for f in figures.values()) else 1


if __name__ == "__main__":
    if (rc := main()) != 0:
        sys.exit(rc)
