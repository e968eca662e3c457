"""Suite-wide defaults.

The simulated cluster stays on the Python talosctl and the Python Kubernetes API unless a test asks for the
real ones (``RUNBOOK_SIM_TALOSCTL=real``: ``tests/sim/test_sim_up_real_talosctl.py``; ``RUNBOOK_SIM_KUBE=real``:
``tests/sim/test_sim_up_real_kube.py``): with the binaries in the tools cache, their unset default would switch
every test that starts the simulator to them, whose outputs and timings those tests were not written for.

Talos's durations run at ``RUNBOOK_SIM_TIME_SCALE`` = 0.01 (``TIME_SCALE``), as the real-talosctl acceptance
test runs them (``tests/sim/test_sim_up_real_talosctl.py``), not at simnode's default 0.05: measured on the
2-core machine, ``runbook run --apply``'s image step on 3 nodes with the real talosctl took 22.3 s at 0.05 and
20.1 s at 0.01 (each upgrade's installer pull and install: 2 s → 0.4 s), and a boot that hangs fails after 42 s
instead of 3.5 min. What it leaves alone: the 3 s a reboot keeps a simnode node's API down
(``runbook_lib/sim/realtalos.py`` ``REBOOT_MS``, not scaled: the real tracker misses a faster reboot on a loaded
machine), and the Python talosctl's hung boot, which sleeps ``min(--timeout, 70 min × scale)``: the tests give
it timeouts of at most 30 s, under the 42 s it now takes.
"""

from __future__ import annotations

import os

#: Talos's durations for every simulator the suite starts (simnode's -time-factor, the Python talosctl's boot).
TIME_SCALE = "0.01"

os.environ.setdefault("RUNBOOK_SIM_TALOSCTL", "python")
os.environ.setdefault("RUNBOOK_SIM_KUBE", "python")
os.environ.setdefault("RUNBOOK_SIM_TIME_SCALE", TIME_SCALE)
