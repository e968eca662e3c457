"""The switch between the real talosctl (against simnode) and the Python one, and what the kubelet reads.

Fast: no binary runs here (the tools cache is a temporary directory with stand-in executables); the real
talosctl and simnode run in ``tests/sim/test_sim_up_real_talosctl.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from runbook_lib.sim import cluster, realtalos
from runbook_lib.sim.state import SimNode, runtime

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A tools cache holding a talosctl v1.12.0 and the simnode of the current sources (stand-ins)."""
    cache = tmp_path / "cache"
    for path in (
        cache / "talosctl" / "v1.12.0" / "talosctl",
        cache / "simnode" / realtalos.simnode_hash() / "simnode",
    ):
        path.parent.mkdir(parents=True)
        path.write_text("#!/bin/sh\n")
        path.chmod(0o700)
    monkeypatch.setenv("RUNBOOK_TOOLS_CACHE", str(cache))
    monkeypatch.delenv(realtalos.MODE_ENV, raising=False)
    return cache


def test_auto_runs_the_real_talosctl_of_the_nodes_minor_release_when_built(tools: Path) -> None:
    choice = realtalos.choose("v1.12.7", None, "fresh")
    assert choice.real and choice.reason == "real talosctl v1.12.0 against simnode"
    assert choice.talosctl == str(tools / "talosctl" / "v1.12.0" / "talosctl")


def test_auto_runs_talos_1_14_nodes_on_the_real_talosctl_v1_14_1_when_built(tools: Path) -> None:
    """1.14 was left to the Python talosctl while its drain refused the simulated kubeconfig (a token user,
    talos@v1.14.1 pkg/kubeconfig/validate.go:29); the control-plane node now hands out a client-certificate one
    (the real control plane's: tests/sim/test_real_talos_114_real_plane.py), so auto pairs 1.14 nodes with talosctl v1.14.1 (v1.14.0 is not
    served by the Go module proxy)."""
    built = tools / "talosctl" / "v1.14.1" / "talosctl"
    built.parent.mkdir(parents=True)
    built.write_text("#!/bin/sh\n")
    built.chmod(0o700)
    choice = realtalos.choose("v1.14.0", None, "fresh")
    assert choice.real and choice.reason == "real talosctl v1.14.1 against simnode", choice.reason


@pytest.mark.parametrize(
    ("version", "scenario", "reason"),
    [
        ("v1.12.7", "not-on-simnode", "scenario not-on-simnode has faults simnode does not simulate yet"),
    ],
)
def test_auto_falls_back_to_the_python_talosctl_saying_why(
    tools: Path, version: str, scenario: str, reason: str
) -> None:
    choice = realtalos.choose(version, None, scenario)
    assert not choice.real
    assert choice.reason.startswith(f"Python talosctl: {reason}")


@pytest.mark.parametrize(
    ("nodes", "client"),
    [
        ("v1.3.7", "v1.3.5"),
        ("v1.4.8", "v1.4.0"),
        ("v1.5.5", "v1.5.5"),
        ("v1.6.7", "v1.6.7"),
        ("v1.7.7", "v1.7.0"),
        ("v1.8.4", "v1.8.0"),
        ("v1.9.6", "v1.9.0"),
        ("v1.10.9", "v1.10.0"),
        ("v1.11.6", "v1.11.0"),
    ],
)
def test_talos_1_3_to_1_11_nodes_run_the_real_talosctl_of_their_release_when_built(
    tools: Path, nodes: str, client: str
) -> None:
    """simnode answers as a 1.3-1.11 machined where the runbook meets a difference (simnode/legacy.go,
    legacy18.go, installext.go); they fell back to the Python talosctl while simnode answered every node as
    1.12/1.13 (1.7 and 1.8: until simnode answered as those releases; 1.5 until talosctl v1.5.5 was built, from
    its zip's go.mod; 1.3 and 1.4 until simnode installed machine.install.extensions)."""
    assert realtalos.choose(nodes, None, "fresh").reason == (
        # the tag to build: `make tools` alone builds v1.12.0 only (README audit, stop 50)
        f"Python talosctl: no talosctl {client} built (make tools TALOS_VERSIONS={client}, or "
        "RUNBOOK_SIM_TALOSCTL=real builds it)"
    )
    path = tools / "talosctl" / client / "talosctl"
    path.parent.mkdir(parents=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o700)
    choice = realtalos.choose(nodes, None, "fresh")
    assert choice.real and choice.talosctl == str(path), choice.reason


def test_without_a_built_talosctl_of_the_release_the_python_one_runs(tools: Path) -> None:
    (tools / "talosctl" / "v1.12.0" / "talosctl").unlink()
    choice = realtalos.choose("v1.12.7", None, "fresh")
    assert choice.reason == (
        "Python talosctl: no talosctl v1.12.0 built (make tools TALOS_VERSIONS=v1.12.0, or RUNBOOK_SIM_TALOSCTL=real "
        "builds it)"
    )


def test_a_talosctl_of_another_release_than_the_nodes_falls_back(tools: Path) -> None:
    """ClusterSpec.talosctl_version still works: a client of another minor release runs the Python talosctl."""
    choice = realtalos.choose("v1.12.7", "v1.11.6", "fresh")
    assert (
        choice.reason
        == "Python talosctl: talosctl v1.11.6 is not the nodes' release v1.12.7 (simnode pairs them)"
    )


def test_real_that_cannot_be_honoured_is_an_error(tools: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(realtalos.MODE_ENV, "real")
    # (every release the simulator knows is served since 1.3 and 1.4 are: a scenario's faults can still not be)
    with pytest.raises(
        realtalos.RealTalosError, match=r"RUNBOOK_SIM_TALOSCTL=real: scenario not-on-simnode has faults"
    ):
        realtalos.choose("v1.4.8", None, "not-on-simnode")


def test_python_is_chosen_by_the_switch(tools: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(realtalos.MODE_ENV, "python")
    assert realtalos.choose("v1.12.7", None, "fresh") == realtalos.Choice(
        False, "Python talosctl: RUNBOOK_SIM_TALOSCTL=python"
    )


def test_sim_up_refuses_an_unknown_switch_value_before_writing_anything(tmp_path: Path) -> None:
    state = tmp_path / "state"
    proc = subprocess.run(
        [sys.executable, "-m", "runbook_lib", "sim", "up", "--state", str(state), "--no-daemon"],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "RUNBOOK_SIM_TALOSCTL": "rael", "HOME": str(tmp_path)},
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert "RUNBOOK_SIM_TALOSCTL='rael' is not one of auto, real, python" in proc.stderr
    assert not state.exists()


def observed(tmp_path: Path, **fields: object) -> Path:
    path = tmp_path / "observed.json"
    path.write_text(json.dumps(fields))
    return path


NVIDIA_EXTENSIONS = [
    {"image": "0.sqsh", "name": "nvidia-open-gpu-kernel-modules-lts", "version": "580.126.20-v1.12.7"},
    {"image": "1.sqsh", "name": "nvidia-container-toolkit-lts", "version": "580.126.20-v1.18.2"},
    {"name": "schematic", "version": "40b13a8d" * 8},
]
MODULES_CONFIG = "version: v1alpha1\nmachine:\n  type: worker\n  kernel:\n    modules:\n    - name: nvidia\n"


def test_the_kubelet_sees_what_simnode_observed(tmp_path: Path) -> None:
    """A stock node file, and simnode saying the node now runs the NVIDIA image with the modules patched: the
    simulated kubelet's view (runtime) has the driver and the nvidia runtime handler."""
    stock = cluster.create(tmp_path / "state", cluster.ClusterSpec(workers=1, talos_version="v1.12.7"))[1]
    assert runtime(stock).driver_version is None
    path = observed(
        tmp_path,
        talos_version="v1.12.7",
        image="factory.talos.dev/metal-installer/x:v1.12.7",
        extensions=NVIDIA_EXTENSIONS,
        machine_config=MODULES_CONFIG,
        booted=True,
        boot_id="b1",
    )
    node = realtalos.with_observed(stock, path)
    rt = runtime(node)
    assert rt.driver_version == "580.126.20" and "nvidia" in rt.cri_runtime_handlers
    assert node.schematic_id == "40b13a8d" * 8 and node.reachable


def test_a_new_boot_id_is_a_reboot_and_down_is_unreachable(tmp_path: Path) -> None:
    node = SimNode(name="n", address="10.5.0.3", talos_version="v1.12.7")
    first = realtalos.with_observed(node, observed(tmp_path, boot_id="b1")).boot_count
    same = realtalos.with_observed(node, observed(tmp_path, boot_id="b1")).boot_count
    rebooted = realtalos.with_observed(node, observed(tmp_path, boot_id="b2", down="connection-refused"))
    assert first == same != rebooted.boot_count
    assert not rebooted.reachable


def test_without_an_observed_file_the_node_file_stays_the_truth(tmp_path: Path) -> None:
    node = SimNode(name="n", address="10.5.0.3", talos_version="v1.12.7")
    assert realtalos.with_observed(node, tmp_path / "missing.json") == node


def test_a_gpu_ready_node_boots_the_factory_installer_of_its_schematic(tmp_path: Path) -> None:
    """gpu-ready nodes carry the NVIDIA schematic but the stock ``install_image``: simnode must boot them from the
    factory installer of that schematic (one stock image installing two things was refused before)."""
    state = tmp_path / "state"
    nodes = cluster.create(
        state, cluster.ClusterSpec(workers=2, talos_version="v1.12.7", scenario="gpu-ready")
    )
    doc = realtalos.nodes_document(state, nodes, 0)
    cp, worker = doc["nodes"][0], doc["nodes"][1]
    assert cp["image"] == "ghcr.io/siderolabs/installer:v1.12.7"
    assert worker["image"] == f"factory.talos.dev/metal-installer/{nodes[1].schematic_id}:v1.12.7"
    names = [e["name"] for e in doc["images"][worker["image"]]["extensions"]]
    assert names == [e.name for e in nodes[1].extensions] + ["schematic"]
