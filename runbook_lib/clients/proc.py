"""The one place the library starts processes, and the journal of everything it ran or changed.

Why one boundary: change records must list every command and API change with its argv, exit code and the
diff applied, and that is only trustworthy if nothing can run a process around it.  Every client runs
through :class:`Runner`, which appends a :class:`CommandResult` to the shared :class:`Journal`.

Secrets: argv holds paths (``--talosconfig /path``), never contents; environment values are never
journalled; stdout/stderr and diffs pass through :func:`runbook_lib.model.redact.redact` (a machine-config
diff's context lines can carry the cluster secret), and callers can keep a command's output out entirely.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from runbook_lib.errors import AUTHORIZER_REFUSAL, FORBIDDEN_HINT, Forbidden, PermanentError, RetryableError
from runbook_lib.model.redact import redact

#: Output kept in the journal per stream; of larger output its first and last halves (the caller gets it all).
JOURNAL_OUTPUT_LIMIT = 4000


@dataclass(frozen=True)
class CommandResult:
    """What one command did: enough to reproduce it and to judge it without re-running it."""

    argv: tuple[str, ...]
    exit_code: int
    stdout: str
    stderr: str
    duration_s: float
    changes_cluster: bool = False
    """True for commands that change a cluster (patch, upgrade, helm install); dry-runs are False."""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def check(self, what: str) -> CommandResult:
        """Raise when the command failed, with its stderr; connection problems are retryable."""
        if self.ok:
            return self
        message = f"{what} failed (exit {self.exit_code}): {' '.join(self.argv)}\n{self.stderr.strip()}"
        if is_transient(self.stderr):
            raise RetryableError(message, hint="the node or server may be rebooting; retry in a moment")
        if AUTHORIZER_REFUSAL.search(self.stderr):  # helm's or kubectl's request refused by RBAC
            raise Forbidden(message, hint=FORBIDDEN_HINT)
        raise PermanentError(message)


def is_transient(stderr: str) -> bool:
    """Errors a retry may cure: gRPC Unavailable / deadline, connection refused, timeouts."""
    needles = (
        "code = Unavailable",
        "code = DeadlineExceeded",
        "connection refused",
        "i/o timeout",
        "no route to host",
    )
    return any(n in stderr for n in needles)


@dataclass(frozen=True)
class JournalEntry:
    kind: Literal["command", "api"]
    summary: str
    argv: tuple[str, ...] = ()
    exit_code: int | None = None
    duration_s: float = 0.0
    changes_cluster: bool = False
    stdout: str = ""
    stderr: str = ""
    diff: str | None = None
    """The change applied (a unified diff, a patch body) where there is one."""
    at: float = field(default_factory=time.time)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Journal:
    """Thread-safe, append-only list of what the library ran and changed during one run.

    With a ``sink`` file, every entry is also appended to it as one JSON line the moment it is made, and
    each call that changes the cluster marks its start and end there (:meth:`pending`).  Why: a step
    interrupted by Ctrl-C or SIGTERM never returns its journal, yet the change record must list what reached
    the cluster, including a call that was in flight (``runbook run`` reads the file then).
    """

    def __init__(self, sink: Path | None = None) -> None:
        self._entries: list[JournalEntry] = []
        self._lock = threading.Lock()
        self._sink = sink
        self._calls = 0

    def sink_to(self, sink: Path | None) -> None:
        """From now on append to ``sink`` (None: to no file).  Why: a JupyterLab kernel's journal lives as
        long as the kernel, and each approval's entries go to that approval's record as they happen."""
        with self._lock:
            self._sink = sink

    def _write(self, event: dict[str, Any]) -> None:
        """Append one event to the sink (called with the lock held): one write, so lines never interleave."""
        if self._sink is not None:
            with self._sink.open("a", encoding="utf-8") as out:
                out.write(json.dumps(event, default=str) + "\n")

    def add(self, entry: JournalEntry) -> None:
        with self._lock:
            self._entries.append(entry)
            self._write({"event": "entry", **entry.to_dict()})

    @contextlib.contextmanager
    def pending(
        self, kind: Literal["command", "api"], summary: str, argv: Sequence[str] = ()
    ) -> Iterator[None]:
        """Mark a call that changes the cluster as in flight in the sink until it returns or raises.

        The end marker names an exception that ended the call: after ``KeyboardInterrupt`` (or no end
        marker at all, the kernel killed) nobody knows whether the change reached the cluster.
        """
        if self._sink is None:
            yield
            return
        with self._lock:
            self._calls += 1
            call = self._calls
            self._write(
                {"event": "start", "call": call, "kind": kind, "summary": summary, "argv": list(argv)}
                | {"at": time.time()}
            )
        raised = None
        try:
            yield
        except BaseException as exc:
            raised = type(exc).__name__
            raise
        finally:
            with self._lock:
                self._write({"event": "end", "call": call, "raised": raised, "at": time.time()})

    def record_command(
        self, result: CommandResult, *, diff: str | None = None, keep_output: bool = True
    ) -> None:
        def cut(text: str) -> str:
            if not keep_output:
                return "" if not text else "(output not recorded)"
            text = redact(text)
            if len(text) <= JOURNAL_OUTPUT_LIMIT:
                return text
            # Head and tail: a failing tool (talosctl upgrade's tracker) prints its error last.
            half = JOURNAL_OUTPUT_LIMIT // 2
            return f"{text[:half]}\n…({len(text) - 2 * half} characters left out)…\n{text[-half:]}"

        self.add(
            JournalEntry(
                kind="command",
                summary=" ".join(result.argv[:4]),
                argv=result.argv,
                exit_code=result.exit_code,
                duration_s=round(result.duration_s, 3),
                changes_cluster=result.changes_cluster,
                stdout=cut(result.stdout),
                stderr=cut(result.stderr),
                diff=redact(diff) if diff else diff,
            )
        )

    def record_api(
        self, summary: str, *, diff: str | None = None, changes_cluster: bool = True, duration_s: float = 0.0
    ) -> None:
        self.add(
            JournalEntry(
                kind="api",
                summary=summary,
                changes_cluster=changes_cluster,
                diff=redact(diff) if diff else diff,
                duration_s=round(duration_s, 3),
            )
        )

    @property
    def entries(self) -> list[JournalEntry]:
        with self._lock:
            return list(self._entries)

    def changes(self) -> list[JournalEntry]:
        return [e for e in self.entries if e.changes_cluster]


class Runner:
    """Runs commands with a timeout and journals them.  Tests and records read the journal."""

    def __init__(self, journal: Journal | None = None, env: Mapping[str, str] | None = None) -> None:
        self.journal = journal if journal is not None else Journal()
        self._env = dict(env) if env is not None else None

    def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float = 120.0,
        stdin: str | None = None,
        changes_cluster: bool = False,
        diff: str | None = None,
        journal_output: bool = True,
        on_stderr_line: Callable[[str], None] | None = None,
    ) -> CommandResult:
        """``on_stderr_line``: each line of stderr as the program prints it (:func:`_streamed`)."""
        env = None if self._env is None else {**os.environ, **self._env}
        started = time.monotonic()
        in_flight = (
            self.journal.pending("command", " ".join(argv[:4]), argv)
            if changes_cluster
            else contextlib.nullcontext()
        )
        try:
            with in_flight:
                proc = (
                    subprocess.run(
                        list(argv),
                        input=stdin,
                        capture_output=True,
                        text=True,
                        timeout=timeout,
                        env=env,
                        check=False,
                    )
                    if on_stderr_line is None
                    else _streamed(list(argv), stdin, timeout, env, on_stderr_line)
                )
            result = CommandResult(
                argv=tuple(argv),
                exit_code=proc.returncode,
                stdout=proc.stdout,
                stderr=proc.stderr,
                duration_s=time.monotonic() - started,
                changes_cluster=changes_cluster,
            )
        except FileNotFoundError:
            raise PermanentError(
                f"{argv[0]}: command not found",
                hint="install it or set its path in the parameters (tools.talosctl / tools.helm / tools.kubectl)",
            ) from None
        except OSError as exc:  # not executable, another architecture's binary (ENOEXEC): it never started
            raise PermanentError(
                f"{argv[0]}: cannot run it: {exc.strerror or exc}",
                hint="point the parameter at an executable built for this machine (tools.talosctl / tools.helm / "
                "tools.kubectl)",
            ) from None
        except subprocess.TimeoutExpired as exc:
            result = CommandResult(
                argv=tuple(argv),
                exit_code=124,
                stdout=_text(exc.stdout),
                stderr=_text(exc.stderr) + f"\n(timed out after {timeout:.0f} s)",
                duration_s=time.monotonic() - started,
                changes_cluster=changes_cluster,
            )
        self.journal.record_command(result, diff=diff, keep_output=journal_output)
        return result


def _streamed(
    argv: list[str],
    stdin: str | None,
    timeout: float,
    env: dict[str, str] | None,
    on_line: Callable[[str], None],
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run``'s capture, each stderr line also handed to ``on_line`` as the program prints it.

    Why: one ``talosctl upgrade --wait`` over several nodes prints each node's failure the moment its tracker gives
    up, long before the process exits once its slowest node is back (talos@v1.12.0 cmd/talosctl/pkg/talos/action/
    tracker.go:210-227, 291-295).  Killed after ``timeout`` (``TimeoutExpired``, as ``subprocess.run``)."""
    expired = threading.Event()
    with subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    ) as proc:
        out: list[str] = []
        reader = threading.Thread(target=lambda: out.append(proc.stdout.read() if proc.stdout else ""))
        reader.start()
        if stdin is not None and proc.stdin is not None:
            proc.stdin.write(stdin)
            proc.stdin.close()

        def expire() -> None:
            expired.set()
            proc.kill()

        timer = threading.Timer(timeout, expire)
        timer.start()
        err: list[str] = []
        try:
            for line in proc.stderr or ():
                err.append(line)
                on_line(line)
        except BaseException:
            proc.kill()
            raise
        finally:
            timer.cancel()
            proc.wait()
            reader.join()
    if expired.is_set():
        raise subprocess.TimeoutExpired(argv, timeout, output="".join(out), stderr="".join(err))
    return subprocess.CompletedProcess(argv, proc.returncode, "".join(out), "".join(err))


def _text(value: bytes | str | None) -> str:
    if value is None:
        return ""
    return value.decode(errors="replace") if isinstance(value, bytes) else value


class KubeconfigTool:
    """A command-line client of the Kubernetes API (helm, kubectl): its binary, the kubeconfig it is pointed at
    (a path, never its contents) and the runner that journals its calls."""

    def __init__(self, binary: str, *, kubeconfig: str | None = None, runner: Runner | None = None) -> None:
        self.binary = binary
        self.kubeconfig = kubeconfig
        self.runner = runner or Runner()

    def argv(self, args: list[str]) -> list[str]:
        out = [self.binary, *args]
        if self.kubeconfig:
            out += ["--kubeconfig", self.kubeconfig]
        return out
