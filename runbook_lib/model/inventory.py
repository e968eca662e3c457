"""What verification saw on each node, and the same facts grouped so 1,000 identical nodes take one line.

Why: "all checks passed" says nothing a reviewer can compare with the plan.  The verify step records, per
node, the Talos version, the schematic, the extensions and their versions, the planned modules and their
state, the driver version, the GPUs and (where the Kubernetes API answers) the allocatable
``nvidia.com/gpu``.  A fleet is mostly identical nodes, so the view is one line per distinct set of facts,
most nodes first; the node that differs gets a line of its own.

Where each fact comes from (:data:`SOURCES`; a fact with no source is ``unknown``, never a guess):

* Talos version: ``talosctl version`` (the server ``Tag`` of each node).
* schematic and extensions: ``talosctl get extensions`` (the ``schematic`` pseudo-extension carries the ID).
* modules: ``talosctl get modules`` (Talos >= 1.11) or ``talosctl read /proc/modules`` (older).
* driver: ``talosctl read /proc/driver/nvidia/version``.
* GPU model: ``talosctl get pcidevices`` (Talos >= 1.8: the PCI database's product name, e.g.
  ``AD104GL [L4]``; siderolabs/talos v1.8.0 pkg/machinery/resources/hardware/pcidevice.go), or GPU Feature
  Discovery's ``nvidia.com/gpu.product`` node label.
* GPU memory: only GPU Feature Discovery's ``nvidia.com/gpu.memory`` node label (the device's total memory
  in MiB, ``GetTotalMemoryMB``; the product label is the NVML name with spaces replaced by ``-``:
  NVIDIA/k8s-device-plugin internal/lm/resource.go, commit 02f65cc).  Talos itself reports no GPU memory,
  so without GFD it is ``unknown`` (``nvidia-smi`` in the CUDA test shows it).
* allocatable: the Kubernetes Node's ``status.allocatable["nvidia.com/gpu"]``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

UNKNOWN = "unknown"
GPU_RESOURCE = "nvidia.com/gpu"
GFD_PRODUCT = "nvidia.com/gpu.product"
GFD_MEMORY = "nvidia.com/gpu.memory"
GFD_COUNT = "nvidia.com/gpu.count"
#: Schematic IDs are 64 hex digits: this many are enough to tell them apart on one line.
SCHEMATIC_SHOWN = 12

SOURCES: dict[str, str] = {
    "talos": "talosctl version (server Tag)",
    "schematic": "talosctl get extensions (the schematic extension)",
    "extensions": "talosctl get extensions",
    "modules": "talosctl get modules (Talos >= 1.11) or talosctl read /proc/modules",
    "driver": "talosctl read /proc/driver/nvidia/version",
    "gpu model": f"talosctl get pcidevices (Talos >= 1.8, PCI database name), else the {GFD_PRODUCT} label",
    "gpu memory": f"the {GFD_MEMORY} node label (GPU Feature Discovery, MiB); Talos does not report it",
    "allocatable": f"Kubernetes Node status.allocatable[{GPU_RESOURCE}]",
}


@dataclass(frozen=True)
class Gpu:
    model: str = UNKNOWN
    memory_mib: int | None = None

    def describe(self) -> str:
        memory = f"{self.memory_mib / 1024:.1f} GiB" if self.memory_mib else f"memory {UNKNOWN}"
        return f"{self.model} {memory}"


@dataclass(frozen=True)
class KubeGpu:
    """What the Kubernetes Node object says about a node's GPUs (GFD labels and the allocatable count)."""

    allocatable: int
    product: str | None = None
    memory_mib: int | None = None
    count: int | None = None


@dataclass(frozen=True)
class NodeInventory:
    """One node's facts, hashable so that identical nodes group in one dictionary pass."""

    talos: str | None
    schematic: str | None
    extensions: tuple[tuple[str, str], ...]
    modules: tuple[tuple[str, str], ...]
    """Each planned module and its state (``Live``, or ``not loaded``)."""
    driver: str | None
    gpus: tuple[Gpu, ...] | None
    """``None``: no source said (Talos < 1.8 without GFD); empty: the PCI bus shows no NVIDIA GPU."""
    allocatable: int | None = None
    """``None``: the Kubernetes API was not read (or did not answer)."""

    def describe(self) -> str:
        """One line: ``Talos v1.12.7, schematic 1a2b…, ext 1.0, modules live, driver 570.1, 1× L4 …``."""
        parts = [
            f"Talos {self.talos or UNKNOWN}",
            f"schematic {self.schematic[:SCHEMATIC_SHOWN] + '…' if self.schematic else 'none'}",
            ", ".join(f"{name} {version}" for name, version in self.extensions) or "no extensions",
            self._modules_text(),
            f"driver {self.driver or 'not loaded'}",
            self._gpus_text(),
        ]
        if self.allocatable is not None:
            parts.append(f"{GPU_RESOURCE} allocatable {self.allocatable}")
        return ", ".join(parts)

    def _modules_text(self) -> str:
        if self.modules and all(state.lower() == "live" for _name, state in self.modules):
            return "modules live"
        return "modules: " + (", ".join(f"{name} {state}" for name, state in self.modules) or "none planned")

    def _gpus_text(self) -> str:
        if self.gpus is None:
            return f"GPUs {UNKNOWN}"
        if not self.gpus:
            return "no NVIDIA GPU"
        counted = Counter(gpu.describe() for gpu in self.gpus)
        return " + ".join(f"{n}× {text}" for text, n in counted.items())

    def to_dict(self) -> dict[str, Any]:
        return {
            "talos": self.talos,
            "schematic": self.schematic,
            "extensions": dict(self.extensions),
            "modules": dict(self.modules),
            "driver": self.driver,
            "gpus": None
            if self.gpus is None
            else [{"model": g.model, "memory_mib": g.memory_mib} for g in self.gpus],
            "allocatable": self.allocatable,
        }


@dataclass(frozen=True)
class InventoryGroup:
    inventory: NodeInventory
    nodes: tuple[str, ...]

    def line(self) -> str:
        """``1000 nodes: Talos …`` (a single node is named: it is the one that differs)."""
        if len(self.nodes) == 1:
            return f"{self.nodes[0]}: {self.inventory.describe()}"
        return f"{len(self.nodes)} nodes: {self.inventory.describe()}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "count": len(self.nodes),
            "nodes": list(self.nodes),
            "line": self.line(),
        } | self.inventory.to_dict()


def group_inventory(inventories: Mapping[str, NodeInventory]) -> list[InventoryGroup]:
    """Nodes with identical facts together, most nodes first (then by first node name): one pass, O(n)."""
    groups: dict[NodeInventory, list[str]] = {}
    for node, inventory in inventories.items():
        groups.setdefault(inventory, []).append(node)
    ordered = sorted(groups.items(), key=lambda item: (-len(item[1]), min(item[1])))
    return [InventoryGroup(inventory, tuple(sorted(nodes))) for inventory, nodes in ordered]


def _int(value: object) -> int | None:
    try:
        return int(str(value))
    except ValueError:
        return None


def kube_gpu(node: Mapping[str, Any]) -> KubeGpu:
    """The GPU facts of one Kubernetes Node object (as the API returns it, in dict form)."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    allocatable = ((node.get("status") or {}).get("allocatable") or {}).get(GPU_RESOURCE, "0")
    return KubeGpu(
        allocatable=_int(allocatable) or 0,
        product=labels.get(GFD_PRODUCT) or None,
        memory_mib=_int(labels.get(GFD_MEMORY, "")),
        count=_int(labels.get(GFD_COUNT, "")),
    )


def node_gpus(pci_models: Iterable[str] | None, kube: KubeGpu | None) -> tuple[Gpu, ...] | None:
    """The node's GPUs from the PCI bus (model), completed by GFD's labels (memory; model when no PCI list).

    GFD labels one product and memory per node (NVIDIA/k8s-device-plugin internal/lm/resource.go): the
    memory is given to each GPU only when the PCI bus and GFD count the same number of GPUs.
    """
    memory = kube.memory_mib if kube else None
    if pci_models is None:
        if kube is None or not kube.product or not kube.count:
            return None
        return tuple(Gpu(kube.product, memory) for _ in range(kube.count))
    models = list(pci_models)
    if kube is None or kube.count != len(models):
        memory = None
    return tuple(Gpu(model or UNKNOWN, memory) for model in models)
