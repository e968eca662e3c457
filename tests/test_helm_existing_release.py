"""The Kubernetes step meets a chart a site already runs: its values, a newer version, another release name.

All on the real control plane with the real helm 4.1.4 (``tests/realplane.py``); what a site did before the runbook
is done here with the same real helm commands NVIDIA's instructions give. Each case failed on the code before
this file: the step's ``helm upgrade`` passed only its own ``--set``, which makes helm start from the new chart's
defaults and drop every other value (helm@v4.1.4 pkg/action/upgrade.go:604-642, ``reuseValues``); it upgraded to
``chart_version`` whatever was installed, also a newer chart; and it looked for its release under its own name
only, so a release NVIDIA's README installs (``helm upgrade -i nvdp nvdp/nvidia-device-plugin --namespace
nvidia-device-plugin --create-namespace``, NVIDIA/k8s-device-plugin@v0.18.0 README.md) got a second one beside it.
"""

from __future__ import annotations

import json
import time
from contextlib import contextmanager

import pytest
from kubernetes import client

from runbook_lib.model.params import validate
from runbook_lib.steps.context import connect
from runbook_lib.steps.kubernetes import allocatable_gpus, kubernetes_layer
from tests.helm_releases import gpu_operator
from tests.realplane import real_cluster

pytestmark = pytest.mark.slow

GPUS_WITHIN = 180  # as tests/test_step_kubernetes.py: returns as soon as the GPUs are advertised


def _with(params, state_dir, *, apply=True, **more):
    """The same simulated cluster seen with other parameters, as a user edits them between two runs."""
    data = {
        "cluster": params.cluster,
        "target": "simulated",
        "talos_version": params.talos_version,
        "apply": apply,
        "nodes": [{"name": n.name, "address": n.address} for n in params.nodes],
        **more,
    }
    return connect(validate(data, source="test"), state_dir=state_dir)


def _helm(ctx, *args):
    """A site's own helm command, through the real helm and the cluster's kubeconfig."""
    result = ctx.helm.run(list(args), timeout=300)
    assert result.ok, result.stderr
    return result


def _releases_of(ctx, chart):
    out = _helm(ctx, "list", "-A", "-o", "json").stdout
    return sorted(
        (r["name"], r["namespace"], r["chart"]) for r in json.loads(out) if r["chart"].startswith(chart)
    )


def _site_sets_priority_class(ctx, version):
    """The site's own change to the runbook's release: the chart's priorityClassName value (k8s-device-plugin@v0.18.0
    values.yaml), set with helm as a site does."""
    _helm(
        ctx,
        *["upgrade", "nvidia-device-plugin", "nvdp/nvidia-device-plugin", "-n", "kube-system"],
        *["--version", version, "--reuse-values", "--set", "priorityClassName=system-node-critical"],
    )


def _priority_class(ctx, name, namespace):
    daemonset = ctx.kube.apps.read_namespaced_daemon_set(name, namespace)
    return daemonset.spec.template.spec.priority_class_name


@contextmanager
def _installed(tmp_path, chart_version, workers=2):
    """A GPU-ready cluster on which the runbook installed the device-plugin chart ``chart_version``."""
    with real_cluster(
        tmp_path,
        scenario="gpu-ready",
        workers=workers,
        apply=True,
        device_plugin={"chart_version": chart_version},
    ) as (params, ctx):
        assert kubernetes_layer(ctx, timeout_s=GPUS_WITHIN).ok
        yield params, ctx


def test_an_upgrade_of_the_chart_keeps_the_values_the_site_gave_the_release(tmp_path):
    with _installed(tmp_path, "0.17.2") as (params, ctx):
        _site_sets_priority_class(ctx, "0.17.2")
        assert _priority_class(ctx, "nvidia-device-plugin", "kube-system") == "system-node-critical"

        newer = _with(params, tmp_path, device_plugin={"chart_version": "0.18.0"})
        result = kubernetes_layer(newer, timeout_s=GPUS_WITHIN)

        assert result.ok, result.to_dict()
        assert _releases_of(ctx, "nvidia-device-plugin") == [
            ("nvidia-device-plugin", "kube-system", "nvidia-device-plugin-0.18.0")
        ]
        values = ctx.helm.values("nvidia-device-plugin", "kube-system")
        assert values.get("priorityClassName") == "system-node-critical", values
        assert values.get("runtimeClassName") == "nvidia"
        assert _priority_class(ctx, "nvidia-device-plugin", "kube-system") == "system-node-critical"
        assert any("keeping the release's other values" in c for c in result.data["changes"]), result.data


def test_a_newer_chart_than_planned_is_not_downgraded_and_nothing_changes(tmp_path):
    with _installed(tmp_path, "0.18.0") as (params, ctx):
        before = ctx.helm.release("nvidia-device-plugin", "kube-system")
        changes_before = len(ctx.journal.changes())

        for apply in (False, True):
            older = _with(params, tmp_path, apply=apply, device_plugin={"chart_version": "0.17.2"})
            result = kubernetes_layer(older, timeout_s=5)
            assert not result.ok
            [check] = [c for c in result.checks if not c.ok]
            assert "runs chart 0.18.0, newer than device_plugin.chart_version 0.17.2" in check.message, check
            assert "device_plugin.chart_version: 0.18.0" in check.fix, check
            assert not result.data.get("changes")

        after = ctx.helm.release("nvidia-device-plugin", "kube-system")
        assert (
            (after.chart, after.revision)
            == (before.chart, before.revision)
            == ("nvidia-device-plugin-0.18.0", 1)
        )
        assert len(ctx.journal.changes()) == changes_before


def test_the_device_plugin_as_nvidias_readme_installs_it_is_refused_then_upgraded_in_place_once_named(
    tmp_path,
):
    with real_cluster(tmp_path, scenario="gpu-ready", apply=True) as (params, ctx):
        ctx.helm.repo_add("nvdp", ctx.plan.helm.repo_url)
        _helm(
            ctx,
            "upgrade",
            "-i",
            "nvdp",
            "nvdp/nvidia-device-plugin",
            "--namespace",
            "nvidia-device-plugin",
            "--create-namespace",
            "--version",
            "0.18.0",
            "--set",
            "runtimeClassName=nvidia",
        )

        refused = kubernetes_layer(ctx, timeout_s=5)

        assert not refused.ok
        [check] = [c for c in refused.checks if not c.ok]
        assert "already installed as release nvdp in namespace nvidia-device-plugin" in check.message, check
        assert "device_plugin.release: nvdp and device_plugin.namespace: nvidia-device-plugin" in check.fix
        assert ctx.kube.runtime_class("nvidia") is None  # refused before anything changed
        assert ctx.journal.changes() == []
        assert _releases_of(ctx, "nvidia-device-plugin") == [
            ("nvdp", "nvidia-device-plugin", "nvidia-device-plugin-0.18.0")
        ]

        named = _with(
            params, tmp_path, device_plugin={"release": "nvdp", "namespace": "nvidia-device-plugin"}
        )
        result = kubernetes_layer(named, timeout_s=GPUS_WITHIN)

        assert result.ok, result.to_dict()
        assert _releases_of(ctx, "nvidia-device-plugin") == [
            ("nvdp", "nvidia-device-plugin", "nvidia-device-plugin-0.18.0")
        ]
        labels = ctx.kube.namespace("nvidia-device-plugin")["metadata"]["labels"]
        assert labels["pod-security.kubernetes.io/enforce"] == "privileged"
        gpu_names = {n.name for n in params.nodes}
        assert all(allocatable_gpus(n) == 1 for n in ctx.kube.nodes() if n["metadata"]["name"] in gpu_names)
        # the chart's DaemonSet name for release nvdp (_helpers.tpl nvidia-device-plugin.fullname)
        assert ctx.kube.apps.read_namespaced_daemon_set("nvdp-nvidia-device-plugin", "nvidia-device-plugin")


def test_a_gpu_operator_installed_with_a_generated_name_is_refused_before_the_device_plugin_is_retired(
    tmp_path,
):
    """NVIDIA's quickstart installs the operator as ``helm install --wait --generate-name -n gpu-operator
    --create-namespace nvidia/gpu-operator`` (https://nvidia.github.io/gpu-operator): a release named
    ``gpu-operator-<seconds>``. The refusal comes before the Talos 1.13 hand-over removes the device plugin."""
    with real_cluster(tmp_path, scenario="gpu-ready", talos_version="v1.13.2", apply=True) as (params, ctx):
        # the device plugin a 1.12 cluster ran, as the Talos docs install it (talos-nvidia.md §4)
        ctx.helm.repo_add(
            "nvdp", _with(params, tmp_path, kubernetes_layer="device-plugin").plan.helm.repo_url
        )
        _helm(
            ctx,
            "install",
            "nvidia-device-plugin",
            "nvdp/nvidia-device-plugin",
            "-n",
            "kube-system",
            "--version",
            "0.18.0",
            "--set",
            "runtimeClassName=nvidia",
        )
        ctx.helm.repo_add("nvidia", ctx.plan.helm.repo_url)
        _helm(
            ctx,
            "install",
            "--generate-name",
            "-n",
            "gpu-operator",
            "--create-namespace",
            "nvidia/gpu-operator",
            "--version",
            "v26.3.3",
        )
        [(generated, _, _)] = _releases_of(ctx, "gpu-operator")
        assert generated.startswith("gpu-operator-")

        result = kubernetes_layer(ctx, timeout_s=5)

        assert not result.ok
        [check] = [c for c in result.checks if not c.ok]
        assert f"already installed as release {generated} in namespace gpu-operator" in check.message, check
        assert f"gpu_operator.release: {generated}" in check.fix
        assert _releases_of(ctx, "nvidia-device-plugin"), "the device plugin was retired before the refusal"
        assert ctx.helm.release("gpu-operator", "gpu-operator") is None


def test_a_release_uninstalled_with_its_history_kept_is_not_taken_for_a_second_one(tmp_path):
    """helm 4 lists releases of every status by default, ``uninstalled`` ones too (``helm uninstall --keep-history``:
    helm@v4.1.4 pkg/action/list.go:328-331; helm 3 listed deployed and failed only): the step asks for deployed,
    failed and pending releases, as both do with those flags, so a removed ``nvdp`` is not "the chart twice"."""
    with real_cluster(tmp_path, scenario="gpu-ready", apply=True) as (params, ctx):
        ctx.helm.repo_add("nvdp", ctx.plan.helm.repo_url)
        _helm(ctx, "install", "nvdp", "nvdp/nvidia-device-plugin", "-n", "kube-system", "--version", "0.18.0")
        _helm(ctx, "uninstall", "nvdp", "-n", "kube-system", "--keep-history")

        result = kubernetes_layer(ctx, timeout_s=GPUS_WITHIN)

        assert result.ok, result.to_dict()
        assert ctx.helm.release("nvidia-device-plugin", "kube-system") is not None


def test_the_release_is_found_among_more_than_256_releases(tmp_path, tmp_path_factory):
    """``helm list`` keeps the first 256 releases by name unless ``--max 0`` (helm@v4.1.4 pkg/cmd/list.go:133,
    pkg/action/list.go:216-222): with 257 releases named before it, the installed ``nvidia-device-plugin`` was not
    found, so the step upgraded it without the site's values and recorded it as created, for rollback to remove.
    The 257 are of an empty chart of our own, installed by the real helm."""
    chart = tmp_path_factory.mktemp("chart") / "empty"
    chart.mkdir()
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: empty\nversion: 0.1.0\n")
    with _installed(tmp_path, "0.18.0") as (params, ctx):
        for number in range(257):
            _helm(ctx, "install", f"a{number:03d}", str(chart), "-n", "busy", "--create-namespace")
        _site_sets_priority_class(ctx, "0.18.0")

        result = kubernetes_layer(
            _with(params, tmp_path, device_plugin={"chart_version": "0.18.0"}), timeout_s=5
        )

        assert result.data.get("created") == [], result.data  # found: not recorded as this run's
        values = ctx.helm.values("nvidia-device-plugin", "kube-system")
        assert values.get("priorityClassName") == "system-node-critical", values


def test_a_version_range_that_picks_an_older_chart_is_refused_as_a_downgrade(tmp_path):
    """``chart_version`` may be a range (``~0.17``): ``helm upgrade --version`` installs the highest chart of the
    repository's index that the range allows (helm@v4.1.4 pkg/repo/v1/index.go ``IndexFile.Get``), here 0.17.2 below
    the installed 0.18.0. The downgrade refusal compared only exact versions and left a range to helm, which then
    downgraded the release. The step resolves the range the way helm does (``helm search repo --version``, the same
    constraint check over the same index) before any change."""
    with _installed(tmp_path, "0.18.0") as (params, ctx):
        before = ctx.helm.release("nvidia-device-plugin", "kube-system")

        result = kubernetes_layer(
            _with(params, tmp_path, device_plugin={"chart_version": "~0.17"}), timeout_s=5
        )

        assert not result.ok
        [check] = [c for c in result.checks if not c.ok]
        assert "runs chart 0.18.0, newer than device_plugin.chart_version ~0.17 (0.17.2)" in check.message, (
            check
        )
        after = ctx.helm.release("nvidia-device-plugin", "kube-system")
        assert (
            (after.chart, after.revision)
            == (before.chart, before.revision)
            == ("nvidia-device-plugin-0.18.0", 1)
        )


def test_a_version_range_met_by_the_installed_chart_upgrades_nothing_on_a_second_run(tmp_path):
    """A range that resolves to the installed chart (``>=0.17.0`` -> 0.18.0) is the release as planned: the step
    compared the installed ``0.18.0`` with the text ``>=0.17.0``, never equal, so every run made a new helm revision
    of the same chart and values (and a change in the record)."""
    with _installed(tmp_path, "0.18.0") as (params, ctx):
        result = kubernetes_layer(
            _with(params, tmp_path, device_plugin={"chart_version": ">=0.17.0"}), timeout_s=GPUS_WITHIN
        )

        assert result.ok, result.to_dict()
        assert not result.data.get("changes"), result.data
        assert ctx.helm.release("nvidia-device-plugin", "kube-system").revision == 1


def test_the_values_a_site_gave_the_release_stay_out_of_the_record(tmp_path):
    """A second run on the installed chart reads the release's values (``helm get values -o json``) to compare them
    with its own. They are the site's, and may hold what no key name marks as a secret (a time-slicing or MIG
    config, a registry's credentials under a chart's own key), and records are shared widely: the read goes to
    the journal as a command only, never its output. Before, the journal kept helm's whole JSON answer."""
    with _installed(tmp_path, "0.17.2") as (params, ctx):
        _helm(
            ctx,
            *["upgrade", "nvidia-device-plugin", "nvdp/nvidia-device-plugin", "-n", "kube-system"],
            *["--version", "0.17.2", "--reuse-values", "--set-string", "siteNote=registry-pass-8c1f2e"],
        )
        again = _with(params, tmp_path, device_plugin={"chart_version": "0.17.2"})
        result = kubernetes_layer(again, timeout_s=GPUS_WITHIN)

        assert result.ok and not result.data.get("changes"), result.to_dict()
        read = [e for e in again.journal.entries if e.argv[1:3] == ("get", "values")]
        assert read, [e.summary for e in again.journal.entries]
        assert "registry-pass-8c1f2e" not in json.dumps([e.to_dict() for e in again.journal.entries])


def test_a_version_range_no_chart_meets_fails_before_any_change_naming_the_parameter(tmp_path):
    with real_cluster(
        tmp_path, scenario="gpu-ready", apply=True, device_plugin={"chart_version": "~0.99"}
    ) as (
        params,
        ctx,
    ):
        changes_before = len(ctx.journal.changes())

        result = kubernetes_layer(ctx, timeout_s=5)

        assert not result.ok
        [check] = [c for c in result.checks if not c.ok]
        assert "device_plugin.chart_version ~0.99" in check.message and "0.18.0" in check.message, check
        assert "helm search repo nvdp/nvidia-device-plugin --versions" in check.fix, check
        assert ctx.kube.runtime_class("nvidia") is None
        assert len(ctx.journal.changes()) == changes_before

        # neither a version nor a range: helm search repo's own error, named after the parameter
        result = kubernetes_layer(
            _with(params, tmp_path, device_plugin={"chart_version": "latest"}), timeout_s=5
        )
        [check] = [c for c in result.checks if not c.ok]
        assert "device_plugin.chart_version latest: helm cannot read it" in check.message, check
        assert "invalid version/constraint format" in check.message, check
        assert ctx.kube.runtime_class("nvidia") is None


def test_a_gpu_operator_range_that_resolves_below_the_supported_version_is_refused_before_any_change(
    tmp_path,
):
    """A pinned GPU Operator older than v26.3.1 fails parameter validation (tests/test_params.py); a range is
    known only once helm resolves it. The simulated repository serves only v26.3.3 (its chart facts are that
    version's), so what ``helm search repo`` answers is given here by a stand-in returning its parsed answer;
    the step's own rule is what is tested."""
    from types import SimpleNamespace

    from runbook_lib.errors import PermanentError
    from runbook_lib.steps.kubernetes import _planned_version

    helm = gpu_operator(version="<v26.3.1")

    class _Search:
        def resolve_version(self, chart, constraint):
            return "v26.3.0"

    ctx = SimpleNamespace(plan=SimpleNamespace(helm=helm, kubernetes_layer="gpu-operator"), helm=_Search())
    with pytest.raises(PermanentError) as refused:
        _planned_version(ctx)
    assert "gpu_operator.chart_version <v26.3.1: helm would install v26.3.0 is older than v26.3.1" in str(
        refused.value.message
    )
    ctx.plan.helm = gpu_operator(version=">=v26.3.1")
    _Search.resolve_version = lambda self, chart, constraint: "v26.7.0"
    assert _planned_version(ctx) == "v26.7.0"


def _killed_mid_install(ctx, node, state_dir):
    """A helm installing the device plugin killed while it waits (as a timeout or a kill stops it): one GPU node
    takes no pods (the simulator's ``pods_pending``), so the DaemonSet never becomes ready and helm waits."""
    import subprocess
    import time

    from runbook_lib.sim import faults
    from runbook_lib.steps.kubernetes import _label_nodes
    from runbook_lib.steps.results import StepResult

    faults.inject(state_dir, node, "pods_pending", True)
    # the chart's affinity wants the label the step sets, or the DaemonSet has no node to wait for
    labelled = StepResult(step="kubernetes", applied=True)
    _label_nodes(ctx, [n for n in ctx.params.nodes if n.name == node], labelled, [], dry_run=False)
    ctx.helm.repo_add("nvdp", ctx.plan.helm.repo_url)
    argv = ctx.helm.argv(
        [
            *["upgrade", "--install", "nvidia-device-plugin", "nvdp/nvidia-device-plugin"],
            *["-n", "kube-system", "--version", "0.17.2", "--set", "runtimeClassName=nvidia"],
            *["--wait", "--timeout", "300s"],
        ]
    )
    helm = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while (release := ctx.helm.release("nvidia-device-plugin", "kube-system")) is None or (
            release.status != "pending-install"
        ):
            assert time.monotonic() < deadline and helm.poll() is None, release
            time.sleep(0.5)
        time.sleep(2)  # helm is now waiting for the DaemonSet
    finally:
        helm.kill()
        helm.wait()
    return ctx.helm.release("nvidia-device-plugin", "kube-system")


def test_a_release_a_killed_helm_left_pending_stops_the_step_before_any_change_with_the_command_that_clears_it(
    tmp_path,
):
    """helm records the release ``pending-install`` before it waits, and a helm killed then (the runbook's own
    subprocess timeout did that: it allowed ``--timeout`` + 60 s where helm may take three times ``--timeout``,
    helm@v4.1.4 pkg/action/install.go:505-551) leaves it so: every later helm refuses it, 'another operation
    (install/upgrade/rollback) is in progress'. The step ran into that after creating the RuntimeClass, and its fix
    said "see the helm error above". Now it stops before any change, saying what happened and the command."""
    with real_cluster(tmp_path, scenario="gpu-ready", apply=True) as (params, ctx):
        left = _killed_mid_install(ctx, params.nodes[0].name, tmp_path)
        assert left is not None and left.status == "pending-install", left
        changes_before = len(ctx.journal.changes())

        result = kubernetes_layer(ctx, timeout_s=GPUS_WITHIN)

        (check,) = [c for c in result.checks if not c.ok]
        assert "nvidia-device-plugin in kube-system is pending-install" in check.message, check
        assert "nothing was changed" in check.message, check
        assert "helm uninstall nvidia-device-plugin -n kube-system" in check.fix, check
        assert ctx.kube.runtime_class("nvidia") is None
        assert len(ctx.journal.changes()) == changes_before


def test_an_api_error_after_the_changes_keeps_the_result_that_lists_them(tmp_path, monkeypatch):
    """The waits after the changes read Nodes, Leases and ClusterPolicies; an error there (here the API server's
    RBAC answer for a user who may not list Nodes) raised out of the step, so no result was written and the record
    had nothing for rollback to remove. Now it is the step's failed check, and the result lists what was created."""
    from runbook_lib.errors import PermanentError
    from runbook_lib.steps import kubernetes

    forbidden = (
        'list nodes: HTTP 403 Forbidden: nodes is forbidden: User "sre-jane" cannot list resource "nodes" in API '
        'group "" at the cluster scope'
    )

    def refused(*args, **kwargs):
        raise PermanentError(forbidden)

    with real_cluster(tmp_path, scenario="gpu-ready", apply=True) as (params, ctx):
        monkeypatch.setattr(kubernetes, "_wait_for_gpus", refused)
        result = kubernetes_layer(ctx, timeout_s=GPUS_WITHIN)

        assert not result.ok
        assert [c.message for c in result.checks if not c.ok] == [forbidden]
        kinds = sorted(c["kind"] for c in result.data["created"])
        assert kinds == ["RuntimeClass", "helm-release"], result.data


def test_an_upgrade_of_a_release_the_site_set_to_on_delete_is_not_failed_as_a_stalled_rollout(tmp_path):
    """The chart's ``updateStrategy`` value (k8s-device-plugin@v0.17.2 values.yaml:54) set to ``OnDelete``: the
    DaemonSet controller then replaces no pod itself, and ``kubectl rollout status`` has nothing to wait for
    (kubectl@v0.35.0 rollout_status.go:103-105). The step waited its whole timeout for a rollout that never
    comes and failed every node as held back; now the nodes pass and a note says how to move them."""
    with _installed(tmp_path, "0.17.2") as (params, ctx):
        _helm(
            ctx,
            *["upgrade", "nvidia-device-plugin", "nvdp/nvidia-device-plugin", "-n", "kube-system"],
            *["--version", "0.17.2", "--reuse-values", "--set", "updateStrategy.type=OnDelete"],
        )
        newer = _with(params, tmp_path, device_plugin={"chart_version": "0.18.0"})
        result = kubernetes_layer(newer, timeout_s=60)

        assert result.ok, result.to_dict()
        assert ctx.helm.values("nvidia-device-plugin", "kube-system")["updateStrategy"] == {
            "type": "OnDelete"
        }
        (note,) = [n for n in result.notes if "OnDelete" in n]
        assert all(n.name in note for n in params.nodes), note
        assert (
            "kubectl delete pod -n kube-system -l app.kubernetes.io/instance=nvidia-device-plugin" in note
        ), note


def test_an_upgrade_of_a_release_with_a_fullname_override_waits_for_its_own_daemonset(tmp_path):
    """A site's ``fullnameOverride`` (k8s-device-plugin@v0.18.0 values.yaml, templates/_helpers.tpl
    ``nvidia-device-plugin.fullname``) names the DaemonSet; the step watched for the default name, which never
    appears, and ran its whole timeout before judging nothing. The journal, which the record keeps, shows the
    wait and whether it was reached."""
    with _installed(tmp_path, "0.17.2") as (params, ctx):
        _helm(
            ctx,
            *["upgrade", "nvidia-device-plugin", "nvdp/nvidia-device-plugin", "-n", "kube-system"],
            *["--version", "0.17.2", "--reuse-values", "--set", "fullnameOverride=gpu-plugin"],
        )
        newer = _with(params, tmp_path, device_plugin={"chart_version": "0.18.0"})
        result = kubernetes_layer(newer, timeout_s=GPUS_WITHIN)

        assert result.ok, result.to_dict()
        (wait,) = [
            e.summary for e in newer.journal.entries if "list_namespaced_daemon_set" in (e.summary or "")
        ]
        assert "until DaemonSet gpu-plugin rolled out" in wait and "not reached" not in wait, wait


def test_a_site_that_refuses_the_operators_namespace_keeps_its_device_plugin(tmp_path):
    """The Talos 1.13 hand-over removes the device plugin before the GPU Operator is installed; the operator's
    namespace (created and labelled privileged) came after it. A site whose admission policy refuses privileged
    namespaces (a ValidatingAdmissionPolicy, as the API server enforces it) lost its device plugin, and so every
    GPU, with no operator to replace it. Now the namespace comes first, and the refusal changes nothing."""
    with real_cluster(tmp_path, scenario="gpu-ready", talos_version="v1.13.2", apply=True) as (params, ctx):
        ctx.helm.repo_add(
            "nvdp", _with(params, tmp_path, kubernetes_layer="device-plugin").plan.helm.repo_url
        )
        _helm(
            ctx,
            *["install", "nvidia-device-plugin", "nvdp/nvidia-device-plugin", "-n", "kube-system"],
            *["--version", "0.18.0", "--set", "runtimeClassName=nvidia"],
        )
        _deny_privileged_namespaces(ctx)

        result = kubernetes_layer(ctx, timeout_s=5)

        assert not result.ok
        assert "privileged namespaces need the platform team" in str(result.to_dict()), result.to_dict()
        assert _releases_of(ctx, "nvidia-device-plugin"), "the device plugin was retired before the refusal"
        assert ctx.helm.release("gpu-operator", "gpu-operator") is None


def _deny_privileged_namespaces(ctx):
    """A site's ValidatingAdmissionPolicy refusing namespaces that enforce the privileged Pod Security level,
    and a wait until the API server enforces it (it loads policies asynchronously)."""
    admission = client.AdmissionregistrationV1Api(ctx.kube.api)
    label = "pod-security.kubernetes.io/enforce"
    admission.create_validating_admission_policy(
        {
            "metadata": {"name": "no-privileged-namespaces"},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [
                        {
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE", "UPDATE"],
                            "resources": ["namespaces"],
                        }
                    ]
                },
                "validations": [
                    {
                        "expression": f"!has(object.metadata.labels) || !('{label}' in object.metadata.labels)"
                        f" || object.metadata.labels['{label}'] != 'privileged'",
                        "message": "privileged namespaces need the platform team",
                    }
                ],
            },
        }
    )
    admission.create_validating_admission_policy_binding(
        {
            "metadata": {"name": "no-privileged-namespaces"},
            "spec": {"policyName": "no-privileged-namespaces", "validationActions": ["Deny"]},
        }
    )
    probe = {"metadata": {"name": "probe", "labels": {label: "privileged"}}}
    for _ in range(60):
        try:
            ctx.kube.core.create_namespace(probe, dry_run="All")
        except client.ApiException as exc:
            if "privileged namespaces need the platform team" in str(exc.body):
                return
            raise
        time.sleep(1)
    raise AssertionError("the admission policy was never enforced")


def test_preflight_refuses_a_range_that_picks_a_gpu_operator_too_old() -> None:
    """Review of 671a251: preflight's chart check resolved a ``gpu_operator.chart_version`` range without the
    Kubernetes step's refusal of a GPU Operator older than the Talos docs support, so ``~25.10`` passed preflight
    and an --apply run changed every node before the step refused it."""
    from types import SimpleNamespace

    from runbook_lib.steps.kubernetes import chart_check

    helm = SimpleNamespace(
        repository_entry=lambda _name: {"name": "nvidia", "url": "https://helm.ngc.nvidia.com/nvidia"},
        repo_update=lambda _name=None: None,
        resolve_version=lambda _chart, constraint: {"~25.10": "v25.10.1", ">=26.3.1": "v26.3.3"}.get(
            constraint
        ),
        chart_versions=lambda _chart: ["v26.3.3", "v25.10.1"],
    )

    def ctx(version: str) -> SimpleNamespace:
        planned = SimpleNamespace(
            chart="nvidia/gpu-operator",
            version=version,
            repo_url="https://helm.ngc.nvidia.com/nvidia",
            repo_name="nvidia",
        )
        return SimpleNamespace(plan=SimpleNamespace(helm=planned, kubernetes_layer="gpu-operator"), helm=helm)

    old = chart_check(ctx("~25.10"))  # type: ignore[arg-type]
    assert not old.ok and "helm would install v25.10.1" in old.message, old
    assert "v26.3.1 or newer" in old.fix, old
    new = chart_check(ctx(">=26.3.1"))  # type: ignore[arg-type]
    assert new.ok and "(helm picks v26.3.3)" in new.message, new
