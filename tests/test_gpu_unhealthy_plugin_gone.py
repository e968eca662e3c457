"""The "GPU marked unhealthy (Xid)" diagnosis needs the node's device plugin to be running.

Why: the kubelet keeps a device plugin's GPUs in the Node's capacity with none allocatable not only when the plugin
reports them unhealthy (an Xid critical error), but also for 5 minutes after the plugin's pod stops or restarts:
``PluginDisconnected`` moves every healthy device of the resource to the unhealthy set and keeps it in capacity
until ``endpointStopGracePeriod`` passes (kubernetes@v1.35.0 pkg/kubelet/cm/devicemanager/manager.go
``PluginDisconnected``, ``markResourceUnhealthy``, ``GetCapacity``). A node whose plugin crash-loops or is being
replaced (the 1.13 handover from the device-plugin chart to the GPU Operator) has a healthy GPU and must not be
sent to grep for ``XidCriticalError``. Node and pod objects below are shaped as the real API server returns them.
"""

from __future__ import annotations

import subprocess
from types import SimpleNamespace
from typing import Any

from runbook_lib.steps.kubernetes import _no_gpu_diagnosis
from tests.helm_releases import device_plugin
from tests.sim.test_real_kube_pods import owner

NODE = "gpu-2"


def _node() -> dict[str, Any]:
    """A Ready GPU node whose one GPU is in capacity but not allocatable."""
    return {
        "metadata": {"name": NODE, "labels": {"nvidia.com/gpu.present": "true"}},
        "status": {
            "capacity": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "1", "pods": "110"},
            "allocatable": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "0", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
        },
    }


def _plugin_pod(ready: bool) -> dict[str, Any]:
    """The device plugin's pod on NODE: Running and Ready, or restarting in CrashLoopBackOff (not Ready)."""
    state: dict[str, Any] = (
        {"running": {"startedAt": "2026-12-02T13:00:00Z"}}
        if ready
        else {
            "waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s restarting failed container"}
        }
    )
    return {
        "metadata": {
            "name": "nvidia-device-plugin-abcde",
            "namespace": "kube-system",
            "ownerReferences": [owner("nvidia-device-plugin")],
        },
        "spec": {"nodeName": NODE},
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "Ready", "status": "True" if ready else "False"},
            ],
            "containerStatuses": [{"name": "nvidia-device-plugin-ctr", "ready": ready, "state": state}],
        },
    }


class _Reads:
    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self._pods = pods

    def pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        return self._pods

    def daemonsets(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        return [{"metadata": {"name": "nvidia-device-plugin"}, "status": {"desiredNumberScheduled": 1}}]

    def plugin_pods(self) -> list[dict[str, Any]]:
        return self._pods

    def plugin_daemonset(self) -> tuple[str, str]:
        return "kube-system", "nvidia-device-plugin"  # the chart's defaults for release nvidia-device-plugin


def _ctx() -> Any:
    helm = device_plugin()  # the real HelmRelease: the step reads derived fields such as chart_name
    plan = SimpleNamespace(helm=helm, kubernetes_layer="device-plugin")
    return SimpleNamespace(
        plan=plan, params=SimpleNamespace(nodes=[SimpleNamespace(name=NODE, address="10.5.0.4")])
    )


def test_a_running_plugin_with_a_gpu_out_of_allocatable_is_an_unhealthy_gpu() -> None:
    check = _no_gpu_diagnosis(_ctx(), _node(), _Reads([_plugin_pod(ready=True)]))  # type: ignore[arg-type]
    assert "marked 1 GPU(s) unhealthy" in check.message and "XidCriticalError" in check.fix, check


def test_a_restarting_plugin_is_not_blamed_on_an_xid_error() -> None:
    check = _no_gpu_diagnosis(_ctx(), _node(), _Reads([_plugin_pod(ready=False)]))  # type: ignore[arg-type]
    assert "unhealthy" not in check.message and "XidCriticalError" not in check.fix, check


def test_a_node_without_a_plugin_pod_is_not_blamed_on_an_xid_error() -> None:
    check = _no_gpu_diagnosis(_ctx(), _node(), _Reads([]))  # type: ignore[arg-type]
    assert "unhealthy" not in check.message and "XidCriticalError" not in check.fix, check


#: The plugin's two log lines that mark GPUs unhealthy, as klog prints them (NVIDIA/k8s-device-plugin@v0.19.3
#: internal/rm/health.go:126, an NVML event-wait error marking every GPU, with no Xid; and :169, an Xid critical
#: error on one GPU).
PLUGIN_LOG = (
    "I1202 13:00:01.000000       1 health.go:126] Error waiting for event: Unknown Error; Marking all devices as "
    "unhealthy\n"
    "I1202 13:00:02.000000       1 health.go:169] XidCriticalError: Xid=79 on Device=GPU-5f1e; marking device as "
    "unhealthy.\n"
)


def test_the_fixs_log_filter_finds_both_ways_the_plugin_marks_a_gpu_unhealthy() -> None:
    check = _no_gpu_diagnosis(_ctx(), _node(), _Reads([_plugin_pod(ready=True)]))  # type: ignore[arg-type]
    pipeline = check.fix.split(" | ", 1)[1].split("  #", 1)[0]  # the filter after `kubectl logs`
    found = subprocess.run(
        ["sh", "-c", pipeline], input=PLUGIN_LOG, capture_output=True, text=True, check=False
    )
    assert found.stdout == PLUGIN_LOG, (pipeline, found.stdout)


class _NoDaemonSet(_Reads):
    def daemonsets(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        return []


def test_a_missing_daemonset_is_named_so_not_blamed_on_the_nodes_labels() -> None:
    """helm's upgrade failed before the DaemonSet existed (RBAC refused the patch): the diagnosis summed the
    desired pods of no DaemonSet, said "has 0 desired pods" and gave ``kubectl label node`` for a node already
    labelled (operator walkthrough, 6 Dec 2026)."""
    node = _node()
    node["status"]["capacity"].pop("nvidia.com/gpu")  # no plugin ever registered GPUs there
    node["status"]["allocatable"].pop("nvidia.com/gpu")
    check = _no_gpu_diagnosis(_ctx(), node, _NoDaemonSet([]))  # type: ignore[arg-type]
    assert (
        check.message == "there is no device-plugin DaemonSet nvidia-device-plugin in namespace kube-system"
    )
    assert (
        check.fix.startswith("helm status nvidia-device-plugin -n kube-system") and "label" not in check.fix
    )
