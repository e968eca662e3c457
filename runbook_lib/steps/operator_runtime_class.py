"""On the GPU Operator layer: RuntimeClass ``nvidia`` exists, created by the operator, before the step says ok.

Why: the cuda-test pods and every GPU workload set ``runtimeClassName: nvidia``, and the API server refuses a
pod whose RuntimeClass does not exist (``pod rejected: RuntimeClass "nvidia" not found``: kubernetes
plugin/pkg/admission/runtimeclass/admission.go ``prepareObjects``). The nodes advertising ``nvidia.com/gpu`` do
not show it: they keep the GPUs of plugins already running (a migration's old plugin, or the operator's while
the operator itself is down). The operator creates the RuntimeClass in its first state, ``pre-requisites``
(gpu-operator@v26.3.3 controllers/state_manager.go:889), named and handled ``operator.runtimeClass``, default
``nvidia`` (object_controls.go:91, 2747-2753, ``transformRuntimeClass`` 5115-5160), owned by the ClusterPolicy
(``SetControllerReference``, 5133) — and only when it reconciles: it watches ClusterPolicies, GPU Node labels
and its DaemonSets, not RuntimeClasses (controllers/clusterpolicy_controller.go:345-385 ``SetupWithManager``).
"""

from __future__ import annotations

from typing import Any

from . import kube_diagnosis
from .context import Context
from .results import Check

RUNTIME_CLASS = "nvidia"
#: The ClusterPolicy CRD (gpu-operator@v26.3.3 api/nvidia/v1, group nvidia.com, version v1).
CLUSTER_POLICY = ("nvidia.com", "v1", "clusterpolicies")
#: The operator's pods (deployments/gpu-operator/templates/operator.yaml, Deployment ``gpu-operator``).
OPERATOR_PODS = "app=gpu-operator,app.kubernetes.io/component=gpu-operator"
OPERATOR_DEPLOYMENT = "deployment/gpu-operator"
#: The operator's leader-election Lease: the chart runs it with ``--leader-elect`` (templates/operator.yaml) and it
#: reconciles only while it holds this Lease (cmd/gpu-operator/main.go ``LeaderElectionID``), while its readiness
#: check is ``healthz.Ping`` (main.go ``AddReadyzCheck``): a Ready operator pod may be waiting for it.
OPERATOR_LEASE = "53822513.nvidia.com"
CHECK = f"RuntimeClass {RUNTIME_CLASS} created by the GPU Operator"


def _wanted(obj: dict[str, Any]) -> bool:
    return bool(obj["metadata"]["name"] == RUNTIME_CLASS and obj.get("handler") == RUNTIME_CLASS)


def wait(ctx: Context, *, timeout_s: float, waited_s: float) -> Check:
    """Watch (up to ``timeout_s``) until RuntimeClass ``nvidia`` exists with handler ``nvidia``; else why not
    (``waited_s``: the step's whole wait, which the message names)."""
    found = ctx.kube.runtime_class(RUNTIME_CLASS)
    if (found is None or not _wanted(found)) and timeout_s > 0:
        ctx.kube.watch_until(
            ctx.kube.node_api.list_runtime_class,
            _wanted,
            timeout=timeout_s,
            until=f"RuntimeClass {RUNTIME_CLASS} with handler {RUNTIME_CLASS}",
            field_selector=f"metadata.name={RUNTIME_CLASS}",
        )
        found = ctx.kube.runtime_class(RUNTIME_CLASS)
    if found is not None and _wanted(found):
        return Check(CHECK, True, f"exists with handler {RUNTIME_CLASS}")
    if found is not None:
        return Check(
            CHECK,
            False,
            f"exists with handler {found.get('handler')!r}",
            cause="pods would run with a containerd handler the toolkit extension does not register",
            fix=f"kubectl delete runtimeclass {RUNTIME_CLASS}  # then re-run this step",
        )
    return _missing(ctx, f"missing after {waited_s:.0f} s")


def _missing(ctx: Context, missing: str) -> Check:
    """Why the operator has not created it: no ClusterPolicy, no operator running, or no reconcile since."""
    namespace = ctx.plan.helm.namespace
    policies = ctx.kube.cluster_objects(*CLUSTER_POLICY)
    if not policies:
        crd = "is not installed" if policies is None else "exists but holds no ClusterPolicy"
        return Check(
            CHECK,
            False,
            f"{missing}: the GPU Operator creates it from its ClusterPolicy, and the ClusterPolicy CRD {crd}",
            cause="the GPU Operator chart's ClusterPolicy was not created (a failed or partial helm release)",
            fix=f"helm status {ctx.plan.helm.release} -n {namespace}  # then re-run this step",
        )
    policy = policies[0]
    state = (policy.get("status") or {}).get("state") or "not reported yet"
    creates = f"the GPU Operator creates it (ClusterPolicy {policy['metadata']['name']}, state {state})"
    ready = [
        pod["metadata"]["name"]
        for pod in ctx.kube.pods(namespace, OPERATOR_PODS)
        if (kube_diagnosis.condition(pod, "Ready") or {}).get("status") == "True"
    ]
    if not ready:
        return Check(
            CHECK,
            False,
            f"{missing}: {creates}, but no gpu-operator pod is Ready in namespace {namespace}",
            cause="the operator does not run, so nothing reconciles the ClusterPolicy",
            fix=f"kubectl -n {namespace} rollout status {OPERATOR_DEPLOYMENT}; "
            f"kubectl -n {namespace} describe pods -l {OPERATOR_PODS}",
        )
    if not policy.get("status"):
        return _never_reconciled(ctx, f"{missing}: {creates}", ready)
    return Check(
        CHECK,
        False,
        f"{missing}: {creates}, and its pod is Ready but has not created it",
        cause="the operator creates it only when it reconciles the ClusterPolicy (it does not watch "
        "RuntimeClasses), so one deleted after the ClusterPolicy became ready stays missing until then",
        fix=f"kubectl -n {namespace} rollout restart {OPERATOR_DEPLOYMENT}  # a started operator reconciles; "
        f"then kubectl -n {namespace} logs {OPERATOR_DEPLOYMENT}",
    )


def _never_reconciled(ctx: Context, missing: str, ready: list[str]) -> Check:
    """A ClusterPolicy with no status was never reconciled (the operator writes ``status.state`` from its first
    reconcile, controllers/clusterpolicy_controller.go); with a Ready pod, the usual reason is that the pod does
    not lead: another instance (a second release, a leftover Deployment) holds the operator's Lease. Controller-
    runtime's holder identity is ``<hostname>_<uuid>``, and a pod's hostname is its name."""
    namespace = ctx.plan.helm.namespace
    said = f"{missing}, and its pod is Ready but has not reconciled the ClusterPolicy (it has no status)"
    logs = f"kubectl -n {namespace} logs {OPERATOR_DEPLOYMENT}"
    holder = str(
        ((ctx.kube.lease(namespace, OPERATOR_LEASE) or {}).get("spec") or {}).get("holderIdentity") or ""
    )
    if holder and holder.split("_", 1)[0] not in ready:
        return Check(
            CHECK,
            False,
            f"{said}: its leader-election Lease {OPERATOR_LEASE} is held by {holder}, not by a gpu-operator "
            f"pod of namespace {namespace} that is Ready",
            cause="the operator reconciles only while it holds that Lease, and its readiness probe passes "
            "without it: another GPU Operator instance leads (a second release or a leftover Deployment)",
            fix=f"kubectl -n {namespace} get lease {OPERATOR_LEASE} -o yaml  # find the instance that holds it "
            f"and remove it; the operator takes the Lease once it expires, then {logs}",
        )
    return Check(
        CHECK,
        False,
        said,
        cause="the operator has not started its controllers or fails before its first status update",
        fix=f"{logs}  # its errors; kubectl -n {namespace} get lease {OPERATOR_LEASE} shows which pod leads",
    )
