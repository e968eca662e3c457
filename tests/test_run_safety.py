"""``runbook run`` safety: no random crash, nothing applied without approval on this command line, no
crash on a failing version probe, bad arguments refused before anything starts, concurrent runs locked.

Issue 18; the attack report /work/shared/docs/attack-2026-12-01.md (F1, F2, F3, F8, F12) gives the commands.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PARAMS = str(REPO / "params" / "simulated.yaml")

# ---------------------------------------------------------------------------------------------------------
# F1: the import race between the main thread and the run's worker threads

#: Runs ``runbook run`` in a fresh interpreter and prints, as JSON, every module that a thread other than
#: the main thread imported for the first time.  Two threads importing the same package at once is what
#: handed one of them a partially initialised ``requests.utils`` (CPython's import deadlock avoidance).
_TRACE_THREAD_IMPORTS = textwrap.dedent(
    """
    import importlib.abc, json, sys, threading

    off_main = []

    class Tracer(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name not in sys.modules and threading.current_thread() is not threading.main_thread():
                off_main.append([threading.current_thread().name, name])
            return None

    sys.meta_path.insert(0, Tracer())
    from runbook_lib.cli import main

    code = main(sys.argv[1:])
    print(json.dumps({"exit": code, "off_main": off_main}))
    """
)


@pytest.mark.slow
def test_run_worker_threads_import_nothing_so_no_import_race_is_possible(tmp_path: Path) -> None:
    """F1: ~1 run in 4 died with ``ImportError: cannot import name 'parse_dict_header' from partially
    initialized module 'requests.utils'``: worker threads imported requests (the Kubernetes client) while the
    main thread imported papermill.  Timing-dependent, so the test checks the cause, deterministically: every
    module a worker thread needs is imported on the main thread before (a multi-step run: kernels started
    ahead, stopped, HTML copies, version reads)."""
    argv = ["run", "-p", PARAMS, "--set", "simulation.scenario=gpu-ready", "--no-progress"]
    argv += ["--records", str(tmp_path / "records"), "--state", str(tmp_path / "sim")]
    proc = subprocess.run(
        [sys.executable, "-c", _TRACE_THREAD_IMPORTS, *argv],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.splitlines()[-1])
    assert report["exit"] == 0, proc.stdout
    assert report["off_main"] == [], report["off_main"][:40]
