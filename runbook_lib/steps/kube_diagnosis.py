"""Why a GPU node advertises no ``nvidia.com/gpu``, read from what Kubernetes itself reports about the node and
its device-plugin pod, before any guess about drivers or runtimes.

Why this order: a node whose kubelet is gone, or whose plugin never started (its image cannot be pulled, the
scheduler cannot place it), advertises no GPUs for a reason the API already states in the real components'
words; sending the user to the plugin's logs or the driver then leads nowhere (the plugin never ran). The
texts quoted are the components' own:

- the node's Ready condition: the node lifecycle controller's "Kubelet stopped posting node status." (Unknown,
  kubernetes@v1.35.0 pkg/controller/nodelifecycle/node_lifecycle_controller.go:966-971) or the kubelet's own
  reason for False (pkg/kubelet/nodestatus/setters.go ``ReadyCondition``);
- a container waiting in ``ErrImagePull``/``ImagePullBackOff`` with the kubelet's message, which from 1.31 carries
  the last pull's error (pkg/kubelet/images/image_manager.go:336-348);
- the pod's PodScheduled condition, reason ``Unschedulable``, with kube-scheduler's "0/N nodes are available: ..."
  (pkg/scheduler/framework/types.go:784-860).
"""

from __future__ import annotations

import re
import time
from collections.abc import Hashable, Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from runbook_lib.errors import RunbookError

from .results import Check

if TYPE_CHECKING:
    from runbook_lib.clients.kube import Kube

#: How long a node must have been not Ready before a wait stops waiting on it (``DownNodes``). A choice, not a
#: Kubernetes figure: a node the runbook rebooted is Ready again before the Kubernetes steps (the config-patch and
#: image steps wait for it), so a node still not Ready after a minute is down, and waiting the whole
#: ``timeouts.kubernetes_seconds`` for it only delays the verdict on every other node.
DOWN_GRACE_S = 60.0

#: Waiting reasons of a container whose image the node cannot pull (kubernetes@v1.35.0 pkg/kubelet/images/types.go).
PULL_REASONS = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull")
#: A registry's answer that says "later", in containerd's words for it ("unexpected status from HEAD request to
#: <url>: 429 Too Many Requests": containerd@v2.1.5 core/remotes/errors/errors.go:43): the statuses containerd
#: itself retries (408 and 429 always, 500, 503 and 504 once: core/remotes/docker/resolver.go:755-765), and 502
#: (our choice: what a proxy answers while the registry behind it is down).
#: The kubelet keeps the last pull's error in the back-off's waiting message (image_manager.go:336-348).
TEMPORARY_PULL = re.compile(r"unexpected status from \w+ request to \S+: (408|429|500|502|503|504)\b")


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    """The status condition of type ``kind`` (Node or Pod), or None."""
    conditions = (obj.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == kind), None)


def node_not_ready(node: dict[str, Any], address: str) -> Check | None:
    """A failed check when the Node's Ready condition is False or Unknown, quoting it; None when Ready."""
    if is_ready(node):
        return None
    ready = condition(node, "Ready") or {}
    name = node["metadata"]["name"]
    said = f"{ready.get('reason', '')}: {ready.get('message', '')}".strip(": ")
    if ready.get("status") == "Unknown":
        cause = (
            "the node's kubelet stopped posting its status (the node is down, rebooting or cut off from the "
            "API server, or its kubelet is not running): no device plugin can register GPUs there"
        )
    else:
        cause = "the node's kubelet reports it not ready (its own reason above): pods do not start there"
    return Check(
        "node Ready",
        False,
        f"node {name} is not Ready (Ready={ready.get('status')}, {said})",
        cause=cause,
        fix=f"talosctl -n {address} service kubelet  # then `talosctl -n {address} logs kubelet`; "
        f"`talosctl -n {address} health` if the node does not answer",
    )


def is_ready(node: dict[str, Any]) -> bool:
    """The Node's Ready condition is True (a Node without one yet counts as Ready, as ``node_not_ready``)."""
    ready = condition(node, "Ready")
    return ready is None or ready.get("status") == "True"


class DownNodes:
    """Since when each node seen has been not Ready: the earlier of when this process first saw it so and its
    Ready condition's ``lastTransitionTime``.

    Why: a Node whose kubelet stopped keeps the status it last posted, its allocatable GPUs too; the node
    lifecycle controller changes only its conditions (kubernetes@v1.35.0
    pkg/controller/nodelifecycle/node_lifecycle_controller.go:938-980). Such a node never registers GPUs nor
    finishes deleting a pod, and a wait for either ran its whole timeout, failing every other node's verdict
    with it. A clock ahead of the API server's only makes a node that is down count as down sooner."""

    def __init__(self) -> None:
        self._since: dict[str, float] = {}

    def see(self, node: dict[str, Any]) -> None:
        name = node["metadata"]["name"]
        if is_ready(node):
            self._since.pop(name, None)
        elif name not in self._since:
            changed = (condition(node, "Ready") or {}).get("lastTransitionTime")
            self._since[name] = time.monotonic() - _age_s(changed)

    def forget(self, name: str) -> None:
        """A node that is gone: when it went down no longer counts."""
        self._since.pop(name, None)

    def down(self, names: Iterable[str], grace_s: float = DOWN_GRACE_S) -> list[str]:
        """``names`` (sorted) when every one of them has been not Ready for ``grace_s``; else none."""
        wanted = sorted(names)
        now = time.monotonic()
        if wanted and all(n in self._since and now - self._since[n] >= grace_s for n in wanted):
            return wanted
        return []


class Stall:
    """A wait that stopped moving at nodes that are down, for the waits that can end early (``give_up``).

    Why one class: the rollout wait and cuda-test's pod wait ask the same two questions, each with its own mark
    of progress. Nodes are read only once the mark has not moved for ``DOWN_GRACE_S`` (a wait that moves costs
    nothing more), one at a time and only until one is Ready or gone, which keeps the wait going; a read that
    fails leaves it as it was."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self.down: list[str] = []
        """The nodes the last look found the wait held by, all down."""
        self._mark: Hashable = None
        self._ready: str | None = None
        self._moved = time.monotonic()
        self._nodes = DownNodes()

    def quiet(self, mark: Hashable) -> bool:
        """Whether ``mark`` (the wait's progress) has stayed the same for ``DOWN_GRACE_S``."""
        if mark != self._mark:
            self._mark, self._moved = mark, time.monotonic()
            return False
        return time.monotonic() - self._moved >= DOWN_GRACE_S

    def down_among(self, names: Iterable[str]) -> list[str]:
        """``names`` (sorted) when every one is a Node not Ready for ``DOWN_GRACE_S``; else none (also ``down``).

        Each Node read is seen (``DownNodes.see``) before the Ready test ends the look: a node that came back
        forgets when it went down, so going down again starts a new minute. The node found Ready last time is
        read first, so a wait held by a Ready node costs one read a look."""
        wanted = sorted(names)
        self.down = []
        try:
            for name in sorted(wanted, key=lambda n: n != self._ready):
                obj = self.kube.node(name)
                if obj is None:
                    self._nodes.forget(name)
                    return []
                self._nodes.see(obj)
                if is_ready(obj):
                    self._ready = name
                    return []
        except RunbookError:
            return []
        self.down = self._nodes.down(wanted)
        return self.down


def _age_s(stamp: Any) -> float:
    """Seconds since an API timestamp (``2026-12-06T02:30:00Z``); 0 when there is none or it is in the future."""
    try:
        then = datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0
    return max(0.0, time.time() - then)


def pods_for_node(pods: list[dict[str, Any]], node: str) -> list[dict[str, Any]]:
    """The pods bound to ``node``, or (not yet bound) pinned to it by a DaemonSet's ``matchFields`` affinity
    (the DaemonSet controller's pods are scheduled by kube-scheduler onto their one node)."""
    return [p for p in pods if (p.get("spec") or {}).get("nodeName") == node or _pinned_to(p) == node]


def _pinned_to(pod: dict[str, Any]) -> str | None:
    affinity = ((pod.get("spec") or {}).get("affinity") or {}).get("nodeAffinity") or {}
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    for term in required.get("nodeSelectorTerms") or []:
        for field in term.get("matchFields") or []:
            if field.get("key") == "metadata.name" and len(field.get("values") or []) == 1:
                return str(field["values"][0])
    return None


def pull_failing(pod: dict[str, Any]) -> bool:
    """A container of ``pod`` waits in a failed image pull (``PULL_REASONS``) that the registry did not call
    temporary (``TEMPORARY_PULL``: a pull rate limit, a registry briefly down), so waiting on cannot help.

    Why not every failed pull: cuda-test stops waiting once pulls have failed for a minute, and a registry's
    rate limit (Docker Hub's and others' 429) often lifts within the step's timeout; such a pull is waited for."""
    return any(not TEMPORARY_PULL.search(str(w.get("message") or "")) for _, w in _failed_pulls(pod))


def _failed_pulls(pod: dict[str, Any]) -> Iterable[tuple[dict[str, Any], dict[str, Any]]]:
    """(container status, its ``waiting``) of each container of ``pod`` waiting in a failed pull (``PULL_REASONS``)."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        waiting = (status.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in PULL_REASONS:
            yield status, waiting


def pod_not_started(pod: dict[str, Any], node: str, what: str) -> Check | None:
    """A failed check when ``pod`` (``what`` for ``node``: the device plugin, a CUDA test) never started: its image
    cannot be pulled, or the scheduler cannot place it; None otherwise."""
    meta = pod["metadata"]
    describe = f"kubectl -n {meta['namespace']} describe pod {meta['name']}"
    scheduled = condition(pod, "PodScheduled")
    if scheduled is not None and scheduled.get("status") == "False":
        return Check(
            f"{what} scheduled",
            False,
            f"the {what} pod for {node} is not scheduled: {scheduled.get('message') or scheduled.get('reason')}",
            cause="kube-scheduler cannot place the pod on this node, for the reasons it gives",
            fix=f"{describe}  # free what the scheduler names on {node} (pods, resources, taints)",
        )
    pull = next(iter(_failed_pulls(pod)), None)
    if pull is not None:
        status, waiting = pull
        return Check(
            f"{what} image pulled",
            False,
            f"the {what} on {node} waits in {waiting['reason']}: {waiting.get('message', '')}".rstrip(": "),
            cause=f"the node cannot pull the image {status.get('image', '')} (a wrong name or tag, the "
            "registry unreachable from the node, or a missing pull secret), so the plugin never started",
            fix=f"{describe}  # the kubelet's Failed events carry the registry's error",
        )
    return None
