"""What a Talos control plane runs in kube-system, for the simulated cluster on the real control plane.

Talos's manifest controller applies its bootstrap manifests to every cluster it runs: the ``kube-proxy``
DaemonSet, the ``kube-flannel`` DaemonSet (the default CNI) and the ``coredns`` Deployment, each with its
ServiceAccount (siderolabs/talos@v1.12.0 internal/app/machined/pkg/controllers/k8s/internal/k8stemplates:
kube-proxy.go, flannel.go, coredns.go; their rendered form in testdata/kube-proxy-daemonset.yaml,
flannel-daemonset.yaml, coredns-deployment.yaml). A user of a Talos cluster sees them next to the device plugin
(``kubectl -n kube-system get ds,deploy,pods``), and a drain or a reboot moves them like any pod, so the
simulated cluster has them too, with Talos's names, namespace, labels, selectors, tolerations, priority classes
and images (pkg/machinery/constants/constants.go at v1.12.0: ``registry.k8s.io/kube-proxy`` at the cluster's
Kubernetes version, ``ghcr.io/siderolabs/flannel:v0.27.4``, ``registry.k8s.io/coredns/coredns:v1.13.2``).
kwok runs their pods. Left out, since no simulated node acts on them: commands, arguments, environment,
volumes, probes, resources and security contexts, the ConfigMaps, RBAC and the kube-dns Service.
"""

from __future__ import annotations

from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

NAMESPACE = "kube-system"
FLANNEL_IMAGE = "ghcr.io/siderolabs/flannel:v0.27.4"
COREDNS_IMAGE = "registry.k8s.io/coredns/coredns:v1.13.2"
#: kube-proxy and flannel run on every node: they tolerate every NoSchedule and NoExecute taint.
EVERY_TAINT = [{"effect": "NoSchedule", "operator": "Exists"}, {"effect": "NoExecute", "operator": "Exists"}]
#: CoreDNS runs on control planes too (coredns-deployment.yaml).
COREDNS_TOLERATIONS = [
    {"effect": "NoSchedule", "key": "node-role.kubernetes.io/control-plane", "operator": "Exists"},
    {"effect": "NoSchedule", "key": "node.cloudprovider.kubernetes.io/uninitialized", "operator": "Exists"},
]


def _meta(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"name": name, "namespace": NAMESPACE, "labels": labels}


def daemonset(name: str, labels: dict[str, str], pod_spec: dict[str, Any]) -> dict[str, Any]:
    """A DaemonSet with Talos's rolling update (one node at a time)."""
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": _meta(name, labels),
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
        },
    }


def on_every_node(name: str, image: str, account: str, priority: str) -> dict[str, Any]:
    """The pod spec of a per-node network agent: host network, every taint tolerated."""
    return {
        "containers": [{"name": name, "image": image}],
        "hostNetwork": True,
        "priorityClassName": priority,
        "serviceAccountName": account,
        "tolerations": EVERY_TAINT,
    }


def kube_proxy(kubernetes: str) -> dict[str, Any]:
    image = f"registry.k8s.io/kube-proxy:v{kubernetes.lstrip('v')}"
    spec = on_every_node("kube-proxy", image, "kube-proxy", "system-cluster-critical")
    return daemonset("kube-proxy", {"k8s-app": "kube-proxy", "tier": "node"}, spec)


def flannel() -> dict[str, Any]:
    linux = {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}
    terms = {"nodeSelectorTerms": [{"matchExpressions": [linux]}]}
    spec = on_every_node("kube-flannel", FLANNEL_IMAGE, "flannel", "system-node-critical")
    spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": terms}}
    spec["initContainers"] = [{"name": "install-config", "image": FLANNEL_IMAGE}]
    return daemonset("kube-flannel", {"k8s-app": "flannel", "tier": "node"}, spec)


def coredns() -> dict[str, Any]:
    """Two replicas, preferably on different nodes (coredns-deployment.yaml's anti-affinity)."""
    selector = {"matchExpressions": [{"key": "k8s-app", "operator": "In", "values": ["kube-dns"]}]}
    apart = {
        "weight": 100,
        "podAffinityTerm": {"labelSelector": selector, "topologyKey": "kubernetes.io/hostname"},
    }
    spec = {
        "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [apart]}},
        "containers": [{"name": "coredns", "image": COREDNS_IMAGE, "imagePullPolicy": "IfNotPresent"}],
        "dnsPolicy": "Default",
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "priorityClassName": "system-cluster-critical",
        "serviceAccountName": "coredns",
        "tolerations": COREDNS_TOLERATIONS,
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta("coredns", {"k8s-app": "kube-dns", "kubernetes.io/name": "CoreDNS"}),
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"k8s-app": "kube-dns"}},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
            "template": {"metadata": {"labels": {"k8s-app": "kube-dns"}}, "spec": spec},
        },
    }


def _created(create: Any, body: dict[str, Any]) -> None:
    """Create ``body`` in kube-system; one that exists already is left as it is."""
    try:
        create(NAMESPACE, body)
    except ApiException as exc:
        if exc.status != 409:
            raise


def apply(api_client: client.ApiClient, kubernetes: str) -> None:
    """Create Talos's kube-system workloads (ServiceAccounts first: the ServiceAccount admission refuses a pod
    whose account does not exist)."""
    core, apps = client.CoreV1Api(api_client), client.AppsV1Api(api_client)
    for account in ("kube-proxy", "flannel", "coredns"):
        _created(core.create_namespaced_service_account, {"metadata": {"name": account}})
    for ds in (kube_proxy(kubernetes), flannel()):
        _created(apps.create_namespaced_daemon_set, ds)
    _created(apps.create_namespaced_deployment, coredns())
