"""What ``runbook run`` adds to the runner's report on its terminal: the operator's own parameters in the fix
commands, and the steps a successful run left for later with the command that continues.

Why here and not in the runner: a step runs in a kernel that knows its parameter values but not the file or the
``--set`` overrides they came from, and the record is shared with people who have neither; only the command line
knows them (found by an operator walkthrough: fixes said ``runbook run -p <parameters> …``, and after ``--steps
image --apply`` nothing said that verify, kubernetes and cuda-test were still to run).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from runbook_lib.errors import PermanentError
from runbook_lib.model.rollback import talosctl_nodes
from runbook_lib.model.text import MODULES_PATCH_MISSING, PARAMS_PLACEHOLDER, shortened
from runbook_lib.notebook import continues, records
from runbook_lib.notebook.record_content import RunOutcome
from runbook_lib.notebook.steps import STEP_NAMES

#: Step statuses after which the next step may run: the run went through this step.
_DONE = ("ok", "changed")


@dataclass(frozen=True)
class Invocation:
    """The parts of a ``runbook run`` command line that a later command must repeat to mean the same cluster."""

    params_file: str | None
    overrides: Sequence[str] = ()
    records: str | None = None
    state: str | None = None
    apply: bool = False
    selection: tuple[str, ...] = ()
    """The run's own ``--steps A,B`` or ``--from STEP`` when it did not name preflight: an ``--apply`` run of
    node-changing steps runs preflight first all the same (``runner.with_preflight``), and a preflight fix's
    ``--steps preflight`` re-run then means this command (walkthrough: it named a plan-only preflight)."""
    picked: bool = False
    """The run was given ``--steps``: it ran those only, and what follows a failure is not this run's to say."""

    def params_args(self) -> list[str]:
        """``-p FILE --set K=V …`` as given; empty when the run resumed a record's parameters (no file)."""
        if self.params_file is None:
            return []
        return ["-p", self.params_file, *(arg for item in self.overrides for arg in ("--set", item))]

    def place_args(self) -> list[str]:
        """``--records DIR --state DIR`` as given: a command to run later must find the same records and cluster."""
        return [
            *(["--records", self.records] if self.records else []),
            *(["--state", self.state] if self.state else []),
        ]

    def with_params(self, text: str) -> str:
        """``text`` with the placeholder of the fixes replaced by this run's ``-p FILE --set … --records …``."""
        args = self.params_args()
        if not args:
            return text
        if self.selection:
            own = [
                "runbook",
                "run",
                *args,
                *self.selection,
                *self.place_args(),
                *(["--apply"] if self.apply else []),
            ]
            # a preflight fix re-runs this command; a hint that preflight *names* something (every write a run
            # needs) means preflight itself: as this run's own --steps kubernetes it pointed back at the command
            # that printed it, and with --apply re-applied (review of eed6b00)
            preflight = rf"runbook run {re.escape(PARAMS_PLACEHOLDER)} --steps preflight(?![\w,-])(?!` names)"
            text = re.sub(preflight, lambda _m: shlex.join(own), text)
        # `runbook run` takes --records and --state too; `runbook schematic show` only -p and --set
        run = f"runbook run {PARAMS_PLACEHOLDER}"
        text = text.replace(run, shlex.join(["runbook", "run", *args, *self.place_args()]))
        return text.replace(PARAMS_PLACEHOLDER, shlex.join(args))

    def continue_from(self, step: str) -> str:
        """The command that runs ``step`` and every step after it with this run's parameters and approval.

        Without ``-p``, ``--from`` reuses the parameters of the latest record in the records folder, which is
        this run's (``cmd_run._resume_values``); the approval is never reused, so ``--apply`` is repeated."""
        argv = ["runbook", "run", "--from", step, *self.params_args(), *self.place_args()]
        argv += ["--apply"] if self.apply else []
        return shlex.join(argv)


def steps_left(outcome: RunOutcome) -> list[str]:
    """The runbook's steps after the first one this run ran (preflight aside) that it did not run, when it changed the cluster and
    every step it ran ended ok or changed.

    Gaps count (review of 6 Dec 2026: after ``--steps preflight,config-patch,verify --apply`` the continue command
    started at kubernetes, past the image the Kubernetes layer needs): ``--from`` the earliest re-runs the steps
    after it that this run did, which find their work done. Empty after a failure (the report says where it
    stopped), a plan (its later steps wait for apply), a run that changed nothing (a health check such as
    ``--steps verify`` is not a partial change) or one with nothing left."""
    if not outcome.ok or not outcome.steps or any(s.status not in _DONE for s in outcome.steps):
        return []
    if not any(s.status == "changed" for s in outcome.steps):
        return []
    ran = {s.name for s in outcome.steps}
    # from the first step after preflight: an --apply run adds preflight to any selection (runner.with_preflight)
    anchor = next((s.name for s in outcome.steps if s.name != "preflight"), outcome.steps[0].name)
    first = STEP_NAMES.index(anchor)
    return [name for name in STEP_NAMES[first + 1 :] if name not in ran]


def what_it_changed(outcome: RunOutcome, invocation: Invocation) -> str:
    """After an approved run that failed: whether it changed the cluster before it stopped, from its record's
    ``changes`` (every command that changes the cluster is journaled there when it ends, failed or not, and every
    Kubernetes API write that succeeded), and when it did, how to undo them. Why: ``stopped at preflight`` said
    nothing of the cluster, and an operator whose ``--apply`` run failed must know whether to look for half-made
    changes (operator walkthrough, stop 52). Calls that failed are counted apart: a refused upgrade changed
    nothing, though a failed talosctl patch may have reached the nodes before the one it stopped at (review).
    "" for a plan, a run that passed, or one without a record."""
    if not (outcome.apply and outcome.failed_step):
        return ""
    if outcome.changes == 0:
        pods = (
            " (the CUDA test's pods aside, which it deletes)"
            if any(s.name == "cuda-test" for s in outcome.steps)
            else ""
        )
        # an API write that raised is not journaled (only commands are, failed or not): said where one can be
        api = (
            " (a Kubernetes API write that failed is not listed: the step's failed check names it)"
            if outcome.failed_step == "kubernetes"
            else ""
        )
        return f"nothing was changed on the cluster: this run made no call that changes it{pods}{api}\n"
    try:
        data = records.load_record(outcome.record)
    except PermanentError:
        data = {}
    failed = sum(1 for c in records.listed(data, "changes") if c.get("exit_code") not in (0, None))
    show = ["runbook", "records", "show", outcome.record.name, "--records", str(outcome.record.parent)]
    rollback = rollback_argv(outcome.record, data, invocation)
    calls = "call that changes" if outcome.changes == 1 else "calls that change"
    some = f"{failed} of them failed and may have changed nothing; " if failed else ""
    return (
        f"before it stopped, this run made {outcome.changes} {calls} the cluster ({some}{shlex.join(show)} "
        f"lists them); to undo them instead of going on (plan first, then --apply): {shlex.join(rollback)}\n"
    )


def resume_after_failure(outcome: RunOutcome, invocation: Invocation) -> str:
    """After an ``--apply`` run of the runbook (or ``--from``) stopped at a step that changes nodes or the
    cluster, the command that goes on from that step once it is fixed. Why: the failed step's fix re-runs that
    step alone (``--steps image --apply``), and the steps after it (verify, the Kubernetes layer, the CUDA test)
    were left for the operator to remember (operator walkthrough, 6 Dec 2026). "" otherwise."""
    failed = outcome.failed_step
    if not (invocation.apply and failed and not invocation.picked) or failed not in STEP_NAMES[1:-1]:
        return ""
    if failed == "image" and _patch_missing(outcome):  # the go-on starts at the patch (walkthrough)
        return (
            f"the image step needs the modules patch first; continue with: {invocation.continue_from('config-patch')}"
            "  # config-patch, then image, verify, kubernetes, cuda-test\n"
        )
    after = STEP_NAMES[STEP_NAMES.index(failed) + 1 :]
    return (
        f"once {failed} is fixed, continue with: {invocation.continue_from(failed)}  "
        f"# {failed} again (it redoes only what is not done), then {', '.join(after)}\n"
    )


def _patch_missing(outcome: RunOutcome) -> bool:
    """Whether the image step failed its nodes for a config without the modules patch (``steps.image``)."""
    step = next((s for s in outcome.steps if s.name == "image"), None)
    nodes = [n for n in ((step.result if step else None) or {}).get("nodes") or [] if isinstance(n, dict)]
    failed = [str(n.get("message") or "") for n in nodes if n.get("status") == "failed"]
    return bool(failed) and all(m.startswith(MODULES_PATCH_MISSING) for m in failed)


def after_interrupt(record: Path | None, invocation: Invocation) -> str:
    """What an interrupted ``--apply`` run can do next, from its sealed record: go on from the step it was in,
    or undo what it changed. Why: the interrupt said only where the record is (operator walkthrough, 6 Dec
    2026), and an interrupted upgrade is when a rollback is wanted. "" when the run was interrupted before it
    opened its record (``None``: it changed nothing), the record cannot be read, or the run only planned.

    ``record`` is the run's own, as the runner opened it (``runner.run(on_record=)``): the newest record of the
    folder was another run's when a plan was interrupted before opening one (review of 49e691e), and could be
    a concurrent run's of the same parameters (review of 8d27fe4's stop).
    No go-on line after ``--steps``: ``--from`` would run steps the operator did not select (review)."""
    data = _applied(record)
    if record is None or data is None:
        return ""
    invocation = replace(invocation, apply=True)
    steps = records.listed(data, "steps")
    cut = next((s.get("name") for s in steps if s.get("status") == "interrupted"), None)
    rollback = rollback_argv(record, data, invocation)
    go_on = cut in STEP_NAMES and not invocation.picked
    lines = _cut_short(data, invocation)
    lines += [f"once it is safe to go on: {invocation.continue_from(str(cut))}"] if go_on else []
    lines.append(f"to undo what it changed instead (plan first, then --apply): {shlex.join(rollback)}")
    return "".join(f"{line}\n" for line in lines)


def _applied(record: Path | None) -> dict[str, Any] | None:
    """The sealed ``record.json`` of an ``--apply`` run; None when there is no record, it cannot be read, or the
    run only planned (it changed nothing; its approval may have come from the file or a --set: review)."""
    if record is None:
        return None
    try:
        data = records.load_record(record)
    except PermanentError:
        return None
    return data if data.get("apply") is True else None


def rollback_argv(record: Path, data: dict[str, Any], invocation: Invocation) -> list[str]:
    """The ``runbook rollback`` that undoes ``record``'s changes. The runs it follows left the same change
    unfinished (continues.py): it names them too, as they changed nodes this record does not show."""
    params = invocation.params_args() or ["-p", "<parameters>"]  # a resumed run's: give the file there
    earlier = [name for name, _data in continues.chain(record.parent, data)] if data else []
    named = [arg for name in [*reversed(earlier), record.name] for arg in ("--from", name)]
    return ["runbook", "rollback", *params, *invocation.place_args(), *named]


#: Node calls :func:`_cut_short` names at most; the record's changes list them all.
CUT_SHORT_MAX = 8


def _cut_short(data: dict[str, Any], invocation: Invocation) -> list[str]:
    """The node calls the interrupt cut short (in flight then, or finished after it), by node, and how to see
    where those nodes are before going on. Why: the interrupt said "once it is safe to go on" while the node
    whose upgrade was stopped showed only in ``records show`` (operator walkthrough, 6 Dec 2026)."""
    lines = _node_calls(data, cut_short=True)
    if not lines:
        return []
    given = invocation.params_args() or ["-p", "<parameters>"]  # a resumed run's: give the file there
    check = shlex.join(["runbook", "run", *given, "--steps", "preflight", *invocation.place_args()])
    return [
        f"cut short by the interrupt (see where these nodes are before going on: {check}):",
        *_at_most(lines),
    ]


def _at_most(lines: list[str]) -> list[str]:
    more = len(lines) - CUT_SHORT_MAX
    return lines[:CUT_SHORT_MAX] + ([f"  … {more} more in the record's changes"] if more > 0 else [])


def _node_calls(data: dict[str, Any], *, cut_short: bool) -> list[str]:
    """``  <nodes>: talosctl <upgrade|patch|call>, <how>`` for each talosctl call of the record's changes the
    interrupt cut short (``cut_short``), or each that finished before it (one over several nodes that exited
    non-zero may have changed some of them: review of 78c5f42)."""
    params = data["params"] if isinstance(data.get("params"), dict) else {}
    names = {str(n.get("address")): str(n.get("name")) for n in records.listed(params, "nodes")}
    lines = []
    for change in records.listed(data, "changes"):
        argv = [str(a) for a in change.get("argv") or []]
        addresses = talosctl_nodes(argv)  # talosctl's only: helm's `-n` is a namespace (review)
        code = change.get("exit_code")
        wanted = bool(change.get("interrupt")) if cut_short else not change.get("interrupt")
        if not wanted or not addresses:
            continue
        nodes = shortened([names.get(a, a) for a in addresses])
        what = next((w for w in ("upgrade", "patch") if w in argv), "call")
        if not cut_short:
            how = "done" if code == 0 else f"exit {code}: it may have changed some of them, or none"
        else:
            how = (
                "in flight: it may have reached the node"
                if code is None
                else f"exit {code} after the interrupt"
            )
        lines.append(f"  {nodes}: {Path(argv[0]).name} {what}, {how}")
    return lines


def after_rollback_interrupt(record: Path | None, invocation: Invocation) -> str:
    """What an interrupted ``--apply`` rollback had done, node by node, from its sealed record: the calls that
    finished before the interrupt and the ones it cut short. Why: it printed only the command that goes on, so a
    person did not know which nodes were back (operator walkthrough, stop 53). "" when there is no such record."""
    data = _applied(record)
    if data is None:
        return ""
    done = _node_calls(data, cut_short=False)
    lines = ["done before the interrupt:", *_at_most(done)] if done else []
    cut = _node_calls(data, cut_short=True)
    # where they are now: the rollback's own plan says, not a forward preflight (walkthrough, stop 54)
    lines += (
        ["cut short by the interrupt (the plan of the rollback below shows where these nodes are now):"]
        if cut
        else []
    )
    return "".join(f"{line}\n" for line in lines + _at_most(cut))


#: A command that needs the cluster's servers up: talosctl, kubectl or helm (a path's too) with a flag or one of
#: the subcommands the runbook's fixes and notes print; not prose such as "helm release".
_TOOL_FIX = re.compile(
    r"(?:^|[\s`(])(?:\S*/)?(?:talosctl|kubectl|helm) "
    r"(?:-|label |get |uninstall |upgrade |delete |cordon |uncordon |patch |dmesg|logs |describe |rollout )",
    re.MULTILINE,
)


def simulator_stopped(text: str, invocation: Invocation) -> str:
    """After a simulated run whose report gives tool commands (fixes, notes, a rollback's not-undone label
    commands), after which the simulator it used is down: how to start it again as the run left it. "" when
    no command needs it. "Used", not "started": the last run to leave a simulator that several runs shared
    stops it, whichever of them started it (review of 8d27fe4's stop).

    Why: the unsupported GPU's ``talosctl … dmesg | grep NVRM``, pasted after ``runbook run``, failed to connect:
    the run had stopped the simulator on its way out (operator walkthrough, stop 48); so did a passed rollback's
    ``kubectl label node … nvidia.com/gpu.present-`` (README audit, stop 50)."""
    # a plan's `would: helm upgrade …` lines show a change, not a command to run (review of eed6b00)
    commands = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("would:"))
    if not _TOOL_FIX.search(commands):
        return ""
    state = ["--state", invocation.state] if invocation.state else []
    up, down = (
        shlex.join(["runbook", "sim", "up", "--keep", *state]),
        shlex.join(["runbook", "sim", "down", *state]),
    )
    return (
        f"the simulated cluster this run used is stopped: to run a talosctl, kubectl or helm command above, "
        f"start it as the run left it first, `{up}` (it prints the PATH line those commands need; "
        f"`{down}` after)\n"
    )


def report(outcome: RunOutcome, invocation: Invocation, *, simulator_stopped_after: bool = False) -> str:
    """The runner's report with this run's parameters in its fixes and, after a partial run, what is left;
    ``simulator_stopped_after``: the run stopped the simulator it started (:func:`simulator_stopped`).

    What this adds goes before the record's two lines, so ``anchor: …`` stays the last line (a CI step's
    ``tail -1``, README "Change records"; it came after the go-on lines: README audit, stop 50)."""
    text = invocation.with_params(outcome.report())
    added = what_it_changed(outcome, invocation) + resume_after_failure(outcome, invocation)
    if simulator_stopped_after:
        added += simulator_stopped(text, invocation)
    left = steps_left(outcome)
    if left:
        added += f"not run yet: {', '.join(left)}; continue with: {invocation.continue_from(left[0])}\n"
    return before_record(text, added)


def before_record(text: str, added: str) -> str:
    """``added`` put into a report above its ``record:`` and ``anchor:`` lines, which stay last."""
    head, cut, tail = text.rpartition("\nrecord: ")
    if not cut:
        return text + added
    return f"{head}\n{added}record: {tail}"
