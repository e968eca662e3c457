"""Bad parameter files of every kind get precise errors naming file, key path and what is valid."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest
import yaml

from runbook_lib.errors import ParametersInvalid
from runbook_lib.model.params import load_params, validate

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
def test_shipped_parameter_files_are_valid(name, tmp_path, monkeypatch):
    # The real-cluster template names ~/.talos/config and ~/.kube/config, which must exist to load it.
    monkeypatch.setenv("HOME", str(tmp_path))
    for config in (tmp_path / ".talos" / "config", tmp_path / ".kube" / "config"):
        config.parent.mkdir()
        config.write_text("x")
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
    assert "nodes[0].overrides" in problem and "v1.5.0" in problem


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
    with pytest.raises(ParametersInvalid, match="file not found") as caught:
        load_params(tmp_path / "missing.yaml")
    assert "did you mean" not in str(caught.value), "no file with a close name: no guess"
    # a file of the same folder with a close name is suggested (walkthrough, stop 52: `-p params/walk13.yml`)
    (tmp_path / "gpu-cluster.yaml").write_text("cluster: a\n")
    with pytest.raises(
        ParametersInvalid, match=rf"file not found; did you mean {tmp_path}/gpu-cluster\.yaml\?"
    ):
        load_params(tmp_path / "gpu-cluster.yml")
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


# --- Issue 18: parameter files are read strictly (attack report 2026-12-01, F3 and F12) ----------------


def test_a_duplicated_apply_key_is_refused_with_both_lines(tmp_path):
    # PyYAML's safe_load keeps the last of two equal keys; a reviewer reading the top sees `apply: false`.
    # YAML 1.2.2 §3.2.1.1: "each of the keys is unique" (https://yaml.org/spec/1.2.2/).
    text = yaml.safe_dump(GOOD, sort_keys=False) + "apply: false\nrollout_concurrency: 2\napply: true\n"
    path = write(tmp_path, text)
    lines = text.splitlines()
    first, second = (i + 1 for i, line in enumerate(lines) if line.startswith("apply:"))
    with pytest.raises(ParametersInvalid) as err:
        load_params(path)
    (problem,) = [str(p) for p in err.value.problems]
    assert problem.startswith(f"{path}: apply:")
    assert f"lines {first} and {second}" in problem and "duplicate" in problem


def test_a_duplicated_nested_key_is_refused_with_its_path(tmp_path):
    text = (
        "cluster: lab\ntalos_version: v1.12.7\nnodes:\n"
        "  - {name: gpu-1, address: 10.5.0.11, address: 10.5.0.12}\n"
        "device_plugin:\n  namespace: nvidia\n  namespace: kube-system\n"
    )
    with pytest.raises(ParametersInvalid) as err:
        load_params(write(tmp_path, text))
    found = [str(p) for p in err.value.problems]
    assert any("device_plugin.namespace" in p and "lines 6 and 7" in p for p in found)
    assert any("nodes[0].address" in p and "lines 4 and 4" in p for p in found)


def test_an_invalid_file_value_is_refused_even_when_a_flag_overrides_it(tmp_path):
    path = write(tmp_path, {**GOOD, "apply": "yes please", "rollout_concurrency": "many"})
    with pytest.raises(ParametersInvalid) as err:
        load_params(path, ["rollout_concurrency=2"], {"apply": True})  # what `runbook run --apply` passes
    found = [str(p) for p in err.value.problems]
    assert any(p.startswith(f"{path}: apply:") and "'yes please'" in p for p in found)
    assert any(p.startswith(f"{path}: rollout_concurrency:") and "'many'" in p for p in found)


def test_set_errors_name_the_set_option_not_the_file(tmp_path):
    path = write(tmp_path, GOOD)
    with pytest.raises(ParametersInvalid) as err:
        load_params(path, ["rollout_concurrency=zero", "aply=true"])
    found = [str(p) for p in err.value.problems]
    assert any(p.startswith("--set rollout_concurrency=zero: rollout_concurrency:") for p in found)
    assert any(p.startswith("--set aply=true: aply:") and "did you mean 'apply'" in p for p in found)
    assert not any(p.startswith(str(path)) for p in found)


def test_set_reaches_into_a_node_by_index(tmp_path):
    path = write(tmp_path, GOOD)
    params = load_params(path, ["nodes.0.address=10.5.0.99"])
    assert params.nodes[0].address == "10.5.0.99" and params.nodes[0].name == "gpu-1"


@pytest.mark.parametrize(
    ("item", "needle"),
    [("nodes.3.address=10.5.0.9", "index 0"), ("nodes.address=10.5.0.9", "a list index")],
)
def test_set_into_a_list_with_a_bad_index_is_a_clear_error(tmp_path, item, needle):
    with pytest.raises(ParametersInvalid) as err:
        load_params(write(tmp_path, GOOD), [item])
    (problem,) = [str(p) for p in err.value.problems]
    assert problem.startswith(f"--set {item}: nodes") and needle in problem
    assert "tuple" not in problem


@pytest.mark.parametrize(
    "raw",
    ["cluster: caf\xe9\n".encode("latin-1"), "cluster: lab\n".encode("utf-16")],
    ids=["latin-1", "utf-16"],
)
def test_a_file_that_is_not_utf8_is_named_and_refused(tmp_path, raw):
    path = tmp_path / "cluster.yaml"
    path.write_bytes(raw)
    with pytest.raises(ParametersInvalid) as err:
        load_params(path)
    assert str(path) in str(err.value) and "UTF-8" in str(err.value)


def test_a_huge_parameter_file_is_refused_before_it_is_parsed(tmp_path):
    path = write(tmp_path, yaml.safe_dump(GOOD) + "#" * (1024 * 1024) + "\n")
    with pytest.raises(ParametersInvalid) as err:
        load_params(path)
    assert str(path) in str(err.value) and "1 MiB" in str(err.value)


@pytest.mark.parametrize("key", ["talosconfig", "kubeconfig"])
def test_missing_config_paths_of_a_real_cluster_are_refused_at_load(tmp_path, key):
    present = tmp_path / "present"
    present.write_text("x")
    missing = tmp_path / "nowhere" / key
    data = {
        **GOOD,
        "target": "cluster",
        "talosconfig": str(present),
        "kubeconfig": str(present),
        key: str(missing),
    }
    (problem,) = problems(tmp_path, data)
    assert problem.startswith(f"{tmp_path}/cluster.yaml: {key}:") and str(missing) in problem
    assert "no such file" in problem
    data["target"] = (
        "simulated"  # checked when the run connects: one made on the simulator cannot exist before
    )
    assert load_params(write(tmp_path, data)).target == "simulated"


def test_a_tilde_config_path_is_expanded_when_checked(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".talos").mkdir()
    (tmp_path / ".talos" / "config").write_text("x")
    data = {**GOOD, "target": "cluster", "talosconfig": "~/.talos/config"}
    assert load_params(write(tmp_path, data)).talosconfig == "~/.talos/config"


def test_an_unknown_scenario_suggests_the_close_one_and_lists_all(tmp_path):
    (problem,) = problems(tmp_path, {**GOOD, "simulation": {"scenario": "frsh"}})
    assert problem.startswith(f"{tmp_path}/cluster.yaml: simulation.scenario:")
    assert "did you mean 'fresh'" in problem and "gpu-ready" in problem and "chaos" in problem


def test_the_models_scenario_list_is_the_simulators():
    # The library may not import runbook_lib.sim (import-linter), so the model keeps its own copy.
    from runbook_lib.model.params import SIM_SCENARIOS
    from runbook_lib.sim.scenarios import SCENARIOS

    assert list(SIM_SCENARIOS) == list(SCENARIOS)


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("simulation: {latency_ms: .inf}", "simulation.latency_ms"),
        ("simulation: {latency_ms: .nan}", "simulation.latency_ms"),
        ("simulation: {latency_ms: 1.0e+300}", "simulation.latency_ms"),
        ("timeouts: {upgrade_seconds: 100000000000}", "timeouts.upgrade_seconds"),
        ("timeouts: {kubernetes_seconds: 999999999}", "timeouts.kubernetes_seconds"),
        ("cuda_test: {timeout_seconds: 99999999999999999999}", "cuda_test.timeout_seconds"),
        ("rollout_concurrency: true", "rollout_concurrency"),
        ("timeouts: {node_ready_seconds: true}", "timeouts.node_ready_seconds"),
    ],
)
def test_infinite_absurd_or_boolean_numbers_are_refused(tmp_path, text, key):
    (problem,) = problems(tmp_path, yaml.safe_dump(GOOD) + text + "\n")
    assert problem.startswith(f"{tmp_path}/cluster.yaml: {key}:")


@pytest.mark.parametrize(
    ("address", "needle"),
    [
        ("10.5.0.11;touch${IFS}/x", "IPv4"),
        ("../../../etc/x", "IPv4"),
        ("--talosconfig=/x", "IPv4"),
        ("[fd00::11]", "without brackets"),
        ("10.5.0.256", "IPv4"),
        ("-n", "IPv4"),
    ],
)
def test_node_addresses_must_be_ip_addresses_or_hostnames(tmp_path, address, needle):
    (problem,) = problems(tmp_path, {**GOOD, "nodes": [{"name": "gpu-1", "address": address}]})
    assert problem.startswith(f"{tmp_path}/cluster.yaml: nodes[0].address:") and needle in problem


@pytest.mark.parametrize("address", ["10.5.0.11", "fd00::11", "gpu-1.lab.example.com", "gpu1", "GPU-1.Lab"])
def test_ip_addresses_and_hostnames_are_accepted(tmp_path, address):
    params = load_params(write(tmp_path, {**GOOD, "nodes": [{"name": "gpu-1", "address": address}]}))
    assert params.nodes[0].address == address


@pytest.mark.parametrize("section", ["device_plugin", "gpu_operator"])
def test_the_default_namespace_is_refused(tmp_path, section):
    # NVIDIA/k8s-device-plugin deployments/helm/nvidia-device-plugin/templates/validation.yml (chart
    # 0.13.0 on, incl. 0.17.2/0.18.0): "Running in the 'default' namespace is not recommended" unless
    # allowDefaultNamespace=true; and the runbook labels the namespace enforce=privileged (reality-gaps §21),
    # which must never happen to `default`.  The GPU Operator chart has no such check that we found: refusing
    # it there is this project's choice, for the label.
    (problem,) = problems(tmp_path, {**GOOD, section: {"namespace": "default"}})
    assert problem.startswith(f"{tmp_path}/cluster.yaml: {section}.namespace:") and "'default'" in problem


@pytest.mark.parametrize("section", ["device_plugin", "gpu_operator"])
@pytest.mark.parametrize("name", ["NVDP", "gpu_operator", "-nvdp", "a" * 54])
def test_a_release_name_helm_would_refuse_is_refused_naming_the_parameter(tmp_path, section, name):
    # helm@v4.1.4 pkg/chart/v2/util/validate_name.go:35,60: lowercase DNS-style names of at most 53 characters
    (problem,) = problems(tmp_path, {**GOOD, section: {"release": name}})
    assert problem.startswith(f"{tmp_path}/cluster.yaml: {section}.release:") and "at most 53" in problem


def test_a_release_name_as_nvidia_installs_the_charts_is_accepted(tmp_path):
    data = {
        **GOOD,
        "device_plugin": {"release": "nvdp"},
        "gpu_operator": {"release": "gpu-operator-1764892800"},
    }
    params = load_params(write(tmp_path, data))
    assert (params.device_plugin.release, params.gpu_operator.release) == ("nvdp", "gpu-operator-1764892800")


def test_a_boolean_where_a_number_belongs_says_so(tmp_path):
    # YAML reads `true` as a bool and Python's bool is an int: pydantic's lax mode took it as 1.
    (problem,) = problems(tmp_path, yaml.safe_dump(GOOD) + "rollout_concurrency: true\n")
    assert "a whole number, not true or false" in problem


@pytest.mark.parametrize("number", ["9" * 5000, "0x" + "f" * 50_000], ids=["decimal", "hex"])
def test_a_number_too_long_to_be_a_parameter_is_refused_naming_its_line(tmp_path, number):
    # Python refuses int() of more than 4,300 digits, and repr() of a bigger hex value: both were tracebacks.
    path = write(tmp_path, yaml.safe_dump(GOOD) + f"rollout_concurrency: {number}\n")
    with pytest.raises(ParametersInvalid) as err:
        load_params(path)
    (problem,) = [str(p) for p in err.value.problems]
    assert problem.startswith(f"{path}: line 6") and "number" in problem


def test_an_overlong_value_is_not_echoed_in_full(tmp_path):
    (problem,) = problems(tmp_path, {**GOOD, "cluster": "x" * 100_000})
    assert problem.startswith(f"{tmp_path}/cluster.yaml: cluster:") and len(problem) < 400


@pytest.mark.parametrize("version", ["v26.3.0", "25.10.1", "v24.9.2"])
def test_a_gpu_operator_older_than_the_talos_docs_support_is_refused_naming_the_parameter(tmp_path, version):
    # Talos docs 1.13 "NVIDIA GPU (OSS drivers)": "Make sure to install GPU operator version v26.3.1 or higher"
    # (facts §1.5, siderolabs/docs 4e9a921). The pin was taken as given, and the step installed it.
    (problem,) = problems(tmp_path, {**GOOD, "gpu_operator": {"chart_version": version}})
    assert problem.startswith(f"{tmp_path}/cluster.yaml: gpu_operator.chart_version:"), problem
    assert "v26.3.1 or higher" in problem and version in problem


@pytest.mark.parametrize("version", ["v26.3.1", "v26.7.0", "26.3.3", ">=v26.3.1", "~26.3"])
def test_a_supported_gpu_operator_version_or_a_range_is_accepted(tmp_path, version):
    params = load_params(write(tmp_path, {**GOOD, "gpu_operator": {"chart_version": version}}))
    assert params.gpu_operator.chart_version == version


def test_on_the_simulator_a_named_kubeconfig_is_the_one_the_tools_use(tmp_path, request):
    """Walkthrough, 6 Dec 2026: ``--set kubeconfig=<a read-only service account's>`` on ``target: simulated`` was
    ignored without a word (helm ran with the simulator's admin kubeconfig) while the record's parameters named
    it, so the record misstated who made the plan."""
    from runbook_lib.errors import PermanentError
    from runbook_lib.steps.context import resolve_endpoints

    def kubeconfig(path, server):
        path.write_text(
            f"clusters: [{{name: c, cluster: {{server: '{server}'}}}}]\n"
            "contexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n"
            "users: [{name: u, user: {token: t}}]\n"
        )
        return path

    state = tmp_path / "sim"
    state.mkdir()
    factory = socket.create_server(("127.0.0.1", 0))  # the simulator's factory answers: it is running
    request.addfinalizer(factory.close)
    (state / "endpoints.json").write_text(f'{{"factory": "http://127.0.0.1:{factory.getsockname()[1]}"}}')
    kubeconfig(state / "kubeconfig", "https://127.0.0.1:40001")
    mine = kubeconfig(tmp_path / "reader.kubeconfig", "https://127.0.0.1:40001")
    data = {**GOOD, "target": "simulated"}
    own = resolve_endpoints(load_params(write(tmp_path, data)), state).kubeconfig
    assert own == str(state / "kubeconfig")
    named = load_params(write(tmp_path, {**data, "kubeconfig": str(mine)}))
    assert resolve_endpoints(named, state).kubeconfig == str(mine)
    # a real cluster's kubeconfig is refused (review: --set target=simulated on production's parameter file)
    real = kubeconfig(tmp_path / "prod.kubeconfig", "https://prod.example:6443")
    prod = load_params(write(tmp_path, {**data, "kubeconfig": str(real)}))
    with pytest.raises(
        PermanentError, match=re.escape("points at https://prod.example:6443, not at https://127.0.0.1:40001")
    ):
        resolve_endpoints(prod, state)


def test_a_stopped_simulated_cluster_is_named_not_its_nodes_called_unreachable(tmp_path: Path) -> None:
    """Its endpoints file outlives a stopped simulator (`runbook run` stops the one it started): a notebook then
    reported every node "connection refused" with "bring the node back (power, network …)" as the fix
    (cloud-user walkthrough, 7 Dec 2026)."""
    from runbook_lib.errors import PermanentError
    from runbook_lib.steps.context import connect, resolve_endpoints

    closed = socket.create_server(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing answers there now
    state = tmp_path / "sim"
    state.mkdir()
    (state / "endpoints.json").write_text(f'{{"factory": "http://127.0.0.1:{port}"}}')
    params = load_params(write(tmp_path, {**GOOD, "target": "simulated"}))
    with pytest.raises(PermanentError) as raised:
        connect(params, state_dir=state)
    assert f"the simulated cluster at {state} is stopped" in raised.value.message
    assert f"runbook sim up --keep --state {state} -p <params file>" in (raised.value.hint or "")
    # the record's secret scrub reads the endpoints' files whether or not the simulator runs (review of 4421311)
    assert resolve_endpoints(params, state).talosconfig == str(state / "talosconfig")


def test_every_impossible_combination_is_reported_at_once() -> None:
    """README audit (stop 50): a track on Talos 1.7 was reported, and the GPU Operator on 1.7 only once the track
    was fixed, though the README promises every problem at once."""
    data = yaml.safe_load((Path(__file__).resolve().parents[1] / "params" / "simulated.yaml").read_text())
    data |= {"talos_version": "v1.7.0", "track": "lts", "kubernetes_layer": "gpu-operator"}
    with pytest.raises(ParametersInvalid) as raised:
        validate(data, source="p.yaml")
    assert [p.path for p in raised.value.problems] == ["track", "kubernetes_layer"], raised.value.problems


def test_an_extension_without_its_publisher_is_a_parameter_problem(tmp_path):
    """A bare ``nvidia-nope`` in extra_extensions failed at the plan, after ``runbook run`` had started the
    simulated cluster (13 s, walkthrough, stop 52): it is a parameter problem now, naming the field, the
    cluster-wide list and a node's overrides alike."""
    base = {"cluster": "a", "talos_version": "v1.12.7", "nodes": [{"name": "n1", "address": "10.0.0.1"}]}
    found = problems(tmp_path, {**base, "extra_extensions": ["iscsi-tools"]})
    assert any("extra_extensions[0]" in p and "siderolabs/iscsi-tools" in p for p in found), found
    node = {"name": "n1", "address": "10.0.0.1", "overrides": {"extra_extensions": ["siderolabs/zfs", "/x"]}}
    found = problems(tmp_path, {**base, "nodes": [node]})
    assert any("extra_extensions[1]" in p and "publisher" in p for p in found), found
    assert load_params(
        write(tmp_path, {**base, "extra_extensions": ["siderolabs/iscsi-tools"]})
    ).extra_extensions


def test_a_dangling_symlink_is_not_suggested_as_itself(tmp_path):
    """``os.open`` finds no file behind a dangling symlink, which the folder still lists: the suggestion named the
    same path (review of 76b3d0f)."""
    (tmp_path / "cluster.yaml").symlink_to(tmp_path / "gone.yaml")
    with pytest.raises(ParametersInvalid, match="file not found") as caught:
        load_params(tmp_path / "cluster.yaml")
    assert "did you mean" not in str(caught.value)


def test_a_credential_in_a_url_is_neither_echoed_nor_accepted_for_the_factory() -> None:
    """Operator walkthrough (stop 54): a refused ``repo_url`` with ``ci:<password>@`` echoed the password twice
    (the --set and ``got …``), and ``image_factory_url`` with one was accepted, to be recorded in params.yaml and
    printed in fixes."""
    from runbook_lib.errors import RunbookError
    from runbook_lib.model.params import load_params

    params = Path(__file__).resolve().parents[1] / "params" / "simulated.yaml"
    cases = [
        "gpu_operator.repo_url=http://ci:hunter2secret@charts.example.com/nvidia",
        "image_factory_url=https://ci:hunter2secret@factory.example.com",
        "image_factory_url=https://factory.example.com/?token=hunter2secret",
    ]
    for item in cases:
        with pytest.raises(RunbookError) as info:
            load_params(params, [item], {})
        said = str(info.value)
        assert "hunter2secret" not in said and "***REDACTED***" in said, said
        assert item.split("=", 1)[0] in said, said
    assert "must not carry credentials" in said
    assert load_params(params, ["image_factory_url=https://factory.example.com/"], {}).image_factory_url == (
        "https://factory.example.com"
    )


def test_a_duplicate_a_set_made_names_the_set_and_both_nodes() -> None:
    """Operator walkthrough (stop 54): ``--set nodes.1.address=10.5.0.13`` was refused as ``<file>: nodes[2].address:
    duplicate``, naming the file's right value, not the --set."""
    from runbook_lib.errors import RunbookError
    from runbook_lib.model.params import load_params

    params = Path(__file__).resolve().parents[1] / "params" / "simulated.yaml"
    with pytest.raises(RunbookError) as info:
        load_params(params, ["nodes.1.address=10.5.0.13"], {})
    assert (
        "--set nodes.1.address=10.5.0.13: nodes[1].address: duplicate node address '10.5.0.13' (nodes[2].address "
        "has it too)"
    ) in str(info.value), str(info.value)
