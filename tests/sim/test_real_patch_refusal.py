"""A machine-config patch with a misspelt key, through the config-patch step, on the real talosctl (issue 14).

Where a misspelt key can come from: the runbook builds its patches itself (``runbook_lib/model/profiles.py``);
the parameters have no key that carries patch content, and a user who adds one (``machine_patch:``…) is refused
by our own validation, naming it, before anything runs (the first test). So a key our validation cannot know,
a misspelt key nested in the patch, is planted here in the documents the step sends (see ``_misspelt``): what
a user reads then is the real talosctl's refusal on the node's line.

The real client decodes a patch strictly and refuses unknown keys before it calls any node (siderolabs/talos
v1.12.0 pkg/machinery/config/configpatcher, reality-gaps.md §2 row 4; the exact text is pinned by
``tests/sim/test_real_talosctl.py::test_patch_with_a_misspelt_key_is_refused_before_any_call``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from runbook_lib.errors import ParametersInvalid
from runbook_lib.model.machineconfig import remaining_patch
from runbook_lib.model.params import Node, load_params
from runbook_lib.notebook.render import render_markdown
from runbook_lib.sim.state import load_node, save_node
from runbook_lib.steps import patch_plan
from runbook_lib.steps.context import Context
from runbook_lib.steps.patch import config_patch, read_configs
from tests.simcluster import runs_real_talosctl, serve_node_files, sim_cluster

PARAMS = Path(__file__).resolve().parents[2] / "params" / "simulated.yaml"


def test_a_patch_parameter_is_refused_by_the_runbook_naming_it(tmp_path: Path) -> None:
    """A user who tries to hand the runbook patch content of their own gets our refusal, naming the key and
    the valid ones, before any talosctl runs (the CLI exits 2 on ``ParametersInvalid``)."""
    data = yaml.safe_load(PARAMS.read_text())
    data["machine_patch"] = {"machine": {"kernel": {"modules": [{"name": "nvidia"}]}}}
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ParametersInvalid) as caught:
        load_params(path)
    (problem,) = caught.value.problems
    assert (problem.source, problem.path) == (str(path), "machine_patch")
    assert problem.message.startswith("unknown parameter; ")
    assert "extra_kernel_args" in problem.message  # the valid keys are listed


def _misspelt(wanted: list[dict[str, Any]], current: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What the step sends (``remaining_patch``'s documents) with ``machine.kernel.modules`` misspelt
    ``modlues``: a nested key no parameter check could know, as a typo in a profile would make it.

    Planted after ``remaining_patch`` because that function refuses a key it cannot subtract before any node
    is touched (``UnhandledPatchKey``, tests/test_x7_patch_keys_not_subtracted.py): a typo in the profile's
    documents never reaches talosctl that way. This test checks talosctl's own refusal, the second guard."""
    docs = _remaining(wanted, current)
    for doc in docs:
        kernel = doc.get("machine", {}).get("kernel")
        if kernel and "modules" in kernel:
            kernel["modlues"] = kernel.pop("modules")
    return docs


_remaining = remaining_patch


def _configs(ctx: Context, nodes: tuple[Node, ...]) -> dict[str, list[dict[str, Any]]]:
    """Every node's machine config documents, read back through talosctl (what a user would check)."""
    configs, errors = read_configs(ctx, list(nodes))
    assert not errors, errors
    return configs


@pytest.mark.slow
def test_a_misspelt_key_is_refused_by_the_real_talosctl_on_each_nodes_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``apply: true``: the dry run is refused, so each node's line names it with talosctl's own text (the
    misspelt key included) and nothing is applied: no change command runs, the configs stay as they were."""
    monkeypatch.setattr(patch_plan, "remaining_patch", _misspelt)
    with sim_cluster(tmp_path, daemon=False, apply=True, rollout_concurrency=2) as (params, ctx):
        if not runs_real_talosctl(tmp_path):
            pytest.skip("the real talosctl is not built (make tools)")
        before = _configs(ctx, params.nodes)
        result = config_patch(ctx)
        after = _configs(ctx, params.nodes)
        changes = ctx.journal.changes()
    assert result.counts() == {"failed": len(params.nodes)}, result.to_dict()
    markdown = render_markdown(result)
    for node in params.nodes:
        res = result.node(node.name)
        assert res.message.startswith("dry run refused: unknown keys found during decoding:\n"), res.message
        assert "modlues:" in res.message  # talosctl echoes the key it did not know
        assert f"- **{node.name}** ({node.address}): dry run refused: unknown keys found" in markdown
    assert after == before
    assert changes == []


def _kubelet_too_new(state_dir: Path, name: str) -> None:
    """The node's own config names a kubelet its Talos refuses to run (machined's validation, pkg/machinery
    config/types/v1alpha1 ``kubelet image is not valid: version of Kubernetes … is too new``): every patch of
    that node is refused, whatever the patch."""
    node = load_node(state_dir, name)
    for doc in node.machine_config:
        if "machine" in doc:
            doc["machine"].setdefault("kubelet", {})["image"] = "ghcr.io/siderolabs/kubelet:v1.99.0"
    save_node(state_dir, node)
    serve_node_files(state_dir)


@pytest.mark.slow
@pytest.mark.parametrize("talos_version", ["v1.12.7", "v1.14.1"])
def test_a_node_refusing_its_own_dry_run_fails_alone_and_its_siblings_are_patched(
    tmp_path: Path, talos_version: str
) -> None:
    """The three nodes share one patch and one dry-run call; talosctl stops that call at the middle node, whose
    machined refuses the config (a 1.14 talosctl prints the refusal without the node's name, after its
    ``patched`` line). Before: all three failed "dry run refused" (1.14: the third node was named as the one
    refusing). Now the middle node fails with machined's words and the others are patched."""
    with sim_cluster(tmp_path, daemon=False, workers=3, talos_version=talos_version, apply=True) as (
        params,
        ctx,
    ):
        if not runs_real_talosctl(tmp_path):
            pytest.skip("the real talosctl is not built (make tools)")
        first, refusing, last = params.nodes
        _kubelet_too_new(tmp_path, refusing.name)
        result = config_patch(ctx)
        configs, _errors = read_configs(ctx, list(params.nodes))
    assert result.node(refusing.name).status == "failed", result.to_dict()
    assert result.node(refusing.name).message.startswith("dry run refused: rpc error: code = InvalidArgument")
    assert "version of Kubernetes 1.99.0 is too new" in result.node(refusing.name).message
    assert [result.node(n.name).status for n in (first, last)] == ["changed", "changed"], result.to_dict()
    patched = {a for a, docs in configs.items() if "nvidia_uvm" in yaml.safe_dump(docs)}
    assert patched == {first.address, last.address}
