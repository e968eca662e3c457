"""``runbook sim up --keep``: the simulator's servers started again on the cluster a run left, nothing created.

Found while checking a rollback's ``kubectl label`` command by hand: ``runbook run`` stops the simulator it
started, and ``runbook sim up`` created a new cluster, so what a run left could not be looked at with the real
talosctl and kubectl. Here a run patches the nodes; ``--keep`` brings them back with that patch, and a label set
with the real kubectl survives a ``sim down`` / ``sim up --keep`` (the real control plane resumes its etcd data).
"""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import pytest

from runbook_lib.cli import cmd_run, main
from runbook_lib.sim import cluster as sim_cluster
from tests.realplane import use_real_plane

REPO = Path(__file__).resolve().parents[1]
PARAMS = str(REPO / "params" / "simulated.yaml")


def _tool(state: Path, name: str, *args: str) -> str:
    config = ["--talosconfig", str(state / "talosconfig")] if name == "talosctl" else []
    config = config or ["--kubeconfig", str(state / "kubeconfig")]
    argv = [str(state / "bin" / name), *config, *args]
    return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=120).stdout


@pytest.mark.slow
def test_keep_starts_the_cluster_a_run_left_and_refuses_to_make_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    use_real_plane(monkeypatch)
    state = tmp_path / "sim"
    place = ["--records", str(tmp_path / "records"), "--state", str(state)]
    assert main(["run", "-p", PARAMS, *place, "--steps", "config-patch", "--apply", "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["sim", "up", "--keep", "--state", str(state)]) == 0
    assert "(v1.12.7, created as scenario fresh, as runs left it)" in capsys.readouterr().out
    try:
        config = _tool(state, "talosctl", "-n", "10.5.0.11", "get", "machineconfig", "-o", "yaml")
        assert "nvidia_uvm" in config  # the run's modules patch: not a new cluster
        _tool(state, "kubectl", "label", "node", "gpu-worker-1", "kept=yes")
        capsys.readouterr()
        # as if a run had started it: that run would stop it when it ends, so --keep takes it over (review)
        mark = cmd_run.SimLeases.of(state.resolve()).started
        mark.write_text(str(sim_cluster.daemon_pid(state)), encoding="utf-8")
        running = ["sim", "up", "--keep", "--state", str(state), "-p", PARAMS]
        assert main(running) == 0  # running: left as it is
        assert capsys.readouterr().out.startswith(f"already running: the simulated cluster at {state}")
        assert not mark.exists()
        assert main(["sim", "down", "--state", str(state)]) == 0
        assert main(["sim", "up", "--keep", "--state", str(state)]) == 0
        labels = _tool(
            state, "kubectl", "get", "node", "gpu-worker-1", "-o", "jsonpath={.metadata.labels.kept}"
        )
        assert labels == "yes"
    finally:
        main(["sim", "down", "--state", str(state)])
    capsys.readouterr()
    assert main(["sim", "up", "--keep", "--state", str(state), "--scenario", "gpu-ready"]) == 2
    assert (
        "--keep starts the cluster as it was created; --scenario would make another one"
        in capsys.readouterr().err
    )
    other = tmp_path / "other.yaml"
    other.write_text(Path(PARAMS).read_text().replace("scenario: fresh", "scenario: gpu-ready"))
    assert main(["sim", "up", "--keep", "--state", str(state), "-p", str(other)]) == 2
    assert "made for other parameters than" in capsys.readouterr().err
    assert main(["sim", "up", "--keep", "--state", str(tmp_path / "none")]) == 2
    assert f"no simulated cluster at {tmp_path / 'none'} to keep" in capsys.readouterr().err


@pytest.mark.slow
def test_a_fault_simnode_reads_at_its_start_is_refused_while_it_runs_with_the_commands_that_switch_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by an operator walkthrough: ``sim fault --clear gpu-worker-3 upgrade_fails`` printed "cleared" while
    simnode kept failing the upgrade (it switches only ``unreachable`` while it runs); the fix command failed
    again. Clearing is refused as setting is, and the commands the hint gives clear it for simnode."""
    use_real_plane(monkeypatch)
    state = tmp_path / "sim"
    assert main(["sim", "up", "-p", PARAMS, "--scenario", "upgrade-fails", "--state", str(state)]) == 0
    try:
        before = json.loads((state / "simnode-nodes.json").read_text())["nodes"]
        assert [n["name"] for n in before if n.get("fail_install")] == ["gpu-worker-3"]
        capsys.readouterr()
        assert main(["sim", "fault", "--state", str(state), "--clear", "gpu-worker-3", "upgrade_fails"]) == 2
        err = capsys.readouterr().err
        assert "switches only 'unreachable' while it runs" in err, err
        hint = err.split("hint: ", 1)[1].split(" (the nodes keep", 1)[0]
        commands = [shlex.split(c) for c in hint.split("; ")]
        assert [c[:3] for c in commands] == [
            ["runbook", "sim", "down"],
            ["runbook", "sim", "fault"],
            ["runbook", "sim", "up"],
        ]
        for argv in commands:
            assert main(argv[1:]) == 0, argv
        nodes = json.loads((state / "simnode-nodes.json").read_text())["nodes"]
        assert not any(n.get("fail_install") for n in nodes), nodes  # what simnode reads: cleared
    finally:
        main(["sim", "down", "--state", str(state)])


def test_a_plain_sim_up_says_which_cluster_it_replaces(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A plain ``sim up`` on a state directory that holds a cluster creates a new one: what runs had changed on
    the old one went without a word (operator walkthrough, 6 Dec 2026); it now names what it replaced and
    ``--keep``. The first ``sim up`` into an empty directory says nothing of the kind."""
    state = tmp_path / "sim"
    up = ["sim", "up", "--no-daemon", "--state", str(state), "--nodes", "1", "--talos-version", "v1.12.7"]
    assert main([*up, "--scenario", "fresh"]) == 0
    assert "replaced" not in capsys.readouterr().out
    assert main([*up, "--scenario", "gpu-ready"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(
        f"replaced the simulated cluster at {state} (Talos v1.12.7, created as scenario fresh): what runs had "
        "changed on it is gone; `runbook sim up --keep` starts a cluster as runs left it\n"
    ), out
    assert "scenario gpu-ready" in out
    # `sim status` said "scenario: fresh" of nodes runs had patched (walkthrough): the scenario is how it began
    assert main(["sim", "status", "--state", str(state)]) == 0
    assert (
        "\nscenario:    created as gpu-ready (the nodes below are as runs left them)\n"
        in capsys.readouterr().out
    )
