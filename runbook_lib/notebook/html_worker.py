"""The change record's HTML copies, made by a process of their own while ``runbook run`` executes the steps.

Why a process: nbconvert imports ~230 modules, and ~100 more on its first export (lexers, filters, templates):
~1.5 s of CPU, 4.9 s at load 30 (benchmarks/README.md, the 8-node run).  In the runbook process they had to be
imported on the main thread before the first step (a worker thread must import nothing: F1 of the 1 Dec attack,
see ``runner.import_before_threads``), so every run waited for them.  Here they are imported on the other core
while the second step runs, and the runbook process never imports nbconvert.

Protocol: one line per executed notebook on stdin, ``<record directory>\\t<notebook file name>``; each becomes
``<record>/html/<stem>.html``, in order.  At the end of its input the process exits 0; the first failure ends it
with exit 1 and the reason on stderr (the runner then does not seal the record, as when the export failed in
the runbook process).  It ignores SIGINT: a Ctrl-C interrupts the run, whose record still gets the copies.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any, NoReturn, TextIO

from . import offline_html


def export(exporter: Any, record: Path, name: str) -> None:
    """Write the HTML copy of ``record/name``; a notebook that was never written (a step that did not start)
    has none."""
    path = record / name
    if not path.exists():
        return
    import nbformat  # noqa: PLC0415 - lazy: after skip_iri_format_checks

    notebook = nbformat.read(path, as_version=4)  # type: ignore[no-untyped-call]
    body, _ = exporter.from_notebook_node(offline_html.static_widgets(notebook))
    (record / "html" / (Path(name).stem + ".html")).write_text(body, encoding="utf-8")


def serve(lines: TextIO) -> None:
    """Export every notebook named in ``lines`` (the protocol above), building the exporter once."""
    exporter: Any = None
    for line in lines:
        record, _, name = line.rstrip("\n").partition("\t")
        if not name:
            raise ValueError(f"expected '<record directory>\\t<notebook>', got {line!r}")
        if exporter is None:
            offline_html.skip_iri_format_checks()
            exporter = offline_html.exporter()  # no script from the network (see offline_html)
        export(exporter, Path(record), name)


def main() -> int:
    """Serve, then end the process at once: see :func:`_end`."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        serve(sys.stdin)
    except Exception as exc:  # reported to the runner, which refuses to seal a record with missing copies
        print(f"runbook html copies: {type(exc).__name__}: {exc}", file=sys.stderr)
        _end(1)
    _end(0)


def _end(code: int) -> NoReturn:
    """Exit with ``code`` once the output is flushed, without Python's clean-up at exit.

    Why: the runner waits for this process to exit before it seals the record, at the end of every run, and the
    clean-up of a process that imported nbconvert (~330 modules) took 0.3 s of CPU, 1.0-3.8 s at load 20 (2 Dec).
    Nothing is left to it: every copy is written and closed by :func:`export`, stdout and stderr are flushed here.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
