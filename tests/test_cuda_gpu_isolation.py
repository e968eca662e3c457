"""cuda-test's pod that requests ``nvidia.com/gpu: 1`` must list one GPU: more means what the device plugin
allocated did not limit what the container sees (GPU isolation not in effect).

Sources for one GPU (read in the code; no capture from a multi-GPU Talos node was found, so the expectation is
the code's, said here rather than presented as a capture): the device plugin's ``Allocate`` answer carries the
devices' UUIDs in ``NVIDIA_VISIBLE_DEVICES`` (NVIDIA/k8s-device-plugin@v0.18.0 internal/plugin/server.go:344-346,
479-481), set by containerd after the CUDA image's ``all`` (containerd@v2.2.3
internal/cri/server/container_create.go:762-768). Pods listing more GPUs than requested are captured in
NVIDIA/gpu-operator#1021 and NVIDIA/k8s-device-plugin#1294 (the ``gpu_isolation_lost`` fault). The pod with
no request keeps the image's ``all``, which the toolkit accepts by default, so it lists every GPU and passes.
The two-GPU table is the wide layout of tests/data/outputs/nvidia_smi_wide_580.105.08_2xl4.txt (its README).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runbook_lib.sim import faults
from runbook_lib.steps.cudatest import _judge, build_pods, cuda_test
from runbook_lib.steps.kubernetes import kubernetes_layer
from tests.realplane import real_cluster
from tests.sim.test_real_kube_pods import NODE, context
from tests.test_cuda_log_read import FlakyLogs

TWO_L4 = (Path(__file__).parent / "data" / "outputs" / "nvidia_smi_wide_580.105.08_2xl4.txt").read_text()


def _judge_kind(kind: str, log: str) -> Any:
    ctx = context(FlakyLogs(failures=0, log=log))
    node = next(n for n in ctx.params.nodes if n.name == NODE)
    pod = next(p for p in build_pods(ctx, [node], "abc123") if p.kind == kind)
    obj = {"metadata": {"name": pod.name, "namespace": "default"}, "status": {"phase": "Succeeded"}}
    return _judge(ctx, pod, obj, None)


def test_the_pod_that_requested_one_gpu_and_lists_two_fails_naming_isolation():
    check = _judge_kind("gpu", TWO_L4)
    assert not check.ok, check
    assert "2 GPU(s)" in check.message and "requested nvidia.com/gpu: 1" in check.message, check
    assert "GPU isolation is not in effect" in check.message
    assert "DEVICE_LIST_STRATEGY" in check.fix and "NVIDIA_VISIBLE_DEVICES" in check.fix, check.fix


def test_the_pod_with_no_request_lists_every_gpu_and_passes():
    check = _judge_kind("smi", TWO_L4)
    assert check.ok and check.message.startswith("2 GPU(s) (NVIDIA L4)"), check


@pytest.mark.slow
def test_on_two_gpu_nodes_the_one_gpu_pod_sees_one_and_a_node_that_leaks_every_gpu_fails(tmp_path):
    with real_cluster(tmp_path, scenario="gpu-ready", workers=2, gpus_per_worker=2, apply=True) as (
        params,
        ctx,
    ):
        assert kubernetes_layer(ctx, timeout_s=120).ok
        leaking, good = params.nodes
        faults.inject(tmp_path, leaking.name, "gpu_isolation_lost", True)

        result = cuda_test(ctx)

        ok = result.node(good.name)
        assert ok.status == "ok", ok.to_dict()
        by_title = {c.name: c.message for c in ok.checks}
        assert by_title["nvidia-smi with nvidia.com/gpu: 1"].startswith("1 GPU(s)"), by_title
        assert by_title["nvidia-smi (runtimeClass nvidia)"].startswith("2 GPU(s)"), by_title
        failed = result.node(leaking.name)
        assert failed.status == "failed" and "GPU isolation is not in effect" in failed.message, (
            failed.to_dict()
        )
        assert [c.name for c in failed.checks if not c.ok] == ["nvidia-smi with nvidia.com/gpu: 1"]
