"""simnode follows the simulator daemon whose cluster it serves, as realkube's supervisor does
(``runbook_lib/sim/realkube.py`` ``_daemon_gone``: the daemon's pid and start time).

Why: ``realtalos.start`` runs simnode in its own session, and a caller that stops only the daemon
(``cluster.stop_daemon``: a test's ``finally``, ``runbook run`` replacing a daemon) or a daemon killed with
SIGKILL left simnode serving a cluster nobody runs any more, one leaked Go process per test.  The daemon's
pid and start time (``daemon.pid``) go to simnode as ``-parent-pid``/``-parent-start``; simnode polls
``/proc`` and stops when that process is gone.  Each test waits for the outcome with a generous deadline.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from runbook_lib.sim import cluster, pidfile, realtalos
from runbook_lib.sim.state import load_nodes
from tests.sim.test_real_talosctl import build
from tests.sim.waiting import wait_for

pytestmark = pytest.mark.slow

TALOS = "v1.12.0"


@pytest.fixture
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, int, int]]:
    """A one-node cluster: its daemon (tool server only) and simnode; (state dir, daemon pid, simnode pid)."""
    build("build-talosctl.sh", TALOS)  # cached after the first build; skips without go
    build("build-simnode.sh")
    monkeypatch.setenv(realtalos.MODE_ENV, "real")
    state = tmp_path / "sim"
    spec = cluster.ClusterSpec(workers=1, talos_version=TALOS, scenario="fresh")
    cluster.create(state, spec)
    cluster.start_daemon(state, rooms=[])
    try:
        choice = cluster.start_talos(state, spec, load_nodes(state))
        assert choice.real, choice.reason
        daemon, simnode = cluster.daemon_pid(state), realtalos.running_pid(state)
        assert daemon is not None and simnode is not None
        yield state, daemon, simnode
    finally:
        cluster.stop_talos(state)
        cluster.stop_daemon(state)


def gone(pid: int) -> bool:
    """The process has exited (a zombie not yet reaped by this test process counts as exited)."""
    return pidfile.start_time(pid) is None


@pytest.mark.parametrize("how", ["stop_daemon", "kill -9"])
def test_simnode_exits_when_the_daemon_it_serves_is_gone(served: tuple[Path, int, int], how: str) -> None:
    state, daemon, simnode = served
    if how == "stop_daemon":
        assert cluster.stop_daemon(state)
    else:
        os.kill(daemon, signal.SIGKILL)
    wait_for(lambda: gone(simnode), timeout=60)
    assert realtalos.running_pid(state) is None
    assert "parent process" in realtalos.paths(state).log.read_text()


def test_simnode_refuses_a_parent_start_time_it_cannot_compare(tmp_path: Path) -> None:
    """Bad input exits 2 naming the flag, before anything is served or written."""
    nodes = tmp_path / "nodes.json"
    nodes.write_text('{"nodes": []}')
    argv = [str(build("build-simnode.sh")), "-nodes", str(nodes), "-state-dir", str(tmp_path / "state")]
    proc = subprocess.run(
        [*argv, "-parent-pid", str(os.getpid()), "-parent-start", "yesterday"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert "-parent-start" in proc.stderr
    assert not (tmp_path / "state").exists()
