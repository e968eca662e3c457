"""The tool server: simulated talosctl/helm calls answered by forks of a warm process, same as plain runs.

What a user of the simulator would notice if this broke: a different output, stream or exit code than the
plain ``python -m`` tool, a relative ``@patch`` file not found, calls failing once the server is gone, or
processes left behind after ``runbook sim down``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from runbook_lib.sim import cluster, toolserver

pytestmark = pytest.mark.slow

needs_compiler = pytest.mark.skipif(
    toolserver.client_binary() is None,
    reason="no C compiler: the simulator runs its tools as plain processes",
)


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    state = tmp_path_factory.mktemp("toolserver") / "sim"
    cluster.create(state, cluster.ClusterSpec(workers=2, talos_version="v1.12.7", scenario="fresh"))
    cluster.start_daemon(state)
    try:
        yield state
    finally:
        cluster.stop_daemon(state)


def tool(
    state: Path, name: str, *args: str, plain: bool = False, **kw: object
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "RUNBOOK_SIM_STATE"}
    env["TALOSCONFIG"] = str(state / "talosconfig")
    env["KUBECONFIG"] = str(state / "kubeconfig")
    if plain:
        env[toolserver.DISABLE_ENV] = "0"
    return subprocess.run(
        [str(state / "bin" / name), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
        **kw,
    )  # type: ignore[call-overload]


def tools_pid(state: Path) -> int:
    return int(json.loads((state / "endpoints.json").read_text())["tools_pid"])


def listening(state: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect("\0" + toolserver.socket_name(state))
        except OSError:
            return False
        return True


CALLS = [  # (tool, argv, the exit code it must have)
    ("talosctl", ["-n", "10.5.0.3,10.5.0.4", "get", "extensions"], 0),
    ("talosctl", ["-n", "10.5.0.3", "get", "machineconfig", "-o", "json"], 0),
    ("talosctl", ["-n", "10.5.0.3", "read", "/proc/version"], 0),
    ("talosctl", ["-n", "10.5.0.3,10.5.0.4", "read", "/proc/modules"], 1),  # refused: usage on stderr
    ("talosctl", ["-n", "10.9.9.9", "get", "extensions"], 1),  # no such node
    ("talosctl", ["bogus"], 1),
    ("talosctl", ["version", "--client"], 0),
    ("helm", ["version", "--short"], 0),
    ("helm", ["list", "-A"], 0),
    ("helm", ["upgrade", "--no-such-flag"], 1),
]


@needs_compiler
@pytest.mark.parametrize(("name", "args", "code"), CALLS, ids=[" ".join([n, *a]) for n, a, _ in CALLS])
def test_served_call_matches_the_plain_tool(sim: Path, name: str, args: list[str], code: int) -> None:
    assert listening(sim)
    served = tool(sim, name, *args)
    plain = tool(sim, name, *args, plain=True)
    assert served.returncode == code, served.stderr
    assert served.stdout or served.stderr
    assert (served.returncode, served.stdout, served.stderr) == (plain.returncode, plain.stdout, plain.stderr)


@needs_compiler
def test_relative_patch_file_is_read_from_the_callers_directory(sim: Path, tmp_path: Path) -> None:
    patch = tmp_path / "sysctl.yaml"
    patch.write_text("machine:\n  sysctls:\n    net.core.bpf_jit_harden: '1'\n")
    args = ["-n", "10.5.0.3", "patch", "mc", "--patch", "@sysctl.yaml", "--dry-run"]
    served = tool(sim, "talosctl", *args, cwd=tmp_path)
    plain = tool(sim, "talosctl", *args, cwd=tmp_path, plain=True)
    assert served.returncode == 0, served.stderr
    assert "bpf_jit_harden" in served.stdout + served.stderr
    assert (served.stdout, served.stderr) == (plain.stdout, plain.stderr)


@needs_compiler
def test_calls_fall_back_to_plain_processes_when_the_server_is_gone(tmp_path: Path) -> None:
    state = tmp_path / "sim"
    cluster.create(state, cluster.ClusterSpec(workers=1, talos_version="v1.12.7"))
    cluster.start_daemon(state)
    try:
        before = tool(state, "talosctl", "-n", "10.5.0.3", "get", "extensions")
        os.kill(tools_pid(state), signal.SIGKILL)
        deadline = time.monotonic() + 5
        while listening(state) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not listening(state)
        after = tool(state, "talosctl", "-n", "10.5.0.3", "get", "extensions")
        assert (after.returncode, after.stdout) == (0, before.stdout)
    finally:
        cluster.stop_daemon(state)


@needs_compiler
def test_sim_down_leaves_no_tool_server_behind(tmp_path: Path) -> None:
    state = tmp_path / "sim"
    cluster.create(state, cluster.ClusterSpec(workers=1, talos_version="v1.12.7"))
    cluster.start_daemon(state)
    pid = tools_pid(state)
    assert listening(state)
    cluster.stop_daemon(state)
    deadline = time.monotonic() + 5
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{pid}").exists()
    assert not listening(state)
    # and a cluster without its daemon still answers, through plain processes
    done = tool(state, "talosctl", "-n", "10.5.0.3", "get", "extensions")
    assert done.returncode == 0 and "schematic" in done.stdout


def test_without_a_compiler_the_wrapper_runs_the_python_tool(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("CC", "/bin/false")
    state = tmp_path / "sim"
    cluster.create(state, cluster.ClusterSpec(workers=1, talos_version="v1.12.7"))
    wrapper = (state / "bin" / "talosctl").read_text()
    assert "-m runbook_lib.sim.talosctl" in wrapper
    done = tool(state, "talosctl", "-n", "10.5.0.3", "get", "extensions")
    assert done.returncode == 0 and "schematic" in done.stdout
