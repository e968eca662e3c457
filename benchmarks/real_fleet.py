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
from typing import Any

from runbook_lib.steps.verify import DRIVER_VERSION_FILE
from tests.sim.test_library_real_talosctl import gpu_ready_nodes, params_file
from tests.sim.test_real_talosctl import start_simnode

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


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


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


@dataclass
class TreeWatch:
    """Samples a process tree from /proc every 0.1 s: the largest sums over one sample of RSS and of PSS (the
    shared pages of N talosctl processes, their 58 MB of binary, split among them), split into the Python
    process itself and its talosctl children, and the most talosctl processes alive at once."""

    root: int
    peak: dict[str, float] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)

    def _children(self) -> list[int]:
        out = []
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                try:
                    stat = Path(f"/proc/{entry.name}/stat").read_text()
                except OSError:
                    continue
                if int(stat.rsplit(")", 1)[1].split()[1]) == self.root:
                    out.append(int(entry.name))
        return out

    @staticmethod
    def _memory(pid: int) -> tuple[int, int]:
        """(RSS, PSS) in kB from smaps_rollup; (0, 0) when the process is gone."""
        try:
            lines = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
        except OSError:
            return 0, 0
        values = {ln.split(":")[0]: int(ln.split()[1]) for ln in lines if ln.endswith("kB")}
        return values.get("Rss", 0), values.get("Pss", 0)

    def sample(self) -> None:
        kids = [pid for pid in self._children() if b"talosctl" in _cmdline(pid)]
        own_rss, own_pss = self._memory(self.root)
        kid = [self._memory(pid) for pid in kids]
        sample = {
            "self_rss_mb": own_rss / 1024,
            "talosctl_rss_mb": sum(r for r, _ in kid) / 1024,
            "talosctl_pss_mb": sum(p for _, p in kid) / 1024,
            "tree_rss_mb": (own_rss + sum(r for r, _ in kid)) / 1024,
            "tree_pss_mb": (own_pss + sum(p for _, p in kid)) / 1024,
            "talosctl_alive": float(len(kids)),
        }
        for key, value in sample.items():
            self.peak[key] = max(self.peak.get(key, 0.0), value)

    def loop(self) -> None:
        while not self._stop.wait(0.1):
            self.sample()

    def stop(self) -> None:
        self._stop.set()


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
    watch = TreeWatch(proc.pid)
    thread = threading.Thread(target=watch.loop, daemon=True)
    thread.start()
    out, _ = proc.communicate(timeout=900)
    watch.stop()
    thread.join()
    ok: Any = json.loads(out.strip().splitlines()[-1]) if out.strip() else 0
    return {k: round(v, 1) for k, v in watch.peak.items()}, int(ok)
