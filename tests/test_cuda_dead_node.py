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
from runbook_lib.steps.cudatest import RUN_LABEL, TEST_NAMESPACE, TITLES, cuda_test
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
            f"test pods bound to {dead.name} (not Ready) may stay Terminating" in n for n in result.notes
        ), result.notes


def test_a_dead_node_is_named_when_a_ready_nodes_hung_pods_run_the_wait_to_its_timeout(tmp_path):
    """The early stop needs every pod left to be on a down node; here a Ready node's pods hang in ErrImagePull
    (the ``image_pull_error`` fault), so the wait runs its whole timeout. Before, the dead node's pods were then
    reported "still Pending after 30 s" like any slow pod, with no word of the node nor of its pods that stay
    Terminating."""
    with real_cluster(
        tmp_path, scenario="gpu-ready", workers=3, apply=True, cuda_test={"timeout_seconds": 30}
    ) as (params, ctx):
        assert kubernetes_layer(ctx, timeout_s=120).ok
        dead, hung, good = params.nodes
        faults.inject(tmp_path, hung.name, "image_pull_error", True)
        faults.inject(tmp_path, dead.name, "node_not_ready", True)
        _until_not_ready(ctx, dead.name)

        result = cuda_test(ctx)

        assert result.node(good.name).status == "ok", result.to_dict()
        failed = str(result.node(dead.name).to_dict())
        assert f"after 30 s: node {dead.name} is not Ready (Ready=Unknown" in failed, failed
        assert "Kubelet stopped posting node status." in failed, failed
        hung_line = str(result.node(hung.name).to_dict())
        assert "not Ready" not in hung_line and "ErrImagePull" in hung_line, hung_line
        assert any(
            f"test pods bound to {dead.name} (not Ready) may stay Terminating" in n for n in result.notes
        ), result.notes


def test_a_cordoned_node_s_pods_are_not_created_and_its_line_says_uncordon(tmp_path):
    """kube-scheduler places no pod on a cordoned node: its test pods stayed Pending for the whole timeout, then
    were blamed on what holds the node's GPUs or room, with the same fix twice (operator walkthrough, 6 Dec 2026).
    Now the pods that go through kube-scheduler (those asking for a GPU) are not created and the node fails at
    once, naming the cordon and how to lift it; the pods bound by nodeName run there all the same (here both GPU
    nodes are cordoned, one with the runbook's mark, whose fix takes the mark off too)."""
    from runbook_lib.steps.drains import CORDON_MARK

    with real_cluster(tmp_path, scenario="gpu-ready", apply=True, cuda_test={"timeout_seconds": 400}) as (
        params,
        ctx,
    ):
        assert kubernetes_layer(ctx, timeout_s=120).ok
        cordoned, marked = (n.name for n in params.nodes)
        ctx.kube.core.patch_node(cordoned, {"spec": {"unschedulable": True}})
        left = {"metadata": {"annotations": {CORDON_MARK: "true"}}, "spec": {"unschedulable": True}}
        ctx.kube.core.patch_node(marked, left)
        result = cuda_test(ctx)

        said = result.node(cordoned)
        assert said.status == "failed" and said.message == (
            f"not run: Node {cordoned} is cordoned by someone, so kube-scheduler places no pod there (this pod "
            "asks for a GPU through it)"
        ), said.to_dict()
        failed = [c for c in said.checks if not c.ok]
        assert {c.fix for c in failed} == {
            f"kubectl uncordon {cordoned}  # then run the cuda-test step again"
        }
        # the pods bound by nodeName bypass kube-scheduler: they ran, and passed, on the cordoned node (review)
        assert [c.name for c in said.checks if c.ok] == [TITLES["smi"], TITLES["vectoradd"]], said.to_dict()
        runbooks = result.node(marked)
        assert "cordoned with the runbook's mark" in runbooks.message
        assert any(f"kubectl annotate node {marked} {CORDON_MARK}-" in c.fix for c in runbooks.checks)
        assert not any("Pending" in c.message for n in result.nodes for c in n.checks), (
            "no pod was waited for"
        )
