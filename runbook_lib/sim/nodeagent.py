"""The GPU side of the simulated nodes on the real control plane: Node objects and ``nvidia.com/gpu``.

kwok (sigs.k8s.io/kwok) plays each node's kubelet for everything generic: Ready, lease heartbeats, pods
through Running and deletion, once this agent lets a pod's sandbox start (``NodeAgent._start``). What a GPU node
adds is decided here, from the node's simulated Talos state (``state.runtime``) and ``containers.program``: a
node advertises
``nvidia.com/gpu`` only while a device-plugin pod runs on it **and** NVML can initialise in that pod, i.e.
the NVIDIA modules are loaded (driver bound), the pod runs with the containerd handler ``nvidia`` (which only
the toolkit extension registers) and the toolkit's driver matches the kernel's. Why: the device plugin builds
its resource managers only after ``nvml.Init()`` succeeds; on failure it logs "Failed to initialize NVML" and
returns no plugin, so nothing registers with the kubelet (NVIDIA/k8s-device-plugin@v0.18.0
``internal/plugin/factory.go`` ``getResourceManagers``; the same at v0.17.2).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from runbook_lib.sim import kwokstages
from runbook_lib.sim.containers import (
    CONTAINERD_VERSIONS,
    KERNEL_VERSIONS,
    NodeView,
    Outcome,
    cri_down,
    failing_pull,
    program,
    pull_backoff,
    pull_failure,
    rate_limited,
)
from runbook_lib.sim.faultfile import FaultFile, matches
from runbook_lib.sim.kubeletapi import KUBELET_PORT, Logs
from runbook_lib.sim.realtalos import observed_nodes, time_factor
from runbook_lib.sim.state import SimNode, runtime

log = logging.getLogger("runbook_lib.sim.nodeagent")
GPU_RESOURCE = "nvidia.com/gpu"
#: The container the device-plugin chart runs (templates/daemonset-device-plugin.yml, v0.17.2 and v0.18.0).
PLUGIN_CONTAINER = "nvidia-device-plugin-ctr"
#: The device plugin's container in the GPU Operator's DaemonSet (gpu-operator@v26.3.3
#: assets/state-device-plugin/0500_daemonset.yaml:66; gpuoperator.py).
PLUGIN_CONTAINERS = (PLUGIN_CONTAINER, "nvidia-device-plugin")
#: Whether a device-plugin pod on a node may register GPUs (default: always): the simulated GPU Operator's
#: plugin only where its toolkit validation passes (``gpuoperator.GpuOperator.admits``).
Admits = Callable[[dict[str, Any], SimNode], bool]
BASICS = {"cpu": "8", "memory": "32Gi", "pods": "110"}
#: Talos taints control-plane nodes unless cluster.allowSchedulingOnControlPlanes is set (the Talos config
#: reference's description of that field; where Talos applies the taint was not checked in its source).
CONTROL_PLANE_TAINT = {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}
#: Not on a real node: the label kwok selects the nodes it plays the kubelet of by (realkube._start_kwok). The
#: agent takes it off while the node's Talos state says it is down (powered off, rebooting), so nothing renews
#: the node's Lease or posts its status, as with a real node whose kubelet is not running.
KUBELET_LABEL = "sim.talos-gpu-runbooks.local/kubelet"
KUBELET_RUNNING = "running"


#: How many status posts the agent has in flight at once. Each node's kubelet posts its own pods' and node's status
#: (kubernetes@v1.35.0 pkg/kubelet/status/status_manager.go: one status manager per kubelet), so on a real cluster
#: 1,000 nodes post side by side; the agent plays every kubelet and must not post one after another (a round trip
#: per pod was the bound: tests/sim/test_nodeagent_reads.py). 16: our choice, not a source's, to keep the API
#: server's share of 2 cores for everyone else.
KUBELET_POSTS = 16


def api(kubeconfig: Path) -> client.CoreV1Api:
    """A client whose connection pool holds :data:`KUBELET_POSTS` connections (the default, 5 per CPU, would open
    and drop a connection per post beyond it)."""
    configuration = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)  # type: ignore[no-untyped-call]
    configuration.connection_pool_maxsize = KUBELET_POSTS
    return client.CoreV1Api(client.ApiClient(configuration))


def listed(call: Callable[..., Any], **kwargs: Any) -> list[dict[str, Any]]:
    """A list call's items as the JSON the API server sent (``_preload_content=False``), no client model built.

    Why: at 1,000 nodes and their 2,000 kube-system pods, building the client's models and turning them back into
    dicts was 95 % of the agent's pass (py-spy), 7× the CPU of parsing the same answer as JSON (2.57 s against
    0.38 s for the Running pods), every 0.5 s, in the process that also relays the user's API requests
    (tests/sim/test_nodeagent_reads.py)."""
    response = call(_preload_content=False, **kwargs)
    items: list[dict[str, Any]] = json.loads(response.data).get("items") or []
    return items


def node_object(node: SimNode, kubernetes: str) -> dict[str, Any]:
    """The Node a Talos node's kubelet registers: hostname/os/arch labels, its address, its role, and the node
    info a Talos node reports (kubelet ``kubernetes``, containerd and kernel of its release, as kubelet.py)."""
    labels = {"kubernetes.io/hostname": node.name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}
    if node.reachable:
        labels[KUBELET_LABEL] = KUBELET_RUNNING
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
        "daemonEndpoints": {"kubeletEndpoint": {"Port": KUBELET_PORT}},
        "nodeInfo": {
            "machineID": hashlib.md5(node.name.encode()).hexdigest(),  # an identifier, not security
            "systemUUID": hashlib.md5(node.address.encode()).hexdigest(),
            "bootID": "",
            "kubeProxyVersion": "",
            "kubeletVersion": f"v{kubernetes.lstrip('v')}",
            "containerRuntimeVersion": f"containerd://{CONTAINERD_VERSIONS.get(node.minor, '2.1.5')}",
            "kernelVersion": KERNEL_VERSIONS.get(node.minor, "6.12.57-talos"),
            "osImage": f"Talos ({node.talos_version})",
            "operatingSystem": "linux",
            "architecture": "amd64",
        },
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": node.name, "labels": labels},
        "spec": spec,
        "status": status,
    }


def register(core: client.CoreV1Api, nodes: list[SimNode], kubernetes: str) -> None:
    """Create the Node objects that do not exist yet (kwok then keeps them Ready)."""
    for node in nodes:
        try:
            core.create_node(node_object(node, kubernetes))  # type: ignore[arg-type]  # the client accepts a dict body
        except ApiException as exc:
            if exc.status != 409:
                raise


#: Where every node's Lease lives (the kubelet's, here kwok's: kubernetes@v1.35.0 pkg/kubelet/kubelet.go,
#: ``v1.NamespaceNodeLease``).
NODE_LEASES = "kube-node-lease"


def release_leases(core: client.CoreV1Api) -> None:
    """Delete the node Leases an earlier start's kwok held, before a new kwok starts.

    Why: kwok's identity is the host name and a new UUID per process (sigs.k8s.io/kwok@v0.8.0
    pkg/kwok/controllers/controller.go ``Identity``) and it plays a node only while it holds the node's Lease
    (``readOnlyFunc``), which it may take over only once the old holder's expired, up to 40 s on (the
    ``--node-lease-duration-seconds``; node_lease_controller.go ``sync``, ``tryAcquireOrRenew``). Pods created
    meanwhile were skipped, and when kwok's look at the node's pods on taking over ran before its own Lease cache
    named it the holder (controller.go ``podsOnNodeSyncWorker``), they stayed Pending for good. A real node's
    kubelet outlives a ``runbook run``; the simulator's does not, so it hands the Leases over at once."""
    client.CoordinationV1Api(core.api_client).delete_collection_namespaced_lease(NODE_LEASES)


def await_leases(core: client.CoreV1Api, timeout: float) -> list[str]:
    """Wait until every node kwok plays (``KUBELET_LABEL``) has a Lease again (``release_leases``); the nodes
    still without one when ``timeout`` seconds passed (none: all handed over)."""
    coordination = client.CoordinationV1Api(core.api_client)
    deadline = time.monotonic() + timeout
    while True:
        played = {
            o["metadata"]["name"]
            for o in listed(core.list_node, label_selector=f"{KUBELET_LABEL}={KUBELET_RUNNING}")
        }
        held = {
            o["metadata"]["name"]
            for o in listed(functools.partial(coordination.list_namespaced_lease, NODE_LEASES))
            if (o.get("spec") or {}).get("holderIdentity")
        }
        missing = sorted(played - held)
        if not missing or time.monotonic() >= deadline:
            return missing
        time.sleep(0.5)


#: Not on a real pod: the annotation ``nudge_pods`` sets to make kwok look at a pod again.
RESYNC_ANNOTATION = "sim.talos-gpu-runbooks.local/resync"


def nudge_pods(core: client.CoreV1Api) -> int:
    """Touch every pod bound to a node that waits for kwok (Pending, or deleted and not yet gone), so kwok sees
    it again once it holds the Leases (``await_leases``); how many.

    Why: kwok skips a pod's events while it does not hold its node's Lease, and looks at the node's pods once
    when it takes the Lease, before its own Lease cache may name it the holder (``release_leases``): a pod left
    from before the restart could be skipped both times and never run or go. A pod's update is an event kwok
    plays (pod_controller.go ``watchResources``). Found by review; no test makes the race happen on demand."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    waiting = [
        p
        for p in listed(core.list_pod_for_all_namespaces, field_selector="spec.nodeName!=")
        if (p.get("status") or {}).get("phase") == "Pending" or p["metadata"].get("deletionTimestamp")
    ]
    body = {"metadata": {"annotations": {RESYNC_ANNOTATION: now}}}
    for pod in waiting:
        with contextlib.suppress(ApiException):  # gone meanwhile
            core.patch_namespaced_pod(pod["metadata"]["name"], pod["metadata"]["namespace"], body)
    return len(waiting)


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
    """How many GPUs the node advertises: all of them while a working device plugin runs there, else none
    (a plugin container in back-off has not registered yet, even once NVML would initialise)."""
    running = [p for p in plugin_pods if (p.get("spec") or {}).get("nodeName") == node.name and _ready(p)]
    return len(node.gpus) if any(nvml_initialises(node, _handler(p, handlers, node)) for p in running) else 0


def _gpus(node: SimNode, plugin_pods: list[dict[str, Any]], handlers: dict[str, str]) -> tuple[int, int]:
    """The node's ``nvidia.com/gpu`` as it should be: (capacity, allocatable)."""
    want = wanted_gpus(node, plugin_pods, handlers)
    return want, healthy_gpus(node, want)


def _ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def backoff_seconds(restarts: int) -> float:
    """The kubelet's crash-loop back-off before restart ``restarts + 1``: 10 s doubling up to 5 min
    (kubernetes@v1.35.0 pkg/kubelet/kubelet.go ``backOffPeriod`` 10 s; ``MaxContainerBackOff`` 300 s in
    pkg/kubelet/apis/config/v1beta1/defaults.go)."""
    return float(min(10 * 2**restarts, 300))


def _container_status(pod: dict[str, Any], name: str, restarts: int, crash: Outcome | None) -> dict[str, Any]:
    """A crash-looping container (waiting in CrashLoopBackOff after it exited, or after the runtime could not
    start it: exit code 128, reason StartError, the runtime's message) or, without ``crash``, a running one."""
    image = next(c.get("image", "") for c in pod["spec"]["containers"] if c["name"] == name)
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    status: dict[str, Any] = {"name": name, "image": image, "imageID": "", "restartCount": restarts}
    if crash is not None:
        wait = f"back-off {int(backoff_seconds(restarts))}s restarting failed container={name} pod={pod['metadata']['name']}_{pod['metadata']['namespace']}({pod['metadata']['uid']})"
        status |= {
            "ready": False,
            "started": False,
            "state": {"waiting": {"reason": "CrashLoopBackOff", "message": wait}},
        }
        last: dict[str, Any] = {"exitCode": crash.exit_code or 1, "reason": "Error"}
        if crash.start_error:
            last = {"exitCode": 128, "reason": "StartError", "message": crash.start_error}
        status["lastState"] = {"terminated": {**last, "startedAt": now, "finishedAt": now}}
    else:
        status |= {"ready": True, "started": True, "state": {"running": {"startedAt": now}}}
    return status


def _readiness(pod: dict[str, Any], ready: bool) -> list[dict[str, Any]]:
    """The pod's conditions with Ready and ContainersReady set (the others as they are)."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    kept = [
        c
        for c in (pod.get("status") or {}).get("conditions") or []
        if c.get("type") not in ("Ready", "ContainersReady")
    ]
    value = {"status": "True"} if ready else {"status": "False", "reason": "ContainersNotReady"}
    return kept + [{"type": t, "lastTransitionTime": now, **value} for t in ("ContainersReady", "Ready")]


def kubelet_stopped(node: SimNode, cluster_faults: dict[str, Any]) -> bool:
    """No kubelet posts for this node: it is down (powered off, rebooting, not answering), or its kubelet is
    stopped by the ``node_not_ready`` fault (the node's, or the cluster's naming it)."""
    return (
        not node.reachable
        or bool(node.faults.get("node_not_ready"))
        or matches(cluster_faults.get("node_not_ready", False), node.name)
    )


def pod_room(node: SimNode) -> str:
    """How many pods the node's kubelet takes (its ``pods`` capacity and allocatable): none under the
    ``pods_pending`` fault, so kube-scheduler leaves every pod meant for the node Pending, Unschedulable, with
    its own message ("0/N nodes are available: 1 Too many pods, ...": kubernetes@v1.35.0
    pkg/scheduler/framework/plugins/noderesources/fit.go:652-660), the device plugin's DaemonSet pod included
    (the DaemonSet controller checks only name, affinity and taints: pkg/controller/daemon/daemon_controller.go
    ``predicates``). Simplified: a real node has no room once it runs its kubelet's maxPods pods, and then the
    scheduler may preempt lower-priority pods there for the system-node-critical plugin; 0 leaves nothing whose
    preemption would help, so the plugin stays Pending."""
    return "0" if node.faults.get("pods_pending") else BASICS["pods"]


#: The Initialized condition's reason on a pod whose image pull fails here: not a kubelet's (it reports
#: Initialized True and the container waiting), but what keeps kwok's init-container and pod-ready stages from
#: starting the pod, and what tells the agent to retry the pull (``_retry_pulls``).
PULL_FAILED = kwokstages.PULL_BACKOFF


def _awaiting_start(pod: dict[str, Any]) -> bool:
    """A pod kwok's pod-create stage gave a sandbox address whose start the agent has not allowed yet: its
    ``PodReadyToStartContainers`` is not True (``kwokstages.SANDBOX``)."""
    if (pod.get("metadata") or {}).get("deletionTimestamp") or not (pod.get("status") or {}).get("podIP"):
        return False
    conditions = (pod.get("status") or {}).get("conditions") or []
    return not any(c.get("type") == kwokstages.SANDBOX and c.get("status") == "True" for c in conditions)


def _sandbox(ready: bool) -> dict[str, Any]:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return {"type": kwokstages.SANDBOX, "status": str(ready), "lastTransitionTime": now}


def _never_starts(pod: dict[str, Any], outcomes: list[tuple[str, Outcome]]) -> bool:
    """A bare pod (restartPolicy Never/OnFailure, no Job) none of whose containers can start (the runtime's
    error, e.g. the nvidia hook's "driver not loaded"): a real kubelet never runs it, Pending to Failed."""
    spec, meta = pod.get("spec") or {}, pod.get("metadata") or {}
    if spec.get("restartPolicy") not in ("Never", "OnFailure"):
        return False
    if any(ref.get("kind") == "Job" for ref in meta.get("ownerReferences") or []):
        return False
    return bool(outcomes) and all(o.start_error for _, o in outcomes)


def _failing_image(pod: dict[str, Any], node: SimNode, cluster_faults: dict[str, Any]) -> str | None:
    images = [str(c.get("image") or "") for c in (pod.get("spec") or {}).get("containers") or []]
    return next((i for i in images if failing_pull(i, node, cluster_faults)), None)


def _node_ready(node: dict[str, Any]) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _marked_not_ready(pod: dict[str, Any]) -> bool:
    """Ready False while ContainersReady stays True: what the node lifecycle controller leaves on the pods of a
    node whose kubelet stopped posting (it flips only the Ready condition: kubernetes@v1.35.0
    pkg/controller/util/node/controller_utils.go ``MarkPodsNotReady``); a kubelet never reports that pair."""
    conditions = {c.get("type"): c.get("status") for c in (pod.get("status") or {}).get("conditions") or []}
    return conditions.get("Ready") == "False" and conditions.get("ContainersReady") == "True"


def _runs_to_completion(pod: dict[str, Any]) -> bool:
    """A bare pod that ends by itself (restartPolicy Never/OnFailure), started by kwok (Running and Ready).

    kwok's own stages complete only pods a Job owns (its pod-complete stage), and know nothing of GPUs."""
    spec, meta = pod.get("spec") or {}, pod.get("metadata") or {}
    if spec.get("restartPolicy") not in ("Never", "OnFailure") or meta.get("deletionTimestamp"):
        return False
    if any(ref.get("kind") == "Job" for ref in meta.get("ownerReferences") or []):
        return False
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _final_status(pod: dict[str, Any], outcomes: list[tuple[str, Outcome]]) -> dict[str, Any]:
    """Succeeded when every container exited 0, else Failed; each container terminated with its code.

    Simplified: a container that cannot start (``start_error``) is shown terminated with exit code 128 and the
    runtime's message; a real kubelet leaves it waiting (RunContainerError) with that message in an event."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    images = {c["name"]: c.get("image", "") for c in pod["spec"]["containers"]}
    statuses = []
    for name, outcome in outcomes:
        code = 128 if outcome.start_error else int(outcome.exit_code or 0)
        reason = "StartError" if outcome.start_error else ("Completed" if code == 0 else "Error")
        terminated = {"exitCode": code, "reason": reason, "startedAt": now, "finishedAt": now}
        if outcome.start_error:
            terminated["message"] = outcome.start_error
        statuses.append(
            {"name": name, "image": images[name], "imageID": "", "ready": False, "restartCount": 0,
             "started": False, "state": {"terminated": terminated}}
        )  # fmt: skip
    failed = any(s["state"]["terminated"]["exitCode"] != 0 for s in statuses)
    ready = {"type": "Ready", "status": "False", "reason": "PodCompleted", "lastTransitionTime": now}
    return {
        "phase": "Failed" if failed else "Succeeded",
        "containerStatuses": statuses,
        "conditions": [ready],
    }


def _is_plugin(pod: dict[str, Any]) -> bool:
    containers = (pod.get("spec") or {}).get("containers") or []
    return any(c.get("name") in PLUGIN_CONTAINERS for c in containers)


def _advertised(node: dict[str, Any]) -> tuple[int, int]:
    """The Node's ``nvidia.com/gpu`` (capacity, allocatable)."""
    status = node.get("status") or {}
    values = [str((status.get(key) or {}).get(GPU_RESOURCE, "0")) for key in ("capacity", "allocatable")]
    capacity, allocatable = (int(v) if v.isdigit() else 0 for v in values)
    return capacity, allocatable


def healthy_gpus(node: SimNode, registered: int) -> int:
    """How many of the ``registered`` GPUs the device plugin reports healthy: none with the ``gpu_unhealthy``
    fault. The plugin marks a GPU unhealthy on an Xid critical error (NVIDIA/k8s-device-plugin@v0.19.3, the
    operator's default image, internal/rm/health.go:133-170: any Xid but the application errors it skips, e.g.
    79, which the driver logs as "NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.", as quoted in
    NVIDIA/open-gpu-kernel-modules issue 1151) and never marks it healthy again (internal/plugin/server.go:276-279,
    "FIXME: there is no way to recover from the Unhealthy state"); the kubelet counts unhealthy devices in the
    Node's capacity but not in its allocatable (kubernetes@v1.35.0 pkg/kubelet/cm/devicemanager/manager.go:
    444-480 ``GetCapacity``)."""
    return 0 if node.faults.get("gpu_unhealthy") else registered


def unhealthy_log(node: SimNode) -> str:
    """What the device plugin logs as it marks each GPU unhealthy (health.go:169, server.go:279, klog's
    format), Xid 79 for the error."""
    now = time.strftime("%m%d %H:%M:%S.000000", time.gmtime())
    return "".join(
        f"I{now}       1 health.go:169] XidCriticalError: Xid=79 on Device={gpu.uuid}; marking device as "
        f"unhealthy.\nI{now}       1 server.go:279] '{GPU_RESOURCE}' device marked unhealthy: {gpu.uuid}\n"
        for gpu in node.gpus
    )


class Periodic:
    """A controller that runs ``sync`` every ``interval`` seconds in a daemon thread until ``stop``; a failed
    pass is logged and retried (a simulated controller must not die on one API error)."""

    def __init__(self, interval: float, name: str) -> None:
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._posts = ThreadPoolExecutor(max_workers=KUBELET_POSTS, thread_name_prefix=f"{name}-post")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:  # started
            self._thread.join(timeout=10)
        self._posts.shutdown(wait=True, cancel_futures=True)

    def each(self, fn: Callable[[Any], None], items: Iterable[Any]) -> None:
        """``fn`` over ``items``, :data:`KUBELET_POSTS` at a time, as many kubelets post side by side; returns once
        all ended, raising the first error (the pass is then logged and retried, as any failed pass). It waits for
        every post before raising: a post left running into the next pass could land after that pass's newer post
        for the same pod (a stale phase) or count a restart twice."""
        futures = [self._posts.submit(fn, item) for item in items]
        wait(futures)
        for future in futures:
            future.result()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.sync()
            except Exception:
                log.exception("%s pass failed", self._thread.name)

    def sync(self) -> None:
        raise NotImplementedError


class NodeAgent(Periodic):
    """Re-reads the nodes' Talos state and the device-plugin pods every ``interval`` seconds and patches each
    Node's ``nvidia.com/gpu`` capacity/allocatable when it differs (removing it when the plugin stops)."""

    def __init__(
        self,
        state_dir: Path,
        kubeconfig: Path,
        logs: Logs,
        interval: float = 0.5,
        admits: Admits | None = None,
    ) -> None:
        super().__init__(interval, "gpu-node-agent")
        self.state_dir = state_dir
        self.admits: Admits = admits or (lambda _pod, _node: True)
        self.logs = logs
        self._ends: dict[str, float] = {}
        """Running bare pods by uid: the monotonic time their containers end (``_complete``)."""
        self._restarts: dict[str, tuple[int, float]] = {}
        """Crash-looping plugin containers by pod uid: (restarts so far, monotonic time of the next restart)."""
        self._refused: set[str] = set()
        """Pending pods by uid whose FailedCreatePodSandBox event is posted (once: ``_start``)."""
        self.core = api(kubeconfig)
        self.nodes_api = client.NodeV1Api(self.core.api_client)
        self.faults = FaultFile(state_dir)
        self._handlers: dict[str, str] = {}
        """Every RuntimeClass's handler as last listed: a running pod keeps the handler its sandbox was created
        with after its RuntimeClass is deleted, and the API server admits no new pod naming a missing one
        (kubernetes plugin/pkg/admission/runtimeclass/admission.go ``prepareObjects``)."""

    def sync(self) -> None:
        """One pass: what every node should advertise, patched where the Node says otherwise."""
        pods = listed(self.core.list_pod_for_all_namespaces, field_selector="status.phase=Running")
        classes = listed(self.nodes_api.list_runtime_class)
        self._handlers.update({c["metadata"]["name"]: c["handler"] for c in classes})
        handlers = dict(self._handlers)
        objs = listed(self.core.list_node)
        current = {o["metadata"]["name"]: _advertised(o) for o in objs}
        nodes = observed_nodes(self.state_dir)  # with the real talosctl: as simnode observes it
        down = self._follow_kubelets(objs, nodes)
        nodes = [n for n in nodes if n.name not in down]  # no kubelet there: nothing changes until it is back
        self._follow_runtimes(objs, nodes)
        self._follow_boots(objs, nodes)
        by_name = {n.name: n for n in nodes}
        pods = [p for p in pods if (p.get("spec") or {}).get("nodeName") not in down]
        self._repost_readiness(pods, {o["metadata"]["name"] for o in objs if _node_ready(o)})
        pending = listed(self.core.list_pod_for_all_namespaces, field_selector="status.phase=Pending")
        pending = [p for p in pending if (p.get("spec") or {}).get("nodeName") not in down]
        self._start(pending, by_name, handlers)
        self._retry_pulls(pending, by_name)
        plugin_pods = [p for p in pods if _is_plugin(p) and self._admitted(p, by_name)]
        wanted = [(n.name, *_gpus(n, plugin_pods, handlers)) for n in nodes if n.name in current]
        self.each(lambda w: self._advertise(*w), [w for w in wanted if current[w[0]] != w[1:]])
        self._room_for_pods(objs, by_name)
        self._complete(pods, by_name, handlers)
        placed = [(p, by_name.get((p.get("spec") or {}).get("nodeName", ""))) for p in plugin_pods]
        self.each(
            lambda job: self._plugin(job[0], job[1], _handler(job[0], handlers, job[1])),
            [(pod, on) for pod, on in placed if on is not None],
        )

    def _room_for_pods(self, objs: list[dict[str, Any]], nodes: dict[str, SimNode]) -> None:
        """Each Node's ``pods`` capacity as ``pod_room`` says, patched where it differs (the fault switches)."""
        for obj in objs:
            node = nodes.get(obj["metadata"]["name"])
            have = ((obj.get("status") or {}).get("allocatable") or {}).get("pods")
            if node is not None and have != pod_room(node):
                room = {"pods": pod_room(node)}
                body = {"status": {"capacity": room, "allocatable": room}}
                self.core.patch_node_status(node.name, body)
                log.info("node %s: room for %s pods", node.name, room["pods"])

    def _follow_kubelets(self, objs: list[dict[str, Any]], nodes: list[SimNode]) -> set[str]:
        """The nodes whose kubelet is stopped now (``kubelet_stopped``). kwok plays a
        node's kubelet only while the Node carries ``KUBELET_LABEL``, so the label goes while the node is down
        and comes back with it: the node lifecycle controller then sees what a real kubelet's absence shows."""
        down = {n.name for n in nodes if kubelet_stopped(n, self.faults.read())}
        known = {n.name for n in nodes}
        for obj in objs:
            name = obj["metadata"]["name"]
            want = None if name in down else KUBELET_RUNNING
            if name in known and (obj["metadata"].get("labels") or {}).get(KUBELET_LABEL) != want:
                self.core.patch_node(name, {"metadata": {"labels": {KUBELET_LABEL: want}}})
                log.info("node %s: kubelet %s", name, "stopped (node down)" if want is None else "running")
        return down

    def _follow_boots(self, objs: list[dict[str, Any]], nodes: list[SimNode]) -> None:
        """``status.nodeInfo.bootID`` of each Node whose kubelet runs: its node's boot ID, as the kubelet posts the
        kernel's (kubernetes@v1.35.0 pkg/kubelet/nodestatus/setters.go:243-254, read from
        /proc/sys/kernel/random/boot_id, the file simnode serves). A rebooting node's Node keeps the old one until
        its kubelet is back (``nodes`` holds only those whose kubelet runs)."""
        posted = {
            o["metadata"]["name"]: ((o.get("status") or {}).get("nodeInfo") or {}).get("bootID") for o in objs
        }
        for node in nodes:
            boot = node.kernel_boot_id()
            if node.name in posted and posted[node.name] != boot:
                self.core.patch_node_status(node.name, {"status": {"nodeInfo": {"bootID": boot}}})
                log.info("node %s: boot ID %s", node.name, boot)

    def _follow_runtimes(self, objs: list[dict[str, Any]], nodes: list[SimNode]) -> None:
        """``kwokstages.RUNTIME_LABEL`` on the Nodes whose containerd CRI does not load (``kubelet.cri_down``),
        off the others: kwok's ``node-runtime-down`` stage then posts the kubelet's Ready=False "container
        runtime is down", and its ``node-initialize`` stage Ready again once the label is off."""
        labels = {o["metadata"]["name"]: o["metadata"].get("labels") or {} for o in objs}
        for node in nodes:
            want = kwokstages.RUNTIME_DOWN if cri_down(runtime(node)) else None
            if node.name in labels and labels[node.name].get(kwokstages.RUNTIME_LABEL) != want:
                self.core.patch_node(node.name, {"metadata": {"labels": {kwokstages.RUNTIME_LABEL: want}}})
                log.info("node %s: container runtime %s", node.name, "down" if want else "up")

    def _repost_readiness(self, pods: list[dict[str, Any]], ready_nodes: set[str]) -> None:
        """A kubelet back on a Ready node posts its pods' readiness again, which the node lifecycle controller
        had set False while the node was out (``_marked_not_ready``); kwok's stages never revisit a Running
        pod."""

        def repost(pod: dict[str, Any]) -> None:
            meta = pod["metadata"]
            body = {"status": {"conditions": _readiness(pod, True)}}
            self.core.patch_namespaced_pod_status(meta["name"], meta["namespace"], body)

        back = (
            p for p in pods if (p.get("spec") or {}).get("nodeName") in ready_nodes and _marked_not_ready(p)
        )
        self.each(repost, back)

    def _admitted(self, pod: dict[str, Any], nodes: dict[str, SimNode]) -> bool:
        on = nodes.get((pod.get("spec") or {}).get("nodeName", ""))
        return on is None or self.admits(pod, on)

    def _start(self, pods: list[dict[str, Any]], nodes: dict[str, SimNode], handlers: dict[str, str]) -> None:
        """Each Pending pod kwok created a sandbox address for is judged here before any container stage of
        kwok's may select it (``kwokstages.SANDBOX``): no runtime handler (``_no_sandbox``), an image that does
        not pull (``_pull_failed``), a device plugin that crashes at once (``_plugin``) or a bare pod none of whose
        containers can start (``_never_starts``) get what the node's kubelet reports, never Ready; the others are
        let start. The sandbox is retried each pass, as the kubelet retries it."""
        waiting = {p["metadata"]["uid"] for p in pods}
        self._refused &= waiting
        cluster = self.faults.read()
        self.each(lambda pod: self._start_one(pod, nodes, handlers, cluster), filter(_awaiting_start, pods))

    def _start_one(
        self,
        pod: dict[str, Any],
        nodes: dict[str, SimNode],
        handlers: dict[str, str],
        cluster: dict[str, Any],
    ) -> None:
        """One pod of ``_start`` (the pods are judged side by side: each only touches its own entries)."""
        on = nodes.get((pod.get("spec") or {}).get("nodeName", ""))
        handler = _handler(pod, handlers, on) if on is not None else ""
        if on is not None and handler not in runtime(on).cri_runtime_handlers:
            if pod["metadata"]["uid"] not in self._refused:
                self._refused.add(pod["metadata"]["uid"])
                self._no_sandbox(pod, handler)
            return
        image = _failing_image(pod, on, cluster) if on is not None else None
        if image is not None:
            self._pull_failed(pod, image, rate_limited(image, on, cluster) if on is not None else False)
        elif on is None or not self._started_by_agent(pod, on, handler):
            meta = pod["metadata"]
            body = {"status": {"conditions": [_sandbox(True)]}}
            self.core.patch_namespaced_pod_status(meta["name"], meta["namespace"], body)

    def _started_by_agent(self, pod: dict[str, Any], node: SimNode, handler: str) -> bool:
        """The pods whose start the agent posts itself, not kwok's pod-ready stage (which would report them Ready
        first): a device plugin that would exit at once goes straight into CrashLoopBackOff (phase Running, never
        Ready), a bare pod none of whose containers can start straight to Failed."""
        view = NodeView(node, runtime(node), "")
        if _is_plugin(pod) and self.admits(pod, node):
            container = next(c for c in pod["spec"]["containers"] if c["name"] in PLUGIN_CONTAINERS)
            outcome = program(pod, container, view, handler, 1)
            if outcome.exit_code is None and outcome.start_error is None:
                return False
            self._plugin(pod, node, handler, {"phase": "Running"})
            return True
        outcomes = [(c["name"], program(pod, c, view, handler, 1)) for c in pod["spec"]["containers"]]
        never = _never_starts(pod, outcomes)
        if never:
            self._finish(pod, node, outcomes)
        return never

    def _pull_failed(self, pod: dict[str, Any], image: str, limited: bool) -> None:
        """What the kubelet shows after the first failed pull and its back-off: the container waiting in
        ImagePullBackOff, the events Pulling, Failed (the registry's error), Failed "Error: ErrImagePull", BackOff
        and Failed "Error: ImagePullBackOff" (kubernetes@v1.35.0 pkg/kubelet/images/image_manager.go; the texts
        are kubelet.py's, ``pull_failure``). Simplified: the pull is retried every pass, not with back-off."""
        meta = pod["metadata"]
        backoff = f'Back-off pulling image "{image}"'
        pulling = {"waiting": {"reason": "ImagePullBackOff", "message": pull_backoff(image, limited)}}
        creating = {"waiting": {"reason": "ContainerCreating"}}
        statuses = [
            {"name": c["name"], "image": c.get("image", ""), "imageID": "", "ready": False, "restartCount": 0,
             "started": False, "state": pulling if c.get("image") == image else creating}
            for c in pod["spec"]["containers"]
        ]  # fmt: skip
        conditions = [c for c in _readiness(pod, False) if c["type"] != "Initialized"]
        conditions += [{"type": "Initialized", "status": "False", "reason": PULL_FAILED}, _sandbox(True)]
        status = {"phase": "Pending", "containerStatuses": statuses, "conditions": conditions}
        self.core.patch_namespaced_pod_status(meta["name"], meta["namespace"], {"status": status})
        for reason, message, kind in (
            ("Pulling", f'Pulling image "{image}"', "Normal"),
            ("Failed", pull_failure(image, limited), "Warning"),
            ("Failed", "Error: ErrImagePull", "Warning"),
            ("BackOff", backoff, "Normal"),
            ("Failed", "Error: ImagePullBackOff", "Warning"),
        ):
            self._kubelet_event(pod, reason, message, kind)

    def _retry_pulls(self, pending: list[dict[str, Any]], nodes: dict[str, SimNode]) -> None:
        """A pod in image-pull back-off whose images the node can pull now (the fault cleared) starts: its
        Initialized condition goes back to what kwok's pod-create posted (True, or False until its init
        containers ran), and kwok's stages run it from there."""
        cluster = self.faults.read()
        for pod in pending:
            on = nodes.get((pod.get("spec") or {}).get("nodeName", ""))
            conditions = (pod.get("status") or {}).get("conditions") or []
            backing_off = any(
                c.get("type") == "Initialized" and c.get("reason") == PULL_FAILED for c in conditions
            )
            if on is not None and backing_off and _failing_image(pod, on, cluster) is None:
                kept = [c for c in conditions if c.get("type") != "Initialized"]
                now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
                initialized = {"type": "Initialized", "status": "True", "lastTransitionTime": now}
                if (pod.get("spec") or {}).get("initContainers"):
                    initialized |= {"status": "False", "reason": "ContainersNotInitialized"}
                meta = pod["metadata"]
                body = {"status": {"conditions": [*kept, initialized]}}
                self.core.patch_namespaced_pod_status(meta["name"], meta["namespace"], body)

    def _kubelet_event(self, pod: dict[str, Any], reason: str, message: str, kind: str) -> None:
        """An event about ``pod`` as its node's kubelet records it."""
        meta = pod["metadata"]
        event = {
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "kind": "Pod",
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta["uid"],
            },
            "reason": reason,
            "message": message,
            "type": kind,
            "source": {"component": "kubelet", "host": pod["spec"]["nodeName"]},
        }
        self.core.create_namespaced_event(meta["namespace"], event)  # type: ignore[arg-type]

    def _no_sandbox(self, pod: dict[str, Any], handler: str) -> None:
        """What the kubelet reports when containerd has no runtime ``handler`` (the toolkit extension is
        missing): the pod stays Pending, its containers ContainerCreating, and a FailedCreatePodSandBox event
        carries containerd 2.x's error (wording: reality-gaps.md §3 item 8; Talos 1.12 ships containerd 2.1)."""
        meta = pod["metadata"]
        sandbox = hashlib.sha256(meta["uid"].encode()).hexdigest()
        message = (
            "Failed to create pod sandbox: rpc error: code = Unknown desc = unable to get OCI runtime for "
            f'sandbox "{sandbox}": no runtime for "{handler}" is configured'
        )
        waiting = {"waiting": {"reason": "ContainerCreating"}}
        statuses = [
            {"name": c["name"], "image": c.get("image", ""), "imageID": "", "ready": False, "restartCount": 0,
             "started": False, "state": waiting}
            for c in pod["spec"]["containers"]
        ]  # fmt: skip
        # PodReadyToStartContainers False, as a real kubelet reports it here, keeps every container stage of
        # kwok's off the pod (kwokstages.SANDBOX).
        conditions = [*_readiness(pod, False), _sandbox(False)]
        status = {"phase": "Pending", "containerStatuses": statuses, "conditions": conditions}
        self.core.patch_namespaced_pod_status(meta["name"], meta["namespace"], {"status": status})
        self._kubelet_event(pod, "FailedCreatePodSandBox", message, "Warning")

    def _plugin(
        self, pod: dict[str, Any], node: SimNode, handler: str, starting: dict[str, Any] | None = None
    ) -> None:
        """The device plugin exits 1 where NVML does not initialise (its ``fail-on-init-error`` defaults to
        true: NVIDIA/k8s-device-plugin@v0.18.0 cmd/nvidia-device-plugin/main.go), so the kubelet restarts it
        with back-off; at each restart it runs again against the node's state as it is then. ``starting``: the
        status fields of its first start, which the agent posts instead of kwok (``_start``)."""
        container = next(c for c in pod["spec"]["containers"] if c["name"] in PLUGIN_CONTAINERS)
        outcome = program(pod, container, NodeView(node, runtime(node), ""), handler, 1)
        meta = pod["metadata"]
        unhealthy = unhealthy_log(node) if outcome.registers and not healthy_gpus(node, 1) else ""
        self.logs.put(meta["namespace"], meta["name"], PLUGIN_CONTAINER, outcome.log + unhealthy)
        restarts, due = self._restarts.get(meta["uid"], (-1, 0.0))
        crashing = outcome.exit_code is not None or outcome.start_error is not None
        if time.monotonic() < due or (not crashing and restarts < 0):
            return  # in back-off, or running fine since it started
        if crashing:
            restarts += 1
            self._restarts[meta["uid"]] = (restarts, time.monotonic() + backoff_seconds(restarts))
        else:
            del self._restarts[meta["uid"]]
            restarts += 1  # this restart is the one that works
        crash = outcome if crashing else None
        status = {"containerStatuses": [_container_status(pod, container["name"], max(restarts, 0), crash)]}
        status["conditions"] = _readiness(pod, not crashing)
        if starting is not None:
            status |= starting
            status["conditions"].append(_sandbox(True))
        self.core.patch_namespaced_pod_status(meta["name"], meta["namespace"], {"status": status})

    def _complete(
        self, pods: list[dict[str, Any]], nodes: dict[str, SimNode], handlers: dict[str, str]
    ) -> None:
        """Each bare pod ends once it ran its run time (``kwokstages.run_seconds``: scaled by the time factor as
        kwok's stages are), counted from the pass that first saw it running; before, at the next pass."""
        now, running, due = time.monotonic(), set(), []
        for pod in pods:
            on = nodes.get((pod.get("spec") or {}).get("nodeName", ""))
            if on is None or not _runs_to_completion(pod):
                continue
            uid = pod["metadata"]["uid"]
            running.add(uid)
            ends = self._ends.setdefault(uid, now + kwokstages.run_seconds(pod, time_factor()))
            if now >= ends:
                due.append((pod, on, _handler(pod, handlers, on)))
        self.each(lambda job: self._run_to_completion(*job), due)
        self._ends = {uid: t for uid, t in self._ends.items() if uid in running}

    def _run_to_completion(self, pod: dict[str, Any], node: SimNode, handler: str) -> None:
        """A pod that kwok started and that ends by itself: what its containers print and exit with on this
        node (``containers.program``), recorded for its logs, then its final phase.
        A container that keeps running leaves the pod Running."""
        view = NodeView(node, runtime(node), "")
        outcomes = [(c["name"], program(pod, c, view, handler, 1)) for c in pod["spec"]["containers"]]
        if not any(o.exit_code is None and o.start_error is None for _, o in outcomes):
            self._finish(pod, node, outcomes)

    def _finish(self, pod: dict[str, Any], node: SimNode, outcomes: list[tuple[str, Outcome]]) -> None:
        """The containers' logs recorded and the pod's final phase posted (``_final_status``)."""
        meta = pod["metadata"]
        for name, outcome in outcomes:
            self.logs.put(meta["namespace"], meta["name"], name, outcome.log)
        body = {"status": _final_status(pod, outcomes)}
        self.core.patch_namespaced_pod_status(meta["name"], meta["namespace"], body)
        log.info("pod %s/%s on %s: %s", meta["namespace"], meta["name"], node.name, body["status"]["phase"])

    def _advertise(self, name: str, count: int, healthy: int) -> None:
        # null removes the resource. Simplified: a real kubelet drops it from capacity only once the stopped
        # plugin's endpoint expires (kubernetes@v1.35.0 pkg/kubelet/cm/devicemanager, endpointStopGracePeriod).
        value = str(count) if count else None
        allocatable = str(healthy) if count else None
        body = {"status": {"capacity": {GPU_RESOURCE: value}, "allocatable": {GPU_RESOURCE: allocatable}}}
        self.core.patch_node_status(name, body)
        log.info("node %s advertises %s %s (%s healthy)", name, count, GPU_RESOURCE, healthy)
