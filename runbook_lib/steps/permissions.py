"""What a run or a rollback will ask of the Kubernetes API, asked of its authorizer before any change
(preflight; rollback's plan).

Why: the Kubernetes writes come late in a run. A service account that may not evict pods learns it at the first
node whose patch reboots it, after the images of the whole fleet were upgraded; one that may not create the
RuntimeClass learns it after every node was changed. The API server answers "may I?" for any request without
making it (a SelfSubjectAccessReview, as ``kubectl auth can-i``), so preflight asks, for the requests the run
will make with the parameters and the cluster as they are, and names each refused one with the command that
asks the same question.

Rollback asks for its own writes the same way (:func:`for_rollback`), the removal of a release from what the
release holds (``helm get manifest``, :func:`removal`). Not asked: what a chart's templates create on install
(it depends on the chart and its values; helm reports a refusal with the object it named), a policy other than
RBAC (an admission webhook), nor the steps' reads other than those a write depends on. Evictions and DaemonSet
reads are asked in every namespace: a user granted them per namespace is refused here, though a drain of a node
whose pods are all in those namespaces would work. A plan-only ``runbook run`` makes
none of these writes: there a refusal is reported without failing preflight (the plan still shows), and named
as what an ``--apply`` run would meet.
"""

from __future__ import annotations

import shlex
from collections.abc import Collection
from dataclasses import dataclass

from runbook_lib.clients.helm import Release
from runbook_lib.clients.proc import KubeconfigTool
from runbook_lib.errors import GRANT_HINT, Forbidden, RunbookError
from runbook_lib.model.versions import is_chart_version

from . import dryrun, gpu_operator_handover
from .context import Context
from .cudatest import TEST_NAMESPACE
from .kubernetes import GPU_PRESENT_LABEL, PRIVILEGED, RUNTIME_CLASS, already_deployed
from .results import Check

CHECK = "Kubernetes permissions"


#: The cluster-scoped resources the runbook's own writes name (kubernetes@v1.35.0 discovery: ``namespaced:
#: false``); a release's objects take their scope from discovery (:func:`_objects`).
CLUSTER_SCOPED = frozenset({"nodes", "namespaces", "runtimeclasses"})


@dataclass(frozen=True)
class Need:
    """One request the run makes: ``namespace`` "" means in every namespace (a drain evicts whatever runs),
    unless ``cluster`` (the resource has no namespace: a Node, a RuntimeClass)."""

    verb: str
    resource: str
    why: str
    group: str = ""
    subresource: str = ""
    namespace: str = ""
    cluster: bool = False

    def what(self) -> str:
        full = self.resource + (f"/{self.subresource}" if self.subresource else "")
        full += f".{self.group}" if self.group else ""
        return f"{self.verb} {full}"

    def where(self) -> str:
        """Where it is asked, as a message says it ("" for a cluster-scoped resource)."""
        if self.cluster:
            return ""
        return f" in {self.namespace}" if self.namespace else " in every namespace"

    def command(self, kubectl: KubeconfigTool | None = None) -> str:
        """``kubectl auth can-i`` asking the same, with the ``kubectl`` and kubeconfig the run uses (the
        question is the kubeconfig's user's: without ``--kubeconfig`` a user pasting it asks as whoever their
        own kubeconfig names). A subresource goes in ``--subresource``, since ``<resource>/<x>`` names an
        object there (k8s.io/kubectl@v0.35.0 pkg/cmd/auth/cani.go:176-183); ``-A`` only for a namespaced
        resource asked in every namespace."""
        resource = self.resource + (f".{self.group}" if self.group else "")
        sub = [f"--subresource={self.subresource}"] if self.subresource else []
        where = ["-n", self.namespace] if self.namespace else [] if self.cluster else ["-A"]
        args = ["auth", "can-i", self.verb, resource, *sub, *where]
        return shlex.join(kubectl.argv(args) if kubectl else ["kubectl", *args])


def _need(verb: str, resource: str, why: str, **kw: str) -> Need:
    """A :class:`Need` whose scope follows :data:`CLUSTER_SCOPED`."""
    return Need(verb, resource, why, cluster=resource in CLUSTER_SCOPED, **kw)


@dataclass
class LayerReads:
    """The Kubernetes layer as asking for its writes read it (None where it did not), which preflight reports
    as progress too: one ``helm list`` and one RuntimeClass read per preflight, not two."""

    runtime_class: bool | None = None
    """Whether RuntimeClass ``nvidia`` exists."""
    release: tuple[Release | None] | None = None
    """The planned release as ``helm list`` showed it (in a 1-tuple: ``(None,)`` is read and not installed)."""
    release_error: RunbookError | None = None
    """Why ``helm list`` could not read it, when it could not."""


def runs_step(steps: Collection[str] | None, step: str) -> bool:
    """Whether a run of ``steps`` runs ``step``: None is every step, and so is preflight alone (a readiness gate
    for the whole runbook)."""
    return steps is None or not set(steps) - {"preflight"} or step in steps


def needs(ctx: Context, steps: Collection[str] | None = None, reads: LayerReads | None = None) -> list[Need]:
    """The writes the run's ``steps`` make (None: all of them, as a user going through the notebooks does), as
    the parameters and the cluster now stand. Why by step: ``runbook run --steps preflight,verify`` with a
    read-only kubeconfig is a health check that makes no write, and must not fail for writes it will not make.
    Preflight alone is asked as a readiness gate for the whole runbook: everything."""

    def runs(step: str) -> bool:
        return runs_step(steps, step)

    out: list[Need] = []
    if ctx.params.default_runtime_patch and runs("config-patch"):
        out += _drains()
    reads = reads or LayerReads()
    if ctx.plan.kubernetes_layer == "gpu-operator" and (runs("image") or runs("kubernetes")):
        out += _handover(ctx, reads)
    out += _kubernetes_layer(ctx, reads) if runs("kubernetes") else []
    out += _cuda_test() if runs("cuda-test") else []
    return list(dict.fromkeys(out))


def for_rollback(
    ctx: Context, kube_layer: gpu_operator_handover.Leftovers | None, *, drains: bool, cordons: bool
) -> list[Need]:
    """The writes a rollback makes: the Kubernetes layer's removal, the drains of nodes whose removal patch
    reboots them, and the uncordon of a cordon a run left (a patch of the Node). Raises ``RunbookError`` when
    the layer's objects cannot be read."""
    why = "removes the Kubernetes layer the runbook created"
    out = removal(ctx, kube_layer, why) if kube_layer else []
    out += _drains("drains the nodes a removal patch reboots") if drains else []
    if cordons:
        out.append(_need("patch", "nodes", "lifts the cordon a run left"))
    return list(dict.fromkeys(out))


def _drains(why: str = "drains the nodes a patch reboots") -> list[Need]:
    """``kubectl drain`` as the config-patch step runs it (``drains``): it gets the Node
    (k8s.io/kubectl@v0.35.0 pkg/cmd/drain/drain.go:293-306), cordons it with a strategic merge patch
    (pkg/drain/cordon.go:104), lists the node's pods in every namespace (drain.go:198), reads each pod's
    DaemonSet to let it stay (filters.go:196), evicts the others through the eviction subresource (drain.go:165)
    and gets each evicted pod until it is gone (drain.go:253-255, :415-430); the runbook marks and uncordons the
    Node with patches too. In every namespace: a drain evicts whatever runs on the node."""
    return [
        _need("get", "nodes", why),
        _need("patch", "nodes", why),
        Need("list", "pods", why),
        Need("get", "pods", why),
        Need("get", "daemonsets", why, group="apps"),
        Need("create", "pods", why, subresource="eviction"),
    ]


def _handover(ctx: Context, reads: LayerReads) -> list[Need]:
    """On the GPU Operator layer, the device plugin's removal (``gpu_operator_handover``), which the image step
    runs before the first node goes to Talos 1.13 and the Kubernetes step before the operator: ``helm list -A``
    reads helm's release Secrets in every namespace (helm@v3.14.0 pkg/storage/driver/secrets.go ``List``), and
    each release found is uninstalled (its objects and its Secrets deleted), then a RuntimeClass ``nvidia`` the
    operator does not own. A refusal there stops the image step before any upgrade, or leaves the cluster
    without a device plugin and no operator: asked here. What it reads is kept in ``reads`` (the planned release
    is in ``helm list -A``; the RuntimeClass): preflight then starts no second helm nor reads it again."""
    why = "hands the GPUs from the device plugin to the GPU Operator"
    out = [Need("list", "secrets", why + " (helm list -A)")]
    plan = ctx.plan.helm
    try:
        listed = ctx.helm.releases_everywhere()
        planned = (r for r in listed if r.name == plan.release and r.namespace == plan.namespace)
        reads.release = (next(planned, None),)
        found = gpu_operator_handover.leftovers(ctx, listed)
    except RunbookError:  # helm list -A refused: the question above names why; what it would find is unknown
        return out
    reads.runtime_class = found.runtime_class_exists()
    return out + removal(ctx, found, why)


def removal(ctx: Context, found: gpu_operator_handover.Leftovers, why: str) -> list[Need]:
    """Removing ``found``. ``helm uninstall --wait`` (helm@v4.1.4 pkg/action/uninstall.go) reads the release's
    history (:98: ``list`` its Secrets), deletes each object of its manifest (:256-289; a refused delete is noted
    and the others go on, then the uninstall fails with the release left ``uninstalling``), waits for them to be
    gone (:161: ``list`` and ``watch`` each kind), and purges its Secrets (:179-182: ``get`` and ``delete``). The
    objects are the release's own (``helm get manifest``), each kind's resource from discovery. Not asked:
    the chart's delete hooks: k8s-device-plugin@v0.18.0 has none, gpu-operator@v26.3.1 one only with
    ``operator.cleanupCRD`` (deployments/gpu-operator/templates/cleanup_crd.yaml:8; values.yaml:79, off)."""
    out: list[Need] = []
    for name, namespace in found.releases:
        uninstall = f"{why} (helm uninstall {name})"
        out += [Need(verb, "secrets", uninstall, namespace=namespace) for verb in ("list", "get", "delete")]
        for group, resource, where in _objects(ctx, name, namespace):
            out += [
                Need(v, resource, uninstall, group=group, namespace=where or "", cluster=where is None)
                for v in ("delete", "list", "watch")
            ]
    if found.runtime_class:
        out.append(_need("delete", "runtimeclasses", why, group="node.k8s.io"))
    return out


def _objects(ctx: Context, release: str, namespace: str) -> list[tuple[str, str, str | None]]:
    """(group, resource, namespace or None for a cluster-scoped kind) of each kind of object the release made."""
    out: dict[tuple[str, str, str | None], None] = {}
    discovered: dict[str, dict[str, tuple[str, bool]]] = {}
    for api_version, kind, where in ctx.helm.manifest(release, namespace):
        if api_version not in discovered:
            discovered[api_version] = ctx.kube.kinds(api_version)
        served = discovered[api_version].get(kind)
        if (
            served is None
        ):  # not served (a CRD gone): helm cannot build it either, and fails on that, not on RBAC
            continue
        resource, namespaced = served
        out[(api_version.rpartition("/")[0], resource, (where or namespace) if namespaced else None)] = None
    return list(out)


def _cuda_test() -> list[Need]:
    """The CUDA test creates its pods and deletes them after (``cudatest``; a refused ``deletecollection``
    falls back to deleting each pod, ``Kube.delete_pods``)."""
    why = "runs the CUDA test pods"
    return [
        Need("create", "pods", why, namespace=TEST_NAMESPACE),
        Need("delete", "pods", why, namespace=TEST_NAMESPACE),
    ]


def _kubernetes_layer(ctx: Context, reads: LayerReads) -> list[Need]:
    """The Kubernetes step's own writes. helm: ``helm list -A`` reads every namespace's release Secrets; an
    install creates its release Secret, then updates it with the outcome (helm@v3.14.0 pkg/action/install.go:478,
    :552-556), and an upgrade also deletes the oldest beyond ``--history-max`` (10) before it creates one
    (pkg/storage/storage.go:60-70). The RuntimeClass when missing (device-plugin layer), the release namespace
    when missing or unlabelled, and the labels of GPU nodes that lack them. Not asked: what the chart's own
    templates create (helm names the object when refused)."""
    plan, why = ctx.plan, "installs the Kubernetes layer"
    release, record = plan.helm, "installs the Kubernetes layer (helm's release record)"
    out = [Need("list", "secrets", why + " (helm list -A)")]
    exists = _release_exists(ctx, reads)
    if not _unchanged(ctx, reads):
        out += [Need(verb, "secrets", record, namespace=release.namespace) for verb in ("create", "update")]
        out += [Need("delete", "secrets", record, namespace=release.namespace)] if exists else []
        out += _upgraded_objects(ctx, reads)
    if plan.kubernetes_layer == "device-plugin":
        reads.runtime_class = ctx.kube.runtime_class(RUNTIME_CLASS) is not None
        if not reads.runtime_class:
            out.append(_need("create", "runtimeclasses", why, group="node.k8s.io"))
    if release.privileged_namespace or plan.kubernetes_layer == "gpu-operator":
        out += _namespace(ctx, release.namespace, why)
    if plan.kubernetes_layer == "device-plugin" and ctx.params.device_plugin.label_nodes and _unlabelled(ctx):
        out.append(_need("patch", "nodes", why + " (labels the GPU nodes)"))
    return out


def _upgraded_objects(ctx: Context, reads: LayerReads) -> list[Need]:
    """An upgrade's writes to the release's own objects: helm gets each object of the new manifest, creates the
    missing ones, patches the others (server-side apply by default, else a client-side patch) and deletes those
    the new manifest drops (helm pkg/kube/client.go ``(*Client).update``, read at helm/helm main 002ac78; the
    v4.1.4 tag was not read). Asked here: get and patch of each kind the installed release holds (``helm get
    manifest``), e.g. its DaemonSet. Why: a user granted exactly what preflight listed passed it, and the upgrade
    failed at ``cannot patch resource "daemonsets"`` after the nodes were changed (operator walkthrough, 6 Dec
    2026). Not asked: the kinds only the new chart version adds (create), nor the deletes. Only for a release
    that was read (a helm that may not read it names that refusal instead)."""
    current = (reads.release or (None,))[0]
    if current is None:
        return []
    why = f"upgrades the Kubernetes layer (the objects of release {current.name})"
    try:
        kinds = _objects(ctx, current.name, current.namespace)
    except RunbookError:  # not asked, as before (a discovery 503): the others' refusals still show (review)
        return []
    return [
        Need(verb, resource, why, group=group, namespace=where or "", cluster=where is None)
        for group, resource, where in kinds
        for verb in ("get", "patch")
    ]


def _release_exists(ctx: Context, reads: LayerReads) -> bool:
    """Whether the release exists; a helm that cannot read it (``list secrets`` refused, asked just before)
    counts as yes: the question then asked is the upgrade's, the larger one."""
    if reads.release is not None:
        return reads.release[0] is not None
    try:
        reads.release = (ctx.helm.release(ctx.plan.helm.release, ctx.plan.helm.namespace),)
    except RunbookError as exc:
        reads.release_error = exc
        return True
    return reads.release[0] is not None


def _unchanged(ctx: Context, reads: LayerReads) -> bool:
    """Whether the step will run no helm: the release is deployed with the pinned ``chart_version`` and the
    runbook's values (``kubernetes.already_deployed``), so a least-privileged re-run on a cluster already done
    is not asked for helm's writes. A range of versions is not resolved here (that reads the repository): it
    counts as a change."""
    current = (reads.release or (None,))[0]
    version = ctx.plan.helm.version
    if current is None or not is_chart_version(version):
        return False
    try:
        return already_deployed(ctx, current, version)
    except RunbookError:
        return False


def _namespace(ctx: Context, name: str, why: str) -> list[Need]:
    current = ctx.kube.namespace(name)
    labels = ((current or {}).get("metadata") or {}).get("labels") or {}
    if current is None:
        return [_need("create", "namespaces", why)]
    if any(labels.get(k) != v for k, v in PRIVILEGED.items()):
        return [_need("patch", "namespaces", why)]
    return []


def _unlabelled(ctx: Context) -> bool:
    """Some GPU node lacks the label the step sets (one list of the Nodes without it)."""
    key, value = next(iter(GPU_PRESENT_LABEL.items()))
    names = {n.name for n in ctx.params.nodes}
    return any(n["metadata"]["name"] in names for n in ctx.kube.nodes(f"{key}!={value}"))


def check(ctx: Context, steps: Collection[str] | None = None, reads: LayerReads | None = None) -> Check:
    """One check of the run's ``steps`` (:func:`needs`). ``steps`` given and apply off (a plan-only
    ``runbook run``): refusals pass, named as the apply run's. ``reads`` keeps what it read of the layer."""
    try:
        wanted = needs(ctx, steps, reads)
    except RunbookError as exc:
        ok = steps is not None and not ctx.apply
        fix = GRANT_HINT if isinstance(exc, Forbidden) else exc.hint or ""  # not "run preflight": this is it
        return Check(CHECK, ok, f"could not read what the run will change: {exc.message}", fix=fix)
    return verdict(ctx, wanted, advisory=steps is not None and not ctx.apply)


def verdict(ctx: Context, wanted: list[Need], *, advisory: bool, unasked_ok: bool = False) -> Check:
    """Ask about each of ``wanted``: every one allowed, or each refused one named with its reason and the command
    that asks the same. ``advisory`` (a plan): refusals are named, as what applying would meet, and pass.
    ``unasked_ok``: an API server that cannot be asked passes with a note, for a caller whose writes each fail
    safely on their own when the API is down (rollback's drains: a node whose Node cannot be read is not
    patched, ``drains._drain_one``)."""
    try:
        answers = ctx.kube.each(
            lambda n: ctx.kube.allowed(
                n.verb, n.resource, group=n.group, subresource=n.subresource, namespace=n.namespace
            ),
            wanted,
        )
    except RunbookError as exc:
        ok = advisory or unasked_ok
        return Check(CHECK, ok, f"could not ask the API server: {exc.message}", fix=exc.hint or "")
    refused = [(n, reason) for n, (ok, reason) in zip(wanted, answers, strict=True) if not ok]
    if not wanted:
        return Check(CHECK, True, "no Kubernetes write to make")
    if not refused:
        return Check(CHECK, True, f"the kubeconfig's user may make the {len(wanted)} kind(s) of write")
    told = "; ".join(
        f"{n.what()}{n.where()}, as the run {n.why}" + (f": {reason}" if reason else "")
        for n, reason in refused
    )
    fix = f"{GRANT_HINT}; check with: " + "; ".join(dict.fromkeys(n.command(ctx.kubectl) for n, _ in refused))
    if advisory:
        return Check(CHECK, True, f"plan only; {dryrun.REFUSED}: {told}", fix=fix)
    return Check(
        CHECK,
        False,
        f"the API server refuses the kubeconfig's user: {told}",
        fix=fix,
        cause="the run would stop at that write, after the changes before it",
    )
