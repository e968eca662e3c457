"""Step: rollback — take the GPU nodes back to where the runbook found them, from its change records.

Why from records: only a record says what the runbook did and where it found each node (``model.rollback``
reads it).  Nodes no record shows changed are left alone, so after a rollout the failure budget stopped,
only the nodes it changed go back.  A node whose evidence is incomplete (or that cannot be read) is refused
with the reason, and then nothing is changed on any node: the plan says which node to leave out
(``nodes``) or to put back by hand.

Why this order, per node (the reverse of how the runbook got there):

1. the Kubernetes layer first, when every GPU node goes back: the Helm releases and the RuntimeClass the
   records say the runbook *created* (never one that was there before), so no device plugin runs on
   nodes losing their driver;
2. what must leave the config before the old image boots: the default-runtime file or document (the old
   image has no ``nvidia`` runtime and containerd refuses a default runtime without a definition) and,
   before Talos 1.5, ``machine.install.extensions`` (that installer installs what the list names);
3. the image: ``talosctl upgrade --image <the installer the node was found on>``, with the image step's
   ``--preserve`` (below 1.8), ``--legacy`` and per-platform installer rules, then confirmed;
4. only then the modules patch: an NVIDIA image without the modules in its config hangs at boot
   (``notebook.steps``, the config-patch spec), so a node whose image did not come back keeps them.

Why ``talosctl upgrade --image`` and not ``talosctl rollback``: rollback only swaps the A/B boot entries and
reboots (talos@v1.12.0 cmd/talosctl/cmd/talos/rollback.go; the machined handler
internal/app/machined/internal/server/v1alpha1/v1alpha1_server.go ``Rollback``: ``bootloader.Probe`` then
``config.Revert`` and a reboot).  It is the image the runbook found only when exactly one upgrade happened
since, which neither the records nor the Talos API show (a re-run, a failed attempt or someone else's
upgrade moves the other entry), and it reports nothing to wait for.  An upgrade to the recorded installer
is right whatever the boot entries hold, and its outcome is confirmed like the image step's.

Rolled out with the ``rollout`` controls (canary, failure budget, pause) like the image and config-patch
steps; with ``apply`` false it only plans: the removal patches are dry-run on each node.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from runbook_lib.clients.fanout import concurrently
from runbook_lib.clients.talosctl import upgrade_args
from runbook_lib.errors import PermanentError, RunbookError
from runbook_lib.model.boot_assets import installer_image
from runbook_lib.model.machineconfig import Doc, contains
from runbook_lib.model.params import Node
from runbook_lib.model.parsers import extension_versions, extensions_from_resources
from runbook_lib.model.profiles import render_documents
from runbook_lib.model.redact import redact
from runbook_lib.model.rollback import (
    NOT_UNDONE_NOTE,
    Evidence,
    NodeEvidence,
    Phase,
    label_undo,
    removal_documents,
    runs_nvidia_image,
)
from runbook_lib.model.rollout import Schedule
from runbook_lib.model.text import shortened
from runbook_lib.model.upgrade_risks import preserve_needed
from runbook_lib.model.versions import TalosVersion

from . import drains, fixes, gpu_operator_handover, image_risks, permissions
from .context import Context, wait_seconds
from .drains import drain, lift, stays_cordoned
from .image import MAX_PARALLEL_UPGRADES, NodeState, read_states
from .patch import log_batch, pause_before, read_configs, rollout_schedule, wanted_documents
from .reboots import NOT_REBOOTED, boot_ids, wait_for_reboots
from .results import Check, NodeResult, StepResult

Progress = Callable[[int, int], None]
STEP = "rollback"
PHASES: tuple[Phase, ...] = ("before-image", "after-image")


def kubernetes_by_hand(ctx: Context) -> str:
    """What a person does when a record cannot say what its Kubernetes step created; the release and namespace
    the parameters plan (the walkthrough of stop 52 met ``helm history <release> -n <namespace>``, placeholders
    the rollback could have filled)."""
    history = shlex.join(["helm", "history", ctx.plan.helm.release, "-n", ctx.plan.helm.namespace])
    return (
        f"check each change against the cluster ({history} shows whether that run installed the release or "
        "upgraded one already there) and remove by hand only what it created"
    )


@dataclass
class NodeRollback:
    """One node's way back: the two removal patches (YAML, may be empty) and the installer to boot."""

    node: Node
    evidence: NodeEvidence
    patches: dict[Phase, str]
    image: str | None
    preserve: bool = False
    legacy: bool = False
    drains: bool = True
    """Whether talosctl drains the node first (``image_risks.drains``), which sets how long its upgrade may run."""
    reboots: set[Phase] = field(default_factory=set)
    """The phases whose removal patch the dry run said reboots the node: it is drained before (``drains``)."""

    def upgrade_argv(self, ctx: Context) -> list[str]:
        args = upgrade_args(
            self.image or "",
            preserve=self.preserve,
            legacy=self.legacy,
            wait=True,
            timeout=ctx.params.timeouts.upgrade_seconds,
        )
        return ctx.talosctl.argv(args, [self.node.address])

    def describe(self, ctx: Context) -> str:
        """The plan for the node, in the order it runs (what Approve approves), numbered as it will run and
        each with the command that makes it, so an operator can follow it, or do it by hand."""
        parts = []
        if self.patches["before-image"]:
            parts.append(
                ("remove from the config before the old image boots", self._patch(ctx, "before-image"))
            )
        if self.image:
            parts.append(("back to the image the runbook found", shlex.join(self.upgrade_argv(ctx))))
        if self.patches["after-image"]:
            after = " (after the image)" if self.image else ""  # no image to wait for (walkthrough)
            parts.append((f"remove the modules patch{after}", self._patch(ctx, "after-image")))
        return "\n".join(f"# {i}. {title}\n{body}" for i, (title, body) in enumerate(parts, 1))

    def _patch(self, ctx: Context, phase: Phase) -> str:
        """A removal patch: the drain before it when it reboots the node, the command, the patch itself."""
        argv = ctx.talosctl.argv(["patch", "machineconfig", "--patch", "@removal.yaml"], [self.node.address])
        return (
            _drained_first(self, phase) + shlex.join(argv) + "  # removal.yaml holds:\n" + self.patches[phase]
        )


def rollback(
    ctx: Context,
    *,
    only: list[str] | None = None,
    apply: bool | None = None,
    progress: Progress | None = None,
    evidence: Evidence | None = None,
    settle_timeout: float | None = None,
    poll_interval: float = 2.0,
) -> StepResult:
    """Plan (dry-run) or roll back the GPU nodes the records in ``evidence`` show changed."""
    if evidence is None or not evidence.records:
        raise PermanentError(
            "rollback.records names no change record: there is no evidence of where the runbook found the nodes",
            hint="runbook rollback -p PARAMS --from RECORD (`runbook records list` shows the names)",
        )
    timeout = wait_seconds(settle_timeout, ctx.params.timeouts.node_ready_seconds, "settle_timeout")
    do_apply = ctx.apply if apply is None else apply
    result = StepResult(step=STEP, applied=do_apply)
    result.data["records"] = list(evidence.records)
    nodes = ctx.nodes(only)
    todo, results = _plan_nodes(ctx, result, nodes, evidence)
    # every GPU node, however it was asked for (``nodes`` may list them all): then the Kubernetes layer goes
    whole_cluster = {n.address for n in nodes} == {n.address for n in ctx.params.nodes}
    keeping = _keeping_nvidia(ctx, nodes, todo, evidence) if whole_cluster and evidence.kubernetes else []
    kube = _kubernetes_plan(ctx, result, evidence, whole_cluster=whole_cluster, keeping=keeping)
    goes = layer_goes(kube, result, evidence)
    _not_undone(
        result,
        evidence,
        {t.node.name for t in todo},
        layer_goes=goes,
        operator_goes=goes and ctx.plan.kubernetes_layer == "gpu-operator",
    )
    _dry_run(ctx, todo, results)
    schedule = rollout_schedule(ctx, result, [t.node.name for t in todo])
    # a cordon a run left is the runbook's change too; a node whose removal reboots it is drained and
    # uncordoned by its rollout, which lifts that cordon with its own
    drained = {t.node.name for t in todo if t.reboots}
    left = drains.cordons_left(ctx, result, [n.name for n in nodes if n.name not in drained])
    _ask_permissions(ctx, result, kube, drains=bool(drained), cordons=bool(left), do_apply=do_apply)
    refused = [r.node for r in result.nodes if r.status == "failed"]
    if not do_apply or refused or not result.ok:
        if left and not do_apply:
            result.notes.append(drains.left_note(left))
            # a change like the others, so Approve approves it (it was a note only: operator walkthrough)
            result.data.setdefault("changes", []).extend(_uncordons(left))
            result.data["planned"] = True  # alone (a run cut after a drain, before its patch) it is the plan
        for plan in todo:
            res = results[plan.node.address]
            if res.status != "failed":
                res.status = "planned" if not do_apply else "skipped"
                res.message = (
                    res.message if not do_apply else "not touched: the plan has refusals, nothing was changed"
                )
        if not do_apply:
            result.notes.append("plan only (apply is off): nothing was changed")
        return result.finish()
    if kube is not None and not _remove_kubernetes(ctx, result, kube):
        for plan in todo:
            _untouched(
                results[plan.node.address], "not touched: the Kubernetes layer could not be removed first"
            )
        return result.finish()
    log = result.data.setdefault("rollout", [])
    _roll_out(ctx, schedule, todo, results, progress, timeout=timeout, interval=poll_interval, log=log)
    lifted = drains.lift_left(ctx, result, left, wait_s=0.0)  # the rollout waited: one not Ready is down
    # the terminal's "rolled back:" lists the lifts, as the record does
    result.data["uncordoned"] = _uncordons(lifted)
    if lifted:
        result.data["changed"] = True
    return result.finish()


def _uncordons(names: list[str]) -> list[str]:
    """The lifts of cordons a run left, as the commands that make them."""
    return [f"{drains.uncordon_command(n, marked=True)}  (the cordon a run left)" for n in names]


# -- planning ------------------------------------------------------------------------------------------------


def _ask_permissions(
    ctx: Context,
    result: StepResult,
    kube: gpu_operator_handover.Leftovers | None,
    *,
    drains: bool,
    cordons: bool,
    do_apply: bool,
) -> None:
    """Before any change: a write the API server refuses would stop the rollback halfway (the Kubernetes layer
    gone, a node left unpatched because its drain was refused). With the API down, the drains fail per node,
    unpatched, so only the layer's removal needs the answer first."""
    try:
        wanted = permissions.for_rollback(ctx, kube, drains=drains, cordons=cordons)
    except RunbookError as exc:
        result.checks.append(
            Check(
                permissions.CHECK,
                False,
                f"could not read the objects to remove: {exc.message}",
                fix=exc.hint or "",
            )
        )
        return
    if wanted:
        result.checks.append(permissions.verdict(ctx, wanted, advisory=not do_apply, unasked_ok=kube is None))


def _plan_nodes(
    ctx: Context, result: StepResult, nodes: list[Node], evidence: Evidence
) -> tuple[list[NodeRollback], dict[str, NodeResult]]:
    """Sort each node: unchanged (no record changed it, or already back), refused (failed), or to do."""
    results = {n.address: NodeResult(node=n.name, address=n.address) for n in nodes}
    result.nodes += results.values()
    changed = [n for n in nodes if n.name in evidence.nodes]
    configs, errors = read_configs(ctx, changed) if changed else ({}, {})
    states = read_states(ctx, [n.address for n in changed])
    facts = image_risks.read_facts(ctx, [n for n in changed if evidence.nodes[n.name].image])
    todo: list[NodeRollback] = []
    for node in nodes:
        res = results[node.address]
        found = evidence.nodes.get(node.name)
        if found is None:
            res.status = "unchanged"
            res.message = _not_in_named(evidence.continued.get(node.name, []))
            continue
        res.data["records"] = sorted(
            {r for r, _d in found.patches} | ({found.image.record} if found.image else set())
        )
        if found.address != node.address:  # another node of that name: records of the name say nothing of it
            _refuse(res, node, _moved(node, found), [])
            continue
        state = states[node.address]
        problem = found.missing or [errors.get(node.address) or state.error or ""]
        if found.missing or node.address in errors or state.error or node.address not in configs:
            why = "; ".join(p for p in problem if p) or "the machine config could not be read"
            _refuse(res, node, why, evidence.unnamed(node.name))
            continue
        try:
            plan = _node_plan(
                ctx, node, found, config=configs[node.address], state=state, fact=facts.get(node.address)
            )
        except RunbookError as exc:
            _refuse(res, node, exc.message, evidence.unnamed(node.name))
            continue
        if plan is None:
            res.status = "unchanged"
            res.message = "already where the runbook found it"
            continue
        res.message = _summary(plan)  # its diff once the dry run says which removal reboots it (_dry_run)
        todo.append(plan)
    # not the refused nodes: a refused node's config may be another machine's
    refused = {r.node for r in results.values() if r.status == "failed"}
    kept = [n for n in changed if n.name not in refused and n.address in configs]
    _patch_not_named(ctx, result, kept, evidence, configs)
    _continued_note(result, evidence, nodes)
    return todo, results


def _not_in_named(earlier: list[str]) -> str:
    """An unchanged node's line: no named record changed it, and which earlier unnamed run did."""
    if not earlier:
        return "no record shows the runbook changed this node: left as it is"
    names = ", ".join(earlier)
    return f"left as it is: no named record changed it, but {names} did, an earlier run of this cluster (not named)"


def _continued_note(result: StepResult, evidence: Evidence, nodes: list[Node]) -> None:
    """One note for every node an earlier, unnamed run changed, also those the named records changed too: a plan
    that lists many nodes hides one line, and a note naming only the nodes no named record changed read as if
    that run had changed no other (operator walkthrough: it had patched all three, the resume upgraded two)."""
    changed = [n.name for n in nodes if evidence.continued.get(n.name)]
    if changed:
        earlier = sorted({r for n in changed for r in evidence.continued[n]})
        result.notes.append(
            f"{shortened(changed)}: also changed by {', '.join(earlier)}, an earlier run of this cluster that is "
            "not named: what it did to them stays; to undo it too, add "
            + " ".join(f"--from {r}" for r in earlier)
        )


def _patch_not_named(
    ctx: Context, result: StepResult, nodes: list[Node], evidence: Evidence, configs: dict[str, list[Doc]]
) -> None:
    """A note naming the nodes whose config carries the runbook's modules patch that no named record applied.

    Why: a run split by ``--steps config-patch --apply`` and the ``--from image --apply`` its report suggests
    leaves two records; a rollback from the second alone took the image back and left the patch without a
    word, while the operator believed the nodes back where the runbook found them (operator walkthrough, 6 Dec
    2026). The patch may also have been there before the runbook: the note says both, and changes nothing."""

    def carried(
        node: Node,
    ) -> bool:  # the modules (not the default runtime) on the node, and by no named patch
        modules = wanted_documents(ctx, node, default_runtime=False)
        added = evidence.nodes[node.name].added_documents()
        return contains(configs[node.address], modules) and not (added and contains(added, modules))

    carrying = [n for n in nodes if carried(n)]
    by_earlier = [n.name for n in carrying if evidence.continued.get(n.name)]
    if by_earlier:  # the run that applied it is known: said so, not "perhaps the site's" (walkthrough)
        earlier = sorted({r for n in by_earlier for r in evidence.continued[n]})
        result.notes.append(
            f"{shortened(by_earlier)}: the machine config keeps the runbook's modules patch, which "
            f"{', '.join(earlier)} applied (not named), also on the nodes this rollback takes back to the image "
            f"they were found on; to remove it too, add {' '.join(f'--from {r}' for r in earlier)}"
        )
    kept = [n.name for n in carrying if not evidence.continued.get(n.name)]
    if kept:
        result.notes.append(
            f"{shortened(kept)}: the machine config carries the runbook's modules patch, which no named record "
            "applied, so this rollback leaves it; if a run of the runbook applied it (`--steps config-patch`), "
            "name that record too (--from <record>; `runbook records list` shows them); if it was there before "
            "the runbook, nothing is to do"
        )


def _moved(node: Node, found: NodeEvidence) -> str:
    """Why a node whose name sits at another address than in the records is refused: the records are of
    another cluster that has the same name, or the names moved to other machines.  Either way the machine
    the parameters name is not the one the records changed, and reading it would report the runbook's
    changes as already undone while the machine they were made on keeps them."""
    return (
        f"the records show {node.name} at {found.address}, the parameters at {node.address}: "
        "not the machine they changed (a record of another cluster with the same name?)"
    )


def _node_plan(
    ctx: Context,
    node: Node,
    found: NodeEvidence,
    *,
    config: list[Doc],
    state: NodeState,
    fact: image_risks.NodeFacts | None,
) -> NodeRollback | None:
    """The node's way back, or None when it is already there; raises when it cannot be done safely."""
    added = found.added_documents()
    patches = {
        phase: render_documents(docs) if docs else ""
        for phase in PHASES
        for docs in [removal_documents(added, config, found.sysctls_before, phase)]
    }
    image: str | None = None
    plan = NodeRollback(node, found, patches, None)
    if found.image is not None and (
        state.version != found.image.version or state.schematic_id != found.image.schematic_id
    ):
        platform = image_risks.installer_platform(ctx, fact) if fact is not None else "metal"
        factory = ctx.endpoints.image_factory_url if found.image.schematic_id else None
        image = installer_image(
            factory,
            found.image.schematic_id or "",
            found.image.version,
            secureboot=ctx.params.secureboot,
            platform=platform,
        )
        plan.image = image
        # the version rolled back to, and the one the node reports running (not the plan's: the node may have
        # been moved by hand since the records; unread counts as old, preserve_needed)
        plan.preserve = preserve_needed(TalosVersion.parse(found.image.version), state.version)
        plan.legacy = fact is not None and image_risks.legacy_needed(fact, state.client_version)
        plan.drains = image_risks.drains(state.version, state.client_version, legacy=plan.legacy)
    elif patches["after-image"] and runs_nvidia_image(state.extensions):
        raise PermanentError(
            "runs an NVIDIA image no record shows the runbook installed: removing the modules patch would hang "
            "its next boot (the kernel-module extension blacklists the modules)"
        )
    if not image and not any(patches.values()):
        return None
    return plan


def _drained_first(plan: NodeRollback, phase: Phase) -> str:
    """The plan's line saying the node is drained before a removal patch that reboots it."""
    if phase not in plan.reboots:
        return ""
    return f"# it reboots the node: kubectl drain {plan.node.name} first, uncordon once Ready\n"


def _summary(plan: NodeRollback) -> str:
    parts = []
    if plan.image:
        assert plan.evidence.image is not None
        found = plan.evidence.image
        parts.append(f"back to Talos {found.version}, schematic {found.schematic_id or 'none'}")
    if any(plan.patches.values()):
        parts.append("remove the runbook's config patch")
    return "; ".join(parts)


def _refuse(res: NodeResult, node: Node, why: str, unnamed: list[str]) -> None:
    """The node is refused; the fix names the records in the folder that changed it and were not named. It does
    not name the node: alike refusals of many nodes are said once (``render.failure_text``)."""
    res.status = "failed"
    res.message = f"refused: {why}"
    also = (
        f"name the record(s) that changed it too: {' '.join(f'--from {r}' for r in unnamed)} "
        "(in the notebook: rollback.records)"
        if unnamed
        else "name the record that changed it (runbook rollback --from RECORD; in the notebook: rollback.records)"
    )
    res.checks.append(
        Check(
            "rollback evidence",
            False,
            res.message,
            fix=f"{also}, or leave it out of the parameters' nodes and put it back by hand",
        )
    )


def layer_goes(kube: gpu_operator_handover.Leftovers | None, result: StepResult, evidence: Evidence) -> bool:
    """Whether the device plugin the records' runs created is gone after this rollback: it removes it (``kube``),
    or it was read and is gone already (``data["kubernetes"] == []``: a rollback interrupted after removing it,
    run again). Only a layer the runbook created counts: a run that upgraded a site's release created none, and
    that plugin still serves the nodes that stay (review of 7 Dec 2026)."""
    # the release is the device plugin: a RuntimeClass the run created, removed alone, leaves a site's plugin
    # (review of 7 Dec 2026)
    return (kube is not None or result.data.get("kubernetes") == []) and bool(evidence.releases())


#: What removing the GPU Operator's release leaves, which no record lists (operator walkthrough, stop 54: the rollback
#: said only "namespace gpu-operator created" while the CRD and the GPU labels stayed). helm never deletes a chart's
#: crds/ (helm docs, "Custom Resource Definitions"), and the chart's CRD cleanup hook is off by default
#: (NVIDIA/gpu-operator v26.3.3 deployments/gpu-operator/values.yaml operator.cleanupCRD: false, as
#: runbook_lib/sim/chartsrc/gpu-operator/Chart.yaml notes); GPU Feature Discovery's and Node Feature Discovery's
#: node labels are not removed when their pods go.
OPERATOR_LEFTOVERS = (
    "the GPU Operator's CRDs (clusterpolicies.nvidia.com, nvidiadrivers.nvidia.com): helm uninstall leaves a chart's "
    "CRDs and the chart's cleanup hook is off by default; once no other release uses them: "
    "kubectl delete crd clusterpolicies.nvidia.com nvidiadrivers.nvidia.com",
    "the labels GPU Feature Discovery and Node Feature Discovery put on the GPU nodes (nvidia.com/gpu.*, "
    "nvidia.com/cuda.*, nvidia.com/gfd.*, feature.node.kubernetes.io/*): a workload that selects them lands on "
    "nodes without the NVIDIA driver; see them with kubectl get node <node> --show-labels and remove each with "
    "kubectl label node <node> <label>-",
)


def _not_undone(
    result: StepResult, evidence: Evidence, back: set[str], *, layer_goes: bool, operator_goes: bool = False
) -> None:
    """What the records show changed that the rollback leaves, for a person: the node labels as the ``kubectl``
    commands that put them back, on every labelled node when this rollback removes the Kubernetes layer, else only
    on the nodes that go back (review of 6 Dec 2026: removing the label from the nodes that keep their GPUs would take the
    device plugin off them, since the chart schedules only where it is set)."""
    labels = []
    for record, items in evidence.labelled:
        labels += [f"{record}: {line}" for line in label_undo(items, None if layer_goes else back)]
    left = [*labels, *evidence.not_undone, *(OPERATOR_LEFTOVERS if operator_goes else ())]
    if left:
        result.data["not_undone"] = left
        result.notes += [f"{NOT_UNDONE_NOTE}{item}" for item in left]


def _keeping_nvidia(
    ctx: Context, nodes: list[Node], todo: list[NodeRollback], evidence: Evidence
) -> list[str]:
    """The GPU nodes an earlier, unnamed run changed (``Evidence.continued``) that stay on the NVIDIA image after
    this rollback, or whose extensions cannot be read: they still need the device plugin.

    Why: the layer went whenever every GPU node was in the rollback's scope, also when a node another run had
    upgraded stayed on the NVIDIA image, which then lost its device plugin and RuntimeClass (operator
    walkthrough, 6 Dec 2026: a run, its fix run and a resume, rolled back from the resume's record alone). A
    node on the NVIDIA image that no run changed was found so: without the layer is where it was found."""
    going = {plan.node.address for plan in todo if plan.image}
    staying = [n for n in nodes if n.address not in going and evidence.continued.get(n.name)]
    if not staying:
        return []
    # the extensions alone (one fan-out call): the release a node runs does not decide it
    fan = ctx.talosctl.get("extensions", [n.address for n in staying])
    found = fan.by_node()
    return [
        n.name
        for n in staying
        if n.address in fan.errors
        or runs_nvidia_image(extension_versions(extensions_from_resources(found.get(n.address, []))))
    ]


def _kubernetes_plan(
    ctx: Context, result: StepResult, evidence: Evidence, *, whole_cluster: bool, keeping: list[str]
) -> gpu_operator_handover.Leftovers | None:
    """The releases and RuntimeClass the records say the runbook created and that still exist; none while a
    GPU node keeps the NVIDIA image (``keeping``). ``result.data["kubernetes"]`` is the commands, set only when
    the layer goes: ``[]`` when it was read and is gone already (a rollback interrupted after removing it)."""
    if not evidence.kubernetes and not evidence.kubernetes_missing:
        return None
    if not whole_cluster:
        result.notes.append("the Kubernetes layer is kept: only some GPU nodes go back")
        return None
    if keeping:
        result.notes.append(
            f"the Kubernetes layer is kept: {shortened(keeping)} (changed by an earlier run that is not named) "
            "stay on the NVIDIA image after this rollback, or their extensions could not be read, and need the "
            "device plugin; name that run's record too (see the note on it)"
        )
        return None
    if evidence.kubernetes_missing:
        result.checks.append(
            Check(
                "Kubernetes layer",
                False,
                "; ".join(evidence.kubernetes_missing),
                fix=kubernetes_by_hand(ctx),
            )
        )
        return None
    try:
        releases = tuple(r for r in evidence.releases() if ctx.helm.release(*r) is not None)
        runtime_class = (
            evidence.runtime_class()
            and ctx.kube.runtime_class(gpu_operator_handover.RUNTIME_CLASS) is not None
        )
    except (
        RunbookError
    ) as exc:  # the layer to remove cannot be read: nothing is rolled back, the plan says why
        result.checks.append(
            Check("Kubernetes layer", False, f"could not read it: {exc.message}", fix=exc.hint or "")
        )
        return None
    found = gpu_operator_handover.Leftovers(releases, runtime_class)
    commands = _own_commands(ctx, found)
    result.data["kubernetes"] = commands
    if commands:
        result.data["planned"] = True
        if not result.applied:  # as the forward plan lists its Kubernetes changes: each a "would:" line
            first = "(first: the Kubernetes layer the runbook created)"
            result.data["changes"] = [f"{c} {first}" for c in commands]
    return found if commands else None


def _dry_run(ctx: Context, todo: list[NodeRollback], results: dict[str, NodeResult]) -> None:
    """Each removal patch dry-run on its node: Talos refuses a delete whose target is not there."""
    jobs = [(plan, phase) for plan in todo for phase in PHASES if plan.patches[phase]]
    runs = ctx.talosctl.patch_machineconfigs(
        [(plan.patches[phase], [plan.node.address]) for plan, phase in jobs], dry_run=True
    )
    for (plan, phase), run in zip(jobs, runs, strict=True):
        if run.ok and "with a reboot" in run.details_of(plan.node.address):
            plan.reboots.add(phase)
        if not run.ok:
            res = results[plan.node.address]
            res.status = "failed"
            res.message = "dry run of the removal patch refused: " + run.failure_text
            res.checks.append(Check("removal patch dry run", False, res.message))
    for plan in todo:  # the plan now knows which removal reboots its node, and says it drains it
        results[plan.node.address].diff = plan.describe(ctx)


# -- applying ------------------------------------------------------------------------------------------------


def _own_commands(ctx: Context, found: gpu_operator_handover.Leftovers) -> list[str]:
    """The layer's removal as the rollback runs it, with the run's helm, kubectl and kubeconfig, as its talosctl
    lines have their talosconfig: the plan and summary printed a bare ``helm uninstall …``, which pasted acts on
    the shell's default context, perhaps another cluster (operator walkthrough, stop 52)."""
    helm = fixes.helm_as_run(ctx.endpoints.helm, ctx.endpoints.kubeconfig)
    kubectl = fixes.kubectl_as_run(ctx.endpoints.kubectl, ctx.endpoints.kubeconfig)
    return [helm(kubectl(c)) for c in found.commands(ctx.params.timeouts.kubernetes_seconds)]


def _remove_kubernetes(ctx: Context, result: StepResult, found: gpu_operator_handover.Leftovers) -> bool:
    try:
        gpu_operator_handover.remove(
            ctx, result, found, dry_run=False, timeout_s=float(ctx.params.timeouts.kubernetes_seconds)
        )
    except RunbookError as exc:
        result.checks.append(Check("Kubernetes layer removed", False, exc.message, fix=exc.hint or ""))
        return False
    result.data["changed"] = True
    ran = _own_commands(ctx, found)
    result.checks.append(Check("Kubernetes layer removed", True, "ran: " + "; ".join(ran)))
    return True


def _roll_out(
    ctx: Context,
    schedule: Schedule,
    todo: list[NodeRollback],
    results: dict[str, NodeResult],
    progress: Progress | None,
    *,
    timeout: float,
    interval: float,
    log: list[dict[str, Any]],
) -> None:
    """The schedule's batches until the failure budget is used up; later batches are left untouched.  Each
    batch run goes to ``log`` (``patch.log_batch``: the record's front page draws the batches)."""
    failed = done = 0
    for index, batch in enumerate(schedule.batches(todo)):
        if schedule.exhausted(failed):
            for plan in batch:
                _untouched(
                    results[plan.node.address],
                    f"not touched: the rollout stopped after {failed} failed node(s)",
                )
            continue
        pause_before(schedule, index)
        started = time.time()
        failed += _run_batch(ctx, batch, results, timeout=timeout, interval=interval)
        log_batch(
            log, index, schedule, [results[plan.node.address] for plan in batch], started, events=ctx.events
        )
        done += len(batch)
        if progress:
            progress(done, len(todo))


def _run_batch(
    ctx: Context,
    batch: list[NodeRollback],
    results: dict[str, NodeResult],
    *,
    timeout: float,
    interval: float,
) -> int:
    """One batch: config before the image, the image, then the modules patch; returns the failed count."""
    going = _patch(ctx, batch, results, "before-image", timeout=timeout)
    going = _images(ctx, going, results, timeout=timeout, interval=interval)
    going = _patch(ctx, going, results, "after-image", timeout=timeout)
    _confirm_configs(ctx, going, results)
    return sum(results[p.node.address].status == "failed" for p in batch)


def _fail(res: NodeResult, message: str) -> None:
    res.status = "failed"
    res.message = message


def _patch(
    ctx: Context, plans: list[NodeRollback], results: dict[str, NodeResult], phase: Phase, *, timeout: float
) -> list[NodeRollback]:
    """Apply ``phase``'s removal patch on the nodes that have one; returns the nodes still going."""
    jobs = [p for p in plans if p.patches[phase]]
    if not jobs:
        return plans
    # The removal is applied without a dry run, so which node reboots is known only after it: every node's
    # boot ID is read before. A node whose boot ID cannot be read is not patched (as config-patch's
    # ``_boots_before``): were it to reboot, its reboot could not be told from its answers before it, and its
    # image upgrade would start while it is down.
    boots, unread = boot_ids(ctx, [p.node.address for p in jobs])
    for plan in jobs:
        if plan.node.address in unread:
            _fail(
                results[plan.node.address],
                f"removal patch not applied: its boot ID could not be read ({redact(unread[plan.node.address])});"
                " the patch may reboot the node, and the rollback must see it come back before its next change",
            )
    jobs = [p for p in jobs if p.node.address not in unread]
    drained = drain(ctx, [p.node.name for p in jobs if phase in p.reboots])
    for plan in jobs:
        if plan.node.name in drained.failed:
            why = drained.failed[plan.node.name]
            _fail(results[plan.node.address], f"removal patch not applied: it reboots the node, and {why}")
    jobs = [p for p in jobs if p.node.name not in drained.failed]
    runs = ctx.talosctl.patch_machineconfigs(
        [(p.patches[phase], [p.node.address]) for p in jobs], dry_run=False
    )
    rebooting: dict[str, str | None] = {}
    for plan, run in zip(jobs, runs, strict=True):
        if not run.ok:
            kept = " (the modules patch is kept)" if phase == "before-image" else ""
            _fail(results[plan.node.address], f"removal patch failed{kept}: {redact(run.failure_text)}")
        elif "with a reboot" in run.details_of(plan.node.address):
            rebooting[plan.node.address] = boots.get(plan.node.address)
    down = wait_for_reboots(ctx, rebooting, timeout)
    for address, why in down.items():
        _fail(results[address], f"patched, but {why}")
    _lift(ctx, jobs, drained.cordoned, results, rebooting=rebooting, down=down, timeout=timeout)
    return [p for p in plans if results[p.node.address].status != "failed"]


def _lift(
    ctx: Context,
    jobs: list[NodeRollback],
    cordoned: list[str],
    results: dict[str, NodeResult],
    *,
    rebooting: dict[str, str | None],
    down: dict[str, str],
    timeout: float,
) -> None:
    """The drained nodes' cordons lifted (``drains.lift``); one that stays cordoned fails, saying so: the image
    step after it would upgrade a node the scheduler avoids."""
    names = {p.node.address: p.node.name for p in jobs}
    by_name = {p.node.name: results[p.node.address] for p in jobs}
    rebooted = {names[a]: boot for a, boot in rebooting.items() if a not in down}
    gone = {names[a] for a, why in down.items() if why != NOT_REBOOTED}
    left = lift(ctx, cordoned, rebooted=rebooted, down=gone, timeout=timeout)
    for name, why in left.items():
        res = by_name[name]
        said = res.message if res.status == "failed" else "removal patch applied"
        _fail(res, said + stays_cordoned(name, why))


def _images(
    ctx: Context,
    plans: list[NodeRollback],
    results: dict[str, NodeResult],
    *,
    timeout: float,
    interval: float,
) -> list[NodeRollback]:
    """Upgrade the nodes to the installer they were found on, concurrently, and wait until each reports it."""
    moving = [p for p in plans if p.image]
    if moving:

        def upgrade(plan: NodeRollback) -> str | None:
            run = ctx.talosctl.upgrade(
                plan.node.address,
                plan.image or "",
                preserve=plan.preserve,
                legacy=plan.legacy,
                drains=plan.drains,
                timeout=float(ctx.params.timeouts.upgrade_seconds),
            )
            return None if run.ok else (run.stderr.strip() or f"talosctl upgrade exited {run.exit_code}")

        errors = concurrently(upgrade, moving, MAX_PARALLEL_UPGRADES)
        for plan, error in zip(moving, errors, strict=True):
            if error:
                _fail(
                    results[plan.node.address], f"talosctl upgrade failed, the modules patch is kept: {error}"
                )
        _wait_for_found(
            ctx, [p for p, e in zip(moving, errors, strict=True) if not e], results, timeout, interval
        )
    return [p for p in plans if results[p.node.address].status != "failed"]


def _back(plan: NodeRollback, state: NodeState) -> bool:
    found = plan.evidence.image
    return (
        found is not None
        and not state.error
        and state.version == found.version
        and state.schematic_id == found.schematic_id
        and not runs_nvidia_image(state.extensions)
    )


def _wait_for_found(
    ctx: Context,
    plans: Sequence[NodeRollback],
    results: dict[str, NodeResult],
    timeout: float,
    interval: float,
) -> None:
    """Poll until each node answers on the version and schematic it was found on, without NVIDIA modules."""
    deadline = time.monotonic() + timeout
    pending = list(plans)
    while pending:
        states = read_states(ctx, [p.node.address for p in pending])
        pending = [p for p in pending if not _back(p, states[p.node.address])]
        if not pending or time.monotonic() >= deadline:
            break
        time.sleep(interval)
    for plan in pending:
        _fail(
            results[plan.node.address],
            "after the upgrade the node is not on the image it was found on; the modules patch is kept",
        )


def _confirm_configs(ctx: Context, plans: list[NodeRollback], results: dict[str, NodeResult]) -> None:
    """Re-read the configs: nothing the runbook added may be left; then the node counts as rolled back."""
    if not plans:
        return
    configs, errors = read_configs(ctx, [p.node for p in plans])
    for plan in plans:
        res = results[plan.node.address]
        config = configs.get(plan.node.address)
        left = (
            [
                removal_documents(
                    plan.evidence.added_documents(), config, plan.evidence.sysctls_before, phase
                )
                for phase in PHASES
            ]
            if config is not None
            else [[{"unreadable": errors.get(plan.node.address, "no answer")}]]
        )
        if any(left):
            _fail(res, "the node's config still holds part of the runbook's patch")
            continue
        res.status = "changed"
        res.checks.append(Check("back where the runbook found it", True, res.message))


def _untouched(res: NodeResult, message: str) -> None:
    res.status = "skipped"
    res.message = message
