"""What ``bench_real_talosctl.py`` runs against: simnode fleets for the real talosctl, the floor strategies, and
a /proc watcher for the memory of a process tree (kept apart so the benchmark script stays readable).

Every strategy issues the talosctl calls a step needs, as processes of the real binary, the way a script
would: ``Job`` is one call (its arguments and ``-n`` nodes), a ``Pool`` a list of jobs run at most ``limit``
at once, and all pools of a strategy run at the same time (verify starts every kind of read at once).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from resource import RUSAGE_CHILDREN, getrusage
from typing import Any

from runbook_lib.steps.verify import DRIVER_VERSION_FILE
from tests.sim.test_library_real_talosctl import gpu_ready_nodes, params_file
from tests.sim.test_real_talosctl import find_go, start_simnode

Job = tuple[Sequence[str], Sequence[str]]
Pool = tuple[list[Job], int]
GETS = ("extensions", "modules", "pcidevices")


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

    def jobs(self, pools: Sequence[Pool]) -> None:
        """Run each pool at its own concurrency, all pools at the same time."""

        def drain(pool: Pool) -> None:
            jobs, limit = pool
            with ThreadPoolExecutor(max_workers=max(1, min(limit, len(jobs)))) as ex:
                list(ex.map(lambda job: self.call(*job), jobs))

        with ThreadPoolExecutor(max_workers=len(pools)) as outer:
            list(outer.map(drain, pools))


def go_on_path() -> bool:
    """Put Go's directory on PATH for the build scripts of the real talosctl and simnode; without Go, say SKIP
    and return False (the benchmarks that need them then skip)."""
    go = find_go()
    if go is None:
        print("SKIP: go is not installed: the real talosctl and simnode are built from Go modules")
        return False
    os.environ["PATH"] = f"{Path(go).parent}:{os.environ['PATH']}"
    return True


def update_results(path: Path, key: str, value: Any) -> None:
    """Set ``key`` in ``benchmarks/results.json``, keeping the other benchmarks' figures (each script owns keys)."""
    data = json.loads(path.read_text()) if path.exists() else {}
    data[key] = value
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def union_seconds(spans: Sequence[tuple[float, float]]) -> float:
    """Seconds covered by at least one of the (start, end) spans: overlapping ones count once."""
    total, start, end = 0.0, None, float("-inf")
    for lo, hi in sorted(spans):
        if start is None or lo > end:
            total += 0.0 if start is None else end - start
            start, end = lo, hi
        else:
            end = max(end, hi)
    return total + (end - start if start is not None else 0.0)


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def children_cpu() -> float:
    """CPU seconds (user + system) of this process's children waited for so far: the real tools it ran."""
    usage = getrusage(RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def split(nodes: Sequence[str], size: int) -> list[Sequence[str]]:
    return [nodes[i : i + size] for i in range(0, len(nodes), size)]


def get_args(resource: str) -> list[str]:
    return ["get", resource, "-o", "json"]


# -- verify: the calls of verify's reads, fanned out one way or another ------------------------------------


def verify_pools(nodes: Sequence[str], get_chunk: int, reads: int) -> list[Pool]:
    """Verify's reads: each ``get`` in chunks of ``get_chunk`` (all at once), ``version`` and ``service`` in one
    call each (one-to-many: apid asks the nodes concurrently), the per-node ``read`` ``reads`` at once."""
    gets: list[Job] = [(get_args(r), part) for r in GETS for part in split(nodes, get_chunk)]
    gets += [(["version"], nodes), (["service"], nodes)]
    return [(gets, len(gets)), ([(["read", DRIVER_VERSION_FILE], [n]) for n in nodes], reads)]


def get_only_pools(nodes: Sequence[str], get_chunk: int, per_node: int) -> list[Pool]:
    """One ``get extensions`` over the fleet: in chunks (all at once), or per node ``per_node`` at once."""
    if per_node:
        return [([(get_args("extensions"), [n]) for n in nodes], per_node)]
    parts = split(nodes, get_chunk)
    return [([(get_args("extensions"), part) for part in parts], len(parts))]


def verify_loop_jobs(nodes: Sequence[str]) -> list[Job]:
    """The per-node loop: every call of verify for one node, then the next node."""
    calls = [*(get_args(r) for r in GETS), ["version"], ["service"], ["read", DRIVER_VERSION_FILE]]
    return [(args, [n]) for n in nodes for args in calls]


# -- patch dry run: read each node's config, then dry-run the patch on it ------------------------------------


def patch_args(patch_file: Path) -> list[str]:
    return ["patch", "machineconfig", "--patch", f"@{patch_file}", "--dry-run"]


def patch_chunks(cli: Cli, nodes: Sequence[str], chunk: int, limit: int, patch_file: Path) -> None:
    """Per chunk, ``get machineconfig`` then ``patch --dry-run`` (the dry run needs the config read first);
    chunks at most ``limit`` at once."""

    def one(part: Sequence[str]) -> None:
        cli.call(get_args("machineconfig"), part)
        cli.call(patch_args(patch_file), part)

    parts = split(nodes, chunk)
    with ThreadPoolExecutor(max_workers=max(1, min(limit, len(parts)))) as ex:
        list(ex.map(one, parts))


# -- fleets ---------------------------------------------------------------------------------------------------


def addresses(count: int, second: int = 7) -> list[str]:
    return [f"10.{second}.{i // 250}.{i % 250 + 1}" for i in range(count)]


@dataclass(frozen=True)
class Fleet:
    cli: Cli
    nodes: list[str]
    params: Path


@contextmanager
def simnode_fleet(
    binaries: tuple[Path, Path], count: int, latency_ms: int, *, patched: bool
) -> Iterator[Fleet]:
    """``count`` nodes with the NVIDIA lts image: GPU-ready (``patched``) or with the stock worker config from
    ``talosctl gen config`` (the config-patch step then plans the modules patch for each)."""
    talosctl, simnode = binaries
    with tempfile.TemporaryDirectory(prefix=f"bench-real-{count}-") as tmp_name:
        tmp = Path(tmp_name)
        state = tmp / "state"
        nodes = addresses(count, 7 if patched else 8)
        params = params_file(tmp, talosctl, state / "talosconfig", nodes)
        spec = gpu_ready_nodes(talosctl, tmp, params, latency_ms=latency_ms)
        if not patched:
            stock = (tmp / "worker.yaml").read_text()  # written by gpu_ready_nodes before it patches it
            for node in spec["nodes"]:
                node["machine_config"] = stock
        proc = start_simnode(simnode, state, spec)
        try:
            yield Fleet(Cli(talosctl, state / "talosconfig"), nodes, params)
        finally:
            proc.terminate()
            proc.wait(timeout=30)


# -- memory of a process tree -----------------------------------------------------------------------------------


def _parents() -> dict[int, int]:
    """Every live process's parent (a process gone between the listing and its read is left out)."""
    parent = {int(e.name): _parent_of(int(e.name)) for e in os.scandir("/proc") if e.name.isdigit()}
    return {pid: ppid for pid, ppid in parent.items() if ppid}


def descendants(root: int) -> set[int]:
    """``root`` and every process under it."""
    parent = _parents()
    tree, frontier = {root}, {root}
    while frontier:
        frontier = {pid for pid, ppid in parent.items() if ppid in frontier}
        tree |= frontier
    return tree


def kind_of(pid: int, root: int) -> str:
    """What a process of the tree is: the runbook (the watched Python process and its HTML process), a notebook
    kernel, a talosctl, a helm, the simulator (its daemon, simnode, the real control plane's binaries and kwok: the
    cluster, not the runbook), or other: mostly a child between its fork and its exec, which shows its parent's
    pages.  Python's subprocess forks with vfork, so such a child shares its parent's memory and its smaps_rollup
    shows the parent's whole RSS and PSS (measured on Python 3.11: a 206 MB PSS parent and its child both showed
    206 MB): counting it would count the parent twice."""
    if pid == root:
        return "runbook"
    argv = _cmdline(pid)
    if argv and argv == _cmdline(_parent_of(pid)):  # forked, not yet exec'd: its pages are its parent's
        return "other"
    return kind_of_argv(argv.split(b"\0"))


def _parent_of(pid: int) -> int:
    """The parent pid from ``/proc/<pid>/stat``; 0 when the process is gone (or is init's child of the kernel)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


#: Paths of the simulated cluster's own binaries (``~/.cache/talos-gpu-runbooks/{kube,kwok,simkube,simnode}``).
SIMULATOR_MARKS = (b"simnode", b"runbook_lib.sim", b"/kube/v", b"/kwok/", b"simkube")


def kind_of_argv(argv: list[bytes]) -> str:
    """:func:`kind_of` for a process that is not the root, from its command line: a ``runbook_lib`` module outside
    the simulator (the HTML process, ``runbook_lib.notebook.html_worker``) is the runbook's own."""
    if any(a.startswith(b"runbook_lib.") and not a.startswith(b"runbook_lib.sim") for a in argv):
        return "runbook"
    if argv[0].endswith(b"talosctl"):
        return "talosctl"
    if argv[0].endswith(b"helm"):
        return "helm"
    if any(b"ipykernel" in a for a in argv):
        return "kernel"
    return "simulator" if any(m in a for a in argv for m in SIMULATOR_MARKS) else "other"


def memory_kb(pid: int) -> tuple[int, int]:
    """(RSS, PSS) in kB from smaps_rollup; (0, 0) when the process is gone."""
    try:
        lines = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
    except OSError:
        return 0, 0
    values = {ln.split(":")[0]: int(ln.split()[1]) for ln in lines if ln.endswith("kB")}
    return values.get("Rss", 0), values.get("Pss", 0)


@dataclass
class TreeWatch:
    """Samples a process tree from /proc every 0.2 s: per kind of process (:func:`kind_of`) the largest sums,
    over one sample, of RSS and of PSS (PSS splits shared pages among the processes sharing them: the 58 MB of
    talosctl's binary, a kernel's copy-on-write pages), how many were alive at once, and the largest sum of the
    runbook, its kernels and every talosctl and helm (``tree_*``: issue 16's process tree; the simulator left
    out)."""

    root: int
    peak: dict[str, float] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)

    def sample(self) -> None:
        sums: dict[str, float] = {}
        for pid in descendants(self.root):
            kind = kind_of(pid, self.root)
            rss, pss = memory_kb(pid)
            sums[f"{kind}_rss_mb"] = sums.get(f"{kind}_rss_mb", 0.0) + rss / 1024
            sums[f"{kind}_pss_mb"] = sums.get(f"{kind}_pss_mb", 0.0) + pss / 1024
            sums[f"{kind}_alive"] = sums.get(f"{kind}_alive", 0.0) + 1
        for unit in ("rss", "pss"):
            own = [sums.get(f"{k}_{unit}_mb", 0.0) for k in ("runbook", "kernel", "talosctl", "helm")]
            sums[f"tree_{unit}_mb"] = sum(own)
            sums[f"runbook_and_kernels_{unit}_mb"] = own[0] + own[1]
        for key, value in sums.items():
            self.peak[key] = max(self.peak.get(key, 0.0), value)

    def loop(self) -> None:
        while not self._stop.wait(0.2):
            self.sample()

    def watch(self, proc: subprocess.Popen[str], timeout: float) -> dict[str, float]:
        """Sample until ``proc`` ends; the peaks, rounded."""
        thread = threading.Thread(target=self.loop, daemon=True)
        thread.start()
        try:
            proc.wait(timeout=timeout)
        finally:
            self._stop.set()
            thread.join()
        return {k: round(v, 1) for k, v in sorted(self.peak.items())}


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


CHILD = """
import json, sys
from runbook_lib.model.params import load_params
from runbook_lib.steps.context import connect
from runbook_lib.steps.verify import verify
result = verify(connect(load_params(sys.argv[1])))
print(json.dumps([n.status for n in result.nodes].count("ok")))
"""


def watched_verify(params: Path) -> tuple[dict[str, float], int]:
    """``verify`` in a child Python process watched through /proc: peak memory of it and its talosctl children,
    and how many nodes passed."""
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(params)], stdout=subprocess.PIPE, text=True, cwd=Path.cwd()
    )
    peak = TreeWatch(proc.pid).watch(proc, timeout=900)
    out = proc.stdout.read() if proc.stdout else ""
    ok: Any = json.loads(out.strip().splitlines()[-1]) if out.strip() else 0
    return peak, int(ok)


def run_env(environ: dict[str, str]) -> dict[str, str]:
    """The run's environment: the real talosctl, and the Kubernetes side ``runbook run`` picks (the real control
    plane: ``RUNBOOK_SIM_KUBE=python`` is refused since the Python API server was retired on 2 Dec 2026)."""
    return {k: v for k, v in environ.items() if k != "RUNBOOK_SIM_KUBE"} | {"RUNBOOK_SIM_TALOSCTL": "real"}


def watched_run(work: Path, count: int, latency_ms: int) -> tuple[dict[str, float], float, Path]:
    """``runbook run -p <count GPU-ready nodes>`` (plan only) on the simulated cluster the CLI starts itself, with
    the real talosctl against simnode (``RUNBOOK_SIM_TALOSCTL=real``) and the real control plane (its binaries are
    counted as the simulator's, :func:`kind_of`): peak memory of the tree, wall time, and the record's directory."""
    params = work / "params.yaml"
    # 10.5.0.1-2 are the simulated control plane's
    nodes = [{"name": f"gpu-{i:04d}", "address": f"10.5.{i // 250}.{i % 250 + 3}"} for i in range(count)]
    simulation = {"scenario": "gpu-ready", "latency_ms": latency_ms}
    data = {"cluster": f"real{count}", "target": "simulated", "talos_version": "v1.12.0", "track": "lts"}
    params.write_text(json.dumps(data | {"nodes": nodes, "simulation": simulation}))
    argv = [sys.executable, "-m", "runbook_lib", "run", "-p", str(params), "--records", str(work / "records")]
    argv += ["--state", str(work / "state"), "--no-progress"]
    env = run_env(dict(os.environ))
    started = time.perf_counter()
    with open(work / "run.log", "w") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, text=True, env=env)
        peak = TreeWatch(proc.pid).watch(proc, timeout=1800)
    records = sorted((work / "records").glob("*/record.json"))
    log_text = (work / "run.log").read_text()
    if not records or "real talosctl" not in log_text:
        raise RuntimeError(f"runbook run did not run on the real talosctl:\n{log_text[-2000:]}")
    return peak, time.perf_counter() - started, records[-1].parent
