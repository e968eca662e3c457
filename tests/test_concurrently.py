"""The library's one fan-out helper (``runbook_lib.clients.fanout.concurrently``), used by the talosctl client
(processes per chunk or node) and ``Kube.each`` (API calls per node).

What callers rely on: results in job order, at most ``limit`` jobs at once, and on an error or Ctrl-C no job
left running when it returns (cuda-test deletes every pod whose creation was sent, a change record lists every
call in flight) and no new job started after it.  Each test observes the jobs themselves, never a wall clock.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import _base as futures_base
from pathlib import Path

import pytest

from runbook_lib.clients import fanout
from runbook_lib.clients.fanout import Pool, concurrently


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


def waiting_for_jobs(thread: int, function: str = "wait", file: str = futures_base.__file__) -> None:
    """Return once ``thread`` runs ``function`` of ``file`` (by default ``concurrent.futures.wait``: its jobs
    all submitted), so that a signal sent next comes while it waits there."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        frame = sys._current_frames().get(thread)
        while frame is not None:
            if frame.f_code.co_name == function and frame.f_code.co_filename == file:
                return
            frame = frame.f_back
        time.sleep(0.001)
    raise AssertionError(f"the calling thread never reached {function}")


def waiting_for_the_running_jobs(thread: int) -> None:
    """Return once ``thread`` waits in the fan-out's exit for the jobs still running."""
    waiting_for_jobs(thread, "_wait_for_running", fanout.__file__)


@contextlib.contextmanager
def ctrl_c_raises() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt, as in a terminal or a Jupyter kernel running a cell."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


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

    with ctrl_c_raises(), pytest.raises(KeyboardInterrupt):
        concurrently(job, list(range(400)), 4)
    with jobs.lock:
        assert sorted(jobs.started) == sorted(jobs.ended), "a job was still running when it raised"
        assert len(jobs.started) < 400, "jobs after the interrupt were started anyway"


def test_a_single_job_runs_in_the_calling_thread() -> None:
    """No pool for one job (a one-node cluster): its exception comes straight from the call."""
    assert concurrently(lambda _: threading.get_ident(), [0], 8) == [threading.get_ident()]
    assert concurrently(lambda n: n, [], 8) == []


#: Run in a fresh interpreter by the test below, so that a hang fails the test instead of the test session.
_EVERY_POINT = r"""
import signal, sys, threading, time
from concurrent.futures import _base as futures_base
from concurrent.futures import thread as futures_thread
from runbook_lib.clients.fanout import Pool, concurrently

FUTURES_FILES = {futures_base.__file__, futures_thread.__file__}
main = threading.main_thread().ident
# Ctrl-C raises, as in a terminal or a kernel; a Python started by a background job inherits SIGINT ignored
signal.signal(signal.SIGINT, signal.default_int_handler)
started, ended = [], []

def job(n):
    started.append(n)
    time.sleep(0.002)
    ended.append(n)
    return n

def interrupt_at(k, seen):
    # Count the lines this (the main) thread runs inside concurrent.futures; SIGINT to it at the k-th.
    def trace(frame, event, arg):
        if frame.f_code.co_filename in FUTURES_FILES:
            if event == "line":
                seen[0] += 1
                if seen[0] == k:
                    signal.pthread_kill(main, signal.SIGINT)
            return trace
        return None
    return trace

def call(k):
    started.clear(); ended.clear()
    seen = [0]
    sys.settrace(interrupt_at(k, seen))
    try:
        if sys.argv[2] == "concurrently":
            concurrently(job, list(range(12)), 4)
        else:  # a batch's upgrades (steps/image.py): results as they come
            with Pool(4) as pool:
                for future in pool.as_completed([pool.submit(job, n) for n in range(12)]):
                    future.result()
        raised = "nothing"
    except KeyboardInterrupt:
        raised = "KeyboardInterrupt"
    finally:
        sys.settrace(None)
    return seen[0], raised

lines, _ = call(0)  # no signal: how many lines one call runs there (submit, wait, result, shutdown)
for k in range(1, lines + 1, int(sys.argv[1])):
    print("point", k, "of", lines, flush=True)
    seen, raised = call(k)
    if seen < k:
        continue  # this call ran fewer lines (fewer waits): the point was not reached
    assert raised == "KeyboardInterrupt", f"point {k}: the Ctrl-C was lost ({raised} raised)"
    assert sorted(started) == sorted(ended), f"point {k}: a job still ran when it returned"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler, f"point {k}: handler not restored"
print("all points", flush=True)
"""


@pytest.mark.parametrize("fan_out", ["concurrently", "as_completed"])
def test_ctrl_c_at_any_point_of_the_wait_neither_hangs_nor_is_lost(tmp_path: Path, fan_out: str) -> None:
    """A Ctrl-C landing while the calling thread is inside ``concurrent.futures`` (holding a future's lock in
    ``wait``'s ``_AcquireFutures``, or in ``shutdown``) must still end the call with ``KeyboardInterrupt``.

    Found in CI on 4 Dec (f6f0320) and reproduced here (1 in ~6,000 runs of the test above, 4 at once on
    2 cores): the interrupt raised inside ``wait`` after it had taken some futures' condition locks, which
    stayed taken; the worker threads then blocked for good in ``Future.set_result`` and ``shutdown``'s join
    never returned (faulthandler: pool threads at ``_base.py`` ``set_result`` -> ``threading.py``
    ``__enter__``, the main thread at ``Thread.join``).  Raised inside ``submit`` instead, the call returned
    with a job still running (point 49 below, before the fix).  A handler's exception can land between any
    two bytecodes, so this sends SIGINT at every third line the calling thread runs in ``concurrent.futures``
    (submit, wait, result, shutdown), one call per point.  The kernel of a ``runbook run`` runs the steps'
    fan-outs, and an interrupt reaches it as SIGINT (``interrupts.end_cell``).  ``as_completed`` is how a
    batch's upgrades are waited for (``steps/image.py``), which used ``concurrent.futures.as_completed``.
    """
    stride = (
        3  # ~300 points for concurrently, ~590 for as_completed; a lock's window in wait: 2 lines a future
    )
    script = tmp_path / "every_point.py"
    script.write_text(_EVERY_POINT, encoding="utf-8")
    try:
        done = subprocess.run(
            [sys.executable, str(script), str(stride), fan_out],
            capture_output=True,
            check=False,
            text=True,
            timeout=120,
            cwd=Path(__file__).resolve().parent.parent,
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        last = out.strip().splitlines()[-1:] or ["before the first point"]
        pytest.fail(f"concurrently hung after a Ctrl-C at {last[0]}")
    assert done.returncode == 0, done.stdout[-500:] + done.stderr[-3000:]
    assert "all points" in done.stdout


def test_a_fan_out_from_another_thread_leaves_the_signal_handlers_alone() -> None:
    """Off the main thread no handler can be set (``signal.signal`` raises ValueError there) or needs to be:
    Python runs handlers on the main thread only.  A fan-out inside a fan-out's job is such a call."""
    with ctrl_c_raises():  # a Python handler, which the main thread's fan-out would defer
        inner = concurrently(lambda n: concurrently(lambda m: n * 10 + m, [0, 1], 2), [1, 2], 2)
        assert inner == [[10, 11], [20, 21]]
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_second_ctrl_c_stops_waiting_for_a_job_that_never_returns() -> None:
    """The first Ctrl-C waits for the running jobs; a second one while it waits raises at once.  A job that
    never returns (an API call to a server that went silent: the Kubernetes client's calls have no timeout)
    must not leave the kernel impossible to interrupt."""
    main, release, ended, running = threading.get_ident(), threading.Event(), list[int](), threading.Event()

    def job(n: int) -> int:
        if n == 0:
            running.wait(30)  # job 1 has started, so the first Ctrl-C has it to wait for
            waiting_for_jobs(main)
            signal.pthread_kill(main, signal.SIGINT)
            waiting_for_the_running_jobs(main)
            signal.pthread_kill(main, signal.SIGINT)
            return n
        running.set()
        release.wait(30)  # stuck until the test ends
        ended.append(n)
        return n

    try:
        with ctrl_c_raises(), pytest.raises(KeyboardInterrupt):
            concurrently(job, [0, 1], 2)
        assert ended == [], "it waited for the stuck job despite the second Ctrl-C"
    finally:
        release.set()


def test_a_ctrl_c_while_a_failed_fan_out_waits_for_its_running_jobs_is_not_lost() -> None:
    """A job's error ends the fan-out; a Ctrl-C that comes while the jobs still running are waited for is the
    user's first: it waits for them too, then raises, with the job's error as its context."""
    main, ended, running = threading.get_ident(), list[int](), threading.Event()

    def job(n: int) -> int:
        if n == 0:
            running.wait(30)  # job 1 has started: it is a running job, not one cancelled before its start
            raise RuntimeError("node 0 failed")
        running.set()
        waiting_for_the_running_jobs(main)
        signal.pthread_kill(main, signal.SIGINT)
        time.sleep(0.3)  # still running after the Ctrl-C
        ended.append(n)
        return n

    with ctrl_c_raises(), pytest.raises(KeyboardInterrupt) as raised:
        concurrently(job, [0, 1], 2)
    assert ended == [1], "the running job was not waited for"
    assert isinstance(raised.value.__context__, RuntimeError)


def _sigterm_exits(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)  # as runbook run's SIGTERM handler (cmd_run._terminate)


@contextlib.contextmanager
def only_sigterm_raises() -> Iterator[None]:
    """SIGINT ignored (a run started in the background), SIGTERM raising: ``runbook run`` under a CI job."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN), signal.signal(signal.SIGTERM, _sigterm_exits)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous[0])
        signal.signal(signal.SIGTERM, previous[1])


@pytest.mark.parametrize(
    ("sig", "handlers", "raised"),
    [(signal.SIGINT, ctrl_c_raises, KeyboardInterrupt), (signal.SIGTERM, only_sigterm_raises, SystemExit)],
    ids=["sigint", "sigterm-with-sigint-ignored"],
)
def test_a_fan_out_inside_a_pools_block_takes_the_signal_at_once(
    sig: signal.Signals, handlers: Callable[[], contextlib.AbstractContextManager[None]], raised: type
) -> None:
    """``concurrently`` called on the main thread inside a ``Pool``'s block (a step's own pool): the signal
    stops the inner fan-out at its next check, not after the outer block, and the handlers are back after."""
    main, jobs = threading.get_ident(), Jobs()

    def job(n: int) -> int:
        jobs.enter(n)
        if n == 0:
            waiting_for_jobs(main)
            signal.pthread_kill(main, sig)
        time.sleep(0.05)
        jobs.leave(n)
        return n

    with handlers():
        before = signal.getsignal(sig)
        with pytest.raises(raised), Pool(2) as pool:
            pool.result(pool.submit(time.sleep, 0))
            concurrently(job, list(range(40)), 2)  # 40 jobs of 0.05 s, 2 at once: 1 s if not stopped
            pytest.fail("the inner fan-out ran to its end")
        assert signal.getsignal(sig) is before
    assert len(jobs.started) < 40
    assert sorted(jobs.started) == sorted(jobs.ended)
