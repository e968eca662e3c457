"""cuda-test with a node that cannot pull the test image: its pods wait in ErrImagePull/ImagePullBackOff, which
the kubelet retries with a back-off from 10 s to 5 minutes (kubernetes v1.35.0 pkg/kubelet/kubelet.go:177, 225,
681), so the step must not wait its whole ``cuda_test.timeout_seconds`` for them before it reports every node.

Found by an operator walkthrough (301.3 s for an image the registry does not have). On the real control plane;
the failing pull is simulated (the ``image_pull_error`` fault: the kubelet's waiting message and events as
kubernetes v1.35.0 pkg/kubelet/images/image_manager.go:336-348, 410-411 word them).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runbook_lib.sim import faults
from runbook_lib.steps.cudatest import cuda_test
from runbook_lib.steps.kubernetes import kubernetes_layer
from tests.realplane import real_cluster

pytestmark = pytest.mark.slow


@contextlib.contextmanager
def cuda_test_with(tmp_path: Path, fault: str, timeout_s: int) -> Iterator[tuple[Any, Any, Any, float, Any]]:
    """cuda-test on two gpu-ready workers, the first with ``fault``: its node, the other, the result, how long
    the step took and the context whose journal it wrote, yielded while the cluster still runs."""
    with real_cluster(
        tmp_path, scenario="gpu-ready", workers=2, apply=True, cuda_test={"timeout_seconds": timeout_s}
    ) as (params, ctx):
        assert kubernetes_layer(ctx, timeout_s=120).ok
        faulty, good = params.nodes
        faults.inject(tmp_path, faulty.name, fault, True)
        started = time.monotonic()
        result = cuda_test(ctx)
        yield faulty, good, result, time.monotonic() - started, ctx


def test_pods_whose_image_cannot_be_pulled_end_the_wait_after_a_minute_without_progress(tmp_path):
    with cuda_test_with(tmp_path, "image_pull_error", 400) as (pulling, good, result, took, ctx):
        assert took < 250, took  # the whole 400 s before
        assert result.node(good.name).status == "ok", result.to_dict()
        failed = str(result.node(pulling.name).to_dict())
        assert "pod still Pending: the CUDA test on" in failed and "ErrImagePull" in failed, failed
        assert "after 400 s" not in failed, failed
        fixes = {c.name: c.fix for c in result.node(pulling.name).checks}
        # commands that still work after the step deleted its pods (before: `kubectl describe pod` of one gone);
        # of the two GPU pods, the one scheduled first pulls, the other may wait for its GPU
        assert fixes["nvidia-smi (runtimeClass nvidia)"].startswith(
            f"talosctl -n {pulling.address} image pull nvcr.io/nvidia/cuda:"
        ), fixes
        pull, node = f"talosctl -n {pulling.address} image pull", f"kubectl describe node {pulling.name}"
        assert all(fix.startswith((pull, node)) for fix in fixes.values()), fixes
        (wait,) = [e.summary for e in ctx.journal.entries if "list_namespaced_pod" in (e.summary or "")]
        assert "wait in an image pull that has failed for 60 s or more" in wait, wait


def test_a_pull_the_registry_rate_limits_is_waited_for_not_given_up_after_a_minute(tmp_path):
    """A registry's 429 (Docker Hub's pull rate limit, and others') often lifts within the step's timeout, and
    containerd itself retries it (containerd@v2.1.5 core/remotes/docker/resolver.go:755-756): cuda-test gave up
    on it after a minute as on an image that does not exist. The waiting message carries containerd's
    "unexpected status from HEAD request to <url>: 429 Too Many Requests" (the ``image_pull_rate_limited``
    fault), which the node's line shows when the timeout ends the wait."""
    with cuda_test_with(tmp_path, "image_pull_rate_limited", 110) as (limited, good, result, took, _ctx):
        assert took >= 105, took  # waited its timeout; before, it stopped after about 70 s
        assert result.node(good.name).status == "ok", result.to_dict()
        failed = str(result.node(limited.name).to_dict())
        assert "after 110 s" in failed and "429 Too Many Requests" in failed, failed


def test_only_a_pull_the_registry_did_not_call_temporary_counts_as_failing():
    """The kubelet's waiting messages as the simulated kubelet words them (sim/containers.py, after
    kubernetes@v1.35.0 image_manager.go and containerd@v2.1.5's errors)."""
    from runbook_lib.sim.containers import pull_backoff
    from runbook_lib.steps.kube_diagnosis import pull_failing

    image = "nvcr.io/nvidia/cuda:12.8.0-base-ubuntu24.04"

    def pod(message: str) -> dict:
        waiting = {"reason": "ImagePullBackOff", "message": message}
        return {"status": {"containerStatuses": [{"name": "c", "state": {"waiting": waiting}}]}}

    assert pull_failing(pod(pull_backoff(image)))  # not found: waiting on cannot help
    assert not pull_failing(pod(pull_backoff(image, limited=True)))  # 429: it may lift
    assert "https://nvcr.io/v2/nvidia/cuda/manifests/12.8.0-base-ubuntu24.04: 429" in pull_backoff(
        image, True
    )
