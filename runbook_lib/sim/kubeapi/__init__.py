"""What is left of the retired Python Kubernetes API server (2 Dec 2026): ``faults``, a re-export of
``runbook_lib.sim.faultfile`` while tests/realplane.py imports it from here."""
