"""A node's PCI devices as Talos reports them, and which of them are NVIDIA GPUs.

Why: a node listed as a GPU node that has no NVIDIA GPU (a CPU-only worker in the list by mistake, or a GPU
not passed through to the VM) gets the GPU installer, and ``ext-nvidia-persistenced`` then waits for the
nvidia driver forever, so the upgrade hangs and rolls back (siderolabs/extensions#888).  Talos shows the PCI
bus as the ``PCIDevices.hardware.talos.dev`` resource from v1.8.0 on ("A list of PCI devices can now be
obtained via `PCIDevices` resource, e.g. `talosctl get pcidevices`": siderolabs/talos v1.8.0
website/content/v1.8/introduction/what-is-new/index.md:125); before 1.8 there is no Talos API that lists
them, so the presence of a GPU cannot be checked before the upgrade.

The spec fields are those of siderolabs/talos v1.8.0 pkg/machinery/resources/hardware/pcidevice.go
(``class``, ``subclass``, ``vendor``, ``product`` names from the PCI database; ``class_id``,
``subclass_id``, ``vendor_id``, ``product_id`` as ``0x``-prefixed hex, written by
internal/app/machined/pkg/controllers/hardware/pcidevices.go: ``fmt.Sprintf("0x%04x", vendorID)``);
``driver`` (the bound kernel driver) exists from v1.10.0.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .parsers import TalosResource
from .versions import TalosVersion

PCI_DEVICES_TYPE = "PCIDevices.hardware.talos.dev"
#: The ``talosctl get`` name of the resource (the release note's spelling).
PCI_DEVICES_RESOURCE = "pcidevices"
PCI_DEVICES_SINCE = (1, 8)
#: NVIDIA's PCI vendor ID (the PCI ID repository, pci.ids: "10de  NVIDIA Corporation").
NVIDIA_VENDOR_ID = 0x10DE
#: PCI base class 0x03, display controller (subclass 0x00 VGA, 0x02 3D controller: every NVIDIA GPU).
DISPLAY_CLASS_ID = 0x03


@dataclass(frozen=True)
class PciDevice:
    id: str
    """The PCI address, e.g. ``0000:01:00.0`` (the resource ID is the /sys/bus/pci/devices entry)."""
    vendor_id: int | None
    class_id: int | None
    product_id: int | None
    vendor: str = ""
    product: str = ""
    driver: str = ""

    @property
    def is_nvidia_gpu(self) -> bool:
        return self.vendor_id == NVIDIA_VENDOR_ID and self.class_id == DISPLAY_CLASS_ID

    def describe(self) -> str:
        """``NVIDIA Corporation AD104GL [L4] (10de:27b8) at 0000:01:00.0``, with what is known."""
        name = " ".join(part for part in (self.vendor, self.product) if part) or "PCI device"
        ids = ""
        if self.vendor_id is not None and self.product_id is not None:
            ids = f" ({self.vendor_id:04x}:{self.product_id:04x})"
        return f"{name}{ids} at {self.id}"


def lists_pci_devices(talos: TalosVersion) -> bool:
    """Whether a node of this Talos release serves ``talosctl get pcidevices``."""
    return talos.at_least(*PCI_DEVICES_SINCE)


def _hex(value: object) -> int | None:
    try:
        return int(str(value), 16)
    except ValueError:
        return None


def pci_devices(resources: Iterable[TalosResource]) -> list[PciDevice]:
    """The PCI devices in ``talosctl get pcidevices -o json|yaml`` output (other resource types are ignored)."""
    devices: list[PciDevice] = []
    for res in resources:
        if res.type != PCI_DEVICES_TYPE or res.spec is None:
            continue
        spec = res.spec
        devices.append(
            PciDevice(
                id=res.id,
                vendor_id=_hex(spec.get("vendor_id", "")),
                class_id=_hex(spec.get("class_id", "")),
                product_id=_hex(spec.get("product_id", "")),
                vendor=str(spec.get("vendor") or ""),
                product=str(spec.get("product") or ""),
                driver=str(spec.get("driver") or ""),
            )
        )
    return devices


def nvidia_gpus(devices: Iterable[PciDevice]) -> list[PciDevice]:
    return [d for d in devices if d.is_nvidia_gpu]
