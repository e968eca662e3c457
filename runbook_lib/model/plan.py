"""The resolved plan: what the runbook will do to this cluster, computed without touching it.

Why a separate, pure object: the plan is what a person approves.  Notebooks show it, the Approve button
applies exactly it, and the change record stores it, so it must be deterministic from the parameters
alone and serialisable as JSON/YAML.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from .boot_assets import installer_image
from .params import Node, Params
from .profiles import GPU_OPERATOR_VALUES, GpuProfile, render_documents, services_for
from .schematic import Schematic, schematic_for


@dataclass(frozen=True)
class HelmRelease:
    """The Kubernetes layer as one Helm release."""

    release: str
    chart: str
    repo_name: str
    repo_url: str
    version: str
    namespace: str
    values: dict[str, str]
    privileged_namespace: bool
    """Label the namespace ``pod-security.kubernetes.io/enforce=privileged`` (hostPath volumes need it)."""

    @property
    def chart_name(self) -> str:
        """The chart without its repository (``nvdp/nvidia-device-plugin`` -> ``nvidia-device-plugin``), as
        ``helm list`` names a release's chart."""
        return self.chart.split("/", 1)[1]


@dataclass(frozen=True)
class NodePlan:
    name: str
    address: str
    extensions: list[str]
    schematic_id: str | None
    installer_image: str | None
    schematic_yaml: str | None = None
    services: list[str] = field(default_factory=list)
    """Extension services verify checks on this node (``profiles.services_for`` its extensions)."""


@dataclass(frozen=True)
class Plan:
    cluster: str
    target: str
    talos_version: str
    driver_flavor: str
    track: str | None
    extensions: list[str]
    """Official names, in schematic order (kernel modules, toolkit, then extra extensions)."""
    extension_delivery: str
    machine_config_patches: list[str]
    """YAML documents of the strategic-merge patch, one string per document."""
    default_runtime_patch: str | None
    default_runtime_needs_reboot: bool
    kubernetes_layer: str
    helm: HelmRelease
    installer_image: str | None
    schematic_id: str | None
    schematic_yaml: str | None
    """The canonical schematic (the exact bytes the factory hashes); ``None`` before the Image Factory."""
    module_check: str
    services: list[str]
    cuda_smi_image: str
    cuda_vectoradd_image: str | None
    apply: bool
    rollout_concurrency: int
    nodes: list[NodePlan] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def schematic_of(self, node_name: str) -> str | None:
        """The schematic the plan gives this node (its overrides' extensions), else the fleet's: an upgrade to the
        fleet's would drop a node's own extra extensions. One place for preflight, verify and cuda-test."""
        return next((p.schematic_id for p in self.nodes if p.name == node_name), self.schematic_id)


def _helm_release(params: Params, profile: GpuProfile, layer: str) -> HelmRelease:
    if layer == "gpu-operator":
        return HelmRelease(
            release=params.gpu_operator.release,
            chart="nvidia/gpu-operator",
            repo_name="nvidia",
            repo_url=params.gpu_operator.repo_url,
            version=params.gpu_operator.chart_version,
            namespace=params.gpu_operator.namespace,
            values=dict(GPU_OPERATOR_VALUES),
            privileged_namespace=True,
        )
    namespace = params.device_plugin.namespace
    return HelmRelease(
        release=params.device_plugin.release,
        chart="nvdp/nvidia-device-plugin",
        repo_name="nvdp",
        repo_url=params.device_plugin.repo_url,
        version=params.device_plugin.chart_version or profile.device_plugin_chart_default,
        namespace=namespace,
        values={"runtimeClassName": "nvidia"},
        privileged_namespace=namespace != "kube-system",
    )


def node_extensions(params: Params, profile: GpuProfile, extra: tuple[str, ...] = ()) -> list[str]:
    """Extensions of a node's image: NVIDIA first, then the extra ones, without duplicates, order kept."""
    out: list[str] = []
    for name in [*profile.extensions, *params.extra_extensions, *extra]:
        if name not in out:
            out.append(name)
    return out


def node_schematic(params: Params, node: Node | None = None) -> Schematic | None:
    """The image a GPU node needs; ``None`` where extensions go through machine config (Talos < 1.5)."""
    profile = params.profile(node)
    if profile.extension_delivery != "image-factory":
        return None
    extra_ext = node.overrides.extra_extensions if node else ()
    extra_args = node.overrides.extra_kernel_args if node else ()
    return schematic_for(
        node_extensions(params, profile, extra_ext),
        extra_kernel_args=[*params.extra_kernel_args, *extra_args],
    )


def _installer(params: Params, schematic: Schematic | None) -> str:
    factory = params.image_factory_url if schematic is not None else None
    return installer_image(
        factory, schematic.id if schematic else "", params.talos, secureboot=params.secureboot
    )


def _image_notes(params: Params, profile: GpuProfile) -> list[str]:
    """What the image step decides per node, which the offline plan cannot show (``steps.image_risks``)."""
    if profile.extension_delivery != "image-factory":
        return []
    notes = [
        "the image step refuses to upgrade a node that runs extensions this schematic lacks (iscsi-tools, "
        "drbd…): the upgrade would remove them; it names the extra_extensions line that keeps them"
    ]
    if _kernel_args_miss_the_installer(params):
        notes.append(
            "extra_kernel_args change the schematic ID but never reach the node's kernel command line through "
            f"the Talos {params.talos} installer (the Image Factory adds them to installers only with secure "
            "boot or from Talos 1.10): set them in machine.install.extraKernelArgs instead"
        )
    if params.talos.at_least(1, 10):
        notes.append(
            "installer_image is the metal one: the image step upgrades each node with its own "
            "<platform>-installer (talosctl get platformmetadata, e.g. aws-installer)"
        )
    return notes


def _kernel_args_miss_the_installer(params: Params) -> bool:
    """True when the factory installer leaves out the schematic's kernel arguments: Talos 1.5-1.9 without
    secure boot (image-factory@26b95ca internal/profile/profile.go:593-597; talos@v1.10.0
    pkg/machinery/imager/quirks/quirks.go:214 ``minTalosVersionUnifiedInstaller = 1.10.0``)."""
    wanted = params.extra_kernel_args or any(n.overrides.extra_kernel_args for n in params.nodes)
    return bool(wanted) and not params.secureboot and not params.talos.at_least(1, 10)


def build_plan(params: Params) -> Plan:
    """Resolve the parameters into the concrete plan (pure; the same parameters give the same plan)."""
    profile = params.profile()
    layer = params.resolved_kubernetes_layer
    extensions = node_extensions(params, profile)
    install_images = (
        profile.install_extension_images() if profile.extension_delivery == "install-extensions" else None
    )
    patch_docs = profile.machine_config_patch_documents(install_images=install_images)
    notes = list(profile.notes)
    if profile.extension_delivery == "install-extensions":
        notes.append(
            f"Talos {profile.talos} predates the Image Factory: extensions are installed through "
            "machine.install.extensions and an upgrade to the stock installer; check that the image tags exist"
        )
    notes += _image_notes(params, profile)
    if layer == "device-plugin" and params.talos.at_least(1, 13):
        notes.append("Talos ≥ 1.13 docs use the GPU Operator; the device plugin is kept here by request")
    schematic = node_schematic(params)
    nodes = []
    for node in params.nodes:
        own = node_schematic(params, node)
        own_profile = params.profile(node)
        own_extensions = node_extensions(params, own_profile, node.overrides.extra_extensions)
        nodes.append(
            NodePlan(
                name=node.name,
                address=node.address,
                extensions=own_extensions,
                schematic_id=own.id if own else None,
                installer_image=_installer(params, own),
                schematic_yaml=own.canonical_yaml() if own and own != schematic else None,
                services=services_for(own_profile, own_extensions),
            )
        )
    return Plan(
        cluster=params.cluster,
        target=params.target,
        talos_version=params.talos_version,
        driver_flavor=profile.flavor,
        track=profile.track,
        extensions=extensions,
        extension_delivery=profile.extension_delivery,
        machine_config_patches=[render_documents([doc]) for doc in patch_docs],
        default_runtime_patch=render_documents(profile.default_runtime_documents())
        if params.default_runtime_patch
        else None,
        default_runtime_needs_reboot=params.default_runtime_patch and profile.default_runtime_needs_reboot,
        kubernetes_layer=layer,
        helm=_helm_release(params, profile, layer),
        installer_image=_installer(params, schematic),
        schematic_id=schematic.id if schematic else None,
        schematic_yaml=schematic.canonical_yaml() if schematic else None,
        module_check=profile.module_check,
        services=services_for(profile, extensions),
        cuda_smi_image=params.cuda_test.smi_image or profile.cuda_smi_image,
        cuda_vectoradd_image=profile.cuda_vectoradd_image
        if params.cuda_test.vectoradd_image == "auto"
        else params.cuda_test.vectoradd_image,
        apply=params.apply,
        rollout_concurrency=params.rollout_concurrency,
        nodes=nodes,
        notes=notes,
    )
