"""What a container does on a simulated GPU node (``runbook_lib.sim.containers.program``), which the GPU node
agent applies to the pods kwok runs on the real control plane.

Kept from tests/sim/test_kubelet.py (the Python kubelet, retired on 2 Dec 2026), whose cases were the only ones
asserting these outcomes; here without a cluster, as the node agent calls ``program``. The texts are the
simulator's (runbook_lib/sim/nvidia.py, containers.py); test_kubelet.py cited no source for them, and none was
found this session.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from runbook_lib.sim import cluster
from runbook_lib.sim.containers import NodeView, program
from runbook_lib.sim.state import load_node, locked_node, runtime, v1alpha1_doc

NODE = "talos-worker-1"


def view(tmp_path: Path, talos: str) -> NodeView:
    cluster.create(tmp_path, cluster.ClusterSpec(workers=1, talos_version=talos, scenario="gpu-ready"))
    node = load_node(tmp_path, NODE)
    return NodeView(node, runtime(node), "")


def smi(image: str = "nvcr.io/nvidia/cuda:12.5.0-base-ubuntu22.04") -> tuple[dict[str, Any], dict[str, Any]]:
    container = {"name": "smi", "image": image, "command": ["nvidia-smi"]}
    return {"metadata": {"name": "smi"}, "spec": {"containers": [container]}}, container


def test_an_old_driver_branch_prints_the_narrow_table(tmp_path: Path) -> None:
    pod, container = smi("nvcr.io/nvidia/cuda:11.7.1-base-ubuntu20.04")
    outcome = program(pod, container, view(tmp_path, "1.3"), "nvidia", 1)
    header = next(line for line in outcome.log.splitlines() if "NVIDIA-SMI" in line)
    assert outcome.exit_code == 0 and len(header) == 79 and header.startswith("| NVIDIA-SMI 515.")


def test_nvidia_smi_without_the_runtime_class_fails_to_start(tmp_path: Path) -> None:
    pod, container = smi()
    outcome = program(pod, container, view(tmp_path, "1.12"), "", 1)
    assert outcome.start_error is not None
    assert 'exec: "nvidia-smi": executable file not found in $PATH' in outcome.start_error


def test_a_missing_bpf_jit_sysctl_breaks_the_legacy_hook_on_1_12(tmp_path: Path) -> None:
    view(tmp_path, "1.12")
    with locked_node(tmp_path, NODE) as node:
        v1alpha1_doc(node.machine_config)["machine"]["sysctls"].pop("net.core.bpf_jit_harden")
    node = load_node(tmp_path, NODE)
    pod, container = smi()
    outcome = program(pod, container, NodeView(node, runtime(node), ""), "nvidia", 1)
    assert outcome.start_error is not None
    assert "load program: invalid argument: last insn is not an exit or jmp" in outcome.start_error
