"""After a chart upgrade: which GPU nodes run the device plugin's new pod, and why the others do not.

Why: helm no longer waits for the release's resources (``Helm.upgrade_install``), and a node whose GPUs are
allocatable may still run the previous plugin. A DaemonSet's rolling update replaces a node's pod only while
fewer than ``maxUnavailable`` (1 by default) of its pods are unavailable (kubernetes v1.35.0
pkg/controller/daemon/update.go:44-119), so one node whose new pod does not start holds back all the others:
they keep their GPUs, on the old plugin. The rollout is done as ``kubectl rollout status`` judges it
(kubectl@v0.35.0 pkg/polymorphichelpers/rollout_status.go:95-117); each node's pod is of the current revision
when its ``controller-revision-hash`` label is the newest ControllerRevision's (daemon/util/daemonset_util.go:
165-171, update.go:293-330).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from runbook_lib.errors import RunbookError

from .context import Context
from .kube_diagnosis import DOWN_GRACE_S, Stall, condition

#: The label the DaemonSet controller puts on its pods and ControllerRevisions (apps/v1
#: ``DefaultDaemonSetUniqueLabelKey``).
REVISION_LABEL = "controller-revision-hash"


@dataclass(frozen=True)
class Rollout:
    """A DaemonSet as last read: its pods by node, its current revision, and whether the rollout is done."""

    name: str
    revision: str | None
    pods: dict[str, dict[str, Any]]
    done: bool
    selector: str = ""
    """The DaemonSet's pod selector (``k=v,...``), which finds its pods with kubectl."""
    namespace: str = ""
    rolling: bool = True
    """Whether the DaemonSet replaces its pods itself (``RollingUpdate``); with ``OnDelete`` a pod is replaced
    only once someone deletes it, so an old pod is the site's choice, not a stalled rollout."""
    images: tuple[str, ...] = ()
    """The images of the DaemonSet's containers as last read."""
    wanted_image: str | None = None
    """The image the DaemonSet must carry before its rollout counts (the GPU Operator layer: the ClusterPolicy's
    device plugin, which the operator writes into its DaemonSet after helm returned)."""
    held_by_down: tuple[str, ...] = ()
    """The nodes, not Ready, at which the wait found the rolling update stopped (``wait``)."""
    unpullable: tuple[str, ...] = ()
    """The nodes whose new pod cannot pull its image, which the registry does not have (``wait`` gave up on
    them: :func:`unpullable`)."""
    tolerates_all: bool = False
    """Its pods tolerate every taint (a toleration ``operator: Exists`` without a key), a site's choice: then the
    DaemonSet puts a pod on a node that is not Ready too."""

    def stale(self) -> bool:
        """Whether the DaemonSet does not carry ``wanted_image`` yet: its rollout is the previous spec's."""
        return self.wanted_image is not None and not _carries(self.images, self.wanted_image)

    def previous(self) -> list[str]:
        """The nodes whose pod is not the current revision's."""
        return sorted(node for node, pod in self.pods.items() if not self._updated(pod))

    def behind(self) -> dict[str, str]:
        """Node name -> why its pod is not the current revision's, ready, worded to follow "but" (nodes without a
        pod are left out: the GPU check says why they have no GPUs). Under ``OnDelete`` only a new pod that is
        not ready is behind: the old ones stay until the site deletes them."""
        waiting = self.holding()
        why: dict[str, str] = {}
        for node, pod in self.pods.items():
            name = pod["metadata"]["name"]
            if _deleting(pod):
                why[node] = (
                    f"its device plugin pod {name} is being deleted and none replaces it yet (a stopped plugin's "
                    "GPUs stay allocatable for up to 5 minutes: kubelet devicemanager endpointStopGracePeriod)"
                )
            elif not self._updated(pod) and self.rolling:
                held = f"it waits on {', '.join(waiting)}" if waiting else "it has not reached this node yet"
                why[node] = (
                    f"it still runs the previous device plugin (pod {name} of DaemonSet {self.name}): the rolling "
                    f"update replaces a node's pod only while the replaced ones are available, and {held}"
                )
            elif self._updated(pod) and not _ready(pod):
                why[node] = f"the device plugin's new pod {name} is not ready: {_not_ready(pod)}"
        return why

    def holding(self) -> list[str]:
        """The nodes the rolling update waits on: their pod is being deleted, or new and not ready."""
        return sorted(
            node
            for node, pod in self.pods.items()
            if _deleting(pod) or (self._updated(pod) and not _ready(pod))
        )

    def cannot_pull(self, node: str) -> bool:
        """Whether ``node``'s pod is the current revision's, not being deleted, and cannot pull an image the
        registry lacks (:func:`unpullable`). Why not any pod's: an earlier revision's pod with a typo'd tag, being
        deleted on a node that went down, is held by the node, not by the image (review of 638403c)."""
        pod = self.pods.get(node)
        return pod is not None and not _deleting(pod) and self._updated(pod) and unpullable(pod) is not None

    def holds_others(self, held: list[str]) -> bool:
        """Whether the update waits on ``held`` to reach other nodes: an old pod there is being deleted, or
        another node still runs the previous revision. Not on a first install whose new pod the DaemonSet placed
        on a node that went down afterwards: nothing waits on it, though the rollout never ends (``stranded``)."""
        old = any(_deleting(self.pods[n]) for n in held if n in self.pods)
        return old or (self.rolling and any(n not in held for n in self.previous()))

    def _updated(self, pod: dict[str, Any]) -> bool:
        return _of_revision(pod, self.revision)


def wait(
    ctx: Context, namespace: str, name: str, *, timeout_s: float, image: str | None = None
) -> Rollout | None:
    """Watch DaemonSet ``name`` until it carries ``image`` (when given) and its rollout is done, or
    ``timeout_s`` passed (journalled as the cluster's wait); ``None`` when there is none."""

    stall = _Stall(ctx, image)

    def settled(ds: dict[str, Any]) -> bool:
        stall.last = ds
        return (image is None or _carries(_images(ds), image)) and _done(ds)

    last = ctx.kube.watch_until(
        ctx.kube.apps.list_namespaced_daemon_set,
        settled,
        timeout=timeout_s,
        until=f"DaemonSet {name} rolled out" + (f" with {image}" if image else ""),
        give_up=stall.held,
        namespace=namespace,
        field_selector=f"metadata.name={name}",
    )
    daemonset = last if last is not None else ctx.kube.daemonset(namespace, name)
    rollout = None if daemonset is None else read(ctx, daemonset, image)
    if rollout is None:
        return None
    return replace(rollout, held_by_down=tuple(stall.stall.down), unpullable=tuple(stall.unpullable))


class _Stall:
    """Whether a rolling update has stopped at nodes that are down, so waiting on longer cannot help.

    Why: on an upgrade the DaemonSet controller deletes the old pod of a node that is not Ready (its pods are
    unavailable), but only the node's kubelet finishes a pod's deletion, and while that pod counts unavailable the
    update replaces no other (``maxUnavailable`` 1: kubernetes@v1.35.0 pkg/controller/daemon/update.go:44-119). Only
    the node's return, a forced delete, or the ``node.kubernetes.io/out-of-service`` taint (the pod garbage
    collector then deletes the node's terminating pods, pkg/controller/podgc/gc_controller.go:148-190) moves it
    on. Asked between watches: the pods are read only once the DaemonSet's status has not moved for ``DOWN_GRACE_S``
    (a new pod's image pull and start can take longer than one question's interval), the Nodes as
    ``kube_diagnosis.Stall`` reads them."""

    def __init__(self, ctx: Context, image: str | None) -> None:
        self.ctx, self.image = ctx, image
        self.last: dict[str, Any] | None = None
        self.stall = Stall(ctx.kube)
        self.unpullable: list[str] = []

    def held(self) -> str | None:
        if self.last is None or not self.stall.quiet(_progress(self.last)):
            return None
        try:
            rollout = read(self.ctx, self.last, self.image)
        except RunbookError:
            return None
        holders = rollout.holding()
        # the operator has not rewritten it yet: its pods are the previous spec's (review)
        missing = [] if rollout.stale() else [n for n in holders if rollout.cannot_pull(n)]
        rest = [n for n in holders if n not in missing]
        down = self.stall.down_among(rest)
        if not holders or (rest and not down):  # a holder that is up and may still pull keeps the wait going
            return None
        self.unpullable = missing
        grace = f"{DOWN_GRACE_S:.0f} s"
        why = (
            [f"the rolling update waits on {', '.join(down)}, not Ready for {grace} or more"] if down else []
        )
        if missing:  # with nodes that are down too (review of stop 53: that mix waited the whole timeout)
            why.append(f"the device plugin's pod on {', '.join(missing)} cannot pull its image: not found")
        return "; ".join(why)


def _progress(daemonset: dict[str, Any]) -> tuple[int, ...]:
    status = daemonset.get("status") or {}
    keys = (
        "observedGeneration",
        "updatedNumberScheduled",
        "numberReady",
        "numberAvailable",
        "numberUnavailable",
    )
    return tuple(int(status.get(k) or 0) for k in keys)


def again(ctx: Context, rollout: Rollout) -> Rollout | None:
    """The same DaemonSet read again (``None`` when it is gone), to judge its pods as they are now."""
    daemonset = ctx.kube.daemonset(rollout.namespace, rollout.name)
    if daemonset is None:
        return None
    return replace(read(ctx, daemonset, rollout.wanted_image), held_by_down=rollout.held_by_down)


def operator_image(policy: dict[str, Any]) -> str | None:
    """The device-plugin image the GPU Operator writes into its DaemonSet for this ClusterPolicy, as its
    ``imagePath`` builds it (gpu-operator@v26.3.1 api/nvidia/v1/clusterpolicy_types.go:2001-2030, used for the
    device plugin by controllers/object_controls.go:1502-1506): ``repository/image:version``, ``@`` for a
    ``sha256:`` version, the bare ``image`` without both; ``None`` when the image comes from the operator's
    environment (``DEVICE_PLUGIN_IMAGE``, not readable here)."""
    spec = (policy.get("spec") or {}).get("devicePlugin") or {}
    repository, image, version = (str(spec.get(k) or "") for k in ("repository", "image", "version"))
    if not repository and not version:
        return image or None
    return f"{repository}/{image}{'@' if version.startswith('sha256:') else ':'}{version}"


def _carries(images: Sequence[str], image: str) -> bool:
    """``image`` among ``images``, also with a digest an admission controller appended (``repo/img:tag@sha256:…``,
    as image-verifying policies that pin digests write it)."""
    return any(i == image or i.startswith(image + "@") for i in images)


def _tolerates_all(daemonset: dict[str, Any]) -> bool:
    """A toleration with ``operator: Exists`` and no key tolerates every taint (core/v1 ``Toleration``)."""
    template = ((daemonset.get("spec") or {}).get("template") or {}).get("spec") or {}
    return any(
        not t.get("key") and t.get("operator") == "Exists" and not t.get("effect")
        for t in template.get("tolerations") or []
    )


def _images(daemonset: dict[str, Any]) -> list[str]:
    template = ((daemonset.get("spec") or {}).get("template") or {}).get("spec") or {}
    return [str(c.get("image")) for c in template.get("containers") or []]


def read(ctx: Context, daemonset: dict[str, Any], image: str | None = None) -> Rollout:
    """The DaemonSet's pods (those it owns) by node, and its newest ControllerRevision's hash."""
    meta, spec = daemonset["metadata"], daemonset.get("spec") or {}
    labels = (spec.get("selector") or {}).get("matchLabels") or {}
    selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items())) or None
    namespace, uid = meta["namespace"], meta.get("uid")
    revisions = [r for r in ctx.kube.controller_revisions(namespace, selector) if _owned(r, uid)]
    newest = max(revisions, key=lambda r: int(r.get("revision") or 0), default=None)
    revision = None
    if newest is not None:
        revision = (newest["metadata"].get("labels") or {}).get(REVISION_LABEL) or newest["metadata"]["name"]
    owned = [pod for pod in ctx.kube.pods(namespace, selector) if _owned(pod, uid)]
    return Rollout(
        meta["name"],
        revision,
        _by_node(owned, revision),
        _done(daemonset),
        selector=selector or "",
        namespace=namespace,
        rolling=_rolling(daemonset),
        images=tuple(_images(daemonset)),
        wanted_image=image,
        tolerates_all=_tolerates_all(daemonset),
    )


def _by_node(pods: list[dict[str, Any]], revision: str | None) -> dict[str, dict[str, Any]]:
    """Each node's pod, as the DaemonSet controller counts it: of a pod being deleted and a live one (a
    terminal pod awaiting deletion, daemon_controller.go:747, or a surge), the live one, and of two live pods
    the current revision's (daemon/update.go:266-288 ``findUpdatedPodsOnNode``). A node whose only pod is
    being deleted keeps it: no new pod starts there until it is gone (``podsShouldBeOnNode``, :806-812), and
    ``Rollout.behind`` says so."""
    out: dict[str, dict[str, Any]] = {}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if not node:
            continue
        held = out.get(node)
        if held is None or _rank(pod, revision) < _rank(held, revision):
            out[node] = pod
    return out


def _rank(pod: dict[str, Any], revision: str | None) -> tuple[bool, bool]:
    """Lower is the pod judged: a live pod before one being deleted, then the current revision's."""
    return _deleting(pod), not _of_revision(pod, revision)


def _of_revision(pod: dict[str, Any], revision: str | None) -> bool:
    """Whether the pod's ``controller-revision-hash`` is ``revision`` (never, when the revision is unknown)."""
    labels = pod["metadata"].get("labels") or {}
    return revision is not None and labels.get(REVISION_LABEL) == revision


def _deleting(pod: dict[str, Any]) -> bool:
    return bool(pod["metadata"].get("deletionTimestamp"))


def _rolling(daemonset: dict[str, Any]) -> bool:
    """``spec.updateStrategy.type`` is ``RollingUpdate`` (the apps/v1 default when unset); the device-plugin
    chart sets it from its ``updateStrategy`` value (k8s-device-plugin@v0.17.2 values.yaml:54,
    templates/daemonset-device-plugin.yml:32), which a site may set to ``OnDelete``."""
    strategy = ((daemonset.get("spec") or {}).get("updateStrategy") or {}).get("type") or "RollingUpdate"
    return strategy == "RollingUpdate"


def _done(daemonset: dict[str, Any]) -> bool:
    """``kubectl rollout status``'s judgement (rollout_status.go:103-116): a DaemonSet that does not roll its
    pods itself (``OnDelete``) is done at once, there is no rollout to wait for."""
    if not _rolling(daemonset):
        return True
    status = daemonset.get("status") or {}
    desired = int(status.get("desiredNumberScheduled") or 0)
    return (
        int(daemonset["metadata"].get("generation") or 0) <= int(status.get("observedGeneration") or 0)
        and int(status.get("updatedNumberScheduled") or 0) >= desired
        and int(status.get("numberAvailable") or 0) >= desired
    )


def _owned(obj: dict[str, Any], uid: str | None) -> bool:
    return any(ref.get("uid") == uid for ref in obj["metadata"].get("ownerReferences") or [])


#: The kubelet's waiting reasons of a container whose image pull failed (kubernetes@v1.35.0
#: pkg/kubelet/images/types.go:28-35).
PULL_REASONS = ("ErrImagePull", "ImagePullBackOff")
#: What the CRI's pull error says when the registry does not have the image (containerd's gRPC NotFound:
#: containerd@v2.1.5 internal/cri/server/images/image_pull.go:283; the code's source is cited in
#: runbook_lib/sim/containers.py ``cri_pull_error``, which words it the same).
PULL_NOT_FOUND = "code = NotFound"


def unpullable(pod: dict[str, Any]) -> str | None:
    """The waiting message of ``pod``'s container whose image the registry does not have, else None.

    Why only NotFound: no retry of the kubelet's can pull an image that does not exist (a typo'd tag or
    repository), while a 429 or a network error may pass; the wait gave such a node its whole timeout, five
    minutes of silence (operator walkthrough, stop 53). Asked only once the rollout has not moved for
    ``DOWN_GRACE_S``, as for a node that is down."""
    status = pod.get("status") or {}
    for container in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
        waiting = (container.get("state") or {}).get("waiting") or {}
        message = str(waiting.get("message") or "")
        if waiting.get("reason") in PULL_REASONS and PULL_NOT_FOUND in message:
            return message
    return None


def _ready(pod: dict[str, Any]) -> bool:
    return (condition(pod, "Ready") or {}).get("status") == "True"


def _not_ready(pod: dict[str, Any]) -> str:
    """What the kubelet or the scheduler says of a pod that is not ready: a container's waiting or terminated
    reason and message, else the unscheduled condition's message, else its phase."""
    status = pod.get("status") or {}
    for container in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
        state = container.get("state") or {}
        for kind in ("waiting", "terminated"):
            detail = state.get(kind)
            if detail and detail.get("reason") not in (None, "Completed"):
                message = detail.get("message") or ""
                return f"{container.get('name')} {detail['reason']}" + (f": {message}" if message else "")
    for cond in status.get("conditions") or []:
        if cond.get("status") == "False" and cond.get("message"):
            return str(cond["message"])
    return f"phase {status.get('phase') or 'unknown'}"
