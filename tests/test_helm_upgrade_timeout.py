"""The runbook never kills a ``helm upgrade --install`` that helm itself would still let run.

helm gives the pre-upgrade hooks, the wait for the release's resources and the post-upgrade hooks its whole
``--timeout`` each (helm@v4.1.4 pkg/action/upgrade.go:457, 490-496, 505; install.go:505, 542-551), and the GPU
Operator chart runs a pre-upgrade hook Job (``gpu-operator-upgrade-crd``). The runbook stopped helm at ``--timeout``
+ 60 s, so a slow hook followed by a slow rollout got helm killed, leaving the release ``pending-upgrade``, which
every later helm refuses (what the step then says: tests/test_helm_existing_release.py, the killed-helm test).
"""

from __future__ import annotations

from typing import Any

from runbook_lib.clients.helm import Helm
from runbook_lib.clients.proc import CommandResult


class Recording:
    """A runner that records how long each command may run and answers success."""

    def __init__(self) -> None:
        self.timeouts: list[float] = []

    def run(self, argv: list[str], **kwargs: Any) -> CommandResult:
        self.timeouts.append(kwargs["timeout"])
        return CommandResult(tuple(argv), 0, "", "", 0.1)


def test_helm_may_run_its_three_timed_phases_before_the_runbook_stops_it() -> None:
    runner = Recording()
    helm = Helm("helm", runner=runner)  # type: ignore[arg-type]  # the one method Helm calls
    helm.upgrade_install(
        "gpu-operator",
        "nvidia/gpu-operator",
        version="v26.3.1",
        namespace="gpu-operator",
        values={},
        timeout_s=300,
    )
    assert runner.timeouts == [3 * 300 + 60]
