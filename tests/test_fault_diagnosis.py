"""The image step's diagnosis of a node that fails its upgrade: the real cause from the failure table
(``runbook_lib.model.diagnosis``), the same one verify gives, and a fix that is the command that fixes it.

Attack report 2026-12-01 F13: on driver-mismatch, unsupported-gpu and mixed-fleet the image step said
"missing extensions ..." or "timeout waiting for ext-nvidia-persistenced" with ``talosctl get extensions`` /
``talosctl dmesg`` as the fix, while verify named the cause on the same node.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from runbook_lib.steps.image import image_upgrade
from runbook_lib.steps.patch import config_patch
from runbook_lib.steps.preflight import preflight
from runbook_lib.steps.results import Check, StepResult
from tests.simcluster import runs_real_talosctl, sim_cluster

pytestmark = pytest.mark.slow
#: The three workers of a 3-worker simulated cluster, all listed as GPU nodes (as params/simulated.yaml
#: lists its workers); in mixed-fleet the third has no GPU.
ALL_WORKERS = [{"name": f"talos-worker-{i}", "address": f"10.5.0.{i + 2}"} for i in (1, 2, 3)]
TIMEOUTS = {"upgrade_seconds": 10, "node_ready_seconds": 5}
# talosctl subcommands that only read: a fix made of them alone fixes nothing.
READ_ONLY = re.compile(r"^\s*talosctl\s+(?:-n\s+\S+\s+)?(?:get|read|dmesg|version|logs|services)\b")


def failed_checks(result: StepResult) -> tuple[str, list[Check]]:
    failing = result.failing()
    assert len(failing) == 1, result.to_dict()
    return failing[0].node, failing[0].failed_checks


def assert_fixes_change_something(checks: list[Check]) -> None:
    for check in checks:
        assert check.fix, check
        assert not READ_ONLY.match(check.fix.splitlines()[-1]), f"read-only fix: {check.fix}"


# scenario -> what the failing node's diagnosis must say after the image step (the failure-table row verify
# also gives for that node)
AFTER_UPGRADE = {
    "driver-mismatch": "tracks lts and production are mixed",
    "toolkit-missing": "no nvidia-container-toolkit extension",
}


@pytest.mark.parametrize("scenario", sorted(AFTER_UPGRADE))
def test_the_image_step_names_the_cause_on_the_faulty_node(tmp_path: Path, scenario: str) -> None:
    with sim_cluster(tmp_path, scenario=scenario, workers=2, apply=True, timeouts=TIMEOUTS) as (_p, ctx):
        assert config_patch(ctx).ok  # the modules patch goes before the upgrade
        node, checks = failed_checks(image_upgrade(ctx))
    assert node == "talos-worker-2"
    assert AFTER_UPGRADE[scenario] in " ".join(c.message for c in checks)
    assert any("upgrade --image" in c.fix for c in checks)
    assert_fixes_change_something(checks)


# scenario -> what the diagnosis of the node whose upgrade hung must say (preflight skipped for mixed-fleet,
# as when its nodes run a Talos without PCIDevices or the step is run on its own)
UPGRADE_HANGS = {
    "unsupported-gpu": ("GPU is not supported by this driver branch", "upgrade --image"),
    "mixed-fleet": ("no NVIDIA GPU", "remove talos-worker-3 (10.5.0.5) from `nodes:`"),
}


@pytest.mark.parametrize("scenario", sorted(UPGRADE_HANGS))
def test_the_image_step_names_why_the_upgrade_hung(tmp_path: Path, scenario: str) -> None:
    """On the real talosctl (``auto``): its tracker prints no timeout line and no error naming a service; the
    hung service is named from the new boot's service events it printed (``service: <id> message: Waiting for
    …``, talos@v1.12.0 cmd/talosctl/pkg/talos/action/node.go:303-307), and the step itself says the --timeout
    passed. Talos's BootTimeout (70 min x RUNBOOK_SIM_TIME_SCALE 0.01 = 42 s) is longer than the 10 s
    --timeout, so the node still hangs when talosctl gives up, as with a real --timeout under 70 minutes."""
    cause, fix = UPGRADE_HANGS[scenario]
    with sim_cluster(
        tmp_path, scenario=scenario, workers=3, nodes=ALL_WORKERS, apply=True, timeouts=TIMEOUTS
    ) as (_p, ctx):
        assert config_patch(ctx).ok
        node, checks = failed_checks(image_upgrade(ctx))
    assert node == "talos-worker-3"
    upgrade = next(c for c in checks if c.name == "upgrade")
    assert 'service "ext-nvidia-persistenced" to be "up"' in upgrade.message  # Talos's own condition text
    assert "talos-worker-3 (10.5.0.5)" in upgrade.message, upgrade.message
    if runs_real_talosctl(tmp_path):
        assert 'Waiting for file "/sys/bus/pci/drivers/nvidia" to exist' in upgrade.message, upgrade.message
        assert "no answer after the upgrade's --timeout of 10s" in upgrade.message, upgrade.message
    assert cause in " ".join(c.message + " " + c.cause for c in checks)
    assert fix in upgrade.fix
    assert_fixes_change_something(checks)
    if (
        scenario == "unsupported-gpu"
    ):  # the command it names is the run's talosctl (attack re-run, 7 Dec 2026)
        dmesg = shlex.join(ctx.talosctl.argv(["dmesg"], ["10.5.0.5"])) + " | grep NVRM"
        assert any(dmesg in c.message for c in checks), [c.message for c in checks]


def test_preflight_names_a_listed_node_without_an_nvidia_gpu(tmp_path: Path) -> None:
    """mixed-fleet: talos-worker-3 has no GPU; preflight must say so before anything is upgraded."""
    with sim_cluster(tmp_path, scenario="mixed-fleet", workers=3, nodes=ALL_WORKERS) as (_params, ctx):
        result = preflight(ctx)
    node, checks = failed_checks(result)
    assert node == "talos-worker-3"
    [check] = checks
    assert check.name == "nvidia-gpu" and "no NVIDIA GPU" in check.message
    assert "remove talos-worker-3 (10.5.0.5) from `nodes:`" in check.fix
    passed = {n.node: [c.message for c in n.checks if c.name == "nvidia-gpu"] for n in result.nodes}
    assert passed["talos-worker-2"] == [
        "NVIDIA Corporation GH100 [H100 SXM5 80GB] (10de:2330) at 0000:18:00.0"
    ]


def test_preflight_says_gpu_presence_cannot_be_checked_before_talos_1_8(tmp_path: Path) -> None:
    with sim_cluster(
        tmp_path, talos_version="v1.7.7", scenario="mixed-fleet", workers=3, nodes=ALL_WORKERS
    ) as (
        _params,
        ctx,
    ):
        result = preflight(ctx)
    assert not any(c.name == "nvidia-gpu" for n in result.nodes for c in n.checks)
    assert any("GPU presence not checked" in note and "1.8" in note for note in result.notes)
