"""A node the patch reboots but Kubernetes does not know by the parameters' name is not patched.

Why: ``kubectl drain <name>`` of a name Kubernetes does not know drains nothing, and skipping the drain would reboot
a node with its pods still on it whenever ``nodes[].name`` differs from the node's Kubernetes name (talosctl's own
drain asks the node for that name: talos@v1.13.0 cmd/talosctl/pkg/talos/nodedrain/nodedrain.go:47-63). The
Kubernetes client answers as the real one does for a missing Node (``read_node`` 404 -> ``Kube.node`` None).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from runbook_lib.steps import drains


class _Kubectl:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def drain(self, node: str, *, timeout_s: float) -> Any:
        self.calls.append(node)
        return SimpleNamespace(ok=True, stderr="")


def test_a_node_kubernetes_does_not_know_by_that_name_is_reported_not_drained_and_not_skipped() -> None:
    kubectl = _Kubectl()
    ctx = SimpleNamespace(
        params=SimpleNamespace(timeouts=SimpleNamespace(drain_seconds=300)),
        kube=SimpleNamespace(node=lambda name: None),
        kubectl=kubectl,
    )
    outcome = drains.drain(ctx, ["gpu-7"])  # type: ignore[arg-type]
    assert outcome.cordoned == [] and kubectl.calls == []
    assert "no Kubernetes Node named gpu-7" in outcome.failed["gpu-7"]
    assert "nodes[].name" in outcome.failed["gpu-7"]


def _node(boot_id: str, ready: str = "True") -> dict[str, Any]:
    """A Node as the API serves it: the kubelet posts the kernel's boot ID (kubernetes@v1.35.0
    pkg/kubelet/nodestatus/setters.go:243-254) and its Ready condition."""
    return {
        "metadata": {"name": "gpu-7"},
        "spec": {"unschedulable": True},
        "status": {
            "conditions": [{"type": "Ready", "status": ready, "reason": "KubeletReady"}],
            "nodeInfo": {"bootID": boot_id, "kubeletVersion": "v1.35.0"},
        },
    }


class _Answers:
    """``Kube.node`` answering each read with the next of ``answers`` (an exception is raised), the last one
    for ever."""

    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)

    def annotate_node(self, name: str, annotations: dict[str, str | None]) -> None:
        pass  # the mark's removal after the uncordon: _Cluster below checks it

    def node(self, name: str) -> Any:
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer


def _uncordoning(monkeypatch: pytest.MonkeyPatch, kube: _Answers) -> tuple[Any, list[str]]:
    monkeypatch.setattr(drains, "READY_POLL_S", 0.0)
    uncordoned: list[str] = []

    def uncordon(node: str) -> Any:
        uncordoned.append(node)
        return SimpleNamespace(ok=True, stderr="")

    return SimpleNamespace(kube=kube, kubectl=SimpleNamespace(uncordon=uncordon)), uncordoned


def test_a_node_still_showing_its_old_kubelets_ready_is_not_uncordoned_until_the_new_boot_posts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Talos's API answers from the new boot before the kubelet starts, and the Node keeps the old kubelet's
    Ready until the node lifecycle controller's grace period passes (nodelifecycle/config/v1alpha1/defaults.go:
    40-46): Ready alone would uncordon a node with no kubelet."""
    kube = _Answers(_node("old-boot"), _node("old-boot"), _node("new-boot", ready="False"), _node("new-boot"))
    ctx, uncordoned = _uncordoning(monkeypatch, kube)
    left = drains.uncordon_when_ready(ctx, ["gpu-7"], 5.0, {"gpu-7": "old-boot"})  # type: ignore[arg-type]
    assert left == {} and uncordoned == ["gpu-7"]
    assert kube.answers == [_node("new-boot")], "uncordoned before the new boot's kubelet was Ready"


def test_an_api_error_while_the_node_comes_back_is_waited_out_not_raised(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """talosctl's wait takes a failed read as "not Ready yet" (talos@v1.13.0 nodedrain.go:157-160); raising
    left the batch's nodes cordoned and the step without a result."""
    from runbook_lib.errors import RetryableError

    down = RetryableError("read node gpu-7: the Kubernetes API did not answer")
    ctx, uncordoned = _uncordoning(monkeypatch, _Answers(down, down, _node("new-boot")))
    assert drains.uncordon_when_ready(ctx, ["gpu-7"], 5.0, {"gpu-7": "old-boot"}) == {}  # type: ignore[arg-type]
    assert uncordoned == ["gpu-7"]


def test_a_node_whose_new_kubelet_never_posts_keeps_its_cordon_and_says_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ctx, uncordoned = _uncordoning(monkeypatch, _Answers(_node("old-boot")))
    left = drains.uncordon_when_ready(ctx, ["gpu-7"], 0.05, {"gpu-7": "old-boot"})  # type: ignore[arg-type]
    assert uncordoned == [] and "not Ready from its new boot" in left["gpu-7"]


class _Cluster:
    """Nodes as the API serves them, their annotations patched as a strategic merge patch does (None removes)."""

    def __init__(self, nodes: dict[str, dict[str, Any]]) -> None:
        self.nodes = nodes

    def node(self, name: str) -> dict[str, Any] | None:
        return self.nodes.get(name)

    def each(self, fn: Any, items: list[str]) -> list[Any]:
        return [fn(item) for item in items]

    def annotate_node(self, name: str, annotations: dict[str, str | None]) -> None:
        meta = self.nodes[name]["metadata"]
        meta["annotations"] = {
            k: v for k, v in {**(meta.get("annotations") or {}), **annotations}.items() if v is not None
        }


def _cordoned(marked: bool) -> dict[str, Any]:
    node = _node("new-boot")
    if marked:
        node["metadata"]["annotations"] = {drains.CORDON_MARK: "true"}
    return node


def test_a_cordon_the_runbook_marked_is_not_taken_for_an_administrators() -> None:
    """A run interrupted between its drain and its uncordon leaves the cordon; Talos marks the cordons it sets
    the same way (``talos.dev/cordoned``, talos@v1.13.0 node_apply.go:466-488) to tell them from an
    administrator's. Unmarked, the next run took it for an administrator's and never lifted it."""
    assert drains.administrators(_cordoned(marked=False))
    assert not drains.administrators(_cordoned(marked=True))


def test_the_next_run_lifts_a_cordon_a_run_left_and_leaves_an_administrators(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from runbook_lib.steps.patch import _cordons_left
    from runbook_lib.steps.results import StepResult

    monkeypatch.setattr(drains, "READY_POLL_S", 0.0)
    cluster = _Cluster({"gpu-1": _cordoned(marked=True), "gpu-2": _cordoned(marked=False)})

    def uncordon(node: str) -> Any:
        cluster.nodes[node]["spec"]["unschedulable"] = False
        return SimpleNamespace(ok=True, stderr="")

    ctx = SimpleNamespace(
        params=SimpleNamespace(default_runtime_patch=True, timeouts=SimpleNamespace(node_ready_seconds=5)),
        kube=cluster,
        kubectl=SimpleNamespace(uncordon=uncordon),
    )
    plan = StepResult(step="config-patch", applied=False)
    assert _cordons_left(ctx, plan, ["gpu-1", "gpu-2"], lift=False) == ["gpu-1"]  # type: ignore[arg-type]
    assert cluster.nodes["gpu-1"]["spec"]["unschedulable"], "a plan changed nothing"
    applied = StepResult(step="config-patch", applied=True)
    _cordons_left(ctx, applied, ["gpu-1", "gpu-2"], lift=True)  # type: ignore[arg-type]
    assert not cluster.nodes["gpu-1"]["spec"]["unschedulable"]
    assert drains.CORDON_MARK not in (cluster.nodes["gpu-1"]["metadata"].get("annotations") or {})
    assert cluster.nodes["gpu-2"]["spec"]["unschedulable"], "the administrator's cordon was lifted"
    assert applied.notes == ["lifted the cordon a run could not lift on gpu-1"]


def test_a_drain_that_cannot_start_leaves_no_mark_on_a_node_it_never_cordoned() -> None:
    """The mark is set before ``kubectl drain`` runs; when kubectl cannot even start (not installed: the runner
    raises before any cordon), the Node stays schedulable, so a mark left on it would make the next run's plan
    list a cordon that does not exist, and a later administrator's cordon pass for the runbook's and be lifted."""
    from runbook_lib.errors import PermanentError

    node = _node("boot")
    node["spec"]["unschedulable"] = False
    cluster = _Cluster({"gpu-7": node})

    def missing(name: str, *, timeout_s: float) -> Any:
        raise PermanentError(
            "kubectl not found: /opt/bin/kubectl", hint="install kubectl or set tools.kubectl"
        )

    ctx = SimpleNamespace(
        params=SimpleNamespace(timeouts=SimpleNamespace(drain_seconds=300)),
        kube=cluster,
        kubectl=SimpleNamespace(drain=missing),
    )
    outcome = drains.drain(ctx, ["gpu-7"])  # type: ignore[arg-type]
    assert "kubectl not found" in outcome.failed["gpu-7"] and outcome.cordoned == []
    assert drains.CORDON_MARK not in (node["metadata"].get("annotations") or {})
    node["spec"]["unschedulable"] = True  # an administrator cordons it later
    assert drains.administrators(node)


def test_a_drain_that_cannot_start_keeps_the_mark_of_a_cordon_a_run_left() -> None:
    """A node still cordoned and marked by an interrupted run: the failed start must not strip the mark, or its
    cordon would pass for an administrator's and never be lifted."""
    from runbook_lib.errors import PermanentError

    node = _cordoned(marked=True)
    cluster = _Cluster({"gpu-7": node})

    def missing(name: str, *, timeout_s: float) -> Any:
        raise PermanentError("kubectl not found: /opt/bin/kubectl")

    ctx = SimpleNamespace(
        params=SimpleNamespace(timeouts=SimpleNamespace(drain_seconds=300)),
        kube=cluster,
        kubectl=SimpleNamespace(drain=missing),
    )
    assert "gpu-7" in drains.drain(ctx, ["gpu-7"]).failed  # type: ignore[arg-type]
    assert not drains.administrators(node)


def test_a_kubectl_that_cannot_execute_is_a_refused_drain_and_leaves_no_mark(tmp_path) -> None:
    """A ``tools.kubectl`` that exists but cannot run (no execute bit; another architecture's binary gives
    ENOEXEC) raised a bare OSError past the drain's error handling: the step ended with a traceback and the
    mark stayed on a schedulable Node. The runner now names the file, as for one that is missing."""
    from runbook_lib.clients.kubectl import Kubectl
    from runbook_lib.clients.proc import Runner

    binary = tmp_path / "kubectl"
    binary.write_text("not a program\n")
    binary.chmod(0o644)
    node = _node("boot")
    node["spec"]["unschedulable"] = False
    cluster = _Cluster({"gpu-7": node})
    ctx = SimpleNamespace(
        params=SimpleNamespace(timeouts=SimpleNamespace(drain_seconds=300)),
        kube=cluster,
        kubectl=Kubectl(str(binary), kubeconfig=None, runner=Runner()),
    )
    outcome = drains.drain(ctx, ["gpu-7"])  # type: ignore[arg-type]
    assert (
        f"{binary}: cannot run it" in outcome.failed["gpu-7"] and "tools.kubectl" in outcome.failed["gpu-7"]
    )
    assert drains.CORDON_MARK not in (node["metadata"].get("annotations") or {})


def test_a_cordon_a_run_left_on_a_node_that_is_down_stays_without_holding_the_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Lifting a cordon a run left is tidying: the node is not rebooting for this step, so one not Ready is down
    (often why a rollback runs). Before, the step waited ``node_ready_seconds`` (300 s by default) for it."""
    from runbook_lib.steps.results import StepResult

    def waited(seconds: float) -> None:
        raise AssertionError(f"the step waited {seconds} s for a node that is down")

    monkeypatch.setattr(drains.time, "sleep", waited)
    down = _cordoned(marked=True)
    down["status"]["conditions"][0]["status"] = "Unknown"
    cluster = _Cluster({"gpu-1": down, "gpu-2": _cordoned(marked=True)})

    def uncordon(node: str) -> Any:
        cluster.nodes[node]["spec"]["unschedulable"] = False
        return SimpleNamespace(ok=True, stderr="")

    ctx = SimpleNamespace(
        params=SimpleNamespace(timeouts=SimpleNamespace(node_ready_seconds=3600)),
        kube=cluster,
        kubectl=SimpleNamespace(uncordon=uncordon),
    )
    result = StepResult(step="rollback", applied=True)
    drains.lift_left(ctx, result, ["gpu-1", "gpu-2"], wait_s=0.0)  # type: ignore[arg-type]  # as rollback does
    assert (
        cluster.nodes["gpu-1"]["spec"]["unschedulable"]
        and not cluster.nodes["gpu-2"]["spec"]["unschedulable"]
    )
    [note] = [n for n in result.notes if n.startswith("gpu-1:")]
    assert "its Node was not Ready within 0 s" in note and "kubectl uncordon gpu-1 once it is back" in note


def test_a_cordon_that_cannot_be_lifted_is_a_note_not_the_loss_of_the_steps_result() -> None:
    """Rollback lifts leftover cordons after its rollout: an exception there lost the result that lists what the
    rollout changed."""
    from runbook_lib.errors import PermanentError
    from runbook_lib.steps.results import StepResult

    def missing(node: str) -> Any:
        raise PermanentError("kubectl: command not found")

    ctx = SimpleNamespace(
        params=SimpleNamespace(timeouts=SimpleNamespace(node_ready_seconds=5)),
        kube=_Cluster({"gpu-1": _cordoned(marked=True)}),
        kubectl=SimpleNamespace(uncordon=missing),
    )
    result = StepResult(step="rollback", applied=True)
    drains.lift_left(ctx, result, ["gpu-1"])  # type: ignore[arg-type]
    assert result.notes == ["the cordon a run left on gpu-1 stays: kubectl: command not found"]


def test_a_step_waits_a_bounded_time_for_a_node_an_interrupted_run_left_still_booting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """config-patch may run right after the interrupted run, its node still coming back: it waits for it, but
    at most ``LEFT_READY_S``, not ``node_ready_seconds`` (a node that is down must not hold the step)."""
    from runbook_lib.steps.results import StepResult

    clock = [0.0]
    monkeypatch.setattr(drains.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(drains.time, "sleep", lambda s: clock.__setitem__(0, clock[0] + s))
    booting = _cordoned(marked=True)
    booting["status"]["conditions"][0]["status"] = "Unknown"
    cluster = _Cluster({"gpu-1": booting})
    ready_at = [20.0]

    def node(name: str) -> Any:
        if clock[0] >= ready_at[0]:
            booting["status"]["conditions"][0]["status"] = "True"
        return cluster.nodes[name]

    ctx = SimpleNamespace(
        params=SimpleNamespace(timeouts=SimpleNamespace(node_ready_seconds=3600)),
        kube=SimpleNamespace(node=node, annotate_node=cluster.annotate_node),
        kubectl=SimpleNamespace(uncordon=lambda n: SimpleNamespace(ok=True, stderr="")),
    )
    result = StepResult(step="config-patch", applied=True)
    drains.lift_left(ctx, result, ["gpu-1"])  # type: ignore[arg-type]
    assert result.notes == ["lifted the cordon a run could not lift on gpu-1"]
    booting["status"]["conditions"][0]["status"] = "Unknown"
    clock[0], ready_at[0] = 0.0, float("inf")  # down for good
    down = StepResult(step="config-patch", applied=True)
    drains.lift_left(ctx, down, ["gpu-1"])  # type: ignore[arg-type]
    assert clock[0] <= drains.LEFT_READY_S + drains.READY_POLL_S
    assert f"its Node was not Ready within {drains.LEFT_READY_S:.0f} s" in down.notes[0]
