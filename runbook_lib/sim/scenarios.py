"""Named training/test scenarios: bundles of node states and faults that ``runbook sim up --scenario`` applies.

A scenario says *what is wrong* on which node, in the terms an operator meets it (a node that never comes
back, a driver/toolkit mismatch, a GPU the branch does not support), so that runbooks can be exercised
against every failure in the domain spec without hand-editing state files.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runbook_lib.sim import catalog
from runbook_lib.sim.patching import StrategicPatch, apply_strategic, dump_yaml
from runbook_lib.sim.state import Gpu, SimNode, minor_of, v1alpha1_doc
from runbook_lib.sim.talosctl import images


def nvidia_extension_names(talos_version: str, track: str = "lts") -> list[str]:
    """The OSS kmod + toolkit pair as Image Factory names them for this Talos version."""
    suffix = f"-{track}" if minor_of(talos_version) >= (1, 8) else ""
    return [
        f"siderolabs/nvidia-open-gpu-kernel-modules{suffix}",
        f"siderolabs/nvidia-container-toolkit{suffix}",
    ]


def schematic_bytes(extensions: list[str]) -> bytes:
    if not extensions:
        return b"customization: {}\n"
    return dump_yaml({"customization": {"systemExtensions": {"officialExtensions": extensions}}}).encode()


def register_schematic(state_dir: Path, extensions: list[str]) -> str:
    """Store the schematic where the factory room keeps them, so upgrades and the factory know its ID."""
    sid: str = catalog.schematic_store(state_dir).put(schematic_bytes(extensions))
    return sid


def install_nvidia(state_dir: Path, node: SimNode, *, track: str = "lts", patch_modules: bool = True) -> None:
    """Put a node in the state a finished runbook leaves it in: GPU schematic booted, modules configured."""
    names = nvidia_extension_names(node.talos_version, track)
    sid = register_schematic(state_dir, names)
    available = {e["name"]: e for e in images.official_extensions(node.talos_version)}
    node.schematic_id = sid
    node.extensions = [images.to_installed(available[n]) for n in names if n in available]
    node.extensions = images.apply_extension_faults(node.extensions, node.talos_version, node.faults)
    if patch_modules:
        configure_modules(node)


def configure_modules(node: SimNode) -> None:
    """The config-patch step's modules patch (and the sysctl up to 1.12), as a node keeps it."""
    machine: dict[str, Any] = {
        "kernel": {"modules": [{"name": m} for m in ("nvidia", "nvidia_uvm", "nvidia_drm", "nvidia_modeset")]}
    }
    if minor_of(node.talos_version) <= (1, 12):
        # a string, as Talos holds every sysctl (MachineSysctls map[string]string) and the runbook's patch writes it
        machine["sysctls"] = {"net.core.bpf_jit_harden": "1"}
    node.machine_config = apply_strategic(node.machine_config, StrategicPatch([{"machine": machine}]))
    node.config_version += 1


H100 = Gpu(model="NVIDIA H100 80GB HBM3", memory_mib=81559, bus_id="0000:18:00.0", uuid="")


def _workers(nodes: list[SimNode]) -> list[SimNode]:
    return [n for n in nodes if n.role == "worker"]


def _first_worker(nodes: list[SimNode]) -> SimNode:
    workers = _workers(nodes)
    if not workers:
        raise ValueError("this scenario needs at least one worker node")
    return workers[-1]


def _fault(name: str, value: Any = True) -> Callable[[Path, list[SimNode]], None]:
    def apply(_state_dir: Path, nodes: list[SimNode]) -> None:
        node = _first_worker(nodes)
        node.faults[name] = value
        if name == "unreachable":
            node.reachable = False

    return apply


def _gpu_ready(state_dir: Path, nodes: list[SimNode]) -> None:
    for n in _workers(nodes):
        if n.gpus:
            install_nvidia(state_dir, n)


def _config_patched(_state_dir: Path, nodes: list[SimNode]) -> None:
    for n in _workers(nodes):
        if n.gpus:
            configure_modules(n)


def _extensions_without_patch(state_dir: Path, nodes: list[SimNode]) -> None:
    for n in _workers(nodes):
        if n.gpus:
            install_nvidia(state_dir, n, patch_modules=False)


#: The holder identity of the other instance in ``operator-not-leader``: controller-runtime's leader-election
#: identity is ``<hostname>_<uuid>`` (the pod name is the hostname), here of a pod that is not this release's.
OTHER_OPERATOR = "gpu-operator-5b8d9c7f4-old42_0f6c2d1e-7a35-4b8e-9c1d-2e4f6a8b0c3d"


def _operator_not_leader(state_dir: Path, nodes: list[SimNode]) -> None:
    _gpu_ready(state_dir, nodes)
    _first_worker(nodes).faults["gpu_operator_lease_held"] = OTHER_OPERATOR


def _gpu_unhealthy(state_dir: Path, nodes: list[SimNode]) -> None:
    _gpu_ready(state_dir, nodes)
    _first_worker(nodes).faults["gpu_unhealthy"] = True


def _mismatch(state_dir: Path, nodes: list[SimNode]) -> None:
    node = _first_worker(nodes)
    node.faults["driver_mismatch"] = True
    install_nvidia(state_dir, node)


def _toolkit_missing(state_dir: Path, nodes: list[SimNode]) -> None:
    node = _first_worker(nodes)
    node.faults["toolkit_missing"] = True
    install_nvidia(state_dir, node)


def _mixed_fleet(_state_dir: Path, nodes: list[SimNode]) -> None:
    workers = _workers(nodes)
    for i, n in enumerate(workers):
        if i % 3 == 2:
            n.gpus = []  # a CPU-only worker: NVIDIA extensions must not go here (extensions#888)
        elif i % 3 == 1:
            n.gpus = [Gpu(H100.model, H100.memory_mib, H100.bus_id, n.gpus[0].uuid if n.gpus else "")]


def _chaos(state_dir: Path, nodes: list[SimNode]) -> None:
    workers = _workers(nodes)
    faults = [
        ("unreachable", "no_route"),
        ("slow_ms", 1500),
        ("gpu_unsupported", True),
        ("upgrade_fails", True),
    ]
    for n, (name, value) in zip(workers, faults, strict=False):
        n.faults[name] = value
        if name == "unreachable":
            n.reachable = False


def _on_aws(_state_dir: Path, nodes: list[SimNode]) -> None:
    for n in nodes:
        n.platform = "aws"


def _storage_extensions(state_dir: Path, nodes: list[SimNode]) -> None:
    """The last worker booted a schematic with iscsi-tools (as nodes serving Longhorn or iSCSI volumes do)."""
    node = _first_worker(nodes)
    names = ["siderolabs/iscsi-tools"]
    available = {e["name"]: e for e in images.official_extensions(node.talos_version)}
    node.schematic_id = register_schematic(state_dir, names)
    node.extensions = [images.to_installed(available[n]) for n in names]


def _kernel_args_before_1_12(_state_dir: Path, nodes: list[SimNode]) -> None:
    """The last worker's config was generated before Talos 1.12 (no ``grubUseUKICmdline``) with kernel args."""
    install = v1alpha1_doc(_first_worker(nodes).machine_config)["machine"]["install"]
    install.pop("grubUseUKICmdline", None)
    install["extraKernelArgs"] = ["intel_iommu=on", "iommu=pt"]


@dataclass(frozen=True)
class Scenario:
    description: str
    apply: Callable[[Path, list[SimNode]], None]


SCENARIOS: dict[str, Scenario] = {
    "fresh": Scenario(
        "GPU workers on the vanilla schematic: the runbook's starting point", lambda _d, _n: None
    ),
    "gpu-ready": Scenario(
        "every GPU worker already runs the NVIDIA schematic with the modules patch", _gpu_ready
    ),
    "config-patched": Scenario(
        "GPU workers on the vanilla schematic with the modules patch applied (the config-patch step done)",
        _config_patched,
    ),
    "extensions-no-patch": Scenario(
        "NVIDIA extensions installed but the modules are not in the machine config (nothing is Live)",
        _extensions_without_patch,
    ),
    "driver-mismatch": Scenario("last worker: kmod and toolkit from different tracks", _mismatch),
    "toolkit-missing": Scenario(
        "last worker: kernel modules without the container toolkit", _toolkit_missing
    ),
    "unsupported-gpu": Scenario(
        "last worker: GPU not supported by the driver branch", _fault("gpu_unsupported")
    ),
    "unreachable-node": Scenario("last worker does not answer", _fault("unreachable", "refused")),
    "upgrade-fails": Scenario("last worker: upgrade fails and rolls back", _fault("upgrade_fails")),
    "upgrade-hangs": Scenario("last worker: upgrade hangs until --timeout", _fault("upgrade_hangs")),
    "slow-node": Scenario("last worker answers 2 s late", _fault("slow_ms", 2000)),
    "mixed-fleet": Scenario("every third worker has no GPU, every other GPU is an H100", _mixed_fleet),
    "aws": Scenario("every node runs on AWS (PlatformMetadata platform: aws)", _on_aws),
    "storage-extensions": Scenario(
        "last worker runs iscsi-tools, which the GPU schematic lacks unless extra_extensions keeps it",
        _storage_extensions,
    ),
    "kernel-args-before-1-12": Scenario(
        "last worker: config generated before Talos 1.12 with machine.install.extraKernelArgs (GRUB builds "
        "the command line from them)",
        _kernel_args_before_1_12,
    ),
    "operator-not-leader": Scenario(
        "gpu-ready, and another GPU Operator instance holds the operator's leader-election Lease: its pod is "
        "Ready but reconciles nothing (real control plane only)",
        _operator_not_leader,
    ),
    "gpu-unhealthy": Scenario(
        "gpu-ready, and the device plugin on the last worker marks its GPU unhealthy (an Xid critical error): "
        "the node lists nvidia.com/gpu in capacity with none allocatable (real control plane only)",
        _gpu_unhealthy,
    ),
    "chaos": Scenario("unreachable, slow, unsupported-GPU and failing-upgrade workers at once", _chaos),
}


def apply_scenario(name: str, state_dir: Path, nodes: list[SimNode]) -> None:
    if name not in SCENARIOS:
        raise ValueError(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}")
    SCENARIOS[name].apply(state_dir, nodes)
