"""The config-patch dry run, pipelined per chunk (issue 16): each chunk of nodes is read, planned and dry-run on
its own, the chunks side by side, as the fastest direct use of talosctl does it (benchmarks/bench_real_talosctl.py,
the patch floor: ``get machineconfig`` then ``patch --dry-run`` per ``-n`` chunk, all chunks at once).

What a user sees must not change: the same result per node, a node whose config cannot be read failing alone
(naming it, with a fix) while the rest of its chunk is planned, one group per distinct patch with the dry run of
exactly its nodes. What changes is which talosctl calls run: per chunk one ``get`` and one dry run per patch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from runbook_lib.clients.talosctl import FanOut, pipeline_chunk_size
from runbook_lib.model.machineconfig import config_documents
from runbook_lib.model.parsers import TalosResource
from runbook_lib.model.profiles import render_documents
from runbook_lib.steps import patch_plan
from runbook_lib.steps.patch import config_patch, read_configs, wanted_documents
from tests.simcluster import inject_fault, sim_cluster


def nodes_of(argv: list[str]) -> list[str]:
    return argv[argv.index("-n") + 1].split(",")


def calls(ctx: Any, *words: str, since: int = 0) -> list[list[str]]:
    """The ``-n`` lists of the journalled talosctl calls (from entry ``since`` on) whose argv has all of
    ``words``, in journal order."""
    return [nodes_of(e.argv) for e in ctx.journal.entries[since:] if all(w in e.argv for w in words)]


def small_chunks(ctx: Any, count: int) -> None:
    """Split the dry run into ``count`` chunks however few the nodes (the library makes no more chunks than chunks of 32
    nodes would, one for these tests' fleets), so that the tests see several chunks."""
    ctx.talosctl.pipeline_chunks = count
    ctx.talosctl.min_pipeline_chunk = 1


def test_a_ten_node_dry_run_is_one_get_and_one_dry_run(tmp_path: Path) -> None:
    """Issue 16: 10 nodes were 10 single-node chunks, 20 talosctl processes, where the benchmark's floor reads
    and dry-runs them with one ``get machineconfig`` and one ``patch --dry-run`` (real talosctl v1.12.0 against
    simnode at 2 ms: library 0.60 s, floor 0.30 s).  Now one of each, over all 10 nodes, and every node is
    still planned on its own."""
    with sim_cluster(tmp_path, workers=10, daemon=False) as (params, ctx):
        result = config_patch(ctx, apply=False)
        gets = calls(ctx, "get")
        dry_runs = calls(ctx, "patch", "--dry-run")
    everyone = [n.address for n in params.nodes]
    assert result.counts() == {"planned": 10} and len(result.data["groups"]) == 1
    assert gets == [everyone] and dry_runs == [everyone]


def test_the_default_runtime_patch_reads_each_chunks_extensions_with_its_configs(tmp_path: Path) -> None:
    """The default-runtime patch needs each node's extensions (``nodes_with_nvidia_runtime``).  They were read
    over the whole fleet BEFORE the first chunk could start: one more sequential wave of talosctl.  Now each
    chunk reads its nodes' extensions beside their configs (same ``-n`` list), before its own dry run, and no
    call reads the extensions of the whole fleet."""
    with sim_cluster(
        tmp_path, workers=6, daemon=False, scenario="extensions-no-patch", default_runtime_patch=True
    ) as (params, ctx):
        small_chunks(ctx, 3)
        result = config_patch(ctx, apply=False)
        journal = [list(e.argv) for e in ctx.journal.entries]
    assert result.counts() == {"planned": 6} and "default_runtime_deferred" not in result.data
    chunks = sorted([n.address for n in params.nodes][i : i + 2] for i in range(0, 6, 2))
    extension_reads = [nodes_of(a) for a in journal if "extensions" in a]
    assert (
        sorted(extension_reads)
        == chunks
        == sorted(nodes_of(a) for a in journal if "get" in a and "machineconfig" in a)
    )
    for chunk in chunks:  # a chunk's dry run comes after its own extensions were read
        read_at = next(i for i, a in enumerate(journal) if "extensions" in a and nodes_of(a) == chunk)
        dry_at = next(i for i, a in enumerate(journal) if "--dry-run" in a and nodes_of(a) == chunk)
        assert read_at < dry_at


def test_each_chunk_is_read_once_and_dry_run_once_whatever_the_fleet_size(tmp_path: Path) -> None:
    """12 nodes in 4 chunks of 3 (no smallest chunk): 4 ``get machineconfig`` calls and 4 dry runs, each dry run
    over the very nodes one ``get`` read; before, the whole fleet was read first in ``get`` chunks of at least 32
    nodes (one call here) and dry-run afterwards."""
    with sim_cluster(tmp_path, workers=12, daemon=False) as (params, ctx):
        small_chunks(ctx, 4)
        result = config_patch(ctx)
        gets = calls(ctx, "get", "machineconfig")
        dry_runs = calls(ctx, "patch", "--dry-run")
    assert result.counts() == {"planned": 12} and len(result.data["groups"]) == 1
    size = pipeline_chunk_size(12, 4, minimum=1)
    expected = sorted([n.address for n in params.nodes][i : i + size] for i in range(0, 12, size))
    assert sorted(gets) == expected and sorted(dry_runs) == expected
    assert ctx.journal.changes() == []


def test_a_node_whose_config_cannot_be_read_fails_alone_and_its_chunk_is_planned(tmp_path: Path) -> None:
    """6 nodes in chunks of 2.  gpu 3, the FIRST node of the second chunk, is down: the real ``talosctl get`` then
    fails before printing anything for the other node of its call (``ResolveResourceKind`` on ``Nodes()[0]``,
    siderolabs/talos v1.12.0 cmd/talosctl/pkg/talos/helpers/resources.go:49), so its chunk-mate must be read
    again.  gpu 1 already has the ``nvidia`` module (a patch of its own), gpu 5 everything (unchanged); the
    others share one patch whose group spans three chunks and whose dry run covers exactly them."""
    with sim_cluster(tmp_path, workers=6, daemon=False) as (params, ctx):
        n1, n2, n3, n4, n5, n6 = params.nodes
        partial = "machine:\n  kernel:\n    modules:\n      - name: nvidia\n"
        assert ctx.talosctl.patch_machineconfig([n1.address], partial, dry_run=False).ok
        full = render_documents(wanted_documents(ctx, n5))
        assert ctx.talosctl.patch_machineconfig([n5.address], full, dry_run=False).ok
        inject_fault(tmp_path, n3.name, "unreachable", "refused")
        small_chunks(ctx, 3)
        since = len(ctx.journal.entries)
        result = config_patch(ctx)
        journal = ctx.journal.entries[since:]
        dry_runs = calls(ctx, "patch", "--dry-run", since=since)
        n2_config = read_configs(ctx, [n2])[0][n2.address]
    down = result.node(n3.name)
    assert down.status == "failed" and "cannot read the machine config" in down.message
    assert n3.address in down.checks[0].fix
    assert {n.name: result.node(n.name).status for n in (n1, n2, n4, n5, n6)} == {
        n1.name: "planned",
        n2.name: "planned",
        n4.name: "planned",
        n5.name: "unchanged",
        n6.name: "planned",
    }
    mine, shared = result.data["groups"]
    assert mine["nodes"] == [n1.name] and shared["nodes"] == [n2.name, n4.name, n6.name]
    assert [m["name"] for m in yaml.safe_load(mine["patch"])["machine"]["kernel"]["modules"]] == [
        "nvidia_uvm",
        "nvidia_drm",
        "nvidia_modeset",
    ]
    # each group's dry run is its own nodes', in node order, and nothing else's
    for group, members in ((mine, [n1]), (shared, [n2, n4, n6])):
        patched = [line.split()[-1] for line in group["dry_run"].splitlines() if line.startswith("patched ")]
        assert patched == [n.address for n in members]
    assert sorted(dry_runs) == sorted([[n1.address], [n2.address], [n4.address], [n6.address]])
    assert not any(e.changes_cluster for e in journal) and "nvidia_uvm" not in str(n2_config)


def test_each_distinct_patch_is_rendered_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nodes lacking the same documents share one rendering (the YAML dump per node cost ~0.7 s of CPU at 1,000
    nodes); documents that differ, even only in a value's type, get their own, with the text they would get
    alone."""
    rendered: list[str] = []

    def counted(docs: list[dict[str, Any]]) -> str:
        rendered.append(render_documents(docs))
        return rendered[-1]

    monkeypatch.setattr(patch_plan, "render_documents", counted)
    render = patch_plan.RenderOnce()
    one = [{"machine": {"sysctls": {"net.core.bpf_jit_harden": "1"}}}]
    other = [{"machine": {"sysctls": {"net.core.bpf_jit_harden": 1}}}]
    texts = [render(yaml.safe_load(yaml.safe_dump(docs))) for docs in (one, one, other, one, other)]
    assert texts == [render_documents(d) for d in (one, one, other, one, other)]
    assert len(rendered) == 2 and texts[0] != texts[2]


def test_nodes_sharing_one_config_text_have_it_parsed_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 16: at 1,000 nodes the dry run took 63.4 s against its floor's 27.1 s in the same chunks (8 of 125,
    real talosctl v1.12.0 against simnode, load 44-60): the floor parses nothing, the library spent 2.4 s of CPU,
    most of it building the YAML of 1,000 configs (~1.2 ms each, PyYAML's Python constructor), in one process
    whose threads share one interpreter lock while ~30 other tasks wanted the 2 cores.  Workers applied from one
    ``worker.yaml`` carry the same text: it is parsed once per ``get`` answer, and each node still gets its own
    documents (equal to a parse of its own text)."""
    parsed: list[str] = []

    def counted(spec: Any) -> list[dict[str, Any]]:
        parsed.append(spec)
        return config_documents(spec)

    monkeypatch.setattr(patch_plan, "config_documents", counted)
    worker, other = "machine:\n  type: worker\n", "machine:\n  type: worker\n  sysctls: {a: '1'}\n"
    texts = {"10.0.0.1": worker, "10.0.0.2": other, "10.0.0.3": worker, "10.0.0.4": worker}
    fan = FanOut(
        resources=[
            TalosResource(
                node=n, namespace="config", type="MachineConfigs", id="v1alpha1", version="1", spec_text=t
            )
            for n, t in texts.items()
        ]
    )
    configs, errors = patch_plan.configs_of(fan)
    assert sorted(parsed) == sorted([worker, other]) and errors == {}
    assert configs == {n: config_documents(t) for n, t in texts.items()}
    assert configs["10.0.0.1"] is not configs["10.0.0.3"]  # a node's list is its own
