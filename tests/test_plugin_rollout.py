"""Which device-plugin pod is judged on a node (``steps.plugin_rollout``), as the DaemonSet controller counts
them: kubernetes v1.35.0 pkg/controller/daemon/update.go:266-288 ``findUpdatedPodsOnNode`` leaves out a pod
being deleted, and a node holds two pods while an old one is held by a finalizer (the controller creates the
new one beside it: daemon_controller.go ``podsShouldBeOnNode`` skips deleting pods) or during a surge.

The pods are shaped as the API server returns them (``Kube.to_dict``: camelCase, as ``kubectl get -o json``)."""

from __future__ import annotations

import itertools
from typing import Any

from runbook_lib.steps.plugin_rollout import REVISION_LABEL, Rollout, _by_node


def _pod(
    name: str, node: str, revision: str, *, deleting: bool = False, ready: bool = True
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": {REVISION_LABEL: revision}}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-05T16:00:00Z"
        meta["finalizers"] = ["example.com/hold"]
    status = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    return {"metadata": meta, "spec": {"nodeName": node}, "status": status}


def _rollout(pods: list[dict[str, Any]]) -> Rollout:
    return Rollout("nvidia-device-plugin", "new", _by_node(pods, "new"), done=False)


def test_an_old_pod_held_terminating_beside_the_new_one_is_not_judged_in_any_list_order() -> None:
    """Before: the last pod listed on a node won, so the node failed as 'still runs the previous device
    plugin' whenever the terminating old pod sorted after the new one."""
    pods = [_pod("plugin-aaaaa", "gpu-1", "old", deleting=True), _pod("plugin-bbbbb", "gpu-1", "new")]
    for order in itertools.permutations(pods):
        rollout = _rollout(list(order))
        assert rollout.pods["gpu-1"]["metadata"]["name"] == "plugin-bbbbb"
        assert rollout.behind() == {}


def test_of_two_live_pods_on_a_node_the_current_revisions_is_judged() -> None:
    pods = [_pod("plugin-old", "gpu-1", "old"), _pod("plugin-new", "gpu-1", "new", ready=False)]
    for order in itertools.permutations(pods):
        behind = _rollout(list(order)).behind()
        assert list(behind) == ["gpu-1"] and "new pod plugin-new is not ready" in behind["gpu-1"], behind


def test_a_node_whose_only_pod_is_being_deleted_has_no_pod_judged() -> None:
    """The GPU check says why such a node has no GPUs; the rollout does not blame a pod that is going."""
    rollout = _rollout([_pod("plugin-x", "gpu-1", "old", deleting=True), _pod("plugin-y", "gpu-2", "old")])
    assert set(rollout.pods) == {"gpu-2"}
    assert list(rollout.behind()) == ["gpu-2"]
