"""The parameter schema: one YAML file per cluster under ``params/``.

Why pydantic: the Kubernetes client already brings it, it reports *every* error of a file in one pass with
its key path, and each field's docstring becomes its description, from which the README's parameter table
is generated (so the docs cannot drift from the schema).  Unknown keys are errors with a "did you mean",
because a misspelt ``aply: true`` silently ignored is how clusters get changed by surprise.

Validation is pure and happens before anything touches a cluster; combinations that cannot work (a track
on Talos < 1.8, the GPU Operator before 1.13, ...) are checked here via the GPU profiles.
"""

from __future__ import annotations

import copy
import difflib
import ipaddress
import os
import re
import types
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator

from runbook_lib.errors import CompatibilityError, ParameterProblem, ParametersInvalid, PermanentError

from . import safeload
from .boot_assets import is_factory_url
from .profiles import GPU_OPERATOR_CHART_MINIMUM, Flavor, GpuProfile, Track, profile_for
from .redact import redact
from .rollout import parse_budget
from .versions import TalosVersion, gpu_operator_too_old

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_HOSTNAME = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?)*$"
)
#: libyaml's emitter where PyYAML has it, ~4× faster than PyYAML's own (a 1,000-node record's ``params.yaml`` in
#: 0.05 s, not 0.18 s).  The same data, not always the same text: it folds some long lines elsewhere (review)
_SAFE_DUMPER: type[yaml.SafeDumper] = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
MAX_FILE_BYTES = 1024 * 1024
"""Largest parameter file read: a 1,000-node file is about 60 KB, so 1 MiB is a typo or an attack."""
DAY_SECONDS = 86_400
"""Upper bound of every timeout: longer is a typo (or an overflow waiting to happen), not a wish."""
#: The simulator's scenarios (``runbook_lib/sim/scenarios.py``), copied because the library may not import
#: the simulator; a test keeps the two equal.
SIM_SCENARIOS = (
    "fresh",
    "gpu-ready",
    "config-patched",
    "extensions-no-patch",
    "driver-mismatch",
    "toolkit-missing",
    "unsupported-gpu",
    "unreachable-node",
    "upgrade-fails",
    "upgrade-hangs",
    "slow-node",
    "mixed-fleet",
    "aws",
    "storage-extensions",
    "kernel-args-before-1-12",
    "operator-not-leader",
    "gpu-unhealthy",
    "chaos",
)
_SECRET_HINT = "give a path to the file, never its contents"
#: Values never echoed back in an error: a pasted kubeconfig must not land in a log or a record.
_SECRET_FIELDS = frozenset({"talosconfig", "kubeconfig"})


def _check_namespace(value: str) -> str:
    """A Kubernetes namespace the runbook may label ``enforce=privileged``: never ``default``.

    The device-plugin chart refuses ``default`` unless ``allowDefaultNamespace=true``
    (NVIDIA/k8s-device-plugin ``deployments/helm/nvidia-device-plugin/templates/validation.yml``, from
    chart 0.13.0), and the runbook would first have relabelled ``default`` privileged (reality-gaps §21).
    """
    if not _DNS_LABEL.match(value):
        raise ValueError("must be a DNS label: lowercase letters, digits and '-', at most 63 characters")
    if value == "default":
        raise ValueError(
            "'default' is refused: the runbook labels the namespace pod-security enforce=privileged, and the "
            "device-plugin chart refuses 'default'; use a namespace of its own, e.g. nvidia or gpu-operator"
        )
    return value


Namespace = Annotated[str, AfterValidator(_check_namespace)]
#: helm's own rule for a release name (helm@v4.1.4 pkg/chart/v2/util/validate_name.go:35,60: this pattern, at
#: most 53 characters, because helm appends suffixes to it in names limited to 63).
_RELEASE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def _check_release_name(value: str) -> str:
    """A Helm release name helm accepts, checked here so a typo fails before anything changes."""
    if len(value) > 53 or not _RELEASE_NAME.match(value):
        raise ValueError(
            "must be a Helm release name: lowercase letters, digits, '-' and '.', starting and ending with a "
            "letter or digit, at most 53 characters (as `helm list -A` shows it)"
        )
    return value


ReleaseName = Annotated[str, AfterValidator(_check_release_name)]


def _check_extension_name(value: str) -> str:
    """An extension named with its publisher, as the Image Factory lists them; checked with the parameters, so a
    bare ``nvidia-fabricmanager-lts`` fails before a simulated cluster is started or any step runs (it failed at
    the plan, after ``runbook run`` had started the simulator: walkthrough, stop 52)."""
    if "/" not in value or value.startswith("/") or value.endswith("/"):
        raise ValueError(
            f"must name its publisher, as the Image Factory lists it: siderolabs/{value.strip('/')}"
        )
    return value


ExtensionName = Annotated[str, AfterValidator(_check_extension_name)]
_REPO_URL = re.compile(r"^https?://[^\s/?#@]+(/[^\s?#]*)?$")


def _check_repo_url(value: str) -> str:
    """A Helm chart repository URL (``helm repo add NAME URL``): http(s) only, trailing slash dropped.

    Why http(s): the kubernetes step adds the repository with ``helm repo add``, which reads
    ``<url>/index.yaml``; an ``oci://`` registry is not a repository helm can add, and a bare host name is
    a typo that would surface only as helm's "not a valid chart repository" at apply time.
    """
    if not _REPO_URL.match(value):
        raise ValueError(
            "must be an http(s) URL of a Helm chart repository (the folder holding index.yaml), "
            "e.g. https://nvidia.github.io/k8s-device-plugin or a mirror such as https://charts.example.com/nvidia"
        )
    return value.rstrip("/")


RepoUrl = Annotated[str, AfterValidator(_check_repo_url)]
Seconds = Annotated[int, Field(strict=True, le=DAY_SECONDS)]


class _Strict(BaseModel):
    model_config = ConfigDict(
        extra="forbid", use_attribute_docstrings=True, frozen=True, validate_default=True
    )


class NodeOverrides(_Strict):
    """Per-node exceptions to the cluster-wide choices (e.g. one DGX node on the proprietary driver)."""

    driver_flavor: Flavor | None = None
    """Kernel-module flavour for this node only."""
    track: Track | None = None
    """Driver track for this node only."""
    extra_extensions: tuple[ExtensionName, ...] = ()
    """Official extensions this node needs in addition to the cluster-wide ones."""
    extra_kernel_args: tuple[str, ...] = ()
    """Kernel arguments for this node's image (e.g. ``arm64.nobti`` on Grace Blackwell GB10)."""


class Node(_Strict):
    """A GPU node the runbook acts on."""

    name: str
    """Kubernetes node name (DNS label)."""
    address: str
    """Address talosctl reaches the node at (``-n``), usually its IP."""
    overrides: NodeOverrides = NodeOverrides()
    """Optional per-node exceptions (driver_flavor, track, extra_extensions, extra_kernel_args)."""

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _DNS_LABEL.match(value):
            raise ValueError("must be a DNS label: lowercase letters, digits and '-', at most 63 characters")
        return value

    @field_validator("address")
    @classmethod
    def _address(cls, value: str) -> str:
        """One IPv4/IPv6 address or DNS hostname: the value goes into talosctl's argv as ``-n VALUE``."""
        try:
            ipaddress.ip_address(value)
        except ValueError:
            pass
        else:
            return value
        if value.startswith("[") and value.endswith("]"):
            raise ValueError(f"write the IPv6 address without brackets, e.g. {value[1:-1]}")
        if _HOSTNAME.match(value) and not value.rsplit(".", 1)[-1].isdigit():
            return value
        raise ValueError(
            "must be one IPv4 or IPv6 address or a DNS hostname (letters, digits, '-' and '.'), "
            "e.g. 10.5.0.11, fd00::11 or gpu-1.example.com"
        )


class DevicePlugin(_Strict):
    """NVIDIA k8s-device-plugin Helm chart (the Kubernetes layer up to Talos 1.12)."""

    chart_version: str | None = None
    """Chart version to pin, or a range helm resolves (`~0.18`, `>=0.17.0`: the step installs the newest chart it allows and refuses one older than installed); default: 0.17.2 up to Talos 1.11, 0.18.0 from 1.12 (the charts Talos CI installs on 1.11 and 1.12; up to 1.10 CI ran its own DaemonSet with k8s-device-plugin v0.14.1, not a chart)."""
    namespace: Namespace = "kube-system"
    """Namespace (not ``default``); Talos enforces Pod Security baseline elsewhere unless the namespace is labelled privileged."""
    release: ReleaseName = "nvidia-device-plugin"
    """Helm release name; set it (and ``namespace``) to an existing release of the chart, e.g. ``nvdp`` in ``nvidia-device-plugin`` as NVIDIA's README installs it, so the runbook upgrades that one instead of refusing."""
    label_nodes: bool = True
    """Label GPU nodes ``nvidia.com/gpu.present=true`` (chart ≥0.15 schedules nowhere without it or NFD)."""
    repo_url: RepoUrl = "https://nvidia.github.io/k8s-device-plugin"
    """Helm chart repository holding ``nvidia-device-plugin``: NVIDIA's, or a mirror for air-gapped sites (for target simulated: the simulator's own)."""


class GpuOperator(_Strict):
    """NVIDIA GPU Operator Helm chart (the Kubernetes layer from Talos 1.13)."""

    chart_version: str = "v26.3.3"
    """Chart version to pin, or a range helm resolves (`>=v26.3.1`: the step installs the newest chart it allows and refuses one older than installed); the Talos docs require v26.3.1 or higher."""
    namespace: Namespace = "gpu-operator"
    """Namespace (not ``default``); it is labelled ``pod-security.kubernetes.io/enforce=privileged``."""
    release: ReleaseName = "gpu-operator"
    """Helm release name; set it (and ``namespace``) to an existing release of the chart, e.g. the ``gpu-operator-<number>`` that NVIDIA's ``helm install --generate-name`` creates, so the runbook upgrades that one instead of refusing."""
    repo_url: RepoUrl = "https://helm.ngc.nvidia.com/nvidia"
    """Helm chart repository holding ``gpu-operator``: NVIDIA's, or a mirror for air-gapped sites (for target simulated: the simulator's own)."""

    @field_validator("chart_version")
    @classmethod
    def _supported(cls, value: str) -> str:
        why = gpu_operator_too_old(value, GPU_OPERATOR_CHART_MINIMUM)
        if why:
            raise ValueError(why)
        return value


class CudaTest(_Strict):
    """The final proof: pods that run CUDA tools on each GPU node."""

    smi_image: str | None = None
    """Image running ``nvidia-smi``; default: ``nvcr.io/nvidia/cuda:12.1.0-base-ubuntu22.04`` up to Talos 1.7, ``cuda:12.5.0-base-ubuntu22.04`` from 1.8 (the images of the 1.6–1.10 docs' test; the 1.11–1.12 OSS docs run ``nvidia-smi`` in the vectoradd sample, the 1.13+ docs leave the test to the GPU Operator)."""
    vectoradd_image: str | None = "auto"
    """CUDA vectoradd sample image; ``auto``: the sample Talos CI runs for the release (CUDA 11.7 up to 1.10, 12.5 from 1.11), ``null`` skips the test."""
    request_gpu: bool = True
    """Also run ``nvidia-smi`` and the vectoradd sample in pods requesting ``nvidia.com/gpu: 1`` (the docs' test alone passes with a broken device plugin); the runtime-class-only pods run either way."""
    timeout_seconds: Seconds = Field(default=300, ge=10)
    """How long a test pod may take to finish."""


class Tools(_Strict):
    """Where the command-line tools are; bare names are looked up on PATH."""

    talosctl: str = "talosctl"
    """Path or name of the talosctl binary (for target simulated: the simulator's)."""
    helm: str = "helm"
    """Path or name of the helm binary (for target simulated: the simulator's)."""
    kubectl: str = "kubectl"
    """Path or name of the kubectl binary: it drains a node before a patch that reboots it (for target simulated: the simulator's)."""


class Timeouts(_Strict):
    """How long the runbook waits for the cluster before it calls a node or a rollout failed."""

    upgrade_seconds: Seconds = Field(default=1800, ge=10)
    """A `talosctl upgrade --wait --timeout=<this>s` (talosctl's own default is 30 minutes): one process for a
    node, or for the nodes of a batch upgraded together (then it spans them all); the plan prints each node's
    command with it."""
    node_ready_seconds: Seconds = Field(default=300, ge=5)
    """A node answering again, on the planned schematic, after its upgrade."""
    kubernetes_seconds: Seconds = Field(default=300, ge=5)
    """The Helm release becoming ready and every GPU node advertising `nvidia.com/gpu`; also each `helm uninstall
    --wait --timeout <this>s` of the device plugin (the Talos 1.13 hand-over, rollback), printed so in plans."""
    drain_seconds: Seconds = Field(default=300, ge=5)
    """One node's `kubectl drain` before a patch that reboots it (talosctl's own drain timeout is 5 minutes)."""


class Rollout(_Strict):
    """How the image and config-patch steps roll out over the GPU nodes (``runbook_lib/model/rollout.py``)."""

    canary: int | None = Field(default=None, ge=1, le=1000, strict=True)
    """Size of the first batch; later batches double up to `rollout_concurrency` (canary 1, concurrency 8: 1, 2, 4, 8, 8…). `null`: every batch is `rollout_concurrency` nodes."""
    max_failures: int | str = 0
    """Failure budget: a count of nodes, or a percentage of the nodes the run changes (`"5%"`, rounded down). The batch in flight finishes; no new batch starts once more nodes failed. `0`: stop after the first failure."""
    pause_seconds: float = Field(default=0.0, ge=0, le=DAY_SECONDS, strict=True, allow_inf_nan=False)
    """Pause between two batches, e.g. to watch the canary's workloads (at most a day)."""

    @field_validator("max_failures", mode="before")
    @classmethod
    def _budget(cls, value: Any) -> Any:
        if isinstance(value, bool | int | str):
            parse_budget(value)
        return value


class Rollback(_Strict):
    """What the rollback step undoes (``runbook rollback``, notebook 07; ``runbook_lib/model/rollback.py``)."""

    records: tuple[str, ...] = ()
    """Change records whose changes to the GPU nodes are undone (names as `runbook records list` shows them, or paths); `runbook rollback --from RECORD` sets it. Empty: the rollback step refuses to run."""


class Simulation(_Strict):
    """Only for ``target: simulated``: how the built-in simulated cluster behaves."""

    scenario: str = "fresh"
    """Starting state of the simulated cluster: `fresh` (GPU nodes on stock Talos), `gpu-ready`, or a fault scenario (`runbook sim scenarios`)."""
    latency_ms: float = Field(default=0.0, ge=0, le=60_000, strict=True, allow_inf_nan=False)
    """Simulated latency per talosctl call per node, in milliseconds (at most a minute)."""

    @field_validator("scenario")
    @classmethod
    def _scenario(cls, value: str) -> str:
        if value not in SIM_SCENARIOS:
            close = difflib.get_close_matches(value, SIM_SCENARIOS, n=1)
            suggestion = f"did you mean {close[0]!r}? " if close else ""
            raise ValueError(f"unknown scenario; {suggestion}valid: {', '.join(SIM_SCENARIOS)}")
        return value


class Params(_Strict):
    """Everything the runbook needs to know about one cluster."""

    cluster: str
    """Cluster name, used in records and resource names (DNS label)."""
    target: Literal["simulated", "cluster"] = "simulated"
    """``simulated`` runs against the built-in simulated cluster; ``cluster`` against a real one."""
    talos_version: str
    """Exact Talos release of the GPU nodes, e.g. ``v1.12.7`` (supported: v1.3–v1.14)."""
    nodes: tuple[Node, ...] = Field(min_length=1)
    """GPU nodes: ``name`` and ``address`` each, optional ``overrides``."""
    driver_flavor: Flavor = "oss"
    """``oss`` (open kernel modules) or ``proprietary`` (nonfree modules)."""
    track: Track | None = None
    """Driver track ``lts`` or ``production`` (Talos ≥1.8; default lts); must be unset before 1.8."""
    kubernetes_layer: Literal["auto", "device-plugin", "gpu-operator"] = "auto"
    """``auto``: device plugin + RuntimeClass up to Talos 1.12, GPU Operator from 1.13."""
    device_plugin: DevicePlugin = DevicePlugin()
    """Device-plugin chart settings (chart_version, namespace, label_nodes, repo_url)."""
    gpu_operator: GpuOperator = GpuOperator()
    """GPU Operator chart settings (chart_version, namespace, repo_url)."""
    cuda_test: CudaTest = CudaTest()
    """CUDA test pods (smi_image, vectoradd_image, request_gpu, timeout_seconds)."""
    default_runtime_patch: bool = False
    """Also make ``nvidia`` the default containerd runtime on GPU nodes (reboots the node up to Talos 1.13)."""
    extra_extensions: tuple[ExtensionName, ...] = ()
    """Other official extensions the GPU nodes' image must keep (e.g. ``siderolabs/iscsi-tools``)."""
    extra_kernel_args: tuple[str, ...] = ()
    """Extra kernel arguments for the GPU nodes' image."""
    secureboot: bool = False
    """Use SecureBoot installer and boot assets."""
    apply: bool = False
    """Change the cluster: ``true`` or ``false`` (default: plans and dry-runs only), as YAML reads them (``yes``
    and ``on`` too); ``1``, ``y`` or ``t`` are refused: an approval is written out."""
    rollout_concurrency: int = Field(default=1, ge=1, le=1000, strict=True)
    """How many nodes change at once (the largest batch); `rollout` sets the canary, failure budget and pause."""
    rollout: Rollout = Rollout()
    """Rollout controls for the image and config-patch steps (canary, max_failures, pause_seconds)."""
    rollback: Rollback = Rollback()
    """The change records the rollback step undoes (records)."""
    talosconfig: str | None = None
    """Path to the talosconfig (never its contents); default: talosctl's own default / the simulator's."""
    kubeconfig: str | None = None
    """Path to the kubeconfig (never its contents); default: ``$KUBECONFIG`` / the simulator's. On
    ``target: simulated`` a path given here is used instead of the simulator's when it points at the simulated
    API server (e.g. a read-only service account's); one that points elsewhere is refused."""
    tools: Tools = Tools()
    """Paths of ``talosctl`` and ``helm``."""
    timeouts: Timeouts = Timeouts()
    """Waits (upgrade_seconds, node_ready_seconds, kubernetes_seconds) before a node or rollout counts as failed."""
    image_factory_url: str = "https://factory.talos.dev"
    """Image Factory base URL; a self-hosted factory for air-gapped sites."""
    simulation: Simulation = Simulation()
    """Simulator settings (scenario, latency_ms); only meaningful for ``target: simulated``."""

    @field_validator("cluster")
    @classmethod
    def _cluster(cls, value: str) -> str:
        if not _DNS_LABEL.match(value):
            raise ValueError("must be a DNS label: lowercase letters, digits and '-', at most 63 characters")
        return value

    @field_validator("talos_version", mode="before")
    @classmethod
    def _talos_version_text(cls, value: Any) -> Any:
        if isinstance(value, int | float):
            raise ValueError(
                f'write the version as text with its patch release, e.g. "v{value}.0" (YAML reads 1.10 as 1.1)'
            )
        return value

    @field_validator("talos_version")
    @classmethod
    def _talos_version(cls, value: str) -> str:
        try:
            version = TalosVersion.parse(value)
        except PermanentError as exc:
            raise ValueError(f"{exc.message}; {exc.hint}") from None
        if not version.is_release:
            raise ValueError(
                f"needs the exact release, e.g. {version}.0: installers and extension tags are per release"
            )
        return str(version)

    @field_validator("image_factory_url")
    @classmethod
    def _factory(cls, value: str) -> str:
        if not is_factory_url(value):
            raise ValueError("must be an http(s) URL such as https://factory.talos.dev")
        if redact(value) != value or "@" in value.split("/")[2]:
            # the URL is recorded in params.yaml and printed in fixes: a credential in it would travel with them
            raise ValueError(
                "must not carry credentials (user:password@ or a token in the query): the URL is recorded and "
                "printed; give the factory's own URL, e.g. https://factory.talos.dev"
            )
        return value.rstrip("/")

    @field_validator("apply", mode="before")
    @classmethod
    def _approval(cls, value: Any) -> bool:
        return approval(value)

    @field_validator("talosconfig", "kubeconfig")
    @classmethod
    def _path_not_contents(cls, value: str | None) -> str | None:
        if value is not None and ("\n" in value or value.lstrip().startswith(("apiVersion", "context", "{"))):
            raise ValueError(f"looks like file contents; {_SECRET_HINT}")
        return value

    # -- derived views ---------------------------------------------------------------------------------
    def with_chart_repo(self, url: str) -> Params:
        """These parameters with both chart repositories at ``url`` (a simulated cluster serving both charts),
        except a ``repo_url`` the parameters set: that one is kept, as on a real cluster (an air-gapped
        site's mirror; the simulator serves one too, ``charts_mirror``), and helm is pointed where it says.
        NVIDIA's own repository (the default) counts as not set even when written out: ``runbook run`` hands its
        kernels the validated parameters with every default in them (the record's ``params.yaml``)."""
        url = _check_repo_url(url)
        sections: dict[str, DevicePlugin | GpuOperator] = {
            "device_plugin": self.device_plugin,
            "gpu_operator": self.gpu_operator,
        }
        return self.model_copy(
            update={
                name: section.model_copy(update={"repo_url": url})
                for name, section in sections.items()
                if section.repo_url == type(section).model_fields["repo_url"].default
            }
        )

    @property
    def talos(self) -> TalosVersion:
        return TalosVersion.parse(self.talos_version)

    def profile(self, node: Node | None = None) -> GpuProfile:
        """The GPU profile for the cluster, or for one node with its overrides applied."""
        flavor = (node.overrides.driver_flavor if node else None) or self.driver_flavor
        track = (node.overrides.track if node else None) or self.track
        return profile_for(self.talos, flavor, track)

    @property
    def resolved_kubernetes_layer(self) -> Literal["device-plugin", "gpu-operator"]:
        if self.kubernetes_layer == "auto":
            return self.profile().kubernetes_layer_auto
        return self.kubernetes_layer

    def public_dict(self) -> dict[str, Any]:
        """The validated values as plain data, safe to record: secrets are only ever paths here."""
        return self.model_dump(mode="json")


def approval(value: Any) -> bool:
    """``apply``'s value: a boolean, or the text ``true``/``false`` in any case (papermill's ``-p apply true``
    passes text). Why not pydantic's own reading: it takes ``1``, ``"y"`` and ``"t"`` as true, and
    ``runbook run --from`` said "plan only" of a ``--set apply=1`` that then applied (review of 70aa799)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise ValueError("must be true or false")


#: The first line of a record's ``params.yaml``: a run's, and a JupyterLab approval's.
RUN_HEADING = "# The validated parameters of this run (paths only, never file contents).\n"
APPROVAL_HEADING = "# The validated parameters of this approval (paths only, never file contents).\n"
RECORD_HEADINGS = (RUN_HEADING, APPROVAL_HEADING)


def record_yaml(params: Params, heading: str, *, source: str) -> str:
    """``params`` as a record's ``params.yaml``: ``heading`` (a YAML comment line) and every validated value.

    Refused when larger than :data:`MAX_FILE_BYTES`, the limit of a parameter file.  Why here, in the same
    rule as the input: a run's steps read their parameters back from this file, and a 20,000-node file that
    ``params check`` accepted was refused inside preflight, after the record had started (attack re-run N7):
    written out with every default, a node takes about 145 bytes, twice a hand-written file's line.
    """
    data = params.public_dict()
    text = heading + _dump_yaml(data)
    size = len(text.encode("utf-8"))
    if size <= MAX_FILE_BYTES:
        return text
    limit = f"{MAX_FILE_BYTES // 1024:,} KiB"  # KiB: "1.0 MiB, at most 1 MiB" read as no excess (review)
    what = f"as a record's params.yaml, which the run's steps read back as a parameter file (at most {limit})"
    node_bytes = len(_dump_yaml(data["nodes"]).encode("utf-8"))
    room = (MAX_FILE_BYTES - (size - node_bytes)) * len(params.nodes) // max(1, node_bytes)
    if room < 1:  # the rest of the parameters alone are too big: no split helps
        problem = f"the parameters are {-(-size // 1024):,} KiB {what}: shorten the longest values"
        raise ParametersInvalid([ParameterProblem(source, "(file)", problem)])
    problem = (
        f"{len(params.nodes)} nodes are {-(-size // 1024):,} KiB {what}: split the fleet into runs of "
        f"at most about {room} nodes"
    )
    raise ParametersInvalid([ParameterProblem(source, "nodes", problem)])


def _dump_yaml(data: Any) -> str:
    """YAML as a record writes it: keys in the schema's order, text as written (no ``\\xE9`` escapes)."""
    return yaml.dump(data, Dumper=_SAFE_DUMPER, sort_keys=False, allow_unicode=True)


# ---------------------------------------------------------------------------------------------------------
# Loading and error reporting


def _model_keys(model: type[BaseModel]) -> list[str]:
    return list(model.model_fields)


def _submodel_at(loc: Sequence[str | int]) -> type[BaseModel] | None:
    """The model class that owns the mapping at ``loc`` (for "did you mean" on unknown keys)."""
    model: type[BaseModel] = Params
    for part in loc:
        if isinstance(part, int):
            continue
        info = model.model_fields.get(part)
        if info is None:
            return None
        annotation = info.annotation
        candidates = [annotation, *getattr(annotation, "__args__", ())]
        nested = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
        if nested is None:
            return None
        model = nested
    return model


def format_loc(loc: Iterable[str | int]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


Loc = tuple[str | int, ...]


class _Sources:
    """Which input each value came from, so every error names it: the file, ``--set KEY=VALUE`` or a
    notebook/CLI parameter.  The last override covering a key path wins, as it does for the value."""

    def __init__(self, default: str) -> None:
        self.default = default
        self.layers: list[tuple[Loc, str]] = []

    def __call__(self, loc: Sequence[str | int]) -> str:
        for parts, label in reversed(self.layers):
            common = min(len(parts), len(loc))
            if tuple(loc[:common]) == parts[:common]:
                return label
        return self.default

    def overridden(self, loc: Sequence[str | int]) -> bool:
        return self(loc) != self.default


def _problem_from_pydantic(source: str, error: Mapping[str, Any]) -> ParameterProblem:
    loc = tuple(error["loc"])
    kind = error["type"]
    if kind == "extra_forbidden":
        owner = _submodel_at(loc[:-1])
        valid = _model_keys(owner) if owner else []
        key = str(loc[-1])
        close = difflib.get_close_matches(key, valid, n=1)
        suggestion = f"did you mean {close[0]!r}? " if close else ""
        return ParameterProblem(
            source, format_loc(loc), f"unknown parameter; {suggestion}valid keys: {', '.join(valid)}"
        )
    if kind == "missing":
        return ParameterProblem(source, format_loc(loc), "required parameter is missing")
    message = error["msg"]
    if kind == "int_type" and isinstance(error.get("input"), bool):
        message = "must be a whole number, not true or false"
    if message.startswith("Value error, "):
        message = message.removeprefix("Value error, ")
    secret_field = bool(loc) and loc[-1] in _SECRET_FIELDS
    if "input" in error and not secret_field and not isinstance(error["input"], dict | list):
        # a URL's password or ?token= is not echoed (walkthrough, stop 54)
        shown = redact(repr(error["input"]))
        message += f" (got {shown[:80]}…)" if len(shown) > 80 else f" (got {shown})"
    return ParameterProblem(source, format_loc(loc), message)


def _compatibility_problems(src: _Sources, params: Params) -> list[ParameterProblem]:
    problems: list[ParameterProblem] = []
    seen: dict[str, int] = {}
    for index, node in enumerate(params.nodes):
        for attr, value in (("name", node.name), ("address", node.address)):
            first = seen.setdefault(f"{attr}:{value}", index)
            if first == index:
                continue
            # the one a --set gave is named: the file's value was right (walkthrough, stop 54)
            at = (
                first
                if src.overridden(("nodes", first, attr)) and not src.overridden(("nodes", index, attr))
                else index
            )
            other = index if at == first else first
            problems.append(
                ParameterProblem(
                    src(("nodes", at, attr)),
                    f"nodes[{at}].{attr}",
                    f"duplicate node {attr} {value!r} (nodes[{other}].{attr} has it too)",
                )
            )
    cluster_ok = True
    try:
        params.profile()
    except CompatibilityError as exc:
        cluster_ok = False
        key = (
            "track"
            if "track" in exc.message
            else ("driver_flavor" if "proprietary" in exc.message else "talos_version")
        )
        problems.append(
            ParameterProblem(src((key,)), key, f"{exc.message} ({exc.hint})" if exc.hint else exc.message)
        )
    # the other checks still run: "every problem at once" reported a track on 1.7 and, only once it was fixed,
    # the GPU Operator on 1.7 (README audit, stop 50); a node's own overrides only with the cluster's right
    for index, node in enumerate(params.nodes if cluster_ok else ()):
        if node.overrides.driver_flavor is None and node.overrides.track is None:
            continue
        try:
            params.profile(node)
        except CompatibilityError as exc:
            loc = ("nodes", index, "overrides")
            problems.append(ParameterProblem(src(loc), format_loc(loc), exc.message))
    canary = params.rollout.canary
    if canary is not None and canary > params.rollout_concurrency:
        problems.append(
            ParameterProblem(
                src(("rollout", "canary")),
                "rollout.canary",
                f"{canary} is more than rollout_concurrency {params.rollout_concurrency}: the canary is the "
                f"first, smallest batch; set it to at most {params.rollout_concurrency} or raise "
                "rollout_concurrency",
            )
        )
    talos = params.talos
    if params.kubernetes_layer == "gpu-operator" and not talos.at_least(1, 13):
        problems.append(
            ParameterProblem(
                src(("kubernetes_layer",)),
                "kubernetes_layer",
                f"the GPU Operator path needs Talos ≥ v1.13 (CDI toolkit); Talos {talos} uses "
                "'device-plugin' (or 'auto')",
            )
        )
    return problems


def _list_index(items: list[Any], part: str, source: str, loc: Loc) -> int:
    """``part`` as an index into ``items`` (``--set nodes.0.address=...``), or an error saying what is valid."""
    if not items:
        raise ParametersInvalid(
            [ParameterProblem(source, format_loc(loc), "is an empty list: nothing to set")]
        )
    valid = f"index 0 to {len(items) - 1}" if len(items) > 1 else "index 0"
    if not part.isdigit():
        message = f"is a list: give a list index ({valid}) before {part!r}, e.g. {format_loc(loc)}.0.{part}"
        raise ParametersInvalid([ParameterProblem(source, format_loc(loc), message.replace("[", ".["))])
    if int(part) >= len(items):
        message = f"has {len(items)} entr{'y' if len(items) == 1 else 'ies'}: {valid}, not {part}"
        raise ParametersInvalid([ParameterProblem(source, format_loc(loc), message)])
    return int(part)


def set_dotted(data: dict[str, Any], dotted: str, value: Any, *, source: str = "--set") -> Loc:
    """Apply one ``--set a.b=value`` override onto raw parameter data; return the key path it set.

    Numbers index lists (``nodes.0.address``).  ``source`` names the override in errors.
    """
    parts = dotted.split(".")
    loc: list[str | int] = []
    target: dict[str, Any] | list[Any] = data
    for position, part in enumerate(parts):
        key: str | int = _list_index(target, part, source, tuple(loc)) if isinstance(target, list) else part
        loc.append(key)
        if position == len(parts) - 1:
            target[key] = value  # type: ignore[index]
            break
        nxt = target[key] if isinstance(target, list) else target.get(str(key))  # type: ignore[index]
        if isinstance(nxt, tuple):
            nxt = list(nxt)
        if not isinstance(nxt, dict | list):
            nxt = {}
        target[key] = nxt  # type: ignore[index]
        target = nxt
    return tuple(loc)


def parse_set(item: str) -> tuple[str, Any]:
    """``KEY=VALUE`` with VALUE read as a YAML scalar (``true``, ``3``, ``v1.8.3``, ``[a, b]``)."""
    if "=" not in item:
        raise ParametersInvalid(
            [ParameterProblem("--set", item, "expected KEY=VALUE, e.g. talos_version=v1.8.3")]
        )
    key, raw = item.split("=", 1)
    try:
        value = safeload.load(raw) if raw else ""
    except yaml.YAMLError:
        value = raw
    if key == "talos_version" or (isinstance(value, float) and raw.count(".") != 1):
        value = raw  # keep versions as text (YAML would read 1.10 as the float 1.1)
    return key.strip(), value


def validate(data: Mapping[str, Any], *, source: str, sources: _Sources | None = None) -> Params:
    """Validate raw parameter data; raise :class:`ParametersInvalid` listing every problem at once.

    ``sources`` says which keys came from overrides rather than ``source`` (see :func:`load_params`).
    """
    src = sources or _Sources(source)
    try:
        params = Params.model_validate(dict(data))
    except ValidationError as exc:
        errors = exc.errors()
        located = {tuple(err["loc"][:1]) for err in errors if len(err["loc"]) > 1}
        # A tuple whose items failed is also reported as too short; that echo would only confuse.
        errors = [e for e in errors if not (e["type"] == "too_short" and tuple(e["loc"]) in located)]
        problems = [_problem_from_pydantic(src(err["loc"]), err) for err in errors]
        # Report impossible combinations in the same pass when the rest of the file allows judging them.
        bad_keys = {err["loc"][0] for err in errors if err["loc"]}
        try:
            rest = Params.model_validate({k: v for k, v in data.items() if k not in bad_keys})
        except ValidationError:
            pass
        else:
            problems += _compatibility_problems(src, rest)
        raise ParametersInvalid(problems) from None
    problems = _compatibility_problems(src, params)
    if problems:
        raise ParametersInvalid(problems)
    return params


def _decode(file: Path, raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        found = (
            "UTF-16 text" if raw.startswith((b"\xff\xfe", b"\xfe\xff")) else f"not UTF-8 (byte {exc.start})"
        )
        raise ParametersInvalid(
            [
                ParameterProblem(
                    str(file), "(file)", f"{found}: a parameter file must be UTF-8; save it as UTF-8"
                )
            ]
        ) from None


def read_params_file(path: str | Path) -> dict[str, Any]:
    """Read a parameter file as raw data, with file-level errors that name the file.

    Bounded (:data:`MAX_FILE_BYTES`), UTF-8 only, and read with :mod:`.safeload`, so a repeated key is an
    error with both lines instead of the last one silently winning.
    """
    file = Path(path)
    try:
        raw = safeload.read_regular_file(str(file), MAX_FILE_BYTES)
    except safeload.NotReadable as exc:
        raise ParametersInvalid([ParameterProblem(str(file), "(file)", str(exc))]) from None
    try:
        data, literal = safeload.load_with_keys(_decode(file, raw))
    except safeload.DuplicateKeys as exc:
        raise ParametersInvalid(
            [
                ParameterProblem(
                    str(file),
                    format_loc(dup.path),
                    f"duplicate key on lines {dup.lines[0]} and {dup.lines[1]}: each key may appear once "
                    "(YAML readers disagree on which one wins); delete one",
                )
                for dup in exc.found
            ]
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "(file)"
        refused = isinstance(exc, safeload.YamlRefused)
        message = f"refused: {getattr(exc, 'problem', exc)}" if refused else f"not valid YAML: {exc}"
        raise ParametersInvalid([ParameterProblem(str(file), where, message)]) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ParametersInvalid(
            [ParameterProblem(str(file), "(top level)", "must be a mapping of parameter: value")]
        )
    if "apply" in data and "apply" not in literal:
        raise ParametersInvalid([ParameterProblem(str(file), "apply", _MERGED_APPROVAL)])
    return data


_MERGED_APPROVAL = (
    "not written as a top-level 'apply:' line (a YAML merge key '<<' or an alias gives it): the approval must be "
    "its own line, 'apply: true' or 'apply: false', where a reviewer reads it (or given with --apply)"
)


def _overridden_file_problems(file_data: dict[str, Any], src: _Sources) -> list[ParameterProblem]:
    """Invalid file values that an override hides: the file stays wrong for the next run without the flag."""
    if not src.layers or not file_data:
        return []
    try:
        Params.model_validate(file_data)
    except ValidationError as exc:
        return [
            _problem_from_pydantic(src.default, err)
            for err in exc.errors()
            if err["type"] != "missing" and src.overridden(err["loc"])
        ]
    return []


def _config_path_problems(params: Params, src: _Sources) -> list[ParameterProblem]:
    """A real cluster's talosconfig/kubeconfig must exist before any tool runs (talosctl only says the
    client "did not answer", after a record was started). On the simulator a named kubeconfig is checked when
    the run connects (steps/context.py), since one made against the simulated API server cannot exist before it."""
    if params.target != "cluster":
        return []
    problems: list[ParameterProblem] = []
    for key in ("talosconfig", "kubeconfig"):
        value = getattr(params, key)
        if value is None:
            continue
        path = Path(os.path.expanduser(value))
        if not path.is_file():
            what = "is not a regular file" if path.exists() else "no such file"
            problems.append(
                ParameterProblem(
                    src((key,)),
                    key,
                    f"{what}: {value} (give the path of the {key}, or leave it unset for the default)",
                )
            )
    return problems


def load_params(
    path: str | Path | None = None,
    overrides: Iterable[str] = (),
    values: Mapping[str, Any] | None = None,
    *,
    base: Mapping[str, Any] | None = None,
) -> Params:
    """Load a parameter file, apply ``--set`` overrides and explicit values, and validate the result.

    ``values`` (e.g. notebook parameters, ``--apply``) win over ``overrides``, which win over the file.
    ``base`` stands in for the file when there is none (an earlier record's parameters, ``run --from``): the
    overrides still win over it, where as ``values`` it silently won over every ``--set`` (attack re-run).
    Dotted keys are accepted in both.  Errors name the file for file values, ``--set KEY=VALUE`` and
    ``parameters`` for the others; an invalid file value is an error even when an override hides it.
    """
    file_data: dict[str, Any] = (
        read_params_file(path) if path is not None else copy.deepcopy(dict(base or {}))
    )
    data = copy.deepcopy(file_data)
    src = _Sources(str(path) if path is not None else "parameters")
    for item in overrides:
        key, value = parse_set(item)
        said = redact(f"--set {item}")  # an error names the --set, not a password in it
        src.layers.append((set_dotted(data, key, value, source=said), said))
    for key, value in (values or {}).items():
        src.layers.append((set_dotted(data, key, value, source="parameters"), "parameters"))
    hidden = _overridden_file_problems(file_data, src)
    try:
        params = validate(data, source=src.default, sources=src)
    except ParametersInvalid as exc:
        raise ParametersInvalid([*hidden, *exc.problems]) from None
    problems = hidden + _config_path_problems(params, src)
    if problems:
        raise ParametersInvalid(problems)
    # every caller (params check, run, rollback, a JupyterLab notebook) refuses what a record could not hold,
    # with the longest heading a record writes (review of 49e691e: an 80-byte gap passed check, failed run)
    record_yaml(params, max(RECORD_HEADINGS, key=len), source=src.default)
    return params


# ---------------------------------------------------------------------------------------------------------
# Documentation generated from the schema (README's parameter table)


def _type_name(annotation: Any) -> str:
    """A short human type: ``one of a, b``, ``str or null``, ``list[str]``."""
    args = [a for a in getattr(annotation, "__args__", ()) if a is not type(None)]
    nullable = type(None) in getattr(annotation, "__args__", ())
    if getattr(annotation, "__origin__", None) is Literal:
        text = "one of " + ", ".join(f"`{a}`" for a in annotation.__args__)
    elif nullable and len(args) == 1:
        text = _type_name(args[0])
    elif isinstance(annotation, types.UnionType):  # ``int | str``: a bare "|" would split the table cell
        text = " or ".join(_type_name(a) for a in args)
    elif getattr(annotation, "__origin__", None) is tuple:
        text = "list[str]"
    else:
        text = getattr(annotation, "__name__", str(annotation))
    return f"{text} or null" if nullable else text


def parameter_rows() -> list[tuple[str, str, str, str]]:
    """(key, type, default, description) for every parameter, nested sections flattened with dots."""
    rows: list[tuple[str, str, str, str]] = []

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, info in model.model_fields.items():
            key = f"{prefix}{name}"
            nested = (
                info.annotation
                if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel)
                else None
            )
            if nested is not None and key != "nodes":
                walk(nested, key + ".")
                continue
            if info.is_required():
                default = "required"
            else:
                default_value = info.default
                default = (
                    "`null`"
                    if default_value is None
                    else f"`{yaml.safe_dump(default_value, default_flow_style=True).strip().removesuffix('...').strip()}`"
                )
                if isinstance(default_value, tuple) and not default_value:
                    default = "`[]`"
            type_text = (
                "list of {name, address, overrides}" if key == "nodes" else _type_name(info.annotation)
            )
            rows.append(
                (key, type_text, default, (info.description or "").replace("\n", " ").replace("``", "`"))
            )

    walk(Params, "")
    return rows


def parameters_markdown() -> str:
    lines = ["| parameter | type | default | meaning |", "|---|---|---|---|"]
    lines += [f"| `{key}` | {typ} | {default} | {desc} |" for key, typ, default, desc in parameter_rows()]
    return "\n".join(lines) + "\n"
