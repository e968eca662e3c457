"""`runbook params check|doc` and `runbook plan`, driven as a user runs them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

from runbook_lib.cli import main
from runbook_lib.model.params import parameters_markdown

ROOT = Path(__file__).resolve().parents[1]
SIM = str(ROOT / "params" / "simulated.yaml")


def test_plan_json_has_the_documented_keys(capsys):
    assert main(["plan", "-p", SIM, "--format", "json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    for key in (
        "talos_version",
        "extensions",
        "machine_config_patches",
        "default_runtime_patch",
        "kubernetes_layer",
        "installer_image",
        "schematic_id",
    ):
        assert key in plan
    assert plan["extensions"] == [
        "siderolabs/nvidia-open-gpu-kernel-modules-lts",
        "siderolabs/nvidia-container-toolkit-lts",
    ]
    assert plan["kubernetes_layer"] == "device-plugin"
    (patch,) = plan["machine_config_patches"]
    assert yaml.safe_load(patch)["machine"]["sysctls"] == {"net.core.bpf_jit_harden": "1"}


def test_plan_set_overrides_the_talos_version(capsys):
    assert main(["plan", "-p", SIM, "--set", "talos_version=v1.13.2", "--format", "json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["talos_version"] == "v1.13.2" and plan["kubernetes_layer"] == "gpu-operator"
    assert plan["helm"]["values"]["hostPaths.driverInstallDir"] == "/usr/local"
    assert "sysctls" not in yaml.safe_load(plan["machine_config_patches"][0])["machine"]


def test_plan_on_1_14_uses_kernel_module_config_documents(capsys):
    assert (
        main(
            [
                "plan",
                "-p",
                SIM,
                "--set",
                "talos_version=v1.14.0",
                "--set",
                "default_runtime_patch=true",
                "--format",
                "json",
            ]
        )
        == 0
    )
    plan = json.loads(capsys.readouterr().out)
    kinds = [yaml.safe_load(doc)["kind"] for doc in plan["machine_config_patches"]]
    assert kinds == ["KernelModuleConfig"] * 4
    assert "CRICustomizationConfig" in plan["default_runtime_patch"]


def test_plan_yaml_is_default_and_parses(capsys):
    assert main(["plan", "-p", SIM]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["cluster"] == "sim-gpu"


def test_params_check_ok_prints_resolved_values(capsys):
    assert main(["params", "check", SIM]) == 0
    out = capsys.readouterr().out
    assert out.startswith("ok\n") and "rollout_concurrency: 1" in out


def test_params_check_prints_every_error_and_exits_2(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "cluster: x\ntalos_version: v1.7.4\ntrack: lts\naply: true\nnodes:\n- {name: a, address: 1.1.1.1}\n"
    )
    assert main(["params", "check", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "2 parameter problems" in err and "did you mean 'apply'" in err and "track" in err


def test_console_script_entry_point_and_module_run_the_same_cli():
    out = subprocess.run(
        [sys.executable, "-m", "runbook_lib", "plan", "-p", SIM, "--format", "json"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert json.loads(out)["cluster"] == "sim-gpu"


def test_readme_parameter_table_is_generated_from_the_schema():
    readme = (ROOT / "README.md").read_text()
    assert parameters_markdown() in readme, "regenerate with: runbook params doc"
