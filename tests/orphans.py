"""Simulated clusters that a killed pytest left running: found and stopped when the next session starts.

Why: a test's cluster (simnode, simkube with kube-apiserver, etcd, kube-scheduler and kwok, the node agent) is
stopped by its fixture's ``finally``.  A pytest killed with SIGTERM (``timeout``, a CI runner cancelling a job)
or SIGKILL runs no ``finally``, and those servers, started in sessions of their own (their parent becomes
PID 1), keep running.  On 4 Dec 2026 a ``timeout 900 pytest`` left one cluster running for 35 minutes, its
simulated kubelets taking CPU under every later test and benchmark on the 2 cores.

Each session writes its pid into its base temporary directory (:data:`OWNER_FILE`); a process whose command
line names a base directory whose owner is gone is stopped.  A base directory without an owner file (a
session started before this check existed, or one still starting) is left alone: it may belong to a pytest
that is running, and stopping a live session's cluster would fail its tests.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from pathlib import Path

#: Written into each session's base temporary directory (``pytest-N``): the controller's pid.
OWNER_FILE = "owner.pid"


def mark_owner(basetemp: Path, pid: int | None = None) -> None:
    (basetemp / OWNER_FILE).write_text(str(pid or os.getpid()), encoding="utf-8")


def _argv(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return raw.decode(errors="replace").split("\0")


def _is_pytest(argv: list[str]) -> bool:
    """``pytest …``, ``python -m pytest …`` or ``py.test …`` (the program, not a path that names pytest-N)."""
    return any(Path(arg).name in ("pytest", "py.test") for arg in argv[:3])


def _running(pid: int) -> bool:
    """Alive and not a zombie (a stopped child of ours stays in /proc until waited for)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def owner_alive(basetemp: Path) -> bool | None:
    """Whether the pytest that owns ``basetemp`` runs (its pid, still a pytest: pids are reused); None
    when the directory has no owner file."""
    try:
        pid = int((basetemp / OWNER_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return _running(pid) and _is_pytest(_argv(pid))


def orphans(root: Path, current: Path | None = None) -> list[tuple[int, Path]]:
    """Processes naming a base directory under ``root`` (``/tmp/pytest-of-<user>``) whose owner is gone,
    with that directory; never a pytest process, this process, or one of ``current`` (this session's)."""
    pattern = re.compile(re.escape(str(root)) + r"/(pytest-\d+)(?:/|\s|$)")
    found: list[tuple[int, Path]] = []
    owners: dict[Path, bool | None] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        argv = _argv(int(entry.name))
        match = pattern.search(" ".join(argv))
        if match is None or _is_pytest(argv) or not _running(int(entry.name)):
            continue
        basetemp = root / match.group(1)
        if current is not None and basetemp == current:
            continue
        if basetemp not in owners:
            owners[basetemp] = owner_alive(basetemp)
        if owners[basetemp] is False:
            found.append((int(entry.name), basetemp))
    return found


def stop(pids: list[int], grace_s: float = 5.0) -> list[int]:
    """SIGTERM, then SIGKILL what still runs after ``grace_s``; returns the pids that were running."""
    sent = []
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
            sent.append(pid)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_s
    while any(_running(p) for p in sent) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in sent:
        if _running(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    return sent
