"""What enabling NVIDIA GPUs requires, for each Talos release: the "GPU profile".

Why: every step of the Talos "NVIDIA GPU" procedure changes with the Talos minor version (extension names,
module configuration documents, the sysctl, the containerd plugin path, device plugin vs GPU Operator,
installer path).  Getting one of these wrong fails late and obscurely on a real node, so all of them are
decided here, once, from ``shared/docs/talos-nvidia.md`` (section numbers below refer to it), as pure data.
Nothing in this module does I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import yaml

from runbook_lib.errors import CompatibilityError

from .versions import SUPPORTED_MINORS, TalosVersion

Flavor = Literal["oss", "proprietary"]
Track = Literal["lts", "production"]
KubernetesLayer = Literal["device-plugin", "gpu-operator"]

#: Loaded through machine config only: the kmod extension blacklists autoloading (facts §1.1).
NVIDIA_MODULES: tuple[str, ...] = ("nvidia", "nvidia_uvm", "nvidia_drm", "nvidia_modeset")

#: The file Talos merges into containerd's CRI config (facts §1.4).
CRI_CUSTOMIZATION_PATH = "/etc/cri/conf.d/20-customization.part"

GPU_OPERATOR_VALUES: Mapping[str, str] = {
    "driver.enabled": "false",
    "toolkit.enabled": "false",
    "hostPaths.driverInstallDir": "/usr/local",
}
"""Talos ships driver and toolkit as extensions, so the operator must not install its own (facts §1.5)."""

#: Talos CI pins v26.3.3; the docs require v26.3.1 or higher (facts §1.5).
GPU_OPERATOR_CHART_DEFAULT = "v26.3.3"
#: The oldest chart the Talos docs support: "Make sure to install GPU operator version v26.3.1 or higher".
GPU_OPERATOR_CHART_MINIMUM = "v26.3.1"

#: Images the CUDA test pods use (facts §1.5).  The vectoradd sample also proves CUDA compute works.
CUDA_VECTORADD_IMAGE = "nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0"
#: The CUDA 11 sample for releases whose driver predates CUDA 12: Talos 1.3 ships 515.65.01
#: (extensions@v1.3.0:nvidia-gpu/vars.yaml) and CUDA 12 needs >= 525.60.13 (NVIDIA "CUDA Compatibility").
#: Talos CI ran this image up to v1.10 (talos@v1.10.0:internal/integration/api/extensions_nvidia.go:106)
#: and vectoradd-cuda12.5.0 from v1.11 (talos@v1.11.0:internal/integration/api/constants.go:15).
CUDA11_VECTORADD_IMAGE = "nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda11.7.1"

#: Driver (LTS / single), driver (production) and container toolkit at each ``.0`` extensions release
#: (facts §1.2).  Used only where no Image Factory exists (Talos 1.3–1.4) to name extension images; elsewhere
#: the factory catalog is the truth.
DRIVER_TABLE: Mapping[tuple[int, int], tuple[str, str | None, str]] = {
    (1, 3): ("515.65.01", None, "v1.11.0"),
    (1, 4): ("530.41.03", None, "v1.12.1"),
    (1, 5): ("535.54.03", None, "v1.13.5"),
    (1, 6): ("535.129.03", None, "v1.13.5"),
    (1, 7): ("535.129.03", None, "v1.14.6"),
    (1, 8): ("535.183.06", "550.90.07", "v1.16.1"),
    (1, 9): ("535.216.03", "550.127.08", "v1.17.2"),
    (1, 10): ("535.230.02", "570.124.06", "v1.17.5"),
    (1, 11): ("535.247.01", "570.172.08", "v1.17.8"),
    (1, 12): ("580.105.08", "570.195.03", "v1.18.1"),
    (1, 13): ("580.126.20", "595.58.03", "v1.19.0"),
    (1, 14): ("580.178.04", "595.91.07", "v1.19.1"),
}


@dataclass(frozen=True)
class GpuProfile:
    """Everything version-specific about enabling NVIDIA GPUs on one Talos release, flavour and track."""

    talos: TalosVersion
    flavor: Flavor
    track: Track | None
    """``None`` before Talos 1.8, which has no lts/production split."""
    kmod_extension: str
    toolkit_extension: str
    extension_delivery: Literal["image-factory", "install-extensions"]
    """Talos 1.3–1.4 predate the Image Factory: extensions go in ``machine.install.extensions`` + upgrade."""
    module_config: Literal["machine.kernel.modules", "KernelModuleConfig"]
    sysctls: Mapping[str, str]
    cri_plugin: str
    """containerd CRI plugin name used in TOML table headers (changes with containerd 2.x in Talos 1.8)."""
    default_runtime_form: Literal["machine.files", "CRICustomizationConfig"]
    default_runtime_needs_reboot: bool
    """Up to 1.13 a ``machine.files`` change cannot apply immediately: mode auto reboots (facts §1.4)."""
    kubernetes_layer_auto: KubernetesLayer
    installer_kind: Literal["ghcr-installer", "installer", "metal-installer"]
    module_check: Literal["read /proc/modules", "get modules"]
    services: tuple[str, ...]
    """Extension services that must be up once the toolkit runs (checked by verify)."""
    device_plugin_chart_default: str
    """Talos CI's chart on 1.11 (0.17.2) and 1.12 (0.18.0) (talos@v1.11.0/@v1.12.0 internal/integration/api/
    constants.go:12); 0.17.2 is kept for older releases, where CI ran its own DaemonSet with
    k8s-device-plugin v0.14.1 (talos@v1.10.0 extensions_nvidia.go:228) and the docs pin chart 0.13.0."""
    cuda_smi_image: str
    """The image of the docs' ``nvidia-smi`` test in the 1.6-1.7 (12.1.0) and 1.8-1.10 (12.5.0) docs
    (siderolabs/docs public/talos/v1.x/.../nvidia-gpu.mdx); other releases' docs have none of their own."""
    cuda_vectoradd_image: str
    """The vectoradd sample Talos CI runs for the release, so it runs on the release's driver."""
    modules: tuple[str, ...] = NVIDIA_MODULES
    notes: tuple[str, ...] = field(default=())

    @property
    def extensions(self) -> list[str]:
        """Official extension names in schematic order: kernel modules first, then the toolkit.

        Order matters: the factory does not sort, so it changes the schematic ID (facts §2.3).
        """
        return [self.kmod_extension, self.toolkit_extension]

    def machine_config_patch_documents(
        self, *, install_images: list[str] | None = None, legacy_modules: bool = False
    ) -> list[dict[str, Any]]:
        """The strategic-merge patch documents that load the modules (and relax the sysctl where needed).

        ``legacy_modules``: ``machine.kernel.modules`` even where the release documents ``KernelModuleConfig``,
        for a node still running an earlier release: its machined refuses a kind its machinery does not register
        (talos@v1.13.0 pkg/machinery/config/internal/registry/registry.go:79, ``"KernelModuleConfig" "v1alpha1":
        not registered``), and Talos 1.14 still loads the deprecated form, merged with the documents
        (talos@v1.14.0-rc.1 pkg/machinery/config/container/container.go:355-372)."""
        if self.module_config == "KernelModuleConfig" and not legacy_modules:
            docs: list[dict[str, Any]] = [
                {"apiVersion": "v1alpha1", "kind": "KernelModuleConfig", "name": name}
                for name in self.modules
            ]
            return docs
        machine: dict[str, Any] = {"kernel": {"modules": [{"name": name} for name in self.modules]}}
        if self.sysctls:
            machine["sysctls"] = dict(self.sysctls)
        if self.extension_delivery == "install-extensions" and install_images:
            machine["install"] = {"extensions": [{"image": image} for image in install_images]}
        return [{"machine": machine}]

    def default_runtime_documents(self) -> list[dict[str, Any]]:
        """The optional patch that makes ``nvidia`` the node's default runtime for every pod."""
        toml = default_runtime_toml(self.cri_plugin)
        if self.default_runtime_form == "CRICustomizationConfig":
            return [
                {
                    "apiVersion": "v1alpha1",
                    "kind": "CRICustomizationConfig",
                    "name": "nvidia-default-runtime",
                    "content": toml,
                }
            ]
        return [{"machine": {"files": [{"content": toml, "path": CRI_CUSTOMIZATION_PATH, "op": "create"}]}}]

    def install_extension_images(self) -> list[str]:
        """``ghcr.io`` images for ``machine.install.extensions`` (Talos 1.3–1.4 only), tagged per facts §1.2."""
        driver, _production, toolkit = DRIVER_TABLE[self.talos.minor_line]
        names = [
            self.kmod_extension.removeprefix("siderolabs/"),
            self.toolkit_extension.removeprefix("siderolabs/"),
        ]
        return [
            f"ghcr.io/siderolabs/{names[0]}:{driver}-{self.talos}",
            f"ghcr.io/siderolabs/{names[1]}:{driver}-{toolkit}",
        ]


def default_runtime_toml(cri_plugin: str) -> str:
    """The containerd fragment from the Talos docs, with the plugin path of the node's containerd."""
    return (
        "[plugins]\n"
        f'  [plugins."{cri_plugin}"]\n'
        f'    [plugins."{cri_plugin}".containerd]\n'
        '      default_runtime_name = "nvidia"\n'
    )


class _BlockDumper(yaml.SafeDumper):
    """Multi-line strings (TOML fragments) as ``|`` blocks, the way the Talos docs write them."""


def _str_representer(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_BlockDumper.add_representer(str, _str_representer)


def render_documents(docs: list[dict[str, Any]]) -> str:
    """YAML for a multi-document patch, in the block style the Talos docs show."""
    return "---\n".join(
        yaml.dump(doc, Dumper=_BlockDumper, sort_keys=False, default_flow_style=False) for doc in docs
    )


def _extension_names(talos: TalosVersion, flavor: Flavor, track: Track | None) -> tuple[str, str]:
    suffix = f"-{track}" if track else ""
    if flavor == "oss":
        kmod = f"siderolabs/nvidia-open-gpu-kernel-modules{suffix}"
    else:
        kmod = f"siderolabs/nonfree-kmod-nvidia{suffix}"
    return kmod, f"siderolabs/nvidia-container-toolkit{suffix}"


def resolve_track(talos: TalosVersion, track: Track | None) -> Track | None:
    """The effective track: ``lts`` by default from 1.8, none before (where asking for one is an error)."""
    if talos.at_least(1, 8):
        return track or "lts"
    if track is not None:
        raise CompatibilityError(
            f"track {track!r} does not exist on Talos {talos}: the lts/production extension tracks start with "
            "Talos 1.8 (before that there is one driver per release)",
            hint="remove `track`, or target Talos v1.8 or newer",
        )
    return None


def profile_for(
    talos_version: TalosVersion | str, flavor: Flavor = "oss", track: Track | None = None
) -> GpuProfile:
    """The GPU profile for one exact Talos release (e.g. ``v1.12.7``), flavour and track.

    Raises :class:`CompatibilityError` for combinations that do not exist (a track before 1.8, proprietary
    modules before 1.5.0, a release outside the researched range) with what would be valid.
    """
    talos = talos_version if isinstance(talos_version, TalosVersion) else TalosVersion.parse(talos_version)
    if talos.minor_line not in SUPPORTED_MINORS:
        first, last = SUPPORTED_MINORS[0], SUPPORTED_MINORS[-1]
        raise CompatibilityError(
            f"Talos {talos} is outside the supported range v{first[0]}.{first[1]}–v{last[0]}.{last[1]}",
            hint="profiles exist for every Talos minor from v1.3 to v1.14",
        )
    effective_track = resolve_track(talos, track)
    if flavor == "proprietary" and not talos.at_least(1, 5):
        # The extensions v1.4.x tags have no nvidia-gpu/nonfree: nonfree-kmod-nvidia first ships with
        # extensions v1.5.0 (commit ee8df92).  The Talos 1.3/1.4 proprietary guides build a custom kernel
        # and installer instead (talos@v1.4.8:website/content/v1.4/talos-guides/configuration/
        # nvidia-gpu-proprietary.md): modules must be signed by the kernel they load into.
        raise CompatibilityError(
            f"no proprietary NVIDIA kernel-module extension is published for Talos {talos} "
            "(nonfree-kmod-nvidia starts with extensions v1.5.0, for Talos v1.5.0)",
            hint="use driver_flavor: oss, or target Talos v1.5.0 or newer; before 1.5 the proprietary driver "
            "needs a custom-built kernel and installer (Talos guide 'NVIDIA GPU (proprietary drivers)'), "
            "which this runbook does not manage",
        )
    kmod, toolkit = _extension_names(talos, flavor, effective_track)
    minor = talos.minor
    notes: list[str] = []
    if minor >= 13:
        notes.append("the toolkit is CDI-based (no nvidia-container-cli), so bpf_jit_harden stays at 2")
    if minor <= 12:
        notes.append("net.core.bpf_jit_harden=1 is needed because nvidia-container-cli loads BPF programs")
    if flavor == "proprietary":
        notes.append(
            "DGX / Grace Blackwell (GB10) systems are only known to work with the proprietary driver"
        )
    return GpuProfile(
        talos=talos,
        flavor=flavor,
        track=effective_track,
        kmod_extension=kmod,
        toolkit_extension=toolkit,
        extension_delivery="install-extensions" if minor <= 4 else "image-factory",
        module_config="KernelModuleConfig" if minor >= 14 else "machine.kernel.modules",
        sysctls={"net.core.bpf_jit_harden": "1"} if minor <= 12 else {},
        cri_plugin="io.containerd.grpc.v1.cri" if minor <= 7 else "io.containerd.cri.v1.runtime",
        default_runtime_form="CRICustomizationConfig" if minor >= 14 else "machine.files",
        default_runtime_needs_reboot=minor <= 13,
        kubernetes_layer_auto="gpu-operator" if minor >= 13 else "device-plugin",
        installer_kind="ghcr-installer"
        if minor <= 4
        else ("metal-installer" if minor >= 10 else "installer"),
        module_check="get modules" if minor >= 11 else "read /proc/modules",
        services=_services(minor),
        device_plugin_chart_default="0.18.0" if minor >= 12 else "0.17.2",
        cuda_smi_image=(
            "nvcr.io/nvidia/cuda:12.1.0-base-ubuntu22.04"
            if minor <= 7
            else "nvcr.io/nvidia/cuda:12.5.0-base-ubuntu22.04"
        ),
        cuda_vectoradd_image=CUDA_VECTORADD_IMAGE if minor >= 11 else CUDA11_VECTORADD_IMAGE,
        notes=tuple(notes),
    )


def _services(minor: int) -> tuple[str, ...]:
    # nvidia-persistenced ships with the toolkit from siderolabs/extensions v1.3.0 on
    # (nvidia-gpu/nvidia-container-toolkit/nvidia-persistenced.yaml); CDI generation with 1.13's CDI-based
    # toolkit (nvidia-gpu/nvidia-container-toolkit/lts/nvidia-cdi-gen.yaml at v1.13.0; Talos CI checks both).
    services = ["ext-nvidia-persistenced"]
    if minor >= 13:
        services.append("ext-nvidia-cdi-gen")
    return tuple(services)


#: Extension name prefix of the fabric manager (NVSwitch systems such as HGX H100/H200), any track.
FABRICMANAGER_EXTENSION = "siderolabs/nvidia-fabricmanager"


def services_for(profile: GpuProfile, extensions: Sequence[str]) -> list[str]:
    """The extension services verify checks on a node with these extensions: the toolkit's, plus
    ``ext-nvidia-fabricmanager`` when the image carries the fabric manager (its service is ``name:
    nvidia-fabricmanager`` in extensions@v1.12.0 nvidia-gpu/nvidia-fabricmanager/lts/nvidia-fabricmanager.yaml;
    verify checks it from the node's extensions, so the approved plan must name it too)."""
    services = list(profile.services)
    if any(name.startswith(FABRICMANAGER_EXTENSION) for name in extensions):
        services.append("ext-nvidia-fabricmanager")
    return services


def expected_driver(talos: TalosVersion, track: Track | None) -> str:
    """The driver a ``.0`` release ships for the track: a hint for messages, not a check (patches bump it)."""
    lts, production, _toolkit = DRIVER_TABLE[talos.minor_line]
    return production if track == "production" and production else lts
