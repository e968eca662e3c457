"""The ``runbook`` command: a thin shell over the library, one module per command group.

Each ``cmd_*`` module exposes ``register(subparsers)``; adding a group means adding one import and one entry
to ``GROUPS`` here.  Errors from the library become one clear message and exit code 2 (bad input or a
permanent failure) or 3 (a retryable failure), never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from runbook_lib.errors import PermanentError, RetryableError, RunbookError

from . import cmd_diagnose, cmd_params, cmd_records, cmd_rollback, cmd_run, cmd_schematic, cmd_sim

Register = Callable[["argparse._SubParsersAction[argparse.ArgumentParser]"], None]

GROUPS: list[Register] = [
    cmd_diagnose.register,
    cmd_params.register,
    cmd_records.register,
    cmd_rollback.register,
    cmd_run.register,
    cmd_schematic.register,
    cmd_sim.register,
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="runbook",
        description="Talos Linux + NVIDIA GPU runbooks: plan, simulate, apply, verify, record.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for register in GROUPS:
        register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except RetryableError as exc:
        print(f"error (retryable): {exc}", file=sys.stderr)
        return 3
    except (PermanentError, RunbookError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `runbook plan | head`
        return 0


def run() -> None:
    """Entry point for ``python -m runbook_lib`` and the ``runbook`` console script."""
    sys.exit(main())
