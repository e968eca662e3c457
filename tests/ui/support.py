"""What the UI test shares with its fixtures: the copied workspace, the simulated nodes, the console log.

Kept out of ``conftest.py`` so the test module imports plain code (a conftest is pytest's to import).
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
RUNBOOK = str(Path(sys.executable).with_name("runbook"))
#: Extensions installed, modules not configured: the config-patch step has work to do, and after it the
#: verification step can be green (a fresh cluster would also need the image step).
SCENARIO = "extensions-no-patch"
#: How long the applied result may take to show once the progress bar turned green: the gate seals the change
#: record of the approval (``RUNBOOK_RECORDS``: the notebook rebuilt, the front page, the checksums) before it
#: displays the result (``notebook/gates.py``, ``ApprovalGate.approve``), which a loaded machine makes take far
#: longer than the 10 s the tests gave it before approvals sealed records.
SEALED_MS = 120_000
#: The mutation the test must catch: an Approve button whose handler does nothing.
BREAK_APPROVE = """\
import runbook_lib.notebook.gates as _gates
_gates.ApprovalGate.approve = lambda self, _button=None: None
del _gates
"""


@dataclass
class Workspace:
    base: Path
    root: Path
    params_file: Path
    sim_state: Path
    screenshots: Path
    cluster: str
    node_names: list[str] = field(default_factory=list)
    node_addresses: list[str] = field(default_factory=list)

    @property
    def records(self) -> Path:
        """Where the kernels seal the change records of approvals (``RUNBOOK_RECORDS``)."""
        return self.base / "records"


def runbook(*args: str) -> None:
    proc = subprocess.run([RUNBOOK, *args], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, f"runbook {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}"


class SimNodes:
    """The simulated nodes as a user inspects them: through the simulated ``talosctl``."""

    def __init__(self, ws: Workspace) -> None:
        self._ws = ws

    def machine_config(self, address: str) -> dict[str, Any]:
        state = self._ws.sim_state
        proc = subprocess.run(
            [
                *(str(state / "bin" / "talosctl"), "--talosconfig", str(state / "talosconfig")),
                *("-n", address, "get", "machineconfig", "-o", "yaml"),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert proc.returncode == 0, f"talosctl get machineconfig on {address} failed: {proc.stderr.strip()}"
        resource = yaml.safe_load(proc.stdout)
        config: dict[str, Any] = yaml.safe_load(resource["spec"])
        return config

    def all_configs(self) -> dict[str, dict[str, Any]]:
        return {address: self.machine_config(address) for address in self._ws.node_addresses}


class ConsoleErrors:
    """Browser console errors and uncaught page exceptions, which a user would see in the devtools."""

    def __init__(self) -> None:
        self.errors: list[str] = []

    def console(self, message: Any) -> None:
        if message.type == "error":
            self.errors.append(f"console.error: {message.text}")

    def page_error(self, error: Any) -> None:
        self.errors.append(f"uncaught: {error}")
