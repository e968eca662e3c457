"""Step: config patching — load the NVIDIA modules (and, optionally, make nvidia the default runtime).

Why it is computed per node and grouped: each node gets only what its config lacks (strategic merge
appends lists, so a blind re-apply duplicates modules), but on a healthy fleet most nodes lack the same
thing, so nodes with an identical remaining patch share one ``talosctl patch mc -n a,b,c`` call.  A
second run finds nothing missing and changes nothing, so a re-run after a failed rollout changes only the
nodes it did not reach.  Applying goes in the batches of the ``rollout`` schedule (a canary, then batches
growing to ``rollout_concurrency``, optionally paused, see ``model/rollout.py``) and stops starting batches
once the failure budget is used up (default: the first failure).  Within a batch the nodes are patched
concurrently, in small chunk calls (``Talosctl.patch_machineconfigs``), because talosctl patches the nodes of
one ``-n a,b,c`` call one after the other; the plan reads, plans and dry-runs the same chunks one chunk at a
time, the chunks side by side (``patch_plan``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from runbook_lib.model.machineconfig import contains
from runbook_lib.model.params import Node
from runbook_lib.model.redact import redact
from runbook_lib.model.rollout import Schedule, schedule

from . import drains
from .context import Context
from .events import Events
from .patch_plan import (
    configs_of,
    nvidia_runtime_nodes,
    plan_and_dry_run,
    wanted_documents,
)
from .reboots import NOT_REBOOTED, boot_ids, wait_for_reboots
from .results import Check, NodeResult, StepResult

#: ``wanted_documents`` moved to ``patch_plan`` and is still imported from here (preflight, tests).
__all__ = [
    "Progress",
    "config_patch",
    "log_batch",
    "nodes_with_nvidia_runtime",
    "pause_before",
    "read_configs",
    "rollout_schedule",
    "wanted_documents",
]

Progress = Callable[[int, int], None]


def nodes_with_nvidia_runtime(ctx: Context, nodes: list[Node]) -> set[str]:
    """Addresses of the nodes whose image has the container toolkit, i.e. a containerd ``nvidia`` runtime, which
    the default-runtime patch waits for (why: :func:`patch_plan.nvidia_runtime_nodes`); every node when that
    patch is not asked for.  One ``get extensions`` fan-out; the step's own plan reads them per chunk instead
    (``patch_plan.Planner.read``)."""
    if not ctx.params.default_runtime_patch:
        return {n.address for n in nodes}
    return nvidia_runtime_nodes(ctx.talosctl.get("extensions", [n.address for n in nodes]))


def read_configs(ctx: Context, nodes: list[Node]) -> tuple[dict[str, list[dict[str, Any]]], dict[str, str]]:
    """Current machine config documents per node address, plus per-node read errors (one fan-out call)."""
    return configs_of(ctx.talosctl.get("machineconfig", [n.address for n in nodes]))


def config_patch(
    ctx: Context,
    *,
    only: list[str] | None = None,
    apply: bool | None = None,
    progress: Progress | None = None,
) -> StepResult:
    """Plan (dry-run) or apply the machine-config patch on the GPU nodes; returns per-node results."""
    do_apply = ctx.apply if apply is None else apply
    nodes = ctx.nodes(only)
    result = StepResult(step="config-patch", applied=do_apply)
    plan = plan_and_dry_run(ctx, nodes)
    by_address, groups = plan.results, plan.groups
    result.nodes = [by_address[n.address] for n in nodes]

    deferred = [n.name for n in nodes if by_address[n.address].data.get("default_runtime_deferred")]
    if deferred:
        result.data["default_runtime_deferred"] = deferred
        result.notes.append(
            f"default runtime nvidia deferred on {len(deferred)} node(s): their image has no NVIDIA container "
            "toolkit yet, and containerd refuses a default runtime it has no definition for, or they run a "
            "release before 1.14, which does not know the 1.14 form of the patch; the image step applies it "
            "right after the upgrade"
        )
    result.data["groups"] = []
    for index, ((patch_yaml, members), dry) in enumerate(
        zip(groups.items(), plan.dry_runs.values(), strict=True)
    ):
        # A refused dry run fails its node only: its siblings got their own verdicts (Planner.dry_run).
        result.data["groups"].append(
            {"nodes": [n.name for n in members], "patch": patch_yaml, "dry_run": redact(dry.output.strip())}
        )
        for node in members:
            res = by_address[node.address]
            res.data["group"] = index
            if node.address in plan.refused:
                res.status = "failed"
                res.message = "dry run refused: " + redact(plan.refused[node.address] or dry.failure_text)
            elif "with a reboot" in dry.details_of(node.address):
                res.needs_reboot = True
    todo = [
        (patch, node)
        for patch, members in groups.items()
        for node in members
        if by_address[node.address].status == "planned"
    ]
    batches = rollout_schedule(ctx, result, [node.name for _patch, node in todo])
    rebooting = [node.name for _patch, node in todo if by_address[node.address].needs_reboot]
    if rebooting:
        result.notes.append(drains.plan_note(ctx, rebooting))
    left = _cordons_left(ctx, result, [n.name for n in nodes if n.name not in rebooting], lift=do_apply)
    if not do_apply:
        if left:
            result.notes.append(drains.left_note(left))
        result.notes.append("plan only (apply is off): nothing was changed")
        return result.finish()

    _apply_in_batches(ctx, result, batches, todo, by_address, progress=progress)
    return result.finish()


def _cordons_left(ctx: Context, result: StepResult, names: list[str], *, lift: bool) -> list[str]:
    """The nodes among ``names`` an interrupted run left cordoned (``drains.CORDON_MARK``), lifted once Ready when
    ``lift``. Why here: those nodes are patched already, so no later drain of theirs would lift it, and a cordon
    marked as the runbook's is not an administrator's. Only where the patch reboots nodes (the runbook cordons
    nowhere else in this step)."""
    if not ctx.params.default_runtime_patch:
        return []
    left = drains.cordons_left(ctx, result, names)
    if lift:
        drains.lift_left(ctx, result, left)
    return left


def rollout_schedule(ctx: Context, result: StepResult, names: list[str]) -> Schedule:
    """The ``rollout`` schedule for the nodes to change, in order; the plan shows it (a note, and
    ``data["batches"]``: the node names of each batch) so Approve approves the batches too."""
    rollout = ctx.params.rollout
    plan = schedule(
        len(names),
        concurrency=ctx.params.rollout_concurrency,
        canary=rollout.canary,
        max_failures=rollout.max_failures,
        pause_seconds=rollout.pause_seconds,
    )
    result.data["batches"] = plan.batches(names)
    if names:
        result.notes.append(plan.describe())
    return plan


def pause_before(plan: Schedule, index: int) -> None:
    """The pause between two batches (none before the first)."""
    if index and plan.pause_seconds:
        time.sleep(plan.pause_seconds)


def log_batch(
    log: list[dict[str, Any]],
    index: int,
    plan: Schedule,
    members: list[NodeResult],
    started: float,
    *,
    events: Events | None = None,
) -> None:
    """Append what one batch did to ``log`` (the result's ``data["rollout"]``): its nodes, when it started,
    how long it took and which of its nodes failed.

    Why: the journal holds calls, not batches; a reviewer of a fleet rollout wants to see the canary go
    first, how long each batch took and where the rollout stopped (the record's front page draws these).
    """
    failed = [res.node for res in members if res.status == "failed"]
    log.append(
        {
            "batch": index + 1,
            "of": len(plan.sizes),
            "nodes": [res.node for res in members],
            "started": round(started, 3),
            "duration_s": round(time.time() - started, 3),
            "failed": failed,
            "outcome": "failed" if failed else "ok",
        }
    )
    if events is not None:  # the watcher learns of the batch now, not when the step ends
        events.batch_done(log, plan.total, members)


def _apply_in_batches(
    ctx: Context,
    result: StepResult,
    plan: Schedule,
    todo: list[tuple[str, Node]],
    by_address: dict[str, NodeResult],
    *,
    progress: Progress | None,
) -> None:
    """Apply ``todo`` in the schedule's batches; no new batch once the failure budget is used up."""
    names = {node.address: node.name for _patch, node in todo}
    done = 0
    failed: list[str] = []
    stopped_by: str | None = None
    for index, batch in enumerate(plan.batches(todo)):
        if stopped_by is not None:
            for _patch, node in batch:
                res = by_address[node.address]
                res.status = "skipped"
                res.message = f"not touched: the rollout stopped after {stopped_by} failed"
            continue
        pause_before(plan, index)
        started = time.time()
        going, boots, unread = _boots_before(ctx, batch, by_address)
        failed += unread
        going, drained = _drain_rebooting(ctx, going, by_address)
        failed += list(drained.failed)
        if going:
            failed += _patch_batch(ctx, going, by_address, names)
            failed += _wait_rebooted(ctx, going, by_address, boots)
        failed += _uncordon(ctx, drained.cordoned, by_address, boots)
        batch_results = [by_address[node.address] for _patch, node in batch]
        log_batch(
            result.data.setdefault("rollout", []), index, plan, batch_results, started, events=ctx.events
        )
        if plan.exhausted(len(failed)):
            stopped_by = failed[-1]
        done += len(batch)
        if progress:
            progress(done, len(todo))
    _confirm(ctx, result, by_address)


def _patch_batch(
    ctx: Context, batch: list[tuple[str, Node]], by_address: dict[str, NodeResult], names: dict[str, str]
) -> list[str]:
    """Patch one batch and set each node's result; returns the names of the nodes whose patch failed.

    The whole batch at once: every node of every patch in concurrent chunk calls, so a batch costs about one
    node's round trip instead of one per node (talosctl patches the nodes of a call in a row).
    """
    per_patch: dict[str, list[Node]] = {}
    for patch, node in batch:
        per_patch.setdefault(patch, []).append(node)
    applied = ctx.talosctl.patch_machineconfigs(
        [(patch, [n.address for n in members]) for patch, members in per_patch.items()], dry_run=False
    )
    failed: list[str] = []
    for members, outcome in zip(per_patch.values(), applied, strict=True):
        failures, untouched = outcome.outcomes()
        for node in members:
            res = by_address[node.address]
            if node.address in failures:
                res.status = "failed"
                res.message = f"patch failed: {redact(failures[node.address])}"
                failed.append(node.name)
            elif node.address in untouched:
                # talosctl returns at the first failing node of a call: the rest of that call was never
                # touched (only possible when a chunk holds several nodes, i.e. batches over 32 nodes).
                res.status = "skipped"
                res.message = f"not touched: talosctl stopped at {names[untouched[node.address]]}"
            else:
                res.status = "changed"
                res.needs_reboot = res.needs_reboot or "with a reboot" in outcome.details_of(node.address)
    return failed


def _boots_before(
    ctx: Context, batch: list[tuple[str, Node]], by_address: dict[str, NodeResult]
) -> tuple[list[tuple[str, Node]], dict[str, str | None], list[str]]:
    """(the batch's nodes to patch, their boot IDs, the names of those failed here) before the patch.

    Only the nodes whose dry run said the patch reboots them are read. One whose boot ID cannot be read is
    not patched: its reboot could not be told from its answers before it (``reboots``), and a rollout that
    cannot see a node come back would start the next batch while it is down.
    """
    rebooting = [node.address for _patch, node in batch if by_address[node.address].needs_reboot]
    if not rebooting:
        return batch, {}, []
    ids, errors = boot_ids(ctx, rebooting)
    for _patch, node in batch:
        if node.address in errors:
            res = by_address[node.address]
            res.status = "failed"
            res.message = (
                f"not patched: its boot ID could not be read ({redact(errors[node.address])}); the patch "
                "reboots the node, and the rollout must see it come back before the next batch"
            )
    going = [(patch, node) for patch, node in batch if node.address not in errors]
    return going, ids, [node.name for _patch, node in batch if node.address in errors]


def _drain_rebooting(
    ctx: Context, batch: list[tuple[str, Node]], by_address: dict[str, NodeResult]
) -> tuple[list[tuple[str, Node]], drains.Drained]:
    """(the batch's nodes to patch, what the drain did): the nodes whose dry run said the patch reboots them are
    drained first (``drains``); one whose drain fails is not patched and fails, with kubectl's error."""
    rebooting = [node.name for _patch, node in batch if by_address[node.address].needs_reboot]
    drained = drains.drain(ctx, rebooting)
    for _patch, node in batch:
        if node.name in drained.failed:
            res = by_address[node.address]
            res.status = "failed"
            res.message = (
                f"not patched: the patch reboots it, and its drain failed: {drained.failed[node.name]}"
            )
    return [(p, n) for p, n in batch if n.name not in drained.failed], drained


def _uncordon(
    ctx: Context, cordoned: list[str], by_address: dict[str, NodeResult], boots: dict[str, str | None]
) -> list[str]:
    """Lift the cordons of the batch's drained nodes (``drains.lift``); returns the names of nodes this fails.
    ``boots``: boot IDs before the patch, by address; a node ``_wait_rebooted`` did not see back keeps its
    cordon (``data["not_back"]``)."""
    named = {res.node: (address, res) for address, res in by_address.items() if res.node in cordoned}
    down = {n for n, (_a, res) in named.items() if res.data.get("not_back")}
    rebooted = {n: boots.get(a) for n, (a, res) in named.items() if res.status == "changed"}
    timeout = float(ctx.params.timeouts.node_ready_seconds)
    failed: list[str] = []
    for name, why in drains.lift(ctx, cordoned, rebooted=rebooted, down=down, timeout=timeout).items():
        res = named[name][1]
        res.message += drains.stays_cordoned(name, why)
        if res.status == "changed":
            res.status = "failed"
            failed.append(name)
    return failed


def _wait_rebooted(
    ctx: Context,
    batch: list[tuple[str, Node]],
    by_address: dict[str, NodeResult],
    boots: dict[str, str | None],
) -> list[str]:
    """Wait for the batch's nodes that reboot for their patch; returns those not seen back in a new boot.

    auto mode reboots for a machine.files change (Talos <= 1.13): the next batch starts only once these nodes
    answer again from a new boot, so rollout_concurrency also bounds how many GPU nodes are down. A node whose
    reboot the dry run did not foretell (its config changed in between) has no boot ID from before: it is only
    waited for to answer.
    """
    rebooting = {
        n.address: boots.get(n.address)
        for _p, n in batch
        if by_address[n.address].status == "changed" and by_address[n.address].needs_reboot
    }
    failed: list[str] = []
    if not rebooting:
        return failed
    timeout = float(ctx.params.timeouts.node_ready_seconds)
    for address, why in wait_for_reboots(ctx, rebooting, timeout).items():
        res = by_address[address]
        res.status = "failed"
        res.message = f"patched, but {why}"
        res.data["not_back"] = why != NOT_REBOOTED  # one that never went down is not down
        failed.append(res.node)
    return failed


def _confirm(ctx: Context, result: StepResult, by_address: dict[str, NodeResult]) -> None:
    """Re-read the changed nodes' configs: the change counts only once the node reports it."""
    changed = [
        n for n in ctx.params.nodes if n.address in by_address and by_address[n.address].status == "changed"
    ]
    if not changed:
        return
    configs, errors = read_configs(ctx, changed)
    for node in changed:
        res = by_address[node.address]
        wanted = wanted_documents(ctx, node, default_runtime=not res.data.get("default_runtime_deferred"))
        ok = node.address in configs and contains(configs[node.address], wanted)
        message = (
            "the node's config now contains the patch"
            if ok
            else (
                f"patch applied but the node's config does not show it ({errors.get(node.address, 'missing entries')})"
            )
        )
        res.checks.append(Check("config contains patch", ok, message))
        if not ok:
            res.status = "failed"
            res.message = message
