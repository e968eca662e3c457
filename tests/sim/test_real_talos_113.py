"""Talos 1.13 nodes on the real talosctl v1.13.0 (issue 14), and its ``upgrade --drain`` through Kubernetes.

talosctl 1.13 upgrades a 1.13 node through the LifecycleService and drains it by default: ``--drain`` defaults
to true and forces ``--wait`` (talos@v1.13.0:cmd/talosctl/cmd/talos/upgrade.go:69-71,360). After the install it
fetches the admin kubeconfig from the endpoint (a control-plane node, ``MachineService.Kubeconfig``), reads the
node's ``Nodename`` resource, cordons the node and evicts its pods through the Kubernetes API, reboots it, then
waits for the node to be Ready and uncordons it (cmd/talosctl/cmd/talos/drain.go, pkg/talos/nodedrain). The
runbook's image step passes no ``--drain`` flag, so on a real 1.13 cluster every GPU node is drained before its
reboot. Before simnode answered ``Kubeconfig``, the image step failed on the first node *after* installing:
``error creating Kubernetes client for drain: error fetching kubeconfig from Talos API: rpc error: code =
Unimplemented``.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runbook_lib.model.diagnosis import NodeContext, diagnose_text
from runbook_lib.model.versions import TalosVersion
from runbook_lib.sim import realkube, realtalos
from runbook_lib.sim.state import LATEST_PATCH, minor_of
from runbook_lib.steps.results import checks_from_findings
from tests.sim.test_real_talosctl import build, find_go
from tests.sim.test_realtalos import tools  # noqa: F401  (the stand-in tools cache, extended below)
from tests.sim.test_sim_up_real_talosctl import real_env as real_env_112
from tests.sim.test_sim_up_real_talosctl import runbook, step_lines
from tests.sim.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
TALOS = "v1.13.0"
KUBERNETES = "1.36.0"  # Talos 1.13's (state.KUBERNETES_FOR_TALOS)


# ---------------------------------------------------------------- choosing the talosctl (fast)


@pytest.fixture
def tools_113(request: pytest.FixtureRequest) -> Path:
    """The stand-in tools cache of ``test_realtalos`` (talosctl v1.12.0, simnode) plus a talosctl v1.13.0."""
    cache: Path = request.getfixturevalue("tools")
    path = cache / "talosctl" / "v1.13.0" / "talosctl"
    path.parent.mkdir(parents=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o700)
    return cache


@pytest.mark.parametrize(
    ("nodes", "client"), [("v1.13.0", "v1.13.0"), ("v1.13.4", "v1.13.0"), ("v1.12.7", "v1.12.0")]
)
def test_each_release_runs_the_real_talosctl_of_its_own_minor_release(
    tools_113: Path, nodes: str, client: str
) -> None:
    """simnode is built on pkg/machinery v1.13.0: it validates a 1.13 node's Kubernetes 1.36 config, so 1.13
    nodes get the real talosctl v1.13.0 (they fell back to the Python one while simnode validated as 1.12)."""
    choice = realtalos.choose(nodes, None, "fresh")
    assert choice.real, choice.reason
    assert choice.talosctl == str(tools_113 / "talosctl" / client / "talosctl")


def test_every_release_the_simulator_knows_is_served_by_simnode() -> None:
    """Since 1.3 and 1.4 are (simnode/installext.go), a node of any release the simulated cluster can make runs the
    real talosctl of its release when built; the fallback that named the releases simnode served is gone. A release
    added to the simulator (state.LATEST_PATCH) fails this until simnode serves it or it is excluded on purpose."""
    known = sorted(minor_of(v) for v in LATEST_PATCH.values())
    assert known == sorted(realtalos.SIMNODE_RELEASES)
    choice = realtalos.choose("v1.4.8", None, "fresh")
    assert "simnode does not simulate" not in choice.reason, choice.reason


# ---------------------------------------------------------------- a failed drain, diagnosed (fast)

#: What the real talosctl v1.13.0 prints when its drain cannot start: the talosconfig endpoint is a worker, which
#: has no Kubernetes admin kubeconfig (seen against simnode, tests/sim/test_real_talosctl_lifecycle.py; the text is
#: machined's, talos@v1.13.0:internal/app/internal/machinehelper/machinehelper.go:33-35), after the install lines.
DRAIN_NO_KUBECONFIG = (
    "10.5.0.11: Exit code: 0\n10.5.0.11: upgrade completed\n"
    "error creating Kubernetes client for drain: error fetching kubeconfig from Talos API: rpc error: "
    "code = Unimplemented desc = kubeconfig is only available on control plane nodes"
)
#: The drain's own error when an eviction does not finish (format at talos@v1.13.0:cmd/talosctl/pkg/talos/
#: nodedrain/nodedrain.go:141; the wrapped kubectl drain text is not from a run: no source run at hand).
DRAIN_TIMEOUT = 'error draining node "gpu-worker-1": global timeout reached: 5m0s'


@pytest.mark.parametrize("output", [DRAIN_NO_KUBECONFIG, DRAIN_TIMEOUT])
def test_a_failed_drain_is_diagnosed_as_installed_but_not_rebooted(output: str) -> None:
    """talosctl 1.13 drains after the install and before the reboot (upgrade.go:136-148), so a failed drain
    leaves the new image installed for the node's next boot: the generic "on its previous image" advice is
    wrong there, and the fix is the drain (a control-plane endpoint, the Kubernetes API, a PodDisruptionBudget)."""
    ctx = NodeContext(node="10.5.0.11", talos=TalosVersion.parse(TALOS))
    [cause] = checks_from_findings(diagnose_text(output, ctx, check="upgrade-cause"))
    assert "installed" in cause.cause and "next" in cause.cause and "reboot" in cause.cause
    assert "control-plane" in cause.fix and "--steps image --apply" in cause.fix


# ---------------------------------------------------------------- runbook run on Talos 1.13 (slow)


def real_env(tmp: Path, kube: str | None = None) -> dict[str, str]:
    """``test_sim_up_real_talosctl``'s environment (real talosctl, durations scaled down) with talosctl v1.13.0
    built and the Kubernetes side ``kube`` (default: the one ``runbook sim up`` picks, ``realkube.choose``)."""
    env = real_env_112(tmp)  # skips without go
    build("build-talosctl.sh", TALOS)
    return env if kube is None else env | {"RUNBOOK_SIM_KUBE": kube}


@pytest.mark.slow
def test_runbook_run_on_talos_1_13_drains_each_node_with_the_real_talosctl_and_a_second_run_changes_nothing(
    tmp_path: Path,
) -> None:
    """Issue 14's "done when" for 1.13: ``runbook run -p params/simulated.yaml --set talos_version=v1.13.0
    --apply`` with the real talosctl v1.13.0; the image step's upgrades drain each GPU node (talosctl's own
    cordon/drain/uncordon lines, through the real control plane here) and reboot it into the NVIDIA image."""
    env, state = real_env(tmp_path), tmp_path / "state"
    args = ["run", "-p", "params/simulated.yaml", "--set", f"talos_version={TALOS}", "--apply"]
    args += ["--state", str(state), "--no-progress"]
    first = runbook(env, *args)
    assert first.returncode == 0, first.stdout + first.stderr
    assert f"simulated Talos nodes: real talosctl {TALOS} against simnode" in first.stderr
    changed = ["config-patch", "image", "kubernetes"]  # preflight, verify and cuda-test: ok
    assert [s for s, outcome in step_lines(first.stdout).items() if outcome != "ok"] == changed
    (image,) = (tmp_path / "records").glob("*/results/image.json")
    upgrade_output = image.read_text()
    for node in ("gpu-worker-1", "gpu-worker-2", "gpu-worker-3"):
        for line in ("node cordoned", "node drained", "node uncordoned"):
            assert f"{node}: {line}" in upgrade_output
        observed = json.loads((state / "simnode" / "observed" / f"{node}.json").read_text())
        assert (
            observed["talos_version"] == TALOS
            and "/metal-installer/" in observed["image"]
            and observed["booted"]
        )
    second = runbook(env, *args)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "nothing changed on the cluster" in second.stdout


@pytest.mark.slow
@pytest.mark.parametrize(("talos", "drains"), [(TALOS, True), ("v1.12.7", False)])
def test_the_image_plan_says_talosctl_drains_each_1_13_node_before_its_reboot(
    tmp_path: Path, talos: str, drains: bool
) -> None:
    """Approving the image step on 1.13 nodes evicts their pods: talosctl 1.13 drains by default (upgrade.go:360)
    whenever the node serves the LifecycleService (upgrade.go:85,115-126), so the plan says so. A 1.12 node is
    upgraded through the legacy API, which never drains (the plan says nothing)."""
    env, state = real_env(tmp_path), tmp_path / "state"
    args = ["run", "-p", "params/simulated.yaml", "--set", f"talos_version={talos}", "--steps", "image"]
    args += ["--set", "simulation.scenario=config-patched", "--state", str(state), "--no-progress"]
    plan = runbook(env, *args)
    assert plan.returncode == 0, plan.stdout + plan.stderr
    (image,) = (tmp_path / "records").glob("*/results/image.json")
    notes = json.loads(image.read_text())["result"]["notes"]
    drain_notes = [n for n in notes if "drains" in n]
    assert bool(drain_notes) == drains, notes
    if drains:
        assert drain_notes[0].startswith("gpu-worker-1, gpu-worker-2, gpu-worker-3: talosctl 1.13+ drains")


# ---------------------------------------------------------------- --drain through the real control plane (slow)


def kube_tools() -> realkube.Tools:
    if find_go() is not None:
        build("build-simkube.sh")
    found = realkube.find_tools(KUBERNETES)
    if isinstance(found, str):
        pytest.skip(f"the real control plane {KUBERNETES} is {found}")
    return found


@pytest.fixture
def real_cluster(tmp_path: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    """Two fresh Talos 1.13 GPU workers on simnode (real talosctl v1.13.0) and the real control plane."""
    kube_tools()
    env, state = real_env(tmp_path, "real"), tmp_path / "state"
    up = runbook(env, "sim", "up", "--nodes", "2", "--talos-version", TALOS, "--state", str(state))
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        yield state, env
    finally:
        runbook(env, "sim", "down", "--state", str(state))


def core_api(state: Path) -> Any:
    from kubernetes import client, config  # the official client, as the library's clients/kube.py

    api_client = config.new_client_from_config(config_file=str(state / "kubeconfig"))  # type: ignore[no-untyped-call]
    return client.CoreV1Api(api_client)


def bare_pod(name: str, node: str) -> dict[str, Any]:
    """A pod bound to ``node`` (no scheduler, every taint tolerated: the test does not depend on when the node
    lifecycle controller lifts the not-ready taint), ended at once on deletion."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": node,
            "tolerations": [{"operator": "Exists"}],
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10"}],
        },
    }


def service_accounts(api: Any) -> set[str]:
    return {sa.metadata.name for sa in api.list_namespaced_service_account("default").items}


def pod_phase(api: Any, name: str) -> str | None:
    from kubernetes.client.exceptions import ApiException

    try:
        return str(api.read_namespaced_pod(name, "default").status.phase)
    except ApiException as err:
        if err.status == 404:
            return None
        raise


def nodes_file(state: Path) -> dict[str, str]:
    """Node name -> address of simnode's workers."""
    doc = json.loads((state / "simnode-nodes.json").read_text())
    return {n["name"]: n["address"] for n in doc["nodes"] if "worker" in n["name"]}


@pytest.mark.slow
def test_upgrade_drains_the_node_through_the_real_control_plane_and_uncordons_it_after_the_reboot(
    real_cluster: tuple[Path, dict[str, str]],
) -> None:
    """talosctl v1.13.0's ``upgrade`` (``--drain`` by default) against a 1.13 worker: it gets the real
    kube-apiserver's kubeconfig from simnode's control-plane node, evicts the kwok-run pod bound to the node
    through the real Eviction API, leaves the other node's pod alone, and uncordons the node once it is Ready
    after the reboot."""
    state, env = real_cluster
    (drained, address), (kept, _) = sorted(nodes_file(state).items())
    api = core_api(state)
    # The ServiceAccount admission refuses a pod until the controller-manager created the namespace's "default"
    # ServiceAccount, some time after the API server answers: wait for it rather than assume an order.
    wait_for(lambda: "default" in service_accounts(api), timeout=180)
    for name, node in (("drained", drained), ("kept", kept)):
        api.create_namespaced_pod("default", bare_pod(name, node))
    wait_for(
        lambda: pod_phase(api, "drained") == "Running" and pod_phase(api, "kept") == "Running", timeout=180
    )
    image = json.loads((state / "simnode" / "observed" / f"{drained}.json").read_text())["image"]
    talosctl = [str(state / "bin" / "talosctl"), "--talosconfig", str(state / "talosconfig"), "-n", address]
    upgrade = subprocess.run(
        [*talosctl, "upgrade", "--image", image, "--timeout", "5m"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    out = upgrade.stdout + upgrade.stderr
    assert upgrade.returncode == 0, out
    for line in ("node cordoned", "evicted pod default/drained", "node drained", "node uncordoned"):
        assert f"{drained}: {line}" in out
    wait_for(lambda: pod_phase(api, "drained") is None, timeout=60)
    assert pod_phase(api, "kept") == "Running"
    assert not api.read_node(drained).spec.unschedulable
