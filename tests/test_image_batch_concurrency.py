"""A batch of the image step upgrades all of its nodes at once.

``rollout_concurrency`` is "how many nodes change at once (the largest batch)" (``runbook_lib/model/params.py``), up
to its bound of 1,000, and the README's rollout controls say the same.  Until 1 Dec 2026 the step ran at most 64
``talosctl upgrade`` processes at once (``MAX_PARALLEL_UPGRADES``), so a batch of 125 went as two waves, each as
long as an upgrade plus reboot: ``benchmarks/bench_whole_change.py`` at 1,000 nodes, ``rollout_concurrency`` 125,
saw each batch's last upgrades start 11-13 s after its first (one upgrade alone: ~6 s) and every batch last ~22 s.
"""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import yaml

from runbook_lib.model.params import Node, load_params
from runbook_lib.steps.context import Context
from runbook_lib.steps.image import NodeImage, _run_batch
from runbook_lib.steps.results import NodeResult

BATCH = 100


class AllInFlight(Exception):
    """Raised by every fake upgrade once all of the batch's upgrades were running at the same time."""


def test_a_batch_of_100_nodes_runs_its_100_upgrades_at_once(tmp_path: Path) -> None:
    nodes = [Node(name=f"gpu-{i:03d}", address=f"10.5.0.{i + 3}") for i in range(BATCH)]
    data = {"cluster": "c", "talos_version": "v1.12.0", "rollout_concurrency": BATCH}
    data["nodes"] = [{"name": n.name, "address": n.address} for n in nodes]
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(data))
    # Waits until BATCH upgrades are in flight together; with fewer, it breaks after the (generous) timeout.
    together = threading.Barrier(BATCH, timeout=60)

    def upgrade(address: str, image: str, **_: Any) -> None:
        together.wait()
        raise AllInFlight(address)

    ctx = cast(
        Context,
        SimpleNamespace(
            params=load_params(tmp_path / "params.yaml"), talosctl=SimpleNamespace(upgrade=upgrade)
        ),
    )
    batch = [NodeImage(node=n, schematic=None, image="installer:v1.12.0", extensions=()) for n in nodes]
    results = {n.address: NodeResult(node=n.name, address=n.address) for n in nodes}
    with pytest.raises(AllInFlight):  # not threading.BrokenBarrierError: all BATCH were running at once
        _run_batch(
            ctx, batch, results, target="v1.12.0", upgrade_timeout=60, settle_timeout=1, poll_interval=0.1
        )
