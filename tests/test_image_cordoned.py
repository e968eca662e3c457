"""A node already on the planned image but cordoned fails the image step, naming the cordon and the fix.

talosctl 1.13+ cordons and drains a node before rebooting it into the new image and uncordons it only at the end
(talos@v1.13.0 cmd/talosctl/cmd/talos/upgrade.go:131-166; drain.go:33-100, where a failed drain returns before the
uncordon is deferred). The runbook stops a talosctl at ``--timeout`` + 30 s, so a killed upgrade leaves the node
booted on the plan and cordoned; the second run said "already on ... at <release>" and went on, while the node took
no pod (cuda-test's pods stayed Pending). The Kubernetes side is the real control plane (tests/realplane.py): the
cordon is a real Node's ``spec.unschedulable``, set here as ``kubectl cordon`` sets it.
"""

from __future__ import annotations

import pytest

from runbook_lib.steps.image import image_upgrade
from tests.realplane import real_cluster

pytestmark = pytest.mark.slow


def _set_unschedulable(ctx, name: str, value: bool) -> None:
    ctx.kube.core.patch_node(name, {"spec": {"unschedulable": value}})


def test_a_cordoned_node_on_the_plan_fails_naming_the_cordon_and_the_others_stay_unchanged(tmp_path):
    with real_cluster(tmp_path, scenario="gpu-ready") as (params, ctx):
        before = image_upgrade(ctx)
        assert {n.status for n in before.nodes} == {"unchanged"}, [n.message for n in before.nodes]

        cordoned = params.nodes[0].name
        _set_unschedulable(ctx, cordoned, True)
        result = image_upgrade(ctx)

        statuses = {n.node: n.status for n in result.nodes}
        assert statuses.pop(cordoned) == "failed", result.to_dict()
        assert set(statuses.values()) == {"unchanged"}
        [check] = [c for c in result.node(cordoned).checks if not c.ok]
        assert check.message == f"Node {cordoned} is cordoned (spec.unschedulable: true)", check
        assert check.fix.startswith(f"kubectl uncordon {cordoned}"), check
        assert ctx.journal.changes() == []  # reported, not undone: the cordon may be an administrator's

        _set_unschedulable(ctx, cordoned, False)
        assert {n.status for n in image_upgrade(ctx).nodes} == {"unchanged"}


def test_a_cordoned_node_on_the_plan_does_not_hold_back_the_others_upgrades(tmp_path):
    """It fails for its cordon only: the nodes still to upgrade are upgraded (before, any failed node stopped the
    whole rollout, so one node an administrator had cordoned held the fleet back)."""
    with real_cluster(tmp_path, scenario="config-patched", apply=True) as (params, ctx):
        first, *others = [n.name for n in params.nodes]
        assert image_upgrade(ctx, only=[first]).node(first).status == "changed"
        _set_unschedulable(ctx, first, True)

        result = image_upgrade(ctx)

        assert result.node(first).status == "failed" and "cordoned" in result.node(first).message
        assert [result.node(name).status for name in others] == ["changed"] * len(others), result.to_dict()
