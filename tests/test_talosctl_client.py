"""The talosctl client's patch fan-out, without a cluster: how a node list becomes concurrent chunk calls,
and how each call's stderr becomes per-node outcomes (patched, failed, never touched)."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest

from runbook_lib.clients.proc import CommandResult, Runner
from runbook_lib.clients.talosctl import PATCH_CALLS, PatchCall, Talosctl, patch_chunk_size

NODES = [f"10.5.{i // 250}.{i % 250 + 1}" for i in range(1000)]


class RecordingRunner(Runner):
    """Answers every talosctl call with success after a short pause, and counts how many run at once."""

    def __init__(self, fail: dict[str, str] | None = None, barrier: threading.Barrier | None = None) -> None:
        super().__init__()
        self.barrier = barrier
        self.calls: list[list[str]] = []
        self.fail = fail or {}
        self.running = 0
        self.most_at_once = 0
        self._lock = threading.Lock()

    def run(self, argv: Sequence[str], **kwargs: Any) -> CommandResult:
        nodes = argv[argv.index("-n") + 1].split(",")
        with self._lock:
            self.calls.append(nodes)
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
        if self.barrier is not None:
            self.barrier.wait(timeout=10)  # breaks (and the test fails) unless all calls run at once
        time.sleep(0.02)
        with self._lock:
            self.running -= 1
        # like talosctl patch: node after node, returning at the first failure
        stderr = ""
        for node in nodes:
            if node in self.fail:
                return CommandResult(tuple(argv), 1, "", stderr + f"{node}: {self.fail[node]}\n", 0.02)
            stderr += f"patched MachineConfigs.config.talos.dev/v1alpha1 at the node {node}\n"
        return CommandResult(tuple(argv), 0, "", stderr, 0.02, kwargs.get("changes_cluster", False))


@pytest.mark.parametrize(("nodes", "size"), [(0, 1), (1, 1), (8, 1), (32, 1), (33, 2), (1000, 32)])
def test_chunk_size_keeps_the_number_of_calls_at_most_32(nodes: int, size: int) -> None:
    assert patch_chunk_size(nodes) == size
    assert -(-nodes // size) <= PATCH_CALLS


def test_eight_nodes_are_eight_single_node_calls_run_at_once() -> None:
    runner = RecordingRunner(barrier=threading.Barrier(8))
    result = Talosctl(runner=runner).patch_machineconfig(NODES[:8], "machine: {}\n", dry_run=False)
    assert sorted(runner.calls) == sorted([n] for n in NODES[:8])
    assert runner.most_at_once == 8
    assert result.ok and result.outcomes() == ({}, {})
    assert all(call.result.changes_cluster for call in result.calls)


def test_a_thousand_nodes_are_32_calls_and_never_more_than_32_processes_at_once() -> None:
    runner = RecordingRunner()
    Talosctl(runner=runner).patch_machineconfig(NODES, "machine: {}\n", dry_run=True)
    assert len(runner.calls) == 32 and max(len(c) for c in runner.calls) == 32
    assert sorted(n for c in runner.calls for n in c) == sorted(NODES)  # every node exactly once
    assert runner.most_at_once <= PATCH_CALLS


def test_several_patches_share_the_bound_and_keep_their_own_nodes() -> None:
    runner = RecordingRunner()
    first, second = NODES[:40], NODES[40:100]
    results = Talosctl(runner=runner).patch_machineconfigs(
        [("a: 1\n", first), ("b: 2\n", second), ("c: 3\n", [])], dry_run=False
    )
    assert [sorted(n for call in r.calls for n in call.nodes) for r in results] == [
        sorted(first),
        sorted(second),
        [],
    ]
    assert runner.most_at_once <= PATCH_CALLS
    assert results[2].calls == () and results[2].ok  # no nodes: no call (talosctl would use its defaults)


def test_a_failing_node_is_reported_on_itself_and_its_chunk_mates_after_it_untouched() -> None:
    runner = RecordingRunner(fail={NODES[4]: "rpc error: code = Unavailable desc = connection refused"})
    result = Talosctl(runner=runner).patch_machineconfig(NODES[:96], "machine: {}\n", dry_run=False)
    failed, untouched = result.outcomes()
    assert failed == {NODES[4]: "rpc error: code = Unavailable desc = connection refused"}
    # chunks of 3: NODES[3:6] is one call, which patched NODES[3] and never reached NODES[5]
    assert untouched == {NODES[5]: NODES[4]}
    assert not result.ok and "connection refused" in result.failure_text


def test_multierror_lines_and_whole_call_errors_are_attributed() -> None:
    def call(stderr: str, *nodes: str) -> PatchCall:
        return PatchCall(nodes, CommandResult(("talosctl",), 1, "", stderr, 0.0))

    multi = call("1 error occurred:\n\t* 10.0.0.2: config validation failed\n\n", "10.0.0.1", "10.0.0.2")
    assert multi.outcome() == ({"10.0.0.2": "config validation failed"}, {})
    # no node named: talosctl failed before touching any node (bad flag, unreadable patch file)
    whole = call("open /tmp/x.yaml: no such file or directory\n", "10.0.0.1", "10.0.0.2")
    assert whole.outcome() == (
        dict.fromkeys(("10.0.0.1", "10.0.0.2"), "open /tmp/x.yaml: no such file or directory"),
        {},
    )
    # 10.0.0.1 is a prefix of 10.0.0.10: the longer address wins
    prefix = call("10.0.0.10: refused\n", "10.0.0.1", "10.0.0.10", "10.0.0.11")
    assert prefix.outcome() == ({"10.0.0.10": "refused"}, {"10.0.0.11": "10.0.0.10"})
