"""What a step tells the user to do when a node fails for a reason the runbook cannot name.

Why one place: a ``fix`` must be what to *do* (the attack report of 2026-12-01, F13, found read-only commands
such as ``talosctl version`` given as the fix). Here the read-only command stays, as the way to check the fix
worked, followed by how to resume: the steps skip what is already done, so re-running one retries only the
nodes that still need it.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from runbook_lib.errors import RunbookError
from runbook_lib.model.boot_assets import installer_kind
from runbook_lib.model.upgrade_risks import node_platform
from runbook_lib.model.versions import TalosVersion

from .results import NodeResult, StepResult

if TYPE_CHECKING:
    from .context import Context

#: The installer the fix commands of the failure table name (``NodeContext.fill``) where the platform is unknown.
METAL_INSTALLER = "/metal-installer/"


def names_metal_installer(res: NodeResult) -> bool:
    """Whether a failed check of this node gives an upgrade command with the metal installer."""
    return any(METAL_INSTALLER in check.fix for check in res.checks if not check.ok)


def own_installers(result: StepResult, platforms: Mapping[str, str | None], talos: TalosVersion) -> None:
    """Name each node's own platform installer (``aws-installer`` on AWS) in its fix commands, where the failure
    table wrote ``metal-installer`` (``platforms``: by address, as PlatformMetadata says). Why: the factory
    serves one installer per platform (image-factory internal/frontend/http/registry.go:74-100) and Talos names
    it after the platform (talos@v1.14.1 pkg/images/images.go:79); the image step upgrades an AWS node with
    aws-installer, while every fix said metal-installer (Talos profiles review, 7 Dec 2026). A node whose
    platform is unknown, or cannot be an image name (the image step refuses it), keeps the metal one."""
    for res in result.nodes:
        platform = platforms.get(res.address)
        if platform in (None, "metal"):
            continue
        try:
            own = f"/{installer_kind(talos, platform or '')}/"
        except RunbookError:
            continue
        for check in res.checks:
            check.fix = check.fix.replace(METAL_INSTALLER, own)


def name_own_installers(ctx: Context, result: StepResult) -> None:
    """The upgrade commands of failed checks name each node's own platform installer (``aws-installer`` on AWS),
    as the image step upgrades it (``image_risks.installer_platform``), not ``metal-installer``: the factory
    serves one installer per platform (image-factory internal/frontend/http/registry.go:74-100), and Talos
    names it after the platform (talos@v1.14.1 pkg/images/images.go:79, ``InstallerImageRepository``).

    Why after diagnosing: the platform is read (one ``get platformmetadata``) only for the nodes whose failed
    checks give such a command, so a healthy fleet pays no call for it (verify, cuda-test; Talos profiles review, 7 Dec
    2026: every fix said ``metal-installer``). A node whose platform cannot be read keeps ``metal-installer``."""
    needing = [res.address for res in result.nodes if names_metal_installer(res)]
    if not needing or not ctx.params.talos.at_least(1, 10):
        return  # before Talos 1.10 the installer is the same on every platform
    by_node = ctx.talosctl.get("platformmetadata", needing).by_node()
    platforms = {address: node_platform(by_node.get(address, [])) for address in needing}
    own_installers(result, platforms, ctx.params.talos)


def unreachable(address: str, step: str, *, after_preflight: bool = False) -> str:
    """A node that does not answer: nothing on this side fixes it, so say what has to come back, or that the
    parameters may name the wrong address (an operator walkthrough's typo got only "bring the node back"). Not
    ``after_preflight``: an ``--apply`` run's image and config-patch steps follow a preflight that reached the
    node (review of 8fc7b54), while a plan, a checks-only run or a notebook may ask it first (review of 4bc778e)."""
    typo = "" if after_preflight else f"or correct its address in `nodes:` if {address} is not the node's, "
    return (
        f"bring the node back (power, network: apid on port 50000 must answer from here; "
        f"`talosctl -n {address} version` shows it does), {typo}then re-run: runbook run -p <parameters> --steps "
        f"{step}; or take the node out of `nodes:` in the parameters"
    )


def upgrade_failed(address: str) -> str:
    """An upgrade that failed with no known cause: the node is on its previous image (rolled back or kept)."""
    return (
        f"read why in the node's kernel log (`talosctl -n {address} dmesg`), fix that, then re-run the image step: "
        "runbook run -p <parameters> --steps image --apply (it retries only the nodes not yet on the plan)"
    )


#: ``talosctl -n`` where it begins a command in a fix (not inside a path or another word).
_TALOSCTL_N = re.compile(r"(?<![\w/.-])talosctl -n ")


#: ``kubectl <subcommand>`` where it begins a command (not inside a path, and not one already given a kubeconfig).
_KUBECTL = re.compile(r"(?<![\w/.-])kubectl (?!--kubeconfig)(?=[a-z-])")


def kubectl_as_run(binary: str, kubeconfig: str | None) -> Callable[[str], str]:
    """What makes a printed ``kubectl …`` the run's own: its kubectl binary and ``--kubeconfig`` (a global flag,
    before the subcommand). Why: the rollback's ``kubectl label node … nvidia.com/gpu.present-`` and the
    uncordon fixes, pasted, asked the shell's default context, perhaps another cluster, and on the simulator
    failed with "connection to the server localhost:8080 was refused" (operator walkthrough, 7 Dec 2026).
    Unchanged text when the run uses the plain ``kubectl`` with the default kubeconfig."""
    words = [binary, *(["--kubeconfig", kubeconfig] if kubeconfig else [])]
    if words == ["kubectl"]:
        return lambda text: text
    prefix = shlex.join(words) + " "
    return lambda text: _KUBECTL.sub(lambda _m: prefix, text) if text else text


#: ``helm <subcommand>`` where it begins a command (not inside a path or a word such as "helm release").
_HELM = re.compile(
    r"(?<![\w/.-])helm (?!--kubeconfig)(?=(?:uninstall|upgrade|history|status|rollback|list|get|search|repo) )"
)


def helm_as_run(binary: str, kubeconfig: str | None) -> Callable[[str], str]:
    """What makes a printed ``helm …`` the run's own: its helm binary and ``--kubeconfig`` (helm's global flag).
    Why: the rollback's plan and summary printed ``helm uninstall gpu-operator -n gpu-operator …`` beside
    talosctl lines with their ``--talosconfig``: pasted, it acted on the shell's default context, perhaps another
    cluster (operator walkthrough, stop 52), as :func:`kubectl_as_run` found for kubectl. Unchanged text when the
    run uses the plain ``helm`` with the default kubeconfig."""
    words = [binary, *(["--kubeconfig", kubeconfig] if kubeconfig else [])]
    if words == ["helm"]:
        return lambda text: text
    prefix = shlex.join(words) + " "
    return lambda text: _HELM.sub(lambda _m: prefix, text) if text else text


def talosctl_as_run(binary: str, talosconfig: str | None) -> Callable[[str], str]:
    """What makes a fix's ``talosctl -n …`` the run's own: its talosctl binary and ``--talosconfig``.

    Why: a fix said ``talosctl -n 10.5.0.12 dmesg`` while the run used another talosconfig than the shell's
    default (the parameters' ``talosconfig``, or the simulator's): pasted, it asked the default context's cluster,
    which may be another one with the same addresses, and an ``upgrade`` or ``patch`` fix would change it; on
    the simulated cluster it failed (operator walkthrough, 6 Dec 2026; stop 47 did the same for kubectl).
    Unchanged text when the run uses the plain ``talosctl`` with the default config."""
    words = [binary] if binary != "talosctl" else ["talosctl"]
    words += ["--talosconfig", talosconfig] if talosconfig else []
    if words == ["talosctl"]:
        return lambda text: text
    prefix = shlex.join(words) + " -n "
    return lambda text: _TALOSCTL_N.sub(lambda _m: prefix, text) if text else text
