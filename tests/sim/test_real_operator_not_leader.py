"""The GPU Operator's pod is Ready but reconciles nothing: what the kubernetes step says (real control plane).

Why a Ready operator can do nothing: the chart runs it with ``--leader-elect`` (gpu-operator@v26.3.3
deployments/gpu-operator/templates/operator.yaml), controller-runtime starts its controllers only once it holds
the Lease ``53822513.nvidia.com`` (cmd/gpu-operator/main.go ``LeaderElectionID``), and its readiness check is
``healthz.Ping`` (main.go ``AddReadyzCheck``), which passes without the lease. A ClusterPolicy no operator has
reconciled has no ``status`` at all (the operator writes ``status.state`` from its first reconcile,
controllers/clusterpolicy_controller.go ``updateCRState``). Scenario ``operator-not-leader`` plays another
instance holding and renewing that Lease (``runbook_lib/sim/gpuoperator.py``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from runbook_lib.sim import realkube
from runbook_lib.sim.scenarios import OTHER_OPERATOR
from runbook_lib.steps.kubernetes import kubernetes_layer
from tests.sim import test_gpu_operator_real as gpu_operator
from tests.sim.test_gpu_operator_real import NAMESPACE, context, operator_pods, started
from tests.sim.waiting import wait_for

tools = gpu_operator.tools  # the module's fixture: the v1.36.0 control plane, or skip saying what to build

pytestmark = pytest.mark.slow


def test_a_ready_operator_without_its_lease_is_named_not_a_device_plugin_that_advertises_nothing(
    tools: realkube.Tools, tmp_path: Path
) -> None:
    """Before: each node was told "the device plugin runs but the node advertises no GPUs" (no device-plugin
    DaemonSet exists) and the RuntimeClass check blamed a RuntimeClass "deleted after the ClusterPolicy became
    ready" (it never was)."""
    with started(tools, tmp_path, "operator-not-leader") as state:
        ctx = context(state)
        plan = ctx.plan.helm
        # The release as the step installs it (helm returns once its objects are created): then the
        # step finds it deployed with its values and only waits.
        ctx.helm.repo_add(plan.repo_name, plan.repo_url)
        run = ctx.helm.upgrade_install(
            plan.release, plan.chart, version=plan.version, namespace=plan.namespace, values=plan.values,
            create_namespace=True, timeout_s=300, dry_run=False,
        )  # fmt: skip
        assert run.ok, run.stderr
        wait_for(lambda: operator_pods(state), 120)
        wait_for(lambda: ctx.kube.lease(NAMESPACE, "53822513.nvidia.com"), 60)
        result = kubernetes_layer(context(state), apply=True, timeout_s=3)
    assert not result.ok
    (check,) = [c for c in result.checks if not c.ok]
    assert "has not reconciled" in check.message and "no status" in check.message, check
    assert f"Lease 53822513.nvidia.com is held by {OTHER_OPERATOR}" in check.message, check
    assert "get lease 53822513.nvidia.com" in check.fix, check
    for node in result.nodes:
        assert node.status == "failed"
        (why,) = node.checks
        assert "has not created nvidia-device-plugin-daemonset" in why.message, why
