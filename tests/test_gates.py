"""The approval gate: headless never waits and changes nothing by default; Approve applies the plan shown."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from runbook_lib.errors import ParametersInvalid
from runbook_lib.notebook.gates import ApprovalGate, ProgressBar, gated, plan_fingerprint
from runbook_lib.notebook.steps import check_notebook_parameters, injected_parameter_names
from runbook_lib.steps.results import Check, NodeResult, StepResult

NODES = ["gpu-1", "gpu-2", "gpu-3"]


class FakeStep:
    """A cluster-changing step: plans a patch per node, applies it when asked; the cluster is a dict."""

    def __init__(self) -> None:
        self.cluster: dict[str, str] = {n: "old" for n in NODES}
        self.calls: list[tuple[list[str] | None, bool]] = []
        self.fail_plan: set[str] = set()

    def _result(self, only: list[str] | None, applied: bool) -> StepResult:
        result = StepResult(step="config-patch", applied=applied)
        for name in only or NODES:
            node = NodeResult(name, f"10.0.0.{NODES.index(name) + 1}")
            if name in self.fail_plan:
                node.status = "failed"
                node.checks.append(Check("reachable", False, "connection refused"))
            elif self.cluster[name] == "new":
                node.status = "unchanged"
            else:
                node.status = "changed" if applied else "planned"
                node.diff = f"{name}: old -> new"
            result.nodes.append(node)
        return result

    def plan(self, only: list[str] | None) -> StepResult:
        self.calls.append((only, False))
        return self._result(only, applied=False)

    def apply(self, only: list[str] | None, progress: Callable[[int, int], None]) -> StepResult:
        self.calls.append((only, True))
        result = self._result(only, applied=True)
        targets = only or NODES
        for done, name in enumerate(targets, 1):
            self.cluster[name] = "new"
            progress(done, len(targets))
        return result

    @property
    def applies(self) -> list[list[str] | None]:
        return [only for only, applied in self.calls if applied]


def test_headless_default_plans_shows_the_button_and_changes_nothing() -> None:
    step = FakeStep()
    result, gate = gated(
        "config-patch", step.plan, step.apply, apply=False, nodes=NODES, selected=None, show=False
    )
    assert result.status == "planned" and not result.applied
    assert step.applies == [] and set(step.cluster.values()) == {"old"}
    assert gate is not None and gate.button.disabled is False  # offered, never awaited


def test_apply_true_applies_directly_with_progress() -> None:
    step = FakeStep()
    result, gate = gated(
        "config-patch", step.plan, step.apply, apply=True, nodes=NODES, selected=None, show=False
    )
    assert gate is None
    assert step.calls == [(None, True)]
    assert result.status == "changed" and set(step.cluster.values()) == {"new"}


def test_approve_applies_exactly_the_plan_shown_for_the_picked_nodes() -> None:
    step = FakeStep()
    applied: list[StepResult] = []
    gate = ApprovalGate("config-patch", step.plan, step.apply, nodes=NODES, on_applied=applied.append)
    gate.plan()
    gate.picker.value = ("gpu-2",)  # the node picker re-plans for the chosen node
    assert gate.shown is not None and [n.node for n in gate.shown.nodes] == ["gpu-2"]
    gate.button.click()
    assert step.applies == [["gpu-2"]]
    assert step.cluster == {"gpu-1": "old", "gpu-2": "new", "gpu-3": "old"}
    assert gate.button.disabled and gate.picker.disabled
    assert applied and applied[0].status == "changed"
    assert gate.progress.widget.value == gate.progress.widget.max == 1


def test_button_works_once() -> None:
    step = FakeStep()
    gate = ApprovalGate("config-patch", step.plan, step.apply, nodes=NODES)
    gate.plan()
    gate.button.click()
    gate.button.click()
    assert gate.approve() is None
    assert step.applies == [None]


def test_nothing_is_applied_when_the_cluster_moved_since_the_plan_was_shown() -> None:
    step = FakeStep()
    gate = ApprovalGate("config-patch", step.plan, step.apply, nodes=NODES)
    gate.plan()
    step.cluster["gpu-1"] = "new"  # someone else changed gpu-1 meanwhile
    assert gate.approve(gate.button) is None
    assert step.applies == []
    assert "changed since this plan was shown" in gate.status.value
    assert gate.button.disabled


def test_a_plan_with_failures_cannot_be_approved() -> None:
    step = FakeStep()
    step.fail_plan = {"gpu-3"}
    gate = ApprovalGate("config-patch", step.plan, step.apply, nodes=NODES)
    gate.plan()
    assert gate.button.disabled
    gate.button.click()
    assert step.applies == []


def test_nothing_to_change_disables_the_button() -> None:
    step = FakeStep()
    step.cluster = dict.fromkeys(NODES, "new")
    gate = ApprovalGate("config-patch", step.plan, step.apply, nodes=NODES)
    gate.plan()
    assert gate.button.disabled and "Nothing to change" in gate.status.value


def test_fingerprint_ignores_timings_but_not_the_diff() -> None:
    step = FakeStep()
    first, second = step.plan(None), step.plan(None)
    second.duration_s = 99.0
    assert plan_fingerprint(first) == plan_fingerprint(second)
    second.nodes[0].diff = "something else"
    assert plan_fingerprint(first) != plan_fingerprint(second)


def test_progress_bar_follows_the_rollout() -> None:
    bar = ProgressBar()
    bar(3, 10)
    assert (bar.widget.value, bar.widget.max) == (3, 10) and bar.label.value == "3/10 nodes"
    bar.finish(ok=False)
    assert bar.widget.bar_style == "danger"


def test_misspelt_notebook_parameter_is_an_error_with_a_suggestion() -> None:
    injected = injected_parameter_names(['# Parameters\nparams_file = "x.yaml"\naply = True\n', "x = 1"])
    assert injected == ["params_file", "aply"]
    with pytest.raises(ParametersInvalid, match="did you mean 'apply'"):
        check_notebook_parameters(injected)
    check_notebook_parameters(["params_file", "apply", "nodes", "overrides"])


@pytest.mark.slow
def test_approve_on_the_simulated_cluster_patches_only_the_picked_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real config-patch step behind the gate: plan (nothing changes), approve one node, re-plan."""
    from runbook_lib.cli.cmd_run import _simulated_cluster
    from runbook_lib.model.params import load_params
    from runbook_lib.steps.context import SIM_STATE_ENV, connect
    from runbook_lib.steps.patch import config_patch

    params = load_params(Path(__file__).resolve().parents[1] / "params" / "simulated.yaml")
    with _simulated_cluster(params, str(tmp_path / "sim")) as env:
        monkeypatch.setenv(SIM_STATE_ENV, env[SIM_STATE_ENV])
        ctx = connect(params)
        names = [n.name for n in params.nodes]
        result, gate = gated(
            "config-patch",
            lambda only: config_patch(ctx, only=only, apply=False),
            lambda only, progress: config_patch(ctx, only=only, apply=True, progress=progress),
            apply=False,
            nodes=names,
            selected=None,
            show=False,
        )
        assert result.counts() == {"planned": 3} and ctx.journal.changes() == []
        assert gate is not None
        gate.picker.value = ("gpu-worker-2",)
        gate.button.click()
        assert gate.applied is not None and gate.applied.counts() == {"changed": 1}
        changes = ctx.journal.changes()
        assert len(changes) == 1 and "10.5.0.12" in changes[0].argv and "10.5.0.11" not in changes[0].argv
        after = config_patch(ctx, apply=False)
        assert {n.node: n.status for n in after.nodes} == {
            "gpu-worker-1": "planned",
            "gpu-worker-2": "unchanged",
            "gpu-worker-3": "planned",
        }
