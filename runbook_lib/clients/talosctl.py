"""The library's talosctl client: the same argv against the simulator's binary or the real one.

Why fan-out is built in: a per-node loop over 1,000 nodes costs 1,000 round trips; talosctl itself fans a
``-n a,b,c`` call out concurrently and aggregates per-node failures into one multierror on stderr while
still printing the answers of the nodes that replied.  So every multi-node read here is one call per chunk
of nodes (chunks run concurrently), and per-node errors are parsed out of stderr instead of failing the
whole call.  ``read`` is the exception: talosctl refuses it for several nodes
(``command "read" is not supported with multiple nodes``), so it runs per node, concurrently.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from runbook_lib.errors import PermanentError
from runbook_lib.model.parsers import TalosResource, parse_talosctl_get

from .proc import CommandResult, Runner, is_transient

#: Nodes per talosctl call; keeps argv short and lets chunks run in parallel on very long node lists.
DEFAULT_CHUNK = 250
#: Nodes per ``patch --dry-run`` call when a long list is split (talosctl patches node after node).
DRY_RUN_CHUNK = 50
_MULTIERROR_HEAD = re.compile(r"^\d+ errors? occurred:$")


@dataclass
class FanOut:
    """Result of one logical multi-node call: answers per node plus the nodes that failed and why."""

    resources: list[TalosResource] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)
    results: list[CommandResult] = field(default_factory=list)

    def by_node(self) -> dict[str, list[TalosResource]]:
        out: dict[str, list[TalosResource]] = {}
        for resource in self.resources:
            out.setdefault(resource.node or "", []).append(resource)
        return out


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
    """Per-node errors from talosctl's aggregated stderr (``N errors occurred:`` + ``\\t* node: msg`` lines)."""
    wanted = sorted(set(nodes), key=len, reverse=True)
    errors: dict[str, str] = {}
    current: str | None = None
    for line in stderr.splitlines():
        stripped = line.strip()
        if stripped.startswith("* "):
            body = stripped[2:]
            current = next((n for n in wanted if body.startswith(n + ": ")), None)
            if current is not None:
                errors[current] = body[len(current) + 2 :]
        elif current is not None and line.startswith("\t\t"):
            errors[current] += "\n" + stripped
        elif stripped and not _MULTIERROR_HEAD.match(stripped):
            current = None
    return errors


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
        parallel: int = 32,
    ) -> None:
        self.binary = binary
        self.talosconfig = talosconfig
        self.runner = runner or Runner()
        self.chunk_size = chunk_size
        self.parallel = parallel

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
        args = ["get", resource, "-o", "json"]
        if namespace:
            args += ["--namespace", namespace]
        groups = chunks(list(nodes), self.chunk_size)
        with ThreadPoolExecutor(max_workers=min(len(groups), 8)) as pool:
            results = list(pool.map(lambda group: self.run(args, group, journal_output=False), groups))
        fan = FanOut(results=results)
        for group, result in zip(groups, results, strict=True):
            errors = node_errors(result.stderr, group)
            if result.stdout.strip():
                fan.resources += parse_talosctl_get(result.stdout)
            if result.exit_code != 0 and not errors:
                # The whole call failed (bad flag, bad config): every node in the chunk is affected.
                message = result.stderr.strip() or f"exit {result.exit_code}"
                errors = dict.fromkeys(group, message)
            fan.errors.update(errors)
        return fan

    def read(self, path: str, nodes: Sequence[str]) -> dict[str, NodeRead]:
        """``talosctl read <path>`` on each node, concurrently (talosctl refuses multi-node reads)."""

        def one(node: str) -> NodeRead:
            result = self.run(["read", path], [node])
            if result.ok:
                return NodeRead(node, result.stdout)
            return NodeRead(node, None, result.stderr.strip() or f"exit {result.exit_code}")

        with ThreadPoolExecutor(max_workers=max(1, min(self.parallel, len(nodes)))) as pool:
            return {r.node: r for r in pool.map(one, nodes)}

    def version(self, nodes: Sequence[str]) -> tuple[str | None, dict[str, str], dict[str, str]]:
        """Client tag, server tag per node, and per-node errors, from one ``talosctl version`` call."""
        result = self.run(["version"], list(nodes))
        client, servers = parse_version(result.stdout)
        errors = node_errors(result.stderr, nodes)
        for line in result.stderr.splitlines():  # talosctl version reports some node failures as warnings
            match = re.match(r"^WARNING: (\S+): (.*)$", line.strip())
            if match and match.group(1) in set(nodes):
                errors.setdefault(match.group(1), match.group(2))
        if not result.ok and not errors and not servers:
            errors = dict.fromkeys(nodes, result.stderr.strip() or f"exit {result.exit_code}")
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
    ) -> CommandResult:
        """``talosctl patch mc --patch @file`` (``@file`` works on every talosctl; bare names only from 1.12)."""
        with tempfile.TemporaryDirectory(prefix="runbook-patch-") as tmp:
            patch_file = Path(tmp) / "patch.yaml"
            patch_file.write_text(patch_yaml, encoding="utf-8")
            args = ["patch", "machineconfig", "--patch", f"@{patch_file}"]
            if mode:
                args += ["--mode", mode]
            if dry_run:
                args.append("--dry-run")
            if dry_run and len(nodes) > DRY_RUN_CHUNK:
                return self._chunked_dry_run(args, list(nodes), patch_yaml, timeout)
            result = self.run(args, nodes, timeout=timeout, changes_cluster=not dry_run, diff=patch_yaml)
        return result

    def _chunked_dry_run(
        self, args: list[str], nodes: list[str], patch_yaml: str, timeout: float
    ) -> CommandResult:
        """The dry run of a long node list as concurrent chunks, merged into one result.

        Why: talosctl's ``patch`` visits the nodes of ``-n a,b,c`` one after the other (and stops at the
        first failure), so one call over 1,000 nodes costs 1,000 round trips in a row
        (benchmarks/bench_fleet.py, "patch dry-run").  A dry run changes nothing, so splitting it is safe;
        real patches keep going through the rollout batches.
        """
        groups = chunks(nodes, DRY_RUN_CHUNK)
        with ThreadPoolExecutor(max_workers=min(len(groups), self.parallel // 4 or 1)) as pool:
            results = list(
                pool.map(lambda group: self.run(args, group, timeout=timeout, diff=patch_yaml), groups)
            )
        failed = next((r for r in results if not r.ok), None)
        return CommandResult(
            argv=tuple(self.argv(args, nodes)),
            exit_code=failed.exit_code if failed else 0,
            stdout="".join(r.stdout for r in results),
            stderr="".join(r.stderr for r in results),
            duration_s=max(r.duration_s for r in results),
        )

    def upgrade(self, node: str, image: str, *, wait: bool = True, timeout: float = 1800.0) -> CommandResult:
        """``talosctl upgrade --image <installer>``: never without ``--image`` (that drops the extensions)."""
        if not image:
            raise PermanentError(
                "refusing to run talosctl upgrade without --image: it would drop the NVIDIA extensions"
            )
        args = ["upgrade", "--image", image, f"--wait={'true' if wait else 'false'}"]
        if wait:
            # talosctl's own timeout first, so its error text (not a killed process) tells what hung
            args.append(f"--timeout={int(timeout)}s")
        return self.run(args, [node], timeout=timeout + 30, changes_cluster=True)

    def machineconfig_text(self, node: str) -> CommandResult:
        """The node's current machine config as YAML (``get machineconfig -o yaml``)."""
        return self.run(["get", "machineconfig", "-o", "yaml"], [node])


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
