"""The GPU side of the simulated nodes on the real control plane: Node objects and ``nvidia.com/gpu``.

kwok (sigs.k8s.io/kwok) plays each node's kubelet for everything generic: Ready, lease heartbeats, pods
through Running and deletion. What a GPU node adds is decided here, from the node's simulated Talos state
(``state.runtime``), the way ``kubelet.py`` decides it for the Python API server: a node advertises
``nvidia.com/gpu`` only while a device-plugin pod runs on it **and** NVML can initialise in that pod, i.e.
the NVIDIA modules are loaded (driver bound), the pod runs with the containerd handler ``nvidia`` (which only
the toolkit extension registers) and the toolkit's driver matches the kernel's. Why: the device plugin builds
its resource managers only after ``nvml.Init()`` succeeds; on failure it logs "Failed to initialize NVML" and
returns no plugin, so nothing registers with the kubelet (NVIDIA/k8s-device-plugin@v0.18.0
``internal/plugin/factory.go`` ``getResourceManagers``; the same at v0.17.2).
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from runbook_lib.sim.state import SimNode, load_nodes, runtime

log = logging.getLogger("runbook_lib.sim.nodeagent")
GPU_RESOURCE = "nvidia.com/gpu"
#: The container the device-plugin chart runs (templates/daemonset-device-plugin.yml, v0.17.2 and v0.18.0).
PLUGIN_CONTAINER = "nvidia-device-plugin-ctr"
BASICS = {"cpu": "8", "memory": "32Gi", "pods": "110"}
#: Talos taints control-plane nodes unless cluster.allowSchedulingOnControlPlanes is set
#: (siderolabs/talos@v1.12.0 pkg/machinery/constants: LabelNodeRoleControlPlane, used for the taint).
CONTROL_PLANE_TAINT = {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}


def api(kubeconfig: Path) -> client.CoreV1Api:
    return client.CoreV1Api(config.new_client_from_config(config_file=str(kubeconfig)))  # type: ignore[no-untyped-call]


def node_object(node: SimNode) -> dict[str, Any]:
    """The Node a Talos node's kubelet registers: hostname/os/arch labels, its address, its role."""
    labels = {"kubernetes.io/hostname": node.name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}
    spec: dict[str, Any] = {}
    if node.role == "controlplane":
        labels["node-role.kubernetes.io/control-plane"] = ""
        spec["taints"] = [CONTROL_PLANE_TAINT]
    status = {
        "capacity": dict(BASICS),
        "allocatable": dict(BASICS),
        "addresses": [
            {"type": "InternalIP", "address": node.address},
            {"type": "Hostname", "address": node.name},
        ],
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": node.name, "labels": labels},
        "spec": spec,
        "status": status,
    }


def register(core: client.CoreV1Api, nodes: list[SimNode]) -> None:
    """Create the Node objects that do not exist yet (kwok then keeps them Ready)."""
    for node in nodes:
        try:
            core.create_node(node_object(node))  # type: ignore[arg-type]  # the client accepts a dict body
        except ApiException as exc:
            if exc.status != 409:
                raise


def nvml_initialises(node: SimNode, handler: str) -> bool:
    """Would NVML initialise in a container of this node started with containerd handler ``handler``?"""
    rt = runtime(node)
    return (
        handler == "nvidia"
        and handler in rt.cri_runtime_handlers
        and rt.driver_version is not None
        and rt.toolkit_driver_version in (None, rt.driver_version)
    )


def _handler(pod: dict[str, Any], handlers: dict[str, str], node: SimNode) -> str:
    """The containerd handler a pod runs with: its RuntimeClass's, else the node's default runtime."""
    name = (pod.get("spec") or {}).get("runtimeClassName")
    return handlers.get(name, "") if name else runtime(node).default_runtime


def wanted_gpus(node: SimNode, plugin_pods: list[dict[str, Any]], handlers: dict[str, str]) -> int:
    """How many GPUs the node advertises: all of them while a working device plugin runs there, else none."""
    running = [p for p in plugin_pods if (p.get("spec") or {}).get("nodeName") == node.name]
    return len(node.gpus) if any(nvml_initialises(node, _handler(p, handlers, node)) for p in running) else 0


def _is_plugin(pod: dict[str, Any]) -> bool:
    containers = (pod.get("spec") or {}).get("containers") or []
    return any(c.get("name") == PLUGIN_CONTAINER for c in containers)


def _advertised(node: dict[str, Any]) -> int:
    value = ((node.get("status") or {}).get("allocatable") or {}).get(GPU_RESOURCE, "0")
    return int(value) if str(value).isdigit() else 0


class NodeAgent:
    """Re-reads the nodes' Talos state and the device-plugin pods every ``interval`` seconds and patches each
    Node's ``nvidia.com/gpu`` capacity/allocatable when it differs (removing it when the plugin stops)."""

    def __init__(self, state_dir: Path, kubeconfig: Path, interval: float = 0.5) -> None:
        self.state_dir = state_dir
        self.core = api(kubeconfig)
        self.nodes_api = client.NodeV1Api(self.core.api_client)
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="gpu-node-agent", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.sync()
            except Exception:  # a failed pass is retried; the agent must not die
                log.exception("node agent pass failed")

    def sync(self) -> None:
        """One pass: what every node should advertise, patched where the Node says otherwise."""
        pods = self.core.api_client.sanitize_for_serialization(
            self.core.list_pod_for_all_namespaces(field_selector="status.phase=Running")
        )["items"]
        plugin_pods = [p for p in pods if _is_plugin(p)]
        classes = self.core.api_client.sanitize_for_serialization(self.nodes_api.list_runtime_class())[
            "items"
        ]
        handlers = {c["metadata"]["name"]: c["handler"] for c in classes}
        objs = self.core.api_client.sanitize_for_serialization(self.core.list_node())["items"]
        current = {o["metadata"]["name"]: _advertised(o) for o in objs}
        for node in load_nodes(self.state_dir):
            want = wanted_gpus(node, plugin_pods, handlers)
            if node.name in current and current[node.name] != want:
                self._advertise(node.name, want)

    def _advertise(self, name: str, count: int) -> None:
        # null removes the resource. Simplified: a real kubelet drops it from capacity only once the stopped
        # plugin's endpoint expires (kubernetes@v1.35.0 pkg/kubelet/cm/devicemanager, endpointStopGracePeriod).
        value = str(count) if count else None
        body = {"status": {"capacity": {GPU_RESOURCE: value}, "allocatable": {GPU_RESOURCE: value}}}
        self.core.patch_node_status(name, body)
        log.info("node %s advertises %s %s", name, count, GPU_RESOURCE)
