"""One GPU node whose device-plugin pod cannot start, among healthy ones: the Kubernetes step judges each node.

The step ran ``helm upgrade --install --wait``. On helm 4 a bare ``--wait`` uses kstatus, which counts a DaemonSet
ready only when every scheduled pod is (helm 3 allowed ``maxUnavailable``): one such node made helm time out and
mark the release failed, the step waited a second timeout for the GPUs, and every later run upgraded the release
again because it was not ``deployed``. On an upgrade the DaemonSet's rolling update stops at that node (kubernetes
v1.35.0 pkg/controller/daemon/update.go:44-119, maxUnavailable 1), so the other nodes keep the previous plugin and
their GPUs: advertised GPUs alone would have passed them.

All on the real control plane with the real helm and the real DaemonSet controller (``tests/realplane.py``); the
simulated part is the node whose kubelet cannot pull the image (``image_pull_error``, the kubelet's ErrImagePull)
or that takes no pods (``pods_pending``, kube-scheduler's ``Too many pods``).
"""

from __future__ import annotations

import shlex
import subprocess
import time

import pytest
from kubernetes import client

from runbook_lib.sim import faults
from runbook_lib.steps.kubernetes import kubernetes_layer
from tests.realplane import real_cluster
from tests.test_helm_existing_release import _installed, _with

pytestmark = pytest.mark.slow

RELEASE, NAMESPACE = "nvidia-device-plugin", "kube-system"


def _helm_changes(result):
    return [c for c in result.data["changes"] if c.startswith("helm ")]


def test_a_first_install_with_one_node_taking_no_pods_fails_that_node_alone_and_the_release_is_deployed(
    tmp_path,
):
    with real_cluster(tmp_path, scenario="gpu-ready", workers=3, apply=True) as (params, ctx):
        bad, *good = params.nodes
        faults.inject(tmp_path, bad.name, "pods_pending", True)
        result = kubernetes_layer(ctx, timeout_s=30)

        assert ctx.helm.release(RELEASE, NAMESPACE).status == "deployed"
        (helm_check,) = [c for c in result.checks if c.name == f"helm release {RELEASE}"]
        assert helm_check.ok, helm_check
        assert result.node(bad.name).status == "failed"
        assert "Too many pods" in str(result.node(bad.name).to_dict()), result.node(bad.name).to_dict()
        assert [result.node(n.name).status for n in good] == ["ok"] * len(good), result.to_dict()
        assert {"kind": "helm-release", "name": RELEASE, "namespace": NAMESPACE} in result.data["created"]

        again = kubernetes_layer(ctx, timeout_s=5)
        assert _helm_changes(again) == [], again.data  # a deployed release with its values: nothing to redo
        assert again.node(bad.name).status == "failed"


def test_an_upgrade_that_stops_at_one_node_fails_the_nodes_still_on_the_previous_plugin(tmp_path):
    # Two of three nodes cannot pull the new plugin's image. The DaemonSet controller picks the next old pod to
    # replace in Go map order (kubernetes v1.35.0 pkg/controller/daemon/update.go:72, `range nodeToDaemonPods`),
    # so which node it reaches first is random; with maxUnavailable 1 it stops at the first bad node it reaches,
    # and the other bad node is then certain to still run the previous plugin. (With one bad node the good ones
    # may all be replaced before it: nothing would be held, which made this test fail at random.)
    with _installed(tmp_path, "0.17.2", workers=3) as (params, ctx):
        bad = params.nodes[:2]
        for node in bad:
            faults.inject(tmp_path, node.name, "image_pull_error", "v0.18.0")  # the new plugin's image only
        newer = _with(params, tmp_path, device_plugin={"chart_version": "0.18.0"})
        # long enough for the DaemonSet controller to reach a bad node on a busy machine: the step waits its
        # whole timeout anyway, since the rollout never ends
        result = kubernetes_layer(newer, timeout_s=60)

        assert not result.ok
        assert ctx.helm.release(RELEASE, NAMESPACE).status == "deployed"
        results = {n.name: result.node(n.name) for n in params.nodes}
        stuck = [name for name in results if "ImagePull" in str(results[name].to_dict())]
        assert len(stuck) == 1 and stuck[0] in {n.name for n in bad}, {
            k: r.to_dict() for k, r in results.items()
        }
        assert results[stuck[0]].status == "failed"
        assert results[stuck[0]].message.endswith("after 60 s"), results[stuck[0]].message  # the step's wait
        (held,) = [n.name for n in bad if n.name != stuck[0]]
        assert results[held].status == "failed", results[held].to_dict()
        assert "still runs the previous device plugin" in results[held].message, results[held].message
        assert f"waits on {stuck[0]}" in results[held].message, results[held].message
        good = results[params.nodes[2].name]
        # the rolling update either reached it (ok) or it waits on the stuck node too
        assert good.status == "ok" or f"waits on {stuck[0]}" in good.message, good.to_dict()


def _deny_daemonset(ctx, name):
    """A site's admission policy refusing the plugin's DaemonSet (a ValidatingAdmissionPolicy, GA since
    Kubernetes 1.30), and a wait until the API server enforces it (it loads policies asynchronously)."""
    admission = client.AdmissionregistrationV1Api(ctx.kube.api)
    admission.create_validating_admission_policy(
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": "no-gpu-daemonsets"},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [
                        {
                            "apiGroups": ["apps"],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE"],
                            "resources": ["daemonsets"],
                        }
                    ]
                },
                "validations": [
                    {"expression": f"object.metadata.name != '{name}'", "message": "needs the platform team"}
                ],
            },
        }
    )
    admission.create_validating_admission_policy_binding(
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": "no-gpu-daemonsets"},
            "spec": {"policyName": "no-gpu-daemonsets", "validationActions": ["Deny"]},
        }
    )
    probe = {
        "metadata": {"name": name},
        "spec": {
            "selector": {"matchLabels": {"a": "b"}},
            "template": {
                "metadata": {"labels": {"a": "b"}},
                "spec": {"containers": [{"name": "c", "image": "x"}]},
            },
        },
    }
    for _ in range(60):
        try:
            ctx.kube.apps.create_namespaced_daemon_set(NAMESPACE, probe, dry_run="All")
        except client.ApiException as exc:
            if exc.status in (400, 403, 422) and "needs the platform team" in str(exc.body):
                return
            raise
        time.sleep(1)
    raise AssertionError("the admission policy was never enforced")


def test_a_first_install_helm_fails_is_still_recorded_as_created_for_rollback(tmp_path):
    """A failed first install leaves the release, status failed (helm@v4.1.4 pkg/action/install.go:576-592; no
    --atomic): the record lists it as created so rollback removes it. Here a site's admission policy refuses the
    plugin's DaemonSet, as the API server's ValidatingAdmissionPolicy does."""
    with real_cluster(tmp_path, scenario="gpu-ready", apply=True) as (params, ctx):
        _deny_daemonset(ctx, RELEASE)
        result = kubernetes_layer(ctx, timeout_s=10)

        assert not result.ok
        (helm_check,) = [c for c in result.checks if c.name == f"helm release {RELEASE}"]
        assert not helm_check.ok and "needs the platform team" in helm_check.message, helm_check
        assert ctx.helm.release(RELEASE, NAMESPACE).status == "failed"
        assert {"kind": "helm-release", "name": RELEASE, "namespace": NAMESPACE} in result.data["created"]
        assert any("failed, and left the release" in c for c in result.data["changes"]), result.data
        # helm failed, so no device plugin will come: the step does not wait for one, and does not blame the
        # nodes' labels for a DaemonSet helm never made (operator walkthrough, 6 Dec 2026: 300 s, then
        # `kubectl label node …` on nodes already labelled)
        assert any(
            n.startswith("not waited for the device plugin nor the GPUs: helm failed") for n in result.notes
        )
        assert result.nodes == [] and "kubectl label" not in str(result.to_dict())
        # the site lifts its policy: the next plan says the release it would upgrade is a failed one, where it
        # said only "keeping the release's other values", as if the install had worked (stop 52's open item)
        admission = client.AdmissionregistrationV1Api(ctx.kube.api)
        admission.delete_validating_admission_policy_binding("no-gpu-daemonsets")
        admission.delete_validating_admission_policy("no-gpu-daemonsets")
        for _ in range(30):  # until the API server's policy cache has dropped it
            plan = kubernetes_layer(_with(params, tmp_path, apply=False), timeout_s=10)
            if "needs the platform team" not in str(plan.to_dict()):
                break
            time.sleep(1)
        assert any(
            f"(release {RELEASE} is failed: the helm before this one did not finish" in c
            for c in plan.data["changes"]
        ), plan.to_dict()


def test_a_dead_gpu_node_does_not_make_the_step_wait_its_whole_timeout(tmp_path):
    """A first install. A review (stop 38) expected a NotReady GPU node to hold the plugin's rollout, and so the
    step, for its whole timeout on every run. It does not, and this test keeps it so: the node lifecycle controller
    taints a NotReady
    node ``node.kubernetes.io/not-ready:NoSchedule``, which DaemonSet pods do not tolerate (only its NoExecute
    form: kubernetes v1.35.0 pkg/controller/daemon/util/daemonset_util.go:47-100), so the DaemonSet controller
    no longer counts the node as one that should run its pod (daemon_controller.go:1298-1315
    ``NodeShouldRunDaemonPod``) and the rollout is done without it. The dead node fails alone, from the GPU
    check. The journal (kept in the record) shows the wait and whether it was reached. (On an upgrade the node
    does hold it: the rolling update deletes its old pod, which its kubelet never finishes, and counts it
    unavailable, update.go:82-94; tests/test_plugin_rollout.py covers how that node is then judged.)"""
    with real_cluster(tmp_path, scenario="gpu-ready", workers=3, apply=True) as (params, ctx):
        dead, *good = params.nodes
        faults.inject(tmp_path, dead.name, "node_not_ready", True)
        _until_not_ready(ctx, dead.name)
        result = kubernetes_layer(ctx, timeout_s=120)

        assert result.node(dead.name).status == "failed"
        assert "node Ready" in str(result.node(dead.name).to_dict()), result.node(dead.name).to_dict()
        assert [result.node(n.name).status for n in good] == ["ok"] * len(good), result.to_dict()
        (wait,) = [
            e.summary for e in ctx.journal.entries if "list_namespaced_daemon_set" in (e.summary or "")
        ]
        assert "not reached" not in wait, wait


def _until_not_ready(ctx, name, timeout=60.0):
    """The node lifecycle shows the fault: the Node's Ready condition is no longer True."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        node = ctx.kube.core.read_node(name).to_dict()
        ready = [c for c in node["status"]["conditions"] or [] if c["type"] == "Ready"]
        if ready and ready[0]["status"] != "True":
            return
        time.sleep(1)
    raise AssertionError(f"{name} stayed Ready for {timeout} s")


def test_an_upgrade_held_by_a_dead_node_ends_early_with_the_command_that_moves_it_on(tmp_path):
    """A GPU node that is down during a chart upgrade. The DaemonSet controller deletes its old, unavailable pod,
    only its kubelet can finish that deletion, and while the pod is being deleted the node counts unavailable, so
    the rolling update replaces no other pod (kubernetes v1.35.0 pkg/controller/daemon/update.go:70-88,
    findUpdatedPodsOnNode :266-288 skips a pod being deleted). The step waited its whole timeout for a rollout that
    cannot end, and a re-run passed the dead node on the GPUs its Node still lists (the node lifecycle controller
    changes only its conditions). Now the wait ends once the node has been down a minute, the step says what holds
    the update and the forced delete that moves it on; that command, run with the real kubectl, lets the update
    finish on the other nodes, and the dead node fails on every run."""
    with _installed(tmp_path, "0.17.2", workers=3) as (params, ctx):
        dead, *good = params.nodes
        faults.inject(tmp_path, dead.name, "node_not_ready", True)
        _until_not_ready(ctx, dead.name)
        newer = _with(params, tmp_path, device_plugin={"chart_version": "0.18.0"})

        started = time.monotonic()
        result = kubernetes_layer(newer, timeout_s=400)
        took = time.monotonic() - started

        assert took < 250, took  # the whole timeout before: the update never ends
        assert result.node(dead.name).status == "failed"
        assert "node Ready" in str(result.node(dead.name).to_dict()), result.node(dead.name).to_dict()
        (held,) = [c for c in result.checks if c.name == f"DaemonSet {RELEASE} rolled out"]
        assert not held.ok and f"stopped at {dead.name}, not Ready" in held.message, held
        (wait,) = [
            e.summary for e in newer.journal.entries if "list_namespaced_daemon_set" in (e.summary or "")
        ]
        assert f"waits on {dead.name}, not Ready" in wait, wait

        command = held.fix.split("(", 1)[1].split(")", 1)[0]
        assert command.startswith("kubectl delete pod") and command.endswith("--force --grace-period=0"), held
        kubectl, kubeconfig = tmp_path / "bin" / "kubectl", tmp_path / "kubeconfig"  # the real kubectl 1.35.2
        assert kubectl.exists(), list((tmp_path / "bin").iterdir())
        argv = [str(kubectl), *shlex.split(command)[1:], "--kubeconfig", str(kubeconfig)]
        forced = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        assert forced.returncode == 0, forced.stderr

        again = kubernetes_layer(newer, timeout_s=240)
        assert [again.node(n.name).status for n in good] == ["ok"] * len(good), again.to_dict()
        assert again.node(dead.name).status == "failed"
        assert "not Ready" in again.node(dead.name).message, again.node(dead.name).to_dict()
        assert not [c for c in again.checks if c.name == f"DaemonSet {RELEASE} rolled out"], again.checks


def test_a_device_plugin_image_the_registry_does_not_have_is_not_waited_for_the_whole_timeout(tmp_path):
    """A node whose device-plugin pod cannot pull its image because the registry does not have it (the CRI's
    ``code = NotFound``: a typo'd tag or repository) made the step wait its whole timeout, five minutes of
    silence for a pull no retry can make (operator walkthrough, stop 53). Once the rollout has not moved for
    ``DOWN_GRACE_S`` and every node it waits on is such a node, the waits stop; that node fails naming the pull,
    the others pass. A 429 or a network error is not given up on (``plugin_rollout.unpullable``)."""
    from runbook_lib.steps.kube_diagnosis import DOWN_GRACE_S

    with real_cluster(tmp_path, scenario="gpu-ready", workers=2, apply=True) as (params, ctx):
        bad, good = params.nodes
        faults.inject(tmp_path, bad.name, "image_pull_error", True)
        started = time.monotonic()
        result = kubernetes_layer(ctx, timeout_s=600)
        took = time.monotonic() - started

        assert took < 600 - 60, f"waited {took:.0f} s of its 600 s for an image that does not exist"
        assert took >= DOWN_GRACE_S, took
        assert result.node(good.name).status == "ok", result.node(good.name).to_dict()
        failed = result.node(bad.name)
        assert failed.status == "failed"
        assert failed.message == (
            "no allocatable nvidia.com/gpu: its device plugin pod cannot pull its image, which the registry does "
            "not have, so the step stopped waiting for it (a registry mirror that has not synced the image yet says "
            "the same: re-run the step once it has)"
        ), failed.message
        assert "code = NotFound" in str(failed.to_dict()), failed.to_dict()
