"""``talosctl dmesg`` through the real talosctl v1.12.0 against simnode: the kernel log the runbook's fixes send an
operator to (``talosctl -n <node> dmesg | grep NVRM``) and ``runbook diagnose --log`` reads.

Before, simnode had no Dmesg and the real talosctl answered ``Unimplemented`` (stop 45's note), so the fix could
not be followed on the simulator. What the lines say, and their sources, is in ``simnode/dmesg.go``; the line
format is machined's (talos@v1.12.0 internal/app/machined/internal/server/v1alpha1/v1alpha1_server.go Dmesg:
``"%s: %7s: [%s]: %s"``, facility, priority, RFC 3339 timestamp, message) after talosctl's ``<node>: ``
(cmd/talosctl/cmd/talos/dmesg.go).
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from runbook_lib.cli import main
from runbook_lib.model.parsers import parse_driver_version
from tests.sim.test_library_real_talosctl import ADDRESSES, DRIVER, TALOS, gpu_ready_nodes, params_file
from tests.sim.test_real_talosctl import build, start_simnode

pytestmark = pytest.mark.slow

LINE = re.compile(r"^(?P<node>\S+): kern: +(?P<priority>\w+): \[(?P<at>[^\]]+)\]: (?P<text>.*)$")


@pytest.fixture
def talosctl_dmesg(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """Three GPU-ready nodes on simnode, the last with a GPU its driver does not initialise; the real talosctl and
    the talosconfig simnode wrote."""
    talosctl = build("build-talosctl.sh", TALOS)
    state = tmp_path / "state"
    nodes = gpu_ready_nodes(
        talosctl, tmp_path, params_file(tmp_path, talosctl, state / "talosconfig", ADDRESSES)
    )
    for node in nodes["nodes"]:
        node["files"] = {}  # the driver's version file is derived from the image, as the kernel log is
    nodes["nodes"][-1]["nvidia_probe_fails"] = True
    proc = start_simnode(build("build-simnode.sh"), state, nodes)
    try:
        yield talosctl, state / "talosconfig"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def dmesg(talosctl: Path, config: Path, address: str) -> str:
    argv = [str(talosctl), "--talosconfig", str(config), "-n", address, "dmesg"]
    run = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)
    assert run.returncode == 0, run.stderr
    return run.stdout


def test_a_loaded_driver_logs_its_version_and_a_failed_probe_logs_why(
    talosctl_dmesg: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    talosctl, config = talosctl_dmesg
    loaded = dmesg(talosctl, config, ADDRESSES[0])
    [line] = loaded.splitlines()
    said = LINE.match(line)
    assert said and said["node"] == ADDRESSES[0] and said["priority"] == "info", line
    assert said["text"].startswith("NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  ")
    assert parse_driver_version(said["text"]).version == DRIVER

    failed = dmesg(talosctl, config, ADDRESSES[-1])
    texts = [m["text"] for m in map(LINE.match, failed.splitlines()) if m]
    assert texts == [
        "nvidia: probe of 0000:01:00.0 failed with error -1",
        "NVRM: The NVIDIA probe routine failed for 1 device(s).",
        "NVRM: None of the NVIDIA devices were initialized.",
    ], failed
    log = tmp_path / "dmesg.txt"
    log.write_text(failed)
    capsys.readouterr()
    main(["diagnose", "--log", str(log), "--talos-version", TALOS])
    report = capsys.readouterr().out
    # the failure table's probe entry, quoting the whole dmesg line it matched (talosctl's node, facility,
    # priority and time before the driver's words)
    assert f'FAIL  log: "{ADDRESSES[-1]}: kern: ' in report, report
    assert (
        ': NVRM: The NVIDIA probe routine failed for 1 device(s)." points to: the GPU is not supported'
        in report
    ), report
    assert "siderolabs/extensions/issues/227" in report, report

    tail = [str(talosctl), "--talosconfig", str(config), "-n", ADDRESSES[0], "dmesg", "--tail"]
    assert subprocess.run(tail, capture_output=True, text=True, check=True, timeout=60).stdout == ""


TALOS_LINE = re.compile(r"^(?P<node>\S+): user: +warning: \[(?P<at>[^\]]+)\]: (?P<text>\[talos\] .*)$")


def test_an_upgrade_whose_install_fails_is_in_the_kernel_log_the_fix_sends_to(tmp_path: Path) -> None:
    """Operator walkthrough (stop 53): the image step's fix for a failed upgrade says to read why in
    ``talosctl -n <node> dmesg``, which printed nothing on the simulator. machined logs the failed task, phase and
    sequence to the kernel log (simnode/dmesg.go ``upgradeFailedLog`` cites the lines), as facility user, priority
    warning."""
    talosctl = build("build-talosctl.sh", TALOS)
    state = tmp_path / "state"
    nodes = gpu_ready_nodes(
        talosctl, tmp_path, params_file(tmp_path, talosctl, state / "talosconfig", ADDRESSES)
    )
    nodes["nodes"][0]["fail_install"] = True
    nodes["nodes"][0]["install_ms"] = 200  # the installer run before it fails (lifecycle.go taskTime)
    proc = start_simnode(build("build-simnode.sh"), state, nodes)
    try:
        config = state / "talosconfig"
        assert not [m for m in map(TALOS_LINE.match, dmesg(talosctl, config, ADDRESSES[0]).splitlines()) if m]
        image = next(iter(nodes["images"]))  # one the nodes file serves: the install fails, not the pull
        argv = [str(talosctl), "--talosconfig", str(config), "-n", ADDRESSES[0], "upgrade", "--image", image]
        sent = subprocess.run(
            [*argv, "--wait=false"], capture_output=True, text=True, check=False, timeout=60
        )
        assert sent.returncode == 0, sent.stderr
        texts: list[str] = []
        deadline = (
            time.monotonic() + 90
        )  # the upgrade's phases run first, the install for its time (lifecycle.go)
        while time.monotonic() < deadline:
            texts = [
                m["text"]
                for m in map(TALOS_LINE.match, dmesg(talosctl, config, ADDRESSES[0]).splitlines())
                if m
            ]
            if texts:
                break
            time.sleep(0.5)
        assert texts[0] == '[talos] task upgrade (1/1): failed: task "upgrade" failed: exit code 1', texts
        assert re.fullmatch(r"\[talos\] phase upgrade \((\d+)/\d+\): failed", texts[1]), texts
        assert texts[2:] == [
            "[talos] upgrade sequence: failed",
            f"[talos] upgrade failed: error running phase {texts[1].split('(')[1].split('/')[0]} in upgrade "
            'sequence: task 1/1: failed, task "upgrade" failed: exit code 1',
        ], texts
        # a config change re-derives the driver's lines, not machined's: they stay until the node boots again
        # (review of 4be2e1c: the go-on after a failed upgrade patched the config and the lines were gone)
        sysctl = '{"machine": {"sysctls": {"net.core.somaxconn": "65535"}}}'
        patch = [
            str(talosctl),
            "--talosconfig",
            str(config),
            "-n",
            ADDRESSES[0],
            "patch",
            "mc",
            "--patch",
            sysctl,
        ]
        patched = subprocess.run(
            [*patch, "--mode=no-reboot"], capture_output=True, text=True, check=False, timeout=60
        )
        assert patched.returncode == 0, patched.stderr
        after = dmesg(talosctl, config, ADDRESSES[0])
        assert [m["text"] for m in map(TALOS_LINE.match, after.splitlines()) if m] == texts, after
    finally:
        proc.terminate()
        proc.wait(timeout=10)
