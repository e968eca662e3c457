"""``runbook records list|show|verify|seal-aborted``: reading, checking and closing the change records.

Why a module of its own: a record is read by people who did not run it (reviewers, auditors), so what ``show``
prints is its own concern, apart from running the notebooks (``cmd_run``).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from runbook_lib.cli import cmd_run
from runbook_lib.notebook import interrupts, lock, records, runner
from runbook_lib.notebook.record_content import step_line_summary
from runbook_lib.notebook.steps import journal_file


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    rec = sub.add_parser("records", help="list, show and verify change records")
    rec_sub = rec.add_subparsers(dest="records_command", metavar="ACTION", required=True)
    lst = rec_sub.add_parser("list", help="one line per record, oldest first")
    show = rec_sub.add_parser("show", help="a record's steps, changes and verification results")
    show.add_argument("name", nargs="?", help="record name, or a unique prefix/suffix (default: latest)")
    show.add_argument("--json", action="store_true", help="print record.json")
    ver = rec_sub.add_parser("verify", help="check manifests and the chain; non-zero exit names what changed")
    ver.add_argument(
        "--expect",
        action="append",
        default=[],
        metavar="SHA256",
        help="a record's SHA256SUMS hash kept outside the folder (`runbook run` prints it): that record must "
        "still be there, unchanged; repeatable",
    )
    aborted = rec_sub.add_parser(
        "seal-aborted",
        help="seal a run that was killed or crashed (no record.json, no SHA256SUMS) as aborted",
        description="Only for a run that is no longer running: seals its directory as an aborted run, at "
        "the end of the chain, listing the files it left; secrets from its configs are scrubbed first.",
    )
    aborted.add_argument("name", help="the unsealed record's name, or a unique prefix/suffix")
    aborted.add_argument(
        "--state",
        metavar="DIR",
        help="simulator state directory (target simulated; default: $RUNBOOK_SIM_STATE or <repo>/.sim/default)",
    )
    for parser in (lst, show, ver, aborted):
        parser.add_argument(
            "--dir",
            "--records",  # the name `runbook run` and `runbook rollback` give it (an operator walkthrough tried it)
            dest="dir",
            metavar="DIR",
            help="records directory (default: $RUNBOOK_RECORDS or ./records)",
        )
    lst.set_defaults(handler=_list)
    show.set_defaults(handler=_show)
    ver.set_defaults(handler=_verify)
    aborted.set_defaults(handler=_seal_aborted)


def _root(value: str | None) -> Path:
    return Path(value) if value else records.default_root()


def _list(args: argparse.Namespace) -> int:
    with records.reading(
        _root(args.dir)
    ):  # a seal in progress is waited for, not named as malformed or broken
        rows = records.list_records(_root(args.dir))
        chain = records.read_chain(_root(args.dir), quick=True)
    if not rows:
        missing = "" if _root(args.dir).is_dir() else " (the folder does not exist)"
        sys.stdout.write(f"no records in {_root(args.dir)}{missing}\n")
        return 0
    for row in rows:
        if row.problem:
            sys.stdout.write(f"{row.name}  malformed: {row.problem}\n")
            continue
        if records.is_unsealed(row.path):
            sys.stdout.write(
                f"{row.name}  aborted?   not sealed (killed or crashed, or still running): "
                f"{_seal_aborted_command(row.name, args.dir)}\n"
            )
            continue
        mode = "apply" if row.apply else "plan"
        steps = " ".join(f"{name}:{status}" for name, status in row.steps)
        nodes = f"  [{row.nodes}]" if row.nodes else ""
        sys.stdout.write(
            f"{row.name}  {row.outcome:<10} {mode:<5} {row.changes:>3} {_plural(row.changes)}  {steps}{nodes}\n"
        )
    if chain.head is not None and (chain.head / records.MANIFEST).is_file():
        sys.stdout.write(_head_line(chain.head))
    malformed = [row.name for row in rows if row.problem]
    if malformed:  # every record is listed, but a script must notice
        sys.stderr.write(f"error: malformed record(s): {', '.join(malformed)} (`runbook records verify`)\n")
    # the links only (each record.json's head): a broken one was listed without a word (attack re-run,
    # 7 Dec 2026); the files' hashes are `records verify`'s, which reads every file
    for problem in chain.problems:
        sys.stderr.write(f"error: {problem} (`runbook records verify`)\n")
    return 2 if malformed or chain.problems else 0


def _plural(count: int) -> str:
    return "change " if count == 1 else "changes"  # padded: the columns after it stay aligned


def _mapping(data: dict[str, Any], key: str) -> dict[str, Any]:
    """``data[key]`` if it is a mapping: ``show`` prints what a malformed record has, never crashes on it."""
    value = data.get(key)
    return value if isinstance(value, dict) else {}


def _show(args: argparse.Namespace) -> int:
    """The record, then (exit 2) what makes it not intact: a record.json edited after sealing was shown without
    a word (attack re-run, 7 Dec 2026); ``records verify`` checks the whole folder."""
    path = records.resolve(_root(args.dir), args.name)
    data = records.load_record(path)
    if args.json:
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
    else:
        _show_text(path, data)
    problems = records.intact_problems(path)
    if problems:
        sys.stderr.write(
            f"error: {path.name} is not intact: {'; '.join(problems)} (`runbook records verify`)\n"
        )
        return 2
    return 0


def _show_text(path: Path, data: dict[str, Any]) -> None:
    out = sys.stdout
    who = _mapping(data, "who")
    git = _mapping(data, "runbook")
    out.write(f"record:   {path.name}\n")
    out.write(f"path:     {path}\n")
    out.write(f"cluster:  {data.get('cluster')} ({data.get('target')})\n")
    # an aborted run's record holds no `who` (its seal never ran): `?@?` read as a corrupt field (attack re-run)
    by = f"{who.get('user', '?')}@{who.get('host', '?')}" if who else "not recorded"
    out.write(f"by:       {by} at {data.get('started')}\n")
    dirty = " (dirty tree)" if git.get("dirty") else ""
    out.write(f"runbook:  {git.get('commit') or 'unknown commit'}{dirty}\n")
    out.write(f"mode:     {'apply' if data.get('apply') else 'plan only'}; outcome {data.get('outcome')}\n")
    if data.get(
        "continues"
    ):  # the run before it on the cluster: a rollback of this one names it (continues.py)
        out.write(f"follows:  {data['continues']} (the cluster's earlier run that changed it)\n")
    if data.get("aborted"):
        late = _mapping(data, "sealed_after_abort")
        files = ", ".join(str(f.get("path")) for f in records.listed(data, "files"))
        out.write(
            f"aborted:  sealed afterwards by {late.get('user')}@{late.get('host')} at {late.get('at')}\n"
        )
        out.write(f"          files it left: {files or 'none'}\n")
    _show_steps(records.listed(data, "steps"))
    _show_checked(_mapping(_mapping(data, "verification"), "verify"))
    _show_changes(records.listed(data, "changes"))
    if data.get("note"):
        out.write(f"note: {data['note']}\n")


def _show_steps(steps: list[dict[str, Any]]) -> None:
    sys.stdout.write("steps:\n")
    for step in steps:
        duration = step.get("duration_s", 0)
        seconds = f"{duration:>7.1f}" if isinstance(duration, int | float) else f"{'?':>7}"
        line = f"  {step.get('name')!s:<13} {step.get('status')!s:<10} {seconds} s"
        if step.get("summary"):
            line += (
                f"  {step_line_summary(str(step['summary']), str(step.get('name')), str(step.get('status')))}"
            )
        sys.stdout.write(line + "\n")
        error = step.get("error")
        if isinstance(error, dict):
            sys.stdout.write(_error_lines(error, step.get("summary")))


def _error_lines(error: dict[str, Any], summary: object) -> str:
    """A step's error under its line, every line indented alike. A step that found problems (``StepFailed``) is
    no exception to name: its diagnosis is shown without the class and without its first line when that repeats
    the step's summary (found by an operator walkthrough: ``error: StepFailed: kubernetes: failed (…)``, then
    the diagnosis indented less than that line)."""
    lines = str(error.get("evalue") or "").splitlines() or [""]
    if error.get("ename") == "StepFailed":
        lines = lines[1:] if lines[0].strip() == str(summary or "").strip() else lines
    else:
        lines[0] = f"error: {error.get('ename')}: {lines[0]}"
    return "".join(f"    {line}\n" for line in lines if line.strip())


def _show_checked(verify: dict[str, Any]) -> None:
    """What verify saw, one line per distinct node inventory (identical nodes share a line)."""
    checked = verify.get("checked")
    if isinstance(checked, list) and checked:
        sys.stdout.write("verify checked:\n" + "".join(f"  {line}\n" for line in checked))


def _show_changes(changes: list[dict[str, Any]]) -> None:
    sys.stdout.write(f"changes to the cluster: {len(changes) or 'none'}\n")
    patches: dict[str, str] = {}  # patch body -> the name it is shown under
    for change in changes:
        argv = _with_patch_name(change, patches)
        text = " ".join(map(str, argv)) if argv else str(change.get("summary", ""))
        code = change.get("exit_code")
        interrupt = change.get("interrupt")  # in flight at, or finished after, an interrupt (Ctrl-C)
        sys.stdout.write(
            f"  [{change.get('step')}] {text}"
            + (f"  (exit {code})" if code is not None else "")
            + (f"  ({interrupt})" if interrupt else "")
            + "\n"
        )
    for body, name in patches.items():
        sys.stdout.write(f"{name} (the machine-config patch the changes above name):\n")
        sys.stdout.write("".join(f"    {line}\n" for line in body.rstrip("\n").splitlines()))


def _with_patch_name(change: dict[str, Any], patches: dict[str, str]) -> list[str]:
    """The change's argv with ``--patch @<temporary file>`` named by its content: ``@patch-1.yaml``, shown below.

    Why: the runbook writes each patch to a temporary file that is gone once the step ends, so the path told a
    reader nothing (found by an operator walkthrough); the record keeps the patch itself as the change's
    ``diff``. Identical patches share one name, so 1,000 nodes patched alike show one patch."""
    argv = change.get("argv")
    if not isinstance(argv, list) or not argv:
        return []
    body = change.get("diff")
    if not isinstance(body, str) or "--patch" not in argv:
        return [str(a) for a in argv]
    at = argv.index("--patch") + 1
    if at >= len(argv) or not str(argv[at]).startswith("@"):
        return [str(a) for a in argv]
    name = patches.setdefault(body, f"patch-{len(patches) + 1}.yaml")
    return [*map(str, argv[:at]), f"@{name}", *map(str, argv[at + 1 :])]


def _seal_aborted_command(name: str, folder: str | None) -> str:
    """``runbook records seal-aborted NAME`` with the folder as given: pasted without it, the command looked in
    ./records and said "no records" (README audit, stop 50)."""
    return shlex.join(
        ["runbook", "records", "seal-aborted", name, *(["--records", folder] if folder else [])]
    )


def _verify(args: argparse.Namespace) -> int:
    root = _root(args.dir)
    chain = records.check(root, args.expect)
    out = sys.stdout
    for path in chain.aborted:
        out.write(
            f"aborted run, not sealed: {path.name} (killed or crashed, or still running); once it is not "
            f"running: {_seal_aborted_command(path.name, args.dir)}\n"
        )
    if chain.problems:
        out.write(f"{len(chain.problems)} problem(s) in {root}:\n")
        for problem in chain.problems:
            out.write(f"  - {problem}\n")
        return 1
    anchored = f", {len(args.expect)} anchor(s) found" if args.expect else ""
    out.write(f"ok: {len(chain.order)} record(s) in {root}, manifests and chain intact{anchored}\n")
    if chain.head is not None:
        out.write(_head_line(chain.head))
    return 0


def _head_line(head: Path) -> str:
    digest = records.sha256_file(head / records.MANIFEST)
    return (
        f"head: {head.name}  SHA256SUMS {digest}\n"
        f"anchor (keep it outside this folder): runbook records verify --records "
        f"{shlex.quote(str(head.parent))} --expect {digest}\n"
    )


def _seal_aborted(args: argparse.Namespace) -> int:
    root = _root(args.dir)
    path = records.resolve(root, args.name)
    params = records.aborted_params(path) or {}
    talosconfig, kubeconfig = params.get("talosconfig"), params.get("kubeconfig")
    paths = runner.config_paths(
        talosconfig if isinstance(talosconfig, str) else None,
        kubeconfig if isinstance(kubeconfig, str) else None,
    )
    if params.get("target", "simulated") == "simulated":
        state = cmd_run.resolve_state(args.state)
        paths += [str(state / "talosconfig"), str(state / "kubeconfig")]
    # A run applying into this folder holds this lock: the directory may be its own, not an aborted one.
    with lock.exclusive(root / lock.RECORDS_LOCK, f"the records folder {root}"):
        digest = records.seal_aborted(
            path,
            secrets=records.secret_values(*paths),
            read_journal=lambda result: interrupts.read_journal(journal_file(result), float("inf")),
        )
    sys.stdout.write(f"sealed {path.name} as an aborted run\n" + _head_line(path))
    return 0 if digest else 1
