"""Config patching against the simulated cluster: plan changes nothing, apply changes exactly the plan,
a second run changes nothing, per-node failures stop the rollout."""

from __future__ import annotations

import pytest
import yaml

from runbook_lib.model.machineconfig import config_documents, duplicate_modules
from runbook_lib.sim.realtalos import REBOOT_MS
from runbook_lib.sim.state import load_node
from runbook_lib.steps.patch import config_patch, read_configs
from runbook_lib.steps.reboots import BOOT_ID_PATH
from tests.simcluster import (
    failing_boot_id_read,
    inject_fault,
    runs_real_talosctl,
    sim_cluster,
)

MODULES = ["nvidia", "nvidia_uvm", "nvidia_drm", "nvidia_modeset"]


def nodes_of(entry):
    return entry.argv[entry.argv.index("-n") + 1].split(",")


def overlap(entries):
    """True when every journalled command was running at one common moment (entries are stamped at the end)."""
    starts = [e.at - e.duration_s for e in entries]
    return max(starts) < min(e.at for e in entries)


def modules_of(ctx, node):
    configs, _ = read_configs(ctx, [node])
    machine = next(d for d in configs[node.address] if "machine" in d)["machine"]
    return [m["name"] for m in (machine.get("kernel") or {}).get("modules", [])]


@pytest.mark.slow
def test_plan_only_shows_a_diff_and_changes_nothing(tmp_path):
    with sim_cluster(tmp_path, daemon=False) as (params, ctx):
        result = config_patch(ctx)
        assert result.status == "planned" and result.counts() == {"planned": 2}
        (group,) = result.data["groups"]
        assert (
            "Dry run summary:" in group["dry_run"] and "+            - name: nvidia_uvm" in group["dry_run"]
        )
        assert yaml.safe_load(group["patch"])["machine"]["sysctls"] == {"net.core.bpf_jit_harden": "1"}
        assert all(modules_of(ctx, n) == [] for n in params.nodes)
        assert ctx.journal.changes() == []


@pytest.mark.slow
def test_apply_then_second_run_changes_nothing_and_never_duplicates(tmp_path):
    with sim_cluster(tmp_path, daemon=False, apply=True, rollout_concurrency=2) as (params, ctx):
        first = config_patch(ctx)
        assert first.status == "changed" and first.counts() == {"changed": 2}
        assert all(c.ok for n in first.nodes for c in n.checks)
        for node in params.nodes:
            assert modules_of(ctx, node) == MODULES
        second = config_patch(ctx)
        assert second.status == "ok" and second.counts() == {"unchanged": 2}
        for node in params.nodes:
            configs, _ = read_configs(ctx, [node])
            assert duplicate_modules(configs[node.address]) == []
        changes = ctx.journal.changes()
        # a batch of 2: both nodes at once, one single-node call each (talosctl patches a -n list in a row)
        assert sorted(nodes_of(c) for c in changes) == sorted([n.address] for n in params.nodes)
        assert not any("--dry-run" in c.argv for c in changes)


@pytest.mark.slow
def test_rollout_concurrency_one_patches_node_by_node(tmp_path):
    with sim_cluster(tmp_path, daemon=False, apply=True, rollout_concurrency=1) as (params, ctx):
        seen = []
        config_patch(ctx, progress=lambda done, total: seen.append((done, total)))
        assert seen == [(1, 2), (2, 2)]
        assert len(ctx.journal.changes()) == 2


@pytest.mark.slow
def test_only_a_subset_of_nodes(tmp_path):
    with sim_cluster(tmp_path, daemon=False, apply=True) as (params, ctx):
        first, second = params.nodes
        result = config_patch(ctx, only=[first.name])
        assert [n.node for n in result.nodes] == [first.name]
        assert modules_of(ctx, first) == MODULES and modules_of(ctx, second) == []


@pytest.mark.slow
def test_default_runtime_patch_reports_the_reboot_it_needs_before_1_14(tmp_path, monkeypatch):
    # extensions-no-patch: the toolkit (and its nvidia runtime) is there, so the default runtime is not deferred
    with sim_cluster(tmp_path, daemon=False, scenario="extensions-no-patch", default_runtime_patch=True) as (
        params,
        ctx,
    ):
        result = config_patch(ctx)
        (group,) = result.data["groups"]
        assert "/etc/cri/conf.d/20-customization.part" in group["patch"]
        assert all(n.needs_reboot for n in result.nodes)


@pytest.mark.slow
def test_unreachable_node_fails_alone_with_a_fix(tmp_path):
    with sim_cluster(tmp_path, daemon=False, scenario="unreachable-node", apply=True) as (params, ctx):
        result = config_patch(ctx)
        failed = result.failing()
        assert len(failed) == 1 and "cannot read the machine config" in failed[0].message
        assert "talosctl -n" in failed[0].checks[0].fix
        others = [n for n in result.nodes if n.status != "failed"]
        assert others and all(n.status == "changed" for n in others)


@pytest.mark.slow
def test_patch_on_1_14_uses_kernel_module_config_documents(tmp_path):
    with sim_cluster(tmp_path, daemon=False, talos_version="v1.14.0") as (params, ctx):
        result = config_patch(ctx)
        (group,) = result.data["groups"]
        kinds = [d["kind"] for d in yaml.safe_load_all(group["patch"])]
        assert kinds == ["KernelModuleConfig"] * 4


def test_sim_node_state_is_what_talosctl_reports(tmp_path):
    with sim_cluster(tmp_path, daemon=False) as (params, ctx):
        node = params.nodes[0]
        configs, _ = read_configs(ctx, [node])
        assert (
            config_documents(load_node(tmp_path, node.address).machine_config)[0]["machine"]["type"]
            == configs[node.address][0]["machine"]["type"]
        )


@pytest.mark.slow
def test_default_runtime_patch_applied_node_by_node_waits_for_each_reboot(tmp_path, monkeypatch):
    with sim_cluster(tmp_path, scenario="extensions-no-patch", default_runtime_patch=True, apply=True) as (
        params,
        ctx,
    ):
        result = config_patch(ctx)
        assert result.status == "changed" and all(n.needs_reboot for n in result.nodes)
        boot_reads = [e for e in ctx.journal.entries if BOOT_ID_PATH in e.argv]
        # each node's boot ID before its patch, then at least once after it
        assert len(boot_reads) >= 4, "after each rebooting batch the step waits for the node's new boot"
        assert config_patch(ctx).counts() == {"unchanged": 2}


@pytest.mark.slow
def test_a_rebooting_node_is_seen_back_in_a_new_boot_before_the_next_batch(tmp_path, monkeypatch):
    """machined answers an apply that reboots first and reboots after, stopping the pods before apid (talos
    v1.13.0 v1alpha1_server.go:242-250, 308-319; simnode/lifecycle.go runs the same order). At Talos's own pace
    (time factor 1: the pods take 0.5 s to stop) the step saw each node answer before it went down, patched the
    next one at once, and then read both nodes' old active config: two correctly patched nodes were failed
    ("the node's config does not show it"). The wait is now for a new boot ID, as talosctl's tracker waits."""
    monkeypatch.setenv("RUNBOOK_SIM_TIME_SCALE", "1")
    with sim_cluster(tmp_path, scenario="extensions-no-patch", default_runtime_patch=True, apply=True) as (
        params,
        ctx,
    ):
        if not runs_real_talosctl(tmp_path):
            pytest.skip("the real talosctl is not built (make tools)")
        result = config_patch(ctx)
    assert result.counts() == {"changed": 2}, result.to_dict()
    first, second = result.data["rollout"]
    down = REBOOT_MS / 1000  # simnode keeps a rebooting node's API down this long
    assert first["nodes"] == [params.nodes[0].name] and first["duration_s"] >= down
    assert second["started"] >= first["started"] + down, "the next batch started while the canary rebooted"


@pytest.mark.slow
def test_a_node_whose_boot_id_cannot_be_read_is_not_given_a_rebooting_patch(tmp_path):
    """The dry run says the default-runtime patch reboots the node (up to Talos 1.13); its boot ID is read before
    the patch so its reboot can be told from its answers before it. A node whose read fails is not patched
    (``patch._boots_before``): the rollout could not see it come back before the next batch."""
    with sim_cluster(
        tmp_path,
        scenario="extensions-no-patch",
        default_runtime_patch=True,
        apply=True,
        rollout={"max_failures": 1},  # the canary's failure does not stop the second node
    ) as (params, ctx):
        first, second = params.nodes[:2]
        ctx.talosctl.binary = failing_boot_id_read(tmp_path, ctx.talosctl.binary, first.address)
        result = config_patch(ctx)
    refused = result.node(first.name)
    assert refused.status == "failed" and refused.message.startswith(
        "not patched: its boot ID could not be read"
    )
    assert "i/o timeout" in refused.message
    assert result.node(second.name).status == "changed", result.to_dict()
    patched = [e.argv for e in ctx.journal.changes() if "patch" in e.argv]
    assert all(first.address not in argv for argv in patched), patched


@pytest.mark.slow
def test_a_batch_of_eight_nodes_is_patched_at_once_not_node_after_node(tmp_path):
    """Issue 8: talosctl patches the nodes of ``-n a,b,c`` one after the other, so one call over a batch of 8
    paid 8 latencies; the batch's nodes are applied in concurrent single-node calls.  The dry run before it is
    one call over the 8 (issue 16: ``pipeline_chunk_size``, no chunk under 32 nodes; with the real talosctl at
    2 ms per node, 10 single-node chunks took twice one call's time: processes, not latency, decide there)."""
    with sim_cluster(tmp_path, workers=8, daemon=False, apply=True, rollout_concurrency=8, latency_ms=50) as (
        params,
        ctx,
    ):
        result = config_patch(ctx)
        patches = [e for e in ctx.journal.entries if "patch" in e.argv]
    assert result.counts() == {"changed": 8}
    dry_runs = [e for e in patches if "--dry-run" in e.argv]
    applies = [e for e in patches if e.changes_cluster]
    assert [nodes_of(e) for e in dry_runs] == [[n.address for n in params.nodes]]
    assert sorted(nodes_of(e) for e in applies) == sorted([n.address] for n in params.nodes)
    assert overlap(applies), "the batch's patch calls ran one after the other"
    # every change is journalled with its full argv and the patch applied
    assert all(e.diff and "nvidia_uvm" in e.diff for e in applies)


@pytest.mark.slow
def test_a_node_failing_its_patch_fails_alone_in_its_batch_and_stops_later_batches(tmp_path):
    with sim_cluster(tmp_path, workers=4, daemon=False, apply=True, rollout_concurrency=2) as (params, ctx):
        victim, sibling, *later = params.nodes
        patch = ctx.talosctl.patch_machineconfigs

        def lose_the_victim_before_applying(patches, *, dry_run, **kw):
            if not dry_run:  # reachable for the read and the dry run, gone when the change is applied
                inject_fault(tmp_path, victim.name, "unreachable", "refused")
            return patch(patches, dry_run=dry_run, **kw)

        ctx.talosctl.patch_machineconfigs = lose_the_victim_before_applying
        result = config_patch(ctx)
        sibling_modules = modules_of(ctx, sibling)
        changes = ctx.journal.changes()
    failed = result.node(victim.name)
    assert failed.status == "failed" and "patch failed" in failed.message and "refused" in failed.message
    # the victim was first in its batch: its sibling was still attempted (and changed), not left behind
    assert result.node(sibling.name).status == "changed" and sibling_modules == MODULES
    for node in later:
        res = result.node(node.name)
        assert res.status == "skipped" and f"after {victim.name} failed" in res.message
    assert sorted(nodes_of(c) for c in changes) == sorted([[victim.address], [sibling.address]])


@pytest.mark.slow
def test_talosctl_1_3_reboot_is_seen_on_stdout(tmp_path):
    """talosctl 1.3 prints ``patched …`` and the apply result on stdout (siderolabs/talos v1.3.0
    cmd/talosctl/cmd/talos/patch.go:74-79, helpers/mode.go:122-131 ``fmt.Println``); 1.4+ on stderr.  Reading
    stderr only, the default-runtime patch's "with a reboot" was missed and the next batch started while
    the nodes rebooted."""
    with sim_cluster(
        tmp_path,
        daemon=False,
        talos_version="v1.3.7",
        scenario="extensions-no-patch",
        default_runtime_patch=True,
    ) as (params, ctx):
        result = config_patch(ctx)
        (group,) = result.data["groups"]
        assert "Dry run summary:" in group["dry_run"]
        assert all(n.needs_reboot for n in result.nodes), result.to_dict()


@pytest.mark.slow
def test_the_real_talosctl_accepts_the_default_runtime_patch(tmp_path):
    """The modules and default-runtime patches as one dry run on the real talosctl against simnode. Failed
    before the step merged them into one ``machine:`` document: talosctl v1.12.0 refused the file with
    "duplicate document /v1alpha1/ is not allowed" (tests/test_patch_documents.py cites the source)."""
    with sim_cluster(tmp_path, daemon=False, scenario="extensions-no-patch", default_runtime_patch=True) as (
        _params,
        ctx,
    ):
        if not runs_real_talosctl(tmp_path):
            pytest.skip("the real talosctl is not built (make tools)")
        result = config_patch(ctx)
    assert result.counts() == {"planned": 2}, result.to_dict()
