"""What the real Kubernetes control plane shows while the simulated Talos nodes change (issues 14 and 15).

The nodes' kubelets are kwok's (v0.8.0) on the real kube-apiserver, kube-controller-manager and kube-scheduler
v1.35.0 that ``simkube`` runs; the GPU node agent (``runbook_lib.sim.nodeagent``) decides what follows from
each node's Talos state. Every wait here polls for the condition it needs with a generous deadline: the node
lifecycle controller, kwok and the agent run on their own clocks, and a loaded machine delays all of them.
Skipped, saying what to build, when the control plane is not built (``make kube-tools``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from runbook_lib.sim import faults, realkube
from tests.sim.test_real_talos_113 import bare_pod, core_api, pod_phase, service_accounts
from tests.sim.test_sim_up_real_kube import down, up
from tests.sim.test_sim_up_real_kube import tools as tools  # noqa: PLC0414  (the module-scoped fixture)
from tests.sim.test_sim_up_real_talosctl import step_lines
from tests.sim.waiting import wait_for

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]

#: kube-controller-manager's --node-monitor-grace-period, which simkube leaves at its default: 50 s
#: (kubernetes@v1.35.0 pkg/controller/nodelifecycle/config/v1alpha1/defaults.go). The node's Lease, renewed
#: every 10 s (a quarter of kwok's --node-lease-duration-seconds=40, sigs.k8s.io/kwok@v0.8.0
#: pkg/kwok/controllers/controller.go), counts as its last heartbeat, so the node can turn Unknown up to one
#: renewal interval before the grace period has passed since it went down.
GRACE_S = 50
RENEW_S = 10


def ready_condition(api: Any, node: str) -> Any:
    return next(c for c in api.read_node(node).status.conditions if c.type == "Ready")


def taint_keys(api: Any, node: str) -> set[str]:
    return {t.key for t in api.read_node(node).spec.taints or []}


def pod_ready(api: Any, name: str) -> str:
    pod = api.read_namespaced_pod(name, "default")
    return next((c.status for c in pod.status.conditions or [] if c.type == "Ready"), "")


@pytest.fixture
def two_workers(tools: realkube.Tools, tmp_path: Path) -> Iterator[Path]:
    """Two gpu-ready Talos 1.12 workers (Python talosctl: their state is the node files) on the real control
    plane."""
    state = tmp_path / "sim"
    up(state, tools, 2, "gpu-ready")
    try:
        yield state
    finally:
        down(state)


@pytest.mark.parametrize("fault", ["unreachable", "node_not_ready"])
def test_a_node_that_goes_down_turns_ready_unknown_after_the_grace_period_and_ready_when_it_is_back(
    two_workers: Path, fault: str
) -> None:
    """A Talos node that is down (powered off, rebooting) runs no kubelet, so nothing renews its Lease or posts
    its status: the node lifecycle controller sets Ready (and the other conditions) Unknown, "Kubelet stopped
    posting node status.", once the grace period passed, taints it unreachable and marks its pods not ready
    (kubernetes@v1.35.0 pkg/controller/nodelifecycle/node_lifecycle_controller.go tryUpdateNodeHealth,
    markPodsNotReady). Once the node is back its kubelet posts Ready again, the controller lifts the taints, and
    the kubelet restarts the node's pods, which turn ready. Before, kwok kept every node Ready throughout.
    ``runbook sim fault NODE node_not_ready`` stops the kubelet alone; before, it did nothing on the real control
    plane."""
    state = two_workers
    api = core_api(state)
    wait_for(lambda: "default" in service_accounts(api), timeout=180)
    api.create_namespaced_pod("default", bare_pod("on-node", "talos-worker-2"))
    wait_for(lambda: pod_ready(api, "on-node") == "True", timeout=180)
    wait_for(lambda: ready_condition(api, "talos-worker-2").status == "True", timeout=180)

    faults.inject(state, "talos-worker-2", fault)
    went_down = time.monotonic()
    unknown = wait_for(
        lambda: (c := ready_condition(api, "talos-worker-2")).status == "Unknown" and c, timeout=GRACE_S + 180
    )
    assert time.monotonic() - went_down > GRACE_S - RENEW_S - 5  # the controller's grace, not at once
    assert (unknown.reason, unknown.message) == ("NodeStatusUnknown", "Kubelet stopped posting node status.")
    wait_for(lambda: "node.kubernetes.io/unreachable" in taint_keys(api, "talos-worker-2"), timeout=60)
    wait_for(lambda: pod_ready(api, "on-node") == "False", timeout=60)
    assert ready_condition(api, "talos-worker-1").status == "True"  # the node that stayed up

    faults.clear(state, "talos-worker-2", fault)
    wait_for(lambda: ready_condition(api, "talos-worker-2").status == "True", timeout=180)
    wait_for(lambda: "node.kubernetes.io/unreachable" not in taint_keys(api, "talos-worker-2"), timeout=120)
    wait_for(lambda: pod_ready(api, "on-node") == "True", timeout=120)


# ---------------------------------------------------------------- the Kubernetes faults


#: The kubernetes step's wait for GPUs: long enough for kwok to start the good nodes' plugin pods on a loaded
#: machine (as tests/sim/test_sim_up_real_kube.py), and past the grace period after which a node whose kubelet
#: stopped turns Ready=Unknown (``GRACE_S`` + ``RENEW_S``).
GPU_WAIT_S = 90


def kube_fault_run(
    tmp: Path,
    fault: str,
    then: Callable[[Path], None] | None = None,
    also: dict[str, str] | None = None,
) -> tuple[dict[str, str], list[tuple[str, str, list[str]]]]:
    """``runbook sim up`` (gpu-ready), ``runbook sim fault gpu-worker-3 FAULT true`` (and ``also``'s node: fault),
    then ``runbook run --apply`` of the kubernetes and cuda-test steps on the real control plane: the step
    outcomes, and per failed GPU node its message and its checks' messages (the diagnosis a user reads).
    ``then(state)`` runs after the run, on the same cluster, before it goes down (a control plane is slow to
    start: checks share this one)."""
    state, records = tmp / "state", tmp / "records"
    env = {**os.environ, realkube.MODE_ENV: "real", "RUNBOOK_SIM_TALOSCTL": "python"}
    sim = [sys.executable, "-m", "runbook_lib", "sim"]
    params = str(ROOT / "params" / "simulated.yaml")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            args, env=env, capture_output=True, text=True, timeout=900, check=False, cwd=ROOT
        )

    try:
        started = run(*sim, "up", "-p", params, "--state", str(state), "--scenario", "gpu-ready")
        assert started.returncode == 0, started.stderr
        for node, name in {"gpu-worker-3": fault, **(also or {})}.items():
            assert run(*sim, "fault", "--state", str(state), node, name, "true").returncode == 0
        proc = run(
            sys.executable, "-m", "runbook_lib", "run", "-p", params, "--apply", "--state", str(state),
            "--records", str(records), "--no-progress", "--steps", "kubernetes,cuda-test",
            "--set", "simulation.scenario=gpu-ready", "--set", f"timeouts.kubernetes_seconds={GPU_WAIT_S}",
        )  # fmt: skip
        if then is not None:
            then(state)
    finally:
        run(*sim, "down", "--state", str(state))
    [path] = records.glob("*/results/kubernetes.json")
    nodes = json.loads(path.read_text())["result"]["nodes"]
    failed = [
        (n["node"], n.get("message", ""), [c.get("message", "") for c in n.get("failed", [])])
        for n in nodes
        if n["status"] == "failed" and n["node"].startswith("gpu-worker")
    ]
    return step_lines(proc.stdout), failed


#: What the kubernetes step says of gpu-worker-3 for each fault, in Kubernetes' own words: the kubelet's
#: image-pull back-off (kubernetes@v1.35.0 pkg/kubelet/images/image_manager.go:336-348), and the node lifecycle
#: controller's Ready=Unknown once the stopped kubelet's grace period has passed (kubernetes@v1.35.0
#: pkg/controller/nodelifecycle/node_lifecycle_controller.go:969-970).
FAULT_SAYS = {
    "image_pull_error": "waits in ImagePullBackOff: Back-off pulling image",
    "node_not_ready": "is not Ready (Ready=Unknown, NodeStatusUnknown: Kubelet stopped posting node status.)",
}


@pytest.mark.parametrize("fault", sorted(FAULT_SAYS))
def test_a_kubernetes_fault_stops_the_run_at_the_kubernetes_step_on_the_faulty_node_only(
    tools: realkube.Tools, tmp_path: Path, fault: str
) -> None:
    """``runbook sim fault gpu-worker-3 image_pull_error true`` (every image on that node fails to pull): the
    device plugin never starts there, so the kubernetes step fails on that node alone, saying why in the
    kubelet's words, and cuda-test does not run. Before, kwok ran the pods anyway and the node got its GPU: the
    run went on. ``node_not_ready``: no kubelet runs the node's plugin pod, the same failure, in the node
    lifecycle controller's words. (Once compared with the Python API server's run, retired in issue 15.)

    The image-pull run also puts ``pods_pending`` on gpu-worker-2 and checks a Terminating pod on gpu-worker-1
    (``tests/sim/test_real_kube_pods.py``: a control plane is slow to start, so they share this one)."""
    from tests.sim.test_real_kube_pods import PENDING, assert_pending_quotes_the_scheduler, terminating

    also, then = (PENDING, terminating) if fault == "image_pull_error" else (None, None)
    real = kube_fault_run(tmp_path, fault, then, also)
    failing = sorted({"gpu-worker-3", *(also or {})})
    expected: tuple[dict[str, str], list[tuple[str, str, list[str]]]] = (
        {"kubernetes": "failed"},
        [(node, "", []) for node in failing],
    )
    if also:
        real = assert_pending_quotes_the_scheduler(real, expected)
    assert real[0] == {"kubernetes": "failed"}, real
    [(node, _message, checks)] = real[1]
    assert node == "gpu-worker-3", real
    assert any(FAULT_SAYS[fault] in check for check in checks), checks


# ---------------------------------------------------------------- kube-system as Talos fills it


def running_pods(api: Any, selector: str) -> list[tuple[str, str]]:
    """(node, image) of the kube-system pods matching ``selector`` that run and are ready."""
    pods = api.list_namespaced_pod("kube-system", label_selector=selector).items
    return sorted(
        (p.spec.node_name, p.spec.containers[0].image)
        for p in pods
        if p.status.phase == "Running"
        and any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
    )


def test_kube_system_runs_what_talos_deploys_there(two_workers: Path) -> None:
    """Every Talos cluster runs kube-proxy and flannel on each node and two CoreDNS replicas, applied by Talos's
    manifest controller with these names and labels (siderolabs/talos@v1.12.0
    internal/app/machined/pkg/controllers/k8s/internal/k8stemplates/testdata/kube-proxy-daemonset.yaml,
    flannel-daemonset.yaml, coredns-deployment.yaml; images from pkg/machinery/constants/constants.go).
    Before, kube-system was empty on the simulated cluster."""
    api = core_api(two_workers)
    nodes = ["talos-cp-1", "talos-worker-1", "talos-worker-2"]
    proxy = wait_for(
        lambda: len(r := running_pods(api, "k8s-app=kube-proxy,tier=node")) == 3 and r, timeout=240
    )
    assert proxy == [(n, "registry.k8s.io/kube-proxy:v1.35.0") for n in nodes]
    flannel = wait_for(
        lambda: len(r := running_pods(api, "k8s-app=flannel,tier=node")) == 3 and r, timeout=240
    )
    assert flannel == [(n, "ghcr.io/siderolabs/flannel:v0.27.4") for n in nodes]
    dns = wait_for(lambda: len(r := running_pods(api, "k8s-app=kube-dns")) == 2 and r, timeout=240)
    assert {image for _, image in dns} == {"registry.k8s.io/coredns/coredns:v1.13.2"}
    owners = {p.metadata.owner_references[0].kind for p in api.list_namespaced_pod("kube-system").items}
    assert owners == {
        "DaemonSet",
        "ReplicaSet",
    }  # the real controllers made them, from the DaemonSets and Deployment


def lease_holders(state: Path) -> dict[str, str]:
    """Node name -> the holder of its Lease in kube-node-lease (kwok's identity: hostname and a per-process UUID,
    sigs.k8s.io/kwok@v0.8.0 pkg/kwok/controllers/controller.go ``Identity``)."""
    from kubernetes import client

    coordination = client.CoordinationV1Api(core_api(state).api_client)
    leases = coordination.list_namespaced_lease("kube-node-lease").items
    return {lease.metadata.name: lease.spec.holder_identity or "" for lease in leases}


def test_a_restarted_simulator_runs_pods_on_every_node_at_once(
    tools: realkube.Tools, two_workers: Path
) -> None:
    """``runbook run`` restarts the simulator on the cluster the last run kept. A new kwok has a new identity,
    and it manages a node only while it holds the node's Lease, which the old kwok held until it expires 40 s
    after its last renewal (node_lease_controller.go ``sync``, ``tryAcquireOrRenew``). A pod created in that
    window was skipped as read-only, and if kwok's look at the node's pods on taking the Lease over ran before
    its own Lease cache showed it the holder (controller.go ``podsOnNodeSyncWorker``, ``readOnlyFunc``), the pod
    stayed Pending for good: CI on 6 Dec 2026 failed a second ``runbook run`` whose cuda-test pods on one node
    never started in 300 s. Real kubelets outlive a runbook run, so nothing of this exists on a real cluster:
    the simulator now hands the Leases over before it says it is up."""
    api = core_api(two_workers)
    before = wait_for(lambda: len(h := lease_holders(two_workers)) == 3 and h, timeout=120)
    realkube.stop(two_workers)
    realkube.start(two_workers, tools)
    after = lease_holders(two_workers)  # read at once: no wait for the old Leases to expire
    assert set(after) == set(before) and not set(after.values()) & set(before.values()), (before, after)
    api.create_namespaced_pod("default", bare_pod("after-restart", "talos-worker-1"))
    assert wait_for(lambda: pod_phase(api, "after-restart") == "Running", timeout=120) is True
