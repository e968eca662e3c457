"""Cluster-wide faults for the Kubernetes side of the simulator, read from ``<state>/faults.json``.

Keys the real control plane's simulated components read (all optional; per-node faults live in the node state's
``faults`` dict and use the same names where they make sense; ``runbook_lib/sim/faults.py`` lists them all):

- ``api_latency_ms`` (number) and ``watch_drop_after_s`` (number): the user's relay (``latencyproxy``).
- ``pods_pending``, ``image_pull_error``, ``image_pull_rate_limited``, ``node_not_ready``: the GPU node agent
  (``nodeagent``).

The file is re-read only when its mtime changes, so tests can flip faults while the cluster runs.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


class FaultFile:
    def __init__(self, state_dir: Path) -> None:
        self.path = Path(state_dir) / "faults.json"
        self._mtime: float | None = None
        self._data: dict[str, Any] = {}

    def read(self) -> dict[str, Any]:
        try:
            mtime = os.stat(self.path).st_mtime_ns
        except FileNotFoundError:
            self._mtime, self._data = None, {}
            return self._data
        if mtime != self._mtime:
            try:
                data = json.loads(self.path.read_text() or "{}")
            except (OSError, ValueError):
                return self._data  # a half-written file: keep the last good view
            self._data = data if isinstance(data, dict) else {}
            self._mtime = mtime
        return self._data


def matches(value: Any, item: str) -> bool:
    """A fault value may be a bool (everything) or a list of substrings/names (those only)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        return value in item or value == "*"
    if isinstance(value, list):
        return any(str(v) in item or v == "*" for v in value)
    return bool(value)
