"""A GPU node the image step finds already upgraded, but cordoned: what an interrupted ``talosctl upgrade`` leaves.

Why the image step looks: from Talos 1.13 ``talosctl upgrade`` installs the image, then cordons and drains the node
itself, reboots it, and uncordons it only at the end, in a deferred call registered after the drain succeeded
(talos@v1.13.0 cmd/talosctl/cmd/talos/upgrade.go:131-166, drain.go:33-100). A talosctl that is killed during the
reboot wait (the runbook stops one at ``talosctl.upgrade_deadline``) never uncordons, and a drain that fails returns before the
uncordon is registered. The node then boots the planned image, so a second run found it "already on" the plan and
said nothing while no pod could be scheduled there; cuda-test's pods stayed Pending. The step does not uncordon it:
a cordon can also be an administrator's, so it names the node and the command instead.

Why only a cordon with the runbook's mark fails the node, and any other is a note: a maintenance cordon an
administrator set on a node already on the plan failed the image step, so a plan exited 1 (a CI plan gate
failed) and an ``--apply`` run stopped before verify, while verify itself only notes such a cordon (operator
walkthrough, 6 Dec 2026). An interrupted talosctl 1.13+ upgrade's cordon carries no mark either: the note says
both, ``runbook run`` prints it, and cuda-test holds back its pod for a cordoned node.
"""

from __future__ import annotations

from runbook_lib.errors import RunbookError

from . import drains
from .context import Context
from .results import Check, NodeResult, StepResult

#: (connect, read) seconds for the one Node list: the official client waits forever by default.
LIST_TIMEOUT = (10.0, 60.0)

CHECK = "node schedulable"


def flag_cordoned(ctx: Context, result: StepResult, unchanged: list[NodeResult]) -> None:
    """Fail each of ``unchanged`` (nodes already on the plan) whose Kubernetes Node carries a cordon with the
    runbook's mark; a note for a cordon without it (module docstring), and when the Nodes cannot be read (the
    image itself is not in question)."""
    if not unchanged:
        return
    try:
        nodes = ctx.kube.nodes(timeout_s=LIST_TIMEOUT)  # the Kubernetes client is imported here, not before
    except RunbookError as exc:
        result.notes.append(f"cordons not checked: the Kubernetes Nodes could not be listed: {exc.message}")
        return
    cordons = {n["metadata"]["name"]: drains.cordon_of(n) for n in nodes}
    unmarked = [res.node for res in unchanged if cordons.get(res.node) is False]
    if unmarked:
        result.notes.append(drains.unmarked_note(unmarked))
    for res in unchanged:
        if not cordons.get(res.node):
            continue
        res.status = "failed"
        res.data["cordoned"] = True  # not a reason to hold back the other nodes' upgrades (only_cordoned)
        res.message += "; but its Kubernetes Node is cordoned, so no pod is scheduled there"
        res.checks.append(
            Check(
                CHECK,
                False,
                f"Node {res.node} is cordoned and carries the runbook's mark ({drains.CORDON_MARK})",
                cause="a run or a rollback drained it before a reboot and was interrupted, or failed, before the "
                "uncordon",
                fix=f"{drains.uncordon_command(res.node, marked=True)}  # then re-run this step",
            )
        )


def only_cordoned(res: NodeResult) -> bool:
    """A node that failed only for its cordon: the image step still upgrades the other nodes, since nothing about
    this one makes their upgrade unsafe (it is already on the plan)."""
    return bool(res.data.get("cordoned")) and all(c.ok or c.name == CHECK for c in res.checks)
