"""`runbook diagnose` on outputs collected by hand: report, --json shape, exit codes 0/1/2."""

from __future__ import annotations

import io
import itertools
import json
import os
import resource
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


def test_missing_modules_without_extensions_says_the_modules_patch_then_the_factory_installer(capsys):
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
    assert finding["fix"].index("patch mc") < finding["fix"].index("upgrade --image"), "the patch first"
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


def test_fixes_name_the_factory_given_with_image_factory_url(capsys):
    """A site with its own Image Factory: before, ``runbook diagnose`` named factory.talos.dev in every fix."""
    args = ["--extensions", str(DATA / "extensions_table_mixed_tracks_1.12.7.txt")]
    code, out, _ = run(capsys, *args, "--image-factory-url", "http://factory.lab:8080")
    assert code == 1
    assert "upgrade --image factory.lab:8080/metal-installer/<gpu-schematic-id>:<talos-version>" in out
    assert "POST it to http://factory.lab:8080/schematics" in out
    assert "factory.talos.dev" not in out
    for bad in ("factory.lab:8080", "https://"):
        code, out, err = run(capsys, *args, "--image-factory-url", bad)
        assert code == 2 and f"--image-factory-url {bad!r}: not an http(s) URL" in err


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


# --- Issue 18 point 9: hostile or broken inputs are exit 2 naming the input, in bounded time and memory ---
# (attack report 2026-12-01, F11 and area table 2; each input shaped as the attack built it)

_EXT_HEAD = (
    "node: 10.5.0.3\nmetadata:\n    namespace: runtime\n    type: ExtensionStatuses.runtime.talos.dev\n"
    '    id: "0"\n    version: 1\n'
)


def run_bounded(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    """`runbook diagnose` in a child limited to 1 GiB of address space and 60 s: a hang or a memory blow-up
    fails the test instead of the machine."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    return subprocess.run(
        [sys.executable, "-m", "runbook_lib", "diagnose", *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        check=False,
        preexec_fn=limit,
    )


def write_input(tmp_path: Path, text: str, name: str = "input.txt") -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


@pytest.mark.parametrize(
    "text", ["[" * 200_000 + "]" * 200_000, '{"a":' * 100_000 + "1" + "}" * 100_000], ids=["array", "object"]
)
def test_deeply_nested_json_is_refused_naming_the_input(capsys, tmp_path, text):
    path = write_input(tmp_path, text, "ext.json")
    code, out, err = run(capsys, "--extensions", path)
    assert code == 2 and out == ""
    assert f"--extensions {path}:" in err and "nest" in err


def test_a_yaml_alias_bomb_is_refused_in_bounded_memory(tmp_path):
    levels = "abcdefghi"
    bomb = "lol: &a [" + ", ".join(['"lol"'] * 9) + "]\n"
    for prev, name in itertools.pairwise(levels):
        bomb += f"{name}{name}: &{name} [" + ", ".join([f"*{prev}"] * 9) + "]\n"
    text = _EXT_HEAD + bomb + "spec:\n    metadata:\n        name: *i\n        version: 1.0.0\n"
    assert len(text) < 2048
    path = write_input(tmp_path, text, "bomb.yaml")
    result = run_bounded("--extensions", path)
    assert result.returncode == 2, result.stderr
    assert f"--extensions {path}:" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("flag", ["--extensions", "--log"])
def test_dev_zero_is_refused_as_not_a_regular_file(flag):
    result = run_bounded(flag, "/dev/zero")
    assert result.returncode == 2, result.stderr
    assert f"{flag} /dev/zero:" in result.stderr and "not a regular file" in result.stderr


def test_a_fifo_without_a_writer_is_refused_not_waited_for(tmp_path):
    fifo = tmp_path / "ext.fifo"
    os.mkfifo(fifo)
    result = run_bounded("--extensions", str(fifo))
    assert result.returncode == 2, result.stderr
    assert f"--extensions {fifo}:" in result.stderr and "not a regular file" in result.stderr


def test_a_two_million_digit_module_size_is_refused_naming_the_input(capsys, tmp_path):
    line = f"nvidia {'9' * 2_000_000} 0 - Live 0xffffffffc1a8e000 (O)\n"
    path = write_input(tmp_path, line, "modules.txt")
    code, _, err = run(capsys, "--proc-modules", path)
    assert code == 2 and f"--proc-modules {path}:" in err


@pytest.mark.parametrize(
    "spec",
    [
        "spec:\n    metadata:\n        name: 123\n        version: 1.0.0\n",
        "spec: hello\n",
        "spec:\n    - metadata: {name: nvidia-container-toolkit-lts, version: 580.105.08-v1.12.7}\n",
        "spec:\n    metadata:\n        name: nvidia-container-toolkit-lts\n        version: [580]\n",
    ],
    ids=["name-123", "spec-text", "spec-list", "version-list"],
)
def test_wrong_typed_extension_resources_are_refused_not_listed(capsys, tmp_path, spec):
    path = write_input(tmp_path, _EXT_HEAD + spec, "ext.yaml")
    code, out, err = run(capsys, "--extensions", path)
    assert code == 2 and out == "", out
    assert f"--extensions {path}:" in err


@pytest.mark.parametrize("flag", ["--extensions", "--proc-modules", "--services", "--log"])
@pytest.mark.parametrize("text", ["", "  \n\n\t\n"], ids=["empty", "whitespace"])
def test_empty_input_is_an_error_never_a_diagnosis(capsys, tmp_path, flag, text):
    # What a failed `talosctl -n <node> get extensions > ext.txt` leaves behind.
    path = write_input(tmp_path, text)
    code, out, err = run(capsys, flag, path)
    assert code == 2 and out == ""
    assert f"{flag} {path}: empty input" in err


def test_empty_standard_input_is_an_error(capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    code, out, err = run(capsys, "--extensions", "-")
    assert code == 2 and out == "" and "--extensions -: empty input" in err


def test_dev_null_is_refused(capsys):
    code, out, err = run(capsys, "--extensions", "/dev/null")
    assert code == 2 and out == "" and "--extensions /dev/null:" in err


def test_an_input_larger_than_the_bound_is_refused_unread(capsys, tmp_path):
    from runbook_lib.cli.cmd_diagnose import MAX_INPUT_BYTES

    path = tmp_path / "dmesg.txt"
    with path.open("wb") as handle:
        handle.truncate(MAX_INPUT_BYTES + 1)  # sparse: costs no disk
    code, out, err = run(capsys, "--log", str(path))
    assert code == 2 and out == "" and f"--log {path}: cannot read it: larger than 32 MiB" in err


def _resource(kind: str, rid: str, spec: str) -> str:
    return (
        f"node: 10.5.0.3\nmetadata:\n    namespace: runtime\n    type: {kind}\n    id: {rid}\n"
        f"    version: 1\n{spec}"
    )


_MODULE = "LoadedKernelModules.runtime.talos.dev"
_SERVICE = "Services.v1alpha1.talos.dev"


@pytest.mark.parametrize(
    ("flag", "text"),
    [
        ("--proc-modules", _resource(_MODULE, "nvidia", "spec: hello\n")),
        ("--proc-modules", _resource(_MODULE, "nvidia", "spec: [Live]\n")),
        ("--proc-modules", _resource(_MODULE, "nvidia", "spec:\n    name: 123\n    state: Live\n")),
        ("--proc-modules", _resource(_MODULE, "nvidia", "spec:\n    state: [Live]\n")),
        ("--services", _resource(_SERVICE, "ext-nvidia-persistenced", "spec: hello\n")),
        ("--services", _resource(_SERVICE, "ext-nvidia-persistenced", "spec:\n    running: [true]\n")),
    ],
    ids=[
        "module-spec-text",
        "module-spec-list",
        "module-name-123",
        "module-state-list",
        "service-text",
        "service-list",
    ],
)
def test_wrong_typed_module_and_service_resources_are_refused(capsys, tmp_path, flag, text):
    path = write_input(tmp_path, text, "res.yaml")
    code, out, err = run(capsys, flag, path)
    assert code == 2 and out == "", out
    assert f"{flag} {path}:" in err


def test_a_kernel_log_alone_names_its_node(capsys):
    """README audit (stop 50): ``--log`` alone titled the report "Node (address not in the outputs)", though
    talosctl prints ``NODE: `` before every dmesg line (talos@v1.12.0 cmd/talosctl/cmd/talos/dmesg.go:33-35)."""
    from runbook_lib.cli import main

    main(["diagnose", "--log", str(DATA / "dmesg_nvrm_unsupported_gpu.txt")])
    assert capsys.readouterr().out.startswith("Node 10.5.0.3\n")


@pytest.mark.parametrize(
    "log",
    [
        "[  12.3] NVRM: The NVIDIA GPU 0000:01:00.0 is not supported\n",  # a host's dmesg | grep NVRM
        "NVRM: loading NVIDIA UNIX Open Kernel Module\nNVRM: GPU at 0000:01:00.0 has fallen off the bus\n",
        "Error: failed to create containerd task: no runtime for nvidia\n",  # a pod's event
    ],
)
def test_a_log_word_is_never_taken_for_a_node(tmp_path, capsys, log):
    """Review of 585e9f9: the first word of every line (``NVRM``, ``Error``) became the node, and the fix said
    ``talosctl -n NVRM upgrade …``."""
    from runbook_lib.cli import main

    path = tmp_path / "log.txt"
    path.write_text(log)
    main(["diagnose", "--log", str(path)])
    out = capsys.readouterr().out
    assert (
        out.startswith("Node (address not in the outputs)") and "-n NVRM" not in out and "-n Error" not in out
    )
