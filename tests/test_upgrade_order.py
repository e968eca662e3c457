"""Config patch, then image upgrade, on the simulated cluster: what a real Talos node needs from that order.

Issue 13 (real-cluster correctness), shared/docs/reality-gaps.md §1 findings 3 and 4.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from runbook_lib.model.profiles import profile_for, render_documents
from runbook_lib.sim.state import SimNode, load_nodes, runtime
from runbook_lib.steps.context import Context, connect
from runbook_lib.steps.image import image_upgrade
from runbook_lib.steps.patch import config_patch
from tests.realplane import _params as gpu_params
from tests.sim.waiting import wait_for
from tests.simcluster import node_state, sim_cluster

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(("version", "preserve"), [("v1.3.7", True), ("v1.7.7", True), ("v1.8.4", False)])
def test_upgrade_keeps_the_ephemeral_partition_below_talos_1_8(
    tmp_path: Path, version: str, preserve: bool
) -> None:
    """Talos <= 1.7 wipes EPHEMERAL (/var, local PVs) on upgrade unless ``--preserve`` is passed.

    talos@v1.7.0:internal/pkg/install/install.go:292 ``WithForce(!in.GetPreserve())``; siderolabs/docs
    public/talos/v1.7/.../upgrading-talos.mdx:23,72-74.  From v1.8 the disk is never wiped
    (talos@v1.8.0:hack/release.toml), so the flag (hidden since 1.8) is left out there.
    """
    with sim_cluster(tmp_path / "sim", talos_version=version, workers=1) as (_params, ctx):
        plan = image_upgrade(ctx, apply=False)
        assert [("--preserve" in shlex.split(c)) for c in plan.data["commands"]] == [preserve]
        assert config_patch(ctx, apply=True).ok
        applied = image_upgrade(ctx, apply=True, settle_timeout=10.0, poll_interval=0.1)
        assert applied.ok, applied.summary()
        runs = [e.argv for e in ctx.journal.entries if "upgrade" in e.argv]
        assert runs and all(("--preserve" in argv) == preserve for argv in runs)


def _gpu_nodes(state: Path) -> list[SimNode]:
    """The GPU nodes as the talosctl answering them holds them (simnode's observed state, or the node files)."""
    return [node_state(state, n.name) for n in load_nodes(state) if n.gpus]


def _cri_accepts_default_runtime(state: Path) -> dict[str, bool]:
    """Per GPU node: does containerd accept the CRI config (its default runtime is a defined runtime)?"""
    nodes = _gpu_nodes(state)
    return {n.name: runtime(n).default_runtime in runtime(n).cri_runtime_handlers for n in nodes}


@pytest.mark.parametrize("version", ["v1.12.7", "v1.14.0"])
def test_default_runtime_patch_waits_until_the_image_brings_the_nvidia_runtime(
    tmp_path: Path, version: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """containerd refuses a CRI config whose ``default_runtime_name`` names no configured runtime
    ("no corresponding runtime configured in `containerd.runtimes` ...", containerd
    internal/cri/config/config.go ``ValidateRuntimeConfig``), and the ``nvidia`` runtime comes with the
    toolkit extension (extensions@v1.12.0:nvidia-gpu/nvidia-container-toolkit/nvidia-container-runtime/
    10-nvidia-container-runtime.part).  With the config patch before the image upgrade, making ``nvidia``
    the default then would take the node's CRI (every pod on it) down until the upgrade.  So the config
    patch defers it, and the image step applies it once the toolkit is there."""
    state = tmp_path / "sim"
    with sim_cluster(state, talos_version=version, workers=2, default_runtime_patch=True) as (_p, ctx):
        patched = config_patch(ctx, apply=True)
        assert patched.ok, patched.summary()
        assert all(_cri_accepts_default_runtime(state).values())
        assert any("default runtime" in note for note in patched.notes)
        upgraded = image_upgrade(ctx, apply=True, settle_timeout=10.0, poll_interval=0.1)
        assert upgraded.ok, upgraded.summary()
        # simnode writes its observed state on its next 100 ms tick (simnode/observe.go), later on a loaded machine
        wanted = {"nvidia"}
        wait_for(lambda: {runtime(n).default_runtime for n in _gpu_nodes(state)} == wanted, timeout=30.0)
        assert all(_cri_accepts_default_runtime(state).values())
        assert config_patch(ctx, apply=False).counts() == {"unchanged": 2}


def _ready(ctx: Context, name: str) -> tuple[str, str, str]:
    """The Node's Ready condition as ``kubectl describe node`` shows it: status, reason, message."""
    [node] = [n for n in ctx.kube.nodes() if n["metadata"]["name"] == name]
    [cond] = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
    return cond["status"], cond.get("reason", ""), cond.get("message", "")


def test_simulated_node_is_not_ready_while_containerd_lacks_its_default_runtime(tmp_path: Path) -> None:
    """What the deferral above prevents, as a user would see it: containerd's CRI does not load with a
    default runtime it has no definition for (containerd internal/cri/config/config.go
    ``ValidateRuntimeConfig``), the kubelet's runtime status sync stops, and its Node's Ready condition goes
    False with reason ``KubeletNotReady`` and message "container runtime is down" (kubernetes@v1.35.0
    pkg/kubelet/runtime.go:124 ``runtimeErrors``, pkg/kubelet/nodestatus/setters.go:505-512
    ``ReadyCondition``). On whichever Kubernetes side the suite runs: the real control plane (kwok and the
    node agent) or the Python API server."""
    state = tmp_path / "sim"
    with sim_cluster(state, talos_version="v1.12.7", workers=1) as (params, ctx):
        name, address = params.nodes[0].name, params.nodes[0].address
        wait_for(lambda: _ready(ctx, name)[0] == "True", timeout=60.0)
        docs = profile_for("v1.12.7").default_runtime_documents()
        patch = ctx.talosctl.patch_machineconfigs([(render_documents(docs), [address])], dry_run=False)
        assert patch[0].ok
        down = ("False", "KubeletNotReady", "container runtime is down")
        assert wait_for(lambda: _ready(ctx, name) == down, timeout=60.0)
        assert config_patch(ctx, apply=True).ok
        assert image_upgrade(ctx, apply=True, settle_timeout=10.0, poll_interval=0.1).ok
        assert wait_for(lambda: _ready(ctx, name)[0] == "True", timeout=60.0)


@pytest.mark.parametrize("version", ["v1.4.8", "v1.12.7"])
def test_image_step_refuses_nodes_whose_config_does_not_load_the_modules(
    tmp_path: Path, version: str
) -> None:
    """Run on its own (``--steps image``, or notebook 03 before 02), the upgrade would boot the kmod
    extension with the modules blacklisted and hang for BootTimeout before rolling back (see
    ``test_upgrade_before_the_modules_patch_hangs_at_boot_and_rolls_back`` in tests/sim); on Talos < 1.5
    it would also install nothing without ``machine.install.extensions``.  Nothing is changed."""
    timeouts = {"upgrade_seconds": 10, "node_ready_seconds": 5}
    with sim_cluster(tmp_path / "sim", talos_version=version, workers=2, timeouts=timeouts) as (_p, ctx):
        result = image_upgrade(ctx, apply=True, settle_timeout=5.0, poll_interval=0.1)
        assert not result.ok and result.counts() == {"failed": 2}
        assert all("run the config-patch step first" in n.message for n in result.nodes)
        assert not [e for e in ctx.journal.entries if "upgrade" in e.argv]
        # its plan says so (walkthrough: `--from image` planned a clean upgrade its --apply refused), unless
        # the same run plans the config patch first
        plan = image_upgrade(ctx, apply=False, steps=["preflight", "image", "verify"])
        assert plan.ok and plan.counts() == {"planned": 2}, plan.to_dict()
        assert any(
            n.startswith("applying this step now would be refused: the machine config of ")
            for n in plan.notes
        )
        whole = image_upgrade(ctx, apply=False, steps=["preflight", "config-patch", "image"])
        assert not any("would be refused" in n for n in whole.notes), whole.notes


def test_image_plan_shows_the_default_runtime_it_will_set_on_nodes_already_upgraded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Approve applies exactly the plan shown: a node already on the GPU image whose default runtime is
    still to set is planned (not "unchanged") by the image step that will set it."""
    state = tmp_path / "sim"
    with sim_cluster(state, scenario="gpu-ready", workers=2, default_runtime_patch=True) as (_p, ctx):
        plan = image_upgrade(ctx, apply=False)
        assert plan.counts() == {"planned": 2}
        assert all("default runtime" in n.message for n in plan.nodes)
        applied = image_upgrade(ctx, apply=True, settle_timeout=10.0, poll_interval=0.1)
        assert applied.counts() == {"changed": 2}
        assert {runtime(n).default_runtime for n in _gpu_nodes(state)} == {"nvidia"}
        assert image_upgrade(ctx, apply=False).counts() == {"unchanged": 2}


def test_a_node_on_1_7_keeps_its_pods_and_etcd_membership_on_its_way_to_1_8(tmp_path: Path) -> None:
    """``--preserve`` follows the node's running release too, not only the target: the running machined builds
    the upgrade sequence from the request, and without preserve a 1.7 node removes all its pods and, on a control
    plane, leaves etcd before the 1.8 installer runs (talos@v1.7.0 internal/app/machined/pkg/runtime/v1alpha1/
    v1alpha1_sequencer.go:462-488). Found by a review reading the talos source; the plan used the target alone."""
    with sim_cluster(tmp_path / "sim", talos_version="v1.7.7", workers=1, daemon=False) as (params, _ctx):
        ctx = connect(gpu_params(tmp_path / "sim", "v1.8.4", {}), state_dir=tmp_path / "sim")
        plan = image_upgrade(ctx, apply=False)
        assert len(plan.data["commands"]) == len(params.nodes), plan.summary()
        assert all("--preserve" in shlex.split(c) for c in plan.data["commands"]), plan.data["commands"]
