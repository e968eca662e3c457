"""A simulated cluster on the real Kubernetes control plane, for library tests (issue 15: one truth).

``real_cluster`` is ``tests/simcluster.py``'s ``sim_cluster`` with the Kubernetes side real: simkube (etcd,
kube-apiserver, kube-controller-manager, kube-scheduler of the nodes' Talos release), kwok as the nodes'
kubelets, the GPU node agent, the simulated GPU Operator and the chart repository, all started by
``runbook_lib.sim.realkube`` exactly as ``runbook sim up`` starts them with ``RUNBOOK_SIM_KUBE=real``; ``bin/helm``
and ``bin/kubectl`` are the real helm 4.1.4 and kubectl 1.35.2. The Talos side is the Python talosctl
(``bin/talosctl`` as ``cluster.create`` writes it, answered by the daemon's tool server): ``real_cluster`` starts
no simnode, unlike ``sim_cluster``, which starts simnode and the real talosctl where ``RUNBOOK_SIM_TALOSCTL`` picks
them (``cluster.start_talos``). The library reaches it only through the kubeconfig, the binaries and the URLs.

It yields once every simulated node's Node is Ready and carries no ``node.kubernetes.io/not-ready`` taint: the
node lifecycle controller lifts that taint on its own schedule after the node first reports Ready, and a test
that creates pods before then races it (CI failed once on exactly that).

Where the control plane of the nodes' Kubernetes release is not in the tools cache, the nearest built release
stands in for it (``realkube.choose``); a test skips, saying what to build, only when none is built (``make
kube-tools``); nothing here builds it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from runbook_lib.model.params import Params, validate
from runbook_lib.sim import cluster, realkube
from runbook_lib.sim.containers import cri_down
from runbook_lib.sim.faultfile import FaultFile
from runbook_lib.sim.nodeagent import kubelet_stopped
from runbook_lib.sim.realtalos import observed_nodes
from runbook_lib.sim.state import load_cluster, load_nodes, runtime
from runbook_lib.steps.context import Context, connect

#: How long the real control plane may take, on a loaded 2-core machine, to have every Node Ready and untainted
#: (measured: 2-4 s idle; the lifecycle controller's first pass over a new Node can take its 5 s period more).
NODES_READY_SECONDS = 120.0


def tools_for(kubernetes_version: str) -> realkube.Tools:
    """The cached control plane of this Kubernetes release, else of the nearest built release standing in for it
    (``realkube.choose``, as ``runbook sim up`` picks it), or skip the test naming what to build."""
    try:
        return realkube.choose(kubernetes_version, {})
    except ValueError as why:
        pytest.skip(str(why))


def use_real_plane(monkeypatch: pytest.MonkeyPatch, kubernetes_version: str = "1.35.0") -> None:
    """This test's simulator runs its Kubernetes side on the real control plane (issue 15: one truth):
    ``RUNBOOK_SIM_KUBE=real`` for ``sim_cluster``, ``realkube.start_servers`` and the ``runbook run``/``sim up``
    processes it starts; skips naming ``make kube-tools`` when no control plane is built (the nearest built release
    stands in for one that is not; Talos v1.12 ships Kubernetes 1.35.0, v1.13 1.36.0: ``runbook_lib.sim.state``)."""
    tools_for(kubernetes_version)
    monkeypatch.setenv(realkube.MODE_ENV, "real")


def _unready_nodes(ctx: Context, names: set[str]) -> list[str]:
    """The simulated nodes whose Node is missing, not Ready, or still tainted not-ready (what blocks pods)."""
    seen: dict[str, dict[str, Any]] = {n["metadata"]["name"]: n for n in ctx.kube.nodes()}
    waiting = []
    for name in sorted(names):
        node = seen.get(name)
        conditions = ((node or {}).get("status") or {}).get("conditions") or []
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
        taints = ((node or {}).get("spec") or {}).get("taints") or []
        if not ready or any(t.get("key") == "node.kubernetes.io/not-ready" for t in taints):
            waiting.append(name)
    return waiting


def _expected_ready(state_dir: Path) -> set[str]:
    """The simulated nodes whose Node should become Ready: not those the scenario has down or whose kubelet it
    stopped (no kubelet posts: ``nodeagent.kubelet_stopped``), nor those whose containerd CRI does not load (the
    kubelet posts Ready=False: ``containers.cri_down``). Read as the node agent reads them (``observed_nodes``)."""
    cluster_faults = FaultFile(state_dir).read()
    return {
        n.name
        for n in observed_nodes(state_dir)
        if not kubelet_stopped(n, cluster_faults) and not cri_down(runtime(n))
    }


def wait_nodes_ready(ctx: Context, state_dir: Path, timeout: float = NODES_READY_SECONDS) -> None:
    """Poll until every simulated node that should be Ready (``_expected_ready``: a scenario's unreachable node
    never is) has its Node Ready and untainted; fail naming the ones that are not."""
    names = _expected_ready(state_dir)
    deadline = time.monotonic() + timeout
    while waiting := _unready_nodes(ctx, names):
        if time.monotonic() > deadline:
            raise AssertionError(f"Nodes not Ready and untainted after {timeout:.0f} s: {waiting}")
        time.sleep(0.2)


def ready_if_real(ctx: Context, state_dir: Path) -> None:
    """On the real control plane (``realkube.start_servers`` chose it for this state dir), wait until every Node
    is Ready and untainted before the test creates pods; nothing to wait for where no control plane was started
    (``sim_cluster(daemon=False)``)."""
    if realkube.supervisor_pid(state_dir) is not None:
        wait_nodes_ready(ctx, state_dir)


def stop_servers(state_dir: Path) -> None:
    """What ``realkube.start_servers`` started: the real control plane (if any) first, then the daemon."""
    realkube.stop(state_dir)
    cluster.stop_daemon(state_dir)


def _params(state_dir: Path, talos_version: str, params: dict[str, Any]) -> Params:
    """The runbook's parameters for the cluster's GPU nodes (also ``tests/simcluster.py``'s)."""
    gpu_nodes = [n for n in load_nodes(state_dir) if n.gpus]
    data: dict[str, Any] = {
        "cluster": "test",
        "target": "simulated",
        "talos_version": talos_version,
        "nodes": [{"name": n.name, "address": n.address} for n in gpu_nodes],
        **params,
    }
    return validate(data, source="test")


@contextmanager
def real_cluster(
    state_dir: Path,
    *,
    talos_version: str = "v1.12.7",
    workers: int = 2,
    scenario: str = "fresh",
    gpus_per_worker: int = 1,
    **params: Any,
) -> Iterator[tuple[Params, Context]]:
    """Create a simulated cluster on the real control plane; yield validated params + a connected context.

    The daemon starts (the Image Factory, the tool server), and the real control plane beside it. Stops
    everything it started, also when the test fails."""
    cluster.create(
        state_dir,
        cluster.ClusterSpec(
            workers=workers, talos_version=talos_version, scenario=scenario, gpus_per_worker=gpus_per_worker
        ),
    )
    tools = tools_for(str(load_cluster(state_dir)["kubernetes_version"]))
    cluster.start_daemon(state_dir)
    try:
        realkube.start(state_dir, tools)
        p = _params(state_dir, talos_version, params)
        ctx = connect(p, state_dir=state_dir)
        wait_nodes_ready(ctx, state_dir)
        yield p, ctx
    finally:
        realkube.stop(state_dir)
        cluster.stop_daemon(state_dir)
