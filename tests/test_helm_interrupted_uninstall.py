"""A ``helm uninstall`` stopped midway (Ctrl-C, a kill, a runner's timeout) leaves the release ``uninstalling``.

helm records the release ``uninstalling`` before it deletes its objects and waits for them to go, and removes the
record only at the end (helm@v4.1.4 pkg/action/uninstall.go:125-150, 176-186). Killed in between, the record
stays. Then:

- ``helm upgrade --install`` does not install it again: the release has history, so helm upgrades, and an
  upgrade finds no deployed revision and a last one that is neither failed nor superseded ("has no deployed
  releases", pkg/cmd/upgrade.go:122-127, pkg/action/upgrade.go:250-263);
- ``helm list`` with the statuses the library asked for (deployed, failed, pending) did not show it, so rollback
  found nothing to remove and the kubernetes step took the release as absent and met helm's raw error.

All with the real helm 4.1.4 on the real control plane (``tests/realplane.py``). The uninstall is held in its
wait the way a real one is held: an object of the release that does not go away (a finalizer on its DaemonSet).
"""

from __future__ import annotations

import json
import subprocess
import time
from typing import Any

import pytest

from runbook_lib.model.rollback import evidence_from_records
from runbook_lib.steps.context import connect
from runbook_lib.steps.kubernetes import kubernetes_layer
from runbook_lib.steps.preflight import preflight
from runbook_lib.steps.rollback import rollback
from tests.realplane import real_cluster
from tests.test_rollback import _record

pytestmark = pytest.mark.slow

RELEASE, NAMESPACE = "nvidia-device-plugin", "kube-system"
HOLD = "talos-gpu-runbooks.test/hold"


def _listed(ctx: Any) -> list[tuple[str, str]]:
    """(name, status) of every release in the namespace, whatever its status: helm 4 lists them all when no
    status is asked for (helm@v4.1.4 pkg/action/list.go:328-331; it has no ``--all`` any more)."""
    run = ctx.helm.run(["list", "-n", NAMESPACE, "-o", "json"], timeout=60)
    assert run.ok, run.stderr
    return [(r["name"], r["status"]) for r in json.loads(run.stdout or "[]")]


def _hold_daemonset(ctx: Any, hold: bool) -> None:
    """A finalizer on the release's DaemonSet, or none: a JSON patch, as a strategic merge patch merges the
    ``finalizers`` list (ObjectMeta's ``patchStrategy:"merge"``) and cannot empty it."""
    value = [HOLD] if hold else []
    op = [{"op": "add", "path": "/metadata/finalizers", "value": value}]
    ctx.kube.apps.patch_namespaced_daemon_set(RELEASE, NAMESPACE, op)


def _killed_mid_uninstall(ctx: Any) -> None:
    """The release's uninstall killed while it waits for the DaemonSet to go; the DaemonSet then goes."""
    _hold_daemonset(ctx, True)
    argv = ctx.helm.argv(["uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--timeout", "120s"])
    helm = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while (RELEASE, "uninstalling") not in _listed(ctx) or not (
            ctx.kube.apps.read_namespaced_daemon_set(RELEASE, NAMESPACE).metadata.deletion_timestamp
        ):
            assert time.monotonic() < deadline and helm.poll() is None, _listed(ctx)
            time.sleep(0.3)
    finally:
        helm.kill()
        helm.wait()
    _hold_daemonset(ctx, False)
    deadline = time.monotonic() + 60
    while ctx.kube.daemonset(NAMESPACE, RELEASE) is not None:
        assert time.monotonic() < deadline, "the DaemonSet stayed after its finalizer went"
        time.sleep(0.3)


def test_the_kubernetes_step_stops_before_any_change_at_a_release_left_uninstalling(tmp_path):
    with real_cluster(tmp_path, scenario="gpu-ready", apply=True) as (params, ctx):
        assert kubernetes_layer(ctx, timeout_s=120).ok
        _killed_mid_uninstall(ctx)
        changes_before = len(ctx.journal.changes())

        result = kubernetes_layer(ctx, timeout_s=60)

        (check,) = [c for c in result.checks if not c.ok]
        assert f"release {RELEASE} in {NAMESPACE} is uninstalling" in check.message, check
        assert "nothing was changed" in check.message, check
        assert f"helm uninstall {RELEASE} -n {NAMESPACE}" in check.fix, check
        assert len(ctx.journal.changes()) == changes_before
        assert _listed(ctx) == [(RELEASE, "uninstalling")]

        # preflight says so before a run's image and config-patch steps change the nodes, when it runs the step
        (refused,) = [c for c in preflight(ctx).checks if c.name == f"helm release {RELEASE}"]
        assert not refused.ok and "is uninstalling" in refused.message and refused.fix == check.fix, refused
        gate = preflight(ctx, steps=["preflight"])  # preflight alone is the whole runbook's readiness gate
        assert [c.ok for c in gate.checks if c.name == f"helm release {RELEASE}"] == [False], gate.checks
        health = preflight(ctx, steps=["preflight", "verify"])
        assert not [c for c in health.checks if c.name == f"helm release {RELEASE}"], health.checks


def test_rollback_finishes_a_removal_a_killed_helm_left_uninstalling(tmp_path):
    """The rollback of the run that installed the release, after a first rollback's helm was killed."""
    with real_cluster(tmp_path, scenario="gpu-ready", apply=True) as (params, ctx):
        installed = kubernetes_layer(ctx, timeout_s=120)
        assert installed.ok
        record = _record("run-1", ("kubernetes", ctx, installed))
        record[1]["params"] = params.public_dict()
        _killed_mid_uninstall(ctx)

        back = connect(params, state_dir=tmp_path)
        result = rollback(back, evidence=evidence_from_records([record]), poll_interval=0.1)

        assert result.ok, [c for c in result.checks if not c.ok]
        wait = f"--wait --timeout {params.timeouts.kubernetes_seconds}s"
        own = f"{back.endpoints.helm} --kubeconfig {back.endpoints.kubeconfig}"  # the run's own, pasteable
        assert f"{own} uninstall {RELEASE} -n {NAMESPACE} {wait}" in result.data["kubernetes"], result.data
        assert _listed(ctx) == []
