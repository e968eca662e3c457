"""``runbook diagnose``: findings from outputs a user collected by hand, with no cluster access.

Why: GPU trouble reaches support as pasted ``talosctl``/``nvidia-smi`` output.  This command reads those
pastes with the same parsers and the same failure table the verify step uses, so the answer (cause and
the exact command to run) is the one the runbook itself would give.

Exit codes: 0 every finding ok, 1 some finding failed, 2 an input could not be read or parsed (the message
names the file).

Inputs are pasted by people and may be hostile or broken, so reading is bounded: regular files or ``-`` only
(a FIFO with no writer would hang, ``/dev/zero`` would fill memory), at most :data:`MAX_INPUT_BYTES`, YAML
through :mod:`runbook_lib.model.safeload` (no alias bombs, no deep nesting), and an empty input is an error:
it is what a failed ``talosctl ... > file`` leaves, and "nothing loaded" read from it would be a lie.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from runbook_lib.errors import PermanentError
from runbook_lib.model import safeload
from runbook_lib.model.boot_assets import PUBLIC_FACTORY_URL, is_factory_url
from runbook_lib.model.diagnosis import Evidence, Finding, NodeContext, classify_extensions, diagnose
from runbook_lib.model.parsers import (
    NVIDIA_MODULES,
    DriverInfo,
    Extension,
    KernelModule,
    NvidiaSmi,
    ServiceStatus,
    extension_versions,
    is_talosctl_output,
    parse_driver_version,
    parse_extensions,
    parse_modules,
    parse_nvidia_smi,
    parse_services,
    schematic_id,
    talosctl_nodes,
)
from runbook_lib.model.versions import TalosVersion

T = TypeVar("T")

MAX_INPUT_BYTES = 32 * 1024 * 1024
"""Largest input read: ``talosctl get extensions -o yaml`` for a 1,000-node fleet is about 10 MiB."""

_INPUTS = (
    (
        "proc_modules",
        "--proc-modules",
        "output of `talosctl read /proc/modules` or `talosctl get modules` (any -o)",
    ),
    ("driver_version", "--driver-version", "output of `talosctl read /proc/driver/nvidia/version`"),
    ("extensions", "--extensions", "output of `talosctl get extensions` (table, -o yaml or -o json)"),
    (
        "nvidia_smi",
        "--nvidia-smi",
        "output of `nvidia-smi`, `nvidia-smi -L` or `nvidia-smi --query-gpu=… --format=csv`",
    ),
    ("services", "--services", "output of `talosctl get services` or `talosctl services`"),
    (
        "log",
        "--log",
        "any log text (`talosctl dmesg`, pod logs, `kubectl describe` events), matched against the failure table",
    ),
)


class InputUnreadable(PermanentError):
    """An input file is missing, not text, or not the output it was given as."""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "diagnose",
        help="diagnose a GPU node from outputs collected by hand (no cluster access)",
        description="Parse outputs collected from one GPU node and report what is loaded, which driver, "
        "which GPUs, what is missing or inconsistent, and the command that fixes it. "
        "FILE may be '-' for standard input (for one input only).",
    )
    for dest, flag, what in _INPUTS:
        parser.add_argument(flag, dest=dest, metavar="FILE", help=what)
    parser.add_argument(
        "--talos-version", metavar="V", help="the node's Talos version (e.g. v1.12.7): enables the tag checks"
    )
    parser.add_argument("--node", metavar="NODE", help="which node to diagnose when an output covers several")
    parser.add_argument(
        "--schematic", metavar="ID", help="the planned schematic ID, compared with the node's"
    )
    parser.add_argument(
        "--image-factory-url",
        metavar="URL",
        default=PUBLIC_FACTORY_URL,
        help="the Image Factory the node's installers come from, which the fix commands name (the parameters' "
        f"image_factory_url; default {PUBLIC_FACTORY_URL})",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the report")
    parser.set_defaults(handler=run)


def _node_context(talos: TalosVersion | None, factory_url: str) -> NodeContext:
    """What the fix commands name; a factory URL that is not http(s) is an error naming the flag (a site's own
    factory: before, every fix named factory.talos.dev)."""
    if not is_factory_url(factory_url):  # as the parameters' image_factory_url
        raise PermanentError(
            f"--image-factory-url {factory_url!r}: not an http(s) URL",
            hint=f"e.g. {PUBLIC_FACTORY_URL}, or your own factory's URL as in the parameters' image_factory_url",
        )
    return NodeContext.at_factory(factory_url, talos=talos)


@dataclass
class _Collected:
    modules: dict[str, KernelModule] | None = None
    driver: DriverInfo | None = None
    extensions: list[Extension] | None = None
    smi: NvidiaSmi | None = None
    services: dict[str, ServiceStatus] | None = None
    log: str | None = None


def _read_bytes(path: str) -> bytes:
    if path != "-":
        return safeload.read_regular_file(path, MAX_INPUT_BYTES)
    stream = getattr(sys.stdin, "buffer", None)
    data = stream.read(MAX_INPUT_BYTES + 1) if stream is not None else sys.stdin.read(MAX_INPUT_BYTES + 1)
    if len(data) > MAX_INPUT_BYTES:
        raise safeload.NotReadable(f"larger than {MAX_INPUT_BYTES // (1024 * 1024)} MiB; refused")
    return data if isinstance(data, bytes) else data.encode("utf-8")


def _read(path: str, flag: str) -> str:
    """The input as text: a bounded read of a regular file (or stdin), UTF-8, not blank."""
    try:
        text = _read_bytes(path).decode("utf-8")
    except (safeload.NotReadable, OSError) as exc:
        raise InputUnreadable(f"{flag} {path}: cannot read it: {exc}") from None
    except UnicodeDecodeError as exc:
        raise InputUnreadable(f"{flag} {path}: cannot read it: not UTF-8 text (byte {exc.start})") from None
    if not text.strip():
        raise InputUnreadable(
            f"{flag} {path}: empty input",
            hint="the command that wrote it probably failed: run it again and check its exit status",
        )
    return text


def _parse(path: str, flag: str, text: str, parser: Callable[[str], T]) -> T:
    try:
        return parser(text)
    except PermanentError as exc:
        raise InputUnreadable(f"{flag} {path}: {exc.message}", hint=exc.hint) from exc
    except RecursionError:
        raise InputUnreadable(f"{flag} {path}: nested too deeply to be a talosctl output") from None
    except ValueError as exc:  # e.g. a 2,000,000-digit number: int() refuses more than 4,300 digits
        reason = str(exc)[:120]
        raise InputUnreadable(f"{flag} {path}: a value cannot be read ({reason})") from None


def _pick_node(texts: Mapping[str, tuple[str, str]], wanted: str | None) -> str | None:
    """The one node the talosctl outputs cover; several without ``--node`` is an input error."""
    seen: dict[str, list[str]] = {}
    for dest in ("extensions", "proc_modules", "services"):
        if dest not in texts:
            continue
        path, text = texts[dest]
        services_command = text.lstrip().startswith("NODE") and " SERVICE " in text.lstrip().split("\n")[0]
        if not is_talosctl_output(text) or services_command:
            continue
        flag = {d: f for d, f, _ in _INPUTS}[dest]
        nodes = _parse(path, flag, text, talosctl_nodes)
        if wanted is None and len(nodes) > 1:
            raise InputUnreadable(
                f"{flag} {path}: the output covers {len(nodes)} nodes ({', '.join(nodes)})",
                hint="diagnose one node at a time: add --node NODE",
            )
        for node in nodes:
            seen.setdefault(node, []).append(flag)
    if wanted is not None:
        return wanted
    return next(iter(seen), None) or (_log_node(texts["log"][1]) if "log" in texts else None)


#: A line of ``talosctl dmesg``: the node, then Talos's facility, level and time (the checked-in capture
#: tests/data/outputs/dmesg_nvrm_unsupported_gpu.txt)
_TALOS_DMESG = re.compile(r"^(\S+): [a-z0-9]+: +[a-z]+: \[")


def _log_node(text: str) -> str | None:
    """The node a ``talosctl -n NODE dmesg`` log names on every line, or None: talosctl prints ``NODE: `` before
    each chunk, one node or many (talos@v1.12.0 cmd/talosctl/cmd/talos/dmesg.go:33-35, ``fmt.Printf("%s: %s",
    node, data.Bytes)``). Why: ``--log`` alone titled the
    report "Node (address not in the outputs)" although each line named it (README audit, stop 50)."""
    found = [_TALOS_DMESG.match(line) for line in text.splitlines() if line.strip()]
    prefixes = {m.group(1) for m in found if m}
    # every line in talosctl's form (``NODE: kern:    info: [time]: …``): a host's ``dmesg | grep NVRM`` or a pod's
    # ``Error: …`` has a first word too, which read as a node name (review of 585e9f9)
    return prefixes.pop() if len(prefixes) == 1 and all(found) else None


def collect(args: argparse.Namespace) -> tuple[_Collected, str | None]:
    """Read and parse every given input; raises :class:`InputUnreadable` naming the first bad file."""
    given = [(dest, flag) for dest, flag, _ in _INPUTS if getattr(args, dest, None)]
    if not given:
        raise InputUnreadable(
            "nothing to diagnose: give at least one of " + ", ".join(flag for _, flag, _ in _INPUTS),
            hint="e.g. talosctl -n <node> get extensions > ext.txt && runbook diagnose --extensions ext.txt",
        )
    stdin_users = [flag for dest, flag in given if getattr(args, dest) == "-"]
    if len(stdin_users) > 1:
        raise InputUnreadable(f"only one input can be read from standard input, not {', '.join(stdin_users)}")
    texts = {dest: (getattr(args, dest), _read(getattr(args, dest), flag)) for dest, flag in given}
    node = _pick_node(texts, args.node)
    flags = {dest: flag for dest, flag, _ in _INPUTS}
    out = _Collected()
    for dest, (path, text) in texts.items():
        flag = flags[dest]
        if dest == "proc_modules":
            out.modules = _parse(path, flag, text, lambda t: parse_modules(t, node))
        elif dest == "driver_version":
            out.driver = _parse(path, flag, text, parse_driver_version)
        elif dest == "extensions":
            exts = _parse(path, flag, text, parse_extensions)
            out.extensions = [e for e in exts if node is None or e.node in (node, None)]
            if node is not None and exts and not out.extensions:
                raise InputUnreadable(f"{flag} {path}: no extensions listed for node {node}")
        elif dest == "nvidia_smi":
            out.smi = _parse(path, flag, text, parse_nvidia_smi)
        elif dest == "services":
            out.services = _parse(path, flag, text, lambda t: parse_services(t, node))
        elif dest == "log":
            out.log = text
    return out, node


def run(args: argparse.Namespace) -> int:
    try:
        talos = TalosVersion.parse(args.talos_version) if args.talos_version else None
        ctx = _node_context(talos, args.image_factory_url)  # a bad flag before any input is read
        collected, node = collect(args)
    except PermanentError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    versions = extension_versions(collected.extensions) if collected.extensions is not None else None
    current = schematic_id(collected.extensions) if collected.extensions is not None else None
    evidence = Evidence(
        modules={name: mod.state for name, mod in collected.modules.items()}
        if collected.modules is not None
        else None,
        driver=collected.driver,
        extensions=versions,
        schematic=current,
        smi=collected.smi,
        services=collected.services,
        log=collected.log,
    )
    findings = diagnose(evidence, replace(ctx, node=node), planned_schematic=args.schematic)
    if args.json:
        sys.stdout.write(json.dumps(report_dict(evidence, findings), indent=2) + "\n")
    else:
        sys.stdout.write(render_report(evidence, findings, node=node, talos=talos))
    return 1 if any(not f.ok for f in findings) else 0


def _driver_summary(evidence: Evidence) -> tuple[dict[str, Any] | None, str]:
    """Best-known driver and where it came from: the loaded module, else the extension, else nvidia-smi."""
    if evidence.driver is not None:
        return {
            "version": evidence.driver.version,
            "flavor": evidence.driver.flavor,
        }, "/proc/driver/nvidia/version"
    stack = classify_extensions(evidence.extensions or {})
    if stack.kmod is not None and stack.kmod_driver is not None:
        flavor = "open" if stack.kmod.kind == "kmod-open" else "proprietary"
        return {
            "version": stack.kmod_driver,
            "flavor": flavor,
        }, f"extension {stack.kmod.name} (not the loaded module)"
    if evidence.smi is not None and evidence.smi.driver_version:
        return {"version": evidence.smi.driver_version, "flavor": None}, "nvidia-smi"
    return None, ""


def report_dict(evidence: Evidence, findings: list[Finding] | None = None) -> dict[str, Any]:
    """The ``--json`` object: exactly ``modules``, ``driver``, ``extensions``, ``gpus``, ``cuda_version``, ``findings``.

    Inputs that were not given are ``null`` (not empty), so "not collected" never reads as "none loaded".
    """
    driver, _ = _driver_summary(evidence)
    smi = evidence.smi
    return {
        "modules": dict(evidence.modules) if evidence.modules is not None else None,
        "driver": driver,
        "extensions": dict(evidence.extensions) if evidence.extensions is not None else None,
        "gpus": (
            [{"name": g.name, "memory_mib": g.memory_mib, "bus_id": g.bus_id} for g in smi.gpus]
            if smi is not None and smi.error is None
            else None
        ),
        "cuda_version": smi.cuda_version if smi is not None else None,
        "findings": [f.to_dict() for f in findings or []],
    }


def _indent(text: str, prefix: str) -> str:
    return "\n".join(prefix + line if line else line for line in text.splitlines())


def render_report(
    evidence: Evidence, findings: list[Finding], *, node: str | None = None, talos: TalosVersion | None = None
) -> str:
    """The human report: what is there first, then each finding with its fix."""
    lines: list[str] = []
    title = f"Node {node}" if node else "Node (address not in the outputs)"
    if talos is not None:
        title += f", Talos {talos}"
    lines.append(title)
    if evidence.modules is not None:
        nvidia = [f"{m} {evidence.modules[m]}" for m in NVIDIA_MODULES if m in evidence.modules]
        others = len([m for m in evidence.modules if m not in NVIDIA_MODULES])
        text = ", ".join(nvidia) if nvidia else "no NVIDIA module"
        if others:
            text += f" (+{others} other module{'s' if others != 1 else ''})"
        lines.append(f"  modules:     {text}")
    driver, source = _driver_summary(evidence)
    if driver is not None:
        flavor = {"open": "open kernel modules", "proprietary": "proprietary kernel modules"}.get(
            str(driver["flavor"]), "flavour unknown"
        )
        lines.append(f"  driver:      {driver['version']}, {flavor} (from {source})")
    if evidence.extensions is not None:
        exts = ", ".join(f"{name} {version}" for name, version in evidence.extensions.items()) or "none"
        lines.append(f"  extensions:  {exts}")
        lines.append(f"  schematic:   {evidence.schematic or 'none (not an Image Factory install)'}")
    smi = evidence.smi
    if smi is not None and smi.error is None:
        if smi.gpus:
            for gpu in smi.gpus:
                parts = [gpu.name or "(name not in this output)"]
                if gpu.memory_mib is not None:
                    parts.append(f"{gpu.memory_mib} MiB")
                if gpu.bus_id:
                    parts.append(gpu.bus_id)
                if gpu.mig_mode == "Enabled":
                    parts.append("MIG enabled")
                index = f"{gpu.index}: " if gpu.index is not None else ""
                lines.append(f"  gpu:         {index}{', '.join(parts)}")
        else:
            lines.append("  gpu:         none listed")
        if smi.mig_devices:
            lines.append(f"  mig:         {len(smi.mig_devices)} MIG device(s)")
        if smi.cuda_version:
            lines.append(f"  cuda:        {smi.cuda_version}")
    lines.append("")
    failed = [f for f in findings if not f.ok]
    lines.append("Findings:")
    if not findings:
        lines.append("  (no check applies to these inputs alone; add --extensions for the cross-checks)")
    for finding in findings:
        mark = "ok  " if finding.ok else "FAIL"
        lines.append(f"  {mark}  {finding.check}: {finding.message}")
        if not finding.ok and finding.fix:
            lines.append("        fix: " + _indent(finding.fix, "             ").lstrip())
            if finding.sources:
                lines.append(f"        see: {finding.sources[0]}")
    lines.append("")
    if failed:
        lines.append(f"{len(failed)} of {len(findings)} checks failed.")
    else:
        lines.append(f"All {len(findings)} checks passed." if findings else "Nothing failed.")
    return "\n".join(lines) + "\n"
