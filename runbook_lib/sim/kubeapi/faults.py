"""Moved to ``runbook_lib.sim.faultfile`` (the Python API server was retired on 2 Dec 2026); kept only while
tests/realplane.py still imports it from here."""

from runbook_lib.sim.faultfile import FaultFile, matches

__all__ = ["FaultFile", "matches"]
