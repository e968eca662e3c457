"""The library's one fan-out: ``fn`` over jobs on a bounded thread pool, safe to interrupt.

Why a module of its own: interrupting a fan-out safely needs care that has nothing to do with processes.
A Python signal handler that raises (Ctrl-C's ``KeyboardInterrupt``, ``runbook run``'s SIGTERM) raises
between any two bytecodes of the main thread, and ``concurrent.futures`` is written in Python: raised inside
``wait`` after it has taken some futures' condition locks (its ``_AcquireFutures``), those locks stay taken,
the pool's threads block for good in ``Future.set_result`` and ``shutdown``'s join never returns (CI of
4 Dec, tests/test_concurrently.py).  Raised inside ``shutdown``'s join, the call returned with jobs still
running.  CPython documents the hazard: a handler's exception may be raised after any bytecode
instruction, at any point of the program (https://docs.python.org/3.11/library/signal.html, "Note on
Signal Handlers and Exceptions").  So while the
main thread fans out, SIGINT and SIGTERM only note that they came (:class:`DeferredSignals`), and their
own handlers run at points where the thread holds no lock: at the next check while it waits for its jobs
(every :data:`SIGNAL_CHECK_S`), else when its block ends.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import (
    ALL_COMPLETED,
    FIRST_COMPLETED,
    FIRST_EXCEPTION,
    Future,
    ThreadPoolExecutor,
    wait,
)
from types import FrameType, TracebackType
from typing import Any, ParamSpec, TypeVar

#: Longest a fan-out's calling thread blocks before it runs the handlers of signals that came meanwhile.
SIGNAL_CHECK_S = 0.2
#: The signals whose Python handlers are deferred: Ctrl-C, and SIGTERM, which ``runbook run`` turns into an
#: exception.  (In a Jupyter kernel only SIGINT has a Python handler; SIGTERM's default ends the process.)
DEFERRED = (signal.SIGINT, signal.SIGTERM)
_Job = TypeVar("_Job")
_Out = TypeVar("_Out")
_P = ParamSpec("_P")
_Handler = Callable[[int, FrameType | None], Any]


def _is_interrupt(exc: BaseException | None) -> bool:
    return isinstance(exc, KeyboardInterrupt | SystemExit)


class DeferredSignals:
    """While entered on the main thread: SIGINT/SIGTERM are noted, and :meth:`deliver` runs their handlers.

    Only signals with a Python handler are deferred; SIG_DFL and SIG_IGN stay as they are (the kernel acts
    on those, no Python code runs).  On any other thread it does nothing: Python runs handlers on the main
    thread only, so no handler can raise elsewhere.  Entered while another is (a fan-out inside a fan-out's
    body), it hands everything to that outer one.  On exit the handlers are put back, and signals still
    noted are delivered unless the block is already ending with an interrupt (then they are repeats of it):
    a Ctrl-C is not lost when a job's error ends the fan-out, it comes with that error as its context.
    """

    def __init__(self) -> None:
        self._saved: dict[int, _Handler] = {}
        self._pending: list[tuple[int, FrameType | None]] = []
        self._outer: DeferredSignals | None = None

    def __enter__(self) -> DeferredSignals:
        if threading.current_thread() is not threading.main_thread():
            return self
        for sig in DEFERRED:
            outer = getattr(signal.getsignal(sig), "__self__", None)
            if isinstance(outer, DeferredSignals):
                self._outer = outer
                return self
        for sig in DEFERRED:
            handler = signal.getsignal(sig)
            if callable(handler):
                self._saved[sig] = handler
                signal.signal(sig, self._note)
        return self

    def _note(self, signum: int, frame: FrameType | None) -> None:
        self._pending.append((signum, frame))

    @property
    def pending(self) -> int:
        """How many signals came and were not delivered yet."""
        return self._outer.pending if self._outer else len(self._pending)

    def deliver(self) -> None:
        """Run the handlers of the signals noted so far, in the order they came (the first to raise ends it)."""
        if self._outer:
            self._outer.deliver()
            return
        while self._pending:
            signum, frame = self._pending.pop(0)
            self._saved[signum](signum, frame)

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._outer:
            if not _is_interrupt(exc):
                self._outer.deliver()
            return
        raised = self._restore()
        pending = self._pending_and_clear()
        self._run([] if _is_interrupt(exc) else pending, raised)

    def _restore(self) -> BaseException | None:
        """Put every saved handler back.  ``signal.signal`` first runs the handlers of signals that came, so a
        restored one may raise before the next is restored: that exception is kept for after the loop."""
        raised: BaseException | None = None
        handlers = self._saved
        while handlers:
            sig, handler = next(iter(handlers.items()))
            try:
                signal.signal(sig, handler)
            except BaseException as exc:
                raised = raised or exc
                continue
            del handlers[sig]
        self._saved = {}
        return raised

    def _pending_and_clear(self) -> list[tuple[int, FrameType | None]]:
        pending, self._pending = self._pending, []
        return pending

    def _run(self, pending: list[tuple[int, FrameType | None]], raised: BaseException | None) -> None:
        if raised is not None:
            raise raised
        for signum, frame in pending:
            handler = signal.getsignal(signum)
            if callable(handler):
                handler(signum, frame)


class Pool:
    """A bounded thread pool whose waits a Ctrl-C cannot break: the steps' own fan-outs (a batch's upgrades,
    verify's reads) use it where they need futures rather than :func:`concurrently`'s list.

    Entered, it defers SIGINT/SIGTERM (:class:`DeferredSignals`); its waits deliver them between slices of
    :data:`SIGNAL_CHECK_S`.  On exit, on success or not, the jobs not started are cancelled and the running
    ones waited for, so a caller's ``finally`` sees every call that may have reached the cluster.  One more
    Ctrl-C while it waits for them (after the interrupt that ended the block, or a second one after an error
    or a normal end) stops that wait and raises at once: a job that never returns (an API call to a server
    that went silent) must not make the kernel impossible to interrupt.  That job's thread then outlives
    the block, and Python waits for it when the process exits (``concurrent.futures`` joins its threads).
    """

    def __init__(self, limit: int) -> None:
        self._limit = max(1, limit)
        self._signals = DeferredSignals()
        self._pool: ThreadPoolExecutor | None = None
        self._futures: list[Future[Any]] = []

    def __enter__(self) -> Pool:
        self._signals.__enter__()
        try:
            self._pool = ThreadPoolExecutor(max_workers=self._limit)
        except BaseException as exc:
            self._signals.__exit__(type(exc), exc, exc.__traceback__)
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            if self._pool is not None:
                self._pool.shutdown(wait=False, cancel_futures=True)
                self._wait_for_running(1 if _is_interrupt(exc) else 2)
                self._pool.shutdown(wait=True)  # every job has returned: the threads end at once
        finally:
            self._signals.__exit__(exc_type, exc, tb)

    def _wait_for_running(self, signals_to_stop: int) -> None:
        running = {f for f in self._futures if not f.done()}
        while running:
            _, running = wait(running, timeout=SIGNAL_CHECK_S)
            if self._signals.pending >= signals_to_stop:
                self._signals.deliver()  # the handler's exception ends the wait; still deferred till the end

    def submit(self, fn: Callable[_P, _Out], /, *args: _P.args, **kwargs: _P.kwargs) -> Future[_Out]:
        assert self._pool is not None, "Pool used outside its with block"
        future = self._pool.submit(fn, *args, **kwargs)
        self._futures.append(future)
        return future

    def wait(self, futures: Iterable[Future[Any]], return_when: str = ALL_COMPLETED) -> set[Future[Any]]:
        """Block until ``return_when`` holds for ``futures`` (as ``concurrent.futures.wait``); the done ones.

        Between slices the signals that came are delivered: a handler's exception is raised here, where
        this thread holds none of ``concurrent.futures``' locks.
        """
        pending, finished = set(futures), set[Future[Any]]()
        while pending:
            done, pending = wait(pending, timeout=SIGNAL_CHECK_S, return_when=return_when)
            self._signals.deliver()
            finished |= done
            if done and return_when == FIRST_COMPLETED:
                break
            if return_when == FIRST_EXCEPTION and any(f.exception() is not None for f in done):
                break
        return finished

    def result(self, future: Future[_Out]) -> _Out:
        """``future.result()`` once it is done, a Ctrl-C meanwhile delivered safely (see :meth:`wait`)."""
        self.wait([future])
        return future.result()

    def as_completed(self, futures: Iterable[Future[_Out]]) -> Iterator[Future[_Out]]:
        """``futures`` as they finish (as ``concurrent.futures.as_completed``), waiting as :meth:`wait` does."""
        pending = set(futures)
        while pending:
            done = self.wait(pending, FIRST_COMPLETED)
            pending -= done
            yield from done

    def first_error(self, futures: list[Future[_Out]]) -> BaseException | None:
        """Wait until every future is done or one raised; that exception (the first in job order), else None."""
        self.wait(futures, FIRST_EXCEPTION)
        ended = (f for f in futures if f.done() and not f.cancelled())
        return next((e for f in ended if (e := f.exception()) is not None), None)


def concurrently(fn: Callable[[_Job], _Out], jobs: Sequence[_Job], limit: int) -> list[_Out]:
    """``fn`` over ``jobs`` on at most ``limit`` threads, results in job order: the library's one fan-out
    (talosctl processes, Kubernetes API calls).

    Why this shape: ``limit`` bounds what runs at once (talosctl processes cost memory and CPU each, API calls
    a connection of the client's pool); results in job order let callers zip them with their input.  The
    first job to raise (any exception, ``KeyboardInterrupt`` included), or Ctrl-C/SIGTERM in the calling
    thread while it waits, cancels the jobs not yet started, and the exception is raised only once the jobs
    already running have returned: a caller's ``finally`` (cuda-test deleting its pods, a change record
    sealing what was sent) then sees every call that may have reached the cluster, none still in flight.
    The one exception: a further Ctrl-C while those jobs are waited for raises at once (:class:`Pool`), with
    jobs still running; ``runbook run`` never sends one (it interrupts a step's cell once).
    """
    if len(jobs) <= 1:
        return [fn(job) for job in jobs]
    with Pool(min(limit, len(jobs))) as pool:
        futures = [pool.submit(fn, job) for job in jobs]
        error = pool.first_error(futures)
        if error is not None:
            raise error  # after Pool's exit: the jobs not started cancelled, the running ones ended
        return [future.result() for future in futures]
