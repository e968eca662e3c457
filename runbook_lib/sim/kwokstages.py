"""Our kwok pod Stages: how long a simulated kubelet takes to start, run and stop a pod, on the simulator's clock.

kwok plays nothing without Stage objects. The stages kwok ships for pods (``kustomize/stage/pod/general``)
each wait a random 1-5 s (``durationMilliseconds: 1000``, ``jitterDurationMilliseconds: 5000``), whatever
``RUNBOOK_SIM_TIME_SCALE`` says, so a suite that runs Talos at 0.01 still waited seconds per pod stage. The
stages here are written by us in kwok's Stage API (sigs.k8s.io/kwok@v0.8.0 ``pkg/apis/v1alpha1/stage_types.go``:
``StageSpec`` selector/delay/next, ``StageDelay``'s ``durationMilliseconds``/``jitterDurationMilliseconds``
giving a delay uniform between the two (``pkg/utils/lifecycle/lifecycle.go`` ``Delay``), ``durationFrom``/``jitterDurationFrom`` read from the pod; template
functions ``Now``, ``Quote`` and sprig's ``list`` from ``pkg/utils/gotpl/funcs.go``, ``NodeIPWith`` and
``PodIPWith`` from ``pkg/kwok/controllers/pod_controller.go``). They move a
pod through the same states and select on the same fields as kwok's general pod stages, because the node agent
(``nodeagent``) and the simulated GPU Operator (``gpuoperator``: it holds init containers by the fields the
init-container stages select on) rely on them; only the delays differ: our defaults times the time factor.

Kept from kwok: per-pod overrides in the annotations ``<stage>.stage.kwok.x-k8s.io/delay`` and ``jitter-delay``
(durations such as ``15s``, not scaled: a test that sets one means that wall time), and a deletion that waits
for the pod's grace period at most (``jitterDurationFrom: .metadata.deletionTimestamp``), so a deleted pod shows
Terminating before it goes.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from runbook_lib.sim.containers import RUNTIME_DOWN_MESSAGE, RUNTIME_DOWN_REASON

API_VERSION = "kwok.x-k8s.io/v1alpha1"
ANNOTATION = "{stage}.stage.kwok.x-k8s.io/{what}"


@dataclass(frozen=True)
class Delay:
    """A stage's wait at time factor 1: uniform between ``seconds`` and ``up_to`` (kwok's jitter)."""

    seconds: float
    up_to: float


#: Our assumptions, not measured and not from a source we found: what a kubelet on a GPU node takes, image
#: already in the registry's region. Sandbox and network set up in about a second; an image pull a few seconds
#: (the CUDA sample and nvidia-smi images are a few hundred MB; a cached image takes well under a second);
#: ``nvidia-smi`` or an init container runs about a second; a container that handles SIGTERM stops in about one.
DELAYS: dict[str, Delay] = {
    "pod-create": Delay(0.5, 1.5),  # sandbox and pod network: ContainerCreating
    "pod-init-container-running": Delay(2.0, 6.0),  # the init container's image pull and start
    "pod-init-container-completed": Delay(0.5, 1.5),  # the init container runs to its end
    "pod-ready": Delay(2.0, 6.0),  # the containers' image pull and start: Running
    "pod-complete": Delay(0.5, 1.5),  # a Job's container runs to its end (a bare pod: nodeagent)
    "pod-delete": Delay(1.0, 1.0),  # SIGTERM to gone; at most the grace period (deletionTimestamp)
}


#: A Go duration as kwok parses its delay annotations (``time.ParseDuration``: ``4s``, ``500ms``, ``1m30s``).
_GO_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def go_duration(text: str) -> float | None:
    """Seconds of a Go duration (``4s``, ``1m30s``), None for anything else."""
    text = text.strip()
    parts = _GO_DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    return sum(float(n) * _UNIT_SECONDS[u] for n, u in parts)


def run_seconds(pod: dict[str, Any], factor: float, rng: random.Random | None = None) -> float:
    """How long a bare pod's containers run before they end (the node agent ends it: kwok's pod-complete stage
    takes only a Job's pods): the pod's ``pod-complete.stage.kwok.x-k8s.io/delay`` annotation as wall time, as
    kwok reads it for a Job's pod, else the pod-complete stage's delay at ``factor``, uniform as kwok's jitter."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    given = go_duration(str(annotations.get(ANNOTATION.format(stage="pod-complete", what="delay"), "")))
    if given is not None:
        return given
    delay = DELAYS["pod-complete"]
    return (rng or random).uniform(delay.seconds, delay.up_to) * factor


def _ms(seconds: float, factor: float) -> int:
    return max(round(seconds * factor * 1000), 1)


def _from(stage: str, what: str) -> dict[str, str]:
    return {"expressionFrom": f'.metadata.annotations["{ANNOTATION.format(stage=stage, what=what)}"]'}


def _delay(stage: str, factor: float) -> dict[str, Any]:
    delay = DELAYS[stage]
    spec: dict[str, Any] = {
        "durationMilliseconds": _ms(delay.seconds, factor),
        "durationFrom": _from(stage, "delay"),
    }
    if stage == "pod-delete":  # kwok's: any time until the grace period ends
        spec["jitterDurationFrom"] = {"expressionFrom": ".metadata.deletionTimestamp"}
    else:
        spec["jitterDurationMilliseconds"] = _ms(delay.up_to, factor)
        spec["jitterDurationFrom"] = _from(stage, "jitter-delay")
    return spec


def _expr(key: str, operator: str, *values: str) -> dict[str, Any]:
    return {"key": key, "operator": operator, **({"values": list(values)} if values else {})}


ALIVE = _expr(".metadata.deletionTimestamp", "DoesNotExist")
PENDING = _expr(".status.phase", "In", "Pending")
INITIALIZED = '.status.conditions.[] | select( .type == "Initialized" ) | .status'
READY = '.status.conditions.[] | select( .type == "Ready" ) | .status'
#: The kubelet's condition for "sandbox created, network configured" (kubernetes@v1.35.0
#: pkg/kubelet/status/generate.go ``GeneratePodReadyToStartContainersCondition``; beta and on by default since
#: 1.29). Our pod-create stage posts it False; only the node agent sets it True, once the node's containerd has
#: the pod's runtime handler, its images pull and its plugin would not crash (``nodeagent.NodeAgent._start``).
#: No container stage selects a pod before, so a pod the node refuses is never Running nor Ready, not even
#: for a moment (helm's ``--wait`` watcher reported a DaemonSet of such pods deployed in that moment).
SANDBOX = "PodReadyToStartContainers"
SANDBOX_READY = _expr(f'.status.conditions.[] | select( .type == "{SANDBOX}" ) | .status', "In", "True")
#: The Initialized reason the node agent posts on a pod whose image pull fails: keeps kwok's init-container
#: and pod-ready stages off it until the pull works (``nodeagent.NodeAgent._retry_pulls``).
PULL_BACKOFF = "ImagePullBackOff"
NOT_PULL_BACKOFF = _expr(
    '.status.conditions.[] | select( .type == "Initialized" ) | .reason', "NotIn", PULL_BACKOFF
)

_CREATE = """\
{{ $now := Now | Quote }}
phase: Pending
hostIP: {{ NodeIPWith .spec.nodeName | Quote }}
podIP: {{ PodIPWith .spec.nodeName ( or .spec.hostNetwork false ) ( or .metadata.uid "" ) \
( or .metadata.name "" ) ( or .metadata.namespace "" ) | Quote }}
conditions:
- type: Initialized
  lastTransitionTime: {{ $now }}
{{ if .spec.initContainers }}  status: "False"
  reason: ContainersNotInitialized
{{ else }}  status: "True"
{{ end }}- type: PodReadyToStartContainers
  status: "False"
  lastTransitionTime: {{ $now }}
{{ range list "Ready" "ContainersReady" }}- type: {{ . }}
  status: "False"
  reason: ContainersNotReady
  lastTransitionTime: {{ $now }}
{{ end }}{{ range .spec.readinessGates }}- type: {{ .conditionType | Quote }}
  status: "True"
  lastTransitionTime: {{ $now }}
{{ end }}{{ if .spec.initContainers }}initContainerStatuses:
{{ range .spec.initContainers }}- {name: {{ .name | Quote }}, image: {{ .image | Quote }}, ready: false, \
restartCount: 0, started: false, state: {waiting: {reason: PodInitializing}}}
{{ end }}{{ end }}containerStatuses:
{{ $waiting := "ContainerCreating" }}{{ if .spec.initContainers }}{{ $waiting = "PodInitializing" }}{{ end }}\
{{ range .spec.containers }}- {name: {{ .name | Quote }}, image: {{ .image | Quote }}, ready: false, \
restartCount: 0, started: false, state: {waiting: {reason: {{ $waiting }}}}}
{{ end }}"""

_INIT_RUNNING = """\
initContainerStatuses:
{{ $now := Now | Quote }}{{ range .spec.initContainers }}- {name: {{ .name | Quote }}, \
image: {{ .image | Quote }}, ready: true, restartCount: 0, started: true, state: {running: {startedAt: {{ $now }}}}}
{{ end }}"""

_INIT_DONE = """\
{{ $now := Now | Quote }}
conditions:
- {type: Initialized, status: "True", reason: "", lastTransitionTime: {{ $now }}}
initContainerStatuses:
{{ range .spec.initContainers }}- {name: {{ .name | Quote }}, image: {{ .image | Quote }}, ready: true, \
restartCount: 0, started: false, state: {terminated: {exitCode: 0, reason: Completed, startedAt: {{ $now }}, \
finishedAt: {{ $now }}}}}
{{ end }}containerStatuses:
{{ range .spec.containers }}- {name: {{ .name | Quote }}, image: {{ .image | Quote }}, ready: false, \
restartCount: 0, started: false, state: {waiting: {reason: ContainerCreating}}}
{{ end }}"""

_READY = """\
{{ $now := Now | Quote }}
phase: Running
startTime: {{ $now }}
conditions:
{{ range list "Ready" "ContainersReady" }}- {type: {{ . }}, status: "True", reason: "", message: "", \
lastTransitionTime: {{ $now }}}
{{ end }}containerStatuses:
{{ range .spec.containers }}- {name: {{ .name | Quote }}, image: {{ .image | Quote }}, ready: true, \
restartCount: 0, started: true, state: {running: {startedAt: {{ $now }}}}}
{{ end }}"""

_COMPLETE = """\
{{ $now := Now | Quote }}
phase: Succeeded
containerStatuses:
{{ range .spec.containers }}- {name: {{ .name | Quote }}, image: {{ .image | Quote }}, ready: true, \
restartCount: 0, started: false, state: {terminated: {exitCode: 0, reason: Completed, startedAt: {{ $now }}, \
finishedAt: {{ $now }}}}}
{{ end }}"""

#: Each stage: the pods it selects (the same fields kwok's general stages select on) and what it makes of them.
_STAGES: dict[str, tuple[list[dict[str, Any]], dict[str, Any]]] = {
    "pod-create": (
        [ALIVE, _expr(".status.podIP", "DoesNotExist")],
        {
            "event": {"type": "Normal", "reason": "Created", "message": "Created container"},
            "statusTemplate": _CREATE,
        },
    ),
    "pod-init-container-running": (
        [
            ALIVE,
            PENDING,
            SANDBOX_READY,
            NOT_PULL_BACKOFF,
            _expr(INITIALIZED, "NotIn", "True"),
            _expr(".status.initContainerStatuses.[].state.waiting.reason", "Exists"),
        ],
        {"statusTemplate": _INIT_RUNNING},
    ),
    "pod-init-container-completed": (
        [ALIVE, PENDING, _expr(".status.initContainerStatuses.[].state.running.startedAt", "Exists")],
        {"statusTemplate": _INIT_DONE},
    ),
    "pod-ready": (
        [
            ALIVE,
            PENDING,
            SANDBOX_READY,
            _expr(INITIALIZED, "In", "True"),
            _expr(".status.containerStatuses.[].state.running.startedAt", "DoesNotExist"),
        ],
        {"statusTemplate": _READY},
    ),
    "pod-complete": (
        [
            ALIVE,
            _expr(".status.phase", "In", "Running"),
            _expr(READY, "In", "True"),
            _expr(".metadata.ownerReferences.[].kind", "In", "Job"),
        ],
        {"statusTemplate": _COMPLETE},
    ),
    "pod-delete": (
        [_expr(".metadata.deletionTimestamp", "Exists"), _expr(".metadata.finalizers", "DoesNotExist")],
        {"delete": True},
    ),
}


def pod_stages(factor: float) -> list[dict[str, Any]]:
    """The pod Stage objects with our delays times ``factor`` (``realtalos.time_factor()``)."""
    if not 0 < factor <= 1:
        raise ValueError(f"time factor {factor!r}: must be in (0, 1] (RUNBOOK_SIM_TIME_SCALE)")
    return [
        {
            "apiVersion": API_VERSION,
            "kind": "Stage",
            "metadata": {"name": name},
            "spec": {
                "resourceRef": {"apiGroup": "v1", "kind": "Pod"},
                "selector": {"matchExpressions": selector},
                "delay": _delay(name, factor),
                "next": next_,
            },
        }
        for name, (selector, next_) in _STAGES.items()
    ]


def node_stages(kwok_stages: Path) -> list[dict[str, Any]]:
    """The Node stages of the stages file ``tools/build-kwok.sh`` assembles from kwok's own module (node
    initialisation, lease heartbeats): kwok's, read where the build left them, not copied here."""
    docs = [d for d in yaml.safe_load_all(kwok_stages.read_text()) if isinstance(d, dict)]
    return [d for d in docs if d.get("kind") == "Stage" and d["spec"]["resourceRef"].get("kind") == "Node"]


#: Not on a real node: the label the node agent sets while a node's containerd CRI does not load
#: (``nodeagent.NodeAgent._follow_runtimes``), which the ``node-runtime-down`` stage selects.
RUNTIME_LABEL = "sim.talos-gpu-runbooks.local/container-runtime"
RUNTIME_DOWN = "down"
_RUNTIME = f'.metadata.labels["{RUNTIME_LABEL}"]'


def runtime_down_stage() -> dict[str, Any]:
    """Ready=False with the kubelet's reason and message while the node's container runtime is down
    (``containers.RUNTIME_DOWN_MESSAGE``); only the Ready condition is patched (kwok's strategic merge keeps the
    others). kwok's lease heartbeats go on, as a real kubelet's do while its runtime is down."""
    template = f"""\
{{{{ $now := Now | Quote }}}}
conditions:
- type: Ready
  status: "False"
  reason: {RUNTIME_DOWN_REASON}
  message: "{RUNTIME_DOWN_MESSAGE}"
  lastHeartbeatTime: {{{{ $now }}}}
  lastTransitionTime: {{{{ $now }}}}
"""
    ready_reason = '.status.conditions.[] | select( .type == "Ready" ) | .reason'
    selector = [_expr(_RUNTIME, "In", RUNTIME_DOWN), _expr(ready_reason, "NotIn", RUNTIME_DOWN_REASON)]
    return {
        "apiVersion": API_VERSION,
        "kind": "Stage",
        "metadata": {"name": "node-runtime-down"},
        "spec": {
            "resourceRef": {"apiGroup": "v1", "kind": "Node"},
            "selector": {"matchExpressions": selector},
            "next": {"statusTemplate": template},
        },
    }


def _not_while_runtime_down(stage: dict[str, Any]) -> dict[str, Any]:
    """kwok's Node stages never select a node whose runtime is down: ``node-initialize`` (every Node not Ready
    made Ready) would undo ``node-runtime-down`` at once, and kwok plays one stage of those that match, picked
    at random when none has a weight (sigs.k8s.io/kwok@v0.8.0 ``pkg/utils/lifecycle/lifecycle.go`` ``Match``),
    so ``node-heartbeat-with-lease`` (600 s delay) could be picked instead of it. Once the agent takes the
    label off, ``node-initialize`` makes the node Ready again, as the kubelet's next status sync does."""
    selector = stage["spec"].setdefault("selector", {}).setdefault("matchExpressions", [])
    selector.append(_expr(_RUNTIME, "NotIn", RUNTIME_DOWN))
    return stage


def write(path: Path, kwok_stages: Path, factor: float) -> Path:
    """``path``: kwok's Node stages and our pod stages at ``factor``, the file kwok's ``--config`` reads."""
    nodes = [_not_while_runtime_down(stage) for stage in node_stages(kwok_stages)]
    docs = [*nodes, runtime_down_stage(), *pod_stages(factor)]
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    path.chmod(0o600)
    return path
