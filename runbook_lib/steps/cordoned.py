"""A GPU node the image step finds already upgraded, but cordoned: what an interrupted ``talosctl upgrade`` leaves.

Why the image step looks: from Talos 1.13 ``talosctl upgrade`` installs the image, then cordons and drains the node
itself, reboots it, and uncordons it only at the end, in a deferred call registered after the drain succeeded
(talos@v1.13.0 cmd/talosctl/cmd/talos/upgrade.go:131-166, drain.go:33-100). A talosctl that is killed during the
reboot wait (the runbook stops one at ``talosctl.upgrade_deadline``) never uncordons, and a drain that fails returns before the
uncordon is registered. The node then boots the planned image, so a second run found it "already on" the plan and
said nothing while no pod could be scheduled there; cuda-test's pods stayed Pending. The step does not uncordon it:
a cordon can also be an administrator's, so it names the node and the command instead.
"""

from __future__ import annotations

from runbook_lib.errors import RunbookError

from .context import Context
from .results import Check, NodeResult, StepResult

#: (connect, read) seconds for the one Node list: the official client waits forever by default.
LIST_TIMEOUT = (10.0, 60.0)

CHECK = "node schedulable"


def flag_cordoned(ctx: Context, result: StepResult, unchanged: list[NodeResult]) -> None:
    """Fail each of ``unchanged`` (nodes already on the plan) whose Kubernetes Node is cordoned; a note, not a
    failure, when the Nodes cannot be read (the image itself is not in question)."""
    if not unchanged:
        return
    try:
        nodes = ctx.kube.nodes(timeout_s=LIST_TIMEOUT)  # the Kubernetes client is imported here, not before
    except RunbookError as exc:
        result.notes.append(f"cordons not checked: the Kubernetes Nodes could not be listed: {exc.message}")
        return
    cordoned = {n["metadata"]["name"] for n in nodes if (n.get("spec") or {}).get("unschedulable")}
    for res in unchanged:
        if res.node not in cordoned:
            continue
        res.status = "failed"
        res.data["cordoned"] = True  # not a reason to hold back the other nodes' upgrades (only_cordoned)
        res.message += "; but its Kubernetes Node is cordoned, so no pod is scheduled there"
        res.checks.append(
            Check(
                CHECK,
                False,
                f"Node {res.node} is cordoned (spec.unschedulable: true)",
                cause="talosctl upgrade (Talos 1.13 on) cordons a node before its reboot and uncordons it only "
                "when it returns: an upgrade that was interrupted, or whose drain failed, leaves the cordon; "
                "or someone cordoned the node on purpose",
                fix=f"kubectl uncordon {res.node}  # once nothing else needs it cordoned; then re-run this step",
            )
        )


def only_cordoned(res: NodeResult) -> bool:
    """A node that failed only for its cordon: the image step still upgrades the other nodes, since nothing about
    this one makes their upgrade unsafe (it is already on the plan)."""
    return bool(res.data.get("cordoned")) and all(c.ok or c.name == CHECK for c in res.checks)
