"""The GPU Operator layer (Talos 1.13+) on the real control plane (issue 15).

Real helm 4.1.4 installs our own ``gpu-operator`` chart (``runbook_lib/sim/chartsrc/gpu-operator``, facts of
NVIDIA/gpu-operator@v26.3.3) from the simulator's repository into the real kube-apiserver v1.36.0 (Talos 1.13's
Kubernetes); the simulated operator controller (``runbook_lib/sim/gpuoperator.py``) creates the operand
DaemonSets and the node side holds their pods in the init containers whose validation fails on the node.
Before this, the Python API server's operator advertised GPUs whatever the values said (reality-gaps.md §3
item 1), so a regression in the runbook's ``GPU_OPERATOR_VALUES`` (model/profiles.py) passed every simulated
run. Skipped, saying what to build, when the v1.36.0 control plane is not built (``make kube-tools``).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from runbook_lib.sim import cluster, gpuoperator, realkube
from runbook_lib.sim.state import load_nodes, runtime
from runbook_lib.steps.context import Context
from runbook_lib.steps.kubernetes import kubernetes_layer
from tests.sim.test_real_talosctl import build, find_go
from tests.sim.test_sim_up_real_kube import context as real_kube_context
from tests.sim.test_sim_up_real_talosctl import runbook, step_lines
from tests.sim.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
TALOS = "v1.13.0"
KUBERNETES = "1.36.0"  # Talos 1.13's (state.KUBERNETES_FOR_TALOS)
WORKERS = ["talos-worker-1", "talos-worker-2"]
NAMESPACE = "gpu-operator"  # GpuOperator.namespace's default


@pytest.fixture(scope="module")
def tools() -> realkube.Tools:
    if find_go() is not None:
        build("build-simkube.sh")  # seconds; the control plane itself is never built here
    found = realkube.find_tools(KUBERNETES)
    if isinstance(found, str):
        pytest.skip(f"the real control plane {KUBERNETES} is {found}")
    return found


@contextmanager
def started(tools: realkube.Tools, tmp_path: Path, scenario: str) -> Iterator[Path]:
    """Two Talos 1.13 GPU workers in ``scenario`` on the real control plane, stopped afterwards."""
    state = tmp_path / "sim"
    cluster.create(state, cluster.ClusterSpec(workers=len(WORKERS), talos_version=TALOS, scenario=scenario))
    cluster.start_daemon(state, rooms=["factory"])
    try:
        realkube.start(state, tools)
        yield state
    finally:
        realkube.stop(state)
        cluster.stop_daemon(state)


@pytest.fixture
def gpu_ready(tools: realkube.Tools, tmp_path: Path) -> Iterator[Path]:
    """Two Talos 1.13 GPU workers with the NVIDIA extensions and modules (gpu-ready) on the real control plane."""
    with started(tools, tmp_path, "gpu-ready") as state:
        yield state


def context(state: Path) -> Context:
    return real_kube_context(state, WORKERS, TALOS)


def kubectl(state: Path, *args: str) -> str:
    """The real kubectl 1.35.2 the simulator puts in ``<state>/bin``, as a user runs it."""
    proc = subprocess.run(
        [str(state / "bin" / "kubectl"), "--kubeconfig", str(state / "kubeconfig"), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def pods(state: Path, app: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = json.loads(
        kubectl(state, "get", "pods", "-n", NAMESPACE, "-l", f"app={app}", "-o", "json")
    )["items"]
    return items


def waiting_in(pod: dict[str, Any]) -> str | None:
    """The init container a pod is running (and so waiting in), as ``kubectl describe`` shows it."""
    for status in (pod.get("status") or {}).get("initContainerStatuses") or []:
        if "running" in (status.get("state") or {}):
            return str(status["name"])
    return None


def held_on_every_worker(state: Path, app: str, init: str) -> bool:
    got = {p["spec"].get("nodeName"): waiting_in(p) for p in pods(state, app)}
    return got == dict.fromkeys(WORKERS, init)


# ---------------------------------------------------------------- what the operator decides (fast, no control plane)


@pytest.mark.parametrize(
    ("values", "daemonsets"),
    [
        (
            {"driver": {"enabled": False}, "toolkit": {"enabled": False}},
            ["validator", "device-plugin", "dcgm-exporter", "gpu-feature-discovery"],
        ),
        (  # the chart's defaults (values.yaml:119,211,223,280-281,339-340)
            {},
            [
                "driver",
                "container-toolkit",
                "validator",
                "device-plugin",
                "dcgm-exporter",
                "gpu-feature-discovery",
            ],
        ),
        (
            {"driver": {"enabled": "false"}, "devicePlugin": {"enabled": False}, "gfd": {"enabled": False}}
            | {"dcgmExporter": {"enabled": False}},
            ["container-toolkit", "validator"],
        ),
    ],
)
def test_the_operands_follow_the_cluster_policy(values: dict[str, Any], daemonsets: list[str]) -> None:
    """state_manager.go isStateEnabled: a driver or toolkit DaemonSet only when enabled (chart default: true)."""
    assert [op.component.replace("operator-", "") for op in gpuoperator.operands(values)] == daemonsets


@pytest.mark.parametrize(
    ("install_dir", "managed", "driver"),
    [
        ("/usr/local", False, True),  # the Talos 1.13 docs' values
        ("/usr/local/", False, True),
        ("/run/nvidia/driver", False, False),  # the chart's default: a driver container's directory
        ("/usr/local", True, False),  # driver.enabled: waits for the driver container
    ],
)
def test_driver_validation_on_a_talos_node(
    tmp_path: Path, install_dir: str, managed: bool, driver: bool
) -> None:
    state = tmp_path / "sim"
    cluster.create(state, cluster.ClusterSpec(workers=1, talos_version=TALOS, scenario="gpu-ready"))
    worker = next(n for n in load_nodes(state) if n.role == "worker")
    checks = gpuoperator.validations(worker, install_dir, managed)
    assert (checks.driver, checks.toolkit) == (driver, driver)


def test_a_node_without_the_modules_validates_nothing(tmp_path: Path) -> None:
    """The driver validation runs nvidia-smi: without the modules loaded (fresh: no NVIDIA config) it fails."""
    state = tmp_path / "sim"
    cluster.create(state, cluster.ClusterSpec(workers=1, talos_version=TALOS, scenario="fresh"))
    worker = next(n for n in load_nodes(state) if n.role == "worker")
    assert gpuoperator.validations(worker, "/usr/local", False) == gpuoperator.Validations(False, False)


# ---------------------------------------------------------------- on the real control plane (slow)


@pytest.mark.slow
def test_kubectl_sees_the_cluster_policy_and_the_operand_daemonsets_by_their_real_names(
    gpu_ready: Path,
) -> None:
    """The runbook's kubernetes step with its own values (driver and toolkit off, driverInstallDir /usr/local:
    the Talos 1.13 docs) installs the served chart with the real helm; the operator's DaemonSets are the real
    ones (no driver or toolkit DaemonSet with those values), RuntimeClass ``nvidia`` is the ClusterPolicy's, and
    every GPU node advertises its GPU."""
    ctx = context(gpu_ready)
    assert ctx.kube.server_version() == f"v{KUBERNETES}"  # the real API server, not the Python one
    result = kubernetes_layer(ctx, apply=True, timeout_s=180)
    assert result.ok, result.to_dict()
    assert [(n.status, n.data["allocatable_gpus"]) for n in result.nodes] == [("ok", 1), ("ok", 1)]
    release = ctx.helm.release("gpu-operator", NAMESPACE)
    assert release is not None and release.chart == "gpu-operator-v26.3.3"
    assert kubectl(gpu_ready, "get", "crd", "clusterpolicies.nvidia.com", "-o", "name").strip() == (
        "customresourcedefinition.apiextensions.k8s.io/clusterpolicies.nvidia.com"
    )
    wait_for_policy_ready(gpu_ready)
    names = kubectl(gpu_ready, "get", "daemonsets", "-n", NAMESPACE, "-o", "name").split()
    assert names == [
        "daemonset.apps/gpu-feature-discovery",  # gfd.enabled: the chart's default (values.yaml:339-340)
        "daemonset.apps/nvidia-dcgm-exporter",  # dcgmExporter.enabled: the default too (values.yaml:280-281)
        "daemonset.apps/nvidia-device-plugin-daemonset",
        "daemonset.apps/nvidia-operator-validator",
    ]
    _gfd_labelled_the_gpu_nodes(gpu_ready, ctx)
    assert "simulated GPU Operator" in realkube.describe(gpu_ready)  # what `runbook sim status` prints
    runtime_class = json.loads(kubectl(gpu_ready, "get", "runtimeclass", "nvidia", "-o", "json"))
    assert runtime_class["handler"] == "nvidia"
    assert [o["kind"] for o in runtime_class["metadata"]["ownerReferences"]] == ["ClusterPolicy"]


def _gfd_labelled_the_gpu_nodes(state: Path, ctx: Context) -> None:
    """GPU Feature Discovery's labels on each worker (NVIDIA/k8s-device-plugin@v0.18.0 internal/lm: the model
    with blanks as dashes, resource.go ``sanitise``; the driver's major version, nvml.go ``newVersionLabeler``),
    and the step's per-node line names the model, the value a nodeSelector targets it by."""
    drivers = {n.name: str(runtime(n).driver_version) for n in load_nodes(state) if n.name in WORKERS}

    def labels() -> dict[str, tuple[str, str]]:
        nodes = json.loads(kubectl(state, "get", "nodes", *WORKERS, "-o", "json"))["items"]
        got = {n["metadata"]["name"]: n["metadata"]["labels"] for n in nodes}
        return {
            k: (v.get("nvidia.com/gpu.product", ""), v.get("nvidia.com/cuda.driver.major", ""))
            for k, v in got.items()
        }

    want = {
        name: ("NVIDIA-L4", driver.split(".")[0]) for name, driver in drivers.items()
    }  # cluster.DEFAULT_GPU
    wait_for(lambda: labels() == want, 120)
    again = kubernetes_layer(ctx, apply=True, timeout_s=180)  # changes nothing: the per-node lines only
    assert [n.message for n in again.nodes] == [
        "1 allocatable nvidia.com/gpu (nvidia.com/gpu.product=NVIDIA-L4)"
    ] * 2


#: Regressions of the runbook's GPU_OPERATOR_VALUES (model/profiles.py), each leaving a real Talos node without
#: GPUs: the chart's default driver.enabled=true (the driver container cannot load modules on Talos), the chart's
#: default driverInstallDir (the validator finds no driver there), and the earlier docs draft's directory.
WRONG_VALUES = [
    pytest.param({"driver.enabled": "true"}, "nvidia-driver-daemonset", id="driver-enabled"),
    pytest.param({"hostPaths.driverInstallDir": "/run/nvidia/driver"}, None, id="default-driver-install-dir"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("wrong", "extra_daemonset"), WRONG_VALUES)
def test_wrong_values_leave_the_nodes_without_gpus_and_the_step_fails_with_its_diagnosis(
    gpu_ready: Path, wrong: dict[str, str], extra_daemonset: str | None
) -> None:
    """What a real cluster shows: the validator waits in driver-validation, the device plugin in
    toolkit-validation (``until [ -f /run/nvidia/validations/toolkit-ready ]``), no node advertises
    nvidia.com/gpu, and the kubernetes step fails each node with its diagnosis."""
    ctx = context(gpu_ready)
    ctx.plan.helm.values.update(wrong)
    assert not kubernetes_layer(ctx, apply=True, timeout_s=10).ok  # installs; the pods may not be held yet
    # The diagnosis reads where the pods wait: wait for them to be held there, then let the step diagnose (a
    # 60 s step timeout stood in for this wait before, a minute per case).
    wait_for(lambda: held_on_every_worker(gpu_ready, "nvidia-operator-validator", "driver-validation"), 120)
    # ... and the device plugin's new pods held in toolkit-validation: until the DaemonSet controller replaced the
    # previous test's plugin pods, those still read "ready" and the diagnosis named them (a race seen once).
    wait_for(
        lambda: held_on_every_worker(gpu_ready, "nvidia-device-plugin-daemonset", "toolkit-validation"), 120
    )
    result = kubernetes_layer(ctx, apply=True, timeout_s=1)
    assert not result.ok
    assert [(n.status, n.message) for n in result.nodes] == [
        ("failed", "no allocatable nvidia.com/gpu after 1 s")
    ] * len(WORKERS)
    # The diagnosis names where the operator's stack stops and the values that move it on (was: "the device
    # plugin runs but the node advertises no GPUs", while the plugin never left its init container).
    for node in result.nodes:
        (check,) = node.checks
        assert not check.ok and check.name == "GPU Operator driver validation", node.to_dict()
        assert check.message == f"nvidia-operator-validator on {node.node} waits in driver-validation"
        assert "driver.enabled=false" in check.fix and "hostPaths.driverInstallDir=/usr/local" in check.fix
    # The pods are held where the real ones loop, not merely slow (waited for above): nothing advertises.
    allocatable = kubectl(gpu_ready, "get", "nodes", "-o", "jsonpath={.items[*].status.allocatable}")
    assert "nvidia.com/gpu" not in allocatable
    listed = kubectl(gpu_ready, "get", "pods", "-n", NAMESPACE, "-l", "app=nvidia-device-plugin-daemonset")
    assert "Init:0/2" in listed
    names = kubectl(gpu_ready, "get", "daemonsets", "-n", NAMESPACE, "-o", "name").split()
    if extra_daemonset is not None:
        assert f"daemonset.apps/{extra_daemonset}" in names
        wait_for(lambda: all(crash_looping(p) for p in pods(gpu_ready, extra_daemonset)), 120)
    else:
        assert "daemonset.apps/nvidia-driver-daemonset" not in names


def crash_looping(pod: dict[str, Any]) -> bool:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return bool(statuses) and all(
        ((s.get("state") or {}).get("waiting") or {}).get("reason") == "CrashLoopBackOff" for s in statuses
    )


@pytest.mark.slow
def test_fixing_the_values_brings_the_gpus(gpu_ready: Path) -> None:
    """After a run with the chart's default driverInstallDir, a run with the runbook's values upgrades the
    release (helm's pre-upgrade CRD hook Job runs on kwok) and the held pods go on: every node gets its GPU."""
    wrong = context(gpu_ready)
    wrong.plan.helm.values["hostPaths.driverInstallDir"] = "/run/nvidia/driver"
    assert not kubernetes_layer(wrong, apply=True, timeout_s=10).ok
    wait_for(
        lambda: held_on_every_worker(gpu_ready, "nvidia-device-plugin-daemonset", "toolkit-validation"), 120
    )
    fixed = kubernetes_layer(context(gpu_ready), apply=True, timeout_s=180)
    assert fixed.ok, fixed.to_dict()
    history = json.loads(
        subprocess.run(
            [str(gpu_ready / "bin" / "helm"), "history", "gpu-operator", "-n", NAMESPACE, "-o", "json",
             "--kubeconfig", str(gpu_ready / "kubeconfig")],
            capture_output=True, text=True, timeout=60, check=True,
        ).stdout
    )  # fmt: skip
    # An upgrade, so helm ran the pre-upgrade hook Job (kwok completed it); revision 1 may be "failed" when a
    # loaded machine made its 10 s --wait too short, which does not change what this test checks.
    assert [h["revision"] for h in history] == [1, 2] and history[-1]["status"] == "deployed"


@pytest.mark.slow
@pytest.mark.parametrize("talosctl", ["python", "real"])
def test_runbook_run_on_talos_1_13_passes_every_step_with_the_gpu_operator_on_the_real_control_plane(
    tools: realkube.Tools, tmp_path: Path, talosctl: str
) -> None:
    """Issue 15's "done when" for 1.13: after ``runbook sim up`` (fresh Talos 1.13 nodes, the real control plane),
    ``runbook run -p params/simulated.yaml --set talos_version=v1.13.0 --apply`` passes all six steps with the
    GPU Operator installed by the real helm, and a second run changes nothing; with the Python talosctl and,
    where it is built, the real talosctl v1.13.0 against simnode. (``sim up`` first: a ``runbook run`` that
    starts the control plane itself starts it with an empty etcd, so its second run would install again.)"""
    env = {**os.environ, "RUNBOOK_SIM_KUBE": "real", "RUNBOOK_SIM_TALOSCTL": talosctl}
    if talosctl == "real":
        from tests.sim.test_real_talos_113 import real_env  # builds talosctl v1.13.0 and simnode, or skips

        env = real_env(tmp_path, "real")
    state, records = tmp_path / "state", tmp_path / "records"
    params_113 = tmp_path / "simulated-1.13.yaml"
    text = (ROOT / "params" / "simulated.yaml").read_text()
    params_113.write_text(text.replace("\ntalos_version: v1.12.7\n", f"\ntalos_version: {TALOS}\n"))
    assert f"\ntalos_version: {TALOS}\n" in params_113.read_text(), (
        "params/simulated.yaml changed its release line"
    )
    args = ["run", "-p", "params/simulated.yaml", "--set", f"talos_version={TALOS}", "--apply"]
    args += ["--state", str(state), "--records", str(records), "--no-progress"]
    try:
        up = runbook(env, "sim", "up", "-p", str(params_113), "--state", str(state))
        assert up.returncode == 0, up.stdout + up.stderr
        first = runbook(env, *args)
        assert first.returncode == 0, first.stdout + first.stderr
        changed = ["config-patch", "image", "kubernetes"]  # preflight, verify and cuda-test: ok
        assert [s for s, outcome in step_lines(first.stdout).items() if outcome != "ok"] == changed
        assert len(step_lines(first.stdout)) == 6, first.stdout
        (result,) = records.glob("*/results/kubernetes.json")
        changes = json.loads(result.read_text())["result"]["data"]["changes"]
        assert (
            "helm upgrade --install gpu-operator nvidia/gpu-operator --version v26.3.3 -n gpu-operator"
            in " ".join(changes)
        )
        second = runbook(env, *args)
        assert second.returncode == 0, second.stdout + second.stderr
        assert "nothing changed on the cluster" in second.stdout
    finally:
        runbook(env, "sim", "down", "--state", str(state))


def wait_for_policy_ready(state: Path) -> None:
    """Until ``kubectl get clusterpolicy cluster-policy`` shows the STATUS column ``ready`` (not ``notReady``)."""
    wait_for(lambda: "ready" in kubectl(state, "get", "clusterpolicy", "cluster-policy").split(), 120)


def operator_pods(state: Path) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = json.loads(
        kubectl(state, "get", "pods", "-n", NAMESPACE, "-l", gpuoperator.OPERATOR_SELECTOR, "-o", "json")
    )["items"]
    return items


def advertised(state: Path) -> list[str]:
    """The nvidia.com/gpu each worker's Node advertises, as kubectl prints it."""
    out = kubectl(
        state, "get", "nodes", *WORKERS, "-o", r"jsonpath={.items[*].status.allocatable.nvidia\.com/gpu}"
    )
    return out.split()


@pytest.mark.slow
def test_the_step_is_ok_only_once_the_operators_runtime_class_nvidia_exists(gpu_ready: Path) -> None:
    """cuda-test's pods set ``runtimeClassName: nvidia``; without that RuntimeClass the API server refuses them
    (``pod rejected: RuntimeClass "nvidia" not found``, kubernetes plugin/pkg/admission/runtimeclass/admission.go
    ``prepareObjects``). The operator creates it in its first state, pre-requisites (gpu-operator@v26.3.3
    controllers/state_manager.go:889, object_controls.go:5115-5160 ``transformRuntimeClass``: name and handler
    ``operator.runtimeClass``, default ``nvidia`` (object_controls.go:91), owned by the ClusterPolicy), and only
    while it runs and reconciles. Here the operator is scaled to 0 after a good install and the RuntimeClass
    deleted: the nodes keep their GPUs (the operands keep running), which is all the step waited for; it said ok
    and cuda-test then failed. One cluster for the three runs."""
    ctx = context(gpu_ready)
    first = kubernetes_layer(ctx, apply=True, timeout_s=180)
    assert first.ok, first.to_dict()
    assert (ctx.kube.runtime_class("nvidia") or {}).get("handler") == "nvidia"  # when the step says ok
    # The step waits for the RuntimeClass and the advertised GPUs, not for every operand: under load the
    # ClusterPolicy may still be notReady here (the fresh-clone CI run of 3 Dec met it), and an operator scaled
    # to 0 would leave it so. "After a good install" means ready, so wait for it as a user would.
    wait_for_policy_ready(gpu_ready)

    kubectl(gpu_ready, "-n", NAMESPACE, "scale", "deployment/gpu-operator", "--replicas=0")
    wait_for(lambda: not operator_pods(gpu_ready), 120)
    kubectl(gpu_ready, "delete", "runtimeclass", "nvidia")
    assert advertised(gpu_ready) == ["1", "1"]
    stalled = kubernetes_layer(context(gpu_ready), apply=True, timeout_s=5)
    assert not stalled.ok
    failed = [c for c in stalled.checks if not c.ok]
    assert [c.name for c in failed] == ["RuntimeClass nvidia created by the GPU Operator"], stalled.to_dict()
    assert [n.status for n in stalled.nodes] == [
        "ok",
        "ok",
    ]  # the GPUs are there: only the RuntimeClass is not
    check = failed[0]
    assert check.message == (
        "missing after 5 s: the GPU Operator creates it (ClusterPolicy cluster-policy, state ready), "
        "but no gpu-operator pod is Ready in namespace gpu-operator"
    )
    assert check.fix.startswith("kubectl -n gpu-operator rollout status deployment/gpu-operator")

    kubectl(gpu_ready, "-n", NAMESPACE, "scale", "deployment/gpu-operator", "--replicas=1")
    again = kubernetes_layer(context(gpu_ready), apply=True, timeout_s=180)
    assert again.ok, again.to_dict()
    runtime_class = ctx.kube.runtime_class("nvidia") or {}
    assert runtime_class.get("handler") == "nvidia"
    assert [o["kind"] for o in runtime_class["metadata"]["ownerReferences"]] == ["ClusterPolicy"]


@pytest.mark.slow
def test_on_nodes_without_the_nvidia_extensions_the_diagnosis_points_at_the_node_not_the_values(
    tools: realkube.Tools, tmp_path: Path
) -> None:
    """Talos 1.13 nodes that never got the NVIDIA extensions (scenario fresh), the runbook's own values: the
    validator waits in driver-validation exactly as with wrong values (gpu-operator@v26.3.3
    cmd/nvidia-validator/main.go:745-837: no /host/usr/bin/nvidia-smi, then nvidia-smi and libnvidia-ml.so.1
    looked for under driverInstallDir, retried while WITH_WAIT logging only "failed to validate the driver,
    retrying" (main.go:795-806)), so its pod status cannot tell the two apart; the release's values can. The fix was ``helm upgrade --reuse-values`` with the values the release
    already had, which changes nothing (U5's finding)."""
    with started(tools, tmp_path, "fresh") as state:
        # installs; the pods may not be held yet
        assert not kubernetes_layer(context(state), apply=True, timeout_s=10).ok
        wait_for(lambda: held_on_every_worker(state, "nvidia-operator-validator", "driver-validation"), 120)
        result = kubernetes_layer(context(state), apply=True, timeout_s=1)
    assert [(n.status, [c.name for c in n.checks]) for n in result.nodes] == [
        ("failed", ["GPU Operator driver validation"])
    ] * len(WORKERS)
    for node in result.nodes:
        (check,) = node.checks
        assert "helm upgrade" not in check.fix, check
        assert "--steps config-patch,image,verify --apply" in check.fix
        assert "the release already has the runbook's values" in check.cause
