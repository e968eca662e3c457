"""Step: preflight — can the runbook act on this cluster, and how much of the procedure is already done?

Read-only.  Why it fails on what it fails on: an unreachable node or a node on another Talos release than
the plan would get the wrong installer and kernel-module tag, and a listed node without an NVIDIA GPU
(Talos >= 1.8 shows the PCI bus) would get the GPU installer and hang in its boot, so those stop the run
before any change;
everything else (extensions present, config patched, RuntimeClass, Helm release) is reported as progress,
so a re-run shows at a glance which steps will be no-ops.
"""

from __future__ import annotations

from runbook_lib.errors import RunbookError
from runbook_lib.model.machineconfig import contains
from runbook_lib.model.parsers import extension_versions, extensions_from_resources, schematic_id
from runbook_lib.model.versions import TalosVersion

from . import fixes
from .context import Context
from .gpu_presence import gpu_check, not_checked_note, read_pci
from .patch import read_configs, wanted_documents
from .results import Check, NodeResult, StepResult


def preflight(ctx: Context, *, only: list[str] | None = None) -> StepResult:
    nodes = ctx.nodes(only)
    addresses = [n.address for n in nodes]
    result = StepResult(step="preflight", applied=False)
    plan = ctx.plan
    versions: dict[str, str] = {}

    client, servers, errors = ctx.talosctl.version(addresses)
    result.checks.append(_client_check(client, ctx.params.talos))
    versions["talosctl"] = client or "unknown"
    try:
        versions["helm"] = ctx.helm.version()
        result.checks.append(Check("helm", True, f"helm {versions['helm']}"))
    except RunbookError as exc:
        result.checks.append(
            Check("helm", False, exc.message, fix=exc.hint or "install helm or set tools.helm")
        )
    try:
        versions["kubernetes"] = ctx.kube.server_version()
        result.checks.append(Check("kubernetes API", True, f"Kubernetes {versions['kubernetes']}"))
    except RunbookError as exc:
        result.checks.append(
            Check("kubernetes API", False, exc.message, fix=exc.hint or "check the kubeconfig parameter")
        )
    result.data["versions"] = versions

    extensions = ctx.talosctl.get("extensions", addresses)
    ext_by_node = extensions.by_node()
    pci = read_pci(ctx, [a for a in addresses if a in servers])
    configs, config_errors = read_configs(ctx, nodes)
    wanted_talos = ctx.params.talos
    for node in nodes:
        res = NodeResult(node=node.name, address=node.address)
        result.nodes.append(res)
        if node.address in errors or node.address not in servers:
            res.status = "failed"
            res.message = f"unreachable: {errors.get(node.address, 'no answer to talosctl version')}"
            res.checks.append(
                Check(
                    "reachable",
                    False,
                    res.message,
                    fix=fixes.unreachable(node.address, "preflight"),
                    cause="node down or rebooting",
                )
            )
            continue
        running = servers[node.address]
        res.data["talos_version"] = running
        same = _same_release(running, wanted_talos)
        res.checks.append(
            Check(
                "Talos version",
                same,
                f"runs {running}" + ("" if same else f", the plan is for {wanted_talos}"),
                fix=""
                if same
                else f"upgrade the node to {wanted_talos} first, or set talos_version: {running}",
            )
        )
        exts = extensions_from_resources(ext_by_node.get(node.address, []))
        names = extension_versions(exts)
        nvidia = {k: v for k, v in names.items() if "nvidia" in k}
        planned_schematic = next(
            (p.schematic_id for p in plan.nodes if p.name == node.name), plan.schematic_id
        )
        res.data["nvidia_extensions"] = nvidia
        if node.address in pci:
            res.checks.append(gpu_check(ctx, node, pci[node.address], has_gpu_image=bool(nvidia)))
        res.data["image_done"] = bool(planned_schematic) and schematic_id(exts) == planned_schematic
        res.data["config_done"] = node.address in configs and contains(
            configs[node.address], wanted_documents(ctx, node)
        )
        res.status = "ok" if all(c.ok for c in res.checks) else "failed"
        res.message = (
            f"{running}; NVIDIA extensions: {', '.join(f'{k} {v}' for k, v in nvidia.items()) or 'none'}; "
            f"image {'done' if res.data['image_done'] else 'to do'}, config {'done' if res.data['config_done'] else 'to do'}"
        )
    reachable = [n for n in result.nodes if "image_done" in n.data]
    result.data["done"] = {
        "image": f"{sum(bool(n.data['image_done']) for n in reachable)}/{len(nodes)}",
        "config": f"{sum(bool(n.data['config_done']) for n in reachable)}/{len(nodes)}",
    }
    if config_errors:
        result.notes.append(f"machine config unreadable on {len(config_errors)} node(s)")
    unchecked = not_checked_note(ctx)
    if unchecked:
        result.notes.append(unchecked)
    try:
        runtime_class = ctx.kube.runtime_class("nvidia")
        result.data["done"]["runtimeclass"] = runtime_class is not None
        release = ctx.helm.release(plan.helm.release, plan.helm.namespace)
        result.data["done"]["helm_release"] = f"{release.chart} ({release.status})" if release else None
    except RunbookError as exc:
        result.notes.append(f"Kubernetes state not read: {exc.message}")
    return result.finish()


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
