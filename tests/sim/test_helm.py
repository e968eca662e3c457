"""The simulated ``helm`` executable (as ``runbook sim up`` puts it in the state's ``bin/``) against the simulated API."""

from __future__ import annotations

import base64
import gzip
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from runbook_lib.sim import cluster, scenarios
from runbook_lib.sim.kubeapi import server
from runbook_lib.sim.state import load_node, locked_node, runtime, sim_paths, v1alpha1_doc
from tests.sim.waiting import wait_for

DOCS_INSTALL = [
    "install",
    "nvidia-device-plugin",
    "nvdp/nvidia-device-plugin",
    "--version=0.13.0",
    "--set=runtimeClassName=nvidia",
]
NVDP = "https://nvidia.github.io/k8s-device-plugin"
NGC = "https://helm.ngc.nvidia.com/nvidia"


class Sim:
    def __init__(self, state: Path, srv: server.KubeServer) -> None:
        self.state = state
        self.srv = srv
        api = config.new_client_from_config(config_file=str(sim_paths(state).kubeconfig))
        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)
        self.node = client.NodeV1Api(api)
        self.custom = client.CustomObjectsApi(api)

    def helm(self, *argv: str, check: bool = False) -> subprocess.CompletedProcess[str]:
        env = {"PATH": os.environ.get("PATH", ""), "HOME": str(self.state)}
        out = subprocess.run(
            [str(sim_paths(self.state).bin_dir / "helm"), *argv],
            check=False,
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        if check:
            assert out.returncode == 0, out.stderr
        return out

    def gpus(self, node: str) -> str | None:
        return (self.core.read_node(node).status.allocatable or {}).get("nvidia.com/gpu")


def _sim(tmp_path: Path, **spec: Any) -> Iterator[Sim]:
    cluster.create(tmp_path, cluster.ClusterSpec(**{"workers": 2, "talos_version": "1.12", **spec}))
    srv = server.serve_in_thread(tmp_path)
    try:
        yield Sim(tmp_path, srv)
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.fixture
def sim(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Sim]:
    yield from _sim(tmp_path, **getattr(request, "param", {}))


def runtime_class(sim: Sim) -> None:
    sim.node.create_runtime_class(
        client.V1RuntimeClass(metadata=client.V1ObjectMeta(name="nvidia"), handler="nvidia")
    )


# --- the "Done when" --------------------------------------------------------------------------


@pytest.mark.slow
def test_docs_command_in_kube_system_gives_gpus_only_after_extensions_and_modules_patch(sim: Sim) -> None:
    sim.helm("repo", "add", "nvdp", NVDP, check=True)
    sim.helm("repo", "update", check=True)
    runtime_class(sim)
    out = sim.helm(*DOCS_INSTALL, "-n", "kube-system", check=True)
    assert "STATUS: deployed" in out.stdout and "NAMESPACE: kube-system" in out.stdout
    workers = ["talos-worker-1", "talos-worker-2"]
    wait_for(
        lambda: [
            e
            for e in sim.core.list_namespaced_event("kube-system").items
            if e.reason == "FailedCreatePodSandBox"
        ]
    )
    assert all(sim.gpus(n) is None for n in workers)
    for n in workers:  # the modules patch alone is not enough: the kmod and toolkit extensions are missing
        with locked_node(sim.state, n) as node:
            machine = v1alpha1_doc(node.machine_config).setdefault("machine", {})
            machine["kernel"] = {
                "modules": [{"name": m} for m in ("nvidia", "nvidia_uvm", "nvidia_drm", "nvidia_modeset")]
            }
            machine["sysctls"] = {"net.core.bpf_jit_harden": "1"}
    time.sleep(1.0)
    assert all(sim.gpus(n) is None for n in workers)
    assert all(not runtime(load_node(sim.state, n)).modules_live for n in workers)
    for n in workers:  # the GPU schematic's extensions complete the node
        with locked_node(sim.state, n) as node:
            scenarios.install_nvidia(sim.state, node, patch_modules=False)
    for n in workers:
        assert wait_for(lambda n=n: sim.gpus(n)) == str(len(load_node(sim.state, n).gpus))


def test_docs_command_as_written_fails_in_the_default_namespace(sim: Sim) -> None:
    sim.helm("repo", "add", "nvdp", NVDP, check=True)
    out = sim.helm(*DOCS_INSTALL)
    assert out.returncode == 1
    assert out.stderr == (
        "Error: INSTALLATION FAILED: execution error at (nvidia-device-plugin/templates/validation.yml:19:4): \n"
        "Running in the 'default' namespace is not recommended.\n"
        "Set 'allowDefaultNamespace=true' to bypass this error.\n"
        "Otherwise, use --namespace (with --create-namespace as necessary) to run in a specific namespace.\n"
        "See: https://helm.sh/docs/helm/helm_install/#options\n"
    )
    assert sim.apps.list_daemon_set_for_all_namespaces().items == []
    assert json.loads(sim.helm("list", "-A", "-o", "json", check=True).stdout) == []
    # The bypass the message names really bypasses it (and then Pod Security bites instead).
    runtime_class(sim)
    sim.helm(*DOCS_INSTALL, "--set", "allowDefaultNamespace=true", check=True)
    ev = wait_for(
        lambda: [e for e in sim.core.list_namespaced_event("default").items if e.reason == "FailedCreate"]
    )
    assert (
        'violates PodSecurity "baseline:latest": hostPath volumes (volume "device-plugin")' in ev[0].message
    )


# --- CLI behaviour and error texts --------------------------------------------------------------------


def test_error_texts_match_helm(sim: Sim) -> None:
    out = sim.helm("install", "x", "nvdp/nvidia-device-plugin", "--bogus-flag")
    assert (out.returncode, out.stderr) == (1, "Error: unknown flag: --bogus-flag\n")
    out = sim.helm("install", "x", "nvdp/nvidia-device-plugin", "-n", "kube-system")
    assert out.stderr == "Error: INSTALLATION FAILED: repo nvdp not found\n"
    bad = sim.helm("repo", "add", "nvdp", "https://example.invalid/charts")
    assert bad.returncode == 1 and "is not a valid chart repository or cannot be reached" in bad.stderr
    sim.helm("repo", "add", "nvdp", NVDP, check=True)
    assert (
        sim.helm("repo", "add", "nvdp", NVDP, check=True).stdout
        == '"nvdp" already exists with the same configuration, skipping\n'
    )
    out = sim.helm("install", "x", "nvdp/nvidia-device-plugin", "--version", "9.9.9", "-n", "kube-system")
    assert out.stderr == (
        'Error: INSTALLATION FAILED: chart "nvidia-device-plugin" matching 9.9.9 not found in nvdp index. '
        "(try 'helm repo update'): no chart version found for nvidia-device-plugin-9.9.9\n"
    )
    sim.helm(
        "install", "x", "nvdp/nvidia-device-plugin", "--version", "0.17.1", "-n", "kube-system", check=True
    )
    again = sim.helm("install", "x", "nvdp/nvidia-device-plugin", "-n", "kube-system")
    assert again.stderr == "Error: INSTALLATION FAILED: cannot re-use a name that is still in use\n"
    missing = sim.helm("uninstall", "nope", "-n", "kube-system")
    assert missing.stderr == "Error: uninstall: Release not loaded: nope: release: not found\n"
    ns = sim.helm("install", "y", "nvdp/nvidia-device-plugin", "-n", "absent")
    assert (
        ns.stderr == 'Error: INSTALLATION FAILED: create: failed to create: namespaces "absent" not found\n'
    )


def test_repo_list_and_search(sim: Sim) -> None:
    sim.helm("repo", "add", "nvdp", NVDP, check=True)
    sim.helm("repo", "add", "nvidia", NGC, check=True)
    repos = json.loads(sim.helm("repo", "list", "-o", "json", check=True).stdout)
    assert repos == [{"name": "nvdp", "url": NVDP}, {"name": "nvidia", "url": NGC}]
    found = json.loads(
        sim.helm("search", "repo", "nvdp/nvidia-device-plugin", "--versions", "-o", "json", check=True).stdout
    )
    assert {"0.13.0", "0.15.0", "0.20.0"} <= {r["version"] for r in found}


def test_release_lifecycle_list_status_upgrade_uninstall(sim: Sim) -> None:
    sim.helm("repo", "add", "nvdp", NVDP, check=True)
    first = sim.helm(
        "upgrade",
        "--install",
        "dp",
        "nvdp/nvidia-device-plugin",
        "--version",
        "0.14.5",
        "-n",
        "kube-system",
        check=True,
    )
    assert first.stdout.startswith('Release "dp" does not exist. Installing it now.\n')
    listed = json.loads(sim.helm("list", "-n", "kube-system", "-o", "json", check=True).stdout)
    assert [(r["name"], r["revision"], r["status"], r["chart"], r["app_version"]) for r in listed] == [
        ("dp", "1", "deployed", "nvidia-device-plugin-0.14.5", "0.14.5")
    ]
    assert json.loads(sim.helm("list", "-o", "json", check=True).stdout) == []  # current namespace is default
    second = sim.helm(
        "upgrade",
        "--install",
        "dp",
        "nvdp/nvidia-device-plugin",
        "--version",
        "0.17.0",
        "-n",
        "kube-system",
        "--set",
        "runtimeClassName=nvidia",
        check=True,
    )
    assert 'Release "dp" has been upgraded. Happy Helming!' in second.stdout
    status = sim.helm("status", "dp", "-n", "kube-system", check=True).stdout
    assert "STATUS: deployed" in status and "REVISION: 2" in status
    ds = sim.apps.read_namespaced_daemon_set("dp-nvidia-device-plugin", "kube-system")
    assert ds.spec.template.spec.runtime_class_name == "nvidia"
    assert ds.metadata.annotations["meta.helm.sh/release-name"] == "dp"
    secrets = sim.core.list_namespaced_secret("kube-system", label_selector="owner=helm,name=dp").items
    assert sorted(s.metadata.name for s in secrets) == [
        "sh.helm.release.v1.dp.v1",
        "sh.helm.release.v1.dp.v2",
    ]
    stored = json.loads(gzip.decompress(base64.b64decode(base64.b64decode(secrets[0].data["release"]))))
    assert stored["name"] == "dp" and stored["info"]["status"] in ("superseded", "deployed")
    values = json.loads(sim.helm("get", "values", "dp", "-n", "kube-system", "-o", "json", check=True).stdout)
    assert values == {"runtimeClassName": "nvidia"}
    assert sim.helm("uninstall", "dp", "-n", "kube-system", check=True).stdout == 'release "dp" uninstalled\n'
    assert sim.apps.list_namespaced_daemon_set("kube-system").items == []
    assert sim.core.list_namespaced_secret("kube-system", label_selector="owner=helm").items == []


def test_set_file_and_values_files(sim: Sim, tmp_path: Path) -> None:
    sim.helm("repo", "add", "nvdp", NVDP, check=True)
    cfg = tmp_path / "ts.yaml"
    cfg.write_text(
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 4\n"
    )
    vals = tmp_path / "values.yaml"
    vals.write_text("runtimeClassName: nvidia\nfailOnInitError: false\n")
    sim.helm(
        "install",
        "dp",
        "nvdp/nvidia-device-plugin",
        "-n",
        "kube-system",
        "-f",
        str(vals),
        "--set-file",
        f"config.map.config={cfg}",
        "--set",
        "config.default=config",
        check=True,
    )
    cm = sim.core.read_namespaced_config_map("dp-nvidia-device-plugin-configs", "kube-system")
    assert cm.data["config"] == cfg.read_text()
    env = {
        e.name: e.value
        for e in sim.apps.read_namespaced_daemon_set("dp-nvidia-device-plugin", "kube-system")
        .spec.template.spec.containers[0]
        .env
    }
    assert env["FAIL_ON_INIT_ERROR"] == "false"


# --- --wait -------------------------------------------------------------------------------------------


def test_wait_times_out_like_helm_when_pods_never_get_ready(sim: Sim) -> None:
    sim.helm("repo", "add", "nvdp", NVDP, check=True)
    runtime_class(sim)
    t0 = time.monotonic()
    out = sim.helm(*DOCS_INSTALL, "-n", "kube-system", "--wait", "--timeout", "1s")
    assert time.monotonic() - t0 < 8
    assert (out.returncode, out.stderr) == (1, "Error: INSTALLATION FAILED: context deadline exceeded\n")
    listed = json.loads(sim.helm("list", "-n", "kube-system", "-o", "json", check=True).stdout)
    assert listed[0]["status"] == "failed"


@pytest.mark.parametrize("sim", [{"scenario": "gpu-ready"}], indirect=True)
def test_wait_returns_once_the_daemonset_is_ready(sim: Sim) -> None:
    sim.helm("repo", "add", "nvdp", NVDP, check=True)
    runtime_class(sim)
    sim.helm(*DOCS_INSTALL, "-n", "kube-system", "--wait", "--timeout=30s", check=True)
    ds = sim.apps.read_namespaced_daemon_set("nvidia-device-plugin", "kube-system")
    assert ds.status.number_ready == ds.status.desired_number_scheduled == 2


# --- GPU Operator -------------------------------------------------------------------------------------


@pytest.mark.parametrize("sim", [{"scenario": "gpu-ready", "talos_version": "1.13"}], indirect=True)
def test_gpu_operator_with_driver_and_toolkit_disabled_brings_runtimeclass_and_gpus(sim: Sim) -> None:
    sim.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name="gpu-operator")))
    sim.core.patch_namespace(
        "gpu-operator", {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "privileged"}}}
    )
    sim.helm("repo", "add", "nvidia", NGC, check=True)
    sim.helm("repo", "update", check=True)
    sim.helm(
        "upgrade",
        "--wait",
        "--install",
        "-n",
        "gpu-operator",
        "gpu-operator",
        "nvidia/gpu-operator",
        "--version=v26.3.1",
        "--set",
        "driver.enabled=false",
        "--set",
        "toolkit.enabled=false",
        "--set",
        "hostPaths.driverInstallDir=/usr/local",
        check=True,
    )
    assert wait_for(lambda: sim.node.read_runtime_class("nvidia")).handler == "nvidia"
    ds = wait_for(
        lambda: (
            sim.apps.list_namespaced_daemon_set(
                "gpu-operator", label_selector="app=nvidia-device-plugin-daemonset"
            ).items
        )
    )
    assert ds[0].spec.template.spec.runtime_class_name == "nvidia"
    for n in ("talos-worker-1", "talos-worker-2"):
        assert wait_for(lambda n=n: sim.gpus(n)) == str(len(load_node(sim.state, n).gpus))
    names = {d.metadata.name for d in sim.apps.list_namespaced_daemon_set("gpu-operator").items}
    assert "nvidia-driver-daemonset" not in names and "nvidia-container-toolkit-daemonset" not in names
    policy = wait_for(
        lambda: (
            (
                p := sim.custom.get_cluster_custom_object(
                    "nvidia.com", "v1", "clusterpolicies", "cluster-policy"
                )
            )
            .get("status", {})
            .get("state")
            == "ready"
            and p
        )
    )
    assert policy["spec"]["hostPaths"]["driverInstallDir"] == "/usr/local"


@pytest.mark.parametrize("sim", [{"scenario": "gpu-ready", "talos_version": "1.13"}], indirect=True)
def test_gpu_operator_in_a_baseline_namespace_cannot_run_nfd(sim: Sim) -> None:
    sim.helm("repo", "add", "nvidia", NGC, check=True)
    sim.helm(
        "install",
        "gpu-operator",
        "nvidia/gpu-operator",
        "-n",
        "gpu-operator",
        "--create-namespace",
        "--set",
        "driver.enabled=false",
        "--set",
        "toolkit.enabled=false",
        check=True,
    )
    ev = wait_for(
        lambda: [
            e for e in sim.core.list_namespaced_event("gpu-operator").items if e.reason == "FailedCreate"
        ]
    )
    assert (
        'violates PodSecurity "baseline:latest": hostPath volumes (volumes "host-boot", "host-sys")'
        in ev[0].message
    )


@pytest.mark.parametrize("sim", [{"scenario": "gpu-ready", "talos_version": "1.13"}], indirect=True)
def test_leftover_nvidia_runtimeclass_is_used_by_the_operator(sim: Sim) -> None:
    """A RuntimeClass applied by hand earlier does not break the operator (the chart does not render it)."""
    runtime_class(sim)
    sim.core.create_namespace(
        client.V1Namespace(
            metadata=client.V1ObjectMeta(
                name="gpu-operator", labels={"pod-security.kubernetes.io/enforce": "privileged"}
            )
        )
    )
    sim.helm("repo", "add", "nvidia", NGC, check=True)
    sim.helm(
        "install",
        "gpu-operator",
        "nvidia/gpu-operator",
        "-n",
        "gpu-operator",
        "--set",
        "driver.enabled=false",
        "--set",
        "toolkit.enabled=false",
        check=True,
    )
    assert wait_for(lambda: sim.gpus("talos-worker-1")) == str(
        len(load_node(sim.state, "talos-worker-1").gpus)
    )


@pytest.mark.slow
def test_atomic_install_uninstalls_and_atomic_upgrade_rolls_back(sim: Sim) -> None:
    sim.helm("repo", "add", "nvdp", NVDP, check=True)
    runtime_class(sim)
    out = sim.helm(*DOCS_INSTALL, "-n", "kube-system", "--atomic", "--timeout", "500ms")
    assert out.stderr == (
        "Error: INSTALLATION FAILED: release nvidia-device-plugin failed, and has been uninstalled due to atomic "
        "being set: context deadline exceeded\n"
    )
    assert sim.apps.list_namespaced_daemon_set("kube-system").items == []
    assert json.loads(sim.helm("list", "-A", "-a", "-o", "json", check=True).stdout) == []
    # A release without runtimeClassName deploys (nothing waits); the upgrade to it with --atomic fails and rolls back.
    sim.helm(
        "install", "dp", "nvdp/nvidia-device-plugin", "--version=0.13.0", "-n", "kube-system", check=True
    )
    out = sim.helm(
        "upgrade",
        "dp",
        "nvdp/nvidia-device-plugin",
        "--version=0.13.0",
        "-n",
        "kube-system",
        "--set",
        "runtimeClassName=nvidia",
        "--atomic",
        "--timeout",
        "500ms",
    )
    assert "has been rolled back due to atomic being set: context deadline exceeded" in out.stderr
    ds = sim.apps.read_namespaced_daemon_set("dp-nvidia-device-plugin", "kube-system")
    assert ds.spec.template.spec.runtime_class_name is None
    listed = json.loads(sim.helm("list", "-n", "kube-system", "-o", "json", check=True).stdout)
    assert [(r["revision"], r["status"]) for r in listed] == [("3", "deployed")]


def test_objects_not_owned_by_the_release_block_the_install(sim: Sim) -> None:
    sim.helm("repo", "add", "nvdp", NVDP, check=True)
    labels = {"app": "dp"}
    sim.apps.create_namespaced_daemon_set(
        "kube-system",
        client.V1DaemonSet(
            metadata=client.V1ObjectMeta(name="nvidia-device-plugin"),
            spec=client.V1DaemonSetSpec(
                selector=client.V1LabelSelector(match_labels=labels),
                template=client.V1PodTemplateSpec(
                    metadata=client.V1ObjectMeta(labels=labels),
                    spec=client.V1PodSpec(
                        containers=[client.V1Container(name="c", image="x:1")], node_selector={"none": "x"}
                    ),
                ),
            ),
        ),
    )
    out = sim.helm(*DOCS_INSTALL, "-n", "kube-system")
    assert out.stderr == (
        'Error: INSTALLATION FAILED: Unable to continue with install: DaemonSet "nvidia-device-plugin" in namespace '
        '"kube-system" exists and cannot be imported into the current release: invalid ownership metadata; '
        'label validation error: missing key "app.kubernetes.io/managed-by": must be set to "Helm"; '
        'annotation validation error: missing key "meta.helm.sh/release-name": must be set to "nvidia-device-plugin"; '
        'annotation validation error: missing key "meta.helm.sh/release-namespace": must be set to "kube-system"\n'
    )
