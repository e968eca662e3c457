"""A restricted user on the real control plane (RBAC on, as Talos configures its API server:
simkube/components.go): a ServiceAccount that may read everything and create and delete pods in ``default``,
nothing else, the kind of CI identity a site hands a runbook; its token is a real one (TokenRequest)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from runbook_lib.clients.helm import Helm

USER = "gpu-runner"


def restricted_kubeconfig(ctx: Any, out: Path) -> Path:
    """A kubeconfig for a service account that may read everything and create pods in ``default``, nothing
    else: the kind of CI identity a site hands a runbook."""
    rbac = client.RbacAuthorizationV1Api(ctx.kube.api)
    if ctx.kube.core.list_namespaced_service_account("default", field_selector=f"metadata.name={USER}").items:
        return _kubeconfig(ctx, out)  # made already in this cluster: a fresh token
    ctx.kube.core.create_namespaced_service_account("default", {"metadata": {"name": USER}})
    rbac.create_cluster_role(
        {
            "metadata": {"name": USER},
            "rules": [
                {"apiGroups": ["*"], "resources": ["*"], "verbs": ["get", "list", "watch"]},
            ],
        }
    )
    rbac.create_cluster_role_binding(
        {
            "metadata": {"name": USER},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": USER},
            "subjects": [{"kind": "ServiceAccount", "name": USER, "namespace": "default"}],
        }
    )
    rbac.create_namespaced_role(
        "default",
        {
            "metadata": {"name": USER},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "delete"]}],
        },
    )
    rbac.create_namespaced_role_binding(
        "default",
        {
            "metadata": {"name": USER},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": USER},
            "subjects": [{"kind": "ServiceAccount", "name": USER, "namespace": "default"}],
        },
    )
    return _kubeconfig(ctx, out)


VIEWER = "gpu-viewer"


def viewer_kubeconfig(ctx: Any, out: Path) -> Path:
    """A kubeconfig for a service account bound to the built-in ``view`` ClusterRole, plus reading Nodes and
    RuntimeClasses (cluster-scoped, which ``view`` leaves out): the read-only identity a site hands a reviewer.
    ``view`` grants no Secrets (kubernetes@v1.35.0 plugin/pkg/auth/authorizer/rbac/bootstrappolicy/policy.go),
    so helm, which keeps its releases in Secrets, can read none. The roles are the real API server's own."""
    rbac = client.RbacAuthorizationV1Api(ctx.kube.api)
    ctx.kube.core.create_namespaced_service_account("default", {"metadata": {"name": VIEWER}})
    rbac.create_cluster_role(
        {
            "metadata": {"name": VIEWER},
            "rules": [
                {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
                {
                    "apiGroups": ["node.k8s.io"],
                    "resources": ["runtimeclasses"],
                    "verbs": ["get", "list", "watch"],
                },
            ],
        }
    )
    for role in ("view", VIEWER):
        rbac.create_cluster_role_binding(
            {
                "metadata": {"name": f"{VIEWER}-{role}"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                "subjects": [{"kind": "ServiceAccount", "name": VIEWER, "namespace": "default"}],
            }
        )
    return _kubeconfig(ctx, out, VIEWER)


def _kubeconfig(ctx: Any, out: Path, user: str = USER) -> Path:
    token = ctx.kube.core.create_namespaced_service_account_token(
        user, "default", {"spec": {"expirationSeconds": 3600}}
    ).status.token
    config = yaml.safe_load(Path(ctx.endpoints.kubeconfig).read_text())
    config["users"] = [{"name": user, "user": {"token": token}}]
    for entry in config["contexts"]:
        entry["context"]["user"] = user
    out.write_text(yaml.safe_dump(config))
    return out


def as_restricted_user(ctx: Any, tmp_path: Path) -> Any:
    """``ctx`` with the Kubernetes client, helm and kubectl on the restricted user's kubeconfig."""
    kubeconfig = str(restricted_kubeconfig(ctx, tmp_path / "runner.kubeconfig"))
    endpoints = dataclasses.replace(ctx.endpoints, kubeconfig=kubeconfig)
    helm = Helm(endpoints.helm, kubeconfig=kubeconfig, runner=ctx.helm.runner)
    return dataclasses.replace(ctx, endpoints=endpoints, _kube=None, helm=helm)
