"""The fault scenarios on simnode: each Python-simulator fault of a node (``SimNode.faults``) as simnode node state.

``runbook sim scenarios`` names what is wrong on which node; the Python talosctl reads the faults when it
answers. With the real talosctl the node behind the API has to *be* faulty, so each fault becomes a field of
simnode's nodes file (``simnode/README.md``, "Faults"), and the real talosctl and the runbook meet it as they
would meet a real node:

- ``unreachable`` → ``down`` (the dial error apid returns: refused or no route to host);
- ``slow_ms`` → more ``latency_ms`` (every call the node answers waits that long);
- ``gpu_unsupported``, ``upgrade_hangs`` → ``nvidia_probe_fails``: the driver initialises no GPU, so no NVIDIA
  module loads and ``ext-nvidia-persistenced`` waits for ``/sys/bus/pci/drivers/nvidia`` forever; an upgrade to
  the NVIDIA image then hangs in ``startAllServices`` and the node rolls back after Talos's boot timeout
  (simnode's boot hang, ``simnode/lifecycle.go``). The Python simulator's ``upgrade_hangs`` has no cause; the
  one cause the real node has for this hang is a driver that does not bind (extensions#888, talos#9149);
- ``upgrade_fails`` → ``fail_install``: the installer exits non-zero, the upgrade sequence fails and the node
  keeps its image (``simnode/faults.go``; no source says why an installer would fail);
- ``driver_mismatch``, ``toolkit_missing`` → ``extension_faults``: the toolkit extension replaced by the other
  track's, or dropped, in every image the node boots (ours: it keeps the Python fault, which follows the node
  across upgrades).

Kubernetes-side faults (``node_not_ready``, ``pods_pending``, ``image_pull_error``) are the simulated kubelet's
and need nothing here.
"""

from __future__ import annotations

from typing import Any

from runbook_lib.sim.state import SimNode

#: ``runbook sim fault NODE unreachable VALUE`` as simnode's ``down`` (its dial errors: simnode/README.md).
#: ``timeout`` (a black-holed host) has no simnode equivalent yet: it is refused there as no-route-to-host.
DOWN_KINDS = {"refused": "connection-refused", "no_route": "no-route-to-host", "timeout": "no-route-to-host"}
#: Faults simnode reproduces (the others are read by the simulated kubelet, not by talosctl).
TALOS_FAULTS = frozenset(
    {
        "unreachable",
        "slow_ms",
        "gpu_unsupported",
        "upgrade_hangs",
        "upgrade_fails",
        "driver_mismatch",
        "toolkit_missing",
    }
)
KUBE_FAULTS = frozenset(
    {
        "node_not_ready",
        "pods_pending",
        "image_pull_error",
        "image_pull_rate_limited",
        "gpu_operator_lease_held",
        "gpu_unhealthy",
    }
)


def down_kind(node: SimNode) -> str:
    value = node.faults.get("unreachable")
    if value is None or value is False:
        return ""
    return DOWN_KINDS.get(str(value), "connection-refused")


def unsupported(node: SimNode) -> list[str]:
    """The node's faults simnode cannot reproduce (a scenario with one falls back to the Python talosctl)."""
    return sorted(set(node.faults) - TALOS_FAULTS - KUBE_FAULTS)


def fault_fields(node: SimNode, latency_ms: float) -> dict[str, Any]:
    """The nodes-file fields of the node's faults (none for a healthy node); ``latency_ms`` always."""
    faults = node.faults
    fields: dict[str, Any] = {"latency_ms": round(latency_ms + float(faults.get("slow_ms", 0) or 0))}
    if down_kind(node):
        fields["down"] = down_kind(node)
    if faults.get("gpu_unsupported") or faults.get("upgrade_hangs"):
        fields["nvidia_probe_fails"] = True
    if faults.get("upgrade_fails"):
        fields["fail_install"] = True
    return fields


def extension_faults(image: list[dict[str, Any]], listed: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """simnode's ``extension_faults`` that make a node booting ``image``'s extensions list ``listed``: each image
    extension the node does not list, replaced by the one the node lists in its place (same index: the Python
    faults swap the toolkit in place or drop it, ``sim/talosctl/images.py`` apply_extension_faults)."""
    names = {e["name"] for e in listed}
    image_names = {e["name"] for e in image}
    out: list[dict[str, Any]] = []
    for i, ext in enumerate(image):
        if ext["name"] in names:
            continue
        swap = listed[i] if i < len(listed) and listed[i]["name"] not in image_names else None
        out.append({"name": ext["name"], **({"replace": swap} if swap else {})})
    return out
