"""A step's wait given as 0 or less is refused, naming the argument, before the step touches anything.

It used to be read as ``given or default``, so ``image_upgrade(ctx, upgrade_timeout=0)`` silently waited the
``timeouts.upgrade_seconds`` parameter instead (noticed in the 4 Dec 2026 review). The tools here do not exist
and the Kubernetes client fails on first use: a refusal that came after any read or change would show up as a
different error.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from runbook_lib.clients.helm import Helm
from runbook_lib.clients.proc import Journal
from runbook_lib.clients.talosctl import Talosctl
from runbook_lib.errors import PermanentError
from runbook_lib.model.params import validate
from runbook_lib.model.plan import build_plan
from runbook_lib.model.rollback import Evidence
from runbook_lib.steps.context import Context, Endpoints, wait_seconds
from runbook_lib.steps.image import image_upgrade
from runbook_lib.steps.kubernetes import kubernetes_layer
from runbook_lib.steps.rollback import rollback

ROOT = Path(__file__).resolve().parents[1]
MISSING = "/nonexistent/talos-gpu-runbooks/tool"


class _NoKube:
    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the step used the Kubernetes API ({name}) before refusing its wait")


def _context() -> Context:
    params = validate(yaml.safe_load((ROOT / "params" / "simulated.yaml").read_text()), source="test")
    ctx = Context(
        params=params,
        plan=build_plan(params),
        endpoints=Endpoints(MISSING, MISSING, None, None, "https://factory.invalid"),
        journal=Journal(),
        talosctl=Talosctl(MISSING),
        helm=Helm(MISSING),
    )
    ctx._kube = _NoKube()  # type: ignore[assignment]
    return ctx


STEPS: dict[str, Callable[[Context, float], object]] = {
    "upgrade_timeout": lambda ctx, s: image_upgrade(ctx, apply=True, upgrade_timeout=s),
    "settle_timeout": lambda ctx, s: image_upgrade(ctx, apply=True, settle_timeout=s),
    "timeout_s": lambda ctx, s: kubernetes_layer(ctx, apply=True, timeout_s=s),
    "rollback settle_timeout": lambda ctx, s: rollback(
        ctx, apply=True, evidence=Evidence(records=["run-1"], nodes={}), settle_timeout=s
    ),
}


@pytest.mark.parametrize("seconds", [0, -5])
@pytest.mark.parametrize("argument", list(STEPS))
def test_a_wait_of_zero_or_less_is_refused_naming_it_before_anything_runs(
    argument: str, seconds: float
) -> None:
    ctx = _context()
    with pytest.raises(PermanentError) as refused:
        STEPS[argument](ctx, seconds)
    name = argument.rsplit(maxsplit=1)[-1]
    assert refused.value.message.startswith(f"{name}={seconds:g}:"), refused.value.message
    assert refused.value.hint is not None and "timeouts parameters" in refused.value.hint
    assert ctx.journal.entries == []


def test_a_wait_left_out_is_the_timeouts_parameter_and_a_given_one_is_kept() -> None:
    assert wait_seconds(None, 900, "upgrade_timeout") == 900.0
    assert wait_seconds(0.5, 900, "upgrade_timeout") == 0.5
