"""The real talosctl against simnode as the simulated cluster's Talos side (issue 14, the wiring).

First: simnode's observed state (``<state-dir>/observed/<name>.json``), what the simulated kubelet reads so the
Kubernetes side follows what the real talosctl changed, and its image resolver (installer images the nodes file
does not list, as the runbook's schematics are only known once it registers them with the factory room).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.sim.test_real_talosctl import Sim, build, start_simnode, unavailable
from tests.sim.test_real_talosctl_lifecycle import (
    IMAGES,
    MODULES,
    NVIDIA,
    NVIDIA_ID,
    REBOOT_MS,
    TALOS,
    VANILLA,
    installer,
    nvidia_exts,
    worker_configs,
)
from tests.sim.waiting import wait_for

pytestmark = pytest.mark.slow

APPLY, UPGRADE = "10.5.7.1", "10.5.7.2"
# An installer the nodes file does not list: only the resolver knows what it installs.
RESOLVED = installer(NVIDIA_ID, "v1.12.1")


@dataclass(frozen=True)
class Observed:
    sim: Sim
    state: Path
    proc: subprocess.Popen[str]
    patches: Path

    def read(self, name: str) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.state / "observed" / f"{name}.json").read_text())
        return data

    def when(
        self, name: str, holds: Callable[[dict[str, Any]], bool], timeout: float = 30.0
    ) -> dict[str, Any]:
        """The node's observed state once ``holds`` (simnode rewrites the file within ~0.1 s of a change);
        ``timeout`` must also cover what simnode itself takes to get there (a boot timeout, a reboot)."""

        def probe() -> dict[str, Any] | None:
            node = self.read(name)
            return node if holds(node) else None

        found: dict[str, Any] = wait_for(probe, timeout=timeout)
        return found


def resolver(tmp: Path) -> Path:
    """An -image-resolver answering for RESOLVED only, and failing with a message for anything else."""
    answer = json.dumps({"talos_version": "v1.12.1", "extensions": nvidia_exts("v1.12.1")})
    script = tmp / "resolve"
    script.write_text(
        f"#!/bin/sh\nif [ \"$1\" = '{RESOLVED}' ]; then echo '{answer}'; exit 0; fi\n"
        'echo "schematic of $1 not found" >&2; exit 1\n'
    )
    script.chmod(0o700)
    return script


@pytest.fixture(scope="module")
def observed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Observed]:
    talosctl = build("build-talosctl.sh", TALOS)
    tmp = tmp_path_factory.mktemp("observed")
    plain, with_modules = worker_configs(talosctl, tmp)
    nodes = [
        {"name": name, "address": address, "talos_version": TALOS, "image": VANILLA, "machine_config": config}
        | {"services": [{"id": "apid", "state": "Running", "healthy": True}], "reboot_ms": REBOOT_MS}
        for name, address, config in (("apply", APPLY, plain), ("upgrade", UPGRADE, with_modules))
    ]
    state = tmp / "state"
    flags = ("-image-resolver", str(resolver(tmp)), "-time-factor", "0.01")  # upgrades take 0.4 s
    proc = start_simnode(build("build-simnode.sh"), state, {"nodes": nodes, "images": IMAGES}, *flags)
    yield Observed(Sim(talosctl, state / "talosconfig"), state, proc, tmp)
    proc.terminate()
    proc.wait(timeout=10)


def test_each_node_is_observed_once_simnode_serves(observed: Observed) -> None:
    """The files exist when the endpoint file does (a caller that waited for simnode finds them)."""
    node = observed.read("apply")
    assert (node["address"], node["talos_version"], node["image"]) == (APPLY, TALOS, VANILLA)
    assert [e["name"] for e in node["extensions"]] == ["schematic"]
    assert "kernel_modules" not in node and "down" not in node and node["booted"] is True
    assert "nvidia" not in node["machine_config"]
    assert (observed.state / "observed").stat().st_mode & 0o777 == 0o700


def test_the_file_follows_a_config_applied_by_the_real_talosctl(observed: Observed) -> None:
    patch = observed.sim.run(
        "-n", APPLY, "patch", "machineconfig", "--patch", f"@{observed.patches / 'modules.yaml'}"
    )
    assert patch.returncode == 0, patch.stderr
    node = observed.when("apply", lambda n: "nvidia_uvm" in n["machine_config"])
    assert node["booted"] is True and "kernel_modules" not in node  # no kmod extension: nothing loads


def test_the_file_follows_an_upgrade_to_an_image_only_the_resolver_knows(observed: Observed) -> None:
    before = observed.read("upgrade")
    proc = observed.sim.run("-n", UPGRADE, "upgrade", "--image", RESOLVED, "--wait", "--timeout", "60s")
    assert proc.returncode == 0, proc.stderr
    node = observed.when("upgrade", lambda n: n["talos_version"] == "v1.12.1")
    assert node["image"] == RESOLVED and node["boot_id"] != before["boot_id"] and node["booted"] is True
    assert sorted(m["name"] for m in node["kernel_modules"]) == sorted(MODULES)
    assert {s["id"]: s["state"] for s in node["services"]}["ext-nvidia-persistenced"] == "Running"
    driver = observed.sim.run("-n", UPGRADE, "read", "/proc/driver/nvidia/version")
    assert driver.stdout.startswith("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.172.08  ")


def test_no_driver_version_file_without_the_driver(observed: Observed) -> None:
    """The file exists once the nvidia module is loaded (derived from the kmod extension), not before."""
    proc = observed.sim.run("-n", APPLY, "read", "/proc/driver/nvidia/version")
    assert proc.returncode == 1
    assert "stat /proc/driver/nvidia/version: no such file or directory" in proc.stderr


def test_an_image_the_resolver_refuses_fails_the_upgrade_with_its_message(observed: Observed) -> None:
    unknown = installer("0" * 64, TALOS)
    proc = observed.sim.run("-n", APPLY, "upgrade", "--image", unknown)
    assert proc.returncode == 1
    assert f'error validating installer image "{unknown}": schematic of {unknown} not found' in proc.stderr


def test_the_file_follows_a_node_taken_down_by_sighup(observed: Observed, tmp_path: Path) -> None:
    nodes_file = observed.state.parent / f"{observed.state.name}-nodes.json"
    nodes = json.loads(nodes_file.read_text())
    nodes["nodes"][0]["down"] = "no-route-to-host"
    nodes_file.write_text(json.dumps(nodes))
    observed.proc.send_signal(signal.SIGHUP)
    node = observed.when("apply", lambda n: bool(n.get("down")))
    assert node["down"] == "no-route-to-host" and node["booted"] is False
    nodes["nodes"][0]["down"] = ""
    nodes_file.write_text(json.dumps(nodes))
    observed.proc.send_signal(signal.SIGHUP)
    assert "down" not in observed.when("apply", lambda n: n["booted"])


# ---------------------------------------------------------------- runbook sim up / runbook run


ROOT = Path(__file__).resolve().parents[2]


def real_env(tmp: Path) -> dict[str, str]:
    """The environment of a user who built the tools and asks for the real talosctl, with Talos's durations
    scaled down (an upgrade's installer pull and install: 0.4 s; a hung boot would fail after 42 s)."""
    build("build-talosctl.sh", TALOS)  # skips without go; cached: instant
    build("build-simnode.sh")
    return {
        **os.environ,
        "RUNBOOK_SIM_TALOSCTL": "real",
        "RUNBOOK_SIM_TIME_SCALE": "0.01",
        "RUNBOOK_RECORDS": str(tmp / "records"),
    }


def runbook(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "runbook_lib", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=900,
        check=False,
    )


def step_lines(stdout: str) -> dict[str, str]:
    """STEP -> outcome of ``runbook run``'s one line per step."""
    steps = ("preflight", "config-patch", "image", "verify", "kubernetes", "cuda-test")
    return {
        line.split()[0]: line.split()[1]
        for line in stdout.splitlines()
        if line.split()[:1] in [[s] for s in steps]
    }


def test_runbook_run_applies_all_six_steps_with_the_real_talosctl_and_a_second_run_changes_nothing(
    tmp_path: Path,
) -> None:
    """The acceptance of issue 14's wiring: ``runbook run -p params/simulated.yaml --apply`` with the real
    talosctl v1.12.0 doing preflight, the config patch, the image upgrade and verify against simnode, the
    simulated kubelet following what it changed (cuda-test passes only if the kubelet saw the toolkit and the
    modules). The second run resumes simnode from what it observed and changes nothing."""
    env, state = real_env(tmp_path), tmp_path / "state"
    args = ("run", "-p", "params/simulated.yaml", "--apply", "--state", str(state), "--no-progress")
    first = runbook(env, *args)
    assert first.returncode == 0, first.stdout + first.stderr
    assert step_lines(first.stdout) == {
        "preflight": "ok",
        "config-patch": "changed",
        "image": "changed",
        "verify": "ok",
        "kubernetes": "changed",
        "cuda-test": "ok",
    }
    assert f"simulated Talos nodes: real talosctl {TALOS} against simnode" in first.stderr
    workers = [
        json.loads((state / "simnode" / "observed" / f"gpu-worker-{i}.json").read_text()) for i in (1, 2, 3)
    ]
    assert {"/metal-installer/" in w["image"] and w["booted"] for w in workers} == {True}
    assert {len(w["kernel_modules"]) for w in workers} == {4}
    # `runbook sim status` shows the nodes as simnode observes them: before, the stock schematic and no driver
    shown = json.loads(runbook(env, "sim", "status", "--state", str(state), "--json").stdout)["nodes"]
    gpu = [n for n in shown if n["name"].startswith("gpu-worker")]
    assert len(gpu) == 3 and all(n["driver"] != "-" and n["extensions"] for n in gpu), gpu
    second = runbook(env, *args)
    assert second.returncode == 0, second.stdout + second.stderr
    assert set(step_lines(second.stdout).values()) == {"ok"}
    assert "nothing changed on the cluster" in second.stdout
    assert not (state / "simnode.pid").exists()  # the run stopped the simnode it started


def test_sim_up_runs_the_real_talosctl_and_sim_down_stops_simnode(tmp_path: Path) -> None:
    env, state = real_env(tmp_path), tmp_path / "state"
    up = runbook(env, "sim", "up", "-p", "params/simulated.yaml", "--state", str(state))
    try:
        assert up.returncode == 0, up.stderr
        assert f"({'real talosctl ' + TALOS} against simnode)" in up.stdout
        talosctl = state / "bin" / "talosctl"
        assert talosctl.resolve().parent.name == TALOS  # the cached real binary
        sim = Sim(talosctl, state / "talosconfig")
        version = sim.run("-n", "10.5.0.11", "version")
        assert version.returncode == 0, version.stderr
        assert "Tag:         v1.12.7" in version.stdout  # the node's release, from simnode
        fault = runbook(env, "sim", "fault", "--state", str(state), "gpu-worker-2", "unreachable", "no_route")
        assert fault.returncode == 0, fault.stderr
        dead = sim.run("-n", "10.5.0.12", "version")
        assert dead.returncode == 1 and unavailable("10.5.0.12") in dead.stderr  # simnode's dial error
        cleared = runbook(
            env, "sim", "fault", "--state", str(state), "--clear", "gpu-worker-2", "unreachable"
        )
        assert cleared.returncode == 0, cleared.stderr
        assert json.loads((state / "simnode" / "observed" / "gpu-worker-2.json").read_text())["booted"]
        status = runbook(env, "sim", "status", "--state", str(state))
        assert f"talosctl:    real talosctl {TALOS} against simnode" in status.stdout
        pid = int((state / "simnode.pid").read_text().split()[0])
    finally:
        down = runbook(env, "sim", "down", "--state", str(state))
    assert down.returncode == 0 and "simulator stopped" in down.stdout
    assert not Path(f"/proc/{pid}").exists() or "simnode" not in Path(f"/proc/{pid}/cmdline").read_text()


def test_the_file_follows_a_hung_boot_and_its_rollback(tmp_path: Path) -> None:
    """An upgrade to the NVIDIA image without the modules in the config: the boot waits on
    ext-nvidia-persistenced (observed: the new image, not booted) until BootTimeout (70 min x 0.005 = 21 s
    here), then the node rolls back (observed: the image it ran before, booted)."""
    talosctl = build("build-talosctl.sh", TALOS)
    plain, _ = worker_configs(talosctl, tmp_path)
    node: dict[str, Any] = {
        "name": "hang",
        "address": APPLY,
        "talos_version": TALOS,
        "image": VANILLA,
        "machine_config": plain,
    }
    node |= {"services": [{"id": "apid", "state": "Running", "healthy": True}], "reboot_ms": REBOOT_MS}
    state = tmp_path / "state"
    flags = ("-time-factor", "0.005")
    proc = start_simnode(build("build-simnode.sh"), state, {"nodes": [node], "images": IMAGES}, *flags)
    try:
        obs = Observed(Sim(talosctl, state / "talosconfig"), state, proc, tmp_path)
        upgrade = obs.sim.run("-n", APPLY, "upgrade", "--image", NVIDIA, "--wait=false")
        assert upgrade.returncode == 0, upgrade.stderr
        hung = obs.when("hang", lambda n: n["image"] == NVIDIA and "down" not in n)
        assert hung["booted"] is False
        assert {s["id"]: s["state"] for s in hung["services"]}["ext-nvidia-persistenced"] == "Waiting"
        # the boot timeout (21 s) and the reboot (REBOOT_MS) from the hung boot's start: polled far longer than
        # those ~25 s, as a loaded machine delays simnode's timers and this poll (30 s left 5 s of margin)
        back = obs.when("hang", lambda n: n["image"] == VANILLA and n["booted"], timeout=120)
        assert [e["name"] for e in back["extensions"]] == ["schematic"] and back["boot_id"] != hung["boot_id"]
    finally:
        proc.terminate()
        proc.wait(timeout=10)
