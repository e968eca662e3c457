"""Talos 1.13 nodes bound for 1.14: the real talosctl v1.14.1 against simnode nodes running v1.13.9.

The config-patch step runs before the image step upgrades a node, so the modules patch reaches the node's machined
while it still runs 1.13. Talos 1.14 documents the modules as ``KernelModuleConfig`` documents (talos-nvidia.md
§1.3), which 1.13's machinery does not register: its machined refuses the whole config (talos@v1.13.0
internal/app/machined/internal/server/v1alpha1/v1alpha1_server.go:194-197, InvalidArgument, with the decoder's
error: pkg/machinery/config/configloader/internal/decoder/decoder.go:135 wrapping
pkg/machinery/config/internal/registry/registry.go:79). simnode decodes with v1.14.1's machinery, so until this
file it accepted them on a 1.13 node and the runbook's plan for 1.14 passed here while it fails on every real 1.13
node. Talos 1.14 still loads ``machine.kernel.modules``, merged with the documents (talos@v1.14.0-rc.1
pkg/machinery/config/container/container.go:355-372), which is what the step now sends a node before 1.14.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from runbook_lib.model.params import validate
from runbook_lib.steps.context import connect
from runbook_lib.steps.patch import config_patch
from tests.sim.test_real_talos_110_111 import Release, patch_dry_run, serve
from tests.sim.test_real_talos_114 import CLIENT, KERNEL_MODULE_CONFIG, TALOS

pytestmark = pytest.mark.slow

RUNNING = "v1.13.9"  # the newest 1.13 patch the simulator knows (runbook_lib/sim/state.py LATEST_PATCH)
LEGACY_MODULES = "machine:\n  kernel:\n    modules:\n      - name: nvidia\n      - name: nvidia_uvm\n"


@pytest.fixture
def fresh_113(tmp_path: Path) -> Iterator[Release]:
    """Fresh 1.13.9 GPU workers (no modules config) driven by the real talosctl v1.14.1, a newer client than the
    nodes, as a user bound for 1.14 runs it (preflight asks for a client of the target's minor or newer)."""
    yield from serve(tmp_path / "cluster-113", RUNNING, CLIENT, "fresh")


def test_a_1_13_node_refuses_kernel_module_config_documents_as_its_machinery_does(
    fresh_113: Release, tmp_path: Path
) -> None:
    proc = patch_dry_run(fresh_113, tmp_path, KERNEL_MODULE_CONFIG)
    assert proc.returncode != 0, proc.stderr
    assert (
        "code = InvalidArgument desc = error decoding document v1alpha1/KernelModuleConfig/nvidia (line "
        in (proc.stderr)
    ), proc.stderr
    assert proc.stderr.rstrip().endswith('"KernelModuleConfig" "v1alpha1": not registered'), proc.stderr
    legacy = patch_dry_run(fresh_113, tmp_path, LEGACY_MODULES)
    assert legacy.returncode == 0, legacy.stderr


def _context(release: Release, apply: bool, **more):
    """The runbook's context for a real cluster at these nodes, its target Talos 1.14."""
    data = {
        **more,
        "cluster": "lab",
        "target": "cluster",
        "talos_version": TALOS,
        "apply": apply,
        "nodes": [{"name": f"gpu-{i}", "address": a} for i, a in enumerate(release.nodes[1:], start=1)],
        "talosconfig": str(release.sim.talosconfig),
        "tools": {"talosctl": str(release.sim.talosctl)},
    }
    return connect(validate(data, source="test"))


def test_the_1_14_modules_patch_reaches_1_13_nodes_in_the_form_they_read_and_counts_as_done(
    fresh_113: Release,
) -> None:
    plan = config_patch(_context(fresh_113, apply=False))
    assert [n.status for n in plan.nodes] == ["planned"] * len(plan.nodes), [n.message for n in plan.nodes]
    [group] = plan.data["groups"]
    patch = yaml.safe_load(group["patch"])
    assert [m["name"] for m in patch["machine"]["kernel"]["modules"]][:2] == ["nvidia", "nvidia_uvm"], group
    assert "KernelModuleConfig" not in group["patch"]
    assert "default_runtime_deferred" not in plan.data, plan.notes  # not asked for: nothing to defer

    applied = config_patch(_context(fresh_113, apply=True))
    assert applied.ok and {n.status for n in applied.nodes} == {"changed"}, [n.message for n in applied.nodes]
    again = config_patch(
        _context(fresh_113, apply=False)
    )  # done: the documents' modules are met by the older form
    assert {n.status for n in again.nodes} == {"unchanged"}, [n.message for n in again.nodes]


@pytest.fixture
def nvidia_image_113(tmp_path: Path) -> Iterator[Release]:
    """1.13.9 GPU workers already on the NVIDIA image (the toolkit's runtime is there), modules not configured."""
    yield from serve(tmp_path / "cluster-113-nvidia", RUNNING, CLIENT, "extensions-no-patch")


def test_the_1_14_default_runtime_waits_for_the_upgrade_on_a_1_13_node_that_has_the_toolkit(
    nvidia_image_113: Release,
) -> None:
    """Talos 1.14's default-runtime patch is a CRICustomizationConfig document (talos-nvidia.md §1.3), a kind
    first registered at talos@v1.14.0-rc.1 (pkg/machinery/config/types/cri/customization.go:21), which a 1.13
    machined refuses as it refuses KernelModuleConfig. A node with the toolkit counted as ready for it, so the
    whole patch, modules too, was refused; it now waits for the image step, which applies it on 1.14."""
    plan = config_patch(_context(nvidia_image_113, apply=False, default_runtime_patch=True))
    assert [n.status for n in plan.nodes] == ["planned"] * len(plan.nodes), [n.message for n in plan.nodes]
    assert plan.data["default_runtime_deferred"] == [n.node for n in plan.nodes]
    [group] = plan.data["groups"]
    assert "CRICustomizationConfig" not in group["patch"] and "KernelModuleConfig" not in group["patch"]
