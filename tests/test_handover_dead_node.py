"""The Talos 1.13 hand-over's ``helm uninstall --wait`` of the device plugin, with a GPU node down.

helm deletes a release's objects with background propagation unless told otherwise and ``--wait`` waits for
those objects only (helm@v4.1.4 pkg/action/uninstall.go:161, 286-301): the DaemonSet goes at once, and the
garbage collector marks its pods deleted after. The dead node's pod can only be finished by its kubelet, so it
stays Terminating, but it does not hold the uninstall. Real helm on the real control plane
(``tests/realplane.py``); the stopped kubelet is simulated (the ``node_not_ready`` fault).
"""

from __future__ import annotations

import time

import pytest

from runbook_lib.sim import faults
from runbook_lib.steps import gpu_operator_handover
from runbook_lib.steps.kubernetes import kubernetes_layer
from runbook_lib.steps.results import StepResult
from tests.realplane import real_cluster
from tests.test_helm_one_bad_node import _until_not_ready

pytestmark = pytest.mark.slow


def _left_on(ctx, node: str) -> list[dict]:
    pods = ctx.kube.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}").items
    return [p.to_dict() for p in pods if "device-plugin" in p.metadata.name]


def test_the_device_plugin_is_uninstalled_at_once_with_a_gpu_node_down(tmp_path):
    with real_cluster(tmp_path, scenario="gpu-ready", workers=2, apply=True) as (params, ctx):
        assert kubernetes_layer(ctx, timeout_s=120).ok
        dead = params.nodes[0].name
        assert _left_on(ctx, dead), "the device plugin runs on the node before it goes down"
        faults.inject(tmp_path, dead, "node_not_ready", True)
        _until_not_ready(ctx, dead)

        found = gpu_operator_handover.leftovers(ctx)
        assert [name for name, _ in found.releases] == [ctx.plan.helm.release], found
        started = time.monotonic()
        gpu_operator_handover.remove(
            ctx, StepResult(step="kubernetes", applied=True), found, dry_run=False, timeout_s=120
        )
        took = time.monotonic() - started

        assert took < 60, took
        assert ctx.helm.release(ctx.plan.helm.release, ctx.plan.helm.namespace) is None
        deadline = time.monotonic() + 60
        while (left := _left_on(ctx, dead)) and not all(p["metadata"]["deletion_timestamp"] for p in left):
            assert time.monotonic() < deadline, left
            time.sleep(1)
        assert left, "the dead node's pod stays until its kubelet confirms it (Terminating)"
