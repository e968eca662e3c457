"""Draining the GPU nodes a patch reboots, before the patch, and uncordoning them once Ready after it.

Why: Talos applies a machine-config change that needs a reboot by running its Reboot sequence, which stops every
pod on the node without evicting it (talos@v1.12.0 internal/app/machined/pkg/runtime/v1alpha1/
v1alpha1_sequencer.go:236-253: ``StopAllPods``, where the Upgrade sequence first runs ``CordonAndDrainNode``,
:423-433). So PodDisruptionBudgets were never asked, and the scheduler kept placing pods on a node going down.
talosctl drains only for ``upgrade`` (1.13+, by default) and ``reboot --drain`` (talos@v1.13.0
cmd/talosctl/cmd/talos/reboot.go:142), never for ``patch``. The runbook drains as talosctl does: ``kubectl drain``
with the options of Talos's own drain (``clients/kubectl.py``), then, after the reboot, waits for the Node to be
Ready and uncordons it (talos@v1.13.0 cmd/talosctl/cmd/talos/drain.go:145-149).

A node an administrator had cordoned before stays cordoned: the runbook uncordons only what it cordoned.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from runbook_lib.clients.fanout import concurrently
from runbook_lib.clients.kubectl import DRAIN_FLAGS, SLACK_S
from runbook_lib.clients.proc import CommandResult
from runbook_lib.errors import RunbookError
from runbook_lib.model.redact import redact

from . import kube_diagnosis
from .context import Context
from .results import StepResult

#: How many ``kubectl drain`` processes run at once: each is a Go process of some tens of MB that mostly waits (for
#: evictions, for pods to go), so a batch of 250 rebooting nodes must not start 250 of them; talosctl drains every
#: node of a call at once (drain.go:29). 16 is our choice, not from a source.
DRAINS_AT_ONCE = 16
#: The annotation the runbook sets on a Node it cordons, as Talos marks the nodes it cordons itself
#: (``talos.dev/cordoned: "true"``: talos@v1.13.0 pkg/machinery/constants/constants.go:926-930,
#: internal/app/machined/pkg/controllers/k8s/node_apply.go:466-488). Why: a cordon a run could not lift (it was
#: interrupted between the drain and the uncordon) would otherwise pass for an administrator's on every later run.
CORDON_MARK = "talos-gpu-runbooks/cordoned"
#: How often a drained node's Ready condition is read after its reboot (talosctl polls every 5 s,
#: talos@v1.13.0 cmd/talosctl/pkg/talos/nodedrain/nodedrain.go:33).
READY_POLL_S = 2.0


@dataclass
class Drained:
    """What :func:`drain` did to a batch's rebooting nodes (Kubernetes node names)."""

    cordoned: list[str] = field(default_factory=list)
    """Drained, and cordoned by the runbook: to uncordon once the node is back."""
    failed: dict[str, str] = field(default_factory=dict)
    """Node -> why its drain failed; such a node must not be patched."""


def plan_note(ctx: Context, names: list[str]) -> str:
    """What the plan says about the drains, so Approve approves them with the patch."""
    flags = " ".join(DRAIN_FLAGS)
    return (
        f"{len(names)} node(s) reboot for their patch: each is drained first (kubectl drain {flags} "
        f"--timeout={ctx.params.timeouts.drain_seconds}s: evictions wait for PodDisruptionBudgets, DaemonSet and "
        "static pods stay) and uncordoned once its Node is Ready again; a node whose drain fails is not patched"
    )


def drain(ctx: Context, names: list[str]) -> Drained:
    """Drain ``names`` side by side, each within ``timeouts.drain_seconds``; a failed drain is undone (its
    cordon lifted, unless it was there before) and the node named with kubectl's own error."""
    outcome = Drained()
    if not names:
        return outcome
    timeout = float(ctx.params.timeouts.drain_seconds)
    drained = concurrently(lambda n: _drain_one(ctx, n, timeout), names, DRAINS_AT_ONCE)
    for name, cordoned, why in drained:
        if why is not None:
            outcome.failed[name] = why
        elif cordoned:
            outcome.cordoned.append(name)
    return outcome


def _drain_one(ctx: Context, name: str, timeout: float) -> tuple[str, bool, str | None]:
    """(name, whether the runbook cordoned it, why the drain failed or None)."""
    try:
        node = ctx.kube.node(name)
    except RunbookError as exc:  # the API unreachable: nothing was touched
        return name, False, _because(exc)
    if node is None:
        # Skipping it would reboot, undrained, a node whose Kubernetes name differs from the parameters'
        # (talosctl asks the node for it: talos@v1.13.0 nodedrain.go:47-63); the other steps use the name too.
        return name, False, _NO_NODE.format(name=name)
    was_cordoned = administrators(node)
    schedulable = not (node.get("spec") or {}).get("unschedulable")
    try:
        if not was_cordoned:  # marked before kubectl cordons it: an interruption from here on leaves the mark
            ctx.kube.annotate_node(name, {CORDON_MARK: "true"})
        run = ctx.kubectl.drain(name, timeout_s=timeout)
    except RunbookError as exc:  # kubectl missing, the API unreachable: the runner raised before any cordon
        if schedulable:  # a mark on a schedulable node would claim the next cordon, maybe an administrator's
            _unmark(ctx, name)
        return name, False, _because(exc)
    if run.ok:
        return name, not was_cordoned, None
    why = f"kubectl drain failed: {_drain_error(run)}"
    if not was_cordoned:
        left = uncordon(ctx, [name])
        if left:
            why += f"; it stays cordoned ({left[name]})"
    return name, False, why


_NO_NODE = (
    "there is no Kubernetes Node named {name} to drain (nodes[].name must be the node's name in Kubernetes: "
    "kubectl get nodes -o wide)"
)


def _because(exc: RunbookError) -> str:
    return exc.message + (f" ({exc.hint})" if exc.hint else "")


def _unmark(ctx: Context, name: str) -> None:
    """Take :data:`CORDON_MARK` off, best effort: the API that just failed may refuse this too, and then the mark
    stays (harmless while the Node is schedulable, but a later administrator's cordon would pass for the
    runbook's)."""
    with contextlib.suppress(RunbookError):
        ctx.kube.annotate_node(name, {CORDON_MARK: None})


def _drain_error(run: CommandResult) -> str:
    """Why ``kubectl drain`` failed, in its words: its verdict (the last ``error`` line: on a timeout
    ``error when evicting pods/"<pod>" -n "<ns>": global timeout reached: 5m0s``), and the last refusal it retried,
    which says why (a PodDisruptionBudget's 429, printed "(will retry after 5s): <the API server's message>":
    k8s.io/kubectl@v0.35.0 pkg/drain/drain.go:300-314)."""
    if run.exit_code == 124:  # the runner stopped it (proc.Runner): kubectl did not end at its own --timeout
        return f"it did not end within its --timeout + {SLACK_S:.0f} s and was stopped"
    verdict = _last_error(run.stderr)
    retried = [line for line in run.stderr.splitlines() if "(will retry after" in line]
    cause = retried[-1].split("): ", 1)[-1].strip() if retried else ""
    return verdict if not cause or cause in verdict else f"{verdict} (the last refusal: {redact(cause)})"


def _last_error(stderr: str) -> str:
    """kubectl's last ``error…`` line (its verdict; the lines before it retell each retried eviction)."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.lower().startswith("error")]
    return redact((errors or lines or ["no output"])[-1])


def uncordon_when_ready(
    ctx: Context, names: list[str], timeout: float, before: Mapping[str, str | None] | None = None
) -> dict[str, str]:
    """Wait until each Node's kubelet is back (:func:`_back`), then uncordon it; returns node -> why it stays
    cordoned. ``before``: each node's boot ID before its reboot."""
    left: dict[str, str] = {}
    pending = list(names)
    deadline = time.monotonic() + timeout
    while pending:
        ready = [n for n in pending if _back(ctx, n, (before or {}).get(n))]
        left |= uncordon(ctx, ready)
        pending = [n for n in pending if n not in ready]
        if not pending or time.monotonic() >= deadline:
            break
        time.sleep(READY_POLL_S)
    for name in pending:
        left[name] = (
            f"its Node was not Ready from its new boot within {timeout:.0f} s of its reboot"
            if before
            else f"its Node was not Ready within {timeout:.0f} s"
        )
    return left


def _back(ctx: Context, name: str, boot_before: str | None) -> bool:
    """The Node is Ready, as posted by the kubelet of the node's new boot.

    Why the boot ID: Talos's API answers from the new boot before the kubelet starts, and the Node keeps the old
    kubelet's Ready until the node lifecycle controller's grace period passes (kubernetes@v1.35.0
    pkg/controller/nodelifecycle/config/v1alpha1/defaults.go:40-46), so Ready alone could uncordon a node whose
    kubelet is not back. The kubelet posts the kernel's boot ID, the file the runbook read before the reboot
    (``reboots.BOOT_ID_PATH``), as ``status.nodeInfo.bootID`` (pkg/kubelet/nodestatus/setters.go:243-254). An API
    error is "not yet", as in talosctl's wait (talos@v1.13.0 nodedrain.go:157-160)."""
    try:
        node = ctx.kube.node(name)
    except RunbookError:
        return False
    if node is None or (kube_diagnosis.condition(node, "Ready") or {}).get("status") != "True":
        return False
    posted = ((node.get("status") or {}).get("nodeInfo") or {}).get("bootID")
    return not (boot_before and posted == boot_before)


def uncordon(ctx: Context, names: list[str]) -> dict[str, str]:
    """Uncordon ``names`` now and take the runbook's mark off; returns node -> why it stays cordoned."""
    left: dict[str, str] = {}
    for name in names:
        run = ctx.kubectl.uncordon(name)
        if not run.ok:
            left[name] = f"kubectl uncordon failed: {_last_error(run.stderr)}"
            continue
        try:
            ctx.kube.annotate_node(name, {CORDON_MARK: None})
        except RunbookError as exc:  # uncordoned all the same; the mark alone does no harm
            left[name] = f"uncordoned, but its {CORDON_MARK} annotation stays: {exc.message}"
    return left


def uncordon_command(name: str, *, marked: bool) -> str:
    """The command that lifts a cordon by hand; with the runbook's mark, the mark goes too. Why: a plain
    ``kubectl uncordon`` left the mark, so an administrator's later cordon of that node passed for the
    runbook's, and a rollback lifted it (operator walkthrough, 6 Dec 2026)."""
    if not marked:
        return f"kubectl uncordon {name}"
    return f"kubectl uncordon {name} && kubectl annotate node {name} {CORDON_MARK}-"


def unmarked_note(names: list[str]) -> str:
    """The note for GPU nodes cordoned without the runbook's mark: not a failure (a cordon can be on purpose), but
    no new pod, the CUDA test's included, is scheduled there. Not said to be an administrator's: talosctl 1.13+'s
    own drain in an interrupted upgrade leaves one without the mark too (steps/cordoned.py)."""
    return (
        f"cordoned without the runbook's mark (an administrator's, or one an interrupted talosctl upgrade "
        f"left): {', '.join(names)}: no new pod, the CUDA test's included, is scheduled there until someone "
        "uncordons them (kubectl uncordon <node>, if it is not meant)"
    )


def cordon_of(node: dict[str, Any]) -> bool | None:
    """None when the Node is not cordoned; else whether the cordon carries the runbook's :data:`CORDON_MARK`."""
    if not (node.get("spec") or {}).get("unschedulable"):
        return None
    return (node["metadata"].get("annotations") or {}).get(CORDON_MARK) == "true"


def administrators(node: dict[str, Any]) -> bool:
    """The Node is cordoned, and not by the runbook (no :data:`CORDON_MARK`): the runbook leaves that cordon."""
    return cordon_of(node) is False


def left_by_a_run(ctx: Context, names: list[str]) -> list[str]:
    """The nodes among ``names`` still cordoned by a run that could not lift its cordon (:data:`CORDON_MARK`)."""
    nodes = ctx.kube.each(ctx.kube.node, names)
    return [n for n, obj in zip(names, nodes, strict=True) if obj is not None and cordon_of(obj)]


def cordons_left(ctx: Context, result: StepResult, names: list[str]) -> list[str]:
    """:func:`left_by_a_run`, for a step's plan: an API error is a note, not the step's failure (the cordon is
    a leftover to tidy, not a reason to stop)."""
    if not names:
        return []
    try:
        return left_by_a_run(ctx, names)
    except RunbookError as exc:
        result.notes.append(f"could not look for cordons a run left: {exc.message}")
        return []


#: How long a step waits for a node it found cordoned by an interrupted run to be Ready before it lifts that
#: cordon: such a node is not rebooting for this step, though it may still be coming back from the run that left
#: it; one not Ready after this is down (often why a rollback runs), and ``node_ready_seconds`` (300 s by
#: default) would hold the step for nothing. Our choice, not from a source.
LEFT_READY_S = 60.0


def lift_left(
    ctx: Context, result: StepResult, left: list[str], *, wait_s: float = LEFT_READY_S
) -> list[str]:
    """Lift the cordons :func:`cordons_left` found on the nodes whose Node is Ready within ``wait_s`` (at most
    ``node_ready_seconds``); notes say which were lifted and why any stays; returns the nodes lifted. An error
    (kubectl missing, the API gone) is a note: the step's own result must survive it."""
    if not left:
        return []
    try:
        wait = min(wait_s, float(ctx.params.timeouts.node_ready_seconds))
        kept = uncordon_when_ready(ctx, left, wait)
    except RunbookError as exc:
        result.notes.append(f"the cordon a run left on {', '.join(left)} stays: {exc.message}")
        return []
    lifted = [n for n in left if n not in kept]
    if lifted:
        result.notes.append(f"lifted the cordon a run could not lift on {', '.join(lifted)}")
    result.notes += [
        f"{n}: the cordon a run left stays ({why}): kubectl uncordon {n} once it is back and Ready, or run this "
        "step again"
        for n, why in kept.items()
    ]
    return lifted


def left_note(left: list[str]) -> str:
    """What a plan says of the cordons a run left."""
    return (
        f"{', '.join(left)} still {'carries' if len(left) == 1 else 'carry'} the cordon a run could not lift "
        f"(annotation {CORDON_MARK}): apply lifts it once each Node is Ready"
    )


def lift(
    ctx: Context,
    cordoned: list[str],
    *,
    rebooted: Mapping[str, str | None],
    down: set[str],
    timeout: float,
) -> dict[str, str]:
    """Lift the cordons :func:`drain` set: on nodes back from their reboot once Ready, at once on nodes the
    change did not reach (no reboot came); nodes that did not come back keep theirs (pods scheduled there would
    wait). ``rebooted``: node -> its boot ID before the reboot. Returns node -> why it stays cordoned, for its
    message (:func:`stays_cordoned`)."""
    back = [n for n in cordoned if n in rebooted]
    now = [n for n in cordoned if n not in rebooted and n not in down]
    left = uncordon_when_ready(ctx, back, timeout, rebooted) | uncordon(ctx, now)
    return left | {n: "it was not seen back from a new boot" for n in cordoned if n in down}


def stays_cordoned(name: str, why: str) -> str:
    return f"; it stays cordoned ({why}): kubectl uncordon {name} once it is back and Ready"
