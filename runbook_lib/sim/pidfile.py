"""The simulator daemon's pid file, and whether the pid it names is still that daemon.

Why: ``sim down`` and ``runbook run`` stop the daemon by the pid in ``daemon.pid``.  After a daemon crash
or a reboot that pid belongs to some other process, and signalling it (SIGTERM, then SIGKILL) would kill
whatever the user was running.  So the file also records the process's start time (``/proc/<pid>/stat``,
field 22: clock ticks since boot, unique per pid for the life of the machine), and a pid counts as the
daemon only while its start time matches and its command line is ``-m runbook_lib.sim.daemon --state``
this state dir.
"""

from __future__ import annotations

import os
from pathlib import Path

from runbook_lib.sim.state import atomic_write

DAEMON_MODULE = "runbook_lib.sim.daemon"


def start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot; None when there is no such (live) process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # comm (field 2) is in parentheses and may hold spaces or ')': the fields after it follow the last ')'.
    fields = stat[stat.rfind(")") + 2 :].split()
    if len(fields) < 20 or fields[0] == "Z":  # a zombie has exited: it is not the daemon any more
        return None
    return fields[19]


def write(path: Path) -> None:
    """Record this process as the daemon: ``<pid> <start time>``."""
    pid = os.getpid()
    atomic_write(path, f"{pid} {start_time(pid) or ''}".strip() + "\n")


def read(path: Path) -> tuple[int, str | None] | None:
    """(pid, start time) from a pid file; start time None for a file written before it was recorded. None for
    what is no process's id: ``0`` and ``-1`` made ``sim down`` crash in ``os.pidfd_open`` (attack re-run, 7 Dec
    2026); to ``kill`` they mean the process group and every process."""
    try:
        parts = path.read_text().split()
        pid = int(parts[0])
    except (OSError, ValueError, IndexError):
        return None
    return (pid, parts[1] if len(parts) > 1 else None) if pid > 0 else None


def _state_arg(argv: list[str], cwd: str) -> str | None:
    if DAEMON_MODULE not in argv or "--state" not in argv[:-1]:
        return None
    return os.path.realpath(os.path.join(cwd, argv[argv.index("--state") + 1]))


def is_daemon(pid: int, started: str | None, state_dir: Path) -> bool:
    """True only if ``pid`` is, right now, the simulator daemon of ``state_dir`` that wrote the pid file."""
    now = start_time(pid)
    if now is None or (started is not None and now != started):
        return False
    try:
        argv = [os.fsdecode(a) for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")]
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return False
    return _state_arg(argv, cwd) == os.path.realpath(state_dir)
