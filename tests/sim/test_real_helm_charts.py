"""What a user sees from the real helm 4.1.4 installing our device-plugin chart on the real control plane.

These are the facts ``tests/sim/test_helm.py`` checked against the Python helm and the Python API (issue 15
item 4: one truth), now checked with the real helm 4.1.4, the real kubectl 1.35.2 and kube-apiserver v1.35.0
(``tests/realplane.py``), on our ``nvidia-device-plugin`` chart (``runbook_lib/sim/chartsrc``, each fact sourced
in NVIDIA/k8s-device-plugin at v0.17.2/v0.18.0) served by the simulator's chart repository. Every message
asserted is the real helm's own output. One cluster serves the module: each test uses its own release names
(and namespace where it needs one), so they do not disturb each other. Skipped, saying what to build, when the
control plane is not built (``make kube-tools``).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from runbook_lib.sim import chartrepo, realkube
from tests.realplane import real_cluster
from tests.sim.waiting import wait_for

pytestmark = pytest.mark.slow

CHART = "nvdp/nvidia-device-plugin"
VERSION = "--version=0.18.0"  # params/simulated.yaml's and Talos 1.12's default (DevicePlugin.chart_version)

#: The refusal of the chart's templates/validation.yml (NVIDIA/k8s-device-plugin@v0.18.0
#: deployments/helm/nvidia-device-plugin/templates/validation.yml, same text; our copy's line is 7).
DEFAULT_NAMESPACE_REFUSAL = (
    "Error: INSTALLATION FAILED: execution error at (nvidia-device-plugin/templates/validation.yaml:7:4): \n"
    "Running in the 'default' namespace is not recommended.\n"
    "Set 'allowDefaultNamespace=true' to bypass this error.\n"
    "Otherwise, use --namespace (with --create-namespace as necessary) to run in a specific namespace.\n"
    "See: https://helm.sh/docs/helm/helm_install/#options\n"
)

FOREIGN_DAEMONSET = """\
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: nvidia-device-plugin, namespace: %s}
spec:
  selector: {matchLabels: {app: dp}}
  template:
    metadata: {labels: {app: dp}}
    spec:
      nodeSelector: {none: x}
      containers: [{name: c, image: "x:1"}]
"""

RUNTIME_CLASS = "apiVersion: node.k8s.io/v1\nkind: RuntimeClass\nmetadata: {name: nvidia}\nhandler: nvidia\n"


class Tools:
    """The real helm and kubectl from the state's ``bin/``, with their own HOME (helm's repositories file) and
    the simulated cluster's kubeconfig."""

    def __init__(self, state: Path) -> None:
        self.state = state
        self.env = {
            "PATH": os.environ.get("PATH", ""),
            "HOME": str(state / "home"),
            "KUBECONFIG": str(state / "kubeconfig"),
        }

    def run(self, tool: str, *argv: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.state / "bin" / tool), *argv],
            input=stdin,
            capture_output=True,
            text=True,
            env=self.env,
            timeout=120,
            check=False,
        )

    def ok(self, tool: str, *argv: str, stdin: str | None = None) -> str:
        out = self.run(tool, *argv, stdin=stdin)
        assert out.returncode == 0, out.stderr
        return out.stdout

    def helm(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return self.run("helm", *argv)

    def releases(self, namespace: str) -> list[tuple[str, str, str]]:
        """``helm list`` in ``namespace``: (name, revision, status) of its releases, in every status: helm 4 lists
        all by default and has no ``--all``/``-a`` (helm/helm#31295; helm 4.1.4 answers ``unknown flag: --all``)."""
        listed: list[dict[str, Any]] = json.loads(self.ok("helm", "list", "-n", namespace, "-o", "json"))
        return [(r["name"], r["revision"], r["status"]) for r in listed]

    def daemonset(self, name: str, namespace: str) -> dict[str, Any] | None:
        got = self.ok(
            "kubectl", "get", "daemonset", name, "-n", namespace, "--ignore-not-found", "-o", "json"
        )
        return json.loads(got) if got.strip() else None


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tools]:
    """Two fresh Talos 1.12 workers (no NVIDIA extensions: a pod of RuntimeClass nvidia gets no sandbox) on the
    real control plane, with the chart repository added as ``nvdp`` and RuntimeClass ``nvidia`` created."""
    state = tmp_path_factory.mktemp("real-helm")
    with real_cluster(state):
        tools = Tools(state)
        endpoints = json.loads((state / "endpoints.json").read_text())
        tools.ok("helm", "repo", "add", "nvdp", endpoints["charts"])
        tools.ok("kubectl", "apply", "-f", "-", stdin=RUNTIME_CLASS)
        yield tools


def test_the_docs_command_without_a_namespace_is_refused_and_its_bypass_meets_pod_security(
    real: Tools,
) -> None:
    """The docs' ``helm install`` without ``-n`` lands in ``default``, where the chart's own validation refuses it
    and nothing is installed; the bypass the message names installs, and then Talos's Pod Security baseline
    (enforced outside kube-system) refuses every pod for its hostPath volumes, as the DaemonSet's events say."""
    out = real.helm("install", "nvidia-device-plugin", CHART, VERSION, "--set=runtimeClassName=nvidia")
    assert (out.returncode, out.stderr) == (1, DEFAULT_NAMESPACE_REFUSAL)
    assert real.releases("default") == []
    assert real.daemonset("nvidia-device-plugin", "default") is None
    bypass = [
        "--set=allowDefaultNamespace=true",
        "--set=affinity=null",
    ]  # affinity: the fresh nodes lack GPU labels
    real.ok("helm", "install", "dd", CHART, VERSION, *bypass)
    try:
        message = wait_for(lambda: _failed_create(real, "default", "dd-nvidia-device-plugin"), timeout=60)
        assert 'is forbidden: violates PodSecurity "baseline:latest": hostPath volumes (volumes ' in message
        assert '"kubelet-device-plugins-dir", "mps-root", "mps-shm", "cdi-root")' in message
    finally:
        real.ok("helm", "uninstall", "dd")


def _failed_create(real: Tools, namespace: str, daemonset: str) -> str | None:
    """The DaemonSet controller's latest ``FailedCreate`` event message for ``daemonset``, if any yet."""
    events = json.loads(
        real.ok(
            "kubectl",
            "get",
            "events",
            "-n",
            namespace,
            "--field-selector",
            "reason=FailedCreate",
            "-o",
            "json",
        )
    )["items"]
    mine = [e["message"] for e in events if e["involvedObject"]["name"] == daemonset]
    return mine[-1] if mine else None


def test_a_daemonset_the_release_does_not_own_blocks_the_install_and_is_left_alone(real: Tools) -> None:
    """A DaemonSet of the chart's name applied by hand (an earlier manual install) makes helm refuse the install
    naming the ownership metadata it lacks; the hand-made DaemonSet is not changed and no release is left."""
    namespace = "hand-made"
    real.ok("kubectl", "create", "namespace", namespace)
    real.ok("kubectl", "apply", "-f", "-", stdin=FOREIGN_DAEMONSET % namespace)
    out = real.helm("install", "nvidia-device-plugin", CHART, VERSION, "-n", namespace)
    assert (out.returncode, out.stderr) == (
        1,
        'Error: INSTALLATION FAILED: unable to continue with install: DaemonSet "nvidia-device-plugin" in '
        f'namespace "{namespace}" exists and cannot be imported into the current release: invalid ownership '
        'metadata; label validation error: missing key "app.kubernetes.io/managed-by": must be set to "Helm"; '
        'annotation validation error: missing key "meta.helm.sh/release-name": must be set to '
        '"nvidia-device-plugin"; annotation validation error: missing key "meta.helm.sh/release-namespace": must '
        f'be set to "{namespace}"\n',
    )
    ds = real.daemonset("nvidia-device-plugin", namespace)
    assert ds is not None and ds["spec"]["template"]["spec"]["containers"][0]["image"] == "x:1"
    assert real.releases(namespace) == []


def test_helm_error_texts_a_user_sees(real: Tools) -> None:
    """The real helm's words for the mistakes a user makes by hand with the runbook's commands."""
    ns = ["-n", "kube-system"]
    assert (real.helm("install", "x", CHART, "--bogus-flag").stderr) == "Error: unknown flag: --bogus-flag\n"
    assert real.helm("install", "x", "nope/nvidia-device-plugin", *ns).stderr == (
        "Error: INSTALLATION FAILED: repo nope not found\n"
    )
    assert real.helm("install", "x", CHART, "--version", "9.9.9", *ns).stderr == (
        'Error: INSTALLATION FAILED: chart "nvidia-device-plugin" matching 9.9.9 not found in nvdp index. '
        "(try 'helm repo update'): no chart version found for nvidia-device-plugin-9.9.9\n"
    )
    real.ok("helm", "install", "twice", CHART, VERSION, *ns, "--set=nodeSelector.none=x")
    again = real.helm("install", "twice", CHART, VERSION, *ns)
    assert again.returncode == 1
    assert again.stderr.endswith(
        "Error: INSTALLATION FAILED: release name check failed: cannot reuse a name that is still in use\n"
    )
    real.ok("helm", "uninstall", "twice", *ns)
    assert real.helm("uninstall", "nope", *ns).stderr == (
        "Error: uninstall: Release not loaded: nope: release: not found\n"
    )
    absent = real.helm("install", "absent-ns", CHART, VERSION, "-n", "absent")
    assert (absent.returncode, absent.stderr) == (
        1,
        'Error: INSTALLATION FAILED: create: failed to create: namespaces "absent" not found\n',
    )


# ---------------------------------------------------------------- what the charts render (real helm template, no cluster)


@pytest.fixture(scope="module")
def packaged(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The real helm and the archives the simulator's repository serves (``chartrepo.package``)."""
    found = realkube.find_tools("1.35.0")
    if isinstance(found, str):
        pytest.skip(f"the real helm comes with the control plane 1.35.0, which is {found}")
    out = tmp_path_factory.mktemp("charts")
    chartrepo.package(found.helm, out)
    return found.helm, out


def template(packaged: tuple[Path, Path], archive: str, *argv: str) -> list[dict[str, Any]]:
    """``helm template`` of a served archive: the objects the real helm renders."""
    helm, out = packaged
    proc = subprocess.run(
        [str(helm), "template", *argv, str(out / archive)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


def test_the_device_plugin_schedules_only_onto_labelled_gpu_nodes_unless_affinity_is_switched_off(
    packaged: tuple[Path, Path],
) -> None:
    """From chart 0.15.0 the plugin's DaemonSet requires NFD's NVIDIA PCI label, NFD's vendor label or
    ``nvidia.com/gpu.present`` (NVIDIA/k8s-device-plugin@v0.18.0 deployments/helm/nvidia-device-plugin/values.yaml
    ``affinity``): a node without them gets no plugin. ``--set affinity=null`` removes it; the release name
    prefixes the DaemonSet's name and the image is the chart's appVersion."""
    (ds,) = [
        o
        for o in template(packaged, "nvidia-device-plugin-0.18.0.tgz", "-n", "kube-system")
        if o["kind"] == "DaemonSet"
    ]
    terms = ds["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert [t["matchExpressions"][0]["key"] for t in terms["nodeSelectorTerms"]] == [
        "feature.node.kubernetes.io/pci-10de.present",
        "feature.node.kubernetes.io/cpu-model.vendor_id",
        "nvidia.com/gpu.present",
    ]
    switched = ["dp", "-n", "kube-system", "--set", "affinity=null", "--set", "runtimeClassName=nvidia"]
    (ds,) = [
        o
        for o in template(packaged, "nvidia-device-plugin-0.17.2.tgz", *switched)
        if o["kind"] == "DaemonSet"
    ]
    spec = ds["spec"]["template"]["spec"]
    assert "affinity" not in spec and spec["runtimeClassName"] == "nvidia"
    assert ds["metadata"]["name"] == "dp-nvidia-device-plugin"
    assert spec["containers"][0]["image"] == "nvcr.io/nvidia/k8s-device-plugin:v0.17.2"


def test_the_gpu_operators_switches_reach_the_cluster_policy(packaged: tuple[Path, Path]) -> None:
    """The runbook's GPU Operator values (driver and toolkit off: Talos ships both as extensions) land in the
    ClusterPolicy the operator reconciles (gpu-operator@v26.3.3 deployments/gpu-operator/templates/clusterpolicy.yaml)."""
    values = ["--set", "driver.enabled=false", "--set", "toolkit.enabled=false"]
    values += ["--set", "hostPaths.driverInstallDir=/usr/local"]
    objs = template(packaged, "gpu-operator-v26.3.3.tgz", "gpu-operator", "-n", "gpu-operator", *values)
    (policy,) = [o for o in objs if o["kind"] == "ClusterPolicy"]
    assert policy["spec"]["driver"]["enabled"] is False and policy["spec"]["toolkit"]["enabled"] is False
    assert policy["spec"]["hostPaths"]["driverInstallDir"] == "/usr/local"


def test_wait_times_out_on_a_device_plugin_whose_pods_get_no_sandbox(real: Tools) -> None:
    """The runbook installs with ``--wait --timeout`` (runbook_lib/clients/helm.py). On nodes without the NVIDIA
    container toolkit the plugin's pods (RuntimeClass nvidia) never get a sandbox, so a real kubelet never reports
    them Ready (kubernetes@v1.35.0 pkg/kubelet/kuberuntime/kuberuntime_manager.go ``SyncPod`` returns when
    ``createPodSandbox`` fails, before any container starts; not re-read this session) and helm must time out and
    mark the release failed. Ported from tests/sim/test_helm.py (the Python helm, retired 2 Dec 2026); with
    ``--wait=legacy`` the real helm 4.1.4 here did time out, with ``Error: INSTALLATION FAILED: context deadline
    exceeded`` (Go's ``context.DeadlineExceeded``), since its legacy check counts ready pods, not available ones.
    Until 2 Dec 2026 the default watcher reported the release deployed in about 1.4 s (3 of 3 installs): kwok's
    pod stages showed each pod Running and Ready for a moment before the node agent sent it back to Pending; now
    no container stage of kwok's selects a pod before the agent lets its sandbox exist (tests/sim/
    test_no_flash_ready.py)."""
    ns = ["-n", "kube-system"]
    try:
        out = real.helm(
            "install", "never-ready", CHART, VERSION, *ns, "--set=runtimeClassName=nvidia", "--set=affinity=null",
            "--wait", "--timeout", "10s",
        )  # fmt: skip
        assert out.returncode == 1, out.stdout
        assert "context deadline exceeded" in out.stderr
        assert [r[2] for r in real.releases("kube-system") if r[0] == "never-ready"] == ["failed"]
    finally:
        real.helm("uninstall", "never-ready", *ns)
