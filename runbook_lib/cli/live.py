"""The lines ``runbook run`` and ``runbook rollback`` print while a rollout runs (issue 16).

Why: the step lines come when the run ends, and a rollout over 1,000 nodes is one step that runs for an hour;
the operator must see a node fail when the library knows it (``runbook_lib/steps/events.py``).  One line per
failed node (its name, address, the step and the first line of its reason; secrets are scrubbed by the runner
before the line gets here) and one per batch as it ends.  They go to stdout, flushed at once (a pipe would
otherwise hold them until the run ends), before the step lines, and never start with a bare step name (scripts
read ``<step> <status>`` from the step lines).  The line is ``live_events.event_line``'s, as the executed notebook
shows it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import Any

from tqdm import tqdm

from runbook_lib.notebook.live_events import event_line


def print_event(event: Mapping[str, Any], rewrite: Callable[[str], str] = str) -> None:
    """Print the event's line now (above the progress bar, if one is drawn); ``rewrite`` puts the run's own
    ``-p FILE`` in a fix's placeholder (:mod:`.run_report`)."""
    tqdm.write(rewrite(event_line(event)), file=sys.stdout)
    sys.stdout.flush()
