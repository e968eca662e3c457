"""The tool server: simulated talosctl/helm calls answered by forks of a warm process, same as plain runs.

What a user of the simulator would notice if this broke: a different output, stream or exit code than the
plain ``python -m`` tool, a relative ``@patch`` file not found, calls failing once the server is gone, or
processes left behind after ``runbook sim down``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from runbook_lib.sim import cluster, toolserver
from tests.sim.test_sim_cluster import runbook

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


# ---------------------------------------------------------------- other local users (attack report F4)

SYSTEM_PYTHON = Path("/usr/bin/python3")  # the venv's interpreter lives under /root, out of nobody's reach
NOBODY = 65534
needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or not SYSTEM_PYTHON.exists(),
    reason="acting as another user (nobody) needs root and a system python3",
)

# What another user runs: the tool server's wire protocol (simtool.c's header), asking for the owner's
# kubeconfig on its own stdout, as the attack report's evil_client.py did.
EVIL_CLIENT = r"""
import os, socket, sys
name, state = sys.argv[1], sys.argv[2].encode()
fields = [b"1", b"runbook_lib.sim.talosctl", b"/", b"4", b"-n", b"10.5.0.2", b"kubeconfig", b"-",
          b"2", b"TALOSCONFIG=" + state + b"/talosconfig", b"RUNBOOK_SIM_STATE=" + state]
payload = b"".join(f + b"\0" for f in fields)
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect("\0" + name)
try:
    socket.send_fds(s, [b"%016d" % len(payload)], [0, 1, 2])
    s.sendall(payload)
    reply = s.recv(32)
except OSError as exc:
    reply = repr(exc).encode()
sys.stderr.write("reply=%r\n" % reply)
"""

# What a squatter runs: bind the owner's socket name first, then record what any caller sends and answer
# with a forged output and exit code 0.
SQUATTER = r"""
import os, socket, sys
name, capture = sys.argv[1], sys.argv[2]
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind("\0" + name)
s.listen(8)
print("ready", flush=True)
while True:
    conn, _ = s.accept()
    try:
        data, fds, _f, _a = socket.recv_fds(conn, 1 << 16, 3)
        while True:
            more = conn.recv(1 << 16)
            if not more:
                break
            data += more
            if len(data) >= 16 and len(data) >= 16 + int(data[:16] or b"0"):
                break
    except (OSError, ValueError):
        data, fds = b"", []
    with open(capture, "ab") as fh:
        fh.write(b"CALL %d bytes %d fds\n" % (len(data), len(fds)) + data + b"\n")
    for fd in fds[1:2]:
        os.write(fd, b"FAKE OUTPUT FROM ANOTHER USER: everything is fine\n")
    for fd in fds:
        os.close(fd)
    try:
        conn.sendall(b"0")
    except OSError:
        pass
    conn.close()
"""


def as_nobody(script: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(SYSTEM_PYTHON), "-c", script, *args],
        user=NOBODY,
        group=NOBODY,
        extra_groups=[],
        cwd="/",
        env={"PATH": "/usr/bin:/bin"},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@needs_root
@needs_compiler
def test_another_user_cannot_use_the_owners_tool_server(sim: Path) -> None:
    """As nobody, ask root's tool server for the kubeconfig: the server must refuse before running anything."""
    assert listening(sim)
    if not (sim / "kubeconfig").exists():  # no Kubernetes side here (the Python API server was retired):
        secret = "apiVersion: v1\nkind: Config\nclusters: []\nusers:\n- name: admin\n  user:\n    token: s3cr3t-owner-token\n"
        (sim / "kubeconfig").write_text(
            secret
        )  # the owner's secret the Python talosctl's `kubeconfig` hands out
        (sim / "kubeconfig").chmod(0o600)
    kubeconfig = (sim / "kubeconfig").read_text()
    token_line = next(line for line in kubeconfig.splitlines() if "token" in line)
    evil = as_nobody(EVIL_CLIENT, toolserver.socket_name(sim), str(sim))
    out, err = evil.communicate(timeout=30)
    assert evil.returncode == 0, err
    assert token_line.strip() not in out
    assert "clusters" not in out
    assert "reply=" in err and not re.search(r"reply=b'\d", err)  # closed without an exit code: nothing ran


@contextlib.contextmanager
def squatted(state: Path) -> Iterator[Path]:
    """Another user (nobody) holds the tool server's name of ``state``; yields where it records calls."""
    drop = Path(tempfile.mkdtemp(prefix="squat-"))
    drop.chmod(0o777)
    squatter = as_nobody(SQUATTER, toolserver.socket_name(state), str(drop / "capture"))
    try:
        assert squatter.stdout is not None and squatter.stdout.readline() == "ready\n"
        yield drop / "capture"
    finally:
        cluster.stop_daemon(state)
        squatter.kill()
        squatter.communicate()
        shutil.rmtree(drop)


@needs_root
@needs_compiler
def test_a_squatted_tool_server_name_captures_nothing_and_forges_nothing(tmp_path: Path) -> None:
    """Another user binds the socket name before the owner's daemon: the owner's calls must not go to it."""
    state = tmp_path / "sim"
    cluster.create(state, cluster.ClusterSpec(workers=1, talos_version="v1.12.7"))
    with squatted(state) as capture:
        cluster.start_daemon(state, rooms=[])
        env = {k: v for k, v in os.environ.items() if k != "RUNBOOK_SIM_STATE"}
        env["TALOSCONFIG"] = str(state / "talosconfig")
        env["MARKER_SECRET"] = "MARKERAWSfromRootEnv"
        done = subprocess.run(
            [str(state / "bin" / "talosctl"), "-n", "10.5.0.3", "get", "extensions"],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            check=False,
        )
        captured = capture.read_bytes() if capture.exists() else b""
    assert done.returncode == 0, done.stderr
    assert "held by uid 65534, another user" in (state / "daemon.log").read_text()
    assert "FAKE OUTPUT" not in done.stdout + done.stderr
    assert "schematic" in done.stdout  # the real answer, from a plain process
    assert b"MARKERAWSfromRootEnv" not in captured
    assert b"fds" not in captured or b" 0 bytes 0 fds" in captured  # at most a connect, never a request


@needs_root
@needs_compiler
def test_sim_up_says_when_the_tool_server_is_not_listening(tmp_path: Path) -> None:
    state = tmp_path / "sim"
    with squatted(state):
        up = runbook("sim", "up", "--state", str(state), "--nodes", "1")
    assert up.returncode == 0, up.stderr
    assert (
        f"tools:       not listening, tools run as plain processes (why: {state / 'daemon.log'})" in up.stdout
    )


def _children(pid: int) -> list[int]:
    found = []
    for status in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            if int(status.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(status.parent.name))
    return found


@needs_compiler
def test_a_call_still_running_when_the_simulator_stops_goes_with_it(tmp_path: Path) -> None:
    """Operator walkthrough (stop 54): after SIGTERM and ``runbook sim down``, a served call still waiting (a hung
    ``talosctl upgrade --wait``) ran on its own, parent PID 1, for more than 12 minutes. Here a call waits out a
    30 s node latency when the simulator stops."""
    state = tmp_path / "sim"
    cluster.create(state, cluster.ClusterSpec(workers=1, talos_version="v1.12.7", latency_ms=30_000))
    cluster.start_daemon(state)
    env = {k: v for k, v in os.environ.items() if k != "RUNBOOK_SIM_STATE"}
    env["TALOSCONFIG"] = str(state / "talosconfig")
    call = subprocess.Popen(
        [str(state / "bin" / "talosctl"), "-n", "10.5.0.3", "get", "extensions"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        server = tools_pid(state)
        deadline = time.monotonic() + 10
        while not (children := _children(server)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert children, "the call is served by a fork of the tool server"
        cluster.stop_daemon(state)
        deadline = time.monotonic() + 5
        while any(Path(f"/proc/{c}").exists() for c in children) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(Path(f"/proc/{c}").exists() for c in children), (
            "the served call outlived the simulator"
        )
    finally:
        call.kill()
        call.wait()
        cluster.stop_daemon(state)
