"""The resource table of the simulated Kubernetes API.

One row per served resource: the routing key (group, version, plural) plus what discovery, Status bodies and
model validation need.  Keeping it a table (not per-resource code) is what lets one handler serve every kind
the runbooks touch, and lets discovery be generated instead of hand-written.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Resource:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    model: str | None
    """Name of the ``kubernetes.client`` model class every stored object must validate against."""
    short_names: tuple[str, ...] = ()
    subresources: tuple[str, ...] = ()
    singular: str = ""
    verbs: tuple[str, ...] = (
        "create",
        "delete",
        "deletecollection",
        "get",
        "list",
        "patch",
        "update",
        "watch",
    )
    categories: tuple[str, ...] = field(default=())

    @property
    def key(self) -> str:
        return f"{self.group}/{self.version}/{self.plural}" if self.group else f"{self.version}/{self.plural}"

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified(self) -> str:
        """How the apiserver names the resource in messages: ``pods`` or ``daemonsets.apps``."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def qualified_kind(self) -> str:
        """How validation messages name the kind: ``Pod`` or ``DaemonSet.apps``."""
        return f"{self.kind}.{self.group}" if self.group else self.kind


RESOURCES: tuple[Resource, ...] = (
    Resource("", "v1", "namespaces", "Namespace", False, "V1Namespace", ("ns",), ("status",), "namespace"),
    Resource("", "v1", "nodes", "Node", False, "V1Node", ("no",), ("status",), "node"),
    Resource(
        "", "v1", "pods", "Pod", True, "V1Pod", ("po",), ("status", "log", "binding", "eviction"), "pod"
    ),
    Resource("", "v1", "events", "Event", True, "CoreV1Event", ("ev",), (), "event"),
    Resource("", "v1", "configmaps", "ConfigMap", True, "V1ConfigMap", ("cm",), (), "configmap"),
    Resource("", "v1", "secrets", "Secret", True, "V1Secret", (), (), "secret"),
    Resource(
        "", "v1", "serviceaccounts", "ServiceAccount", True, "V1ServiceAccount", ("sa",), (), "serviceaccount"
    ),
    Resource("", "v1", "services", "Service", True, "V1Service", ("svc",), ("status",), "service"),
    Resource("apps", "v1", "daemonsets", "DaemonSet", True, "V1DaemonSet", ("ds",), ("status",), "daemonset"),
    Resource(
        "apps",
        "v1",
        "deployments",
        "Deployment",
        True,
        "V1Deployment",
        ("deploy",),
        ("status",),
        "deployment",
    ),
    Resource("batch", "v1", "jobs", "Job", True, "V1Job", (), ("status",), "job"),
    Resource(
        "node.k8s.io", "v1", "runtimeclasses", "RuntimeClass", False, "V1RuntimeClass", (), (), "runtimeclass"
    ),
    Resource("rbac.authorization.k8s.io", "v1", "roles", "Role", True, "V1Role", (), (), "role"),
    Resource(
        "rbac.authorization.k8s.io",
        "v1",
        "rolebindings",
        "RoleBinding",
        True,
        "V1RoleBinding",
        (),
        (),
        "rolebinding",
    ),
    Resource(
        "rbac.authorization.k8s.io",
        "v1",
        "clusterroles",
        "ClusterRole",
        False,
        "V1ClusterRole",
        (),
        (),
        "clusterrole",
    ),
    Resource(
        "rbac.authorization.k8s.io",
        "v1",
        "clusterrolebindings",
        "ClusterRoleBinding",
        False,
        "V1ClusterRoleBinding",
        (),
        (),
        "clusterrolebinding",
    ),
    Resource(
        "nvidia.com", "v1", "clusterpolicies", "ClusterPolicy", False, None, (), ("status",), "clusterpolicy"
    ),
)

BY_KEY: dict[str, Resource] = {r.key: r for r in RESOURCES}
BY_KIND: dict[tuple[str, str], Resource] = {(r.api_version, r.kind): r for r in RESOURCES}


def by_kind(api_version: str, kind: str) -> Resource | None:
    return BY_KIND.get((api_version, kind))


def groups() -> dict[str, list[str]]:
    """Group name → versions, in table order (the legacy core group excluded)."""
    out: dict[str, list[str]] = {}
    for r in RESOURCES:
        if r.group and r.version not in out.setdefault(r.group, []):
            out[r.group].append(r.version)
    return out


def resources_of(group: str, version: str) -> list[Resource]:
    return [r for r in RESOURCES if r.group == group and r.version == version]
