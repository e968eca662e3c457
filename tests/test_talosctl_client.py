"""The talosctl client's patch fan-out, without a cluster: how a node list becomes concurrent chunk calls,
and how each call's stderr becomes per-node outcomes (patched, failed, never touched)."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest

from runbook_lib.clients.proc import CommandResult, Runner
from runbook_lib.clients.talosctl import (
    PATCH_CALLS,
    PatchCall,
    PatchResult,
    Talosctl,
    get_chunk_size,
    patch_chunk_size,
    pipeline_chunk_size,
)

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


@pytest.mark.parametrize(("nodes", "size"), [(0, 1), (1, 1), (16, 1), (17, 2), (100, 7), (1000, 63)])
def test_patch_chunk_size_keeps_the_number_of_calls_at_most_16(nodes: int, size: int) -> None:
    assert patch_chunk_size(nodes) == size
    assert -(-nodes // size) <= PATCH_CALLS == 16


@pytest.mark.parametrize(
    ("nodes", "size"), [(1, 1), (10, 10), (32, 32), (33, 17), (64, 32), (100, 25), (1000, 125)]
)
def test_the_dry_run_takes_no_more_chunks_than_chunks_of_32_nodes_make_and_at_most_8(
    nodes: int, size: int
) -> None:
    """The config-patch dry run reads and dry-runs chunk by chunk (``Talosctl.pipeline``): each chunk is two
    talosctl processes in a row.  With the real talosctl v1.12.0 against simnode at 2 ms, 10 nodes as 10
    single-node chunks (20 processes) took 0.60 s where one chunk (2 processes) took 0.30 s: the processes, not
    the nodes' latency, decide there.  On a quiet machine (4 Dec 2026, load 0.2), the library's dry run of 100
    nodes took 1.17 s in 4 chunks of 25 against 1.50 s in 2 of 50 and 1.23 s in 7 of 15 (median of 5 each,
    alternating; benchmarks/README.md, issue 16).  Chunks are even (100 -> 4 of 25, not 32, 32, 32 and 4), so one
    can hold fewer than 32 nodes (33 -> 2 of 17)."""
    chunks = Talosctl(runner=RecordingRunner()).pipeline(NODES[:nodes], lambda chunk: chunk)
    assert pipeline_chunk_size(nodes) == size == max(len(c) for c in chunks)
    assert len(chunks) <= 8 and max(len(c) for c in chunks) - min(len(c) for c in chunks) <= 1
    assert [n for c in chunks for n in c] == NODES[:nodes]  # every node once, in order


def test_eight_nodes_are_eight_single_node_calls_run_at_once() -> None:
    runner = RecordingRunner(barrier=threading.Barrier(8))
    result = Talosctl(runner=runner).patch_machineconfig(NODES[:8], "machine: {}\n", dry_run=False)
    assert sorted(runner.calls) == sorted([n] for n in NODES[:8])
    assert runner.most_at_once == 8
    assert result.ok and result.outcomes() == ({}, {})
    assert all(call.result.changes_cluster for call in result.calls)


def test_a_thousand_nodes_are_16_calls_and_never_more_than_16_processes_at_once() -> None:
    runner = RecordingRunner()
    Talosctl(runner=runner).patch_machineconfig(NODES, "machine: {}\n", dry_run=True)
    assert len(runner.calls) == 16 and max(len(c) for c in runner.calls) == 63
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
    # 16 chunks of 6: NODES[0:6] is one call, which patched NODES[:4] and never reached NODES[5]
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
    # the first node down: talosctl stops there, before any node's line, with an error naming no node
    # (the real talosctl v1.12.0: tests/sim/test_talosctl_patch.py test_patch_stops_at_the_first_failing_node);
    # it failed every node of the call, counting the untouched ones against the failure budget
    down = call(_dial_error("10.0.0.1") + "\n", "10.0.0.1", "10.0.0.2", "10.0.0.3")
    assert down.outcome() == (
        {"10.0.0.1": _dial_error("10.0.0.1")},
        {"10.0.0.2": "10.0.0.1", "10.0.0.3": "10.0.0.1"},
    )
    # the same after talosctl's version-check warning, printed when the nodes are older than talosctl
    # (talos v1.12.0 helpers/checks.go:76): config-patch runs before the image upgrade, so it usually is
    warned = call(
        "WARNING: 10.0.0.2: server version 1.11.5 is older than client version 1.12.0\n"
        + _dial_error("10.0.0.1")
        + "\n",
        "10.0.0.1",
        "10.0.0.2",
    )
    assert warned.outcome() == ({"10.0.0.1": _dial_error("10.0.0.1")}, {"10.0.0.2": "10.0.0.1"})
    # a gRPC error of the whole call (the endpoint down, an expired certificate) is every node's
    endpoint = call(_dial_error("10.9.9.9") + "\n", "10.0.0.1", "10.0.0.2")
    assert set(endpoint.outcome()[0]) == {"10.0.0.1", "10.0.0.2"}
    expired = call(
        'rpc error: code = Unavailable desc = connection error: desc = "transport: authentication handshake '
        'failed: tls: failed to verify certificate: x509: certificate has expired or is not yet valid"\n',
        "10.0.0.1",
        "10.0.0.2",
    )
    assert set(expired.outcome()[0]) == {"10.0.0.1", "10.0.0.2"}
    # 10.0.0.1 is a prefix of 10.0.0.10: the longer address wins
    prefix = call("10.0.0.10: refused\n", "10.0.0.1", "10.0.0.10", "10.0.0.11")
    assert prefix.outcome() == ({"10.0.0.10": "refused"}, {"10.0.0.11": "10.0.0.10"})


# -- get over many nodes: errors as the real talosctl prints them ------------------------------------------


def _dial_error(node: str) -> str:
    """A dead node's error as gRPC reports it through apid (one-to-one for COSI calls)."""
    return (
        'rpc error: code = Unavailable desc = connection error: desc = "transport: Error while dialing: '
        f'dial tcp {node}:50000: connect: connection refused"'
    )


def _multierror(errors: list[str]) -> str:
    """hashicorp/go-multierror's format, then talosctl's root.go ``fmt.Fprintln(os.Stderr, err.Error())``."""
    points = "\n\t".join(f"* {e}" for e in errors)
    noun = "error" if len(errors) == 1 else "errors"
    return f"{len(errors)} {noun} occurred:\n\t{points}\n\n\n"


class RealShapedTalosctl(Runner):
    """``talosctl get`` and ``talosctl version`` with some nodes down, shaped as talosctl v1.12.0 prints them.

    * ``get`` (cmd/talosctl/cmd/talos/get.go:185-209 at siderolabs/talos v1.12.0): each node's COSI error is
      appended to a multierror *raw*, with no node prefix (COSI calls go one-to-one through apid,
      internal/app/apid/pkg/director/director.go); and ``helpers.ForEachResource`` first resolves the
      resource type on the FIRST ``-n`` node (cmd/talosctl/pkg/talos/helpers/resources.go:49), so when that
      node is down the whole call fails with the bare error before anything is printed.
    * ``version`` (cmd/talosctl/cmd/talos/version.go at v1.12.0) is one-to-many: ``FilterMessages``
      (pkg/machinery/client/reply.go) wraps each node's error as ``<node>: <error>`` and talosctl prints
      them as ``WARNING: <multierror>`` while still printing the nodes that answered.
    """

    def __init__(self, down: set[str]) -> None:
        super().__init__()
        self.down = down
        self.calls: list[tuple[str, list[str]]] = []
        self._lock = threading.Lock()

    def run(self, argv: Sequence[str], **kwargs: Any) -> CommandResult:
        nodes = argv[argv.index("-n") + 1].split(",")
        command = argv[argv.index("-n") + 2]
        with self._lock:
            self.calls.append((command, nodes))
        if command == "version":
            return self._version(argv, nodes)
        if command == "service":
            return self._services(argv, nodes)
        if nodes[0] in self.down:
            return CommandResult(tuple(argv), 1, "", _dial_error(nodes[0]) + "\n", 0.0)
        stdout = "".join(
            '{\n    "metadata": {\n        "id": "0",\n        "type": "ExtensionStatuses.runtime.talos.dev"\n'
            f'    }},\n    "node": "{n}",\n    "spec": {{\n        "metadata": {{\n'
            '            "name": "nvidia-container-toolkit-lts",\n            "version": "580.95.05-v1.17.8"\n'
            "        }\n    }\n}\n"
            for n in nodes
            if n not in self.down
        )
        errors = [_dial_error(n) for n in nodes if n in self.down]
        return CommandResult(
            tuple(argv), 1 if errors else 0, stdout, _multierror(errors) if errors else "", 0.0
        )

    def _version(self, argv: Sequence[str], nodes: list[str]) -> CommandResult:
        stdout = "Client:\n\tTag:         v1.12.0\n"
        up = [n for n in nodes if n not in self.down]
        errors = [f"{n}: {_dial_error(n)}" for n in nodes if n in self.down]
        if not up:
            return CommandResult(tuple(argv), 1, stdout, f"error getting version: {_multierror(errors)}", 0.0)
        stdout += "Server:\n" + "".join(f"\tNODE:        {n}\n\tTag:         v1.12.0\n" for n in up)
        return CommandResult(tuple(argv), 0, stdout, f"WARNING: {_multierror(errors)}" if errors else "", 0.0)

    def _services(self, argv: Sequence[str], nodes: list[str]) -> CommandResult:
        """``talosctl services``: the ServiceList API, one-to-many like ``version``, as talos v1.13.0
        cmd/talosctl/cmd/talos/service.go:73-100 prints it (tabwriter, padding 3; ``%s ago``)."""
        errors = [f"{n}: {_dial_error(n)}" for n in nodes if n in self.down]
        up = [n for n in nodes if n not in self.down]
        if not up:
            return CommandResult(tuple(argv), 1, "", f"error listing services: {_multierror(errors)}", 0.0)
        rows = "".join(
            f"{n}   ext-nvidia-cdi-gen        Finished   ?        11m50s ago    Service finished successfully\n"
            f"{n}   ext-nvidia-persistenced   Running    ?        11m52s ago    Started task "
            "ext-nvidia-persistenced (PID 2417) for container ext-nvidia-persistenced\n"
            for n in up
        )
        header = (
            "NODE"
            + " " * (len(up[0]) - 1)
            + "SERVICE                   STATE      HEALTH   LAST CHANGE   LAST EVENT\n"
        )
        return CommandResult(
            tuple(argv), 0, header + rows, f"WARNING: {_multierror(errors)}" if errors else "", 0.0
        )


def test_services_read_finished_one_shots_and_name_the_dead_node() -> None:
    nodes = NODES[:5]
    runner = RealShapedTalosctl(down={nodes[0]})
    services, errors = Talosctl(runner=runner).services(nodes)
    assert set(errors) == {nodes[0]} and "connection refused" in errors[nodes[0]]
    assert sorted(services) == sorted(nodes[1:])
    assert services[nodes[3]]["ext-nvidia-cdi-gen"].state == "Finished"
    assert services[nodes[3]]["ext-nvidia-persistenced"].running is True
    assert [command for command, _nodes in runner.calls] == ["service"]  # one call: errors name their node
    _services, all_down = Talosctl(runner=RealShapedTalosctl(down={nodes[0]})).services(nodes[:1])
    assert set(all_down) == {nodes[0]}


@pytest.mark.parametrize("dead", [0, 1, 125, 249], ids=["head", "second", "middle", "end"])
def test_one_dead_node_fails_only_itself_wherever_it_is_in_the_chunk(dead: int) -> None:
    nodes = NODES[:250]
    runner = RealShapedTalosctl(down={nodes[dead]})
    fan = Talosctl(runner=runner).get("extensions", nodes)
    assert set(fan.errors) == {nodes[dead]}
    assert "connection refused" in fan.errors[nodes[dead]]
    assert sorted(fan.by_node()) == sorted(n for n in nodes if n != nodes[dead])
    assert all(len(rows) == 1 for rows in fan.by_node().values())  # no node's answer counted twice


def test_a_thousand_nodes_with_dead_ones_cost_a_few_calls_not_one_per_node() -> None:
    dead = {NODES[0], NODES[600], NODES[999]}
    runner = RealShapedTalosctl(down=dead)
    fan = Talosctl(runner=runner).get("extensions", NODES)
    assert set(fan.errors) == dead
    assert len(fan.by_node()) == 1000 - len(dead)
    # 4 chunks of 250; in the three with a dead node: the get, one version probe, the get of the live nodes
    assert len(runner.calls) == 4 + 3 * 2


def test_every_node_down_is_every_node_failed() -> None:
    nodes = NODES[:3]
    fan = Talosctl(runner=RealShapedTalosctl(down=set(nodes))).get("extensions", nodes)
    assert set(fan.errors) == set(nodes) and not fan.resources


# -- how a fleet is split (benchmarks/bench_real_talosctl.py measured the sizes) ------------------------------


class CountingShapedTalosctl(RealShapedTalosctl):
    """:class:`RealShapedTalosctl` whose calls take a moment, counting how many run at once; ``read`` answers
    with a driver version that names the node, so a test sees whose answer went where."""

    def __init__(self, down: set[str]) -> None:
        super().__init__(down)
        self.running = 0
        self.most_at_once = 0

    def run(self, argv: Sequence[str], **kwargs: Any) -> CommandResult:
        with self._lock:
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
        time.sleep(0.005)
        with self._lock:
            self.running -= 1
        if argv[argv.index("-n") + 2] != "read":
            return super().run(argv, **kwargs)
        node = argv[argv.index("-n") + 1]
        with self._lock:
            self.calls.append(("read", [node]))
        if node in self.down:
            return CommandResult(tuple(argv), 1, "", _dial_error(node) + "\n", 0.0)
        return CommandResult(tuple(argv), 0, f"NVRM version: 570.172.08 on {node}\n", "", 0.0)


@pytest.mark.parametrize(
    ("count", "calls", "largest"),
    [(10, 1, 10), (32, 1, 32), (100, 4, 32), (1000, 4, 250)],
    ids=["10", "32", "100", "1000"],
)
def test_a_get_is_one_call_on_small_fleets_and_4_chunks_on_big_ones(
    count: int, calls: int, largest: int
) -> None:
    """The real get is sequential over its nodes: big fleets are split into 4 concurrent chunks, small ones
    are not split below 32 nodes a call (each process costs more than a few more nodes in a row)."""
    runner = CountingShapedTalosctl(down=set())
    fan = Talosctl(runner=runner).get("extensions", NODES[:count])
    sizes = [len(nodes) for _command, nodes in runner.calls]
    assert len(sizes) == calls and max(sizes) == largest == min(count, get_chunk_size(count))
    assert sorted(n for _command, nodes in runner.calls for n in nodes) == sorted(NODES[:count])
    assert runner.most_at_once <= PATCH_CALLS
    assert not fan.errors and len(fan.by_node()) == count


def test_a_dead_node_in_a_later_chunk_fails_alone_and_answers_keep_the_node_order() -> None:
    dead = NODES[600]  # the 3rd of 4 chunks of 250, in its middle
    fan = Talosctl(runner=CountingShapedTalosctl(down={dead})).get("extensions", NODES)
    assert set(fan.errors) == {dead} and "connection refused" in fan.errors[dead]
    assert [r.node for r in fan.resources] == [n for n in NODES if n != dead]


def test_per_node_reads_run_at_most_16_at_once_each_answer_on_its_own_node() -> None:
    runner = CountingShapedTalosctl(down={NODES[7]})
    reads = Talosctl(runner=runner).read("/proc/driver/nvidia/version", NODES[:40])
    assert runner.most_at_once <= PATCH_CALLS
    assert list(reads) == NODES[:40]  # in the order asked
    assert reads[NODES[7]].text is None and "connection refused" in (reads[NODES[7]].error or "")
    assert all(reads[n].text == f"NVRM version: 570.172.08 on {n}\n" for n in NODES[:40] if n != NODES[7])


# -- patch outcomes from the `patched ... at the node X` lines (reality-gaps.md §1 findings 13, 14) -----------

PATCHED = "patched MachineConfigs.config.talos.dev/v1alpha1 at the node {}\n"


def _patch_call(nodes: Sequence[str], exit_code: int, stdout: str, stderr: str) -> PatchCall:
    return PatchCall(tuple(nodes), CommandResult(("talosctl", "patch"), exit_code, stdout, stderr, 0.0))


def test_an_unprefixed_patch_error_fails_the_next_node_not_the_ones_already_patched() -> None:
    """talosctl patch visits its nodes in order (talos v1.12.0 cmd/talosctl/cmd/talos/patch.go:139-144) and
    prints ``patched … at the node X`` for each one done (:100-104).  A node that is down fails in
    ``ForEachResource``'s ``ResolveResourceKind`` (helpers/resources.go:49), whose error carries no node."""
    a, b, c = NODES[:3]
    stderr = PATCHED.format(a) + "Applied configuration without a reboot\n" + _dial_error(b) + "\n"
    failed, untouched = _patch_call((a, b, c), 1, "", stderr).outcome()
    assert failed == {b: _dial_error(b)}
    assert untouched == {c: b}


def test_an_unprefixed_error_after_every_node_printed_is_the_last_nodes() -> None:
    """``patchFn`` prints ``patched … at the node X`` before it returns the ApplyConfiguration error
    (talos v1.12.0 patch.go:87-111), so when every node printed and the call still failed, the last one failed."""
    a, b = NODES[:2]
    stderr = PATCHED.format(a) + "Applied configuration without a reboot\n" + PATCHED.format(b) + "boom\n"
    assert _patch_call((a, b), 1, "", stderr).outcome() == ({b: "boom"}, {})


# Captured from the real talosctl v1.14.1 (`patch mc` over three nodes, no --dry-run) against simnode, the middle
# node's config holding a kubelet image too new for its Talos. From 1.14 each node's calls go through
# ``client.WithNode`` (talos v1.14.0-rc.1 cmd/talosctl/pkg/talos/global/factory.go:135-170), a one-to-one
# proxy whose error names no node, printed after the node's ``patched`` line (patch.go, patchFn): the last
# node to print a line without an apply result is the one that failed; the node after it was never touched.
UNNAMED_114_REFUSAL = (
    "patched MachineConfigs.config.talos.dev/v1alpha1 at the node 10.5.0.3\n"
    "Applied configuration without a reboot\n"
    "patched MachineConfigs.config.talos.dev/v1alpha1 at the node 10.5.0.4\n"
    "rpc error: code = InvalidArgument desc = 1 error occurred:\n"
    "\t* v1alpha1.Config: 1 error occurred:\n"
    "\t* kubelet image is not valid: version of Kubernetes 1.99.0 is too new to be used with Talos 1.14.1\n"
    "\n\n\n\n\n"
)


def test_talosctl_1_14_unnamed_apply_error_fails_the_node_that_printed_it_not_the_next() -> None:
    nodes = ("10.5.0.3", "10.5.0.4", "10.5.0.5")
    failed, untouched = _patch_call(nodes, 1, "", UNNAMED_114_REFUSAL).outcome()
    assert list(failed) == ["10.5.0.4"]
    assert failed["10.5.0.4"].startswith("rpc error: code = InvalidArgument")
    assert failed["10.5.0.4"].endswith("too new to be used with Talos 1.14.1")
    assert untouched == {"10.5.0.5": "10.5.0.4"}


def test_a_node_that_printed_its_dry_run_summary_is_not_the_one_that_failed() -> None:
    """A dry run's result starts with ``Dry run summary:`` (no "Applied"): that node got through; the error is
    the next node's, which failed before printing (a node down, ``error getting resource`` names it; a patch
    that does not merge names none)."""
    a, b, c = NODES[:3]
    stderr = (
        _dry_run_block(a) + "\nJSON6902 patches are not supported for multi-document machine configuration\n"
    )
    failed, untouched = _patch_call((a, b, c), 1, "", stderr).outcome()
    assert list(failed) == [b] and untouched == {c: b}


def test_talosctl_1_3_prints_patch_results_on_stdout() -> None:
    """talos v1.3.0 cmd/talosctl/cmd/talos/patch.go:74-79 and helpers/mode.go:122-131 use fmt.Println and
    fmt.Printf: results go to stdout (stderr from v1.4.0)."""
    a, b = NODES[:2]
    stdout = (
        PATCHED.format(a)
        + "Applied configuration with a reboot\n"
        + "Apply was skipped: no changes detected.\n"
    )
    result = PatchResult((_patch_call((a, b), 0, stdout, ""),))
    assert "with a reboot" in result.details_of(a)
    assert "with a reboot" not in result.details_of(b)
    assert "patched MachineConfigs" in result.output
    # and on 1.3 a failure still leaves the printed node patched
    failing = _patch_call((a, b), 1, PATCHED.format(a) + "Applied configuration with a reboot\n", "boom\n")
    assert failing.outcome() == ({b: "boom"}, {})


def test_reboot_is_read_per_node_not_per_call() -> None:
    a, b = NODES[:2]
    stderr = (
        PATCHED.format(a)
        + "Applied configuration without a reboot\n"
        + PATCHED.format(b)
        + "Applied configuration with a reboot\n"
    )
    result = PatchResult((_patch_call((a, b), 0, "", stderr),))
    assert "with a reboot" not in result.details_of(a) and "with a reboot" in result.details_of(b)


class LogsRunner(Runner):
    """``talosctl logs``: one-to-many, each line printed as ``<node>: <line>`` (talos v1.13.0
    cmd/talosctl/cmd/talos/logs.go:92)."""

    def run(self, argv: Sequence[str], **kwargs: Any) -> CommandResult:
        stdout = (
            '10.0.0.10: level=warning msg="Could not locate a: not found"\n10.0.0.1: level=info msg="x"\n'
        )
        return CommandResult(tuple(argv), 0, stdout, "", 0.0)


def test_logs_lines_go_to_their_node_even_when_one_address_prefixes_another() -> None:
    logs, errors = Talosctl(runner=LogsRunner()).logs("ext-nvidia-cdi-gen", ["10.0.0.1", "10.0.0.10"])
    assert logs == {
        "10.0.0.10": 'level=warning msg="Could not locate a: not found"\n',
        "10.0.0.1": 'level=info msg="x"\n',
    }
    assert errors == {}


# Captured from the real talosctl v1.13.0 (`patch machineconfig --dry-run`, one node) against simnode: the node's
# refusal is Talos's own config validation (pkg/machinery v1.12.0, a go-multierror nested in the gRPC status),
# wrapped per node as apid's backend does (simnode's copy of talos@v1.12.0 internal/app/apid/pkg/backend/apid.go
# BuildError) and printed by the client's own multierror: the nested list is not indented.
NESTED_REFUSAL = (
    "patched MachineConfigs.config.talos.dev/v1alpha1 at the node 10.5.0.11\n"
    "1 error occurred:\n"
    "\t* 10.5.0.11: rpc error: code = InvalidArgument desc = 1 error occurred:\n"
    "\t* v1alpha1.Config: 1 error occurred:\n"
    "\t* kubelet image is not valid: version of Kubernetes 1.36.0 is too new to be used with Talos 1.12.0\n"
    "\n\n\n\n\n\n"
)


def test_a_nested_validation_error_keeps_its_cause_on_the_node() -> None:
    """The node's message must carry the cause (the last nested line), not stop at "1 error occurred:"."""
    refused = PatchCall(("10.5.0.11",), CommandResult(("talosctl",), 1, "", NESTED_REFUSAL, 0.0))
    errors, _ = refused.outcome()
    assert errors["10.5.0.11"].endswith(
        "kubelet image is not valid: version of Kubernetes 1.36.0 is too new to be used with Talos 1.12.0"
    )
    assert errors["10.5.0.11"].startswith("rpc error: code = InvalidArgument desc = 1 error occurred:")


def test_a_nested_error_ends_where_the_next_node_begins() -> None:
    two = (
        NESTED_REFUSAL.replace("\n\n\n\n\n\n", "\n\n\n")
        + "\t* 10.5.0.12: rpc error: code = Unavailable desc = x\n"
    )
    refused = PatchCall(("10.5.0.11", "10.5.0.12"), CommandResult(("talosctl",), 1, "", two, 0.0))
    errors, _ = refused.outcome()
    assert errors["10.5.0.12"] == "rpc error: code = Unavailable desc = x"
    assert "10.5.0.12" not in errors["10.5.0.11"] and errors["10.5.0.11"].endswith("Talos 1.12.0")


def _dry_run_block(node: str) -> str:
    """What talosctl v1.12.0 prints on stderr per node of ``patch mc --dry-run`` (seen against simnode; the
    diff's last context lines, the cluster id and secret, left out)."""
    return (
        PATCHED.format(node)
        + "Dry run summary:\nApplied configuration without a reboot (skipped in dry-run).\nConfig diff:\n\n"
        + "--- a\n+++ b\n@@ -18,6 +18,8 @@\n         image: ghcr.io/siderolabs/installer:v1.12.0\n"
        + "         wipe: false\n         grubUseUKICmdline: true\n+    sysctls:\n"
        + '+        net.core.bpf_jit_harden: "1"\n     features:\n         diskQuotaSupport: true\n'
        + "         kubePrism:\n@@ -26,6 +28,12 @@\n         hostDNS:\n             enabled: true\n"
        + "             forwardKubeDNSToHost: true\n+    kernel:\n+        modules:\n"
        + "+            - name: nvidia\n+            - name: nvidia_uvm\n+            - name: nvidia_drm\n"
        + "+            - name: nvidia_modeset\n cluster:\n\n"
    )


def test_reading_each_nodes_dry_run_result_on_a_thousand_nodes_costs_well_under_a_second_of_cpu() -> None:
    """The config-patch step asks every node's details (does it need a reboot?): each question re-parsed the
    whole output of the node's chunk call: 1,000 x 125 nodes of dry-run diff (chunks of 125 as they were then),
    0.9 s of CPU here (the largest item of the step's profile on 1,000 nodes with the real talosctl on simnode,
    benchmarks/bench_real_talosctl.py).
    CPU time, not wall time: a loaded machine must not fail it."""
    calls = tuple(
        _patch_call(part, 0, "", "".join(_dry_run_block(n) for n in part))
        for part in (NODES[i : i + 125] for i in range(0, 1000, 125))
    )
    result = PatchResult(calls)
    start = time.process_time()
    details = {node: result.details_of(node) for node in NODES}
    cpu = time.process_time() - start
    assert all(
        d.startswith("Dry run summary:\nApplied configuration without a reboot") for d in details.values()
    )
    assert all(d.endswith("+            - name: nvidia_modeset\n cluster:\n\n") for d in details.values())
    assert cpu < 0.25, f"details of 1,000 nodes took {cpu:.2f} s of CPU"
