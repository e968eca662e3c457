"""The failure table (facts §5) and the checks that turn parsed evidence into findings with fixes."""

from __future__ import annotations

from pathlib import Path

import pytest

from runbook_lib.model import diagnosis as d
from runbook_lib.model import parsers as p
from runbook_lib.model.versions import TalosVersion

DATA = Path(__file__).parent / "data" / "outputs"

LTS = {
    "nvidia-open-gpu-kernel-modules-lts": "580.105.08-v1.12.7",
    "nvidia-container-toolkit-lts": "580.105.08-v1.18.1",
}
ALL_LIVE = dict.fromkeys(p.NVIDIA_MODULES, "Live")


def ctx(version: str | None = "v1.12.7", node: str | None = "10.5.0.3", **kw) -> d.NodeContext:
    return d.NodeContext(node=node, talos=TalosVersion.parse(version) if version else None, **kw)


def read(name: str) -> str:
    return (DATA / name).read_text(encoding="utf-8")


def by_check(findings: list[d.Finding]) -> dict[str, d.Finding]:
    return {f.check: f for f in findings}


# --- the table ------------------------------------------------------------------------------------------------


def test_every_table_row_is_complete():
    keys = [entry.key for entry in d.FAILURES]
    assert len(keys) == len(set(keys))
    for entry in d.FAILURES:
        assert entry.cause and entry.fix and entry.command, entry.key
        assert entry.sources and all(s.startswith("https://") for s in entry.sources), entry.key
        # every command template renders, with or without node facts, and leaves no template field behind
        for context in (d.NodeContext(), ctx()):
            filled = context.fill(entry.command)
            for field in ("{node}", "{talos}", "{schematic}", "{installer}", "{patch_command}"):
                assert field not in filled, (entry.key, field)
        assert "10.5.0.3" in ctx().fill(entry.command) or "{node}" not in entry.command


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("Incompatible strategy detected auto", "plugin-without-nvidia-runtime"),
        (
            "If this is a GPU node, did you configure the NVIDIA Container Toolkit?",
            "plugin-without-nvidia-runtime",
        ),
        ("E0101 Failed to initialize NVML: could not load NVML library.", "nvml-not-found"),
        (
            'failed to create containerd task: failed to get sandbox runtime: no runtime for "nvidia" is configured',
            "no-runtime-handler",
        ),
        ('pods "x" is forbidden: pod rejected: RuntimeClass "nvidia" not found', "runtimeclass-missing"),
        (
            "nvidia-container-cli: mount error: failed to add device rules: unable to generate new device filter "
            "program from existing programs: unable to create new device filters program: load program: invalid "
            "argument: last insn is not an exit or jmp",
            "bpf-jit-harden",
        ),
        (
            "/usr/local/bin/nvidia-container-cli: error while loading shared libraries: libelf.so.1",
            "toolkit-missing-library",
        ),
        ('exec: "nvidia-smi": executable file not found in $PATH: unknown', "nvidia-smi-not-in-pod"),
        (
            "NVRM: The NVIDIA GPU 0000:01:00.0 (PCI ID: 10de:1eb8) is not supported by the NVIDIA 580.95.05 "
            "driver release.",
            "gpu-unsupported",
        ),
        (
            'task startAllServices: waiting for service "ext-nvidia-persistenced" to be "up"',
            "persistenced-never-up",
        ),
        ("Attempting to validate a driver container installation", "gpu-operator-driver-validation"),
        (
            'violates PodSecurity "baseline:latest": hostPath volumes (volumes "device-plugin")',
            "pod-security-baseline",
        ),
        (
            "NVRM: API mismatch: the client has the version 570.211.01, but this kernel module has the version "
            "580.105.08.",
            "driver-library-mismatch",
        ),
        ("Failed to initialize NVML: Driver/library version mismatch", "driver-library-mismatch"),
    ],
)
def test_real_symptoms_match_their_row(text, key):
    assert [entry.key for entry in d.match_failures(text)] == [key]


def test_daemonset_with_zero_desired_is_recognised():
    assert [e.key for e in d.match_failures("desiredNumberScheduled: 0")] == ["device-plugin-no-pods"]


def test_unrelated_text_matches_nothing():
    assert d.match_failures("Test PASSED\nDone\n") == []


def test_diagnose_text_gives_failed_findings_with_the_command():
    (finding,) = d.diagnose_text('RuntimeClass "nvidia" not found', ctx(), check="cuda-pod")
    assert not finding.ok and finding.check == "cuda-pod"
    assert "kind: RuntimeClass" in finding.fix and "handler: nvidia" in finding.fix


def test_finding_dict_has_exactly_four_keys():
    finding = d.check_modules({}, {}, ctx())
    assert set(finding.to_dict()) == {"check", "ok", "message", "fix"}


# --- modules --------------------------------------------------------------------------------------------------


def test_all_modules_live_is_ok():
    assert d.check_modules(ALL_LIVE, LTS, ctx()).ok


def test_missing_modules_with_extensions_means_patch_machine_config():
    finding = d.check_modules({"nvme_tcp": "Live"}, LTS, ctx())
    assert not finding.ok and finding.failure == "modules-not-configured"
    assert "talosctl -n 10.5.0.3 patch mc --patch @gpu-worker-patch.yaml" in finding.fix
    for module in p.NVIDIA_MODULES:
        assert f"- name: {module}" in finding.fix
    assert "bpf_jit_harden: 1" in finding.fix  # Talos 1.12 still needs the sysctl


def test_missing_modules_without_extensions_means_the_modules_patch_then_the_factory_upgrade():
    """The upgrade alone, on a node whose config does not list the modules, boots a kernel-module extension that
    blacklists them: ext-nvidia-persistenced waits for /sys/bus/pci/drivers/nvidia and the node rolls back after
    about an hour (siderolabs/extensions#888, siderolabs/talos#9149). Before, this fix was that upgrade alone."""
    finding = d.check_modules({}, {}, ctx())
    assert finding.failure == "extensions-not-installed"
    upgrade = (
        "talosctl -n 10.5.0.3 upgrade --image factory.talos.dev/metal-installer/<gpu-schematic-id>:v1.12.7"
    )
    patch = "talosctl -n 10.5.0.3 patch mc --patch @gpu-worker-patch.yaml"
    assert patch in finding.fix and upgrade in finding.fix, finding.fix
    assert finding.fix.index(patch) < finding.fix.index(upgrade), "the patch comes first"
    # README audit (stop 50): pasted bare, it changed the default simulator's cluster; runbook run's report puts
    # the run's own parameters and places where the placeholder is
    from runbook_lib.cli.run_report import Invocation

    assert "runbook run -p <parameters> --steps config-patch,image --apply" in finding.fix
    mine = Invocation("site.yaml", ("rollout_concurrency=4",), "/srv/records", "/srv/sim").with_params(
        finding.fix
    )
    run = "runbook run -p site.yaml --set rollout_concurrency=4 --records /srv/records --state /srv/sim"
    assert f"{run} --steps config-patch,image --apply" in mine, mine


def test_a_fix_names_the_sites_own_image_factory():
    finding = d.check_extensions(
        {}, d.NodeContext(node="10.5.0.3", talos=ctx().talos, factory="factory.corp:8443")
    )[0]
    assert "upgrade --image factory.corp:8443/metal-installer/" in finding.fix, finding.fix
    assert "factory.talos.dev" not in finding.fix


def test_the_new_schematic_hint_posts_to_the_sites_factory_url_not_an_https_guess():
    """A site's factory may answer plain http, or under a path: the hint named ``https://<registry host>/
    schematics``, which such a factory does not serve (found in review on 5 Dec 2026)."""
    site = d.NodeContext(
        node="10.5.0.3",
        talos=ctx().talos,
        factory="factory.lab:8080",
        factory_url="http://factory.lab:8080/tf/",
    )
    finding = d.check_extensions({}, site)[0]
    assert "upgrade --image factory.lab:8080/metal-installer/<gpu-schematic-id>:v1.12.7" in finding.fix
    assert "POST it to http://factory.lab:8080/tf/schematics)" in finding.fix, finding.fix
    assert "POST it to https://factory.talos.dev/schematics)" in d.check_extensions({}, ctx())[0].fix
    secret = d.NodeContext(
        talos=ctx().talos, factory="f.lab", factory_url="https://u:p4ss@f.lab:8443/tf/?t=x#y"
    )
    assert secret.schematics_url == "https://f.lab:8443/tf/schematics"  # no credentials in a printed fix


def test_missing_modules_with_unknown_extensions_offers_both_fixes():
    finding = d.check_modules({}, None, ctx())
    assert not finding.ok and finding.failure is None
    assert "patch mc" in finding.fix and "upgrade --image" in finding.fix


def test_missing_modules_because_kmod_was_built_for_another_talos():
    old = {**LTS, "nvidia-open-gpu-kernel-modules-lts": "580.105.08-v1.12.6"}
    finding = d.check_modules({}, old, ctx())
    assert finding.failure == "kmod-built-for-other-talos"


def test_module_stuck_loading_points_at_unsupported_gpu():
    finding = d.check_modules({**ALL_LIVE, "nvidia": "Loading"}, LTS, ctx())
    assert finding.failure == "gpu-unsupported"
    assert "nvidia (Loading)" in finding.message


def test_module_patch_by_talos_version():
    v114 = d.module_patch(TalosVersion.parse("v1.14.0"), "n1")
    assert v114.count("kind: KernelModuleConfig") == 4
    assert "--patch gpu-worker-patch.yaml" in v114 and "@" not in v114
    v113 = d.module_patch(TalosVersion.parse("v1.13.2"), "n1")
    assert "machine:" in v113 and "bpf_jit_harden" not in v113
    v112 = d.module_patch(TalosVersion.parse("v1.12.7"), "n1")
    assert "net.core.bpf_jit_harden: 1" in v112 and "--patch @gpu-worker-patch.yaml" in v112


# --- extensions -----------------------------------------------------------------------------------------------


def test_healthy_lts_stack_passes_every_check():
    findings = d.check_extensions(LTS, ctx())
    assert findings and all(f.ok for f in findings), [f.message for f in findings if not f.ok]
    assert {"extensions", "driver-match", "kmod-talos-version"} <= set(by_check(findings))


def test_lts_kmod_with_production_toolkit_is_a_driver_mismatch():
    exts = p.extension_versions(p.parse_extensions(read("extensions_table_mixed_tracks_1.12.7.txt")))
    finding = by_check(d.check_extensions(exts, ctx()))["driver-match"]
    assert not finding.ok and finding.failure == "driver-library-mismatch"
    assert "580.105.08" in finding.message and "570.211.01" in finding.message
    assert "tracks lts and production are mixed" in finding.message
    assert "upgrade --image factory.talos.dev/metal-installer/" in finding.fix


def test_fabricmanager_driver_is_compared_too():
    exts = {**LTS, "nvidia-fabricmanager-lts": "580.95.05"}
    assert not by_check(d.check_extensions(exts, ctx()))["driver-match"].ok


def test_kmod_built_for_other_talos_release():
    finding = by_check(d.check_extensions(LTS, ctx("v1.12.8")))["kmod-talos-version"]
    assert not finding.ok and finding.failure == "kmod-built-for-other-talos"
    assert "v1.12.7" in finding.message and "v1.12.8" in finding.message
    assert ":v1.12.8" in finding.fix


def test_talos_version_unknown_skips_the_tag_check():
    assert "kmod-talos-version" not in by_check(d.check_extensions(LTS, ctx(None)))


def test_unsuffixed_names_on_talos_1_8_and_later():
    old = {
        "nvidia-open-gpu-kernel-modules": "535.183.06-v1.8.0",
        "nvidia-container-toolkit": "535.183.06-v1.16.1",
    }
    assert not by_check(d.check_extensions(old, ctx("v1.8.0")))["extension-names"].ok
    assert "extension-names" not in by_check(d.check_extensions(old, ctx("v1.7.6")))


def test_toolkit_missing_means_no_runtime_handler():
    finding = by_check(
        d.check_extensions({"nvidia-open-gpu-kernel-modules-lts": "580.105.08-v1.12.7"}, ctx())
    )
    assert finding["extensions"].failure == "no-runtime-handler"


def test_no_nvidia_extensions():
    (finding,) = d.check_extensions({"intel-ucode": "20250812"}, ctx())
    assert finding.failure == "extensions-not-installed"


def test_both_kmod_flavours_installed():
    both = {**LTS, "nonfree-kmod-nvidia-lts": "580.105.08-v1.12.7"}
    assert by_check(d.check_extensions(both, ctx()))["kmod-flavor"].failure == "driver-flavor-mixup"


def test_unparseable_tag_is_reported_not_raised():
    bad = {**LTS, "nvidia-container-toolkit-lts": "latest"}
    finding = by_check(d.check_extensions(bad, ctx()))["extension-tags"]
    assert not finding.ok and "latest" in finding.message


def test_classify_extensions_reads_tracks_and_kinds():
    stack = d.classify_extensions(
        {"siderolabs/nonfree-kmod-nvidia-production": "570.172.08-v1.11.6", "nvidia-gdrdrv-device": "x"}
    )
    assert stack.kmod is not None and (stack.kmod.kind, stack.kmod.track) == (
        "kmod-proprietary",
        "production",
    )
    assert stack.kmod_driver == "570.172.08"
    assert [o.kind for o in stack.others] == ["gdrdrv"]


def test_expected_names():
    assert d.expected_extension_names(TalosVersion.parse("v1.7.0")) == (
        "nvidia-open-gpu-kernel-modules",
        "nvidia-container-toolkit",
    )
    assert d.expected_extension_names(TalosVersion.parse("v1.12.0"), "proprietary", "production") == (
        "nonfree-kmod-nvidia-production",
        "nvidia-container-toolkit-production",
    )


def test_schematic_check_and_fix_uses_the_planned_id():
    planned = "40b13a8d4f3202c7d7c95f0cc0fa5cecea2d480ea9f1f1dd3122395cd68f6e9d"
    assert d.check_schematic(planned, planned, ctx()).ok
    finding = d.check_schematic(
        "376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba", planned, ctx()
    )
    assert not finding.ok and f"metal-installer/{planned}:v1.12.7" in finding.fix


def test_fixes_needing_other_extensions_never_reuse_the_current_schematic():
    current = "86a5d7c9beb23b4aea2777e44ca06c8c2ceea8a874ccd2b9a6743c4f734329e0"
    mixed = {**LTS, "nvidia-container-toolkit-production": "570.211.01-v1.18.2"}
    del mixed["nvidia-container-toolkit-lts"]
    findings = d.diagnose(d.Evidence(extensions=mixed, schematic=current), ctx())
    mismatch = by_check(findings)["driver-match"]
    assert current not in mismatch.fix and "<gpu-schematic-id>" in mismatch.fix
    # a re-install for the right Talos version keeps the extensions: the current schematic is right there
    stale = d.diagnose(d.Evidence(extensions=LTS, schematic=current), ctx("v1.12.8"))
    assert f"{current}:v1.12.8" in by_check(stale)["kmod-talos-version"].fix


def test_installer_path_before_talos_1_10():
    finding = d.check_modules({}, {}, ctx("v1.9.5"))
    assert "factory.talos.dev/installer/" in finding.fix


# --- driver, nvidia-smi, services -----------------------------------------------------------------------------


def test_open_driver_with_open_extension_is_ok():
    driver = p.parse_driver_version(read("driver_version_open_580.105.08.txt"))
    assert all(f.ok for f in d.check_driver(driver, LTS, ctx()))


def test_proprietary_driver_while_extension_is_open():
    driver = p.parse_driver_version(read("driver_version_talos_oss_guide_515.65.01.txt"))
    findings = by_check(d.check_driver(driver, LTS, ctx()))
    assert findings["driver-flavor"].failure == "driver-flavor-mixup"
    assert "proprietary" in findings["driver-flavor"].message
    assert findings["driver-version"].failure == "driver-version-differs"


def test_open_driver_while_extension_is_nonfree():
    driver = p.parse_driver_version(read("driver_version_open_580.105.08.txt"))
    nonfree = {
        "nonfree-kmod-nvidia-lts": "580.105.08-v1.12.7",
        "nvidia-container-toolkit-lts": "580.105.08-v1.18.1",
    }
    findings = by_check(d.check_driver(driver, nonfree, ctx()))
    assert not findings["driver-flavor"].ok
    assert findings["driver-version"].ok  # same number, wrong flavour: only the flavour check fails


def test_driver_version_disagrees_with_extension():
    driver = p.parse_driver_version(read("driver_version_open_580.95.05.txt"))
    finding = by_check(d.check_driver(driver, LTS, ctx()))["driver-version"]
    assert not finding.ok and "580.95.05" in finding.message and "580.105.08" in finding.message


def test_driver_without_extensions_yields_no_cross_check():
    assert (
        d.check_driver(p.parse_driver_version(read("driver_version_open_580.95.05.txt")), None, ctx()) == []
    )


def test_nvidia_smi_healthy():
    smi = p.parse_nvidia_smi(read("nvidia_smi_wide_580.105.08_2xl4.txt"))
    findings = d.check_nvidia_smi(smi, extensions=LTS, ctx=ctx())
    assert all(f.ok for f in findings) and "2 GPU(s)" in by_check(findings)["gpus"].message


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("nvidia_smi_nvml_mismatch.txt", "driver-library-mismatch"),
        ("nvidia_smi_no_driver.txt", "driver-not-loaded"),
    ],
)
def test_nvidia_smi_errors_are_diagnosed(name, key):
    (finding,) = d.check_nvidia_smi(p.parse_nvidia_smi(read(name)), ctx=ctx())
    assert not finding.ok and finding.failure == key


def test_nvidia_smi_driver_differs_from_loaded_module():
    smi = p.parse_nvidia_smi(read("nvidia_smi_wide_570_l4.txt"))
    driver = p.parse_driver_version(read("driver_version_open_580.105.08.txt"))
    finding = by_check(d.check_nvidia_smi(smi, driver=driver, ctx=ctx()))["smi-driver"]
    assert not finding.ok and "570.195.03" in finding.message


def test_nvidia_smi_without_gpus():
    finding = by_check(d.check_nvidia_smi(p.NvidiaSmi(driver_version="580.105.08"), ctx=ctx()))["gpus"]
    assert not finding.ok


def test_services_on_1_13():
    services = p.parse_services(read("services_command_1.13.txt"))
    assert all(f.ok for f in d.check_services(services, ctx("v1.13.0")))


def test_services_resource_cannot_show_finished_but_is_not_a_failure():
    services = p.parse_services(read("services_table_1.13.txt"))
    findings = by_check(d.check_services(services, ctx("v1.13.0")))
    assert findings["service-cdi-gen"].ok and "talosctl services" in findings["service-cdi-gen"].message


def test_services_missing_or_failed():
    findings = by_check(
        d.check_services(
            {"ext-nvidia-cdi-gen": p.ServiceStatus(id="ext-nvidia-cdi-gen", state="Failed")}, ctx("v1.13.0")
        )
    )
    assert findings["service-persistenced"].failure == "no-runtime-handler"
    assert findings["service-cdi-gen"].failure == "cdi-gen-not-finished"
    stopped = {"ext-nvidia-persistenced": p.ServiceStatus(id="ext-nvidia-persistenced", running=False)}
    assert by_check(d.check_services(stopped, ctx("v1.12.7")))["service-persistenced"].failure == (
        "persistenced-never-up"
    )
    assert "service-cdi-gen" not in by_check(d.check_services(stopped, ctx("v1.12.7")))


def test_diagnose_runs_only_the_checks_the_evidence_allows():
    assert d.diagnose(d.Evidence()) == []
    only_modules = d.diagnose(d.Evidence(modules=ALL_LIVE))
    assert [f.check for f in only_modules] == ["modules"] and only_modules[0].ok


# --- kernel log -----------------------------------------------------------------------------------------------


def test_multi_line_unsupported_gpu_message_in_talosctl_dmesg():
    log = read("dmesg_nvrm_unsupported_gpu.txt")
    assert [e.key for e in d.match_failures(log)] == ["gpu-unsupported"]


def test_kernel_log_turns_missing_modules_into_unsupported_gpu():
    log = read("dmesg_nvrm_unsupported_gpu.txt")
    without_log = d.check_modules({}, LTS, ctx())
    with_log = d.check_modules({}, LTS, ctx(), kernel_log=log)
    assert without_log.failure == "modules-not-configured"
    assert "talosctl -n 10.5.0.3 dmesg | grep NVRM" in without_log.fix
    assert with_log.failure == "gpu-unsupported" and "other track" in with_log.fix


def test_node_without_gpu():
    finding = d.check_modules({}, LTS, ctx(), kernel_log="NVRM: No NVIDIA GPU found.\n")
    assert finding.failure == "no-nvidia-gpu" and "<non-gpu-schematic-id>" in finding.fix


def test_diagnose_reports_log_symptoms():
    findings = d.diagnose(
        d.Evidence(modules={}, extensions=LTS, log=read("dmesg_nvrm_unsupported_gpu.txt")), ctx()
    )
    checks = by_check(findings)
    assert checks["modules"].failure == "gpu-unsupported"
    assert checks["log"].failure == "gpu-unsupported"


# --- real-cluster shapes (reality-gaps.md §1 findings 1, 2, 15, 22) ---------------------------------------------


def test_talos_1_14_kernel_module_status_lowercase_live_passes():
    """1.14 ``get modules`` is KernelModuleStatus: state ``live`` (talos v1.14.0-rc.1
    pkg/machinery/resources/runtime/kernelmodulestate_enumer.go), not LoadedKernelModule's ``Live``."""
    states = {name: m.state for name, m in p.parse_modules(read("modules_json_1.14.json")).items()}
    assert set(states.values()) == {"live"}
    assert d.check_modules(states, LTS, ctx("v1.14.0")).ok


def test_built_in_modules_count_as_loaded_and_loading_does_not():
    built_in = {**dict.fromkeys(p.NVIDIA_MODULES, "live"), "nvidia_drm": "built-in"}
    assert d.check_modules(built_in, LTS, ctx("v1.14.0")).ok
    loading = {**dict.fromkeys(p.NVIDIA_MODULES, "live"), "nvidia_drm": "loading"}
    finding = d.check_modules(loading, LTS, ctx("v1.14.0"))
    assert not finding.ok and "nvidia_drm (loading)" in finding.message


def test_persistenced_is_expected_from_talos_1_3():
    """The toolkit ships ext-nvidia-persistenced from siderolabs/extensions v1.3.0
    (nvidia-gpu/nvidia-container-toolkit/nvidia-persistenced.yaml), not only from 1.8."""
    assert by_check(d.check_services({}, ctx("v1.3.0")))["service-persistenced"].ok is False
    running = {"ext-nvidia-persistenced": p.ServiceStatus(id="ext-nvidia-persistenced", running=True)}
    assert by_check(d.check_services(running, ctx("v1.5.0")))["service-persistenced"].ok


def test_fabric_manager_service_is_checked_when_its_extension_is_installed():
    """``nvidia-fabricmanager`` runs as service ``ext-nvidia-fabricmanager`` (``name: nvidia-fabricmanager``,
    ``restart: always``: siderolabs/extensions v1.13.0 nvidia-gpu/nvidia-fabricmanager/lts/
    nvidia-fabricmanager.yaml, the same at v1.3.0; talos v1.13.0 internal/app/machined/pkg/system/services/
    extension.go:48 prefixes ``ext-``)."""
    fm = {**LTS, "nvidia-fabricmanager-lts": "580.105.08"}
    base = {
        "ext-nvidia-persistenced": p.ServiceStatus(
            id="ext-nvidia-persistenced", state="Running", running=True
        )
    }
    waiting = {
        **base,
        "ext-nvidia-fabricmanager": p.ServiceStatus(id="ext-nvidia-fabricmanager", state="Waiting"),
    }
    evidence = d.Evidence(extensions=fm, services=waiting)
    finding = by_check(d.diagnose(evidence, ctx()))["service-fabricmanager"]
    assert not finding.ok and "Waiting" in finding.message and "talosctl" in finding.fix
    missing = by_check(d.diagnose(d.Evidence(extensions=fm, services=base), ctx()))
    assert not missing["service-fabricmanager"].ok
    running = {
        **base,
        "ext-nvidia-fabricmanager": p.ServiceStatus(id="ext-nvidia-fabricmanager", state="Running"),
    }
    assert by_check(d.diagnose(d.Evidence(extensions=fm, services=running), ctx()))[
        "service-fabricmanager"
    ].ok
    # no fabric manager extension (no NVSwitch): no check
    assert "service-fabricmanager" not in by_check(
        d.diagnose(d.Evidence(extensions=LTS, services=base), ctx())
    )


# --- CDI spec completeness (reality-gaps.md §1 finding 23) ---------------------------------------------------

#: The nine ``Could not locate`` lines Talos CI quotes from ``talosctl logs ext-nvidia-cdi-gen`` on an LTS node
#: (siderolabs/talos v1.13.0 internal/integration/api/extensions_nvidia.go:160-169); nvidia-container-toolkit
#: logs them with ``Warningf("Could not locate %v: %v", …)`` (logrus text format: ``level=warning``).
CI_MISSING = [
    "libnvidia-vulkan-producer.so.580.126.20: libnvidia-vulkan-producer.so.580.126.20: not found\\n"
    "libnvidia-vulkan-producer.so.580.126.20: not found",
    "X11/xorg.conf.d/10-nvidia.conf: X11/xorg.conf.d/10-nvidia.conf: not found",
    "X11/xorg.conf.d/nvidia-drm-outputclass.conf: X11/xorg.conf.d/nvidia-drm-outputclass.conf: not found",
    "vulkan/implicit_layer.d/nvidia_layers.json: vulkan/implicit_layer.d/nvidia_layers.json: not found\\n"
    "vulkan/implicit_layer.d/nvidia_layers.json: not found",
    "vulkan/icd.d/nvidia_icd.x86_64.json: vulkan/icd.d/nvidia_icd.x86_64.json: not found\\n"
    "vulkan/icd.d/nvidia_icd.x86_64.json: not found",
    "/nvidia-fabricmanager/socket: /nvidia-fabricmanager/socket: not found",
    "/tmp/nvidia-mps: /tmp/nvidia-mps: not found",
    "nvidia-imex: nvidia-imex: not found",
    "nvidia-imex-ctl: nvidia-imex-ctl: not found",
]


def cdi_log(missing: list[str]) -> str:
    lines = ['time="2026-11-29T10:00:04Z" level=info msg="Using driver version 580.126.20"']
    lines += [f'time="2026-11-29T10:00:05Z" level=warning msg="Could not locate {m}"' for m in missing]
    lines.append('time="2026-11-29T10:00:06Z" level=info msg="Generated CDI spec with version 0.8.0"')
    return "\n".join(lines) + "\n"


def test_cdi_spec_with_the_ci_baseline_of_missing_files_is_complete():
    """Talos CI's baseline at v1.13.0: 9 for the LTS kernel modules on amd64 (extensions_nvidia.go:91-104)."""
    finding = d.check_cdi_spec(
        cdi_log(CI_MISSING), "nvidia-open-gpu-kernel-modules-lts", ctx("v1.13.0"), arch="amd64"
    )
    assert finding is not None and finding.ok and "9" in finding.message


def test_cdi_spec_missing_more_files_than_ci_allows_is_a_failure_naming_them():
    log = cdi_log([*CI_MISSING, "libcuda.so.580.126.20: libcuda.so.580.126.20: not found"])
    finding = d.check_cdi_spec(log, "nvidia-open-gpu-kernel-modules-lts", ctx("v1.13.0"), arch="amd64")
    assert finding is not None and not finding.ok
    assert "libcuda.so.580.126.20" in finding.message and "10" in finding.message and "9" in finding.message
    assert "talosctl -n 10.5.0.3 logs ext-nvidia-cdi-gen" in finding.fix


def test_cdi_baseline_follows_the_talos_release_and_architecture():
    """v1.13.4 raised the LTS baseline to 11 (extensions_nvidia.go at v1.13.4, the same at v1.14.0-rc.1);
    production stays at 13 on amd64 and 11 on arm64."""
    eleven = cdi_log([*CI_MISSING, "a: not found", "b: not found"])
    assert not d.check_cdi_spec(eleven, "nvidia-open-gpu-kernel-modules-lts", ctx("v1.13.3"), arch="amd64").ok
    assert d.check_cdi_spec(eleven, "nvidia-open-gpu-kernel-modules-lts", ctx("v1.13.4"), arch="amd64").ok
    assert d.check_cdi_spec(
        eleven, "nvidia-open-gpu-kernel-modules-lts", ctx("v1.14.0-rc.1"), arch="arm64"
    ).ok
    assert d.check_cdi_spec(eleven, "nonfree-kmod-nvidia-production", ctx("v1.13.0"), arch="arm64").ok


@pytest.mark.parametrize("talos", ["v1.14.0", "v1.14.1"])
def test_cdi_spec_is_checked_on_released_talos_1_14(talos: str) -> None:
    """The check was skipped on every released 1.14 (the table stopped at v1.14.0-rc.1): an incomplete CDI spec
    went unseen there. talos@v1.14.0 and @v1.14.1 internal/integration/api/extensions_nvidia.go:91-104 keep
    rc.1's baseline (amd64 lts 11, production 13) (Talos profiles review, 7 Dec 2026)."""
    eleven = cdi_log([*CI_MISSING, "a: not found", "b: not found"])
    finding = d.check_cdi_spec(eleven, "nvidia-open-gpu-kernel-modules-lts", ctx(talos), arch="amd64")
    assert finding is not None and finding.ok, finding
    twelve = cdi_log([*CI_MISSING, "a: not found", "b: not found", "libcuda.so: not found"])
    finding = d.check_cdi_spec(twelve, "nonfree-kmod-nvidia-lts", ctx(talos), arch="amd64")
    assert finding is not None and not finding.ok and "libcuda.so" in finding.message, finding


def test_cdi_check_is_skipped_where_ci_has_no_baseline():
    """No baseline is known for a Talos tag not in the sources checked (v1.14.2 was not served by the Go module
    proxy on 7 Dec 2026), nor before 1.13, where there is no ext-nvidia-cdi-gen."""
    assert (
        d.check_cdi_spec(
            cdi_log(CI_MISSING), "nvidia-open-gpu-kernel-modules-lts", ctx("v1.14.2"), arch="amd64"
        )
        is None
    )
    assert (
        d.check_cdi_spec(
            cdi_log(CI_MISSING), "nvidia-open-gpu-kernel-modules-lts", ctx("v1.12.7"), arch="amd64"
        )
        is None
    )


@pytest.mark.parametrize("talos", ["v1.3.7", "v1.4.8"])
def test_missing_extensions_before_1_5_are_fixed_through_the_config_not_an_image_factory(talos: str) -> None:
    """Before Talos 1.5 there is no Image Factory (it builds 1.5 and later: runbook_lib/model/boot_assets.py): the
    Talos 1.3-1.5 docs install the extensions through machine.install.extensions and an upgrade to the stock
    installer (siderolabs/talos website/content/v1.3|v1.5/talos-guides/configuration/nvidia-gpu.md, facts §1.3).
    The fix named a factory.talos.dev installer for 1.3.7, which does not exist (seen on the real talosctl v1.3.5
    against simnode: tests/sim/test_real_talos_13_14.py)."""
    ctx = d.NodeContext(node="10.5.0.13", talos=TalosVersion.parse(talos))
    [finding] = d.check_extensions({}, ctx)
    assert finding.failure == "extensions-not-installed-before-1-5"
    assert "factory.talos.dev" not in finding.fix and "Image Factory" not in finding.fix
    assert "machine.install.extensions" in finding.fix
    assert (
        f"talosctl -n 10.5.0.13 upgrade --image ghcr.io/siderolabs/installer:{talos} --preserve"
        in finding.fix
    )
    later = d.check_extensions({}, d.NodeContext(node="10.5.0.13", talos=TalosVersion.parse("v1.5.5")))
    assert later[0].failure == "extensions-not-installed" and "factory.talos.dev" in later[0].fix


def test_the_modules_patch_in_a_fix_takes_the_form_of_the_release_the_node_runs():
    """A 1.13 node under a 1.14 plan refuses the KernelModuleConfig documents 1.14's docs use
    ("KernelModuleConfig" "v1alpha1": not registered); 1.14 loads machine.kernel.modules too (review of 2adbfe0)."""
    from runbook_lib.model.versions import TalosVersion

    node = d.NodeContext(
        node="10.5.0.3", talos=TalosVersion.parse("v1.14.1"), running=TalosVersion.parse("v1.13.4")
    )
    finding = d.check_extensions({}, node)[0]
    assert "kernel:\n    modules:" in finding.fix and "KernelModuleConfig" not in finding.fix, finding.fix
    assert ":v1.14.1" in finding.fix, "the upgrade still goes to the plan's release"


def test_on_a_node_without_extensions_every_upgrade_fix_says_the_modules_patch_comes_first():
    """Review of 2adbfe0: verify also failed the node's schematic and its services with the bare `talosctl
    upgrade`, printed beside the extensions check's fix that applies the modules patch first."""
    evidence = d.Evidence(extensions={}, modules={"nvme_tcp": "Live"}, schematic="376567988ad3", services={})
    findings = [f for f in d.diagnose(evidence, ctx(), planned_schematic="40b13a8d") if not f.ok]
    upgrades = [f for f in findings if "upgrade --image" in f.fix]
    assert {f.check for f in upgrades} >= {"extensions", "schematic"}, [f.check for f in findings]
    for f in upgrades:
        assert "patch mc" in f.fix.split("upgrade --image")[0] or f.fix.startswith(
            "first the modules patch"
        ), f


def test_a_log_finding_quotes_the_line_it_matched_and_names_its_reading_as_a_pointer() -> None:
    """``runbook diagnose --log`` said "seen: the GPU is not supported by this driver release", an inference
    worded as what the log showed (operator walkthrough). It now quotes the line and says what it points to. The
    toolkit's prestart hook line as a pod's event shows it (captured in NVIDIA/nvidia-docker#1393) matched no
    row before."""
    log = (
        "Warning  Failed  kubelet  Error: failed to create containerd task: failed to create shim task: OCI "
        "runtime create failed: runc create failed: unable to start container process: error during container "
        "init: error running prestart hook #0: exit status 1, stdout: , stderr: Auto-detected mode as legacy\n"
        "nvidia-container-cli: initialization error: nvml error: driver not loaded: unknown\n"
    )
    (found,) = d.diagnose_text(log, ctx(), check="log")
    assert found.failure == "driver-not-loaded"
    assert found.message.startswith(
        '"nvidia-container-cli: initialization error: nvml error: driver not loaded: unknown" points to: '
        "the NVIDIA driver is not loaded (nvidia-smi or the toolkit cannot reach it) (likely cause: "
    ), found.message
    probe = "[ 4.1] nvidia: probe of 0000:01:00.0 failed with error -1\n"
    (unsupported,) = d.diagnose_text("boot\n" + probe, ctx())
    assert unsupported.message.startswith(
        '"[ 4.1] nvidia: probe of 0000:01:00.0 failed with error -1" points to'
    )


def test_kubectl_fixes_name_the_kubernetes_node_and_talosctl_fixes_its_address() -> None:
    """One ``{node}`` served both: cuda-test filled the Kubernetes name into ``talosctl -n`` (a name talosctl may
    not resolve), verify the address into ``kubectl label node`` (review, 7 Dec 2026)."""
    ctx = d.NodeContext(node="10.5.0.11", node_name="gpu-worker-1", talos=TalosVersion.parse("v1.12.7"))
    row = next(f for f in d.FAILURES if f.key == "device-plugin-no-pods")
    assert ctx.fill(row.command) == "kubectl label node gpu-worker-1 nvidia.com/gpu.present=true"
    upgrade = next(f for f in d.FAILURES if "upgrade --image" in f.command)
    assert ctx.fill(upgrade.command).startswith("talosctl -n 10.5.0.11 upgrade --image ")
    assert (
        d.NodeContext(node="10.5.0.11").fill(row.command)
        == "kubectl label node <node-name> nvidia.com/gpu.present=true"
    )
