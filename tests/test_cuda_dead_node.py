"""A GPU node that goes down before the CUDA test: its test pods cannot run, and the step must not wait its whole
``cuda_test.timeout_seconds`` for them before it reports every other node.

On the real control plane (``tests/realplane.py``): the node lifecycle controller marks the node's Ready condition
Unknown when its kubelet stops posting ("Kubelet stopped posting node status.") and taints it
``node.kubernetes.io/unreachable:NoSchedule`` (kubernetes v1.35.0 pkg/controller/nodelifecycle/
node_lifecycle_controller.go:84-91), which the test pods do not tolerate, so kube-scheduler leaves them Pending.
The simulated part is the stopped kubelet (the ``node_not_ready`` fault: kwok stops playing it).
"""

from __future__ import annotations

import time

import pytest

from runbook_lib.sim import faults
from runbook_lib.steps.cudatest import RUN_LABEL, TEST_NAMESPACE, cuda_test
from runbook_lib.steps.kubernetes import kubernetes_layer
from tests.realplane import real_cluster
from tests.test_helm_one_bad_node import _until_not_ready

pytestmark = pytest.mark.slow


def test_cuda_test_reports_the_other_nodes_without_waiting_out_a_dead_nodes_pods(tmp_path):
    with real_cluster(
        tmp_path, scenario="gpu-ready", workers=3, apply=True, cuda_test={"timeout_seconds": 400}
    ) as (params, ctx):
        assert kubernetes_layer(ctx, timeout_s=120).ok
        dead, *good = params.nodes
        faults.inject(tmp_path, dead.name, "node_not_ready", True)
        _until_not_ready(ctx, dead.name)

        started = time.monotonic()
        result = cuda_test(ctx)
        took = time.monotonic() - started

        assert took < 250, took  # the whole 400 s before: the dead node's pods never finish
        assert [result.node(n.name).status for n in good] == ["ok"] * len(good), result.to_dict()
        failed = result.node(dead.name)
        assert failed.status == "failed"
        assert f"node {dead.name} has not been Ready for" in str(failed.to_dict()), failed.to_dict()
        assert "untolerated taint" in str(failed.to_dict()), "the scheduler's own words are kept"
        (wait,) = [e.summary for e in ctx.journal.entries if "list_namespaced_pod" in (e.summary or "")]
        assert f"on {dead.name}, not Ready" in wait, wait
        left = ctx.kube.pods(TEST_NAMESPACE, f"{RUN_LABEL}={result.data['run_id']}")
        # only the dead node's, deleted but Terminating: no kubelet confirms their end; the note says so
        assert {p["spec"].get("nodeName") for p in left} <= {dead.name}, left
        assert all(p["metadata"].get("deletionTimestamp") for p in left), left
        assert any(
            f"test pods bound to {dead.name} (not Ready) stay Terminating" in n for n in result.notes
        ), result.notes
