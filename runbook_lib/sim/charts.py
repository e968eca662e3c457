"""What the two Helm charts the runbooks install create, per chart version, as the simulated ``helm`` renders them.

Not a template engine: each chart is a Python function reproducing what its templates produce for the values
that matter on Talos (``runtimeClassName``, namespace validation, the default node affinity from 0.15, the
hostPath volumes Pod Security cares about, the GPU Operator's driver/toolkit switches).  Facts come from
NVIDIA/k8s-device-plugin ``deployments/helm/nvidia-device-plugin`` and the domain spec §1.5/§4.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version


class ChartError(Exception):
    """A template ``fail``: helm prints ``execution error at (<chart>/<template>:<line>:<col>): <message>``."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"execution error at ({where}): {message}")


@dataclass(frozen=True)
class Repo:
    url: str
    charts: dict[str, list[str]]


DEVICE_PLUGIN_VERSIONS = [
    "0.13.0",
    "0.14.0",
    "0.14.1",
    "0.14.2",
    "0.14.3",
    "0.14.4",
    "0.14.5",
    "0.15.0",
    "0.15.1",
    "0.16.0",
    "0.16.1",
    "0.16.2",
    "0.17.0",
    "0.17.1",
    "0.17.2",
    "0.17.3",
    "0.17.4",
    "0.18.0",
    "0.18.1",
    "0.18.2",
    "0.19.0",
    "0.19.1",
    "0.19.2",
    "0.19.3",
    "0.20.0",
]
GPU_OPERATOR_VERSIONS = [
    "v25.3.0",
    "v25.3.1",
    "v25.3.2",
    "v25.3.3",
    "v25.3.4",
    "v25.10.0",
    "v25.10.1",
    "v26.3.0",
    "v26.3.1",
    "v26.3.2",
    "v26.3.3",
]
REPOS: dict[str, Repo] = {
    "https://nvidia.github.io/k8s-device-plugin": Repo(
        "https://nvidia.github.io/k8s-device-plugin",
        {"nvidia-device-plugin": DEVICE_PLUGIN_VERSIONS, "gpu-feature-discovery": []},
    ),
    "https://helm.ngc.nvidia.com/nvidia": Repo(
        "https://helm.ngc.nvidia.com/nvidia", {"gpu-operator": GPU_OPERATOR_VERSIONS}
    ),
}
DESCRIPTIONS = {
    "nvidia-device-plugin": "A Helm chart for the nvidia-device-plugin on Kubernetes",
    "gpu-operator": "NVIDIA GPU Operator creates/configures/manages GPUs atop Kubernetes",
}


def repo_for(url: str) -> Repo | None:
    return REPOS.get(url.rstrip("/"))


def _v(text: str) -> Version | None:
    try:
        return Version(text.lstrip("v"))
    except InvalidVersion:
        return None


def pick_version(available: list[str], wanted: str | None) -> str | None:
    """Helm's semver choice: the newest stable version, or the newest matching ``--version`` (exact or a range)."""
    versions = sorted(
        (v for v in available if _v(v) is not None), key=lambda v: _v(v) or Version("0"), reverse=True
    )
    if not wanted:
        return next((v for v in versions if not (_v(v) or Version("0")).is_prerelease), None)
    w = wanted.strip()
    if w[0].isdigit() or w[0] == "v":
        target = _v(w)
        return next((v for v in versions if _v(v) == target), None)
    try:
        spec = SpecifierSet(w.replace(" ", ",").replace(",,", ","))
    except InvalidSpecifier:
        return None
    return next((v for v in versions if str(_v(v)) in spec), None)


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Helm's value coalescing: maps merge, everything else replaces; a user ``null`` deletes the default."""
    out = copy.deepcopy(base)
    for k, v in over.items():
        if v is None:
            out.pop(k, None)
        elif isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


# --- nvidia-device-plugin ---------------------------------------------------------------------------------

_DP_AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {
                    "matchExpressions": [
                        {
                            "key": "feature.node.kubernetes.io/pci-10de.present",
                            "operator": "In",
                            "values": ["true"],
                        }
                    ]
                },
                {
                    "matchExpressions": [
                        {
                            "key": "feature.node.kubernetes.io/cpu-model.vendor_id",
                            "operator": "In",
                            "values": ["NVIDIA"],
                        }
                    ]
                },
                {
                    "matchExpressions": [
                        {"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}
                    ]
                },
            ]
        }
    }
}


def device_plugin_defaults(version: str) -> dict[str, Any]:
    v = _v(version) or Version("0.13.0")
    values: dict[str, Any] = {
        "config": {"map": {}, "default": "", "fallbackStrategies": ["named", "single"], "name": ""},
        "legacyDaemonsetAPI": None,
        "compatWithCPUManager": None,
        "migStrategy": None,
        "failOnInitError": None,
        "deviceListStrategy": None,
        "deviceIDStrategy": None,
        "nvidiaDriverRoot": None,
        "gdsEnabled": None,
        "mofedEnabled": None,
        "deviceDiscoveryStrategy": None,
        "nameOverride": "",
        "fullnameOverride": "",
        "namespaceOverride": "",
        "selectorLabelsOverride": {},
        "allowDefaultNamespace": False,
        "imagePullSecrets": [],
        "image": {"repository": "nvcr.io/nvidia/k8s-device-plugin", "pullPolicy": "IfNotPresent", "tag": ""},
        "updateStrategy": {"type": "RollingUpdate"},
        "podAnnotations": {},
        "podSecurityContext": {},
        "securityContext": {},
        "resources": {},
        "nodeSelector": {},
        "affinity": copy.deepcopy(_DP_AFFINITY) if v >= Version("0.15.0") else {},
        "tolerations": [
            {"key": "CriticalAddonsOnly", "operator": "Exists"},
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        ],
        "priorityClassName": "system-node-critical",
        "runtimeClassName": None,
        "devicePlugin": {"enabled": True},
        "gfd": {"enabled": False},
        "nfd": {"enableNodeFeatureApi": False},
        "mps": {"root": "/run/nvidia/mps"},
        "cdi": {"nvidiaHookPath": None},
    }
    if v < Version("0.15.0"):
        values.pop("mps")
        values.pop("deviceDiscoveryStrategy")
    return values


def _fullname(release: str, chart: str, values: dict[str, Any]) -> str:
    if values.get("fullnameOverride"):
        return str(values["fullnameOverride"])[:63]
    name = str(values.get("nameOverride") or chart)
    return release[:63] if name in release else f"{release}-{name}"[:63]


def _labels(release: str, chart: str, version: str, app_version: str, name: str) -> dict[str, str]:
    return {
        "helm.sh/chart": f"{chart}-{version}",
        "app.kubernetes.io/name": name,
        "app.kubernetes.io/instance": release,
        "app.kubernetes.io/version": app_version,
        "app.kubernetes.io/managed-by": "Helm",
    }


def render_device_plugin(
    version: str, values: dict[str, Any], release: str, namespace: str
) -> list[dict[str, Any]]:
    chart = "nvidia-device-plugin"
    where = f"{chart}/templates/validation.yml"
    if values.get("namespace"):
        raise ChartError(
            f"{where}:10:4",
            f"\nValue 'namespace' set to {values['namespace']}\nSetting an explicit 'namespace' in values.yaml or via --set on "
            "the command line is no longer supported.\nUse --namespace (with --create-namespace as necessary) instead.\n"
            "See: https://helm.sh/docs/helm/helm_install/#options",
        )
    ns = str(values.get("namespaceOverride") or namespace)
    if ns == "default" and not values.get("allowDefaultNamespace"):
        raise ChartError(
            f"{where}:19:4",
            "\nRunning in the 'default' namespace is not recommended.\nSet 'allowDefaultNamespace=true' to bypass this error.\n"
            "Otherwise, use --namespace (with --create-namespace as necessary) to run in a specific namespace.\n"
            "See: https://helm.sh/docs/helm/helm_install/#options",
        )
    config = values.get("config") or {}
    if config.get("name") and config.get("map"):
        raise ChartError(
            f"{where}:29:4",
            "\nOnly one of 'config.name' or 'config.map' should ever be set for a given deployment.\nUse 'config.name' to "
            "point to an external ConfigMap with a list of configurations.\nUse 'config.map' to build an integrated "
            "ConfigMap from a set of configurations as part of this helm chart.",
        )
    app_version = version
    full = _fullname(release, chart, values)
    labels = _labels(release, chart, version, app_version, chart)
    selector = values.get("selectorLabelsOverride") or {
        "app.kubernetes.io/name": chart,
        "app.kubernetes.io/instance": release,
    }
    image = values.get("image") or {}
    tag = image.get("tag") or f"v{app_version}"
    objs: list[dict[str, Any]] = []
    volumes: list[dict[str, Any]] = [
        {"name": "device-plugin", "hostPath": {"path": "/var/lib/kubelet/device-plugins"}}
    ]
    mounts: list[dict[str, Any]] = [{"name": "device-plugin", "mountPath": "/var/lib/kubelet/device-plugins"}]
    v = _v(version) or Version("0.13.0")
    if v >= Version("0.14.0"):
        volumes.append(
            {"name": "cdi-root", "hostPath": {"path": "/var/run/cdi", "type": "DirectoryOrCreate"}}
        )
        mounts.append({"name": "cdi-root", "mountPath": "/var/run/cdi"})
    if v >= Version("0.15.0"):
        mps_root = str((values.get("mps") or {}).get("root") or "/run/nvidia/mps")
        volumes += [
            {"name": "mps-root", "hostPath": {"path": mps_root, "type": "DirectoryOrCreate"}},
            {"name": "mps-shm", "hostPath": {"path": f"{mps_root}/shm"}},
        ]
        mounts += [{"name": "mps-shm", "mountPath": "/dev/shm"}, {"name": "mps-root", "mountPath": "/mps"}]
    if values.get("nvidiaDriverRoot"):
        volumes.append({"name": "driver-root", "hostPath": {"path": str(values["nvidiaDriverRoot"])}})
        mounts.append({"name": "driver-root", "mountPath": "/driver-root", "readOnly": True})
    if config.get("map"):
        objs.append(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": f"{full}-configs", "namespace": ns, "labels": labels},
                "data": {str(k): str(val) for k, val in config["map"].items()},
            }
        )
    if config.get("map") or config.get("name"):
        volumes.append(
            {"name": "available-configs", "configMap": {"name": str(config.get("name") or f"{full}-configs")}}
        )
        mounts.append({"name": "available-configs", "mountPath": "/available-configs"})
    env: list[dict[str, str]] = []
    for key, var in (
        ("migStrategy", "MIG_STRATEGY"),
        ("failOnInitError", "FAIL_ON_INIT_ERROR"),
        ("deviceListStrategy", "DEVICE_LIST_STRATEGY"),
        ("deviceIDStrategy", "DEVICE_ID_STRATEGY"),
        ("nvidiaDriverRoot", "NVIDIA_DRIVER_ROOT"),
        ("deviceDiscoveryStrategy", "DEVICE_DISCOVERY_STRATEGY"),
    ):
        if values.get(key) is not None:
            env.append(
                {
                    "name": var,
                    "value": str(values[key]).lower() if isinstance(values[key], bool) else str(values[key]),
                }
            )
    env += [
        {"name": "NVIDIA_MIG_MONITOR_DEVICES", "value": "all"},
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
    ]
    security = values.get("securityContext") or (
        {"privileged": True}
        if values.get("compatWithCPUManager")
        else {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    )
    pod_spec: dict[str, Any] = {
        "priorityClassName": values.get("priorityClassName") or None,
        "securityContext": values.get("podSecurityContext") or {},
        "containers": [
            {
                "name": "nvidia-device-plugin-ctr",
                "image": f"{image.get('repository', 'nvcr.io/nvidia/k8s-device-plugin')}:{tag}",
                "imagePullPolicy": image.get("pullPolicy", "IfNotPresent"),
                "command": ["nvidia-device-plugin"],
                "env": env,
                "securityContext": security,
                "volumeMounts": mounts,
                **({"resources": values["resources"]} if values.get("resources") else {}),
            }
        ],
        "volumes": volumes,
    }
    if not pod_spec["priorityClassName"]:
        pod_spec.pop("priorityClassName")
    if values.get("runtimeClassName"):
        pod_spec["runtimeClassName"] = str(values["runtimeClassName"])
    for key in ("nodeSelector", "affinity", "tolerations", "imagePullSecrets"):
        if values.get(key):
            pod_spec[key] = copy.deepcopy(values[key])
    if (values.get("devicePlugin") or {}).get("enabled", True):
        objs.append(
            {
                "apiVersion": "apps/v1",
                "kind": "DaemonSet",
                "metadata": {"name": full, "namespace": ns, "labels": labels},
                "spec": {
                    "selector": {"matchLabels": selector},
                    "updateStrategy": values.get("updateStrategy") or {"type": "RollingUpdate"},
                    "template": {
                        "metadata": {
                            "labels": dict(selector),
                            **(
                                {"annotations": values["podAnnotations"]}
                                if values.get("podAnnotations")
                                else {}
                            ),
                        },
                        "spec": pod_spec,
                    },
                },
            }
        )
    if (values.get("gfd") or {}).get("enabled"):
        gfd_spec = copy.deepcopy(pod_spec)
        gfd_spec["containers"][0].update(name="gpu-feature-discovery-ctr", command=["gpu-feature-discovery"])
        gfd_sel = {"app.kubernetes.io/name": "gpu-feature-discovery", "app.kubernetes.io/instance": release}
        objs.append(
            {
                "apiVersion": "apps/v1",
                "kind": "DaemonSet",
                "metadata": {"name": f"{full}-gpu-feature-discovery", "namespace": ns, "labels": labels},
                "spec": {
                    "selector": {"matchLabels": gfd_sel},
                    "template": {"metadata": {"labels": gfd_sel}, "spec": gfd_spec},
                },
            }
        )
        objs += _nfd(release, ns, "v0.16.6")
    return objs


def _nfd(release: str, ns: str, nfd_version: str) -> list[dict[str, Any]]:
    """The node-feature-discovery subchart: a master Deployment and a hostPath-mounting worker DaemonSet."""
    base = f"{release}-node-feature-discovery"
    image = f"registry.k8s.io/nfd/node-feature-discovery:{nfd_version}"
    labels = {
        "app.kubernetes.io/name": "node-feature-discovery",
        "app.kubernetes.io/instance": release,
        "app.kubernetes.io/managed-by": "Helm",
    }
    master_sel = {
        **{k: v for k, v in labels.items() if k != "app.kubernetes.io/managed-by"},
        "role": "master",
    }
    worker_sel = {
        **{k: v for k, v in labels.items() if k != "app.kubernetes.io/managed-by"},
        "role": "worker",
    }
    return [
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": f"{base}-master", "namespace": ns, "labels": labels},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": master_sel},
                "template": {
                    "metadata": {"labels": master_sel},
                    "spec": {
                        "containers": [
                            {
                                "name": "master",
                                "image": image,
                                "command": ["nfd-master"],
                                "securityContext": {
                                    "allowPrivilegeEscalation": False,
                                    "capabilities": {"drop": ["ALL"]},
                                    "readOnlyRootFilesystem": True,
                                    "runAsNonRoot": True,
                                },
                            }
                        ],
                        "tolerations": [
                            {
                                "key": "node-role.kubernetes.io/control-plane",
                                "operator": "Equal",
                                "effect": "NoSchedule",
                            }
                        ],
                    },
                },
            },
        },
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": f"{base}-worker", "namespace": ns, "labels": labels},
            "spec": {
                "selector": {"matchLabels": worker_sel},
                "template": {
                    "metadata": {"labels": worker_sel},
                    "spec": {
                        "containers": [
                            {
                                "name": "worker",
                                "image": image,
                                "command": ["nfd-worker"],
                                "securityContext": {
                                    "allowPrivilegeEscalation": False,
                                    "capabilities": {"drop": ["ALL"]},
                                    "readOnlyRootFilesystem": True,
                                    "runAsNonRoot": True,
                                },
                                "volumeMounts": [
                                    {"name": "host-boot", "mountPath": "/host-boot", "readOnly": True},
                                    {"name": "host-sys", "mountPath": "/host-sys", "readOnly": True},
                                ],
                            }
                        ],
                        "volumes": [
                            {"name": "host-boot", "hostPath": {"path": "/boot"}},
                            {"name": "host-sys", "hostPath": {"path": "/sys"}},
                        ],
                    },
                },
            },
        },
    ]


# --- gpu-operator -----------------------------------------------------------------------------------------


def gpu_operator_defaults(version: str) -> dict[str, Any]:
    return {
        "platform": {"openshift": False},
        "nfd": {"enabled": True, "nodefeaturerules": False},
        "psa": {"enabled": False},
        "cdi": {"enabled": True, "default": False},
        "sandboxWorkloads": {"enabled": False, "defaultWorkload": "container"},
        "hostPaths": {"rootFS": "/", "driverInstallDir": "/run/nvidia/driver"},
        "daemonsets": {
            "labels": {},
            "annotations": {},
            "priorityClassName": "system-node-critical",
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        },
        "validator": {
            "repository": "nvcr.io/nvidia/cloud-native",
            "image": "gpu-operator-validator",
            "version": version,
        },
        "operator": {
            "repository": "nvcr.io/nvidia",
            "image": "gpu-operator",
            "version": version,
            "imagePullPolicy": "IfNotPresent",
            "priorityClassName": "system-node-critical",
            "runtimeClass": "nvidia",
            "defaultGPUMode": "compute",
            "cleanupCRD": False,
            "upgradeCRD": True,
        },
        "driver": {
            "enabled": True,
            "nvidiaDriverCRD": {"enabled": False},
            "kernelModuleType": "auto",
            "repository": "nvcr.io/nvidia",
            "image": "driver",
            "version": "580.105.08",
        },
        "toolkit": {
            "enabled": True,
            "repository": "nvcr.io/nvidia/k8s",
            "image": "container-toolkit",
            "version": "v1.18.1-ubuntu20.04",
        },
        "devicePlugin": {
            "enabled": True,
            "repository": "nvcr.io/nvidia",
            "image": "k8s-device-plugin",
            "version": "v0.18.1",
        },
        "dcgm": {"enabled": False},
        "dcgmExporter": {"enabled": True},
        "gfd": {"enabled": True},
        "migManager": {"enabled": True},
        "nodeStatusExporter": {"enabled": False},
        "node-feature-discovery": {"enableNodeFeatureApi": True},
    }


def render_gpu_operator(
    version: str, values: dict[str, Any], release: str, namespace: str
) -> list[dict[str, Any]]:
    chart = "gpu-operator"
    labels = _labels(release, chart, version, version, chart)
    op = values.get("operator") or {}
    sel = {"app": "gpu-operator", "app.kubernetes.io/component": "gpu-operator"}
    objs: list[dict[str, Any]] = [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": "gpu-operator", "namespace": namespace, "labels": labels},
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "gpu-operator", "labels": labels},
            "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "gpu-operator", "labels": labels},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "gpu-operator",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "gpu-operator", "namespace": namespace}],
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "gpu-operator", "namespace": namespace, "labels": {**labels, **sel}},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": sel},
                "template": {
                    "metadata": {"labels": {**sel, "app.kubernetes.io/name": "gpu-operator"}},
                    "spec": {
                        "serviceAccountName": "gpu-operator",
                        "priorityClassName": str(op.get("priorityClassName") or "system-node-critical"),
                        "containers": [
                            {
                                "name": "gpu-operator",
                                "image": f"{op.get('repository', 'nvcr.io/nvidia')}/{op.get('image', 'gpu-operator')}:{op.get('version', version)}",
                                "command": ["gpu-operator"],
                                "args": [
                                    "--leader-elect",
                                    "--zap-time-encoding=epoch",
                                    "--zap-log-level=info",
                                ],
                                "securityContext": {
                                    "allowPrivilegeEscalation": False,
                                    "capabilities": {"drop": ["ALL"]},
                                },
                            }
                        ],
                        "tolerations": [
                            {
                                "key": "node-role.kubernetes.io/control-plane",
                                "operator": "Equal",
                                "effect": "NoSchedule",
                            }
                        ],
                    },
                },
            },
        },
        {
            "apiVersion": "nvidia.com/v1",
            "kind": "ClusterPolicy",
            "metadata": {"name": "cluster-policy", "labels": labels},
            "spec": {
                "operator": {
                    "defaultRuntime": "containerd",
                    "runtimeClass": op.get("runtimeClass", "nvidia"),
                },
                "hostPaths": values.get("hostPaths") or {},
                "driver": values.get("driver") or {},
                "toolkit": values.get("toolkit") or {},
                "devicePlugin": values.get("devicePlugin") or {},
                "gfd": values.get("gfd") or {},
                "dcgmExporter": values.get("dcgmExporter") or {},
                "cdi": values.get("cdi") or {},
                "psa": values.get("psa") or {},
                "validator": values.get("validator") or {},
            },
        },
    ]
    if (values.get("nfd") or {}).get("enabled", True):
        objs += _nfd(release, namespace, "v0.17.3")
    return objs


CHARTS = {
    "nvidia-device-plugin": (device_plugin_defaults, render_device_plugin, lambda v: v),
    "gpu-operator": (gpu_operator_defaults, render_gpu_operator, lambda v: v),
}


def render(
    chart: str, version: str, user_values: dict[str, Any], release: str, namespace: str
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(coalesced values, objects) for a chart version; raises ChartError like the chart's templates."""
    defaults, fn, _ = CHARTS[chart]
    values = deep_merge(defaults(version), user_values)
    return values, fn(version, values, release, namespace)
