"""What an upgrade to the GPU schematic would silently take away from a node, worked out before it runs.

Why: ``talosctl upgrade`` reports success in each of these cases, and the loss shows only later.

- Extensions: a factory installer installs exactly its schematic's extensions, so a node that runs
  iscsi-tools, drbd or qemu-guest-agent and is upgraded to the NVIDIA schematic loses them: storage and
  agents break (docs:public/talos/v1.12/platform-specific-installations/boot-assets.mdx:236-250,
  "upgrade to a new schematic").
- Kernel arguments: talosctl 1.13+ upgrades through ``LifecycleService.Upgrade``
  (talos@v1.14.0-rc.1:cmd/talosctl/cmd/talos/upgrade.go:88-130), which does not pass
  ``.machine.install.extraKernelArgs``; a GRUB node whose ``grubUseUKICmdline`` is not true reboots without
  them (docs:public/talos/v1.13/configure-your-talos-cluster/lifecycle-management/upgrading-talos.mdx:121-137).
- Platform: from Talos 1.10 the factory installer is per platform (``aws-installer``…), read from the node's
  ``PlatformMetadata`` resource (talos@v1.13.0:pkg/machinery/resources/runtime/platform_metadata.go).

Pure: the step reads the node, this module decides.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .parsers import TalosResource
from .versions import TalosVersion

#: Extensions the plan replaces rather than drops: the kernel modules and toolkit of any flavour or track.
NVIDIA_REPLACED_PREFIXES = (
    "nvidia-open-gpu-kernel-modules",
    "nonfree-kmod-nvidia",
    "nvidia-container-toolkit",
)
#: The virtual extension that carries the schematic ID (image-factory internal/artifacts/schematic.go).
SCHEMATIC_EXTENSION = "schematic"
#: talosctl uses the LifecycleService upgrade API from 1.13 (upgrade.go ``talosUpgradeAPIVersionRange``).
UPGRADE_API_CLIENT = (1, 13)


def dropped_extensions(current: Iterable[str], planned: Iterable[str]) -> list[str]:
    """Official names (``siderolabs/<name>``) of the node's extensions that the planned schematic lacks.

    ``current`` are the names ``talosctl get extensions`` shows (the manifest name, which is the official
    name without ``siderolabs/``, e.g. extensions@v1.12.0:storage/iscsi-tools/manifest.yaml.tmpl).  The
    NVIDIA kernel modules and toolkit are left out: changing their flavour or track is the plan itself.
    """
    wanted = {name.removeprefix("siderolabs/") for name in planned}
    out: list[str] = []
    for name in current:
        bare = name.removeprefix("siderolabs/")
        if bare in wanted or bare == SCHEMATIC_EXTENSION or bare.startswith(NVIDIA_REPLACED_PREFIXES):
            continue
        if f"siderolabs/{bare}" not in out:
            out.append(f"siderolabs/{bare}")
    return out


def keep_extensions_line(extra: Sequence[str], dropped: Sequence[str]) -> str:
    """The ``extra_extensions`` parameter line that keeps ``dropped`` besides what ``extra`` already asks."""
    names = list(dict.fromkeys([*extra, *dropped]))
    return f"extra_extensions: [{', '.join(names)}]"


@dataclass(frozen=True)
class InstallSettings:
    """The kernel-argument settings of a node's ``machine.install``."""

    extra_kernel_args: tuple[str, ...] = ()
    extension_images: tuple[str, ...] = ()
    """``machine.install.extensions[].image``: the installer pulls them too up to Talos 1.9."""
    grub_use_uki_cmdline: bool | None = None
    """``None`` when the config does not set it: false, as in every config generated before Talos 1.12
    (talos@v1.12.0:pkg/machinery/config/generate/worker.go:58-59 sets it only from the 1.12 contract)."""


def install_settings(documents: Sequence[Mapping[str, Any]]) -> InstallSettings:
    """``machine.install.extraKernelArgs`` and ``grubUseUKICmdline`` of the v1alpha1 document, if any."""
    for doc in documents:
        if "kind" in doc or doc.get("version") != "v1alpha1":
            continue
        install = (doc.get("machine") or {}).get("install") or {}
        args = install.get("extraKernelArgs") or []
        images = [e.get("image") for e in install.get("extensions") or [] if isinstance(e, dict)]
        flag = install.get("grubUseUKICmdline")
        return InstallSettings(
            extra_kernel_args=tuple(str(a) for a in args if isinstance(args, list)),
            extension_images=tuple(str(i) for i in images if i),
            grub_use_uki_cmdline=flag if isinstance(flag, bool) else None,
        )
    return InstallSettings()


def config_installed_extensions(
    settings: InstallSettings, node: TalosVersion, target: TalosVersion
) -> set[str]:
    """Extension names the installer keeps from ``machine.install.extensions`` whatever the schematic.

    Up to Talos 1.9 the install pulls those images besides the installer's own
    (talos@v1.9.6:internal/pkg/install/install.go:59-104); 1.10 no longer reads the field.  Between a 1.9
    node and a 1.10 target it is unknown which side wins, so nothing is counted as kept there.  The name is
    the image's repository name (``ghcr.io/siderolabs/iscsi-tools:v0.1.6`` → ``iscsi-tools``), which is the
    manifest name of official extensions.
    """
    if node.at_least(1, 10) or target.at_least(1, 10):
        return set()
    names = set()
    for image in settings.extension_images:
        repository = image.split("@", 1)[0].rsplit("/", 1)[-1]
        names.add(repository.split(":", 1)[0])
    return names


def legacy_upgrade_needed(settings: InstallSettings, client: TalosVersion) -> bool:
    """True when the new upgrade API of this talosctl would drop the node's ``extraKernelArgs``.

    Nodes booting systemd-boot are unaffected (their command line comes from the UKI), but the boot loader
    is not in the machine config; ``--legacy`` is harmless there, so it is asked for whenever the config
    says GRUB would build the command line from ``extraKernelArgs``.
    """
    if not settings.extra_kernel_args or settings.grub_use_uki_cmdline is True:
        return False
    return client.minor_line >= UPGRADE_API_CLIENT


def node_platform(resources: Sequence[TalosResource]) -> str | None:
    """``spec.platform`` of the node's ``PlatformMetadata`` (``talosctl get platformmetadata``), or None.

    Table output carries it in the ``PLATFORM`` print column (platform_metadata.go print columns).
    """
    for resource in resources:
        value = (resource.spec or {}).get("platform") or resource.columns.get("PLATFORM")
        if value:
            return str(value)
    return None


def preserve_needed(target: TalosVersion, running: str | None) -> bool:
    """Whether an upgrade from ``running`` to ``target`` needs ``--preserve`` (``upgrade_flags``): either end
    below Talos 1.8.

    The target: up to 1.7 the installer wipes EPHEMERAL without it (talos@v1.7.0 internal/pkg/install/
    install.go:292). The running release too: its machined builds the upgrade sequence from the request's
    preserve flag, and without it a control-plane node removes all pods and leaves etcd before the new installer
    runs (talos@v1.7.0 internal/app/machined/pkg/runtime/v1alpha1/v1alpha1_sequencer.go:462-488), so a 1.7 node
    going to 1.8 needs it as well. A running release that cannot be read counts as old: talosctl 1.8 to 1.14
    accept the flag, hidden."""
    if not target.at_least(1, 8):
        return True
    found = TalosVersion.parse_or_none(running)
    return found is None or not found.at_least(1, 8)
