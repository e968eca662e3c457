"""The library's one fan-out helper (``runbook_lib.clients.proc.concurrently``), used by the talosctl client
(processes per chunk or node) and ``Kube.each`` (API calls per node).

What callers rely on: results in job order, at most ``limit`` jobs at once, and on an error or Ctrl-C no job
left running when it returns (cuda-test deletes every pod whose creation was sent, a change record lists every
call in flight) and no new job started after it.  Each test observes the jobs themselves, never a wall clock.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from concurrent.futures import _base as futures_base

import pytest

from runbook_lib.clients.proc import concurrently


class Jobs:
    """Records which jobs started and ended, and the most that ran at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.started: list[int] = []
        self.ended: list[int] = []
        self.running = 0
        self.most = 0

    def enter(self, job: int) -> None:
        with self.lock:
            self.started.append(job)
            self.running += 1
            self.most = max(self.most, self.running)

    def leave(self, job: int) -> None:
        with self.lock:
            self.running -= 1
            self.ended.append(job)


def test_results_come_in_job_order_with_at_most_limit_jobs_at_once() -> None:
    jobs = Jobs()

    def square(n: int) -> int:
        jobs.enter(n)
        time.sleep(0.002 * (20 - n))  # later jobs finish first
        jobs.leave(n)
        return n * n

    assert concurrently(square, list(range(20)), 4) == [n * n for n in range(20)]
    assert jobs.most <= 4
    assert jobs.most > 1  # they did overlap
    assert sorted(jobs.ended) == list(range(20))


@pytest.mark.parametrize("error", [RuntimeError("node 0 failed"), KeyboardInterrupt()], ids=repr)
def test_a_failing_job_stops_new_jobs_and_returns_only_after_the_running_ones(error: BaseException) -> None:
    """A job raising (an error, or ``KeyboardInterrupt`` as a patched call in tests/test_kube_fanout.py does)
    is raised to the caller once every job already running has ended; the jobs not started never start."""
    jobs = Jobs()
    failed = threading.Event()

    def job(n: int) -> int:
        jobs.enter(n)
        try:
            if n == 0:
                failed.set()
                raise error
            failed.wait(60)  # the others start before the failure and are still running after it
            time.sleep(0.05)
            return n
        finally:
            jobs.leave(n)

    with pytest.raises(type(error)):
        concurrently(job, list(range(400)), 4)
    with jobs.lock:
        assert sorted(jobs.started) == sorted(jobs.ended), "a job was still running when it raised"
        assert len(jobs.started) < 400, "jobs after the failure were started anyway"


def waiting_for_jobs(thread: int) -> None:
    """Return once ``thread`` waits in ``concurrent.futures.wait`` (its jobs all submitted): a signal then
    interrupts that wait, not a finalizer run during submission, where Python drops the KeyboardInterrupt."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        frame = sys._current_frames().get(thread)
        while frame is not None:
            if frame.f_code.co_name == "wait" and frame.f_code.co_filename == futures_base.__file__:
                return
            frame = frame.f_back
        time.sleep(0.001)
    raise AssertionError("the calling thread never waited for its jobs")


def test_ctrl_c_while_waiting_cancels_the_rest_and_waits_for_the_running_jobs() -> None:
    """SIGINT reaches the calling thread (``runbook run`` turns SIGTERM into the same interrupt) while it waits
    for the jobs: the running ones are waited for, the rest never start."""
    jobs = Jobs()
    interrupted = threading.Event()
    main = threading.get_ident()

    def job(n: int) -> int:
        jobs.enter(n)
        try:
            if n == 0:
                waiting_for_jobs(main)
                signal.pthread_kill(main, signal.SIGINT)  # where the kernel delivers a terminal's Ctrl-C
                interrupted.set()
            else:
                interrupted.wait(60)  # in flight when the interrupt comes
                time.sleep(0.05)
            return n
        finally:
            jobs.leave(n)

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            concurrently(job, list(range(400)), 4)
    finally:
        signal.signal(signal.SIGINT, previous)
    with jobs.lock:
        assert sorted(jobs.started) == sorted(jobs.ended), "a job was still running when it raised"
        assert len(jobs.started) < 400, "jobs after the interrupt were started anyway"


def test_a_single_job_runs_in_the_calling_thread() -> None:
    """No pool for one job (a one-node cluster): its exception comes straight from the call."""
    assert concurrently(lambda _: threading.get_ident(), [0], 8) == [threading.get_ident()]
    assert concurrently(lambda n: n, [], 8) == []
