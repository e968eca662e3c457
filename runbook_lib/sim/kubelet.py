"""Moved to ``runbook_lib.sim.containers`` (the Python kubelet was retired with the Python API server on
2 Dec 2026); kept only while tests/realplane.py still imports ``cri_down`` from here."""

from runbook_lib.sim.containers import cri_down

__all__ = ["cri_down"]
