"""``runbook rollback``: the rollback notebook headless, into its own change record.

Why its own command and not a step of ``runbook run``: a normal run must never undo itself, and what a
rollback undoes is named by change records (``--from RECORD``), not by a step.  The records are resolved
and checked (sealed, intact, of this cluster) before the simulator starts or a tool runs, so a wrong name is
exit 2 with nothing done; their paths become ``rollback.records``, which the record of the rollback keeps.

Why only ``--apply`` approves it, never ``apply: true`` in the parameters or a ``--set``: the parameter file
is the one ``runbook run`` applies from (a CI file may well say ``apply: true``), and the README's plan command
``runbook rollback -p FILE --from RECORD`` would otherwise undo every GPU node it names.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from runbook_lib.model.params import load_params
from runbook_lib.model.rollback import NOT_UNDONE_NOTE
from runbook_lib.notebook import runner
from runbook_lib.notebook.record_content import RunOutcome, node_lines
from runbook_lib.notebook.rollback_records import load_evidence, record_path
from runbook_lib.notebook.steps import ROLLBACK

from . import cmd_run, live, run_report

_NOT_APPROVED = (
    "runbook rollback: apply: true in the parameters (file or --set) does not approve a rollback: "
    "planning only (add --apply to roll back)\n"
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "rollback",
        help="take the GPU nodes back to where the runbook found them, from its change records",
        description=(
            "Runs notebooks/07-rollback.ipynb into a new change record: the Kubernetes layer the named records "
            "created is uninstalled, each node they changed goes back to the image it was found on, then the "
            "config patch is removed. Without --apply it only plans and dry-runs."
        ),
    )
    parser.add_argument(
        "-p", "--params", metavar="PARAMS", help="parameter file (default: params/simulated.yaml)"
    )
    parser.add_argument(
        "--from",
        dest="from_records",
        action="append",
        required=True,
        metavar="RECORD",
        help="a change record whose changes are undone (name, unique prefix or suffix, or path); repeat it "
        "for a run and its resumes",
    )
    cmd_run.add_run_options(parser)
    parser.set_defaults(handler=_rollback)


def _rollback(args: argparse.Namespace) -> int:
    with cmd_run.sigterm_unwinds():
        return _roll_back(args)


def _roll_back(args: argparse.Namespace) -> int:
    root = cmd_run._checked_records_root(args.records)
    params_file: str = args.params or "params/simulated.yaml"
    values = {"rollback.records": [str(record_path(ref, root)) for ref in args.from_records]}
    # the records are checked now: a wrong one is exit 2 before the simulator starts or a tool runs
    params = load_params(params_file, args.overrides, values)
    load_evidence(params, root)
    if params.apply and not args.apply:
        sys.stderr.write(_NOT_APPROVED)
    state_dir = cmd_run.resolve_state(args.state)
    cluster = cmd_run.SimulatorHook(state_dir)
    opened: list[Path] = []  # the rollback's record, once it exists (run_report.after_rollback_interrupt)
    try:
        outcome = runner.run(
            params_file,
            steps=[ROLLBACK.name],
            apply=bool(args.apply),  # only --apply approves a rollback (module docstring)
            overrides=args.overrides,
            values=values,
            records_root=root,
            cluster=cluster,
            cluster_key=str(state_dir),
            progress=not args.no_progress,
            on_event=live.print_event,
            on_record=opened.append,
        )
    except (KeyboardInterrupt, SystemExit) as exc:
        if args.apply:
            where = run_report.Invocation(params_file, args.overrides or (), args.records, args.state)
            sys.stderr.write(run_report.after_rollback_interrupt(opened[0] if opened else None, where))
            sys.stderr.write(_go_on(args, params_file, [Path(p) for p in values["rollback.records"]], root))
        if isinstance(exc, KeyboardInterrupt):
            sys.excepthook = cmd_run.quiet_interrupt  # this process ends by it: no traceback under the record
        raise
    done = _done_lines(outcome)
    # the list of what is not undone is in the done lines: its notes are not printed again (walkthrough)
    text = done + outcome.report(omit_notes=(NOT_UNDONE_NOTE,) if done else ())
    if cluster.stopped_after():  # its kubectl lines need it up (README audit)
        where = run_report.Invocation(params_file, args.overrides or (), args.records, args.state)
        text = run_report.before_record(text, run_report.simulator_stopped(text, where))
    sys.stdout.write(text)
    return 0 if outcome.ok else 1


def _go_on(args: argparse.Namespace, params_file: str, named: list[Path], root: Path) -> str:
    """After Ctrl-C or SIGTERM of an ``--apply`` rollback, the command that goes on: the same one, which plans
    from where the nodes are now and does only what is left. Why: the interrupt said only where the record is,
    and an operator did not know whether running the rollback again was safe (operator walkthrough, 6 Dec 2026).
    The records by their full names (``named``, as resolved): a prefix given may match this rollback's own
    record too (review).
    """
    invocation = run_report.Invocation(params_file, args.overrides or (), args.records, args.state)
    refs = [p.name if p.parent == root.resolve() else str(p) for p in named]
    argv = ["runbook", "rollback", *invocation.params_args(), *invocation.place_args()]
    argv += [arg for ref in refs for arg in ("--from", ref)]
    return (
        f"to go on once it is safe: {shlex.join(argv)}  # plan first: it plans from where the nodes are now; "
        "then the same with --apply does only what is left\n"
    )


def _done_lines(outcome: RunOutcome) -> str:
    """After an applied rollback, what it did per group of nodes and what it left for a person, above the step
    line: the counts alone said nothing of either (found by an operator walkthrough), and what is not undone
    (node labels, a device plugin removed for the GPU Operator) is a to-do for whoever ran it."""
    step = next((s for s in outcome.steps if s.name == ROLLBACK.name), None)
    if step is None or step.status != "changed" or not step.result or not step.result.get("applied"):
        # a plan says all this in its plan lines, and a failed rollback's list was made for nodes that did not
        # all go back (review of 6 Dec 2026): the record keeps it, the report says where it stopped
        return ""
    data = step.result.get("data") or {}
    # a rollback that passed removed what its plan listed: a failed removal fails the step
    kubernetes = [f"  {what}" for what in [*(data.get("kubernetes") or []), *(data.get("uncordoned") or [])]]
    lines = ["rolled back:", *kubernetes, *node_lines(step.result, "changed")]
    lines = lines if len(lines) > 1 else []
    left = data.get("not_undone") or []
    lines += (
        ["not undone by the rollback, put back by hand if needed:", *(f"  {i}" for i in left)] if left else []
    )
    return "".join(f"{line}\n" for line in lines)
