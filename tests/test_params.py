"""Bad parameter files of every kind get precise errors naming file, key path and what is valid."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from runbook_lib.errors import ParametersInvalid
from runbook_lib.model.params import load_params

ROOT = Path(__file__).resolve().parents[1]
GOOD = {
    "cluster": "lab",
    "talos_version": "v1.12.7",
    "nodes": [{"name": "gpu-1", "address": "10.5.0.11"}],
}


def write(tmp_path: Path, data) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


def problems(tmp_path, data, overrides=()) -> list[str]:
    path = write(tmp_path, data)
    with pytest.raises(ParametersInvalid) as err:
        load_params(path, overrides)
    text = str(err.value)
    assert str(path) in text or "--set" in text
    return [str(p) for p in err.value.problems]


@pytest.mark.parametrize("name", ["simulated.yaml", "example-cluster.yaml"])
def test_shipped_parameter_files_are_valid(name):
    params = load_params(ROOT / "params" / name)
    assert params.nodes and params.apply is False


def test_defaults_are_safe_plan_only_and_one_node_at_a_time(tmp_path):
    params = load_params(write(tmp_path, GOOD))
    assert params.apply is False and params.rollout_concurrency == 1 and params.target == "simulated"
    assert params.image_factory_url == "https://factory.talos.dev"
    assert params.profile().track == "lts"


def test_unknown_key_suggests_the_close_one_and_lists_valid_keys(tmp_path):
    (problem,) = problems(tmp_path, {**GOOD, "aply": True})
    assert "aply" in problem and "did you mean 'apply'" in problem and "rollout_concurrency" in problem


def test_unknown_nested_key_names_its_path(tmp_path):
    data = {**GOOD, "nodes": [{"name": "gpu-1", "adress": "10.0.0.1"}]}
    found = problems(tmp_path, data)
    assert any("nodes[0].adress" in p and "did you mean 'address'" in p for p in found)
    assert any("nodes[0].address" in p and "missing" in p for p in found)
    assert not any("at least 1 item" in p for p in found), "the echo of the failed item must not be reported"


def test_wrong_types_name_the_key_and_the_value(tmp_path):
    found = problems(tmp_path, {**GOOD, "rollout_concurrency": "zero", "apply": "maybe"})
    assert any(p.startswith(f"{tmp_path}/cluster.yaml: rollout_concurrency") and "'zero'" in p for p in found)
    assert any("apply" in p and "'maybe'" in p for p in found)


def test_invalid_choice_lists_the_valid_ones(tmp_path):
    (problem,) = problems(tmp_path, {**GOOD, "driver_flavor": "nvidia"})
    assert "'oss'" in problem and "'proprietary'" in problem


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("1.12", "as text"),
        ("v1.12", "exact release"),
        ("latest", "vMAJOR.MINOR.PATCH"),
        ("v1.2.0", "supported range"),
    ],
)
def test_malformed_or_unsupported_talos_versions(tmp_path, value, needle):
    data = yaml.safe_dump({**GOOD, "talos_version": "X"}).replace("X", value)
    (problem,) = problems(tmp_path, data)
    assert "talos_version" in problem and needle in problem


def test_track_before_talos_1_8_is_an_impossible_combination(tmp_path):
    (problem,) = problems(tmp_path, {**GOOD, "talos_version": "v1.7.4", "track": "production"})
    assert problem.startswith(f"{tmp_path}/cluster.yaml: track:") and "1.8" in problem


def test_gpu_operator_before_1_13_is_refused(tmp_path):
    (problem,) = problems(tmp_path, {**GOOD, "kubernetes_layer": "gpu-operator"})
    assert "kubernetes_layer" in problem and "1.13" in problem


def test_per_node_override_combinations_are_checked(tmp_path):
    data = {
        **GOOD,
        "talos_version": "v1.4.2",
        "nodes": [{"name": "a", "address": "1.1.1.1", "overrides": {"driver_flavor": "proprietary"}}],
    }
    (problem,) = problems(tmp_path, data)
    assert "nodes[0].overrides" in problem and "1.4.8" in problem


def test_duplicate_nodes_and_bad_names(tmp_path):
    data = {
        **GOOD,
        "nodes": [
            {"name": "gpu-1", "address": "10.0.0.1"},
            {"name": "gpu-1", "address": "10.0.0.1"},
            {"name": "GPU_2", "address": "a b"},
        ],
    }
    found = problems(tmp_path, data)
    assert any("nodes[2].name" in p and "DNS label" in p for p in found)
    assert any("nodes[2].address" in p for p in found)


def test_duplicates_reported_after_types_pass(tmp_path):
    data = {
        **GOOD,
        "nodes": [{"name": "gpu-1", "address": "10.0.0.1"}, {"name": "gpu-1", "address": "10.0.0.2"}],
    }
    (problem,) = problems(tmp_path, data)
    assert "nodes[1].name" in problem and "duplicate" in problem


def test_secret_contents_instead_of_a_path_are_refused_without_echoing_them(tmp_path):
    found = problems(tmp_path, {**GOOD, "kubeconfig": "apiVersion: v1\nusers:\n- token: s3cr3t\n"})
    assert any("kubeconfig" in p and "path" in p for p in found)
    assert not any("s3cr3t" in p for p in found)


def test_every_error_is_reported_at_once(tmp_path):
    found = problems(tmp_path, {"cluster": "Bad_Name", "talos_version": "nope", "nodes": [], "bogus": 1})
    assert len(found) == 4


def test_file_level_errors_name_the_file(tmp_path):
    with pytest.raises(ParametersInvalid, match="file not found"):
        load_params(tmp_path / "missing.yaml")
    with pytest.raises(ParametersInvalid, match="line 2"):
        load_params(write(tmp_path, "cluster: a\n  nodes: [\n"))
    with pytest.raises(ParametersInvalid, match="mapping"):
        load_params(write(tmp_path, "- a\n- b\n"))


def test_set_overrides_win_and_are_typed(tmp_path):
    path = write(tmp_path, GOOD)
    params = load_params(
        path, ["talos_version=v1.8.3", "apply=true", "device_plugin.namespace=gpu", "rollout_concurrency=4"]
    )
    assert params.talos_version == "v1.8.3" and params.apply is True
    assert params.device_plugin.namespace == "gpu" and params.rollout_concurrency == 4


def test_set_with_unknown_key_or_bad_syntax_is_an_error(tmp_path):
    path = write(tmp_path, GOOD)
    with pytest.raises(ParametersInvalid, match="did you mean 'apply'"):
        load_params(path, ["aply=true"])
    with pytest.raises(ParametersInvalid, match="KEY=VALUE"):
        load_params(path, ["apply"])


def test_notebook_values_override_file_and_set(tmp_path):
    path = write(tmp_path, GOOD)
    params = load_params(path, ["rollout_concurrency=3"], {"rollout_concurrency": 5})
    assert params.rollout_concurrency == 5
