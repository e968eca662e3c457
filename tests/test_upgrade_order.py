"""Config patch, then image upgrade, on the simulated cluster: what a real Talos node needs from that order.

Issue 13 (real-cluster correctness), shared/docs/reality-gaps.md §1 findings 3 and 4.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from runbook_lib.sim.state import load_nodes, runtime
from runbook_lib.steps.image import image_upgrade
from runbook_lib.steps.patch import config_patch
from tests.simcluster import sim_cluster

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(("version", "preserve"), [("v1.7.7", True), ("v1.8.4", False)])
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


def _cri_accepts_default_runtime(state: Path) -> dict[str, bool]:
    """Per GPU node: does containerd accept the CRI config (its default runtime is a defined runtime)?"""
    nodes = [n for n in load_nodes(state) if n.gpus]
    return {n.name: runtime(n).default_runtime in runtime(n).cri_runtime_handlers for n in nodes}


@pytest.mark.parametrize("version", ["v1.12.7", "v1.14.0"])
def test_default_runtime_patch_waits_until_the_image_brings_the_nvidia_runtime(
    tmp_path: Path, version: str
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
        gpu_nodes = [n for n in load_nodes(state) if n.gpus]
        assert {runtime(n).default_runtime for n in gpu_nodes} == {"nvidia"}
        assert all(_cri_accepts_default_runtime(state).values())
        assert config_patch(ctx, apply=False).counts() == {"unchanged": 2}
