"""The image step's report of a failed ``talosctl upgrade --wait``, on the output the real talosctl prints.

TRACKER_OUTPUT is the stderr of the real talosctl v1.12.0 (``RUNBOOK_SIM_TALOSCTL=real``) upgrading simnode's
``upgrade-hangs`` node (a boot that never gets past ``startAllServices``), taken from a run of
tests/sim/test_real_faults.py, only the node's address changed.  Its shape is the tracker's non-terminal
reporter: one ``"<node>": <update>`` line per update, the phase/task/sequence events of
talos@v1.12.0 cmd/talosctl/pkg/talos/action/node.go (handleEvent: ``phase: %s action: %v``, ``task: …``,
``sequence: %s action: %v error: [code: … message: …]``; ``unavailable, retrying...``; ``error: %v``) printed
by tracker.go (non-TTY branch, ``"%q: %v"``; see ../shared/docs/reality-gaps.md §Talos CLI row 6), and at
the end the node's returned error, a multierror (``N error(s) occurred:`` then tab-indented lines).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from runbook_lib.sim import factory
from runbook_lib.steps import image, image_diagnosis
from runbook_lib.steps.image import image_upgrade
from tests.test_image_step import _ctx, _sim

ADDRESS = "10.5.0.4"  # talos-worker-2
CAPTURED = (
    '"10.5.0.13": waiting for actor ID\n'
    '"10.5.0.13": actor ID: 72582136-333e-4da9-a68f-7bea3f6afe9a\n'
    '"10.5.0.13": sequence: upgrade action: START\n'
    '"10.5.0.13": phase: drain action: START\n'
    '"10.5.0.13": task: cordonAndDrainNode action: START\n'
    '"10.5.0.13": task: cordonAndDrainNode action: STOP\n'
    '"10.5.0.13": phase: drain action: STOP\n'
    '"10.5.0.13": phase: cleanup action: START\n'
    '"10.5.0.13": task: stopAllPods action: START\n'
    '"10.5.0.13": task: stopAllPods action: STOP\n'
    '"10.5.0.13": phase: cleanup action: STOP\n'
    '"10.5.0.13": phase: dbus action: START\n'
    '"10.5.0.13": task: stopDBus action: START\n'
    '"10.5.0.13": task: stopDBus action: STOP\n'
    '"10.5.0.13": phase: dbus action: STOP\n'
    '"10.5.0.13": phase: stopServices action: START\n'
    '"10.5.0.13": task: stopServicesForUpgrade action: START\n'
    '"10.5.0.13": task: stopServicesForUpgrade action: STOP\n'
    '"10.5.0.13": phase: stopServices action: STOP\n'
    '"10.5.0.13": phase: unmount action: START\n'
    '"10.5.0.13": task: unmountPodMounts action: START\n'
    '"10.5.0.13": task: unmountPodMounts action: STOP\n'
    '"10.5.0.13": phase: unmount action: STOP\n'
    '"10.5.0.13": phase: unmountBind action: START\n'
    '"10.5.0.13": task: unmountSystemDiskBindMounts action: START\n'
    '"10.5.0.13": task: unmountSystemDiskBindMounts action: STOP\n'
    '"10.5.0.13": phase: unmountBind action: STOP\n'
    '"10.5.0.13": phase: unmountSystem action: START\n'
    '"10.5.0.13": task: unmountEphemeralPartition action: START\n'
    '"10.5.0.13": task: unmountEphemeralPartition action: STOP\n'
    '"10.5.0.13": phase: unmountSystem action: STOP\n'
    '"10.5.0.13": phase: volumeFinalize action: START\n'
    '"10.5.0.13": task: teardownLifecycle action: START\n'
    '"10.5.0.13": task: teardownLifecycle action: STOP\n'
    '"10.5.0.13": phase: volumeFinalize action: STOP\n'
    '"10.5.0.13": phase: upgrade action: START\n'
    '"10.5.0.13": task: upgrade action: START\n'
    '"10.5.0.13": task: upgrade action: STOP\n'
    '"10.5.0.13": phase: upgrade action: STOP\n'
    '"10.5.0.13": phase: meta action: START\n'
    '"10.5.0.13": task: reloadMeta action: START\n'
    '"10.5.0.13": task: reloadMeta action: STOP\n'
    '"10.5.0.13": phase: meta action: STOP\n'
    '"10.5.0.13": phase: kexec action: START\n'
    '"10.5.0.13": task: kexecPrepare action: START\n'
    '"10.5.0.13": task: kexecPrepare action: STOP\n'
    '"10.5.0.13": phase: kexec action: STOP\n'
    '"10.5.0.13": phase: stopEverything action: START\n'
    '"10.5.0.13": task: stopAllServices action: START\n'
    '"10.5.0.13": error: stopAllServices task completed\n'
    '"10.5.0.13": unavailable, retrying...\n'
    '"10.5.0.13": sequence: boot action: START\n'
    '"10.5.0.13": phase: startEverything action: START\n'
    '"10.5.0.13": task: startAllServices action: START\n'
    '"10.5.0.13": stage: BOOTING ready: false unmetCond: []\n'
    '"10.5.0.13": sequence: boot action: NOOP error: [code: sequence failed: error running phase 9 in boot sequence: task 1/1: failed, 1 error occurred:\n'
    "\t* context deadline exceeded\n"
    "\n"
    " message: FATAL]\n"
    '"10.5.0.13": error: sequence error: sequence failed: error running phase 9 in boot sequence: task 1/1: failed, 1 error occurred:\n'
    "\t* context deadline exceeded\n"
    "\n"
    "\n"
    '"10.5.0.13": 3 error(s) occurred:\n'
    "\tstopAllServices task completed\n"
    '\terror while watching events: rpc error: code = Unavailable desc = connection error: desc = "transport: Error while dialing: dial tcp 10.5.0.13:50000: connect: connection refused"\n'
    "\tsequence error: sequence failed: error running phase 9 in boot sequence: task 1/1: failed, 1 error occurred:\n"
    "\t* context deadline exceeded\n"
)
TRACKER_OUTPUT = "".join(CAPTURED).replace("10.5.0.13", ADDRESS)
DECISIVE = (
    "error running phase 9 in boot sequence: task 1/1: failed",
    "context deadline exceeded",
    "dial tcp 10.5.0.4:50000: connect: connection refused",
)
#: The tracker's progress lines the node's message must not carry.
PROGRESS = ("phase: drain action: START", "task: kexecPrepare action: STOP", "waiting for actor ID")

pytestmark = pytest.mark.slow


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[tuple[Path, factory.FactoryServer]]:
    yield from _sim(tmp_path)


def _fail_upgrade_of(monkeypatch: pytest.MonkeyPatch, address: str, stderr: str) -> None:
    """The upgrade of ``address`` exits 1 printing ``stderr``, as the real talosctl does; everything else runs."""
    real_run = subprocess.run

    def run(argv: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        if "upgrade" in argv and address in argv:
            return subprocess.CompletedProcess(list(argv), 1, "", stderr)
        return real_run(argv, **kwargs)

    monkeypatch.setattr(subprocess, "run", run)  # the journal is written by runbook_lib.clients.proc.Runner
    # one process per node, as this fake of subprocess.run answers; one process over several nodes (streamed, not
    # through subprocess.run) is tests/test_image_batch_tracked.py's, on the real talosctl's captured output
    monkeypatch.setattr(image, "_tracked", lambda _client, *, legacy: False)


def test_a_failed_real_upgrade_reports_its_error_and_last_phase_not_the_progress(
    sim: tuple[Path, factory.FactoryServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    state, _server = sim
    _fail_upgrade_of(monkeypatch, ADDRESS, TRACKER_OUTPUT)
    ctx = _ctx(state, apply=True)
    result = image_upgrade(ctx, settle_timeout=5.0, poll_interval=0.1)
    node = result.node("talos-worker-2")
    upgrade = next(c for c in node.checks if c.name == "upgrade")
    for shown in (node.message, upgrade.message):
        assert all(line in shown for line in DECISIVE), shown
        assert not any(line in shown for line in PROGRESS), shown
        assert "last phase: startEverything (task startAllServices)" in shown, shown
        assert "journal" in shown, shown
        assert len(shown.splitlines()) <= 15, shown
    [journalled] = [e for e in ctx.journal.entries if e.argv and "upgrade" in e.argv and ADDRESS in e.argv]
    assert journalled.stderr == TRACKER_OUTPUT  # the full output stays where the message says


def test_a_long_real_upgrade_output_keeps_its_final_error_in_the_journal(
    sim: tuple[Path, factory.FactoryServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node unavailable for long makes the tracker print ``unavailable, retrying...`` once per retry
    (node.go trackEventsWithRetry): the output outgrows the journal's limit, and the error is at its end."""
    state, _server = sim
    head, tail = TRACKER_OUTPUT.split(f'"{ADDRESS}": sequence: boot action: START\n')
    retries = f'"{ADDRESS}": unavailable, retrying...\n' * 200
    long_output = head + retries + f'"{ADDRESS}": sequence: boot action: START\n' + tail
    _fail_upgrade_of(monkeypatch, ADDRESS, long_output)
    ctx = _ctx(state, apply=True)
    image_upgrade(ctx, settle_timeout=5.0, poll_interval=0.1)
    [journalled] = [e for e in ctx.journal.entries if e.argv and "upgrade" in e.argv and ADDRESS in e.argv]
    assert "3 error(s) occurred:" in journalled.stderr and "dial tcp 10.5.0.4:50000" in journalled.stderr
    assert "waiting for actor ID" in journalled.stderr


def test_a_killed_upgrade_keeps_the_runners_timeout_line_after_the_progress() -> None:
    """When talosctl outlives the Runner's timeout, proc.Runner appends ``(timed out after N s)`` to what it
    printed so far (runbook_lib/clients/proc.py), which ends with progress lines: that line is the error."""
    cut = TRACKER_OUTPUT.index(f'"{ADDRESS}": stage: BOOTING')
    report = image_diagnosis.upgrade_report(TRACKER_OUTPUT[:cut] + "\n(timed out after 150 s)")
    assert report.splitlines()[0] == "(timed out after 150 s)", report
    assert "last phase: startEverything (task startAllServices)" in report, report
