"""``runbook sim up|status|down``, the daemon, the shared state API and the named scenarios."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from runbook_lib.model.params import load_params
from runbook_lib.sim import cluster, realtalos, scenarios
from runbook_lib.sim.state import (
    Gpu,
    load_node,
    load_nodes,
    locked_node,
    normalize_talos_version,
    runtime,
    save_node,
    sim_paths,
)
from runbook_lib.sim.talosctl import images


def runbook(*args: str, umask: int = -1) -> subprocess.CompletedProcess[str]:
    """``runbook ARGS`` in a fresh process (``umask``: the child's, -1 for this process's)."""
    return subprocess.run(
        [sys.executable, "-m", "runbook_lib", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        umask=umask,
    )


@pytest.mark.slow
def test_sim_up_status_down(tmp_path: Path) -> None:
    state = tmp_path / "state"
    r = runbook("sim", "up", "--state", str(state), "--nodes", "2", "--talos-version", "1.13")
    try:
        assert r.returncode == 0, r.stderr
        paths = sim_paths(state)
        assert f"talosconfig: {paths.talosconfig}" in r.stdout
        assert f"talosctl:    {paths.bin_dir / 'talosctl'}" in r.stdout
        endpoints = json.loads(paths.endpoints.read_text())
        pid = endpoints["pid"]
        os.kill(pid, 0)  # the daemon runs
        if "factory" in endpoints:
            with urllib.request.urlopen(endpoints["factory"] + "/versions", timeout=5) as resp:
                assert resp.status == 200
        if "kube" in endpoints:
            assert paths.kubeconfig.exists()
            kc = yaml.safe_load(paths.kubeconfig.read_text())
            assert kc["clusters"][0]["cluster"]["server"] == endpoints["kube"]
        status = runbook("sim", "status", "--state", str(state), "--json")
        info = json.loads(status.stdout)
        tc = yaml.safe_load(paths.talosconfig.read_text())
        ctx = tc["contexts"][tc["context"]]
        if info["talosctl"].startswith("real talosctl"):
            # the real talosctl reaches the nodes through simnode's apid front, the endpoint it listens on
            front = (realtalos.paths(state).dir / "endpoint").read_text().strip()
            assert ctx["endpoints"] == [front], (ctx, front)
        else:
            assert ctx["endpoints"] == ["10.5.0.2"] and ctx["nodes"] == ["10.5.0.2"]
        assert info["daemon_pid"] == pid
        assert [n["role"] for n in info["nodes"]] == ["controlplane", "worker", "worker"]
        v = subprocess.run(
            [
                str(paths.bin_dir / "talosctl"),
                "--talosconfig",
                str(paths.talosconfig),
                "version",
                "--short",
                "-n",
                "10.5.0.3",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        assert v.returncode == 0 and "v1.13.9" in v.stdout
    finally:
        down = runbook("sim", "down", "--state", str(state))
    assert down.returncode == 0 and down.stdout == "simulator stopped\n"
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail("daemon still running after sim down")
    assert sim_paths(state).talosconfig.exists()  # state is kept without --purge
    assert runbook("sim", "down", "--state", str(state), "--purge").returncode == 0
    assert not state.exists()


def test_sim_up_without_daemon_and_bad_input(tmp_path: Path) -> None:
    r = runbook(
        "sim", "up", "--state", str(tmp_path), "--no-daemon", "--nodes", "1", "--scenario", "gpu-ready"
    )
    assert r.returncode == 0, r.stderr
    assert not sim_paths(tmp_path).endpoints.exists()
    r = runbook("sim", "up", "--state", str(tmp_path), "--no-daemon", "--talos-version", "2.99")
    assert r.returncode == 2 and "unknown Talos minor version" in r.stderr


def test_sim_fault_command(tmp_path: Path) -> None:
    cluster.create(tmp_path, cluster.ClusterSpec(workers=1))
    r = runbook("sim", "fault", "--state", str(tmp_path), "10.5.0.3", "slow_ms", "250")
    assert r.returncode == 0, r.stderr
    assert load_node(tmp_path, "10.5.0.3").faults == {"slow_ms": 250}
    runbook("sim", "fault", "--state", str(tmp_path), "10.5.0.3", "slow_ms", "--clear")
    assert load_node(tmp_path, "10.5.0.3").faults == {}


def test_state_round_trip_and_lookup_by_address(tmp_path: Path) -> None:
    nodes = cluster.create(tmp_path, cluster.ClusterSpec(workers=3, talos_version="1.8", gpus_per_worker=2))
    loaded = load_nodes(tmp_path)
    assert loaded == nodes
    assert load_node(tmp_path, "10.5.0.4").name == "talos-worker-2"
    assert len({g.uuid for n in loaded for g in n.gpus}) == 6
    assert all(isinstance(g, Gpu) and g.uuid.startswith("GPU-") for g in loaded[1].gpus)
    with pytest.raises(KeyError):
        load_node(tmp_path, "10.9.9.9")


def test_concurrent_locked_updates_do_not_lose_writes(tmp_path: Path) -> None:
    cluster.create(tmp_path, cluster.ClusterSpec(workers=1))

    def bump() -> None:
        for _ in range(20):
            with locked_node(tmp_path, "10.5.0.3") as n:
                n.boot_count += 1

    threads = [threading.Thread(target=bump) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert load_node(tmp_path, "10.5.0.3").boot_count == 1 + 80


def test_runtime_rules(tmp_path: Path) -> None:
    cluster.create(tmp_path, cluster.ClusterSpec(workers=1, talos_version="1.12"))
    node = load_node(tmp_path, "10.5.0.3")
    scenarios.install_nvidia(tmp_path, node, patch_modules=False)
    rt = runtime(node)
    assert rt.modules_live == {} and rt.toolkit_active and rt.bpf_jit_harden == 2
    assert rt.services["ext-nvidia-persistenced"] == "Waiting"
    scenarios.install_nvidia(tmp_path, node, patch_modules=True)
    rt = runtime(node)
    assert set(rt.modules_live) == {"nvidia", "nvidia_uvm", "nvidia_drm", "nvidia_modeset"}
    assert rt.driver_flavor == "open" and rt.bpf_jit_harden == 1
    assert rt.cri_runtime_handlers == {"runc", "nvidia"} and rt.default_runtime == "runc"
    node.gpus = []
    assert runtime(node).driver_version is None  # nvidia does not bind without a GPU
    save_node(tmp_path, node)


def test_proprietary_track(tmp_path: Path) -> None:
    cluster.create(tmp_path, cluster.ClusterSpec(workers=1, talos_version="1.12"))
    node = load_node(tmp_path, "10.5.0.3")
    sid = scenarios.register_schematic(
        tmp_path,
        ["siderolabs/nonfree-kmod-nvidia-production", "siderolabs/nvidia-container-toolkit-production"],
    )
    _ref, exts = images.resolve(tmp_path, f"factory.talos.dev/installer/{sid}:v1.12.11", {})
    node.extensions = exts
    scenarios.install_nvidia(tmp_path, node, track="production")
    node.extensions = exts
    rt = runtime(node)
    assert rt.driver_flavor == "proprietary"
    assert rt.driver_version == rt.toolkit_driver_version


@pytest.mark.parametrize("name", sorted(scenarios.SCENARIOS))
def test_every_scenario_builds(tmp_path: Path, name: str) -> None:
    nodes = cluster.create(tmp_path, cluster.ClusterSpec(workers=3, talos_version="1.12", scenario=name))
    assert len(nodes) == 4
    if name == "fresh":
        assert all(not n.faults and not n.extensions for n in nodes)
    elif name in (
        "gpu-ready",
        "extensions-no-patch",
        "mixed-fleet",
        "config-patched",
        "aws",
        "storage-extensions",
        "kernel-args-before-1-12",
    ):
        assert all(not n.faults for n in nodes)
    else:
        assert any(n.faults for n in nodes)


def test_version_normalisation() -> None:
    assert normalize_talos_version("1.12") == "v1.12.11"
    assert normalize_talos_version("v1.8.2") == "v1.8.2"
    with pytest.raises(ValueError):
        normalize_talos_version("latest")


def test_thousand_nodes_are_created_and_loaded_quickly(tmp_path: Path) -> None:
    start = time.monotonic()
    cluster.create(tmp_path, cluster.ClusterSpec(workers=1000, talos_version="1.12"))
    created = time.monotonic() - start
    start = time.monotonic()
    nodes = load_nodes(tmp_path)
    loaded = time.monotonic() - start
    assert len(nodes) == 1001
    assert nodes[-1].address == "10.5.3.234"
    assert created < 20 and loaded < 10  # generous bounds for a shared 2-core machine; see benchmarks/


def test_running_context_manager_without_daemon(tmp_path: Path) -> None:
    with cluster.running(tmp_path, cluster.ClusterSpec(workers=1), daemon=False) as paths:
        assert (paths.bin_dir / "talosctl").exists()
        assert len(load_nodes(tmp_path)) == 2
    assert cluster.daemon_pid(tmp_path) is None


def _modes_open_to_others(root: Path) -> list[str]:
    """Everything under ``root`` that a user other than the owner could read, write or enter."""
    found = []
    for entry in [root, *root.rglob("*")]:
        mode = entry.lstat().st_mode
        if not stat.S_ISLNK(mode) and mode & 0o077:
            found.append(f"{entry.relative_to(root.parent)} {stat.filemode(mode)}")
    return found


@pytest.mark.slow
def test_state_is_private_to_its_owner_whatever_the_umask(tmp_path: Path) -> None:
    """Attack report F14: under umask 000 the state, bin/, kube/ and nodes/ were 0777, so any local user
    could replace bin/talosctl (which the runbook executes) or rewrite node state."""
    state = tmp_path / "state"
    up = runbook("sim", "up", "--state", str(state), "--nodes", "1", umask=0)
    try:
        assert up.returncode == 0, up.stderr
        call = subprocess.run(
            [
                str(state / "bin" / "talosctl"),
                "-n",
                "10.5.0.3",
                "upgrade",
                "--image",
                "ghcr.io/siderolabs/installer:v1.12.7",
                "--wait=false",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            umask=0,
            env={**os.environ, "TALOSCONFIG": str(state / "talosconfig")},
        )
        assert call.returncode == 0, call.stderr
    finally:
        runbook("sim", "down", "--state", str(state))
    assert _modes_open_to_others(state) == []


def test_a_state_path_cannot_inject_a_command_into_the_wrappers(tmp_path: Path) -> None:
    """Attack report F14: the wrapper put the state path in single quotes, so a ``'`` in it ended the quote
    and ``$(...)`` ran on the first talosctl call."""
    state = tmp_path / "q'$(touch INJECTED)'q"
    up = runbook("sim", "up", "--state", str(state), "--no-daemon", "--nodes", "1")
    assert up.returncode == 0, up.stderr
    call = subprocess.run(
        [str(state / "bin" / "talosctl"), "-n", "10.5.0.3", "version", "--short"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
        env={**os.environ, "TALOSCONFIG": str(state / "talosconfig"), "RUNBOOK_SIM_TOOLSERVER": "0"},
    )
    assert not (tmp_path / "INJECTED").exists()
    assert call.returncode == 0, call.stderr
    assert "v1.12" in call.stdout  # and the call reached this very state


def test_a_state_path_with_a_line_break_is_refused(tmp_path: Path) -> None:
    state = tmp_path / "a\ntouch INJECTED"
    up = runbook("sim", "up", "--state", str(state), "--no-daemon", "--nodes", "1")
    assert up.returncode == 2
    assert "--state" in up.stderr and "line break" in up.stderr
    assert not state.exists()


def test_sim_down_never_signals_a_process_it_did_not_start(tmp_path: Path) -> None:
    """Attack report F7: a stale daemon.pid naming another process (pid reused after a crash or reboot)
    got that process SIGTERMed, then SIGKILLed, and ``sim status`` called it the simulator."""
    cluster.create(tmp_path, cluster.ClusterSpec(workers=1))
    victim = subprocess.Popen(["sleep", "1000"])
    try:
        sim_paths(tmp_path).pid.write_text(f"{victim.pid}\n")
        status = json.loads(runbook("sim", "status", "--state", str(tmp_path), "--json").stdout)
        down = runbook("sim", "down", "--state", str(tmp_path))
        time.sleep(0.2)
        assert victim.poll() is None, "sim down signalled a process that is not the simulator"
    finally:
        victim.kill()
        victim.wait()
    assert status["daemon_pid"] is None
    assert down.returncode == 0 and down.stdout == "simulator was not running\n"
    assert str(victim.pid) in down.stderr  # says which pid it left alone


@pytest.mark.parametrize("pid", ["0", "-1"])
def test_sim_down_leaves_a_pid_file_naming_no_process_alone(tmp_path: Path, pid: str) -> None:
    """Attack re-run (7 Dec 2026): a daemon.pid of 0 or -1 (to kill(2): the process group, every process) made
    ``sim down`` crash in ``os.pidfd_open``; it is a stale pid file, left alone as any other."""
    cluster.create(tmp_path, cluster.ClusterSpec(workers=1))
    sim_paths(tmp_path).pid.write_text(f"{pid}\n")
    down = runbook("sim", "down", "--state", str(tmp_path))
    assert down.returncode == 0 and down.stdout == "simulator was not running\n", down.stderr
    assert "Traceback" not in down.stderr


def test_an_empty_state_option_is_refused_not_read_as_the_default(tmp_path: Path) -> None:
    """Attack re-run (7 Dec 2026): a script's ``--state "$DIR"`` with DIR unset fell back to
    ``$RUNBOOK_SIM_STATE``, and ``sim down --purge`` removed that state."""
    state = tmp_path / "state"
    cluster.create(state, cluster.ClusterSpec(workers=1))
    env = {**os.environ, "RUNBOOK_SIM_STATE": str(state)}
    down = subprocess.run(
        [sys.executable, "-m", "runbook_lib", "sim", "down", "--purge", "--state", ""],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )
    assert down.returncode == 2 and "--state is empty" in down.stderr, down.stderr
    assert sim_paths(state).talosconfig.exists()


def test_the_shell_line_quotes_the_state_paths(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Attack re-run (7 Dec 2026): ``sim up``'s "Use it from a shell: export PATH=…" printed the state path
    unquoted, so a path holding ``$(touch …)`` ran it when pasted."""
    from runbook_lib.cli.cmd_sim import _print_up

    state = tmp_path / "s$(touch INJ)"
    spec = cluster.ClusterSpec(workers=1)
    cluster.create(state, spec)
    _print_up(state, spec, load_nodes(state), {}, "v1.12.7")
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.strip().startswith("export PATH="))
    subprocess.run(["bash", "-c", line.strip()], cwd=tmp_path, check=True, timeout=30)
    assert not (tmp_path / "INJ").exists(), line


def test_sim_down_refuses_while_a_run_uses_the_simulator(tmp_path: Path) -> None:
    """Attack re-run (7 Dec 2026): ``sim down`` under an ``--apply`` run stopped the simulator (rc 0); the run
    then hung in ``talosctl upgrade`` until its timeout. A run holds a lease on the simulator it uses
    (``cmd_run._simulated_cluster``): ``sim down`` and ``--purge`` refuse while one is held, naming it."""
    from runbook_lib.cli.cmd_run import SimLeases
    from runbook_lib.notebook import lock

    state = tmp_path / "state"
    cluster.create(state, cluster.ClusterSpec(workers=1))
    with lock.lease(SimLeases.of(state.resolve()).leases):  # as a run holds it while it runs
        for extra in ([], ["--purge"]):
            down = runbook("sim", "down", "--state", str(state), *extra)
            assert down.returncode == 2, down.stdout + down.stderr
            assert "is in use by 1 run(s)" in down.stderr and "not stopped" in down.stderr, down.stderr
    assert sim_paths(state).talosconfig.exists()
    assert runbook("sim", "down", "--state", str(state)).returncode == 0  # the run has ended


def test_purge_deletes_only_a_simulator_state_directory(tmp_path: Path) -> None:
    """Attack report F7: ``sim down --purge --state <dir>`` deleted any directory, e.g. a mistyped one."""
    decoy = tmp_path / "decoy"
    (decoy / "important").mkdir(parents=True)
    (decoy / "important" / "data.txt").write_text("keep me\n")
    down = runbook("sim", "down", "--state", str(decoy), "--purge")
    assert down.returncode == 2
    assert str(decoy) in down.stderr and "not a simulator state directory" in down.stderr
    assert (decoy / "important" / "data.txt").read_text() == "keep me\n"
    state = tmp_path / "state"
    cluster.create(state, cluster.ClusterSpec(workers=1))
    down = runbook("sim", "down", "--state", str(state), "--purge")
    assert down.returncode == 0, down.stderr
    assert not state.exists()


def test_sim_up_refuses_a_directory_that_is_not_simulator_state(tmp_path: Path) -> None:
    """``create`` replaces ``nodes/`` in the state dir: pointed at a user's directory it deleted theirs."""
    mine = tmp_path / "project"
    (mine / "nodes").mkdir(parents=True)
    (mine / "nodes" / "inventory.txt").write_text("keep me\n")
    up = runbook("sim", "up", "--state", str(mine), "--no-daemon", "--nodes", "1")
    assert up.returncode == 2
    assert str(mine) in up.stderr and "not a simulator state directory" in up.stderr
    assert (mine / "nodes" / "inventory.txt").read_text() == "keep me\n"
    assert sorted(p.name for p in mine.iterdir()) == ["nodes"]


def test_a_gpu_node_at_the_control_planes_address_is_refused_and_the_cluster_there_is_kept(
    tmp_path: Path,
) -> None:
    """A parameter file whose GPU node has the simulated control plane's address (10.5.0.2) is refused, naming
    the address, and the simulated cluster already in the state directory stays as it was. Until 4 Dec 2026
    the check ran after ``sim up`` had stopped that cluster's control plane and daemon and ``cluster.create``
    had removed its nodes."""
    state = tmp_path / "state"
    r = runbook("sim", "up", "--state", str(state), "--no-daemon", "--nodes", "1", "--scenario", "gpu-ready")
    assert r.returncode == 0, r.stderr
    before = load_node(state, "talos-worker-1")
    data = yaml.safe_load((Path(__file__).resolve().parents[2] / "params" / "simulated.yaml").read_text())
    data["nodes"][0]["address"] = "10.5.0.2"
    clash = tmp_path / "clash.yaml"
    clash.write_text(yaml.safe_dump(data))

    r = runbook("sim", "up", "--state", str(state), "--no-daemon", "-p", str(clash))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "GPU node address 10.5.0.2 is the simulated control plane's; use 10.5.0.3 and up" in r.stderr
    assert load_node(state, "talos-worker-1") == before
    with pytest.raises(ValueError, match=r"10\.5\.0\.2 is the simulated control plane"):
        cluster.create(state, cluster.spec_from_params(load_params(str(clash), [])))
    assert load_node(state, "talos-worker-1") == before
    two = cluster.ClusterSpec(workers=1, control_planes=2, worker_nodes=(("gpu-1", "10.5.0.3"),))
    with pytest.raises(
        ValueError, match=r"10\.5\.0\.3 is the simulated control plane's; use 10\.5\.0\.4 and up"
    ):
        cluster.check_spec(two)
