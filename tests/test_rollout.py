"""Rollout controls (issue 17 point 4): canary batch, failure budget, pause between batches, resume.

The schedule itself is unit-tested on ``runbook_lib.model.rollout``; the steps are tested against the
simulated cluster, observing what an operator would: which nodes were changed, in which calls and when.
These are the project's own design (no upstream tool defines them), so there is no upstream source to cite.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from runbook_lib.errors import ParametersInvalid
from runbook_lib.model.params import load_params, parameter_rows, parameters_markdown, validate
from runbook_lib.model.rollout import batch_sizes, failure_budget, parse_budget, schedule
from runbook_lib.sim.state import VANILLA_SCHEMATIC, load_node
from runbook_lib.steps.context import Context, connect
from runbook_lib.steps.image import image_upgrade
from runbook_lib.steps.patch import config_patch
from runbook_lib.steps.results import StepResult
from tests.simcluster import clear_fault, factory_only, inject_fault, node_state, sim_cluster

WORKERS = ["talos-worker-1", "talos-worker-2", "talos-worker-3"]

# -- the schedule (pure) ------------------------------------------------------------------------------------


def test_canary_then_batches_double_up_to_the_concurrency() -> None:
    assert batch_sizes(20, 8, 1) == [1, 2, 4, 8, 5]
    assert batch_sizes(3, 4, 1) == [1, 2]
    assert batch_sizes(7, 2, 2) == [2, 2, 2, 1]
    assert batch_sizes(0, 8, 1) == []


def test_without_a_canary_every_batch_is_the_concurrency() -> None:
    assert batch_sizes(5, 2, None) == [2, 2, 1]
    assert batch_sizes(3, 1, None) == [1, 1, 1]


def test_failure_budget_is_a_count_or_a_percentage_of_the_nodes_rounded_down() -> None:
    assert failure_budget(0, 100) == 0
    assert failure_budget(3, 10) == 3
    assert failure_budget("5%", 40) == 2
    assert failure_budget("5%", 39) == 1
    assert failure_budget("50%", 3) == 1
    assert failure_budget("100%", 7) == 7


@pytest.mark.parametrize("bad", [-1, "150%", "-5%", "five", "5", True])
def test_budget_outside_a_count_or_0_to_100_percent_is_refused(bad: Any) -> None:
    with pytest.raises(ValueError):
        parse_budget(bad)


def test_schedule_says_its_batches_budget_and_pause() -> None:
    plan = schedule(20, concurrency=8, canary=1, max_failures="10%", pause_seconds=30)
    assert plan.batches(list(range(20)))[:3] == [[0], [1, 2], [3, 4, 5, 6]]
    assert not plan.exhausted(2) and plan.exhausted(3)
    text = plan.describe()
    assert "20 node(s) in 5 batch(es) of 1, 2, 4, 8, 5" in text
    assert "canary 1" in text and "more than 2 node(s) failed" in text and "30 s pause" in text
    assert (
        "after the first failed node"
        in schedule(2, concurrency=1, canary=None, max_failures=0, pause_seconds=0).describe()
    )


# -- the parameters ------------------------------------------------------------------------------------------


def _params(**extra: Any) -> Any:
    data = {
        "cluster": "c",
        "talos_version": "v1.12.7",
        "nodes": [{"name": "n1", "address": "10.5.0.3"}],
        "rollout_concurrency": 4,
        **extra,
    }
    return validate(data, source="params.yaml")


@pytest.mark.parametrize(
    ("rollout", "key", "words"),
    [
        ({"canary": 0}, "rollout.canary", "greater than or equal to 1"),
        ({"canary": 5}, "rollout.canary", "more than rollout_concurrency 4"),
        ({"max_failures": -1}, "rollout.max_failures", "must not be negative"),
        ({"max_failures": "120%"}, "rollout.max_failures", "0% to 100%"),
        ({"pause_seconds": -1}, "rollout.pause_seconds", "greater than or equal to 0"),
        ({"canry": 1}, "rollout.canry", "did you mean 'canary'"),
    ],
)
def test_bad_rollout_values_name_the_parameter_and_what_is_valid(
    rollout: dict[str, Any], key: str, words: str
) -> None:
    with pytest.raises(ParametersInvalid) as info:
        _params(rollout=rollout)
    text = str(info.value)
    assert key in text and words in text


def test_rollout_defaults_keep_the_old_behaviour() -> None:
    params = _params()
    assert (params.rollout.canary, params.rollout.max_failures, params.rollout.pause_seconds) == (None, 0, 0)
    assert _params(rollout={"max_failures": "5%", "canary": 1}).rollout.max_failures == "5%"


# -- config-patch step ----------------------------------------------------------------------------------------


def _record_applies(
    ctx: Context, on_apply: Callable[[list[str]], None] | None = None
) -> list[tuple[float, list[str]]]:
    """Wrap the patch client: (start time, addresses) of every applying call, in order."""
    calls: list[tuple[float, list[str]]] = []
    patch = ctx.talosctl.patch_machineconfigs

    def recording(patches: Any, *, dry_run: bool, **kw: Any) -> Any:
        if not dry_run:
            addresses = [a for _patch, group in patches for a in group]
            calls.append((time.monotonic(), addresses))
            if on_apply:
                on_apply(addresses)
        return patch(patches, dry_run=dry_run, **kw)

    ctx.talosctl.patch_machineconfigs = recording  # type: ignore[method-assign]
    return calls


@pytest.mark.slow
def test_patch_plan_shows_the_batch_schedule_and_apply_follows_it(tmp_path: Path) -> None:
    with sim_cluster(tmp_path, workers=4, daemon=False, rollout_concurrency=2, rollout={"canary": 1}) as (
        params,
        ctx,
    ):
        plan = config_patch(ctx, apply=False)
        calls = _record_applies(ctx)
        config_patch(ctx, apply=True)
    names = [n.name for n in params.nodes]
    assert any("batch(es) of 1, 2, 1" in note for note in plan.notes)
    assert plan.data["batches"] == [names[:1], names[1:3], names[3:]]
    address = {n.name: n.address for n in params.nodes}
    assert [sorted(a) for _t, a in calls] == [sorted(address[n] for n in b) for b in plan.data["batches"]]


def _unreachable_when_applied(state: Path, victims: list[str]) -> Callable[[list[str]], None]:
    def on_apply(addresses: list[str]) -> None:
        for victim in victims:
            node = load_node(state, victim)
            if node.address in addresses:
                inject_fault(state, victim, "unreachable", "refused")

    return on_apply


@pytest.mark.slow
def test_patch_failure_budget_lets_one_node_fail_and_stops_after_the_second(tmp_path: Path) -> None:
    with sim_cluster(tmp_path, workers=4, daemon=False, apply=True, rollout={"max_failures": 1}) as (
        params,
        ctx,
    ):
        first, second, *later = params.nodes
        _record_applies(ctx, _unreachable_when_applied(tmp_path, [first.name, second.name]))
        result = config_patch(ctx)
    assert [result.node(n.name).status for n in params.nodes] == ["failed", "failed", "skipped", "skipped"]
    assert all(f"after {second.name} failed" in result.node(n.name).message for n in later)


@pytest.mark.slow
def test_patch_pause_between_batches(tmp_path: Path) -> None:
    with sim_cluster(tmp_path, workers=3, daemon=False, apply=True, rollout={"pause_seconds": 0.3}) as (
        _params_,
        ctx,
    ):
        calls = _record_applies(ctx)
        config_patch(ctx)
    starts = [t for t, _a in calls]
    assert len(starts) == 3
    assert all(b - a >= 0.3 for a, b in itertools.pairwise(starts))


@pytest.mark.slow
def test_patch_rerun_after_a_failed_rollout_changes_only_the_remaining_nodes(tmp_path: Path) -> None:
    with sim_cluster(tmp_path, workers=4, daemon=False, apply=True) as (params, ctx):
        done, victim, *rest = params.nodes
        _record_applies(ctx, _unreachable_when_applied(tmp_path, [victim.name]))
        first = config_patch(ctx)
        clear_fault(tmp_path, victim.name, "unreachable")
        again = connect(params, state_dir=tmp_path)
        calls = _record_applies(again)
        second = config_patch(again)
    assert [first.node(n.name).status for n in params.nodes] == ["changed", "failed", "skipped", "skipped"]
    assert second.node(done.name).status == "unchanged"
    assert [second.node(n.name).status for n in [victim, *rest]] == ["changed"] * 3
    assert sorted(a for _t, group in calls for a in group) == sorted(n.address for n in [victim, *rest])


# -- image step ----------------------------------------------------------------------------------------------


@pytest.fixture
def image_sim(tmp_path: Path) -> Iterator[Path]:
    state = tmp_path / "sim"
    # config-patched: the image step refuses nodes whose config lacks the modules patch
    with factory_only(state, workers=3, scenario="config-patched"):
        yield state


def _image_ctx(state: Path, *, apply: bool, **extra: object) -> Context:
    nodes = [{"name": name, "address": f"10.5.0.{3 + i}"} for i, name in enumerate(WORKERS)]
    data = {"cluster": "sim-gpu", "talos_version": "v1.12.7", "nodes": nodes, "track": "lts", "apply": apply}
    path = state.parent / "params.yaml"
    path.write_text(yaml.safe_dump({**data, **extra}))
    return connect(load_params(str(path), []), state_dir=state)


def _upgrade(ctx: Context) -> StepResult:
    return image_upgrade(ctx, settle_timeout=5.0, poll_interval=0.1)


def _record_upgrades(ctx: Context) -> list[tuple[float, str]]:
    """Each node's upgrade call start: the image step upgrades a chunk of a batch in one talosctl (upgrade_nodes,
    715bcc5), and a single node through ``upgrade``, which calls it."""
    calls: list[tuple[float, str]] = []
    upgrade_nodes = ctx.talosctl.upgrade_nodes

    def recording(nodes: list[str], *args: Any, **kw: Any) -> Any:
        started = time.monotonic()
        calls.extend((started, address) for address in nodes)
        return upgrade_nodes(nodes, *args, **kw)

    ctx.talosctl.upgrade_nodes = recording  # type: ignore[method-assign]
    return calls


@pytest.mark.slow
def test_image_plan_shows_the_schedule_and_a_failed_canary_protects_the_rest(image_sim: Path) -> None:
    plan = _upgrade(_image_ctx(image_sim, apply=False, rollout_concurrency=2, rollout={"canary": 1}))
    assert plan.data["batches"] == [WORKERS[:1], WORKERS[1:]]
    assert any("batch(es) of 1, 2" in note for note in plan.notes)
    inject_fault(image_sim, "talos-worker-1", "upgrade_fails")
    result = _upgrade(_image_ctx(image_sim, apply=True, rollout_concurrency=2, rollout={"canary": 1}))
    # without the canary, worker-2 would have been upgraded alongside worker-1 (rollout_concurrency 2)
    assert result.data["failed"] == ["talos-worker-1"]
    assert result.data["untouched"] == WORKERS[1:]
    assert node_state(image_sim, "talos-worker-2").schematic_id == VANILLA_SCHEMATIC


@pytest.mark.slow
def test_image_failure_budget_as_a_percentage_keeps_going_within_it(image_sim: Path) -> None:
    inject_fault(image_sim, "talos-worker-1", "upgrade_fails")
    result = _upgrade(_image_ctx(image_sim, apply=True, rollout={"max_failures": "50%"}))  # 1 of 3 nodes
    assert result.data["failed"] == ["talos-worker-1"]
    assert result.data["done"] == WORKERS[1:]


@pytest.mark.slow
def test_image_pause_between_batches(image_sim: Path) -> None:
    ctx = _image_ctx(image_sim, apply=True, rollout={"pause_seconds": 0.3})
    calls = _record_upgrades(ctx)
    assert _upgrade(ctx).data["done"] == WORKERS
    starts = [t for t, _a in calls]
    assert len(starts) == 3 and all(b - a >= 0.3 for a, b in itertools.pairwise(starts))


@pytest.mark.slow
def test_image_rerun_after_a_failed_rollout_upgrades_only_the_remaining_nodes(image_sim: Path) -> None:
    inject_fault(image_sim, "talos-worker-2", "upgrade_fails")
    first = _upgrade(_image_ctx(image_sim, apply=True))
    assert (first.data["done"], first.data["failed"], first.data["untouched"]) == (
        WORKERS[:1],
        WORKERS[1:2],
        WORKERS[2:],
    )
    clear_fault(image_sim, "talos-worker-2", "upgrade_fails")
    ctx = _image_ctx(image_sim, apply=True)
    calls = _record_upgrades(ctx)
    second = _upgrade(ctx)
    assert second.data["already"] == WORKERS[:1]
    assert second.data["done"] == WORKERS[1:]
    assert [a for _t, a in calls] == ["10.5.0.4", "10.5.0.5"]


def test_parameter_table_names_the_budget_type_without_breaking_the_markdown_row() -> None:
    """A bare ``int | str`` would add a column to the README's Markdown table."""
    types_by_key = {key: typ for key, typ, _default, _desc in parameter_rows()}
    assert types_by_key["rollout.max_failures"] == "int or str"
    assert types_by_key["extra_extensions"] == "list[str]"
    assert all(line.count(" | ") == 3 for line in parameters_markdown().splitlines()[2:])
