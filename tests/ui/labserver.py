"""Start and stop a throw-away JupyterLab for the browser test, the way test-infra.md §4 measured it.

Why each setting: as root the server refuses to start without ``--allow-root``; a random free port and
loopback only, so parallel runs and other users never meet it; no token, because the browser is the only
client; its own config, runtime, data, settings and workspace directories, so nothing the test does leaks
into (or is influenced by) the user's ``~/.jupyter``; a read-only extension manager and no news or update
checks, so the server makes no outbound calls and no toast covers the screenshots.  The server runs in its
own process group and is stopped by that id, which takes its kernels with it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import requests

#: Settings every user would otherwise see: the "get notified about official Jupyter news?" toast.
SETTINGS_OVERRIDES = {
    "@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": False},
}


@dataclass(frozen=True)
class Lab:
    url: str
    pid: int
    log: Path

    def notebook_url(self, path: str, workspace: str) -> str:
        """A fresh workspace with ``?reset``: a reused workspace can leave the notebook panel unopened."""
        return f"{self.url}/lab/workspaces/{workspace}/tree/{path}?reset"

    def close_sessions(self) -> None:
        """Shut down every notebook's kernel, as File → Shut Down All Kernels would."""
        with requests.Session() as http:
            http.get(f"{self.url}/lab", timeout=30)  # sets the _xsrf cookie that write requests must echo
            headers = {"X-XSRFToken": http.cookies.get("_xsrf", "")}
            sessions = http.get(f"{self.url}/api/sessions", timeout=10)
            sessions.raise_for_status()
            for session in sessions.json():
                http.delete(
                    f"{self.url}/api/sessions/{session['id']}", headers=headers, timeout=30
                ).raise_for_status()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _prepare_dirs(home: Path) -> dict[str, Path]:
    dirs = {name: home / name for name in ("config", "runtime", "data", "settings", "user-settings", "ws")}
    for path in dirs.values():
        path.mkdir(parents=True, exist_ok=True)
    (dirs["settings"] / "overrides.json").write_text(json.dumps(SETTINGS_OVERRIDES, indent=2))
    server_config = {
        "LabApp": {"news_url": None, "check_for_updates_class": "jupyterlab.NeverCheckForUpdate"},
    }
    (dirs["config"] / "jupyter_server_config.json").write_text(json.dumps(server_config, indent=2))
    return dirs


def _proc_start(pid: int) -> str | None:
    """The process's start time (field 22 of /proc/PID/stat), so a recycled PID is never signalled."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _children(pid: int) -> dict[int, str]:
    """Direct children of ``pid`` with their start times (the kernels: jupyter starts each in its own session)."""
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found[int(entry.name)] = fields[19]
    return found


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop the server by its process group, then any kernel it left behind by its own PID.

    SIGTERM lets the server shut its kernels down; only what is still running after that gets SIGKILL.
    """
    kernels = _children(proc.pid)
    for sig, wait in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue
    proc.wait(timeout=5)
    deadline = time.monotonic() + 10.0
    while kernels and time.monotonic() < deadline:
        kernels = {pid: start for pid, start in kernels.items() if _proc_start(pid) == start}
        time.sleep(0.1)
    for pid in kernels:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@contextmanager
def jupyterlab(root_dir: Path, home: Path, env: Mapping[str, str], *, timeout: float = 60.0) -> Iterator[Lab]:
    """Run JupyterLab on 127.0.0.1 serving ``root_dir``; yields once ``/api/status`` answers."""
    dirs = _prepare_dirs(home)
    port = free_port()
    log = home / "jupyterlab.log"
    cmd = [
        sys.executable,
        "-m",
        "jupyterlab",
        "--no-browser",
        "--allow-root",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        "--IdentityProvider.token=",
        "--ServerApp.password=",
        f"--ServerApp.root_dir={root_dir}",
        "--LabApp.extension_manager=readonly",
        f"--LabApp.app_settings_dir={dirs['settings']}",
        f"--LabApp.user_settings_dir={dirs['user-settings']}",
        f"--LabApp.workspaces_dir={dirs['ws']}",
    ]
    full_env = {
        **os.environ,
        **env,
        "JUPYTER_CONFIG_DIR": str(dirs["config"]),
        "JUPYTER_RUNTIME_DIR": str(dirs["runtime"]),
        "JUPYTER_DATA_DIR": str(dirs["data"]),
    }
    with log.open("wb") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=full_env, cwd=root_dir, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"jupyter lab exited with {proc.returncode}; see {log}")
            try:
                if requests.get(f"{url}/api/status", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"jupyter lab did not answer on {url} within {timeout:.0f} s; see {log}")
            time.sleep(0.25)
        yield Lab(url=url, pid=proc.pid, log=log)
    finally:
        _stop(proc)
