"""Step: image upgrade — boot each GPU node into the factory installer of its GPU schematic.

Why this step is so defensive: ``talosctl upgrade`` without ``--image`` installs the vanilla image and
silently drops the NVIDIA extensions (facts §2.1), a kernel-module extension built for another Talos release
does not load, and mismatched kmod/toolkit drivers break every GPU pod (facts §5).  So, before anything
changes, the wanted extensions are resolved against the factory for the target release and the schematic is
registered (its ID must equal the offline one).  Then nodes go one batch at a time (the ``rollout``
schedule: an optional canary, then batches growing to ``rollout_concurrency``, default 1, optionally
paused; see ``model/rollout.py``); after each batch the step waits for the nodes to answer again and checks that their
``schematic`` pseudo-extension reports the planned ID, their Talos version is the target and the NVIDIA
extensions are present.  Once the failure budget is used up (default: at the first failure) no new batch
starts: the result says which nodes are done, which failed and why, and which were not touched.  Nodes
already on the planned schematic and version are skipped, so a re-run resumes with the nodes left.
With ``apply: false`` nothing changes and the result carries the exact commands.
"""

from __future__ import annotations

import shlex
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from runbook_lib.clients.factory import FactoryClient
from runbook_lib.clients.fanout import Pool
from runbook_lib.clients.proc import CommandResult
from runbook_lib.clients.talosctl import upgrade_args
from runbook_lib.errors import PermanentError, RunbookError
from runbook_lib.model.boot_assets import boot_asset_urls, installer_image
from runbook_lib.model.machineconfig import contains
from runbook_lib.model.params import Node
from runbook_lib.model.parsers import TalosResource
from runbook_lib.model.plan import node_extensions, node_schematic
from runbook_lib.model.rollout import Schedule
from runbook_lib.model.schematic import Schematic
from runbook_lib.model.text import MODULES_PATCH_MISSING, shortened
from runbook_lib.model.upgrade_risks import dropped_extensions, preserve_needed
from runbook_lib.model.versions import TalosVersion

from . import cordoned, dryrun, fixes, gpu_operator_handover, image_diagnosis, image_risks
from .context import Context, wait_seconds
from .events import Events
from .image_risks import NodeFacts
from .patch import (
    config_patch,
    log_batch,
    pause_before,
    read_configs,
    rollout_schedule,
    wanted_documents,
)
from .results import Check, NodeResult, StepResult

Progress = Callable[[int, int], None]
STEP = "image"  # the name `--steps` and the record use (was "image-upgrade": two names for one step)
#: Upper bound on concurrent ``talosctl upgrade`` processes: ``rollout_concurrency``'s own bound, so a batch's nodes
#: all upgrade at once as that parameter promises. It was 64: a batch of 125 ran as two waves, twice as long
#: (``benchmarks/bench_whole_change.py``). Each process holds ~14 MB of its own (talosctl's 58 MB binary is shared).
MAX_PARALLEL_UPGRADES = 1000
#: Nodes per ``talosctl upgrade --wait`` process where its tracker follows several (``_tracked``): one process for 50
#: nodes used 0.18 s of CPU against 6.4 s for 50 one-node processes, and took T (benchmarks/README.md,
#: bench_whole_change); a batch's chunks run at once.
UPGRADE_CHUNK = 50
#: Identical wrong answers in a row after which a node that rebooted into its new boot is failed (see ``_confirm``).
SETTLE_READS = 3


@dataclass(frozen=True)
class NodeImage:
    """What one node should run: its schematic (``None`` before the Image Factory) and installer image."""

    node: Node
    schematic: Schematic | None
    image: str
    extensions: tuple[str, ...]
    """Official names the node must report (``siderolabs/`` prefix included)."""
    legacy: bool = False
    """Upgrade with ``--legacy`` so GRUB keeps ``machine.install.extraKernelArgs`` (see ``image_risks``)."""
    drains: bool = False
    """talosctl drains the node before its reboot (1.13+ client and node, no ``--legacy``: ``image_risks``)."""
    tracked: bool = False
    """talosctl's action tracker follows the upgrade, so one process can upgrade several nodes (``_tracked``)."""
    preserve: bool = False
    """Upgrade with ``--preserve``: the node or the target runs Talos below 1.8 (``upgrade_risks.preserve_needed``)."""

    @property
    def schematic_id(self) -> str | None:
        return self.schematic.id if self.schematic is not None else None


@dataclass
class NodeState:
    """What a node reports now: Talos version, schematic ID and extension names (or why it did not answer)."""

    version: str | None = None
    schematic_id: str | None = None
    extensions: dict[str, str] = field(default_factory=dict)
    error: str | None = None
    client_version: str | None = None
    """The talosctl client's own tag (it decides which upgrade API is used)."""


@dataclass(frozen=True)
class _Timing:
    """The waits of one run, resolved once (the ``timeouts`` parameters fill what the caller left out)."""

    upgrade_timeout: float
    settle_timeout: float
    poll_interval: float


def planned_image(ctx: Context, node: Node, platform: str = "metal") -> NodeImage:
    """The node's GPU schematic (the plan's, see ``model.plan.node_schematic``) and the installer carrying it.

    The installer host is the factory this run talks to (the simulator's URL on a simulated target), and
    its platform is the node's (``aws-installer`` on AWS, see ``image_risks``).
    """
    params = ctx.params
    names = tuple(node_extensions(params, params.profile(node), node.overrides.extra_extensions))
    schematic = node_schematic(params, node)
    if schematic is None:
        # Talos 1.3–1.4: no factory; the stock installer plus machine.install.extensions (patch step).
        return NodeImage(node, None, installer_image(None, "", params.talos), names)
    image = installer_image(
        ctx.endpoints.image_factory_url,
        schematic.id,
        params.talos,
        secureboot=params.secureboot,
        platform=platform,
    )
    return NodeImage(node, schematic, image, names)


def upgrade_command(ctx: Context, plan: NodeImage) -> list[str]:
    """The argv the step runs for a node (always with ``--image``), with the ``--timeout`` of the
    ``timeouts.upgrade_seconds`` parameter: what ``runbook run`` and the notebooks run with (a library caller
    passing ``upgrade_timeout=`` runs with its own instead)."""
    args = upgrade_args(
        plan.image,
        preserve=plan.preserve,
        legacy=plan.legacy,
        wait=True,
        timeout=ctx.params.timeouts.upgrade_seconds,
    )
    return ctx.talosctl.argv(args, [plan.node.address])


def read_states(ctx: Context, addresses: Sequence[str]) -> dict[str, NodeState]:
    """Talos version and extensions of each node: two fan-out calls, whatever the node count."""
    states = {a: NodeState() for a in addresses}
    if not addresses:
        return states
    client, servers, version_errors = ctx.talosctl.version(list(addresses))
    fan = ctx.talosctl.get("extensions", list(addresses))
    for address in addresses:
        state = states[address]
        state.version = servers.get(address)
        state.client_version = client
        state.error = fan.errors.get(address) or version_errors.get(address)
    for address, resources in fan.by_node().items():
        if address not in states:
            continue
        for name, version in _extension_pairs(resources):
            if name == "schematic":
                states[address].schematic_id = version
            else:
                states[address].extensions[name.removeprefix("siderolabs/")] = version
    return states


def _extension_pairs(resources: Sequence[TalosResource]) -> list[tuple[str, str]]:
    pairs: list[tuple[str, str]] = []
    for res in resources:
        if res.spec is not None:
            meta: Mapping[str, Any] = res.spec.get("metadata") or {}
            pairs.append((str(meta.get("name", "")), str(meta.get("version", ""))))
        else:
            pairs.append((res.columns.get("NAME", ""), res.columns.get("VERSION", "")))
    return pairs


def mismatches(plan: NodeImage, state: NodeState, target_version: str) -> list[str]:
    """Why a node is not (yet) on its planned image; empty when it is."""
    problems: list[str] = []
    if state.version != target_version:
        problems.append(f"runs Talos {state.version or 'unknown'}, planned {target_version}")
    if plan.schematic_id is not None and state.schematic_id != plan.schematic_id:
        problems.append(f"schematic {state.schematic_id or 'none'}, planned {plan.schematic_id}")
    missing = [n for n in plan.extensions if n.removeprefix("siderolabs/") not in state.extensions]
    if missing:
        problems.append(f"missing extensions {', '.join(missing)}")
    return problems


def image_upgrade(
    ctx: Context,
    *,
    only: list[str] | None = None,
    apply: bool | None = None,
    factory: FactoryClient | None = None,
    progress: Progress | None = None,
    upgrade_timeout: float | None = None,
    settle_timeout: float | None = None,
    poll_interval: float = 2.0,
    steps: Collection[str] | None = None,
) -> StepResult:
    """Plan (dry-run) or roll out the GPU installer to the nodes; returns per-node results, never prints.

    Timeouts default to the ``timeouts`` parameters. ``steps``: the run's (``runbook run``; None in a notebook),
    which says whether the config-patch step comes before this one in the same run.
    """
    timing = _Timing(
        upgrade_timeout=wait_seconds(upgrade_timeout, ctx.params.timeouts.upgrade_seconds, "upgrade_timeout"),
        settle_timeout=wait_seconds(settle_timeout, ctx.params.timeouts.node_ready_seconds, "settle_timeout"),
        poll_interval=poll_interval,
    )
    do_apply = ctx.apply if apply is None else apply
    result = StepResult(step=STEP, applied=do_apply)
    nodes = ctx.nodes(only)
    # read once: the installer's facts and the config-patch check both need them
    configs = read_configs(ctx, nodes)
    facts = image_risks.read_facts(ctx, nodes, configs)
    plans, schematics = _plan_images(ctx, result, nodes, facts)
    if do_apply and _refuse_before_config_patch(ctx, result, nodes, configs[0]):
        return _finish(ctx, result, facts)
    if not do_apply and not (steps is not None and "config-patch" in steps):
        _note_refusal_ahead(ctx, result, nodes, configs[0])

    todo, results, states = _sort_nodes(ctx, result, nodes, plans, facts)
    cordoned.flag_cordoned(ctx, result, [r for r in result.nodes if r.status == "unchanged"])
    schedule = _plan_commands(ctx, result, todo, schematics)
    factory_ok = _factory_checks(ctx, result, todo, factory, register=do_apply)
    from_versions = [states[p.node.address].version for p in todo]
    if not do_apply:
        return _finish(ctx, _dry_run(ctx, result, todo, results, from_versions), facts)
    if not _clear_to_roll_out(ctx, result, todo, results, from_versions, factory_ok=factory_ok):
        return _finish(ctx, result, facts)
    rolled = _apply_rollout(ctx, result, schedule, todo, results, progress=progress, timing=timing)
    return _finish(ctx, rolled, facts)


def _plan_images(
    ctx: Context, result: StepResult, nodes: list[Node], facts: dict[str, NodeFacts]
) -> tuple[dict[str, NodeImage], dict[str | None, Schematic]]:
    """Each node's plan by address, and the distinct schematics; recorded first, so that even a run refused
    later shows which installer and schematic each node would have got."""
    plans = {
        n.address: planned_image(ctx, n, image_risks.installer_platform(ctx, facts[n.address])) for n in nodes
    }
    result.data["installer_images"] = {n.name: plans[n.address].image for n in nodes}
    schematics = {p.schematic_id: p.schematic for p in plans.values() if p.schematic is not None}
    result.data["schematics"] = {sid: s.canonical_yaml() for sid, s in schematics.items() if s is not None}
    return plans, schematics


def _refuse_before_config_patch(
    ctx: Context, result: StepResult, nodes: list[Node], configs: dict[str, list[dict[str, Any]]]
) -> bool:
    """True (and every node failed or skipped) when a node's config lacks the modules patch: the upgrade
    must not start on any node then, not even on those whose config is ready."""
    missing = _config_patch_missing(ctx, nodes, configs)
    if not missing:
        return False
    # The config patch must come first: the kmod extension blacklists the NVIDIA modules, so a node
    # booting it without them in its config hangs for BootTimeout and rolls back (see
    # notebook/steps.py); before 1.5 the stock installer also installs only the extensions
    # machine.install.extensions lists.  Nothing is upgraded, on any node.
    for node in nodes:
        res = NodeResult(
            node=node.name, address=node.address, status="failed" if node in missing else "skipped"
        )
        res.message = (
            f"{MODULES_PATCH_MISSING} (upgrading now would hang "
            "the boot and roll back): run the config-patch step first "
            "(runbook run -p <parameters> --steps config-patch --apply), then this step"
            if node in missing
            else "not touched: another node's config lacks the modules patch"
        )
        result.nodes.append(res)
    return True


def _note_refusal_ahead(
    ctx: Context, result: StepResult, nodes: list[Node], configs: dict[str, list[dict[str, Any]]]
) -> None:
    """In a plan with no config-patch step before this one in the same run: a note that applying would be
    refused now, for the nodes whose config lacks the modules patch. Why: ``runbook run --from image`` after a
    rollback planned a clean upgrade, and its ``--apply`` then refused every node (operator walkthrough, 6 Dec
    2026); a plan that is not a failure, since the config patch may be approved before this step is."""
    missing = _config_patch_missing(ctx, nodes, configs)
    if missing:
        result.notes.append(
            f"applying this step now would be refused: the machine config of {shortened([n.name for n in missing])} "
            "does not carry the NVIDIA modules patch yet: apply the config-patch step first "
            "(runbook run -p <parameters> --steps config-patch --apply)"
        )


def _plan_commands(
    ctx: Context,
    result: StepResult,
    todo: list[NodeImage],
    schematics: dict[str | None, Schematic],
) -> Schedule:
    """Record the exact commands, boot assets and notes, and the batches they would run in: a dry run and an
    applied run show the same plan, so Approve applies what was shown."""
    target = ctx.params.talos_version
    result.data["commands"] = [shlex.join(upgrade_command(ctx, p)) for p in todo]
    result.data["boot_assets"] = {
        sid: boot_asset_urls(ctx.endpoints.image_factory_url, sid, target, secureboot=ctx.params.secureboot)
        for sid in schematics
        if sid is not None
    }
    _plan_notes(ctx, result, todo)
    return rollout_schedule(ctx, result, [p.node.name for p in todo])


def _dry_run(
    ctx: Context,
    result: StepResult,
    todo: list[NodeImage],
    results: dict[str, NodeResult],
    from_versions: list[str | None],
) -> StepResult:
    """Mark the nodes to do as planned and show what follows the upgrade: a dry run changes nothing, but
    it must show every later change the applied run would make."""
    gpu_operator_handover.before_upgrade(ctx, result, from_versions, dry_run=True)
    refused = dryrun.note(result)
    if refused:
        result.notes.append(refused)
    for plan in todo:
        results[plan.node.address].status = "planned"
    if ctx.params.default_runtime_patch:
        result.notes.append(
            "after the upgrade, the default-runtime patch is applied to the upgraded nodes "
            "(a reboot up to Talos 1.13): it needs the toolkit's nvidia runtime"
        )
    return _default_runtime_after_upgrade(ctx, result, apply=False)


def _clear_to_roll_out(
    ctx: Context,
    result: StepResult,
    todo: list[NodeImage],
    results: dict[str, NodeResult],
    from_versions: list[str | None],
    *,
    factory_ok: bool,
) -> bool:
    """True when the rollout may start; otherwise every node to do is marked untouched with the reason, since
    one blocked node or a failed factory check stops the whole rollout, not just that node."""
    blocked = [r for r in result.nodes if r.status == "failed" and not cordoned.only_cordoned(r)]
    if blocked or not factory_ok:
        reason = "a node cannot be read or upgraded safely" if blocked else "the Image Factory checks failed"
        for plan in todo:
            _untouched(results[plan.node.address], f"not touched: {reason}, nothing was changed")
        return False
    if not gpu_operator_handover.before_upgrade(ctx, result, from_versions, dry_run=False):
        for plan in todo:  # Talos 1.13 upgrade notes: the device plugin goes before any node is upgraded
            _untouched(
                results[plan.node.address], "not touched: the device plugin could not be removed first"
            )
        return False
    return True


def _apply_rollout(
    ctx: Context,
    result: StepResult,
    schedule: Schedule,
    todo: list[NodeImage],
    results: dict[str, NodeResult],
    *,
    progress: Progress | None,
    timing: _Timing,
) -> StepResult:
    """Upgrade the nodes batch by batch, then apply the default-runtime patch: it waits for the image because
    the ``nvidia`` runtime it names comes with the toolkit extension (``_default_runtime_after_upgrade``)."""
    target = ctx.params.talos_version
    _roll_out(
        schedule,
        todo,
        results,
        progress,
        lambda batch: _run_batch(
            ctx,
            batch,
            results,
            target=target,
            upgrade_timeout=timing.upgrade_timeout,
            settle_timeout=timing.settle_timeout,
            poll_interval=timing.poll_interval,
        ),
        log=result.data.setdefault("rollout", []),
        events=ctx.events,
    )
    return _default_runtime_after_upgrade(ctx, result, apply=True)


def _roll_out(
    schedule: Schedule,
    todo: list[NodeImage],
    results: dict[str, NodeResult],
    progress: Progress | None,
    run_batch: Callable[[list[NodeImage]], int],
    *,
    log: list[dict[str, Any]],
    events: Events | None = None,
) -> None:
    """Run the schedule's batches (``run_batch`` returns a batch's failed count) until the failure budget is
    used up; the nodes of the batches never started are marked untouched.  Each batch run goes to ``log``
    (``patch.log_batch``) and, as it ends, to ``events``."""
    batches = schedule.batches(todo)
    done = failed = 0
    for index, batch in enumerate(batches):
        pause_before(schedule, index)
        started = time.time()
        failed += run_batch(batch)
        log_batch(
            log, index, schedule, [results[plan.node.address] for plan in batch], started, events=events
        )
        done += len(batch)
        if progress:
            progress(done, len(todo))
        if schedule.exhausted(failed):
            why = (
                "at the first failure"
                if not schedule.budget
                else f"after {failed} failed nodes (more than rollout.max_failures allows)"
            )
            for later in batches[index + 1 :]:
                for plan in later:
                    _untouched(results[plan.node.address], f"not touched: the rollout stopped {why}")
            return


def _default_runtime_after_upgrade(ctx: Context, result: StepResult, *, apply: bool) -> StepResult:
    """Apply the default-runtime patch the config-patch step deferred, now that the nodes run the toolkit.

    Why here: containerd refuses a default runtime it has no definition for, and the ``nvidia`` runtime
    comes with the toolkit extension this step installs (see ``patch.nodes_with_nvidia_runtime``).  Only
    nodes on the planned image get it; ``config_patch`` applies only what a node lacks, so a re-run is a
    no-op, and it waits for the reboot a ``machine.files`` change needs up to Talos 1.13.  Planning
    (``apply`` False) shows it on the nodes already on the image, so Approve applies what was shown.
    """
    statuses = ("changed", "unchanged") if apply else ("unchanged",)
    ready = [r.node for r in result.nodes if r.status in statuses]
    if not ctx.params.default_runtime_patch or not ready:
        return result
    # Its own batches would be reported as the image rollout's: its failures show in the step's result.
    follow = config_patch(replace(ctx, events=Events()), only=ready, apply=apply)
    by_name = {r.node: r for r in result.nodes}
    for patched in follow.nodes:
        res = by_name[patched.node]
        if patched.status == "planned":
            res.status = "planned"
            res.message = "on the planned image; default runtime nvidia to set (a reboot up to Talos 1.13)"
        elif patched.status == "changed":
            res.status = "changed"
            res.message = "; ".join(m for m in (res.message, "default runtime nvidia set") if m)
        elif patched.status == "failed":
            res.status = "failed"
            res.message = f"upgraded, but the default-runtime patch failed: {patched.message}"
            res.checks += patched.checks
    result.data["default_runtime"] = follow.counts()
    return result


def _sort_nodes(
    ctx: Context,
    result: StepResult,
    nodes: list[Node],
    plans: dict[str, NodeImage],
    facts: dict[str, NodeFacts],
) -> tuple[list[NodeImage], dict[str, NodeResult], dict[str, NodeState]]:
    """Read every node and sort it: failed (unreadable, newer than the plan, or the upgrade would lose
    something, see ``_guard``), unchanged (already on the plan), or to do (the plans to run, in order)."""
    target = ctx.params.talos_version
    states = read_states(ctx, [n.address for n in nodes])
    todo: list[NodeImage] = []
    results: dict[str, NodeResult] = {}
    for node in nodes:
        plan, state = plans[node.address], states[node.address]
        res = NodeResult(node=node.name, address=node.address, data={"image": plan.image})
        if plan.schematic_id:
            res.data["schematic_id"] = plan.schematic_id
        results[node.address] = res
        result.nodes.append(res)
        if state.error:
            res.status = "failed"
            res.message = f"cannot read the node: {state.error}"
            res.checks.append(
                Check(
                    "node answers",
                    False,
                    res.message,
                    fix=fixes.unreachable(node.address, "image", after_preflight=ctx.apply),
                )
            )
            continue
        downgrade = _downgrade(state.version, target)
        if downgrade:
            res.status = "failed"
            res.message = downgrade
            res.checks.append(
                Check(
                    "no downgrade",
                    False,
                    downgrade,
                    fix=f"set talos_version: {state.version} in the parameters (or upgrade the other nodes)",
                )
            )
            continue
        problems = mismatches(plan, state, target)
        if not problems:
            res.status = "unchanged"
            res.message = f"already on {plan.schematic_id or 'the planned image'} at {target}"
            continue
        guarded = _guard(ctx, result, res, plan, state=state, fact=facts[node.address])
        if guarded is None:
            continue
        plan = plans[node.address] = guarded
        res.data["before"] = {"version": state.version, "schematic_id": state.schematic_id}
        # the installer first: a plan that named only the schematic IDs left the reader to work out the upgrade
        res.message = f"upgrade to {plan.image} (now: {'; '.join(problems)})"
        res.diff = shlex.join(upgrade_command(ctx, plan))
        todo.append(plan)
    return todo, results, states


def _plan_notes(ctx: Context, result: StepResult, todo: list[NodeImage]) -> None:
    """Notes the plan shows next to the commands: ``--legacy`` and its lasting fix, and the nodes talosctl drains
    (the 1.13 switch is ``gpu_operator_handover``'s)."""
    legacy = [p.node.name for p in todo if p.legacy]
    if legacy:
        result.notes.append(image_risks.legacy_note(legacy))
    drained = [p.node.name for p in todo if p.drains]
    if drained:
        result.notes.append(image_risks.drain_note(drained))


def _guard(
    ctx: Context, result: StepResult, res: NodeResult, plan: NodeImage, *, state: NodeState, fact: NodeFacts
) -> NodeImage | None:
    """The node's plan with ``--legacy`` when it needs it, or None (and the node failed) when the upgrade
    would silently drop extensions or cannot name the node's platform installer (``image_risks``)."""
    # Before the Image Factory (no schematic) the stock installer installs what machine.install.extensions
    # lists, and the patch appends the NVIDIA images to that list: the node's other extensions stay.
    current = list(state.extensions) if plan.schematic is not None else []
    kept = image_risks.kept_by_config(ctx, fact, state.version)
    current = [name for name in current if name not in kept]
    dropped = dropped_extensions(current, plan.extensions)
    if dropped:
        result.data.setdefault("dropped_extensions", {})[plan.node.name] = dropped
    refused = image_risks.refusals(ctx, plan.node, fact, plan.extensions, current)
    if refused:
        res.status = "failed"
        res.message = "; ".join(c.message for c in refused)
        res.checks += refused
        return None
    legacy = image_risks.legacy_needed(fact, state.client_version)
    drains = image_risks.drains(state.version, state.client_version, legacy=legacy)
    tracked = _tracked(state.client_version, legacy=legacy)
    preserve = preserve_needed(ctx.params.talos, state.version)
    return replace(plan, legacy=legacy, drains=drains, tracked=tracked, preserve=preserve)


def _tracked(client: str | None, *, legacy: bool) -> bool:
    """Whether ``talosctl upgrade --wait`` follows the node with its action tracker, which follows every ``-n`` node
    in one process and attributes each failure to its node (talos@v1.12.0 cmd/talosctl/pkg/talos/action/
    tracker.go:185-227, 291-295; the same tracker from v1.3.5, whose per-node lines the real v1.3.5 and v1.4.0
    print alike: tests/sim/test_real_talos_13_14.py): talosctl 1.3 to 1.12, and 1.13+ with ``--legacy``
    (talos@v1.13.0 cmd/talosctl/cmd/talos/upgrade.go:96-99, 262-271).  1.13+'s default LifecycleService path
    installs on every node and reboots none when one fails (:131-138).  A node's own lines are what judge it:
    talosctl 1.3 exits 0 when a node failed (``_upgrade_group``)."""
    cli = TalosVersion.parse_or_none(client)
    return cli is not None and cli.at_least(1, 3) and (legacy or not cli.at_least(1, 13))


def _config_patch_missing(
    ctx: Context, nodes: list[Node], configs: dict[str, list[dict[str, Any]]]
) -> list[Node]:
    """Readable nodes whose machine config (``configs``: ``patch.read_configs``) lacks the config-patch step's
    documents (modules, sysctl, and before Talos 1.5 ``machine.install.extensions``); the default runtime waits for
    the image, so it is not required here.  Unreadable nodes are left to the node checks that follow."""
    return [
        node
        for node in nodes
        if node.address in configs
        and not contains(configs[node.address], wanted_documents(ctx, node, default_runtime=False))
    ]


def _downgrade(current: str | None, target: str) -> str | None:
    """A node newer than the plan is not moved back silently: that is a parameter mistake, not a rollout."""
    if not current:
        return None
    try:
        if TalosVersion.parse(target) < TalosVersion.parse(current):
            return f"runs Talos {current}, newer than the planned {target}; refusing to downgrade"
    except PermanentError:
        return None
    return None


def _untouched(res: NodeResult, message: str) -> None:
    res.status = "skipped"
    res.message = message


def _finish(ctx: Context, result: StepResult, facts: dict[str, NodeFacts]) -> StepResult:
    """The result's node lists, and each node's own platform installer in its fix commands (``fixes``)."""
    fixes.own_installers(
        result, {address: fact.platform for address, fact in facts.items()}, ctx.params.talos
    )
    by_status: dict[str, list[str]] = {}
    for res in result.nodes:
        by_status.setdefault(res.status, []).append(res.node)
    result.data["done"] = by_status.get("changed", [])
    result.data["failed"] = by_status.get("failed", [])
    result.data["untouched"] = by_status.get("skipped", [])
    result.data["already"] = by_status.get("unchanged", [])
    return result.finish()


def _factory_checks(
    ctx: Context,
    result: StepResult,
    todo: list[NodeImage],
    factory: FactoryClient | None,
    *,
    register: bool,
) -> bool:
    """Resolve extensions (and register each schematic when applying) before any change.

    A dry run only reads from the factory; every problem becomes a failed check rather than an exception,
    so the plan shows it next to the nodes it would have affected.
    """
    with_schematic = [p for p in todo if p.schematic is not None]
    if not with_schematic:
        return True
    client = factory or FactoryClient(ctx.endpoints.image_factory_url)
    ok = True
    seen: set[str] = set()
    for plan in with_schematic:
        assert plan.schematic is not None
        if plan.schematic.id in seen:
            continue
        seen.add(plan.schematic.id)
        label = f"schematic {plan.schematic.id[:12]}"
        try:
            resolved = client.resolve_extensions(plan.extensions, ctx.params.talos_version)
            registered = client.post_schematic(plan.schematic).id if register else None
        except RunbookError as exc:
            ok = False
            result.checks.append(
                Check(f"{label}: factory", False, exc.message, fix=exc.hint or "", cause="Image Factory")
            )
            continue
        state = f"registered as {registered}" if registered else f"offline ID {plan.schematic.id}"
        result.checks.append(
            Check(f"{label}: factory", True, f"{state}; extensions {', '.join(resolved.refs)}")
        )
        result.data.setdefault("resolved", {})[plan.schematic.id] = resolved.refs
    return ok


def _run_batch(
    ctx: Context,
    batch: list[NodeImage],
    results: dict[str, NodeResult],
    *,
    target: str,
    upgrade_timeout: float,
    settle_timeout: float,
    poll_interval: float,
) -> int:
    """Upgrade one batch concurrently, then confirm each node; returns how many nodes of the batch failed."""
    outcomes = _upgrade_batch(ctx, batch, results, upgrade_timeout)
    pending: list[NodeImage] = []
    diagnosed = image_diagnosis.upgrade_failures(
        ctx, {plan.node.address: error for plan, error in outcomes if error}
    )
    for plan, error in outcomes:
        res = results[plan.node.address]
        if error:
            res.checks += diagnosed[plan.node.address]
        else:
            res.checks.append(Check("upgrade", True, "the installer was accepted and the node rebooted"))
            pending.append(plan)
    _confirm(ctx, pending, results, target=target, settle_timeout=settle_timeout, poll_interval=poll_interval)
    return sum(results[p.node.address].status == "failed" for p, _ in outcomes)


Outcome = tuple[NodeImage, image_diagnosis.UpgradeFailure | None]


def _upgrade_batch(
    ctx: Context, batch: list[NodeImage], results: dict[str, NodeResult], upgrade_timeout: float
) -> list[Outcome]:
    """Run every upgrade of the batch at once (``_groups``), in the batch's order; each failed node is marked
    failed and reported (events.py) as soon as talosctl says so, before its batch-mates finish.  Its message is
    then replaced by its process's final word on it (whether the --timeout passed is known only at its end)."""
    lock, reported = threading.Lock(), set[str]()

    def report(plan: NodeImage, error: image_diagnosis.UpgradeFailure) -> None:
        with lock:
            res = results[plan.node.address]
            res.status = "failed"
            res.message = f"talosctl upgrade failed: {error.report()}"
            if plan.node.address not in reported:
                reported.add(plan.node.address)
                ctx.events.node_failed(res)

    groups = _groups(batch)
    outcomes: list[Outcome] = []
    with Pool(min(len(groups), MAX_PARALLEL_UPGRADES)) as pool:  # a Ctrl-C cannot break its waits (fanout.py)
        futures = [pool.submit(_upgrade_group, ctx, group, upgrade_timeout, report) for group in groups]
        for future in pool.as_completed(futures):
            for plan, error in future.result():
                outcomes.append((plan, error))
                if error:  # known now: reported before the batch-mates finish
                    report(plan, error)
    order = {plan.node.address: index for index, plan in enumerate(batch)}
    return sorted(outcomes, key=lambda outcome: order[outcome[0].node.address])


def _groups(batch: list[NodeImage]) -> list[list[NodeImage]]:
    """The batch's talosctl processes: tracked nodes with the same installer and flags in chunks of
    ``UPGRADE_CHUNK``, every other node on its own."""
    same: dict[tuple[str, bool, bool], list[NodeImage]] = {}
    for plan in batch:
        if plan.tracked:
            same.setdefault((plan.image, plan.legacy, plan.preserve), []).append(plan)
    chunks = [g[i : i + UPGRADE_CHUNK] for g in same.values() for i in range(0, len(g), UPGRADE_CHUNK)]
    return chunks + [[plan] for plan in batch if not plan.tracked]


def _upgrade_group(
    ctx: Context,
    group: list[NodeImage],
    upgrade_timeout: float,
    report: Callable[[NodeImage, image_diagnosis.UpgradeFailure], None],
) -> list[Outcome]:
    """One talosctl process for ``group``: a node fails with its own lines (``TrackerFollower``); one that printed
    neither its post check nor an error (talosctl exited first, or its --timeout passed: then it prints nothing,
    tracker.go:168, node.go:111-118) fails with the process's other lines."""
    first, by_address = group[0], {plan.node.address: plan for plan in group}

    def failed_early(address: str) -> None:
        plan = by_address[address]
        report(plan, image_diagnosis.UpgradeFailure(plan.node, follower.output(address)))

    follower = image_diagnosis.TrackerFollower(list(by_address), failed_early)
    upgrade = ctx.talosctl.upgrade_nodes if first.tracked else _one_node(ctx)
    run = upgrade(
        list(by_address),
        first.image,
        wait=True,
        timeout=upgrade_timeout,
        preserve=first.preserve,
        legacy=first.legacy,
        drains=first.drains,
        on_stderr_line=follower.feed,
    )
    follower.close()
    # talosctl's --timeout spans the whole command (tracker.go:168-169): a failure that took that long is it
    timed_out = upgrade_timeout if run.duration_s >= upgrade_timeout else None
    fallback = run.stderr.strip() or f"talosctl upgrade exited {run.exit_code}"
    # a node's own final error fails it whatever the exit code: talosctl 1.3 exits 0 with a node failed
    # (talos@v1.3.5 cmd/talosctl/pkg/talos/action/tracker.go:172-185)
    return [
        (plan, None)
        if address not in follower.failed and (run.ok or address in follower.passed)
        else (
            plan,
            image_diagnosis.UpgradeFailure(
                plan.node,
                (follower.output(address) if first.tracked else "") or fallback,
                follower.timed_out(address, timed_out),
            ),
        )
        for address, plan in by_address.items()
    ]


def _one_node(ctx: Context) -> Callable[..., CommandResult]:
    """``talosctl.upgrade`` of one node, called as ``upgrade_nodes``: an untracked node's own process, its output
    kept whole (the failure report reads it as before)."""

    def upgrade(nodes: list[str], image: str, **kwargs: Any) -> CommandResult:
        kwargs.pop("on_stderr_line")
        return ctx.talosctl.upgrade(nodes[0], image, **kwargs)

    return upgrade


def _confirm(
    ctx: Context,
    pending: list[NodeImage],
    results: dict[str, NodeResult],
    *,
    target: str,
    settle_timeout: float,
    poll_interval: float,
) -> None:
    """Wait until each upgraded node answers with the planned version, schematic and NVIDIA extensions.

    A node whose upgrade returned success is in its new boot (talosctl --wait returns once the boot ID
    changed: talos@v1.12.0 cmd/talosctl/pkg/talos/action/tracker.go post check); one that then answers
    the same wrong state ``SETTLE_READS`` times in a row (a toolkit missing, another driver track, a
    rollback) will not change by waiting, so it fails then, not after ``settle_timeout``.
    """
    deadline = time.monotonic() + settle_timeout
    last: dict[str, tuple[list[str], NodeState]] = {}
    streaks: dict[str, tuple[object, int]] = {}
    given_up: list[NodeImage] = []
    while pending:
        states = read_states(ctx, [p.node.address for p in pending])
        still: list[NodeImage] = []
        for plan in pending:
            state = states[plan.node.address]
            problems = [f"does not answer: {state.error}"] if state.error else mismatches(plan, state, target)
            if not problems:
                _confirmed(results[plan.node.address], plan, target)
                continue
            last[plan.node.address] = (problems, state)
            settled = not state.error and _same_again(streaks, plan.node.address, state)
            (given_up if settled else still).append(plan)
        pending = still
        if not pending or time.monotonic() >= deadline:
            break
        time.sleep(poll_interval)
    for plan in given_up + pending:
        _not_confirmed(ctx, plan, results[plan.node.address], last.get(plan.node.address))


def _same_again(streaks: dict[str, tuple[object, int]], address: str, state: NodeState) -> bool:
    """Count the node's identical answers in a row; True once it gave the same one ``SETTLE_READS`` times."""
    key = (state.version, state.schematic_id, tuple(sorted(state.extensions.items())))
    previous, count = streaks.get(address, (None, 0))
    count = count + 1 if previous == key else 1
    streaks[address] = (key, count)
    return count >= SETTLE_READS


def _confirmed(res: NodeResult, plan: NodeImage, target: str) -> None:
    res.status = "changed"
    res.message = f"now on {plan.schematic_id or plan.image} at {target}"
    res.checks.append(Check("schematic and extensions", True, res.message))


def _not_confirmed(
    ctx: Context, plan: NodeImage, res: NodeResult, last: tuple[list[str], NodeState] | None
) -> None:
    """The node failed its confirmation: what it last reported, and the diagnosis of it."""
    problems, left = last if last is not None else (["did not settle"], None)
    res.status = "failed"
    res.message = "after the upgrade the node " + "; ".join(problems)
    res.checks += image_diagnosis.confirm_failure(
        ctx,
        plan.node,
        res.message,
        planned_schematic=plan.schematic_id,
        found=None if left is None or left.error else (left.extensions, left.schematic_id),
        retry=shlex.join(upgrade_command(ctx, plan)),
    )
