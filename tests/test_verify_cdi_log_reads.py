"""Verify reads ``ext-nvidia-cdi-gen``'s log only where the service Finished: no talosctl process per silent node.

On Talos 1.13+ a node whose ``ext-nvidia-cdi-gen`` has not started since boot (a stock node before the NVIDIA
image: verify as a pre-check) answers ``talosctl logs`` with ``log "ext-nvidia-cdi-gen" was not registered``
(talos@v1.13.0 internal/app/machined/pkg/runtime/logging/circular.go:235-247) and talosctl exits 1; the log
client then re-reads every node that printed nothing, one process each (``Talosctl._logs_chunk``). The CDI-spec
check only judges nodes where the service Finished (as Talos CI: talos@v1.13.0
internal/integration/api/extensions_nvidia.go:84-88), so those reads were 1,000 processes for nothing on a
1,000-node fleet.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from runbook_lib.clients.proc import CommandResult, Runner
from runbook_lib.steps.verify import verify
from tests.simcluster import sim_cluster


class CountingLogs(Runner):
    """Runs every talosctl call through ``inner`` and keeps the ``-n`` list of each ``talosctl logs`` call."""

    def __init__(self, inner: Runner) -> None:
        super().__init__(inner.journal)
        self.inner = inner
        self.log_calls: list[list[str]] = []

    def run(self, argv: Sequence[str], **kwargs: Any) -> CommandResult:
        if "logs" in argv:
            self.log_calls.append(argv[argv.index("-n") + 1].split(","))
        return self.inner.run(argv, **kwargs)


@pytest.mark.slow
def test_verify_of_a_stock_113_fleet_reads_no_cdi_gen_log(tmp_path: Path) -> None:
    """No NVIDIA image yet: no node ran ``ext-nvidia-cdi-gen``, so no ``talosctl logs`` call at all (before:
    one over all nodes, then one per node)."""
    with sim_cluster(tmp_path, daemon=False, scenario="fresh", talos_version="v1.13.2", workers=3) as (
        _p,
        ctx,
    ):
        runner = CountingLogs(ctx.talosctl.runner)
        ctx.talosctl.runner = runner
        result = verify(ctx)
        assert all(n.status == "failed" for n in result.nodes)  # the pre-check still says what is missing
        assert runner.log_calls == []
        assert not any(c.name == "cdi-spec" for n in result.nodes for c in n.checks)


@pytest.mark.slow
def test_verify_of_a_healthy_113_fleet_reads_the_cdi_gen_logs_in_one_call(tmp_path: Path) -> None:
    """Every node Finished ``ext-nvidia-cdi-gen``: one ``talosctl logs`` call over them all, and each node's
    CDI spec is still judged on its log."""
    with sim_cluster(tmp_path, daemon=False, scenario="gpu-ready", talos_version="v1.13.2", workers=3) as (
        p,
        ctx,
    ):
        runner = CountingLogs(ctx.talosctl.runner)
        ctx.talosctl.runner = runner
        result = verify(ctx)
        assert runner.log_calls == [[n.address for n in p.nodes]]
        assert all(n.status == "ok" for n in result.nodes), result.to_dict()
        for node in result.nodes:
            cdi = next(c for c in node.checks if c.name == "cdi-spec")
            assert cdi.ok and cdi.message.startswith("ext-nvidia-cdi-gen could not locate 9 files")
