"""Issue 14: the image step names the service a hung boot waits for, and says that talosctl's --timeout passed.

CAPTURED is the stderr of the real talosctl v1.12.0 (``RUNBOOK_SIM_TALOSCTL=auto``) whose ``upgrade --wait
--timeout=10s`` of simnode's ``unsupported-gpu`` node gave up while the new boot still hung (a run of
tests/test_fault_diagnosis.py, the upgrade-phase lines cut). Its shape is talos@v1.12.0's:

- after the reboot the tracker re-watches with tail -1 (cmd/talosctl/pkg/talos/action/node.go:163-172) and
  prints every event of the new boot, the ServiceStateEvents included (``service: %v message: %v healthy: %v``,
  node.go:303-307), which machined publishes at each service state change (internal/app/machined/pkg/system/
  service_runner.go:73-93); a service waiting on a dependency says ``Waiting for <condition>`` (:158,
  pkg/conditions/files.go ``file %q to exist``);
- at --timeout the command ends with no line saying so: the reporter stops with the context
  (action/tracker.go:168-180, 282-284); what is left is the watch's own ``error: rpc error: code =
  DeadlineExceeded …`` (node.go:175-181).

That last service line is simnode's (it publishes the boot's service events as machined does); no capture from
a real Talos node was at hand.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from runbook_lib.model.diagnosis import NodeContext, diagnose_text
from runbook_lib.model.params import Node
from runbook_lib.steps import image_diagnosis
from runbook_lib.steps.image import _upgrade_batch
from runbook_lib.steps.image_diagnosis import UpgradeFailure, go_duration, hung_services, upgrade_report
from tests.test_image_batch_tracked import FakeTalosctl, capture, setup

ADDRESS = "10.5.0.5"
UPGRADE = "".join(
    f'"{ADDRESS}": {line}\n'
    for line in (
        "waiting for actor ID",
        "actor ID: a42f2df5-5bc5-4287-8d37-7a17d3098b50",
        "sequence: upgrade action: START",
        "phase: upgrade action: START",
        "task: upgrade action: START",
        "task: upgrade action: STOP",
        "phase: upgrade action: STOP",
        "phase: stopEverything action: START",
        "task: stopAllServices action: START",
        "error: stopAllServices task completed",
        "unavailable, retrying...",
        "unavailable, retrying...",
        "sequence: boot action: START",
        "phase: startEverything action: START",
        "task: startAllServices action: START",
        "stage: BOOTING ready: false unmetCond: []",
    )
)
WAITING = 'Waiting for file "/sys/bus/pci/drivers/nvidia" to exist'
HUNG = f'"{ADDRESS}": service: ext-nvidia-persistenced message: {WAITING} healthy: false\n'
TIMED_OUT = (
    f'"{ADDRESS}": error: rpc error: code = DeadlineExceeded desc = stream terminated by RST_STREAM with error '
    "code: CANCEL\n"
)
CAPTURED = UPGRADE + HUNG + TIMED_OUT
#: The next event of a boot whose driver bound: the containerd runner's (talos@v1.12.0 internal/app/machined/
#: pkg/system/runner/containerd/containerd.go:224, the PID made up).
STARTED = (
    f'"{ADDRESS}": service: ext-nvidia-persistenced message: Started task ext-nvidia-persistenced (PID 4242) '
    "for container ext-nvidia-persistenced healthy: false\n"
)
NODE = Node(name="gpu-3", address=ADDRESS)


def test_the_service_the_new_boot_waits_for_is_named_from_the_trackers_service_events() -> None:
    assert hung_services(CAPTURED) == {"ext-nvidia-persistenced": WAITING}


def test_a_service_that_went_on_to_start_is_not_named() -> None:
    assert hung_services(UPGRADE + HUNG + STARTED + TIMED_OUT) == {}


def test_a_reconnect_replays_the_boot_so_only_the_events_after_it_count() -> None:
    """A waiting event before the last ``unavailable, retrying...`` belongs to a boot the node left."""
    assert hung_services(UPGRADE + HUNG + f'"{ADDRESS}": unavailable, retrying...\n' + TIMED_OUT) == {}


def test_the_report_says_the_timeout_passed_and_names_the_node_its_phase_and_the_hung_service() -> None:
    report = upgrade_report(CAPTURED, UpgradeFailure(NODE, CAPTURED, timed_out=600))
    lines = report.splitlines()
    assert lines[0] == (
        "gpu-3 (10.5.0.5): no answer after the upgrade's --timeout of 10m0s "
        "(last phase: startEverything (task startAllServices))"
    )
    assert lines[1] == (
        f'gpu-3 (10.5.0.5): the new boot waits for service "ext-nvidia-persistenced" to be "up" '
        f"(its last event: {WAITING})"
    )
    assert "stage: BOOTING" not in report and "task: upgrade action" not in report


def test_a_failure_before_the_timeout_gets_no_timeout_line() -> None:
    report = upgrade_report(CAPTURED, UpgradeFailure(NODE, CAPTURED))
    assert "--timeout" not in report
    assert 'waits for service "ext-nvidia-persistenced"' in report


def test_the_timeout_is_shown_as_talosctl_shows_it() -> None:
    """Go's time.Duration.String, which talosctl's --timeout flag prints (e.g. its default ``30m0s``)."""
    assert [go_duration(s) for s in (10, 600, 1800, 4200, 3600)] == [
        "10s",
        "10m0s",
        "30m0s",
        "1h10m0s",
        "1h0m0s",
    ]


def test_the_failure_table_finds_the_persistenced_row_in_the_real_output_only_with_the_named_service() -> (
    None
):
    """The real output alone matches no row (its error names no service); the step's line makes it match."""
    rows = {f.failure for f in diagnose_text(CAPTURED, NodeContext(node=ADDRESS))}
    assert image_diagnosis.PERSISTENCED_ROW not in rows
    evidence = UpgradeFailure(NODE, CAPTURED, timed_out=600).evidence()
    assert image_diagnosis.PERSISTENCED_ROW in {
        f.failure for f in diagnose_text(evidence, NodeContext(node=ADDRESS))
    }


#: The node's last lines when talosctl's --timeout ended its watch, in the two ways talos@v1.12.0 can end it: the
#: event stream's error wins (``error: rpc error: code = DeadlineExceeded …``, node.go:176-181, as in CAPTURED and
#: in a CI run of test_fault_diagnosis[unsupported-gpu]), or handleEvents' ``<-a.ctx.Done()`` does (node.go:225-226:
#: ``error: context deadline exceeded``, which go-retry turns into its ``timeout`` error, siderolabs/go-retry@v0.3.3
#: retry/retry.go:129-130, 240-261; talos@v1.12.0 go.mod pins v0.3.3).  Then the node's final error, go-retry's ErrorSet
#: (``%d error(s) occurred:`` then ``\n\t%s`` per error, retry.go:51-62), printed by tracker.go:210-223
#: when it wins the race with the context (node.go:111-118).  Built from those sources: no capture of the final
#: line, nor of the second way, was at hand.
DEADLINE_ENDS = {
    "stream-deadline": TIMED_OUT
    + f'"{ADDRESS}": 2 error(s) occurred:\n'
    + "\tstopAllServices task completed\n"
    + "\trpc error: code = DeadlineExceeded desc = stream terminated by RST_STREAM with error code: CANCEL\n",
    "context-done": f'"{ADDRESS}": error: context deadline exceeded\n'
    + f'"{ADDRESS}": 2 error(s) occurred:\n'
    + "\tstopAllServices task completed\n"
    + "\ttimeout\n",
}


@pytest.mark.parametrize("ending", sorted(DEADLINE_ENDS))
def test_a_node_whose_final_error_is_the_deadline_says_the_timeout_passed_in_its_message(
    tmp_path: Path, ending: str
) -> None:
    """A multi-node upgrade reports a failed node as soon as its final error is printed; when that error is
    talosctl's --timeout, the node's message in the result says the --timeout passed, as its check does, not only
    the error lines reported before talosctl exited."""
    other = "10.5.0.6"
    lines = (UPGRADE + HUNG + DEADLINE_ENDS[ending]).splitlines(keepends=True)
    talosctl = FakeTalosctl(lambda _nodes: [*lines, f'"{other}": post check passed\n'], exit_code=1)
    ctx, batch, results, _events = setup(tmp_path, [ADDRESS, other], talosctl, tracked=True)
    [(_plan, failure), (_, passed)] = _upgrade_batch(ctx, batch, results, upgrade_timeout=1.0)
    assert failure is not None and passed is None
    timeout_line = "gpu-000 (10.5.0.5): no answer after the upgrade's --timeout of 1s"
    assert timeout_line in failure.report()
    assert timeout_line in results[ADDRESS].message, results[ADDRESS].message


def test_a_node_that_failed_on_its_own_is_not_called_timed_out_when_a_batch_mate_ran_to_the_timeout(
    tmp_path: Path,
) -> None:
    """The real capture of tests/data/talosctl_upgrade_batch/fail-and-hang: 10.5.4.2's installer failed at once,
    10.5.4.3 hung silent until --timeout.  Only the hung one gets the --timeout line, though the process ran that
    long (its boot's own ``context deadline exceeded``, Talos's BootTimeout, is not talosctl's --timeout either)."""
    addresses, lines, exit_code = capture("fail-and-hang")
    talosctl = FakeTalosctl(lambda _nodes: lines, exit_code)
    ctx, batch, results, _events = setup(tmp_path, addresses, talosctl, tracked=True)
    outcomes = {plan.node.address: error for plan, error in _upgrade_batch(ctx, batch, results, 1.0)}
    installer, hung = outcomes["10.5.4.2"], outcomes["10.5.4.3"]
    assert installer is not None and installer.timed_out is None
    assert hung is not None and hung.timed_out == 1.0
    assert "--timeout" not in results["10.5.4.2"].message
    assert "no answer after the upgrade's --timeout of 1s" in results["10.5.4.3"].message
