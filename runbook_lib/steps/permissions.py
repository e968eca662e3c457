"""What the run will ask of the Kubernetes API, asked of its authorizer before any change (preflight).

Why: the Kubernetes writes come late in a run. A service account that may not evict pods learns it at the first
node whose patch reboots it, after the images of the whole fleet were upgraded; one that may not create the
RuntimeClass learns it after every node was changed. The API server answers "may I?" for any request without
making it (a SelfSubjectAccessReview, as ``kubectl auth can-i``), so preflight asks, for the requests the run
will make with the parameters and the cluster as they are, and names each refused one with the command that
asks the same question.

Not asked: what a Helm chart's own templates create (it depends on the chart; helm reports a refusal with the
object it named), and the reads (a user who may not read Nodes fails preflight's own reads first).
"""

from __future__ import annotations

import shlex
from collections.abc import Collection
from dataclasses import dataclass

from runbook_lib.errors import RunbookError

from .context import Context
from .cudatest import TEST_NAMESPACE
from .kubernetes import PRIVILEGED, RUNTIME_CLASS
from .results import Check

CHECK = "Kubernetes permissions"


@dataclass(frozen=True)
class Need:
    """One request the run makes: ``namespace`` "" means in every namespace (a drain evicts whatever runs)."""

    verb: str
    resource: str
    why: str
    group: str = ""
    subresource: str = ""
    namespace: str = ""

    def what(self) -> str:
        full = self.resource + (f"/{self.subresource}" if self.subresource else "")
        full += f".{self.group}" if self.group else ""
        return f"{self.verb} {full}"

    def command(self) -> str:
        where = ["-n", self.namespace] if self.namespace else ["-A"]
        return shlex.join(["kubectl", "auth", "can-i", *self.what().split(" "), *where])


def needs(ctx: Context, steps: Collection[str] | None = None) -> list[Need]:
    """The writes the run's ``steps`` make (None: all of them, as a user going through the notebooks does), as
    the parameters and the cluster now stand. Why by step: ``runbook run --steps preflight,verify`` with a
    read-only kubeconfig is a health check that makes no write, and must not fail for writes it will not make."""

    def runs(step: str) -> bool:
        return steps is None or step in steps

    out = _kubernetes_layer(ctx) if runs("kubernetes") else []
    out += _cuda_test() if runs("cuda-test") else []
    if ctx.params.default_runtime_patch and runs("config-patch"):
        out += _drains()
    return out


def _drains() -> list[Need]:
    """``kubectl drain`` as the config-patch step runs it (``drains``): it cordons with a strategic merge patch
    (k8s.io/kubectl@v0.35.0 pkg/drain/cordon.go:104), lists the node's pods in every namespace (drain.go:198),
    reads each pod's DaemonSet to let it stay (filters.go:196) and evicts the others through the eviction
    subresource (drain.go:165); the runbook marks and uncordons the Node with patches too."""
    why = "drains the nodes a patch reboots"
    return [
        Need("patch", "nodes", why),
        Need("list", "pods", why),
        Need("get", "daemonsets", why, group="apps"),
        Need("create", "pods", why, subresource="eviction"),
    ]


def _cuda_test() -> list[Need]:
    """The CUDA test creates its pods and deletes them after (``cudatest``)."""
    why = "runs the CUDA test pods"
    return [
        Need("create", "pods", why, namespace=TEST_NAMESPACE),
        Need("delete", "pods", why, namespace=TEST_NAMESPACE),
    ]


def _kubernetes_layer(ctx: Context) -> list[Need]:
    """The Kubernetes step's own writes: the RuntimeClass when missing (device-plugin layer), the release
    namespace when missing or unlabelled, node labels, and helm's release record, a Secret in the release's
    namespace (helm's default storage driver: helm@v3.14.0 pkg/storage/driver/secrets.go ``Create``)."""
    plan, why = ctx.plan, "installs the Kubernetes layer"
    release = plan.helm
    out = [Need("create", "secrets", why + " (helm's release record)", namespace=release.namespace)]
    if plan.kubernetes_layer == "device-plugin" and ctx.kube.runtime_class(RUNTIME_CLASS) is None:
        out.append(Need("create", "runtimeclasses", why, group="node.k8s.io"))
    if release.privileged_namespace or plan.kubernetes_layer == "gpu-operator":
        current = ctx.kube.namespace(release.namespace)
        labels = ((current or {}).get("metadata") or {}).get("labels") or {}
        if current is None:
            out.append(Need("create", "namespaces", why))
        elif any(labels.get(k) != v for k, v in PRIVILEGED.items()):
            out.append(Need("patch", "namespaces", why))
    if plan.kubernetes_layer == "device-plugin" and ctx.params.device_plugin.label_nodes:
        out.append(Need("patch", "nodes", why + " (labels the GPU nodes)"))
    return out


def check(ctx: Context, steps: Collection[str] | None = None) -> Check:
    """One check: every request allowed, or each refused one named with its reason and the command to ask."""
    try:
        wanted = needs(ctx, steps)
        answers = ctx.kube.each(
            lambda n: ctx.kube.allowed(
                n.verb, n.resource, group=n.group, subresource=n.subresource, namespace=n.namespace
            ),
            wanted,
        )
    except RunbookError as exc:
        return Check(CHECK, False, f"could not ask the API server: {exc.message}", fix=exc.hint or "")
    refused = [(n, reason) for n, (ok, reason) in zip(wanted, answers, strict=True) if not ok]
    if not wanted:
        return Check(CHECK, True, "the run's steps make no Kubernetes write")
    if not refused:
        return Check(CHECK, True, f"the kubeconfig's user may make the run's {len(wanted)} kinds of write")
    told = "; ".join(
        f"{n.what()} {'in ' + n.namespace if n.namespace else 'in every namespace'} (the run {n.why})"
        + (f": {reason}" if reason else "")
        for n, reason in refused
    )
    return Check(
        CHECK,
        False,
        f"the API server refuses the kubeconfig's user: {told}",
        fix="grant them (a Role or ClusterRole bound to this user), or run with a kubeconfig that has them; "
        "check with: " + "; ".join(dict.fromkeys(n.command() for n, _ in refused)),
        cause="the run would stop at that write, after the changes before it",
    )
