"""Fleet-scale behaviour of the verify and patch steps (issue 8): long node lists still give one answer per
node, in a bounded number of talosctl calls, and the simulated talosctl stays cheap to start."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
import yaml

from runbook_lib.clients.talosctl import PATCH_CALLS, PIPELINE_CHUNKS, FanOut, pipeline_chunk_size
from runbook_lib.steps.patch import config_patch
from runbook_lib.steps.verify import verify
from tests.simcluster import inject_fault, python_talosctl, sim_cluster

WORKERS = 2 * PATCH_CALLS + 7  # dry run: 2 chunks of 20 (pipeline_chunk_size); apply: chunks of 3


@pytest.mark.slow
def test_dry_run_over_a_long_node_list_answers_for_every_node_in_a_few_calls(tmp_path: Path) -> None:
    with sim_cluster(tmp_path, workers=WORKERS, scenario="extensions-no-patch", daemon=False) as (_p, ctx):
        result = config_patch(ctx, apply=False)
        dry_runs = [e for e in ctx.journal.entries if "--dry-run" in e.argv]
    assert result.counts() == {"planned": WORKERS}
    assert len(result.data["groups"]) == 1
    # concurrent chunk calls (talosctl patches the nodes of one call in a row), never more than 8 of them
    assert len(dry_runs) <= PIPELINE_CHUNKS
    assert all(
        len(e.argv[e.argv.index("-n") + 1].split(",")) <= pipeline_chunk_size(WORKERS) for e in dry_runs
    )
    covered = [node for e in dry_runs for node in e.argv[e.argv.index("-n") + 1].split(",")]
    assert sorted(covered) == sorted(n.address for n in ctx.params.nodes)
    # the merged dry-run output is the per-node summaries of every chunk, as a single call would print them
    assert result.data["groups"][0]["dry_run"].count("Dry run summary") == WORKERS
    assert not any(e.changes_cluster for e in ctx.journal.entries)


@pytest.mark.slow
def test_a_node_failing_its_dry_run_fails_alone_and_the_nodes_after_it_get_their_own_dry_run(
    tmp_path: Path,
) -> None:
    """talosctl stops a dry run at the node that fails (talos v1.12.0 helpers/resources.go ForEachResource); the
    nodes after it in the call were never dry-run. The step failed the whole group (every node sharing the
    patch, fleet-wide) for one node's own refusal; now those nodes go again without it."""
    with sim_cluster(tmp_path, workers=WORKERS, scenario="extensions-no-patch", daemon=False) as (_p, ctx):
        victim = ctx.params.nodes[PATCH_CALLS + 3]
        # the step reads and dry-runs chunk by chunk (steps/patch_plan.py)
        read_configs = ctx.talosctl.get_call

        def read_then_lose_the_victim(resource: str, nodes: Sequence[str]) -> FanOut:
            fan = read_configs(resource, nodes)
            if victim.address in nodes:  # read, then gone before its chunk's dry run
                inject_fault(tmp_path, victim.name, "unreachable", "refused")
            return fan

        ctx.talosctl.get_call = read_then_lose_the_victim  # type: ignore[method-assign]
        result = config_patch(ctx, apply=False)
    assert result.counts() == {"failed": 1, "planned": WORKERS - 1}, result.counts()
    assert "dry run refused" in result.node(victim.name).message
    assert victim.address in result.node(victim.name).message
    assert result.data["batches"] and all(victim.name not in b for b in result.data["batches"])


@pytest.mark.slow
def test_verify_over_a_long_node_list_checks_every_node_with_batched_gets(tmp_path: Path) -> None:
    with sim_cluster(tmp_path, workers=60, scenario="gpu-ready", daemon=False) as (_p, ctx):
        result = verify(ctx)
        argvs = [e.argv for e in ctx.journal.entries]
    assert result.counts() == {"ok": 60}
    batched = [a for a in argvs if "get" in a or "service" in a]
    reads = [a for a in argvs if "read" in a]
    # extensions, modules (and whatever else verify reads with `get`), and `talosctl service` (ServiceList,
    # which shows Finished one-shots): each kind covers the 60 nodes exactly once in a few calls (a get in
    # chunks of get_chunk_size(60) = 32 nodes, service in one call), never one call per node
    kinds: dict[str, list[str]] = {}
    for a in batched:
        kinds.setdefault(a[a.index("get") + 1] if "get" in a else "service", []).extend(
            a[a.index("-n") + 1].split(",")
        )
    assert {"extensions", "service"} <= set(kinds), kinds
    assert all(sorted(nodes) == sorted(n.address for n in ctx.params.nodes) for nodes in kinds.values())
    assert len(batched) <= 2 * len(kinds)
    assert len(reads) == 60  # talosctl refuses multi-node reads: one per node
    assert all(n.data["driver"] for n in result.nodes)


def test_simulated_talosctl_read_does_not_import_patching_or_the_image_catalog(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each fleet-wide verify starts one simulated talosctl per node; what it imports is paid N times."""
    python_talosctl(monkeypatch, "the Python talosctl's own start-up is under test")
    with sim_cluster(tmp_path, workers=1, scenario="gpu-ready", daemon=False) as (_p, ctx):
        probe = (
            "import sys, runpy\n"
            "sys.argv = ['talosctl', *sys.argv[1:]]\n"
            "try:\n"
            "    runpy.run_module('runbook_lib.sim.talosctl', run_name='__main__')\n"
            "except SystemExit:\n"
            "    pass\n"
            "heavy = [m for m in ('yaml', 'jsonpatch', 'runbook_lib.sim.patching', 'runbook_lib.sim.catalog') "
            "if m in sys.modules]\n"
            "print('HEAVY', heavy, file=sys.stderr)\n"
        )
        talosctl(tmp_path, "-n", ctx.params.nodes[0].address, "version")  # first call: parses the YAML
        done = subprocess.run(
            [
                *(sys.executable, "-c", probe, "--talosconfig", ctx.endpoints.talosconfig or ""),
                *("-n", ctx.params.nodes[0].address, "read", "/proc/driver/nvidia/version"),
            ],
            capture_output=True,
            text=True,
            check=False,
            env={"RUNBOOK_SIM_STATE": str(tmp_path), "PATH": "/usr/bin:/bin"},
        )
    assert "NVRM version" in done.stdout, done.stderr
    assert "HEAVY []" in done.stderr


def talosctl(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(state / "bin" / "talosctl"), "--talosconfig", str(state / "talosconfig"), *args],
        capture_output=True,
        text=True,
        check=False,
    )


def test_simulated_talosctl_follows_an_edited_talosconfig(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The talosconfig is read through a cache; editing the file must still change what talosctl does."""
    python_talosctl(monkeypatch, "the Python talosctl's talosconfig cache is under test")
    with sim_cluster(tmp_path, workers=2, scenario="gpu-ready", daemon=False) as (_p, ctx):
        first, second = (n.address for n in ctx.params.nodes)
        config = tmp_path / "talosconfig"
        data = yaml.safe_load(config.read_text())
        for node in (first, second):
            data["contexts"][data["context"]]["nodes"] = [node]
            config.write_text(yaml.safe_dump(data))
            done = talosctl(tmp_path, "get", "extensions")
            assert done.returncode == 0, done.stderr
            assert {line.split()[0] for line in done.stdout.splitlines()[1:]} == {node}
        cache = (tmp_path / ".talosconfig-cache.json").read_text()
    assert "key" in cache and "crt" not in cache and "ca" not in cache.replace("cache", "")
