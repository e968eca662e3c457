"""Why a node failed the image step: the failure table's likely cause and the command that fixes it.

Why a module of its own: verify already turns a node's evidence into a cause through the failure table
(:mod:`runbook_lib.model.diagnosis`), while the image step reported only the raw symptom ("timeout waiting
for ext-nvidia-persistenced", "missing extensions …") with a read-only command as the fix (attack report
2026-12-01, F13).  The image step has two kinds of failed nodes, and each gets the evidence that tells
the causes apart, read only from the failed nodes (a healthy rollout pays nothing):

- the upgrade itself failed: its error text matched against the table, with the step's own lines (the
  --timeout that passed, the services the new boot waits for, read from the tracker's service events: the real
  talosctl names neither, see ``UpgradeFailure``), plus the node's PCI bus (Talos >= 1.8) and, when the boot
  hung on ``ext-nvidia-persistenced``, its machine config.  That service waits for
  the nvidia driver to bind (siderolabs/extensions nvidia-persistenced.yaml, ``depends: path``), which it
  never does without an NVIDIA GPU, without the modules in the config, or on a GPU the driver branch does
  not support;
- the node came back but not as planned: its extensions, checked as verify checks them (mixed tracks, a
  missing toolkit, another schematic).
"""

from __future__ import annotations

import re
import shlex
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from runbook_lib.model.diagnosis import (
    Evidence,
    Finding,
    NodeContext,
    diagnose,
    diagnose_text,
    failed,
    finding,
)
from runbook_lib.model.machineconfig import configured_modules
from runbook_lib.model.params import Node
from runbook_lib.model.pci import PciDevice, nvidia_gpus

from . import fixes
from .context import Context
from .gpu_presence import gpu_check, read_pci
from .patch import read_configs
from .results import Check, checks_from_findings

PERSISTENCED_ROW = "persistenced-never-up"
#: A line of ``talosctl upgrade --wait``'s tracker: ``"<node>": <update>`` (talos@v1.12.0
#: cmd/talosctl/pkg/talos/action/tracker.go, non-TTY reporter ``"%q: %v"``); lines without it continue the last.
_TRACKER_LINE = re.compile(r'^"[^"]+": (?P<update>.*)$')
#: The tracker's progress updates (node.go handleEvent/trackEventsWithRetry): they say what ran, not what failed.
#: ``error: stopAllServices task completed`` is how every upgrade's event stream ends before the reboot.
_PROGRESS = re.compile(
    r"^(waiting for actor ID|actor ID: \S+|(sequence|phase|task): \S+ action: (START|STOP)|stage: .*"
    r"|unavailable, retrying\.\.\.|events check condition met|post check passed|service: .*"
    r"|error: stopAllServices task completed)$"
)
_STARTED = re.compile(r"^(?P<kind>phase|task): (?P<name>\S+) action: START$")
#: The tracker's line for a ServiceStateEvent of the node's new boot (node.go:303-307, ``service: %v message: %v
#: healthy: %v``): machined publishes one at each state change of each service (service_runner.go:73-93), and
#: the tracker, re-watching with tail -1 after the reboot (node.go:163-172), prints the whole boot's.
_SERVICE_EVENT = re.compile(r"^service: (?P<id>\S+) message: (?P<msg>.*) healthy: (?:true|false)$")
#: A service waiting on its dependencies: ServiceRunner.waitFor's ``Waiting for <condition>`` (service_runner.go:158).
_WAITING = "Waiting for "
#: At most this many lines of the tracker's error updates go into a message (the last ones: the node's final error).
MAX_ERROR_LINES = 12
JOURNAL_NOTE = (
    "the full output is in the step's journal, the talosctl upgrade command's stderr "
    "(in a change record: results/image.json)"
)


@dataclass(frozen=True)
class UpgradeFailure:
    """A failed ``talosctl upgrade --wait`` of one node: what it printed, and its ``--timeout`` in seconds when
    it ran that long (talosctl then gives up printing no line that says so: its reporter stops with the
    context, talos@v1.12.0 cmd/talosctl/pkg/talos/action/tracker.go:168-180, 282-284)."""

    node: Node
    output: str
    timed_out: float | None = None

    def report(self) -> str:
        """``upgrade_report`` of this failure: its own lines, then talosctl's error lines and last phase."""
        return upgrade_report(self.output, self)

    def lines(self) -> list[str]:
        """The step's own lines about the node: the --timeout that passed, the services its new boot waits for."""
        head = f"{self.node.name} ({self.node.address})"
        progress = [e[0] for e in _tracker_entries(self.output) if _PROGRESS.match(e[0])]
        out = []
        if self.timed_out is not None:
            phase = _last_phase(progress)
            out.append(
                f"{head}: no answer after the upgrade's --timeout of {go_duration(self.timed_out)}"
                + (f" (last {phase})" if phase else "")
            )
        for service, message in hung_services(self.output).items():
            out.append(
                f'{head}: the new boot waits for service "{service}" to be "up" (its last event: {message})'
            )
        return out

    def evidence(self) -> str:
        """The output and the step's lines: what the failure table is matched against."""
        return "\n".join([self.output, *self.lines()])


#: A node's line of one ``talosctl upgrade --wait`` over several nodes: the non-TTY reporter's ``"<node>": <update>``
#: (talos@v1.12.0 cmd/talosctl/pkg/talos/action/tracker.go:291-295), or the TTY reporter's ``    * <node>: <update>``
#: (:311-318), the form the Python talosctl prints.
_NODE_LINE = re.compile(r'^(?:"(?P<quoted>[^"]+)"|    \* (?P<plain>\S+)): (?P<update>.*)$')
PASSED = "post check passed"
#: A node's line saying talosctl's own --timeout ended its tracker (``TrackerFollower.timed_out``): the event
#: stream's gRPC status, the watch's ``error: %v`` of ``ctx.Err()`` (node.go:176-181), go-retry's ``timeout`` entry.
_DEADLINE = re.compile(
    r'DeadlineExceeded|^(?:"[^"]+"|    \* \S+): error: context deadline exceeded$|^\ttimeout$'
)
#: Seconds of silence after a node's final error line before :class:`TrackerFollower` reports the node.
FLUSH_IDLE_S = 0.5


def final_failure(update: str) -> bool:
    """Whether ``update`` is the tracker's last one for a node that failed: the error its node tracker returned
    (tracker.go:210-223), which is none of node.go's progress updates, nor its ``error: %v`` of a watch that gave
    up (node.go:176-181), nor a ``sequence: … error: […]`` line (node.go:274-295): both come before it, and a
    failed ``reboot`` sequence is retried, not final (:289-291)."""
    return not _PROGRESS.match(update) and not update.startswith(("error: ", "sequence: "))


@dataclass
class TrackerFollower:
    """One ``talosctl upgrade --wait -n <nodes>``'s stderr, followed line by line: each node's lines, which nodes
    passed their post check, and ``on_failed(address)`` once a node's final error has been printed in full (its
    continuation lines too): at the next line of another node, at :meth:`close`, or ``idle_s`` after its last line,
    so a failure followed by silence (its batch-mates rebooting) is reported then, not when talosctl prints again.

    Why waiting ``idle_s`` is enough: the final error is the tracker's last update for its node, sent once the node's
    tracker returned (talos@v1.12.0 cmd/talosctl/pkg/talos/action/tracker.go:210-223; a failed ``reboot`` sequence
    is retried before it, node.go:289-291), and the reporter prints it, continuation lines included, with one
    ``Fprintf`` to unbuffered stderr (tracker.go:291-295): they arrive right behind its first line.

    Captured from the real talosctl v1.12.0 against simnode: tests/data/talosctl_upgrade_batch/."""

    addresses: Sequence[str]
    on_failed: Callable[[str], None] = lambda _address: None
    idle_s: float = FLUSH_IDLE_S
    lines: dict[str, list[str]] = field(default_factory=dict)
    other: list[str] = field(default_factory=list)
    passed: set[str] = field(default_factory=set)
    failed: set[str] = field(default_factory=set)
    _last: str | None = None
    _pending: str | None = None
    _timer: threading.Timer | None = None
    _lock: threading.RLock = field(default_factory=threading.RLock)

    def feed(self, line: str) -> None:
        with self._lock:
            self._feed(line.rstrip("\n"))
            if self._pending is not None:  # its final error: reported once nothing more of it comes
                self._arm()

    def close(self) -> None:
        with self._lock:
            self._flush()

    def output(self, address: str) -> str:
        """The node's own lines; the process's other lines when the node printed no error of its own."""
        own = self.lines.get(address, [])
        return "\n".join(own if address in self.failed else [*own, *self.other]).strip()

    def timed_out(self, address: str, ran_out: float | None) -> float | None:
        """The --timeout ``ran_out`` (None when the process ended before it) for a node that failed by it: one that
        printed no final error of its own (at --timeout the reporter stops with the context, tracker.go:168-180,
        282-284), or whose error is talosctl's context deadline (its --timeout is a context deadline over the whole
        command, tracker.go:168-169), which a hung boot prints at the timeout when its event stream is still open:
        the stream's ``rpc error: code = DeadlineExceeded``, or, when the watch saw the context end first
        (node.go:225-226), ``error: context deadline exceeded`` and go-retry's ``timeout`` (siderolabs/go-retry@v0.3.3
        retry/retry.go:129-130, 240-261).  A boot's own ``context deadline exceeded`` (Talos's BootTimeout, in its
        sequence error) is neither."""
        if ran_out is None or address not in self.failed:
            return ran_out
        return ran_out if any(map(_DEADLINE.search, self.lines.get(address, []))) else None

    def _feed(self, line: str) -> None:
        match = _NODE_LINE.match(line)
        node = (match["quoted"] or match["plain"]) if match else None
        if node is None or node not in self.addresses:
            if self._last is not None and (not line.strip() or line[0].isspace()):
                self.lines[self._last].append(line)  # a multierror's continuation
                return
            self._flush()
            self.other.append(line)
            self._last = None
            return
        self._flush()
        self.lines.setdefault(node, []).append(line)
        self._last = node
        update = match["update"] if match else ""
        if update == PASSED:
            self.passed.add(node)
        elif final_failure(update) and node not in self.passed:
            self._pending = node

    def _arm(self) -> None:
        """(Re)start the idle timer of the pending node: each continuation line of its error restarts it."""
        if self._timer is not None:
            self._timer.cancel()
        self._timer = threading.Timer(self.idle_s, self._idle, (self._pending,))
        self._timer.daemon = True
        self._timer.start()

    def _idle(self, node: str) -> None:
        with self._lock:
            if self._pending == node:
                self._flush()

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        node, self._pending = self._pending, None
        if node is not None and node not in self.failed:
            self.failed.add(node)
            self.on_failed(node)


def go_duration(seconds: float) -> str:
    """``seconds`` as Go's time.Duration prints it (``10m0s``, ``1h10m0s``, ``45s``): how talosctl shows --timeout."""
    hours, rest = divmod(int(seconds), 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    return f"{minutes}m{secs}s" if minutes else f"{secs}s"


def hung_services(output: str) -> dict[str, str]:
    """The services whose last event the tracker printed is ``Waiting for …``, with that message.

    Why: talosctl's error for a hung boot names no service (the sequence error carries one ``context deadline
    exceeded`` per service still waiting, pkg/conditions/all.go), and at its --timeout it prints nothing; the
    new boot's service events it printed are where the hung service shows.  A reconnect replays the boot's
    history, so each ``unavailable, retrying...`` starts over."""
    last: dict[str, str] = {}
    for entry in _tracker_entries(output):
        if entry[0] == "unavailable, retrying...":
            last = {}
        elif match := _SERVICE_EVENT.match(entry[0]):
            last[match["id"]] = match["msg"]
    return {service: msg for service, msg in last.items() if msg.startswith(_WAITING)}


def upgrade_report(output: str, failure: UpgradeFailure | None = None) -> str:
    """What a user needs of a failed ``talosctl upgrade --wait``: the step's own lines (``failure``: the
    --timeout that passed, the hung services), its error lines and the node's last phase.

    Why: the real talosctl prints one tracker line per phase, task and service event (about 50 for an
    upgrade), then the error; the node's message and check carried all of it.  Output without tracker progress
    lines (an older talosctl, the simulator's) is kept as it is.  The whole output stays in the journal.
    """
    own = failure.lines() if failure is not None else []
    entries = _tracker_entries(output)
    progress = [e[0] for e in entries if _PROGRESS.match(e[0])]
    if not progress:
        return "\n".join([*own, output])
    errors = [line for e in entries if not _PROGRESS.match(e[0]) for line in e if line.strip()]
    kept = errors[-MAX_ERROR_LINES:]
    cut = len(errors) - len(kept)
    notes = [f"last {_last_phase(progress)}"] if _last_phase(progress) else []
    left_out = f"{len(progress)} progress lines" + (f" and {cut} earlier error lines" if cut else "")
    notes.append(f"{left_out} left out: {JOURNAL_NOTE}")
    return "\n".join([*own, *kept, f"({'; '.join(notes)})"])


def _tracker_entries(output: str) -> list[list[str]]:
    """The tracker's updates, each a list of lines: its own (node prefix removed), then its continuation (blank
    or indented, as a multierror's); any other line (the Runner's ``(timed out after N s)``) stands alone."""
    entries: list[list[str]] = []
    for line in output.strip().splitlines():
        match = _TRACKER_LINE.match(line)
        if entries and not match and (not line.strip() or line[0].isspace()):
            entries[-1].append(line)
        else:
            entries.append([match["update"] if match else line])
    return entries


def _last_phase(progress: list[str]) -> str | None:
    """``phase: <name> (task <name>)`` of the last phase the node started, and the last task in it."""
    phase = task = None
    for update in progress:
        started = _STARTED.match(update)
        if started and started["kind"] == "phase":
            phase, task = started["name"], None
        elif started:
            task = started["name"]
    if phase is None:
        return None
    return f"phase: {phase}" + (f" (task {task})" if task else "")


def upgrade_failures(ctx: Context, failures: Mapping[str, UpgradeFailure]) -> dict[str, list[Check]]:
    """The checks of each node whose ``talosctl upgrade`` failed (``failures``: by address)."""
    if not failures:
        return {}
    pci = read_pci(ctx, list(failures))
    hung = [
        f.node
        for address, f in failures.items()
        if _hung(ctx, f.node, f.evidence()) and nvidia_gpus(pci.get(address, []))
    ]
    configs, _unread = read_configs(ctx, hung) if hung else ({}, {})
    return {
        address: _upgrade_checks(ctx, f, pci.get(address), configs.get(address))
        for address, f in failures.items()
    }


def _context(ctx: Context, node: Node) -> NodeContext:
    return ctx.node_context(node.address)


def _hung(ctx: Context, node: Node, error: str) -> bool:
    return any(f.failure == PERSISTENCED_ROW for f in diagnose_text(error, _context(ctx, node)))


def _upgrade_checks(
    ctx: Context,
    failure: UpgradeFailure,
    devices: list[PciDevice] | None,
    config: list[dict[str, Any]] | None,
) -> list[Check]:
    """The failed ``upgrade`` check (the tool's own error lines, see ``upgrade_report``) carrying the cause's fix,
    then the cause itself; the cause is read from the whole output and the step's own lines."""
    node = failure.node
    shown = failure.report()
    if devices is not None and not nvidia_gpus(devices):
        cause = gpu_check(ctx, node, devices, has_gpu_image=False)
    else:
        found = _cause(ctx, node, failure.evidence(), devices, config)
        if found is None:
            return [Check("upgrade", False, shown, fix=fixes.upgrade_failed(node.address))]
        [cause] = checks_from_findings([found])
    return [Check("upgrade", False, shown, fix=cause.fix, cause=cause.cause), cause]


def _cause(
    ctx: Context, node: Node, error: str, devices: list[PciDevice] | None, config: list[dict[str, Any]] | None
) -> Finding | None:
    """The table row the evidence points at; for a boot hung on persistenced, which of its three causes."""
    nctx = _context(ctx, node)
    seen = diagnose_text(error, nctx, check="upgrade-cause")
    if not any(f.failure == PERSISTENCED_ROW for f in seen) or not devices or config is None:
        return seen[0] if seen else None
    if not set(ctx.params.profile(node).modules) <= configured_modules(config):
        return finding(
            "modules-not-configured",
            "modules",
            "the machine config does not load the NVIDIA modules, so the driver never binds and "
            "ext-nvidia-persistenced waits for it",
            nctx,
        )
    gpus = "; ".join(g.describe() for g in nvidia_gpus(devices))
    # the run's own talosctl and talosconfig: pasted, a plain `talosctl -n` asked the shell's default context
    # (attack re-run, 7 Dec 2026; the fixes get them from notebook/steps, this message does not)
    dmesg = shlex.join(ctx.talosctl.argv(["dmesg"], [node.address])) + " | grep NVRM"
    return finding(
        "gpu-unsupported",
        "driver-binding",
        f"the node has {gpus} and its machine config loads the NVIDIA modules, yet the nvidia driver never "
        f"bound to it in the new boot (`{dmesg}` shows why while the node boots the new image)",
        nctx,
    )


def confirm_failure(
    ctx: Context,
    node: Node,
    message: str,
    *,
    planned_schematic: str | None,
    found: tuple[Mapping[str, str], str | None] | None,
    retry: str,
) -> list[Check]:
    """A node that came back from its upgrade but not as planned: the failed ``schematic and extensions``
    check, with the fix of the first cause the table finds in the extensions it reports (``found``:
    extensions and schematic, None when it did not answer), then those causes as verify gives them.
    Without a known cause, the fix is to run the node's upgrade again once it answers (``retry``)."""
    causes: list[Check] = []
    if found is not None:
        nctx = ctx.node_context(node.address, schematic=planned_schematic)
        evidence = Evidence(extensions=dict(found[0]), schematic=found[1])
        causes = checks_from_findings(failed(diagnose(evidence, nctx, planned_schematic=planned_schematic)))
    fix, cause = retry, "the node rolled back or booted an image without the GPU extensions"
    if causes:
        fix, cause = causes[0].fix, causes[0].cause
    return [Check("schematic and extensions", False, message, fix=fix, cause=cause), *causes]
