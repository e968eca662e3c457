"""``python -m benchmarks``: run every ``benchmarks/bench_*.py`` in turn; exit 1 if any of them failed.

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
    failed: list[str] = []
    for script in scripts:
        print(f"== {script.stem}", flush=True)
        try:
            runpy.run_path(str(script), run_name="__main__")
        except SystemExit as exc:  # a script that exits non-zero must not hide the others' figures
            if exc.code not in (None, 0):
                failed.append(script.stem)
    if failed:
        print(f"benchmarks that failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
