"""``runbook sim fault --clear NODE unreachable`` on simnode returns once the real talosctl reaches the node.

simnode's apid front keeps one gRPC connection per node with apid's backoff (simnode/front.go ``apidBackoff``,
after talos@v1.12.0 internal/app/apid/pkg/backend/apid.go:95-118): a dial that failed while the node was down
is retried only after that backoff (1 s, growing to at most 15 s), and until then every call to the node fails
with the old dial error although simnode already marked the node up (its observed file). A user who clears the
fault and runs talosctl at once met ``connection refused``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from runbook_lib.cli import main
from runbook_lib.sim.cluster import ClusterSpec, create
from runbook_lib.sim.state import load_nodes
from tests.sim.talosctl_legs import leg

pytestmark = pytest.mark.slow


def test_sim_fault_clear_returns_once_talosctl_reaches_the_node_again(tmp_path: Path) -> None:
    state = tmp_path / "state"
    create(state, ClusterSpec(workers=1, talos_version="v1.12.0", scenario="fresh"))
    worker = load_nodes(state)[-1]
    fault = ["sim", "fault", "--state", str(state)]
    with leg("real", state, "v1.12.0") as talosctl:
        assert talosctl("-n", worker.address, "version").returncode == 0  # the front's connection is up
        assert main([*fault, worker.name, "unreachable", "refused"]) == 0
        down = talosctl("-n", worker.address, "version")
        assert down.returncode != 0 and "connection refused" in down.stderr, down.stderr  # backoff starts
        assert main([*fault, "--clear", worker.name, "unreachable"]) == 0
        back = talosctl("-n", worker.address, "version")
        assert back.returncode == 0, back.stderr
