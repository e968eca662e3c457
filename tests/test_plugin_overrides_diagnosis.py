"""The no-GPU diagnosis finds the device plugin where a site's chart values put it.

The device-plugin chart's ``namespaceOverride`` puts the DaemonSet and its pods in another namespace than the
release, and ``fullnameOverride`` renames the DaemonSet (NVIDIA/k8s-device-plugin@v0.18.0
deployments/helm/nvidia-device-plugin/templates/_helpers.tpl ``nvidia-device-plugin.namespace`` and ``.fullname``;
the pods keep the ``app.kubernetes.io/instance: <release>`` label, ``.selectorLabels``). The runbook keeps such
values on upgrade (``--reset-then-reuse-values``) and its rollout wait already followed them; the diagnosis of a
GPU-less node still read the release's namespace. It found no plugin DaemonSet there, so a node whose plugin
could not pull its image was told "0 desired pods, label the node", and the fix texts named
``kubectl -n kube-system logs ds/nvidia-device-plugin``, a DaemonSet that does not exist. Objects are shaped as
kube-apiserver v1.35 serves them (tests/sim/test_real_kube_pods.py's).
"""

from __future__ import annotations

from typing import Any

from runbook_lib.steps.kubernetes import _wait_for_gpus
from runbook_lib.steps.results import StepResult
from tests.sim.test_real_kube_pods import READY, pulling_plugin, running_plugin
from tests.test_x7_no_gpu_diagnosis_reads import CountingKube, _context, _names, _node, _on

RELEASE = "nvidia-device-plugin"
OVERRIDE_NS, OVERRIDE_NAME = "gpu-plugins", "gpu-plugin"
Obj = dict[str, Any]


class OverridingHelm:
    """``helm get values`` of a release a site installed with its own namespace and DaemonSet name."""

    def __init__(self) -> None:
        self.reads = 0

    def values(self, name: str, namespace: str) -> Obj:
        self.reads += 1
        return {
            "namespaceOverride": OVERRIDE_NS,
            "fullnameOverride": OVERRIDE_NAME,
            "runtimeClassName": "nvidia",
        }


#: The chart's GPU Feature Discovery DaemonSet: ``<fullname>-gpu-feature-discovery``, same labels, same namespace
#: (k8s-device-plugin@v0.18.0 templates/daemonset-gfd.yml:20-27, pod labels :38-39).
GFD_NAME = f"{OVERRIDE_NAME}-gpu-feature-discovery"


def _diagnosed(
    plugin: Obj, *, gpu_capacity: str | None = None, gfd: Obj | None = None
) -> tuple[list[Any], OverridingHelm]:
    """Every node's checks after the wait, with ``plugin`` as each node's plugin pod in the override namespace
    (and ``gfd`` as its GPU Feature Discovery pod)."""
    labels = {"app.kubernetes.io/instance": RELEASE}
    nodes = [_node(n, READY) for n in _names()]
    if gpu_capacity is not None:  # the plugin registered the GPUs; none allocatable
        for node in nodes:
            node["status"]["capacity"] = {**node["status"]["allocatable"], "nvidia.com/gpu": gpu_capacity}
            node["status"]["allocatable"]["nvidia.com/gpu"] = "0"
    pods = [_on(plugin, n["metadata"]["name"], OVERRIDE_NS, labels, OVERRIDE_NAME) for n in nodes]
    daemonsets = [
        {
            "metadata": {"name": name, "namespace": OVERRIDE_NS, "labels": labels},
            "status": {
                "desiredNumberScheduled": len(nodes) if gfd is not None or name == OVERRIDE_NAME else 0
            },
        }
        for name in (OVERRIDE_NAME, GFD_NAME)
    ]
    if gfd is not None:
        pods += [_on(gfd, n["metadata"]["name"], OVERRIDE_NS, labels, GFD_NAME) for n in nodes]
    helm = OverridingHelm()
    ctx = _context("v1.12.7", CountingKube(nodes, pods, daemonsets), helm)
    assert ctx.plan.kubernetes_layer == "device-plugin" and ctx.plan.helm.namespace == "kube-system"
    result = StepResult(step="kubernetes", applied=True)
    _wait_for_gpus(ctx, result, list(ctx.params.nodes), timeout_s=0)
    return [c for res in result.nodes for c in res.checks], helm


def test_a_plugin_that_cannot_pull_its_image_in_the_override_namespace_is_named_as_such() -> None:
    checks, helm = _diagnosed(pulling_plugin("ImagePullBackOff", "Back-off pulling image"))
    assert all("ImagePullBackOff" in c.message for c in checks), checks[0]
    assert not any("label" in c.fix for c in checks), checks[0]
    assert helm.reads == 1, "the release's values are read once for the whole fleet"


def test_a_running_plugin_without_gpus_sends_the_user_to_the_overridden_daemonsets_logs() -> None:
    ready = running_plugin()
    ready["status"]["conditions"][0]["status"] = "True"
    checks, _ = _diagnosed(ready)
    assert {c.message for c in checks} == {"the device plugin runs but the node advertises no GPUs"}
    assert all(f"kubectl -n {OVERRIDE_NS} logs ds/{OVERRIDE_NAME}`" in c.fix for c in checks), checks[0].fix


def test_gpus_the_plugin_marked_unhealthy_name_the_overridden_daemonset_and_namespace() -> None:
    ready = running_plugin()
    ready["status"]["conditions"][0]["status"] = "True"
    checks, _ = _diagnosed(ready, gpu_capacity="1")
    assert all("marked 1 GPU(s) unhealthy" in c.message for c in checks), checks[0]
    fix = checks[0].fix
    assert fix.startswith(f"kubectl -n {OVERRIDE_NS} logs ds/{OVERRIDE_NAME} |"), fix
    assert f"kubectl -n {OVERRIDE_NS} delete pod -l app.kubernetes.io/instance={RELEASE}" in fix, fix


def test_a_ready_gpu_feature_discovery_pod_does_not_pass_for_the_device_plugin() -> None:
    """The chart's GFD pods carry the plugin's ``app.kubernetes.io/instance`` label in its namespace: a Ready GFD pod
    passed for a Ready plugin, so a node whose plugin crash-loops (the kubelet keeps the GPUs in capacity, none
    allocatable, for 5 minutes) was sent to grep for Xid errors. Only the pods the plugin's DaemonSet owns count."""
    crashing = running_plugin()  # Ready False
    crashing["status"]["containerStatuses"][0]["state"] = {
        "waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s restarting failed container"}
    }
    ready_gfd = running_plugin()
    ready_gfd["status"]["conditions"][0]["status"] = "True"
    checks, _ = _diagnosed(crashing, gpu_capacity="1", gfd=ready_gfd)
    assert not any("unhealthy" in c.message for c in checks), checks[0]
