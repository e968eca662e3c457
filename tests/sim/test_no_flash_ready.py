"""No pod the simulated node refuses is ever reported Ready, not even for a moment (issue 15 point 2).

On the real control plane kwok's pod stages start pods and the GPU node agent applies what the node does. Before
the fix kwok started every pod (Running, Ready) and the agent sent the refused ones back a moment later; a watch
sees that moment, and so did the real helm 4.1.4's ``--wait`` watcher, which reported a device-plugin DaemonSet
whose pods get no sandbox deployed (tests/sim/test_real_helm_charts.py). A real kubelet never reports these pods
Ready: no container starts without a sandbox (kubernetes@v1.35.0 pkg/kubelet/kuberuntime/kuberuntime_manager.go
``SyncPod`` returns when ``createPodSandbox`` fails) or without its image, and a container that exits at once is
not seen running by the kubelet's relist. Each test watches its pod through the API (a watch, not polling, so a
moment's Ready is seen) from before its creation until the node's answer is there.

One cluster serves the module, each test with its own pod name: two Talos 1.12 workers, ``talos-worker-1`` fresh
(no NVIDIA extensions, so containerd has no ``nvidia`` handler), ``talos-worker-2`` with the NVIDIA extensions but
no modules in its machine config (scenario ``extensions-no-patch``'s state: the ``nvidia`` handler, no driver).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, watch

from runbook_lib.sim import nodeagent
from runbook_lib.sim.scenarios import install_nvidia
from runbook_lib.sim.state import locked_node
from tests.realplane import real_cluster

pytestmark = pytest.mark.slow

NS = "kube-system"  # Talos enforces baseline Pod Security elsewhere; these pods need none of it anyway
PLUGIN_IMAGE = "nvcr.io/nvidia/k8s-device-plugin:v0.18.0"
DEADLINE = 90.0  # seconds for the node's answer on a loaded 2-core machine (it takes about one agent pass)

Seen = list[dict[str, Any]]


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, client.CoreV1Api]]:
    state = tmp_path_factory.mktemp("no-flash")
    with real_cluster(state):
        with locked_node(state, "talos-worker-2") as node:
            install_nvidia(state, node, patch_modules=False)
        core = nodeagent.api(state / "kubeconfig")
        runtime_class = {"metadata": {"name": "nvidia"}, "handler": "nvidia"}
        client.NodeV1Api(core.api_client).create_runtime_class(runtime_class)  # type: ignore[arg-type]
        yield state, core


def _pod(name: str, image: str, container: str = "c", **spec: Any) -> dict[str, Any]:
    containers = [{"name": container, "image": image}]
    return {
        "metadata": {"name": name},
        "spec": {"containers": containers, "nodeName": "talos-worker-1", **spec},
    }


def _ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _waiting(pod: dict[str, Any]) -> set[str]:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return {str(((s.get("state") or {}).get("waiting") or {}).get("reason")) for s in statuses}


def watch_pod(core: client.CoreV1Api, pod: dict[str, Any], done: Callable[[Seen], bool]) -> Seen:
    """Create ``pod`` and return every state of it the API reported, from its creation until ``done(seen)``
    (or DEADLINE): the watch starts before the creation, so no update is missed."""
    listed = core.list_namespaced_pod(NS, field_selector=f"metadata.name={pod['metadata']['name']}")
    core.create_namespaced_pod(NS, pod)  # type: ignore[arg-type]
    seen: Seen = []
    assert listed.metadata is not None
    deadline, version = time.monotonic() + DEADLINE, listed.metadata.resource_version
    while not done(seen) and time.monotonic() < deadline:
        stream = watch.Watch().stream(  # type: ignore[no-untyped-call]
            core.list_namespaced_pod, NS, field_selector=f"metadata.name={pod['metadata']['name']}",
            resource_version=version, timeout_seconds=2,
        )  # fmt: skip
        for event in stream:
            obj = core.api_client.sanitize_for_serialization(event["object"])
            version = obj["metadata"]["resourceVersion"]
            seen.append(obj)
            if done(seen):
                break
    return seen


def _events(core: client.CoreV1Api, name: str, reason: str) -> list[str]:
    listed = core.list_namespaced_event(NS, field_selector=f"involvedObject.name={name},reason={reason}")
    return [str(e.message) for e in listed.items]


def _never_ready(seen: Seen) -> None:
    assert seen, "the watch saw nothing"
    flashes = [(s["status"].get("phase"), s["metadata"]["resourceVersion"]) for s in seen if _ready(s)]
    assert flashes == [], f"reported Ready at (phase, resourceVersion) {flashes}"


def test_a_pod_whose_runtime_handler_is_missing_stays_pending_and_is_never_running(
    plane: tuple[Path, client.CoreV1Api],
) -> None:
    """RuntimeClass nvidia on a node without the toolkit: Pending with containerd's error in a
    FailedCreatePodSandBox event, and never Running nor Ready on the way."""
    _, core = plane
    name = "no-sandbox"
    try:
        seen = watch_pod(
            core,
            _pod(name, "busybox:1.36", runtimeClassName="nvidia"),
            lambda s: bool(s) and bool(_events(core, name, "FailedCreatePodSandBox")),
        )
        _never_ready(seen)
        assert {s["status"].get("phase") for s in seen} == {"Pending"}
        assert 'no runtime for "nvidia" is configured' in _events(core, name, "FailedCreatePodSandBox")[0]
    finally:
        core.delete_namespaced_pod(name, NS, grace_period_seconds=0)


def test_a_pod_whose_image_does_not_pull_waits_in_back_off_without_running_then_starts_once_it_pulls(
    plane: tuple[Path, client.CoreV1Api],
) -> None:
    """The ``image_pull_error`` fault on the pod's image: ImagePullBackOff, never Running nor Ready; once the
    fault is cleared the pull works and the pod runs (the gate does not hold it for good)."""
    state, core = plane
    name, image = "no-pull", "registry.example/no-pull:1"
    faults = state / "faults.json"
    before = faults.read_text() if faults.exists() else "{}"
    faults.write_text(json.dumps({**json.loads(before or "{}"), "image_pull_error": "no-pull"}))
    try:
        seen = watch_pod(core, _pod(name, image), lambda s: bool(s) and "ImagePullBackOff" in _waiting(s[-1]))
        _never_ready(seen)
        assert "Running" not in {s["status"].get("phase") for s in seen}
        assert "ImagePullBackOff" in _waiting(seen[-1])
        faults.write_text(before)
        deadline = time.monotonic() + DEADLINE
        while not _ready(core.api_client.sanitize_for_serialization(core.read_namespaced_pod(name, NS))):
            assert time.monotonic() < deadline, "the pod did not start once its image pulled"
            time.sleep(0.1)
    finally:
        faults.write_text(before)
        core.delete_namespaced_pod(name, NS, grace_period_seconds=0)


def test_a_device_plugin_that_cannot_initialise_nvml_crash_loops_without_ever_being_ready(
    plane: tuple[Path, client.CoreV1Api],
) -> None:
    """The device plugin without the nvidia runtime exits 1 ("Failed to initialize NVML") at once: the kubelet
    shows it in CrashLoopBackOff, and never Ready (it ran for milliseconds)."""
    _, core = plane
    name = "plugin-crash"
    pod = _pod(name, PLUGIN_IMAGE, nodeagent.PLUGIN_CONTAINER)
    try:
        seen = watch_pod(core, pod, lambda s: bool(s) and "CrashLoopBackOff" in _waiting(s[-1]))
        _never_ready(seen)
        assert "CrashLoopBackOff" in _waiting(seen[-1])
    finally:
        core.delete_namespaced_pod(name, NS, grace_period_seconds=0)


def test_a_cuda_pod_whose_nvidia_hook_fails_goes_from_pending_to_failed_without_running(
    plane: tuple[Path, client.CoreV1Api],
) -> None:
    """RuntimeClass nvidia on a node with the toolkit but no driver loaded: the nvidia prestart hook fails
    ("nvml error: driver not loaded", Talos 1.12's legacy toolkit), so the container never starts and the bare pod
    (restartPolicy Never) ends Failed with StartError, never Running nor Ready on the way. Simplified as before
    (``nodeagent._final_status``): the container is shown terminated with exit code 128."""
    _, core = plane
    name = "hook-fails"
    pod = _pod(name, "nvcr.io/nvidia/cuda:12.8.0-base-ubuntu24.04", runtimeClassName="nvidia")
    pod["spec"] |= {"nodeName": "talos-worker-2", "restartPolicy": "Never"}
    pod["spec"]["containers"][0]["command"] = ["nvidia-smi"]
    try:
        seen = watch_pod(core, pod, lambda s: bool(s) and s[-1]["status"].get("phase") == "Failed")
        _never_ready(seen)
        assert "Running" not in {s["status"].get("phase") for s in seen}
        terminated = seen[-1]["status"]["containerStatuses"][0]["state"]["terminated"]
        assert terminated["reason"] == "StartError" and "driver not loaded" in terminated["message"]
    finally:
        core.delete_namespaced_pod(name, NS, grace_period_seconds=0)
