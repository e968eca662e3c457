"""``runbook run`` prints a node's failure while the rollout is still going (issue 16), not with the step lines at
the end, and a line per batch as it ends; the change record keeps the same events.

The run: 6 GPU nodes with the modules patch (scenario ``config-patched``), ``rollout_concurrency`` 2 (batches of
2, 2, 2), the middle node ``gpu-3`` failing its upgrade (``upgrade_fails``), a failure budget of 1 so the rollout
goes on, and ``gpu-5`` in batch 3 whose upgrade hangs (``upgrade_hangs``: the Python talosctl until the upgrade's
600 s timeout; simnode's boot until Talos's BootTimeout, 70 min at the time scale set here, 0.05: 210 s).  The test
reads the run's stdout as it streams; once the failure line and batch 2's line are there, it stops the run with
SIGTERM (a CI timeout; ``runbook run`` seals the record).  The record then says the image step was *interrupted*:
the lines were on stdout while the step was still running (nothing here is timed; the hung upgrade only keeps
the step running until the signal).  The executed notebook is not checked here: after an interrupt it holds the
kernel's printed lines only as far as papermill received them before it stopped (``tests/test_live_rollout.py``
checks that the kernel prints them).
Lines and events are this project's own design (no upstream source defines them).
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from runbook_lib.notebook import records

REPO = Path(__file__).resolve().parents[1]
#: A bound for every wait: a loaded 2-core machine is slow, never this slow.
WAIT_S = 300.0
NODES = [(f"gpu-{i}", f"10.5.0.{i + 2}") for i in range(1, 7)]


#: simnode's -time-factor: BootTimeout (70 min) becomes 210 s, an upgrade's pull and install 0.5 s and 1.5 s
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"} | {"RUNBOOK_SIM_TIME_SCALE": "0.05"}


def _runbook(*args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "runbook_lib", *args]
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=WAIT_S, check=False, cwd=REPO, env=ENV
    )


def _params(tmp_path: Path) -> Path:
    data = {
        "cluster": "live",
        "target": "simulated",
        "talos_version": "v1.12.7",
        "track": "lts",
        "nodes": [{"name": name, "address": address} for name, address in NODES],
        "rollout_concurrency": 2,
        "rollout": {"max_failures": 1},
        "timeouts": {"upgrade_seconds": 600},
        "simulation": {"scenario": "config-patched"},
    }
    path = tmp_path / "params.json"
    path.write_text(json.dumps(data))
    return path


def _lines(proc: subprocess.Popen[str]) -> queue.Queue[str | None]:
    """stdout line by line as the run prints it (None at its end)."""
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    return lines


def _until(lines: queue.Queue[str | None], wanted: str, seen: list[str]) -> None:
    """Read lines into ``seen`` until one contains ``wanted``; fails at the run's end or after WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    while not any(wanted in line for line in seen):
        try:
            line = lines.get(timeout=max(deadline - time.monotonic(), 0.1))
        except queue.Empty:
            line = f"(no {wanted!r} on stdout within {WAIT_S:.0f} s)"
        assert line is not None and not line.startswith("(no "), f"{line}; stdout so far:\n" + "\n".join(seen)
        seen.append(line)


@pytest.mark.slow
def test_a_failed_node_is_printed_while_the_image_step_still_runs_and_kept_in_the_record(
    tmp_path: Path,
) -> None:
    params, state, root = _params(tmp_path), tmp_path / "state", tmp_path / "records"
    up = _runbook("sim", "up", "-p", str(params), "--state", str(state), "--no-daemon")
    assert up.returncode == 0, up.stderr
    for node, fault in (("gpu-3", "upgrade_fails"), ("gpu-5", "upgrade_hangs")):
        switched = _runbook("sim", "fault", "--state", str(state), node, fault)
        assert switched.returncode == 0, switched.stderr
    argv = [sys.executable, "-m", "runbook_lib", "run", "-p", str(params), "--apply", "--steps", "image"]
    argv += ["--state", str(state), "--records", str(root), "--no-progress"]
    # without PYTHONUNBUFFERED (ENV): the CLI must flush its lines itself
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=ENV
    )
    seen: list[str] = []
    try:
        lines = _lines(proc)
        _until(lines, "image: gpu-3 (10.5.0.5) failed: talosctl upgrade failed", seen)
        _until(lines, "image: batch 2/3 done", seen)
        proc.send_signal(signal.SIGTERM)  # batch 3 is upgrading: gpu-5 hangs
        _, err = proc.communicate(timeout=WAIT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
        _runbook("sim", "down", "--state", str(state))
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert seen[:3] == [
        "image: batch 1/3 done: 2 ok, 0 failed (2/6 nodes, 0 failed so far)",
        seen[1],
        "image: batch 2/3 done: 1 ok, 1 failed (4/6 nodes, 1 failed so far)",
    ], seen
    folder = records.resolve(root, None)
    record = records.load_record(folder)
    # preflight first: an --apply run of changing steps runs it (runner.with_preflight)
    assert [(s["name"], s["status"]) for s in record["steps"]] == [
        ("preflight", "ok"),
        ("image", "interrupted"),
    ]
    path = folder / "results" / "image.events.jsonl"
    kept = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(e["kind"], e.get("node"), e.get("batch")) for e in kept] == [
        ("batch_done", None, 1),
        ("node_failed", "gpu-3", None),
        ("batch_done", None, 2),
    ]
    assert records.verify(root) == []
