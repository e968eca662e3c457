"""A patch that reboots a node drains it first, as a Talos upgrade does, and uncordons it once Ready again.

Talos runs a config change that needs a reboot through its Reboot sequence, which stops the node's pods without
evicting them (talos@v1.12.0 internal/app/machined/pkg/runtime/v1alpha1/v1alpha1_sequencer.go:236-253; its
Upgrade sequence drains first, :423-433), and ``talosctl patch`` never drains. The step drained nothing: a
workload's PodDisruptionBudget was not asked and the scheduler kept placing pods on the rebooting node. On the
real control plane with the real kubectl (its eviction API, PodDisruptionBudgets as the API server enforces
them) and simnode's Talos API; the default-runtime patch reboots on Talos 1.12.
"""

from __future__ import annotations

from typing import Any

import pytest

from runbook_lib.steps.drains import CORDON_MARK
from runbook_lib.steps.patch import config_patch, read_configs
from runbook_lib.steps.reboots import boot_ids
from tests.realplane import real_cluster

pytestmark = pytest.mark.slow

ON_NODE = "app"


def _pod(name: str, node: str) -> dict[str, Any]:
    """A workload pod on ``node`` with no controller (``kubectl drain --force`` deletes those too)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {ON_NODE: name}},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10"}],
            "tolerations": [{"operator": "Exists"}],
        },
    }


def _budget(name: str) -> dict[str, Any]:
    """A PodDisruptionBudget that allows no eviction of the pod ``name``."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {ON_NODE: name}}},
    }


def _has_default_runtime(ctx, node) -> bool:
    configs, _ = read_configs(ctx, [node])
    return "nvidia" in str(configs[node.address])


def _commands(ctx, word: str) -> list[tuple[str, ...]]:
    return [e.argv for e in ctx.journal.entries if e.kind == "command" and word in e.argv]


def _unschedulable(ctx, name: str) -> bool:
    return bool((ctx.kube.node(name) or {}).get("spec", {}).get("unschedulable"))


def _rebooting(tmp_path, **more):
    """Two GPU workers whose default-runtime patch reboots them (Talos 1.12), one node per batch."""
    return real_cluster(
        tmp_path,
        scenario="extensions-no-patch",
        default_runtime_patch=True,
        apply=True,
        rollout_concurrency=1,
        **more,
    )


def test_a_rebooting_patch_evicts_the_nodes_pods_first_and_uncordons_it_once_ready(tmp_path):
    with _rebooting(tmp_path) as (params, ctx):
        first = params.nodes[0]
        ctx.kube.create_pod("default", _pod("web", first.name))
        result = config_patch(ctx)

        assert result.counts() == {"changed": 2}, result.to_dict()
        assert ctx.kube.pod("default", "web") is None, "the pod was not evicted before the reboot"
        assert not any(_unschedulable(ctx, n.name) for n in params.nodes), "a node was left cordoned"
        marks = [
            e.summary for e in ctx.journal.entries if e.kind == "api" and CORDON_MARK in (e.summary or "")
        ]
        assert len(marks) == 4, marks  # each node marked before its drain, unmarked after its uncordon
        assert not any(
            CORDON_MARK in (ctx.kube.node(n.name)["metadata"].get("annotations") or {}) for n in params.nodes
        )
        drained = [argv[1:3] for argv in _commands(ctx, "drain")]
        assert drained == [("drain", n.name) for n in params.nodes], drained
        order = [e.argv for e in ctx.journal.entries if e.kind == "command" and e.changes_cluster]
        first_patch = next(i for i, argv in enumerate(order) if "patch" in argv and "--dry-run" not in argv)
        assert "drain" in order[first_patch - 1], "the node was not drained right before its patch"
        assert any("drain" in note for note in result.notes), "the plan did not say the nodes are drained"
        # the uncordon waited for the new boot's kubelet: the Node carries the boot ID the node serves now
        now, _errors = boot_ids(ctx, [first.address])
        posted = ctx.kube.node(first.name)["status"]["nodeInfo"]["bootID"]
        assert posted == now[first.address], (posted, now)


def test_a_node_whose_disruption_budget_blocks_the_drain_is_not_patched_nor_left_cordoned(tmp_path):
    with _rebooting(tmp_path, timeouts={"drain_seconds": 5}) as (params, ctx):
        first, second = params.nodes[:2]
        ctx.kube.create_pod("default", _pod("db", first.name))
        from kubernetes import client

        client.PolicyV1Api(ctx.kube.api).create_namespaced_pod_disruption_budget("default", _budget("db"))
        result = config_patch(ctx)

        blocked = result.node(first.name)
        assert blocked.status == "failed", result.to_dict()
        # kubectl's words at its --timeout, after retrying the eviction API's 429 every 5 s (k8s.io/kubectl@v0.35.0
        # pkg/drain/drain.go:300-314)
        assert "not patched: the patch reboots it, and its drain failed" in blocked.message
        assert "global timeout reached" in blocked.message, blocked.message
        assert "violate the pod's disruption budget" in blocked.message, blocked.message
        assert not _has_default_runtime(ctx, first), "the node was patched without its drain"
        assert not _unschedulable(ctx, first.name), "the runbook left its own cordon"
        assert ctx.kube.pod("default", "db") is not None
        assert result.node(second.name).status == "skipped", "the failure budget (0) did not stop the rollout"


def test_a_node_an_administrator_cordoned_stays_cordoned(tmp_path):
    with real_cluster(tmp_path, scenario="extensions-no-patch", default_runtime_patch=True, apply=True) as (
        params,
        ctx,
    ):
        first, second = params.nodes[:2]
        ctx.kube.core.patch_node(first.name, {"spec": {"unschedulable": True}})
        result = config_patch(ctx)

        assert result.counts() == {"changed": 2}, result.to_dict()
        assert _unschedulable(ctx, first.name), "the administrator's cordon was lifted"
        assert CORDON_MARK not in (ctx.kube.node(first.name)["metadata"].get("annotations") or {})
        assert not _unschedulable(ctx, second.name)
