"""The approval gate: nothing changes a cluster unless the ``apply`` parameter or a person says so.

Why it is built this way (see the notebook-ecosystem notes §4): a headless kernel has no stdin and no one to
click, so the gate never waits.  With ``apply`` true the step applies directly; with ``apply`` false it
shows the plan and an Approve button and returns at once.  In JupyterLab the button applies *the plan that
was shown*: before applying, the plan is computed again and compared with the one on screen, and if the
cluster moved in between nothing is applied.  The button works once; the node picker re-plans for the
chosen nodes, so what is approved is always what is displayed.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from html import escape
from pathlib import Path
from typing import Any, Protocol

import ipywidgets as widgets

from runbook_lib.errors import RunbookError
from runbook_lib.steps.results import StepResult

from .render import render_html, show_html, show_widget

Progress = Callable[[int, int], None]
PlanFn = Callable[[list[str] | None], StepResult]
ApplyFn = Callable[[list[str] | None, Progress], StepResult]


class Recorder(Protocol):
    """Seals a change record of an apply (``interactive_record.InteractiveRecorder``): the gate calls
    ``started`` right before applying and ``finished`` after, so a person's click leaves the same record a
    headless run does."""

    def hold(self) -> None: ...

    def started(self, *, approved: bool = True) -> Path: ...

    def finished(
        self, result: StepResult | None, *, shown: StepResult | None, error: RunbookError | None = None
    ) -> Path | None: ...

    def release(self) -> None: ...


#: Keys whose values differ between two plans of the same change (timings, tool chatter).
_VOLATILE = frozenset({"dry_run", "duration_s", "started", "at", "run_id"})


def _stable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _stable(v) for k, v in sorted(value.items()) if k not in _VOLATILE}
    if isinstance(value, list | tuple):
        return [_stable(v) for v in value]
    return value


def plan_fingerprint(result: StepResult) -> str:
    """What a person approves: per-node status and diff, the checks, and the planned changes."""
    data = result.to_dict()
    data.pop("applied", None)
    data.pop("notes", None)
    return hashlib.sha256(json.dumps(_stable(data), sort_keys=True, default=str).encode()).hexdigest()


class ProgressBar:
    """An ``IntProgress`` fed by a step's ``progress(done, total)`` callback."""

    def __init__(self, description: str = "rollout") -> None:
        self.widget = widgets.IntProgress(value=0, min=0, max=1, description=description, bar_style="info")
        self.label = widgets.Label("")

    def __call__(self, done: int, total: int) -> None:
        self.widget.max = max(total, 1)
        self.widget.value = min(done, self.widget.max)
        self.label.value = f"{done}/{total} nodes"

    def finish(self, ok: bool) -> None:
        if ok:
            # Steps that report no per-node progress (e.g. the Kubernetes layer) still end full.
            self.widget.value = self.widget.max
        self.widget.bar_style = "success" if ok else "danger"


class ApprovalGate:
    """Plan display, node picker, Approve button and progress bar for one step.

    ``plan_fn(only)`` computes a dry-run plan; ``apply_fn(only, progress)`` changes the cluster.  Both are
    the same library call with ``apply`` false/true, so notebooks and headless runs share one code path.
    """

    def __init__(
        self,
        step: str,
        plan_fn: PlanFn,
        apply_fn: ApplyFn,
        *,
        nodes: list[str],
        selected: list[str] | None = None,
        on_applied: Callable[[StepResult], None] | None = None,
        title: str | None = None,
        recorder: Recorder | None = None,
    ) -> None:
        self.step = step
        self._recorder = recorder
        self._plan_fn = plan_fn
        self._apply_fn = apply_fn
        self._on_applied = on_applied
        self._title = title or step
        self.shown: StepResult | None = None
        self.shown_nodes: list[str] | None = None
        self.applied: StepResult | None = None
        self._fingerprint = ""
        self.picker = widgets.SelectMultiple(
            options=list(nodes),
            value=tuple(selected or nodes),
            description="nodes",
            rows=min(max(len(nodes), 2), 10),
        )
        self.button = widgets.Button(
            description="Approve and apply",
            button_style="warning",
            icon="check",
            disabled=True,
            layout=widgets.Layout(width="max-content"),
        )
        self.progress = ProgressBar()
        self.status = widgets.HTML("")
        self.output = widgets.Output()
        self.button.on_click(self.approve)
        self.picker.observe(self._picked, names="value")

    # -- planning -------------------------------------------------------------------------------------
    def _selection(self) -> list[str] | None:
        chosen = list(self.picker.value)
        return None if len(chosen) == len(self.picker.options) else chosen

    def plan(self) -> StepResult:
        """Compute and remember the plan for the picked nodes; the button applies exactly this."""
        only = self._selection()
        result = self._plan_fn(only)
        self.shown, self.shown_nodes = result, only
        self._fingerprint = plan_fingerprint(result)
        if not result.ok:
            self.button.disabled = True
            self.status.value = "<b>The plan has failures: fix them and run the cell again.</b>"
        elif result.status == "ok" or not _has_changes(result):
            self.button.disabled = True
            self.status.value = "Nothing to change on the selected nodes."
        else:
            self.button.disabled = self.applied is not None
            self.status.value = "Review the plan above, then approve to apply exactly it."
        return result

    def _picked(self, _change: Any) -> None:
        if self.applied is not None:
            return
        result = self.plan()
        self.output.clear_output()
        with self.output:
            show_html(render_html(result, title=f"{self._title}: plan for the selected nodes"))

    # -- approval -------------------------------------------------------------------------------------
    def approve(self, _button: Any = None) -> StepResult | None:
        """Apply the plan on screen, once.  Refuses when the cluster no longer matches that plan."""
        if self.button.disabled and _button is not None:
            return None
        if self.shown is None or self.applied is not None:
            return None
        self.button.disabled = True
        self.picker.disabled = True
        self.status.value = "Checking that the plan still holds…"
        try:
            if self._recorder is not None:
                self._recorder.hold()
            current = self._plan_fn(self.shown_nodes)
            if plan_fingerprint(current) != self._fingerprint:
                self.status.value = (
                    "<b>The cluster changed since this plan was shown; nothing was applied.</b> "
                    "Run the cell again to see the new plan."
                )
                self.output.clear_output()
                with self.output:
                    show_html(render_html(current, title=f"{self._title}: the plan now"))
                return None
            self.status.value = "Applying…"
            if self._recorder is not None:
                self._recorder.started()
            result = self._apply_fn(self.shown_nodes, self.progress)
        except RunbookError as exc:
            self.status.value = f"<b>Failed:</b> {escape(str(exc))}"  # tool output: text, never markup
            self.progress.finish(False)
            self._record(None, exc)
            return None
        else:
            self.applied = result
            self.progress.finish(result.ok)
            self.status.value = f"Applied: {result.summary()}"
            # sealed while the cluster is still held: see InteractiveRecorder.finished
            self._record(result, None)
        finally:
            if self._recorder is not None:
                self._recorder.release()  # also when interrupted: the next approval must not find it held
        self.output.clear_output()
        with self.output:
            show_html(render_html(result, title=f"{self._title}: applied"))
        if self._on_applied is not None:
            self._on_applied(result)
        return result

    def _record(self, result: StepResult | None, error: RunbookError | None) -> None:
        """Seal the record of this approval (a no-op when it never started applying)."""
        if self._recorder is None:
            return
        try:
            path = self._recorder.finished(result, shown=self.shown, error=error)
        except (OSError, RunbookError) as exc:  # a button callback's exception is seen by no one: say it
            self.status.value += f"<br><b>The change record could not be written:</b> {escape(str(exc))}"
            return
        if path is not None:
            self.status.value += f"<br>Change record: <code>{escape(str(path))}</code>"

    def widget(self) -> widgets.VBox:
        bar = widgets.HBox([self.progress.widget, self.progress.label])
        return widgets.VBox([self.picker, self.button, self.status, bar, self.output])


def _has_changes(result: StepResult) -> bool:
    return result.status == "planned" or bool(result.data.get("planned"))


def gated(
    step: str,
    plan_fn: PlanFn,
    apply_fn: ApplyFn,
    *,
    apply: bool,
    nodes: list[str],
    selected: list[str] | None,
    show: bool = True,
    on_applied: Callable[[StepResult], None] | None = None,
    title: str | None = None,
    recorder: Recorder | None = None,
) -> tuple[StepResult, ApprovalGate | None]:
    """Run a cluster-changing step behind the gate; never waits for input.

    ``apply`` true: apply directly (with a progress bar).  ``apply`` false: plan, display the plan and the
    gate's widgets, and return the plan; a click later applies it.  ``recorder`` seals a change record of
    each approval, and of an ``apply`` true run that changed the cluster.
    """
    if apply:
        bar = ProgressBar()
        if show:
            show_widget(widgets.HBox([bar.widget, bar.label]))
        result = _apply_recorded(apply_fn, selected, bar, recorder)
        bar.finish(result.ok)
        if show:
            show_html(render_html(result, title=title))
        return result, None
    gate = ApprovalGate(
        step,
        plan_fn,
        apply_fn,
        nodes=nodes,
        selected=selected,
        on_applied=on_applied,
        title=title,
        recorder=recorder,
    )
    result = gate.plan()
    if show:
        show_html(render_html(result, title=f"{title or step}: plan"))
        show_widget(gate.widget())
    return result, gate


def _apply_recorded(
    apply_fn: ApplyFn, selected: list[str] | None, bar: ProgressBar, recorder: Recorder | None
) -> StepResult:
    """``apply_fn`` with its record, when there is a recorder (it keeps only a run that changed something)."""
    if recorder is None:
        return apply_fn(selected, bar)
    try:
        recorder.hold()
        recorder.started(approved=False)
        result = apply_fn(selected, bar)
    except RunbookError as exc:
        recorder.finished(None, shown=None, error=exc)
        raise
    else:
        recorder.finished(result, shown=None)  # sealed while the cluster is still held
    finally:
        recorder.release()
    return result
