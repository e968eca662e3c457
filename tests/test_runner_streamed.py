"""``Runner.run(on_stderr_line=…)`` hands each stderr line over as the program prints it, and still journals the
whole output and kills the program at its timeout.

Why: one ``talosctl upgrade --wait`` over several nodes prints a node's failure long before it exits (the real
talosctl v1.12.0's captured output: tests/data/talosctl_upgrade_batch/, the failing node at 0.39 s, the process
exiting at 8.3 s); the image step reports that node from the line (tests/test_image_batch_tracked.py).
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

from runbook_lib.clients.proc import Runner

#: prints a line, then waits until the file named by argv[1] exists (the test creates it once it saw the line)
PROGRAM = (
    "import os, sys, time\n"
    "print('\"10.5.0.3\": 1 error(s) occurred:', file=sys.stderr, flush=True)\n"
    "while not os.path.exists(sys.argv[1]): time.sleep(0.01)\n"
    "print('out'); print('\"10.5.0.4\": post check passed', file=sys.stderr); sys.exit(1)\n"
)


def test_a_line_is_handed_over_before_the_program_ends(tmp_path: Path) -> None:
    go_on = f"{tmp_path}/go-on"
    seen: list[str] = []

    def on_line(line: str) -> None:
        seen.append(line)
        if len(seen) == 1:  # the program is still waiting: it ends only once this file exists
            threading.Thread(target=lambda: open(go_on, "w").close()).start()

    runner = Runner()
    result = runner.run([sys.executable, "-c", PROGRAM, go_on], timeout=60, on_stderr_line=on_line)
    assert seen == ['"10.5.0.3": 1 error(s) occurred:\n', '"10.5.0.4": post check passed\n']
    assert (result.exit_code, result.stdout, result.stderr) == (1, "out\n", "".join(seen))
    assert runner.journal.entries[-1].stderr == result.stderr


def test_a_program_past_its_timeout_is_killed_with_what_it_printed(tmp_path: Path) -> None:
    never = f"{tmp_path}/never"
    # 5 s, not 1: the child's Python must start and print its first line before the kill, which under the suite's
    # load (pytest -n 3 on 2 cores) can take more than a second
    result = Runner().run([sys.executable, "-c", PROGRAM, never], timeout=5.0, on_stderr_line=lambda _l: None)
    assert result.exit_code == 124
    assert result.stderr.startswith('"10.5.0.3": 1 error(s) occurred:\n')
    assert "(timed out after 5 s)" in result.stderr
