"""Every Talos minor v1.3–v1.14 against the facts file (shared/docs/talos-nvidia.md, sections cited)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from runbook_lib.errors import CompatibilityError, ParametersInvalid
from runbook_lib.model.params import parameter_rows, validate
from runbook_lib.model.plan import build_plan
from runbook_lib.model.profiles import DRIVER_TABLE, profile_for, render_documents

SHARED = Path(__file__).resolve().parents[2] / "shared" / "reference" / "talos"

# §1.1 extension names; §1.3 sysctl/module documents; §1.4 CRI plugin; §1.5 layer and module check;
# §2.1 installer path.  One row per minor: (kmod oss, toolkit, sysctl?, module doc kind, cri plugin, layer,
# installer kind, module check)
FACTS = {
    3: (
        "nvidia-open-gpu-kernel-modules",
        "nvidia-container-toolkit",
        True,
        "machine",
        "io.containerd.grpc.v1.cri",
        "device-plugin",
        "ghcr-installer",
        "read /proc/modules",
    ),
    4: (
        "nvidia-open-gpu-kernel-modules",
        "nvidia-container-toolkit",
        True,
        "machine",
        "io.containerd.grpc.v1.cri",
        "device-plugin",
        "ghcr-installer",
        "read /proc/modules",
    ),
    5: (
        "nvidia-open-gpu-kernel-modules",
        "nvidia-container-toolkit",
        True,
        "machine",
        "io.containerd.grpc.v1.cri",
        "device-plugin",
        "installer",
        "read /proc/modules",
    ),
    6: (
        "nvidia-open-gpu-kernel-modules",
        "nvidia-container-toolkit",
        True,
        "machine",
        "io.containerd.grpc.v1.cri",
        "device-plugin",
        "installer",
        "read /proc/modules",
    ),
    7: (
        "nvidia-open-gpu-kernel-modules",
        "nvidia-container-toolkit",
        True,
        "machine",
        "io.containerd.grpc.v1.cri",
        "device-plugin",
        "installer",
        "read /proc/modules",
    ),
    8: (
        "nvidia-open-gpu-kernel-modules-lts",
        "nvidia-container-toolkit-lts",
        True,
        "machine",
        "io.containerd.cri.v1.runtime",
        "device-plugin",
        "installer",
        "read /proc/modules",
    ),
    9: (
        "nvidia-open-gpu-kernel-modules-lts",
        "nvidia-container-toolkit-lts",
        True,
        "machine",
        "io.containerd.cri.v1.runtime",
        "device-plugin",
        "installer",
        "read /proc/modules",
    ),
    10: (
        "nvidia-open-gpu-kernel-modules-lts",
        "nvidia-container-toolkit-lts",
        True,
        "machine",
        "io.containerd.cri.v1.runtime",
        "device-plugin",
        "metal-installer",
        "read /proc/modules",
    ),
    11: (
        "nvidia-open-gpu-kernel-modules-lts",
        "nvidia-container-toolkit-lts",
        True,
        "machine",
        "io.containerd.cri.v1.runtime",
        "device-plugin",
        "metal-installer",
        "get modules",
    ),
    12: (
        "nvidia-open-gpu-kernel-modules-lts",
        "nvidia-container-toolkit-lts",
        True,
        "machine",
        "io.containerd.cri.v1.runtime",
        "device-plugin",
        "metal-installer",
        "get modules",
    ),
    13: (
        "nvidia-open-gpu-kernel-modules-lts",
        "nvidia-container-toolkit-lts",
        False,
        "machine",
        "io.containerd.cri.v1.runtime",
        "gpu-operator",
        "metal-installer",
        "get modules",
    ),
    14: (
        "nvidia-open-gpu-kernel-modules-lts",
        "nvidia-container-toolkit-lts",
        False,
        "KernelModuleConfig",
        "io.containerd.cri.v1.runtime",
        "gpu-operator",
        "metal-installer",
        "get modules",
    ),
}
MODULES = ["nvidia", "nvidia_uvm", "nvidia_drm", "nvidia_modeset"]


@pytest.mark.parametrize("minor", sorted(FACTS))
def test_profile_matches_facts_for_every_minor(minor):
    kmod, toolkit, sysctl, module_doc, cri, layer, installer, module_check = FACTS[minor]
    profile = profile_for(f"v1.{minor}.2")
    assert profile.extensions == [f"siderolabs/{kmod}", f"siderolabs/{toolkit}"]
    docs = profile.machine_config_patch_documents()
    if module_doc == "KernelModuleConfig":
        assert docs == [{"apiVersion": "v1alpha1", "kind": "KernelModuleConfig", "name": m} for m in MODULES]
    else:
        (doc,) = docs
        assert doc["machine"]["kernel"]["modules"] == [{"name": m} for m in MODULES]
        assert ("sysctls" in doc["machine"]) == sysctl
        if sysctl:
            assert doc["machine"]["sysctls"] == {"net.core.bpf_jit_harden": "1"}
    assert profile.cri_plugin == cri
    runtime_text = render_documents(profile.default_runtime_documents())
    assert (
        f'[plugins."{cri}".containerd]' in runtime_text and 'default_runtime_name = "nvidia"' in runtime_text
    )
    assert profile.kubernetes_layer_auto == layer
    assert profile.installer_kind == installer
    assert profile.module_check == module_check
    assert ("ext-nvidia-cdi-gen" in profile.services) == (minor >= 13)
    # the toolkit ships persistenced from siderolabs/extensions v1.3.0 (nvidia-gpu/nvidia-container-toolkit/
    # nvidia-persistenced.yaml), not only with the 1.8 track split
    assert "ext-nvidia-persistenced" in profile.services


def test_production_track_and_proprietary_flavor_names():
    assert profile_for("v1.12.7", "oss", "production").extensions == [
        "siderolabs/nvidia-open-gpu-kernel-modules-production",
        "siderolabs/nvidia-container-toolkit-production",
    ]
    assert profile_for("v1.12.7", "proprietary", "lts").extensions[0] == "siderolabs/nonfree-kmod-nvidia-lts"
    assert profile_for("v1.7.4", "proprietary").extensions[0] == "siderolabs/nonfree-kmod-nvidia"


def test_default_runtime_patch_forms_and_reboot_need():
    old = profile_for("v1.12.7")
    (doc,) = old.default_runtime_documents()
    (file,) = doc["machine"]["files"]
    assert file["path"] == "/etc/cri/conf.d/20-customization.part" and file["op"] == "create"
    assert old.default_runtime_needs_reboot
    new = profile_for("v1.14.0")
    (doc14,) = new.default_runtime_documents()
    assert doc14["kind"] == "CRICustomizationConfig" and "io.containerd.cri.v1.runtime" in doc14["content"]
    assert not new.default_runtime_needs_reboot


def test_talos_13_and_older_patch_text_is_the_docs_patch():
    text = render_documents(profile_for("v1.12.0").machine_config_patch_documents())
    assert yaml.safe_load(text) == {
        "machine": {
            "kernel": {"modules": [{"name": m} for m in MODULES]},
            "sysctls": {"net.core.bpf_jit_harden": "1"},
        }
    }


def test_pre_factory_releases_install_extensions_through_machine_config():
    profile = profile_for("v1.3.7")
    assert profile.extension_delivery == "install-extensions"
    images = profile.install_extension_images()
    assert images == [
        "ghcr.io/siderolabs/nvidia-open-gpu-kernel-modules:515.65.01-v1.3.7",
        "ghcr.io/siderolabs/nvidia-container-toolkit:515.65.01-v1.11.0",
    ]
    (doc,) = profile.machine_config_patch_documents(install_images=images)
    assert doc["machine"]["install"]["extensions"] == [{"image": i} for i in images]


@pytest.mark.parametrize(
    ("version", "flavor", "track", "needle"),
    [
        ("v1.7.4", "oss", "lts", "tracks start with Talos 1.8"),
        ("v1.3.7", "proprietary", None, "extensions v1.5.0"),
        ("v1.4.8", "proprietary", None, "extensions v1.5.0"),
        ("v1.2.9", "oss", None, "outside the supported range"),
        ("v1.15.0", "oss", None, "outside the supported range"),
    ],
)
def test_impossible_combinations_are_refused_with_what_would_work(version, flavor, track, needle):
    with pytest.raises(CompatibilityError) as err:
        profile_for(version, flavor, track)
    assert needle in str(err.value)


def _merge(base, patch):
    """Talos strategic merge for the keys our patches touch: maps merge, lists append."""
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        elif isinstance(value, list) and isinstance(base.get(key), list):
            base[key] = base[key] + value
        else:
            base[key] = copy.deepcopy(value)
    return base


@pytest.mark.parametrize("minor", [10, 11, 12, 13])
def test_patched_sample_config_validates_against_the_real_talos_schema(minor):
    jsonschema = pytest.importorskip("jsonschema")
    schema_file = SHARED / f"config.schema.v1.{minor}.json"
    sample_file = SHARED / "worker-machineconfig.sample.yaml"
    if not schema_file.exists() or not sample_file.exists():
        pytest.skip(f"{schema_file} not present (../shared is not beside the project)")
    schema = json.loads(schema_file.read_text())
    config = yaml.safe_load(sample_file.read_text())
    validator = jsonschema.Draft202012Validator({**schema, "$ref": "#/$defs/v1alpha1.MachineConfig"})

    def errors_of(cfg):
        return {
            (tuple(e.absolute_path), e.validator, tuple(e.schema_path))
            for e in validator.iter_errors(cfg["machine"])
        }

    # The sample predates some schema changes; the patch must add no error of its own.
    baseline = errors_of(config)
    profile = profile_for(f"v1.{minor}.0")
    for doc in profile.machine_config_patch_documents() + profile.default_runtime_documents():
        _merge(config, yaml.safe_load(render_documents([doc])))
    errors = errors_of(config) - baseline
    assert not errors
    bad = copy.deepcopy(config)
    bad["machine"]["kernel"]["modules"].append({"nam": "typo"})
    assert errors_of(bad) - baseline, "the schema check must be able to fail"
    assert config["machine"]["kernel"]["modules"][-4:] == [{"name": m} for m in MODULES]


# Minimum Linux driver for each CUDA major under minor-version compatibility (NVIDIA, "CUDA Compatibility",
# https://docs.nvidia.com/deploy/cuda-compatibility/minor-version-compatibility.html: CUDA 12.x >= 525.60.13,
# CUDA 11.x >= 450.80.02).
CUDA_MIN_DRIVER = {11: (450, 80, 2), 12: (525, 60, 13)}


def _driver(text):
    return tuple(int(part) for part in text.split("."))


@pytest.mark.parametrize("minor", sorted(FACTS))
def test_default_vectoradd_image_runs_on_the_release_driver(minor):
    """The default vectoradd sample must run on the oldest driver the release ships (its ``.0`` LTS driver).

    Talos 1.3 ships 515.65.01 (extensions@v1.3.0:nvidia-gpu/vars.yaml), too old for any CUDA 12 image.
    Talos CI ran nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda11.7.1 up to v1.10
    (talos@v1.10.0:internal/integration/api/extensions_nvidia.go:106) and vectoradd-cuda12.5.0 from v1.11
    (talos@v1.11.0:internal/integration/api/constants.go:15).
    """
    version = f"v1.{minor}.0"
    nodes = [{"name": "n", "address": "10.0.0.1"}]
    image = build_plan(
        validate({"cluster": "c", "talos_version": version, "nodes": nodes}, source="test")
    ).cuda_vectoradd_image
    assert image is not None and image.startswith("nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda")
    cuda_major = int(image.rsplit("vectoradd-cuda", 1)[1].split(".")[0])
    lts_driver = DRIVER_TABLE[(1, minor)][0]
    assert _driver(lts_driver) >= CUDA_MIN_DRIVER[cuda_major], (version, lts_driver, image)
    ci_image = "vectoradd-cuda11.7.1" if minor <= 10 else "vectoradd-cuda12.5.0"
    assert image.endswith(ci_image)


def test_vectoradd_image_named_by_the_user_or_skipped():
    base = {"cluster": "c", "talos_version": "v1.3.7", "nodes": [{"name": "n", "address": "10.0.0.1"}]}
    mine = validate({**base, "cuda_test": {"vectoradd_image": "registry.local/vectoradd:11"}}, source="t")
    assert build_plan(mine).cuda_vectoradd_image == "registry.local/vectoradd:11"
    skipped = validate({**base, "cuda_test": {"vectoradd_image": None}}, source="t")
    assert build_plan(skipped).cuda_vectoradd_image is None


def test_proprietary_before_talos_1_5_is_refused_naming_the_parameter():
    """No nonfree-kmod-nvidia image is published before extensions v1.5.0 (the v1.4.x tags have no
    nvidia-gpu/nonfree; it appears in v1.5.0, commit ee8df92), and the Talos 1.4 proprietary guide builds a
    custom kernel and installer instead (talos@v1.4.8:website/content/v1.4/talos-guides/configuration/
    nvidia-gpu-proprietary.md), which this runbook does not manage."""
    base = {"cluster": "c", "nodes": [{"name": "n", "address": "10.0.0.1"}], "driver_flavor": "proprietary"}
    with pytest.raises(ParametersInvalid) as err:
        validate({**base, "talos_version": "v1.4.8"}, source="p.yaml")
    (problem,) = err.value.problems
    assert problem.path == "driver_flavor"
    assert "v1.5.0" in problem.message and "oss" in problem.message
    assert validate({**base, "talos_version": "v1.5.0"}, source="p.yaml").profile().kmod_extension == (
        "siderolabs/nonfree-kmod-nvidia"
    )


def test_plan_lists_the_fabric_manager_service_verify_checks_when_the_extension_is_added():
    """The fabric manager extension runs as service ``nvidia-fabricmanager`` (extensions@v1.12.0
    nvidia-gpu/nvidia-fabricmanager/lts/nvidia-fabricmanager.yaml, ``name: nvidia-fabricmanager``), which Talos
    shows as ``ext-nvidia-fabricmanager``; verify checks it on nodes that carry the extension
    (``diagnosis.check_services``), so the plan a person approves must list it too."""
    base = {"cluster": "c", "talos_version": "v1.12.7", "track": "lts"}
    nodes = [
        {"name": "hgx-1", "address": "10.0.0.1"},
        {
            "name": "hgx-2",
            "address": "10.0.0.2",
            "overrides": {"extra_extensions": ["siderolabs/nvidia-fabricmanager-lts"]},
        },
    ]
    plan = build_plan(validate({**base, "nodes": nodes}, source="t"))
    assert "ext-nvidia-fabricmanager" not in plan.services
    assert [n.services for n in plan.nodes] == [
        ["ext-nvidia-persistenced"],
        ["ext-nvidia-persistenced", "ext-nvidia-fabricmanager"],
    ]
    everywhere = {**base, "nodes": nodes[:1], "extra_extensions": ["siderolabs/nvidia-fabricmanager-lts"]}
    assert build_plan(validate(everywhere, source="t")).services == [
        "ext-nvidia-persistenced",
        "ext-nvidia-fabricmanager",
    ]
    before_tracks = {**everywhere, "talos_version": "v1.7.7", "track": None}
    before_tracks["extra_extensions"] = ["siderolabs/nvidia-fabricmanager"]
    assert "ext-nvidia-fabricmanager" in build_plan(validate(before_tracks, source="t")).services


def _description(key: str) -> str:
    return next(desc for k, _typ, _default, desc in parameter_rows() if k == key)


def test_device_plugin_default_is_not_credited_to_talos_ci_before_1_11():
    """Talos CI installs chart v0.17.2 on 1.11 and v0.18.0 on 1.12 (talos@v1.11.0 and @v1.12.0
    internal/integration/api/constants.go:12, NvidiaDevicePluginChartVersion); up to v1.10 it deployed its own
    DaemonSet with image k8s-device-plugin:v0.14.1 (talos@v1.10.0 internal/integration/api/
    extensions_nvidia.go:228), not a chart (reality-gaps.md §1 finding 16). The parameter documentation says
    which chart each release gets and where that choice comes from."""
    text = _description("device_plugin.chart_version")
    assert "the version Talos CI uses for the release" not in text
    for minor in (3, 10, 11, 12):
        assert profile_for(f"v1.{minor}.0").device_plugin_chart_default in text
    assert "v0.14.1" in text


def test_nvidia_smi_image_description_names_each_default_and_where_it_comes_from():
    """The docs' nvidia-smi test image is cuda:12.1.0-base up to the 1.7 docs and cuda:12.5.0-base in the 1.8-1.10
    docs (siderolabs/docs public/talos/v1.7 and v1.8 .../hardware-and-drivers/nvidia-gpu.mdx:148 and :159),
    but the 1.11-1.12 OSS docs run nvidia-smi in the vectoradd sample and the 1.13+ docs leave the test to the
    GPU Operator (reality-gaps.md §1 finding 17): "the image of the Talos docs" is not true for every release."""
    text = _description("cuda_test.smi_image")
    assert "the image of the Talos docs for the release" not in text
    for minor in (3, 7, 8, 14):
        assert profile_for(f"v1.{minor}.0").cuda_smi_image.removeprefix("nvcr.io/nvidia/") in text


def test_plan_says_extra_kernel_args_miss_the_installer_on_1_5_to_1_9_without_secureboot():
    """The Image Factory puts a schematic's kernel arguments into an installer only with secure boot or from
    Talos 1.10 (siderolabs/image-factory@26b95ca internal/profile/profile.go:593-597; talos@v1.10.0
    pkg/machinery/imager/quirks/quirks.go:214, minTalosVersionUnifiedInstaller = 1.10.0): on 1.5-1.9 the
    schematic ID changes but the node's cmdline does not (reality-gaps.md §1 finding 18)."""
    base = {
        "cluster": "c",
        "nodes": [{"name": "n", "address": "10.0.0.1"}],
        "extra_kernel_args": ["iommu=pt"],
    }

    def notes(version: str, **more: object) -> str:
        return "\n".join(build_plan(validate({**base, "talos_version": version, **more}, source="t")).notes)

    assert "never reach the node's kernel command line" in notes("v1.9.6")
    assert "machine.install.extraKernelArgs" in notes("v1.5.0")
    for quiet in (notes("v1.10.0"), notes("v1.9.6", secureboot=True), notes("v1.4.8")):
        assert "never reach the node's kernel command line" not in quiet
    no_args = validate({**base, "extra_kernel_args": [], "talos_version": "v1.9.6"}, source="t")
    assert not any("kernel command line" in n for n in build_plan(no_args).notes)
