"""A step's rollout events, from its kernel to ``runbook run`` while the step runs.

Why a file: the step runs in a Jupyter kernel (another process) inside one notebook cell, and papermill hands
the runner nothing until the cell ends.  The kernel appends each event (``runbook_lib/steps/events.py``) as one
JSON line to ``results/<step>.events.jsonl`` next to the step's result, as its journal goes to
``<step>.journal.jsonl``; the runner follows the file while the notebook executes and hands each event to its
caller (the CLI prints it).  The file stays in the change record, sealed with it (secrets scrubbed), so the
record shows what the operator was shown and when (``at``).  The kernel also prints each event's line, so the
executed notebook in the record shows them under the step's cell, as the terminal did.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from runbook_lib.steps.events import RolloutEvent, Sink

Deliver = Callable[[dict[str, Any]], None]
#: How often the runner looks for new events (s): a line is on the terminal this soon after the kernel knows it.
POLL_S = 0.1


def events_file(result_file: Path) -> Path:
    """Where a step's events go (next to its result file)."""
    return result_file.with_name(result_file.stem + ".events.jsonl")


def event_line(event: Mapping[str, Any]) -> str:
    """``image: gpu-3 (10.5.0.5) failed: <reason>`` or ``image: batch 2/3 done: 1 ok, 1 failed (…)``: never a bare
    step name first (scripts read ``<step> <status>`` from ``runbook run``'s step lines)."""
    step = event.get("step", "?")
    if event.get("kind") == "node_failed":
        return f"{step}: {event.get('node')} ({event.get('address')}) failed: {event.get('reason')}"
    if event.get("kind") == "batch_done":
        return (
            f"{step}: batch {event.get('batch')}/{event.get('batches')} done: {event.get('ok')} ok, "
            f"{event.get('failed')} failed ({event.get('nodes_done')}/{event.get('nodes_total')} nodes, "
            f"{event.get('failed_total')} failed so far)"
        )
    return f"{step}: {dict(event)}"


def file_sink(path: Path, step: str) -> Sink:
    """A sink (in the step's kernel) appending each event as one line: one ``write`` per line, so a reader never
    sees half of one except at the file's end, which it leaves for the next read; and printing the event's line
    (cell output: the executed notebook shows it)."""

    def write(event: RolloutEvent) -> None:
        data = {"step": step, "at": round(time.time(), 3), **asdict(event)}
        with path.open("a", encoding="utf-8") as out:
            out.write(json.dumps(data) + "\n")
        print(event_line(data), flush=True)  # the notebook layer renders: this is the cell's output

    return write


class _Follower:
    """Reads the complete lines appended to ``path`` since the last read, in order."""

    def __init__(self, path: Path, deliver: Deliver) -> None:
        self.path, self.deliver = path, deliver
        self.offset = 0

    def drain(self) -> None:
        try:
            with self.path.open("rb") as src:
                src.seek(self.offset)
                data = src.read()
        except FileNotFoundError:
            return
        complete = data[: data.rfind(b"\n") + 1]
        self.offset += len(complete)
        for line in complete.decode("utf-8", errors="replace").splitlines():
            with contextlib.suppress(ValueError):  # not an event: never stops the run
                self.deliver(json.loads(line))


@contextlib.contextmanager
def following(path: Path, deliver: Deliver | None) -> Iterator[None]:
    """Hand each event appended to ``path`` to ``deliver`` while the block runs, and the last ones at its end.

    ``deliver`` runs on a worker thread; an ``OSError`` from it (stdout closed) stops the delivery, not the run.
    """
    if deliver is None:
        yield
        return
    follower, stop = _Follower(path, deliver), threading.Event()

    def loop() -> None:
        with contextlib.suppress(OSError):
            while not stop.wait(POLL_S):
                follower.drain()

    worker = threading.Thread(target=loop, name="runbook-events", daemon=True)
    worker.start()
    try:
        yield
    finally:
        stop.set()
        worker.join()
        with contextlib.suppress(OSError):
            follower.drain()
