"""The pure parts of ``benchmarks/bench_real_plane.py``: reading the API server's Node list, ``/proc`` status and
command lines, and the budget. Inputs in ``tests/data/real_plane/`` were captured on 2 Dec 2026 from ``runbook sim
up --nodes 1`` on the real control plane: ``kubectl get nodes -o json`` (kubectl 1.35.2, kube-apiserver v1.35.0,
Node status posted by kwok v0.8.0), ``/proc/<pid>/status`` of that kube-apiserver and of kthreadd (a kernel
thread: no ``Vm*`` lines), and the command lines of every process naming the state dir (the daemon ran as two
processes with the same command line: kept once)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks import bench_real_plane as bench
from runbook_lib.sim import realkube

DATA = Path(__file__).resolve().parent / "data" / "real_plane"


def node_list() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DATA / "nodes.json").read_text())
    return data


def test_both_nodes_kwok_keeps_ready_count_as_ready() -> None:
    assert bench.ready_nodes(node_list()) == (2, 2)


def test_a_node_the_lifecycle_controller_marked_unknown_is_not_ready() -> None:
    """What kube-controller-manager writes once a node's kubelet stops posting status (kubernetes@v1.35.0
    pkg/controller/nodelifecycle/node_lifecycle_controller.go: status Unknown, reason NodeStatusUnknown)."""
    nodes = node_list()
    (ready,) = [c for c in nodes["items"][1]["status"]["conditions"] if c["type"] == "Ready"]
    ready |= {
        "status": "Unknown",
        "reason": "NodeStatusUnknown",
        "message": "Kubelet stopped posting node status.",
    }
    assert bench.ready_nodes(nodes) == (1, 2)


def test_a_node_registered_before_kwok_posted_its_status_is_not_ready() -> None:
    """The node agent creates the Node objects; until kwok posts status they have no conditions at all."""
    nodes = node_list()
    fresh = copy.deepcopy(nodes["items"][0])
    del fresh["status"]["conditions"]
    nodes["items"].append(fresh)
    assert bench.ready_nodes(nodes) == (2, 3)
    assert bench.ready_nodes({"apiVersion": "v1", "kind": "List", "items": []}) == (0, 0)


def test_peak_and_current_rss_of_a_process_and_of_a_kernel_thread() -> None:
    assert bench.memory_kb((DATA / "apiserver.status").read_text()) == {"VmHWM": 263796, "VmRSS": 263796}
    assert bench.memory_kb((DATA / "kthread.status").read_text()) == {"VmHWM": 0, "VmRSS": 0}


def test_every_process_of_the_cluster_is_named_once() -> None:
    lines = (DATA / "cmdlines.txt").read_text().splitlines()
    named = sorted(str(bench.component(line.split())) for line in lines)
    assert named == [
        "etcd",
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kwok",
        "realkube supervisor",
        "simkube",
        "simulator daemon",
    ]
    assert bench.component(["/usr/bin/python3", "-m", "pytest"]) is None
    assert bench.component([]) is None


def test_the_control_plane_sum_leaves_out_the_simulator_daemon() -> None:
    """The daemon (Image Factory, tool server: two processes) is not Kubernetes; the supervisor, which runs the
    kubelets' GPU side and the kubelet API, is."""
    peaks = {
        "etcd": [100],
        "kube-apiserver": [300],
        "realkube supervisor": [50],
        "simulator daemon": [40, 40],
    }
    assert bench.summed(peaks, bench.CONTROL_PLANE) == 450
    assert bench.summed(peaks, peaks) == 530


@pytest.mark.parametrize(
    ("nodes", "budget"), [(1, 45.0), (10, 45.0), (100, 45.0), (999, 45.0), (1000, 120.0), (2000, 240.0)]
)
def test_budget_per_fleet_size(nodes: int, budget: float) -> None:
    assert bench.budget_for(nodes) == budget


def test_the_verdict_names_each_miss() -> None:
    assert bench.verdict(12.0, 45.0, []) == (True, "")
    assert bench.verdict(45.5, 45.0, ["kwok"]) == (
        False,
        "Ready after 45.5 s > 45 s; left running after sim down: kwok",
    )
    assert bench.verdict(None, 45.0, []) == (False, "the Nodes never all became Ready")


@pytest.mark.parametrize("text", ["", "10,,100", "ten", "0,10", "-5"])
def test_bad_sizes_are_refused_naming_the_variable(text: str) -> None:
    with pytest.raises(ValueError, match=r"BENCH_REAL_PLANE_SIZES=.*give positive node counts"):
        bench.sizes_from(text)


def test_a_bad_sizes_setting_exits_2_before_starting_anything(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(realkube, "find_tools", lambda _v: realkube.Tools(*[Path("/x")] * 6))
    monkeypatch.setattr(bench, "measure", lambda *_a: pytest.fail("measured despite bad sizes"))
    monkeypatch.setenv("BENCH_REAL_PLANE_SIZES", "10,lots")
    assert bench.main() == 2
    assert "BENCH_REAL_PLANE_SIZES='10,lots'" in capsys.readouterr().err
