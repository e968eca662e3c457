"""Which device-plugin pod is judged on a node (``steps.plugin_rollout``), as the DaemonSet controller counts
them (kubernetes v1.35.0 pkg/controller/daemon): ``findUpdatedPodsOnNode`` (update.go:266-288) leaves out a pod
being deleted. A node holds a pod being deleted beside a live one when the old pod is terminal and awaiting its
deletion (``getNodesToDaemonPods`` drops only pods both terminal and deleted, daemon_controller.go:747, so the
controller creates the new one beside it), and two live pods during a surge. A node whose only pod is being
deleted and is not terminal gets no new pod until it is gone (``podsShouldBeOnNode``, daemon_controller.go:
806-812), while the kubelet keeps the stopped plugin's GPUs allocatable for up to 5 minutes (pkg/kubelet/cm/
devicemanager/types.go:122 ``endpointStopGracePeriod``): that node is not judged ok.

The pods are shaped as the API server returns them (``Kube.to_dict``: camelCase, as ``kubectl get -o json``)."""

from __future__ import annotations

import itertools
import time
from dataclasses import replace
from typing import Any

from runbook_lib.steps.kube_diagnosis import DownNodes, Stall
from runbook_lib.steps.plugin_rollout import REVISION_LABEL, Rollout, _by_node


def _pod(
    name: str, node: str, revision: str, *, deleting: bool = False, ready: bool = True, phase: str = "Running"
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": {REVISION_LABEL: revision}}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-05T16:00:00Z"
        meta["finalizers"] = ["example.com/hold"]
    status = {"phase": phase, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    return {"metadata": meta, "spec": {"nodeName": node}, "status": status}


def _rollout(pods: list[dict[str, Any]]) -> Rollout:
    return Rollout("nvidia-device-plugin", "new", _by_node(pods, "new"), done=False)


def test_a_terminal_old_pod_awaiting_deletion_beside_the_new_one_is_not_judged_in_any_list_order() -> None:
    """Before: the last pod listed on a node won, so the node failed as 'still runs the previous device
    plugin' whenever the old pod sorted after the new one."""
    old = _pod("plugin-aaaaa", "gpu-1", "old", deleting=True, ready=False, phase="Failed")
    pods = [old, _pod("plugin-bbbbb", "gpu-1", "new")]
    for order in itertools.permutations(pods):
        rollout = _rollout(list(order))
        assert rollout.pods["gpu-1"]["metadata"]["name"] == "plugin-bbbbb"
        assert rollout.behind() == {}


def test_of_two_live_pods_on_a_node_the_current_revisions_is_judged() -> None:
    pods = [_pod("plugin-old", "gpu-1", "old"), _pod("plugin-new", "gpu-1", "new", ready=False)]
    for order in itertools.permutations(pods):
        behind = _rollout(list(order)).behind()
        assert list(behind) == ["gpu-1"] and "new pod plugin-new is not ready" in behind["gpu-1"], behind


def test_a_node_whose_only_pod_is_being_deleted_is_behind_and_holds_the_others() -> None:
    """Its GPUs may still be allocatable from the stopped plugin; the rolling update counts the node
    unavailable, so a node still on the previous plugin waits on it."""
    behind = _rollout(
        [_pod("plugin-x", "gpu-1", "old", deleting=True), _pod("plugin-y", "gpu-2", "old")]
    ).behind()
    assert "plugin-x is being deleted" in behind["gpu-1"], behind
    assert "still runs the previous device plugin" in behind["gpu-2"] and "waits on gpu-1" in behind["gpu-2"]


def test_the_operators_image_counts_with_a_digest_an_admission_policy_appended() -> None:
    """Image-verifying admission policies that pin digests rewrite ``repo/img:tag`` to ``repo/img:tag@sha256:…``;
    the step must not wait its whole timeout for an exact string the API server never stores."""
    want = "nvcr.io/nvidia/k8s-device-plugin:v0.20.0"
    pinned = Rollout("ds", "new", {}, done=True, images=(want + "@sha256:" + "a" * 64,), wanted_image=want)
    assert not pinned.stale()
    older = Rollout(
        "ds", "new", {}, done=True, images=("nvcr.io/nvidia/k8s-device-plugin:v0.19.3",), wanted_image=want
    )
    assert older.stale()


def _node(name: str, ready: str, changed: str) -> dict[str, Any]:
    """A Node as the API server returns it, its Ready condition as the node lifecycle controller leaves it for a
    node whose kubelet stopped posting (kubernetes v1.35.0 node_lifecycle_controller.go:966-971)."""
    condition = {"type": "Ready", "status": ready, "lastTransitionTime": changed}
    if ready == "Unknown":
        condition |= {"reason": "NodeStatusUnknown", "message": "Kubelet stopped posting node status."}
    return {"metadata": {"name": name}, "status": {"conditions": [condition]}}


def _stamp(seconds_ago: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - seconds_ago))


def test_a_node_down_for_minutes_counts_as_down_at_once_and_one_just_gone_only_after_the_grace() -> None:
    down = DownNodes()
    down.see(_node("gpu-1", "Unknown", _stamp(300)))
    down.see(_node("gpu-2", "Unknown", _stamp(0)))
    down.see(_node("gpu-3", "True", _stamp(900)))

    assert down.down(["gpu-1"]) == ["gpu-1"]
    assert down.down(["gpu-1", "gpu-2"]) == []  # gpu-2 went down just now: it may be back within the grace
    assert down.down(["gpu-2", "gpu-1"], grace_s=0) == ["gpu-1", "gpu-2"]
    assert down.down(["gpu-3"], grace_s=0) == []  # Ready
    assert down.down([]) == []

    down.see(_node("gpu-1", "True", _stamp(0)))  # its kubelet posts again
    assert down.down(["gpu-1"], grace_s=0) == []


class _NodeReads:
    """A kube that serves Nodes by name (``Kube.node``: None when there is none) and counts the reads."""

    def __init__(self) -> None:
        self.nodes: dict[str, dict[str, Any]] = {}
        self.reads: list[str] = []

    def node(self, name: str) -> dict[str, Any] | None:
        self.reads.append(name)
        return self.nodes.get(name)


def test_a_node_that_came_back_and_went_down_again_gets_a_new_grace_before_a_wait_gives_up_on_it() -> None:
    """Before (90f31b5), a wait's look returned at a Ready node before noting it Ready, so the node kept when it
    first went down, and a second outage minutes later counted as down at once: the rollout gave up and offered
    a forced delete for a node that was only restarting its kubelet."""
    kube = _NodeReads()
    stall = Stall(kube)  # type: ignore[arg-type]  # the one read a look makes
    kube.nodes["gpu-1"] = _node("gpu-1", "Unknown", _stamp(300))
    assert stall.down_among(["gpu-1"]) == ["gpu-1"]
    kube.nodes["gpu-1"] = _node("gpu-1", "True", _stamp(0))  # its kubelet posts again
    assert stall.down_among(["gpu-1"]) == []
    kube.nodes["gpu-1"] = _node("gpu-1", "Unknown", _stamp(0))  # and stops again, just now
    assert stall.down_among(["gpu-1"]) == [], "a new outage waits its own grace"
    assert stall.down == []


def test_a_wait_held_by_a_ready_node_reads_that_node_first_at_each_look() -> None:
    kube = _NodeReads()
    stall = Stall(kube)  # type: ignore[arg-type]
    kube.nodes = {
        "gpu-a": _node("gpu-a", "Unknown", _stamp(300)),
        "gpu-b": _node("gpu-b", "True", _stamp(900)),
    }
    assert stall.down_among(["gpu-a", "gpu-b"]) == []
    assert stall.down_among(["gpu-a", "gpu-b"]) == []
    assert kube.reads == ["gpu-a", "gpu-b", "gpu-b"], kube.reads


def test_the_nodes_a_rolling_update_waits_on_are_those_whose_pod_is_deleted_or_new_and_not_ready() -> None:
    rollout = _rollout(
        [
            _pod("old-a", "gpu-1", "old", deleting=True),
            _pod("new-b", "gpu-2", "new", ready=False),
            _pod("new-c", "gpu-3", "new"),
            _pod("old-d", "gpu-4", "old"),
        ]
    )
    assert rollout.holding() == ["gpu-1", "gpu-2"]
    assert "waits on gpu-1, gpu-2" in rollout.behind()["gpu-4"]


def test_a_first_install_whose_new_pod_sits_on_a_node_that_went_down_blames_no_old_pod() -> None:
    """Found by an operator walkthrough, reproduced by a helper: the node went down after the DaemonSet placed its
    pod there (helm revision 1), so the controller kept counting it and the rollout never ended; the step said
    "the old device plugin pod there is deleted only when its kubelet confirms it", an upgrade's words."""
    from runbook_lib.steps.kubernetes import _judge_rollout
    from runbook_lib.steps.results import StepResult

    pods = [_pod("new-a", "gpu-1", "new"), _pod("new-b", "gpu-2", "new")]
    stranded = _pod("new-c", "gpu-3", "new", ready=False, phase="Pending")
    rollout = replace(_rollout([*pods, stranded]), held_by_down=("gpu-3",))
    result = StepResult("kubernetes", applied=True)
    _judge_rollout(result, rollout)
    assert not [c for c in result.checks if not c.ok], result.checks
    assert any("new-c on gpu-3 before the node went down" in n and "--force" in n for n in result.notes)
    upgrade = replace(_rollout([*pods[:1], _pod("old-b", "gpu-2", "old"), stranded]), held_by_down=("gpu-3",))
    result = StepResult("kubernetes", applied=True)
    _judge_rollout(result, upgrade)  # another node waits on gpu-3: the upgrade's check stays
    assert any("stopped at gpu-3" in c.message for c in result.checks if not c.ok), result.checks


def _pulling(name: str, node: str, message: str, reason: str = "ImagePullBackOff") -> dict[str, Any]:
    pod = _pod(name, node, "new", ready=False, phase="Pending")
    waiting = {"reason": reason, "message": message}
    pod["status"]["containerStatuses"] = [{"name": "nvidia-device-plugin-ctr", "state": {"waiting": waiting}}]
    return pod


NOT_FOUND = (
    'Back-off pulling image "nvcr.io/nvidia/k8s-device-plugin:v0.99.0": ErrImagePull: rpc error: code = NotFound '
    'desc = failed to pull and unpack image "nvcr.io/nvidia/k8s-device-plugin:v0.99.0": not found'
)


def test_the_rollout_gives_up_only_on_nodes_whose_image_the_registry_does_not_have(monkeypatch: Any) -> None:
    """Once the rollout has not moved for ``DOWN_GRACE_S`` and every node it waits on cannot pull an image the
    registry does not have (the CRI's NotFound), waiting longer cannot help (operator walkthrough, stop 53); a
    429, or a DaemonSet the GPU Operator has not rewritten yet (its pods are the previous spec's: review, stop
    53), keeps the wait going."""
    from types import SimpleNamespace

    from runbook_lib.steps import plugin_rollout

    limited = NOT_FOUND.replace("code = NotFound", "code = Unknown").replace(
        "not found", "429 Too Many Requests"
    )
    cases = [
        (
            [_pulling("p1", "gpu-1", NOT_FOUND), _pulling("p2", "gpu-2", NOT_FOUND, "ErrImagePull")],
            None,
            True,
        ),
        ([_pulling("p1", "gpu-1", NOT_FOUND), _pulling("p2", "gpu-2", limited)], None, False),
        ([_pulling("p1", "gpu-1", NOT_FOUND)], "nvcr.io/nvidia/k8s-device-plugin:v0.18.0", False),
    ]
    for pods, wanted, gives_up in cases:
        rollout = replace(
            _rollout(pods), images=("nvcr.io/nvidia/k8s-device-plugin:v0.99.0",), wanted_image=wanted
        )
        monkeypatch.setattr(plugin_rollout, "read", lambda *_a, r=rollout: r)
        stall = plugin_rollout._Stall(SimpleNamespace(kube=None), wanted)  # type: ignore[arg-type]
        stall.last = {"status": {}}
        monkeypatch.setattr(stall.stall, "quiet", lambda _mark: True)
        monkeypatch.setattr(stall.stall, "down_among", lambda _names: [])
        why = stall.held()
        assert (why is not None) is gives_up, (pods, why)
        assert stall.unpullable == (sorted(rollout.pods) if gives_up else []), stall.unpullable


def test_the_rollout_gives_up_on_a_mix_of_nodes_that_are_down_and_pods_that_cannot_pull(
    monkeypatch: Any,
) -> None:
    """Review of stop 53: one node's pod could not pull an image the registry lacks and the other node the update
    waited on was down; each alone ended the wait after ``DOWN_GRACE_S``, together they waited the whole timeout.
    A holder that is up and only slow to pull still keeps the wait going."""
    from types import SimpleNamespace

    from runbook_lib.steps import plugin_rollout

    stranded = _pod("p2", "gpu-2", "new", ready=False, phase="Pending")
    rollout = replace(
        _rollout([_pulling("p1", "gpu-1", NOT_FOUND), stranded]),
        images=("nvcr.io/nvidia/k8s-device-plugin:v0.99.0",),
    )
    monkeypatch.setattr(plugin_rollout, "read", lambda *_a: rollout)
    for down_nodes, gives_up in ((["gpu-2"], True), ([], False)):
        stall = plugin_rollout._Stall(SimpleNamespace(kube=None), None)  # type: ignore[arg-type]
        stall.last = {"status": {}}
        monkeypatch.setattr(stall.stall, "quiet", lambda _mark: True)
        asked: list[list[str]] = []

        def down_among(
            names: list[str], down: list[str] = down_nodes, asked: list[list[str]] = asked
        ) -> list[str]:
            asked.append(list(names))
            return down if sorted(names) == down else []

        monkeypatch.setattr(stall.stall, "down_among", down_among)
        why = stall.held()
        assert asked == [["gpu-2"]], "the node that cannot pull is not asked to be down"
        assert (why is not None) is gives_up, why
        if gives_up:
            assert (
                why is not None and "waits on gpu-2, not Ready" in why and "pod on gpu-1 cannot pull" in why
            )
            assert stall.unpullable == ["gpu-1"]


def test_a_node_down_with_an_earlier_pod_that_could_not_pull_is_held_by_the_node_not_the_image(
    monkeypatch: Any,
) -> None:
    """Review of 638403c: a rollout with a typo'd tag, then the image corrected; the node that went down still
    holds the bad revision's pod, being deleted. It was reported as "cannot pull its image" (the current image is
    fine) and lost the forced-delete fix of a node that is down."""
    from types import SimpleNamespace

    from runbook_lib.steps import plugin_rollout

    earlier = _pulling("p1", "gpu-1", NOT_FOUND)
    earlier["metadata"]["labels"] = {REVISION_LABEL: "old"}
    earlier["metadata"]["deletionTimestamp"] = "2026-12-07T20:00:00Z"
    rollout = _rollout([earlier, _pod("p2", "gpu-2", "new")])
    assert rollout.holding() == ["gpu-1"] and not rollout.cannot_pull("gpu-1")
    monkeypatch.setattr(plugin_rollout, "read", lambda *_a: rollout)
    stall = plugin_rollout._Stall(SimpleNamespace(kube=None), None)  # type: ignore[arg-type]
    stall.last = {"status": {}}
    monkeypatch.setattr(stall.stall, "quiet", lambda _mark: True)
    monkeypatch.setattr(stall.stall, "down_among", sorted)
    why = stall.held()
    assert why is not None and "waits on gpu-1, not Ready" in why and "cannot pull" not in why, why
    assert stall.unpullable == []
