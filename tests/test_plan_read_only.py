"""A plan made with a read-only kubeconfig shows every change, and names the writes applying would be refused.

The API server authorizes a dry-run write as the write itself: a dry run is the ``dryRun`` flag on the same
request, and the authorization filter runs before any handler reads it (k8s.io/apiserver@v0.35.0
pkg/server/config.go:1019 ``WithAuthorization`` in ``DefaultBuildHandlerChain``; the attributes it decides on,
pkg/authorization/authorizer/interfaces.go ``Attributes``, carry verb, resource and name, no dry run), so a
read-only identity, the one a site
hands a reviewer or a CI job that only plans, failed the whole Kubernetes plan at its first write, and the
image step's plan at the Talos 1.13 hand-over. Found by an operator walkthrough (stop 44's note). On the real
control plane with a real service account's token (tests/rbac.py): the 403s are the real authorizer's.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from runbook_lib.steps.image import image_upgrade
from runbook_lib.steps.kubernetes import kubernetes_layer
from tests.rbac import as_restricted_user
from tests.realplane import real_cluster
from tests.test_image_step import _same_cluster_on

pytestmark = pytest.mark.slow

REFUSED = "applying would be refused"


def test_a_read_only_user_plans_the_whole_kubernetes_layer_and_sees_which_writes_it_may_not_make(
    tmp_path: Path,
) -> None:
    with real_cluster(tmp_path, scenario="gpu-ready") as (_params, ctx):
        runner = as_restricted_user(ctx, tmp_path)
        plan = kubernetes_layer(runner, apply=False)
        assert plan.ok, plan.to_dict()
        assert plan.data["changes"] == [
            "RuntimeClass nvidia (handler nvidia)",
            "label node talos-worker-1 nvidia.com/gpu.present=true",
            "label node talos-worker-2 nvidia.com/gpu.present=true",
            "helm upgrade --install nvidia-device-plugin nvdp/nvidia-device-plugin --version 0.18.0 -n kube-system "
            "--set runtimeClassName=nvidia",
        ]
        said = {c.name: c for c in plan.checks}
        runtime_class = said["RuntimeClass nvidia"]
        assert runtime_class.message.startswith("would be created; " + REFUSED), runtime_class.message
        assert 'cannot create resource "runtimeclasses"' in runtime_class.message
        assert "grant it to the kubeconfig's user (a Role or ClusterRole bound to it)" in runtime_class.fix
        labels = said["label nvidia.com/gpu.present=true"]
        assert "would label 2 node(s); " + REFUSED in labels.message and 'cannot patch resource "nodes"' in (
            labels.message
        )
        assert any("3 planned write(s) are refused" in n for n in plan.notes), plan.notes  # a label per node
        assert [e.summary for e in runner.journal.changes()] == []
        assert ctx.kube.runtime_class("nvidia") is None

        applied = kubernetes_layer(runner, apply=True)
        assert not applied.ok, "an apply run with the same user must still stop at the refused write"
        assert 'cannot create resource "runtimeclasses"' in applied.checks[-1].message
        assert "grant it to the kubeconfig's user" in applied.checks[-1].fix
        assert ctx.kube.runtime_class("nvidia") is None

        admin = kubernetes_layer(ctx, apply=False)
        assert admin.ok and "refused" not in admin.data, "an admin's plan names no refusal"
        assert not any(REFUSED in c.message for c in admin.checks)


def test_a_read_only_user_plans_the_talos_1_13_hand_over_and_the_upgrade_behind_it(tmp_path: Path) -> None:
    """The image step's plan on 1.12 nodes with the device plugin, to 1.13 with the GPU Operator: its
    RuntimeClass deletion goes to the server's dry run, which the read-only user may not make."""
    from tests.simcluster import sim_cluster

    with sim_cluster(tmp_path, scenario="gpu-ready", apply=True) as (params, ctx):
        assert kubernetes_layer(ctx, timeout_s=60).ok  # Talos 1.12: the device plugin and RuntimeClass nvidia
        runner = as_restricted_user(_same_cluster_on(params, "v1.13.2", tmp_path, apply=False), tmp_path)
        plan = image_upgrade(runner)
        assert plan.ok, plan.to_dict()
        assert [n.status for n in plan.nodes] == ["planned"] * len(plan.nodes)
        hand_over = next(c for c in plan.checks if c.name.startswith("device plugin removed before"))
        assert hand_over.message.startswith(
            "would run: helm uninstall nvidia-device-plugin -n kube-system --wait --timeout 300s; kubectl delete runtimeclass nvidia; "
            + REFUSED
        ), hand_over.message
        assert 'cannot delete resource "runtimeclasses"' in hand_over.message
        assert ctx.kube.runtime_class("nvidia") is not None

        # the kubernetes step's plan of the same hand-over (nodes moved without the runbook): the old
        # RuntimeClass is not said to be fine, since applying deletes it (operator walkthrough, stop 45)
        layer = kubernetes_layer(_same_cluster_on(params, "v1.13.2", tmp_path, apply=False))
        said = {c.name: c.message for c in layer.checks}
        assert said["namespace gpu-operator allows privileged pods"] == "would be created", said
        assert said["RuntimeClass nvidia"] == (
            "the device plugin's is deleted first; the GPU Operator chart creates its own"
        ), said
        assert "delete RuntimeClass nvidia (the GPU Operator creates its own)" in layer.data["changes"]
        refused = kubernetes_layer(runner)
        handed = next(c for c in refused.checks if c.name == "RuntimeClass nvidia handed to the GPU Operator")
        assert REFUSED in handed.message and handed.ok, handed


def _plan_as(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    make_kubeconfig: Callable[[Any, Path], Path],
    steps: list[str],
) -> tuple[int, str]:
    """A plan-only ``runbook run`` of ``steps`` on a gpu-ready simulated cluster, with the kubeconfig
    ``make_kubeconfig`` makes there: its exit code and what it printed."""
    from runbook_lib.cli import main
    from runbook_lib.model.params import load_params
    from runbook_lib.steps.context import connect
    from tests.realplane import use_real_plane

    use_real_plane(monkeypatch)
    params = str(Path(__file__).resolve().parents[1] / "params" / "simulated.yaml")
    state = tmp_path / "sim"
    assert main(["sim", "up", "-p", params, "--state", str(state), "--scenario", "gpu-ready"]) == 0
    try:
        kubeconfig = make_kubeconfig(connect(load_params(params), state_dir=state), tmp_path / "user.yaml")
        capsys.readouterr()
        argv = [
            "run",
            "-p",
            params,
            "--set",
            "simulation.scenario=gpu-ready",
            "--set",
            f"kubeconfig={kubeconfig}",
        ]
        argv += ["--steps", ",".join(steps)] if steps else []
        code = main([*argv, "--state", str(state), "--records", str(tmp_path / "r"), "--no-progress"])
        return code, capsys.readouterr().out
    finally:
        main(["sim", "down", "--state", str(state)])


def test_runbook_run_prints_each_write_a_read_only_user_would_be_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """What the operator reads: the refusals passed (a plan goes on), so the terminal showed only a count in a
    note, and ``--set kubeconfig=`` was ignored on the simulator (walkthrough, 6 Dec 2026). Here a plan-only
    ``runbook run`` with a read-only service account's kubeconfig names each refused write with its fix."""
    from tests.rbac import restricted_kubeconfig

    code, out = _plan_as(tmp_path, monkeypatch, capsys, restricted_kubeconfig, ["preflight", "kubernetes"])
    assert code == 0, out
    assert (
        "\napplying would be refused to this kubeconfig's user (a plan names them and goes on):\n" in out
    ), out
    assert "  preflight: Kubernetes permissions: plan only; applying would be refused: " in out
    assert "create secrets in kube-system" in out  # helm's release record, which no dry run checks
    assert "  kubernetes: RuntimeClass nvidia: would be created; applying would be refused" in out
    assert (
        "    fix: grant it to the kubeconfig's user (a Role or ClusterRole bound to it), or use a kubeconfig"
        in out
    )


def test_a_viewer_who_may_not_read_secrets_plans_the_whole_runbook(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The built-in ``view`` ClusterRole grants no Secrets, and helm keeps its releases in Secrets: a plan with
    such a kubeconfig failed the Kubernetes step at ``helm list -A`` (helm printed the authorizer's ``secrets is
    forbidden: User "…" cannot list resource "secrets"``). It now plans every step, says what it could not read,
    and names the refusal the apply run would meet."""
    from tests.rbac import viewer_kubeconfig

    code, out = _plan_as(tmp_path, monkeypatch, capsys, viewer_kubeconfig, [])
    assert code == 0, out
    assert "  kubernetes: helm releases: not read: helm keeps its releases in Secrets" in out, out
    assert 'cannot list resource "secrets"' in out
    assert "\n  would: helm upgrade --install nvidia-device-plugin nvdp/nvidia-device-plugin" in out, out
    assert "kubernetes: helm release nvidia-device-plugin: would run: helm upgrade --install" not in out, (
        "only refusals are in the report's refusal section"
    )


def test_a_viewer_plans_the_talos_1_13_hand_over_without_reading_helm_s_releases(tmp_path: Path) -> None:
    """The image step's plan to 1.13 removes the device plugin first; a user who may not read helm's Secrets
    failed the plan there ("the Talos 1.13 upgrade notes require the device plugin gone first"). The plan goes on,
    says the releases were not read, still plans the RuntimeClass's deletion, and notes the refusals."""
    from tests.rbac import viewer_kubeconfig
    from tests.simcluster import sim_cluster

    with sim_cluster(tmp_path, scenario="gpu-ready", apply=True) as (params, ctx):
        assert kubernetes_layer(ctx, timeout_s=60).ok  # Talos 1.12: the device plugin and RuntimeClass nvidia
        planner = _same_cluster_on(params, "v1.13.2", tmp_path, apply=False)
        viewer = str(viewer_kubeconfig(ctx, tmp_path / "viewer.yaml"))
        runner = _on_kubeconfig(planner, viewer)
        plan = image_upgrade(runner)
        assert plan.ok, plan.to_dict()
        assert [n.status for n in plan.nodes] == ["planned"] * len(plan.nodes)
        hand_over = [c for c in plan.checks if c.name.startswith("device plugin removed before")]
        assert [c.ok for c in hand_over] == [True, True], hand_over
        assert hand_over[0].message.startswith("the device-plugin releases were not read: "), hand_over[0]
        assert 'cannot list resource "secrets"' in hand_over[0].message
        assert hand_over[1].message.startswith("would run: kubectl delete runtimeclass nvidia; " + REFUSED)
        assert any(
            "1 planned write(s) are refused" in n and "1 read(s) the plan needed were refused" in n
            for n in plan.notes
        ), plan.notes
        # the Kubernetes step's plan of the same hand-over: the RuntimeClass half needs no helm, so it is planned
        # (it was left out, and the old RuntimeClass said to be fine, while the apply run deletes it: review)
        layer = kubernetes_layer(runner)
        assert layer.ok, layer.to_dict()
        assert "delete RuntimeClass nvidia (the GPU Operator creates its own)" in layer.data["changes"]
        said = {c.name: c.message for c in layer.checks}
        assert "nor which device-plugin releases it uninstalls first" in said["helm releases"]
        assert [e.summary for e in runner.journal.changes()] == []


def _on_kubeconfig(ctx, kubeconfig: str):  # type: ignore[no-untyped-def]
    """``ctx`` with the Kubernetes client and helm on ``kubeconfig``."""
    import dataclasses

    from runbook_lib.clients.helm import Helm

    endpoints = dataclasses.replace(ctx.endpoints, kubeconfig=kubeconfig)
    helm = Helm(endpoints.helm, kubeconfig=kubeconfig, runner=ctx.helm.runner)
    return dataclasses.replace(ctx, endpoints=endpoints, _kube=None, helm=helm)
