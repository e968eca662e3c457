"""Preflight asks the API server whether the kubeconfig's user may make the run's writes, before any change.

Without it, a service account that may not evict pods learned so at the first node whose patch reboots it (after
the whole fleet's images were upgraded), and one that may not create the RuntimeClass after every node changed.
On the real control plane (RBAC on, as Talos configures its API server: simkube/components.go), with a real
service account's token, so the answers are the real authorizer's (SelfSubjectAccessReview, ``kubectl auth
can-i``'s question).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from runbook_lib.steps import permissions
from runbook_lib.steps.preflight import preflight
from tests.rbac import as_restricted_user
from tests.realplane import real_cluster

pytestmark = pytest.mark.slow


def test_preflight_names_each_write_the_kubeconfigs_user_may_not_make_before_any_change(tmp_path):
    with real_cluster(tmp_path, default_runtime_patch=True) as (params, ctx):
        admin = permissions.check(ctx)
        assert admin.ok, admin.message
        runner = as_restricted_user(ctx, tmp_path)
        before = len(runner.journal.entries)
        result = preflight(runner)
        check = next(c for c in result.checks if c.name == permissions.CHECK)
        assert not check.ok and not result.ok
        ran = runner.journal.entries[before:]
        lists = [e.argv[1:4] for e in ran if e.kind == "command" and e.argv[1:2] == ("list",)]
        assert lists == [("list", "-n", "kube-system")], "the release was read twice: " + repr(lists)
        assert result.data["done"]["runtimeclass"] is False and result.data["done"]["helm_release"] is None
        for refused in (
            "create pods/eviction in every namespace",
            "patch nodes",
            "create secrets in kube-system",
        ):
            assert refused in check.message, check.message
        assert "create runtimeclasses.node.k8s.io" in check.message
        assert "in default" not in check.message, "the pods it may create were named as refused"
        kubeconfig = runner.endpoints.kubeconfig
        assert f"auth can-i create pods --subresource=eviction -A --kubeconfig {kubeconfig}" in check.fix
        assert (
            "patch nodes, as the run" in check.message and "nodes in every namespace" not in check.message
        ), "a Node has no namespace"
        _each_check_command_answers_no(check.fix)
        every = ["preflight", "config-patch", "image", "verify", "kubernetes", "cuda-test"]
        planned = next(c for c in preflight(runner, steps=every).checks if c.name == permissions.CHECK)
        assert planned.ok and "applying would be refused: " in planned.message, "a plan-only run failed"
        assert "create pods/eviction in every namespace" in planned.message
        assert "daemonsets" not in check.message, "get daemonsets is allowed by the read-everything role"
        assert [e.summary for e in runner.journal.changes()] == []


def _each_check_command_answers_no(fix: str) -> None:
    """Each ``check with:`` command, run as printed (the real kubectl), asks as the run's user and answers
    ``no``: without ``--kubeconfig`` it asked as whoever the user's own kubeconfig names, or nobody."""
    import shlex
    import subprocess
    import tempfile

    commands = fix.split("check with: ", 1)[1].split("; ")
    assert len(commands) >= 3, commands
    home = {"HOME": tempfile.mkdtemp()}  # no ~/.kube/config nor $KUBECONFIG to fall back on
    for command in commands:
        argv = shlex.split(command)
        done = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=60, env=home)
        assert (done.returncode, done.stdout.strip()) == (1, "no"), (command, done.stdout, done.stderr)


def test_a_health_check_run_asks_no_write_permission_of_a_read_only_user(tmp_path):
    """``runbook run --steps preflight,verify`` makes no write: the same read-only user passes its preflight."""
    with real_cluster(tmp_path, default_runtime_patch=True) as (_params, ctx):
        runner = as_restricted_user(ctx, tmp_path)
        result = preflight(runner, steps=["preflight", "verify"])
        check = next(c for c in result.checks if c.name == permissions.CHECK)
        assert check.ok and "no Kubernetes write" in check.message
        assert "kubectl" not in [c.name for c in result.checks], "no drain in this run: kubectl is not needed"
        cuda = permissions.check(runner, ["preflight", "cuda-test"])
        assert cuda.ok, "the role lets it create and delete the test pods: " + cuda.message


@pytest.mark.slow
def test_runbook_run_tells_preflight_which_steps_it_runs(tmp_path):
    """The steps reach preflight in the run's kernel (``RUNBOOK_RUN_STEPS``): a ``--steps preflight,verify`` run's
    preflight record says the run makes no Kubernetes write."""
    import json

    from runbook_lib.cli import main
    from runbook_lib.notebook import records

    params = str(Path(__file__).parents[1] / "params" / "simulated.yaml")
    argv = ["run", "-p", params, "--steps", "preflight,verify", "--records", str(tmp_path / "r")]
    main([*argv, "--state", str(tmp_path / "s"), "--no-progress"])
    record = records.resolve(tmp_path / "r", None)
    checks = json.loads((record / "results" / "preflight.json").read_text())["result"]["checks"]
    [check] = [c for c in checks if c["name"] == permissions.CHECK]
    assert "no Kubernetes write" in check["message"]


def test_a_layers_removal_asks_for_every_kind_of_object_its_release_made(tmp_path):
    """``helm uninstall --wait`` deletes and watches each object of the release's manifest and purges its
    Secrets (helm@v4.1.4 pkg/action/uninstall.go:98,161,179-182,256-289). The objects come from the real helm's
    ``helm get manifest`` of a release the Kubernetes step installed, their resources from the real API server's
    discovery; the read-everything user may list and watch them but not delete them."""
    from runbook_lib.steps.gpu_operator_handover import Leftovers
    from runbook_lib.steps.kubernetes import kubernetes_layer

    with real_cluster(tmp_path, scenario="gpu-ready", apply=True) as (params, ctx):
        assert kubernetes_layer(ctx, timeout_s=180).ok
        release = (ctx.plan.helm.release, ctx.plan.helm.namespace)
        found = Leftovers((release,), runtime_class=True)
        asked = {f"{n.what()} {n.namespace or '*'}" for n in permissions.removal(ctx, found, "removes it")}
        ns = ctx.plan.helm.namespace
        assert {f"delete daemonsets.apps {ns}", f"watch daemonsets.apps {ns}", f"get secrets {ns}"} <= asked
        assert "delete runtimeclasses.node.k8s.io *" in asked
        runner = as_restricted_user(ctx, tmp_path)
        verdict = permissions.verdict(
            runner, permissions.removal(runner, found, "removes it"), advisory=False
        )
        assert not verdict.ok and f"delete daemonsets.apps in {ns}" in verdict.message
        assert f"watch daemonsets.apps in {ns}" not in verdict.message, "the read-everything role may watch"


def test_a_re_run_on_a_cluster_already_done_asks_no_helm_write_and_runs_without_one(tmp_path):
    """The release deployed with the pinned chart and the runbook's values: the Kubernetes step runs no helm
    (``kubernetes.already_deployed``), so its release-record writes are not asked of a least-privileged
    identity, and that identity's Kubernetes step passes, making no write. Before, preflight refused it "create
    secrets in kube-system" for a run that writes none. Another chart version is asked again (v1.12.7 installs
    0.18.0 by default)."""
    from runbook_lib.steps.kubernetes import kubernetes_layer
    from tests.test_helm_existing_release import _with

    with real_cluster(tmp_path, scenario="gpu-ready", apply=True) as (params, ctx):
        assert kubernetes_layer(ctx, timeout_s=120).ok
        runner = as_restricted_user(ctx, tmp_path)
        steps = ["preflight", "kubernetes", "cuda-test"]
        changes = len(runner.journal.changes())  # the journal is the admin's too: its install

        check = permissions.check(runner, steps)
        assert check.ok, check.message
        again = kubernetes_layer(runner, timeout_s=120)
        assert again.ok, [c for c in again.checks if not c.ok]
        assert [e.summary for e in runner.journal.changes()[changes:]] == []

        newer = as_restricted_user(
            _with(params, tmp_path, device_plugin={"chart_version": "0.17.2"}), tmp_path
        )
        upgrade = permissions.check(newer, steps)
        assert not upgrade.ok and "create secrets in kube-system" in upgrade.message, upgrade.message


def test_on_the_gpu_operator_layer_preflight_lists_the_releases_once(tmp_path):
    """The hand-over's ``helm list -A`` (gpu_operator_handover) holds the planned release too; before, preflight
    started a second helm for it (``helm list -n``) and read RuntimeClass ``nvidia`` again for its progress."""
    with real_cluster(tmp_path, scenario="gpu-ready", talos_version="v1.13.2", apply=True) as (params, ctx):
        assert ctx.plan.kubernetes_layer == "gpu-operator"
        before = len(ctx.journal.entries)
        result = preflight(ctx)
        ran = ctx.journal.entries[before:]
        lists = [e.argv[1:3] for e in ran if e.kind == "command" and e.argv[1:2] == ("list",)]
        assert lists == [("list", "-A")], "the releases were listed twice: " + repr(lists)
        assert result.data["done"]["runtimeclass"] is False and result.data["done"]["helm_release"] is None


def test_preflight_names_the_nodes_still_to_do_when_the_rollout_is_uneven() -> None:
    """README audit (stop 50): after an interrupt, the go-on line says to see where the nodes are with a
    preflight, which printed only "3 ok"; which node was left was only in its result file."""
    from runbook_lib.steps.preflight import _uneven_progress
    from runbook_lib.steps.results import NodeResult

    def node(name: str, config: bool, image: bool) -> NodeResult:
        res = NodeResult(node=name, address="10.0.0.1")
        res.data.update(config_done=config, image_done=image)
        return res

    uneven = [node("gpu-1", True, True), node("gpu-2", True, False), node("gpu-3", False, False)]
    assert _uneven_progress(uneven) == [
        "config-patch still to do on 1 of 3 node(s): gpu-3",
        "image still to do on 2 of 3 node(s): gpu-2, gpu-3",
    ]
    assert _uneven_progress([node("gpu-1", False, False), node("gpu-2", False, False)]) == [], "a fresh fleet"
    assert _uneven_progress([node("gpu-1", True, True)]) == [], "all done"
