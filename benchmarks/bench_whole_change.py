"""The whole change on a GPU fleet (issue 16 point 2): ``runbook run --apply``, all six steps from stock Talos to
CUDA tests passing, with the real talosctl v1.12.0 against simnode, measured against its floor; and how soon a
node that fails its upgrade in the middle of the fleet is reported.

Per ``rollout_concurrency`` c (``BENCH_WHOLE_CONCURRENCY``), on N fresh nodes (``BENCH_WHOLE_NODES``), all in one
run of this script (benchmarks/README.md defines each figure):

- **wall**: ``runbook run -p <N nodes, scenario fresh> --apply`` from its start to its exit, on a simulated
  cluster brought up beforehand by ``runbook sim up`` (so simnode's and the control plane's start are not in it;
  the real Kubernetes control plane, ``RUNBOOK_SIM_KUBE`` unset);
- **T**: one node's ``talosctl upgrade --image <the run's installer> --wait`` alone, on the same simnode right
  after the run (median of 3 nodes one after another): the upgrade-plus-reboot time no rollout can beat;
- **floor** = ⌈N/c⌉·T (the image step's batches, each as long as one upgrade) + the verify floor (verify's reads
  issued directly on the upgraded fleet, the fastest strategy of ``real_fleet.verify_pools``) + the Kubernetes
  and cuda-test steps' cluster time (their journals' ``helm upgrade --install --wait`` and ``wait: …`` entries:
  the simulated controllers' and kubelets' ticks, which no program can skip);
- **first failure** (``BENCH_WHOLE_FAILURE``, default on): the same fleet with node N/2 failing its installer
  (simnode's ``fail_install``, ``runbook sim fault NODE upgrade_fails``), at the largest c: from the image step's
  first call to the failed upgrade in the step's journal (written as each call ends), to the line ``runbook run``
  prints for that node as soon as the step knows it failed (read from its stdout as it streams:
  ``failure_line_time``), and to the ``image failed`` step line (printed with the others when the run ends),
  against when that node's batch started.

Settings: ``BENCH_WHOLE_NODES`` (default 100: 1,000 takes ~10 min per run on 2 cores, see benchmarks/README.md),
``BENCH_WHOLE_CONCURRENCY`` (default ``25,50``),
``BENCH_WHOLE_LATENCY_MS`` (default 2), ``BENCH_WHOLE_TIME_SCALE`` (simnode's -time-factor, default 0.05: an
upgrade's 10 s pull and 30 s install become 0.5 s and 1.5 s; the reboot keeps the API down 3 s,
``realtalos.REBOOT_MS``). Figures go to ``benchmarks/results.json`` under ``whole_change``. Skips without Go.
"""

from __future__ import annotations

import functools
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.real_fleet import (
    Cli,
    children_cpu,
    go_on_path,
    timed,
    union_seconds,
    update_results,
    verify_pools,
)
from tests.sim.test_library_real_talosctl import TALOS
from tests.sim.test_real_talosctl import build

RESULTS = Path(__file__).resolve().parent / "results.json"
TARGET = 1.1
STEPS = ("preflight", "config-patch", "image", "verify", "kubernetes", "cuda-test")
RUN_TIMEOUT_S = 1800
#: verify floor candidates: (get chunk, per-node reads at once); 128 was the fastest get chunk at 1,000 nodes
#: (bench_real_talosctl), 16 reads the library's fan-out; 32 the other value that benchmark tried.
VERIFY_FLOORS = ((128, 16), (128, 32))


# -- floor arithmetic (pure; tests/test_bench_whole_change.py) ----------------------------------------------


def rolling_floor(nodes: int, concurrency: int, upgrade_s: float) -> float:
    """⌈N/c⌉·T: batches run one after another, and a batch lasts at least one node's upgrade and reboot."""
    if nodes < 1 or concurrency < 1 or upgrade_s < 0:
        raise ValueError(f"nodes ({nodes}) and concurrency ({concurrency}) must be ≥ 1, T ({upgrade_s}) ≥ 0")
    return math.ceil(nodes / concurrency) * upgrade_s


def cpu_bound_floor(nodes: int, concurrency: int, upgrade_s: float, cpu_s: float, cores: int) -> float:
    """The rolling floor on this machine: a batch of c upgrades cannot be shorter than T, nor than the CPU its c
    talosctl processes need (c × one upgrade's CPU) spread over the cores. On a real fleet each node reboots on its
    own hardware; here simnode and every talosctl share the benchmark's cores."""
    per_batch = max(upgrade_s, min(concurrency, nodes) * cpu_s / max(cores, 1))
    return rolling_floor(nodes, concurrency, per_batch)


def batches_by_start(starts: Sequence[float], concurrency: int) -> list[list[float]]:
    """The upgrade calls' start times grouped into the rollout's batches.  A batch starts only once the one
    before it ended, so sorted by start the calls fall into consecutive groups of ``concurrency`` (the last one
    smaller); no canary in this benchmark, so every batch is ``concurrency`` nodes."""
    ordered = sorted(starts)
    return [ordered[i : i + concurrency] for i in range(0, len(ordered), concurrency)]


# -- a runbook run, its stdout lines timestamped ------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    returncode: int
    started: float  # epoch, as the journal's "at"
    wall_s: float
    lines: list[tuple[float, str]]  # (epoch, stdout line)
    record: Path | None

    def line_time(self, step: str) -> float | None:
        """When ``runbook run`` printed the step's line (it prints the step lines together when the run ends)."""
        return next((t for t, line in self.lines if line.split()[:1] == [step]), None)

    def journal(self, step: str) -> list[dict[str, Any]]:
        if self.record is None or not (self.record / "results" / f"{step}.json").exists():
            return []
        return list(json.loads((self.record / "results" / f"{step}.json").read_text())["journal"])


def failure_line_time(run: Run, node: str) -> float | None:
    """When ``runbook run`` printed ``image: <node> (<address>) failed: …``, the line it prints as soon as the image
    step knows the node failed (``runbook_lib/cli/live.py``), read from its stdout as it streamed."""
    prefix = f"image: {node} ("
    return next((t for t, line in run.lines if line.startswith(prefix) and ") failed: " in line), None)


def failure_event_time(run: Run, node: str) -> float | None:
    """When the image step's kernel emitted the node's failure (``at`` in ``results/image.events.jsonl``): the
    failure line's delay split into the step's part and the delivery's (the runner follows the file)."""
    path = run.record / "results" / "image.events.jsonl" if run.record else None
    if path is None or not path.exists():
        return None
    events = [json.loads(line) for line in path.read_text().splitlines()]
    return next(
        (float(e["at"]) for e in events if e.get("kind") == "node_failed" and e.get("node") == node), None
    )


def failed_nodes(run: Run) -> list[str]:
    """The nodes the image step reported failed (``node_failed`` in ``results/image.events.jsonl``), in order."""
    path = run.record / "results" / "image.events.jsonl" if run.record else None
    if path is None or not path.exists():
        return []
    events = [json.loads(line) for line in path.read_text().splitlines()]
    return [str(e["node"]) for e in events if e.get("kind") == "node_failed"]


def env(time_scale: float | None) -> dict[str, str]:
    """The real talosctl against simnode at ``time_scale`` (``None``: simnode's ``realtalos.DEFAULT_TIME_FACTOR``)
    on the real Kubernetes control plane: ``RUNBOOK_SIM_KUBE`` unset, so ``runbook sim up`` chooses as it does for a
    user (``realkube.choose``: the plane of the nodes' Kubernetes release where ``make kube-tools`` built it). Until
    2 Dec 2026 this benchmark ran on the Python Kubernetes API, which is being retired."""
    unset = ("RUNBOOK_SIM_TIME_SCALE", "RUNBOOK_SIM_KUBE")
    base = {k: v for k, v in os.environ.items() if k not in unset}
    if time_scale is not None:
        base |= {"RUNBOOK_SIM_TIME_SCALE": repr(time_scale)}
    # PYTHONUNBUFFERED: each step's line when it is printed, as on a terminal (a pipe buffers it)
    return base | {"RUNBOOK_SIM_TALOSCTL": "real", "PYTHONUNBUFFERED": "1"}


def runbook(work: Path, time_scale: float | None, *args: str) -> None:
    """A ``runbook`` command that must succeed (``sim up``/``sim fault``/``sim down``)."""
    argv = [sys.executable, "-m", "runbook_lib", *args, "--state", str(work / "state")]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env(time_scale), timeout=600, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"runbook {' '.join(args)} failed: {proc.stdout[-1000:]}{proc.stderr[-2000:]}")


def run_apply(work: Path, time_scale: float | None) -> Run:
    argv = [sys.executable, "-m", "runbook_lib", "run", "-p", str(work / "params.json"), "--apply"]
    argv += ["--state", str(work / "state"), "--records", str(work / "records"), "--no-progress"]
    lines: list[tuple[float, str]] = []
    started = time.time()
    with open(work / "run.stderr", "w") as err:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, text=True, env=env(time_scale))
        reader = threading.Thread(target=lambda: lines.extend((time.time(), ln) for ln in proc.stdout or []))
        reader.start()
        rc = proc.wait(timeout=RUN_TIMEOUT_S)
        reader.join()
    records = sorted((work / "records").glob("*/record.json"))
    return Run(rc, started, time.time() - started, lines, records[-1].parent if records else None)


def write_params(work: Path, nodes: int, concurrency: int, latency_ms: int) -> list[str]:
    """N GPU nodes on stock Talos v1.12.0 (10.5.0.1-2 are the simulated control plane's); their addresses."""
    spec = [{"name": f"gpu-{i:04d}", "address": f"10.5.{i // 250}.{i % 250 + 3}"} for i in range(nodes)]
    data: dict[str, Any] = {
        "cluster": f"whole{nodes}",
        "target": "simulated",
        "talos_version": TALOS,
        "track": "lts",
    }
    data |= {"nodes": spec, "rollout_concurrency": concurrency}
    data |= {"simulation": {"scenario": "fresh", "latency_ms": latency_ms}}
    (work / "params.json").write_text(json.dumps(data))
    return [n["address"] for n in spec]


# -- what the record says ----------------------------------------------------------------------------------------


def upgrades(run: Run) -> list[dict[str, Any]]:
    return [e for e in run.journal("image") if e.get("kind") == "command" and "upgrade" in e.get("argv", [])]


def start_of(entry: dict[str, Any]) -> float:
    """A journal entry's ``at`` is when it was journaled, at the command's end."""
    return float(entry["at"]) - float(entry.get("duration_s", 0.0))


def node_spans(entries: list[dict[str, Any]]) -> list[tuple[str, float, float, int]]:
    """(address, start, end, exit code) of each node's upgrade: an upgrade call covers its ``-n`` nodes (since 2 Dec
    2026 one talosctl process upgrades a chunk of a batch, ``steps/image.py`` ``_groups``)."""
    return [
        (address, start_of(e), float(e["at"]), int(e.get("exit_code", 0)))
        for e in entries
        for address in str(e["argv"][e["argv"].index("-n") + 1]).split(",")
    ]


def helm_wait(entry: dict[str, Any]) -> bool:
    """A journaled helm call that waits on the cluster: ``helm … --wait``, or ``helm upgrade --install`` (its
    hooks; until 5 Dec 2026 it also waited with ``--wait`` for the rollout, now the step's ``wait: …`` entry)."""
    argv = entry.get("argv", [""])
    return (
        entry.get("kind") == "command"
        and argv[0].endswith("helm")
        and ("--wait" in argv or {"upgrade", "--install"} <= set(argv))
    )


def cluster_time(run: Run, step: str) -> float:
    """The step's own floor: the time the cluster took (``helm upgrade --install --wait``, ``wait: …``)."""
    spans = [
        (start_of(e), float(e["at"]))
        for e in run.journal(step)
        if (e.get("kind") == "api" and str(e.get("summary", "")).startswith("wait:")) or helm_wait(e)
    ]
    return union_seconds(spans)


def label_phase(run: Run) -> dict[str, Any]:
    """The kubernetes step's ``nvidia.com/gpu.present`` labels (``label Node …``, journaled as each call ends):
    how many, and the seconds from the first to the last; and its ``helm --wait`` (the device plugin's DaemonSet
    rolling out). Why: 2 Dec 2026, 1,000 labels took 227 s and the wait 304 s on the real plane."""
    entries = run.journal("kubernetes")
    ats = sorted(float(e["at"]) for e in entries if str(e.get("summary", "")).startswith("label Node"))
    helm = sum(float(e.get("duration_s", 0.0)) for e in entries if helm_wait(e))
    return {
        "labels": len(ats),
        "label_s": round(ats[-1] - ats[0], 1) if ats else 0.0,
        "helm_wait_s": round(helm, 1),
    }


def step_walls(run: Run) -> dict[str, float]:
    """Each step's wall time from ``record.json`` (its notebook's run, kernel start-up not included), and the rest of
    the run's wall time (the CLI, kernels, sealing the record) as ``outside steps``."""
    steps = json.loads((run.record / "record.json").read_text())["steps"] if run.record else []
    out = {str(s["name"]): round(float(s["duration_s"]), 1) for s in steps}
    return out | {"outside steps": round(run.wall_s - sum(out.values()), 1)}


# -- floors measured on the upgraded fleet ----------------------------------------------------------------------


def upgrade_alone(cli: Cli, nodes: Sequence[str], image: str) -> tuple[float, float]:
    """T: one node's ``upgrade --wait`` with nothing else running, median over 3 nodes one after another; and the
    CPU seconds one such talosctl process uses (user + system, mean of the 3: ``getrusage`` of the children)."""
    args = ["upgrade", "--image", image, "--wait=true", "--timeout=600s"]
    before = children_cpu()
    walls = [timed(functools.partial(cli.call, args, [n])) for n in nodes[:3]]
    return statistics.median(walls), (children_cpu() - before) / len(walls)


def verify_floor(cli: Cli, nodes: Sequence[str]) -> tuple[float, str]:
    times = {
        f"gets in chunks of {k}, reads ×{r}": timed(functools.partial(cli.jobs, verify_pools(nodes, k, r)))
        for k, r in VERIFY_FLOORS
    }
    best = min(times, key=times.__getitem__)
    return times[best], best


# -- the figures ---------------------------------------------------------------------------------------------------

#: how each step of a whole change from stock Talos ends
EXPECTED = dict(zip(STEPS, ("ok", "changed", "changed", "ok", "changed", "ok"), strict=True))


def outcomes(run: Run) -> dict[str, str]:
    return {ln.split()[0]: ln.split()[1] for _, ln in run.lines if ln.split()[:1] in [[s] for s in STEPS]}


def checked(run: Run, work: Path, expected: dict[str, str]) -> Run:
    """A run whose steps did not end as expected aborts the benchmark: a wrong answer is not a fast one."""
    if outcomes(run) != expected:
        tail = (work / "run.stderr").read_text(errors="replace")[-2000:]
        raise RuntimeError(
            f"runbook run: {outcomes(run)} (exit {run.returncode}), expected {expected}:\n{tail}"
            + "".join(f"\n{line}" for line in failed_checks(run))
            + (f"\nthe record is kept in {kept}" if (kept := keep_record(run)) else "")
        )
    return run


def failed_checks(run: Run) -> list[str]:
    """The failed checks of the run's failed steps (``record.json``): why a 1,000-node run stopped, which its
    temporary directory would otherwise take with it (2 Dec 2026: the kubernetes step failed after 10 minutes)."""
    steps = json.loads((run.record / "record.json").read_text())["steps"] if run.record else []
    return [
        f"{s['name']}: {c['name']}: {str(c.get('message', ''))[:500]}"
        for s in steps
        if s["status"] == "failed"
        for c in (s.get("result") or {}).get("checks", [])
        if not c.get("ok")
    ]


def keep_record(run: Run) -> Path | None:
    """A copy of a failed run's record outside the benchmark's temporary directory."""
    if run.record is None:
        return None
    kept = Path(tempfile.gettempdir()) / f"bench-whole-failed-{run.record.name}"
    shutil.copytree(run.record, kept, dirs_exist_ok=True)
    return kept


def installer(run: Run) -> str:
    argv = upgrades(run)[0]["argv"]
    return str(argv[argv.index("--image") + 1])


def measure(
    work: Path, nodes: int, concurrency: int, settings: dict[str, Any], box: dict[str, Any]
) -> dict[str, Any]:
    """One whole change at ``concurrency``, then T and (once per benchmark: it does not depend on c) the verify
    floor on the fleet it left, before the simulator goes down."""
    addresses = write_params(work, nodes, concurrency, settings["latency_ms"])
    scale = settings["time_scale"]
    runbook(work, scale, "sim", "up", "-p", str(work / "params.json"))
    try:
        run = checked(run_apply(work, scale), work, EXPECTED)
        cli = Cli(work / "state" / "bin" / "talosctl", work / "state" / "talosconfig")
        upgrade = upgrade_alone(cli, addresses, installer(run))
        if "verify_floor" not in box:
            box["verify_floor"] = verify_floor(cli, addresses)
    finally:
        runbook(work, scale, "sim", "down")
    return figures(run, nodes, concurrency, upgrade, box["verify_floor"])


def figures(
    run: Run, nodes: int, concurrency: int, upgrade: tuple[float, float], vfloor: tuple[float, str]
) -> dict[str, Any]:
    upgrade_s, cpu_s = upgrade
    rolling = rolling_floor(nodes, concurrency, upgrade_s)
    kube, cuda = cluster_time(run, "kubernetes"), cluster_time(run, "cuda-test")
    floor = rolling + vfloor[0] + kube + cuda
    in_run = [end - start for _a, start, end, _rc in node_spans(upgrades(run))]
    return {
        "nodes": nodes,
        "concurrency": concurrency,
        "wall_s": round(run.wall_s, 1),
        "floor_s": round(floor, 1),
        "ratio_to_floor": round(run.wall_s / floor, 2),
        "upgrade_alone_s": round(upgrade_s, 2),
        "upgrade_cpu_s": round(cpu_s, 3),
        "cpu_bound_rolling_floor_s": round(
            cpu_bound_floor(nodes, concurrency, upgrade_s, cpu_s, os.cpu_count() or 1), 1
        ),
        "batches": math.ceil(nodes / concurrency),
        "rolling_floor_s": round(rolling, 1),
        "verify_floor_s": round(vfloor[0], 1),
        "verify_floor_strategy": vfloor[1],
        "kubernetes_floor_s": round(kube, 1),
        "cuda_test_floor_s": round(cuda, 1),
        "step_wall_s": step_walls(run),
        "upgrade_in_run_s": {"median": round(statistics.median(in_run), 2), "max": round(max(in_run), 2)},
        "image_in_upgrade_calls_s": round(in_batches(upgrades(run), concurrency), 1),
        "upgrade_processes": len(upgrades(run)),
        "kubernetes_labels": label_phase(run),
    }


def in_batches(entries: list[dict[str, Any]], concurrency: int) -> float:
    """Seconds the image step spent with upgrade calls running: per batch, first start to last end (the rest of
    the step is its reads before the first batch and between batches)."""
    spans = sorted((start, end) for _a, start, end, _rc in node_spans(entries))
    batches = [spans[i : i + concurrency] for i in range(0, len(spans), concurrency)]
    return sum(max(end for _s, end in b) - b[0][0] for b in batches)


def measure_failure(work: Path, nodes: int, concurrency: int, settings: dict[str, Any]) -> dict[str, Any]:
    """Node N/2 fails its installer: when is it reported, against when its batch started?"""
    addresses = write_params(work, nodes, concurrency, settings["latency_ms"])
    scale, bad = settings["time_scale"], nodes // 2
    runbook(work, scale, "sim", "up", "-p", str(work / "params.json"), "--no-daemon")
    runbook(work, scale, "sim", "fault", f"gpu-{bad:04d}", "upgrade_fails")
    try:
        expected = {"preflight": "ok", "config-patch": "changed", "image": "failed"}
        run = checked(run_apply(work, scale), work, expected)
    finally:
        runbook(work, scale, "sim", "down")
    spans = node_spans(upgrades(run))
    failed = [span for span in spans if span[0] == addresses[bad] and span[3] != 0]
    if not failed or failed_nodes(run) != [f"gpu-{bad:04d}"]:
        raise RuntimeError(
            f"expected exactly gpu-{bad:04d}'s upgrade to fail, the run reported {failed_nodes(run)}"
        )
    batches = batches_by_start([start for _a, start, _e, _rc in spans], concurrency)
    index = next(i for i, b in enumerate(batches) if failed[0][1] in b)
    # runbook run prints the node's failure line as the image step learns it (cli/live.py), and its step lines
    # together at its end (RunOutcome.report); the journal gets each call as it ends.
    image_start = min(start_of(e) for e in run.journal("image"))
    reported = failure_line_time(run, f"gpu-{bad:04d}") or float("nan")
    emitted = failure_event_time(run, f"gpu-{bad:04d}") or float("nan")
    step_line = run.line_time("image") or float("nan")
    return {
        "nodes": nodes,
        "concurrency": concurrency,
        "failing_node": f"gpu-{bad:04d}",
        "batch": index + 1,
        "batches_started": len(batches),
        "batch_start_s": round(batches[index][0] - image_start, 1),
        "journaled_s": round(failed[0][2] - image_start, 1),
        "emitted_s": round(emitted - image_start, 1),
        "reported_s": round(reported - image_start, 1),
        "step_line_s": round(step_line - image_start, 1),
        "failed_call_s": round(failed[0][2] - failed[0][1], 1),
        "wall_s": round(run.wall_s, 1),
    }


def report(fig: dict[str, Any]) -> None:
    met = "met" if fig["ratio_to_floor"] <= TARGET else "NOT MET"
    print(
        f"-- {fig['nodes']} nodes, rollout_concurrency {fig['concurrency']}: runbook run --apply {fig['wall_s']:.1f} s "
        f"vs floor {fig['floor_s']:.1f} s = {fig['ratio_to_floor']:.2f}× (target ≤ {TARGET}×: {met})\n"
        f"   floor: {fig['batches']} batch(es) × T {fig['upgrade_alone_s']:.2f} s = {fig['rolling_floor_s']:.1f} s "
        f"+ verify {fig['verify_floor_s']:.1f} s ({fig['verify_floor_strategy']}) + kubernetes "
        f"{fig['kubernetes_floor_s']:.1f} s + cuda-test {fig['cuda_test_floor_s']:.1f} s\n"
        f"   steps: "
        + ", ".join(f"{k} {v:.1f} s" for k, v in fig["step_wall_s"].items())
        + f"; image step in upgrade calls {fig['image_in_upgrade_calls_s']:.1f} s (floor with one talosctl upgrade's "
        f"{fig['upgrade_cpu_s']:.2f} s of CPU × c on {os.cpu_count()} cores: {fig['cpu_bound_rolling_floor_s']:.1f} s)"
        + f"; one upgrade in the run: median {fig['upgrade_in_run_s']['median']:.2f} s, "
        f"max {fig['upgrade_in_run_s']['max']:.2f} s"
        + f"; kubernetes: {fig['kubernetes_labels']['labels']} node labels in {fig['kubernetes_labels']['label_s']:.1f} s, "
        f"helm --wait {fig['kubernetes_labels']['helm_wait_s']:.1f} s",
        flush=True,
    )


def report_failure(fig: dict[str, Any]) -> None:
    print(
        f"-- first failure: {fig['failing_node']} of {fig['nodes']} (batch {fig['batch']} of "
        f"{fig['batches_started']} started, rollout_concurrency {fig['concurrency']}), from the image step's first "
        "call: "
        f"its batch started at {fig['batch_start_s']:.1f} s, its failed upgrade was journaled at "
        f"{fig['journaled_s']:.1f} s (the call took {fig['failed_call_s']:.1f} s), the step emitted it at "
        f"{fig['emitted_s']:.1f} s, runbook run printed its "
        f"failure line at {fig['reported_s']:.1f} s and the step line 'image failed' at {fig['step_line_s']:.1f} s",
        flush=True,
    )


def merged_figures(old: dict[str, Any], figures: dict[str, Any]) -> dict[str, Any]:
    """``whole_change`` of results.json with ``figures`` added: per fleet size, and within one size per
    ``rollout_concurrency`` (a 1,000-node run takes ~12 minutes per c, so the issue's two values of c may come
    from two runs): a new run replaces the earlier run at its c only; the first-failure figure is kept unless
    the new run measured one. Each run keeps the ``measured_at`` of the run that measured it."""
    size = str(figures["settings"]["nodes"])
    earlier = old.get(size, {})
    runs = {
        r["concurrency"]: {"measured_at": earlier.get("measured_at"), **r} for r in earlier.get("runs", [])
    }
    runs |= {r["concurrency"]: {**r, "measured_at": figures.get("measured_at")} for r in figures["runs"]}
    settings = {**figures["settings"], "concurrency": sorted(runs)}
    # ``earlier`` first: its first-failure figure stays unless ``figures`` measured one
    combined = {**earlier, **figures, "settings": settings, "runs": [runs[c] for c in sorted(runs)]}
    return old | {size: combined}


def merge(figures: dict[str, Any]) -> None:
    """Into results.json beside the other benchmarks' figures (bench_fleet rewrites the file; this adds its key)."""
    old = json.loads(RESULTS.read_text()).get("whole_change", {}) if RESULTS.exists() else {}
    update_results(RESULTS, "whole_change", merged_figures(old, figures))


def settings_from_env() -> dict[str, Any]:
    return {
        "nodes": int(os.environ.get("BENCH_WHOLE_NODES", "100")),
        "concurrency": [int(c) for c in os.environ.get("BENCH_WHOLE_CONCURRENCY", "25,50").split(",")],
        "latency_ms": int(os.environ.get("BENCH_WHOLE_LATENCY_MS", "2")),
        "time_scale": float(os.environ.get("BENCH_WHOLE_TIME_SCALE", "0.05")),
        "failure": os.environ.get("BENCH_WHOLE_FAILURE", "1") != "0",
    }


def main() -> int:
    if not go_on_path():
        return 0
    settings = settings_from_env()
    build("build-talosctl.sh", TALOS)
    build("build-simnode.sh")
    print(
        f"whole change: real talosctl {TALOS} against simnode, {settings['nodes']} nodes, "
        f"{settings['latency_ms']} ms per call, time factor {settings['time_scale']}, {os.cpu_count()} cores",
        flush=True,
    )
    started, box = time.perf_counter(), dict[str, Any]()
    out: dict[str, Any] = {"settings": settings, "runs": []}
    for concurrency in settings["concurrency"]:
        with tempfile.TemporaryDirectory(prefix=f"bench-whole-{concurrency}-") as tmp:
            out["runs"].append(measure(Path(tmp), settings["nodes"], concurrency, settings, box))
        report(out["runs"][-1])
    if settings["failure"]:
        with tempfile.TemporaryDirectory(prefix="bench-whole-fail-") as tmp:
            out["first_failure"] = measure_failure(
                Path(tmp), settings["nodes"], max(settings["concurrency"]), settings
            )
        report_failure(out["first_failure"])
    out["bench_wall_s"] = round(time.perf_counter() - started)
    out["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    merge(out)
    print(
        f"bench_whole_change took {out['bench_wall_s']} s; figures in {RESULTS} under 'whole_change'.'{settings['nodes']}'"
    )
    return 1 if any(r["ratio_to_floor"] > TARGET for r in out["runs"]) else 0


if __name__ == "__main__":
    if (rc := main()) != 0:
        sys.exit(rc)
