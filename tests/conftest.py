"""Suite-wide defaults.

The simulated cluster stays on the Python talosctl and the Python Kubernetes API unless a test asks for the
real ones (``RUNBOOK_SIM_TALOSCTL=real``: ``tests/sim/test_sim_up_real_talosctl.py``; ``RUNBOOK_SIM_KUBE=real``:
``tests/sim/test_sim_up_real_kube.py``): with the binaries in the tools cache, their unset default would switch
every test that starts the simulator to them, whose outputs and timings those tests were not written for.
"""

from __future__ import annotations

import os

os.environ.setdefault("RUNBOOK_SIM_TALOSCTL", "python")
os.environ.setdefault("RUNBOOK_SIM_KUBE", "python")
