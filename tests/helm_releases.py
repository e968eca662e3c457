"""Planned Helm releases as the plan builds them (``runbook_lib.model.plan.HelmRelease``), for tests that call a
step's functions without a cluster: the real dataclass, so derived fields such as ``chart_name`` are there."""

from __future__ import annotations

from typing import Any

from runbook_lib.model.plan import HelmRelease

_DEVICE_PLUGIN = {
    "release": "nvidia-device-plugin",
    "chart": "nvdp/nvidia-device-plugin",
    "repo_name": "nvdp",
    "repo_url": "https://nvidia.github.io/k8s-device-plugin",
    "version": "0.17.4",
    "namespace": "kube-system",
    "values": {"runtimeClassName": "nvidia"},
    "privileged_namespace": False,
}
_GPU_OPERATOR = {
    "release": "gpu-operator",
    "chart": "nvidia/gpu-operator",
    "repo_name": "nvidia",
    "repo_url": "https://helm.ngc.nvidia.com/nvidia",
    "version": "v26.3.3",
    "namespace": "gpu-operator",
    "values": {},
    "privileged_namespace": True,
}


def device_plugin(**changes: Any) -> HelmRelease:
    return HelmRelease(**{**_DEVICE_PLUGIN, **changes})


def gpu_operator(**changes: Any) -> HelmRelease:
    return HelmRelease(**{**_GPU_OPERATOR, **changes})
