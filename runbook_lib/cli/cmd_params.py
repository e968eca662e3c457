"""``runbook params check|doc`` and ``runbook plan``: everything that needs no cluster."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from runbook_lib.errors import PermanentError
from runbook_lib.model.params import load_params, parameters_markdown, record_yaml
from runbook_lib.model.plan import build_plan


def add_params_args(parser: argparse.ArgumentParser) -> None:
    """``-p FILE`` and repeatable ``--set KEY=VALUE``: the same options wherever a command reads parameters."""
    parser.add_argument(
        "-p", "--params", required=True, metavar="FILE", help="parameter file (params/*.yaml)"
    )
    add_set_arg(parser)


def add_set_arg(parser: argparse.ArgumentParser) -> None:
    """Repeatable ``--set KEY=VALUE`` into ``overrides``: one definition for every command that takes it."""
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one parameter (dotted keys for sections, e.g. device_plugin.namespace=gpu); repeatable",
    )


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    params = sub.add_parser("params", help="check or document parameter files")
    params_sub = params.add_subparsers(dest="params_command", metavar="ACTION", required=True)
    check = params_sub.add_parser(
        "check", help="validate a parameter file; print 'ok' and the resolved values"
    )
    check.add_argument("file", metavar="FILE")
    check.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    check.set_defaults(handler=_check)
    doc = params_sub.add_parser("doc", help="print the parameter reference as a Markdown table")
    doc.add_argument(
        "--write",
        metavar="README",
        help="replace the table between the <!-- parameters:begin/end --> markers of this file instead",
    )
    doc.set_defaults(handler=_doc)

    plan = sub.add_parser(
        "plan", help="print the resolved plan for a parameter file, without touching a cluster"
    )
    add_params_args(plan)
    plan.add_argument("--format", choices=["yaml", "json"], default="yaml")
    plan.set_defaults(handler=_plan)


def _dump(data: Any, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(data, indent=2) + "\n"
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)


def _check(args: argparse.Namespace) -> int:
    params = load_params(args.file, args.overrides)
    text = record_yaml(params, "", source=args.file)  # what `runbook run` will refuse, refused here too (N7)
    sys.stdout.write("ok\n" + text)
    return 0


BEGIN, END = "<!-- parameters:begin -->\n", "<!-- parameters:end -->"


def _doc(args: argparse.Namespace) -> int:
    if not args.write:
        sys.stdout.write(parameters_markdown())
        return 0
    path = Path(args.write)
    text = path.read_text(encoding="utf-8")
    if BEGIN not in text or END not in text:
        raise PermanentError(f"{path} has no {BEGIN.strip()} ... {END} markers")
    head, rest = text.split(BEGIN, 1)
    _old, tail = rest.split(END, 1)
    path.write_text(head + BEGIN + parameters_markdown() + END + tail, encoding="utf-8")
    return 0


#: What ``runbook plan`` says first for ``target: simulated`` (a YAML comment; on stderr with ``--format json``).
SIMULATED_NOTE = (
    "target simulated: `runbook run` uses the simulator's Image Factory and chart repository in place of the "
    "installer registry and repo_url below (their local addresses exist only while it runs: `runbook sim status`)"
)


def _plan(args: argparse.Namespace) -> int:
    """The plan offline. Why the note: for a simulated target it showed factory.talos.dev and the public chart
    repository, which that run never contacts (found by an operator walkthrough)."""
    params = load_params(args.params, args.overrides)
    plan = build_plan(params)
    if params.target == "simulated":
        if args.format == "json":
            sys.stderr.write(f"note: {SIMULATED_NOTE}\n")
        else:
            sys.stdout.write(f"# {SIMULATED_NOTE}\n")
    sys.stdout.write(_dump(plan.to_dict(), args.format))
    return 0
