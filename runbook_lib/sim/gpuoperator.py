"""The simulated NVIDIA GPU Operator on the real control plane: what its controller does for the ClusterPolicy.

Real helm installs our own ``gpu-operator`` chart (``chartsrc/gpu-operator``): the ClusterPolicy CRD, the
operator Deployment (kwok runs its pod) and the ClusterPolicy ``cluster-policy``. The operator's controller is
an image we cannot run, so this reconciler does what its states do, through the official client against the
real API server, once the operator pod is Ready (sources: NVIDIA/gpu-operator at tag v26.3.3):

- ``pre-requisites``: RuntimeClass ``nvidia`` (handler ``nvidia``), and ``nvidia-cdi``/``nvidia-legacy`` while
  ``cdi.enabled`` (controllers/object_controls.go ``RuntimeClasses``, assets/pre-requisites/02*_runtime_class*),
  owned by the ClusterPolicy; first in each pass, as ``pre-requisites`` is the first state of each reconcile
  (controllers/state_manager.go:889), so before any operand DaemonSet. Simplified: this reconciles every pass
  while the operator pod is Ready, where the real one reconciles on ClusterPolicy, GPU Node label and
  DaemonSet events and every 5 s while not ready (clusterpolicy_controller.go:180-186, 345-385), so a
  RuntimeClass deleted under a ready ClusterPolicy comes back here within a pass, there only at the next event;
- GPU nodes: NFD's ``feature.node.kubernetes.io/pci-10de.present`` (the NFD subchart is not shipped: this
  plays it, from each node's simulated PCI devices) and the operator's ``nvidia.com/gpu.present`` and
  ``nvidia.com/gpu.deploy.<operand>`` labels (controllers/state_manager.go:42,88-117);
- the operand DaemonSets by their real names, labels, node selectors, service accounts and init containers
  (assets/state-*/0500_daemonset.yaml): ``nvidia-driver-daemonset`` only with ``driver.enabled``,
  ``nvidia-container-toolkit-daemonset`` only with ``toolkit.enabled``, ``nvidia-operator-validator`` and
  ``nvidia-device-plugin-daemonset`` and, with ``dcgmExporter.enabled`` and ``gfd.enabled`` (the chart's
  defaults), ``nvidia-dcgm-exporter`` and ``gpu-feature-discovery``, in the order of their states
  (state_manager.go:889-900; 1107-1113 ``isStateEnabled``); a disabled one is deleted;
- GPU Feature Discovery's node labels (``nvidia.com/gpu.product``, ``gpu.count``, ``gpu.memory``,
  ``cuda.driver.major``…, NVIDIA/k8s-device-plugin@v0.18.0 internal/lm/resource.go ``baseLabeler``, nvml.go
  ``newVersionLabeler``) on each node where its pod runs: what lets a user target a GPU model;
- the ClusterPolicy's ``status.state``: ``ready`` once every operand DaemonSet has all its pods ready.

Leader election: the chart runs the operator with ``--leader-elect`` (deployments/gpu-operator/templates/
operator.yaml), so it reconciles only while it holds the Lease ``53822513.nvidia.com`` in its namespace
(cmd/gpu-operator/main.go ``LeaderElectionID``), while its readiness probe is a bare ``healthz.Ping``
(main.go ``AddReadyzCheck``): a pod waiting for the lease is Ready and reconciles nothing. The node fault
``gpu_operator_lease_held`` (scenario ``operator-not-leader``) plays another instance holding and renewing that
Lease; then this reconciler does nothing. Simplified: without the fault no Lease is written (the real operator
holds one, named after its pod).

The node side (what kwok cannot know): an operand pod waits in the init container whose validation does not
pass on its node, as the real ones loop (``until [ -f /run/nvidia/validations/toolkit-ready ]``, or
nvidia-validator with ``WITH_WAIT``), and the driver and toolkit containers crash-loop on Talos. Left out:
the DCGM exporter's metrics (its pod only runs), standalone DCGM (off by default, values.yaml:268-270), MIG manager
(enabled by default, values.yaml:350-351, but scheduled only on MIG-capable GPUs' nodes), GFD's
architecture, MIG and MPS labels and its timestamp, the NVIDIADriver CRD, the cuda-validation workload
pod, node-status-exporter, upgrades of the driver, and any state the runbook's values do not touch.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from runbook_lib.sim.containers import NodeView, program
from runbook_lib.sim.kubeletapi import Logs
from runbook_lib.sim.nodeagent import GPU_RESOURCE, Periodic, _container_status, _readiness, _ready
from runbook_lib.sim.nvidia import cuda_version
from runbook_lib.sim.realtalos import observed_nodes
from runbook_lib.sim.state import SimNode, runtime

log = logging.getLogger("runbook_lib.sim.gpuoperator")
GROUP, VERSION, PLURAL = "nvidia.com", "v1", "clusterpolicies"  # the ClusterPolicy CRD (crds/, lines 7-24)
OPERATOR_SELECTOR = (
    "app=gpu-operator,app.kubernetes.io/component=gpu-operator"  # templates/operator.yaml:14-15
)
NFD_GPU_LABEL = "feature.node.kubernetes.io/pci-10de.present"  # state_manager.go:116
GPU_PRESENT_LABEL = "nvidia.com/gpu.present"  # state_manager.go:42
#: The default ``hostPaths.driverInstallDir``: where a driver container makes the driver available
#: (object_controls.go:183 ``DefaultDriverInstallDir``).
DEFAULT_DRIVER_INSTALL_DIR = "/run/nvidia/driver"
#: The root under which a Talos node has ``nvidia-smi`` and ``libnvidia-ml.so.1`` (its NVIDIA extensions):
#: the Talos 1.13 docs' ``hostPaths.driverInstallDir=/usr/local`` (siderolabs/docs 4e9a921; Talos CI too).
#: Unknown: whether other roots (the earlier draft's /usr/local/glibc/usr/lib) would pass; here only this.
TALOS_DRIVER_ROOT = "/usr/local"
VALIDATIONS = "/run/nvidia/validations"
HASH_ANNOTATION = "nvidia.com/last-applied-hash"
LEASE = "53822513.nvidia.com"  # cmd/gpu-operator/main.go LeaderElectionID
LEASE_FAULT = "gpu_operator_lease_held"  # faults.FAULTS: the holder identity of another instance


@dataclass(frozen=True)
class Operand:
    """One operand DaemonSet as the operator's asset for its state names it."""

    name: str
    component: str  # the nvidia.com/gpu.deploy.<component> label its pods select on
    service_account: str
    init: tuple[str, ...]
    container: str
    image_key: str  # the ClusterPolicy spec section giving its image
    labels: tuple[tuple[str, str], ...] = ()


#: assets/state-driver/0500_daemonset.yaml (labels 5-23, k8s-driver-manager 47, nvidia-driver-ctr 94, SA 44).
DRIVER = Operand(
    "nvidia-driver-daemonset", "driver", "nvidia-driver", ("k8s-driver-manager",), "nvidia-driver-ctr",
    "driver", (("app.kubernetes.io/component", "nvidia-driver"),),
)  # fmt: skip
#: assets/state-container-toolkit/0500_daemonset.yaml (labels 5-17, SA 26, driver-validation 29).
TOOLKIT = Operand(
    "nvidia-container-toolkit-daemonset", "container-toolkit", "nvidia-container-toolkit",
    ("driver-validation",), "nvidia-container-toolkit-ctr", "toolkit",
)  # fmt: skip
#: assets/state-operator-validation/0500_daemonset.yaml (labels 6-18, SA 27, init containers 29-125, 128).
VALIDATOR = Operand(
    "nvidia-operator-validator", "operator-validator", "nvidia-operator-validator",
    ("driver-validation", "toolkit-validation", "cuda-validation", "plugin-validation"),
    "nvidia-operator-validator", "validator", (("app.kubernetes.io/part-of", "gpu-operator"),),
)  # fmt: skip
#: assets/state-device-plugin/0500_daemonset.yaml (labels 5-17, SA 26, init containers 29,39, container 66).
DEVICE_PLUGIN = Operand(
    "nvidia-device-plugin-daemonset", "device-plugin", "nvidia-device-plugin",
    ("toolkit-validation", "config-manager-init"), "nvidia-device-plugin", "devicePlugin",
)  # fmt: skip
#: assets/state-dcgm-exporter/0800_daemonset.yaml (labels 5-6, nodeSelector 20, SA 26, init container 29, container 41).
DCGM_EXPORTER = Operand(
    "nvidia-dcgm-exporter", "dcgm-exporter", "nvidia-dcgm-exporter", ("toolkit-validation",),
    "nvidia-dcgm-exporter", "dcgmExporter",
)  # fmt: skip
#: assets/gpu-feature-discovery/0500_daemonset.yaml (labels 7-8, nodeSelector 21, SA 27, init containers 29,39,
#: container 67).
GFD = Operand(
    "gpu-feature-discovery", "gpu-feature-discovery", "nvidia-gpu-feature-discovery",
    ("toolkit-validation", "config-manager-init"), "gpu-feature-discovery", "gfd",
    (("app.kubernetes.io/part-of", "nvidia-gpu"),),
)  # fmt: skip
ALL_OPERANDS = (DRIVER, TOOLKIT, VALIDATOR, DEVICE_PLUGIN, DCGM_EXPORTER, GFD)


def _enabled(spec: dict[str, Any], key: str) -> bool:
    """``spec.<key>.enabled``, true when absent (the chart's defaults, values.yaml:119,211,223)."""
    value = (spec.get(key) or {}).get("enabled", True)
    return value is True or str(value).lower() == "true"


def operands(spec: dict[str, Any]) -> list[Operand]:
    """The operand DaemonSets this ClusterPolicy asks for (state_manager.go:1107-1113 ``isStateEnabled``)."""
    wanted = [DRIVER] if _enabled(spec, "driver") else []
    wanted += [TOOLKIT] if _enabled(spec, "toolkit") else []
    wanted.append(VALIDATOR)
    wanted += [DEVICE_PLUGIN] if _enabled(spec, "devicePlugin") else []
    wanted += [DCGM_EXPORTER] if _enabled(spec, "dcgmExporter") else []
    return wanted + ([GFD] if _enabled(spec, "gfd") else [])  # after the device plugin, as its state runs


def _image(spec: dict[str, Any], op: Operand) -> str:
    part = spec.get(op.image_key) or {}
    return f"{part.get('repository', 'nvcr.io/nvidia')}/{part.get('image', op.image_key)}:{part.get('version', '')}"


def _driver_install_dir(spec: dict[str, Any]) -> str:
    return str((spec.get("hostPaths") or {}).get("driverInstallDir") or DEFAULT_DRIVER_INSTALL_DIR)


def _init_container(name: str, image: str, spec: dict[str, Any]) -> dict[str, Any]:
    """An init container; ``driver-validation`` gets ``DRIVER_INSTALL_DIR`` and the install dir mounted where
    the validator looks (object_controls.go:879-907 ``transformForDriverInstallDir``)."""
    container: dict[str, Any] = {"name": name, "image": image, "securityContext": {"privileged": True}}
    if name == "driver-validation":
        path = _driver_install_dir(spec)
        container["env"] = [
            {"name": "WITH_WAIT", "value": "true"},
            {"name": "COMPONENT", "value": "driver"},
            {"name": "DRIVER_INSTALL_DIR", "value": path},
            {"name": "DRIVER_INSTALL_DIR_CTR_PATH", "value": path},
        ]
        container["volumeMounts"] = [{"name": "driver-install-dir", "mountPath": path}]
    elif name == "toolkit-validation":
        container["command"] = ["sh", "-c"]
        container["args"] = [
            f"until [ -f {VALIDATIONS}/toolkit-ready ]; do echo waiting for nvidia container stack to be "
            "setup; sleep 5; done"
        ]  # state-device-plugin/0500_daemonset.yaml:31
    return container


def daemonset(op: Operand, spec: dict[str, Any], namespace: str, owner: dict[str, Any]) -> dict[str, Any]:
    """The DaemonSet the operator creates for ``op``: its asset's names and selectors, the ClusterPolicy's
    tolerations and priority class (``daemonsets``), RuntimeClass ``nvidia`` on every operand but the driver
    (object_controls.go:2755 ``setRuntimeClassName``), owned by the ClusterPolicy."""
    image = _image(spec, op)
    validator = _image(spec, VALIDATOR)
    labels = {"app": op.name, **dict(op.labels)}
    pod_spec: dict[str, Any] = {
        "nodeSelector": {f"nvidia.com/gpu.deploy.{op.component}": "true"},
        "tolerations": (spec.get("daemonsets") or {}).get("tolerations")
        or [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
        "priorityClassName": (spec.get("daemonsets") or {}).get("priorityClassName")
        or "system-node-critical",
        "serviceAccountName": op.service_account,
        "initContainers": [_init_container(n, validator, spec) for n in op.init],
        "containers": [{"name": op.container, "image": image, "securityContext": {"privileged": True}}],
        "volumes": [{"name": "driver-install-dir", "hostPath": {"path": _driver_install_dir(spec)}}],
    }
    if op is not DRIVER:
        pod_spec["runtimeClassName"] = str((spec.get("operator") or {}).get("runtimeClass") or "nvidia")
    ds_spec = {
        "selector": {"matchLabels": labels},
        "template": {"metadata": {"labels": labels}, "spec": pod_spec},
    }
    # The operator updates an operand only when this hash of what it wants changed (object_controls.go:129).
    digest = hashlib.sha256(json.dumps(ds_spec, sort_keys=True).encode()).hexdigest()[:16]
    metadata = {
        "name": op.name,
        "namespace": namespace,
        "labels": labels,
        "annotations": {HASH_ANNOTATION: digest},
        "ownerReferences": [owner],
    }
    return {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": metadata, "spec": ds_spec}


def _hash(body: dict[str, Any]) -> str:
    return str(body["metadata"]["annotations"][HASH_ANNOTATION])


def gfd_labels(node: SimNode) -> dict[str, str]:
    """The labels GPU Feature Discovery puts on a node (NVIDIA/k8s-device-plugin@v0.18.0 internal/lm:
    resource.go ``baseLabeler``, ``sanitise`` and the memory label; nvml.go ``newVersionLabeler``, both the
    deprecated ``cuda.driver.*`` and the ``cuda.driver-version.*`` names). The operator's GFD image is v0.19.3
    (values.yaml:339-343): its label names are assumed unchanged from v0.18.0 (not checked)."""
    gpu = node.gpus[0]
    product = "-".join(re.sub(r"[^A-Za-z0-9-_. ]", "", gpu.model).split())
    labels = {
        "nvidia.com/gpu.product": product,
        "nvidia.com/gpu.count": str(len(node.gpus)),
        "nvidia.com/gpu.memory": str(gpu.memory_mib),
        "nvidia.com/gpu.replicas": "1",
        "nvidia.com/gpu.sharing-strategy": "none",
    }
    driver = runtime(node).driver_version
    if driver is None:
        return labels
    major, minor, rev = ([*driver.split("."), "", ""])[:3]
    cuda_major, cuda_minor = cuda_version(driver).split(".")
    return labels | {
        "nvidia.com/cuda.driver.major": major,
        "nvidia.com/cuda.driver.minor": minor,
        "nvidia.com/cuda.driver.rev": rev,
        "nvidia.com/cuda.runtime.major": cuda_major,
        "nvidia.com/cuda.runtime.minor": cuda_minor,
        "nvidia.com/cuda.driver-version.major": major,
        "nvidia.com/cuda.driver-version.minor": minor,
        "nvidia.com/cuda.driver-version.revision": rev,
        "nvidia.com/cuda.driver-version.full": driver,
        "nvidia.com/cuda.runtime-version.major": cuda_major,
        "nvidia.com/cuda.runtime-version.minor": cuda_minor,
        "nvidia.com/cuda.runtime-version.full": f"{cuda_major}.{cuda_minor}",
    }


# ---------------------------------------------------------------- the node side: which validations pass


@dataclass(frozen=True)
class Validations:
    """Which of ``/run/nvidia/validations/*-ready`` the validator writes on a node."""

    driver: bool
    toolkit: bool


def validations(node: SimNode, driver_install_dir: str, driver_managed: bool) -> Validations:
    """What nvidia-validator finds on this Talos node (cmd/nvidia-validator/main.go at v26.3.3).

    driver: the host check wants ``/usr/bin/nvidia-smi`` (main.go:752), which Talos does not have (its NVIDIA
    files are under /usr/local), so the validator looks in ``DRIVER_INSTALL_DIR`` (main.go:796-808,
    find.go:29-60). With ``driver.enabled`` the driver DaemonSet exists, so it first waits for the driver
    container's ``.driver-ctr-ready`` (main.go:700-743, 767-770), which never comes on Talos: the driver
    container builds kernel modules, and Talos loads only modules signed with its build's key, which "is not
    available to the user" (docs.siderolabs.com talos/v1.14 customizing-the-kernel). Otherwise it passes only
    where ``nvidia-smi`` runs from that root: the Talos root, modules loaded, libraries of the same driver.
    toolkit: ``nvidia-smi`` in a container of the ``nvidia`` runtime (main.go:1132-1158), so the handler the
    toolkit extension registers, and the driver validated first.
    """
    rt = runtime(node)
    driver = (
        not driver_managed
        and driver_install_dir.rstrip("/") == TALOS_DRIVER_ROOT
        and rt.driver_version is not None
        and rt.toolkit_driver_version in (None, rt.driver_version)
        and "nvidia" in rt.cri_runtime_handlers
    )
    return Validations(driver=driver, toolkit=driver and "nvidia" in rt.cri_runtime_handlers)


def waiting_in(pod: dict[str, Any], checks: Validations, advertised: int) -> int | None:
    """The index of the init container this pod waits in, or None when all of them would finish."""
    passes = {
        "driver-validation": checks.driver,
        "toolkit-validation": checks.toolkit,
        "cuda-validation": checks.toolkit,  # its CUDA workload pod is not simulated: passes with the stack
        "plugin-validation": advertised > 0,  # main.go:1160ff: the node must advertise nvidia.com/gpu
    }
    for index, container in enumerate((pod.get("spec") or {}).get("initContainers") or []):
        if not passes.get(container["name"], True):
            return index
    return None


def _waiting_status(pod: dict[str, Any], index: int) -> dict[str, Any]:
    """Pending in init container ``index``: those before it completed, it running, the rest waiting.

    The running one carries no ``startedAt`` and the later ones no waiting reason, so none of kwok's pod
    stages (pod-init-container-running/-completed select on those fields) moves the pod on."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    inits = pod["spec"]["initContainers"]

    def state(i: int) -> dict[str, Any]:
        if i < index:
            return {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": now, "finishedAt": now}}
        return {"running": {}} if i == index else {"waiting": {}}

    names = " ".join(c["name"] for c in inits[index:])
    init_statuses = [
        {"name": c["name"], "image": c.get("image", ""), "imageID": "", "ready": i < index,
         "restartCount": 0, "started": i == index, "state": state(i)}
        for i, c in enumerate(inits)
    ]  # fmt: skip
    containers = [
        {"name": c["name"], "image": c.get("image", ""), "imageID": "", "ready": False, "restartCount": 0,
         "started": False, "state": {"waiting": {"reason": "PodInitializing"}}}
        for c in pod["spec"]["containers"]
    ]  # fmt: skip
    initialized = {
        "type": "Initialized",
        "status": "False",
        "reason": "ContainersNotInitialized",
        "message": f"containers with incomplete status: [{names}]",
        "lastTransitionTime": now,
    }
    conditions = [c for c in _readiness(pod, False) if c["type"] != "Initialized"] + [initialized]
    return {
        "phase": "Pending",
        "initContainerStatuses": init_statuses,
        "containerStatuses": containers,
        "conditions": conditions,
    }


def _held_at(pod: dict[str, Any]) -> int | None:
    """The init container this simulator holds the pod in (running without startedAt), if any."""
    statuses = (pod.get("status") or {}).get("initContainerStatuses") or []
    for index, status in enumerate(statuses):
        running = (status.get("state") or {}).get("running")
        if running is not None and not running.get("startedAt"):
            return index
    return None


# ---------------------------------------------------------------- the reconciler


class GpuOperator(Periodic):
    """Reconciles the ClusterPolicy every ``interval`` seconds in a thread, like ``nodeagent.NodeAgent``."""

    def __init__(self, state_dir: Path, kubeconfig: Path, logs: Logs, interval: float = 1.0) -> None:
        super().__init__(interval, "gpu-operator")
        self.state_dir = state_dir
        self.logs = logs
        api_client = config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
        self.core = client.CoreV1Api(api_client)
        self.apps = client.AppsV1Api(api_client)
        self.nodes_api = client.NodeV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.leases = client.CoordinationV1Api(api_client)
        self.toolkit_ready: frozenset[str] = frozenset()
        """Nodes whose toolkit validation passes: the node agent counts the operator's device plugin only there."""
        self._crashed: set[str] = set()
        self.node_labels: dict[str, dict[str, str]] = {}
        """Each Node's labels at this pass's node list (GFD's are patched only when they differ)."""

    def admits(self, pod: dict[str, Any], node: SimNode) -> bool:
        """For the node agent: a device-plugin pod of the operator registers GPUs only where its
        ``toolkit-validation`` passes (also in the moment before this reconciler holds a pod kwok started)."""
        inits = {c.get("name") for c in (pod.get("spec") or {}).get("initContainers") or []}
        return "toolkit-validation" not in inits or node.name in self.toolkit_ready

    def sync(self) -> None:
        """One pass: nothing until the ClusterPolicy exists and the operator pod is Ready."""
        policy = self._policy()
        namespace = self._operator_namespace() if policy is not None else None  # one list call while no chart
        if policy is None:
            self.toolkit_ready = frozenset()
            return
        if namespace is None:
            # The operator is down (scaled to 0, crash-looping): nothing is reconciled, but its operands keep
            # running where they validated, so the nodes keep their GPUs.
            return
        nodes = {n.name: n for n in observed_nodes(self.state_dir)}
        if self._lease_held_elsewhere(namespace, nodes):
            return  # Ready, waiting for the lease: nothing reconciled, no status written
        spec = policy.get("spec") or {}
        owner = {
            "apiVersion": "nvidia.com/v1",
            "kind": "ClusterPolicy",
            "name": policy["metadata"]["name"],
            "uid": policy["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
        self._runtime_classes(spec, owner)
        advertised = self._label_nodes(nodes)
        wanted = operands(spec)
        self._daemonsets(namespace, spec, owner, wanted)
        self._pods(namespace, spec, nodes, advertised)
        self._status(policy, namespace, wanted)

    def _policy(self) -> dict[str, Any] | None:
        try:
            items = self._items(self.custom.list_cluster_custom_object(GROUP, VERSION, PLURAL))
        except ApiException as exc:
            if exc.status == 404:  # the CRD is not installed (yet): no chart, nothing to do
                return None
            raise
        return min(items, key=lambda p: p["metadata"]["creationTimestamp"]) if items else None

    def _lease_held_elsewhere(self, namespace: str, nodes: dict[str, SimNode]) -> bool:
        """With the ``gpu_operator_lease_held`` fault: the Lease written (or renewed) as its other holder renews
        it (controller-runtime's default lease duration, 15 s); True then, as this operator does not lead."""
        holder = next((str(n.faults[LEASE_FAULT]) for n in nodes.values() if n.faults.get(LEASE_FAULT)), None)
        if holder is None:
            return False
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        spec = {"holderIdentity": holder, "leaseDurationSeconds": 15, "renewTime": now}
        try:
            self.leases.patch_namespaced_lease(LEASE, namespace, {"spec": spec})
        except ApiException as exc:
            if exc.status != 404:
                raise
            body = {"metadata": {"name": LEASE, "namespace": namespace}, "spec": spec | {"acquireTime": now}}
            self._create(self.leases.create_namespaced_lease, body, namespace=namespace)
        return True

    def _operator_namespace(self) -> str | None:
        pods = self._items(self.core.list_pod_for_all_namespaces(label_selector=OPERATOR_SELECTOR))
        ready = [p for p in pods if _ready(p)]
        return str(ready[0]["metadata"]["namespace"]) if ready else None

    def _runtime_classes(self, spec: dict[str, Any], owner: dict[str, Any]) -> None:
        """pre-requisites: RuntimeClass ``nvidia`` (``operator.runtimeClass``), plus ``nvidia-cdi`` and
        ``nvidia-legacy`` with CDI enabled (object_controls.go:5265-5310)."""
        name = str((spec.get("operator") or {}).get("runtimeClass") or "nvidia")
        names = [name] + (["nvidia-cdi", "nvidia-legacy"] if _enabled(spec, "cdi") else [])
        existing = {c["metadata"]["name"] for c in self._items(self.nodes_api.list_runtime_class())}
        for rc in names:
            if rc in existing:
                continue
            body = {
                "apiVersion": "node.k8s.io/v1",
                "kind": "RuntimeClass",
                "metadata": {
                    "name": rc,
                    "labels": {"app.kubernetes.io/component": "gpu-operator"},
                    "ownerReferences": [owner],
                },
                "handler": rc,
            }
            self._create(self.nodes_api.create_runtime_class, body)

    def _label_nodes(self, nodes: dict[str, SimNode]) -> dict[str, int]:
        """NFD's PCI label on nodes with an NVIDIA GPU, then the operator's labels on them; the GPUs each Node
        advertises now, in its capacity, as plugin-validation reads them (gpu-operator@v26.3.3
        cmd/nvidia-validator/main.go:1435-1454: unhealthy GPUs count, as the kubelet keeps them in capacity)."""
        advertised: dict[str, int] = {}
        for obj in self._items(self.core.list_node()):
            name = obj["metadata"]["name"]
            self.node_labels[name] = obj["metadata"].get("labels") or {}
            capacity = ((obj.get("status") or {}).get("capacity") or {}).get(GPU_RESOURCE, "0")
            advertised[name] = int(capacity) if str(capacity).isdigit() else 0
            sim = nodes.get(name)
            if sim is None or not sim.gpus:
                continue
            want = {NFD_GPU_LABEL: "true", GPU_PRESENT_LABEL: "true"}
            want |= {f"nvidia.com/gpu.deploy.{op.component}": "true" for op in ALL_OPERANDS}
            labels = obj["metadata"].get("labels") or {}
            if any(labels.get(k) != v for k, v in want.items()):
                self.core.patch_node(name, {"metadata": {"labels": want}})
        return advertised

    def _daemonsets(
        self, namespace: str, spec: dict[str, Any], owner: dict[str, Any], wanted: list[Operand]
    ) -> None:
        """Each wanted operand's ServiceAccount and DaemonSet created or brought back to the ClusterPolicy;
        the others deleted (a value turned off removes its operand, as the operator's state cleanup does)."""
        existing = {
            d["metadata"]["name"]: d for d in self._items(self.apps.list_namespaced_daemon_set(namespace))
        }
        accounts = {
            s["metadata"]["name"] for s in self._items(self.core.list_namespaced_service_account(namespace))
        }
        for op in wanted:
            if op.service_account not in accounts:
                body = {"metadata": {"name": op.service_account, "namespace": namespace}}
                self._create(self.core.create_namespaced_service_account, body, namespace=namespace)
            body = daemonset(op, spec, namespace, owner)
            current = existing.get(op.name)
            if current is None:
                self._create(self.apps.create_namespaced_daemon_set, body, namespace=namespace)
                log.info("created DaemonSet %s/%s", namespace, op.name)
            elif (current["metadata"].get("annotations") or {}).get(HASH_ANNOTATION) != _hash(body):
                patch = {"metadata": {"annotations": body["metadata"]["annotations"]}, "spec": body["spec"]}
                self.apps.patch_namespaced_daemon_set(op.name, namespace, patch)
                log.info("updated DaemonSet %s/%s", namespace, op.name)
        for name in {op.name for op in ALL_OPERANDS} - {op.name for op in wanted}:
            if name in existing:
                self.apps.delete_namespaced_daemon_set(name, namespace)
                log.info("deleted DaemonSet %s/%s (disabled in the ClusterPolicy)", namespace, name)

    def _pods(
        self, namespace: str, spec: dict[str, Any], nodes: dict[str, SimNode], advertised: dict[str, int]
    ) -> None:
        """Each operand pod held in the init container whose validation fails on its node, let go when it
        passes; the driver and toolkit containers crash-loop once they run (they cannot work on Talos)."""
        managed = _enabled(spec, "driver")
        install_dir = _driver_install_dir(spec)
        checks = {name: validations(node, install_dir, managed) for name, node in nodes.items()}
        self.toolkit_ready = frozenset(name for name, c in checks.items() if c.toolkit)
        selector = "app in (" + ",".join(op.name for op in ALL_OPERANDS) + ")"
        for body in self._items(self.core.list_namespaced_pod(namespace, label_selector=selector)):
            node = nodes.get(body["spec"].get("nodeName") or "")
            if node is None or body["metadata"].get("deletionTimestamp"):
                continue
            self._gate(body, checks[node.name], advertised.get(node.name, 0))
            if body["spec"]["containers"][0]["name"] in (DRIVER.container, TOOLKIT.container):
                self._crash(body, node)
            elif body["spec"]["containers"][0]["name"] == GFD.container and _ready(body) and node.gpus:
                self._label(node.name, gfd_labels(node))

    def _label(self, name: str, labels: dict[str, str]) -> None:
        """GFD's labels on the Node, patched only when one differs (GFD relabels every 60 s)."""
        current = self.node_labels.get(name, {})
        if any(current.get(k) != v for k, v in labels.items()):
            self.core.patch_node(name, {"metadata": {"labels": labels}})

    def _gate(self, pod: dict[str, Any], checks: Validations, advertised: int) -> None:
        meta, status = pod["metadata"], pod.get("status") or {}
        index = waiting_in(pod, checks, advertised)
        held = _held_at(pod)
        if index is not None and held != index:
            # Also a pod kwok already started (a pass that came late on a loaded machine): held again.
            body = {"status": _waiting_status(pod, index)}
            self.core.patch_namespaced_pod_status(meta["name"], meta["namespace"], body)
        elif index is None and held is not None and status.get("phase") == "Pending":
            # Validated now: the init containers run, and kwok's pod-init-container-completed stage goes on.
            now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            inits = [
                {"name": c["name"], "image": c.get("image", ""), "imageID": "", "ready": False,
                 "restartCount": 0, "started": True, "state": {"running": {"startedAt": now}}}
                for c in pod["spec"]["initContainers"]
            ]  # fmt: skip
            body = {"status": {"initContainerStatuses": inits}}
            self.core.patch_namespaced_pod_status(meta["name"], meta["namespace"], body)

    def _crash(self, pod: dict[str, Any], node: SimNode) -> None:
        """A running driver or toolkit container exits as ``kubelet.program`` says it does on this node (the
        Python kubelet's texts); shown in CrashLoopBackOff with its log. Simplified: the restart count stays 1
        (the node agent's plugin back-off is not applied here)."""
        meta, status = pod["metadata"], pod.get("status") or {}
        if status.get("phase") != "Running" or meta["uid"] in self._crashed:
            return
        container = pod["spec"]["containers"][0]
        outcome = program(pod, container, NodeView(node, runtime(node), ""), "", 1)
        self.logs.put(meta["namespace"], meta["name"], container["name"], outcome.log)
        if outcome.exit_code is None and outcome.start_error is None:
            return
        body = {
            "status": {
                "containerStatuses": [_container_status(pod, container["name"], 1, outcome)],
                "conditions": _readiness(pod, False),
            }
        }
        self.core.patch_namespaced_pod_status(meta["name"], meta["namespace"], body)
        self._crashed.add(meta["uid"])

    def _status(self, policy: dict[str, Any], namespace: str, wanted: list[Operand]) -> None:
        """``status.state`` ready/notReady as the real ClusterPolicy reports it (api/nvidia/v1 ``State``)."""
        sets = {
            d["metadata"]["name"]: d.get("status") or {}
            for d in self._items(self.apps.list_namespaced_daemon_set(namespace))
        }
        ready = all(
            sets.get(op.name, {}).get("desiredNumberScheduled", 0) > 0
            and sets[op.name].get("numberReady", 0) == sets[op.name]["desiredNumberScheduled"]
            for op in wanted
        )
        state = "ready" if ready else "notReady"
        if (policy.get("status") or {}).get("state") != state:
            body = {"status": {"state": state, "namespace": namespace}}
            name = policy["metadata"]["name"]
            self.custom.patch_cluster_custom_object_status(GROUP, VERSION, PLURAL, name, body)
            log.info("ClusterPolicy %s: %s", policy["metadata"]["name"], state)

    def _items(self, listed: Any) -> list[dict[str, Any]]:
        """A list answer's items as plain dicts (the JSON the API server sent)."""
        items: list[dict[str, Any]] = (
            self.core.api_client.sanitize_for_serialization(listed).get("items") or []
        )
        return items

    @staticmethod
    def _create(create: Any, body: dict[str, Any], **kwargs: str) -> None:
        try:
            create(body=body, **kwargs)
        except ApiException as exc:
            if exc.status != 409:
                raise
