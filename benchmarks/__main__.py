"""``python -m benchmarks``: run every ``benchmarks/bench_*.py`` in turn and stop at the first failure.

Each benchmark script prints its own figures with their targets; this runner only sequences them so that
``make bench`` is one command.  Pass names to run a subset: ``python -m benchmarks sim_talosctl``.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    here = Path(__file__).resolve().parent
    scripts = sorted(here.glob("bench_*.py"))
    if argv:
        scripts = [s for s in scripts if s.stem.removeprefix("bench_") in argv or s.stem in argv]
    if not scripts:
        print("no benchmark matched", file=sys.stderr)
        return 2
    for script in scripts:
        print(f"== {script.stem}", flush=True)
        runpy.run_path(str(script), run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
