"""Seeing a node reboot: its kernel's boot ID before the change, and another one after it.

Why not "the node answers again": a Talos node that reboots for an applied config answers the apply first and
runs its reboot sequence in the background (talos@v1.13.0 internal/app/machined/internal/server/v1alpha1/
v1alpha1_server.go:242-250, 308-319); the sequence stops the pods, then the services, apid among the last
(v1alpha1_sequencer.go Reboot, stopAllPhaselist). Until then the node answers as before, so a wait for an
answer returned at once: the next batch started while the node went down, and the config read after it showed
the old active config on nodes that were rebooting into the new one. talosctl's own reboot and upgrade tracking
compares the boot ID before and after (talos@v1.12.0 cmd/talosctl/pkg/talos/action/tracker.go:59-75, 345-366).
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from .context import Context

#: Why a node :func:`wait_for_reboots` names is not back, when it never went down.
NOT_REBOOTED = "it still runs the boot it had before the change: it did not reboot"
#: The kernel's boot ID, new on every boot (what talosctl's tracker reads, tracker.go:346).
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"


def boot_ids(ctx: Context, addresses: list[str]) -> tuple[dict[str, str | None], dict[str, str]]:
    """(address -> boot ID, address -> read error). A node that refuses the read with PermissionDenied gets
    ``None``: talosctl then skips the boot ID check (tracker.go:355-358) and so does :func:`wait_for_reboots`,
    which waits for it to answer."""
    ids: dict[str, str | None] = {}
    errors: dict[str, str] = {}
    for address, read in ctx.talosctl.read(BOOT_ID_PATH, addresses).items():
        if read.text is not None:
            ids[address] = read.text.strip()
        elif "PermissionDenied" in (read.error or ""):
            ids[address] = None
        else:
            errors[address] = read.error or "no answer"
    return ids, errors


def wait_for_reboots(
    ctx: Context, before: Mapping[str, str | None], timeout: float, interval: float = 2.0
) -> dict[str, str]:
    """Wait until each node answers with a boot ID other than its one in ``before`` (``None``: any answer);
    returns the nodes that did not within ``timeout``, each with why (it never went down, or it did not come
    back)."""
    deadline = time.monotonic() + timeout
    pending = dict(before)
    why: dict[str, str] = {}
    while pending:
        ids, errors = boot_ids(ctx, list(pending))
        for address, old in list(pending.items()):
            if address in ids and (old is None or ids[address] != old):
                del pending[address]
            elif address in ids:
                why[address] = NOT_REBOOTED
            else:
                why[address] = f"it did not answer again after its reboot ({errors[address]})"
        if not pending or time.monotonic() >= deadline:
            break
        time.sleep(interval)
    return {address: why[address] for address in pending}
