"""`runbook params check|doc` and `runbook plan`, driven as a user runs them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
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


def test_plan_of_a_simulated_target_says_the_factory_and_chart_repository_it_shows_are_not_the_ones_used(
    capsys,
):
    """Found by an operator walkthrough: for ``target: simulated`` the plan showed factory.talos.dev and the public
    chart repository, which that run never contacts (``runbook_lib/steps/context.py``: the simulator's endpoints
    replace them); still valid YAML and JSON."""
    assert main(["plan", "-p", SIM]) == 0
    out = capsys.readouterr().out
    assert out.startswith(
        "# target simulated: `runbook run` uses the simulator's Image Factory and chart repo"
    )
    assert yaml.safe_load(out)["helm"]["repo_url"] == "https://nvidia.github.io/k8s-device-plugin"
    assert main(["plan", "-p", SIM, "--format", "json"]) == 0
    printed = capsys.readouterr()
    assert json.loads(printed.out)["target"] == "simulated" and "simulator's Image Factory" in printed.err
    assert main(["plan", "-p", SIM, "--set", "target=cluster"]) == 0
    assert not capsys.readouterr().out.startswith("#")  # a real cluster's plan shows what it uses


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


def test_plan_schematic_id_matches_the_factory_algorithm_for_the_lts_pair(capsys):
    # facts §2.3: modules-lts then toolkit-lts hashes to 40b13a8d… (order matters)
    assert main(["plan", "-p", SIM, "--format", "json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["schematic_id"] == "40b13a8d4f3202c7d7c95f0cc0fa5cecea2d480ea9f1f1dd3122395cd68f6e9d"
    assert plan["installer_image"] == f"factory.talos.dev/metal-installer/{plan['schematic_id']}:v1.12.7"
    assert all(n["installer_image"] == plan["installer_image"] for n in plan["nodes"])


def test_plan_for_a_node_override_gets_its_own_schematic(tmp_path, capsys):
    data = yaml.safe_load(Path(SIM).read_text())
    data["nodes"][1]["overrides"] = {"driver_flavor": "proprietary"}
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["plan", "-p", str(path), "--format", "json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    # facts §2.3: nonfree-kmod-nvidia-lts + toolkit-lts
    assert (
        plan["nodes"][1]["schematic_id"] == "af8eb82417d3deaa94d2ef19c3b590b0dac1b2549d0b9b35b3da2bc325de75f7"
    )
    assert plan["nodes"][0]["schematic_id"] == plan["schematic_id"]


def test_plan_before_the_image_factory_uses_the_stock_installer(capsys):
    assert (
        main(["plan", "-p", SIM, "--set", "talos_version=v1.3.7", "--set", "track=null", "--format", "json"])
        == 0
    )
    plan = json.loads(capsys.readouterr().out)
    assert plan["schematic_id"] is None and plan["installer_image"] == "ghcr.io/siderolabs/installer:v1.3.7"
    assert "install" in yaml.safe_load(plan["machine_config_patches"][0])["machine"]


# --- Issue 18: what a user sees for bad parameter input (attack report 2026-12-01, F3 and F12) -------------


def _sim_with(tmp_path: Path, extra: str) -> Path:
    path = tmp_path / "p.yaml"
    path.write_text(Path(SIM).read_text(encoding="utf-8") + extra, encoding="utf-8")
    return path


def test_params_check_refuses_a_duplicated_apply_key(tmp_path, capsys):
    path = _sim_with(tmp_path, "apply: true\n")  # the file says `apply: false` further up
    lines = path.read_text().splitlines()
    first, second = (n for n, line in enumerate(lines, 1) if line.startswith("apply:"))
    assert main(["params", "check", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}: apply: duplicate key on lines {first} and {second}" in err


@pytest.mark.parametrize(
    "written",
    [
        "<<: {apply: true}",
        "cluster2: &k apply\n*k : true",  # review of 70aa799: the key as an alias of a value written elsewhere
        "cluster2: &t true\napply: *t",  # review of 49e691e: the approval's value written elsewhere
    ],
)
def test_an_approval_given_only_by_a_yaml_merge_key_is_refused_and_nothing_runs(tmp_path, capsys, written):
    """Attack re-run (stop 49): ``<<: {apply: true}`` applied, though ``grep '^apply:'`` finds no approval."""
    path = tmp_path / "p.yaml"
    path.write_text(Path(SIM).read_text().replace("apply: false", written))
    records = tmp_path / "records"
    assert main(["params", "check", str(path)]) == 2
    assert f"{path}: apply: not written as a top-level 'apply:' line" in capsys.readouterr().err
    assert main(["run", "-p", str(path), "--records", str(records)]) == 2
    assert "merge key" in capsys.readouterr().err
    assert not records.exists() or not any(records.iterdir())


def test_a_merge_key_that_sets_other_parameters_is_still_read(tmp_path, capsys):
    path = tmp_path / "p.yaml"
    path.write_text(Path(SIM).read_text() + "<<: {rollout_concurrency: 3}\n")
    assert main(["params", "check", str(path)]) == 0, capsys.readouterr().err


def test_run_with_apply_refuses_an_invalid_apply_in_the_file_and_records_nothing(tmp_path, capsys):
    path = tmp_path / "p.yaml"
    path.write_text(Path(SIM).read_text().replace("apply: false", 'apply: "yes please"'))
    records = tmp_path / "records"
    assert main(["run", "-p", str(path), "--apply", "--records", str(records)]) == 2
    err = capsys.readouterr().err
    assert f"{path}: apply:" in err and "'yes please'" in err
    assert not records.exists() or not any(records.iterdir())


def test_plan_names_the_set_option_that_is_wrong(capsys):
    assert main(["plan", "-p", SIM, "--set", "rollout_concurrency=zero"]) == 2
    err = capsys.readouterr().err
    assert "--set rollout_concurrency=zero: rollout_concurrency:" in err and SIM not in err


def test_params_check_refuses_a_latin1_file_without_a_traceback(tmp_path, capsys):
    path = tmp_path / "p.yaml"
    path.write_bytes(Path(SIM).read_bytes() + "# café\n".encode("latin-1"))
    assert main(["params", "check", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}: (file): not UTF-8" in err and "Traceback" not in err


def _fleet_file(tmp_path: Path, count: int) -> Path:
    head, rest = Path(SIM).read_text().split("nodes:\n")
    lines = "".join(
        f"  - {{name: gpu-{i:05d}, address: 10.{i // 65536}.{i // 256 % 256}.{i % 256}}}\n"
        for i in range(count)
    )
    path = tmp_path / "fleet.yaml"
    path.write_text(head + "nodes:\n" + lines + "driver_flavor" + rest.split("driver_flavor", 1)[1])
    return path


def test_a_fleet_too_big_for_its_records_params_yaml_is_refused_by_check_and_run_alike(tmp_path, capsys):
    """Attack re-run N7 (stop 49): a 20,000-node file (858 KB) passed `params check`, then preflight refused the
    record's own params.yaml (every default written out: ~145 bytes a node) as over the 1 MiB limit."""
    path = _fleet_file(tmp_path, 8000)
    assert path.stat().st_size < 1024 * 1024  # the input alone is within the limit
    assert main(["params", "check", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}: nodes: 8000 nodes are 1,1" in err and "KiB as a record's params.yaml" in err
    assert "(at most 1,024 KiB): split the fleet into runs of at most about 7" in err
    records = tmp_path / "records"
    assert main(["run", "-p", str(path), "--records", str(records), "--state", str(tmp_path / "sim")]) == 2
    assert "8000 nodes are 1,1" in capsys.readouterr().err
    assert not records.exists() and not (tmp_path / "sim").exists()


@pytest.mark.parametrize("value", ["1", "y", "t", "1.0"])
def test_an_approval_is_true_or_false_nothing_that_reads_like_it(capsys, value):
    """Review of 70aa799: ``--set apply=1`` applied (pydantic read 1, "y", "t" as true) while the resume message,
    which takes only ``true``, said "plan only"; an approval is written out."""
    assert main(["params", "check", SIM, "--set", f"apply={value}"]) == 2
    assert f"--set apply={value}: apply: must be true or false (got " in capsys.readouterr().err


def test_params_check_prints_text_as_written(capsys):
    """Review of 70aa799: `params check` printed ``/opt/jos\\xE9/talosctl`` for ``/opt/josé/talosctl``."""
    assert main(["params", "check", SIM, "--set", "tools.talosctl=/opt/josé/talosctl"]) == 0
    assert "talosctl: /opt/josé/talosctl" in capsys.readouterr().out


def test_the_size_rule_counts_the_heading_a_record_writes(monkeypatch):
    """Review of 49e691e: the check dumped the parameters without the record's heading line, so a file within
    ~80 bytes of the limit passed `params check` and failed `runbook run` (or a JupyterLab approval, after its
    record was made)."""
    from runbook_lib.errors import ParametersInvalid
    from runbook_lib.model import params as model

    loaded = model.load_params(SIM)
    bare = len(model.record_yaml(loaded, "", source=SIM).encode())
    monkeypatch.setattr(model, "MAX_FILE_BYTES", bare + 10)  # room for the values, not for a heading
    with pytest.raises(ParametersInvalid, match=r"as a record's params\.yaml"):
        model.load_params(SIM)
    for heading in model.RECORD_HEADINGS:
        with pytest.raises(ParametersInvalid):
            model.record_yaml(loaded, heading, source=SIM)
