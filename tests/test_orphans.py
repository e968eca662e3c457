"""A killed pytest's simulated cluster is stopped when the next session starts (``tests/orphans.py``).

The processes here stand in for simnode or kube-apiserver: what matters is that their command line names a
session's base temporary directory, as the real servers' ``--state``/``--kubeconfig`` arguments do.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import orphans


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        proc.kill()
        proc.wait()


def shows_argv(proc: subprocess.Popen[bytes]) -> subprocess.Popen[bytes]:
    """Wait until ``/proc/<pid>/cmdline`` holds the program's arguments. ``Popen`` returns once the child has
    entered ``execve``, and the kernel lets the parent go on before it has set up the new program's
    arguments: on 4 Dec 2026, 201 of 300 reads right after ``Popen`` found the cmdline empty (CI failed on it
    with ``assert [] == [pid]``). A real orphan has long been running when a session starts."""
    deadline = time.monotonic() + 10
    while not any(orphans._argv(proc.pid)) and time.monotonic() < deadline:
        time.sleep(0.01)
    return proc


def server(procs: list[subprocess.Popen[bytes]], state: Path) -> subprocess.Popen[bytes]:
    state.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "--state", str(state)])
    procs.append(proc)
    return shows_argv(proc)


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_killed_sessions_servers_are_stopped_and_a_running_sessions_are_not(
    tmp_path: Path, started: list[subprocess.Popen[bytes]]
) -> None:
    root = tmp_path / "pytest-of-someone"
    killed, running, unmarked, ours = (root / f"pytest-{n}" for n in (11, 12, 13, 14))
    orphan = server(started, killed / "popen-gw0" / "test_x0" / "sim")
    live = server(started, running / "popen-gw1" / "sim")
    unknown = server(started, unmarked / "sim")
    mine = server(started, ours / "sim")
    orphans.mark_owner(killed, dead_pid())
    owner = shows_argv(
        subprocess.Popen(["pytest", "-c", "import time; time.sleep(120)"], executable=sys.executable)
    )
    started.append(
        owner
    )  # a running pytest (as its argv says); this test's own process may be an xdist worker
    orphans.mark_owner(running, owner.pid)
    orphans.mark_owner(ours, dead_pid())

    found = orphans.orphans(root, current=ours)

    assert [pid for pid, _d in found] == [orphan.pid]
    assert orphans.stop([pid for pid, _d in found]) == [orphan.pid]
    assert orphan.wait(timeout=10) is not None
    assert live.poll() is None and unknown.poll() is None and mine.poll() is None


def test_a_reused_pid_that_is_not_a_pytest_does_not_keep_a_cluster_alive(
    tmp_path: Path, started: list[subprocess.Popen[bytes]]
) -> None:
    root = tmp_path / "pytest-of-someone"
    other = server(started, root / "pytest-20" / "elsewhere")  # any running process, not a pytest
    orphan = server(started, root / "pytest-21" / "sim")
    orphans.mark_owner(root / "pytest-21", other.pid)

    assert [pid for pid, _d in orphans.orphans(root)] == [orphan.pid]
