"""What the benchmarks' process-tree memory (issue 16 point 3: the runbook, its kernels and every talosctl/helm
child) counts as the runbook's own: its HTML process too.

Why: ``runbook run`` makes the record's HTML copies in a child process of its own
(runbook_lib/notebook/runner.py ``export_html``: ``python -m runbook_lib.notebook.html_worker``), from the first
step's end to the run's; the 1,000-node run of 2 Dec 16:02 counted it as "other", outside both figures, while it
held 55 MB PSS at the tree's peak.
"""

from __future__ import annotations

import sys

from benchmarks import real_fleet


def test_the_runbooks_html_process_counts_as_the_runbooks_own() -> None:
    argv = [sys.executable.encode(), b"-m", b"runbook_lib.notebook.html_worker"]
    assert real_fleet.kind_of_argv(argv) == "runbook"


def test_the_simulators_python_processes_stay_the_simulators() -> None:
    for module in (b"runbook_lib.sim.daemon", b"runbook_lib.sim.realkube"):
        assert real_fleet.kind_of_argv([sys.executable.encode(), b"-m", module]) == "simulator"
