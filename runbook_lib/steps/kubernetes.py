"""Step: the Kubernetes layer — RuntimeClass ``nvidia`` and the device plugin, or the GPU Operator.

Why each piece: the toolkit extension registers a containerd handler named ``nvidia``, but pods reach it
only through a RuntimeClass; the device plugin makes GPUs schedulable (``nvidia.com/gpu``) and must itself
run with that runtime; Talos enforces Pod Security ``baseline`` outside ``kube-system``, and the chart's
hostPath volumes need a privileged namespace; chart ≥0.15 schedules only onto labelled nodes (facts §4).
From Talos 1.13 the docs use the GPU Operator instead, with its driver and toolkit disabled.

Idempotent by comparison: what already matches is left alone, so a second run changes nothing.  With
apply off, writes go to the API server's dry run and helm's ``--dry-run``.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable, Collection
from typing import Any

from runbook_lib.clients.helm import Release
from runbook_lib.errors import Forbidden, PermanentError, RunbookError
from runbook_lib.model.profiles import GPU_OPERATOR_CHART_MINIMUM, GPU_OPERATOR_VALUES
from runbook_lib.model.text import shortened
from runbook_lib.model.versions import chart_is_newer, gpu_operator_too_old, is_chart_version

from . import dryrun, gpu_operator_handover, kube_diagnosis, operator_runtime_class, plugin_rollout
from .context import Context, wait_seconds
from .results import Check, NodeResult, StepResult

GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRESENT_LABEL = {"nvidia.com/gpu.present": "true"}
PRIVILEGED = {"pod-security.kubernetes.io/enforce": "privileged"}
RUNTIME_CLASS = "nvidia"


def allocatable_gpus(node: dict[str, Any]) -> int:
    return _gpu_count((node.get("status") or {}).get("allocatable"))


def _gpu_count(resources: dict[str, Any] | None) -> int:
    """``nvidia.com/gpu`` in a Node's capacity or allocatable (0 when absent or not a count)."""
    try:
        return int(str((resources or {}).get(GPU_RESOURCE, "0")))
    except ValueError:
        return 0


def kubernetes_layer(
    ctx: Context, *, apply: bool | None = None, timeout_s: float | None = None, only: list[str] | None = None
) -> StepResult:
    timeout_s = wait_seconds(timeout_s, ctx.params.timeouts.kubernetes_seconds, "timeout_s")
    do_apply = ctx.apply if apply is None else apply
    dry_run = not do_apply
    plan = ctx.plan
    release = plan.helm
    result = StepResult(step="kubernetes", applied=do_apply)
    result.data["layer"] = plan.kubernetes_layer
    if do_apply:  # what this run creates, for the rollback step (model/rollback.py): only that is removed
        result.data["created"] = []
    changed: list[str] = []
    try:
        _chart_repository(ctx)  # before any change: a repository helm cannot read stops the step here
        version = _planned_version(ctx)  # before any change: a range resolved as helm will, or none met
        releases = _read_releases(ctx, result, dry_run=dry_run)  # one helm list -A for both uses below
        # before any change: another release of the chart, or a newer one
        current = None if releases is None else _existing_release(ctx, releases, version)
        # the namespace before the hand-over: a site that refuses it (RBAC, an admission policy) must not
        # find its device plugin already removed and no GPU Operator to replace it
        # the device plugin's RuntimeClass, deleted (or planned so) for the GPU Operator's own
        replaced = False
        if plan.kubernetes_layer == "gpu-operator":
            _privileged_namespace(ctx, result, changed, dry_run=dry_run)
            # releases unread (a plan only): the RuntimeClass half of the hand-over is still planned (review)
            replaced = _retire_device_plugin(
                ctx, releases or [], result, changed, dry_run=dry_run, timeout_s=timeout_s
            )
        _runtime_class(ctx, result, changed, dry_run=dry_run, replaced=replaced)
        if not result.ok:
            result.notes.append("stopped before the Helm release: fix the RuntimeClass first")
            return result.finish()
        if release.privileged_namespace and plan.kubernetes_layer != "gpu-operator":
            _privileged_namespace(ctx, result, changed, dry_run=dry_run)
        gpu_nodes = ctx.nodes(only)
        if plan.kubernetes_layer == "device-plugin" and ctx.params.device_plugin.label_nodes:
            _label_nodes(ctx, gpu_nodes, result, changed, dry_run=dry_run)
        if releases is None:
            _unread_release(ctx, version, result, changed)
        else:
            _helm_release(ctx, current, version, result, changed, dry_run=dry_run, timeout_s=timeout_s)
    except RunbookError as exc:
        result.checks.append(Check("kubernetes layer", False, exc.message, fix=exc.hint or ""))
        result.data["changes"] = changed  # what was changed before the error, for the record
        return result.finish()
    result.data["changes"] = changed
    result.data["changed" if do_apply and changed else ("planned" if changed else "unchanged")] = True
    if dry_run:
        result.notes.append(
            "plan only (apply is off): writes went to the API server's dry run / helm --dry-run"
        )
        refused = dryrun.note(result)
        if refused:
            result.notes.append(refused)
    if do_apply and not _helm_ran_ok(ctx, result):
        result.notes.append(
            "not waited for the device plugin nor the GPUs: helm failed (above), so there is nothing to wait for; "
            "fix that and run this step again"
        )
        return result.finish()
    try:
        _wait_after_changes(ctx, result, only, timeout_s=timeout_s, do_apply=do_apply)
    except RunbookError as exc:
        # Changes were made: an error here must not lose the result that lists them (rollback reads it).
        result.checks.append(Check("kubernetes layer", False, exc.message, fix=exc.hint or ""))
    return result.finish()


def _helm_ran_ok(ctx: Context, result: StepResult) -> bool:
    """False when the step's helm failed. Why: the step then waited its whole timeout for a device plugin helm
    had not deployed, and blamed each node (its labels) for the missing DaemonSet (operator walkthrough, 6 Dec
    2026: a DaemonSet patch the chart's upgrade needed was refused by RBAC)."""
    return all(c.ok for c in result.checks if c.name == f"helm release {ctx.plan.helm.release}")


def _wait_after_changes(
    ctx: Context, result: StepResult, only: list[str] | None, *, timeout_s: float, do_apply: bool
) -> None:
    """The device plugin's DaemonSet rolled out, every GPU node advertising ``nvidia.com/gpu``, and on the GPU
    Operator layer its RuntimeClass, within ``timeout_s`` together."""
    deadline = time.monotonic() + timeout_s
    rollout = None
    watched = _plugin_to_watch(ctx) if do_apply else None
    if watched is not None:
        # before the GPUs: a node may advertise them from the previous plugin (plugin_rollout)
        namespace, name, image = watched
        rollout = plugin_rollout.wait(ctx, namespace, name, timeout_s=timeout_s, image=image)
    left = max(0.0, deadline - time.monotonic())
    _wait_for_gpus(
        ctx,
        result,
        ctx.nodes(only),
        timeout_s=left if do_apply else 0.0,
        waited_s=timeout_s,
        hopeless=rollout.unpullable if rollout is not None else (),
    )
    if rollout is not None:
        # judged as it is now, after the GPU wait: the watch can end before the pods are ready (a DaemonSet
        # whose first status counts no node as due a pod is done, 0 of 0), and its pods become ready meanwhile
        now = plugin_rollout.again(ctx, rollout)
        if now is None:
            result.checks.append(
                Check(
                    f"DaemonSet {rollout.name}",
                    False,
                    f"DaemonSet {rollout.name} in namespace {rollout.namespace} was deleted during the step's wait",
                    fix=f"helm status {ctx.plan.helm.release} -n {ctx.plan.helm.namespace}  # then re-run this step",
                )
            )
        else:
            _judge_rollout(result, now)
    if do_apply and ctx.plan.kubernetes_layer == "gpu-operator":
        # Advertised GPUs do not show it (issue 15): wait for it in what is left of the same timeout.
        left = max(0.0, deadline - time.monotonic())
        result.checks.append(operator_runtime_class.wait(ctx, timeout_s=left, waited_s=timeout_s))


def _plugin_to_watch(ctx: Context) -> tuple[str, str, str | None] | None:
    """(namespace, name, image it must carry) of the device plugin's DaemonSet to wait for; ``None`` on the GPU
    Operator layer when its ClusterPolicy disables the device plugin (``devicePlugin.enabled: false``: the
    operator then creates no DaemonSet, and a site runs its own).

    Why an image on the GPU Operator layer: helm changes the ClusterPolicy, and the operator rewrites its
    DaemonSet only when it next reconciles; until then the DaemonSet is the previous spec's, fully rolled out,
    and nothing in the ClusterPolicy's status says it has reconciled (gpu-operator@v26.3.1 api/nvidia/v1/
    clusterpolicy_types.go:2012-2020: a state and conditions, no observed generation). The image is what a
    chart upgrade changes."""
    if ctx.plan.kubernetes_layer != "gpu-operator":
        return (*_release_daemonset(ctx), None)
    policies = ctx.kube.cluster_objects(*operator_runtime_class.CLUSTER_POLICY)
    policy = policies[0] if policies else None
    if (((policy or {}).get("spec") or {}).get("devicePlugin") or {}).get("enabled") is False:
        return None
    image = None if policy is None else plugin_rollout.operator_image(policy)
    return ctx.plan.helm.namespace, _plugin_daemonset(ctx), image


def _judge_rollout(result: StepResult, rollout: plugin_rollout.Rollout) -> None:
    """A GPU node that advertises GPUs but whose device-plugin pod is not the current revision's, ready, fails
    with why: its GPUs may come from the previous plugin. A node without GPUs already failed with the diagnosis
    of its plugin pod (``_no_gpu_diagnosis``), which says the same. On the GPU Operator layer a DaemonSet the
    operator has not rewritten yet fails the step's check: its nodes run the previous device plugin."""
    if rollout.stale():
        result.checks.append(_stale_check(rollout))
    held = [n for n in rollout.held_by_down if n in rollout.holding()]
    if held and not rollout.done and rollout.holds_others(held):
        result.checks.append(_held_by_down_check(rollout, held))
    elif held and not rollout.done:
        result.notes.append(_stranded_note(rollout, held))
    behind = rollout.behind()
    if not rollout.rolling and rollout.previous():
        result.notes.append(_on_delete_note(rollout))
    for res in result.nodes:
        why = behind.get(res.node)
        if why is None or res.status != "ok":
            continue
        res.checks.append(Check("device plugin rolled out", False, why))
        res.status = "failed"
        res.message = f"{res.message}, but {why}"


def _held_by_down_check(rollout: plugin_rollout.Rollout, held: list[str]) -> Check:
    """The rolling update stopped at nodes that are down: what moves it on without them (``plugin_rollout._Stall``
    says why nothing else does)."""
    pods = [rollout.pods[n]["metadata"]["name"] for n in held]
    forced = f"kubectl delete pod -n {rollout.namespace} {' '.join(pods)} --force --grace-period=0"
    if rollout.tolerates_all:
        # its pods tolerate the not-ready taints, so the DaemonSet would start a pod there again and wait on it
        forced = f"kubectl delete node {' '.join(held)}; the kubelet registers it again when it returns"
    return Check(
        f"DaemonSet {rollout.name} rolled out",
        False,
        f"the rolling update of DaemonSet {rollout.name} stopped at {', '.join(held)}, not Ready: the old device "
        "plugin pod there is deleted only when its kubelet confirms it, and until then the update replaces no "
        "other node's pod",
        cause="the node is down (powered off, cut off, or its kubelet stopped)",
        fix="bring the node back; or, once you know it is down for good, take it out of the update "
        f"({forced}) and run this step again: the update goes on without the node, and the node gets the new "
        "plugin when it returns",
    )


def _stranded_note(rollout: plugin_rollout.Rollout, held: list[str]) -> str:
    """New pods on nodes that went down after the DaemonSet placed them, which no other node waits on (a first
    install): the controller keeps counting such a node, as on a taint it resyncs a DaemonSet only when a pod must
    be created or removed (kubernetes@v1.35.0 pkg/controller/daemon/daemon_controller.go:1466) and its pods
    tolerate the NoExecute not-ready/unreachable taints (util/daemonset_util.go:48-67), so the rollout never
    ends. The node fails on its own (node Ready). Before, this was the upgrade's check, blaming an old pod that
    did not exist (found by an operator walkthrough; root cause by a helper's reproduction)."""
    pods = [rollout.pods[n]["metadata"]["name"] for n in held]
    return (
        f"DaemonSet {rollout.name} placed its pod {', '.join(pods)} on {', '.join(held)} before the node went "
        "down: the pod never started and the DaemonSet controller keeps counting the node, so `kubectl rollout "
        "status` does not finish (no other node waits on it). Once the node is known down for good: kubectl "
        f"delete pod -n {rollout.namespace} {' '.join(pods)} --force --grace-period=0 (the controller then leaves "
        "the tainted node out; it gets a pod when it is Ready again)"
    )


def _stale_check(rollout: plugin_rollout.Rollout) -> Check:
    now = ", ".join(rollout.images) or "no container"
    return Check(
        f"DaemonSet {rollout.name} runs the ClusterPolicy's device plugin",
        False,
        f"the GPU Operator has not written {rollout.wanted_image} into DaemonSet {rollout.name} (it runs {now}): "
        "every GPU node still runs the previous device plugin",
        cause="the operator has not reconciled the ClusterPolicy since helm changed it",
        fix=f"kubectl -n {rollout.namespace} logs {operator_runtime_class.OPERATOR_DEPLOYMENT}  # then re-run "
        "this step",
    )


def _on_delete_note(rollout: plugin_rollout.Rollout) -> str:
    """What a site that chose ``updateStrategy: OnDelete`` must do for its nodes to run the new plugin."""
    nodes = rollout.previous()
    shown = ", ".join(nodes[:5]) + (f" and {len(nodes) - 5} more" if len(nodes) > 5 else "")
    return (
        f"DaemonSet {rollout.name} replaces its pods only when they are deleted (updateStrategy OnDelete: the "
        "release's values, or the ClusterPolicy's daemonsets.updateStrategy on the GPU Operator layer): "
        f"{shown} still run the previous device plugin; delete each node's plugin pod "
        f"when it may restart (kubectl delete pod -n {rollout.namespace} -l {rollout.selector} --field-selector "
        "spec.nodeName=<node>), then run this step again to check them"
    )


def _runtime_class(
    ctx: Context, result: StepResult, changed: list[str], *, dry_run: bool, replaced: bool = False
) -> None:
    """RuntimeClass ``nvidia`` created, or checked when it exists. ``replaced``: the step deletes (a plan: would
    delete) the device plugin's class for the GPU Operator's; a plan then still reads the old one, and said
    "exists with handler 'nvidia'" of the class that applying deletes (found by an operator walkthrough)."""
    if replaced:
        said = "the device plugin's is deleted first; the GPU Operator chart creates its own"
        result.checks.append(Check("RuntimeClass nvidia", True, said))
        return
    existing = ctx.kube.runtime_class(RUNTIME_CLASS)
    if existing is not None:
        handler = existing.get("handler")
        ok = handler == RUNTIME_CLASS
        result.checks.append(
            Check(
                "RuntimeClass nvidia",
                ok,
                f"exists with handler {handler!r}",
                fix=""
                if ok
                else "kubectl delete runtimeclass nvidia  # then re-run this step to recreate it",
                cause="" if ok else "pods would run with a containerd handler the toolkit does not register",
            )
        )
        return
    if ctx.plan.kubernetes_layer == "gpu-operator":
        result.checks.append(Check("RuntimeClass nvidia", True, "will be created by the GPU Operator chart"))
        return
    try:
        ctx.kube.create_runtime_class(RUNTIME_CLASS, RUNTIME_CLASS, dry_run=dry_run)
        refused = ""
    except Forbidden as exc:
        refused = dryrun.refused_in_plan(result, exc, dry_run=dry_run)
    changed.append("RuntimeClass nvidia (handler nvidia)")
    if not dry_run:
        result.data["created"].append({"kind": "RuntimeClass", "name": RUNTIME_CLASS})
    said = "created" if not dry_run else "would be created" + refused
    result.checks.append(Check("RuntimeClass nvidia", True, said, fix=dryrun.fix(refused)))


def _privileged_namespace(ctx: Context, result: StepResult, changed: list[str], *, dry_run: bool) -> None:
    """The release's namespace, created or labelled to enforce the privileged Pod Security level."""
    namespace = ctx.plan.helm.namespace
    try:
        state, refused = ctx.kube.ensure_namespace(namespace, PRIVILEGED, dry_run=dry_run), ""
    except Forbidden as exc:
        refused = dryrun.refused_in_plan(result, exc, dry_run=dry_run)  # raised again when applying
        # ensure_namespace writes only when a change is due: created when it is not there, else labelled
        state = "created" if ctx.kube.namespace(namespace) is None else "labelled"
    if state != "ok":
        changed.append(f"namespace {namespace} {state} (enforce=privileged)")
    said = f"would be {state}{refused}" if dry_run and state != "ok" else state  # a plan did not create it
    result.checks.append(
        Check(f"namespace {namespace} allows privileged pods", True, said, fix=dryrun.fix(refused))
    )


def _retire_device_plugin(
    ctx: Context,
    releases: list[Release],
    result: StepResult,
    changed: list[str],
    *,
    dry_run: bool,
    timeout_s: float,
) -> bool:
    """Before the GPU Operator: remove the device-plugin releases and a RuntimeClass ``nvidia`` not the chart's;
    True when that RuntimeClass is among them.

    Why, and the sources: ``gpu_operator_handover`` (the image step does the same before a node reaches
    Talos 1.13; this catches what is left, e.g. nodes upgraded without the runbook). A plan only lists what
    would be removed.
    """
    found = gpu_operator_handover.leftovers(ctx, releases)
    refused = gpu_operator_handover.remove(ctx, result, found, dry_run=dry_run, timeout_s=timeout_s)
    for name, namespace in found.releases:
        what = f"helm uninstall {name} -n {namespace}"
        changed.append(what + " (the GPU Operator brings its own device plugin)")
        result.checks.append(Check(f"device-plugin release {name} removed", True, _did(what, dry_run)))
    if found.runtime_class:
        what = f"delete RuntimeClass {RUNTIME_CLASS} (the GPU Operator creates its own)"
        changed.append(what)
        result.checks.append(
            Check(
                f"RuntimeClass {RUNTIME_CLASS} handed to the GPU Operator",
                True,
                _did(what, dry_run) + refused,
                fix=dryrun.fix(refused),
            )
        )
    return found.runtime_class


def _did(what: str, dry_run: bool) -> str:
    return ("would run: " if dry_run else "ran: ") + what


def _label_nodes(
    ctx: Context, gpu_nodes: list[Any], result: StepResult, changed: list[str], *, dry_run: bool
) -> None:
    """Label the GPU nodes that lack the label, concurrently (issue 16: one call at a time took 24 s for
    1,000 nodes); ``changed`` lists the labelled nodes in the API's node order, also when one call fails.

    ``data.labelled`` keeps each labelled node's value before (None: it had no such label), so the rollback can
    say the exact command that puts it back (found by an operator walkthrough: it listed the label it added)."""
    names = {n.name for n in gpu_nodes}
    key, value = next(iter(GPU_PRESENT_LABEL.items()))
    before = {
        node["metadata"]["name"]: (node["metadata"].get("labels") or {}).get(key)
        for node in ctx.kube.nodes()
        if node["metadata"]["name"] in names
    }
    todo = [name for name, current in before.items() if current != value]
    done: set[str] = set()

    def label(name: str) -> None:
        ctx.kube.label_node(name, GPU_PRESENT_LABEL, dry_run=dry_run)
        done.add(name)

    try:
        ctx.kube.each(label, todo)
    except Forbidden as exc:
        said = dryrun.refused_in_plan(result, exc, dry_run=dry_run, writes=len(todo))
        done.update(todo)  # planned all the same: what applying would label
        result.checks.append(
            Check(
                f"label {key}={value}", True, f"would label {len(todo)} node(s){said}", fix=dryrun.fix(said)
            )
        )
    finally:
        changed.extend(f"label node {name} {key}={value}" for name in todo if name in done)
        if not dry_run:
            labelled = [{"node": name, "label": key, "before": before[name]} for name in todo if name in done]
            result.data["labelled"] = labelled


def _chart_repository(ctx: Context) -> None:
    """``helm repo add`` + ``helm repo update`` of the release's repository, first: a mirror URL that is wrong
    or unreachable (the parameter an air-gapped site sets) fails the step before it changes anything, naming
    the parameter, where it used to retire releases or create RuntimeClass ``nvidia`` and then stop half-way.
    Only helm's local repository list changes here: an entry of the same name with the planned URL is used as it
    is; one with another URL is replaced only when it holds nothing but its URL (the runbook's own entry from a
    run with another mirror), else the step stops naming both URLs and what replacing it would erase."""
    release = ctx.plan.helm
    section = _section(ctx)
    entry = ctx.helm.repository_entry(release.repo_name)
    known = None if entry is None else str(entry.get("url", "")).rstrip("/")
    if known is not None and known != release.repo_url.rstrip("/") and _kept_settings(entry):
        # The user's own entry, with what reading it needs: never overwritten, never silently used.
        raise PermanentError(
            f"{section}.repo_url {release.repo_url}: this machine's helm already has a repository named "
            f"{release.repo_name!r} at {known}, with {', '.join(_kept_settings(entry))} that replacing it "
            "would erase; nothing was changed",
            hint=f"set {section}.repo_url: {known} to install from it, or remove the entry first "
            f"(helm repo remove {release.repo_name}) to use {release.repo_url}",
        )
    try:
        if known != release.repo_url.rstrip("/"):
            ctx.helm.repo_add(release.repo_name, release.repo_url, replace=known is not None)
        ctx.helm.repo_update(release.repo_name)
    except RunbookError as exc:
        raise PermanentError(
            f"{section}.repo_url {release.repo_url}: helm cannot read a chart repository there, so nothing "
            f"was changed: {exc.message}",
            hint=f"set {section}.repo_url to a Helm repository (the folder holding index.yaml) this machine "
            f"reaches, NVIDIA's or your mirror of it; check with: helm repo add {release.repo_name} <url>",
        ) from None


#: What a helm repository entry can hold besides its name and URL (helm@v4.1.4 pkg/repo/v1/chartrepo.go:38-48).
_ENTRY_SETTINGS = (
    ("username", "a username"),
    ("password", "a password"),
    ("certFile", "a client certificate"),
    ("keyFile", "a client key"),
    ("caFile", "a CA file"),
    ("insecure_skip_tls_verify", "insecure_skip_tls_verify"),
    ("pass_credentials_all", "pass_credentials_all"),
)


def _kept_settings(entry: dict[str, object] | None) -> list[str]:
    """The settings of a helm repository entry that ``helm repo add --force-update`` would erase (names only:
    their values are never read into a message)."""
    return [label for key, label in _ENTRY_SETTINGS if entry and entry.get(key)]


def _section(ctx: Context) -> str:
    """The parameters section of the planned chart, for messages that name the parameter to change."""
    return "gpu_operator" if ctx.plan.kubernetes_layer == "gpu-operator" else "device_plugin"


def _planned_version(ctx: Context) -> str:
    """The chart version the step installs: ``chart_version`` itself, or the version helm picks for a range
    (``~0.17``, ``>=26.3.1``). Why resolve a range first: the downgrade refusal and the "already deployed" check
    compare versions, and a range compared as text let helm downgrade a release and upgraded an unchanged one
    on every run. A range nothing meets fails here, naming the parameter, where it used to fail in helm after the
    RuntimeClass and namespace were changed. A GPU Operator older than the Talos docs support is refused here too
    when a range picks it (a pinned one already fails parameter validation)."""
    planned = ctx.plan.helm
    return _new_enough(ctx, planned.version if is_chart_version(planned.version) else _resolved(ctx))


def _new_enough(ctx: Context, version: str) -> str:
    """``version``, or an error when it is a GPU Operator older than the Talos docs support."""
    if ctx.plan.kubernetes_layer != "gpu-operator":
        return version
    too_old = gpu_operator_too_old(version, GPU_OPERATOR_CHART_MINIMUM)
    if too_old:
        raise PermanentError(
            f"gpu_operator.chart_version {ctx.plan.helm.version}: helm would install {too_old}; nothing was changed",
            hint=f"set gpu_operator.chart_version: {GPU_OPERATOR_CHART_MINIMUM} or newer",
        )
    return version


def chart_check(ctx: Context) -> Check:
    """Whether the repository has a chart ``chart_version`` names (pinned or a range), for preflight.

    Why: a typo'd pinned version (``v26.3.33``) passed the plan and preflight and failed only in the Kubernetes
    step's ``helm upgrade``, after the config-patch and image steps had patched and upgraded every GPU node, which
    on a real cluster were left on the NVIDIA image with no GPU Operator (operator walkthrough, stop 54). Only
    helm's local repository list changes here, as in the Kubernetes step (:func:`_chart_repository`)."""
    planned = ctx.plan.helm
    name = "chart"
    try:
        _chart_repository(ctx)
        found = _new_enough(ctx, _resolved(ctx))  # a range that picks one too old, too (review of 671a251)
    except RunbookError as exc:
        return Check(name, False, exc.message, fix=exc.hint or "")
    picked = "" if found == planned.version else f" (helm picks {found})"
    return Check(name, True, f"{planned.repo_url} has {planned.chart} {planned.version}{picked}")


def _resolved(ctx: Context) -> str:
    """The version helm picks for the ``chart_version`` range, or an error naming the parameter."""
    planned = ctx.plan.helm
    section = _section(ctx)
    listing = f"helm search repo {planned.chart} --versions"
    try:
        found = ctx.helm.resolve_version(planned.chart, planned.version)
    except RunbookError as exc:
        raise PermanentError(
            f"{section}.chart_version {planned.version}: helm cannot read it as a version or a range, so "
            f"nothing was changed: {exc.message}",
            hint=f"set {section}.chart_version to a version such as {planned.chart} lists: {listing}",
        ) from None
    if found is None:
        every = ctx.helm.chart_versions(planned.chart)  # only for the message: read when nothing matched
        have = shortened(every) if every else "no versions"
        raise PermanentError(
            f"{section}.chart_version {planned.version}: no {planned.chart} chart in {planned.repo_url} meets "
            f"it (the repository has {have}), so nothing was changed",
            hint=f"set {section}.chart_version to one of them; list them with: {listing}",
        )
    return found


def _read_releases(ctx: Context, result: StepResult, *, dry_run: bool) -> list[Release] | None:
    """``helm list -A``; None in a plan whose kubeconfig's user may not read helm's release records.

    Why: helm keeps each release in Secrets of its namespace (helm@v4.1.4 pkg/storage/driver/secrets.go), and
    the built-in ``view`` ClusterRole, the read-only identity a site hands a reviewer or a CI job that plans,
    grants no Secrets (kubernetes@v1.35.0 plugin/pkg/auth/authorizer/rbac/bootstrappolicy/policy.go, ``view``
    has no ``secrets``): the whole Kubernetes plan failed at ``helm list``. The plan now goes on without the
    releases and says what it could not tell. An apply run raises the refusal: helm could not install either."""
    try:
        return ctx.helm.releases_everywhere()
    except Forbidden as exc:
        if not dry_run:
            raise
        release = ctx.plan.helm
        operator = ctx.plan.kubernetes_layer == "gpu-operator"
        cannot = (
            f"tell whether {release.release} in {release.namespace} is installed, nor see what an apply run "
            "refuses before any change (another release of the chart, one on a newer chart, one a stopped helm "
            "left pending or uninstalling)"
            + (", nor which device-plugin releases it uninstalls first" if operator else "")
        )
        dryrun.releases_unread(
            result, "helm releases", exc, lead="not read", subject="its releases", cannot=cannot
        )
        return None


def _unread_release(ctx: Context, version: str, result: StepResult, changed: list[str]) -> None:
    """The release as a plan that could not read it shows it: the command it would run, not dry-run (helm's
    dry run reads the same Secrets and is refused the same way)."""
    what = _helm_command(ctx, version)
    result.checks.append(
        Check(
            f"helm release {ctx.plan.helm.release}",
            True,
            f"would run: {what} (an install, or an upgrade keeping the release's other values: helm's releases "
            "could not be read; not dry-run by helm, which reads them first)",
        )
    )
    changed.append(what)


def _helm_command(ctx: Context, version: str) -> str:
    """``helm upgrade --install`` as a plan names it, with the values it sets."""
    release = ctx.plan.helm
    what = (
        f"helm upgrade --install {release.release} {release.chart} --version {version} -n {release.namespace}"
    )
    return what + "".join(f" --set {key}={value}" for key, value in release.values.items())


def _existing_release(ctx: Context, releases: list[Release], version: str) -> Release | None:
    """The planned release as installed (``None`` if it is not), after refusing what would go wrong; ``releases``
    is ``helm list -A``'s answer, ``version`` the chart version to install (a range resolved).

    Why ``helm list -A``: NVIDIA installs its charts under other names than the runbook's (``nvdp`` in namespace
    ``nvidia-device-plugin``, NVIDIA/k8s-device-plugin README; ``helm install --generate-name`` for the operator,
    https://nvidia.github.io/gpu-operator), and a second release of the same chart is a second device plugin or
    operator on the same nodes. Why refuse a newer chart: ``helm upgrade --version`` installs exactly the version
    given, so the runbook would downgrade what a site moved forward (the Talos docs ask for GPU Operator v26.3.1
    "or higher"). Both refusals come before the step changes anything and name the parameters that adopt the
    existing release instead."""
    planned = ctx.plan.helm
    chart_name = planned.chart_name
    section = _section(ctx)
    same_chart = [r for r in releases if r.of_chart(chart_name)]
    others = [r for r in same_chart if (r.name, r.namespace) != (planned.release, planned.namespace)]
    if others:
        found = ", ".join(f"{r.name} in namespace {r.namespace} ({r.chart}, {r.status})" for r in others)
        first = others[0]
        removal = f"helm uninstall {first.name} -n {first.namespace}"
        raise PermanentError(
            f"{chart_name} is already installed as release {found}: a second release "
            f"{planned.release} in {planned.namespace} would run the chart twice on the same nodes, so nothing "
            "was changed",
            hint=f"finish its removal: {removal}"
            if first.status == "uninstalling"
            else f"to let the runbook manage it, set {section}.release: {first.name} and {section}.namespace: "
            f"{first.namespace}; or remove it first: {removal}",
        )
    current = same_chart[0] if same_chart else None
    stuck = None if current is None else stuck_release(current)
    if stuck is not None:
        raise stuck
    if current is not None:
        shown = planned.version if planned.version == version else f"{planned.version} ({version})"
        _refuse_downgrade(current, chart_name, version, shown, section)
    return current


def stuck_release(current: Release) -> PermanentError | None:
    """The refusal of a release a stopped helm left ``uninstalling`` or ``pending-*``, which no further
    ``helm upgrade --install`` gets past (preflight asks it too, before the other steps change nodes)."""
    where = f"release {current.name} in {current.namespace}"
    if current.status == "uninstalling":
        return PermanentError(
            f"{where} is uninstalling: a helm uninstall of it was stopped midway (killed, or still running "
            "elsewhere), and helm upgrade --install cannot install it again until the removal ends (helm@v4.1.4 "
            "pkg/action/upgrade.go:250-263, 'has no deployed releases'); nothing was changed",
            hint=f"make sure no helm runs on it (helm history {current.name} -n {current.namespace}), then: helm "
            f"uninstall {current.name} -n {current.namespace}  # it finishes the removal; then run this step again",
        )
    if current.status.startswith("pending-"):
        return PermanentError(
            f"{where} is {current.status}: a helm operation on it was stopped midway (killed, or still running "
            "elsewhere) and helm refuses any other until it is cleared (helm@v4.1.4 pkg/action/upgrade.go:241-243, "
            "'another operation (install/upgrade/rollback) is in progress'); nothing was changed",
            hint=_pending_fix(current),
        )
    return None


def _pending_fix(release: Release) -> str:
    """How to clear a release a stopped helm left pending: back to its last revision, or gone if it has none."""
    where = f"{release.name} -n {release.namespace}"
    first = "helm uninstall" if release.status == "pending-install" else "helm rollback"
    return f"make sure no helm runs on it (helm history {where}), then: {first} {where}; then run this step again"


def _refuse_downgrade(current: Release, chart_name: str, version: str, shown: str, section: str) -> None:
    """Refuse when the release runs a newer chart than ``version`` (``shown`` is how the parameter reads)."""
    installed = current.chart_version(chart_name)
    newer = chart_is_newer(installed, version)
    if newer:
        raise PermanentError(
            f"release {current.name} in {current.namespace} runs chart {installed}, newer than "
            f"{section}.chart_version {shown}: the runbook does not downgrade a chart, so nothing was "
            "changed",
            hint=f"set {section}.chart_version: {installed} (or newer) to keep it; to go back on purpose, "
            f"helm rollback {current.name} -n {current.namespace}",
        )


def _helm_release(
    ctx: Context,
    current: Release | None,
    version: str,
    result: StepResult,
    changed: list[str],
    *,
    dry_run: bool,
    timeout_s: float,
) -> None:
    """Install the release, or upgrade it keeping the values a site gave it (``reuse_values``)."""
    release = ctx.plan.helm
    if current is not None and already_deployed(ctx, current, version):
        result.checks.append(
            Check(
                f"helm release {release.release}", True, f"{current.chart} already deployed with these values"
            )
        )
        return
    run = ctx.helm.upgrade_install(
        release.release,
        release.chart,
        version=version,
        namespace=release.namespace,
        values=release.values,
        create_namespace=not release.privileged_namespace and release.namespace != "kube-system",
        timeout_s=int(timeout_s),
        dry_run=dry_run,
        reuse_values=current is not None,
    )
    what = _helm_command(ctx, version) + _over(current)  # the plan names the values
    if dry_run and not run.ok and "ensure CRDs are installed first" in run.stderr:
        # helm installs a chart's CRDs only for real, so a first-time dry run of a chart that also creates
        # custom resources (the GPU Operator's ClusterPolicy) cannot render them: that is not a failure.
        result.checks.append(
            Check(
                f"helm release {release.release}",
                True,
                f"would run: {what} (its CRDs are not installed yet, so helm cannot dry-run the custom resources)",
            )
        )
        changed.append(what)
        return
    result.checks.append(
        Check(
            f"helm release {release.release}",
            run.ok,
            ("would run: " if dry_run else "ran: ") + what if run.ok else run.stderr.strip(),
            fix="" if run.ok else _helm_fix(run.stderr, release.namespace),
        )
    )
    # A failed install (its --wait timed out, helm killed) can leave the release behind, status failed or
    # pending-install: created all the same, so the record lists it and rollback removes it.
    installed = run.ok or (not dry_run and ctx.helm.release(release.release, release.namespace) is not None)
    if installed and current is None and not dry_run:
        created = {"kind": "helm-release", "name": release.release, "namespace": release.namespace}
        result.data["created"].append(created)
    if run.ok:
        changed.append(what)
    elif installed and not dry_run:
        changed.append(
            f"{what}: failed, and left the release {release.release} in {release.namespace} installed"
        )


def _over(current: Release | None) -> str:
    """What the upgrade goes on from, for the plan's line. Why name a failed release: after a Ctrl-C in this step
    (helm cancels its context on SIGINT, helm@v4.1.4 pkg/cmd/upgrade.go:239-249, and the release is left ``failed``)
    or a failed ``--wait``, the next plan said only that it would upgrade, as if the last install had worked (stop
    52's open item). ``helm upgrade`` goes on from a release whose every revision failed (helm@v4.1.4
    pkg/action/upgrade.go:247-266: the last failed release stands in for a deployed one)."""
    if current is None:
        return ""
    if current.status == "failed":
        return (
            f" (release {current.name} is failed: the helm before this one did not finish, stopped or timed out "
            "or refused; this one replaces it, keeping the release's other values)"
        )
    return " (keeping the release's other values)"


def already_deployed(ctx: Context, current: Release, version: str) -> bool:
    """Whether the release is deployed with chart ``version`` and the runbook's values, so the step runs no helm
    (its user-supplied values read with ``helm get values``)."""
    planned = ctx.plan.helm
    if current.status != "deployed" or current.chart_version(planned.chart_name).lstrip(
        "v"
    ) != version.lstrip("v"):
        return False
    values = ctx.helm.values(planned.release, planned.namespace)
    return all(_dotted(values, key) == value for key, value in planned.values.items())


def _helm_fix(stderr: str, namespace: str) -> str:
    if "default' namespace is not recommended" in stderr:
        return "install into kube-system (device_plugin.namespace: kube-system) or a namespace labelled privileged"
    if "unknown flag: --reset-then-reuse-values" in stderr:
        return "use helm 3.14 or newer (tools.helm): older helm cannot keep a release's values while upgrading it"
    if "violates PodSecurity" in stderr:
        return f"kubectl label --overwrite ns {namespace} pod-security.kubernetes.io/enforce=privileged"
    return "see the helm error above"


def _dotted(values: dict[str, Any], key: str) -> str | None:
    node: Any = values
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    if isinstance(node, bool):
        return "true" if node else "false"
    return str(node)


def _wait_for_gpus(
    ctx: Context,
    result: StepResult,
    gpu_nodes: list[Any],
    *,
    timeout_s: float,
    waited_s: float | None = None,
    hopeless: Collection[str] = (),
) -> None:
    """Watch nodes until every GPU node is Ready and advertises ``nvidia.com/gpu`` (or the timeout, or every node
    still waited for has been not Ready a minute: ``kube_diagnosis.DownNodes``, or is one of ``hopeless``, whose
    device plugin pod cannot pull its image: ``plugin_rollout.unpullable``), then report per node.
    ``waited_s`` is the step's whole wait, which the messages name (the rollout wait may have used most of it)."""
    names = {n.name for n in gpu_nodes}
    listed = ctx.kube.nodes()
    down = kube_diagnosis.DownNodes()
    for listed_node in listed:
        down.see(listed_node)
    ready = {n["metadata"]["name"] for n in listed if _serves_gpus(n)} & names

    def all_ready(obj: dict[str, Any]) -> bool:
        # Track readiness from the watch events themselves: no re-list per event at fleet scale.
        name = obj["metadata"]["name"]
        if name in names:
            down.see(obj)
            (ready.add if _serves_gpus(obj) else ready.discard)(name)
        return ready >= names

    unpulled = set(hopeless)

    def give_up() -> str | None:
        waiting = names - ready - unpulled
        held = down.down(waiting)
        if waiting and not held:
            return None
        pulls = sorted((names - ready) & unpulled)
        why = [f"{', '.join(held)} not Ready for {kube_diagnosis.DOWN_GRACE_S:.0f} s or more"] if held else []
        return "; ".join(
            why + ([f"{', '.join(pulls)}: the device plugin's image not found"] if pulls else [])
        )

    if timeout_s > 0 and not ready >= names:
        ctx.kube.watch_until(
            ctx.kube.core.list_node,
            all_ready,
            timeout=timeout_s,
            until="every GPU node Ready with nvidia.com/gpu",
            give_up=give_up,
        )
        listed = ctx.kube.nodes()  # as the watch left them; without a watch the first list is current
    by_name = {n["metadata"]["name"]: n for n in listed}
    waited = timeout_s if waited_s is None else waited_s
    reads = ClusterReads(ctx)  # one set of reads for every GPU-less node's diagnosis
    for node in gpu_nodes:
        obj = by_name.get(node.name)
        res = NodeResult(node=node.name, address=node.address)
        if obj is None:
            res.status = "failed"
            res.message = "no Kubernetes node of this name"
        else:
            unpullable = node.name in unpulled
            _judge_gpus(ctx, res, obj, reads, applied=result.applied, timeout_s=waited, unpullable=unpullable)
        result.nodes.append(res)


def _serves_gpus(node: dict[str, Any]) -> bool:
    """Ready, with allocatable GPUs: a Node that is not Ready keeps the GPUs its kubelet last posted."""
    return allocatable_gpus(node) > 0 and kube_diagnosis.is_ready(node)


def _judge_gpus(
    ctx: Context,
    res: NodeResult,
    obj: dict[str, Any],
    reads: ClusterReads,
    *,
    applied: bool,
    timeout_s: float,
    unpullable: bool = False,
) -> None:
    """``res`` for a GPU node Kubernetes knows: its allocatable GPUs, or why it has none. ``unpullable``: the
    waits gave up on its device plugin pod, whose image the registry does not have (``plugin_rollout``)."""
    gpus = allocatable_gpus(obj)
    res.data["allocatable_gpus"] = gpus
    not_ready = kube_diagnosis.node_not_ready(obj, res.address)
    if not_ready is not None:  # applied or not: no pod starts there
        res.status = "failed"
        res.message = "not Ready" + (
            f": its {gpus} allocatable {GPU_RESOURCE} are what its kubelet last posted" if gpus else ""
        )
        res.checks.append(not_ready)
    elif gpus > 0:
        res.status = "ok"
        res.message = f"{gpus} allocatable {GPU_RESOURCE}"
        product = _gpu_product(obj)
        if product:
            res.data["gpu_product"] = product
            res.message += f" ({GPU_PRODUCT_LABEL}={product})"
    elif not applied:
        res.status = "planned"
        res.message = f"no allocatable {GPU_RESOURCE} yet (apply to install the Kubernetes layer)"
    else:
        res.status = "failed"
        res.message = (
            f"no allocatable {GPU_RESOURCE}: its device plugin pod cannot pull its image, which the registry does "
            "not have, so the step stopped waiting for it (a registry mirror that has not synced the image yet says "
            "the same: re-run the step once it has)"
            if unpullable
            else f"no allocatable {GPU_RESOURCE} after {timeout_s:.0f} s"
        )
        res.checks.append(_no_gpu_diagnosis(ctx, obj, reads))


#: GPU Feature Discovery's label naming the node's GPU model (NVIDIA/k8s-device-plugin@v0.18.0 internal/lm/
#: resource.go ``baseLabeler``); the GPU Operator runs GFD by default (gpu-operator@v26.3.3 values.yaml
#: ``gfd.enabled: true``). Absent with the device-plugin chart alone (its ``gfd.enabled`` is false).
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"


def _gpu_product(node: dict[str, Any]) -> str | None:
    """The GPU model GFD labelled the node with: the value a workload's nodeSelector targets a model by."""
    product = (node["metadata"].get("labels") or {}).get(GPU_PRODUCT_LABEL)
    return str(product) if product else None


class ClusterReads:
    """The cluster reads the no-GPU diagnosis makes, each made once per step and shared by every node.

    Why: what it reads (the device plugin's pods, the release's and the GPU Operator's DaemonSets, the
    validator's pods, the release's values) is the same for every node, and it used to be read again for each
    GPU-less node: on a 1,000-node fleet without a loaded driver, thousands of API list calls and a ``helm get
    values`` per node where one of each does. Each read happens on first use, so a node the first checks
    explain costs none of the later ones, as before.
    """

    def __init__(self, ctx: Context) -> None:
        self._ctx = ctx
        self._done: dict[tuple[str, ...], Any] = {}

    def _once(self, key: tuple[str, ...], read: Callable[[], Any]) -> Any:
        if key not in self._done:
            self._done[key] = read()
        return self._done[key]

    def daemonsets(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = self._once(
            ("daemonsets", namespace, selector), lambda: self._ctx.kube.daemonsets(namespace, selector)
        )
        return found

    def pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = self._once(
            ("pods", namespace, selector), lambda: self._ctx.kube.pods(namespace, selector)
        )
        return found

    def helm_values(self, release: str, namespace: str) -> dict[str, Any]:
        found: dict[str, Any] = self._once(
            ("values", release, namespace), lambda: self._ctx.helm.values(release, namespace)
        )
        return found

    def plugin_pods(self) -> list[dict[str, Any]]:
        """The device plugin's pods: those its DaemonSet owns. Why not the label selector alone: the chart's GPU
        Feature Discovery and MPS DaemonSets label their pods ``app.kubernetes.io/instance: <release>`` too, in the
        same namespace (k8s-device-plugin@v0.18.0 templates/daemonset-gfd.yml:25,38-39,
        daemonset-mps-control-daemon.yml:23,36-37), so a Ready GFD pod passed for a Ready plugin."""
        namespace, name = self.plugin_daemonset()
        return [
            pod
            for pod in self.pods(namespace, _plugin_selector(self._ctx))
            if any(
                ref.get("kind") == "DaemonSet" and ref.get("name") == name
                for ref in pod["metadata"].get("ownerReferences") or []
            )
        ]

    def plugin_daemonset(self) -> tuple[str, str]:
        """(namespace, name) of the device plugin's DaemonSet: on the device-plugin layer as the release's values
        make them (``_release_daemonset``), read with the values the diagnosis shares."""
        if self._ctx.plan.kubernetes_layer == "gpu-operator":
            return self._ctx.plan.helm.namespace, _plugin_daemonset(self._ctx)
        return _release_daemonset(self._ctx, self.helm_values)


def _no_gpu_diagnosis(ctx: Context, node: dict[str, Any], reads: ClusterReads | None = None) -> Check:
    """Why a GPU node advertises no ``nvidia.com/gpu``; ``reads`` shared by the step's nodes (fresh if None)."""
    reads = reads or ClusterReads(ctx)
    said = _kubernetes_says(ctx, node, reads) or _gpus_unhealthy(ctx, node, reads)
    if said is not None:
        return said
    release = ctx.plan.helm
    labels = node["metadata"].get("labels") or {}
    namespace, daemonset = reads.plugin_daemonset()
    # Only the release's own DaemonSets: kube-proxy and flannel share kube-system on every Talos cluster.
    daemonsets = [
        d
        for d in reads.daemonsets(namespace, f"app.kubernetes.io/instance={release.release}")
        if d["metadata"].get("name") == daemonset  # the chart's GFD and MPS DaemonSets carry the same label
    ]
    desired = sum(int((d.get("status") or {}).get("desiredNumberScheduled", 0)) for d in daemonsets)
    if ctx.plan.kubernetes_layer == "device-plugin" and not daemonsets:
        return Check(
            "device plugin scheduled",
            False,
            f"there is no device-plugin DaemonSet {daemonset} in namespace {namespace}",
            cause="helm did not create it (an install or upgrade that failed), or it was deleted",
            fix=f"helm status {release.release} -n {release.namespace}  # then run the kubernetes step again",
        )
    if ctx.plan.kubernetes_layer == "device-plugin" and desired == 0:
        return Check(
            "device plugin scheduled",
            False,
            "the device-plugin DaemonSet has 0 desired pods",
            cause="chart ≥0.15 node affinity needs nvidia.com/gpu.present=true or NFD labels",
            fix=f"kubectl label node {node['metadata']['name']} nvidia.com/gpu.present=true",
        )
    if labels.get("nvidia.com/gpu.present") != "true" and ctx.plan.kubernetes_layer == "device-plugin":
        return Check(
            "node labelled",
            False,
            "node lacks nvidia.com/gpu.present=true",
            fix=f"kubectl label node {node['metadata']['name']} nvidia.com/gpu.present=true",
        )
    if ctx.plan.kubernetes_layer == "gpu-operator":
        waiting = (
            _operator_plugin_missing(ctx, reads)
            or _operator_not_selected(ctx, node)
            or _operator_validation_waiting(ctx, node["metadata"]["name"], reads)
        )
        if waiting is not None:
            return waiting
    return Check(
        "device plugin ready",
        False,
        "the device plugin runs but the node advertises no GPUs",
        cause="the driver is not loaded on the node, or the plugin does not run with the nvidia runtime",
        fix="run the verification step for this node; check `kubectl -n "
        f"{namespace} logs ds/{daemonset}` for 'Incompatible strategy' / NVML errors",
    )


def _kubernetes_says(ctx: Context, node: dict[str, Any], reads: ClusterReads) -> Check | None:
    """What Kubernetes itself reports against the node: not Ready, or its device-plugin pod never started
    (``kube_diagnosis``); None when it reports nothing, and the plugin or driver is the suspect."""
    name = node["metadata"]["name"]
    address = next((n.address for n in ctx.params.nodes if n.name == name), name)
    not_ready = kube_diagnosis.node_not_ready(node, address)
    if not_ready is not None:
        return not_ready
    for pod in kube_diagnosis.pods_for_node(reads.plugin_pods(), name):
        stuck = kube_diagnosis.pod_not_started(pod, name, "device plugin")
        if stuck is not None:
            return stuck
    return None


def _gpus_unhealthy(ctx: Context, node: dict[str, Any], reads: ClusterReads) -> Check | None:
    """The device plugin registered the node's GPUs but reports some unhealthy: they count in the Node's
    ``nvidia.com/gpu`` capacity, not in its allocatable (kubernetes@v1.35.0 pkg/kubelet/cm/devicemanager/
    manager.go:444-480 ``GetCapacity``). The plugin marks a GPU unhealthy on an Xid critical error, logging
    ``XidCriticalError: Xid=<n> on Device=<uuid>; marking device as unhealthy.``, and never marks it healthy again
    while it runs (NVIDIA/k8s-device-plugin@v0.19.3 internal/rm/health.go:133-170, internal/plugin/server.go:
    276-279). Why here: the driver and runtime checks would blame a driver verify just found loaded.

    Only while the node's plugin pod is Ready: for 5 minutes after the plugin stops (crash loop, a restart, the
    chart-to-operator handover) the kubelet also keeps every GPU in capacity and none allocatable
    (manager.go ``PluginDisconnected`` -> ``markResourceUnhealthy``; ``GetCapacity``'s grace period), with no Xid."""
    namespace, daemonset = reads.plugin_daemonset()
    pods = kube_diagnosis.pods_for_node(reads.plugin_pods(), node["metadata"]["name"])
    if not any((kube_diagnosis.condition(pod, "Ready") or {}).get("status") == "True" for pod in pods):
        return None
    status = node.get("status") or {}
    capacity = _gpu_count(status.get("capacity"))
    unhealthy = capacity - allocatable_gpus(node)
    if unhealthy <= 0:
        return None
    return Check(
        "device plugin ready",
        False,
        f"the device plugin marked {unhealthy} GPU(s) unhealthy ({GPU_RESOURCE} capacity {capacity}, "
        f"allocatable {capacity - unhealthy})",
        cause="the plugin saw an Xid critical error on the GPU (e.g. Xid 79: it fell off the bus), or an NVML "
        "error waiting for GPU events (then every GPU, no Xid: health.go:126), and keeps it out of allocatable "
        "until its pod restarts",
        fix=f"kubectl -n {namespace} logs ds/{daemonset} | grep -iE 'XidCriticalError|unhealthy'  "
        "# which Xid (or NVML error), which GPU; once its cause is dealt with (NVIDIA's Xid catalog), restart the "
        "plugin on this node: "
        f"kubectl -n {namespace} delete pod -l {_plugin_selector(ctx)} "
        f"--field-selector spec.nodeName={node['metadata']['name']}",
    )


def _plugin_selector(ctx: Context) -> str:
    """The label selector of the device plugin's pods: the operator's DaemonSet's ``app``, the chart's release."""
    if ctx.plan.kubernetes_layer == "gpu-operator":
        return f"app={_plugin_daemonset(ctx)}"
    return f"app.kubernetes.io/instance={ctx.plan.helm.release}"


#: The GPU Operator's validator DaemonSet (gpu-operator@v26.3.3 assets/state-operator-validation/0500_daemonset.yaml).
OPERATOR_VALIDATOR = "nvidia-operator-validator"


def _operator_plugin_missing(ctx: Context, reads: ClusterReads) -> Check | None:
    """The operator has not created its device-plugin DaemonSet at all: it has not reconciled the ClusterPolicy
    (not running, or not leading: the RuntimeClass check says which), so no plugin runs to be suspected."""
    namespace = ctx.plan.helm.namespace
    name = _plugin_daemonset(ctx)
    if reads.daemonsets(namespace, f"app={name}"):
        return None
    return Check(
        "GPU Operator device plugin",
        False,
        f"the GPU Operator has not created {name} in namespace {namespace}",
        cause="the operator has not reconciled its ClusterPolicy (see the check "
        f"'{operator_runtime_class.CHECK}')",
        fix=f"kubectl -n {namespace} logs {operator_runtime_class.OPERATOR_DEPLOYMENT}",
    )


#: The Node labels the GPU Operator takes as "has an NVIDIA GPU", which Node Feature Discovery sets
#: (gpu-operator@v26.3.3 controllers/state_manager.go:114-118 ``gpuNodeLabels``).
NFD_GPU_LABELS = (
    "feature.node.kubernetes.io/pci-10de.present",
    "feature.node.kubernetes.io/pci-0302_10de.present",
    "feature.node.kubernetes.io/pci-0300_10de.present",
)
#: The label the operator's device-plugin DaemonSet selects on (state_manager.go:93;
#: assets/state-device-plugin/0500_daemonset.yaml nodeSelector; the validator's selects
#: ``nvidia.com/gpu.deploy.operator-validator``, which the operator sets with it, :97).
DEPLOY_PLUGIN_LABEL = "nvidia.com/gpu.deploy.device-plugin"
#: ``false`` on a node: the operator removes every deploy label there (state_manager.go:317-323, 396-402).
OPERANDS_LABEL = "nvidia.com/gpu.deploy.operands"


def _operator_not_selected(ctx: Context, node: dict[str, Any]) -> Check | None:
    """The operator deploys nothing to a node it has not labelled ``nvidia.com/gpu.deploy.device-plugin=true``,
    and it labels only nodes NFD marked as having an NVIDIA PCI device (state_manager.go:521-621
    ``labelGPUNodes``): with no plugin and no validator pod there, the other diagnoses find nothing to blame and
    the node got "the device plugin runs" (found by a review helper). None when the node is selected."""
    name, labels = node["metadata"]["name"], node["metadata"].get("labels") or {}
    if labels.get(DEPLOY_PLUGIN_LABEL) == "true":
        return None
    namespace = ctx.plan.helm.namespace
    if not any(labels.get(key) == "true" for key in NFD_GPU_LABELS):
        return Check(
            "GPU Operator node selection",
            False,
            f"Node {name} has no NFD label for an NVIDIA PCI device ({NFD_GPU_LABELS[0]}), so the GPU Operator "
            "deploys nothing to it",
            cause="Node Feature Discovery has not labelled it: its worker does not run there, or the release has "
            "nfd.enabled=false and the site runs no NFD of its own",
            fix=f"kubectl -n {namespace} get pods -l app.kubernetes.io/name=node-feature-discovery,role=worker "
            "-o wide  # the NFD worker on this node, and its log",
        )
    for label, what in ((OPERANDS_LABEL, "none of its operands"), (DEPLOY_PLUGIN_LABEL, "its device plugin")):
        if labels.get(label) == "false":
            # the operator honours a deploy label already set, false too (state_manager.go:411-420)
            return Check(
                "GPU Operator node selection",
                False,
                f"Node {name} has {label}=false, so the GPU Operator deploys {what} there",
                cause="someone excluded the node from the GPU Operator by hand (or a tool did)",
                fix=f"kubectl label node {name} {label}-  # if the node should run GPU pods; the operator "
                "then labels it",
            )
    return Check(
        "GPU Operator node selection",
        False,
        f"the GPU Operator has not labelled Node {name} {DEPLOY_PLUGIN_LABEL}=true, so its device plugin does not "
        "run there",
        cause="the operator has not reconciled since NFD labelled the node",
        fix=f"kubectl get node {name} --show-labels; kubectl -n {namespace} logs "
        f"{operator_runtime_class.OPERATOR_DEPLOYMENT}",
    )


def _operator_validation_waiting(ctx: Context, node: str, reads: ClusterReads) -> Check | None:
    """The validation the GPU Operator's stack waits in on ``node``, as a failed check; None if it waits in none.

    Why: the operator's device plugin waits in its ``toolkit-validation`` init container until the validator
    passes, so with wrong values it never runs and "check its logs" leads nowhere. The validator's
    ``driver-validation`` (gpu-operator@v26.3.3 cmd/nvidia-validator/main.go:745-837) waits for the operator's
    driver container when ``driver.enabled`` (it cannot load modules on Talos, which loads only modules signed
    with its build key) or looks for ``nvidia-smi``/``libnvidia-ml.so.1`` under ``hostPaths.driverInstallDir``
    (Talos: /usr/local, the Talos 1.13 docs); ``toolkit-validation`` runs ``nvidia-smi`` with the nvidia runtime
    (main.go:1132-1158)."""
    release = ctx.plan.helm
    for pod in reads.pods(release.namespace, f"app={OPERATOR_VALIDATOR}"):
        if (pod.get("spec") or {}).get("nodeName") != node:
            continue
        for status in (pod.get("status") or {}).get("initContainerStatuses") or []:
            how = _stuck(status)
            if how is None:
                continue
            message = f"{OPERATOR_VALIDATOR} on {node} waits in {status['name']}{how}"
            if status["name"] == "driver-validation":
                return _driver_validation(ctx, message, reads)
            if status["name"] == "toolkit-validation":
                return Check(
                    "GPU Operator toolkit validation",
                    False,
                    message,
                    cause="nvidia-smi does not run in a container of the nvidia runtime: the toolkit "
                    "extension is missing or its driver differs from the loaded one",
                    fix="run the verification step for this node",
                )
    return None


def _stuck(status: dict[str, Any]) -> str | None:
    """How an init container holds its pod up: ``""`` running (driver-validation waits, ``WITH_WAIT: "true"``),
    ``" (CrashLoopBackOff: …)"`` when it exits with an error and is restarted, which is how the validator's later
    validations fail, or, between a failed run and the back-off, terminated with a non-zero exit code
    (``WITH_WAIT: "false"``: they run once; gpu-operator@v26.3.3
    assets/state-operator-validation/0500_daemonset.yaml:59-125, cmd/nvidia-validator/main.go:1132-1150); None
    otherwise (done, or not started yet)."""
    state = status.get("state") or {}
    if "running" in state:
        return ""
    waiting = state.get("waiting") or {}
    if waiting.get("reason") == "CrashLoopBackOff":
        return " (CrashLoopBackOff: it exits with an error and is restarted)"
    ended = state.get("terminated") or {}
    if ended.get("exitCode", 0) != 0:  # the moment between a failed run and the back-off
        return (
            f" (exited with code {ended['exitCode']}, {ended.get('reason') or 'no reason'}: it is restarted)"
        )
    return None


def _driver_validation(ctx: Context, message: str, reads: ClusterReads) -> Check:
    """Why driver-validation waits: the release's values, or the node. The pod's status is the same either way
    (running driver-validation), and with the right values its log says only "failed to validate the driver,
    retrying" (gpu-operator@v26.3.3 cmd/nvidia-validator/main.go:795-806), so the values the release has decide:
    ``helm upgrade`` with values it already has changes nothing (U5's finding)."""
    release = ctx.plan.helm
    stored = reads.helm_values(release.release, release.namespace)
    if all(_dotted(stored, key) == value for key, value in GPU_OPERATOR_VALUES.items()):
        return Check(
            "GPU Operator driver validation",
            False,
            message,
            cause="the release already has the runbook's values (driver.enabled=false, "
            "hostPaths.driverInstallDir=/usr/local), so the validator finds no working nvidia-smi and "
            "libnvidia-ml.so.1 under /usr/local: the node lacks the NVIDIA extensions or their modules",
            fix="runbook run -p <parameters> --steps config-patch,image,verify --apply  # the modules patch, the "
            "extensions, then what verify finds on this node",
        )
    values = " ".join(f"--set {k}={v}" for k, v in GPU_OPERATOR_VALUES.items())
    return Check(
        "GPU Operator driver validation",
        False,
        message,
        cause="the operator waits for its own driver container (driver.enabled=true), which "
        "cannot load its modules on Talos, or finds no driver under hostPaths.driverInstallDir "
        "(Talos ships it under /usr/local)",
        fix=f"helm upgrade {release.release} {release.chart} --version {shlex.quote(release.version)} "
        f"-n {release.namespace} --reuse-values {values}  # the values the runbook sets",
    )


def _release_daemonset(
    ctx: Context, values_of: Callable[[str, str], dict[str, Any]] | None = None
) -> tuple[str, str]:
    """(namespace, name) of the device plugin's DaemonSet as the release's own values make them: the chart's
    ``fullnameOverride``, ``nameOverride`` and ``namespaceOverride`` (k8s-device-plugin@v0.18.0
    deployments/helm/nvidia-device-plugin/templates/_helpers.tpl ``nvidia-device-plugin.fullname`` and
    ``.namespace``), which a site may have set and the runbook keeps. Why: a DaemonSet looked for under the
    default name never appears, and the rollout wait ran its whole timeout; and the no-GPU diagnosis looked for the
    plugin's pods in the release's namespace, found none, and blamed the node's labels or named a DaemonSet that
    does not exist. ``values_of`` reads the values (default: ``helm get values``)."""
    namespace = ctx.plan.helm.namespace
    try:
        values = (values_of or ctx.helm.values)(ctx.plan.helm.release, namespace)
    except RunbookError:
        values = {}  # no release to read (a failed first install): the chart's defaults
    overridden = str(values.get("namespaceOverride") or "") or namespace
    full = str(values.get("fullnameOverride") or "")
    if full:
        return overridden, full[:63].rstrip("-")
    return overridden, _plugin_daemonset(ctx, str(values.get("nameOverride") or "") or None)


def _plugin_daemonset(ctx: Context, name_override: str | None = None) -> str:
    """The DaemonSet that runs the device plugin: the operator names its own ``nvidia-device-plugin-daemonset``
    (gpu-operator assets/state-device-plugin/0500_daemonset.yaml); the chart names it after the release, with the
    chart's name appended unless the release name contains it (k8s-device-plugin@v0.18.0
    deployments/helm/nvidia-device-plugin/templates/_helpers.tpl, ``nvidia-device-plugin.fullname``: ``nvdp``
    gives ``nvdp-nvidia-device-plugin``)."""
    if ctx.plan.kubernetes_layer == "gpu-operator":
        return "nvidia-device-plugin-daemonset"
    release = ctx.plan.helm.release
    chart = name_override or ctx.plan.helm.chart_name
    name = release if chart in release else f"{release}-{chart}"
    return name[:63].rstrip("-")
