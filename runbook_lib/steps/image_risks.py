"""The image step's guards against silent losses: extensions, kernel arguments, the cloud platform.

Why a module of its own: ``talosctl upgrade`` succeeds in all three cases and the damage shows later
(storage without iscsi-tools, a node booted without its kernel arguments, an AWS node booted as metal).
So, before anything changes, each node's platform and ``machine.install`` are read (two fan-out calls)
and the pure rules of ``model.upgrade_risks`` decide: refuse with the parameter line that fixes it, or
add ``--legacy`` to the upgrade.  Sources are cited in ``model.upgrade_risks``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from runbook_lib.errors import PermanentError
from runbook_lib.model.boot_assets import installer_kind
from runbook_lib.model.params import Node
from runbook_lib.model.upgrade_risks import (
    InstallSettings,
    config_installed_extensions,
    dropped_extensions,
    install_settings,
    keep_extensions_line,
    legacy_upgrade_needed,
    node_platform,
)
from runbook_lib.model.versions import TalosVersion

from .context import Context
from .patch import read_configs
from .results import Check

DEFAULT_PLATFORM = "metal"


@dataclass(frozen=True)
class NodeFacts:
    """A node's platform (``None`` when unreadable) and kernel-argument settings, or why they are unknown."""

    platform: str | None = None
    install: InstallSettings = field(default_factory=InstallSettings)
    error: str | None = None


Configs = tuple[dict[str, list[dict[str, Any]]], dict[str, str]]


def read_facts(
    ctx: Context, nodes: Sequence[Node], configs_read: Configs | None = None
) -> dict[str, NodeFacts]:
    """``get platformmetadata`` and ``get machineconfig`` for every node: two fan-out calls; ``configs_read``: the
    machine configs the caller read already (``patch.read_configs``), so they are not read twice."""
    if not nodes:
        return {}
    fan = ctx.talosctl.get("platformmetadata", [n.address for n in nodes])
    by_node = fan.by_node()
    configs, config_errors = configs_read if configs_read is not None else read_configs(ctx, list(nodes))
    facts: dict[str, NodeFacts] = {}
    for node in nodes:
        error = fan.errors.get(node.address) or config_errors.get(node.address)
        if error is None and node.address not in configs:
            error = "no machine config in the answer"
        facts[node.address] = NodeFacts(
            platform=node_platform(by_node.get(node.address, [])),
            install=install_settings(configs.get(node.address, [])),
            error=error,
        )
    return facts


def installer_platform(ctx: Context, fact: NodeFacts) -> str:
    """The platform to name the installer after; metal when it cannot be used (the node is then refused)."""
    if fact.platform is None:
        return DEFAULT_PLATFORM
    try:
        installer_kind(ctx.params.talos, fact.platform)
    except PermanentError:
        return DEFAULT_PLATFORM
    return fact.platform


def refusals(
    ctx: Context, node: Node, fact: NodeFacts, planned: Sequence[str], current: Sequence[str]
) -> list[Check]:
    """Failed checks that stop this node's upgrade; empty when it may go ahead."""
    checks: list[Check] = []
    if fact.error:
        message = f"cannot read the node's platform and install settings: {fact.error}"
        return [Check("platform and install settings", False, message, fix=_get(node, "platformmetadata"))]
    checks += _platform_check(ctx, node, fact)
    dropped = dropped_extensions(current, planned)
    if dropped:
        every = keep_extensions_line(ctx.params.extra_extensions, dropped)
        own = keep_extensions_line(node.overrides.extra_extensions, dropped)
        message = f"the upgrade would remove {', '.join(dropped)}: the new schematic has only the planned extensions"
        fix = f"add to the parameters: {every} (every GPU node), or to this node's overrides: {own}"
        checks.append(
            Check("no extension dropped", False, message, fix=fix, cause="extensions not in the plan")
        )
    return checks


def _platform_check(ctx: Context, node: Node, fact: NodeFacts) -> list[Check]:
    if fact.platform is None:
        if ctx.params.talos.at_least(1, 10):
            message = "the node reports no PlatformMetadata, so its installer platform is unknown"
            return [Check("installer platform", False, message, fix=_get(node, "platformmetadata"))]
        return []
    try:
        installer_kind(ctx.params.talos, fact.platform)
    except PermanentError as exc:
        return [Check("installer platform", False, exc.message, fix=exc.hint or "")]
    return []


def kept_by_config(ctx: Context, fact: NodeFacts, node_version: str | None) -> set[str]:
    """Extensions the node keeps through ``machine.install.extensions`` (Talos up to 1.9, see the model)."""
    version = _version(node_version)
    if version is None:
        return set()
    return config_installed_extensions(fact.install, version, ctx.params.talos)


def legacy_needed(fact: NodeFacts, client: str | None) -> bool:
    """Whether this node's upgrade needs ``--legacy`` to keep its ``extraKernelArgs``."""
    version = _version(client)
    return version is not None and legacy_upgrade_needed(fact.install, version)


def legacy_note(names: Sequence[str]) -> str:
    """What the plan says when ``--legacy`` is added, and the lasting fix."""
    return (
        f"{', '.join(names)}: machine.install.extraKernelArgs with grubUseUKICmdline not true, so the upgrade runs "
        "with --legacy (talosctl 1.13+'s new upgrade API would drop them silently; --legacy is removed in "
        "1.18). Lasting fix: put the arguments in extra_kernel_args (the schematic), set "
        "grubUseUKICmdline: true and remove extraKernelArgs"
    )


def drains(node_version: str | None, client: str | None, *, legacy: bool) -> bool:
    """Whether ``talosctl upgrade`` will drain this node: talosctl 1.13+ drains by default (``--drain``, which the
    step does not pass, defaults to true) whenever it uses the new upgrade API, i.e. the node runs 1.13+
    (talos@v1.13.0:cmd/talosctl/cmd/talos/upgrade.go:69-71,85,115-126,360) and ``--legacy`` is not set.

    A node release the runbook cannot read (not answered, or a development build's ``git describe`` tag, which
    talosctl parses tolerantly, helpers/checks.go:55-75) counts as draining: the answer sets how long the upgrade
    may run, and stopping one midway through its drain leaves the node cordoned."""
    node, cli = _version(node_version), _version(client)
    if legacy or cli is None or not cli.at_least(1, 13):
        return False
    return node is None or node.at_least(1, 13)


def drain_note(names: Sequence[str]) -> str:
    """What the plan says about the drain talosctl 1.13+ does on its own (drain.go, nodedrain.go at v1.13.0); a
    failed drain returns before the uncordon is deferred (upgrade.go:143-160), so the cordon stays."""
    return (
        f"{', '.join(names)}: talosctl 1.13+ drains each node after installing and before its reboot: cordon, "
        "evict every pod but DaemonSets' (PodDisruptionBudgets respected, 5 min timeout), then uncordon once "
        "the node is Ready again. It fetches the kubeconfig from talosctl's endpoint, which must be a "
        "control-plane node; a failed drain leaves the node cordoned, with the new image installed for its next "
        "reboot"
    )


def _version(tag: str | None) -> TalosVersion | None:
    """A talosctl or node version tag, or None when it is missing or unparsable."""
    return TalosVersion.parse_or_none(tag)


def _get(node: Node, resource: str) -> str:
    return f"talosctl -n {node.address} get {resource}"
