"""Text shared by steps and rendering: one rule for a long list cut short, so every message shortens the same way."""

from __future__ import annotations

import re
from collections.abc import Sequence


def shortened(names: Sequence[str], limit: int = 8) -> str:
    """``names`` joined with commas, the first ``limit`` of them, then how many more: a message about 1,000 nodes
    stays one line."""
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


#: How the image step's refusal of a node whose config lacks the modules patch begins (``steps.image``): what
#: follows is the config-patch step, and the go-on line starts there (``cli.run_report.resume_after_failure``).
MODULES_PATCH_MISSING = "the machine config does not carry the NVIDIA modules patch yet"

#: How a fix names the parameters to re-run with.  A step runs in a kernel that does not know the file or the
#: ``--set`` overrides it was started with; ``runbook run`` puts its own ``-p FILE --set …`` in their place when it
#: prints (an operator walkthrough copied ``-p <parameters>`` into a shell).  Records keep this placeholder.
PARAMS_PLACEHOLDER = "-p <parameters>"


def any_node(text: str, *names: object) -> str:
    """``text`` with a node's address and name as ``<node>``, so alike nodes' lines (a plan's diffs, a stopped
    step's failures) compare and print as one (a removal that reboots says ``kubectl drain <name> first``:
    review); whole words only, so 10.5.0.1 leaves 10.5.0.11 and gpu-1 leaves gpu-10 alone."""
    for name in (str(n) for n in names if n):
        text = re.sub(rf"(?<![\w.-]){re.escape(name)}(?![\w-]|\.\w)", "<node>", text)
    return text
