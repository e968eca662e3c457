"""What the kubernetes step says about a GPU node without ``nvidia.com/gpu``, on objects shaped as the real API
returns them (issue 15), and what the real control plane does with the runbook's pods.

The diagnosis tests build the step's context from ``params/simulated.yaml`` and hand it a Kubernetes client
that answers with fixed objects: the Node and the device-plugin pod exactly as kube-apiserver v1.35 serves them
when the node lifecycle controller gave up on the kubelet, when the kubelet cannot pull the plugin's image, or
when kube-scheduler cannot place the plugin's pod. The slow tests run the real control plane
(``make kube-tools``; skipped, saying what to build, without it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from runbook_lib.clients.helm import Helm
from runbook_lib.clients.proc import Journal
from runbook_lib.clients.talosctl import Talosctl
from runbook_lib.model.params import load_params
from runbook_lib.model.plan import build_plan
from runbook_lib.steps.context import Context, Endpoints
from runbook_lib.steps.kubernetes import _no_gpu_diagnosis
from runbook_lib.steps.results import Check
from tests.sim.test_sim_up_real_kube import tools as tools  # noqa: PLC0414  (the module-scoped fixture)
from tests.sim.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
NODE = "gpu-worker-3"
PLUGIN_IMAGE = "nvcr.io/nvidia/k8s-device-plugin:v0.17.2"


class FixedKube:
    """The three reads ``_no_gpu_diagnosis`` makes, answered from fixed objects."""

    def __init__(self, pods: list[dict[str, Any]], events: list[dict[str, Any]] | None = None) -> None:
        self._pods = pods
        self._events = events or []

    def daemonsets(self, namespace: str, label_selector: str | None = None) -> list[dict[str, Any]]:
        # Three GPU workers in the DaemonSet's reach: the chart's affinity matched, the pods exist.
        return [{"metadata": {"name": "nvidia-device-plugin"}, "status": {"desiredNumberScheduled": 4}}]

    def pods(self, namespace: str, label_selector: str | None = None) -> list[dict[str, Any]]:
        return [p for p in self._pods if p["metadata"]["namespace"] == namespace]

    def events_for(self, namespace: str, kind: str, name: str) -> list[dict[str, Any]]:
        return [e for e in self._events if e["involvedObject"]["name"] == name]


def context(kube: FixedKube) -> Context:
    params = load_params(ROOT / "params" / "simulated.yaml")
    journal = Journal()
    endpoints = Endpoints("talosctl", "helm", None, None, "https://factory.talos.dev")
    ctx = Context(
        params=params,
        plan=build_plan(params),
        endpoints=endpoints,
        journal=journal,
        talosctl=Talosctl("talosctl"),
        helm=Helm("helm"),
    )
    ctx._kube = kube  # type: ignore[assignment]  # the reads the diagnosis makes, nothing else
    return ctx


def node_object(ready: dict[str, str], taints: list[dict[str, str]] | None = None) -> dict[str, Any]:
    """A GPU worker's Node as the API serves it: labelled for the chart, no nvidia.com/gpu."""
    return {
        "metadata": {
            "name": NODE,
            "labels": {"kubernetes.io/hostname": NODE, "nvidia.com/gpu.present": "true"},
        },
        "spec": {"taints": taints or []},
        "status": {
            "allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"},
            "conditions": [
                {"type": "MemoryPressure", "status": ready["status"], "reason": ready["reason"]},
                {"type": "Ready", **ready, "lastHeartbeatTime": "2026-12-02T01:40:00Z"},
            ],
        },
    }


#: What the node lifecycle controller writes once the kubelet's Lease and status stop for the grace period
#: (kubernetes@v1.35.0 pkg/controller/nodelifecycle/node_lifecycle_controller.go:966-971), and the taints it
#: adds (pkg/controller/nodelifecycle: UnreachableTaintTemplate, node.kubernetes.io/unreachable).
STOPPED_POSTING = {
    "status": "Unknown",
    "reason": "NodeStatusUnknown",
    "message": "Kubelet stopped posting node status.",
}
UNREACHABLE = [
    {"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule", "timeAdded": "2026-12-02T01:41:00Z"},
    {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute", "timeAdded": "2026-12-02T01:41:05Z"},
]
READY = {"status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status"}


def owner(daemonset: str) -> dict[str, Any]:
    """The owner reference the DaemonSet controller gives each pod it creates (kubernetes@v1.35.0
    pkg/controller/daemon/daemon_controller.go, ``metav1.NewControllerRef``)."""
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "name": daemonset,
        "uid": "5d1c7c5e-8b0e-4a36-9c55-0f5a3c1e2b7d",
        "controller": True,
        "blockOwnerDeletion": True,
    }


def plugin_pod(status: dict[str, Any], *, bound: bool = True) -> dict[str, Any]:
    """The chart's DaemonSet pod for NODE (the DaemonSet controller pins it with a matchFields affinity; the
    scheduler sets nodeName once it binds it)."""
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}
                ]
            }
        }
    }
    spec: dict[str, Any] = {
        "affinity": affinity,
        "containers": [{"name": "nvidia-device-plugin-ctr", "image": PLUGIN_IMAGE}],
    }
    if bound:
        spec["nodeName"] = NODE
    return {
        "metadata": {
            "name": "nvidia-device-plugin-x7k2p",
            "namespace": "kube-system",
            "labels": {"app.kubernetes.io/instance": "nvidia-device-plugin"},
            "ownerReferences": [owner("nvidia-device-plugin")],
        },
        "spec": spec,
        "status": status,
    }


def diagnose(
    node: dict[str, Any], pods: list[dict[str, Any]], events: list[dict[str, Any]] | None = None
) -> Check:
    return _no_gpu_diagnosis(context(FixedKube(pods, events)), node)


def running_plugin() -> dict[str, Any]:
    return plugin_pod(
        {
            "phase": "Running",
            "conditions": [
                {"type": "Ready", "status": "False"},
                {"type": "ContainersReady", "status": "True"},
            ],
            "containerStatuses": [
                {
                    "name": "nvidia-device-plugin-ctr",
                    "ready": True,
                    "state": {"running": {}},
                    "restartCount": 0,
                }
            ],
        }
    )


def test_a_node_whose_kubelet_stopped_posting_is_diagnosed_as_not_ready_not_as_a_plugin_without_gpus() -> (
    None
):
    """The node lifecycle controller set Ready Unknown and tainted the node unreachable; the plugin pod it ran
    still shows Running (only its Ready condition went False: MarkPodsNotReady). Before, the diagnosis said "the
    device plugin runs but the node advertises no GPUs" and sent the user to the plugin's logs, which a node
    without a kubelet cannot serve."""
    check = diagnose(node_object(STOPPED_POSTING, UNREACHABLE), [running_plugin()])
    assert not check.ok
    assert "not Ready" in check.message and "Kubelet stopped posting node status." in check.message
    assert "device plugin runs" not in check.message
    assert "kubelet" in check.cause
    assert "talosctl -n 10.5.0.13 service kubelet" in check.fix  # the node's address in params/simulated.yaml


def test_a_node_whose_kubelet_reports_not_ready_is_diagnosed_with_the_kubelets_own_message() -> None:
    """Ready False comes from the kubelet itself (e.g. its runtime's network is not ready: kubernetes@v1.35.0
    pkg/kubelet/nodestatus/setters.go ReadyCondition, reason KubeletNotReady); the diagnosis quotes it."""
    not_ready = {
        "status": "False",
        "reason": "KubeletNotReady",
        "message": "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady "
        "message:Network plugin returns error: cni plugin not initialized",
    }
    check = diagnose(node_object(not_ready), [running_plugin()])
    assert not check.ok and "not Ready" in check.message
    assert "cni plugin not initialized" in check.message


#: The kubelet's waiting message during image-pull back-off: "Back-off pulling image %q" wrapped with the last
#: pull's error, "<ErrImagePull>: <the CRI's message>" (kubernetes@v1.35.0 pkg/kubelet/images/image_manager.go:
#: 336-348 and 362-367; ErrImagePull is "ErrImagePull", pkg/kubelet/images/types.go:35). The CRI message is
#: containerd's for a tag the registry does not have (reality-gaps.md §3 item 8).
PULL_ERROR = (
    f'rpc error: code = NotFound desc = failed to pull and unpack image "{PLUGIN_IMAGE}": failed to resolve '
    f'reference "{PLUGIN_IMAGE}": {PLUGIN_IMAGE}: not found'
)
BACKING_OFF = f'Back-off pulling image "{PLUGIN_IMAGE}": ErrImagePull: {PULL_ERROR}'


def pulling_plugin(reason: str, message: str) -> dict[str, Any]:
    return plugin_pod(
        {
            "phase": "Pending",
            "conditions": [
                {"type": "PodReadyToStartContainers", "status": "True"},
                {"type": "Initialized", "status": "True"},
                {
                    "type": "Ready",
                    "status": "False",
                    "reason": "ContainersNotReady",
                    "message": "containers with unready status: [nvidia-device-plugin-ctr]",
                },
                {"type": "PodScheduled", "status": "True"},
            ],
            "containerStatuses": [
                {
                    "name": "nvidia-device-plugin-ctr",
                    "image": PLUGIN_IMAGE,
                    "imageID": "",
                    "ready": False,
                    "restartCount": 0,
                    "started": False,
                    "state": {"waiting": {"reason": reason, "message": message}},
                }
            ],
        }
    )


def test_a_plugin_in_image_pull_back_off_is_diagnosed_as_an_image_pull_failure_quoting_the_kubelet() -> None:
    """Before: "the device plugin runs but the node advertises no GPUs", while it never started."""
    check = diagnose(node_object(READY), [pulling_plugin("ImagePullBackOff", BACKING_OFF)])
    assert not check.ok
    assert "device plugin runs" not in check.message
    assert "ImagePullBackOff" in check.message and BACKING_OFF in check.message
    assert "image" in check.cause
    assert "kubectl -n kube-system describe pod nvidia-device-plugin-x7k2p" in check.fix


def test_a_plugin_failing_its_first_pull_is_diagnosed_the_same_way() -> None:
    """Between the failed pull and the back-off the container waits in ErrImagePull with the CRI's message
    (image_manager.go:362-369 returns it as the waiting message)."""
    check = diagnose(node_object(READY), [pulling_plugin("ErrImagePull", PULL_ERROR)])
    assert not check.ok and "ErrImagePull" in check.message and PULL_ERROR in check.message


#: kube-scheduler's FitError for the DaemonSet pod of a node with no room: "0/%v nodes are available: ..." with
#: the filters' reasons and the preemption's (kubernetes@v1.35.0 pkg/scheduler/framework/types.go:784-860,
#: "Too many pods" pkg/scheduler/framework/plugins/noderesources/fit.go:652-660), as the PodScheduled
#: condition's message (reason Unschedulable).
UNSCHEDULABLE = (
    "0/5 nodes are available: 1 Too many pods, 4 node(s) didn't match Pod's node affinity/selector. "
    "preemption: 0/5 nodes are available: 1 No preemption victims found for incoming pod, "
    "4 Preemption is not helpful for scheduling."
)


def test_a_plugin_pod_the_scheduler_cannot_place_is_diagnosed_with_the_schedulers_message() -> None:
    status = {
        "phase": "Pending",
        "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": UNSCHEDULABLE}
        ],
    }
    check = diagnose(node_object(READY), [plugin_pod(status, bound=False)])
    assert not check.ok
    assert UNSCHEDULABLE in check.message and "device plugin runs" not in check.message
    assert "kubectl -n kube-system describe pod nvidia-device-plugin-x7k2p" in check.fix


def test_a_ready_node_with_a_running_plugin_keeps_the_plugin_diagnosis() -> None:
    """The diagnosis that was right stays: a Ready node whose plugin runs and registers nothing."""
    ready_plugin = running_plugin()
    ready_plugin["status"]["conditions"][0]["status"] = "True"
    check = diagnose(node_object(READY), [ready_plugin])
    assert not check.ok and "the device plugin runs but the node advertises no GPUs" in check.message


# ---------------------------------------------------------------- on the real control plane (slow)

#: A GPU workload that takes its time to stop: a real kubelet keeps a deleted pod (Terminating, deletionTimestamp
#: set) until its containers exited or the grace period ended, then deletes it (kubernetes@v1.35.0
#: pkg/kubelet/status/status_manager.go ``canBeDeleted``); until then kube-scheduler counts its nvidia.com/gpu as
#: used. kwok, the simulated kubelet, deletes a Terminating pod after its pod-delete stage's delay, which the
#: annotation sets, plus a jitter up to the deletionTimestamp (sigs.k8s.io/kwok@v0.8.0
#: kustomize/stage/pod/general/pod-delete.yaml, pkg/utils/lifecycle/lifecycle.go ``Delay``): 15-30 s here.
GRACE_S = 30
HOLDER = "gpu-holder"


def gpu_holder(node: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": HOLDER, "annotations": {"pod-delete.stage.kwok.x-k8s.io/delay": "15s"}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "terminationGracePeriodSeconds": GRACE_S,
            "containers": [
                {
                    "name": "app",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                }
            ],
        },
    }


def terminating(state: Path) -> None:
    """On gpu-worker-1 (its one GPU advertised): a pod holding the GPU is deleted with its grace period and shows
    Terminating; cuda-test started meanwhile waits for it (its GPU pods Pending, "Insufficient nvidia.com/gpu")
    and passes once the simulated kubelet finished the deletion."""
    from kubernetes.client.exceptions import ApiException

    from runbook_lib.steps.context import connect
    from runbook_lib.steps.cudatest import cuda_test
    from tests.sim.test_real_talos_113 import core_api, pod_phase

    api = core_api(state)
    api.create_namespaced_pod("default", gpu_holder("gpu-worker-1"))
    wait_for(lambda: pod_phase(api, HOLDER) == "Running", timeout=180)
    deleted = api.delete_namespaced_pod(HOLDER, "default")  # kubectl delete pod: the pod's own grace period
    assert deleted.metadata.deletion_timestamp is not None, deleted.metadata
    assert deleted.metadata.deletion_grace_period_seconds == GRACE_S
    assert api.read_namespaced_pod(HOLDER, "default").metadata.deletion_timestamp  # Terminating, still there
    ctx = connect(load_params(ROOT / "params" / "simulated.yaml"), state_dir=state)
    result = cuda_test(ctx, only=["gpu-worker-1"], apply=True, node_drivers={})
    assert result.ok, result.to_dict()
    waited = [
        e.message
        for e in api.list_namespaced_event("default").items
        if e.reason == "FailedScheduling" and e.involved_object.name.startswith("cuda-gpu-gpu-worker-1-")
    ]
    assert any("Insufficient nvidia.com/gpu" in m for m in waited), waited

    def gone() -> bool:
        try:
            api.read_namespaced_pod(HOLDER, "default")
        except ApiException as exc:
            return exc.status == 404
        return False

    wait_for(gone, timeout=GRACE_S + 60)


#: ``runbook sim fault gpu-worker-2 pods_pending true``, run beside gpu-worker-3's image-pull fault by
#: ``tests/sim/test_real_kube_nodes.py`` (one control plane for both).
PENDING = {"gpu-worker-2": "pods_pending"}
Outcome = tuple[dict[str, str], list[tuple[str, str, list[str]]]]


def assert_pending_quotes_the_scheduler(real: Outcome, python: Outcome) -> Outcome:
    """The ``pods_pending`` node on the real control plane: the node takes no more pods
    (``nodeagent.pod_room``), so kube-scheduler leaves its device-plugin pod Pending and the kubernetes step
    fails on it, as on the Python API server (whose kubelet never starts the node's pods), with the scheduler's
    own message. Before, the fault did nothing on the real control plane: the plugin ran there and the run went
    on (failed first: ``{'kubernetes': 'changed', 'cuda-test': 'ok'}``). Returns ``real`` without that node."""
    [node] = PENDING
    assert real[0] == python[0], (real, python)
    assert [n for n, _, _ in real[1]] == [n for n, _, _ in python[1]], (real, python)
    said = " ".join(checks for n, _, messages in real[1] if n == node for checks in messages)
    assert f"device plugin pod for {node} is not scheduled: 0/" in said, said
    assert "Too many pods" in said, said
    # gpu-worker-3's image-pull fault, in the kubelet's words on both API servers (the comparison checks they agree)
    pulled = " ".join(message for n, _, messages in real[1] if n == "gpu-worker-3" for message in messages)
    assert "waits in ImagePullBackOff: Back-off pulling image" in pulled, pulled
    assert ": ErrImagePull: rpc error: code = NotFound" in pulled, pulled
    return real[0], [entry for entry in real[1] if entry[0] != node]


# ---------------------------------------------------------------- the cuda-test step's pods


def test_a_cuda_test_pod_left_pending_by_the_scheduler_is_diagnosed_with_the_schedulers_message() -> None:
    """A GPU test pod kube-scheduler cannot place (the node's GPU held by another pod) ends the step "still
    Pending": the reason must say why, in the scheduler's words, as the PodScheduled condition carries them.
    Before, the message was only "pod still Pending after 300 s" (the reason at best in the evidence)."""
    from runbook_lib.steps.cudatest import _judge, build_pods

    ctx = context(FixedKube([]))
    node = next(n for n in ctx.params.nodes if n.name == NODE)
    pod = next(p for p in build_pods(ctx, [node], "abc123") if p.kind == "gpu")
    # kube-scheduler 1.35's text for a resource no node has free, with the DRA clause (reality-gaps.md §3 item 8).
    insufficient = (
        "0/5 nodes are available: 1 Insufficient nvidia.com/gpu, 4 node(s) didn't match Pod's node "
        "affinity/selector. no new claims to deallocate, preemption: 0/5 nodes are available: 1 No preemption "
        "victims found for incoming pod, 4 Preemption is not helpful for scheduling."
    )
    status = {
        "phase": "Pending",
        "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": insufficient}
        ],
    }
    check = _judge(ctx, pod, {"metadata": {"name": pod.name, "namespace": "default"}, "status": status}, None)
    assert not check.ok and "still Pending" in check.message and insufficient in check.message, check


def test_a_cuda_test_pod_in_image_pull_back_off_is_diagnosed_with_the_kubelets_message() -> None:
    from runbook_lib.steps.cudatest import _judge, build_pods

    ctx = context(FixedKube([]))
    node = next(n for n in ctx.params.nodes if n.name == NODE)
    pod = next(p for p in build_pods(ctx, [node], "abc123") if p.kind == "smi")
    obj = pulling_plugin("ImagePullBackOff", BACKING_OFF)
    obj["metadata"] = {"name": pod.name, "namespace": "default"}
    check = _judge(ctx, pod, obj, None)
    assert not check.ok and "ImagePullBackOff" in check.message and BACKING_OFF in check.message, check
