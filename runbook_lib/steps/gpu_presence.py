"""Does each node in the GPU list have an NVIDIA GPU?  Asked of the node's PCI bus, before anything changes.

Why before: the image step gives every listed node the GPU installer, and on a node without an NVIDIA GPU
``ext-nvidia-persistenced`` waits for the nvidia driver forever, so the upgrade hangs and the node rolls
back (siderolabs/extensions#888).  ``talosctl get pcidevices`` exists from Talos 1.8 on
(:mod:`runbook_lib.model.pci`); on older releases the presence of a GPU cannot be checked here.
"""

from __future__ import annotations

from collections.abc import Sequence

from runbook_lib.model.diagnosis import check_gpu_present
from runbook_lib.model.params import Node
from runbook_lib.model.pci import PCI_DEVICES_RESOURCE, PciDevice, lists_pci_devices, pci_devices

from .context import Context
from .results import Check


def read_pci(ctx: Context, addresses: Sequence[str]) -> dict[str, list[PciDevice]]:
    """Each node's PCI devices (one fan-out call); a node missing from the answer could not be asked.

    Empty when the planned release has no PCIDevices resource (Talos < 1.8).
    """
    if not addresses or not lists_pci_devices(ctx.params.talos):
        return {}
    fan = ctx.talosctl.get(PCI_DEVICES_RESOURCE, list(addresses))
    by_node = fan.by_node()
    return {a: pci_devices(by_node.get(a, [])) for a in addresses if a not in fan.errors}


def not_checked_note(ctx: Context) -> str | None:
    """What to say when GPU presence cannot be asked of the nodes."""
    if lists_pci_devices(ctx.params.talos):
        return None
    return (
        f"GPU presence not checked: Talos {ctx.params.talos} has no PCIDevices resource (`talosctl get "
        "pcidevices` exists from Talos 1.8); make sure every node in `nodes:` has an NVIDIA GPU"
    )


def gpu_check(ctx: Context, node: Node, devices: list[PciDevice], *, has_gpu_image: bool) -> Check:
    """The ``nvidia-gpu`` check of one node; when it fails, the fix takes the node out of the GPU list and,
    if it already runs a GPU image, gives it back a non-GPU one (failure table row ``no-nvidia-gpu``)."""
    found = check_gpu_present(devices, ctx.node_context(node.address))
    if found.ok:
        return Check(found.check, True, found.message)
    fix = f"remove {node.name} ({node.address}) from `nodes:` in the parameter file: it is not a GPU node"
    if has_gpu_image:
        fix += f"; it already runs a GPU image, so also {found.fix}"
    return Check(found.check, False, found.message, fix=fix, cause=found.cause)
