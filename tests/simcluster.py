"""A simulated cluster for library tests: the same binaries, kubeconfig and URLs a user gets.

Tests import the simulator only here, to create and tear down a cluster; the library under test reaches it
exactly as it reaches a real one (``runbook_lib.steps.context.connect``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from runbook_lib.model.params import Params, validate
from runbook_lib.sim import cluster, factory
from runbook_lib.sim.state import load_nodes
from runbook_lib.steps.context import Context, connect


@contextmanager
def sim_cluster(
    state_dir: Path,
    *,
    talos_version: str = "v1.12.7",
    workers: int = 2,
    scenario: str = "fresh",
    daemon: bool = True,
    latency_ms: float = 0.0,
    **params: Any,
) -> Iterator[tuple[Params, Context]]:
    """Create a simulated cluster, start its servers, and yield validated params + a connected context.

    ``latency_ms`` is every node's simulated round trip per talosctl call (what makes serial calls visible).
    """
    cluster.create(
        state_dir,
        cluster.ClusterSpec(
            workers=workers, talos_version=talos_version, scenario=scenario, latency_ms=latency_ms
        ),
    )
    if daemon:
        cluster.start_daemon(state_dir)
    try:
        gpu_nodes = [n for n in load_nodes(state_dir) if n.gpus]
        data: dict[str, Any] = {
            "cluster": "test",
            "target": "simulated",
            "talos_version": talos_version,
            "nodes": [{"name": n.name, "address": n.address} for n in gpu_nodes],
        }
        for key, value in params.items():
            data[key] = value
        if not daemon:
            (state_dir / "endpoints.json").write_text("{}")
        p = validate(data, source="test")
        yield p, connect(p, state_dir=state_dir)
    finally:
        if daemon:
            cluster.stop_daemon(state_dir)


@contextmanager
def factory_only(
    state_dir: Path, *, workers: int, scenario: str, talos_version: str = "v1.12.7"
) -> Iterator[factory.FactoryServer]:
    """A simulated cluster whose only server is the Image Factory, run in this process (talosctl reads the
    state directory): what the image, rollout and rollback tests need, without the daemon's start-up."""
    cluster.create(
        state_dir, cluster.ClusterSpec(workers=workers, talos_version=talos_version, scenario=scenario)
    )
    with factory.running(state_dir) as server:
        (state_dir / "endpoints.json").write_text(json.dumps({"factory": server.url}))
        yield server


def node_config(ctx: Context, address: str) -> str:
    """The node's machine config as talosctl shows it (what a user would look at)."""
    return ctx.talosctl.run(["get", "machineconfig", "-o", "yaml"], [address]).stdout
