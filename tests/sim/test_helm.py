"""The simulated ``helm`` executable (as ``runbook sim up`` puts it in the state's ``bin/``) against the simulated API.

Issue 15 item 4: what the real helm 4.1.4 on the real control plane now checks was removed from here (the default
namespace's refusal, objects the release does not own and helm's error texts: ``tests/sim/test_real_helm_charts.py``;
repo search and the release lifecycle: ``tests/sim/test_real_control_plane.py``; the docs' command in kube-system:
``tests/sim/test_sim_up_real_kube.py``; the GPU Operator with driver and toolkit off: ``test_gpu_operator_real.py``).
What stays has no real-plane check yet: ``--set-file`` (our stand-in chart has no config-manager), NFD (our
gpu-operator chart has no NFD subchart), a leftover RuntimeClass under the operator, and ``--wait``/``--atomic``
timeouts (the real helm 4.1.4 reported an upgrade whose DaemonSet never got ready as deployed within 2 s in one
of two tries here, so a real-plane test of it would be flaky; cause not established).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from runbook_lib.sim import cluster
from runbook_lib.sim.kubeapi import server
from runbook_lib.sim.state import load_node, sim_paths
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


# --- CLI behaviour and error texts --------------------------------------------------------------------


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


# --- GPU Operator -------------------------------------------------------------------------------------


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
