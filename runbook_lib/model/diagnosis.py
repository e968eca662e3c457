"""The failure table (facts §5) as data, and the checks that turn parsed evidence into findings.

Why: a failed check that only says "failed" sends the user searching issue trackers.  Each entry here
pairs a symptom (text a user sees in a log, an event or a tool's output) with its likely cause, the fix
with the exact command, and the public source it came from.  The check functions take *parsed* values
(from :mod:`runbook_lib.model.parsers`), not raw text, so the verify step (which reads a live node) and
``runbook diagnose`` (which reads a support paste) reach the same findings with the same fixes.

Everything here is pure; node names, Talos versions and schematic IDs fill the command templates when
known and stay ``<placeholders>`` when not, so a fix is always a command the user can complete.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from runbook_lib.errors import PermanentError

from .boot_assets import factory_host, schematics_url
from .parsers import NVIDIA_MODULES, DriverInfo, NvidiaSmi, ServiceStatus
from .pci import PciDevice, nvidia_gpus
from .text import PARAMS_PLACEHOLDER
from .versions import TalosVersion, parse_kmod_tag, parse_toolkit_tag

ExtensionKind = Literal["kmod-open", "kmod-proprietary", "toolkit", "fabricmanager", "gdrdrv"]


# --------------------------------------------------------------------------------------------------------------
# The table


@dataclass(frozen=True)
class KnownFailure:
    """One row of the failure table: symptom matcher → likely cause → fix (with the command) → sources."""

    key: str
    title: str
    symptoms: tuple[str, ...]
    """Regular expressions matched against logs, events or tool output; empty for evidence-only rows."""
    cause: str
    fix: str
    command: str
    """The command to run; ``{node}`` (the address talosctl's ``-n`` takes), ``{node_name}`` (the Kubernetes Node
    kubectl names), ``{talos}``, ``{schematic}``, ``{installer}`` are filled when known."""
    sources: tuple[str, ...]
    new_schematic: bool = False
    """The fix needs a schematic with other extensions, so the node's current one must not fill ``{schematic}``."""

    def matches(self, text: str) -> bool:
        return self.matched_line(text) is not None

    def matched_line(self, text: str) -> str | None:
        """The line of ``text`` where a symptom starts (stripped, at most :data:`QUOTE_MAX` characters), or None
        when none appears: what a finding quotes as what was seen."""
        for pattern in self.symptoms:
            found = re.search(pattern, text, re.IGNORECASE)
            if found:
                start = text.rfind("\n", 0, found.start()) + 1
                end = text.find("\n", found.start())
                line = text[start : end if end >= 0 else len(text)].strip()
                return line if len(line) <= QUOTE_MAX else line[: QUOTE_MAX - 1] + "…"
        return None


#: How much of a matched line a finding quotes.
QUOTE_MAX = 160


FAILURES: tuple[KnownFailure, ...] = (
    KnownFailure(
        key="device-plugin-no-pods",
        title="device-plugin DaemonSet schedules no pods",
        symptoms=(r"nvidia-device-plugin\S*.*\b0 desired", r"desiredNumberScheduled\W+0\b"),
        cause="chart >= 0.15 requires a node label (NFD's pci-10de.present or nvidia.com/gpu.present=true) "
        "that Talos nodes do not carry without NFD/GFD",
        fix="label the GPU node (or set machine.nodeLabels), or override the chart's affinity, or enable gfd",
        command="kubectl label node {node_name} nvidia.com/gpu.present=true",
        sources=(
            "https://github.com/siderolabs/talos/issues/12103",
            "https://github.com/siderolabs/talos/issues/9187",
            "https://github.com/NVIDIA/k8s-device-plugin/issues/315",
        ),
    ),
    KnownFailure(
        key="plugin-without-nvidia-runtime",
        title="device plugin finds no GPU library",
        symptoms=(
            r"Incompatible strategy detected auto",
            r"did you configure the NVIDIA Container Toolkit",
            r"invalid device discovery strategy",
        ),
        cause="the device-plugin pod does not run with the nvidia runtime, so it sees no NVML",
        fix="install the chart with runtimeClassName=nvidia (or make nvidia the node's default runtime)",
        command="helm upgrade --install nvidia-device-plugin nvdp/nvidia-device-plugin -n kube-system "
        "--version <chart-version> --set runtimeClassName=nvidia",
        sources=(
            "https://github.com/NVIDIA/k8s-device-plugin/issues/1220",
            "https://github.com/NVIDIA/k8s-device-plugin/issues/1470",
            "https://github.com/NVIDIA/k8s-device-plugin/issues/1574",
        ),
    ),
    KnownFailure(
        key="nvml-not-found",
        title="NVML cannot be loaded in the pod",
        symptoms=(
            r"Failed to initialize NVML: (?!Driver/library version mismatch)",
            r"could not load NVML library",
        ),
        cause="the pod does not run with the nvidia runtime, so the driver libraries are not mounted into it",
        fix="set runtimeClassName: nvidia on the pod (for the device plugin: --set runtimeClassName=nvidia)",
        command="helm upgrade --install nvidia-device-plugin nvdp/nvidia-device-plugin -n kube-system "
        "--version <chart-version> --set runtimeClassName=nvidia",
        sources=(
            "https://github.com/NVIDIA/k8s-device-plugin/blob/main/internal/plugin/factory.go",
            "https://github.com/NVIDIA/gpu-operator/issues/250",
        ),
    ),
    KnownFailure(
        key="no-runtime-handler",
        title="the node has no nvidia runtime handler",
        symptoms=(r"no runtime for \"?nvidia\"? is configured",),
        cause="the container-toolkit extension is not installed or not active on the node, so "
        "/etc/cri/conf.d/10-nvidia-container-runtime.part does not exist",
        fix="add the nvidia-container-toolkit extension (same track as the kernel modules) to the node's "
        "schematic and upgrade the node with that installer",
        command="talosctl -n {node} upgrade --image {factory}/{installer}/{schematic}:{talos}",
        sources=(
            "https://github.com/NVIDIA/gpu-operator/issues/413",
            "https://github.com/siderolabs/extensions/tree/main/nvidia-gpu/nvidia-container-toolkit",
        ),
        new_schematic=True,
    ),
    KnownFailure(
        key="runtimeclass-missing",
        title="RuntimeClass nvidia does not exist",
        symptoms=(r"RuntimeClass \"?nvidia\"? not found",),
        cause="the RuntimeClass was never created, or was deleted (the 1.13 upgrade note asks for that)",
        fix="create the RuntimeClass nvidia with handler nvidia (or let the GPU Operator create it)",
        command="kubectl apply -f - <<EOF\napiVersion: node.k8s.io/v1\nkind: RuntimeClass\nmetadata:\n"
        "  name: nvidia\nhandler: nvidia\nEOF",
        sources=("https://kubernetes.io/docs/concepts/containers/runtime-class/",),
    ),
    KnownFailure(
        key="bpf-jit-harden",
        title="nvidia-container-cli cannot load its BPF device filter",
        symptoms=(r"failed to add device rules", r"last insn is not an exit or jmp"),
        cause="Talos' KSPP default net.core.bpf_jit_harden=2 breaks the legacy nvidia-container-cli",
        fix="set the sysctl net.core.bpf_jit_harden: 1 (Talos <= 1.12; the 1.13 CDI toolkit does not need it)",
        command='talosctl -n {node} patch mc --patch \'{{"machine": {{"sysctls": '
        '{{"net.core.bpf_jit_harden": "1"}}}}}}\'',
        sources=(
            "https://github.com/siderolabs/extensions/issues/101",
            "https://github.com/NVIDIA/libnvidia-container/issues/176",
        ),
    ),
    KnownFailure(
        key="toolkit-missing-library",
        title="nvidia-container-cli misses a shared library",
        symptoms=(r"nvidia-container-cli: error while loading shared libraries",),
        cause="an extension packaging bug (libelf vs elfutils) in some production-track toolkit builds",
        fix="upgrade to a newer Talos patch release (its toolkit extension is rebuilt); the fixing version "
        "was not confirmed",
        command="talosctl -n {node} upgrade --image {factory}/{installer}/{schematic}:<newer-patch>",
        sources=("https://github.com/siderolabs/extensions/issues/751",),
    ),
    KnownFailure(
        key="nvidia-smi-not-in-pod",
        title="nvidia-smi is not in the container",
        symptoms=(r"\"?nvidia-smi\"?: executable file not found in \$PATH",),
        cause="the pod does not use the nvidia runtime (no runtimeClassName, default runtime runc), so the "
        "driver's binaries are not mounted",
        fix="set runtimeClassName: nvidia on the pod; CUDA images already set NVIDIA_VISIBLE_DEVICES",
        command="kubectl run nvidia-test --restart=Never --rm -ti --image nvcr.io/nvidia/cuda:12.5.0-base-ubuntu22.04 "
        '--overrides \'{{"spec": {{"runtimeClassName": "nvidia"}}}}\' -- nvidia-smi',
        sources=(
            "https://github.com/NVIDIA/k8s-device-plugin/issues/346",
            "https://github.com/NVIDIA/nvidia-docker/issues/1668",
        ),
    ),
    KnownFailure(
        key="extensions-not-installed",
        title="NVIDIA modules absent: the extensions are not installed",
        symptoms=(),
        cause="the node does not run an installer that carries the NVIDIA extensions: patching the machine "
        "config does not install them, an upgrade with the GPU schematic's installer does",
        fix="first the modules patch, unless the machine config lists the four modules already (the kernel-module "
        "extension blacklists them, so a node that boots it without them never starts ext-nvidia-persistenced "
        "and the upgrade rolls back after about an hour), then upgrade the node with the Image Factory installer "
        "of a schematic holding the kernel-module and container-toolkit extensions, for the node's exact Talos "
        # the placeholder: `runbook run` puts the run's own -p/--set/--records/--state there; pasted bare, the
        # command changed the default simulator's cluster and wrote to ./records (README audit, stop 50)
        f"version (`runbook run {PARAMS_PLACEHOLDER} --steps config-patch,image --apply` does both, in that order)",
        command="{patch_command}\n# then, with the patch applied:\n"
        "talosctl -n {node} upgrade --image {factory}/{installer}/{schematic}:{talos}",
        sources=(
            "https://github.com/siderolabs/talos/issues/7043",
            "https://github.com/siderolabs/talos/issues/5956",
            "https://github.com/siderolabs/extensions/issues/888",
            "https://github.com/siderolabs/talos/issues/9149",
        ),
        new_schematic=True,
    ),
    KnownFailure(
        key="extensions-not-installed-before-1-5",
        title="NVIDIA modules absent: the extensions are not installed (Talos before 1.5)",
        symptoms=(),
        cause="the node's last installer run did not install the NVIDIA extensions: before Talos 1.5 there is "
        "no Image Factory, and the stock installer installs the images machine.install.extensions lists when "
        "the node upgrades",
        fix="list the NVIDIA kernel-module and container-toolkit images for the node's exact Talos version in "
        "machine.install.extensions (the config-patch step does, with the modules), then upgrade to the stock "
        "installer, keeping /var",
        command="talosctl -n {node} upgrade --image ghcr.io/siderolabs/installer:{talos} --preserve",
        sources=(
            "https://github.com/siderolabs/talos/blob/v1.4.8/website/content/v1.4/talos-guides/configuration/"
            "nvidia-gpu.md",
        ),
    ),
    KnownFailure(
        key="modules-not-configured",
        title="NVIDIA modules absent although the extensions are installed",
        symptoms=(),
        cause="the kernel-module extension blacklists nvidia, nvidia_uvm, nvidia_drm and nvidia_modeset, so "
        "they load only when the machine config lists them",
        fix="add the four modules to the machine config (gpu-worker-patch.yaml below) and apply it; if the "
        "config lists them already, the driver failed to load: read `talosctl -n {node} dmesg | grep NVRM` "
        "(unsupported GPU, or no NVIDIA GPU in the node)",
        command="{patch_command}",
        sources=(
            "https://github.com/siderolabs/extensions/blob/main/nvidia-gpu/nvidia-modules/lts/files/nvidia.conf",
            "https://github.com/siderolabs/extensions/pull/138",
            "https://docs.siderolabs.com/talos/v1.12/configure-your-talos-cluster/hardware-and-drivers/nvidia-gpu",
        ),
    ),
    KnownFailure(
        key="driver-not-loaded",
        title="the NVIDIA driver is not loaded (nvidia-smi or the toolkit cannot reach it)",
        symptoms=(
            r"couldn't communicate with the NVIDIA driver",
            r"NVIDIA-SMI has failed",
            # the toolkit's prestart hook, in a pod's events (captured in NVIDIA/nvidia-docker#1393,
            # NVIDIA/nvidia-container-toolkit#1269): no driver for NVML to talk to
            r"nvidia-container-cli: initialization error: nvml error: driver not loaded",
        ),
        cause="the nvidia kernel module is not loaded: either the extensions are not installed or the modules "
        "are not listed in the machine config",
        fix="collect the extensions and the loaded modules and run `runbook diagnose` on them",
        command="talosctl -n {node} get extensions > extensions.txt && talosctl -n {node} read /proc/modules "
        "> modules.txt && runbook diagnose --extensions extensions.txt --proc-modules modules.txt",
        sources=(
            "https://github.com/siderolabs/talos/issues/7043",
            "https://github.com/NVIDIA/nvidia-docker/issues/1393",
        ),
    ),
    KnownFailure(
        key="gpu-unsupported",
        title="the GPU is not supported by this driver release",
        symptoms=(
            # the driver wraps this message over several "NVRM:" lines
            r"is not supported by the\s+(?:.*?NVRM:\s+)?NVIDIA \S+ driver release",
            r"NVRM: The NVIDIA probe routine failed",
            r"probe .* failed with error -1",
        ),
        cause="the GPU is not supported by this driver branch (or needs the proprietary/GRID driver)",
        fix="choose another track (lts/production) or the proprietary kernel modules (nonfree-kmod-nvidia-*)",
        command="talosctl -n {node} upgrade --image {factory}/{installer}/<schematic-with-other-track>:{talos}",
        sources=("https://github.com/siderolabs/extensions/issues/227",),
        new_schematic=True,
    ),
    KnownFailure(
        key="no-nvidia-gpu",
        title="the node has no NVIDIA GPU",
        symptoms=(r"NVRM: No NVIDIA GPU found",),
        cause="the NVIDIA extensions and modules are on a node without an NVIDIA GPU (or the GPU is not "
        "visible to the OS, e.g. not passed through to the VM)",
        fix="put the NVIDIA extensions and the modules patch on GPU nodes only; upgrade this node with its "
        "non-GPU schematic",
        command="talosctl -n {node} upgrade --image {factory}/{installer}/<non-gpu-schematic-id>:{talos}",
        sources=("https://github.com/siderolabs/extensions/issues/888",),
    ),
    KnownFailure(
        key="persistenced-never-up",
        title="ext-nvidia-persistenced never comes up",
        symptoms=(r"service \"?ext-nvidia-persistenced\"? to be \"?up\"?",),
        cause="the toolkit extension is on a node whose nvidia driver never binds (persistenced waits for "
        "/sys/bus/pci/drivers/nvidia): a node without a GPU, or without the modules loaded",
        fix="put the NVIDIA extensions on GPU nodes only, and apply the modules patch before upgrading",
        command="talosctl -n {node} read /proc/modules",
        sources=(
            "https://github.com/siderolabs/extensions/issues/888",
            "https://github.com/siderolabs/extensions/blob/main/nvidia-gpu/nvidia-container-toolkit/lts/nvidia-persistenced.yaml",
        ),
    ),
    KnownFailure(
        key="upgrade-drain-failed",
        title="talosctl 1.13 installed the new image but could not drain the node",
        symptoms=(
            r"error creating Kubernetes client for drain",
            r"error resolving Kubernetes node name for ",
            r"error getting node \"[^\"]+\": ",
            r"error (?:cordoning|draining) node \"",
        ),
        cause="talosctl 1.13 drains the node (its default --drain) after the install and before the reboot, and "
        "the drain failed: the new image is installed and boots at the node's next reboot, the node still runs "
        "the old one, and a node the drain already cordoned stays cordoned",
        fix="make the drain possible: talosctl's endpoints must include a control-plane node (only those hand out "
        "the kubeconfig the drain uses: talosctl config endpoint <control-plane address>), the Kubernetes API it "
        "names must be reachable from here, and no PodDisruptionBudget may block the eviction for 5 minutes; "
        "then re-run the image step (it drains, reboots and uncordons the node)",
        command="runbook run -p <parameters> --steps image --apply",
        sources=(
            "https://github.com/siderolabs/talos/blob/v1.13.0/cmd/talosctl/cmd/talos/upgrade.go",
            "https://github.com/siderolabs/talos/blob/v1.13.0/cmd/talosctl/cmd/talos/drain.go",
            "https://github.com/siderolabs/talos/blob/v1.13.0/cmd/talosctl/pkg/talos/nodedrain/nodedrain.go",
            "https://github.com/siderolabs/talos/blob/v1.13.0/internal/app/internal/machinehelper/machinehelper.go",
        ),
    ),
    KnownFailure(
        key="broken-after-minor-upgrade",
        title="GPU pods stopped working after a Talos minor upgrade",
        symptoms=(),
        cause="the Talos release bumped the driver and toolkit; 1.13 switched the recommended Kubernetes layer "
        "to the GPU Operator",
        fix="re-validate the node and follow the procedure for the new Talos minor version",
        command="runbook run -p <parameters>",
        sources=(
            "https://github.com/siderolabs/talos/issues/13346",
            "https://github.com/siderolabs/extensions/issues/527",
        ),
    ),
    KnownFailure(
        key="gpu-operator-driver-validation",
        title="the GPU Operator waits for its own driver container",
        symptoms=(r"Attempting to validate a driver container installation",),
        cause="the operator expects to install the driver itself; on Talos the extensions provide it",
        fix="install the chart with driver and toolkit disabled and the host driver path",
        command="helm upgrade --wait --install -n gpu-operator gpu-operator nvidia/gpu-operator "
        "--set driver.enabled=false --set toolkit.enabled=false --set hostPaths.driverInstallDir=/usr/local",
        sources=(
            "https://docs.siderolabs.com/talos/v1.13/configure-your-talos-cluster/hardware-and-drivers/nvidia-gpu",
            "https://github.com/cozystack/cozystack/issues/3585",
        ),
    ),
    KnownFailure(
        key="pod-security-baseline",
        title="Pod Security rejects the hostPath volumes",
        symptoms=(r"violates PodSecurity \"?baseline(?::latest)?\"?.*hostPath",),
        cause="Talos enforces the baseline Pod Security level everywhere except kube-system",
        fix="install into kube-system, or label the namespace privileged",
        command="kubectl label --overwrite ns <namespace> pod-security.kubernetes.io/enforce=privileged",
        sources=("https://github.com/siderolabs/talos/blob/main/pkg/machinery/config/generate/init.go",),
    ),
    KnownFailure(
        key="driver-library-mismatch",
        title="kernel module and user-space driver differ",
        symptoms=(r"API mismatch: the client has the version", r"Driver/library version mismatch"),
        cause="the kernel modules and the container toolkit carry different driver versions (e.g. an lts "
        "kernel module with a production toolkit)",
        fix="use one track for both extensions (…-lts with …-lts, or …-production with …-production) and "
        "upgrade with that schematic's installer",
        command="talosctl -n {node} upgrade --image {factory}/{installer}/{schematic}:{talos}",
        sources=(
            "https://docs.siderolabs.com/talos/v1.12/configure-your-talos-cluster/hardware-and-drivers/nvidia-gpu",
            "https://github.com/NVIDIA/nvidia-container-toolkit/issues/171",
        ),
        new_schematic=True,
    ),
    KnownFailure(
        key="kmod-built-for-other-talos",
        title="kernel modules built for another Talos release",
        symptoms=(),
        cause="the NVIDIA kernel modules are locked to one Talos kernel build; an extension pinned by tag "
        "(e.g. machine.install.extensions) or an installer for another release brings modules that do not load",
        fix="upgrade with the Image Factory installer for the node's exact Talos version: the factory picks "
        "the matching kernel-module tag",
        command="talosctl -n {node} upgrade --image {factory}/{installer}/{schematic}:{talos}",
        sources=("https://github.com/siderolabs/extensions/issues/406",),
    ),
    KnownFailure(
        key="driver-flavor-mixup",
        title="the loaded driver is not the flavour the extension ships",
        symptoms=(),
        cause="the running nvidia module and the kernel-module extension differ in flavour (open vs "
        "proprietary): both flavours in one schematic, or outputs collected before and after a change",
        fix="keep exactly one kernel-module extension in the schematic (open modules for Turing and newer, "
        "proprietary for older GPUs and DGX/GB10), upgrade with it, and collect the outputs again",
        command="talosctl -n {node} upgrade --image {factory}/{installer}/{schematic}:{talos}",
        sources=(
            "https://github.com/siderolabs/extensions/tree/main/nvidia-gpu",
            "https://docs.siderolabs.com/talos/v1.13/configure-your-talos-cluster/hardware-and-drivers/nvidia-gpu",
        ),
        new_schematic=True,
    ),
    KnownFailure(
        key="driver-version-differs",
        title="the loaded driver differs from the extension's",
        symptoms=(),
        cause="the module in memory is not the one the installed extension ships: the node was not rebooted "
        "into the new installer, both kernel-module flavours are installed, or the outputs come from different "
        "boots or nodes",
        fix="make the schematic carry exactly one kernel-module extension, upgrade (which reboots) and collect "
        "/proc/driver/nvidia/version and the extensions again",
        command="talosctl -n {node} upgrade --image {factory}/{installer}/{schematic}:{talos}",
        sources=("https://github.com/siderolabs/extensions/issues/406",),
    ),
    KnownFailure(
        key="cdi-gen-not-finished",
        title="ext-nvidia-cdi-gen did not finish",
        symptoms=(),
        cause="Talos >= 1.13 toolkit writes the CDI spec /run/cdi/nvidia.yaml in this one-shot service; "
        "without it pods requesting nvidia.com/gpu get no devices",
        fix="read the service log; it usually fails because the nvidia modules are not loaded",
        command="talosctl -n {node} logs ext-nvidia-cdi-gen",
        sources=(
            "https://github.com/siderolabs/talos/blob/main/internal/integration/api/extensions_nvidia.go",
        ),
    ),
    KnownFailure(
        key="cdi-spec-incomplete",
        title="the CDI spec misses files Talos CI expects it to find",
        symptoms=(),
        cause="nvidia-ctk could not locate more driver files than the Talos release's CI baseline: the kernel "
        "modules and the toolkit come from different builds, or the extension is broken; a pod using the CDI "
        "spec lacks those files",
        fix="read the names it could not locate in the service log; re-install the matching kernel-module and "
        "toolkit extensions of one track (upgrade with the planned schematic)",
        command="talosctl -n {node} logs ext-nvidia-cdi-gen",
        sources=(
            "https://github.com/siderolabs/talos/blob/v1.13.4/internal/integration/api/extensions_nvidia.go",
        ),
    ),
    KnownFailure(
        key="fabricmanager-not-running",
        title="ext-nvidia-fabricmanager is not running",
        symptoms=(),
        cause="on NVSwitch systems (HGX/DGX) CUDA cannot use the GPUs until the fabric manager runs; it "
        "refuses to start when its version differs from the loaded driver, or waits while the driver is "
        "not loaded",
        fix="read the service log; the fabric manager extension must carry the same driver version as the "
        "kernel modules (upgrade with one schematic that has both)",
        command="talosctl -n {node} logs ext-nvidia-fabricmanager",
        sources=(
            "https://github.com/siderolabs/extensions/blob/v1.13.0/nvidia-gpu/nvidia-fabricmanager/lts/nvidia-fabricmanager.yaml",
            "https://docs.siderolabs.com/talos/v1.12/configure-your-talos-cluster/hardware-and-drivers/nvidia-fabricmanager",
        ),
    ),
    KnownFailure(
        key="schematic-differs",
        title="the node runs another schematic than planned",
        symptoms=(),
        cause="the node was installed or upgraded with an installer of another schematic (for example "
        "`talosctl upgrade` without --image drops the extensions)",
        fix="upgrade the node with the planned schematic's installer",
        command="talosctl -n {node} upgrade --image {factory}/{installer}/{schematic}:{talos}",
        sources=("https://docs.siderolabs.com/talos/v1.12/learn-more/image-factory",),
    ),
)

_BY_KEY = {entry.key: entry for entry in FAILURES}


def known_failure(key: str) -> KnownFailure:
    try:
        return _BY_KEY[key]
    except KeyError:
        raise PermanentError(f"no failure-table entry {key!r}") from None


def match_failures(text: str) -> list[KnownFailure]:
    """Table rows whose symptom appears in ``text`` (pod events, logs, nvidia-smi or talosctl output)."""
    return [entry for entry in FAILURES if entry.matches(text)]


# --------------------------------------------------------------------------------------------------------------
# Findings


@dataclass(frozen=True)
class Finding:
    """The outcome of one check on one node: what was seen and, when it failed, what to run."""

    check: str
    ok: bool
    message: str
    fix: str = ""
    cause: str = ""
    failure: str | None = None
    """Key of the failure-table row this finding came from."""
    sources: tuple[str, ...] = ()
    node: str | None = None

    def to_dict(self) -> dict[str, object]:
        """The stable four-key shape of ``runbook diagnose --json`` and run records."""
        return {"check": self.check, "ok": self.ok, "message": self.message, "fix": self.fix}


@dataclass(frozen=True)
class NodeContext:
    """What is known about the node; unknown parts stay placeholders in the fix commands."""

    node: str | None = None
    """The node as talosctl's ``-n`` takes it: its address."""
    talos: TalosVersion | None = None
    schematic: str | None = None
    """The planned GPU schematic: the one to upgrade to."""
    node_name: str | None = None
    """The node's Kubernetes name, which kubectl commands take; unknown: a placeholder, never the address. Why
    apart: cuda-test filled
    ``talosctl -n <Kubernetes name>`` (a name talosctl may not resolve), verify ``kubectl label node <address>``
    (review, 7 Dec 2026)."""
    current_schematic: str | None = None
    """The schematic the node runs; good enough for fixes that keep the extensions (a re-install)."""
    running: TalosVersion | None = None
    """The release the node reports (``talosctl version``); ``talos`` stays the plan's, which fix commands
    upgrade to. Unknown: the node is taken to run ``talos``."""
    factory: str = "factory.talos.dev"
    """The Image Factory's registry host the installers come from (the parameters' ``image_factory_url``: a
    site's own factory, or the simulator's), which fix commands name."""
    factory_url: str | None = None
    """That factory's API URL (``image_factory_url``), where a schematic is POSTed; unknown: ``https://`` and
    ``factory``. Why apart from ``factory``: a site's factory may answer plain http or under a path, while
    its installers are named by the registry host alone."""

    @classmethod
    def at_factory(cls, factory_url: str, **known: Any) -> NodeContext:
        """The context of a node whose installers come from the factory at ``factory_url`` (the parameters'
        ``image_factory_url``): its registry host for the installers, the URL for schematics. Raises
        PermanentError for a string that is no URL."""
        return cls(factory=factory_host(factory_url), factory_url=factory_url, **known)

    @property
    def schematics_url(self) -> str:
        """Where to POST a schematic (``boot_assets.schematics_url``: no credentials, query or fragment)."""
        return schematics_url(self.factory_url or f"https://{self.factory}")

    @property
    def node_release(self) -> TalosVersion | None:
        """What the node's kernel is: the kernel-module build is compared with this, not with the plan."""
        return self.running or self.talos

    def fill(self, template: str, *, new_schematic: bool = False) -> str:
        talos = str(self.talos) if self.talos and self.talos.is_release else "<talos-version>"
        installer = "installer" if self.talos and not self.talos.at_least(1, 10) else "metal-installer"
        schematic = self.schematic or (None if new_schematic else self.current_schematic)
        return template.format(
            node=self.node or "<node>",
            node_name=self.node_name or "<node-name>",  # never the address (review of 6b1cc22)
            talos=talos,
            schematic=schematic or "<gpu-schematic-id>",
            installer=installer,
            factory=self.factory,
            # the form the node's own release takes (a 1.13 node refuses 1.14's KernelModuleConfig documents)
            patch_command=module_patch(self.node_release, self.node),
        )


NEW_SCHEMATIC_HINT = (
    "(<gpu-schematic-id>: the ID Image Factory returns for a schematic with the kernel-module and toolkit "
    "extensions of one track, e.g. `runbook schematic show -p <parameters>`, or POST it to "
    "{schematics_url})"
)


def module_patch(talos: TalosVersion | None, node: str | None = None) -> str:
    """The modules patch and the command that applies it, in the form the node's Talos version wants.

    1.14 uses ``KernelModuleConfig`` documents (and ``--patch file`` without ``@``); 1.13 drops the
    ``bpf_jit_harden`` sysctl; older versions need it (facts §1.3).
    """
    target = node or "<node>"
    if talos is not None and talos.at_least(1, 14):
        docs = "---\n".join(
            f"apiVersion: v1alpha1\nkind: KernelModuleConfig\nname: {m}\n" for m in NVIDIA_MODULES
        )
        return f"cat > gpu-worker-patch.yaml <<EOF\n{docs}EOF\ntalosctl -n {target} patch mc --patch gpu-worker-patch.yaml"
    modules = "".join(f"      - name: {m}\n" for m in NVIDIA_MODULES)
    sysctl = ""
    if talos is None or not talos.at_least(1, 13):
        sysctl = "  sysctls:\n    net.core.bpf_jit_harden: 1\n"
    note = "" if talos is not None else "# Talos >= 1.13: leave out the sysctls part\n"
    return (
        f"cat > gpu-worker-patch.yaml <<EOF\n{note}machine:\n  kernel:\n    modules:\n{modules}{sysctl}EOF\n"
        f"talosctl -n {target} patch mc --patch @gpu-worker-patch.yaml"
    )


def _finding(check: str, ok: bool, message: str, ctx: NodeContext, key: str | None = None) -> Finding:
    """A finding; failed ones carry the table row's cause, fix and command, filled for this node."""
    if ok or key is None:
        return Finding(check=check, ok=ok, message=message, node=ctx.node)
    if key == "extensions-not-installed" and ctx.talos is not None and not ctx.talos.at_least(1, 5):
        key = "extensions-not-installed-before-1-5"  # no Image Factory before 1.5 (boot_assets.py)
    entry = known_failure(key)
    fix = f"{ctx.fill(entry.fix)}:\n{ctx.fill(entry.command, new_schematic=entry.new_schematic)}"
    if entry.new_schematic and ctx.schematic is None and "{schematic}" in entry.command:
        fix += "\n" + NEW_SCHEMATIC_HINT.format(schematics_url=ctx.schematics_url)
    return Finding(
        check=check,
        ok=False,
        message=f"{message} (likely cause: {entry.cause})",
        fix=fix,
        cause=entry.cause,
        failure=entry.key,
        sources=entry.sources,
        node=ctx.node,
    )


# --------------------------------------------------------------------------------------------------------------
# Extensions: classify names, then check the stack


_EXT_RE = re.compile(
    r"^(?:siderolabs/)?(?P<base>nvidia-open-gpu-kernel-modules|nonfree-kmod-nvidia|nvidia-container-toolkit|"
    r"nvidia-fabricmanager|nvidia-gdrdrv-device)(?:-(?P<track>lts|production))?$"
)
_KIND_BY_BASE: dict[str, ExtensionKind] = {
    "nvidia-open-gpu-kernel-modules": "kmod-open",
    "nonfree-kmod-nvidia": "kmod-proprietary",
    "nvidia-container-toolkit": "toolkit",
    "nvidia-fabricmanager": "fabricmanager",
    "nvidia-gdrdrv-device": "gdrdrv",
}


@dataclass(frozen=True)
class NvidiaExtension:
    name: str
    kind: ExtensionKind
    track: str | None
    """``lts``/``production`` from Talos 1.8 on; ``None`` for the unsuffixed names of 1.2–1.7."""
    tag: str


@dataclass(frozen=True)
class NvidiaStack:
    """The NVIDIA extensions of one node, sorted by role."""

    kmods: tuple[NvidiaExtension, ...] = ()
    toolkits: tuple[NvidiaExtension, ...] = ()
    others: tuple[NvidiaExtension, ...] = field(default_factory=tuple)

    @property
    def kmod(self) -> NvidiaExtension | None:
        return self.kmods[0] if self.kmods else None

    @property
    def toolkit(self) -> NvidiaExtension | None:
        return self.toolkits[0] if self.toolkits else None

    @property
    def empty(self) -> bool:
        return not (self.kmods or self.toolkits or self.others)

    @property
    def kmod_driver(self) -> str | None:
        """The driver version the kernel-module extension ships, if its tag parses."""
        if self.kmod is None:
            return None
        try:
            return parse_kmod_tag(self.kmod.tag)[0]
        except PermanentError:
            return None


def classify_extensions(extensions: Mapping[str, str]) -> NvidiaStack:
    """Sort extension name → version into kernel modules, toolkit and the rest; non-NVIDIA ones are ignored."""
    kmods: list[NvidiaExtension] = []
    toolkits: list[NvidiaExtension] = []
    others: list[NvidiaExtension] = []
    for name, tag in extensions.items():
        match = _EXT_RE.match(name)
        if not match:
            continue
        ext = NvidiaExtension(name=name, kind=_KIND_BY_BASE[match["base"]], track=match["track"], tag=tag)
        if ext.kind in ("kmod-open", "kmod-proprietary"):
            kmods.append(ext)
        elif ext.kind == "toolkit":
            toolkits.append(ext)
        else:
            others.append(ext)
    return NvidiaStack(kmods=tuple(kmods), toolkits=tuple(toolkits), others=tuple(others))


def expected_extension_names(
    talos: TalosVersion, flavor: str = "open", track: str = "lts"
) -> tuple[str, str]:
    """Kernel-module and toolkit extension names for a Talos version (facts §1.1).

    ``flavor`` is ``open`` (also accepted: ``oss``, the profiles' word) or ``proprietary``.
    """
    kmod_base = "nvidia-open-gpu-kernel-modules" if flavor in ("open", "oss") else "nonfree-kmod-nvidia"
    if talos.at_least(1, 8):
        return f"{kmod_base}-{track}", f"nvidia-container-toolkit-{track}"
    return kmod_base, "nvidia-container-toolkit"


#: The known failure of a node with no NVIDIA extensions (or only half of them).
_NOT_INSTALLED = "extensions-not-installed"
_NOT_INSTALLED_KEYS = (_NOT_INSTALLED, "extensions-not-installed-before-1-5")


def check_extensions(extensions: Mapping[str, str], ctx: NodeContext | None = None) -> list[Finding]:
    """Check the NVIDIA extensions of one node: both parts present, one flavour, one track, one driver,
    kernel modules built for the node's Talos release (when known) and the names its version uses.

    ``extensions`` maps name → version as :func:`parsers.extension_versions` returns it.
    """
    ctx = ctx or NodeContext()
    stack = classify_extensions(extensions)
    if stack.kmod is None and stack.toolkit is None:
        return [
            _finding(
                "extensions", False, "no NVIDIA extensions are installed on the node", ctx, _NOT_INSTALLED
            )
        ]
    findings = [_presence(stack, ctx), *_flavours(stack, ctx), *_names_for_release(stack, ctx)]
    kmod, toolkit = stack.kmod, stack.toolkit
    if kmod is None or toolkit is None:
        return findings
    try:
        kmod_driver, built_for = parse_kmod_tag(kmod.tag)
        toolkit_driver, _ = parse_toolkit_tag(toolkit.tag)
    except PermanentError as exc:
        error = Finding(
            check="extension-tags", ok=False, message=exc.message, fix=exc.hint or "", node=ctx.node
        )
        return [*findings, error]
    drivers = {kmod.name: kmod_driver, toolkit.name: toolkit_driver}
    for other in stack.others:
        if other.kind == "fabricmanager":
            drivers[other.name] = other.tag.split("-")[0]
    findings.append(_driver_match(stack, drivers, ctx))
    findings += _built_for_release(kmod.tag, str(built_for), ctx)
    return findings


def _presence(stack: NvidiaStack, ctx: NodeContext) -> Finding:
    """Both halves are needed: the kernel modules load the driver, the toolkit gives containerd the runtime."""
    if stack.kmod is None:
        toolkit = stack.toolkit.name if stack.toolkit else ""
        message = f"the container toolkit {toolkit} is installed but no NVIDIA kernel-module extension"
        return _finding("extensions", False, message, ctx, _NOT_INSTALLED)
    if stack.toolkit is None:
        message = (
            f"the kernel modules {stack.kmod.name} are installed but no nvidia-container-toolkit extension"
        )
        return _finding("extensions", False, message, ctx, "no-runtime-handler")
    message = f"kernel modules {stack.kmod.name} and toolkit {stack.toolkit.name} are installed"
    return _finding("extensions", True, message, ctx)


def _flavours(stack: NvidiaStack, ctx: NodeContext) -> list[Finding]:
    """Two kernel-module extensions (open and proprietary) ship the same ``nvidia`` module: one must go."""
    if len(stack.kmods) <= 1:
        return []
    names = ", ".join(k.name for k in stack.kmods)
    message = (
        f"more than one kernel-module extension is installed ({names}); they ship the same nvidia module"
    )
    return [_finding("kmod-flavor", False, message, ctx, "driver-flavor-mixup")]


def _names_for_release(stack: NvidiaStack, ctx: NodeContext) -> list[Finding]:
    """From Talos 1.8 the NVIDIA extensions carry a track suffix (-lts/-production), before it none: a name of
    the other era was built for another Talos release."""
    if ctx.talos is None:
        return []
    suffixed = ctx.talos.at_least(1, 8)
    wrong = [
        ext.name
        for ext in (*stack.kmods, *stack.toolkits, *stack.others)
        if ext.kind != "gdrdrv" and (ext.track is None) == suffixed
    ]
    if not wrong:
        return []
    want = "with an -lts/-production suffix" if suffixed else "without a track suffix"
    message = f"Talos {ctx.talos} names the NVIDIA extensions {want}, but the node has {', '.join(wrong)}"
    return [_finding("extension-names", False, message, ctx, "kmod-built-for-other-talos")]


def _driver_match(stack: NvidiaStack, drivers: Mapping[str, str], ctx: NodeContext) -> Finding:
    """The kernel module and the user-space libraries (toolkit, fabric manager) must be one driver version."""
    if len(set(drivers.values())) <= 1:
        driver = next(iter(drivers.values()))
        return _finding("driver-match", True, f"kernel modules and toolkit both carry driver {driver}", ctx)
    detail = ", ".join(f"{name} {driver}" for name, driver in drivers.items())
    kmod, toolkit = stack.kmod, stack.toolkit
    if kmod is not None and toolkit is not None and kmod.track != toolkit.track:
        detail += f" (tracks {kmod.track or 'none'} and {toolkit.track or 'none'} are mixed)"
    message = f"the NVIDIA extensions carry different drivers: {detail}"
    return _finding("driver-match", False, message, ctx, "driver-library-mismatch")


def _built_for_release(kmod_tag: str, built_for: str, ctx: NodeContext) -> list[Finding]:
    """Kernel modules load only into the kernel they were built against, i.e. their Talos release."""
    runs = ctx.node_release
    if runs is None or not runs.is_release:
        return []
    if built_for != str(runs):
        message = f"kernel modules {kmod_tag} were built for Talos {built_for}, but the node runs {runs}"
        return [_finding("kmod-talos-version", False, message, ctx, "kmod-built-for-other-talos")]
    return [_finding("kmod-talos-version", True, f"kernel modules {kmod_tag} match Talos {runs}", ctx)]


def check_schematic(current: str | None, planned: str, ctx: NodeContext | None = None) -> Finding:
    """The node's schematic (the ``schematic`` pseudo-extension) against the planned one."""
    ctx = ctx or NodeContext()
    planned_ctx = replace(ctx, schematic=planned)
    if current == planned:
        return _finding("schematic", True, f"the node runs the planned schematic {planned}", planned_ctx)
    seen = f"schematic {current}" if current else "no factory schematic"
    return _finding(
        "schematic",
        False,
        f"the node runs {seen}, not the planned {planned}",
        planned_ctx,
        "schematic-differs",
    )


# --------------------------------------------------------------------------------------------------------------
# Modules, driver, nvidia-smi, services


_DRIVER_LOAD_FAILURES = ("gpu-unsupported", "no-nvidia-gpu")


def check_modules(
    modules: Mapping[str, str],
    extensions: Mapping[str, str] | None = None,
    ctx: NodeContext | None = None,
    *,
    kernel_log: str | None = None,
) -> Finding:
    """The four NVIDIA modules must be ``Live``; when not, the extensions tell which fix applies.

    ``modules`` maps name → state; ``extensions`` is ``None`` when they were not collected.  ``kernel_log``
    (``talosctl dmesg``) tells a driver that failed to probe from one that was never configured.
    """
    ctx = ctx or NodeContext()
    probe_failure = next(
        (e.key for e in match_failures(kernel_log or "") if e.key in _DRIVER_LOAD_FAILURES), None
    )
    missing = [m for m in NVIDIA_MODULES if m not in modules]
    not_live = [f"{m} ({modules[m]})" for m in NVIDIA_MODULES if m in modules and not _loaded(modules[m])]
    if not missing and not not_live:
        return _finding("modules", True, "nvidia, nvidia_uvm, nvidia_drm and nvidia_modeset are Live", ctx)
    parts = []
    if missing:
        parts.append(f"not loaded: {', '.join(missing)}")
    if not_live:
        parts.append(f"not Live: {', '.join(not_live)}")
    message = "NVIDIA kernel modules " + "; ".join(parts)
    if probe_failure is not None:
        return _finding("modules", False, message + "; the kernel log says why", ctx, probe_failure)
    if extensions is None:
        return _modules_cause_open(message, ctx)
    return _modules_cause(message, bool(missing), classify_extensions(extensions), ctx)


def _modules_cause_open(message: str, ctx: NodeContext) -> Finding:
    """Without the extensions both fixes are possible: say how to tell them apart, and give both."""
    fix = (
        "run `talosctl -n {} get extensions`: with the NVIDIA kernel-module extension listed, apply the "
        "modules patch:\n{}\nwithout it, apply the modules patch first, then upgrade with the factory installer "
        "of the GPU schematic:\n{}"
    ).format(
        ctx.node or "<node>",
        module_patch(ctx.node_release, ctx.node),
        ctx.fill(known_failure(_NOT_INSTALLED).command, new_schematic=True),
    )
    message += " (the extensions were not given, so the cause is open)"
    return Finding(check="modules", ok=False, message=message, fix=fix, node=ctx.node)


def _modules_cause(message: str, missing: bool, stack: NvidiaStack, ctx: NodeContext) -> Finding:
    """Modules not Live, with the extensions known: no extension, one built for another release, no modules
    patch (listed nowhere), or a probe that did not finish (listed but stuck)."""
    if stack.kmod is None:
        message += "; no NVIDIA kernel-module extension is installed"
        return _finding("modules", False, message, ctx, _NOT_INSTALLED)
    built_for = _kmod_built_for(stack.kmod.tag)
    runs = ctx.node_release
    if missing and runs is not None and runs.is_release and built_for and built_for != str(runs):
        message += f"; the extension {stack.kmod.name} was built for Talos {built_for}, not {runs}"
        return _finding("modules", False, message, ctx, "kmod-built-for-other-talos")
    if missing:
        message += f"; the extension {stack.kmod.name} is installed"
        return _finding("modules", False, message, ctx, "modules-not-configured")
    # Listed but stuck in Loading/Unloading: the module is there but its probe did not finish.
    return _finding("modules", False, message, ctx, "gpu-unsupported")


def _loaded(state: str) -> bool:
    """``Live`` (/proc/modules, LoadedKernelModule) or, from Talos 1.14, KernelModuleStatus's lowercase
    ``live`` and ``built-in`` (siderolabs/talos v1.14.0-rc.1 pkg/machinery/resources/runtime/
    kernelmodulestate_enumer.go: live, loading, unloading, built-in)."""
    return state.lower() in ("live", "built-in")


def _kmod_built_for(tag: str) -> str | None:
    try:
        return str(parse_kmod_tag(tag)[1])
    except PermanentError:
        return None


def check_driver(
    driver: DriverInfo, extensions: Mapping[str, str] | None = None, ctx: NodeContext | None = None
) -> list[Finding]:
    """``/proc/driver/nvidia/version`` against the kernel-module extension: same flavour, same version."""
    ctx = ctx or NodeContext()
    stack = classify_extensions(extensions or {})
    kmod = stack.kmod
    findings: list[Finding] = []
    if kmod is None:
        return findings
    expected: str = "open" if kmod.kind == "kmod-open" else "proprietary"
    if len(stack.kmods) == 1:
        if driver.flavor != expected:
            findings.append(
                _finding(
                    "driver-flavor",
                    False,
                    f"the loaded driver is the {driver.flavor} kernel module, but the installed extension "
                    f"{kmod.name} ships the {expected} one",
                    ctx,
                    "driver-flavor-mixup",
                )
            )
        else:
            findings.append(
                _finding("driver-flavor", True, f"the loaded {driver.flavor} driver matches {kmod.name}", ctx)
            )
    want = stack.kmod_driver
    if want is not None:
        matching = [k for k in stack.kmods if k.tag.split("-")[0] == driver.version]
        if driver.version == want or matching:
            findings.append(
                _finding(
                    "driver-version", True, f"the loaded driver {driver.version} is the extension's", ctx
                )
            )
        else:
            findings.append(
                _finding(
                    "driver-version",
                    False,
                    f"/proc/driver/nvidia/version says {driver.version}, but the extension {kmod.name} ships {want}",
                    ctx,
                    "driver-version-differs",
                )
            )
    return findings


def check_nvidia_smi(
    smi: NvidiaSmi,
    *,
    driver: DriverInfo | None = None,
    extensions: Mapping[str, str] | None = None,
    ctx: NodeContext | None = None,
) -> list[Finding]:
    """nvidia-smi must see GPUs and report the same driver as the node's kernel module."""
    ctx = ctx or NodeContext()
    if smi.error:
        entries = match_failures(smi.error)
        key = entries[0].key if entries else None
        return [_finding("nvidia-smi", False, f"nvidia-smi failed: {smi.error}", ctx, key)]
    findings: list[Finding] = []
    if smi.gpus:
        findings.append(_finding("gpus", True, f"nvidia-smi sees {len(smi.gpus)} GPU(s)", ctx))
    else:
        findings.append(
            Finding(
                check="gpus",
                ok=False,
                message="nvidia-smi lists no GPU",
                fix="check that the node has an NVIDIA GPU and that the nvidia module bound to it: "
                f"talosctl -n {ctx.node or '<node>'} dmesg | grep NVRM",
                node=ctx.node,
            )
        )
    reference = driver.version if driver else classify_extensions(extensions or {}).kmod_driver
    if smi.driver_version and reference and smi.driver_version != reference:
        what = "the loaded kernel module" if driver else "the kernel-module extension"
        findings.append(
            _finding(
                "smi-driver",
                False,
                f"nvidia-smi reports driver {smi.driver_version}, {what} is {reference}",
                ctx,
                "driver-version-differs",
            )
        )
    elif smi.driver_version and reference:
        findings.append(_finding("smi-driver", True, f"nvidia-smi reports driver {smi.driver_version}", ctx))
    return findings


def check_services(
    services: Mapping[str, ServiceStatus],
    ctx: NodeContext | None = None,
    *,
    cdi: bool | None = None,
    fabricmanager: bool = False,
) -> list[Finding]:
    """``ext-nvidia-persistenced`` running; on Talos >= 1.13 (``cdi``) ``ext-nvidia-cdi-gen`` finished; with
    the fabric manager extension (``fabricmanager``) ``ext-nvidia-fabricmanager`` running.

    ``services`` should come from ``talosctl services`` (the ServiceList API): the ``Service`` resource of
    ``talosctl get services`` exists only while a service runs (siderolabs/talos v1.13.0
    internal/app/machined/pkg/controllers/v1alpha1/service.go:73-92), so it never shows a Finished one-shot.
    """
    ctx = ctx or NodeContext()
    if cdi is None:
        cdi = ctx.talos.at_least(1, 13) if ctx.talos is not None else "ext-nvidia-cdi-gen" in services
    findings: list[Finding] = []
    # The toolkit ships persistenced from siderolabs/extensions v1.3.0 on
    # (nvidia-gpu/nvidia-container-toolkit/nvidia-persistenced.yaml, restart: always).
    if ctx.talos is None or ctx.talos.at_least(1, 3) or "ext-nvidia-persistenced" in services:
        findings.append(
            _running_service(
                services, "persistenced", ctx, missing="no-runtime-handler", down="persistenced-never-up"
            )
        )
    if cdi:
        findings.append(_cdi_gen(services.get("ext-nvidia-cdi-gen"), ctx))
    if fabricmanager:
        key = "fabricmanager-not-running"
        findings.append(_running_service(services, "fabricmanager", ctx, missing=key, down=key))
    return findings


def _running_service(
    services: Mapping[str, ServiceStatus], short: str, ctx: NodeContext, *, missing: str, down: str
) -> Finding:
    """Finding ``service-<short>`` for the long-running extension service ``ext-nvidia-<short>``."""
    name = f"ext-nvidia-{short}"
    service = services.get(name)
    if service is None:
        return _finding(f"service-{short}", False, f"service {name} does not exist", ctx, missing)
    if (service.state == "Running") if service.state is not None else service.running:
        return _finding(f"service-{short}", True, f"{name} is running", ctx)
    return _finding(f"service-{short}", False, f"{name} is {service.state or 'not running'}", ctx, down)


def _cdi_gen(service: ServiceStatus | None, ctx: NodeContext) -> Finding:
    """The one-shot ``ext-nvidia-cdi-gen`` (``restart: untilSuccess``) is healthy once Finished."""
    if service is None:
        return _finding(
            "service-cdi-gen", False, "service ext-nvidia-cdi-gen does not exist", ctx, "cdi-gen-not-finished"
        )
    if service.state is not None and service.state not in ("Finished", "Running"):
        return _finding(
            "service-cdi-gen", False, f"ext-nvidia-cdi-gen is {service.state}", ctx, "cdi-gen-not-finished"
        )
    how = service.state or "present (use `talosctl services` to see Finished)"
    return _finding("service-cdi-gen", True, f"ext-nvidia-cdi-gen is {how}", ctx)


#: How many ``Could not locate`` lines Talos CI expects in the ``ext-nvidia-cdi-gen`` log, per architecture and
#: kernel-module extension: files the CDI generator looks for that the extensions do not ship (Vulkan, X11,
#: IMEX, the fabric manager socket …), "manually verified" (siderolabs/talos
#: internal/integration/api/extensions_nvidia.go ``missingCDIFilesData``).  The table changed once: v1.13.0-v1.13.3
#: (and v1.14.0-alpha.0/1) vs v1.13.4-v1.13.9, v1.14.0-alpha.2-rc.1, v1.14.0 and v1.14.1 (talos@v1.14.0 and
#: @v1.14.1 from the Go module proxy, extensions_nvidia.go:91-104); no later tag was served there on 7 Dec 2026.
_CDI_BASELINE_A = {"amd64": {"production": 13, "lts": 9}, "arm64": {"production": 11, "lts": 9}}
_CDI_BASELINE_B = {"amd64": {"production": 13, "lts": 11}, "arm64": {"production": 11, "lts": 11}}
_CDI_BASELINES = {
    **{f"v1.13.{patch}": _CDI_BASELINE_A for patch in range(4)},
    **{f"v1.13.{patch}": _CDI_BASELINE_B for patch in range(4, 10)},
    **{tag: _CDI_BASELINE_B for tag in ("v1.14.0-rc.1", "v1.14.0", "v1.14.1")},
}
_COULD_NOT_LOCATE = re.compile(r'msg="Could not locate ([^:"]+)')


def cdi_baseline(kmod: str, ctx: NodeContext, *, arch: str | None) -> int | None:
    """How many ``Could not locate`` lines Talos CI expects for this release, architecture and kernel-module
    extension; ``None`` where CI publishes no baseline (the CDI-spec check does not apply there)."""
    table = _CDI_BASELINES.get(str(ctx.talos)) if ctx.talos is not None else None
    match = _EXT_RE.match(kmod)
    return (table or {}).get(arch or "", {}).get((match["track"] or "") if match else "")


def check_cdi_spec(log: str, kmod: str, ctx: NodeContext, *, arch: str | None) -> Finding | None:
    """Is the CDI spec ``ext-nvidia-cdi-gen`` wrote as complete as Talos CI requires?

    CI counts ``Could not locate`` in the service log and expects exactly its baseline; more means the
    generator missed files the spec should list (a library a CUDA pod would lack), fewer is more complete.
    ``None`` where CI publishes no baseline (another Talos tag, an unknown architecture or extension).
    """
    baseline = cdi_baseline(kmod, ctx, arch=arch)
    if baseline is None:
        return None
    count = log.count("Could not locate")
    if count <= baseline:
        return _finding(
            "cdi-spec",
            True,
            f"ext-nvidia-cdi-gen could not locate {count} files (Talos CI allows {baseline})",
            ctx,
        )
    names = ", ".join(dict.fromkeys(_COULD_NOT_LOCATE.findall(log)))
    return _finding(
        "cdi-spec",
        False,
        f"ext-nvidia-cdi-gen could not locate {count} files, Talos CI allows {baseline} for {kmod} on {arch}: {names}",
        ctx,
        "cdi-spec-incomplete",
    )


def diagnose_text(text: str, ctx: NodeContext | None = None, *, check: str = "symptoms") -> list[Finding]:
    """Failed findings for every table row whose symptom appears in free text (logs, pod events)."""
    ctx = ctx or NodeContext()
    return [
        _finding(
            check,
            False,
            f"{json.dumps(entry.matched_line(text), ensure_ascii=False)} points to: {entry.title}",
            ctx,
            entry.key,
        )
        for entry in match_failures(text)
    ]


def check_gpu_present(devices: Sequence[PciDevice], ctx: NodeContext | None = None) -> Finding:
    """The node's PCI bus (``talosctl get pcidevices``, Talos >= 1.8) must show an NVIDIA GPU."""
    ctx = ctx or NodeContext()
    gpus = nvidia_gpus(devices)
    if gpus:
        return _finding("nvidia-gpu", True, "; ".join(g.describe() for g in gpus), ctx)
    return _finding(
        "nvidia-gpu",
        False,
        f"no NVIDIA GPU among the node's {len(devices)} PCI devices (none with vendor 10de and class 03)",
        ctx,
        "no-nvidia-gpu",
    )


def finding(key: str, check: str, message: str, ctx: NodeContext | None = None) -> Finding:
    """A failed finding for table row ``key`` when the evidence, not a symptom text, points at it."""
    return _finding(check, False, message, ctx or NodeContext(), key)


def failed(findings: Iterable[Finding]) -> list[Finding]:
    return [f for f in findings if not f.ok]


# --------------------------------------------------------------------------------------------------------------
# All evidence of one node at once (runbook diagnose)


@dataclass(frozen=True)
class Evidence:
    """What was collected from one node; ``None`` means "not collected", which is not "empty"."""

    modules: Mapping[str, str] | None = None
    driver: DriverInfo | None = None
    extensions: Mapping[str, str] | None = None
    """Name → version, without the ``schematic`` pseudo-extension."""
    schematic: str | None = None
    smi: NvidiaSmi | None = None
    services: Mapping[str, ServiceStatus] | None = None
    log: str | None = None
    """Free text (``talosctl dmesg``, pod logs and events) matched against the failure table."""


def diagnose(
    evidence: Evidence, ctx: NodeContext | None = None, *, planned_schematic: str | None = None
) -> list[Finding]:
    """Run every check the evidence allows, in the order a user would fix things.

    The node's own schematic fills the upgrade commands that keep its extensions (re-installing it for the
    right Talos version fixes a mismatched kernel-module tag); fixes that need other extensions get the
    planned schematic or a placeholder, never the node's current (wrong) one.
    """
    ctx = ctx or NodeContext()
    ctx = replace(
        ctx,
        schematic=ctx.schematic or planned_schematic,
        current_schematic=ctx.current_schematic or evidence.schematic,
    )
    findings: list[Finding] = []
    if evidence.extensions is not None:
        findings.extend(check_extensions(evidence.extensions, ctx))
        if planned_schematic is not None:
            findings.append(check_schematic(evidence.schematic, planned_schematic, ctx))
    if evidence.modules is not None:
        findings.append(check_modules(evidence.modules, evidence.extensions, ctx, kernel_log=evidence.log))
    if evidence.driver is not None:
        findings.extend(check_driver(evidence.driver, evidence.extensions, ctx))
    if evidence.smi is not None:
        findings.extend(
            check_nvidia_smi(evidence.smi, driver=evidence.driver, extensions=evidence.extensions, ctx=ctx)
        )
    if evidence.services is not None:
        stack = classify_extensions(evidence.extensions or {})
        fabricmanager = any(ext.kind == "fabricmanager" for ext in stack.others)
        findings.extend(check_services(evidence.services, ctx, fabricmanager=fabricmanager))
    if evidence.log is not None:
        findings.extend(diagnose_text(evidence.log, ctx, check="log"))
    return _one_way_in(findings)


def _one_way_in(findings: list[Finding]) -> list[Finding]:
    """On a node without the NVIDIA extensions, the other checks whose fix is a ``talosctl upgrade`` (its
    schematic, its services) say to apply the modules patch of that check's fix first.

    Why: printed side by side, the bare upgrade read as a shorter way to the same end, and on a node whose
    config does not list the modules it hangs the boot (siderolabs/extensions#888); the extensions' fix applies
    the modules patch first (found by a review of 2adbfe0)."""
    missing = next((f for f in findings if not f.ok and f.failure in _NOT_INSTALLED_KEYS), None)
    if missing is None:
        return findings
    first = f"first the modules patch (the {missing.check} check's fix: the NVIDIA extensions are missing), then: "
    return [
        replace(f, fix=first + f.fix)
        if not f.ok and f.failure not in _NOT_INSTALLED_KEYS and "upgrade --image" in f.fix
        else f
        for f in findings
    ]
