"""Step: preflight — can the runbook act on this cluster, and how much of the procedure is already done?

Read-only.  Why it fails on what it fails on: an unreachable node or a node on another Talos release than
the plan would get the wrong installer and kernel-module tag, and a listed node without an NVIDIA GPU
(Talos >= 1.8 shows the PCI bus) would get the GPU installer and hang in its boot, so those stop the run
before any change;
everything else (extensions present, config patched, RuntimeClass, Helm release) is reported as progress,
so a re-run shows at a glance which steps will be no-ops.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass, field, replace
from typing import Any

from runbook_lib.clients.factory import (
    FactoryClient,
    FactoryRefused,
    known_versions_hint,
    resolve_against,
)
from runbook_lib.errors import RunbookError
from runbook_lib.model.machineconfig import contains
from runbook_lib.model.params import Node
from runbook_lib.model.parsers import (
    TalosResource,
    extension_versions,
    extensions_from_resources,
    schematic_id,
)
from runbook_lib.model.pci import PciDevice
from runbook_lib.model.schematic import ExtensionInfo
from runbook_lib.model.text import shortened
from runbook_lib.model.upgrade_risks import preserve_needed
from runbook_lib.model.versions import TalosVersion

from . import fixes, gpu_operator_handover, kubernetes, node_identity, permissions
from .context import Context
from .gpu_presence import gpu_check, not_checked_note, read_pci
from .patch import read_configs, wanted_documents
from .results import Check, NodeResult, StepResult


@dataclass(frozen=True)
class _NodeReads:
    """What the nodes answered, each read one fan-out call for all nodes (never one call per node)."""

    servers: dict[str, str]
    errors: dict[str, str]
    extensions: dict[str, list[TalosResource]]
    pci: dict[str, list[PciDevice]]
    configs: dict[str, list[dict[str, Any]]]
    config_errors: dict[str, str]
    extension_errors: dict[str, str] = field(default_factory=dict)
    """Nodes whose extensions could not be read: their schematic is not known (no ``schematic_id`` recorded)."""
    kube_nodes: node_identity.KubeNodes | None = None
    """The cluster's Kubernetes Nodes (names, addresses), when the list was read."""


def preflight(
    ctx: Context, *, only: list[str] | None = None, steps: Collection[str] | None = None
) -> StepResult:
    """``steps``: the steps of the run it precedes (``runbook run --steps``), whose needs it checks (tools,
    Kubernetes permissions); None: all of them, as a user going through the notebooks runs them."""
    nodes = ctx.nodes(only)
    addresses = [n.address for n in nodes]
    result = StepResult(step="preflight", applied=False)

    client, servers, errors = ctx.talosctl.version(addresses)
    layer = permissions.LayerReads()
    result.data["versions"] = _tool_versions(ctx, result, client, steps, layer, nodes=nodes)
    reads = _read_nodes(ctx, nodes, addresses, servers, errors)
    kube_nodes, unread = node_identity.read(ctx, steps)
    reads = replace(reads, kube_nodes=kube_nodes)
    if unread:
        result.notes.append(unread)
    for node in nodes:
        res = NodeResult(node=node.name, address=node.address)
        result.nodes.append(res)
        _check_node(ctx, res, node, reads)
    _count_done(ctx, result, nodes, reads.config_errors)
    _mixed_releases(result)
    _cluster_progress(ctx, result, layer, steps)
    # before the steps that change nodes (walkthrough, stop 54)
    if permissions.runs_step(steps, "kubernetes"):
        result.checks.append(kubernetes.chart_check(ctx))
    return result.finish()


def _tool_versions(
    ctx: Context,
    result: StepResult,
    client: str | None,
    steps: Collection[str] | None,
    layer: permissions.LayerReads,
    *,
    nodes: list[Node],
) -> dict[str, str]:
    """Check talosctl, helm and the Kubernetes API and return their versions: a missing or unusable tool
    fails preflight, before any step changes a node, and the report shows which versions ran."""
    versions: dict[str, str] = {}
    result.checks.append(_client_check(client, ctx.params.talos))
    versions["talosctl"] = client or "unknown"
    try:
        versions["helm"] = ctx.helm.version()
        result.checks.append(_helm_check(versions["helm"]))
    except RunbookError as exc:
        result.checks.append(
            Check("helm", False, exc.message, fix=exc.hint or "install helm or set tools.helm")
        )
    if ctx.params.default_runtime_patch and permissions.runs_step(steps, "config-patch"):
        _kubectl_check(ctx, result, versions)
    if permissions.runs_step(steps, "image") and ctx.params.talos.at_least(1, 5):
        result.checks += _factory_checks(ctx, nodes)
    try:
        versions["kubernetes"] = ctx.kube.server_version()
        result.checks.append(Check("kubernetes API", True, f"Kubernetes {versions['kubernetes']}"))
        result.checks.append(permissions.check(ctx, steps, layer))
    except RunbookError as exc:
        result.checks.append(
            Check("kubernetes API", False, exc.message, fix=exc.hint or "check the kubeconfig parameter")
        )
    return versions


def _factory_checks(ctx: Context, nodes: list[Node]) -> list[Check]:
    """The Image Factory builds the plan's release (:func:`_factory_check`), and offers, for that release, every
    extension the image step will put in these nodes' schematics (:func:`_extensions_check`)."""
    # a gate, not the step that needs the factory: one retry, a short read
    client = FactoryClient(ctx.endpoints.image_factory_url, retries=1, read_timeout=15)
    check, available = _factory_check(ctx, client)
    if not check.ok or check.message.startswith("not checked"):
        return [check]
    return [check, _extensions_check(ctx, client, available, nodes)]


def _factory_check(ctx: Context, client: FactoryClient) -> tuple[Check, list[ExtensionInfo] | None]:
    """The Image Factory builds the plan's release: ``GET /versions``, "a list of Talos Linux versions available
    for image generation" (siderolabs/image-factory README, ``GET /versions``, at 03bd46f).

    Why here: a mistyped release (``v1.12.77``) passed preflight and planned the modules patch; only the image
    step, after the patch was applied, asked the factory for the release's extensions and got a 404. A factory
    that does not answer is not a failure here (a re-run whose nodes all run the GPU schematic needs none): the
    image step says so when it needs it.

    The list leaves out what the factory still builds: pre-releases other than the newest line's alpha and beta,
    and releases newer than its cached list (siderolabs/image-factory internal/artifacts/versions.go
    ``fetchTalosVersions`` at 9d6ab0e). So a release missing from it fails only when the factory also has no
    extensions for it (``GET /version/<v>/extensions/official`` answers 404, as the image step would meet).
    Returns that list of extensions when it was read."""
    wanted = ctx.params.talos
    try:
        known = client.versions()
    except RunbookError as exc:
        return Check("image factory", True, f"not checked: {exc.message}"), None
    if wanted in {TalosVersion.parse_or_none(v) for v in known}:
        return Check("image factory", True, f"{client.base_url} builds Talos {wanted}"), None
    try:
        available = client.official_extensions(str(wanted))
        serves = f"{client.base_url} serves the extensions of Talos {wanted}"
        return Check("image factory", True, serves), available
    except FactoryRefused as exc:
        if exc.status != 404:
            return Check("image factory", True, f"not checked: {exc.message}"), None
    except RunbookError as exc:
        return Check("image factory", True, f"not checked: {exc.message}"), None
    failed = Check(
        "image factory",
        False,
        f"the Image Factory {client.base_url} does not build Talos {wanted}: "
        f"{known_versions_hint(known, wanted)}",
        fix="set talos_version to a release the factory lists (GET /versions), or image_factory_url to the "
        "factory that builds it",
    )
    return failed, None


def _extensions_check(
    ctx: Context, client: FactoryClient, available: list[ExtensionInfo] | None, nodes: list[Node]
) -> Check:
    """Every extension list the image step will ask for these nodes (``track``, ``driver_flavor``,
    ``extra_extensions`` and each node's overrides) exists for the release and works together, checked as the
    image step resolves it (``factory.resolve_against``: the names, one driver for kernel modules, toolkit and
    fabric manager).

    Why here: the image step resolved them only after the config-patch step had patched the nodes, so a track
    the release does not build (or a misspelt extra extension) stopped a ``runbook run --apply`` half way
    (notebook audit, 7 Dec 2026: the preflight notebook said it checked this). A factory that does not answer
    is a note, as for the release."""
    talos = str(ctx.params.talos)
    chosen = {node.name for node in nodes}
    lists: dict[tuple[str, ...], list[str]] = {}  # each extension list, and the nodes whose schematic it is
    for plan in ctx.plan.nodes:
        if plan.name in chosen and plan.extensions:
            lists.setdefault(tuple(plan.extensions), []).append(plan.name)
    try:
        available = available if available is not None else client.official_extensions(talos)
    except RunbookError as exc:
        return Check("image factory extensions", True, f"not checked: {exc.message}")
    problems: list[str] = []
    hints: list[str] = []
    for extensions, names in sorted(lists.items()):
        try:
            resolve_against(available, extensions, talos, source=client.base_url)
        except RunbookError as exc:
            # which nodes, when not all: a node's overrides.extra_extensions was the cause (review of 77170ba)
            whose = "" if len(lists) == 1 else f"{shortened(names)}: "
            problems.append(f"{whose}{exc.message}")
            hints.append(exc.hint or "")
    if problems:
        # the image step's own hint (a name to correct, or a track to choose), then where to see a node's list
        shown = "`runbook schematic show -p <parameters> --node <node>` shows a node's extensions"
        fix = "; ".join([*(h for h in dict.fromkeys(hints) if h), shown])
        return Check("image factory extensions", False, "; ".join(problems), fix=fix)
    names = sorted({name for extensions in lists for name in extensions})
    return Check("image factory extensions", True, f"Talos {talos} offers {', '.join(names)}")


def _kubectl_check(ctx: Context, result: StepResult, versions: dict[str, str]) -> None:
    """kubectl must run where a patch may reboot the nodes (the default-runtime patch up to Talos 1.13): the
    config-patch step drains each such node with it first (``drains``), and refuses to patch one it cannot
    drain. Checked here so a missing kubectl stops the run before any node changes, not at the canary."""
    try:
        versions["kubectl"] = ctx.kubectl.version()
        result.checks.append(Check("kubectl", True, f"kubectl {versions['kubectl']}"))
    except RunbookError as exc:
        result.checks.append(
            Check(
                "kubectl",
                False,
                exc.message,
                fix="install kubectl or set tools.kubectl: default_runtime_patch reboots the nodes up to Talos "
                "1.13, and each is drained with kubectl first",
            )
        )


def _helm_check(version: str) -> Check:
    """helm must be 3.14 or newer: the Kubernetes step upgrades an existing release with
    ``--reset-then-reuse-values`` (helm@v3.14.0 cmd/helm/upgrade.go:255) so the site's own values stay; an older
    helm fails there with ``unknown flag``, after the step may have changed other things (on the GPU Operator
    layer: the device plugin uninstalled). ``version`` is ``helm version --short`` (``v3.13.3+g<commit>``, helm@v3.13.0
    cmd/helm/version.go:94-103); one that does not read as a version is not compared."""
    match = re.match(r"^v?(\d+)\.(\d+)", version.strip())
    if match is None or (int(match.group(1)), int(match.group(2))) >= (3, 14):
        return Check("helm", True, f"helm {version}")
    return Check(
        "helm",
        False,
        f"helm {version} is older than 3.14: it cannot upgrade a release keeping the values the site gave it "
        "(--reset-then-reuse-values)",
        fix="install helm 3.14 or newer and point tools.helm at it",
    )


def _read_nodes(
    ctx: Context, nodes: list[Node], addresses: list[str], servers: dict[str, str], errors: dict[str, str]
) -> _NodeReads:
    """Read extensions, PCI devices and machine configs of all nodes up front, so the per-node checks
    make no calls of their own (one call per node would not scale to large clusters)."""
    extensions = ctx.talosctl.get("extensions", addresses)
    ext_by_node = extensions.by_node()
    pci = read_pci(ctx, [a for a in addresses if a in servers])
    configs, config_errors = read_configs(ctx, nodes)
    return _NodeReads(servers, errors, ext_by_node, pci, configs, config_errors, dict(extensions.errors))


def _check_node(ctx: Context, res: NodeResult, node: Node, reads: _NodeReads) -> None:
    """Fill one node's result.  Only what would make a later step harm the node fails it (unreachable, another
    release, no GPU: the module docstring says why); the rest is progress, so a re-run shows the no-op steps."""
    if node.address in reads.errors or node.address not in reads.servers:
        _unreachable(res, node, reads.errors)
        return
    running = reads.servers[node.address]
    res.data["talos_version"] = running
    res.checks.append(_version_check(ctx, running))
    kube_nodes = reads.kube_nodes
    res.checks += node_identity.checks(node, kube_nodes) if kube_nodes is not None else []
    # another machine's PCI bus says nothing of this node
    identity = node_identity.elsewhere(node, kube_nodes) if kube_nodes is not None else []
    exts = extensions_from_resources(reads.extensions.get(node.address, []))
    names = extension_versions(exts)
    nvidia = {k: v for k, v in names.items() if "nvidia" in k}
    planned_schematic = ctx.plan.schematic_of(node.name)
    res.data["nvidia_extensions"] = nvidia
    # the image the run found the node on, as the image step's ``before`` says it: rollback's fallback when an
    # interrupted run's image step left no result (model/rollback.py ``_add_images``)
    if node.address not in reads.extension_errors:  # unread is not "no schematic" (a stock installer)
        res.data["schematic_id"] = schematic_id(exts)
    if node.address in reads.pci and not identity:
        res.checks.append(gpu_check(ctx, node, reads.pci[node.address], has_gpu_image=bool(nvidia)))
    res.data["image_done"] = bool(planned_schematic) and schematic_id(exts) == planned_schematic
    res.data["config_done"] = node.address in reads.configs and contains(
        reads.configs[node.address], wanted_documents(ctx, node)
    )
    res.status = "ok" if all(c.ok for c in res.checks) else "failed"
    res.message = (
        f"{running}; NVIDIA extensions: {', '.join(f'{k} {v}' for k, v in nvidia.items()) or 'none'}; "
        f"image {'done' if res.data['image_done'] else 'to do'}, config {'done' if res.data['config_done'] else 'to do'}"
    )


#: What talosctl prints, before contacting any node, when it cannot read its talosconfig (the real talosctl
#: v1.12.0, given a file that is not YAML: ``failed to open config file "<path>": yaml: mapping values are not
#: allowed in this context``).
CONFIG_UNREADABLE = "failed to open config file"


def _unreachable(res: NodeResult, node: Node, errors: dict[str, str]) -> None:
    """Fail a node that did not answer: nothing else about it can be known, and a step would fail on it.

    A talosconfig talosctl cannot read is named so, with the parameter to fix: it was "unreachable: bring the
    node back (power, network …)" on every node (attack re-run, 7 Dec 2026)."""
    res.status = "failed"
    error = errors.get(node.address, "no answer to talosctl version")
    if CONFIG_UNREADABLE in error:
        res.message = f"talosctl cannot read its talosconfig: {error}"
        fix = "point the `talosconfig` parameter at a valid talosconfig (`talosctl --talosconfig <file> config info`)"
        cause = "the talosconfig is not one talosctl can read"
        res.checks.append(Check("talosconfig readable", False, res.message, fix=fix, cause=cause))
        return
    res.message = f"unreachable: {error}"
    res.checks.append(
        Check(
            "reachable",
            False,
            res.message,
            fix=fixes.unreachable(node.address, "preflight"),
            cause="node down or rebooting",
        )
    )


def _mixed_releases(result: StepResult) -> None:
    """A note when the nodes run more than one Talos release: each failed node's fix says "set talos_version:
    <its release>", and no one value passes them all (a cloud-user walkthrough, 7 Dec 2026)."""
    by_release: dict[str, list[str]] = {}
    for res in result.nodes:
        running = res.data.get("talos_version")
        if isinstance(running, str) and running:
            by_release.setdefault(running, []).append(res.node)
    if len(by_release) < 2:
        return
    each = "; ".join(f"{release}: {shortened(names)}" for release, names in sorted(by_release.items()))
    result.notes.append(
        f"the nodes run {len(by_release)} Talos releases ({each}): one run covers one release (talos_version), "
        "so bring them to one release first, or run the runbook for each release with its nodes (`nodes`, or "
        "one parameter file per release)"
    )


def _version_check(ctx: Context, running: str) -> Check:
    """A node on another release than the plan would get the wrong installer and kernel-module tag.

    The fix says how to move the node without losing what it runs, and gives no command to paste: the image
    step's own command for a node carries flags a hand-written one forgets (``--preserve`` below 1.8, which
    otherwise wipes ``/var``; ``--legacy`` for kernel arguments; ``-n`` and the run's talosconfig) (review of
    77170ba). Newer than the plan: only the parameter, as the image step moves no node back."""
    wanted = ctx.params.talos
    if _same_release(running, wanted):
        return Check("Talos version", True, f"runs {running}")
    message = f"runs {running}, the plan is for {wanted}"
    found = TalosVersion.parse_or_none(running)
    fix = f"set talos_version: {running}"
    if found is None or found < wanted:
        fix += f", or upgrade the node to {wanted} first{_keeping_extensions(ctx, running)}"
    return Check("Talos version", False, message, fix=fix)


def _keeping_extensions(ctx: Context, running: str) -> str:
    """How a node keeps what it runs while it moves to the plan's release (the tail of :func:`_version_check`'s
    fix): from Talos 1.5 an Image Factory installer whose schematic has the extensions it runs, at the new tag
    (the stock installer drops every extension, facts §2.1; below 1.5 extensions come from
    ``machine.install.extensions``, which the stock installer keeps); ``--preserve`` where either end is below 1.8,
    as the image step passes it (``upgrade_risks.preserve_needed``: up to 1.7 the installer wipes ``/var``
    without it, and a 1.7 node builds its upgrade sequence from the flag) — below 1.5 too (review of 0225717);
    going to 1.13 with the GPU Operator planned, the device plugin removed first (the Talos 1.13 upgrade notes;
    not with ``kubernetes_layer: device-plugin``, which keeps it)."""
    wanted = ctx.params.talos
    how = []
    if wanted.at_least(1, 5):
        how.append(
            "an Image Factory installer whose schematic has the extensions it runs, at that tag (the stock "
            "installer drops its extensions)"
        )
    if preserve_needed(wanted, running):
        how.append("--preserve, as the image step passes it where either release is below Talos 1.8")
    tail = f", with {' and '.join(how)}" if how else ""
    if gpu_operator_handover.needed_before_upgrade(ctx, [running]):
        tail += ", after uninstalling the device plugin's Helm release and deleting RuntimeClass nvidia (Talos 1.13 upgrade notes)"
    return tail


def _count_done(ctx: Context, result: StepResult, nodes: list[Node], config_errors: dict[str, str]) -> None:
    """Count the nodes whose image and config are done, out of all listed nodes (unreachable ones count as
    not done), and say what could not be checked, so a partial answer is not taken for progress."""
    reachable = [n for n in result.nodes if "image_done" in n.data]
    result.data["done"] = {
        "image": f"{sum(bool(n.data['image_done']) for n in reachable)}/{len(nodes)}",
        "config": f"{sum(bool(n.data['config_done']) for n in reachable)}/{len(nodes)}",
    }
    result.notes += _uneven_progress(reachable)
    if config_errors:
        result.notes.append(f"machine config unreadable on {len(config_errors)} node(s)")
    unchecked = not_checked_note(ctx)
    if unchecked:
        result.notes.append(unchecked)


def _uneven_progress(reachable: list[NodeResult]) -> list[str]:
    """Which nodes still need the config patch or the image, when some have it and some do not (an interrupted
    or failed rollout). Why: the go-on line after an interrupt says to see where the nodes are with a preflight,
    which printed only "3 ok": which node was left was in its result file (README audit, stop 50). Said only when
    the nodes differ: all to do or all done is what the step lines already say."""
    notes = []
    for what in ("config", "image"):
        left = [n.node for n in reachable if not n.data[f"{what}_done"]]
        if left and len(left) < len(reachable):
            step = "config-patch" if what == "config" else "image"
            notes.append(f"{step} still to do on {len(left)} of {len(reachable)} node(s): {shortened(left)}")
    return notes


def _cluster_progress(
    ctx: Context, result: StepResult, layer: permissions.LayerReads, steps: Collection[str] | None
) -> None:
    """Record whether the RuntimeClass and the Helm release exist (as the permission check read them, else read
    here); an unreadable API is only a note, since this is progress to report, not a reason to stop. A release
    a stopped helm left ``uninstalling`` or ``pending-*`` fails preflight when the run includes the kubernetes
    step: that step refuses it, and the image and config-patch steps before it would have changed the nodes."""
    plan = ctx.plan
    try:
        if layer.runtime_class is None:
            layer.runtime_class = ctx.kube.runtime_class("nvidia") is not None
        result.data["done"]["runtimeclass"] = layer.runtime_class
        if layer.release_error is not None:
            raise layer.release_error
        if layer.release is None:
            layer.release = (ctx.helm.release(plan.helm.release, plan.helm.namespace),)
        (release,) = layer.release
        result.data["done"]["helm_release"] = f"{release.chart} ({release.status})" if release else None
        stuck = None if release is None else kubernetes.stuck_release(release)
        if stuck is not None and permissions.runs_step(steps, "kubernetes"):
            result.checks.append(
                Check(f"helm release {plan.helm.release}", False, stuck.message, fix=stuck.hint or "")
            )
    except RunbookError as exc:
        result.notes.append(f"Kubernetes state not read: {exc.message}")


def _client_check(client: str | None, wanted: TalosVersion) -> Check:
    """The talosctl client must be at least the target's minor release.

    Why: ``talosctl patch`` loads and merges the patch documents client-side
    (talos@v1.13.0:cmd/talosctl/cmd/talos/patch.go, ``configpatcher.LoadPatches``), so a client older than
    the node cannot parse the documents of the newer release: talosctl 1.13 answers
    ``"KernelModuleConfig" "v1alpha1": not registered`` for the 1.14 modules patch
    (talos@v1.13.0:pkg/machinery/config/internal/registry/registry.go:79).  A newer client is supported.
    """
    if client is None:
        return Check(
            "talosctl", False, "talosctl client did not answer", fix="check the tools.talosctl parameter"
        )
    try:
        minor = TalosVersion.parse(client).minor_line
    except RunbookError:
        return Check("talosctl", True, f"talosctl client {client} (version not recognised, not compared)")
    if minor >= wanted.minor_line:
        return Check("talosctl", True, f"talosctl client {client}")
    line = f"v{wanted.major}.{wanted.minor}"
    return Check(
        "talosctl",
        False,
        f"talosctl client {client} is older than the target release {wanted}: it cannot read the {line} "
        "machine-config documents the config-patch step sends",
        fix=f"install talosctl {line} or newer (same minor as the nodes or later) and point tools.talosctl at it",
        cause="talosctl parses and merges patches client-side",
    )


def _same_release(running: str, wanted: TalosVersion) -> bool:
    try:
        return str(TalosVersion.parse(running)) == str(wanted)
    except RunbookError:
        return False
