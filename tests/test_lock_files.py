"""The run locks (``runbook_lib/notebook/lock.py``) leave no file behind.

Found on this project's machine: ``~/.cache/talos-gpu-runbooks/locks`` held 2,715 files after a day of test
runs (781 ``cluster-*.lock``, 966 ``sim-*.lock``, 966 ``sim-*.leases`` directories): every cluster name, state
directory and test run left its own.  A lock's file now exists only while it is held, which must not let two
runs hold one lock: a run that opened the file just before its holder removed it must not count as holding it.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from runbook_lib.notebook import lock
from tests.sim.waiting import wait_for


@pytest.fixture
def locks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "locks"
    monkeypatch.setenv(lock.LOCKS_ENV, str(directory))
    return directory


def test_apply_lock_sim_lock_and_leases_leave_the_locks_directory_empty(locks: Path) -> None:
    cluster = lock.key_path("cluster", "the cluster 'gpu'", ".lock")
    lifecycle, leases = lock.key_path("sim", "/state", ".lock"), lock.key_path("sim", "/state", ".leases")
    with lock.exclusive(cluster, "the cluster 'gpu'"):
        busy = pytest.raises(lock.Busy, match="the cluster 'gpu' is being changed by another run")
        with busy, lock.exclusive(cluster, "the cluster 'gpu'"):
            pass
        with lock.held(lifecycle), lock.lease(leases) as own, lock.lease(leases):
            assert len(lock.live_leases(leases, own=own)) == 1
    assert sorted(p.name for p in locks.iterdir()) == []


def test_a_run_waiting_on_a_removed_lock_file_holds_the_one_now_there(locks: Path) -> None:
    """B opens the lock file while A holds it and waits; A lets go (removing the file); B then holds the lock,
    and a third run C is refused while B holds it (not handed a fresh file of its own)."""
    path = lock.key_path("sim", "/state", ".lock")
    b_holds, b_done = threading.Event(), threading.Event()

    def run_b() -> None:
        with lock.held(path):
            b_holds.set()
            b_done.wait(60)

    with lock.held(path):
        b = threading.Thread(target=run_b)
        b.start()
        wait_for(lambda: b_waits_on(path), timeout=60)
    try:
        assert b_holds.wait(60)
        with pytest.raises(lock.Busy), lock.exclusive(path, "the simulator"):
            pass
    finally:
        b_done.set()
        b.join(60)
    assert not path.exists()


def b_waits_on(path: Path) -> bool:
    """Whether a lock on ``path`` is waited for (a ``->`` line of ``/proc/locks`` on the file's inode)."""
    try:
        inode = path.stat().st_ino
    except FileNotFoundError:
        return False
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if "->" in fields and fields[fields.index("->") + 5].endswith(f":{inode}"):
            return True
    return False


def test_a_locks_folder_that_cannot_be_made_is_named_not_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`runbook sim down` with XDG_CACHE_HOME pointing nowhere ended in a FileNotFoundError traceback (review)."""
    from runbook_lib.cli import main

    monkeypatch.delenv("RUNBOOK_LOCKS", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", "/proc/no-such-folder")
    assert main(["sim", "down", "--state", str(tmp_path / "sim")]) == 2
    err = capsys.readouterr().err
    assert "the locks folder /proc/no-such-folder/talos-gpu-runbooks/locks cannot be made" in err, err
    assert "set RUNBOOK_LOCKS" in err
