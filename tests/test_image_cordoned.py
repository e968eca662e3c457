"""A node already on the planned image but cordoned: the image step fails it when the cordon carries the
runbook's mark, and notes it otherwise.

talosctl 1.13+ cordons and drains a node before rebooting it into the new image and uncordons it only at the end
(talos@v1.13.0 cmd/talosctl/cmd/talos/upgrade.go:131-166; drain.go:33-100, where a failed drain returns before the
uncordon is deferred). The runbook stops a talosctl at ``--timeout`` + 30 s, so a killed upgrade leaves the node
booted on the plan and cordoned; the second run said "already on ... at <release>" and went on, while the node took
no pod (cuda-test's pods stayed Pending). That cordon carries no mark of the runbook's, as an administrator's
maintenance cordon does not, and failing those failed a plan (exit 1, a CI plan gate) and stopped an ``--apply``
run before verify (operator walkthrough, 6 Dec 2026): they are a note, which ``runbook run`` prints; a cordon
with the runbook's mark (a run's drain it could not lift) fails the node. The Kubernetes side is the real
control plane (tests/realplane.py): the cordon is a real Node's ``spec.unschedulable``, set as ``kubectl cordon``
sets it.
"""

from __future__ import annotations

import pytest

from runbook_lib.steps.drains import CORDON_MARK
from runbook_lib.steps.image import image_upgrade
from tests.realplane import real_cluster

pytestmark = pytest.mark.slow


def _set_unschedulable(ctx, name: str, value: bool, *, marked: bool = False) -> None:
    mark = {"metadata": {"annotations": {CORDON_MARK: "true" if marked else None}}}
    ctx.kube.core.patch_node(name, {"spec": {"unschedulable": value}, **mark})


def test_a_cordoned_node_on_the_plan_is_noted_or_with_the_runbook_s_mark_fails(tmp_path):
    with real_cluster(tmp_path, scenario="gpu-ready") as (params, ctx):
        before = image_upgrade(ctx)
        assert {n.status for n in before.nodes} == {"unchanged"}, [n.message for n in before.nodes]

        cordoned = params.nodes[0].name
        _set_unschedulable(ctx, cordoned, True)  # kubectl cordon: an administrator's, or talosctl's own
        noted = image_upgrade(ctx)
        assert noted.ok and {n.status for n in noted.nodes} == {"unchanged"}, noted.to_dict()
        assert any(
            n.startswith("cordoned without the runbook's mark") and f": {cordoned}: " in n
            for n in noted.notes
        ), noted.notes

        _set_unschedulable(ctx, cordoned, True, marked=True)  # a run's drain it could not lift
        result = image_upgrade(ctx)
        statuses = {n.node: n.status for n in result.nodes}
        assert statuses.pop(cordoned) == "failed", result.to_dict()
        assert set(statuses.values()) == {"unchanged"}
        [check] = [c for c in result.node(cordoned).checks if not c.ok]
        assert check.message == f"Node {cordoned} is cordoned and carries the runbook's mark ({CORDON_MARK})"
        assert check.fix.startswith(f"kubectl uncordon {cordoned} && kubectl annotate node {cordoned} "), (
            check
        )
        assert ctx.journal.changes() == []  # reported, not undone

        _set_unschedulable(ctx, cordoned, False)
        assert {n.status for n in image_upgrade(ctx).nodes} == {"unchanged"}


def test_a_cordoned_node_on_the_plan_does_not_hold_back_the_others_upgrades(tmp_path):
    """It fails for its cordon only: the nodes still to upgrade are upgraded (before, any failed node stopped the
    whole rollout, so one node a run had left cordoned held the fleet back)."""
    with real_cluster(tmp_path, scenario="config-patched", apply=True) as (params, ctx):
        first, *others = [n.name for n in params.nodes]
        assert image_upgrade(ctx, only=[first]).node(first).status == "changed"
        _set_unschedulable(ctx, first, True, marked=True)

        result = image_upgrade(ctx)

        assert result.node(first).status == "failed" and "cordoned" in result.node(first).message
        assert [result.node(name).status for name in others] == ["changed"] * len(others), result.to_dict()
