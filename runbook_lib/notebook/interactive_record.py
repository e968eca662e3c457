"""Change records for what a person approves in JupyterLab: one sealed record per Approve click.

Why: ``runbook run`` seals a record of every run, but the Approve button changes the cluster from an open
notebook, outside any run.  Without this, half of the ways to change a cluster left no trace.  Each approval
is written as a record directory like ``runbook run``'s (``params.yaml``, ``results/<step>.json``,
``record.json``, ``SHA256SUMS``) named ``<UTC>-<cluster>-interactive-<run id>`` and sealed by
:func:`records.seal`, under the records folder's lock, into the same hash chain: ``runbook records
list/show/verify`` read it like any other, and two people approving against one records folder chain in
one order.

What "the notebook as it stood" can be here: a kernel cannot save the notebook open in the browser, so the
record holds a notebook rebuilt from the source of the cells this kernel ran (IPython's input history, in
order) with the result as rendered after the approval as the output of the step's cell, and says so.  When JupyterLab tells the kernel which notebook it runs
(``JPY_SESSION_NAME``, set by jupyter_server's ``SessionManager.get_kernel_env``), the file as last saved
is copied too, marked as possibly older than the screen.

The directory is created when the apply starts, with the cells run so far (the rebuilt notebook, without
the result), and the step's journal is appended to ``results/<step>.journal.jsonl`` as each command and API
change happens (each change marked in flight until it returns), as ``runbook run``'s kernels do.  So a kernel
killed mid-apply leaves an unsealed directory that ``records verify`` reports as an aborted run, and
``records seal-aborted`` seals it with the changes that reached the cluster and the one in flight.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runbook_lib.clients.proc import Journal
from runbook_lib.errors import PermanentError, RunbookError
from runbook_lib.model.params import APPROVAL_HEADING, Params, record_yaml
from runbook_lib.model.plan import build_plan
from runbook_lib.steps.context import resolve_endpoints
from runbook_lib.steps.results import StepResult

from . import continues, records
from .record_content import (
    REPO,
    StepOutcome,
    compact_plan,
    journal_record,
    split_journal,
)
from .render import html_page, render_html
from .steps import journal_file

#: Set by jupyter_server for a notebook's kernel: the notebook's path.
SESSION_ENV = "JPY_SESSION_NAME"
SAVED_NOTEBOOK = "notebook-as-last-saved.ipynb"
#: How the change was allowed: a click, or a cell run with ``apply`` true outside ``runbook run``.
HOW = {
    True: "approved interactively (JupyterLab Approve button)",
    False: "applied by a notebook cell run with apply true, outside `runbook run`",
}
INTERACTIVE_NOTE = (
    "the kernel cannot save the open notebook, so "
    "the notebook here is rebuilt from the source of the cells this kernel ran, in order, with the result as "
    "rendered after the approval as the step cell's output (also in html/); other cells' outputs are not "
    f"kept; {SAVED_NOTEBOOK}, when present, is the notebook file as last saved before the "
    "approval and may lack edits that were only on screen"
)


def kernel_history() -> list[str]:
    """The source of the cells the kernel ran, in order (IPython's ``In``); empty outside a kernel."""
    from IPython import get_ipython  # noqa: PLC0415 - lazy: only when a record is written

    shell = get_ipython()
    history = shell.user_ns.get("In", []) if shell is not None else []
    return [h for h in history if isinstance(h, str) and h]


def default_root() -> Path:
    """``$RUNBOOK_RECORDS``, else the project's ``records/`` when the kernel runs in its ``notebooks/``.

    Why: JupyterLab starts a kernel in its notebook's folder, so ``./records`` there would hide approvals
    from ``runbook records list`` run in the checkout, where ``runbook run`` and ``make demo`` write.
    """
    if not os.environ.get(records.RECORDS_ENV) and Path.cwd().resolve() == (REPO / "notebooks").resolve():
        return REPO / "records"
    return records.default_root()


@dataclass
class InteractiveRecorder:
    """Writes and seals one record per approval of ``step`` (see the module docstring).

    ``started`` is called by the gate once the re-plan matched the plan on screen, right before applying;
    ``finished`` after the apply returned or raised.  ``approved`` false (a cell run with ``apply: true``)
    records only when the cluster changed or the apply failed.
    """

    step: str
    notebook: str
    params: Params
    journal: Journal
    params_file: str | None = None
    overrides: Sequence[str] = ()
    root: Path | None = None
    history: Callable[[], list[str]] = kernel_history
    record: Path | None = None
    _mark: int = 0
    _started: str = ""
    _clock: float = 0.0
    _approved: bool = True
    _continues: str | None = None
    sealed: list[str] = field(default_factory=list)
    """Manifest hashes of the records sealed so far (the anchors)."""
    _held: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    @property
    def _follows(self) -> bool:
        """Whether this approval records the run it goes on from: every step's but a rollback's, which ends the
        chain (``continues``), as ``runbook run`` records it."""
        return self.step != "rollback"

    @property
    def notebook_file(self) -> str:
        """The rebuilt notebook's name in the record (``02-config-patch.interactive.ipynb``)."""
        return f"{Path(self.notebook).stem}.interactive.ipynb"

    def hold(self) -> None:
        """Take the cluster's apply lock, before the gate re-plans, until :meth:`release`.

        Why: two approvals, or an approval and ``runbook run --apply``, must not change one cluster at once
        (F8 of the 1 Dec attack); the second is refused (:class:`lock.Busy`) naming the holder.  Taken before
        the re-plan, so the plan checked is the one applied.
        """
        from .runner import cluster_lock  # noqa: PLC0415 - lazy, as below

        self._held.enter_context(cluster_lock(self.params))

    def started(self, *, approved: bool = True) -> Path:
        """Create the record directory before anything changes: a folder that cannot hold the record
        stops the apply (nothing unrecorded reaches the cluster)."""
        root = self.root or default_root()
        try:
            self.record = records.create_record_dir(root, f"{self.params.cluster}-interactive")
        except OSError as exc:
            raise PermanentError(
                f"the records folder {root} cannot hold a change record ({exc.strerror or exc}): nothing was applied",
                hint=f"set {records.RECORDS_ENV} to a folder you can write, or start JupyterLab where ./records is writable",
            ) from None
        self._mark, self._approved = len(self.journal.entries), approved
        # the run this approval goes on from (its own folder, unsealed, is passed over), under the cluster lock
        self._continues = continues.continued_run(root, self.params.cluster) if self._follows else None
        self._started, self._clock = records.now_iso(), time.monotonic()
        (self.record / "params.yaml").write_text(
            record_yaml(self.params, APPROVAL_HEADING, source="parameters"), encoding="utf-8"
        )
        (self.record / "results").mkdir()
        if self._follows:  # for seal-aborted, should the kernel be killed
            records.write_follows(self.record, self._continues)
        self.journal.sink_to(self._journal_file(self.record))  # from here on, as it happens
        self._write_notebook(self.record, "")  # an aborted record names its step by this notebook
        return self.record

    def _journal_file(self, path: Path) -> Path:
        return journal_file(path / "results" / f"{self.step}.json")

    def finished(
        self, result: StepResult | None, *, shown: StepResult | None, error: RunbookError | None = None
    ) -> Path | None:
        """Write the step's result, journal and cells, and seal; ``None`` when nothing was recorded.

        Sealed before the cluster lock is released: a run or approval that takes the lock next reads this
        record as sealed and follows it (review of stop 53: released first, one that started in between
        followed the record before this one)."""
        self.journal.sink_to(None)  # the apply is over: later plans are not part of this approval
        try:
            return self._seal(result, shown, error)
        finally:
            self.release()

    def _seal(
        self, result: StepResult | None, shown: StepResult | None, error: RunbookError | None
    ) -> Path | None:
        path = self.record
        if path is None:
            return None
        self.record = None
        entries = [e.to_dict() for e in self.journal.entries[self._mark :]]
        changed = any(e.get("changes_cluster") for e in entries)
        if not (self._approved or changed or error is not None or (result is not None and not result.ok)):
            shutil.rmtree(path)  # an apply: true cell run that found nothing to change: no change, no record
            return None
        self._write_files(path, result, shown, entries)
        self._journal_file(path).unlink(missing_ok=True)  # the same entries, now in results/<step>.json
        data = self._record_data(path, result, shown, entries, error)
        self.sealed.append(records.seal(path, data, secrets=self._secrets()))
        return path

    def release(self) -> None:
        """Release the cluster's apply lock (also after an interrupted apply, whose record stays unsealed),
        and stop journalling into the record: later plans are not part of this approval."""
        self.journal.sink_to(None)
        self._held.close()

    def _write_files(
        self, path: Path, result: StepResult | None, shown: StepResult | None, entries: list[dict[str, Any]]
    ) -> None:
        payload = {
            "step": self.step,
            "result": result.to_dict() if result is not None else None,
            "plan_shown": shown.to_dict() if shown is not None else None,
            "journal": entries,
            "params": self.params.public_dict(),
        }
        (path / "results" / f"{self.step}.json").write_text(
            json.dumps(payload, indent=2, default=str) + "\n", encoding="utf-8"
        )
        rendered = render_html(result, title=f"{self.step}: applied") if result is not None else ""
        self._write_notebook(path, rendered)
        if rendered:
            (path / "html").mkdir()
            page = html_page(rendered, f"{self.step}: applied")
            (path / "html" / f"{Path(self.notebook_file).stem}.html").write_text(page, encoding="utf-8")
        saved = Path(os.environ.get(SESSION_ENV, ""))
        if saved.suffix == ".ipynb" and saved.is_file():
            shutil.copyfile(saved, path / SAVED_NOTEBOOK)

    def _write_notebook(self, path: Path, rendered: str) -> None:
        notebook = rebuilt_notebook(self.history(), self.step, rendered)
        (path / self.notebook_file).write_text(json.dumps(notebook, indent=1) + "\n", encoding="utf-8")

    def _record_data(
        self,
        path: Path,
        result: StepResult | None,
        shown: StepResult | None,
        entries: list[dict[str, Any]],
        error: RunbookError | None,
    ) -> dict[str, Any]:
        changes, commands = split_journal([journal_record(self.step, entry) for entry in entries])
        outcome = StepOutcome(
            self.step,
            self.notebook_file,
            "failed" if error is not None else (result.status if result is not None else "failed"),
            duration_s=time.monotonic() - self._clock,
            summary=str(error) if error is not None else (result.summary() if result is not None else ""),
            result=result.to_dict() if result is not None else None,
            plan_shown=shown.to_dict() if shown is not None else None,
            error={"ename": type(error).__name__, "evalue": str(error)} if error is not None else None,
        )
        failed = error is not None or result is None or not result.ok
        return {
            "run_id": path.name.rsplit("-", 1)[-1],
            "cluster": self.params.cluster,
            "target": self.params.target,
            "started": self._started,
            "finished": records.now_iso(),
            "duration_s": round(outcome.duration_s, 3),
            "who": records.who(),
            "runbook": records.git_info(REPO),
            "params_file": self.params_file or "(the parameter file's defaults)",
            "overrides": list(self.overrides),
            "apply": True,
            "interactive": {
                "approved": self._approved,
                "notebook": os.environ.get(SESSION_ENV) or "unknown (not started by JupyterLab)",
                "notebook_rebuilt": self.notebook_file,
            },
            "steps_requested": [self.step],
            # as runbook run writes it: a rollback of the run this one went on from is refused without it
            **({continues.FIELD: self._continues} if self._follows else {}),
            "outcome": "failed" if failed else ("changed" if changes else "unchanged"),
            "failed_step": self.step if failed else None,
            "note": f"{HOW[self._approved]}: {INTERACTIVE_NOTE}",
            "params": self.params.public_dict(),
            "plan": compact_plan(build_plan(self.params).to_dict()),
            "steps": [outcome.to_record()],
            "changes": changes,
            "commands": commands,
        }

    def _secrets(self) -> list[str]:
        from .runner import config_paths  # noqa: PLC0415 - lazy, as above

        with contextlib.suppress(RunbookError):
            endpoints = resolve_endpoints(self.params)
            return records.secret_values(*config_paths(endpoints.talosconfig, endpoints.kubeconfig))
        return []


def rebuilt_notebook(cells: Sequence[str], step: str, rendered: str) -> dict[str, Any]:
    """An nbformat 4 notebook of the cells run, in order; the last cell that ran the step shows ``rendered``."""
    call = f"run_step({step!r}"
    shown = max((i for i, source in enumerate(cells) if call in source.replace('"', "'")), default=None)
    out: list[dict[str, Any]] = []
    for number, source in enumerate(cells, 1):
        outputs = []
        if number - 1 == shown and rendered:
            outputs = [{"output_type": "display_data", "data": {"text/html": rendered}, "metadata": {}}]
        cell = {"execution_count": number, "metadata": {}, "source": source, "outputs": outputs}
        out.append({"cell_type": "code", **cell})
    return {
        "nbformat": 4,
        "nbformat_minor": 4,
        "metadata": {"runbook": {"rebuilt": True, "note": INTERACTIVE_NOTE}},
        "cells": out,
    }
