"""Verify's reads with the REAL talosctl v1.12.0 against simnode (issue 16): the library vs the floor strategies.

``bench_fleet.py`` measured the library against the Python simulator's talosctl, whose multi-node ``get`` asks
the nodes concurrently; the real one resolves the type on the first node and then asks the nodes one after
another (``talos@v1.12.0:cmd/talosctl/pkg/talos/helpers/resources.go:48-99``, reality-gaps.md §2 row 3). Here
the real binary talks to simnode's nodes over mTLS, each node answering after ``latency_ms``.

What is timed, on the same GPU-ready fleet at each size (every strategy gets the same answers verify reads):

- **library**: ``verify(connect(params))``, the step itself (its optional Kubernetes read is refused at once);
- **floor strategies**, each issuing verify's talosctl reads (``get extensions|modules|pcidevices``, ``version``,
  ``service``, per-node ``read /proc/driver/nvidia/version``), all kinds at once as verify does, the ``get``\\ s:
  ``one call -n all``; ``per node ×c`` (every per-node call through one pool of c processes, c = 8, 32, 64);
  ``chunks of k`` (all chunks at once, reads at 32). ``version`` and ``service`` are one-to-many through apid
  (concurrent on the nodes): one ``-n all`` call each, except in ``per node`` where they are per node too;
- **per-node loop**: each node's six calls one after another, node after node (at more than 100 nodes 20
  nodes are measured and scaled, marked ``*``);
- a second column, ``get only``: the strategy applied to one ``get extensions`` alone, which is what the choice
  of the library's ``get`` fan-out turns on (verify's per-node ``read`` costs every strategy the same).

Run: ``python -m benchmarks real_talosctl``. Settings: ``BENCH_REAL_SIZES`` (default ``10,100,1000``),
``BENCH_REAL_LATENCY_MS`` (default 2). Skips with a message when ``go`` is missing (the binaries are built
from Go modules by ``tools/build-talosctl.sh`` and ``tools/build-simnode.sh``, cached after the first build).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from runbook_lib.model.params import load_params
from runbook_lib.steps.context import connect
from runbook_lib.steps.verify import DRIVER_VERSION_FILE, verify
from tests.sim.test_library_real_talosctl import TALOS, gpu_ready_nodes, params_file
from tests.sim.test_real_talosctl import build, find_go, start_simnode

GETS = ("extensions", "modules", "pcidevices")
LOOP_SAMPLE = 20
READ_CONCURRENCY = 32  # the library's (runbook_lib.clients.talosctl.PATCH_CALLS)


@dataclass(frozen=True)
class Cli:
    """The real talosctl with simnode's talosconfig."""

    talosctl: Path
    talosconfig: Path

    def call(self, args: Sequence[str], nodes: Sequence[str]) -> None:
        argv = [str(self.talosctl), "--talosconfig", str(self.talosconfig), "-n", ",".join(nodes), *args]
        proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} on {len(nodes)} node(s) failed: {proc.stderr[:300]}")


Job = tuple[Sequence[str], Sequence[str]]


def get_args(resource: str) -> list[str]:
    return ["get", resource, "-o", "json"]


def read_jobs(nodes: Sequence[str]) -> list[Job]:
    return [(["read", DRIVER_VERSION_FILE], [n]) for n in nodes]


def run_pools(cli: Cli, pools: Sequence[tuple[list[Job], int]]) -> None:
    """Run each (jobs, concurrency) pool, all pools at the same time (verify starts every kind of read at once)."""

    def drain(pool: tuple[list[Job], int]) -> None:
        jobs, limit = pool
        with ThreadPoolExecutor(max_workers=max(1, min(limit, len(jobs)))) as ex:
            list(ex.map(lambda job: cli.call(*job), jobs))

    with ThreadPoolExecutor(max_workers=len(pools)) as outer:
        list(outer.map(drain, pools))


def one_call(nodes: Sequence[str], gets: Sequence[str]) -> list[tuple[list[Job], int]]:
    calls: list[Job] = [(get_args(r), nodes) for r in gets]
    return [(calls, len(calls)), (read_jobs(nodes), READ_CONCURRENCY)]


def per_node(limit: int) -> Callable[[Sequence[str], Sequence[str]], list[tuple[list[Job], int]]]:
    def plan(nodes: Sequence[str], gets: Sequence[str]) -> list[tuple[list[Job], int]]:
        jobs: list[Job] = [(get_args(r), [n]) for r in gets for n in nodes]
        return [(jobs + read_jobs(nodes), limit)]

    return plan


def chunked(size: int) -> Callable[[Sequence[str], Sequence[str]], list[tuple[list[Job], int]]]:
    def plan(nodes: Sequence[str], gets: Sequence[str]) -> list[tuple[list[Job], int]]:
        parts = [nodes[i : i + size] for i in range(0, len(nodes), size)]
        jobs: list[Job] = [(get_args(r), part) for r in gets for part in parts]
        return [(jobs, len(jobs)), (read_jobs(nodes), READ_CONCURRENCY)]

    return plan


STRATEGIES = {
    "one call -n all": one_call,
    "per node ×8": per_node(8),
    "per node ×32": per_node(32),
    "per node ×64": per_node(64),
    "chunks of 32": chunked(32),
    "chunks of 128": chunked(128),
}


def one_to_many(nodes: Sequence[str], per_node_calls: bool) -> list[Job]:
    """``version`` and ``service``: apid asks the nodes concurrently, so one call, unless per node is the rule."""
    groups = [[n] for n in nodes] if per_node_calls else [list(nodes)]
    return [(args, g) for args in (["version"], ["service"]) for g in groups]


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def time_strategy(cli: Cli, name: str, nodes: Sequence[str]) -> tuple[float, float]:
    """(all of verify's reads, ``get extensions`` alone) with one strategy."""
    pools = STRATEGIES[name](nodes, GETS)
    if name.startswith("per node"):  # one pool of c processes for every call
        pools = [(pools[0][0] + one_to_many(nodes, per_node_calls=True), pools[0][1])]
    else:
        extra = one_to_many(nodes, per_node_calls=False)
        pools = [*pools, (extra, len(extra))]
    whole = timed(lambda: run_pools(cli, pools))
    get_only = timed(lambda: run_pools(cli, STRATEGIES[name](nodes, ["extensions"])[:1]))
    return whole, get_only


def time_loop(cli: Cli, nodes: Sequence[str]) -> tuple[float, float, bool]:
    """The per-node loop (every call of a node, then the next node), scaled from a sample on big fleets."""
    sample = list(nodes) if len(nodes) <= 100 else list(nodes[:LOOP_SAMPLE])
    calls: list[Sequence[str]] = [*(get_args(r) for r in GETS), ["version"], ["service"]]
    calls.append(["read", DRIVER_VERSION_FILE])
    whole = timed(lambda: run_pools(cli, [([(args, [n]) for n in sample for args in calls], 1)]))
    get_only = timed(lambda: run_pools(cli, [([(get_args("extensions"), [n]) for n in sample], 1)]))
    scale = len(nodes) / len(sample)
    return whole * scale, get_only * scale, scale != 1


def time_library(params: Path, count: int) -> float:
    ctx = connect(load_params(params))
    start = time.perf_counter()
    result = verify(ctx)
    elapsed = time.perf_counter() - start
    bad = [n.node for n in result.nodes if n.status != "ok"]
    if len(result.nodes) != count or bad:  # a wrong answer is not a fast one
        raise RuntimeError(f"verify did not pass every node: {bad[:5]} ({len(bad)} failed)")
    return elapsed


def addresses(count: int) -> list[str]:
    return [f"10.7.{i // 250}.{i % 250 + 1}" for i in range(count)]


def bench_size(binaries: tuple[Path, Path], tmp: Path, count: int, latency_ms: int) -> None:
    talosctl, simnode = binaries
    state = tmp / "state"
    params = params_file(tmp, talosctl, state / "talosconfig", addresses(count))
    proc = start_simnode(simnode, state, gpu_ready_nodes(talosctl, tmp, params, latency_ms=latency_ms))
    try:
        cli, nodes = Cli(talosctl, state / "talosconfig"), addresses(count)
        library = time_library(params, count)
        floors = {name: time_strategy(cli, name, nodes) for name in STRATEGIES}
        loop_whole, loop_get, scaled = time_loop(cli, nodes)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    report(count, library, floors, (loop_whole, loop_get, scaled))


def report(
    count: int, library: float, floors: dict[str, tuple[float, float]], loop: tuple[float, float, bool]
) -> None:
    star = "*" if loop[2] else " "
    print(f"-- {count} nodes                 verify reads   get only")
    print(f"   library verify(ctx)     {library:8.2f} s")
    for name, (whole, get_only) in floors.items():
        print(f"   {name:<22}  {whole:8.2f} s  {get_only:8.2f} s")
    print(f"   per-node loop{star}          {loop[0]:8.2f} s  {loop[1]:8.2f} s")
    best = min(floors, key=lambda n: floors[n][0])
    best_get = min(floors, key=lambda n: floors[n][1])
    floor = floors[best][0]
    print(f"   fastest (verify reads): {best}; fastest get fan-out: {best_get}")
    print(
        f"   library ÷ floor {library / floor:5.2f}× (target ≤ 1.2×), "
        f"loop ÷ library {loop[0] / library:6.1f}× (target ≥ 20× at 1,000 nodes)",
        flush=True,
    )


def main() -> int:
    go = find_go()
    if go is None:
        print("SKIP: go is not installed: the real talosctl and simnode are built from Go modules")
        return 0
    os.environ["PATH"] = f"{Path(go).parent}:{os.environ['PATH']}"
    sizes = [int(s) for s in os.environ.get("BENCH_REAL_SIZES", "10,100,1000").split(",")]
    latency_ms = int(os.environ.get("BENCH_REAL_LATENCY_MS", "2"))
    binaries = (build("build-talosctl.sh", TALOS), build("build-simnode.sh"))
    print(f"real talosctl {TALOS} against simnode, {latency_ms} ms per node per call")
    for count in sizes:
        with tempfile.TemporaryDirectory(prefix=f"bench-real-{count}-") as tmp:
            bench_size(binaries, Path(tmp), count, latency_ms)
    return 0


if __name__ == "__main__":
    if (rc := main()) != 0:
        sys.exit(rc)
