"""Every fault scenario with the real talosctl v1.12.0 against simnode (issue 14: "every existing fault scenario
stops at the right step on the faulty node only").

``runbook run -p params/simulated.yaml --apply --set simulation.scenario=<s>`` with ``RUNBOOK_SIM_TALOSCTL=real``:
simnode serves nodes carrying each scenario's faults (``runbook_lib/sim/realfaults.py`` maps them, citing the
source of each behaviour or saying there is none), and the run must stop at the step, on the node, with the
diagnosis ``tests/fault_cases.py`` expects of the Python talosctl too. The Kubernetes side is the one ``runbook
sim up`` picks (``RUNBOOK_SIM_KUBE`` unset: the real control plane, issue 15's one truth; the Python API server
these Talos faults used to run on for speed was retired): the four Talos steps read Kubernetes only for verify's
optional allocatable count, and on 1.13 for talosctl's drain.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from runbook_lib.sim import cluster, realfaults, realtalos
from runbook_lib.sim.scenarios import SCENARIOS
from runbook_lib.sim.state import SimNode, load_node
from tests.fault_cases import RUN_CASES, STEPS, assert_fails_on_one_node
from tests.sim.test_real_talosctl import build
from tests.sim.test_sim_up_real_talosctl import real_env, runbook, step_lines

#: A hung boot fails after Talos's BootTimeout (70 min) x 0.005 = 21 s; talosctl's --timeout (upgrade_seconds)
#: comes later, so a healthy node's upgrade has room on a loaded machine and the hang ends in the rollback.
TIME_SCALE = "0.005"
UPGRADE_SECONDS = 120
#: How long the image step waits for an upgraded node to show the planned schematic (a faulty node never does).
NODE_READY_SECONDS = 15


#: A boot hung on ext-nvidia-persistenced: the real talosctl's error names no service (startAllServices fails with
#: the conditions' multierror, one "context deadline exceeded" per service still waiting: talos@v1.12.0
#: v1alpha1_sequencer_tasks.go StartAllServices, pkg/conditions/all.go), but before it the tracker printed the new
#: boot's service events (action/node.go:303-307), where the service's last one is "Waiting for file …": the image
#: step names it with Talos's condition text, 'service "ext-nvidia-persistenced" to be "up"', the needle the
#: Python talosctl's run is held to as well.
REAL_CASES = RUN_CASES


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_every_fault_of_every_scenario_is_simnode_state(tmp_path: Path, scenario: str) -> None:
    """No scenario of ``runbook sim scenarios`` falls back to the Python talosctl: simnode maps each fault."""
    nodes = cluster.create(
        tmp_path / "state", cluster.ClusterSpec(workers=4, talos_version="v1.12.7", scenario=scenario)
    )
    assert {n.name: realfaults.unsupported(n) for n in nodes if realfaults.unsupported(n)} == {}


def test_a_fault_simnode_does_not_map_falls_back_to_the_python_talosctl_saying_which(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(realtalos.MODE_ENV, raising=False)
    monkeypatch.setattr(
        realtalos, "choose", lambda *_a, **_kw: realtalos.Choice(True, "real", "talosctl", "simnode")
    )
    monkeypatch.setattr(realtalos, "start", lambda *_a: pytest.fail("simnode must not start"))
    node = SimNode(name="n", address="10.5.0.3", talos_version="v1.12.7", faults={"gpu_on_fire": True})
    choice = realtalos.up(
        tmp_path, [node], talos_version="v1.12.7", talosctl_version=None, scenario="fresh", latency_ms=0
    )
    assert choice == realtalos.Choice(
        False, "Python talosctl: faults gpu_on_fire are not simulated by simnode yet"
    )


FIELDS = {
    "unreachable-node": {"down": "connection-refused"},
    "slow-node": {"latency_ms": 2000},
    "unsupported-gpu": {"nvidia_probe_fails": True},
    "upgrade-hangs": {"nvidia_probe_fails": True},
    "upgrade-fails": {"fail_install": True},
}


def scenario_nodes(tmp: Path, scenario: str) -> list[dict[str, Any]]:
    """simnode's nodes file for the scenario on a control plane and three GPU workers (the last one faulty)."""
    state = tmp / "state"
    nodes = cluster.create(state, cluster.ClusterSpec(workers=3, talos_version="v1.12.7", scenario=scenario))
    doc = realtalos.nodes_document(state, nodes, 0)
    entries: list[dict[str, Any]] = doc["nodes"]
    for entry in entries:
        entry["image_extensions"] = [e["name"] for e in doc["images"][entry["image"]]["extensions"]]
    return entries


@pytest.mark.parametrize("scenario", sorted(FIELDS))
def test_a_fault_is_simnode_state_of_the_faulty_node_only(tmp_path: Path, scenario: str) -> None:
    *healthy, faulty = scenario_nodes(tmp_path, scenario)
    assert FIELDS[scenario].items() <= faulty.items()
    for entry in healthy:
        assert {k: entry.get(k) for k in FIELDS[scenario]} in (
            {"latency_ms": 0},
            dict.fromkeys(FIELDS[scenario]),
        )


@pytest.mark.parametrize(
    ("scenario", "replacement"),
    [("toolkit-missing", None), ("driver-mismatch", "nvidia-container-toolkit-production")],
)
def test_an_extension_fault_follows_the_node_not_its_image(
    tmp_path: Path, scenario: str, replacement: str | None
) -> None:
    """The image the faulty node boots installs the schematic's lts toolkit (another node upgraded to it gets
    that), and the node's own ``extension_faults`` drop or replace it on every image it boots."""
    *healthy, faulty = scenario_nodes(tmp_path, scenario)
    assert "nvidia-container-toolkit-lts" in faulty["image_extensions"]
    [fault] = faulty["extension_faults"]
    assert fault["name"] == "nvidia-container-toolkit-lts"
    assert fault.get("replace", {}).get("name") == replacement
    assert not any("extension_faults" in entry for entry in healthy)


def test_chaos_puts_each_fault_on_its_own_worker(tmp_path: Path) -> None:
    _cp, *workers = scenario_nodes(tmp_path, "chaos")
    assert [[w.get("down"), w["latency_ms"], w.get("nvidia_probe_fails")] for w in workers] == [
        ["no-route-to-host", 0, None],
        [None, 1500, None],
        [None, 0, True],
    ]


def run_scenario(tmp: Path, scenario: str, talos: str = "v1.12.7") -> tuple[Any, Path]:
    env = real_env(tmp) | {"RUNBOOK_SIM_TIME_SCALE": TIME_SCALE}
    client = realtalos.talosctl_version_for(talos)
    build("build-talosctl.sh", client)  # skips without go; cached: instant
    state = tmp / "state"
    proc = runbook(
        env,
        "run",
        "-p",
        "params/simulated.yaml",
        "--apply",
        "--state",
        str(state),
        "--no-progress",
        "--steps",
        ",".join(STEPS),
        "--set",
        f"talos_version={talos}",
        "--set",
        f"simulation.scenario={scenario}",
        "--set",
        f"timeouts.upgrade_seconds={UPGRADE_SECONDS}",
        "--set",
        f"timeouts.node_ready_seconds={NODE_READY_SECONDS}",
    )
    assert f"simulated Talos nodes: real talosctl {client} against simnode" in proc.stderr, proc.stderr
    return proc, state


def step_result(tmp: Path, step: str) -> dict[str, Any]:
    [path] = (tmp / "records").glob(f"*/results/{step}.json")
    result: dict[str, Any] = json.loads(path.read_text())["result"]
    return result


def assert_stops_at_the_right_step_on_the_faulty_node_only(
    tmp: Path, scenario: str, talos: str
) -> dict[str, Any] | None:
    """The run of ``scenario`` on ``talos`` nodes stops at the step ``RUN_CASES`` expects (every step before it
    ok or changed, none after it run), with only the faulty node failed and its diagnosis; returns that node's
    result (``None`` for a scenario that passes)."""
    expected, needle = REAL_CASES[scenario]
    proc, _state = run_scenario(tmp, scenario, talos)
    lines = step_lines(proc.stdout)
    outcomes = [lines.get(step) for step in STEPS]
    stop = STEPS.index(expected) if expected else len(STEPS)
    assert set(outcomes[:stop]) <= {"ok", "changed"}, proc.stdout + proc.stderr
    if expected is None:
        assert proc.returncode == 0 and None not in outcomes, proc.stdout + proc.stderr
        return None
    assert proc.returncode != 0 and outcomes[stop:] == ["failed"] + [None] * (len(STEPS) - stop - 1), (
        proc.stdout
    )
    records = sorted(str(r.relative_to(tmp)) for r in (tmp / "records").glob(f"*/results/{expected}.json"))
    assert len(records) == 1, (
        f"{records}: {proc.stdout}{proc.stderr}"
    )  # once none, under load: what the run said
    failing = assert_fails_on_one_node(step_result(tmp, expected), needle)
    # scenarios.py breaks the last worker; chaos takes the first one down (and breaks others preflight never reaches)
    assert failing["node"] == ("gpu-worker-1" if scenario == "chaos" else "gpu-worker-3"), failing["node"]
    return failing


@pytest.mark.slow
@pytest.mark.parametrize("scenario", sorted(REAL_CASES))
def test_runbook_run_with_the_real_talosctl_stops_at_the_right_step_on_the_faulty_node_only(
    tmp_path: Path, scenario: str
) -> None:
    assert_stops_at_the_right_step_on_the_faulty_node_only(tmp_path, scenario, "v1.12.7")


#: The Talos-side scenarios on Talos 1.13 with the real talosctl v1.13.0, where the upgrade goes through the
#: LifecycleService and talosctl drains each node through Kubernetes before its reboot (``--drain`` by default,
#: talos@v1.13.0:cmd/talosctl/cmd/talos/upgrade.go:69-71,360; here through the real control plane, as
#: test_real_talos_113's run): a dead node, an install that fails, a boot that hangs after the install and drain,
#: and a node that boots another toolkit than its schematic's.
#: Each with what talosctl v1.13.0 itself prints for the faulty node, where it differs from 1.12's legacy API: the
#: installer's exit code streamed back (talos@v1.13.0:internal/app/lifecycle/container.go:212-221) reported by
#: talosctl as "<node>: upgrade failed with exit code 1" (cmd/talosctl/cmd/talos/upgrade.go:216-224).
TALOS_113_CASES = {
    "driver-mismatch": "",
    "unreachable-node": "",
    "upgrade-fails": "10.5.0.13: upgrade failed with exit code 1",
    "upgrade-hangs": "",
}


@pytest.mark.slow
@pytest.mark.parametrize("scenario", sorted(TALOS_113_CASES))
def test_on_talos_1_13_the_real_talosctl_run_stops_at_the_right_step_on_the_faulty_node_only(
    tmp_path: Path, scenario: str
) -> None:
    """The image step's healthy nodes went through talosctl's drain (its own lines in the step's record): the
    run took 1.13's path, not the legacy API's."""
    failing = assert_stops_at_the_right_step_on_the_faulty_node_only(tmp_path, scenario, "v1.13.0")
    assert failing is not None
    assert TALOS_113_CASES[scenario] in json.dumps(failing), failing
    if REAL_CASES[scenario][0] == "image":
        [record] = (tmp_path / "records").glob("*/results/image.json")
        image = record.read_text()
        assert "gpu-worker-1: node drained" in image and "gpu-worker-1: node uncordoned" in image


@pytest.mark.slow
def test_sim_fault_refuses_a_talos_fault_simnode_cannot_switch_while_it_runs(tmp_path: Path) -> None:
    """``runbook sim fault NODE slow_ms 500`` wrote the fault into the Python node file, which simnode never reads
    again (its SIGHUP applies ``down`` only): the real talosctl kept answering at full speed while ``sim status``
    and the node file said the node was slow. Refused now, naming what works, and nothing is written."""
    env = real_env(tmp_path)
    state = tmp_path / "state"
    up = runbook(env, "sim", "up", "-p", "params/simulated.yaml", "--state", str(state))
    try:
        assert up.returncode == 0, up.stderr
        before = load_node(state, "gpu-worker-2").faults
        proc = runbook(env, "sim", "fault", "--state", str(state), "gpu-worker-2", "slow_ms", "500")
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert "slow_ms" in proc.stderr and "RUNBOOK_SIM_TALOSCTL=python" in proc.stderr, proc.stderr
        assert load_node(state, "gpu-worker-2").faults == before
        kube = runbook(env, "sim", "fault", "--state", str(state), "gpu-worker-2", "pods_pending", "true")
        assert kube.returncode == 0, kube.stderr  # the node agent's Kubernetes faults still switch
    finally:
        runbook(env, "sim", "down", "--state", str(state))
