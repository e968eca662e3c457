"""``runbook sim fault NODE FAULT false`` switches the fault off, as ``--clear`` does, and says so.

Found by an operator walkthrough: it printed ``set gpu_isolation_lost on gpu-worker-2`` and ``sim status`` still
listed the fault (its value false), though the nodes behaved as without it."""

from __future__ import annotations

from pathlib import Path

import pytest

from runbook_lib.cli import main
from runbook_lib.sim.cluster import ClusterSpec, create
from runbook_lib.sim.state import load_nodes


def test_a_fault_set_false_is_cleared_and_said_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state = tmp_path / "state"
    create(state, ClusterSpec(workers=1, talos_version="v1.12.0", scenario="fresh"))
    worker = load_nodes(state)[-1]
    fault = ["sim", "fault", "--state", str(state), worker.name, "gpu_isolation_lost"]
    assert main(fault) == 0
    assert load_nodes(state)[-1].faults == {"gpu_isolation_lost": True}
    assert main([*fault, "false"]) == 0
    assert load_nodes(state)[-1].faults == {}
    assert capsys.readouterr().out.splitlines()[-1] == f"cleared gpu_isolation_lost on {worker.name}"


def test_a_fault_for_a_missing_cluster_or_node_is_an_error_naming_what_exists(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``sim fault`` on a state directory with no simulated cluster printed a Python traceback
    (FileNotFoundError), and an unknown node did not say which nodes there are (walkthrough, stop 52)."""
    missing = tmp_path / "none"
    assert main(["sim", "fault", "--state", str(missing), "gpu-1", "upgrade_fails"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert f"error: no simulated cluster at {missing}" in err
    assert f"hint: create it first: runbook sim up --state {missing} -p FILE" in err
    state = tmp_path / "state"
    create(state, ClusterSpec(workers=1, talos_version="v1.12.0", scenario="fresh"))
    assert main(["sim", "fault", "--state", str(state), "gpu-wroker-1", "gpu_isolation_lost"]) == 2
    err = capsys.readouterr().err
    names = ", ".join(n.name for n in load_nodes(state))
    assert f"error: no node 'gpu-wroker-1' in {state}" in err and f"hint: its nodes: {names}" in err
