"""A ``runbook sim up`` that fails after the real control plane started stops everything it started.

Issue 15 ("nothing left after down or a failed start"): the talosctl side is started last
(``runbook_lib/cli/cmd_sim.py``), after the daemon and the real control plane; when it cannot be honoured
(``RUNBOOK_SIM_TALOSCTL=real`` with a talosctl of another minor release than the nodes, which simnode refuses
to pair), ``sim up`` exits 2 and must leave no process of its state dir behind. Before, it stopped only the
daemon and the control plane went down later, whenever its supervisor noticed the daemon was gone.
Skipped, saying what to build, when the control plane is not built (``make kube-tools``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from runbook_lib.sim import realkube
from tests.sim.test_sim_up_real_kube import _cmdline, runbook, tools

pytestmark = pytest.mark.slow

__all__ = ["tools"]  # the fixture, imported so that this file skips where the control plane is not built


def processes_of(state: Path) -> list[str]:
    """Command lines of the processes naming ``state`` (this test's own dir: other tests' are not counted)."""
    return [line for p in Path("/proc").glob("[0-9]*") if str(state) in (line := _cmdline(p))]


def test_a_failed_talosctl_start_stops_the_control_plane_before_sim_up_returns(
    tools: realkube.Tools, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "sim"
    monkeypatch.setenv("RUNBOOK_SIM_TALOSCTL", "real")
    try:
        failed = runbook(
            "sim", "up", "--state", str(state), "--nodes", "1", "--talosctl-version", "1.11", mode="real"
        )
        assert failed.returncode == 2, failed.stdout + failed.stderr
        assert "RUNBOOK_SIM_TALOSCTL=real: talosctl v1.11" in failed.stderr
        assert "is not the nodes' release" in failed.stderr
        assert realkube.supervisor_pid(state) is None
        assert processes_of(state) == []
    finally:
        runbook("sim", "down", "--state", str(state), mode="real")


def test_a_ctrl_c_while_the_control_plane_starts_leaves_nothing_running(
    tools: realkube.Tools, tmp_path: Path
) -> None:
    """Ctrl-C in ``sim up`` once the control plane's supervisor runs, before simnode: before, the daemon and the
    half-started control plane stayed up (stop 45's note: "a half cluster")."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.test_interrupts import _default_sigint

    state = tmp_path / "sim"
    argv = [sys.executable, "-m", "runbook_lib", "sim", "up", "--state", str(state), "--nodes", "1"]
    env = os.environ | {realkube.MODE_ENV: "real"}
    proc = subprocess.Popen(
        argv,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # CI runs in the background, where SIGINT is ignored and a child inherits that (tests/test_interrupts.py)
        preexec_fn=_default_sigint,  # noqa: PLW1509 - the child must see SIGINT
    )
    try:
        deadline = time.monotonic() + 120
        while realkube.supervisor_pid(state) is None and proc.poll() is None:
            assert time.monotonic() < deadline, "the control plane never started"
            time.sleep(0.05)
        assert proc.poll() is None, "sim up ended before the control plane started: " + proc.communicate()[1]
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=120)
        assert proc.returncode != 0, err
        assert realkube.supervisor_pid(state) is None
        assert processes_of(state) == [], processes_of(state)
    finally:
        if proc.poll() is None:
            proc.kill()
        runbook("sim", "down", "--state", str(state), mode="real")
