"""Step: verification — is the NVIDIA stack on each node what the plan says, and if not, why?

Why evidence first, judgement second: every check is one fan-out call over all nodes (``get extensions``,
``services`` — the ServiceList API, which shows Finished one-shots that have no Service resource —
``get modules`` — ``read /proc/modules`` before Talos 1.11, and the driver version file, which talosctl only
reads per node, concurrently), so 1,000 nodes cost a handful of calls, not thousands.
The judgement is the failure table of the facts file (``runbook_lib.model.diagnosis``): a failed check
carries the likely cause and the command that fixes it, not just "failed".
"""

from __future__ import annotations

import re
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from runbook_lib.clients.fanout import Pool
from runbook_lib.clients.talosctl import FanOut, NodeRead
from runbook_lib.errors import RunbookError
from runbook_lib.model.diagnosis import (
    Evidence,
    NodeContext,
    cdi_baseline,
    check_cdi_spec,
    classify_extensions,
    diagnose,
    known_failure,
)
from runbook_lib.model.inventory import (
    GPU_RESOURCE,
    SOURCES,
    KubeGpu,
    NodeInventory,
    group_inventory,
    kube_gpu,
    node_gpus,
)
from runbook_lib.model.machineconfig import configured_modules
from runbook_lib.model.params import Node
from runbook_lib.model.parsers import (
    DriverInfo,
    OutputParseError,
    ServiceStatus,
    extension_versions,
    extensions_from_resources,
    modules_from_resources,
    parse_driver_version,
    parse_proc_modules,
    schematic_id,
)
from runbook_lib.model.pci import PciDevice, nvidia_gpus
from runbook_lib.model.text import shortened
from runbook_lib.model.versions import TalosVersion

from . import drains, fixes
from .context import Context
from .gpu_presence import read_pci
from .patch import read_configs
from .results import Check, NodeResult, StepResult, checks_from_findings

DRIVER_VERSION_FILE = "/proc/driver/nvidia/version"
#: The one-shot service that writes the CDI spec (siderolabs/extensions v1.13.0
#: nvidia-gpu/nvidia-container-toolkit/lts/nvidia-cdi-gen.yaml: ``nvidia-ctk cdi generate``).
CDI_GEN = "ext-nvidia-cdi-gen"
#: (connect, read) seconds for the optional Kubernetes view of the GPUs: a silent API must not hang verify
#: (kubernetes 37.0.2 kubernetes/client/rest.py: ``_request_timeout=None`` by default, i.e. no timeout;
#: urllib3 retries a timed-out GET 3 times, so a black-holed API costs about 4 x 5 s here).
KUBE_READ_TIMEOUT_S = (3.0, 5.0)


@dataclass
class _Collected:
    """Every node's evidence, as the fan-out calls returned it."""

    extensions: FanOut
    services: dict[str, dict[str, ServiceStatus]]
    service_errors: dict[str, str]
    drivers: dict[str, NodeRead]
    modules: dict[str, dict[str, str]]
    module_errors: dict[str, str]
    cdi_logs: tuple[dict[str, str], dict[str, str]] | None
    """``ext-nvidia-cdi-gen``'s log and the read's error per node (Talos >= 1.13), for Talos CI's CDI-spec
    check; ``None`` where the release has no such service."""
    talos: dict[str, str]
    """The Talos version each node reports (``talosctl version``), for the inventory."""
    pci: dict[str, list[PciDevice]]
    """PCI devices per node (Talos >= 1.8; empty before), for the inventory's GPU models."""
    kube: dict[str, KubeGpu] | None
    """GPU facts of the Kubernetes Node objects by node name; ``None`` when the API did not answer."""
    cordons: dict[str, bool]
    """The cordoned Nodes by name: True when a runbook run cordoned it (``drains.CORDON_MARK``)."""


def _collect(ctx: Context, addresses: list[str]) -> _Collected:
    """The checks are independent: all of them at once, so the step costs its slowest check (the per-node
    driver reads at 1,000 nodes), not their sum (benchmarks/bench_fleet.py, "verify ÷ floor")."""
    with Pool(8) as pool:  # a Ctrl-C cannot break its waits (fanout.py)
        extensions_call = pool.submit(ctx.talosctl.get, "extensions", addresses)
        version_call = pool.submit(ctx.talosctl.version, addresses)
        pci_call = pool.submit(read_pci, ctx, addresses)
        kube_call = pool.submit(_kube_nodes, ctx)
        services_call = pool.submit(ctx.talosctl.services, addresses)
        drivers_call = pool.submit(ctx.talosctl.read, DRIVER_VERSION_FILE, addresses)
        cdi = CDI_GEN in ctx.params.profile().services
        logs_call = pool.submit(_cdi_logs, ctx, addresses, services_call) if cdi else None
        module_state, module_errors = pool.result(pool.submit(_read_modules, ctx, addresses))
        services, service_errors = pool.result(services_call)
        talos = pool.result(version_call)[1]
        _reread_pre_111_modules(ctx, talos, module_state, module_errors)
        kube, cordons = pool.result(kube_call)
        return _Collected(
            pool.result(extensions_call),
            services,
            service_errors,
            pool.result(drivers_call),
            module_state,
            module_errors,
            pool.result(logs_call) if logs_call else None,
            talos,
            pool.result(pci_call),
            kube,
            cordons,
        )


def _cdi_logs(
    ctx: Context,
    addresses: list[str],
    services_call: Future[tuple[dict[str, dict[str, ServiceStatus]], dict[str, str]]],
) -> tuple[dict[str, str], dict[str, str]]:
    """``ext-nvidia-cdi-gen``'s log, read only on the nodes where it Finished: the only ones ``_cdi_spec`` judges.

    Why not every node: a node where it has not run since boot (no NVIDIA image yet, verify as a pre-check)
    answers ``log "ext-nvidia-cdi-gen" was not registered`` (talos@v1.13.0 runtime/logging/circular.go:235-247),
    and the log client then re-reads each such node on its own: one talosctl process per node for nothing.
    """
    services = services_call.result()[0]  # the other reads go on meanwhile
    finished = [n for n in addresses if (s := services.get(n, {}).get(CDI_GEN)) and s.state == "Finished"]
    return ctx.talosctl.logs(CDI_GEN, finished) if finished else ({}, {})


def _reread_pre_111_modules(
    ctx: Context, talos: dict[str, str], state: dict[str, dict[str, str]], errors: dict[str, str]
) -> None:
    """Read ``/proc/modules`` again on the nodes that run Talos 1.10 or older under a 1.11+ plan (in place).

    Why: ``get modules`` names LoadedKernelModule from 1.11 (talos@v1.11.0 pkg/machinery/resources/runtime/
    loaded_kernel_module.go:48), but on 1.10 the alias ``modules`` is KernelModuleSpec, the modules the config
    asks for, with no state (talos@v1.10.0 .../kernel_module_spec.go:46): a healthy node the image step has not
    moved read as "modules not Live". Only such nodes are read again, so a fleet on one release pays nothing."""
    if ctx.params.profile().module_check != "get modules":
        return
    older = [
        address
        for address, tag in talos.items()
        if (found := TalosVersion.parse_or_none(tag)) is not None and not found.at_least(1, 11)
    ]
    if older:
        again, again_errors = _read_modules(ctx, older, proc=True)
        for address in older:
            state.pop(address, None)
            errors.pop(address, None)
        state.update(again)
        errors.update(again_errors)


#: How :func:`_read_modules` says a node answered with a ``/proc/modules`` it could not parse: not unreachable.
_NOT_UNDERSTOOD = "/proc/modules not understood: "


def _read_modules(
    ctx: Context, addresses: list[str], *, proc: bool = False
) -> tuple[dict[str, dict[str, str]], dict[str, str]]:
    """Module name -> state per node, and per-node errors (``get modules`` from Talos 1.11, else, or with
    ``proc``, ``/proc/modules``)."""
    if not proc and ctx.params.profile().module_check == "get modules":
        module_fan = ctx.talosctl.get("modules", addresses)
        state = {
            n: {m.name: m.state for m in modules_from_resources(r).values()}
            for n, r in module_fan.by_node().items()
        }
        return state, module_fan.errors
    reads = ctx.talosctl.read("/proc/modules", addresses)
    errors = {n: r.error or "" for n, r in reads.items() if r.text is None}
    parsed: dict[str, dict[str, str]] = {}
    for node, read in reads.items():
        if read.text is None:
            continue
        try:
            parsed[node] = {m.name: m.state for m in parse_proc_modules(read.text).values()}
        except OutputParseError as exc:  # that node's, not the fleet's verify (simulator audit, stop 52)
            errors[node] = f"{_NOT_UNDERSTOOD}{exc.message}"
    return parsed, errors


def _kube_nodes(ctx: Context) -> tuple[dict[str, KubeGpu] | None, dict[str, bool]]:
    """The Kubernetes view of every node's GPUs (``None`` when the API cannot be read) and of its cordon.

    Why optional: verification is about the Talos nodes and must not fail because the Kubernetes API is
    not reachable from here; the inventory then says the allocatable count is unknown.
    """
    gpus: dict[str, KubeGpu] = {}
    cordons: dict[str, bool] = {}
    try:
        for n in ctx.kube.iter_nodes(timeout_s=KUBE_READ_TIMEOUT_S):
            name = str(n["metadata"]["name"])
            gpus[name] = kube_gpu(n)
            marked = drains.cordon_of(n)
            if marked is not None:
                cordons[name] = marked
    except (RunbookError, ValueError):  # ValueError: an answer that is not the API's JSON
        return None, {}
    return gpus, cordons


def _cordon_check(ctx: Context, node: Node, cordons: dict[str, bool]) -> Check | None:
    """A failed check for a Node cordoned with the runbook's mark: a run (or a rollback) cordoned it for a drain
    and could not lift it (interrupted between the drain and the uncordon). The node passed every other check,
    looked done, and took no pod, so the CUDA test's pod for it stayed Pending. A cordon without the mark is
    not the runbook's to judge: :func:`_cordon_note`."""
    if not cordons.get(node.name):
        return None
    fix = drains.uncordon_command(node.name, marked=True)
    if ctx.params.default_runtime_patch:  # only where config-patch drains does it look for such cordons
        fix += "; or: runbook run -p <parameters> --steps config-patch --apply  # lifts it once the Node is Ready"
    return Check(
        "node schedulable",
        False,
        f"Node {node.name} is cordoned and carries the runbook's mark ({drains.CORDON_MARK}), so no pod is "
        "scheduled there",
        cause="a run or a rollback drained it before a reboot and was interrupted, or failed, before the uncordon",
        fix=fix,
    )


def _cordon_note(result: StepResult, nodes: list[Node], cordons: dict[str, bool]) -> None:
    """The note naming the GPU nodes cordoned without the runbook's mark (``drains.unmarked_note``)."""
    others = [n.name for n in nodes if cordons.get(n.name) is False]
    if others:
        result.notes.append(drains.unmarked_note(others))


def verify(
    ctx: Context,
    *,
    only: list[str] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> StepResult:
    """Collect the evidence of every GPU node in a few fan-out calls, then diagnose each node."""
    nodes = ctx.nodes(only)
    result = StepResult(step="verify", applied=False)
    seen = _collect(ctx, [n.address for n in nodes])
    # each node's release, read once: its kernel-module check, the other-minor check and the other-patch note
    releases = {address: TalosVersion.parse_or_none(tag) for address, tag in seen.talos.items()}
    ext_by_node = seen.extensions.by_node()
    unconfigured: list[tuple[Node, NodeResult]] = []
    inventories: dict[str, NodeInventory] = {}
    for index, node in enumerate(nodes, start=1):
        res = NodeResult(node=node.name, address=node.address)
        result.nodes.append(res)
        unreachable = seen.extensions.errors.get(node.address) or seen.module_errors.get(node.address)
        if unreachable and unreachable.startswith(_NOT_UNDERSTOOD):
            _modules_not_understood(res, unreachable)
            continue
        if unreachable:
            _unreachable(res, unreachable)
            continue
        exts = extensions_from_resources(ext_by_node.get(node.address, []))
        ext_versions = extension_versions(exts)
        driver, driver_check = _driver(node.address, seen.drivers.get(node.address))
        service_error = seen.service_errors.get(node.address)
        evidence = Evidence(
            modules=seen.modules.get(node.address, {}),
            driver=driver,
            extensions=ext_versions,
            schematic=schematic_id(exts),
            services=None if service_error else seen.services.get(node.address, {}),
        )
        planned = ctx.plan.schematic_of(node.name)
        running = releases.get(node.address)
        findings = diagnose(
            evidence,
            ctx.node_context(node.address, schematic=planned, running=running),
            planned_schematic=planned,
        )
        res.checks = [*_other_minor(ctx, node, running), *checks_from_findings(findings)]
        cordon = _cordon_check(ctx, node, seen.cordons)
        if cordon is not None:
            res.checks.append(cordon)
        cdi = _cdi_spec(seen, ext_versions, evidence, ctx.node_context(node.address))
        if cdi is not None:
            res.checks.append(cdi)
        if any(f.failure == "modules-not-configured" for f in findings):
            unconfigured.append((node, res))
        if driver_check is not None:
            res.checks.append(driver_check)
        if service_error:
            command = f"talosctl -n {node.address} service"
            res.checks.append(
                _unread("services", "the services", command, service_error, fix=command, cause=_NOT_READ)
            )
        res.data = {
            "extensions": ext_versions,
            "schematic": evidence.schematic,
            "driver": driver.version if driver else None,
        }
        inventories[node.name] = _inventory(ctx, seen, node, evidence)
        res.data |= inventories[node.name].to_dict()
        res.status = "ok" if all(c.ok for c in res.checks) else "failed"
        failed = [c.name for c in res.checks if not c.ok]
        res.message = "all checks passed" if not failed else "failed: " + ", ".join(failed)
        if progress:
            progress(index, len(nodes))
    if unconfigured:
        _configured_but_not_loaded(ctx, unconfigured)
    fixes.name_own_installers(ctx, result)
    _other_patch_note(ctx, result, nodes, releases)
    _cordon_note(result, nodes, seen.cordons)
    _add_inventory(result, inventories, seen.kube)
    return result.finish()


def _other_minor(ctx: Context, node: Node, found: TalosVersion | None) -> list[Check]:
    """A failed check, first, when the node runs another Talos minor than the plan: every check after it is
    judged against the plan's release (which extension services exist, the CDI spec, the kernel module
    extension's build), so on a node the image step has not moved they fail for reasons that are not the
    node's (found by a review helper against talos and extensions sources: a 1.12 node judged as 1.13 lacks
    ``ext-nvidia-cdi-gen``, a service no 1.12 extension has). Only the minor: a node on another patch of the
    same minor is the image step's business (it refuses to move a node back); its kernel-module build is compared
    with the release the node reports (``NodeContext.running``), not the plan's."""
    planned = ctx.params.talos
    if found is None or found.minor_line == planned.minor_line:
        return []
    message = f"the node runs Talos {found}, the plan {planned}: the checks below expect {planned}"
    if found > planned:
        fix = f"set talos_version: {found} in the parameters (the image step does not move a node back)"
        return [Check("Talos release", False, message, fix=fix, cause="the node is newer than the plan")]
    return [
        Check(
            "Talos release",
            False,
            message,
            fix=f"runbook run -p <parameters> --steps image --apply  # moves {node.name} to {planned}",
            cause="the image step has not upgraded this node (it failed, was skipped, or rolled back)",
        )
    ]


def _other_patch_note(
    ctx: Context, result: StepResult, nodes: list[Node], releases: dict[str, TalosVersion | None]
) -> None:
    """A note (not a failure) naming the nodes on another patch of the plan's minor: their checks are judged by
    the release they run and may all pass, but they are not where the plan puts them; the image step moves them
    (or, newer, keeps them: it does not move a node back)."""
    planned = ctx.params.talos
    other: dict[str, list[str]] = {}
    for node in nodes:
        found = releases.get(node.address)
        if found is not None and found.minor_line == planned.minor_line and found != planned:
            other.setdefault(str(found), []).append(node.name)
    for version, names in sorted(other.items()):
        result.notes.append(
            f"{shortened(names, 5)} run{'s' if len(names) == 1 else ''} Talos {version}, not the plan's {planned}: "
            "the image step moves a node to the plan's release (never back)"
        )


def _allocatable_shown(kube: dict[str, KubeGpu] | None) -> bool:
    """The allocatable count is shown once the Kubernetes layer is in, i.e. some node advertises it."""
    return kube is not None and any(k.allocatable > 0 for k in kube.values())


def _inventory(ctx: Context, seen: _Collected, node: Node, evidence: Evidence) -> NodeInventory:
    """One node's facts for the "what was checked" view; each field's source is in ``SOURCES``."""
    address = node.address
    kube = seen.kube.get(node.name) if seen.kube is not None else None
    pci = seen.pci.get(address)
    loaded = evidence.modules or {}
    return NodeInventory(
        talos=seen.talos.get(address),
        schematic=evidence.schematic,
        extensions=tuple(sorted((evidence.extensions or {}).items())),
        modules=tuple((m, loaded.get(m) or "not loaded") for m in ctx.params.profile(node).modules),
        driver=evidence.driver.version if evidence.driver else None,
        gpus=node_gpus(None if pci is None else [d.product for d in nvidia_gpus(pci)], kube),
        allocatable=kube.allocatable if kube is not None and _allocatable_shown(seen.kube) else None,
    )


def _add_inventory(
    result: StepResult, inventories: dict[str, NodeInventory], kube: dict[str, KubeGpu] | None
) -> None:
    """The grouped inventory (one entry per distinct set of facts) and where each fact came from."""
    result.data["inventory"] = [group.to_dict() for group in group_inventory(inventories)]
    result.data["inventory_sources"] = dict(SOURCES)
    if kube is None:
        result.data["inventory_notes"] = [
            f"{GPU_RESOURCE} allocatable unknown: the Kubernetes API did not answer"
        ]
    elif not _allocatable_shown(kube):
        result.data["inventory_notes"] = [
            f"no node advertises {GPU_RESOURCE} yet: the Kubernetes layer (step 5) is not installed or not ready"
        ]


#: ``/proc/driver/nvidia/version``'s architecture as Talos CI names it (``Version.Arch``).
_GO_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}


def _cdi_spec(
    seen: _Collected, extensions: dict[str, str], evidence: Evidence, ctx: NodeContext
) -> Check | None:
    """Talos CI's CDI-spec completeness check, where CI publishes a baseline for the node's release.

    Judged as CI does, once ``ext-nvidia-cdi-gen`` Finished (talos v1.13.0 internal/integration/api/
    extensions_nvidia.go:84-88 asserts that first; until then the services check fails the node).  A log that
    could not be read, or has no line, is no evidence: counting its 0 ``Could not locate`` lines passed the node.
    """
    kmod = classify_extensions(extensions).kmod
    driver = evidence.driver
    if seen.cdi_logs is None or kmod is None or driver is None or ctx.node is None:
        return None
    arch = _GO_ARCH.get(driver.arch or "")
    state = (evidence.services or {}).get(CDI_GEN)
    if cdi_baseline(kmod.name, ctx, arch=arch) is None or state is None or state.state != "Finished":
        return None
    logs, errors = seen.cdi_logs
    if ctx.node in errors or not logs.get(ctx.node):
        return _cdi_log_unread(ctx.node, errors.get(ctx.node))
    finding = check_cdi_spec(logs[ctx.node], kmod.name, ctx, arch=arch)
    return checks_from_findings([finding])[0] if finding else None


def _cdi_log_unread(address: str, error: str | None) -> Check:
    """The cdi-spec check of a node whose ``ext-nvidia-cdi-gen`` log talosctl could not give (or gave empty)."""
    command = f"talosctl -n {address} logs {CDI_GEN}"
    return _unread(
        "cdi-spec",
        "the CDI spec (a healthy node's log lists the files Talos CI counts)",
        command,
        error,
        cause="the log was not read: the node or its API refused the request, or the service has not run "
        "since the node booted (its log is kept in memory)",
        fix=f"talosctl -n {address} service {CDI_GEN}   # has it run since boot? then read its log: {command}",
    )


#: Why a check whose read failed says nothing about the node itself.
_NOT_READ = (
    "the evidence was not read (the node, its API or the network refused the request), so nothing is known"
)


def _unread(name: str, subject: str, command: str, error: str | None, *, fix: str, cause: str) -> Check:
    """The failed check of evidence talosctl could not read: a read that failed is no evidence, and counting it
    as "nothing wrong" passed nodes (the cdi-spec and driver checks did)."""
    what = (
        f"failed: {(error.strip() or 'no output').splitlines()[0]}"
        if error is not None
        else "printed no line"
    )
    return Check(name, False, f"cannot check {subject}: `{command}` {what}", cause=cause, fix=fix)


def _unreachable(res: NodeResult, error: str) -> None:
    res.status = "failed"
    res.message = f"node did not answer: {error.splitlines()[0]}"
    res.checks.append(
        Check(
            "reachable",
            False,
            res.message,
            cause="the node is down, rebooting, or port 50000 is not reachable from here",
            fix=fixes.unreachable(res.address, "verify"),
        )
    )


def _modules_not_understood(res: NodeResult, error: str) -> None:
    """The node answered, with a ``/proc/modules`` line the parser does not know: its failure, not a dead node's."""
    res.status = "failed"
    res.message = error.splitlines()[0]
    command = f"talosctl -n {res.address} read /proc/modules"
    cause = "the loaded modules are unknown, so the node's driver state is not checked"
    res.checks.append(
        Check("kernel modules", False, res.message, cause=cause, fix=f"{command}  # read it by hand")
    )


def _configured_but_not_loaded(ctx: Context, suspects: list[tuple[Node, NodeResult]]) -> None:
    """Tell "modules not in the config" from "in the config but the driver did not load".

    Only nodes whose modules are missing are read (one fan-out call), so a healthy fleet pays nothing.  When
    the config already lists the modules, patching again cannot help: the driver failed to load (an
    unsupported GPU, or no GPU), which the kernel log shows.
    """
    configs, _errors = read_configs(ctx, [node for node, _res in suspects])
    entry = known_failure("gpu-unsupported")
    for node, res in suspects:
        docs = configs.get(node.address)
        if docs is None or not set(ctx.params.profile(node).modules) <= configured_modules(docs):
            continue
        for index, check in enumerate(res.checks):
            if check.name == "modules" and not check.ok:
                res.checks[index] = Check(
                    "modules",
                    False,
                    "the machine config lists the NVIDIA modules, but they are not loaded: the driver failed to "
                    f"load (likely cause: {entry.cause}, or no NVIDIA GPU in the node)",
                    cause=entry.cause,
                    fix=f"talosctl -n {node.address} dmesg | grep NVRM   # shows why; then: {entry.fix}",
                )


def _driver(address: str, read: NodeRead | None) -> tuple[DriverInfo | None, Check | None]:
    """The driver the node runs, or the check that says why it is not known.

    Only an absent file (the NVIDIA module not loaded: the module checks say why) is left to other checks; any
    other failed read is no evidence, and skipping the driver checks on it passed the node on its modules alone.
    """
    if read is None or read.text is None:
        error = (read.error or "") if read is not None else "no answer"
        if _ABSENT.search(error):
            return None, None
        return None, _driver_unread(address, error)
    try:
        return parse_driver_version(read.text), None
    except OutputParseError as exc:
        return None, Check("driver version file", False, exc.message, fix=exc.hint or "")


#: How a read of a file that does not exist fails: ``NotFound`` from Talos 1.8, the bare ``stat`` error before
#: (talos@v1.13.0 internal/app/machined/internal/server/v1alpha1/v1alpha1_server.go:1388-1396 Read; v1.7.0 :1278-1282).
_ABSENT = re.compile(r"code = NotFound|no such file or directory")


def _driver_unread(address: str, error: str) -> Check:
    """The failed ``driver version file`` check of a node whose file talosctl could not read."""
    command = f"talosctl -n {address} read {DRIVER_VERSION_FILE}"
    fix = command
    if "PermissionDenied" in error:
        # MachineService/Read is for os:admin only (talos@v1.13.0 internal/app/machined/pkg/system/services/
        # machined.go:99); os:operator and os:reader may read logs and resources
        fix = f"use a talosconfig with the os:admin role (talosctl read needs it), then: {command}"
    cause = "the file was not read, so the driver's version and its match with the extensions are unknown"
    return _unread("driver version file", "the driver", command, error, fix=fix, cause=cause)


def node_driver_versions(result: StepResult) -> dict[str, str]:
    """Driver per node from a verify result, for the CUDA test's comparison."""
    out: dict[str, str] = {}
    for node in result.nodes:
        driver: Any = node.data.get("driver")
        if driver:
            out[node.node] = str(driver)
    return out
