"""Locks that keep concurrent ``runbook run`` processes apart (``fcntl.flock``, released by the kernel even
when a run is killed, so a lock is never stale).

Why: two ``--apply`` runs against one cluster both upgraded and rebooted every node, and a run that ended
stopped the simulator another run was using (F8 of the 1 Dec attack).  So:

- a run that applies holds :func:`exclusive` locks on its records folder and on its cluster; a second one
  stops at once (exit 2) and says who holds the lock (user, host, pid, start time, command);
- every run using the simulator holds a :func:`lease`; the simulator is stopped only by the last run out
  (:func:`live_leases`), so one run never stops it under another.

Plan-only runs take no exclusive lock: they only read the cluster.  Sealing is ordered by the records
folder's own chain lock (``records.seal``).

A lock's file exists only while it is held (:func:`_acquire`, :func:`_release`), and a lease directory only
while a lease is in it: one file per cluster, state dir or test run kept ``~/.cache/talos-gpu-runbooks/locks``
growing (2,715 files on this project's machine after a day of test runs).
"""

from __future__ import annotations

import contextlib
import fcntl
import getpass
import hashlib
import json
import os
import shlex
import socket
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from runbook_lib.errors import PermanentError

#: Where the per-cluster locks live (default ``$XDG_CACHE_HOME`` or ``~/.cache``, then
#: ``talos-gpu-runbooks/locks``).
LOCKS_ENV = "RUNBOOK_LOCKS"
#: The lock file an applying run holds in its records folder.
RECORDS_LOCK = ".apply.lock"


class Busy(PermanentError):
    """Another run holds the lock: nothing was started."""


def locks_dir() -> Path:
    """The owner-only directory of the per-cluster locks and simulator leases (created when missing).

    One that cannot be made is a :class:`PermanentError` naming it and ``$RUNBOOK_LOCKS``: it was a
    ``FileNotFoundError`` traceback (``XDG_CACHE_HOME`` pointing nowhere, a read-only home in a container)."""
    configured = os.environ.get(LOCKS_ENV)
    if configured:
        path = Path(configured)
    else:
        cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        path = Path(cache) / "talos-gpu-runbooks" / "locks"
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise PermanentError(
            f"the locks folder {path} cannot be made ({exc.strerror or exc}): nothing was done",
            hint=f"set {LOCKS_ENV} to a folder this user can write (it holds the per-cluster locks; keep it on "
            "this machine, one per machine, so every run sees the others' locks)",
        ) from None
    return path


def key_path(kind: str, key: str, suffix: str) -> Path:
    """A file in :func:`locks_dir` for ``key`` (a cluster name, a state path: hashed, any characters)."""
    digest = hashlib.sha256(key.encode()).hexdigest()[:24]
    return locks_dir() / f"{kind}-{digest}{suffix}"


def _command() -> str:
    """This process's command line, with ``--set`` values left out (a value may be a secret)."""
    words = ["runbook", *sys.argv[1:]]
    for index, word in enumerate(words):
        if word.startswith("--set="):
            words[index] = "--set=" + word[len("--set=") :].split("=", 1)[0] + "=…"
        elif word == "--set" and index + 1 < len(words):
            words[index + 1] = words[index + 1].split("=", 1)[0] + "=…"
    return shlex.join(words)


def _user() -> str:
    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no name for this uid (a container's arbitrary user)
        return f"uid {os.getuid()}"


def _holder_text() -> str:
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return json.dumps(
        {
            "user": _user(),
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "started": started,
            "command": _command(),
        }
    )


def describe_holder(fd: int) -> str:
    """Who holds the lock open on ``fd``, as its holder wrote it: ``user@host, pid N, since T: command``."""
    try:
        data = json.loads(os.pread(fd, 65536, 0).decode("utf-8"))
        return f"{data['user']}@{data['host']}, pid {data['pid']}, since {data['started']}: {data['command']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "another run (it has not written its details yet)"


def _open(path: Path) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)


def _acquire(path: Path, *, wait: bool) -> tuple[int, bool]:
    """Open ``path`` and lock it (waiting for it when ``wait``); the descriptor and whether it is locked.

    Why the loop: a holder removes the file when it lets go (:func:`_release`), so a run that opened it just
    before may lock a file no longer at ``path`` while a third run creates and locks a new one there.  A lock
    counts only on the file that is at ``path`` once it is locked; otherwise this tries again.
    """
    while True:
        fd = _open(path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            return fd, False
        except BaseException:
            os.close(fd)
            raise
        if _is_at(fd, path):
            return fd, True
        os.close(fd)


def _is_at(fd: int, path: Path) -> bool:
    try:
        at = os.stat(path)
    except FileNotFoundError:
        return False
    own = os.fstat(fd)
    return (at.st_dev, at.st_ino) == (own.st_dev, own.st_ino)


def _release(fd: int, path: Path) -> None:
    """Remove the lock's file, then unlock it: nothing is left behind, and a run waiting on the file finds
    it gone and locks a new one (:func:`_acquire`).  Only the holder removes it, so it is still this one."""
    try:
        path.unlink(missing_ok=True)
    finally:
        os.close(fd)


def _claim(fd: int) -> None:
    """Write this run's details into a lock it now holds (read by :func:`describe_holder`)."""
    text = _holder_text().encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, text, 0)


@contextlib.contextmanager
def exclusive(path: Path, what: str) -> Iterator[None]:
    """Hold the lock ``path`` for the block, or raise :class:`Busy` naming ``what`` and the holder at once.

    Not waiting is deliberate: a second apply run should not queue up behind the first and then change a
    cluster its plan did not see.
    """
    fd, locked = _acquire(path, wait=False)
    if not locked:
        holder = describe_holder(fd)
        os.close(fd)
        raise Busy(
            f"{what} is being changed by another run ({holder}); nothing was started",
            hint="wait for that run to finish (a plan-only run, without --apply, may run alongside it)",
        )
    try:
        _claim(fd)
        yield
    finally:
        _release(fd, path)


@contextlib.contextmanager
def held(path: Path) -> Iterator[None]:
    """Hold the lock ``path`` for the block, waiting for it (short critical sections only)."""
    fd, _ = _acquire(path, wait=True)
    try:
        yield
    finally:
        _release(fd, path)


@contextlib.contextmanager
def lease(directory: Path) -> Iterator[Path]:
    """A lease file in ``directory``, locked while the block runs: "this run uses the shared resource".
    The directory goes with the last lease in it."""
    path = directory / f"{os.getpid()}-{uuid.uuid4().hex[:8]}.lease"
    fd = _create_in(directory, path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        _claim(fd)
        yield path
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        os.close(fd)
        with contextlib.suppress(OSError):  # not empty: another run's lease is in it
            directory.rmdir()


def _create_in(directory: Path, path: Path) -> int:
    """Open ``path`` in ``directory``, creating the directory; again when the last lease of another run
    removed it in between (:func:`lease`)."""
    while True:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            return _open(path)
        except FileNotFoundError:
            continue


def live_leases(directory: Path, *, own: Path | None = None) -> list[str]:
    """The holders of the other leases in ``directory`` that are still held; stale ones (a killed run's)
    are removed.  Call it under the resource's :func:`held` lock, so no lease is taken meanwhile."""
    holders = []
    for path in sorted(directory.glob("*.lease")) if directory.is_dir() else []:
        if path == own:
            continue
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holders.append(describe_holder(fd))
        else:
            path.unlink(missing_ok=True)
        finally:
            os.close(fd)
    return holders
