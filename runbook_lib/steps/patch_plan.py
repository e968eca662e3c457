"""The config-patch step's plan: per chunk of nodes, read the configs, work out each node's remaining patch and
dry-run it, the chunks overlapping one another.

Why per chunk: the dry run of a node needs its config first.  Reading the whole fleet, then planning it, then
dry-running it put the slowest read chunk, all of the planning (Python, one core) and the slowest dry-run chunk
one after the other: at 1,000 nodes with the real talosctl that was 1.5-2x the fastest direct use of talosctl,
which pipelines ``get machineconfig`` and ``patch --dry-run`` per chunk (benchmarks/README.md,
bench_real_talosctl.py).  Per chunk, one chunk's planning runs while the others wait on talosctl.

Why each distinct patch is rendered once: nodes that lack the same thing get the same patch, and one YAML dump
per node to find out cost ~0.7 s of CPU at 1,000 nodes; a JSON key of the remaining documents (C code) finds
the nodes with equal patches and the YAML is rendered once per distinct patch.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any

from runbook_lib.clients.fanout import concurrently
from runbook_lib.clients.talosctl import FanOut, PatchCall, PatchResult
from runbook_lib.model.machineconfig import FileConflict, config_documents, remaining_patch
from runbook_lib.model.params import Node
from runbook_lib.model.parsers import extension_versions, extensions_from_resources
from runbook_lib.model.profiles import render_documents
from runbook_lib.model.rollback import sysctls_before
from runbook_lib.model.versions import TalosVersion

from . import fixes
from .context import Context
from .results import Check, NodeResult

#: The MachineConfig resource talosctl patch acts on (``config.ActiveID``).
ACTIVE_CONFIG_ID = "v1alpha1"

Configs = dict[str, list[dict[str, Any]]]


def wanted_documents(
    ctx: Context, node: Node, *, default_runtime: bool = True, legacy_modules: bool = False
) -> list[dict[str, Any]]:
    """The patch documents the node should carry; ``default_runtime`` False leaves out the default-runtime
    patch (see :func:`nvidia_runtime_nodes`); ``legacy_modules`` asks for the modules in the form a node still
    on an earlier release reads (:func:`legacy_module_nodes`)."""
    profile = ctx.params.profile(node)
    images = (
        profile.install_extension_images() if profile.extension_delivery == "install-extensions" else None
    )
    docs = profile.machine_config_patch_documents(install_images=images, legacy_modules=legacy_modules)
    if ctx.params.default_runtime_patch and default_runtime:
        docs += profile.default_runtime_documents()
    return docs


def nvidia_runtime_nodes(extensions: FanOut) -> set[str]:
    """Addresses of the nodes, in a ``get extensions`` answer, whose image has the container toolkit, i.e. a
    containerd ``nvidia`` runtime.

    Why: containerd refuses a CRI config whose ``default_runtime_name`` names no configured runtime ("no
    corresponding runtime configured in `containerd.runtimes`", containerd internal/cri/config/config.go
    ``ValidateRuntimeConfig``), and the ``nvidia`` runtime comes with the toolkit extension
    (extensions@v1.12.0:nvidia-gpu/nvidia-container-toolkit/nvidia-container-runtime/
    10-nvidia-container-runtime.part).  The config patch runs before the image upgrade, so making ``nvidia``
    the default there would take the node's CRI, and every pod on it, down until the upgrade: it waits
    for the toolkit, and the image step applies it after the upgrade.  A node whose extensions could not be
    read is not counted: the default runtime waits for it too.
    """
    return {
        address
        for address, resources in extensions.by_node().items()
        if any(
            "nvidia-container-toolkit" in name
            for name in extension_versions(extensions_from_resources(resources))
        )
    }


def documents_modules(ctx: Context) -> bool:
    """Whether the target release's modules patch is ``KernelModuleConfig`` documents (Talos 1.14 on), which a
    node still on an earlier release refuses: only then does the plan read the nodes' running release."""
    return ctx.params.profile().module_config == "KernelModuleConfig"


def legacy_module_nodes(servers: dict[str, str], addresses: list[str]) -> set[str]:
    """Of ``addresses``, the nodes to patch with ``machine.kernel.modules`` although the target documents
    ``KernelModuleConfig``: those running a release before 1.14 (``talosctl version``'s server tag per node), and
    those whose release could not be read, since every release from 1.3 to 1.14 loads that form.

    Why: the config-patch step runs before the image step upgrades the node, so on a fresh 1.13 node bound for
    1.14 the documents went to a machined that refuses them (talos@v1.13.0
    pkg/machinery/config/configloader/internal/decoder/decoder.go:135 wrapping registry.go:79: ``error decoding
    document v1alpha1/KernelModuleConfig/nvidia (line N): "KernelModuleConfig" "v1alpha1": not registered``),
    and no 1.13 node could be moved to 1.14 by the runbook."""
    releases = {address: TalosVersion.parse_or_none(servers.get(address)) for address in addresses}
    return {
        address for address, running in releases.items() if running is None or not running.at_least(1, 14)
    }


def configs_of(fan: FanOut) -> tuple[Configs, dict[str, str]]:
    """The active machine config documents per node address in a ``get machineconfig`` answer, and the
    per-node read errors.

    Each distinct config text is parsed once (nodes with the same text share its documents, which nothing
    changes; each node's list is its own).  Why: building the YAML of a 20 KB worker config costs ~1.2 ms of CPU
    (PyYAML's constructor is Python even with libyaml's parser), 2.4 s at 1,000 nodes, spent under one
    interpreter lock: on the loaded 2-core machine the dry run took 63.4 s against its floor's 27.1 s in the same
    chunks (benchmarks/README.md, issue 16).  Workers applied from one ``worker.yaml`` share one text; nodes with
    per-node configs (hostnames, addresses) still cost one parse each.
    """
    configs: Configs = {}
    parsed: dict[str, list[dict[str, Any]]] = {}
    for node, resources in fan.by_node().items():
        docs: list[dict[str, Any]] = []
        # Real nodes also expose the "persistent" (and "maintenance") config; patches apply to the active one.
        for resource in [r for r in resources if r.id == ACTIVE_CONFIG_ID] or resources:
            if resource.spec_text is None:
                docs += config_documents(resource.spec)
                continue
            if resource.spec_text not in parsed:
                parsed[resource.spec_text] = config_documents(resource.spec_text)
            docs += parsed[resource.spec_text]
        configs[node] = docs
    return configs, fan.errors


class RenderOnce:
    """:func:`render_documents` once per distinct patch; shared by the chunks' threads (a race renders a patch
    twice, to the same text)."""

    def __init__(self) -> None:
        self._texts: dict[str, str] = {}
        self._lock = threading.Lock()

    def __call__(self, docs: list[dict[str, Any]]) -> str:
        key = json.dumps(docs, default=str)  # order kept, as the YAML keeps it (sort_keys=False)
        with self._lock:
            text = self._texts.get(key)
        if text is None:
            text = render_documents(docs)
            with self._lock:
                self._texts[key] = text
        return text


@dataclass
class ChunkPlan:
    """One chunk's plan: its nodes' results (in order), the patch of each planned node, and the chunk's dry-run
    call per distinct patch."""

    results: list[NodeResult] = field(default_factory=list)
    patch_of: dict[str, str] = field(default_factory=dict)
    dry_runs: dict[str, PatchResult] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)
    """Address -> the error of each node whose own dry run failed."""


@dataclass(frozen=True)
class ChunkReads:
    """What the plan of one chunk read: configs and read errors by address, the nodes that can take the
    default-runtime patch, and the nodes that need the modules as ``machine.kernel.modules``."""

    configs: Configs
    errors: dict[str, str]
    ready: set[str]
    legacy: set[str]


@dataclass(frozen=True)
class Planner:
    """What every chunk's plan needs: the step's context, its nodes by address, and the shared renderer."""

    ctx: Context
    nodes: dict[str, Node]
    render: RenderOnce = field(default_factory=RenderOnce)

    def chunk(self, addresses: list[str]) -> ChunkPlan:
        """Read the chunk's configs (one ``get`` call, and what else it needs beside it: :meth:`read`), plan each
        node, dry-run each distinct patch (one call each, one after the other: the other chunks run beside this
        one)."""
        reads = self.read(addresses)
        plan = ChunkPlan()
        for address in addresses:
            res, patch = self.node(self.nodes[address], reads)
            plan.results.append(res)
            if patch is not None:
                plan.patch_of[address] = patch
        groups: dict[str, list[str]] = {}
        for address, patch in plan.patch_of.items():
            groups.setdefault(patch, []).append(address)
        if groups:
            plan.dry_runs, plan.refused = self.dry_run(groups)
        return plan

    def dry_run(self, groups: dict[str, list[str]]) -> tuple[dict[str, PatchResult], dict[str, str]]:
        """Dry-run each patch over its nodes: (each patch's calls, the nodes refused and why).

        talosctl stops a call at the first node that fails (``PatchCall.outcome``); the nodes after it were never
        dry-run, so they go again without the refused ones, round after round, until each node has its own
        verdict. A node's refusal is its own (its config, its release): it does not fail its siblings. Each round
        is one call per patch, in this chunk's thread; many refusing nodes cost one round each.
        """
        calls: dict[str, list[PatchCall]] = {patch: [] for patch in groups}
        refused: dict[str, str] = {}
        pending = dict(groups)
        while pending:
            runs = self.ctx.talosctl.patch_machineconfigs(list(pending.items()), dry_run=True, split=False)
            again: dict[str, list[str]] = {}
            for (patch, addresses), run in zip(pending.items(), runs, strict=True):
                calls[patch] += run.calls
                failed, untouched = run.outcomes()
                refused.update(failed)
                rest = [address for address in addresses if address in untouched]
                if failed and rest:
                    again[patch] = rest
            pending = again
        return {patch: PatchResult(tuple(c)) for patch, c in calls.items()}, refused

    def read(self, addresses: list[str]) -> ChunkReads:
        """The chunk's configs and read errors; which of its nodes can take the default-runtime patch (all of them
        when it is not asked for); which need the modules in the older form (none unless the target documents
        ``KernelModuleConfig``: :func:`legacy_module_nodes`).

        Why the calls at once, per chunk: the extensions decide the default-runtime patch
        (:func:`nvidia_runtime_nodes`); read over the whole fleet before the first chunk (until 2 Dec 2026) they
        were one more wave of talosctl calls in a row before any config was read. The release is read only
        where the form depends on it (Talos 1.14 on), so the plan of an earlier release makes no extra call.
        """
        jobs: list[str] = ["machineconfig"]
        if self.ctx.params.default_runtime_patch:
            jobs.append("extensions")
        if documents_modules(self.ctx):
            jobs.append("version")
        answers = dict(
            zip(
                jobs, concurrently(lambda what: self._read_one(what, addresses), jobs, len(jobs)), strict=True
            )
        )
        configs, errors = configs_of(answers["machineconfig"])
        ready = nvidia_runtime_nodes(answers["extensions"]) if "extensions" in answers else set(addresses)
        legacy = legacy_module_nodes(answers["version"], addresses) if "version" in answers else set()
        return ChunkReads(configs, errors, ready, legacy)

    def _read_one(self, what: str, addresses: list[str]) -> Any:
        if what == "version":
            return self.ctx.talosctl.version(addresses)[1]
        return self.ctx.talosctl.get_call(what, addresses)

    def node(self, node: Node, reads: ChunkReads) -> tuple[NodeResult, str | None]:
        """One node's result before the dry run, and its patch when it lacks something."""
        res = NodeResult(node=node.name, address=node.address)
        configs, errors = reads.configs, reads.errors
        if node.address in errors or node.address not in configs:
            res.status = "failed"
            res.message = f"cannot read the machine config: {errors.get(node.address, 'no answer')}"
            res.checks.append(
                Check(
                    "machine config readable",
                    False,
                    res.message,
                    fix=unreachable_fix(node, after_preflight=self.ctx.apply),
                )
            )
            return res, None
        legacy = node.address in reads.legacy
        # A node before 1.14 bound for 1.14 would refuse the CRICustomizationConfig document as it refuses
        # KernelModuleConfig (kind first registered at talos@v1.14.0-rc.1 pkg/machinery/config/types/cri/
        # customization.go:21): the image step applies it once the node runs 1.14.
        ready = node.address in reads.ready and not (legacy and self.ctx.params.default_runtime_patch)
        if not ready:
            res.data["default_runtime_deferred"] = True
        if legacy:
            res.data["modules_form"] = "machine.kernel.modules (the node runs a release before 1.14)"
        try:
            remaining = remaining_patch(
                wanted_documents(self.ctx, node, default_runtime=ready, legacy_modules=legacy),
                configs[node.address],
            )
        except FileConflict as exc:
            res.status = "failed"
            res.message = str(exc)
            res.checks.append(Check("default-runtime file", False, str(exc)))
            return res, None
        if not remaining:
            res.status = "unchanged"
            res.message = "the machine config already contains the patch"
            return res, None
        res.status = "planned"
        replaced = sysctls_before(remaining, configs[node.address])
        if replaced:  # what the rollback step sets back (model/rollback.py)
            res.data["sysctls_before"] = replaced
        return res, self.render(remaining)


@dataclass
class Plan:
    """The whole dry run: every node's result (in the step's node order), the nodes of each distinct patch (in
    order of their first node) and each patch's dry run (its chunks' calls in node order)."""

    results: dict[str, NodeResult]
    groups: dict[str, list[Node]]
    dry_runs: dict[str, PatchResult]
    refused: dict[str, str] = field(default_factory=dict)


def plan_and_dry_run(ctx: Context, nodes: list[Node]) -> Plan:
    """Read, plan and dry-run ``nodes`` chunk by chunk (``Talosctl.pipeline``); per-node results as the step
    reports them, and per patch the nodes and dry-run calls, as one dry run over the group would give them."""
    planner = Planner(ctx, {n.address: n for n in nodes})
    chunks = ctx.talosctl.pipeline([n.address for n in nodes], planner.chunk)
    results = {res.address: res for chunk in chunks for res in chunk.results}
    patch_of = {address: patch for chunk in chunks for address, patch in chunk.patch_of.items()}
    groups: dict[str, list[Node]] = {}
    for node in nodes:
        if node.address in patch_of:
            groups.setdefault(patch_of[node.address], []).append(node)
    calls: dict[str, list[PatchCall]] = {patch: [] for patch in groups}
    for chunk in chunks:
        for patch, run in chunk.dry_runs.items():
            calls[patch] += run.calls
    refused = {address: error for chunk in chunks for address, error in chunk.refused.items()}
    return Plan(results, groups, {patch: PatchResult(tuple(c)) for patch, c in calls.items()}, refused)


def unreachable_fix(node: Node, *, after_preflight: bool = False) -> str:
    return "a node that is rebooting answers again after a few minutes; otherwise " + fixes.unreachable(
        node.address, "config-patch", after_preflight=after_preflight
    )
