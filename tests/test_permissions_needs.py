"""Which writes preflight asks the API server about, for which steps (``steps/permissions.py``).

The answers are the real authorizer's in ``tests/test_preflight_permissions.py``; here, the questions, from the
parameters and the cluster's state as the API and helm would answer them, checked against the sources the module
cites (kubectl@v0.35.0 pkg/drain, helm@v3.14.0 pkg/storage and pkg/action/install.go).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from runbook_lib.clients.helm import Release
from runbook_lib.model.params import validate
from runbook_lib.model.plan import build_plan
from runbook_lib.steps import permissions


class _Cluster:
    def __init__(self, *, runtime_class: dict[str, Any] | None, namespace: dict[str, Any] | None) -> None:
        self._runtime_class = runtime_class
        self._namespace = namespace
        self.unlabelled: list[str] = []

    def runtime_class(self, name: str) -> dict[str, Any] | None:
        return self._runtime_class

    def namespace(self, name: str) -> dict[str, Any] | None:
        return self._namespace

    def kinds(self, api_version: str) -> dict[str, tuple[str, bool]]:
        """As discovery answers (kubernetes v1.35.0)."""
        return {
            "apps/v1": {"DaemonSet": ("daemonsets", True)},
            "v1": {"ServiceAccount": ("serviceaccounts", True)},
            "rbac.authorization.k8s.io/v1": {"ClusterRole": ("clusterroles", False)},
        }.get(api_version, {})

    def nodes(self, selector: str | None = None) -> list[dict[str, Any]]:
        assert selector == "nvidia.com/gpu.present!=true"
        return [{"metadata": {"name": n}} for n in self.unlabelled]


class _Helm:
    def __init__(self, releases: list[Release]) -> None:
        self.releases = releases
        self.given: dict[str, Any] = {}
        """The release's values as ``helm get values -o json`` prints them (the user-supplied ones)."""

    def values(self, name: str, namespace: str) -> dict[str, Any]:
        return self.given

    def releases_everywhere(self) -> list[Release]:
        return self.releases

    def release(self, name: str, namespace: str) -> Release | None:
        return next((r for r in self.releases if (r.name, r.namespace) == (name, namespace)), None)

    def manifest(self, name: str, namespace: str) -> list[tuple[str, str, str]]:
        """The device-plugin chart's objects with a config map set (k8s-device-plugin@v0.18.0
        deployments/helm/nvidia-device-plugin/templates: daemonset.yml, service-account.yml, role.yml)."""
        return [
            ("apps/v1", "DaemonSet", namespace),
            ("v1", "ServiceAccount", namespace),
            ("rbac.authorization.k8s.io/v1", "ClusterRole", ""),
        ]


def _ctx(
    talos: str = "v1.12.7", *, releases: list[Release] = (), kube: _Cluster | None = None, **more: Any
) -> Any:
    params = validate(
        {
            "cluster": "c",
            "talos_version": talos,
            "nodes": [{"name": "gpu-1", "address": "10.0.0.1"}],
            **more,
        },
        source="test",
    )
    kube = kube or _Cluster(runtime_class=None, namespace=None)
    return SimpleNamespace(params=params, plan=build_plan(params), kube=kube, helm=_Helm(list(releases)))


def _asked(needs: list[permissions.Need]) -> set[str]:
    return {f"{n.what()} {n.namespace or '*'}" for n in needs}


def test_a_drain_asks_what_kubectl_drain_does_and_only_where_a_patch_reboots() -> None:
    asked = _asked(permissions.needs(_ctx(default_runtime_patch=True), ["config-patch"]))
    assert asked == {
        "get nodes *",
        "patch nodes *",
        "list pods *",
        "get pods *",
        "get daemonsets.apps *",
        "create pods/eviction *",
    }
    assert permissions.needs(_ctx(), ["config-patch"]) == []


def test_an_install_asks_for_helms_release_record_and_what_is_missing() -> None:
    """A first install: helm lists every namespace's releases, creates the release Secret and updates it with
    the outcome; the RuntimeClass is created; the GPU node lacks its label."""
    kube = _Cluster(runtime_class=None, namespace=None)
    kube.unlabelled = ["gpu-1", "cpu-9"]
    asked = _asked(permissions.needs(_ctx(kube=kube), ["kubernetes"]))
    assert asked == {
        "list secrets *",
        "create secrets kube-system",
        "update secrets kube-system",
        "create runtimeclasses.node.k8s.io *",
        "patch nodes *",
    }


_RELEASE_OBJECTS = (
    "daemonsets.apps kube-system",
    "serviceaccounts kube-system",
    "clusterroles.rbac.authorization.k8s.io *",
)


def test_what_is_already_there_is_not_asked_for_but_an_upgrade_may_prune_helms_history() -> None:
    kube = _Cluster(runtime_class={"handler": "nvidia"}, namespace=None)
    kube.unlabelled = ["cpu-9"]  # not a GPU node of the parameters
    deployed = Release("nvidia-device-plugin", "kube-system", "nvidia-device-plugin-0.18.0", "deployed", 3)
    ctx = _ctx(kube=kube, releases=[deployed])
    ctx.helm.given = {"priorityClassName": "system-node-critical"}  # the site's, without the runbook's value
    asked = _asked(permissions.needs(ctx, ["kubernetes"]))
    assert asked == {
        "list secrets *",
        "create secrets kube-system",
        "update secrets kube-system",
        "delete secrets kube-system",
        # the upgrade gets and patches each of the release's objects (helm pkg/kube/client.go update): a user
        # granted only the above passed preflight and the upgrade failed at `cannot patch resource
        # "daemonsets"` after the nodes were changed (operator walkthrough, 6 Dec 2026)
        *(f"{verb} {what}" for verb in ("get", "patch") for what in _RELEASE_OBJECTS),
    }
    # deployed with the runbook's values at the planned 0.18.0 (v1.12's default): the step runs no helm
    ctx.helm.given = {"priorityClassName": "system-node-critical", "runtimeClassName": "nvidia"}
    assert _asked(permissions.needs(ctx, ["kubernetes"])) == {"list secrets *"}
    ctx = _ctx(kube=kube, releases=[deployed], device_plugin={"chart_version": "~0.18"})
    ctx.helm.given = {"runtimeClassName": "nvidia"}
    assert "create secrets kube-system" in _asked(permissions.needs(ctx, ["kubernetes"])), (
        "a range is a change"
    )


def test_a_run_of_preflight_alone_runs_every_step_and_otherwise_only_its_own() -> None:
    assert permissions.runs_step(None, "kubernetes") and permissions.runs_step(["preflight"], "kubernetes")
    assert permissions.runs_step(["preflight", "kubernetes"], "kubernetes")
    assert not permissions.runs_step(["preflight", "verify"], "kubernetes")


def test_the_gpu_operator_layer_asks_for_the_device_plugins_removal_from_the_image_step_on() -> None:
    """The image step uninstalls the device plugin before the first node goes to Talos 1.13: a refusal there
    must show at preflight, not after the plan was approved. ``helm uninstall --wait`` deletes, then watches, each
    object of the release and purges its Secrets (helm@v4.1.4 pkg/action/uninstall.go:98,161,179-182,256-289):
    a user who may delete the DaemonSet but not the chart's ClusterRole left the release ``uninstalling``."""
    plugin = Release("nvdp", "nvidia-device-plugin", "nvidia-device-plugin-0.18.0", "deployed", 1)
    kube = _Cluster(runtime_class={"metadata": {}, "handler": "nvidia"}, namespace=None)
    asked = _asked(permissions.needs(_ctx("v1.13.0", kube=kube, releases=[plugin]), ["image"]))
    ns = "nvidia-device-plugin"
    assert asked == {
        "list secrets *",
        *(f"{verb} secrets {ns}" for verb in ("list", "get", "delete")),
        *(f"{verb} daemonsets.apps {ns}" for verb in ("delete", "list", "watch")),
        *(f"{verb} serviceaccounts {ns}" for verb in ("delete", "list", "watch")),
        *(f"{verb} clusterroles.rbac.authorization.k8s.io *" for verb in ("delete", "list", "watch")),
        "delete runtimeclasses.node.k8s.io *",
    }


def test_preflight_alone_is_a_readiness_gate_for_the_whole_runbook() -> None:
    ctx = _ctx(default_runtime_patch=True)
    assert permissions.needs(ctx, ["preflight"]) == permissions.needs(ctx, None)
    assert permissions.needs(ctx, ["preflight", "verify"]) == []


def test_the_command_asks_for_the_subresource_as_kubectl_auth_can_i_reads_it() -> None:
    """``kubectl auth can-i create pods/eviction`` asks about a pod *named* eviction (k8s.io/kubectl@v0.35.0
    pkg/cmd/auth/cani.go:176-183); the subresource is a flag."""
    [evict] = [
        n for n in permissions.needs(_ctx(default_runtime_patch=True), ["config-patch"]) if n.subresource
    ]
    assert evict.command() == "kubectl auth can-i create pods --subresource=eviction -A"


class _RefusingHelm(_Helm):
    """helm as it answers a user who may not list Secrets: every read fails (helm list exits 1)."""

    def releases_everywhere(self) -> list[Release]:
        from runbook_lib.errors import PermanentError

        raise PermanentError(
            'helm list -A failed: secrets is forbidden: User "x" cannot list resource "secrets"'
        )

    def release(self, name: str, namespace: str) -> Release | None:
        self.releases_everywhere()
        return None


def test_a_helm_that_cannot_read_its_releases_makes_the_questions_that_name_why() -> None:
    """Before, helm's refusal failed preflight with helm's raw error, even a plan-only run's; now the access
    reviews ask ``list secrets`` (which names the refusal) and, not knowing, the upgrade's larger questions."""
    ctx = _ctx("v1.13.0", kube=_Cluster(runtime_class=None, namespace={"metadata": {"labels": {}}}))
    ctx.helm = _RefusingHelm([])
    asked = _asked(permissions.needs(ctx, ["image", "kubernetes"]))
    assert {"list secrets *", "create secrets gpu-operator", "delete secrets gpu-operator"} <= asked


def test_an_api_server_that_cannot_be_asked_fails_only_where_no_write_fails_safely_on_its_own() -> None:
    """Rollback is often run on a broken cluster: with the API down its drains fail per node, unpatched, so the
    Talos side may still go back; the removal of the Kubernetes layer needs the answer first."""
    from runbook_lib.errors import RetryableError

    def down(*args: Any, **kwargs: Any) -> Any:
        raise RetryableError("can-i: the Kubernetes API did not answer")

    ctx = SimpleNamespace(kube=SimpleNamespace(each=lambda fn, items: [fn(i) for i in items], allowed=down))
    wanted = permissions.for_rollback(ctx, None, drains=True, cordons=False)  # type: ignore[arg-type]
    assert permissions.verdict(ctx, wanted, advisory=False, unasked_ok=True).ok  # type: ignore[arg-type]
    assert not permissions.verdict(ctx, wanted, advisory=False).ok  # type: ignore[arg-type]
    assert permissions.verdict(ctx, wanted, advisory=True).ok  # type: ignore[arg-type]


class _EveryNamespaceRefused(_Helm):
    """helm as it answers a user who may list Secrets in the release's namespace only: ``helm list -A`` fails."""

    def releases_everywhere(self) -> list[Release]:
        from runbook_lib.errors import PermanentError

        raise PermanentError(
            'helm list -A failed: User "x" cannot list resource "secrets" at the cluster scope'
        )


def _operator(namespace: str) -> Release:
    return Release("gpu-operator", namespace, "gpu-operator-v26.3.1", "deployed", 1)


def test_a_helm_refused_every_namespace_still_reads_the_planned_release_in_its_own() -> None:
    """The GPU Operator layer takes the planned release from the hand-over's ``helm list -A`` (5de9165); refused
    that, it still reads it with ``helm list -n`` (what preflight reports and asks about)."""
    ctx = _ctx("v1.13.0", kube=_Cluster(runtime_class=None, namespace={"metadata": {"labels": {}}}))
    ctx.helm = _EveryNamespaceRefused([_operator(ctx.plan.helm.namespace)])
    reads = permissions.LayerReads()
    asked = _asked(permissions.needs(ctx, ["image", "kubernetes"], reads))
    assert reads.release == (_operator(ctx.plan.helm.namespace),), reads
    assert "delete secrets gpu-operator" in asked, "an upgrade of the release found is asked"


def test_a_release_of_the_planned_name_in_another_namespace_is_not_taken_for_the_planned_one() -> None:
    ctx = _ctx("v1.13.0", kube=_Cluster(runtime_class=None, namespace={"metadata": {"labels": {}}}))
    ctx.helm = _Helm([_operator("somewhere-else")])
    reads = permissions.LayerReads()
    permissions.needs(ctx, ["image", "kubernetes"], reads)
    assert reads.release == (None,) and reads.runtime_class is False, reads


def test_a_node_or_namespace_is_asked_without_a_namespace() -> None:
    """Nodes and RuntimeClasses have no namespace (``namespaced: false`` in the API server's discovery): the
    message named them "in every namespace" and the command asked ``-A``, which reads as a namespaced grant."""
    ctx = _ctx("v1.13.0", kube=_Cluster(runtime_class=None, namespace=None), default_runtime_patch=True)
    by_what = {n.what(): n for n in permissions.needs(ctx, None)}
    patch = by_what["patch nodes"]
    assert patch.where() == "" and patch.command() == "kubectl auth can-i patch nodes"
    assert by_what["list pods"].command() == "kubectl auth can-i list pods -A"
    assert by_what["create namespaces"].command() == "kubectl auth can-i create namespaces"


def test_a_runtime_class_on_the_device_plugin_layer_is_asked_without_a_namespace() -> None:
    ctx = _ctx("v1.12.7", kube=_Cluster(runtime_class=None, namespace=None))
    [create] = [n for n in permissions.needs(ctx, ["kubernetes"]) if n.resource == "runtimeclasses"]
    assert create.command() == "kubectl auth can-i create runtimeclasses.node.k8s.io"
    assert create.where() == ""
