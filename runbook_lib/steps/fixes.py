"""What a step tells the user to do when a node fails for a reason the runbook cannot name.

Why one place: a ``fix`` must be what to *do* (the attack report of 2026-12-01, F13, found read-only commands
such as ``talosctl version`` given as the fix). Here the read-only command stays, as the way to check the fix
worked, followed by how to resume: the steps skip what is already done, so re-running one retries only the
nodes that still need it.
"""

from __future__ import annotations


def unreachable(address: str, step: str) -> str:
    """A node that does not answer: nothing on this side fixes it, so say what has to come back."""
    return (
        f"bring the node back (power, network: apid on port 50000 must answer from here; "
        f"`talosctl -n {address} version` shows it does), then re-run: runbook run -p <parameters> --steps {step}; "
        "or take the node out of `nodes:` in the parameters"
    )


def upgrade_failed(address: str) -> str:
    """An upgrade that failed with no known cause: the node is on its previous image (rolled back or kept)."""
    return (
        f"read why in the node's kernel log (`talosctl -n {address} dmesg`), fix that, then re-run the image step: "
        "runbook run -p <parameters> --steps image --apply (it retries only the nodes not yet on the plan)"
    )
