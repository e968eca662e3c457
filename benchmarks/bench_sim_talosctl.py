"""Fleet-scale simulator benchmark: a 1,000-node cluster is created in seconds, and one
``talosctl get extensions -n <all 1,000>`` answers in about the per-node latency plus a small overhead,
not 1,000 times it (the real talosctl fans out concurrently through apid, and so must the simulator).

Run: ``python -m benchmarks sim_talosctl`` (or ``make bench``).  Exits 1 when a target is missed.
Targets: create ≤ 10 s; one fan-out call ≤ latency + 1.5 s overhead (process start, 1,000 state files,
1,000 threads, table rendering) on the project's 2-core machine.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from runbook_lib.sim.cluster import ClusterSpec, create
from runbook_lib.sim.state import sim_paths

NODES = 1000
LATENCY_MS = 50.0
CREATE_TARGET_S = 10.0
OVERHEAD_TARGET_S = 1.5


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="bench-sim-") as tmp:
        state = Path(tmp)
        start = time.perf_counter()
        nodes = create(state, ClusterSpec(workers=NODES, talos_version="1.12", latency_ms=LATENCY_MS))
        created = time.perf_counter() - start
        workers = ",".join(n.address for n in nodes if n.role == "worker")
        paths = sim_paths(state)
        argv = [
            str(paths.bin_dir / "talosctl"),
            "--talosconfig",
            str(paths.talosconfig),
            "get",
            "extensions",
            "-n",
            workers,
        ]
        timings = []
        for _ in range(3):
            start = time.perf_counter()
            r = subprocess.run(argv, capture_output=True, text=True, check=False)
            timings.append(time.perf_counter() - start)
            if r.returncode != 0 or len(r.stdout.splitlines()) != NODES + 1:
                print(f"FAIL: talosctl exited {r.returncode}: {r.stderr[:500]}")
                return 1
        best, median = min(timings), statistics.median(timings)
        serial = NODES * LATENCY_MS / 1000
        print(f"create {NODES} nodes:            {created:6.2f} s   (target ≤ {CREATE_TARGET_S:.0f} s)")
        print(
            f"get extensions -n <{NODES} nodes>: best {best:5.2f} s, median {median:5.2f} s "
            f"(latency {LATENCY_MS / 1000:.2f} s; target ≤ {LATENCY_MS / 1000 + OVERHEAD_TARGET_S:.2f} s; "
            f"serial would be {serial:.0f} s)"
        )
        ok = created <= CREATE_TARGET_S and median <= LATENCY_MS / 1000 + OVERHEAD_TARGET_S
        print("OK" if ok else "FAIL: target missed")
        return 0 if ok else 1


if __name__ == "__main__":
    if (rc := main()) != 0:
        sys.exit(rc)
