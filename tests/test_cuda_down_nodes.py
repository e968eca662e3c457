"""cuda-test after its pod wait: which nodes its unfinished pods' failures name, and which get the note that
their pods stay Terminating, from the Nodes as the API server serves them (kubernetes v1.35.0): Ready Unknown
"Kubelet stopped posting node status." when the node lifecycle controller marks a silent kubelet
(pkg/controller/nodelifecycle/node_lifecycle_controller.go:966-971); Ready False with the kubelet's own reason
when a running kubelet reports its node not ready (pkg/kubelet/nodestatus/setters.go ``ReadyCondition``, e.g.
``KubeletNotReady`` "container runtime network not ready: NetworkReady=false …"). Only a running kubelet
confirms a pod's deletion, so only the first leaves the pods bound to it Terminating. The Node list is the
paged GET the step makes (``Kube.iter_nodes``); the pod logs as in tests/test_cuda_log_read.py.
"""

from __future__ import annotations

from typing import Any

from runbook_lib.errors import RetryableError
from runbook_lib.steps.cudatest import _down_nodes, _judge, build_pods
from tests.sim.test_real_kube_pods import NODE, READY, STOPPED_POSTING, FixedKube, context, node_object
from tests.test_cuda_log_read import SMI

NO_CNI = {
    "status": "False",
    "reason": "KubeletNotReady",
    "message": "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady "
    "message:Network plugin returns error: cni plugin not initialized",
}


class Nodes(FixedKube):
    """Nodes by name (``iter_nodes``, ``node``), counted; pod logs that answer ``log_status`` (None: SMI)."""

    def __init__(self, nodes: dict[str, dict[str, Any]], log_status: int | None = None) -> None:
        super().__init__([])
        self.by_name = nodes
        self.lists = 0
        self.node_reads = 0
        self.log_reads = 0
        self.log_status = log_status
        self.list_error: Exception | None = None

    def iter_nodes(self, **_: Any) -> Any:
        self.lists += 1
        if self.list_error:
            raise self.list_error
        return iter(list(self.by_name.values()))

    def node(self, name: str) -> dict[str, Any] | None:
        self.node_reads += 1
        if self.list_error:
            raise self.list_error
        return self.by_name.get(name)

    def pod_log(self, namespace: str, name: str) -> str:
        self.log_reads += 1
        if self.log_status is not None:
            raise RetryableError(f"log of {namespace}/{name}: HTTP {self.log_status}", status=self.log_status)
        return SMI


def _named(name: str, ready: dict[str, str]) -> dict[str, Any]:
    node = node_object(ready)
    node["metadata"]["name"] = name
    return node


def _down(kube: Nodes, left: dict[str, str], early: list[str] | None = None) -> Any:
    """``left``: pod name -> node, none finished."""
    return _down_nodes(context(kube), {}, left, early or [])


def test_at_the_timeout_the_nodes_not_ready_are_named_with_their_own_ready_condition():
    kube = Nodes(
        {
            "gpu-a": _named("gpu-a", STOPPED_POSTING),
            "gpu-b": _named("gpu-b", NO_CNI),
            "gpu-c": _named("gpu-c", READY),
        }
    )
    down = _down(kube, {"p1": "gpu-a", "p2": "gpu-b", "p3": "gpu-c"})
    assert sorted(down) == ["gpu-a", "gpu-b"], down  # gpu-c is Ready: its pods are just slow
    assert down["gpu-a"].unreachable and not down["gpu-b"].unreachable  # a kubelet that posts serves logs
    assert down["gpu-a"].held and down["gpu-b"].held  # a kubelet with no runtime cannot stop the pods either
    assert down["gpu-a"].said() == (
        " after 300 s: node gpu-a is not Ready (Ready=Unknown, NodeStatusUnknown: Kubelet stopped posting node "
        "status.)"
    )
    assert "KubeletNotReady: container runtime network not ready" in down["gpu-b"].said()
    assert kube.lists == 0 and kube.node_reads == 3  # a few nodes: a GET each


def test_a_node_deleted_during_the_wait_is_named_as_gone_without_the_terminating_note():
    down = _down(Nodes({NODE: _named(NODE, READY)}), {"p1": "gpu-gone"})
    assert down["gpu-gone"].said() == " after 300 s: node gpu-gone no longer exists", down
    assert not down["gpu-gone"].held  # pod GC deletes the pods of a Node that no longer exists


def test_a_thousand_hung_nodes_cost_one_paged_list_of_the_nodes_not_a_read_each():
    nodes = {f"gpu-{i:04d}": _named(f"gpu-{i:04d}", READY) for i in range(2000)}
    nodes["gpu-0007"] = _named("gpu-0007", STOPPED_POSTING)
    kube = Nodes(nodes)
    down = _down(kube, {f"p{i}": f"gpu-{i:04d}" for i in range(1000)})
    assert list(down) == ["gpu-0007"], down
    assert kube.lists == 1 and kube.node_reads == 0


def test_an_api_server_that_stops_answering_costs_one_node_read_not_one_per_node():
    kube = Nodes({})
    kube.list_error = RetryableError("read node gpu-a: the Kubernetes API did not answer: timed out")
    assert _down(kube, {"p1": "gpu-a", "p2": "gpu-b", "p3": "gpu-c"}) == {}
    assert kube.node_reads == 1


def test_a_node_list_that_fails_keeps_the_early_stops_names_and_adds_none():
    kube = Nodes({})
    kube.list_error = RetryableError("list nodes: HTTP 503 Service Unavailable", status=503)
    down = _down(kube, {"p1": "gpu-a", "p2": "gpu-b"}, early=["gpu-a"])
    assert list(down) == ["gpu-a"] and down["gpu-a"].unreachable, down
    assert "has not been Ready for 60 s or more" in down["gpu-a"].said()


def _judge_succeeded(kube: Nodes, node_down: Any = None) -> Any:
    ctx = context(kube)
    node = next(n for n in ctx.params.nodes if n.name == NODE)
    pod = next(p for p in build_pods(ctx, [node], "abc123") if p.kind == "smi")
    obj = {"metadata": {"name": pod.name, "namespace": "default"}, "status": {"phase": "Succeeded"}}
    return _judge(ctx, pod, obj, None, node_down=node_down)


def test_a_busy_api_server_429_is_read_again_without_reading_the_node():
    kube = Nodes({NODE: _named(NODE, STOPPED_POSTING)}, log_status=429)
    check = _judge_succeeded(kube)
    assert kube.log_reads == 3 and kube.node_reads == 0, (kube.log_reads, kube.node_reads)
    assert not check.ok and "HTTP 429" in check.message, check


def test_a_log_on_a_node_whose_kubelet_reports_not_ready_is_read_again_as_that_kubelet_serves_logs():
    kube = Nodes({NODE: _named(NODE, NO_CNI)}, log_status=500)
    (down,) = _down(kube, {"p1": NODE}).values()
    check = _judge_succeeded(kube, node_down=down)
    assert kube.log_reads == 3, kube.log_reads
    assert not check.ok and "HTTP 500" in check.message, check


def test_a_log_on_a_node_already_found_down_is_read_once_and_the_node_not_read_again():
    kube = Nodes({NODE: _named(NODE, STOPPED_POSTING)}, log_status=500)
    (down,) = _down(kube, {"p1": NODE}).values()
    reads = kube.node_reads
    check = _judge_succeeded(kube, node_down=down)
    assert kube.log_reads == 1 and kube.node_reads == reads, (kube.log_reads, kube.node_reads)
    assert f"node {NODE} is not Ready (Ready=Unknown" in check.message, check


def test_a_nodes_line_says_a_failure_its_pods_share_once():
    """An operator walkthrough met the node's line holding four copies of one ErrImagePull text (1,500+ chars):
    an image the node cannot pull fails its four test pods with the same words."""
    from runbook_lib.steps.cudatest import _node_results
    from runbook_lib.steps.results import Check

    ctx = context(Nodes({}))
    node = next(n for n in ctx.params.nodes if n.name == NODE)
    pods = build_pods(ctx, [node], "abc123")
    same = "pod still Pending after 300 s: ErrImagePull: not found"
    checks = [Check(p.kind, False, same) for p in pods[:-1]] + [Check(pods[-1].kind, False, "other")]
    (line,) = _node_results([node], pods, checks)
    assert line.message == f"{same}; other", line.message


def test_a_nodes_line_leaves_out_a_failure_another_pods_says_more_of():
    """CI on 6 Dec 2026 printed ``pod still Pending after 300 s; pod still Pending after 300 s: the CUDA test pod
    for gpu-worker-3 is not scheduled: 0/4 nodes are available: ...``: three pods were bound and waited, the
    fourth had the scheduler's reason."""
    from runbook_lib.steps.cudatest import _node_results
    from runbook_lib.steps.results import Check

    ctx = context(Nodes({}))
    node = next(n for n in ctx.params.nodes if n.name == NODE)
    pods = build_pods(ctx, [node], "abc123")
    short = "pod still Pending after 300 s"
    longer = (
        f"{short}: the CUDA test pod for {NODE} is not scheduled: 0/4 nodes are available: 1 Insufficient"
    )
    checks = [Check(p.kind, False, short) for p in pods[:-1]] + [Check(pods[-1].kind, False, longer)]
    (line,) = _node_results([node], pods, checks)
    assert line.message == longer, line.message


def test_after_an_early_stop_a_node_found_not_ready_is_not_said_to_have_waited_the_timeout():
    """Review of bc6c156: the wait gave up at ~70 s on pulls that failed, then the node went NotReady; its pods
    read "pod still Pending after 300 s" though no 300 s passed."""
    kube = Nodes({"gpu-a": _named("gpu-a", STOPPED_POSTING)})
    down = _down_nodes(context(kube), {}, {"p1": "gpu-a"}, [], waited_out=False)
    assert down["gpu-a"].said().startswith(": node gpu-a is not Ready"), down
