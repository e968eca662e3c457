"""The ``runbook`` command: a thin shell over the library, one module per command group.

Each ``cmd_*`` module exposes ``register(subparsers)``; adding a group means adding one import and one entry
to ``GROUPS`` here.  Errors from the library become one clear message and exit code 2 (bad input or a
permanent failure) or 3 (a retryable failure), never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

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


class _StoreOnce(argparse._StoreAction):
    """A single-value option given twice is a usage error, not the last one silently winning.

    Why: ``runbook run --steps preflight --steps image`` ran the image step alone, and ``-p a.yaml -p b.yaml``
    read only ``b.yaml`` (attack re-run, stop 49). Repeatable options (``--set``) use ``append`` instead.
    """

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        given: set[str] = namespace.__dict__.setdefault("_given_once", set())
        if self.dest in given:
            names = "/".join(self.option_strings) or self.dest
            several = " (several steps: --steps a,b)" if self.dest == "steps" else ""
            parser.error(f"{names} given twice: give it once{several}")
        given.add(self.dest)
        super().__call__(parser, namespace, values, option_string)


class _Parser(argparse.ArgumentParser):
    """``argparse`` with :class:`_StoreOnce` as every plain option's action (sub-commands inherit the class)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.register("action", None, _StoreOnce)
        self.register("action", "store", _StoreOnce)


def build_parser() -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = _Parser(
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
