"""What each fault scenario of the simulator must do to a run, whichever talosctl answers (the Python one in
``tests/test_runbook_faults.py``, the real one against simnode in ``tests/sim/test_real_faults.py``): the step
a real cluster would fail at, on the faulty node only, with a diagnosis that names the cause and a fix."""

from __future__ import annotations

from typing import Any

# scenario → (step that fails or None for all green, text the failing node's diagnosis must contain). The
# Python talosctl says an upgrade-fails node "rolled back" (no source for that wording); simnode's installer
# fails and the node keeps its image (simnode/faults.go), so both are held to "upgrade failed".
CASES: dict[str, tuple[str | None, str]] = {
    "fresh": (None, ""),
    "extensions-no-patch": (None, ""),
    "mixed-fleet": (None, ""),
    "unreachable-node": ("preflight", "connection refused"),
    "chaos": ("preflight", "no route to host"),
    "upgrade-fails": ("image", "upgrade failed"),
    "upgrade-hangs": ("image", 'service "ext-nvidia-persistenced" to be "up"'),
    "unsupported-gpu": ("image", 'service "ext-nvidia-persistenced" to be "up"'),
    "toolkit-missing": ("image", "missing extensions siderolabs/nvidia-container-toolkit-lts"),
    "driver-mismatch": ("image", "missing extensions siderolabs/nvidia-container-toolkit-lts"),
}
#: ``runbook run -p params/simulated.yaml`` names every worker a GPU node; ``tests/simcluster.py`` names only the
#: workers with a GPU. So mixed-fleet's CPU-only worker is in the run's nodes, and preflight refuses it.
#: The scenarios tests/test_runbook_faults.py does not run are held to what the Python talosctl's run does.
RUN_CASES = CASES | {
    "mixed-fleet": ("preflight", "no NVIDIA GPU among the node's"),
    "slow-node": (None, ""),
    "aws": (None, ""),
    "storage-extensions": ("image", "the upgrade would remove siderolabs/iscsi-tools"),
    "kernel-args-before-1-12": (None, ""),
}
#: The steps a run goes through, in order, up to the first that fails (the names of ``StepResult.step``).
STEPS = ("preflight", "config-patch", "image", "verify")


def failing_nodes(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The failed nodes of a step result (``StepResult.to_dict()``, or a record's ``results/<step>.json``)."""
    return [n for n in result["nodes"] if n["status"] == "failed"]


def assert_fails_on_one_node(result: dict[str, Any], needle: str) -> dict[str, Any]:
    """Only the faulty node fails (the others carry on), its diagnosis contains ``needle``, and every failed
    check says what to do; returns that node."""
    failing = failing_nodes(result)
    assert len(failing) == 1, f"only the faulty node fails; the others carry on: {failing}"
    node = failing[0]
    failed = node.get("failed", [])
    evidence = " ".join(
        [node.get("message", "")] + [f"{c.get('message', '')} {c.get('fix', '')}" for c in failed]
    )
    assert needle in evidence, evidence
    assert all(c.get("fix") for c in failed), f"every failed check says what to do: {failed}"
    return node
