"""Verify and the config-patch dry run with the REAL talosctl v1.12.0 against simnode (issue 16): the library vs
the floor vs the per-node loop, at 10, 100 and 1,000 nodes; and the memory of verify's process tree.

``bench_fleet.py`` measured the library against the Python simulator's talosctl, whose multi-node ``get`` asks
the nodes concurrently; the real one resolves the type on the first node and then asks the nodes one after
another (``talos@v1.12.0:cmd/talosctl/pkg/talos/helpers/resources.go:48-99``, reality-gaps.md §2 row 3). Here
the real binary talks to simnode's nodes over mTLS, each node answering after ``latency_ms``.

What is timed at each size, in the same run (benchmarks/README.md defines each figure):

- **get fan-out** (one ``get extensions`` over the fleet): one call ``-n all``, ``-n`` chunks of 16/32/64/128/256
  (all at once), one call per node 8/32/64 at once (up to 100 nodes; 1,000 nodes would be 1,000 processes
  for a get that 8 chunks do in ~1 s). This is what the library's choice of ``get`` chunks turns on;
- **verify**: the library's ``verify(connect(params))`` against the **floor**, the fastest of: verify's reads
  with the fastest get fan-out and the per-node ``read`` 8 or 32 at once; each ``REPEATS`` times, library and
  floor candidates in turn (the machine is shared: load drifts), medians compared;
- **patch dry run**: ``config_patch(ctx, apply=False)`` on nodes with the stock config against the floor, the
  fastest of ``get machineconfig`` then ``patch --dry-run`` per ``-n`` chunk of 8/16/32/64/128/256 (chunks at
  once; and one call over all, up to 100 nodes), the two fastest measured again alternately with the library.
  The floor reads no extensions, and gets the same answers: the parameters here leave ``default_runtime_patch``
  off (its default), and then the library reads none either (its journal at 10, 100 and 1,000 nodes: one ``get
  machineconfig`` and one ``patch --dry-run`` per chunk, nothing else).  With that patch on, the library reads
  each chunk's extensions beside its configs (``steps/patch_plan.py``, ``Planner.read``); not measured here.
  Every node here carries the same stock config text, which the library parses once per chunk
  (``patch_plan.configs_of``): a fleet of per-node configs costs it ~1.2 ms of CPU per node more (not measured);
- **what bounds verify's floor**: one ``talosctl read`` process per node, as talosctl refuses ``read`` for several
  nodes (talos@v1.12.0 cmd/talosctl/cmd/talos/read.go:35 calls ``helpers.FailIfMultiNodes``,
  cmd/talosctl/pkg/talos/helpers/checks.go:23-34), and no multi-node resource carries the loaded driver's
  version (``LoadedKernelModuleSpec``: size, references, dependencies, state, address;
  pkg/machinery/resources/runtime/loaded_kernel_module.go:25-31);
- **per-node loop**: each node's calls one after another, node after node (above 20 nodes 20 nodes are
  measured and scaled, marked ``*``);
- **memory** (largest size only): verify in a child process, its process tree sampled from /proc: peak summed
  RSS and PSS of the Python process and every talosctl child alive at once;
- **runbook run** (``BENCH_REAL_RUN_NODES``, default 1,000; 0 skips it): ``runbook run`` (plan only) on GPU-ready
  nodes with the real talosctl against simnode (``RUNBOOK_SIM_TALOSCTL=real``), its whole process tree watched
  (runbook, kernels, every talosctl; the simulator left out): issue 16's memory and record-size figures.

Run: ``python -m benchmarks real_talosctl``. Settings: ``BENCH_REAL_SIZES`` (default ``10,100,1000``),
``BENCH_REAL_LATENCY_MS`` (default 2). Figures go to ``benchmarks/results.json`` under ``real_talosctl``
(merged into what ``bench_fleet.py`` wrote). Skips with a message when ``go`` is missing (the binaries are
built from Go modules by ``tools/build-talosctl.sh`` and ``tools/build-simnode.sh``, cached after the first
build).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.real_fleet import (
    Fleet,
    get_args,
    get_only_pools,
    go_on_path,
    patch_args,
    patch_chunks,
    simnode_fleet,
    timed,
    verify_loop_jobs,
    verify_pools,
    watched_run,
    watched_verify,
)
from runbook_lib.clients.talosctl import PATCH_CALLS
from runbook_lib.model.params import load_params
from runbook_lib.steps.context import connect
from runbook_lib.steps.patch import config_patch
from runbook_lib.steps.verify import verify
from tests.sim.test_library_real_talosctl import TALOS
from tests.sim.test_real_talosctl import build

RESULTS = Path(__file__).resolve().parent / "results.json"
REPEATS = 3
LOOP_SAMPLE = 20
PER_NODE_MAX = 100  # per-node get strategies and the one-call patch only up to here
TARGET_FLOOR = 1.2
TARGET_LOOP = 20.0
TARGET_TREE_MB = 1024.0
TARGET_RUNBOOK_MB = 400.0


#: what ``BENCH_REAL_QUICK=1`` (``make bench``) leaves out, printed when it applies
QUICK_NOTE = (
    "the get fan-out measured once; the verify floor with the library's read fan-out only (8 and 32 reads at once "
    "measured the same); patch chunks 32/64/128 at 1,000 nodes (64 was the fastest); 2 alternating runs at 1,000 "
    "nodes, 3 below; no separate memory run of verify (the runbook run below measures the whole tree)"
)


def quick() -> bool:
    """``make bench`` runs this benchmark in its quick form (``QUICK_NOTE``), ``make bench-full`` in full."""
    return os.environ.get("BENCH_REAL_QUICK", "") == "1"


def repeats(count: int) -> int:
    return 2 if quick() and count >= 1000 else REPEATS


def median(fn: Callable[[], float], times: int = REPEATS) -> float:
    return statistics.median(fn() for _ in range(times))


def alternating(candidates: dict[str, Callable[[], float]], times: int = REPEATS) -> dict[str, float]:
    """Each candidate ``times`` times, in turn, so that drifting load hits them all alike; medians."""
    samples: dict[str, list[float]] = {name: [] for name in candidates}
    for _ in range(times):
        for name, fn in candidates.items():
            samples[name].append(fn())
    return {name: statistics.median(s) for name, s in samples.items()}


def loop_time(fleet: Fleet, jobs_for: Callable[[list[str]], list[Any]]) -> tuple[float, bool]:
    """The per-node loop over the fleet, scaled from ``LOOP_SAMPLE`` nodes on bigger fleets (it is linear: one
    call after another; measuring 100 nodes in full took 48 s of the benchmark's time for the same figure)."""
    sample = fleet.nodes[:LOOP_SAMPLE]
    elapsed = timed(lambda: fleet.cli.jobs([(jobs_for(sample), 1)]))
    return elapsed * len(fleet.nodes) / len(sample), len(sample) != len(fleet.nodes)


# -- verify -------------------------------------------------------------------------------------------------------


def get_fanouts(fleet: Fleet) -> dict[str, float]:
    """One ``get extensions`` over the fleet, each way of fanning it out (median of ``REPEATS``)."""
    count = len(fleet.nodes)
    ways: dict[str, tuple[int, int]] = {"one call -n all": (count, 0)}
    ways |= {f"chunks of {k}": (k, 0) for k in (16, 32, 64, 128, 256) if k < count}
    if count <= PER_NODE_MAX:
        ways |= {f"per node ×{c}": (1, c) for c in (8, 32, 64)}

    def way(chunk: int, per_node: int) -> float:
        return timed(lambda: fleet.cli.jobs(get_only_pools(fleet.nodes, chunk, per_node)))

    times = 1 if quick() else REPEATS
    return {name: median(lambda k=k, c=c: way(k, c), times) for name, (k, c) in ways.items()}  # type: ignore[misc]


def library_verify(fleet: Fleet) -> float:
    ctx = connect(load_params(fleet.params))
    start = time.perf_counter()
    result = verify(ctx)
    elapsed = time.perf_counter() - start
    bad = [n.node for n in result.nodes if n.status != "ok"]
    if len(result.nodes) != len(fleet.nodes) or bad:  # a wrong answer is not a fast one
        raise RuntimeError(f"verify did not pass every node: {bad[:5]} ({len(bad)} failed)")
    return elapsed


def bench_verify(fleet: Fleet) -> dict[str, Any]:
    gets = get_fanouts(fleet)
    best_get = min((n for n in gets if n.startswith(("chunks", "one call"))), key=gets.__getitem__)
    chunk = len(fleet.nodes) if best_get.startswith("one call") else int(best_get.rsplit(" ", 1)[1])
    candidates: dict[str, Callable[[], float]] = {"library": lambda: library_verify(fleet)}
    for reads in (PATCH_CALLS,) if quick() else (8, 32):
        candidates[f"gets {best_get}, reads ×{reads}"] = verify_floor(fleet, chunk, reads)
    times = alternating(candidates, repeats(len(fleet.nodes)))
    loop, scaled = loop_time(fleet, verify_loop_jobs)
    return summary(times, loop, scaled) | {
        "get_fanout_s": rounded(gets),
        "fastest_get": min(gets, key=gets.__getitem__),
    }


def verify_floor(fleet: Fleet, chunk: int, reads: int) -> Callable[[], float]:
    return lambda: timed(lambda: fleet.cli.jobs(verify_pools(fleet.nodes, chunk, reads)))


# -- patch dry run ----------------------------------------------------------------------------------------------


def library_patch(fleet: Fleet, box: dict[str, str]) -> float:
    ctx = connect(load_params(fleet.params))
    start = time.perf_counter()
    result = config_patch(ctx, apply=False)
    elapsed = time.perf_counter() - start
    if result.counts() != {"planned": len(fleet.nodes)} or len(result.data["groups"]) != 1:
        raise RuntimeError(f"the dry run did not plan every node: {result.counts()}")
    box["patch"] = result.data["groups"][0]["patch"]
    return elapsed


def bench_patch(fleet: Fleet, tmp: Path) -> dict[str, Any]:
    box: dict[str, str] = {}
    library_patch(fleet, box)  # the patch the library plans is the one the floor dry-runs
    patch_file = tmp / "patch.yaml"
    patch_file.write_text(box["patch"])
    count = len(fleet.nodes)
    chunks = (32, 64, 128) if quick() and count >= 1000 else (8, 16, 32, 64, 128, 256)
    sizes = [k for k in chunks if k < count] + ([count] if count <= PER_NODE_MAX else [])
    scan = {k: patch_floor(fleet, k, patch_file)() for k in sizes}
    best = sorted(scan, key=scan.__getitem__)[:2]
    candidates: dict[str, Callable[[], float]] = {"library": lambda: library_patch(fleet, box)}
    candidates |= {f"chunks of {k}": patch_floor(fleet, k, patch_file) for k in best}
    times = alternating(candidates, repeats(count))

    def loop_jobs(nodes: list[str]) -> list[Any]:
        return [(args, [n]) for n in nodes for args in (get_args("machineconfig"), patch_args(patch_file))]

    loop, scaled = loop_time(fleet, loop_jobs)
    return summary(times, loop, scaled) | {"scan_s": {f"chunks of {k}": round(v, 2) for k, v in scan.items()}}


def patch_floor(fleet: Fleet, chunk: int, patch_file: Path) -> Callable[[], float]:
    return lambda: timed(lambda: patch_chunks(fleet.cli, fleet.nodes, chunk, 64, patch_file))


# -- figures ------------------------------------------------------------------------------------------------------


def rounded(times: dict[str, float]) -> dict[str, float]:
    return {k: round(v, 2) for k, v in times.items()}


def summary(times: dict[str, float], loop: float, scaled: bool) -> dict[str, Any]:
    library = times.pop("library")
    floor_name = min(times, key=times.__getitem__)
    return {
        "library_s": round(library, 2),
        "floor_s": round(times[floor_name], 2),
        "floor_strategy": floor_name,
        "floor_candidates_s": rounded(times),
        "loop_s": round(loop, 1),
        "loop_scaled_from_sample": scaled,
        "ratio_to_floor": round(library / times[floor_name], 2),
        "speedup_over_loop": round(loop / library, 1),
        "floor_speedup_over_loop": round(loop / times[floor_name], 1),
    }


def report(count: int, what: str, fig: dict[str, Any]) -> None:
    star = "*" if fig["loop_scaled_from_sample"] else ""
    met_floor = "met" if fig["ratio_to_floor"] <= TARGET_FLOOR else "NOT MET"
    met_loop = "met" if fig["speedup_over_loop"] >= TARGET_LOOP else "NOT MET"
    print(
        f"   {what:<14} library {fig['library_s']:6.2f} s | floor {fig['floor_s']:6.2f} s ({fig['floor_strategy']}) "
        f"| loop{star} {fig['loop_s']:7.1f} s\n"
        f"   {'':<14} library ÷ floor {fig['ratio_to_floor']:.2f}× (target ≤ {TARGET_FLOOR}× at 1,000: "
        f"{met_floor if count >= 1000 else 'n/a'}), speed-up over the loop {fig['speedup_over_loop']:.1f}× "
        f"(target ≥ {TARGET_LOOP:.0f}× at 1,000: {met_loop if count >= 1000 else 'n/a'}; the floor's own: "
        f"{fig['floor_speedup_over_loop']:.1f}×)",
        flush=True,
    )


def bench_size(binaries: tuple[Path, Path], count: int, latency_ms: int, memory: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with simnode_fleet(binaries, count, latency_ms, patched=True) as fleet:
        out["verify"] = bench_verify(fleet)
        if memory:
            out["memory"], passed = watched_verify(fleet.params)
            if passed != count:
                raise RuntimeError(f"verify in the watched child passed {passed} of {count} nodes")
    with simnode_fleet(binaries, count, latency_ms, patched=False) as fleet:
        out["patch"] = bench_patch(fleet, fleet.params.parent)
    print(f"-- {count} nodes; fastest get fan-out: {out['verify']['fastest_get']}")
    print(
        "   get extensions: " + ", ".join(f"{k} {v:.2f} s" for k, v in out["verify"]["get_fanout_s"].items())
    )
    report(count, "verify", out["verify"])
    report(count, "patch dry run", out["patch"])
    if memory:
        mem = out["memory"]
        print(
            f"   memory of verify's process tree: peak {mem['tree_pss_mb']:.0f} MB PSS ({mem['tree_rss_mb']:.0f} MB "
            f"summed RSS): Python process {mem['runbook_rss_mb']:.0f} MB RSS, up to {mem['talosctl_alive']:.0f} "
            f"talosctl at once {mem['talosctl_pss_mb']:.0f} MB PSS ({mem['talosctl_rss_mb']:.0f} MB summed RSS)",
            flush=True,
        )
    return out


def bench_run(count: int, latency_ms: int) -> dict[str, Any]:
    """Issue 16 points 3 and 4 with the real talosctl: ``runbook run`` (plan only) on ``count`` GPU-ready nodes,
    the whole process tree watched, and the size of the record it wrote."""
    with tempfile.TemporaryDirectory(prefix=f"bench-real-run-{count}-") as tmp:
        peak, wall, record = watched_run(Path(tmp), count, latency_ms)
        notebook = record / "04-verify.ipynb"
        nb_bytes = notebook.stat().st_size if notebook.exists() else -1
        per_node = round((record / "record.json").stat().st_size / count, 1)
    fig: dict[str, Any] = {"nodes": count, "wall_s": round(wall, 1), "notebook_bytes": nb_bytes}
    fig |= {"record_bytes_per_node": per_node, "memory": peak}
    tree, own = peak.get("tree_pss_mb", 0.0), peak.get("runbook_and_kernels_pss_mb", 0.0)
    checks = [
        ("executed verify notebook", f"{nb_bytes / 2**20:.2f} MB", 0 <= nb_bytes <= 5 * 2**20),
        ("record.json per node", f"{per_node:.0f} B", per_node <= 2048),
        ("runbook + kernels + talosctl (PSS)", f"{tree:.0f} MB", tree <= TARGET_TREE_MB),
        ("runbook + kernels (PSS)", f"{own:.0f} MB", own <= TARGET_RUNBOOK_MB),
    ]
    print(f"-- runbook run, {count} nodes, real talosctl: {wall:.0f} s")
    for name, value, met in checks:
        print(f"   {name:<36} {value:>10}  {'met' if met else 'NOT MET'}")
    print(
        f"   peak: up to {peak.get('talosctl_alive', 0):.0f} talosctl at once ({peak.get('talosctl_pss_mb', 0):.0f} MB "
        f"PSS, {peak.get('talosctl_rss_mb', 0):.0f} MB summed RSS), {peak.get('kernel_alive', 0):.0f} kernels; "
        f"tree summed RSS {peak.get('tree_rss_mb', 0):.0f} MB",
        flush=True,
    )
    return fig


def merge(figures: dict[str, Any]) -> None:
    """Into results.json beside bench_fleet's figures (it rewrites the file; this one adds its key).  A run of
    some sizes only (``BENCH_REAL_SIZES``) keeps the other sizes' figures from the run that measured them."""
    data = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    old = data.get("real_talosctl", {})
    data["real_talosctl"] = {**old, **figures, "sizes": {**old.get("sizes", {}), **figures["sizes"]}}
    RESULTS.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def main() -> int:
    if not go_on_path():
        return 0
    sizes = [int(s) for s in os.environ.get("BENCH_REAL_SIZES", "10,100,1000").split(",")]
    latency_ms = int(os.environ.get("BENCH_REAL_LATENCY_MS", "2"))
    binaries = (build("build-talosctl.sh", TALOS), build("build-simnode.sh"))
    print(f"real talosctl {TALOS} against simnode, {latency_ms} ms per node per call, {os.cpu_count()} cores")
    if quick():
        print(f"BENCH_REAL_QUICK=1 (make bench): {QUICK_NOTE}")
    started = time.perf_counter()
    figures: dict[str, Any] = {
        "talosctl": TALOS,
        "latency_ms": latency_ms,
        "cores": os.cpu_count(),
        "sizes": {},
    }
    for count in sizes:
        memory = count == max(sizes) and not quick()
        figures["sizes"][str(count)] = bench_size(binaries, count, latency_ms, memory)
        figures["sizes"][str(count)]["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    run_nodes = int(os.environ.get("BENCH_REAL_RUN_NODES", "1000"))
    if run_nodes:
        figures["run"] = bench_run(run_nodes, latency_ms)
    figures["bench_wall_s"] = round(time.perf_counter() - started)
    merge(figures)
    print(f"bench_real_talosctl took {figures['bench_wall_s']} s; figures in {RESULTS} under 'real_talosctl'")
    return 0


if __name__ == "__main__":
    if (rc := main()) != 0:
        sys.exit(rc)
