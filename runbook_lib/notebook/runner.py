"""``runbook run``: execute the step notebooks headless, in-process, into one sealed change record.

Why in-process papermill and not one ``papermill`` CLI call per notebook: the CLI pays a 3–5 s import per
call (test-infra notes §3).  Why one kernel for all the step notebooks of a run: a kernel start and the step
code's imports cost ~1–2.6 s each on 2 cores, and six of them bounded the 8-node run's own time (issue 16 point
5, benchmarks/README.md).  Each notebook is still executed by papermill into its own executed notebook (the
record keeps one per step); between two notebooks the runner resets the kernel as a fresh one would be (see
:func:`next_step_code`), and a step that fails, is interrupted or loses its kernel ends the run as before.

Why the notebooks read a parameter file written into the record: every step of a run, and a later
``--from`` resume, must see exactly the same validated parameters, and the record must show them.  The file
holds the validated values (paths for the talosconfig/kubeconfig, never their contents).

Why a plan-only run skips verify and the CUDA test once a step plans changes: they would only look at a
cluster without those changes and report failures that the plan already explains.  The steps whose plan does not
depend on an earlier step's changes (``StepSpec.plans_alone``: the image) are still planned, so one plan shows
the node changes (found by an operator walkthrough: a plan stopped after the config patch and never showed the
installer the nodes would boot).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.metadata
import json
import os
import platform
import queue
import re
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
from tqdm import tqdm
from traitlets import Type

from runbook_lib.clients.proc import Journal
from runbook_lib.errors import PermanentError, RunbookError
from runbook_lib.model.params import RUN_HEADING, Params, load_params, record_yaml
from runbook_lib.model.plan import build_plan
from runbook_lib.steps.context import Context, connect, resolve_endpoints, sim_state_dir
from runbook_lib.steps.preflight import CONFIG_UNREADABLE

from . import continues, interrupts, live_events, lock, offline_html, record_content, records
from .record_content import REPO, RunOutcome, StepOutcome, compact_plan
from .steps import (
    RESULT_FILE_ENV,
    ROLLBACK,
    RUN_ID_ENV,
    RUN_STEPS_ENV,
    STEP_NAMES,
    STEPS,
    StepSpec,
    journal_file,
)

NOTEBOOKS = REPO / "notebooks"
KERNEL = "python3"
#: Seconds a single notebook cell may run (a whole-fleet rollout is one cell).
CELL_TIMEOUT = 6 * 3600

ClusterHook = Callable[[Params], AbstractContextManager[Mapping[str, str]]]


def select_steps(steps: Sequence[str] | None, from_step: str | None) -> list[StepSpec]:
    """The steps to run, always in runbook order; unknown names are an error.  ``rollback`` runs alone."""
    if steps and ROLLBACK.name in steps:
        if len(steps) > 1 or from_step:
            raise PermanentError("rollback runs alone", hint="runbook rollback -p PARAMS --from RECORD")
        return [ROLLBACK]
    wanted = list(steps) if steps else list(STEP_NAMES)
    unknown = [s for s in [*wanted, *([from_step] if from_step else [])] if s not in STEP_NAMES]
    if unknown:
        raise PermanentError(f"unknown step(s) {', '.join(unknown)}", hint=f"steps: {', '.join(STEP_NAMES)}")
    start = STEP_NAMES.index(from_step) if from_step else 0
    chosen = [s for s in STEPS if s.name in wanted and STEP_NAMES.index(s.name) >= start]
    if not chosen:  # ``--from verify --steps preflight`` raised an IndexError (attack re-run, 7 Dec 2026)
        raise PermanentError(
            f"--from {from_step} and --steps {','.join(wanted)} select no step: --from skips the steps before it",
            hint=f"name steps at or after {from_step}, or leave out --steps (runbook order: {', '.join(STEP_NAMES)})",
        )
    return chosen


#: The steps that change the Talos nodes: a run of either gets preflight's node checks first (with_preflight).
NODE_CHANGING = frozenset({"config-patch", "image"})


def with_preflight(selected: list[StepSpec], *, apply: bool) -> list[StepSpec]:
    """``selected`` with preflight first when the run applies a change to the Talos nodes and does not run it.

    Why: ``--steps config-patch --apply`` (and a resume ``--from image --apply``) changed the nodes with none of
    preflight's checks, silently (found by an operator walkthrough): a node on another Talos release getting the
    wrong installer, a GPU-less node getting the GPU one, a node that does not answer, Kubernetes writes the user
    may not make, a helm release left pending. Preflight is read-only and asks only for the permissions the
    selected steps need (``RUNBOOK_RUN_STEPS``); its node checks run in any case, which is why a run of only the
    Kubernetes layer or the CUDA test is left as asked: it may come from a machine with only a kubeconfig, and
    the Kubernetes step judges a down node alone (review, 6 Dec 2026). A plan-only run changes nothing and is
    left as asked, and so is a rollback."""
    names = {s.name for s in selected}
    if not apply or STEPS[0].name in names or not names & NODE_CHANGING:
        return selected
    return [STEPS[0], *selected]


@contextlib.contextmanager
def _environment(values: Mapping[str, str]) -> Iterator[None]:
    """Kernels inherit this process's environment; set what they need for one run, then restore it."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _no_cluster(_params: Params) -> AbstractContextManager[Mapping[str, str]]:
    return contextlib.nullcontext({})


class _Background:
    """Work for the record that need not hold up the next notebook: on worker threads, and the HTML copies
    in a process of their own (:mod:`.html_worker`).

    Why: ``runbook run`` is bound by fixed costs, not by the cluster (benchmarks/README.md, the 8-node run).
    Starting and stopping the kernel takes ~1 s and ~0.1 s; nbconvert's import and templates cost ~1.5 s of
    CPU and each export some more.  Done in line, all of it added to every run's wall time; here it overlaps
    the runbook process's imports and the steps, which mostly wait on other processes.

    Everything submitted is finished by :meth:`wait`, which the runner calls before it seals the record, so
    the record holds exactly what it held when this work was done in line.  HTML copies are made in step
    order by one exporter (its templates are loaded once).
    """

    def __init__(self) -> None:
        self._kernels = ThreadPoolExecutor(max_workers=1, thread_name_prefix="runbook-kernel-stop")
        self._html: subprocess.Popen[str] | None = None
        self._html_errors: IO[bytes] | None = None
        self._starts = ThreadPoolExecutor(max_workers=1, thread_name_prefix="runbook-kernel-start")
        self._pending: list[Future[_Kernel]] = []
        self._jobs: list[Future[None]] = []
        self._exporter: Any = None
        #: The run's kernel while steps may still use it; :meth:`wait` stops it.
        self.kernel: _Kernel | None = None

    def early(self, read: Callable[[], dict[str, Any] | None]) -> Future[dict[str, Any] | None]:
        """Start a read-only call that the end of the run needs, on the kernel-stop thread (idle until the
        first notebook ends)."""
        return self._kernels.submit(read)

    @staticmethod
    def result_or_none(job: Future[dict[str, Any] | None]) -> dict[str, Any] | None:
        """The early call's result, or None when it raised (the caller then makes the call itself)."""
        try:
            return job.result()
        except Exception:  # any failure: read it again the ordinary way, which reports it as before
            return None

    def stop_kernel(self, stop: Callable[[], None]) -> None:
        self._jobs.append(self._kernels.submit(stop))

    def prestart(self, start: Callable[[], _Kernel]) -> Future[_Kernel]:
        """Start the run's kernel on its own thread; :meth:`take` hands it over."""
        job = self._starts.submit(start)
        self._pending.append(job)
        return job

    def take(self, job: Future[_Kernel]) -> _Kernel | None:
        """The pre-started kernel, or None when it could not start (the step then starts its own, which
        reports the problem in the record as before)."""
        self._pending.remove(job)
        try:
            return job.result()
        except Exception:
            return None

    def export_html(self, record: Path, notebook: str) -> None:
        """Have the HTML copy of ``record/notebook`` made by the HTML process (:mod:`.html_worker`), started
        at the first copy: the runbook process never imports nbconvert."""
        if self._html is None:
            self._html_errors = tempfile.TemporaryFile()  # noqa: SIM115 - closed by _finish_html
            self._html = subprocess.Popen(
                [sys.executable, "-m", f"{__package__}.html_worker"],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=self._html_errors,
                text=True,
                start_new_session=True,  # a Ctrl-C at the terminal is the run's to handle, not this process's
            )
        with contextlib.suppress(BrokenPipeError):  # it failed: wait() reports why
            assert self._html.stdin is not None
            self._html.stdin.write(f"{record}\t{notebook}\n")
            self._html.stdin.flush()

    def _finish_html(self) -> None:
        """Wait for the HTML process to write every copy asked for; its failure is raised."""
        proc, self._html = self._html, None
        if proc is None:
            return
        with contextlib.suppress(BrokenPipeError):
            assert proc.stdin is not None
            proc.stdin.close()
        if proc.wait() != 0:
            assert self._html_errors is not None
            self._html_errors.seek(0)
            reason = self._html_errors.read().decode(errors="replace").strip()[-2000:]
            raise RuntimeError(
                f"the record's HTML copies were not written (exit {proc.returncode}): {reason}"
            )

    def wait(self) -> None:
        """Finish everything submitted; the first failure is raised (the record is then not sealed).

        Safe to call again: the runner calls it before sealing and, on the way out, after any error.
        """
        unused, self._pending = self._pending, []
        for pending in unused:  # a kernel started for a step that did not run (failure, plan only)
            with contextlib.suppress(Exception):
                self.stop_kernel(pending.result().stop)
        kernel, self.kernel = self.kernel, None
        if kernel is not None and not kernel.retired:  # the run's kernel, after its last step
            self.stop_kernel(kernel.stop)
        jobs, self._jobs = self._jobs, []
        try:
            for job in jobs:
                job.result()
            self._finish_html()
        finally:
            self._starts.shutdown(wait=True)
            self._kernels.shutdown(wait=True)
            if self._html is not None:  # an earlier failure: the copies no longer matter
                self._html.kill()
                self._html.wait()


class _RunKernelManager(KernelManager):
    """A kernel manager that remembers the clients it made.

    Why: nbclient leaves the channels of its client open on a kernel it did not start; the runner closes them
    (:meth:`_Kernel.release_clients`) before the run's kernel executes the next notebook."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.made: list[BlockingKernelClient] = []

    def client(self, **kwargs: Any) -> BlockingKernelClient:
        made: BlockingKernelClient = super().client(**kwargs)
        self.made.append(made)
        return made


@dataclass
class _Kernel:
    """The run's kernel: its manager and the private directory of its IPC sockets.  ``retired`` once it is
    being stopped (after a step failed, was interrupted or lost it): no later step may use it."""

    km: _RunKernelManager
    sockets: tempfile.TemporaryDirectory[str]
    retired: bool = False

    def stop(self) -> None:
        self.retired = True
        try:
            if self.km.has_kernel:  # nbclient leaves a kernel it did not start running
                self.km.shutdown_kernel(now=True)
        finally:
            self.release_clients()
            self.sockets.cleanup()

    def release_clients(self) -> None:
        """Close the channels of every client made so far (a finished notebook's, a silent run's)."""
        made, self.km.made = self.km.made, []
        for kc in made:
            with contextlib.suppress(Exception):
                kc.stop_channels()

    def next_step(self, result_file: Path, notebooks: Path, env: Mapping[str, str]) -> None:
        """Make the kernel what a fresh one started for this step would be (:func:`next_step_code`)."""
        self.release_clients()
        reply = _run_silently(self, next_step_code(result_file, notebooks, env))
        if reply.get("status") != "ok":
            raise RuntimeError(f"the kernel could not be reset: {reply.get('ename')}: {reply.get('evalue')}")


class ReadyClient(BlockingKernelClient):
    """A kernel client whose ``wait_for_ready`` does not sit out 0.2 s of IOPub silence.

    Why: nbclient calls ``wait_for_ready`` before the first cell of every notebook, and jupyter_client ends
    it by waiting until IOPub has been quiet for 0.2 s: 1.2 s of a six-notebook run spent idle (cProfile
    of papermill on a started kernel, issue 8).  The handshake is kept as jupyter_client does it: a
    ``kernel_info`` reply on the shell channel, then one IOPub message, which proves the IOPub subscription
    is live so no output of the first cell can be lost.  Only the final flush changes: messages already
    queued are dropped without waiting for more; a late one belongs to the handshake, and nbclient keeps
    only IOPub messages whose parent is the request it made.

    Its shell and IOPub channels notice a dead kernel (:class:`~.interrupts.WatchedChannel`).
    """

    shell_channel_class = Type(interrupts.WatchedChannel)
    iopub_channel_class = Type(interrupts.WatchedChannel)

    @property
    def shell_channel(self) -> Any:
        return self._watched(super().shell_channel)

    @property
    def iopub_channel(self) -> Any:
        return self._watched(super().iopub_channel)

    def _watched(self, channel: Any) -> Any:
        channel.kernel_alive = functools.partial(interrupts.kernel_process_alive, self.parent)
        return channel

    def wait_for_ready(self, timeout: float | None = None) -> None:
        deadline = time.monotonic() + (timeout if timeout is not None else float("inf"))
        while True:
            self.kernel_info()
            try:
                reply = self.get_shell_msg(timeout=1)
            except queue.Empty:
                pass
            else:
                if reply["msg_type"] == "kernel_info_reply":
                    try:
                        self.get_iopub_msg(timeout=0.2)
                    except queue.Empty:
                        pass  # IOPub not subscribed yet: ask again
                    else:
                        self._handle_kernel_info_reply(reply)
                        break
            if not self.is_alive():
                raise RuntimeError("Kernel died before replying to kernel_info")
            if time.monotonic() > deadline:
                raise RuntimeError(f"Kernel didn't respond in {timeout} seconds")
        while True:  # drop what the handshake left queued
            try:
                self.get_iopub_msg(timeout=0)
            except queue.Empty:
                break


def _new_kernel() -> _Kernel:
    # IPC sockets in a private directory: the kernel (cluster data, outputs) is not reachable over TCP.
    sockets = tempfile.TemporaryDirectory()
    km = _RunKernelManager(
        kernel_name=KERNEL,
        transport="ipc",
        ip=str(Path(sockets.name) / "kernel"),
        client_class=f"{__name__}.ReadyClient",
    )
    return _Kernel(km, sockets)


def warm_code(items: Sequence[StepSpec]) -> str:
    """What the run's kernel imports before its first notebook runs: the step code the notebooks' first cells
    import, the approval gate when a step changes the cluster, and the Kubernetes client's API classes the
    steps call: the 37.x client builds validators for every method of a class on first use, ~1 s and ~35 MB
    for all five.  Done while the runbook process imports papermill, so it overlaps that instead of the
    steps.  Then ``gc.freeze()``: what is imported stays for the run, and IPython's ``reset`` between two
    notebooks runs ``gc.collect()``, which scanned all of it (0.6 s at load 50).  Inside a function, so the
    notebook's namespace stays as the notebook makes it."""
    modules = ["runbook_lib.notebook.steps", *(f"runbook_lib.steps.{item.module}" for item in items)]
    if any(item.changes_cluster for item in items):
        modules.append("runbook_lib.notebook.gates")
    apis = list(dict.fromkeys(api for item in items for api in item.kubernetes_apis))
    body = f"    for name in {modules!r}:\n        importlib.import_module(name)\n"
    if apis:
        body += f"    client = importlib.import_module('kubernetes.client')\n    for api in {apis!r}:\n"
        body += "        getattr(client, api)\n"
    return (
        "def _runbook_warm():\n    import gc, importlib\n"
        + body
        + "    gc.freeze()\n"
        + "try:\n    _runbook_warm()\nfinally:\n    del _runbook_warm\n"
    )


def next_step_code(result_file: Path, notebooks: Path, env: Mapping[str, str]) -> str:
    """What the runner runs in its kernel before each step notebook, so that it starts as in a fresh kernel:
    IPython's ``reset`` (``%reset -f`` with a new session: no name an earlier notebook set, execution counts
    from 1, an empty output cache), the run's environment ``env`` (the cluster's, the run id: the kernel starts
    before the cluster is up, see :func:`run`) and this step's result file in ``RUNBOOK_RESULT_FILE``, the
    notebooks directory as working directory, and warnings shown again.

    Why the last one: Python shows a warning once per code location (the ``default`` action's registry);
    in a fresh kernel per step, a warning the library gave in step 1 was shown in step 2's notebook too.
    ``warnings._filters_mutated()`` is what ``warnings.simplefilter`` calls to invalidate those registries
    (CPython Lib/warnings.py at v3.11.7).  Modules stay imported: that is the point of one kernel."""
    return (
        "def _runbook_next_step():\n"
        "    import os, warnings\n"
        "    get_ipython().reset(new_session=True)\n"
        f"    os.environ.update({dict(env)!r})\n"
        f"    os.environ[{RESULT_FILE_ENV!r}] = {str(result_file)!r}\n"
        f"    os.chdir({str(notebooks)!r})\n"
        "    warnings._filters_mutated()\n"
        "_runbook_next_step()\n"
    )


def _run_silently(kernel: _Kernel, code: str, timeout: float = 120.0) -> dict[str, Any]:
    """Run ``code`` in the kernel without output, history or execution count (nothing the notebook shows);
    the content of its ``execute_reply`` (``status`` ``ok`` or ``error``).  Raises when no reply came."""
    kc = kernel.km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
        msg_id = kc.execute(code, silent=True, store_history=False)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            reply = kc.get_shell_msg(timeout=max(0.1, deadline - time.monotonic()))
            if reply.get("parent_header", {}).get("msg_id") == msg_id:
                content: dict[str, Any] = reply.get("content", {})
                return content
        raise TimeoutError(f"no reply from the kernel within {timeout:.0f} s")
    finally:
        kc.stop_channels()


def prestart_kernel(items: Sequence[StepSpec], *, notebooks: Path, result_file: Path, run_id: str) -> _Kernel:
    """Start the run's kernel and import the step code of ``items``, while the cluster comes up and the runbook
    process imports papermill.

    The kernel gets what papermill would give it: the notebooks directory as working directory, the run id and
    the first step's result file in its environment (:func:`next_step_code` sets the later ones and the
    cluster's environment), an in-memory IPython history.  The warm-up runs silently and outside the history, so the executed notebook (outputs,
    execution counts) is the same; an import error here is ignored and surfaces, as before, when the
    notebook's own cell runs.
    """
    kernel = _new_kernel()
    try:
        kernel.km.start_kernel(
            cwd=str(notebooks),
            env={
                **os.environ,
                RESULT_FILE_ENV: str(result_file),
                RUN_ID_ENV: run_id,
                RUN_STEPS_ENV: ",".join(i.name for i in items),
            },
            extra_arguments=["--HistoryManager.hist_file=:memory:"],
        )
        _run_silently(kernel, warm_code(items))
    except BaseException:
        kernel.stop()
        raise
    return kernel


def step_kernel(
    kernel: _Kernel | None,
    result_file: Path,
    notebooks: Path,
    background: _Background,
    env: Mapping[str, str],
) -> _Kernel:
    """The kernel the next step's notebook runs in: the run's kernel, reset for it by
    :meth:`_Kernel.next_step`; a new one (started by papermill with this process's environment, which holds
    ``env``) when there is none or the reset failed, so a step never runs in a kernel that still holds an
    earlier step's names."""
    if kernel is not None and not kernel.retired:
        try:
            kernel.next_step(result_file, notebooks, env)
        except Exception:  # no reply: the kernel is gone or stuck
            kernel.retired = True
            background.stop_kernel(kernel.stop)
        else:
            return kernel
    return _new_kernel()


def _execute(
    item: StepSpec,
    *,
    record: Path,
    params_path: Path,
    apply: bool,
    notebooks: Path,
    results: Path,
    background: _Background | None = None,
    kernel: _Kernel | None = None,
    signals: interrupts.SignalGuard | None = None,
    on_event: live_events.Deliver | None = None,
    keep_kernel: bool = False,
) -> StepOutcome:
    """Execute one step notebook into the record, in ``kernel`` when one was started for it.

    While it runs, each rollout event its kernel appends to ``results/<step>.events.jsonl`` goes to ``on_event``
    (``live_events.following``); the file stays in the record.

    With ``keep_kernel`` a kernel whose notebook ran without error stays up for the next step (the caller
    stops it after the last one); otherwise it is stopped on ``background`` when given: its result file is
    complete once papermill returns.
    Interrupted (the first Ctrl-C or SIGTERM, see :class:`~.interrupts.SignalGuard`), the cell is
    interrupted so its ``finally`` blocks run, the kernel is stopped, and the step's journal is read from
    the file its kernel appended it to.
    """
    guard = signals or interrupts.SignalGuard()
    interrupted_at: float | None = None
    cell_ended = True
    result_file = results / f"{item.name}.json"
    started = time.monotonic()
    error: dict[str, Any] | None = None
    # papermill (~0.2 s of imports) is not imported at `runbook run` start-up: run() imports it while the
    # first kernel starts in the background, so the import overlaps that start instead of preceding it.
    import papermill  # noqa: PLC0415 - lazy (run start-up)

    kernel = kernel or _new_kernel()
    with _environment({RESULT_FILE_ENV: str(result_file)}):
        try:
            # following's thread starts and stops outside armed(): the interrupt can only raise inside, not
            # while that thread's Event is set (a Condition's lock, left taken if raised in it)
            with live_events.following(live_events.events_file(result_file), on_event), guard.armed():
                _papermill(
                    item,
                    notebooks=notebooks,
                    out_nb=record / item.notebook,
                    params_path=params_path,
                    apply=apply,
                    km=kernel.km,
                )
        except (KeyboardInterrupt, SystemExit) as exc:
            guard.note(exc)
            interrupted_at = time.time()
            cell_ended = interrupts.off_the_main_thread(lambda: interrupts.end_cell(kernel.km))
        except papermill.PapermillExecutionError as exc:
            error = {"ename": exc.ename, "evalue": exc.evalue, "cell_index": exc.cell_index}
            error |= {"exec_count": exc.exec_count, "notebook": item.notebook}
        except Exception as exc:  # a dead kernel, a missing notebook: the record must still be written
            error = {"ename": type(exc).__name__, "evalue": str(exc), "notebook": item.notebook}
        finally:
            _after_step(
                kernel, background, interrupted=interrupted_at is not None, keep=keep_kernel and error is None
            )
    duration = time.monotonic() - started
    if interrupted_at is not None:
        journal = interrupts.read_journal(journal_file(result_file), interrupted_at)
        text = interrupts.summary(item.name, guard.name, journal, cell_ended)
        error = {"ename": "Interrupted", "evalue": text, "notebook": item.notebook}
        return StepOutcome(
            item.name, item.notebook, "interrupted", duration, text, error=error, journal=journal
        )
    return _read_outcome(item, result_file, error, duration)


def _papermill(
    item: StepSpec, *, notebooks: Path, out_nb: Path, params_path: Path, apply: bool, km: KernelManager
) -> None:
    """papermill executes the step's notebook into the record, in the run's kernel, with the run's parameters."""
    import papermill  # noqa: PLC0415 - lazy (run start-up, see _execute)

    papermill.execute_notebook(
        str(notebooks / item.notebook),
        str(out_nb),
        parameters={"params_file": str(params_path), "apply": apply, "nodes": [], "overrides": []},
        kernel_name=KERNEL,
        progress_bar=False,
        log_output=False,
        cwd=str(notebooks),
        execution_timeout=CELL_TIMEOUT,
        km=km,
    )


def _after_step(kernel: _Kernel, background: _Background | None, *, interrupted: bool, keep: bool) -> None:
    """Stop the step's kernel, or keep it for the next step (``keep``: more steps follow and this one ran).

    Interrupted, it stops before the runner removes any test pod left; otherwise a kernel that is not kept
    stops in the background when there is one (its result file is complete once papermill returns).
    """
    if interrupted:
        interrupts.off_the_main_thread(kernel.stop)
    elif keep:
        kernel.release_clients()  # the notebook's client; the kernel runs the next step
    elif background is None:
        kernel.stop()
    else:
        kernel.retired = True
        background.stop_kernel(kernel.stop)


def _read_outcome(
    item: StepSpec, result_file: Path, error: dict[str, Any] | None, duration: float
) -> StepOutcome:
    """The step's outcome from the result file its kernel wrote; when the kernel died before writing it, what
    it had journalled is still in its journal file."""
    outcome = StepOutcome(item.name, item.notebook, "failed", duration, error=error)
    if result_file.exists():
        data = json.loads(result_file.read_text(encoding="utf-8"))
        outcome.status = "failed" if error else str(data.get("status"))
        outcome.summary = str(data.get("summary", ""))
        outcome.result = data.get("result")
        outcome.plan_shown = data.get("plan_shown")
        outcome.journal = list(data.get("journal", []))
        journal_file(result_file).unlink(missing_ok=True)  # the same entries, now in the result
    else:
        outcome.journal = interrupts.read_journal(journal_file(result_file), float("inf"))
        if error:
            first_line = str(error["evalue"]).splitlines()[0] if error["evalue"] else ""
            outcome.summary = f"{error['ename']}: {first_line}"
    return outcome


def _package_versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for pkg in ("talos-gpu-runbooks", "papermill", "nbclient", "ipykernel", "kubernetes"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            out[pkg] = importlib.metadata.version(pkg)
    return out


def _talos_versions(ctx: Context, addresses: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    try:
        client, servers, errors = ctx.talosctl.version(addresses)
        out["talosctl"] = client
        counts: dict[str, int] = {}
        for version in servers.values():
            counts[version] = counts.get(version, 0) + 1
        out["talos_nodes"] = counts
        unreadable = sorted(e for e in errors.values() if CONFIG_UNREADABLE in e)
        if unreadable:  # talosctl stopped before any node: they were not "unreachable" (review of 7470dc3)
            out["talosctl_error"] = f"talosctl cannot read its talosconfig: {unreadable[0]}"
        unreachable = sorted(a for a, e in errors.items() if CONFIG_UNREADABLE not in e)
        if unreachable:
            out["talos_unreachable"] = unreachable
    except Exception as exc:  # a version read never stops the run (see collect_versions)
        out["talosctl_error"] = probe_failure(exc)
    return out


def _helm_version(ctx: Context) -> dict[str, Any]:
    try:
        return {"helm": ctx.helm.version()}
    except Exception as exc:  # a version read never stops the run (see collect_versions)
        return {"helm_error": probe_failure(exc)}


def _kubernetes_version(ctx: Context) -> dict[str, Any]:
    try:
        return {"kubernetes_server": ctx.kube.server_version()}
    except Exception as exc:  # a version read never stops the run (see collect_versions)
        return {"kubernetes_error": probe_failure(exc)}


def probe_failure(exc: Exception) -> str:
    """What the record keeps of a failed version read: our own errors in full, anything else only its type
    and its text up to the first quoted value.

    Why: a client's exception can quote what it was about to send.  For a kubeconfig token that ends in a
    newline (``token: |``, a pasted token), the Kubernetes client raises ``ValueError: Invalid header value
    b'Bearer <token>\\n'`` (CPython ``http.client.HTTPConnection.putheader``, Lib/http/client.py at v3.11.7),
    which escaped this read, crashed the run before the seal and carried the token (F2 of the 1 Dec attack).
    """
    if isinstance(exc, RunbookError):
        return exc.message
    lines = str(exc).splitlines() or [""]
    text = re.split(r"""b?['"]""", lines[0], maxsplit=1)[0].strip().rstrip(":")
    return f"{type(exc).__name__}: {text} (the rest is not recorded: it can quote credentials)"


def collect_versions(params: Params, *, helm: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Tool and cluster versions, read-only; a failure to read one is recorded, never fatal.

    The reads (talosctl, helm, the Kubernetes API) are independent, so they run at the same time: one after
    the other they were three round trips plus the Kubernetes client's import in a row at the end of every
    run.  ``helm`` is the helm part read earlier (:func:`early_helm_version`): it is the local client's
    version, which a run does not change.  The result has the same keys in the same order either way.
    """
    try:
        ctx = connect(params, journal=Journal())
    except Exception as exc:  # e.g. an unreadable endpoints.json: recorded, like a failed read
        return {"packages": _package_versions(), "error": probe_failure(exc)}
    addresses = [n.address for n in params.nodes]
    with ThreadPoolExecutor(max_workers=3, thread_name_prefix="runbook-versions") as pool:
        talos = pool.submit(_talos_versions, ctx, addresses)
        helm_part = pool.submit(_helm_version, ctx) if helm is None else None
        kubernetes = pool.submit(_kubernetes_version, ctx)
        versions: dict[str, Any] = {"packages": _package_versions()}  # while the tools answer
        versions.update(talos.result())
        versions.update(helm_part.result() if helm_part is not None else helm or {})
        versions.update(kubernetes.result())
    return versions


def early_helm_version(params: Params) -> dict[str, Any] | None:
    """The helm client's version, read while the first notebook runs; None when it cannot be read here.

    Why early: the simulated helm is a Python process (~0.35 s), and read at the end it was the longest of
    the version reads, in line after the last step.  None makes :func:`collect_versions` read it itself,
    so a failure is still recorded exactly as before.
    """
    try:
        ctx = connect(params, journal=Journal())
    except RunbookError:
        return None
    return _helm_version(ctx)


def import_for_kernel_start() -> None:
    """Look the kernel up as a kernel start does, on the main thread, before the threads that start kernels
    exist: jupyter_client's first lookup imports IPython's paths and ``ipykernel.kernelspec`` (~80 modules),
    which a worker thread must not (see :func:`import_before_threads`)."""
    KernelSpecManager().get_kernel_spec(KERNEL)


def test_pods_may_be_left(outcome: StepOutcome) -> bool:
    """Whether the runner must look for cuda-test's pods after the step (``interrupts.remove_test_pods``).

    Why not always: that look builds the Kubernetes client's CoreV1Api in the runbook process and lists the pods,
    about a second per run on 2 cores (9.5 s of 64 under cProfile at load 25).  A step that ended ``ok`` and
    journaled a successful delete for every pod it created left none; anything else (failed, interrupted, a
    dead kernel, a pod created and not deleted) is looked for, as before.
    """
    if outcome.status != "ok":
        return True
    summaries = [str(e.get("summary", "")) for e in outcome.journal if e.get("kind") == "api"]
    created = {s.removeprefix("create Pod ") for s in summaries if s.startswith("create Pod ")}
    deleted = {s.removeprefix("delete Pod ") for s in summaries if s.startswith("delete Pod ")}
    return not created <= deleted


def import_before_threads() -> None:
    """Import, on the main thread, every module the run's worker threads would otherwise import first.

    Why: two threads importing the same package at once can get a partially initialised module from
    CPython's import deadlock avoidance.  ``runbook run`` died of it about one run in four (F1 of the
    1 Dec attack: ``cannot import name 'parse_dict_header' from partially initialized module
    'requests.utils'``: papermill here, the Kubernetes client on a worker, both importing requests).  So
    worker threads import nothing: papermill, the Kubernetes client and the classes
    :func:`collect_versions` uses are imported here, while the first kernels start in their own processes.
    """
    offline_html.skip_iri_format_checks()
    importlib.import_module("papermill")
    importlib.import_module("runbook_lib.clients.kube")
    kube = importlib.import_module("kubernetes.client")
    for name in ("VersionApi", "VersionInfo"):  # built on first use by the 37.x client
        getattr(kube, name)


def config_paths(talosconfig: str | None, kubeconfig: str | None) -> list[str]:
    """Every file talosctl and the Kubernetes client may have read credentials from, for scrubbing.

    Unset parameters fall back the way the tools do: ``$TALOSCONFIG`` or ``~/.talos/config``, and each path of
    ``$KUBECONFIG`` or ``~/.kube/config``.
    """
    paths = [talosconfig or os.environ.get("TALOSCONFIG") or os.path.expanduser("~/.talos/config")]
    if kubeconfig:
        paths.append(kubeconfig)
    else:
        env = os.environ.get("KUBECONFIG")
        paths += env.split(os.pathsep) if env else [os.path.expanduser("~/.kube/config")]
    return [p for p in paths if p]


def cluster_lock(params: Params, cluster_key: str | None = None) -> AbstractContextManager[None]:
    """The cluster's apply lock (see :func:`lock_for_apply`), also held by a JupyterLab approval while it
    applies, so an approval and an ``--apply`` run (or two approvals) never change one cluster at once."""
    if params.target == "simulated":
        what = f"the simulated cluster at {cluster_key or sim_state_dir().resolve()}"
    else:
        what = f"the cluster {params.cluster!r}"
    return lock.exclusive(lock.key_path("cluster", what, ".lock"), what)


def scrubbed(deliver: live_events.Deliver | None, secrets: Sequence[str]) -> live_events.Deliver | None:
    """``deliver`` with the run's secrets scrubbed from every text of the event, as the record is scrubbed at
    its seal: a line on a terminal or in a CI log leaves the machine too."""
    if deliver is None:
        return None
    values = list(secrets)

    def clean(value: Any) -> Any:  # nested too: a line printed from an event may show any of its values
        if isinstance(value, str):
            return records.redact(value, values)
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [clean(v) for v in value]
        return value

    def scrub(event: dict[str, Any]) -> None:
        deliver(clean(event))

    return scrub


def lock_for_apply(stack: contextlib.ExitStack, params: Params, root: Path, cluster_key: str | None) -> None:
    """Hold, for the rest of ``stack``, the records folder's and the cluster's apply locks (exit 2 naming
    the holder when another run has one), before the cluster is brought up.

    Why: two ``--apply`` runs against one cluster both upgraded and rebooted every node (F8 of the 1 Dec
    attack).  The cluster is the simulator's state directory (``cluster_key``, default ``$RUNBOOK_SIM_STATE``)
    for ``target: simulated``, else the ``cluster`` parameter: two parameter files that name one real
    cluster differently are not kept apart.
    """
    stack.enter_context(cluster_lock(params, cluster_key))
    records.make_root(root)  # only now: a refused run leaves no records folder behind
    stack.enter_context(lock.exclusive(root / lock.RECORDS_LOCK, f"the records folder {root}"))


@dataclass
class _StepLoop:
    """What every step of one run shares: where it writes, its kernel and signals, whom it reports to."""

    selected: list[StepSpec]
    params: Params
    record: Path
    params_path: Path
    notebooks: Path
    background: _Background
    signals: interrupts.SignalGuard
    run_env: dict[str, str]
    run_id: str
    on_event: live_events.Deliver | None
    html: bool
    continues: str | None = None
    """The run this one follows on the cluster (``continues.continued_run``), recorded for rollback."""

    @property
    def results(self) -> Path:
        return self.record / "results"


@dataclass
class _StepsRun:
    """How the step loop ended: the outcomes in order, the step that stopped it, why a plan stopped early."""

    outcomes: list[StepOutcome] = field(default_factory=list)
    failed_step: str | None = None
    stop_note: str = ""


def _open_record(
    root: Path, params: Params, run_id: str, named_at: datetime, *, html: bool, params_text: str
) -> tuple[Path, Path]:
    """Create the run's record folder with its validated ``params.yaml``; returns both paths.

    Called only once the cluster is up: a cluster that cannot start leaves no half record behind.
    """
    record = records.create_record_dir(root, params.cluster, run_id=run_id, now=named_at)
    (record / "results").mkdir()
    params_path = record / "params.yaml"
    params_path.write_text(params_text, encoding="utf-8")
    if html:
        (record / "html").mkdir()
    return record, params_path


def _run_secrets(params: Params) -> list[str]:
    """The secret values in the run's talosconfig and kubeconfig, which the seal scrubs from the record."""
    with contextlib.suppress(RunbookError):
        endpoints = resolve_endpoints(params)
        return records.secret_values(*config_paths(endpoints.talosconfig, endpoints.kubeconfig))
    return []


def _run_step(loop: _StepLoop, index: int, item: StepSpec, first: Future[_Kernel]) -> StepOutcome:
    """One step notebook in the run's kernel; Ctrl-C or SIGTERM, even while waiting for the kernel, becomes
    an ``interrupted`` outcome to seal, and an interrupted or failed CUDA test leaves no test pod behind."""
    background = loop.background
    try:
        if index == 0:
            background.kernel = background.take(first)
        result_file = loop.results / f"{item.name}.json"
        background.kernel = step_kernel(
            background.kernel, result_file, loop.notebooks, background, loop.run_env
        )
        outcome = _execute(
            item,
            record=loop.record,
            params_path=loop.params_path,
            apply=loop.params.apply,
            notebooks=loop.notebooks,
            results=loop.results,
            background=background,
            kernel=background.kernel,
            signals=loop.signals,
            on_event=loop.on_event,
            keep_kernel=index + 1 < len(loop.selected),
        )
    except (KeyboardInterrupt, SystemExit) as exc:  # Ctrl-C or SIGTERM: seal what happened
        loop.signals.note(exc)
        error = {"ename": "Interrupted", "evalue": f"the run was interrupted ({loop.signals.name})"}
        outcome = StepOutcome(item.name, item.notebook, "interrupted", error=error)
    if item.name == "cuda-test" and loop.params.apply and test_pods_may_be_left(outcome):
        outcome.journal += interrupts.remove_test_pods(loop.params, loop.run_id)  # no test pod is left
    return outcome


def _plan_note(planned: StepSpec, skipped: Sequence[StepSpec]) -> str:
    """Why a plan-only run left steps out (module docstring): they check changes it only planned."""
    return (
        f"plan only: {planned.name} planned changes, so {', '.join(s.name for s in skipped)}, which "
        f"{'needs' if len(skipped) == 1 else 'need'} them applied, {'was' if len(skipped) == 1 else 'were'} not "
        "run; run with --apply to apply them"
    )


def _waits(item: StepSpec, params: Params) -> str:
    """A step a plan-only run left out, and for the Kubernetes step what it will install. Why: a first plan
    never named the chart, its version or its namespace, as the step plans only once the nodes are changed
    (operator walkthrough, stop 53: a pinned chart newer than the release's default went unnoticed)."""
    if item.name != "kubernetes":
        return "waits for apply"
    helm = build_plan(params).helm
    return (
        f"waits for apply; it will then run helm upgrade --install {helm.release} {helm.chart} --version "
        f"{helm.version} -n {helm.namespace}"
    )


def _run_steps(loop: _StepLoop, first: Future[_Kernel], *, progress: bool) -> _StepsRun:
    """Run the selected steps in order; stop at a failed or interrupted step, after a plan-only step's plan,
    or, between two steps, when a signal came (the next step is not started)."""
    ran = _StepsRun()
    # None: tqdm leaves out the bar when stderr is no terminal (a CI log, a file), where its carriage returns
    # mixed the bar into the live "batch 1/3 done" lines (found by an operator walkthrough of `make demo`).
    bar = tqdm(total=len(loop.selected), unit="step", disable=True if not progress else None, desc="runbook")
    with contextlib.closing(bar):
        planned: StepSpec | None = None  # the first step of a plan-only run that planned changes
        skipped: list[StepSpec] = []
        for index, item in enumerate(loop.selected):
            if loop.signals.received is not None:
                break
            if planned is not None and not item.plans_alone:
                skipped.append(item)
                ran.outcomes.append(
                    StepOutcome(item.name, item.notebook, "skipped", summary=_waits(item, loop.params))
                )
                bar.update(1)
                continue
            bar.set_description(item.name)
            outcome = _run_step(loop, index, item, first)
            ran.outcomes.append(outcome)
            if loop.html:
                loop.background.export_html(loop.record, outcome.notebook)
            bar.update(1)
            if outcome.status in ("failed", "interrupted"):
                ran.failed_step = item.name
                break
            if outcome.status == "planned" and not loop.params.apply and planned is None:
                planned = item
        if planned is not None and skipped:
            ran.stop_note = _plan_note(planned, skipped)
    return ran


def _record_data(
    loop: _StepLoop,
    ran: _StepsRun,
    *,
    params_file: str | Path | None,
    overrides: Sequence[str],
    started: tuple[str, float],
    versions: dict[str, Any],
    interrupted: bool,
) -> dict[str, Any]:
    """``record.json``'s content; ``started`` is the run's start as ISO time and ``time.monotonic()``."""
    changes, commands = record_content.journal_sections(ran.outcomes)
    apply, failed = loop.params.apply, ran.failed_step
    return {
        "run_id": loop.record.name.rsplit("-", 1)[-1],
        "cluster": loop.params.cluster,
        "target": loop.params.target,
        "started": started[0],
        "finished": records.now_iso(),
        "duration_s": round(time.monotonic() - started[1], 3),
        "who": records.who(),
        "runbook": records.git_info(REPO),
        "params_file": str(params_file) if params_file else "(parameters of an earlier record)",
        "overrides": list(overrides),
        "apply": apply,
        "steps_requested": [s.name for s in loop.selected],
        # every run but a rollback says which run it follows, null for none (continues.continued_run reads it)
        **({continues.FIELD: loop.continues} if loop.selected != [ROLLBACK] else {}),
        "outcome": record_content.outcome_word(
            interrupted=interrupted, failed_step=failed, outcomes=ran.outcomes, changed=bool(changes)
        ),
        "failed_step": failed,
        "note": record_content.run_note(
            apply=apply,
            failed_step=failed,
            changed=bool(changes),
            stop_note=ran.stop_note,
            steps=[s.name for s in loop.selected],
        ),
        "params": loop.params.public_dict(),
        "plan": compact_plan(build_plan(loop.params).to_dict()),
        "versions": versions,
        "steps": [o.to_record() for o in ran.outcomes],
        "changes": changes,
        "commands": commands,
        # The full per-node results are in "steps"; this is the verdict a reader looks for first.
        "verification": record_content.verification(ran.outcomes),
    }


def _prepare(
    stack: contextlib.ExitStack,
    params: Params,
    selected: list[StepSpec],
    *,
    root: Path,
    notebooks: Path,
    hook: ClusterHook,
    cluster_key: str | None,
    background: _Background,
    signals: interrupts.SignalGuard,
    on_event: live_events.Deliver | None,
    html: bool,
    continuing: bool,
    params_text: str,
    on_record: Callable[[Path], None] | None,
) -> tuple[_StepLoop, Future[_Kernel], list[str]]:
    """Everything before the first step, held open on ``stack``: the apply locks, the kernel (started and
    warmed while the cluster comes up and this process imports papermill), the cluster and its environment,
    and the record folder; returns the step loop's shared state, the kernel's start and the run's secrets."""
    if params.apply:
        lock_for_apply(stack, params, root, cluster_key)
    # read under the apply lock: a run sealing meanwhile is the one this run follows
    carried = continues.continued_run(root, params.cluster) if continuing else None
    # One kernel for the run (module docstring); the record is named now for it (the first step's result file
    # is in the kernel's environment), and the cluster's environment reaches the kernel before each step.
    run_id, named_at = records.new_run_id(), datetime.now(UTC)
    first_result = root / records.record_name(params.cluster, run_id, named_at) / "results"
    first_result /= f"{selected[0].name}.json"
    import_for_kernel_start()  # worker threads import nothing (F1): see import_before_threads
    first = background.prestart(
        lambda: prestart_kernel(selected, notebooks=notebooks, result_file=first_result, run_id=run_id)
    )
    env = stack.enter_context(hook(params))
    stack.enter_context(_environment(dict(env)))
    record, params_path = _open_record(root, params, run_id, named_at, html=html, params_text=params_text)
    if selected != [ROLLBACK]:
        records.write_follows(record, carried)  # for seal-aborted, should this run be killed before its seal
    if on_record is not None:
        on_record(record)
    # the run id labels the CUDA test pods; the steps tell preflight what to check
    steps_env = {RUN_ID_ENV: run_id, RUN_STEPS_ENV: ",".join(s.name for s in selected)}
    stack.enter_context(_environment(steps_env))
    secrets = _run_secrets(params)
    loop = _StepLoop(
        selected,
        params,
        record,
        params_path,
        notebooks,
        background,
        signals,
        run_env={**env, **steps_env},
        run_id=run_id,
        on_event=scrubbed(on_event, secrets),
        html=html,
        continues=carried,
    )
    return loop, first, secrets


def _end_signals(loop: _StepLoop, interrupted: BaseException | None, digest: str) -> None:
    """Put the signal handlers back and re-raise an interrupt only now, after the record is sealed and the
    cluster released: an interrupted run still leaves its change record, and says its anchor as a finished run
    does (a CI log keeps it: operator walkthrough, stop 54, an interrupted run printed none)."""
    signals = loop.signals
    signals.restore()
    if interrupted is None and signals.received is not None:  # came after the last step: nothing cut short
        interrupted = signals.exception()
    if interrupted is not None:
        command = "runbook rollback" if [s.name for s in loop.selected] == ["rollback"] else "runbook run"
        folder = shlex.quote(str(loop.record.parent))
        sys.stderr.write(
            f"{command}: {signals.name}: the record is sealed at {loop.record}\n"
            f"anchor: runbook records verify --records {folder} --expect {digest}\n"
        )
        raise interrupted


def run(
    params_file: str | Path | None,
    steps: Sequence[str] | None = None,
    from_step: str | None = None,
    apply: bool | None = None,
    overrides: Sequence[str] = (),
    *,
    values: Mapping[str, Any] | None = None,
    base: Mapping[str, Any] | None = None,
    records_root: Path | None = None,
    cluster: ClusterHook | None = None,
    progress: bool = True,
    notebooks_dir: Path | None = None,
    html: bool = True,
    cluster_key: str | None = None,
    on_event: live_events.Deliver | None = None,
    on_record: Callable[[Path], None] | None = None,
) -> RunOutcome:
    """Run the selected step notebooks into a new record; stop at the first failing step.

    ``base`` (validated parameters of an earlier record) replaces the parameter file for ``--from``; the
    ``overrides`` win over it, and ``values`` (e.g. a rollback's records) over both.
    ``cluster`` brings a cluster up for the run (the CLI passes the simulator for ``target: simulated``)
    and yields environment variables the kernels need.  ``cluster_key`` names the simulated cluster for
    the apply lock (see :func:`lock_for_apply`; the CLI passes its state directory).  ``on_event`` gets each
    rollout event (a node failed, a batch ended) while its step runs, with the run's secrets scrubbed.
    ``on_record`` gets the record's folder once it exists: after Ctrl-C or SIGTERM, which re-raise once the record
    is sealed, it is how the caller knows which record is this run's (not the newest in the folder, which a
    concurrent run of the same parameters may have made: review of 8d27fe4's stop).
    """
    merged = dict(values or {})
    if apply is not None:
        merged["apply"] = apply
    params = load_params(params_file, list(overrides), merged, base=base)
    # refused now if too big to read back, before the cluster, the locks or the record (params.record_yaml)
    params_text = record_yaml(params, RUN_HEADING, source=str(params_file or "parameters"))
    selected = with_preflight(select_steps(steps, from_step), apply=params.apply)
    started = (records.now_iso(), time.monotonic())
    hook = cluster if (cluster is not None and params.target == "simulated") else _no_cluster
    background = _Background()
    signals = interrupts.SignalGuard()  # from here until sealed, Ctrl-C or SIGTERM ends in a sealed record
    signals.install()
    interrupted: BaseException | None = None
    versions: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        stack.push(signals.restore_on_error)
        # Whatever happens, no worker thread outlives the run (an early failure leaves nothing to wait for).
        stack.callback(background.wait)
        loop, first, secrets = _prepare(
            stack,
            params,
            selected,
            root=records_root or records.default_root(),
            notebooks=notebooks_dir or NOTEBOOKS,
            hook=hook,
            cluster_key=cluster_key,
            background=background,
            signals=signals,
            on_event=on_event,
            html=html,
            continuing=[s.name for s in selected] != ["rollback"],
            params_text=params_text,
            on_record=on_record,
        )
        import_before_threads()  # while the kernel starts (papermill: see _execute)
        helm_version = background.early(lambda: early_helm_version(params))
        ran = _run_steps(loop, first, progress=progress)
        if signals.received is not None:
            interrupted = signals.exception()
        try:
            if interrupted is None:
                versions = collect_versions(params, helm=background.result_or_none(helm_version))
        finally:
            background.wait()  # HTML copies written, kernels stopped: before the cluster goes and the seal
        data = _record_data(
            loop,
            ran,
            params_file=params_file,
            overrides=overrides,
            started=started,
            versions=versions,
            interrupted=interrupted is not None,
        )
        # Sealed under the apply locks, which the stack releases: a JupyterLab approval or a run started the moment
        # they are released reads this record as sealed and follows it (review of stop 53). A failure here: the
        # stack restores the signal handlers.
        digest = records.seal(loop.record, data, secrets=secrets)
    _end_signals(loop, interrupted, digest)
    changes = len(data["changes"])
    scrub = functools.partial(records.redact, secrets=secrets)
    return RunOutcome(
        loop.record,
        data["outcome"],
        ran.outcomes,
        digest,
        changes,
        ran.failed_step,
        data["note"],
        scrub,
        apply=loop.params.apply,
    )
