"""A simulator daemon that does not answer within ``start_daemon``'s timeout is stopped, not left behind.

Found on 2 Dec 2026: at load ~110, ``runbook run`` on ``target: simulated`` failed with "simulator daemon did not
start within 15s", and the daemon it had started (in a session of its own, ``start_new_session=True``) and its
child kept running for 39 minutes after the run had exited, holding their ports, until killed by hand. Nothing
else knew their pid: the run had failed before ``endpoints.json`` named it, so ``runbook sim down`` could not stop
them either."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from runbook_lib.sim import cluster


def _processes_of(state_dir: Path) -> list[int]:
    """Live pids whose command line names this test's state dir (unique per test: xdist-safe)."""
    mine = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if str(state_dir).encode() in argv and stat.rsplit(")", 1)[-1].split()[0] != "Z":
            mine.append(int(entry.name))
    return mine


def test_a_daemon_that_misses_the_start_timeout_is_stopped(tmp_path: Path) -> None:
    cluster.create(tmp_path, cluster.ClusterSpec(workers=1))
    with pytest.raises(RuntimeError, match="did not start within"):
        cluster.start_daemon(tmp_path, timeout=0.01)  # Python's own start-up alone takes longer
    deadline = time.monotonic() + 10
    while _processes_of(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = _processes_of(tmp_path)
    for pid in left:  # never leave them to the next test, whatever the result
        os.kill(pid, 9)
    assert not left, f"the daemon is still running after start_daemon failed: pids {left}"
