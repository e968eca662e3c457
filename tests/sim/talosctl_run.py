"""Run the simulated ``talosctl`` as a subprocess, exactly as the library runs the real binary."""

from __future__ import annotations

import subprocess
from pathlib import Path

from runbook_lib.sim.state import sim_paths


def talosctl(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    paths = sim_paths(state)
    return subprocess.run(
        [str(paths.bin_dir / "talosctl"), "--talosconfig", str(paths.talosconfig), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
