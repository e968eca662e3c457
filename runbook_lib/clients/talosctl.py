"""The library's talosctl client: the same argv against the simulator's binary or the real one.

Why fan-out is built in: a per-node loop over 1,000 nodes costs 1,000 processes; one talosctl call takes
``-n a,b,c`` and prints the answers of the nodes that replied.  So every multi-node read here is one call
per chunk of nodes (chunks run concurrently).  Per-node errors: ``version`` and ``service`` (one-to-many
APIs) name the node in each error; ``get`` does not, so a failed ``get`` chunk is resolved with a
``version`` probe (:meth:`Talosctl._get_chunk`).  ``read`` is the exception: talosctl refuses it for several nodes
(``command "read" is not supported with multiple nodes``), so it runs per node, concurrently.  ``patch``
is the other: talosctl visits its nodes one after the other and stops at the first failure, so a patch
runs as concurrent calls over small chunks (:meth:`Talosctl.patch_machineconfigs`), and per-node outcomes
(patched, failed, never touched) are worked out per call (:class:`PatchCall`).
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TypeVar

from runbook_lib.errors import PermanentError
from runbook_lib.model.parsers import ServiceStatus, TalosResource, parse_services_by_node, parse_talosctl_get

from .fanout import concurrently
from .proc import CommandResult, Runner, is_transient

#: Most nodes in one talosctl call (``Talosctl.chunk_size``).  One-to-many calls (``version``, ``service``,
#: ``logs``) take this many: apid asks their nodes concurrently, so the bound only keeps argv short (20,000
#: addresses in one ``-n`` exceed Linux's 128 KiB per argument, F12) and caps how many nodes one apid fans out
#: to.  ``get`` and ``patch`` chunks are smaller, see :func:`get_chunk_size` and :func:`patch_chunk_size`.
DEFAULT_CHUNK = 250
#: At most this many talosctl processes at once in one fan-out (per-node ``read``, ``get`` and ``patch`` chunks;
#: ``Talosctl.parallel``), and the number of chunks a ``patch`` is split into.  Why 16 (32 until 1 Dec 2026):
#: each real talosctl is a Go process of ~15 MB of its own memory (72-86 MB RSS with the shared binary) that
#: spends ~25 ms of CPU per call on start-up and mTLS, so on 2 cores a few at once keep both cores busy when
#: nodes answer fast (1,000 ``read`` calls with the real talosctl at 2 ms latency: 35.9 s at 8 at once, 37.3 s
#: at 32), and latency needs more: at 50 ms per call 8 at once left verify latency-bound (1,000 reads x ~80 ms
#: / 8 = 10 s; verify on the Python simulator took 27.7 s against 8.1 s at 32), 16 at once (5 s) is under the
#: CPU the reads need.  And memory: verify at 1,000 nodes keeps ~40 talosctl alive at once, 591 MB PSS, next
#: to ~400 MB for the runbook and its kernels in the 1 GB budget of the process tree (issue 16).
PATCH_CALLS = 16
#: Most chunks of the config-patch dry run, and its smallest chunk (:func:`pipeline_chunk_size`).
PIPELINE_CHUNKS = 8
MIN_PIPELINE_CHUNK = 32
#: Chunks a ``get`` is split into on a big fleet (:func:`get_chunk_size`): verify runs three ``get`` kinds at
#: once next to the reads, so fewer, longer chunks hold fewer processes for the same time (1,000 nodes in
#: chunks of 128: 1.76 s, of 256: 1.73 s).
GET_CALLS = 4
#: Smallest ``get`` chunk: a real talosctl ``get`` visits its ``-n`` nodes one after another (~3.5 ms each at
#: 2 ms latency), and a process costs ~25 ms of CPU, so chunks under ~32 nodes spend more on processes than
#: they save in sequence (100 nodes: chunks of 32 0.21 s, of 8 0.36 s, one call 0.36 s).
MIN_GET_CHUNK = 32
_Out = TypeVar("_Out")
_MULTIERROR_HEAD = re.compile(r"^\d+ errors? occurred:$")
_NESTED_MULTIERROR_HEAD = re.compile(r"(?:^|\s)\d+ errors? occurred:$")
#: talosctl 1.14 asks each node on its own and joins their errors (``errors.Join``), one line each, naming the
#: node in words, as the real talosctl v1.14.1 printed them against simnode (4 Dec 2026, tests/sim/
#: test_real_talos_114.py): ``error from node <X>: …`` (siderolabs/talos v1.14.0-rc.1 cmd/talosctl/cmd/talos/
#: service.go:102, logs.go:105, list.go:121), ``error getting version from node <X>: …`` (version.go:77),
#: ``error listing resources on node <X>: …`` (get.go:136), ``error building client for node <X>: …`` (get.go:124).
_JOINED_NODE_ERROR = re.compile(r"^error (?:[a-z]+ )*?(?:from|on|for|to) node (\S+): (.*)$")


@dataclass
class FanOut:
    """Result of one logical multi-node call: answers per node plus the nodes that failed and why."""

    resources: list[TalosResource] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)
    results: list[CommandResult] = field(default_factory=list)

    def add(self, other: FanOut) -> None:
        """Fold another call's answers and errors into this one."""
        self.resources += other.resources
        self.errors.update(other.errors)
        self.results += other.results

    def by_node(self) -> dict[str, list[TalosResource]]:
        out: dict[str, list[TalosResource]] = {}
        for resource in self.resources:
            out.setdefault(resource.node or "", []).append(resource)
        return out


#: ``patched <type>/<id> at the node <node>`` (talos v1.12.0 cmd/talosctl/cmd/talos/patch.go:100-104).
_PATCHED_LINE = re.compile(r"^patched \S+ at the node (\S+)$")
_SKIPPED_LINE = "Apply was skipped: no changes detected."
#: How a node's apply result (``ModeDetails``) starts, as opposed to an error.
_RESULT_STARTS = ("Applied configuration", "Staged configuration", _SKIPPED_LINE)
#: How a node's result starts in a dry run or a real apply: the node got through its apply.
_APPLY_RESULT_STARTS = (*_RESULT_STARTS, "Dry run summary:")


@dataclass(frozen=True)
class PatchCall:
    """One ``talosctl patch mc`` process: the nodes it was given (in order) and what it did."""

    nodes: tuple[str, ...]
    result: CommandResult

    @property
    def output(self) -> str:
        """Both streams: talosctl 1.3 prints the patch results on stdout (talos v1.3.0
        cmd/talosctl/cmd/talos/patch.go:74-79, helpers/mode.go:122-131), 1.4 and later on stderr."""
        return self.result.stdout + self.result.stderr

    def reports(self) -> list[tuple[str | None, str]]:
        """(node, what followed its line) for each node talosctl got through, in order.

        Each node it reaches prints ``patched … at the node X`` and the apply result (the dry-run summary
        and diff), or ``Apply was skipped: no changes detected.`` (which names no node: ``None``).
        """
        return list(self._reports)

    @cached_property
    def _reports(self) -> tuple[tuple[str | None, str], ...]:
        """Parsed once per call: the step asks each node's details, and a chunk holds dozens of nodes."""
        reports: list[tuple[str | None, list[str]]] = []
        for line in self.output.splitlines():
            match = _PATCHED_LINE.match(line.strip())
            if match or line.strip() == _SKIPPED_LINE:
                reports.append((match.group(1) if match else None, []))
            elif reports:
                reports[-1][1].append(line + "\n")
        return tuple((node, "".join(lines)) for node, lines in reports)

    def outcome(self) -> tuple[dict[str, str], dict[str, str]]:
        """(failed node -> error, untouched node -> the node talosctl stopped at) for this call.

        talosctl patches the nodes of one call in order and returns at the first error, so the nodes after
        the failing one were never touched and the ones before it were patched.  The failing node is the one
        the error names (``<node>: …`` or a multierror line, e.g. ApplyConfiguration's up to 1.13), else the
        one :meth:`_unnamed_failure` finds from the lines printed: a node that is down fails in
        ``ResolveResourceKind`` and a patch that does not merge in ``configpatcher.Apply``, both before the
        node's line and with no node in the error (talos v1.12.0 patch.go:58-111, helpers/resources.go:49);
        from 1.14 an apply the node refuses names no node either, after the node's line.
        An error before any node printed is the first node's when it says that node cannot be reached
        (:meth:`_first_node_unreachable`: the nodes after it were never touched), else every node's (a bad flag,
        an unreadable patch file, an expired certificate, an endpoint down: the call failed as a whole).
        """
        if self.result.ok:
            return {}, {}
        message = _without_warnings(self.result.stderr).strip() or f"exit {self.result.exit_code}"
        failed = node_errors(self.result.stderr, self.nodes) or _prefixed_node_error(
            self.result.stderr, self.nodes
        )
        done = len(self.reports())
        if not failed and done == 0 and not self._first_node_unreachable():
            return dict.fromkeys(self.nodes, message), {}
        if not failed:
            failed = {self._unnamed_failure(): _without_warnings(_error_lines(self.result.stderr)) or message}
        first = next(i for i, node in enumerate(self.nodes) if node in failed)
        return failed, dict.fromkeys(
            (node for node in self.nodes[first + 1 :] if node not in failed), self.nodes[first]
        )

    def _first_node_unreachable(self) -> bool:
        """Whether the call's error is gRPC's ``Unavailable`` or ``DeadlineExceeded`` dialling the first node:
        ``rpc error: code = Unavailable desc = connection error: … dial tcp <node>:50000: …``, as the real
        talosctl v1.12.0 prints it for a node that is down (tests/sim/test_talosctl_patch.py
        ``test_patch_stops_at_the_first_failing_node``), after any ``WARNING:`` lines of its version check
        (talos v1.12.0 cmd/talosctl/cmd/talos/helpers/checks.go:76, printed for nodes older than talosctl).
        One naming another address (the endpoint) is the whole call's."""
        error = _without_warnings(self.result.stderr)
        first = self.nodes[0] if self.nodes else ""
        return (
            error.startswith(_UNREACHABLE)
            and bool(first)
            and (f"{first}:" in error or f"[{first}]:" in error)
        )

    def _unnamed_failure(self) -> str:
        """The node an error naming no node belongs to: the last node that printed its ``patched`` line but no
        apply result after it (ApplyConfiguration refused it: patchFn prints the line, then returns the error,
        talos v1.12.0-v1.14.0-rc.1 cmd/talosctl/cmd/talos/patch.go patchFn), else the first node that printed
        no line (it failed before its apply: a node down, a patch that does not merge)."""
        reports = self.reports()
        if reports:
            node, text = reports[-1]
            if node in self.nodes and not _without_warnings(text).startswith(_APPLY_RESULT_STARTS):
                return node
        return self.nodes[min(len(reports), len(self.nodes) - 1)]


#: How a gRPC status error for a peer that cannot be reached starts as talosctl prints it
#: (google.golang.org/grpc/status ``Error()``: ``rpc error: code = %s desc = %s``).
_UNREACHABLE = ("rpc error: code = Unavailable ", "rpc error: code = DeadlineExceeded ")


def _without_warnings(text: str) -> str:
    """``text`` without the ``WARNING:`` lines PrintApplyResults prints before a result (pkg/cli/output.go:24-29,
    helpers/mode.go PrintApplyResults at talos v1.14.0-rc.1)."""
    lines = text.lstrip().splitlines()
    while lines and lines[0].startswith("WARNING: "):
        lines = lines[1:]
    return "\n".join(lines)


def _error_lines(stderr: str) -> str:
    """The error talosctl printed last, without the result lines before it (talosctl 1.4+ mixes them)."""
    lines = stderr.strip().splitlines()
    last = max((i for i, line in enumerate(lines) if _PATCHED_LINE.match(line.strip())), default=-1)
    tail = lines[last + 1 :]
    while tail and tail[0].startswith(_RESULT_STARTS):
        tail = tail[1:]
    return "\n".join(tail).strip()


@dataclass(frozen=True)
class PatchResult:
    """One logical patch over many nodes, run as concurrent :class:`PatchCall` chunks (see ``patch_machineconfigs``)."""

    calls: tuple[PatchCall, ...]

    @property
    def ok(self) -> bool:
        return all(call.result.ok for call in self.calls)

    @property
    def output(self) -> str:
        """Every call's output in node order: what one call over all the nodes would have printed."""
        return "".join(call.output for call in self.calls)

    @property
    def failure_text(self) -> str:
        """The stderr of the calls that failed only (the others' dry-run summaries are not the reason)."""
        return "".join(call.result.stderr for call in self.calls if not call.result.ok).strip()

    def outcomes(self) -> tuple[dict[str, str], dict[str, str]]:
        """(failed node -> error, untouched node -> node its call stopped at) over all calls."""
        failed: dict[str, str] = {}
        untouched: dict[str, str] = {}
        for call in self.calls:
            call_failed, call_untouched = call.outcome()
            failed.update(call_failed)
            untouched.update(call_untouched)
        return failed, untouched

    def details_of(self, node: str) -> str:
        """What talosctl printed after ``node``'s ``patched`` line (e.g. whether it applied "with a reboot")."""
        return self._details.get(node, "")

    @cached_property
    def _details(self) -> dict[str, str]:
        """Each node's details, from the first call given that node that printed its line (parsed once: asked
        for every node, a scan of every call per node cost 0.9 s of CPU on 1,000 nodes)."""
        details: dict[str, str] = {}
        for call in self.calls:
            for node, text in call.reports():
                if node is not None and node in call.nodes:
                    details.setdefault(node, text)
        return details


def patch_chunk_size(nodes: int, calls: int = PATCH_CALLS) -> int:
    """Nodes per patch call so that ``nodes`` take at most ``calls`` calls (16 -> 1 each, 1,000 -> 63).

    A patch costs the node more than a read (~14 ms a node in one dry-run call at 2 ms latency), so even small
    lists are split.  Dry run with the real talosctl on simnode, ``get`` then ``patch`` per chunk, chunks at
    once: 100 nodes in chunks of 8: 1.46 s, 16: 1.36 s, 32: 1.29 s, one call: 2.12 s; 1,000 nodes in chunks
    of 32: 9.2 s, 64: 8.3 s, 128: 8.5 s, 256: 10.1 s (benchmarks/bench_real_talosctl.py).
    """
    return max(1, -(-nodes // max(1, calls)))


#: talosctl 1.13+'s own drain timeout, its ``--drain-timeout`` default (talos@v1.13.0
#: cmd/talosctl/pkg/talos/nodedrain/nodedrain.go:30), which the runbook does not change.
DRAIN_SECONDS = 300.0
#: How long past its own deadline a talosctl upgrade may take to print its error and exit before it is stopped.
KILL_MARGIN = 30.0


def upgrade_deadline(timeout: float, *, drains: bool) -> float:
    """When the runbook stops a ``talosctl upgrade --wait --timeout=<timeout>`` that has not returned.

    Why more than ``--timeout`` when talosctl drains: up to 1.12 (and with ``--legacy``) ``--timeout`` bounds the
    whole command (tracker.go:168). On 1.13+'s default path it bounds only the reboot wait; before it come the
    image pull, the install and the drain (``--drain-timeout``, 5 min), after it the wait for the node to be
    Ready before the uncordon, again up to ``--timeout`` (talos@v1.13.0 cmd/talosctl/cmd/talos/upgrade.go:131-166,
    drain.go:106-150). Killed at ``--timeout`` + 30 s, a healthy but slow upgrade died in its drain or its
    uncordon wait and left the node cordoned. The pull and install have no bound of their own; they get the
    ``KILL_MARGIN`` with the rest."""
    return 2 * timeout + DRAIN_SECONDS + KILL_MARGIN if drains else timeout + KILL_MARGIN


def pipeline_chunk_size(
    nodes: int, calls: int = PIPELINE_CHUNKS, *, minimum: int = MIN_PIPELINE_CHUNK
) -> int:
    """Nodes per chunk of the config-patch dry run (:meth:`Talosctl.pipeline`): no more chunks than chunks of
    ``minimum`` nodes would make (one when there are fewer), at most ``calls`` chunks, the chunks even, so a chunk
    can hold fewer than ``minimum`` nodes but more than half of it (33 -> 2 of 17, 100 -> 4 of 25, 1,000 -> 8 of
    125).

    Why not :func:`patch_chunk_size`'s ``ceil(N/16)``: each chunk is two talosctl processes in a row (``get
    machineconfig``, ``patch --dry-run``), and with the real talosctl v1.12.0 against simnode at 2 ms per node
    and call the processes decide, not the nodes' latency (benchmarks/README.md, issue 16).  Measured, the
    load average in brackets (the floor: the same two calls per chunk issued directly): 10 nodes as 10 chunks
    0.60 s, as one 0.30 s (load 4-20), 6.99 s and 1.81 s (load 70-128); 100 nodes as 15 chunks of 7 2.28 s,
    the floor's fastest 1.43 s (load 4-20), floor chunks of 8/16/32/64/100 8.0/6.6/3.7/3.1/3.8 s (load 36-53),
    1.46/1.36/1.29/-/2.12 s (1 Dec, load not recorded), 9.87/8.6/5.84/3.56/5.61 s (load 30-60), and the
    library itself in 4 chunks of 25 7.32 s, in 2 of 50 5.32 s (floor chunks of 25/50/64: 4.74/5.65/5.15 s,
    load 40-60); on a quiet machine (4 Dec 2026, load 0.2; median of 5, alternating) the library itself at 100
    nodes in 2 chunks of 50 1.50 s, 4 of 25 1.17 s, 7 of 15 1.23 s, the floor's chunks of 16/32/64/100
    1.10/1.11/1.67/2.25 s: so 32 is the smallest chunk (64 until then, from the loaded runs: a run on a
    machine shared with a simulated cluster of 2 cores is not where the runbook usually runs); 1,000
    nodes in chunks of 32/64/128/256: 81.6/58.4/44.9/- s (load 36-53), 9.2/8.3/8.5/10.1 s (1 Dec, load not
    recorded).  The cost of this choice: a node of a chunk waits for the nodes before it, so where each
    node answers slowly (tens of ms: a remote cluster) smaller chunks would win; not measured with the real
    talosctl above 2 ms.
    """
    if nodes <= 0:
        return 1
    size = max(min(nodes, minimum), -(-nodes // max(1, calls)), 1)
    count = -(-nodes // size)
    return -(-nodes // count)


def get_chunk_size(nodes: int, calls: int = GET_CALLS) -> int:
    """Nodes per ``get`` call: ``nodes`` in about ``calls`` chunks, none under :data:`MIN_GET_CHUNK` nodes.

    Why a function of the fleet size: the real ``get`` is sequential over its nodes (COSI calls are
    one-to-one through apid, reality-gaps.md §2 row 3), so one call over 1,000 nodes takes 1,000 round trips
    in a row (3.7 s), while each extra chunk is one more process.  Measured with the real talosctl v1.12.0
    against simnode (2 ms latency, 2 cores; benchmarks/bench_real_talosctl.py): ``get extensions`` over 1,000
    nodes in chunks of 16: 3.0 s, 32: 2.6 s, 64: 1.9 s, 128: 1.8 s, 256: 1.7 s, one call: 3.7 s; over 100
    nodes chunks of 32 were fastest (0.31 s; one call 0.42 s).  10 nodes -> one call, 100 -> 32, 1,000 -> 250.
    """
    return max(MIN_GET_CHUNK, -(-nodes // max(1, calls)))


def _prefixed_node_error(stderr: str, nodes: Sequence[str]) -> dict[str, str]:
    """A ``<node>: <error>`` line (how ``talosctl patch`` reports the node it stopped at), as {node: error}."""
    wanted = sorted(set(nodes), key=len, reverse=True)
    for line in stderr.splitlines():
        node = next((n for n in wanted if line.startswith(n + ": ")), None)
        if node is not None:
            return {node: line[len(node) + 2 :].strip()}
    return {}


@dataclass(frozen=True)
class NodeRead:
    node: str
    text: str | None
    """File contents, or ``None`` when the read failed (see ``error``)."""
    error: str | None = None

    @property
    def missing(self) -> bool:
        """The file does not exist on the node (e.g. the NVIDIA driver is not loaded)."""
        return self.error is not None and ("no such file" in self.error.lower() or "NotFound" in self.error)


def node_errors(stderr: str, nodes: Iterable[str]) -> dict[str, str]:
    """Per-node errors from talosctl's aggregated stderr (``N errors occurred:`` + ``\\t* node: msg`` lines, up to
    1.13; from 1.14 one ``error from node <X>: msg`` line per node, see :data:`_JOINED_NODE_ERROR`).

    A node's error that is itself a multierror (Talos's config validation: ``… desc = 1 error occurred:``)
    continues on ``\\t* `` lines naming no node, unindented (go-multierror's list format nests without
    indenting), until a blank line or the next node: they are its cause, kept on that node.
    """
    wanted = sorted(set(nodes), key=len, reverse=True)
    errors: dict[str, str] = {}
    current: str | None = None
    nested = False
    for line in stderr.splitlines():
        stripped = line.strip()
        joined = _JOINED_NODE_ERROR.match(stripped)
        if joined and joined.group(1) in wanted:
            errors[joined.group(1)] = joined.group(2)
            current, nested = None, False
        elif stripped.startswith("* "):
            body = stripped[2:]
            node = next((n for n in wanted if body.startswith(n + ": ")), None)
            if node is None and current is not None and nested:
                errors[current] += "\n" + stripped
            else:
                current = node
                if current is not None:
                    errors[current] = body[len(current) + 2 :]
            nested = current is not None and _ends_with_multierror_head(errors[current])
        elif current is not None and line.startswith("\t\t"):
            errors[current] += "\n" + stripped
        elif not stripped:
            nested = False
        elif not _MULTIERROR_HEAD.match(stripped):
            current = None
    return errors


def _ends_with_multierror_head(message: str) -> bool:
    """``… desc = 1 error occurred:`` (or a nested line ``v1alpha1.Config: 1 error occurred:``)."""
    return _NESTED_MULTIERROR_HEAD.search(message) is not None


def chunks(items: Sequence[str], size: int) -> list[list[str]]:
    return [list(items[i : i + size]) for i in range(0, len(items), size)] or [[]]


class Talosctl:
    """Builds and runs talosctl argv; knows nothing about the simulator."""

    def __init__(
        self,
        binary: str = "talosctl",
        *,
        talosconfig: str | None = None,
        runner: Runner | None = None,
        chunk_size: int = DEFAULT_CHUNK,
        parallel: int = PATCH_CALLS,
    ) -> None:
        self.binary = binary
        self.talosconfig = talosconfig
        self.runner = runner or Runner()
        self.chunk_size = chunk_size
        self.parallel = parallel
        self.pipeline_chunks = PIPELINE_CHUNKS
        self.min_pipeline_chunk = MIN_PIPELINE_CHUNK

    def argv(self, args: Sequence[str], nodes: Sequence[str] = ()) -> list[str]:
        out = [self.binary]
        if self.talosconfig:
            out += ["--talosconfig", self.talosconfig]
        if nodes:
            out += ["-n", ",".join(nodes)]
        return out + list(args)

    def run(self, args: Sequence[str], nodes: Sequence[str] = (), **kwargs: object) -> CommandResult:
        return self.runner.run(self.argv(args, nodes), **kwargs)  # type: ignore[arg-type]

    # -- fan-out reads ---------------------------------------------------------------------------------
    def get(self, resource: str, nodes: Sequence[str], *, namespace: str | None = None) -> FanOut:
        """``talosctl get <resource> -o json`` over all nodes, one call per chunk, chunks concurrently.

        Resource outputs are not journalled (a machine config is full of keys; 1,000 nodes of extensions
        would bloat the record); the argv and exit code are.
        """
        args = _get_args(resource, namespace)
        fan = FanOut()
        size = min(self.chunk_size, get_chunk_size(len(nodes)))
        for part in concurrently(
            lambda group: self._get_chunk(args, group), chunks(list(nodes), size), self.parallel
        ):
            fan.add(part)
        return fan

    def get_call(self, resource: str, nodes: Sequence[str]) -> FanOut:
        """``get <resource>`` over ``nodes`` as ONE call (no chunking): for a caller that already works per
        chunk (:meth:`pipeline`).  A failed call is resolved per node as in :meth:`get`."""
        return self._get_chunk(_get_args(resource, None), list(nodes))

    def pipeline(self, nodes: Sequence[str], stage: Callable[[list[str]], _Out]) -> list[_Out]:
        """``stage`` over ``nodes`` in chunks (:func:`pipeline_chunk_size`: at most ``pipeline_chunks``, no more than
        chunks of ``min_pipeline_chunk`` nodes would make, even), at most ``parallel`` chunks at once; results in chunk order.

        Why: the config-patch dry run needs each node's config before it can dry-run that node's patch.  Reading
        the whole fleet first and dry-running it afterwards puts the slowest read chunk, all the planning and the
        slowest dry-run chunk one after the other; per chunk (read, plan, dry run) the chunks overlap each other,
        which is what the fastest direct use of talosctl does (``benchmarks/bench_real_talosctl.py``, the patch
        floor: ``get machineconfig`` then ``patch --dry-run`` per chunk, all chunks at once).  The config-patch
        stage runs one talosctl process at a time, two while it reads a chunk's configs and extensions at once
        (the default-runtime patch), so its 8 chunks keep within the ``parallel`` bound of 16 processes, except
        while it resolves a failed read node by node.
        """
        size = pipeline_chunk_size(len(nodes), self.pipeline_chunks, minimum=self.min_pipeline_chunk)
        parts = [c for c in chunks(list(nodes), min(self.chunk_size, size)) if c]
        return concurrently(stage, parts, self.parallel)

    def _get_chunk(self, args: list[str], group: list[str]) -> FanOut:
        """One ``get`` call over ``group``; when it fails, which of its nodes failed.

        The real ``talosctl get`` cannot say: it appends each node's error with no node prefix
        (siderolabs/talos v1.12.0 cmd/talosctl/cmd/talos/get.go:185-209), and when the FIRST ``-n`` node is
        down it fails before printing anything (``ResolveResourceKind`` on ``Nodes()[0]``,
        cmd/talosctl/pkg/talos/helpers/resources.go:49).  So a failed call is followed by one
        ``talosctl version`` over the same nodes (one-to-many: its errors do name the node) and the get is
        re-run on the nodes that answered; when they all answer and the get still fails (an error that is
        not a dead node, e.g. a resource type one node does not know), each node is asked on its own.
        """
        if not group:
            return FanOut()
        result = self.run(args, group, journal_output=False)
        rows = parse_talosctl_get(result.stdout) if result.stdout.strip() else []
        if result.ok or len(group) == 1:
            errors = {} if result.ok else {group[0]: _failure(result)}
            return FanOut(resources=rows, errors=errors, results=[result])
        _client, _servers, down = self.version(group)
        live = [node for node in group if node not in down]
        if len(live) == len(group):
            parts = concurrently(lambda node: self._get_chunk(args, [node]), live, self.parallel)
        else:
            parts = [self._get_chunk(args, live)]
        fan = FanOut(errors={node: down[node] for node in group if node in down}, results=[result])
        for part in parts:
            fan.add(part)
        return fan

    def services(self, nodes: Sequence[str]) -> tuple[dict[str, dict[str, ServiceStatus]], dict[str, str]]:
        """``talosctl service`` (the ServiceList API): services by ID per node, and per-node errors.

        Why not ``get services``: the Service resource exists only while a service runs (siderolabs/talos
        v1.13.0 internal/app/machined/pkg/controllers/v1alpha1/service.go:73-92), so a one-shot that
        Finished, such as ``ext-nvidia-cdi-gen``, would look missing.  ServiceList is one-to-many: each
        error names its node (``client.FilterMessages``), printed as a ``WARNING`` while the others answer.
        """
        groups = chunks(list(nodes), self.chunk_size)
        results = concurrently(lambda group: self.run(["service"], group, journal_output=False), groups, 8)
        services: dict[str, dict[str, ServiceStatus]] = {}
        errors: dict[str, str] = {}
        for group, result in zip(groups, results, strict=True):
            services.update(parse_services_by_node(result.stdout))
            group_errors = node_errors(result.stderr, group)
            if not result.ok and not group_errors:
                group_errors = dict.fromkeys(group, _failure(result))
            errors.update(group_errors)
        return services, errors

    def logs(self, service: str, nodes: Sequence[str]) -> tuple[dict[str, str], dict[str, str]]:
        """``talosctl logs <service>`` per node, and per-node errors; one call per chunk: the API is one-to-many
        and talosctl prints every line as ``<node>: <line>`` (siderolabs/talos v1.13.0
        cmd/talosctl/cmd/talos/logs.go:74-92).  A node read without error but with no line has no entry.

        Why a second read: a node's error is printed as ``ERROR: <error>``, naming no node, and talosctl exits 1
        (logs.go:74-83, 104-106), so in a failed call the nodes that printed nothing are read again one by one,
        each error then being its node's.  A call that failed as a whole (no ``ERROR:`` line, no node
        answered: the endpoint refused it) gives its error to all its nodes without re-reading.
        """
        groups = chunks(list(nodes), self.chunk_size)
        logs: dict[str, str] = {}
        errors: dict[str, str] = {}
        for group_logs, group_errors in concurrently(lambda g: self._logs_chunk(service, g), groups, 8):
            logs.update(group_logs)
            errors.update(group_errors)
        return logs, errors

    def _logs_chunk(self, service: str, group: list[str]) -> tuple[dict[str, str], dict[str, str]]:
        result = self.run(["logs", service], group, journal_output=False)
        logs = _lines_by_node(result.stdout, group)
        silent = [n for n in group if n not in logs]
        if result.ok or not silent:
            return logs, {}
        if len(group) == 1 or (len(silent) == len(group) and "ERROR: " not in result.stderr):
            return logs, dict.fromkeys(silent, _failure(result))
        errors: dict[str, str] = {}
        for node_logs, node_errors in concurrently(
            lambda node: self._logs_chunk(service, [node]), silent, self.parallel
        ):
            logs.update(node_logs)
            errors.update(node_errors)
        return logs, errors

    def read(self, path: str, nodes: Sequence[str]) -> dict[str, NodeRead]:
        """``talosctl read <path>`` on each node, ``parallel`` at once (talosctl refuses multi-node reads).

        This is what bounds verify on a big fleet, for any program: 1,000 nodes are 1,000 processes.
        """

        def one(node: str) -> NodeRead:
            result = self.run(["read", path], [node])
            if result.ok:
                return NodeRead(node, result.stdout)
            return NodeRead(node, None, _failure(result))

        return {r.node: r for r in concurrently(one, list(nodes), self.parallel)}

    def version(self, nodes: Sequence[str]) -> tuple[str | None, dict[str, str], dict[str, str]]:
        """Client tag, server tag per node, and per-node errors: one ``talosctl version`` call per chunk of
        nodes, chunks concurrently.

        Why chunks: one ``-n`` list of 20,000 addresses is longer than Linux lets one argument be (128 KiB,
        MAX_ARG_STRLEN), and the call died with ``OSError: [Errno 7] Argument list too long`` (F12).
        """
        groups = chunks(list(nodes), self.chunk_size)
        client: str | None = None
        servers: dict[str, str] = {}
        errors: dict[str, str] = {}
        for part_client, part_servers, part_errors in concurrently(self._version_chunk, groups, 8):
            client = client or part_client
            servers.update(part_servers)
            errors.update(part_errors)
        return client, servers, errors

    def _version_chunk(self, nodes: list[str]) -> tuple[str | None, dict[str, str], dict[str, str]]:
        result = self.run(["version"], nodes)
        client, servers = parse_version(result.stdout)
        errors = node_errors(result.stderr, nodes)
        for line in result.stderr.splitlines():  # talosctl version reports some node failures as warnings
            match = re.match(r"^WARNING: (\S+): (.*)$", line.strip())
            if match and match.group(1) in set(nodes):
                errors.setdefault(match.group(1), match.group(2))
        if not result.ok and not errors and not servers:
            errors = dict.fromkeys(nodes, _failure(result))
        return client, servers, errors

    # -- changes ---------------------------------------------------------------------------------------
    def patch_machineconfig(
        self,
        nodes: Sequence[str],
        patch_yaml: str,
        *,
        dry_run: bool,
        mode: str | None = None,
        timeout: float = 300.0,
    ) -> PatchResult:
        """``talosctl patch mc --patch @file`` on ``nodes``, as concurrent calls over small chunks of them."""
        (result,) = self.patch_machineconfigs(
            [(patch_yaml, nodes)], dry_run=dry_run, mode=mode, timeout=timeout
        )
        return result

    def patch_machineconfigs(
        self,
        patches: Sequence[tuple[str, Sequence[str]]],
        *,
        dry_run: bool,
        mode: str | None = None,
        timeout: float = 300.0,
        split: bool = True,
    ) -> list[PatchResult]:
        """Several patches (each with its nodes) at once; one :class:`PatchResult` per patch, in order.

        Why chunks: talosctl's ``patch`` visits the nodes of ``-n a,b,c`` one after the other (and stops
        at the first failure), so one call over N nodes pays N round trips in a row
        (benchmarks/bench_fleet.py, "patch dry-run"; the 8-node ``runbook run --apply``).  Every node list
        is therefore split into chunks of ``ceil(total / parallel)`` nodes (:func:`patch_chunk_size`), all
        chunks of all patches run concurrently, and at most ``parallel`` talosctl processes run at once: 8
        nodes are 8 single-node calls, 1,000 nodes are 16 calls of 63.  Splitting does not widen a change: only the nodes
        given here are patched, and the caller's rollout batches decide which those are.  It does mean that
        every node given is attempted (talosctl's stop-at-the-first-failure now holds within one chunk
        only), which is what a batch means; :meth:`PatchCall.outcome` tells patched, failed and untouched
        nodes apart.  Each chunk is its own journal entry with its full argv and the patch as its diff.

        ``split=False``: each patch's nodes as one call, the patches one after the other (one process at a
        time): for a caller that already runs one chunk per thread (:meth:`pipeline`).

        ``@file`` works on every talosctl (bare file names only from 1.12).
        """
        total = sum(len(nodes) for _patch, nodes in patches)
        size = min(self.chunk_size, patch_chunk_size(total, self.parallel) if split else max(1, total))
        with tempfile.TemporaryDirectory(prefix="runbook-patch-") as tmp:
            jobs: list[tuple[int, list[str], list[str], str]] = []
            for index, (patch_yaml, nodes) in enumerate(patches):
                patch_file = Path(tmp) / f"patch-{index}.yaml"
                patch_file.write_text(patch_yaml, encoding="utf-8")
                args = ["patch", "machineconfig", "--patch", f"@{patch_file}"]
                if mode:
                    args += ["--mode", mode]
                if dry_run:
                    args.append("--dry-run")
                if nodes:  # never an empty -n: talosctl would fall back to the talosconfig's nodes
                    jobs += [(index, args, group, patch_yaml) for group in chunks(list(nodes), size)]
            results = concurrently(
                lambda job: self.run(
                    job[1], job[2], timeout=timeout, changes_cluster=not dry_run, diff=job[3]
                ),
                jobs,
                self.parallel if split else 1,
            )
        calls: list[list[PatchCall]] = [[] for _ in patches]
        for (index, _args, group, _patch), result in zip(jobs, results, strict=True):
            calls[index].append(PatchCall(tuple(group), result))
        return [PatchResult(tuple(c)) for c in calls]

    def upgrade(
        self,
        node: str,
        image: str,
        *,
        wait: bool = True,
        timeout: float = 1800.0,
        preserve: bool = False,
        legacy: bool = False,
        drains: bool = False,
    ) -> CommandResult:
        """``talosctl upgrade --image <installer>``: never without ``--image`` (that drops the extensions).

        ``preserve``: pass ``--preserve``, which Talos before 1.8 needs to keep EPHEMERAL; ``legacy``: pass
        ``--legacy`` (see :func:`upgrade_flags`); ``drains``: talosctl will drain the node (see
        :func:`upgrade_deadline`).
        """
        return self.upgrade_nodes(
            [node], image, wait=wait, timeout=timeout, preserve=preserve, legacy=legacy, drains=drains
        )

    def upgrade_nodes(
        self,
        nodes: Sequence[str],
        image: str,
        *,
        wait: bool = True,
        timeout: float = 1800.0,
        preserve: bool = False,
        legacy: bool = False,
        drains: bool = False,
        on_stderr_line: Callable[[str], None] | None = None,
    ) -> CommandResult:
        """:meth:`upgrade` of ``nodes`` as ONE talosctl process; ``on_stderr_line`` gets its lines as printed.

        Why: with ``--wait`` talosctl up to 1.12 (and 1.13+ with ``--legacy``) follows every ``-n`` node with its
        action tracker in one process (talos@v1.12.0 cmd/talosctl/pkg/talos/action/tracker.go:185-227: one
        goroutine per node, a node's failure does not stop the others), printing ``"<node>": <update>`` per update
        (:291-295) and exiting 1 when any node failed.  One process for 50 nodes used 0.18 s of CPU where 50
        processes used 6.4 s (benchmarks/README.md, bench_whole_change).  Not for talosctl 1.13+'s default path:
        it installs on every node first and reboots none when one fails (talos@v1.13.0
        cmd/talosctl/cmd/talos/upgrade.go:131-138).  ``timeout`` is talosctl's ``--timeout``, for the whole
        process (tracker.go:168).
        """
        if not image:
            raise PermanentError(
                "refusing to run talosctl upgrade without --image: it would drop the NVIDIA extensions"
            )
        args = upgrade_args(image, preserve=preserve, legacy=legacy, wait=wait, timeout=timeout)
        deadline = upgrade_deadline(timeout, drains=drains) if wait else timeout + KILL_MARGIN
        return self.run(args, nodes, timeout=deadline, changes_cluster=True, on_stderr_line=on_stderr_line)

    def machineconfig_text(self, node: str) -> CommandResult:
        """The node's current machine config as YAML (``get machineconfig -o yaml``)."""
        return self.run(["get", "machineconfig", "-o", "yaml"], [node])


def upgrade_flags(image: str, *, preserve: bool, legacy: bool = False) -> list[str]:
    """``--image`` and, when asked, ``--preserve`` and ``--legacy``: the flags the upgrade runs with and the
    plan shows.

    Why ``--preserve``: Talos up to 1.7 wipes the EPHEMERAL partition (/var, local volumes) and makes a
    control-plane node leave etcd on upgrade unless it is set (talos@v1.7.0:internal/pkg/install/
    install.go:292 ``WithForce(!in.GetPreserve())``; docs v1.7 upgrading-talos).  From 1.8 the disk is
    never wiped and the flag is hidden (1.13: deprecated), so callers set it only below 1.8.

    Why ``--legacy``: talosctl 1.13+ upgrades through the LifecycleService API, which does not pass
    ``machine.install.extraKernelArgs`` (docs v1.13 upgrading-talos.mdx:121-137); the flag exists in
    talosctl 1.13 and 1.14 (talos@v1.13.0 cmd/talosctl/cmd/talos/upgrade.go:368), so callers set it only
    for such clients (``steps.image_risks``).
    """
    return ["--image", image, *(["--preserve"] if preserve else []), *(["--legacy"] if legacy else [])]


def upgrade_args(image: str, *, preserve: bool, legacy: bool, wait: bool, timeout: float) -> list[str]:
    """The whole ``talosctl upgrade`` argument list (without ``-n``), as it runs and as a plan prints it.

    With ``--wait``, talosctl's own ``--timeout`` (default 30m, talos@v1.12.0
    cmd/talosctl/cmd/talos/upgrade.go) is set to the run's, so its error text, not a killed process, tells what
    hung; a plan that left it out showed a command that, pasted, waited another timeout than the run's.
    """
    args = [
        "upgrade",
        *upgrade_flags(image, preserve=preserve, legacy=legacy),
        f"--wait={'true' if wait else 'false'}",
    ]
    return [*args, f"--timeout={int(timeout)}s"] if wait else args


def _get_args(resource: str, namespace: str | None) -> list[str]:
    return ["get", resource, "-o", "json", *(["--namespace", namespace] if namespace else [])]


def _lines_by_node(stdout: str, nodes: Sequence[str]) -> dict[str, str]:
    """``<node>: <line>`` lines gathered per node; the longest address first, so 10.0.0.10 is not 10.0.0.1's."""
    wanted = sorted(nodes, key=len, reverse=True)
    out: dict[str, str] = {}
    for line in stdout.splitlines():
        node = next((n for n in wanted if line.startswith(n + ": ")), None)
        if node is not None:
            out[node] = out.get(node, "") + line[len(node) + 2 :] + "\n"
    return out


def _failure(result: CommandResult) -> str:
    """What a failed call printed, or its exit status when it printed nothing."""
    return result.stderr.strip() or f"exit {result.exit_code}"


def transient(result: CommandResult) -> bool:
    return not result.ok and is_transient(result.stderr)


def parse_version(text: str) -> tuple[str | None, dict[str, str]]:
    """Parse ``talosctl version``: ``Client:`` then one ``Server:`` block per node (``NODE:``, ``Tag:``)."""
    client: str | None = None
    servers: dict[str, str] = {}
    section: str | None = None
    node: str | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped in {"Client:", "Server:"}:
            section, node = stripped[:-1], None
            continue
        key, _, value = stripped.partition(":")
        value = value.strip()
        if section == "Client" and key == "Tag":
            client = value
        elif section == "Server" and key == "NODE":
            node = value
        elif section == "Server" and key == "Tag" and node is not None:
            servers[node] = value
    return client, servers
