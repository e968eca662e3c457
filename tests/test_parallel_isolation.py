"""The suite runs in parallel (``make unit``: pytest-xdist workers, ``PYTEST_WORKERS``), and other pytest
sessions may run on the same machine: what the session start builds into the shared tools cache
(``~/.cache/talos-gpu-runbooks``) must be built once, never by two processes at the same time
(``tests/conftest.py`` ``pytest_sessionstart``: the xdist controller only, under ``tests/buildlock.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from runbook_lib.sim import realtalos
from tests.test_simnode_current import _talosctl_cache

REPO = Path(__file__).resolve().parents[1]

#: A ``go`` whose ``go build -o OUT`` notes its start in $BUILDS, then waits (up to 10 s) for a second build
#: to start before it writes OUT: two builds that overlap both get noted, whatever the machine's load.
FAKE_GO = """#!/bin/sh
echo "$$" >> "$BUILDS"
while [ $# -gt 0 ]; do [ "$1" = "-o" ] && out=$2; shift; done
i=0
while [ "$(wc -l < "$BUILDS")" -lt 2 ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
printf '#!/bin/sh\\n' > "$out" && chmod +x "$out"
"""


def _fake_go(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    go = bin_dir / "go"
    go.write_text(FAKE_GO)
    go.chmod(0o755)
    return bin_dir


def test_a_stale_simnode_is_built_once_by_two_sessions_and_their_workers(tmp_path: Path) -> None:
    """Two pytest sessions start at once on a cache with a talosctl and a stale simnode, one of them with two
    xdist workers: exactly one ``go build`` runs (the other processes wait for it, then find it cached), and
    both sessions go on with the simnode of these sources."""
    cache, builds = _talosctl_cache(tmp_path), tmp_path / "builds"
    path = f"{_fake_go(tmp_path)}:{os.environ.get('PATH', '')}"
    env = {**os.environ, "RUNBOOK_TOOLS_CACHE": str(cache), "RUNBOOK_SIM_TALOSCTL": "auto"}
    env |= {"PATH": path, "BUILDS": str(builds)}
    this = str(Path(__file__).relative_to(REPO))
    argvs = [[this, "--co", "-q"], [this, "--co", "-q", "-n", "2"]]
    sessions = [
        subprocess.Popen(
            [sys.executable, "-m", "pytest", *argv, "-p", "no:cacheprovider"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=REPO,
            env=env,
        )
        for argv in argvs
    ]
    outputs = [session.communicate(timeout=300)[0] for session in sessions]
    assert [session.returncode for session in sessions] == [0, 0], outputs
    assert len(builds.read_text().splitlines()) == 1, outputs
    assert (cache / "simnode" / realtalos.simnode_hash() / "simnode").is_file()
