"""Every fault scenario of the simulator, through the library's steps in runbook order: the run stops at
the step a real cluster would fail at, on the faulty node only, with a diagnosis that names the cause."""

from __future__ import annotations

import pytest

from runbook_lib.steps.image import image_upgrade
from runbook_lib.steps.patch import config_patch
from runbook_lib.steps.preflight import preflight
from runbook_lib.steps.verify import verify
from tests.fault_cases import CASES, assert_fails_on_one_node
from tests.simcluster import sim_cluster

pytestmark = pytest.mark.slow
STEPS = [
    ("preflight", preflight),
    ("config-patch", config_patch),
    ("image", image_upgrade),
    ("verify", verify),
]


@pytest.mark.parametrize("scenario", sorted(CASES))
def test_runbook_stops_at_the_right_step_with_the_right_diagnosis(tmp_path, scenario):
    expected_step, needle = CASES[scenario]
    timeouts = {"upgrade_seconds": 10, "node_ready_seconds": 5}
    with sim_cluster(
        tmp_path, scenario=scenario, workers=3, apply=True, rollout_concurrency=3, timeouts=timeouts
    ) as (params, ctx):
        failed_at = None
        for name, step in STEPS:
            result = step(ctx)
            if not result.ok:
                failed_at = name
                break
        assert failed_at == expected_step, result.to_dict()
        if failed_at is None:
            return
        assert_fails_on_one_node(result.to_dict(), needle)


@pytest.mark.parametrize(
    ("scenario", "rerun"), [("unreachable-node", "--steps preflight"), ("upgrade-fails", "--steps image")]
)
def test_a_node_that_fails_for_no_known_cause_gets_what_to_do_not_only_a_command_to_look(
    tmp_path, scenario, rerun
):
    """Attack report F13: `fix:` was a read-only command (`talosctl version`, `talosctl dmesg`). The fix now says
    what to do, keeps the read-only command as the way to check it, and how to resume."""
    timeouts = {"upgrade_seconds": 10, "node_ready_seconds": 5}
    with sim_cluster(
        tmp_path, scenario=scenario, workers=3, apply=True, rollout_concurrency=3, timeouts=timeouts
    ) as (params, ctx):
        for _name, step in STEPS:
            result = step(ctx)
            if not result.ok:
                break
        [failing] = result.failing()
        fixes = " ".join(c.fix for c in failing.failed_checks)
        assert "runbook run -p <parameters>" in fixes and rerun in fixes, fixes
        assert f"talosctl -n {failing.address}" in fixes
