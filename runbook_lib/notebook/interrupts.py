"""Ctrl-C or SIGTERM during ``runbook run``: the record is still sealed, lists every change that reached the
cluster, and no CUDA test pod is left behind.

Why this needs care (attack report of 1 Dec, F5, F6, F9):

- A step's journal used to come back only with its result, at the end of the notebook; an interrupted step
  was recorded as "failed 0.0 s" with no changes, while nodes had been patched or upgraded.  The kernel now
  appends each journal entry to ``results/<step>.journal.jsonl`` as it happens, and marks each call that
  changes the cluster as in flight until it returns (``Journal.pending``); :func:`read_journal` turns that
  file into the step's journal, and says which entries finished after the interrupt and which were in
  flight (those may have reached the cluster: a real ``talosctl`` or API request cannot be called back).
- The kernel used to be killed at once, so the CUDA test's ``finally`` never deleted its pods; Pending pods
  that request ``nvidia.com/gpu`` grab GPUs once they schedule.  The cell is now interrupted and given
  :data:`CELL_GRACE_S` to clean up (:func:`end_cell`), and then :func:`remove_test_pods` deletes, through
  the Kubernetes API, whatever pod of this run is still there.
- A second Ctrl-C used to break the clean-up, leaving an unsealed record.  :class:`SignalGuard` turns only
  the first signal into an exception, and only while a notebook runs; later ones are counted and ignored
  until the record is sealed (SIGKILL still ends the process).
"""

from __future__ import annotations

import contextlib
import json
import queue
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

from jupyter_client.channels import ZMQSocketChannel
from jupyter_client.manager import KernelManager

from runbook_lib.clients.proc import Journal
from runbook_lib.model.params import Params
from runbook_lib.steps.context import connect
from runbook_lib.steps.cudatest import RUN_LABEL, TEST_NAMESPACE

#: Seconds an interrupted cell gets to run its ``finally`` blocks (the CUDA test deletes its pods there).
CELL_GRACE_S = 20.0
IN_FLIGHT = "in flight when the step was interrupted or its kernel died: it may have reached the cluster"
AFTER = "finished after the interrupt"
_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_INTERRUPTS = ("KeyboardInterrupt", "SystemExit")
T = TypeVar("T")


class SignalGuard:
    """SIGINT and SIGTERM for one run: the first interrupts the notebook that is running; the rest wait.

    The first signal raises (``KeyboardInterrupt``; ``SystemExit(143)`` for SIGTERM, a CI timeout) only
    inside :meth:`armed`, i.e. while a notebook runs.  Arriving elsewhere (between steps, while sealing) it
    is noted and the run stops before the next step.  Every later signal is counted and ignored, so the
    interrupted step's clean-up and the seal are never cut short.  A signal that was ignored when the run
    started (``nohup``, a background job) stays ignored.
    """

    def __init__(self) -> None:
        self.received: int | None = None
        self.repeats = 0
        self._armed = False
        self._saved: dict[int, Callable[[int, FrameType | None], Any] | int | None] = {}

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set there; a run on a thread keeps the defaults
        for sig in _SIGNALS:
            current = signal.getsignal(sig)
            if current is signal.SIG_IGN:
                continue
            self._saved[sig] = current
            signal.signal(sig, self._handle)

    def restore(self) -> None:
        """Put the handlers back (safe to call twice)."""
        saved, self._saved = self._saved, {}
        for sig, handler in saved.items():
            signal.signal(sig, handler)

    def restore_on_error(self, exc_type: type[BaseException] | None, *_exc: object) -> bool:
        """For an ``ExitStack``: a run that fails before its seal gives the handlers back at once."""
        if exc_type is not None:
            self.restore()
        return False

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        if self.received is not None:
            self.repeats += 1
            return
        self.received = signum
        if self._armed:
            self._armed = False
            raise self.exception()

    def note(self, exc: BaseException) -> None:
        """An interrupt this guard did not raise (it was not installed: a run on a thread): remember it."""
        if self.received is None:
            code = exc.code if isinstance(exc, SystemExit) else None
            self.received = code - 128 if isinstance(code, int) and code > 128 else signal.SIGINT

    def exception(self) -> BaseException:
        """What the first signal raises, and what ``runbook run`` raises once the record is sealed."""
        if self.received == signal.SIGINT:
            return KeyboardInterrupt()
        return SystemExit(128 + (self.received or signal.SIGTERM))

    @property
    def name(self) -> str:
        return signal.Signals(self.received).name if self.received else "no signal"

    @contextlib.contextmanager
    def armed(self) -> Iterator[None]:
        """While a notebook runs: the first signal raises here.  One that came before raises at once."""
        if self.received is not None:
            raise self.exception()
        self._armed = True
        try:
            yield
        finally:
            self._armed = False


def off_the_main_thread(call: Callable[[], T]) -> T:
    """``call()`` on a thread of its own, for jupyter_client calls made after an interrupt.

    Why: the interrupt was raised inside nbclient's asyncio tasks on the main thread's event loop, and
    asyncio keeps that ``KeyboardInterrupt`` in the task: the next jupyter_client call that runs that loop
    raises it again.  A new thread gets a loop of its own.
    """
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="runbook-interrupt") as pool:
        return pool.submit(call).result()


class WatchedChannel(ZMQSocketChannel):
    """A blocking kernel channel whose waits end, with an error, once the kernel process is gone.

    Why: nbclient waits for a cell's output on IOPub with no timeout (nbclient 0.11.0 ``client.py``,
    ``_async_poll_output_msg``: ``iopub_channel.get_msg(timeout=None)``).  With the blocking client ``runbook
    run`` gives it (see ``runner.ReadyClient``), that wait holds nbclient's event loop, so its own check
    that the kernel is alive never runs: a kernel killed mid-step (out of memory, say) left the run
    waiting for good, the record unsealed and the CUDA test pods in place.  Waits here are cut into 1 s
    slices, and between two slices the kernel process is looked at.
    """

    kernel_alive: Callable[[], bool] = staticmethod(lambda: True)

    def get_msg(self, timeout: float | None = None) -> dict[str, Any]:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = 1.0 if deadline is None else min(1.0, max(0.0, deadline - time.monotonic()))
            try:
                message: dict[str, Any] = super().get_msg(timeout=left)
            except queue.Empty:
                if deadline is not None and time.monotonic() >= deadline:
                    raise
                if not self.kernel_alive():
                    raise RuntimeError("Kernel died: its process ended while the step ran") from None
                continue
            return message


def kernel_process_alive(km: object) -> bool:
    """Whether ``km``'s kernel process still runs (True when it cannot tell: no local process)."""
    process = getattr(getattr(km, "provisioner", None), "process", None)
    return process is None or process.poll() is None


def end_cell(km: KernelManager, grace_s: float = CELL_GRACE_S) -> bool:
    """Interrupt the kernel's running cell and wait, at most ``grace_s``, until it has ended.

    The kernel handles shell requests one after the other (ipykernel 7.4.0 ``kernelbase.py``,
    ``shell_main``: "Whilst executing a shell message, do not accept any other shell messages"), so the
    reply to a ``kernel_info`` request sent now comes once the interrupted cell (and its ``finally``
    blocks) is done.  The interrupt is SIGINT to the kernel's process group (jupyter_client 8.10.0,
    ``LocalProvisioner.send_signal``), so a ``talosctl`` or ``helm`` it runs gets it too.  False when it did not end in
    time or the kernel is gone; the caller then stops the kernel anyway.  Call it through
    :func:`off_the_main_thread`.
    """
    try:
        km.interrupt_kernel()
    except (RuntimeError, OSError):
        return False
    kc = km.client()
    kc.start_channels()
    try:
        msg_id = kc.kernel_info()
        deadline = time.monotonic() + grace_s
        while (left := deadline - time.monotonic()) > 0:
            reply = kc.get_shell_msg(timeout=left)
            if reply.get("parent_header", {}).get("msg_id") == msg_id:
                return True
    except (queue.Empty, RuntimeError):  # no reply in time; the kernel died (WatchedChannel)
        pass
    finally:
        kc.stop_channels()
    return False


def _in_flight(start: dict[str, Any]) -> dict[str, Any]:
    return {
        "kind": start.get("kind", "command"),
        "summary": start.get("summary", ""),
        "argv": start.get("argv", []),
        "changes_cluster": True,
        "at": start.get("at"),
        "interrupt": IN_FLIGHT,
    }


def read_journal(path: Path, interrupted_at: float) -> list[dict[str, Any]]:
    """The journal an interrupted step's kernel wrote to ``path``, each entry marked if it finished after
    ``interrupted_at``, plus one entry per change that was in flight (started, never returned)."""
    if not path.exists():
        return []
    entries: list[dict[str, Any]] = []
    starts: dict[int, dict[str, Any]] = {}
    ends: dict[int, str | None] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue  # the last line, cut short when the kernel was stopped
        kind = event.pop("event", None)
        if kind == "start":
            starts[event["call"]] = event
        elif kind == "end":
            ends[event["call"]] = event.get("raised")
        elif kind == "entry":
            if float(event.get("at") or 0) > interrupted_at:
                event["interrupt"] = AFTER
            entries.append(event)
    for call, start in starts.items():
        if call not in ends or ends[call] in _INTERRUPTS:
            entries.append(_in_flight(start))
    return entries


def remove_test_pods(params: Params, run_id: str) -> list[dict[str, Any]]:
    """Delete the CUDA test pods of run ``run_id`` still in the API; the journal entries of what was done.

    Never raises: a failure is returned as an entry, so the record is sealed and says so.
    """
    journal = Journal()
    try:
        kube = connect(params, journal=journal).kube
        kube.delete_pods(TEST_NAMESPACE, f"{RUN_LABEL}={run_id}")
    except Exception as exc:  # whatever failed, the record is sealed and names the failure
        journal.record_api(
            f"could not remove the test pods of run {run_id} ({RUN_LABEL}={run_id}): {exc}".splitlines()[0],
            changes_cluster=False,
        )
    left_over = " (left over: removed by runbook run)"
    return [
        {**e.to_dict(), "summary": e.summary + (left_over if e.summary.startswith("delete Pod ") else "")}
        for e in journal.entries
    ]


def summary(step: str, signal_name: str, journal: list[dict[str, Any]], cell_ended: bool) -> str:
    """One line for the record: what the interrupted step had changed, and what may have.

    A change whose command exited non-zero is counted apart: it was counted as having reached the cluster
    (operator walkthrough, 6 Dec 2026), yet a refused patch changed nothing; one over several nodes (a grouped
    upgrade, a patch of a batch) exits 1 when any node failed, the others changed, and one cut short by the
    interrupt (a talosctl upgrade exits 1 then, the node going on) may have reached it."""
    done = [e for e in journal if e.get("changes_cluster") and e.get("interrupt") != IN_FLIGHT]
    failed = [e for e in done if e.get("exit_code") not in (0, None)]
    maybe = [e for e in journal if e.get("interrupt") == IN_FLIGHT]
    reached = len(done) - len(failed)
    text = f"{signal_name} during {step}: "
    if reached or not failed:
        text += f"{reached} change(s) reached the cluster" if reached else "no change reached the cluster"
        text += "; " if failed else ""
    if failed:
        text += (
            f"{len(failed)} change(s) exited non-zero (one over several nodes may have changed some of them, one "
            "cut short by the interrupt may have reached its node: see the node results)"
        )
    if maybe:
        text += f"; {len(maybe)} more in flight then may have reached it"
    if done or maybe:
        text += " (listed in the record's changes)"
    if not cell_ended:
        text += f"; the step did not end within {CELL_GRACE_S:.0f} s of the interrupt and was stopped"
    return text
