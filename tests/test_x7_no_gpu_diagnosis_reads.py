"""The kubernetes step's no-GPU diagnosis reads the cluster once per step, not once per GPU-less node.

After waiting for ``nvidia.com/gpu``, the step diagnoses each GPU node that still advertises none. Each
diagnosis listed the device plugin's pods and the release's DaemonSets (and, under the GPU Operator, its
device-plugin DaemonSet, its validator's pods and ``helm get values``) for itself: on a fleet whose driver is
not loaded anywhere that is several API list calls (and a helm process) per node, where the objects are the
same for every node. Here the step's client answers from fixed objects shaped as kube-apiserver v1.35 serves
them (the shapes of tests/sim/test_real_kube_pods.py), counts every read, and each node's diagnosis is compared
with the one the diagnosis gives that node when it reads the cluster for itself.
"""

from __future__ import annotations

import copy
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from runbook_lib.clients.proc import Journal
from runbook_lib.clients.talosctl import Talosctl
from runbook_lib.model.params import validate
from runbook_lib.model.plan import build_plan
from runbook_lib.steps.context import Context, Endpoints
from runbook_lib.steps.kubernetes import OPERATOR_VALIDATOR, _no_gpu_diagnosis, _wait_for_gpus
from runbook_lib.steps.results import StepResult
from tests.sim.test_real_kube_pods import (
    READY,
    STOPPED_POSTING,
    UNREACHABLE,
    node_object,
    owner,
    pulling_plugin,
    running_plugin,
)

ROOT = Path(__file__).resolve().parents[1]
NODES = 30
Obj = dict[str, Any]


class CountingKube:
    """The reads the step makes after its wait, answered from fixed objects; every read counted."""

    def __init__(self, nodes: list[Obj], pods: list[Obj], daemonsets: list[Obj]) -> None:
        self._nodes, self._pods, self._daemonsets = nodes, pods, daemonsets
        self.reads: Counter[str] = Counter()

    def nodes(self, label_selector: str | None = None, **_: Any) -> list[Obj]:
        self.reads["list nodes"] += 1
        return copy.deepcopy(self._nodes)

    def daemonsets(self, namespace: str, label_selector: str | None = None) -> list[Obj]:
        self.reads["list daemonsets"] += 1
        return [d for d in self._daemonsets if _selected(d, namespace, label_selector)]

    def pods(self, namespace: str, label_selector: str | None = None) -> list[Obj]:
        self.reads["list pods"] += 1
        return copy.deepcopy([p for p in self._pods if _selected(p, namespace, label_selector)])


class CountingHelm:
    """``helm get values`` of the release: the runbook's own values (the validator then waits on the node)."""

    def __init__(self) -> None:
        self.reads = 0

    def values(self, name: str, namespace: str) -> Obj:
        self.reads += 1
        return {
            "driver": {"enabled": False},
            "toolkit": {"enabled": False},
            "hostPaths": {"driverInstallDir": "/usr/local"},
        }


def _selected(obj: Obj, namespace: str, selector: str | None) -> bool:
    """``namespace`` and an equality label selector (``key=value``), as the API server filters a list."""
    meta = obj["metadata"]
    if meta["namespace"] != namespace:
        return False
    if not selector:
        return True
    key, value = selector.split("=", 1)
    return (meta.get("labels") or {}).get(key) == value


def _names() -> list[str]:
    return [f"gpu-worker-{i}" for i in range(NODES)]


def _context(talos: str, kube: CountingKube, helm: CountingHelm) -> Context:
    data = yaml.safe_load((ROOT / "params" / "simulated.yaml").read_text())
    data["talos_version"] = talos
    data["nodes"] = [{"name": name, "address": f"10.5.1.{i + 10}"} for i, name in enumerate(_names())]
    params = validate(data, source="test")
    ctx = Context(
        params=params,
        plan=build_plan(params),
        endpoints=Endpoints("talosctl", "helm", None, None, "https://factory.talos.dev"),
        journal=Journal(),
        talosctl=Talosctl("talosctl"),
        helm=helm,  # type: ignore[arg-type]
    )
    ctx._kube = kube  # type: ignore[assignment]
    return ctx


def _node(name: str, ready: dict[str, str], taints: list[dict[str, str]] | None = None) -> Obj:
    """A GPU worker's Node (tests/sim/test_real_kube_pods.py's), named ``name``: labelled for the chart, no
    nvidia.com/gpu."""
    node = node_object(ready, taints)
    node["metadata"]["name"] = node["metadata"]["labels"]["kubernetes.io/hostname"] = name
    return node


def _on(pod: Obj, node: str, namespace: str, labels: dict[str, str], owner_name: str | None = None) -> Obj:
    """``pod`` (a plugin pod of tests/sim/test_real_kube_pods.py) as the DaemonSet's pod for ``node``."""
    pod = copy.deepcopy(pod)
    daemonset = owner_name or labels.get("app", "nvidia-device-plugin")
    pod["metadata"].update(
        name=f"{daemonset}-{node}", namespace=namespace, ownerReferences=[owner(daemonset)]
    )
    pod["metadata"]["labels"] = labels
    pod["spec"]["nodeName"] = node
    terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    terms["nodeSelectorTerms"][0]["matchFields"][0]["values"] = [node]
    return pod


def _fleet(namespace: str, labels: dict[str, str]) -> tuple[list[Obj], list[Obj]]:
    """NODES Nodes and their plugin pods: node 0's kubelet stopped posting, node 1's plugin cannot pull its
    image, the others run a ready plugin that registers nothing (so each diagnosis differs by node)."""
    names = _names()
    nodes = [_node(names[0], STOPPED_POSTING, UNREACHABLE)] + [_node(n, READY) for n in names[1:]]
    ready_plugin = running_plugin()
    ready_plugin["status"]["conditions"][0]["status"] = "True"
    pulling = pulling_plugin("ImagePullBackOff", "Back-off pulling image")
    pods = [_on(pulling if i == 1 else ready_plugin, n, namespace, labels) for i, n in enumerate(names)]
    return nodes, pods


def _selected_by_operator(nodes: list[Obj]) -> list[Obj]:
    """The Nodes as the GPU Operator leaves them: NFD's NVIDIA PCI label and the operator's deploy labels, which
    its device-plugin and validator DaemonSets select on (gpu-operator@v26.3.3 controllers/state_manager.go:90-118)."""
    for node in nodes:
        node["metadata"]["labels"] |= {
            "feature.node.kubernetes.io/pci-10de.present": "true",
            "nvidia.com/gpu.deploy.device-plugin": "true",
            "nvidia.com/gpu.deploy.operator-validator": "true",
        }
    return nodes


def _diagnose_all(ctx: Context) -> StepResult:
    result = StepResult(step="kubernetes", applied=True)
    _wait_for_gpus(ctx, result, list(ctx.params.nodes), timeout_s=0)
    return result


def _alone(ctx: Context, node: Obj) -> dict[str, Any]:
    """The node's diagnosis when it reads the cluster for itself (as before: one set of reads per node)."""
    return _no_gpu_diagnosis(ctx, node).to_dict()


def test_device_plugin_layer_diagnoses_every_gpu_less_node_from_one_read_of_pods_and_daemonsets() -> None:
    nodes, pods = _fleet("kube-system", {"app.kubernetes.io/instance": "nvidia-device-plugin"})
    daemonset = {
        "metadata": {
            "name": "nvidia-device-plugin",
            "namespace": "kube-system",
            "labels": {"app.kubernetes.io/instance": "nvidia-device-plugin"},
        },
        "status": {"desiredNumberScheduled": NODES},
    }
    kube = CountingKube(nodes, pods, [daemonset])
    ctx = _context("v1.12.7", kube, CountingHelm())
    result = _diagnose_all(ctx)
    assert [n.status for n in result.nodes] == ["failed"] * NODES
    assert kube.reads == {"list nodes": 1, "list pods": 1, "list daemonsets": 1}, kube.reads
    for res, node in zip(result.nodes, nodes, strict=True):
        assert [c.to_dict() for c in res.checks] == [_alone(ctx, node)], res.node
    first, second, third = (result.nodes[i].checks[0].message for i in range(3))
    assert "not Ready" in first and "ImagePullBackOff" in second
    assert third == "the device plugin runs but the node advertises no GPUs"


def test_gpu_operator_layer_reads_its_daemonsets_validator_pods_and_release_values_once() -> None:
    """Talos 1.13 (the GPU Operator): every node's validator waits in driver-validation; the release has the
    runbook's values, so each node gets the "node lacks the NVIDIA extensions" diagnosis."""
    namespace = "gpu-operator"
    nodes, pods = _fleet(namespace, {"app": "nvidia-device-plugin-daemonset"})
    nodes = _selected_by_operator(nodes)
    validator: Obj = {
        "spec": {},
        "status": {"initContainerStatuses": [{"name": "driver-validation", "state": {"running": {}}}]},
    }
    for name in _names():
        pod = copy.deepcopy(validator)
        pod["metadata"] = {
            "name": f"{OPERATOR_VALIDATOR}-{name}",
            "namespace": namespace,
            "labels": {"app": OPERATOR_VALIDATOR},
        }
        pod["spec"]["nodeName"] = name
        pods.append(pod)
    plugin = {
        "metadata": {
            "name": "nvidia-device-plugin-daemonset",
            "namespace": namespace,
            "labels": {"app": "nvidia-device-plugin-daemonset"},
        },
        "status": {"desiredNumberScheduled": NODES},
    }
    kube = CountingKube(nodes, pods, [plugin])
    helm = CountingHelm()
    ctx = _context("v1.13.2", kube, helm)
    assert ctx.plan.kubernetes_layer == "gpu-operator" and ctx.plan.helm.namespace == namespace
    result = _diagnose_all(ctx)
    # the plugin's pods, the validator's pods; the release's DaemonSets, the operator's device-plugin DaemonSet
    assert kube.reads == {"list nodes": 1, "list pods": 2, "list daemonsets": 2}, kube.reads
    assert helm.reads == 1
    for res, node in zip(result.nodes, nodes, strict=True):
        assert [c.to_dict() for c in res.checks] == [_alone(ctx, node)], res.node
    assert "driver-validation" in result.nodes[2].checks[0].message


def test_a_node_with_gpus_names_its_gfd_product_in_message_and_data() -> None:
    """The GPU Feature Discovery label (``nvidia.com/gpu.product``) reaches the node's line and its data, and
    a node with GPUs costs no diagnosis read. Node 0's kubelet stopped posting: its Node keeps the GPUs it last
    posted (the node lifecycle controller changes only its conditions, kubernetes v1.35.0
    node_lifecycle_controller.go:938-980), and it fails as not Ready, from what the Node already says."""
    nodes, _pods = _fleet("kube-system", {})
    for node in nodes:
        node["status"]["allocatable"]["nvidia.com/gpu"] = "1"
    nodes[1]["metadata"]["labels"]["nvidia.com/gpu.product"] = "NVIDIA-L4"
    kube = CountingKube(nodes, [], [])
    result = _diagnose_all(_context("v1.12.7", kube, CountingHelm()))
    assert result.nodes[1].message == "1 allocatable nvidia.com/gpu (nvidia.com/gpu.product=NVIDIA-L4)"
    assert result.nodes[1].data["gpu_product"] == "NVIDIA-L4"
    assert (
        result.nodes[2].message == "1 allocatable nvidia.com/gpu"
        and "gpu_product" not in result.nodes[2].data
    )
    assert result.nodes[0].status == "failed", result.nodes[0].to_dict()
    assert result.nodes[0].message.startswith("not Ready: its 1 allocatable nvidia.com/gpu"), result.nodes[
        0
    ].message
    assert kube.reads == {"list nodes": 1}


_BACK_OFF = (
    f"back-off 20s restarting failed container=toolkit-validation pod={OPERATOR_VALIDATOR}-x_gpu-operator(u)"
)


@pytest.mark.parametrize(
    ("state", "how"),
    [
        (
            {"waiting": {"reason": "CrashLoopBackOff", "message": _BACK_OFF}},
            "(CrashLoopBackOff: it exits with an error and is restarted)",
        ),
        # between the failed run and the back-off the kubelet reports the run's end: the container's state is
        # terminated with the exit code (kubernetes@v1.35.0 pkg/kubelet/kubelet_pods.go:2251-2295, convertContainerStatus)
        (
            {"terminated": {"exitCode": 1, "reason": "Error"}},
            "(exited with code 1, Error: it is restarted)",
        ),
    ],
)
def test_a_validator_crash_looping_in_toolkit_validation_is_named_not_sent_to_the_plugins_log(
    state: dict[str, Any], how: str
) -> None:
    """The validator's toolkit-validation runs nvidia-smi once (``WITH_WAIT: "false"``, gpu-operator@v26.3.3
    assets/state-operator-validation/0500_daemonset.yaml:59-69; cmd/nvidia-validator/main.go:1142-1150): failing,
    it exits and the kubelet restarts it with back-off, so its status is waiting in CrashLoopBackOff with the failed
    run as lastState (as the kubelet reports it: kubernetes pkg/kubelet/container/sync_result.go
    ErrCrashLoopBackOff), never running. The step looked only for a running init container and told the user the
    device plugin runs, pointing at its log, which is empty: the plugin's pod waits in its own toolkit-validation.
    The status is written by hand: the simulated operator has no case where toolkit-validation fails alone (a node
    without the toolkit's runtime cannot start the validator's pod at all)."""
    namespace = "gpu-operator"
    nodes, pods = _fleet(namespace, {"app": "nvidia-device-plugin-daemonset"})
    nodes = _selected_by_operator(nodes)
    name = _names()[2]
    done = {"terminated": {"exitCode": 0, "reason": "Completed"}}
    pods.append(
        {
            "metadata": {
                "name": f"{OPERATOR_VALIDATOR}-x",
                "namespace": namespace,
                "labels": {"app": OPERATOR_VALIDATOR},
            },
            "spec": {"nodeName": name},
            "status": {
                "phase": "Pending",
                "initContainerStatuses": [
                    {"name": "driver-validation", "state": done, "ready": True, "restartCount": 0},
                    {
                        "name": "toolkit-validation",
                        "state": state,
                        "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}},
                        "ready": False,
                        "restartCount": 2,
                    },
                    {"name": "cuda-validation", "state": {"waiting": {"reason": "PodInitializing"}}},
                ],
            },
        }
    )
    plugin = {
        "metadata": {"name": "nvidia-device-plugin-daemonset", "namespace": namespace,
                     "labels": {"app": "nvidia-device-plugin-daemonset"}},
        "status": {"desiredNumberScheduled": NODES},
    }  # fmt: skip
    ctx = _context("v1.13.2", CountingKube(nodes, pods, [plugin]), CountingHelm())
    check = _no_gpu_diagnosis(ctx, nodes[2])
    assert check.name == "GPU Operator toolkit validation", check
    assert check.message == (f"{OPERATOR_VALIDATOR} on {name} waits in toolkit-validation {how}")


@pytest.mark.parametrize(
    ("labels", "message"),
    [
        ({}, "has no NFD label for an NVIDIA PCI device (feature.node.kubernetes.io/pci-10de.present)"),
        (
            {"feature.node.kubernetes.io/pci-10de.present": "true"},
            "the GPU Operator has not labelled Node gpu-worker-2 nvidia.com/gpu.deploy.device-plugin=true",
        ),
        # operands disabled on the node: the operator removes every deploy label there
        # (gpu-operator@v26.3.3 controllers/state_manager.go:317-323, 396-402)
        (
            {
                "feature.node.kubernetes.io/pci-10de.present": "true",
                "nvidia.com/gpu.deploy.operands": "false",
            },
            "Node gpu-worker-2 has nvidia.com/gpu.deploy.operands=false",
        ),
        # a deploy label already set is honoured, false too (state_manager.go:411-420 addGPUStateLabels)
        (
            {
                "feature.node.kubernetes.io/pci-10de.present": "true",
                "nvidia.com/gpu.deploy.device-plugin": "false",
            },
            "Node gpu-worker-2 has nvidia.com/gpu.deploy.device-plugin=false",
        ),
    ],
)
def test_a_node_the_gpu_operator_never_selected_is_named_as_such(
    labels: dict[str, str], message: str
) -> None:
    """The operator's device-plugin and validator DaemonSets select ``nvidia.com/gpu.deploy.*=true``, which the
    operator sets only on nodes NFD labelled as having an NVIDIA PCI device (gpu-operator@v26.3.3
    controllers/state_manager.go:114-118, 521-621): such a node has neither pod, and was told "the device plugin
    runs". The Nodes are written by hand: the simulated operator applies NFD's label itself on every GPU node, so
    it has no case of NFD missing."""
    namespace = "gpu-operator"
    nodes, pods = _fleet(namespace, {"app": "nvidia-device-plugin-daemonset"})
    nodes = _selected_by_operator(nodes)
    for key in list(nodes[2]["metadata"]["labels"]):
        if key.startswith(("feature.node.kubernetes.io/", "nvidia.com/gpu.deploy.")):
            del nodes[2]["metadata"]["labels"][key]
    nodes[2]["metadata"]["labels"] |= labels
    pods = [p for p in pods if p["spec"]["nodeName"] != nodes[2]["metadata"]["name"]]
    plugin = {
        "metadata": {"name": "nvidia-device-plugin-daemonset", "namespace": namespace,
                     "labels": {"app": "nvidia-device-plugin-daemonset"}},
        "status": {"desiredNumberScheduled": NODES - 1},
    }  # fmt: skip
    ctx = _context("v1.13.2", CountingKube(nodes, pods, [plugin]), CountingHelm())
    check = _no_gpu_diagnosis(ctx, nodes[2])
    assert check.name == "GPU Operator node selection", check
    assert message in check.message, check
    if "=false" in message:
        label = message.split(" has ")[1].split("=", maxsplit=1)[0]
        assert f"kubectl label node gpu-worker-2 {label}-" in check.fix, check
