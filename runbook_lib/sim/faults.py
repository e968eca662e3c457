"""Faults a test or a training scenario switches on per node (``SimNode.faults``) or cluster-wide.

Each fault is a real failure mode of a Talos GPU rollout (see the domain spec's "Common failures"), and each
room reads the same names, so one switch makes every view of the node agree (``talosctl get modules``,
``read /proc/driver/nvidia/version``, the kubelet's allocatable GPUs).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from runbook_lib.sim.state import (
    load_cluster_faults,
    locked_node,
    save_cluster_faults,
    toolkit_extension,
)
from runbook_lib.sim.talosctl.images import apply_extension_faults

FAULTS: dict[str, str] = {
    "unreachable": "the node does not answer (value: refused | no_route | timeout; true means refused)",
    "slow_ms": "extra milliseconds on every call to this node",
    "driver_mismatch": "the toolkit extension comes from the other track than the kernel modules (driver mismatch)",
    "toolkit_missing": "the toolkit extension is missing from what the node runs",
    "gpu_unsupported": "the GPU is not supported by the driver branch: nvidia fails to probe (NVRM message)",
    "upgrade_fails": "talosctl upgrade fails on this node and it rolls back to the old image",
    "upgrade_hangs": "talosctl upgrade never completes (ext-nvidia-persistenced waits); --wait runs into --timeout",
    # Read by the real control plane's GPU node agent (runbook_lib/sim/nodeagent.py, containers.py):
    "node_not_ready": "the node's kubelet reports NotReady (its pods are marked not ready)",
    "pods_pending": "pods for this node stay Pending (real control plane: the node has no room, kube-scheduler says Too many pods)",
    "image_pull_error": "containers on this node fail to pull their image (ErrImagePull / ImagePullBackOff)",
    "image_pull_rate_limited": "the registry answers this node's pulls with 429 Too Many Requests (a pull rate "
    "limit; ErrImagePull / ImagePullBackOff until the fault is cleared)",
    # Read by the GPU node agent on the real control plane (runbook_lib/sim/nodeagent.py):
    "gpu_unhealthy": "the device plugin marks the node's GPUs unhealthy (an Xid critical error, e.g. Xid 79: "
    "the GPU fell off the bus): nvidia.com/gpu stays in capacity, allocatable 0",
    # Read when a container runs nvidia-smi (runbook_lib/sim/containers.py ``allocated``):
    "gpu_isolation_lost": "a container that requests nvidia.com/gpu sees every GPU of the node, not the ones "
    "allocated to it (as captured in NVIDIA/gpu-operator#1021 and NVIDIA/k8s-device-plugin#1294)",
    # Read by the simulated GPU Operator on the real control plane (runbook_lib/sim/gpuoperator.py):
    "gpu_operator_lease_held": "another GPU Operator instance holds and renews the operator's leader-election "
    "Lease (value: its holder identity): the operator pod is Ready but reconciles nothing",
}

_DIAL = {
    "refused": "connect: connection refused",
    "no_route": "connect: no route to host",
    "timeout": "i/o timeout",
}


def dial_error(address: str, kind: Any = "refused") -> str:
    """gRPC's text when a node's apid cannot be reached."""
    reason = _DIAL.get(str(kind), _DIAL["refused"]) if kind is not True else _DIAL["refused"]
    return (
        'rpc error: code = Unavailable desc = connection error: desc = "transport: Error while dialing: '
        f'dial tcp {address}:50000: {reason}"'
    )


def validate(name: str) -> None:
    if name not in FAULTS:
        raise ValueError(f"unknown fault {name!r}; known: {', '.join(sorted(FAULTS))}")


def inject(state_dir: Path | str, node: str, name: str, value: Any = True) -> None:
    """Switch a fault on for one node (by name or address); extension faults take effect at once."""
    validate(name)
    with locked_node(state_dir, node) as n:
        n.faults[name] = value
        if name == "unreachable":
            n.reachable = False
        if name in ("toolkit_missing", "driver_mismatch") and toolkit_extension(n) is not None:
            n.extensions = apply_extension_faults(n.extensions, n.talos_version, {name: value})


def clear(state_dir: Path | str, node: str, name: str | None = None) -> None:
    """Switch one fault (or all) off; state already changed by a fault (extensions) stays as it is."""
    with locked_node(state_dir, node) as n:
        if name is None:
            n.faults.clear()
        else:
            n.faults.pop(name, None)
        if "unreachable" not in n.faults:
            n.reachable = True


def set_cluster_fault(state_dir: Path | str, name: str, value: Any) -> None:
    faults = load_cluster_faults(state_dir)
    faults[name] = value
    save_cluster_faults(state_dir, faults)
