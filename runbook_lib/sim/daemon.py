"""The simulator's background process: hosts the HTTP rooms (the Image Factory) of one state dir.

One process for all rooms keeps ``sim up`` fast and ``sim down`` a single kill.  Rooms are optional: a room
whose module is absent (ImportError) is skipped, so the simulator works while rooms are still being built.
The URLs go to ``endpoints.json`` only once every server listens, so a reader never sees a dead port.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import signal
import socketserver
import sys
import threading
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any

from runbook_lib.sim import pidfile, toolserver
from runbook_lib.sim.state import atomic_write, sim_paths

#: The Kubernetes API is the real control plane's (``realkube``): the Python API server's "kube" room was retired on
#: 2 Dec 2026.
ROOMS = {"factory": "runbook_lib.sim.factory"}
log = logging.getLogger("runbook_lib.sim.daemon")


def _url(server: socketserver.BaseServer) -> str:
    url = getattr(server, "url", None)
    if isinstance(url, str):
        return url
    address = server.server_address
    if not isinstance(address, tuple):
        raise TypeError(f"room server is not bound to a TCP address: {address!r}")
    host, port = address[0], address[1]
    return f"http://{host!s}:{port}"


def _load_room(module_name: str) -> ModuleType | None:
    try:
        return importlib.import_module(module_name)
    except ImportError as exc:
        log.warning("room %s skipped: %s", module_name, exc)
        return None


def _close(server: socketserver.BaseServer) -> None:
    server.shutdown()
    server.server_close()


def run(state_dir: Path, rooms: list[str] | None = None) -> int:
    """Serve the rooms named in ``rooms`` (default: all) plus the tool server until SIGTERM."""
    paths = sim_paths(state_dir)
    # First, while this process has no thread: fork() and threads do not mix.
    tools_pid = toolserver.start(state_dir)
    servers: list[socketserver.BaseServer] = []
    endpoints: dict[str, Any] = {}
    started: list[tuple[ModuleType, str]] = []
    for key, module_name in ROOMS.items():
        if rooms is not None and key not in rooms:
            continue
        module = _load_room(module_name)
        if module is None or not hasattr(module, "make_server"):
            continue
        server: socketserver.BaseServer = module.make_server(state_dir)
        servers.append(server)
        threading.Thread(target=server.serve_forever, name=f"sim-{key}", daemon=True).start()
        endpoints[key] = _url(server)
        started.append((module, endpoints[key]))
    for module, url in started:
        hook = getattr(module, "on_started", None)
        if callable(hook):
            hook(state_dir, url)
    stop = threading.Event()

    def _terminate(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGINT, _terminate)
    endpoints["pid"] = os.getpid()
    if tools_pid is not None:
        endpoints["tools"] = f"unix:@{toolserver.socket_name(state_dir)}"
        endpoints["tools_pid"] = tools_pid
    pidfile.write(paths.pid)
    atomic_write(paths.endpoints, json.dumps(endpoints, indent=1))
    log.info(
        "simulator daemon %d serving %s",
        os.getpid(),
        {k: v for k, v in endpoints.items() if not k.endswith("pid")},
    )
    stop.wait()
    if tools_pid is not None:
        toolserver.stop(tools_pid)
    # Shut the rooms down in parallel (each ``shutdown`` waits out a poll interval), but never hang on one.
    closers = [threading.Thread(target=_close, args=(server,), daemon=True) for server in servers]
    for t in closers:
        t.start()
    for t in closers:
        t.join(timeout=2.0)
    recorded = pidfile.read(paths.pid)
    if recorded is not None and recorded[0] == os.getpid():
        paths.pid.unlink(missing_ok=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runbook_lib.sim.daemon")
    parser.add_argument("--state", required=True, type=Path)
    parser.add_argument(
        "--rooms",
        default=",".join(ROOMS),
        help=f"comma-separated rooms to serve (default: all of {', '.join(ROOMS)}); the tool server always runs",
    )
    args = parser.parse_args(argv)
    rooms = [r for r in args.rooms.split(",") if r]
    unknown = sorted(set(rooms) - set(ROOMS))
    if unknown:
        parser.error(f"unknown room(s) {', '.join(unknown)}; valid: {', '.join(ROOMS)}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    return run(args.state, rooms)


if __name__ == "__main__":
    sys.exit(main())
