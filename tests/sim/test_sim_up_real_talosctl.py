"""The real talosctl against simnode as the simulated cluster's Talos side (issue 14, the wiring).

First: simnode's observed state (``<state-dir>/observed/<name>.json``), what the simulated kubelet reads so the
Kubernetes side follows what the real talosctl changed, and its image resolver (installer images the nodes file
does not list, as the runbook's schematics are only known once it registers them with the factory room).
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.sim.test_real_talosctl import Sim, build, start_simnode
from tests.sim.test_real_talosctl_lifecycle import (
    IMAGES,
    MODULES,
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

    def when(self, name: str, holds: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        """The node's observed state once ``holds`` (simnode rewrites the file within ~0.1 s of a change)."""

        def probe() -> dict[str, Any] | None:
            node = self.read(name)
            return node if holds(node) else None

        found: dict[str, Any] = wait_for(probe, timeout=30)
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
