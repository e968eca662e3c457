"""``python -m benchmarks``: run the benchmark scripts in turn; exit 1 if any of them failed.

Each benchmark script prints its own figures with their targets and whether each is met; this runner only
sequences them so that ``make bench`` is one command, and says at the end how long it took and how loaded the
machine was (timings on a shared 2-core machine move with the other processes' load).

Two sets (benchmarks/README.md, "What make bench runs"):

- ``make bench`` (no flag): the figures of issue 16, aimed at about 10 minutes on 2 cores (11.6 minutes on 4 Dec
  2026 with nothing else running, 36 at load 25-83): ``QUICK`` scripts, with
  the settings of ``QUICK_ENV`` (fewer repeats and candidates at 1,000 nodes, the whole change at 100 nodes and
  one ``rollout_concurrency``, the control plane at 1,000 nodes only), each printed by the script that applies it;
- ``make bench-full`` (``--full``): every ``bench_*.py`` with the long variants of ``FULL_ENV`` (the whole change
  at 1,000 nodes with ``rollout_concurrency`` 125 and 250, ~30 minutes; all floor candidates and repeats; the
  issue 8 figures of the Python simulator, ``bench_fleet``), about an hour.

A variable already in the environment wins over both.  Names pick scripts: ``python -m benchmarks small_run``.
"""

from __future__ import annotations

import os
import runpy
import sys
import time
from pathlib import Path

#: the scripts of ``make bench`` (issue 16's figures); the others run with ``--full``
QUICK = ("small_run", "real_talosctl", "whole_change", "real_plane", "schematic")
QUICK_ENV = {
    "BENCH_REAL_QUICK": "1",
    "BENCH_WHOLE_CONCURRENCY": "50",
    "BENCH_REAL_PLANE_SIZES": "1000",
    "BENCH_REAL_PLANE_AGAIN": "0",
}
FULL_ENV = {"BENCH_WHOLE_NODES": "1000", "BENCH_WHOLE_CONCURRENCY": "125,250"}


def selected(here: Path, names: list[str], full: bool) -> list[Path]:
    scripts = sorted(here.glob("bench_*.py"))
    if names:
        return [s for s in scripts if s.stem.removeprefix("bench_") in names or s.stem in names]
    return scripts if full else [s for s in scripts if s.stem.removeprefix("bench_") in QUICK]


def main(argv: list[str]) -> int:
    full = "--full" in argv
    names = [a for a in argv if a != "--full"]
    scripts = selected(Path(__file__).resolve().parent, names, full)
    if not scripts:
        print("no benchmark matched", file=sys.stderr)
        return 2
    for key, value in (FULL_ENV if full else QUICK_ENV).items():
        os.environ.setdefault(key, value)
    started, failed = time.perf_counter(), list[str]()
    for script in scripts:
        print(f"== {script.stem}", flush=True)
        try:
            runpy.run_path(str(script), run_name="__main__")
        except SystemExit as exc:  # a script that exits non-zero must not hide the others' figures
            if exc.code not in (None, 0):
                failed.append(script.stem)
    load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"== {len(scripts)} benchmarks in {time.perf_counter() - started:.0f} s; load average (1/5/15 min) {load}"
    )
    if failed:
        print(f"benchmarks that failed or missed a target: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
