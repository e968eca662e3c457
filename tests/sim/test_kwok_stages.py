"""The pod Stages kwok plays on the real control plane (``runbook_lib/sim/kwokstages.py``): their delays follow
the simulator's time factor (issue 15 point 2: "image pulls and container runs take time, scaled by the same time
factor as the Talos side"). Before, kwok was given its own shipped pod stages, each waiting a random 1-5 s
(sigs.k8s.io/kwok@v0.8.0 kustomize/stage/pod/general/*.yaml: durationMilliseconds 1000,
jitterDurationMilliseconds 5000) at any ``RUNBOOK_SIM_TIME_SCALE``.

The delays themselves are our assumption (no source measured them; see ``kwokstages.DELAYS``); what is tested is
that kwok gets them scaled, and keeps what the node agent, the simulated GPU Operator and the Terminating test
rely on. The stages at work on the real plane: tests/test_step_kubernetes.py, tests/sim/test_real_kube_pods.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from runbook_lib.sim import kwokstages, realkube

#: Shaped as tools/build-kwok.sh assembles kwok's own stages (kustomize/stage/node/fast/node-initialize.yaml,
#: kustomize/stage/pod/general/pod-create.yaml at v0.8.0), cut to the fields read here.
KWOK_STAGES = """\
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: node-initialize
spec:
  resourceRef:
    apiGroup: v1
    kind: Node
  selector:
    matchExpressions:
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: 'NotIn'
      values:
      - 'True'
  next:
    statusTemplate: |
      phase: Running
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-create
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  delay:
    durationMilliseconds: 1000
    jitterDurationMilliseconds: 5000
  next:
    statusTemplate: |
      phase: Pending
"""


def by_name(stages: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {s["metadata"]["name"]: s for s in stages}


def waits_ms(stage: dict[str, Any]) -> tuple[int, int | None]:
    delay = stage["spec"]["delay"]
    return delay["durationMilliseconds"], delay.get("jitterDurationMilliseconds")


def test_pod_stage_delays_scale_with_the_time_factor() -> None:
    """At the suite's 0.01 a pod's stages wait a hundredth of what they wait at 1 (the image pull a few seconds
    there), where kwok's own stages waited 1-5 s each at any factor."""
    slow, fast = by_name(kwokstages.pod_stages(1.0)), by_name(kwokstages.pod_stages(0.01))
    assert set(slow) == set(fast) >= {"pod-create", "pod-ready", "pod-delete"}
    assert waits_ms(slow["pod-ready"])[0] >= 1000  # an image pull takes seconds at factor 1
    for name, stage in slow.items():
        low, high = waits_ms(stage)
        fast_low, fast_high = waits_ms(fast[name])
        assert fast_low == pytest.approx(low / 100, abs=1), name
        if high is not None:
            assert fast_high is not None and fast_high >= fast_low, name
            assert fast_high == pytest.approx(high / 100, abs=1), name
    assert max(waits_ms(s)[1] or 0 for s in fast.values()) < 1000  # below kwok's 1 s floor


def test_a_time_factor_outside_0_to_1_is_refused_naming_the_variable() -> None:
    with pytest.raises(ValueError, match="RUNBOOK_SIM_TIME_SCALE"):
        kwokstages.pod_stages(0.0)


def test_deletion_still_goes_through_terminating_within_the_grace_period() -> None:
    """kwok's pod-delete behaviour is kept: the pod is deleted at some point until its deletionTimestamp (the
    grace period), and the per-pod ``pod-delete.stage.kwok.x-k8s.io/delay`` annotation still holds it
    (tests/sim/test_real_kube_pods.py ``gpu_holder``: 15 s, to see it Terminating)."""
    delete = by_name(kwokstages.pod_stages(0.01))["pod-delete"]["spec"]
    assert delete["next"] == {"delete": True}
    assert delete["delay"]["jitterDurationFrom"] == {"expressionFrom": ".metadata.deletionTimestamp"}
    assert "pod-delete.stage.kwok.x-k8s.io/delay" in delete["delay"]["durationFrom"]["expressionFrom"]
    keys = [e["key"] for e in delete["selector"]["matchExpressions"]]
    assert keys == [".metadata.deletionTimestamp", ".metadata.finalizers"]


def test_init_container_stages_select_on_what_the_gpu_operator_holds_pods_by() -> None:
    """gpuoperator.py holds an operand pod in its validation init container by leaving no ``startedAt`` on the
    running one and no waiting reason on the later ones: the init-container stages must select on exactly
    those fields (as kwok's own pod-init-container-running/-completed do)."""
    stages = by_name(kwokstages.pod_stages(0.01))

    def keys(name: str) -> list[str]:
        return [e["key"] for e in stages[name]["spec"]["selector"]["matchExpressions"]]

    assert ".status.initContainerStatuses.[].state.waiting.reason" in keys("pod-init-container-running")
    assert ".status.initContainerStatuses.[].state.running.startedAt" in keys("pod-init-container-completed")


def test_realkube_gives_kwok_its_node_stages_and_our_scaled_pod_stages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What ``realkube`` writes into the state dir for kwok's ``--config`` at ``RUNBOOK_SIM_TIME_SCALE=0.01``:
    kwok's own Node stages (read from the build, not copied) kept off a node whose container runtime is down,
    our ``node-runtime-down`` stage for that node, and our pod stages in place of kwok's 1-5 s ones."""
    built = tmp_path / "stages.yaml"
    built.write_text(KWOK_STAGES)
    tools = realkube.Tools(*(Path("/nonexistent"),) * 3, built, *(Path("/nonexistent"),) * 2)
    monkeypatch.setenv("RUNBOOK_SIM_TIME_SCALE", "0.01")
    written = realkube.write_stages(tmp_path, tools)
    assert written.parent == tmp_path and written.stat().st_mode & 0o077 == 0
    docs = list(yaml.safe_load_all(written.read_text()))
    node = [d for d in docs if d["spec"]["resourceRef"]["kind"] == "Node"]
    assert [d["metadata"]["name"] for d in node] == ["node-initialize", "node-runtime-down"]
    runtime_down = _runtime_down_expression()
    assert runtime_down in node[0]["spec"]["selector"]["matchExpressions"]
    assert node[1] == kwokstages.runtime_down_stage()
    pods = by_name([d for d in docs if d["spec"]["resourceRef"]["kind"] == "Pod"])
    assert pods == by_name(kwokstages.pod_stages(0.01))
    assert waits_ms(pods["pod-create"]) < (1000, 5000)  # not kwok's


def _runtime_down_expression() -> dict[str, Any]:
    """The selector expression that keeps a kwok Node stage off a node whose runtime the agent marked down."""
    label = f'.metadata.labels["{kwokstages.RUNTIME_LABEL}"]'
    return {"key": label, "operator": "NotIn", "values": [kwokstages.RUNTIME_DOWN]}


def test_no_container_stage_selects_a_pod_the_node_agent_has_not_let_start() -> None:
    """kwok's stages that start containers (init containers, then the pod's: Running and Ready) select only pods
    whose ``PodReadyToStartContainers`` the node agent set True, and none in image-pull back-off; pod-create posts
    it False. Before, kwok started every pod and the agent sent a refused one back a moment later, long enough
    for helm's ``--wait`` to call it deployed (tests/sim/test_no_flash_ready.py watches it on the real plane)."""
    stages = by_name(kwokstages.pod_stages(0.01))
    for name in ("pod-init-container-running", "pod-ready"):
        assert kwokstages.SANDBOX_READY in stages[name]["spec"]["selector"]["matchExpressions"], name
    assert (
        kwokstages.NOT_PULL_BACKOFF
        in stages["pod-init-container-running"]["spec"]["selector"]["matchExpressions"]
    )
    created = stages["pod-create"]["spec"]["next"]["statusTemplate"]
    assert f'- type: {kwokstages.SANDBOX}\n  status: "False"' in created
