"""The simulated ``talosctl`` (``python -m runbook_lib.sim.talosctl``); see ``main`` for the process model."""
