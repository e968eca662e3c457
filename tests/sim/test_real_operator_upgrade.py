"""An upgrade of the GPU Operator chart, on the real control plane with the real helm and the simulated operator:
the step must wait for the operator to rewrite its device-plugin DaemonSet, not judge the previous one.

helm changes the ClusterPolicy and returns; the operator rewrites ``nvidia-device-plugin-daemonset`` when it next
reconciles (controllers/object_controls.go:1502-1506 writes the ClusterPolicy's device-plugin image,
api/nvidia/v1/clusterpolicy_types.go:2001-2030 builds it), and nothing in the ClusterPolicy's status says it has
(clusterpolicy_types.go:2012-2020: no observed generation). The step watched the DaemonSet as it found it, the
previous spec's and fully rolled out, and said ok while every node ran the previous plugin. The served charts
differ in their device plugin as NVIDIA's do: v26.3.3's v0.19.3, v26.7.0's v0.20.0 (values.yaml:222-226 and
241-245 at each tag; runbook_lib/sim/chartrepo.py ``VALUES_OF``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from runbook_lib.model.params import validate
from runbook_lib.sim import faults, realkube
from runbook_lib.steps.context import Context, connect
from runbook_lib.steps.kubernetes import kubernetes_layer
from tests.sim.test_gpu_operator_real import (  # noqa: F401 - tools: a fixture
    NAMESPACE,
    TALOS,
    WORKERS,
    context,
    started,
    tools,
)

pytestmark = pytest.mark.slow

NEW_PLUGIN = "nvcr.io/nvidia/k8s-device-plugin:v0.20.0"


def _newer(state: Path) -> Context:
    data = {
        "cluster": "real-kube",
        "target": "simulated",
        "talos_version": TALOS,
        "apply": True,
        "nodes": [{"name": n, "address": f"10.5.0.{3 + i}"} for i, n in enumerate(WORKERS)],
        "gpu_operator": {"chart_version": "v26.7.0"},
    }
    return connect(validate(data, source="test"), state_dir=state)


def _plugin_images(ctx: Context) -> dict[str, str]:
    """Each node's device-plugin pod's image, as the API server holds it (pods being deleted left out)."""
    pods = ctx.kube.pods(NAMESPACE, "app=nvidia-device-plugin-daemonset")
    return {
        p["spec"]["nodeName"]: p["spec"]["containers"][0]["image"]
        for p in pods
        if not p["metadata"].get("deletionTimestamp")
    }


@pytest.fixture
def installed(tools: realkube.Tools, tmp_path: Path) -> Iterator[Path]:  # noqa: F811 - the fixture imported above
    """Two Talos 1.13 GPU workers on which the runbook installed the GPU Operator chart v26.3.3."""
    with started(tools, tmp_path, "gpu-ready") as state:
        assert kubernetes_layer(context(state), apply=True, timeout_s=180).ok
        yield state


def test_an_operator_upgrade_is_ok_only_once_every_node_runs_the_new_device_plugin(installed: Path) -> None:
    state = installed
    ctx = _newer(state)
    result = kubernetes_layer(ctx, timeout_s=180)
    assert result.ok, result.to_dict()
    # when the step says ok, not some time after
    assert _plugin_images(ctx) == dict.fromkeys(WORKERS, NEW_PLUGIN)


def test_an_operator_upgrade_whose_new_plugin_cannot_start_on_a_node_fails_it(installed: Path) -> None:
    state = installed
    bad = WORKERS[0]
    faults.inject(state, bad, "image_pull_error", "k8s-device-plugin:v0.20.0")
    result = kubernetes_layer(_newer(state), timeout_s=60)
    assert not result.ok
    node = result.node(bad)
    assert node.status == "failed" and "ImagePull" in str(node.to_dict()), node.to_dict()
