"""Hand the GPUs from the device plugin to the GPU Operator when a cluster moves to Talos 1.13.

Why its own module, used by two steps: the Talos 1.13 upgrade notes say "Before upgrading to Talos 1.13,
uninstall the nvidia-device-plugin helm chart and delete the nvidia runtimeclass" (found with
``helm list -A``), and only then switch to the GPU Operator (siderolabs/docs
public/talos/v1.13/configure-your-talos-cluster/lifecycle-management/upgrading-talos.mdx:53-70).  The
operator runs its own device plugin (gpu-operator@v26.3.3 values.yaml ``devicePlugin.enabled: true``) and
creates RuntimeClass ``nvidia`` owned by its ClusterPolicy, so two plugins would advertise
``nvidia.com/gpu``.  The Kubernetes step removes what is left before it installs the operator; the image
step, which runs earlier, removes it before the first node goes to 1.13 (the Kubernetes step cannot run
first: it would install the operator onto nodes that are still on 1.12).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from runbook_lib.clients.helm import Release, uninstall_args
from runbook_lib.errors import Forbidden, PermanentError, RunbookError
from runbook_lib.model.versions import TalosVersion

from . import dryrun
from .context import Context
from .results import Check, StepResult

DEVICE_PLUGIN_CHART = "nvidia-device-plugin-"
"""Prefix of the chart column ``helm list`` prints (``<chart>-<version>``) for the device-plugin chart."""
RUNTIME_CLASS = "nvidia"


@dataclass(frozen=True)
class Leftovers:
    """What of the device-plugin layer is still in the cluster: its releases and a RuntimeClass not the
    operator's."""

    releases: tuple[tuple[str, str], ...]
    """(release, namespace) of every device-plugin release, in every namespace."""
    runtime_class: bool
    """RuntimeClass ``nvidia`` exists and is not the operator's."""
    operators_runtime_class: bool = False
    """RuntimeClass ``nvidia`` exists and is the operator's."""

    def runtime_class_exists(self) -> bool:
        """RuntimeClass ``nvidia`` exists, the operator's or not (what preflight reports as progress)."""
        return self.runtime_class or self.operators_runtime_class

    def commands(self, timeout_s: float) -> list[str]:
        """The commands of the docs' procedure, as the runbook runs them: ``helm uninstall`` with the ``--wait``
        and ``--timeout`` (``timeout_s``, the ``timeouts.kubernetes_seconds`` parameter) it is given (a plan had
        shown the bare command, which pasted returns before the device plugin's pods are gone)."""
        out = [shlex.join(["helm", *uninstall_args(n, ns, int(timeout_s))]) for n, ns in self.releases]
        if self.runtime_class:
            out.append(f"kubectl delete runtimeclass {RUNTIME_CLASS}")
        return out


def leftovers(ctx: Context, listed: list[Release] | None = None) -> Leftovers:
    """Read the device-plugin releases (``helm list -A``, unless the caller ``listed`` them already) and whether
    RuntimeClass ``nvidia`` is not owned by the operator's ClusterPolicy."""
    releases = tuple(
        (rel.name, rel.namespace)
        for rel in (ctx.helm.releases_everywhere() if listed is None else listed)
        if rel.chart.startswith(DEVICE_PLUGIN_CHART)
    )
    existing = ctx.kube.runtime_class(RUNTIME_CLASS)
    owners = ((existing or {}).get("metadata") or {}).get("ownerReferences") or []
    operators = any(o.get("kind") == "ClusterPolicy" for o in owners)
    return Leftovers(releases, existing is not None and not operators, existing is not None and operators)


def remove(ctx: Context, result: StepResult, found: Leftovers, *, dry_run: bool, timeout_s: float) -> str:
    """Uninstall the releases (waiting until the objects they made are gone) and delete the RuntimeClass.

    What the wait covers: ``helm uninstall --wait`` waits for the deleted objects themselves, which it deletes
    with background propagation (helm@v4.1.4 pkg/action/uninstall.go:161, 286-301), so the DaemonSet goes at
    once and the garbage collector deletes its pods after: a node that is down, whose pod only its kubelet can
    finish deleting, does not hold the uninstall.

    A dry run only sends the RuntimeClass deletion to the API server's dry run; a failed uninstall raises
    ``PermanentError`` naming the command, before the RuntimeClass is touched. Returns "" or, in a dry run the
    kubeconfig's user may not make, the refusal as the plan says it (steps/dryrun.py).
    """
    for name, namespace in found.releases:
        if not dry_run:
            run = ctx.helm.uninstall(name, namespace, timeout_s=int(timeout_s))
            if not run.ok:
                what = f"helm uninstall {name} -n {namespace}"
                raise PermanentError(f"{what} failed: {run.stderr.strip()}", hint=what)
    if found.runtime_class:
        try:
            ctx.kube.delete_runtime_class(RUNTIME_CLASS, dry_run=dry_run)
        except Forbidden as exc:
            return dryrun.refused_in_plan(result, exc, dry_run=dry_run)
    return ""


def needed_before_upgrade(ctx: Context, versions: Sequence[str | None]) -> bool:
    """True when this image upgrade takes a node from before 1.13 to 1.13+ and the GPU Operator is the plan
    (``kubernetes_layer: device-plugin`` keeps the device plugin by request)."""
    if not ctx.params.talos.at_least(1, 13) or ctx.plan.kubernetes_layer != "gpu-operator":
        return False
    return any(not _at_least_1_13(v) for v in versions)


def _at_least_1_13(version: str | None) -> bool:
    """A version that cannot be read counts as older: removing the device plugin is the safe side."""
    try:
        return TalosVersion.parse(version or "").at_least(1, 13)
    except PermanentError:
        return False


def before_upgrade(
    ctx: Context, result: StepResult, versions: Sequence[str | None], *, dry_run: bool
) -> bool:
    """The image step's part: plan (``dry_run``) or run the removal before any node is upgraded to 1.13.

    ``versions`` are the Talos versions the nodes to upgrade run now.  Returns False when the removal could
    not be read or done: then no node may be upgraded.  ``result.data["before_upgrade"]`` lists the commands.
    """
    if not needed_before_upgrade(ctx, versions):
        return True
    title = "device plugin removed before the Talos 1.13 upgrade"
    manual = "helm list -A; helm uninstall -n <namespace> <release>; kubectl delete runtimeclass nvidia"
    wait = float(ctx.params.timeouts.kubernetes_seconds)
    unread: Forbidden | None = None
    try:
        try:
            listed = ctx.helm.releases_everywhere()
        except Forbidden as exc:  # helm list -A: the user may not read helm's release Secrets
            if not dry_run:
                raise
            listed, unread = [], exc
        found = leftovers(ctx, listed)
        commands = result.data["before_upgrade"] = found.commands(wait)
        refused = remove(ctx, result, found, dry_run=dry_run, timeout_s=wait)
    except RunbookError as exc:
        result.checks.append(
            Check(
                title,
                False,
                f"{exc.message}: the Talos 1.13 upgrade notes require the device plugin gone first",
                fix=exc.hint or manual,
            )
        )
        return False
    if unread is not None:
        _unread_releases(result, title, unread)
    if commands:
        verb = "would run" if dry_run else "ran"
        result.notes.append(
            "Talos 1.13 upgrade notes: uninstall the nvidia-device-plugin Helm release and delete the nvidia "
            f"RuntimeClass before upgrading (the GPU Operator brings both); {verb} first: "
            + "; ".join(commands)
        )
        said = f"{verb}: " + "; ".join(commands) + refused
        result.checks.append(Check(title, True, said, fix=dryrun.fix(refused)))
    return True


def _unread_releases(result: StepResult, title: str, exc: Forbidden) -> None:
    """A plan whose kubeconfig's user may not list helm's release Secrets: which device-plugin releases the
    apply run would uninstall first is not known (the ``view`` ClusterRole grants no Secrets, kubernetes@v1.35.0
    plugin/pkg/auth/authorizer/rbac/bootstrappolicy/policy.go); the plan says so and goes on."""
    cannot = "name the helm uninstall the apply run makes first"
    lead = "the device-plugin releases were not read"
    dryrun.releases_unread(result, title, exc, lead=lead, subject="them", cannot=cannot)
