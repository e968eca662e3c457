"""Schematic IDs and the factory round trip at fleet scale.

Targets: planning 1,000 per-node schematics (parse + canonical YAML + ID) in under 1 s, so a plan for a
large fleet stays instant; resolving extensions + registering a schematic against the simulated factory in
under 50 ms per round trip (the upgrade step does this once per distinct schematic, not per node).
"""

from __future__ import annotations

import sys
import tempfile
import time

from runbook_lib.clients.factory import FactoryClient
from runbook_lib.model.schematic import parse_schematic, schematic_for
from runbook_lib.sim import factory

LTS = ["siderolabs/nvidia-open-gpu-kernel-modules-lts", "siderolabs/nvidia-container-toolkit-lts"]
NODES = 1000
ROUND_TRIPS = 50


def bench_offline() -> float:
    started = time.perf_counter()
    ids = set()
    for i in range(NODES):
        schematic = schematic_for(
            [*LTS, "siderolabs/iscsi-tools"], [f"talos.hostname=gpu-{i}", "net.ifnames=0"]
        )
        again = parse_schematic(schematic.canonical_yaml())
        ids.add(again.id)
    assert len(ids) == NODES
    return time.perf_counter() - started


def bench_factory() -> float:
    with tempfile.TemporaryDirectory() as state, factory.running(state) as server:
        client = FactoryClient(server.url)
        started = time.perf_counter()
        for i in range(ROUND_TRIPS):
            schematic = schematic_for(LTS, [f"bench={i}"])
            client.resolve_extensions(LTS, "v1.12.7")
            client.post_schematic(schematic)
        return (time.perf_counter() - started) / ROUND_TRIPS


def main() -> int:
    offline = bench_offline()
    per_trip = bench_factory()
    print(f"offline schematics: {NODES} in {offline:.3f} s (target < 1.0 s)")
    print(f"factory resolve+register: {per_trip * 1000:.1f} ms per round trip (target < 50 ms)")
    return 0 if offline < 1.0 and per_trip < 0.05 else 1


if __name__ == "__main__":
    code = main()
    if code:
        sys.exit(code)
