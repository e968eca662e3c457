"""Controllers and per-node kubelets: pods behave as the Talos state of their node dictates."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from runbook_lib.sim import charts, cluster, scenarios
from runbook_lib.sim.kubeapi import server
from runbook_lib.sim.state import (
    load_node,
    locked_node,
    runtime,
    save_cluster_faults,
    sim_paths,
    v1alpha1_doc,
)
from tests.sim.waiting import wait_for

WORKERS = ("talos-worker-1", "talos-worker-2")


class Sim:
    def __init__(self, state: Path, srv: server.KubeServer) -> None:
        self.state = state
        self.srv = srv
        api = config.new_client_from_config(config_file=str(sim_paths(state).kubeconfig))
        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)
        self.batch = client.BatchV1Api(api)
        self.node = client.NodeV1Api(api)

    def events(self, ns: str, reason: str | None = None) -> list[client.CoreV1Event]:
        return [e for e in self.core.list_namespaced_event(ns).items if reason is None or e.reason == reason]

    def gpus(self, node: str) -> str | None:
        alloc = self.core.read_node(node).status.allocatable or {}
        return alloc.get("nvidia.com/gpu")


def make_sim(tmp_path: Path, **spec: Any) -> tuple[Path, server.KubeServer]:
    cluster.create(tmp_path, cluster.ClusterSpec(**{"workers": 2, "talos_version": "1.12", **spec}))
    return tmp_path, server.serve_in_thread(tmp_path)


@pytest.fixture
def sim(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Sim]:
    spec = getattr(request, "param", {})
    state, srv = make_sim(tmp_path, **spec)
    try:
        yield Sim(state, srv)
    finally:
        srv.shutdown()
        srv.server_close()
        assert srv.controllers.errors == []


def install_gpu_stack(state: Path, node: str, *, patch_modules: bool = True) -> None:
    with locked_node(state, node) as n:
        scenarios.install_nvidia(state, n, patch_modules=patch_modules)


def patch_modules(state: Path, node: str) -> None:
    with locked_node(state, node) as n:
        machine = v1alpha1_doc(n.machine_config).setdefault("machine", {})
        machine.setdefault("kernel", {})["modules"] = [
            {"name": m} for m in ("nvidia", "nvidia_uvm", "nvidia_drm", "nvidia_modeset")
        ]
        machine.setdefault("sysctls", {})["net.core.bpf_jit_harden"] = "1"


def create_objects(sim: Sim, objs: list[dict[str, Any]]) -> None:
    for o in objs:
        ns = o["metadata"].get("namespace", "default")
        if o["kind"] == "DaemonSet":
            sim.apps.create_namespaced_daemon_set(ns, o)
        elif o["kind"] == "ConfigMap":
            sim.core.create_namespaced_config_map(ns, o)
        else:
            raise AssertionError(o["kind"])


def runtime_class(sim: Sim) -> None:
    sim.node.create_runtime_class(
        client.V1RuntimeClass(metadata=client.V1ObjectMeta(name="nvidia"), handler="nvidia")
    )


def device_plugin(sim: Sim, version: str = "0.13.0", **values: Any) -> None:
    _, objs = charts.render(
        "nvidia-device-plugin",
        version,
        {"runtimeClassName": "nvidia", **values},
        "nvidia-device-plugin",
        "kube-system",
    )
    create_objects(sim, objs)


def gpu_pod(
    name: str, image: str, command: list[str] | None = None, *, gpus: int = 0, rc: str | None = "nvidia"
) -> client.V1Pod:
    res = client.V1ResourceRequirements(limits={"nvidia.com/gpu": str(gpus)}) if gpus else None
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1PodSpec(
            restart_policy="Never",
            runtime_class_name=rc,
            containers=[client.V1Container(name="c", image=image, command=command, resources=res)],
        ),
    )


def phase(sim: Sim, name: str, ns: str = "default") -> str:
    return str(sim.core.read_namespaced_pod(name, ns).status.phase)


# --- the device plugin chain --------------------------------------------------------------------------


@pytest.mark.parametrize("sim", [{"gpus_per_worker": 2}], indirect=True)
def test_gpu_allocatable_appears_only_once_toolkit_driver_and_runtime_line_up(sim: Sim) -> None:
    runtime_class(sim)
    device_plugin(sim)
    # 1. No toolkit extension: the nvidia handler does not exist on the node.
    ev = wait_for(lambda: sim.events("kube-system", "FailedCreatePodSandBox"))
    assert ev[0].message == (
        'Failed to create pod sandbox: rpc error: code = Unknown desc = failed to get sandbox runtime: no runtime for "nvidia" is configured'
    )
    assert ev[0].type == "Warning" and ev[0].source.component == "kubelet"
    assert all(sim.gpus(n) is None for n in WORKERS)
    # 2. Extensions in place, modules not configured: the hook cannot find a loaded driver.
    for n in WORKERS:
        install_gpu_stack(sim.state, n, patch_modules=False)
    failed = wait_for(
        lambda: [e for e in sim.events("kube-system", "Failed") if "driver not loaded" in e.message]
    )
    assert "nvidia-container-cli: initialization error: nvml error: driver not loaded" in failed[0].message
    wait_for(lambda: sim.events("kube-system", "BackOff"))
    assert all(sim.gpus(n) is None for n in WORKERS)
    # 3. The modules patch: the plugin starts and registers one resource per GPU.
    for n in WORKERS:
        patch_modules(sim.state, n)
    for n in WORKERS:
        want = str(len(load_node(sim.state, n).gpus))
        assert wait_for(lambda n=n: sim.gpus(n)) == want
    ds = sim.apps.read_namespaced_daemon_set_status("nvidia-device-plugin", "kube-system")
    assert wait_for(
        lambda: (
            sim.apps.read_namespaced_daemon_set_status(
                "nvidia-device-plugin", "kube-system"
            ).status.number_ready
            == 2
        )
    )
    assert ds.status.desired_number_scheduled == 2
    pods = sim.core.list_namespaced_pod(
        "kube-system", label_selector="app.kubernetes.io/name=nvidia-device-plugin"
    ).items
    log = sim.core.read_namespaced_pod_log(pods[0].metadata.name, "kube-system")
    assert "Registered device plugin for 'nvidia.com/gpu' with Kubelet" in log
    assert sim.gpus("talos-cp-1") is None


@pytest.mark.parametrize("sim", [{"scenario": "gpu-ready"}], indirect=True)
def test_device_plugin_without_nvidia_runtime_crashloops_with_the_real_log(sim: Sim) -> None:
    _, objs = charts.render("nvidia-device-plugin", "0.13.0", {}, "nvidia-device-plugin", "kube-system")
    create_objects(sim, objs)
    wait_for(lambda: sim.events("kube-system", "BackOff"))
    pod = sim.core.list_namespaced_pod("kube-system").items[0]
    log = sim.core.read_namespaced_pod_log(pod.metadata.name, "kube-system")
    assert "Incompatible strategy detected auto" in log
    assert "If this is a GPU node, did you configure the NVIDIA Container Toolkit?" in log
    status = sim.core.read_namespaced_pod(pod.metadata.name, "kube-system").status.container_statuses[0]
    assert status.state.waiting.reason == "CrashLoopBackOff"
    assert sim.gpus(WORKERS[0]) is None


@pytest.mark.parametrize("sim", [{"scenario": "gpu-ready"}], indirect=True)
def test_time_slicing_config_multiplies_allocatable(sim: Sim) -> None:
    runtime_class(sim)
    config_text = "version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 10\n"
    device_plugin(sim, config={"map": {"default": config_text}, "default": "default"})
    for n in WORKERS:
        assert wait_for(lambda n=n: sim.gpus(n)) == str(10 * len(load_node(sim.state, n).gpus))


def test_chart_015_default_affinity_schedules_nothing_until_nodes_are_labelled(sim: Sim) -> None:
    runtime_class(sim)
    device_plugin(sim, version="0.15.0")
    time.sleep(0.4)
    ds = sim.apps.read_namespaced_daemon_set("nvidia-device-plugin", "kube-system")
    assert ds.status.desired_number_scheduled == 0 and ds.status.current_number_scheduled == 0
    sim.core.patch_node(WORKERS[0], {"metadata": {"labels": {"nvidia.com/gpu.present": "true"}}})
    assert (
        wait_for(
            lambda: (
                sim.apps.read_namespaced_daemon_set(
                    "nvidia-device-plugin", "kube-system"
                ).status.desired_number_scheduled
            )
        )
        == 1
    )


def test_daemonset_pod_rejected_by_pod_security_leaves_failed_create(sim: Sim) -> None:
    _, objs = charts.render(
        "nvidia-device-plugin",
        "0.17.0",
        {"allowDefaultNamespace": True, "affinity": None},
        "nvidia-device-plugin",
        "default",
    )
    create_objects(sim, objs)
    ev = wait_for(lambda: sim.events("default", "FailedCreate"))
    assert ev[0].message == (
        'Error creating: pods "nvidia-device-plugin-" is forbidden: violates PodSecurity "baseline:latest": '
        'hostPath volumes (volumes "device-plugin", "cdi-root", "mps-root", "mps-shm")'
    )
    assert ev[0].source.component == "daemonset-controller"
    ds = sim.apps.read_namespaced_daemon_set("nvidia-device-plugin", "default")
    assert ds.status.desired_number_scheduled == 2 and ds.status.current_number_scheduled == 0


# --- workloads on GPU nodes ---------------------------------------------------------------------------


def _ready_cluster(sim: Sim) -> None:
    runtime_class(sim)
    device_plugin(sim)
    for n in WORKERS:
        wait_for(lambda n=n: sim.gpus(n))


@pytest.mark.parametrize("sim", [{"scenario": "gpu-ready"}], indirect=True)
def test_nvidia_smi_prints_the_driver_branch_table_with_the_node_gpus(sim: Sim) -> None:
    runtime_class(sim)
    sim.core.create_namespaced_pod(
        "default", gpu_pod("smi", "nvcr.io/nvidia/cuda:12.5.0-base-ubuntu22.04", ["nvidia-smi"])
    )
    wait_for(lambda: phase(sim, "smi") == "Succeeded")
    pod = sim.core.read_namespaced_pod("smi", "default")
    node = load_node(sim.state, pod.spec.node_name)
    driver = runtime(node).driver_version
    lines = sim.core.read_namespaced_pod_log("smi", "default").splitlines()
    header = next(line for line in lines if "NVIDIA-SMI" in line)
    assert f"Driver Version: {driver}" in header and header.startswith(f"| NVIDIA-SMI {driver}")
    assert len(header) == len(lines[1]) == 91  # the wide layout of recent branches
    assert sum(node.gpus[0].model in line for line in lines) == len(node.gpus)


@pytest.mark.parametrize("sim", [{"scenario": "gpu-ready", "talos_version": "1.3"}], indirect=True)
def test_old_driver_branch_prints_the_narrow_table(sim: Sim) -> None:
    runtime_class(sim)
    sim.core.create_namespaced_pod(
        "default", gpu_pod("smi", "nvcr.io/nvidia/cuda:11.7.1-base-ubuntu20.04", ["nvidia-smi"])
    )
    wait_for(lambda: phase(sim, "smi") == "Succeeded")
    lines = sim.core.read_namespaced_pod_log("smi", "default").splitlines()
    header = next(line for line in lines if "NVIDIA-SMI" in line)
    assert len(header) == 79
    assert header.startswith("| NVIDIA-SMI 515.")


@pytest.mark.parametrize("sim", [{"scenario": "gpu-ready"}], indirect=True)
def test_nvidia_smi_without_the_runtime_class_fails_to_start(sim: Sim) -> None:
    sim.core.create_namespaced_pod(
        "default", gpu_pod("smi", "nvcr.io/nvidia/cuda:12.5.0-base-ubuntu22.04", ["nvidia-smi"], rc=None)
    )
    wait_for(lambda: phase(sim, "smi") == "Failed")
    term = sim.core.read_namespaced_pod("smi", "default").status.container_statuses[0].state.terminated
    assert term.reason == "StartError" and term.exit_code == 128
    assert 'exec: "nvidia-smi": executable file not found in $PATH' in term.message


@pytest.mark.parametrize("sim", [{"scenario": "gpu-ready"}], indirect=True)
def test_missing_bpf_jit_sysctl_breaks_the_legacy_hook_on_112(sim: Sim) -> None:
    runtime_class(sim)
    for n in WORKERS:
        with locked_node(sim.state, n) as node:
            v1alpha1_doc(node.machine_config)["machine"]["sysctls"].pop("net.core.bpf_jit_harden")
    sim.core.create_namespaced_pod(
        "default", gpu_pod("smi", "nvcr.io/nvidia/cuda:12.5.0-base-ubuntu22.04", ["nvidia-smi"])
    )
    wait_for(lambda: phase(sim, "smi") == "Failed")
    term = sim.core.read_namespaced_pod("smi", "default").status.container_statuses[0].state.terminated
    assert "load program: invalid argument: last insn is not an exit or jmp" in term.message


@pytest.mark.parametrize("sim", [{"scenario": "gpu-ready"}], indirect=True)
def test_vectoradd_job_requesting_a_gpu_passes(sim: Sim) -> None:
    _ready_cluster(sim)
    job = client.V1Job(
        metadata=client.V1ObjectMeta(name="vectoradd"),
        spec=client.V1JobSpec(
            backoff_limit=0,
            template=client.V1PodTemplateSpec(
                spec=gpu_pod("x", "nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0", gpus=1).spec
            ),
        ),
    )
    sim.batch.create_namespaced_job("default", job)
    done = wait_for(
        lambda: [
            c
            for c in sim.batch.read_namespaced_job_status("vectoradd", "default").status.conditions or []
            if c.type == "Complete"
        ]
    )
    assert done[0].status == "True"
    pod = sim.core.list_namespaced_pod("default", label_selector="job-name=vectoradd").items[0]
    assert "Test PASSED" in sim.core.read_namespaced_pod_log(pod.metadata.name, "default")


def test_gpu_request_without_allocatable_fails_scheduling(sim: Sim) -> None:
    runtime_class(sim)
    sim.core.create_namespaced_pod(
        "default", gpu_pod("wants-gpu", "nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0", gpus=1)
    )
    ev = wait_for(lambda: sim.events("default", "FailedScheduling"))
    assert ev[0].message == (
        "0/3 nodes are available: 1 node(s) had untolerated taint {node-role.kubernetes.io/control-plane: }, "
        "2 Insufficient nvidia.com/gpu. preemption: 0/3 nodes are available: 1 Preemption is not helpful for scheduling, "
        "2 No preemption victims found for incoming pod."
    )
    pod = sim.core.read_namespaced_pod("wants-gpu", "default")
    assert pod.status.phase == "Pending" and not pod.spec.node_name
    assert pod.status.conditions[0].reason == "Unschedulable"


def test_failing_job_stops_at_its_backoff_limit(sim: Sim) -> None:
    job = client.V1Job(
        metadata=client.V1ObjectMeta(name="fails"),
        spec=client.V1JobSpec(
            backoff_limit=1,
            template=client.V1PodTemplateSpec(
                spec=client.V1PodSpec(
                    restart_policy="Never",
                    containers=[client.V1Container(name="c", image="busybox:1.36", command=["false"])],
                )
            ),
        ),
    )
    sim.batch.create_namespaced_job("default", job)
    cond = wait_for(
        lambda: [
            c
            for c in sim.batch.read_namespaced_job_status("fails", "default").status.conditions or []
            if c.type == "Failed"
        ]
    )
    assert cond[0].reason == "BackoffLimitExceeded"
    assert sim.batch.read_namespaced_job_status("fails", "default").status.failed == 2


def test_cordoned_node_gets_no_new_pods(sim: Sim) -> None:
    sim.core.patch_node(WORKERS[0], {"spec": {"unschedulable": True}})
    sim.core.patch_node(WORKERS[1], {"spec": {"unschedulable": True}})
    sim.core.create_namespaced_pod("default", gpu_pod("p", "busybox:1.36", ["sleep", "100"], rc=None))
    ev = wait_for(lambda: sim.events("default", "FailedScheduling"))
    assert ev[0].message.startswith(
        "0/3 nodes are available: 1 node(s) had untolerated taint {node-role.kubernetes.io/control-plane: }, 2 node(s) were unschedulable."
    )


def test_deployment_becomes_available(sim: Sim) -> None:
    labels = {"app": "web"}
    dep = client.V1Deployment(
        metadata=client.V1ObjectMeta(name="web"),
        spec=client.V1DeploymentSpec(
            replicas=2,
            selector=client.V1LabelSelector(match_labels=labels),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels=labels),
                spec=client.V1PodSpec(containers=[client.V1Container(name="c", image="nginx:1.27")]),
            ),
        ),
    )
    sim.apps.create_namespaced_deployment("default", dep)
    st = wait_for(
        lambda: (
            (s := sim.apps.read_namespaced_deployment_status("web", "default").status).ready_replicas == 2
            and s
        )
    )
    assert {c.type: c.status for c in st.conditions}["Available"] == "True"
    assert len(sim.core.list_namespaced_pod("default", label_selector="app=web").items) == 2


# --- faults -------------------------------------------------------------------------------------------


def test_pods_pending_fault_keeps_pods_unscheduled(sim: Sim) -> None:
    save_cluster_faults(sim.state, {"pods_pending": True})
    sim.core.create_namespaced_pod("default", gpu_pod("stuck", "busybox:1.36", ["sleep", "1"], rc=None))
    time.sleep(0.5)
    assert phase(sim, "stuck") == "Pending"
    save_cluster_faults(sim.state, {})
    wait_for(lambda: phase(sim, "stuck") != "Pending")


def waiting_state(sim: Sim, name: str) -> Any:
    return sim.core.read_namespaced_pod(name, "default").status.container_statuses[0].state.waiting


def test_image_pull_error_fault_gives_errimagepull_then_backoff(sim: Sim) -> None:
    save_cluster_faults(sim.state, {"image_pull_error": ["does-not-exist"]})
    sim.core.create_namespaced_pod(
        "default", gpu_pod("pull", "registry.example/does-not-exist:1", ["true"], rc=None)
    )
    wait_for(lambda: sim.events("default", "BackOff"))
    failed = [e.message for e in sim.events("default", "Failed")]
    assert any(
        m.startswith('Failed to pull image "registry.example/does-not-exist:1": rpc error: code = NotFound')
        for m in failed
    )
    assert "Error: ImagePullBackOff" in failed
    waiting = sim.core.read_namespaced_pod("pull", "default").status.container_statuses[0].state.waiting
    assert waiting.reason in ("ErrImagePull", "ImagePullBackOff")
    # In back-off the kubelet's waiting message carries the last pull's error, "<ErrImagePull>: <CRI message>",
    # after "Back-off pulling image %q" (kubernetes@v1.35.0 pkg/kubelet/images/image_manager.go:336-348, 362-367;
    # since 1.31, reality-gaps.md §3 item 8); the BackOff event keeps the short text.
    image = "registry.example/does-not-exist:1"
    backing_off = wait_for(lambda: (w := waiting_state(sim, "pull")).reason == "ImagePullBackOff" and w)
    assert backing_off.message == (
        f'Back-off pulling image "{image}": ErrImagePull: rpc error: code = NotFound desc = failed to pull and '
        f'unpack image "{image}": failed to resolve reference "{image}": {image}: not found'
    )
    assert f'Back-off pulling image "{image}"' in [e.message for e in sim.events("default", "BackOff")]
    with pytest.raises(ApiException) as err:
        sim.core.read_namespaced_pod_log("pull", "default")
    assert "is waiting to start: trying and failing to pull image" in err.value.body


def test_unreachable_node_turns_not_ready_and_is_avoided(sim: Sim) -> None:
    pinned = gpu_pod("pinned", "busybox:1.36", ["sleep", "100"], rc=None)
    pinned.spec.node_name = WORKERS[1]
    sim.core.create_namespaced_pod("default", pinned)

    def pinned_ready() -> bool:
        conds = sim.core.read_namespaced_pod("pinned", "default").status.conditions or []
        return any(c.type == "Ready" and c.status == "True" for c in conds)

    wait_for(pinned_ready)
    with locked_node(sim.state, WORKERS[1]) as n:
        n.faults["node_not_ready"] = True

    def ready_status() -> str:
        conds = sim.core.read_node(WORKERS[1]).status.conditions
        return str(next(c for c in conds if c.type == "Ready").status)

    assert wait_for(lambda: ready_status() == "Unknown")
    reason = next(c for c in sim.core.read_node(WORKERS[1]).status.conditions if c.type == "Ready")
    assert reason.message == "Kubelet stopped posting node status."
    for i in range(4):
        sim.core.create_namespaced_pod("default", gpu_pod(f"p{i}", "busybox:1.36", ["sleep", "100"], rc=None))
    wait_for(lambda: all(phase(sim, f"p{i}") == "Running" for i in range(4)))
    assert {sim.core.read_namespaced_pod(f"p{i}", "default").spec.node_name for i in range(4)} == {WORKERS[0]}
    assert not pinned_ready()  # pods of a lost node are marked not ready
    with locked_node(sim.state, WORKERS[1]) as n:
        n.faults.pop("node_not_ready")
    assert wait_for(lambda: ready_status() == "True")
    assert wait_for(pinned_ready)
