"""Issue 16: the cuda-test and kubernetes steps at fleet scale issue their per-node Kubernetes API calls
concurrently, so the run is not ``nodes × calls × latency``.

Found by benchmarks/bench_whole_change.py: at 1,000 GPU nodes cuda-test spent 329 s creating, reading and
deleting its 4 pods per node one call at a time, against 17.7 s of the cluster's own time.  Each test here
gives every API request a fixed latency (the simulated API server's ``api_latency_ms`` fault) and asserts a
ratio against the sum of the per-call latencies, not a wall-clock constant, so a loaded machine only makes
the assertion easier to meet for the serial code, never the concurrent one flaky.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from runbook_lib.sim.state import save_cluster_faults
from runbook_lib.steps.cudatest import RUN_LABEL, TEST_NAMESPACE, cuda_test
from runbook_lib.steps.kubernetes import GPU_PRESENT_LABEL, _label_nodes, kubernetes_layer
from tests.sim.waiting import wait_for
from tests.simcluster import sim_cluster

pytestmark = pytest.mark.slow

NODES = 40
LATENCY_MS = (
    100  # large against the client's and server's CPU per call, so a loaded machine barely moves the ratio
)


def test_cuda_test_on_40_nodes_takes_far_less_than_its_calls_one_at_a_time(tmp_path: Path) -> None:
    with sim_cluster(tmp_path, scenario="gpu-ready", workers=NODES, apply=True) as (params, ctx):
        assert kubernetes_layer(ctx, timeout_s=120).ok
        drivers = {n.name: "" for n in params.nodes}  # no talosctl read: only the API calls are timed
        save_cluster_faults(tmp_path, {"api_latency_ms": LATENCY_MS})
        t0 = time.monotonic()
        result = cuda_test(ctx, node_drivers=drivers)
        elapsed = time.monotonic() - t0
        assert result.ok and len(result.nodes) == NODES, result.to_dict()
        assert all(len(n.checks) == 4 for n in result.nodes)
        run_id = result.data["run_id"]
        assert ctx.kube.pods(TEST_NAMESPACE, f"{RUN_LABEL}={run_id}") == []
        summaries = [e.summary for e in ctx.journal.entries if run_id in e.summary]
        created = [s for s in summaries if s.startswith("create Pod ")]
        deleted = [s for s in summaries if s.startswith("delete Pod ")]
        assert len(created) == len(deleted) == 4 * NODES == result.data["pods_deleted"]
        # each pod: created, its log read, deleted: three calls that pay the latency
        one_at_a_time = 3 * len(created) * LATENCY_MS / 1000
        print(f"elapsed {elapsed:.2f} s against {one_at_a_time:.2f} s one call at a time")
        assert elapsed < one_at_a_time / 3, (elapsed, one_at_a_time)


def test_labelling_40_nodes_takes_far_less_than_one_call_per_node_in_turn(tmp_path: Path) -> None:
    with sim_cluster(tmp_path, scenario="gpu-ready", workers=NODES, apply=True) as (params, ctx):
        save_cluster_faults(tmp_path, {"api_latency_ms": LATENCY_MS})
        changed: list[str] = []
        t0 = time.monotonic()
        _label_nodes(ctx, list(params.nodes), changed, dry_run=False)
        elapsed = time.monotonic() - t0
        assert sorted(changed) == sorted(
            f"label node {n.name} nvidia.com/gpu.present=true" for n in params.nodes
        )
        key, value = next(iter(GPU_PRESENT_LABEL.items()))
        labelled = {
            n["metadata"]["name"] for n in ctx.kube.nodes() if n["metadata"]["labels"].get(key) == value
        }
        assert labelled == {n.name for n in params.nodes}
        one_at_a_time = NODES * LATENCY_MS / 1000
        print(f"elapsed {elapsed:.2f} s against {one_at_a_time:.2f} s one call at a time")
        assert elapsed < one_at_a_time / 3, (elapsed, one_at_a_time)


def test_ctrl_c_while_pods_are_created_concurrently_deletes_every_pod_created(tmp_path: Path) -> None:
    """A KeyboardInterrupt (``runbook run`` interrupts the cell on Ctrl-C/SIGTERM) while the pods are being
    created, here raised by one creation: creations not started are cancelled, those in flight are waited
    for (they reach the API after the interrupt), and every pod that reached the API is deleted before the
    step ends; the journal lists each creation and deletion."""
    with sim_cluster(tmp_path, scenario="gpu-ready", workers=NODES, apply=True) as (params, ctx):
        ctx.kube.create_runtime_class("nvidia", "nvidia", dry_run=False)  # else the API rejects the pods
        save_cluster_faults(tmp_path, {"api_latency_ms": LATENCY_MS})
        create = ctx.kube.create_pod
        calls: list[str] = []
        ended: list[str] = []

        def interrupted_after_some(namespace: str, manifest: dict[str, Any]) -> dict[str, Any]:
            calls.append(manifest["metadata"]["name"])
            try:
                if len(calls) == 2 * ctx.kube.parallel_calls:
                    raise KeyboardInterrupt
                if len(calls) > 2 * ctx.kube.parallel_calls:
                    time.sleep(0.5)  # in flight when the interrupt comes: these reach the API after it
                return create(namespace, manifest)
            finally:
                ended.append(manifest["metadata"]["name"])

        drivers = {n.name: "" for n in params.nodes}
        with (
            mock.patch.object(ctx.kube, "create_pod", interrupted_after_some),
            pytest.raises(KeyboardInterrupt),
        ):
            cuda_test(ctx, node_drivers=drivers, run_id="c0ffee")
        # a creation still running once the step ended would leave its pod behind
        wait_for(lambda: len(ended) == len(calls), timeout=60)
        assert ctx.kube.pods(TEST_NAMESPACE, f"{RUN_LABEL}=c0ffee") == []
        created = {
            e.summary.split("/")[1] for e in ctx.journal.entries if e.summary.startswith("create Pod ")
        }
        deleted = {
            e.summary.split("/")[1] for e in ctx.journal.entries if e.summary.startswith("delete Pod ")
        }
        assert created and created == deleted
        assert len(calls) < 4 * NODES  # the creations not yet started were cancelled
