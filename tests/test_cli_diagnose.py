"""`runbook diagnose` on outputs collected by hand: report, --json shape, exit codes 0/1/2."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from runbook_lib.cli import main

DATA = Path(__file__).parent / "data" / "outputs"
REPO = Path(__file__).resolve().parents[1]

HEALTHY = [
    "--extensions",
    str(DATA / "extensions_table_schematic_1.12.7.txt"),
    "--proc-modules",
    str(DATA / "proc_modules_open_1.12.txt"),
    "--driver-version",
    str(DATA / "driver_version_open_580.105.08.txt"),
    "--nvidia-smi",
    str(DATA / "nvidia_smi_wide_580.105.08_2xl4.txt"),
    "--talos-version",
    "v1.12.7",
]


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["diagnose", *args])
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys, *args: str) -> tuple[int, dict]:
    code, out, _ = run(capsys, *args, "--json")
    return code, json.loads(out)


def failed_checks(report: dict) -> dict[str, dict]:
    return {f["check"]: f for f in report["findings"] if not f["ok"]}


def test_healthy_node_exits_0_and_reports_what_is_there(capsys):
    code, out, err = run(capsys, *HEALTHY)
    assert code == 0, out
    assert err == ""
    assert "Node 10.5.0.3, Talos v1.12.7" in out
    assert "580.105.08, open kernel modules (from /proc/driver/nvidia/version)" in out
    assert "nvidia-open-gpu-kernel-modules-lts 580.105.08-v1.12.7" in out
    assert out.count("NVIDIA L4, 23034 MiB") == 2
    assert "cuda:        13.0" in out
    assert "FAIL" not in out and "checks passed" in out


def test_json_has_exactly_the_documented_keys(capsys):
    code, report = run_json(capsys, *HEALTHY)
    assert code == 0
    assert list(report) == ["modules", "driver", "extensions", "gpus", "cuda_version", "findings"]
    assert report["driver"] == {"version": "580.105.08", "flavor": "open"}
    assert report["modules"]["nvidia_uvm"] == "Live" and report["modules"]["nvme_tcp"] == "Live"
    assert report["extensions"] == {
        "nvidia-open-gpu-kernel-modules-lts": "580.105.08-v1.12.7",
        "nvidia-container-toolkit-lts": "580.105.08-v1.18.1",
    }
    assert report["gpus"] == [
        {"name": "NVIDIA L4", "memory_mib": 23034, "bus_id": "00000000:38:00.0"},
        {"name": "NVIDIA L4", "memory_mib": 23034, "bus_id": "00000000:3A:00.0"},
    ]
    assert report["cuda_version"] == "13.0"
    assert report["findings"] and all(set(f) == {"check", "ok", "message", "fix"} for f in report["findings"])
    assert all(f["ok"] for f in report["findings"])


def test_inputs_not_given_are_null_not_empty(capsys):
    code, report = run_json(
        capsys, "--driver-version", str(DATA / "driver_version_proprietary_510.60.02.txt")
    )
    assert code == 0
    assert report["modules"] is None and report["extensions"] is None and report["gpus"] is None
    assert report["driver"] == {"version": "510.60.02", "flavor": "proprietary"}


def test_missing_modules_with_extensions_says_patch_machine_config(capsys):
    code, report = run_json(
        capsys,
        "--extensions",
        str(DATA / "extensions_table_schematic_1.12.7.txt"),
        "--proc-modules",
        str(DATA / "proc_modules_no_nvidia.txt"),
    )
    assert code == 1
    finding = failed_checks(report)["modules"]
    assert "nvidia, nvidia_uvm, nvidia_drm, nvidia_modeset" in finding["message"]
    assert "talosctl -n 10.5.0.3 patch mc --patch @gpu-worker-patch.yaml" in finding["fix"]
    assert "upgrade" not in finding["fix"]


def test_missing_modules_without_extensions_says_upgrade_with_factory_installer(capsys):
    code, report = run_json(
        capsys,
        "--extensions",
        str(DATA / "extensions_table_vanilla.txt"),
        "--proc-modules",
        str(DATA / "modules_table_missing_1.12.txt"),
        "--talos-version",
        "v1.12.7",
    )
    assert code == 1
    assert report["extensions"] == {}
    finding = failed_checks(report)["modules"]
    assert "talosctl -n 10.5.0.3 upgrade --image factory.talos.dev/metal-installer/" in finding["fix"]
    assert ":v1.12.7" in finding["fix"]
    assert "patch mc" not in finding["fix"]
    # the vanilla schematic is the wrong one: it must not be offered as the upgrade target
    assert "376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba" not in finding["fix"]


def test_proprietary_driver_with_oss_extensions_is_a_mixup(capsys):
    code, report = run_json(
        capsys,
        "--extensions",
        str(DATA / "extensions_table_lts_1.12.txt"),
        "--driver-version",
        str(DATA / "driver_version_talos_oss_guide_515.65.01.txt"),
    )
    assert code == 1
    assert report["driver"] == {"version": "515.65.01", "flavor": "proprietary"}
    flavor = failed_checks(report)["driver-flavor"]
    assert "proprietary" in flavor["message"] and "nvidia-open-gpu-kernel-modules-lts" in flavor["message"]
    assert "exactly one kernel-module extension" in flavor["fix"]


def test_open_driver_with_nonfree_extensions_is_a_mixup(capsys, tmp_path):
    driver = tmp_path / "version"
    driver.write_text(
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.172.08  Release Build  "
        "(dvs-builder@U16-I3-C04-2-2)  Thu Jul 17 22:13:04 UTC 2025\n"
    )
    code, report = run_json(
        capsys,
        "--extensions",
        str(DATA / "extensions_table_nonfree_production_1.11.6.txt"),
        "--driver-version",
        str(driver),
    )
    assert code == 1
    checks = failed_checks(report)
    assert "driver-flavor" in checks and "driver-version" not in checks


def test_kmod_and_toolkit_driver_mismatch(capsys):
    code, out, _ = run(capsys, "--extensions", str(DATA / "extensions_table_mixed_tracks_1.12.7.txt"))
    assert code == 1
    assert "FAIL  driver-match" in out
    assert "580.105.08" in out and "570.211.01" in out
    assert "upgrade --image factory.talos.dev/metal-installer/<gpu-schematic-id>:<talos-version>" in out


def test_kmod_built_for_another_talos_version(capsys):
    code, report = run_json(
        capsys,
        "--extensions",
        str(DATA / "extensions_table_schematic_1.12.7.txt"),
        "--talos-version",
        "v1.12.8",
    )
    assert code == 1
    finding = failed_checks(report)["kmod-talos-version"]
    assert "v1.12.7" in finding["message"] and "v1.12.8" in finding["message"]


def test_proc_driver_version_disagrees_with_extension(capsys):
    code, report = run_json(
        capsys,
        "--extensions",
        str(DATA / "extensions_table_schematic_1.12.7.txt"),
        "--driver-version",
        str(DATA / "driver_version_open_580.95.05.txt"),
    )
    assert code == 1
    assert set(failed_checks(report)) == {"driver-version"}


def test_nvidia_smi_error_is_diagnosed(capsys):
    code, out, _ = run(capsys, "--nvidia-smi", str(DATA / "nvidia_smi_nvml_mismatch.txt"))
    assert code == 1
    assert "Driver/library version mismatch" in out and "use one track for both extensions" in out


def test_stdin_input(capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO((DATA / "nvidia_smi_L_mig.txt").read_text()))
    code, report = run_json(capsys, "--nvidia-smi", "-")
    assert code == 0
    assert [g["name"] for g in report["gpus"]] == ["NVIDIA A100-SXM4-40GB"] * 2
    assert report["cuda_version"] is None


def test_talosctl_get_modules_yaml_is_accepted_for_proc_modules(capsys):
    code, report = run_json(capsys, "--proc-modules", str(DATA / "modules_yaml_1.12.yaml"))
    assert code == 1  # nvidia_drm is still Loading in that capture
    assert report["modules"]["nvidia_drm"] == "Loading"


def test_services_input(capsys):
    code, report = run_json(
        capsys, "--services", str(DATA / "services_command_1.13.txt"), "--talos-version", "v1.13.0"
    )
    assert code == 0
    assert {f["check"] for f in report["findings"]} == {"service-persistenced", "service-cdi-gen"}


def test_several_nodes_need_node_flag(capsys):
    path = str(DATA / "extensions_table_two_nodes.txt")
    code, _, err = run(capsys, "--extensions", path)
    assert code == 2
    assert path in err and "10.5.0.3, 10.5.0.4" in err and "--node" in err
    code, out, _ = run(capsys, "--extensions", path, "--node", "10.5.0.4")
    assert code == 0 and "Node 10.5.0.4" in out


def test_planned_schematic_is_compared(capsys):
    planned = "40b13a8d4f3202c7d7c95f0cc0fa5cecea2d480ea9f1f1dd3122395cd68f6e9d"
    code, _, _ = run(
        capsys, "--extensions", str(DATA / "extensions_table_schematic_1.12.7.txt"), "--schematic", planned
    )
    assert code == 0
    code, report = run_json(
        capsys, "--extensions", str(DATA / "extensions_table_vanilla.txt"), "--schematic", planned
    )
    assert code == 1 and planned in failed_checks(report)["schematic"]["fix"]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--extensions", "/nonexistent/ext.txt"], "--extensions /nonexistent/ext.txt: cannot read it"),
        (["--driver-version", str(DATA / "nvidia_smi_L_2gpu.txt")], "nvidia_smi_L_2gpu.txt"),
        (["--extensions", str(DATA / "modules_table_1.12.txt")], "modules_table_1.12.txt"),
        ([], "nothing to diagnose"),
        (["--proc-modules", "-", "--extensions", "-"], "standard input"),
        (
            ["--extensions", str(DATA / "extensions_table_lts_1.12.txt"), "--talos-version", "latest"],
            "not a Talos",
        ),
    ],
)
def test_unreadable_input_exits_2_naming_it(capsys, args, needle):
    code, out, err = run(capsys, *args)
    assert code == 2
    assert out == ""
    assert needle in err


def test_binary_file_is_unreadable(capsys, tmp_path):
    blob = tmp_path / "blob.bin"
    blob.write_bytes(b"\xff\xfe\x00\x81")
    code, _, err = run(capsys, "--proc-modules", str(blob))
    assert code == 2 and str(blob) in err


def test_console_entry_point_end_to_end():
    result = subprocess.run(
        [sys.executable, "-m", "runbook_lib", "diagnose", "--extensions", "-", "--json"],
        input=(DATA / "extensions_table_mixed_tracks_1.12.7.txt").read_text(),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1, result.stderr
    findings = {f["check"]: f["ok"] for f in json.loads(result.stdout)["findings"]}
    assert findings["driver-match"] is False


def test_kernel_log_explains_missing_modules(capsys):
    code, report = run_json(
        capsys,
        "--extensions",
        str(DATA / "extensions_table_schematic_1.12.7.txt"),
        "--proc-modules",
        str(DATA / "proc_modules_no_nvidia.txt"),
        "--log",
        str(DATA / "dmesg_nvrm_unsupported_gpu.txt"),
    )
    assert code == 1
    failed = failed_checks(report)
    assert "lts/production" in failed["modules"]["fix"] and "patch mc" not in failed["modules"]["fix"]
    assert "log" in failed
