"""The simulator's tool server: simulated ``talosctl``/``helm`` calls at the process cost of a Go binary.

Why it exists: every simulated tool call was a fresh Python process, ~45-85 ms of CPU before it reached a
node, where the real ``talosctl`` starts in a few ms.  At 1,000 nodes a fleet-wide verify starts 1,000
``talosctl read`` processes, so the simulator's start-up, not the runbook, decided the fleet benchmarks
(``benchmarks/README.md``).  A zygote fixes that without changing what a call does:

- the daemon forks this server before it starts any thread; the server imports the simulated tools once
  and listens on an abstract unix socket named after the state dir; it serves its own uid only, and
  ``simtool`` talks only to a server of its own uid (``SO_PEERCRED`` on both ends: an abstract name has no
  file permissions, so another local user could otherwise call it or bind the name first);
- ``bin/talosctl`` runs ``simtool`` (``simtool.c``, compiled once per machine into the user's cache),
  which connects, sends argv, environment and working directory, and passes its own stdin, stdout and
  stderr as file descriptors;
- the server forks per call; the child puts those descriptors in place of its own, runs the same
  ``main()`` that ``python -m runbook_lib.sim.talosctl`` runs, and sends back the exit code, which
  ``simtool`` exits with.

Each call is still its own process (cross-process ``fcntl`` locks, per-process caches and crashes behave
as before), streams are the caller's own pipes, and without a listening server (no daemon, no C compiler,
or ``RUNBOOK_SIM_TOOLSERVER=0``) ``simtool`` execs the plain Python module instead.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import gc
import hashlib
import importlib
import io
import logging
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("runbook_lib.sim.toolserver")

SOURCE = Path(__file__).with_name("simtool.c")
DISABLE_ENV = "RUNBOOK_SIM_TOOLSERVER"
# What the children run: the entry points of ``python -m runbook_lib.sim.<tool>``, and nothing else.
ENTRY_POINTS: dict[str, tuple[str, str]] = {
    "runbook_lib.sim.talosctl": ("runbook_lib.sim.talosctl.main", "main"),
}
# Imported once in the server so that no call pays for them; the tools import them lazily on purpose
# (they keep the plain ``python -m`` path cheap), so they are named here.
PRELOAD = (
    "runbook_lib.sim.talosctl.main",
    "runbook_lib.sim.talosctl.images",
    "runbook_lib.sim.patching",
    "runbook_lib.sim.faults",
    "runbook_lib.sim.catalog",
    "yaml",
    "jsonpatch",
    "requests",
)
_PR_SET_PDEATHSIG = 1


def socket_name(state_dir: Path) -> str:
    """Abstract socket name for a state dir (no path length limit, nothing to clean up on disk)."""
    digest = hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:24]
    return f"runbook-sim-{os.getuid()}-{digest}"


# ---------------------------------------------------------------- the client binary


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "talos-gpu-runbooks"


def client_binary() -> Path | None:
    """``simtool`` compiled for this machine, or None when there is no C compiler (then tools run as before).

    Built once per version of ``simtool.c`` (the file name carries its hash), atomically, so concurrent
    ``sim up`` calls never see half a binary.
    """
    if os.environ.get(DISABLE_ENV) == "0":
        return None
    source = SOURCE.read_bytes()
    target = _cache_dir() / f"simtool-{hashlib.sha256(source).hexdigest()[:16]}"
    if os.access(target, os.X_OK):
        return target
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not compiler:
        log.info("no C compiler: simulated tools run as plain Python processes")
        return None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".simtool-")
        os.close(fd)
        done = subprocess.run(
            [compiler, "-O2", "-o", tmp, str(SOURCE)], capture_output=True, text=True, timeout=60, check=False
        )
        if done.returncode != 0:
            log.warning("cannot compile %s (%s): %s", SOURCE, compiler, done.stderr.strip()[:500])
            os.unlink(tmp)
            return None
        os.chmod(tmp, 0o755)
        os.replace(tmp, target)
    except OSError as exc:
        log.warning("cannot build the simulator's tool client in %s: %s", target.parent, exc)
        return None
    return target


# ---------------------------------------------------------------- the server


def start(state_dir: Path) -> int | None:
    """Fork the tool server (call before any thread exists); return its pid once it listens.

    None when the server could not listen: the tools then fall back to plain processes, which is slower
    but equally correct, so the daemon goes on without it.
    """
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the server
        os.close(read_end)
        code = 1
        try:
            code = _serve(state_dir, write_end)
        except BaseException:  # the daemon's log is the only place to say why
            traceback.print_exc()
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as ready:
        ok = ready.read(1) == b"1"
    if not ok:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
        return None
    return pid


def stop(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def _die_with(parent: int) -> None:
    """SIGTERM this process when ``parent`` ends, even by SIGKILL (Linux ``PR_SET_PDEATHSIG``), and exit now if
    it ended before the call was made."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:
        os._exit(1)


def _serve(state_dir: Path, ready_fd: int) -> int:
    parent = os.getppid()
    _die_with(parent)  # with the daemon
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for name in PRELOAD:
        importlib.import_module(name)
    entry = {
        module: getattr(importlib.import_module(target), attr)
        for module, (target, attr) in ENTRY_POINTS.items()
    }
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind("\0" + socket_name(state_dir))
    except OSError as exc:
        log.warning(
            "tool server not started: %s%s; simulated tools run as plain processes",
            exc,
            _holder(socket_name(state_dir)),
        )
        os.write(ready_fd, b"0")
        return 1
    listener.listen(256)
    # Reap finished calls as they end (not SIG_IGN: only waited-for children add their CPU time to this
    # process's, which is how the benchmarks count what the simulated tools cost).
    signal.signal(signal.SIGCHLD, _reap)
    sys.stdout.flush()
    sys.stderr.flush()
    gc.freeze()  # keep the imported objects' pages shared with every child (no copy on the first GC)
    os.write(ready_fd, b"1")
    os.close(ready_fd)
    log.info("tool server %d listening on @%s", os.getpid(), socket_name(state_dir))
    while os.getppid() == parent:
        readable, _, _ = select.select([listener], [], [], 1.0)
        if not readable:
            continue
        try:
            conn, _ = listener.accept()
        except OSError:
            continue
        if not _is_owner(conn):
            conn.close()
            continue
        server = os.getpid()
        if os.fork() == 0:
            # with the server: a call still running when the simulator stops (a hung `upgrade --wait`) was left
            # running on its own for minutes (operator walkthrough, stop 54)
            _die_with(server)
            listener.close()
            code = 0
            try:
                _call(conn, entry)
            except BaseException:  # a broken call must not take the server down
                traceback.print_exc()
                code = 1
            finally:
                os._exit(code)
        conn.close()
    return 0


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of a connected unix socket (``SO_PEERCRED``, set by the kernel)."""
    _pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    return int(uid)


def _holder(name: str) -> str:
    """Who listens on ``name`` already (a user other than the owner squatting it is worth saying)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect("\0" + name)
            uid = peer_uid(probe)
        except OSError:
            return ""
    return f" (@{name} is held by uid {uid}{', another user' if uid != os.geteuid() else ''})"


def _is_owner(conn: socket.socket) -> bool:
    """Serve only the user the simulator belongs to.

    An abstract socket has no file permissions: any local user can connect, and a call runs the tools as
    the owner with the caller's argv, cwd and environment (it would hand another user the owner's
    kubeconfig, or write files as the owner).  The kernel's record of the caller's uid decides.
    """
    try:
        uid = peer_uid(conn)
    except OSError:
        return False
    if uid != os.geteuid():
        log.warning("tool server: refused a call from uid %d (serves uid %d only)", uid, os.geteuid())
        return False
    return True


def _reap(_signum: int, _frame: object) -> None:
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass


def _recv_exact(conn: socket.socket, size: int, head: bytes = b"") -> bytes:
    chunks = [head]
    got = len(head)
    while got < size:
        chunk = conn.recv(min(size - got, 1 << 20))
        if not chunk:
            raise ConnectionError("simtool closed the connection mid-request")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _call(conn: socket.socket, entry: dict[str, Callable[[list[str]], int]]) -> None:
    """One tool call, in a fresh child of the server: become the caller's process, then run the tool."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    head, fds, _flags, _addr = socket.recv_fds(conn, 16, 3)
    header = _recv_exact(conn, 16, head)
    payload = _recv_exact(conn, int(header))
    fields = payload.split(b"\0")
    if fields[0] != b"1" or len(fds) != 3:
        raise ValueError("simtool and the tool server disagree on the protocol; rerun `runbook sim up`")
    module, cwd = os.fsdecode(fields[1]), fields[2]
    argc = int(fields[3])
    argv = [os.fsdecode(a) for a in fields[4 : 4 + argc]]
    envc = int(fields[4 + argc])
    environ = fields[5 + argc : 5 + argc + envc]
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8")
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8", line_buffering=True)
    os.chdir(cwd)
    os.environb.clear()
    for item in environ:
        key, _, value = item.partition(b"=")
        os.environb[key] = value
    sys.argv = [module.rsplit(".", 1)[-1], *argv]
    code = 1
    try:
        main = entry.get(module)
        if main is None:
            sys.stderr.write(f"simtool: {module} is not a simulated tool\n")
            code = 127
        else:
            code = main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            sys.stderr.write(f"{exc.code}\n")
    except BaseException:  # what an uncaught exception in `python -m` prints
        traceback.print_exc()
        code = 1
    finally:
        atexit._run_exitfuncs()  # what interpreter exit would run (helm's temporary CA file)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
    conn.sendall(str(code).encode())
    conn.close()
