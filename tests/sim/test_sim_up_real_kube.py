"""The simulated cluster on the real Kubernetes control plane (issue 15, wiring slice).

The runbook's kubernetes step, unchanged, against what ``runbook sim up`` starts with
``RUNBOOK_SIM_KUBE=real``: simkube (the real kube-apiserver, controller-manager and scheduler v1.35.0), kwok
running the simulated nodes' kubelets, the GPU node agent and the chart repository serving our stand-in
``nvidia-device-plugin`` chart, installed by the real helm 4.1.4. Skipped, saying what to build, when the
binaries are not built (``make kube-tools``); these tests never build them.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runbook_lib.model.params import validate
from runbook_lib.notebook.records import secret_values
from runbook_lib.sim import cluster, realkube
from runbook_lib.sim.state import locked_node, talos_kubeconfig_path, v1alpha1_doc
from runbook_lib.steps.context import Context, connect
from runbook_lib.steps.cudatest import cuda_test
from runbook_lib.steps.kubernetes import kubernetes_layer
from tests.sim.test_real_talosctl import build, find_go

pytestmark = pytest.mark.slow

TALOS = "v1.12.7"  # Kubernetes 1.35.0 (state.KUBERNETES_FOR_TALOS)
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tools() -> realkube.Tools:
    if find_go() is not None:
        build(
            "build-simkube.sh"
        )  # seconds (standard library only); the control plane itself is never built here
    found = realkube.find_tools("1.35.0")
    if isinstance(found, str):
        pytest.skip(f"the real control plane is {found}")
    return found


def without_modules(state: Path, node: str) -> None:
    """The node keeps the NVIDIA extensions but its machine config no longer loads the modules."""
    with locked_node(state, node) as sim:
        (v1alpha1_doc(sim.machine_config).setdefault("machine", {}).setdefault("kernel", {}))["modules"] = []


def up(state: Path, tools: realkube.Tools, workers: int, scenario: str) -> dict[str, Any]:
    cluster.create(state, cluster.ClusterSpec(workers=workers, talos_version=TALOS, scenario=scenario))
    cluster.start_daemon(state, rooms=["factory"])
    return realkube.start(state, tools)


def down(state: Path) -> None:
    realkube.stop(state)
    cluster.stop_daemon(state)


def context(state: Path, workers: list[str], talos: str = TALOS) -> Context:
    """The runbook's context for ``workers`` of the simulated cluster in ``state`` (Talos ``talos``)."""
    data = {
        "cluster": "real-kube",
        "target": "simulated",
        "talos_version": talos,
        "nodes": [{"name": n, "address": f"10.5.0.{3 + i}"} for i, n in enumerate(workers)],
    }
    return connect(validate(data, source="test"), state_dir=state)


@pytest.fixture
def three_gpu_nodes(tools: realkube.Tools, tmp_path: Path) -> Iterator[tuple[Path, dict[str, Any]]]:
    """gpu-ready nodes on the real control plane, the last one without the modules in its machine config."""
    state = tmp_path / "sim"
    cluster.create(state, cluster.ClusterSpec(workers=3, talos_version=TALOS, scenario="gpu-ready"))
    without_modules(state, "talos-worker-3")
    cluster.start_daemon(state, rooms=["factory"])
    try:
        yield state, realkube.start(state, tools)
    finally:
        down(state)


def test_kubernetes_step_installs_the_served_chart_and_gpus_follow_the_nodes_state(
    three_gpu_nodes: tuple[Path, dict[str, Any]],
) -> None:
    """Real helm installs our nvidia-device-plugin 0.18.0 from the simulator's repository into the real API
    server; kwok runs its DaemonSet's pods; the node agent advertises nvidia.com/gpu on the two nodes whose
    modules are loaded, never on the third: there the nvidia runtime's hook finds no driver, so the plugin
    container never starts and crash-loops with the runtime's error in its last state (where the container
    does start without NVML, the plugin exits 1 instead: its fail-on-init-error defaults to true,
    NVIDIA/k8s-device-plugin@v0.18.0 cmd/nvidia-device-plugin/main.go)."""
    state, info = three_gpu_nodes
    ctx = context(state, ["talos-worker-1", "talos-worker-2", "talos-worker-3"])
    assert ctx.plan.helm.repo_url == info["charts"]
    assert ctx.kube.server_version() == "v1.35.0"  # the real API server, not the Python one
    # 60 s, as the third node waits all of it: the two good ones need kwok to start their plugin pods and the agent
    # to see them ready, which a loaded machine (the real API server, etcd, kwok and helm at once) can slow to 30 s
    result = kubernetes_layer(ctx, apply=True, timeout_s=60)
    added = [list(e.argv[1:5]) for e in ctx.journal.entries if list(e.argv[1:3]) == ["repo", "add"]]
    assert added == [["repo", "add", "nvdp", info["charts"]]]
    release = ctx.helm.release("nvidia-device-plugin", "kube-system")
    # deployed, or failed when helm's --wait saw the third pod crash before it saw all three ready
    assert release is not None and release.chart == "nvidia-device-plugin-0.18.0"
    by_node = {n.node: n for n in result.nodes}
    ok = [
        (by_node[n].status, by_node[n].data["allocatable_gpus"]) for n in ("talos-worker-1", "talos-worker-2")
    ]
    assert ok == [("ok", 1), ("ok", 1)]
    assert (by_node["talos-worker-3"].status, by_node["talos-worker-3"].message) == (
        "failed",
        "no allocatable nvidia.com/gpu after 60 s",
    )
    (crashing,) = [
        p
        for p in ctx.kube.core.list_namespaced_pod(
            "kube-system", label_selector="app.kubernetes.io/instance=nvidia-device-plugin"
        ).items
        if p.spec.node_name == "talos-worker-3"
    ]
    status = crashing.status.container_statuses[0]
    assert status.state.waiting.reason == "CrashLoopBackOff"
    # Talos 1.12's toolkit runs the legacy nvidia-container-cli hook, which fails without the driver
    # (containerd's words as kubelet.py's _gpu_access writes them: no source found for the exact text).
    assert status.last_state.terminated.reason == "StartError"
    assert "nvidia-container-cli: initialization error: nvml error: driver not loaded" in (
        status.last_state.terminated.message
    )


def test_gpus_appear_once_the_modules_are_loaded(three_gpu_nodes: tuple[Path, dict[str, Any]]) -> None:
    """The agent follows the node's Talos state: once the modules are loaded (what the config-patch step
    does), the crash-looping device plugin comes up at its next restart and the node advertises its GPU."""
    state, _ = three_gpu_nodes
    ctx = context(state, ["talos-worker-3"])
    assert not kubernetes_layer(ctx, apply=True, timeout_s=10).ok
    with locked_node(state, "talos-worker-1") as good:
        modules = v1alpha1_doc(good.machine_config)["machine"]["kernel"]["modules"]
    with locked_node(state, "talos-worker-3") as sim:
        v1alpha1_doc(sim.machine_config)["machine"]["kernel"]["modules"] = modules
    # The plugin recovers at its next restart, which the back-off may put up to 5 minutes away (10 s doubling
    # from the first crash: nodeagent.backoff_seconds); a run that took long before this line must still see it
    again = kubernetes_layer(ctx, apply=True, timeout_s=360)
    assert again.ok, again.to_dict()
    assert again.nodes[0].data["allocatable_gpus"] == 1


def test_stop_leaves_nothing_running(tools: realkube.Tools, tmp_path: Path) -> None:
    """Stopping the supervisor stops simkube's components and kwok, and takes the published URLs away."""
    state = tmp_path / "sim"
    info = up(state, tools, 1, "fresh")
    pids = list(info["components"].values())
    supervisor = info["pid"]
    assert all(_alive(p) for p in [supervisor, *pids])
    assert realkube.stop(state) is True
    cluster.stop_daemon(state)
    assert not [p for p in [supervisor, *pids] if _alive(p)]
    assert not (state / "realkube.json").exists()
    assert not [p for p in Path("/proc").glob("[0-9]*") if str(state) in _cmdline(p)]


def test_an_unknown_mode_is_refused_naming_the_variable() -> None:
    with pytest.raises(ValueError, match=r"RUNBOOK_SIM_KUBE='rael' is not a choice: use real"):
        realkube.choose("1.35.0", {"RUNBOOK_SIM_KUBE": "rael"})


def test_real_without_the_binaries_names_what_to_build(tmp_path: Path) -> None:
    env = {**os.environ, "RUNBOOK_TOOLS_CACHE": str(tmp_path)}
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "from runbook_lib.sim import realkube; realkube.choose('1.35.0', {'RUNBOOK_SIM_KUBE': 'real'})",
        ],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    assert "RUNBOOK_SIM_KUBE=real but the control plane is not built:" in proc.stderr
    assert "make kube-tools KUBE_VERSIONS=v1.35.0" in proc.stderr  # as the README and .ci/run say it


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def _cmdline(proc_dir: Path) -> str:
    try:
        return (proc_dir / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def test_published_endpoints_name_the_real_api_and_the_chart_repository_and_records_redact_its_client_key(
    three_gpu_nodes: tuple[Path, dict[str, Any]],
) -> None:
    """Also: the Talos-shaped admin kubeconfig the real plane writes (simkube's, client certificate and key) has its
    key's PEM lines among the secrets change records scrub (``records.secret_values``), as the retired Python API's
    test_kubeapi_client_cert.py checked for its own."""
    state, info = three_gpu_nodes
    user = json.loads(talos_kubeconfig_path(state).read_text())["users"][0]["user"]
    pem = base64.b64decode(user["client-key-data"]).decode().splitlines()
    body = {line for line in pem if not line.startswith("-----")}
    # counts only in the assertion: a failure must not print the key
    lines, unredacted = len(body), len(body - set(secret_values(talos_kubeconfig_path(state))))
    assert lines > 0 and unredacted == 0
    endpoints = json.loads((state / "endpoints.json").read_text())
    assert endpoints["kube"] == info["kube"] and endpoints["charts"] == info["charts"]
    deadline = time.monotonic() + 60
    out = ""
    while time.monotonic() < deadline:
        out = subprocess.run(
            [str(state / "bin" / "kubectl"), "--kubeconfig", str(state / "kubeconfig"), "get", "nodes", "-o",
             "jsonpath={range .items[*]}{.metadata.name}={.status.conditions[?(@.type==\"Ready\")].status} {end}"],
            capture_output=True, text=True, check=False,
        ).stdout  # fmt: skip
        if out.split() == [f"talos-{n}=True" for n in ("cp-1", "worker-1", "worker-2", "worker-3")]:
            break
        time.sleep(0.5)
    assert out.split() == [f"talos-{n}=True" for n in ("cp-1", "worker-1", "worker-2", "worker-3")]


def runbook(*args: str, mode: str | None, **env: str) -> subprocess.CompletedProcess[str]:
    """``runbook ARGS`` in a fresh process with ``RUNBOOK_SIM_KUBE=mode`` (None: unset) and ``env``."""
    environ = {k: v for k, v in os.environ.items() if k != realkube.MODE_ENV} | env
    return subprocess.run(
        [sys.executable, "-m", "runbook_lib", *args],
        env=environ if mode is None else environ | {realkube.MODE_ENV: mode},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=ROOT,
    )


def test_sim_up_starts_the_real_control_plane_and_sim_down_stops_it(
    tools: realkube.Tools, tmp_path: Path
) -> None:
    """What a user runs: ``runbook sim up`` prints the real API server and the chart repository, the state's
    kubectl and kubeconfig reach it, and ``runbook sim down`` leaves no process of this state running."""
    state = tmp_path / "sim"
    try:
        started = runbook("sim", "up", "--state", str(state), "--nodes", "1", mode="real")
        assert started.returncode == 0, started.stderr
        assert "kubernetes:  real control plane v1.35.0\n" in started.stdout
        charts = json.loads((state / "endpoints.json").read_text())["charts"]
        assert f"charts:      {charts}" in started.stdout
        kubectl = [str(state / "bin" / "kubectl"), "--kubeconfig", str(state / "kubeconfig")]
        status = runbook("sim", "status", "--state", str(state), mode="real").stdout
        assert "kubernetes:  real control plane v1.35.0 (supervisor pid " in status
        assert ": etcd, kube-apiserver, kube-controller-manager, kube-scheduler; kwok v0.8.0;" in status
        version = json.loads(
            subprocess.run(
                [*kubectl, "version", "-o", "json"], capture_output=True, text=True, check=True
            ).stdout
        )
        assert version["serverVersion"]["gitVersion"] == "v1.35.0"
        info = "{range .items[*]}{.status.nodeInfo.kubeletVersion} {.status.nodeInfo.osImage};{end}"
        nodes = subprocess.run(
            [*kubectl, "get", "nodes", "-o", f"jsonpath={info}"], capture_output=True, text=True, check=True
        )
        talos = json.loads((state / "cluster.json").read_text())["talos_version"]
        assert (
            nodes.stdout == f"v1.35.0 Talos ({talos});" * 2
        )  # as a Talos node's kubelet reports, not kwok's
    finally:
        stopped = runbook("sim", "down", "--state", str(state), mode="real")
    assert stopped.returncode == 0 and stopped.stdout.startswith("simulator stopped")
    assert not [p for p in Path("/proc").glob("[0-9]*") if str(state) in _cmdline(p)]


def test_the_control_plane_follows_the_daemon_it_was_started_with(
    tools: realkube.Tools, tmp_path: Path
) -> None:
    """``runbook run`` stops (or replaces) only the daemon: the supervisor notices and stops everything."""
    state = tmp_path / "sim"
    info = up(state, tools, 1, "fresh")
    cluster.stop_daemon(state)
    deadline = time.monotonic() + 90
    while [p for p in [info["pid"], *info["components"].values()] if _alive(p)]:
        assert time.monotonic() < deadline, "the real control plane outlived its daemon"
        time.sleep(0.5)
    assert realkube.supervisor_pid(state) is None


def test_a_bad_mode_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    state = tmp_path / "sim"
    refused = runbook("sim", "up", "--state", str(state), "--nodes", "1", mode="rael")
    assert refused.returncode == 2
    assert (
        "RUNBOOK_SIM_KUBE='rael' is not a choice: use real (the real control plane) or leave it unset"
        in refused.stderr
    )
    assert not state.exists()


def test_the_real_control_plane_state_is_private_whatever_the_umask(
    tools: realkube.Tools, tmp_path: Path
) -> None:
    """Like the rest of the state (attack report F14): helm writes index.yaml 0644 whatever the umask."""
    state = tmp_path / "sim"
    proc = subprocess.run(
        [sys.executable, "-m", "runbook_lib", "sim", "up", "--state", str(state), "--nodes", "1"],
        env={**os.environ, "RUNBOOK_SIM_KUBE": "real"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=ROOT,
        umask=0,
    )
    try:
        assert proc.returncode == 0, proc.stderr
        assert (state / "charts" / "index.yaml").is_file()
        open_to_others = [str(p) for p in state.rglob("*") if not p.is_symlink() and p.stat().st_mode & 0o077]
        assert open_to_others == []
    finally:
        runbook("sim", "down", "--state", str(state), mode="real")


def test_cuda_test_runs_its_pods_on_kwok_and_reads_nvidia_smi_through_the_api_server(
    tools: realkube.Tools, tmp_path: Path
) -> None:
    """The cuda-test step end to end on the real control plane: its pods (runtimeClassName nvidia, with and
    without nvidia.com/gpu: 1, the latter placed by the real scheduler) are run by kwok, finished by the node
    agent from the node's state, and their logs read back through the real API server (kubelet API behind
    simkube --kubelet-proxy): nvidia-smi names the node's GPU and driver, vectoradd passes."""
    state = tmp_path / "sim"
    up(state, tools, 2, "gpu-ready")
    try:
        ctx = context(state, ["talos-worker-1", "talos-worker-2"])
        assert kubernetes_layer(ctx, apply=True, timeout_s=90).ok
        result = cuda_test(ctx, apply=True)
        assert result.ok, result.to_dict()
        for node in result.nodes:
            by_title = {c.name: c for c in node.checks}
            smi = by_title["nvidia-smi with nvidia.com/gpu: 1"].message
            assert smi.startswith("1 GPU(s) (NVIDIA L4), driver "), smi
            assert by_title["CUDA vectoradd (runtimeClass nvidia)"].message == "Test PASSED"
        assert result.data["pods_deleted"] == 8
    finally:
        down(state)


def test_runbook_run_applies_every_step_on_the_real_control_plane_and_a_second_run_changes_nothing(
    tools: realkube.Tools, tmp_path: Path
) -> None:
    """Issue 15's first "done when" for Talos 1.12: after ``runbook sim up -p params/simulated.yaml`` (fresh
    nodes, the real control plane), ``runbook run --apply`` passes all six steps (the device plugin from the
    served repository by the real helm, the CUDA pods on kwok with their logs through the real API server),
    and a second run finds nothing to change."""
    state, records = tmp_path / "sim", tmp_path / "records"
    params = str(ROOT / "params" / "simulated.yaml")
    try:
        started = runbook("sim", "up", "-p", params, "--state", str(state), mode="real")
        assert started.returncode == 0, started.stderr
        run = [
            "run",
            "-p",
            params,
            "--apply",
            "--state",
            str(state),
            "--records",
            str(records),
            "--no-progress",
        ]
        first = runbook(*run, mode="real")
        assert first.returncode == 0, first.stdout + first.stderr
        names = ("preflight", "config-patch", "image", "verify", "kubernetes", "cuda-test")
        # the step lines (the rollout's live lines, "image: batch 1/1 done: …", come before them)
        steps = [
            words[:2] for words in map(str.split, first.stdout.splitlines()) if words and words[0] in names
        ]
        assert steps == [
            ["preflight", "ok"],
            ["config-patch", "changed"],
            ["image", "changed"],
            ["verify", "ok"],
            ["kubernetes", "changed"],
            ["cuda-test", "ok"],
        ], first.stdout
        second = runbook(*run, mode="real")
        assert second.returncode == 0, second.stdout + second.stderr
        assert "nothing changed on the cluster" in second.stdout
    finally:
        runbook("sim", "down", "--state", str(state), mode="real")


def test_runbook_run_starts_the_real_control_plane_itself_and_stops_it(
    tools: realkube.Tools, tmp_path: Path
) -> None:
    """Without ``sim up``, ``runbook run`` on ``target: simulated`` brings the simulator up with the real
    control plane (the kubernetes step's plan adds the simulator's own chart repository with the real helm)
    and, having started it, stops all of it."""
    state, records = tmp_path / "sim", tmp_path / "records"
    params = str(ROOT / "params" / "simulated.yaml")
    args = ["run", "-p", params, "--steps", "kubernetes", "--state", str(state), "--records", str(records)]
    run = runbook(*args, "--no-progress", mode="real")
    assert run.returncode == 0, run.stdout + run.stderr
    (result,) = records.glob("*/results/kubernetes.json")
    assert '"repo", "add", "nvdp", "http://127.0.0.1:' in " ".join(result.read_text().split())
    assert realkube.supervisor_pid(state) is None
    assert not [p for p in Path("/proc").glob("[0-9]*") if str(state) in _cmdline(p)]


def test_without_the_toolkit_pods_of_runtime_class_nvidia_get_no_sandbox(
    tools: realkube.Tools, tmp_path: Path
) -> None:
    """On the toolkit-missing node (kernel modules, no container toolkit, so no ``nvidia`` runtime handler)
    the device plugin never starts, so no GPU, and the CUDA pods stay Pending with containerd's sandbox error,
    which the cuda-test step diagnoses (model/diagnosis.py: the toolkit extension is missing)."""
    state = tmp_path / "sim"
    up(state, tools, 2, "toolkit-missing")
    try:
        data = {
            "cluster": "real-kube",
            "target": "simulated",
            "talos_version": TALOS,
            "nodes": [{"name": "talos-worker-2", "address": "10.5.0.4"}],
            # the sandbox error is read once, at the timeout: kwok must have started the pod and the node agent
            # sent it back to Pending by then (seconds; 60 s for a loaded machine)
            "cuda_test": {"timeout_seconds": 60, "vectoradd_image": None, "request_gpu": False},
        }
        ctx = connect(validate(data, source="test"), state_dir=state)
        layer = kubernetes_layer(ctx, apply=True, timeout_s=20)
        assert [n.data["allocatable_gpus"] for n in layer.nodes] == [0]
        result = cuda_test(ctx, apply=True)
        (check,) = result.nodes[0].checks
        assert not check.ok and check.message.startswith("pod still Pending after 60 s")
        assert 'no runtime for "nvidia" is configured' in check.evidence
        assert "toolkit" in (check.cause + check.fix).lower()
    finally:
        down(state)


# ---------------------------------------------------------------- which control plane when the nodes' is not built


def _fake_cache(root: Path, *releases: str) -> None:
    """A tools cache holding the control plane of ``releases`` and every other tool ``find_tools`` looks for
    (empty files: which release is chosen is all these tests read)."""
    clients = root / "kube-clients" / realkube.CLIENTS_PACKAGE_VERSION / "bin"
    kwok = root / "kwok" / realkube.KWOK_VERSION
    files = [
        root / "simkube" / realkube.simkube_key() / "simkube",
        kwok / "bin" / "kwok",
        kwok / "stages.yaml",
    ]
    files += [clients / "kubectl", clients / "helm"]
    files += [root / "kube" / r / "bin" / b for r in releases for b in realkube.KUBE_BINARIES]
    for path in files:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")


@pytest.mark.parametrize(
    ("built", "wanted", "runs"),
    [
        (("v1.35.0", "v1.36.0"), "1.30.0", "v1.35.0"),  # Talos 1.7: the nearest minor
        (("v1.35.0", "v1.36.0"), "1.37.0", "v1.36.0"),  # Talos 1.14 in CI (.ci/run builds no 1.37)
        (("v1.29.0", "v1.30.2", "v1.31.0"), "1.30.0", "v1.30.2"),  # the same minor's other patch first
        (("v1.34.0", "v1.36.0"), "1.35.0", "v1.36.0"),  # a tie: the newer
        (("v1.35.0", "v1.35.3"), "1.35.0", "v1.35.0"),  # the release itself when built
    ],
)
def test_the_nearest_built_control_plane_stands_in_for_one_not_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, built: tuple[str, ...], wanted: str, runs: str
) -> None:
    monkeypatch.setenv("RUNBOOK_TOOLS_CACHE", str(tmp_path))
    _fake_cache(tmp_path, *built)
    assert realkube.choose(wanted, {}).kube_bin == tmp_path / "kube" / runs / "bin"


def _started_here(state: Path) -> list[str]:
    return [c for p in Path("/proc").glob("[0-9]*") if str(state) in (c := _cmdline(p))]


def test_nothing_built_is_an_error_naming_what_to_build_and_nothing_starts(tmp_path: Path) -> None:
    """No control plane in the cache at all (no Go, or ``make kube-tools`` never run): ``sim up`` stops before
    writing anything, naming what is missing and the command that builds the nodes' release."""
    state = tmp_path / "sim"
    refused = runbook(
        "sim", "up", "--state", str(state), "--nodes", "1", "--talos-version", "1.7.0",
        mode=None, RUNBOOK_TOOLS_CACHE=str(tmp_path / "cache"),
    )  # fmt: skip
    assert refused.returncode == 2, refused.stderr
    assert "the real control plane is not built: " in refused.stderr
    assert "kube-apiserver" in refused.stderr and "(make kube-tools KUBE_VERSIONS=v1.30.0" in refused.stderr
    assert not state.exists() and _started_here(state) == []


def test_the_python_api_server_is_refused_as_retired(tmp_path: Path) -> None:
    state = tmp_path / "sim"
    refused = runbook("sim", "up", "--state", str(state), "--nodes", "1", mode="python")
    assert refused.returncode == 2
    assert (
        "RUNBOOK_SIM_KUBE=python: the Python Kubernetes API server was retired (2 Dec 2026)" in refused.stderr
    )
    assert "unset RUNBOOK_SIM_KUBE" in refused.stderr
    assert not state.exists()


def test_sim_up_and_status_say_which_release_stands_in_for_talos_1_7_s_kubernetes(
    tools: realkube.Tools, tmp_path: Path
) -> None:
    """Talos 1.7 ships Kubernetes 1.30.0, which this project does not build: the nearest built release runs the
    control plane, and ``sim up``, ``sim status`` and ``kubectl version`` agree on which. Talos 1.7 supports
    Kubernetes 1.25 to 1.30 (talos pkg/machinery/compatibility/talos17/talos17.go MinimumKubernetesVersion
    1.25.0, MaximumKubernetesVersion 1.30.99; website/content/v1.7/introduction/support-matrix.md lists
    "1.30, 1.29, 1.28, 1.27, 1.26, 1.25"), so a 1.35 or 1.36 stand-in is outside it, and the line says so."""
    if isinstance(realkube.find_tools("1.30.0"), realkube.Tools):
        pytest.skip("Kubernetes 1.30 is built here: it runs itself, nothing stands in")
    state = tmp_path / "sim"
    try:
        started = runbook(
            "sim", "up", "--state", str(state), "--nodes", "1", "--talos-version", "1.7.0", mode=None
        )
        assert started.returncode == 0, started.stderr
        kubectl = [str(state / "bin" / "kubectl"), "--kubeconfig", str(state / "kubeconfig")]
        version = subprocess.run(
            [*kubectl, "version", "-o", "json"], capture_output=True, text=True, check=True
        )
        served = json.loads(version.stdout)["serverVersion"]["gitVersion"]
        line = (
            f"real control plane {served} standing in for v1.30.0, which Talos v1.7.0 ships (not built: make "
            "kube-tools KUBE_VERSIONS=v1.30.0; outside the Kubernetes 1.25-1.30 Talos 1.7 supports)"
        )
        assert f"kubernetes:  {line}\n" in started.stdout
        status = runbook("sim", "status", "--state", str(state), mode=None)
        assert f"kubernetes:  {line} (supervisor pid " in status.stdout
    finally:
        runbook("sim", "down", "--state", str(state), mode=None)
    assert _started_here(state) == []
