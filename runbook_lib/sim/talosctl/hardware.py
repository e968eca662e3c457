"""``PCIDevices.hardware.talos.dev``: the PCI bus of a simulated node, as ``talosctl get pcidevices`` shows it.

Real source: siderolabs/talos v1.8.0 pkg/machinery/resources/hardware/pcidevice.go (type, namespace
``hardware``, spec fields, print columns Class/Subclass/Vendor/Product) and
internal/app/machined/pkg/controllers/hardware/pcidevices.go (one resource per /sys/bus/pci/devices entry,
ID = the PCI address, IDs as ``0x%02x``/``0x%04x``, names from the PCI database); the ``driver`` field
exists from v1.10.0.  The release note (v1.8 what-is-new) spells the command ``talosctl get pcidevices``.

A node shows two board devices and one display controller per GPU, so a GPU-less worker (the
``mixed-fleet`` scenario) shows no NVIDIA device, as a real CPU-only node would.
"""

from __future__ import annotations

from typing import Any

from runbook_lib.sim.state import SimNode, minor_of, runtime

# (product ID, product name) from the PCI ID repository (pci.ids) for the GPU models the simulator uses.
GPU_PRODUCTS = {
    "NVIDIA L4": ("0x27b8", "AD104GL [L4]"),
    "NVIDIA H100 80GB HBM3": ("0x2330", "GH100 [H100 SXM5 80GB]"),
}
# (PCI address, class, subclass, vendor, product, class_id, subclass_id, vendor_id, product_id, driver)
BOARD = (
    ("0000:00:00.0", "Bridge", "Host bridge", "Intel Corporation", "440FX - 82441FX PMC [Natoma]",
     "0x06", "0x00", "0x8086", "0x1237", ""),
    ("0000:00:03.0", "Network controller", "Ethernet controller", "Red Hat, Inc.", "Virtio network device",
     "0x02", "0x00", "0x1af4", "0x1000", "virtio-pci"),
)  # fmt: skip
_FIELDS = ("class", "subclass", "vendor", "product", "class_id", "subclass_id", "vendor_id", "product_id")


def pci_specs(node: SimNode) -> list[tuple[str, dict[str, Any]]]:
    """(resource ID, spec) of each PCI device of the node, in the order /sys/bus/pci/devices lists them."""
    rows = list(BOARD)
    bound = "nvidia" if runtime(node).driver_version else ""
    for gpu in node.gpus:
        product_id, product = GPU_PRODUCTS.get(gpu.model, ("0x0000", ""))
        rows.append(
            (gpu.bus_id, "Display controller", "3D controller", "NVIDIA Corporation", product,
             "0x03", "0x02", "0x10de", product_id, bound)
        )  # fmt: skip
    with_driver = minor_of(node.talos_version) >= (1, 10)
    out: list[tuple[str, dict[str, Any]]] = []
    for address, *values, driver in sorted(rows):
        spec: dict[str, Any] = {k: v for k, v in zip(_FIELDS, values, strict=True) if v or k.endswith("_id")}
        if with_driver and driver:
            spec["driver"] = driver
        out.append((address, spec))
    return out
