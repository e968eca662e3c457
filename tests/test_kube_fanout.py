"""Issue 16: the cuda-test and kubernetes steps at fleet scale issue their per-node Kubernetes API calls
concurrently, so the run is not ``nodes × calls × latency``.

Found by benchmarks/bench_whole_change.py: at 1,000 GPU nodes cuda-test spent 329 s creating, reading and
deleting its 4 pods per node one call at a time, against 17.7 s of the cluster's own time.  Each test here
gives every API request a fixed latency (the ``api_latency_ms`` fault: on the real control plane the network
between the kubeconfig and kube-apiserver, ``runbook_lib/sim/latencyproxy.py``), so calls last long enough to
overlap, and counts the calls in flight at once through the client (``Kube._call``): more than one (not one at a
time) and never more than the client's connection pool (``Kube.parallel_calls``).  Counted, not timed: a
wall-clock ratio failed on a loaded machine (1.38 s against a 1.33 s bound); speed lives in benchmarks/.

On the real control plane (issue 15: one truth; kube-apiserver, kube-controller-manager and kube-scheduler of
Kubernetes 1.35.0, kwok as the 40 kubelets), skipped naming ``make kube-tools`` where it is not built.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from runbook_lib.clients.kube import Kube
from runbook_lib.sim.state import save_cluster_faults
from runbook_lib.steps.cudatest import RUN_LABEL, TEST_NAMESPACE, cuda_test
from runbook_lib.steps.kubernetes import GPU_PRESENT_LABEL, _label_nodes, kubernetes_layer
from runbook_lib.steps.results import StepResult
from tests.realplane import use_real_plane
from tests.sim.waiting import wait_for
from tests.simcluster import sim_cluster

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _real_control_plane(monkeypatch: pytest.MonkeyPatch) -> None:
    use_real_plane(monkeypatch)


NODES = 40
LATENCY_MS = 100  # long against the client's and server's CPU per call, so calls in flight overlap


class InFlight:
    """Counts the client's API calls in flight at once (every call goes through ``Kube._call``)."""

    def __init__(self, kube: Kube) -> None:
        self.lock = threading.Lock()
        self.now = self.most = 0
        self._call = kube._call

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
        try:
            return self._call(*args, **kwargs)
        finally:
            with self.lock:
                self.now -= 1


def test_cuda_test_on_40_nodes_runs_its_api_calls_concurrently_within_the_pool(tmp_path: Path) -> None:
    with sim_cluster(tmp_path, scenario="gpu-ready", workers=NODES, apply=True) as (params, ctx):
        assert kubernetes_layer(ctx, timeout_s=120).ok
        drivers = {n.name: "" for n in params.nodes}  # no talosctl read: only the API calls count
        save_cluster_faults(tmp_path, {"api_latency_ms": LATENCY_MS})
        calls = InFlight(ctx.kube)
        with mock.patch.object(ctx.kube, "_call", calls):
            result = cuda_test(ctx, node_drivers=drivers)
        assert result.ok and len(result.nodes) == NODES, result.to_dict()
        assert all(len(n.checks) == 4 for n in result.nodes)
        run_id = result.data["run_id"]
        assert ctx.kube.pods(TEST_NAMESPACE, f"{RUN_LABEL}={run_id}") == []
        summaries = [e.summary for e in ctx.journal.entries if run_id in e.summary]
        created = [s for s in summaries if s.startswith("create Pod ")]
        deleted = [s for s in summaries if s.startswith("delete Pod ")]
        assert len(created) == len(deleted) == 4 * NODES == result.data["pods_deleted"]
        assert 1 < calls.most <= ctx.kube.parallel_calls, (calls.most, ctx.kube.parallel_calls)


def test_labelling_40_nodes_runs_the_calls_concurrently_within_the_pool(tmp_path: Path) -> None:
    with sim_cluster(tmp_path, scenario="gpu-ready", workers=NODES, apply=True) as (params, ctx):
        save_cluster_faults(tmp_path, {"api_latency_ms": LATENCY_MS})
        started = time.monotonic()
        ctx.kube.server_version()  # the fault reaches the client: a request is answered LATENCY_MS later at least
        assert time.monotonic() - started >= LATENCY_MS / 1000
        changed: list[str] = []
        calls = InFlight(ctx.kube)
        result = StepResult(step="kubernetes", applied=True)
        with mock.patch.object(ctx.kube, "_call", calls):
            _label_nodes(ctx, list(params.nodes), result, changed, dry_run=False)
        assert sorted(changed) == sorted(
            f"label node {n.name} nvidia.com/gpu.present=true" for n in params.nodes
        )
        # each node's value before, for the rollback's command that puts it back: none had the label
        assert sorted(i["node"] for i in result.data["labelled"] if i["before"] is None) == sorted(
            n.name for n in params.nodes
        )
        key, value = next(iter(GPU_PRESENT_LABEL.items()))
        labelled = {
            n["metadata"]["name"] for n in ctx.kube.nodes() if n["metadata"]["labels"].get(key) == value
        }
        assert labelled == {n.name for n in params.nodes}
        assert 1 < calls.most <= ctx.kube.parallel_calls, (calls.most, ctx.kube.parallel_calls)


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
        # Every pod created was deleted: gone, or Terminating until its node stopped it (a pod the scheduler
        # placed and still running keeps its grace period: kubernetes@v1.35.0 pkg/registry/core/pod/strategy.go
        # podStrategy.CheckGracefulDelete; only a finished or unscheduled pod goes at once).
        left = ctx.kube.pods(TEST_NAMESPACE, f"{RUN_LABEL}=c0ffee")
        assert all(p["metadata"].get("deletionTimestamp") for p in left), left
        created = {
            e.summary.split("/")[1] for e in ctx.journal.entries if e.summary.startswith("create Pod ")
        }
        deleted = {
            e.summary.split("/")[1] for e in ctx.journal.entries if e.summary.startswith("delete Pod ")
        }
        assert created and created == deleted
        assert len(calls) < 4 * NODES  # the creations not yet started were cancelled
