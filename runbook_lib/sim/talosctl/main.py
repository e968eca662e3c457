"""The simulated ``talosctl``: same argv, flags, outputs, streams and exit codes as the real CLI.

Process model as in talosctl: cobra finds the command, pflag parses its flags (tables of the simulated
client version), ``WithClient`` resolves talosconfig → context → endpoints/nodes, the request goes to the
endpoint, which proxies it to every node concurrently (one thread per node, each paying that node's
latency), and errors come back per node and are aggregated with hashicorp/multierror's format.  talosctl
prints the error and exits 1, adding the usage text when the message mentions "arg(s)", "flag" or
"command" (root.go), which is why ``nodes are not set for the command`` comes with a usage block.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, TypeVar

from runbook_lib.sim.state import (
    KMOD_PREFIXES,
    TALOS_CMDLINE,
    TOOLKIT_PREFIX,
    InstalledExtension,
    SimNode,
    atomic_write,
    booted_kernel_args,
    configured_modules,
    default_state_dir,
    kernel_args_after_upgrade,
    load_cluster,
    load_cluster_faults,
    load_node,
    load_nodes,
    locked_node,
    minor_of,
    normalize_talos_version,
    resolve_name,
    runtime,
    sim_paths,
    v1alpha1_doc,
)
from runbook_lib.sim.talosctl import flags as fl
from runbook_lib.sim.talosctl import resources as res

if TYPE_CHECKING:
    from runbook_lib.sim import patching

# Why some imports live inside functions: every talosctl call is a new process, and a fleet-wide verify
# starts one per node for ``read``.  Patching (jsonpatch), the image catalog (schematics, profiles) and
# the fault messages cost ~35 ms of imports that ``get``/``read`` never use (benchmarks/bench_fleet.py).


def dial_error(address: str, kind: Any = "refused") -> str:
    from runbook_lib.sim.faults import dial_error as message  # noqa: PLC0415 - lazy (process start-up)

    return message(address, kind)


T = TypeVar("T")

CLIENT_SHA = "a1b2c3d4"
MAX_FANOUT = 1024


class CommandError(Exception):
    """An error talosctl prints (``err.Error()``) before exiting 1."""


class NodeError(Exception):
    """A per-node failure; aggregated as ``<node>: <message>``."""


def multierror(errors: list[str]) -> str:
    """hashicorp/go-multierror's ListFormatFunc."""
    if len(errors) == 1:
        return f"1 error occurred:\n\t* {errors[0]}\n\n"
    points = "\n\t".join(f"* {e}" for e in errors)
    return f"{len(errors)} errors occurred:\n\t{points}\n\n"


@dataclass
class Env:
    state_dir: Path
    client_version: str
    stdout: IO[str]
    stderr: IO[str]
    cluster_faults: dict[str, Any] = field(default_factory=dict)
    """The ``talos`` section of ``faults.json``: ``slow_ms`` for every node, ``unreachable`` addresses."""

    @property
    def client_minor(self) -> tuple[int, int]:
        return minor_of(self.client_version)


# ---------------------------------------------------------------- talosconfig / nodes


def _talosconfig_path(parsed: fl.Parsed) -> Path:
    flag = parsed.get("talosconfig") or ""
    if flag:
        return Path(flag)
    env = os.environ.get("TALOSCONFIG")
    if env:
        return Path(env)
    return Path.home() / ".talos" / "config"


def _load_talosconfig(path: Path) -> Any:
    """The talosconfig's contexts, through a JSON copy in the state dir while the file is unchanged.

    Why: importing PyYAML (and compiling its reader's regexes) is ~10 ms of every talosctl process, and
    a fleet-wide verify starts one process per node; ``get``/``read`` need YAML for nothing else.
    """
    st = path.stat()
    key = [str(path.resolve()), st.st_mtime_ns, st.st_size, st.st_ino]
    cache = default_state_dir() / ".talosconfig-cache.json"
    try:
        cached = json.loads(cache.read_text())
        if isinstance(cached, dict) and cached.get("key") == key:
            return cached.get("config")
    except (OSError, ValueError):
        pass
    import yaml  # noqa: PLC0415 - lazy (process start-up)

    try:
        cfg = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise CommandError(f"failed to parse config file {path}: {exc}") from None
    if isinstance(cfg, dict) and isinstance(cfg.get("contexts"), dict):
        # only what the simulator reads: never a copy of the keys and certificates
        slim = {
            "context": cfg.get("context"),
            "contexts": {
                name: {k: c.get(k) for k in ("endpoints", "nodes")} if isinstance(c, dict) else c
                for name, c in cfg["contexts"].items()
            },
        }
        with contextlib.suppress(OSError, TypeError, ValueError):
            if cache.parent.is_dir():
                atomic_write(cache, json.dumps({"key": key, "config": slim}))
    return cfg


def _context(parsed: fl.Parsed) -> dict[str, Any]:
    path = _talosconfig_path(parsed)
    try:
        cfg = _load_talosconfig(path) or {}
    except FileNotFoundError:
        raise CommandError(f"open {path}: no such file or directory") from None
    except OSError as exc:
        raise CommandError(f"failed to parse config file {path}: {exc}") from None
    if not isinstance(cfg, dict):
        raise CommandError(f"failed to parse config file {path}: not a talosconfig")
    name = parsed.get("context") or cfg.get("context")
    contexts = cfg.get("contexts") or {}
    if not name or name not in contexts:
        raise (
            CommandError(f'context "{name or ""}" is not defined in "{path}"')
            if parsed.get("context")
            else CommandError("failed to resolve config context")
        )
    ctx: dict[str, Any] = contexts[name] or {}
    return ctx


@dataclass
class Target:
    endpoint: str
    nodes: list[str]


def _host(addr: str) -> str:
    addr = addr.strip()
    if addr.startswith("["):
        return addr[1 : addr.index("]")]
    return addr.rsplit(":", 1)[0] if addr.count(":") == 1 else addr


def resolve_target(env: Env, parsed: fl.Parsed) -> Target:
    """``WithClient``: endpoints and nodes from flags, else from the talosconfig context."""
    ctx = _context(parsed)
    endpoints = parsed.get("endpoints") or list(ctx.get("endpoints") or [])
    if not endpoints:
        raise CommandError("failed to determine endpoints")
    nodes = parsed.get("nodes") or list(ctx.get("nodes") or [])
    if not nodes:
        raise CommandError(
            "nodes are not set for the command: please use `--nodes` flag or configuration file "
            "to set the nodes to run the command against"
        )
    endpoint = _host(endpoints[0])
    name = resolve_name(env.state_dir, endpoint)
    if name is None:
        raise CommandError(dial_error(endpoint, "no_route"))
    ep_node = load_node(env.state_dir, name)
    if not ep_node.reachable:
        raise CommandError(dial_error(endpoint, ep_node.faults.get("unreachable", "refused")))
    return Target(endpoint=endpoint, nodes=[_host(n) for n in nodes])


def _load_reachable(env: Env, address: str) -> SimNode:
    """Reach one node through the endpoint: pay its latency, fail as gRPC does when it is down."""
    name = resolve_name(env.state_dir, address)
    if name is None:
        raise NodeError(dial_error(address, "no_route"))
    node = load_node(env.state_dir, name)
    delay = (
        node.latency_ms
        + float(node.faults.get("slow_ms", 0) or 0)
        + float(env.cluster_faults.get("slow_ms", 0) or 0)
    )
    if delay > 0:
        time.sleep(delay / 1000.0)
    if not node.reachable or node.faults.get("unreachable"):
        raise NodeError(dial_error(address, node.faults.get("unreachable", "refused")))
    if address in (env.cluster_faults.get("unreachable") or []) or node.name in (
        env.cluster_faults.get("unreachable") or []
    ):
        raise NodeError(dial_error(address, "refused"))
    return node


def fan_out(env: Env, nodes: list[str], fn: Callable[[SimNode], T]) -> list[tuple[str, T | None, str | None]]:
    """Run ``fn`` on every node concurrently; results in node order as (address, result, error)."""

    def one(address: str) -> tuple[str, T | None, str | None]:
        try:
            node = _load_reachable(env, address)
            return address, fn(node), None
        except NodeError as exc:
            return address, None, str(exc)

    if len(nodes) == 1:
        return [one(nodes[0])]
    import concurrent.futures  # noqa: PLC0415 - lazy (process start-up)

    with concurrent.futures.ThreadPoolExecutor(max_workers=min(len(nodes), MAX_FANOUT)) as pool:
        return list(pool.map(one, nodes))


# ---------------------------------------------------------------- commands


def cmd_version(env: Env, p: fl.Parsed) -> int:
    if p.args:
        raise fl.UsageError(f'unknown command "{p.args[0]}" for "talosctl version"', "version")
    out = env.stdout
    if p.get("short"):
        out.write(f"Client:\nTalos {env.client_version}\n")
    else:
        out.write(
            f"Client:\n\tTag:         {env.client_version}\n\tSHA:         {CLIENT_SHA}\n"
            f"\tBuilt:       \n\tGo version:  go1.24.11\n\tOS/Arch:     linux/amd64\n"
        )
    if p.get("client"):
        return 0
    # printed before the client is made, so also when the call fails (talos@v1.12.0 and v1.3.0
    # cmd/talosctl/cmd/talos/version.go:50); apid answers -n with a multierror even for one node (:64-67)
    out.write("Server:\n")
    out.flush()
    target = resolve_target(env, p)
    results = fan_out(env, target.nodes, lambda n: n)
    errors = [f"{a}: {e}" for a, _r, e in results if e]
    good = [(a, r) for a, r, e in results if r is not None]
    if not good:
        raise CommandError(f"error getting version: {multierror(errors)}")
    for address, node in good:
        assert node is not None
        if p.get("short"):
            out.write(f"\tNODE:        {address}\n\tTag:         {node.talos_version}\n")
            continue
        out.write(
            f"\tNODE:        {address}\n\tTag:         {node.talos_version}\n\tSHA:         {CLIENT_SHA}\n"
            f"\tBuilt:       \n\tGo version:  go1.24.11\n\tOS/Arch:     linux/amd64\n\tEnabled:     RBAC\n"
        )
    if errors:
        env.stderr.write(f"WARNING: {multierror(errors)}\n")
    return 0


def _resolve_kind(env: Env, first: str, name: str) -> res.ResourceType:
    """``ResolveResourceKind`` on the FIRST ``-n`` node only, before anything is printed: when that node is
    down or lacks the type, the whole call fails with the bare error and no other node is asked
    (siderolabs/talos v1.12.0 cmd/talosctl/pkg/talos/helpers/resources.go:48-52;
    pkg/machinery/client/resources.go for the NotFound text)."""
    try:
        node = _load_reachable(env, first)
    except NodeError as exc:
        raise CommandError(str(exc)) from None
    rtype = res.find_type(name, node.minor)
    if rtype is None:
        raise CommandError(f'rpc error: code = NotFound desc = resource "{name}" is not registered')
    return rtype


def cmd_get(env: Env, p: fl.Parsed) -> int:
    if not 1 <= len(p.args) <= 2:
        raise fl.UsageError(f"accepts between 1 and 2 arg(s), received {len(p.args)}", "get")
    output = p.get("output") or "table"
    if p.get("watch"):
        raise CommandError(
            "talosctl simulator: --watch is not simulated (resources do not change on their own)"
        )
    if output not in ("table", "yaml", "json") and not output.startswith("jsonpath"):
        raise CommandError(f"output mode {output!r} is not supported")
    rid = p.args[1] if len(p.args) == 2 else None
    target = resolve_target(env, p)
    rtype = _resolve_kind(env, target.nodes[0], p.args[0])
    peers: list[SimNode] = load_nodes(env.state_dir) if rtype.node_scoped_members else []

    def fetch(node: SimNode) -> list[res.Resource]:
        if not res.serves(rtype.type, node.minor):  # wording not checked against a real node
            raise NodeError(f'rpc error: code = NotFound desc = resource "{rtype.type}" is not registered')
        items = res.resources_for(rtype, node, peers)
        if rid is not None:
            items = [r for r in items if r["metadata"]["id"] == rid]
            if not items:
                raise NodeError(
                    f"rpc error: code = NotFound desc = resource {rtype.type}({rtype.namespace}/{rid}@undefined) "
                    "doesn't exist"
                )
        return items

    rows: list[tuple[str, res.ResourceType, res.Resource]] = []
    errors: list[str] = []
    # Each node's error is appended raw, with no node prefix (siderolabs/talos v1.12.0
    # cmd/talosctl/cmd/talos/get.go:185-209: COSI calls go one-to-one through apid).
    for address, items, err in fan_out(env, target.nodes, fetch):
        if err:
            errors.append(err)
            continue
        assert items is not None
        rows.extend((address, rtype, r) for r in items)
    if env.client_minor < (1, 8) and rtype.type == "MachineConfigs.config.talos.dev":
        rows = [(address, t, res.as_document(r)) for address, t, r in rows]
    if output == "table":
        env.stdout.write(res.render_table(rtype, rows))
    elif output == "yaml":
        env.stdout.write(res.render_yaml(rows))
    elif output == "json":
        env.stdout.write(res.render_json(rows))
    else:
        expr = output.split("=", 1)[1] if "=" in output else ""
        try:
            env.stdout.write(res.render_jsonpath(expr, rows))
        except ValueError as exc:
            raise CommandError(f"error parsing jsonpath: {exc}") from None
    env.stdout.flush()
    if errors:
        raise CommandError(multierror(errors))
    return 0


def cmd_service(env: Env, p: fl.Parsed) -> int:
    """``talosctl service`` (alias ``services``) without arguments: the ServiceList API, one-to-many.

    As siderolabs/talos v1.13.0 cmd/talosctl/cmd/talos/service.go:73-100 (the same at v1.3.0): errors come
    back per node as ``<node>: <error>`` (``client.FilterMessages``) and are printed as a ``WARNING:`` while
    the nodes that answered are listed; only when no node answered does the call fail.  Unlike the Service
    resource, the list shows services in every state, Finished one-shots included.
    """
    if p.args:
        raise CommandError("talosctl simulator: 'service <id> [start|stop|restart|status]' is not simulated")
    target = resolve_target(env, p)
    results = fan_out(env, target.nodes, res.service_rows)
    errors = [f"{a}: {e}" for a, _r, e in results if e]
    if len(errors) == len(results):
        raise CommandError(f"error listing services: {multierror(errors)}")
    if errors:
        env.stderr.write(f"WARNING: {multierror(errors)}\n")
    table = [["NODE", "SERVICE", "STATE", "HEALTH", "LAST CHANGE", "LAST EVENT"]]
    for address, rows, _err in results:
        table += [[address, *row[:3], f"{_go_duration(row[3])} ago", row[4]] for row in rows or []]
    env.stdout.write(res.tabwrite(table))
    return 0


def cmd_logs(env: Env, p: fl.Parsed) -> int:
    """``talosctl logs <service>``: one-to-many, every line printed as ``<node>: <line>`` and a node's error as
    ``ERROR: <error>`` on stderr, and then exit 1 if any node failed (siderolabs/talos v1.13.0
    cmd/talosctl/cmd/talos/logs.go:74-106, ``gotErrors`` then ``os.Exit(1)``)."""
    if len(p.args) != 1:
        raise fl.UsageError(f"accepts 1 arg(s), received {len(p.args)}", "logs")
    target = resolve_target(env, p)
    failed = False
    read = res.service_log if p.get("kubernetes") else _registered_log
    for address, lines, err in fan_out(env, target.nodes, lambda n: read(n, p.args[0])):
        if err:
            env.stderr.write(f"ERROR: {err}\n")
            failed = True
        env.stdout.write("".join(f"{address}: {line}\n" for line in lines or []))
    return 1 if failed else 0


#: The service states only a service that started since boot reaches (``_registered_log``).
_STARTED = ("Running", "Stopping", "Finished")


def _registered_log(node: SimNode, service: str) -> list[str]:
    """A system service's log, which machined has only for itself and for a service that started since boot (a
    Finished one-shot keeps it); for any other the read fails with gRPC code Unknown (siderolabs/talos v1.13.0
    internal/app/machined/pkg/runtime/logging/circular.go:235-247, runner/process/process.go:198).  The fake
    knows a service's current state only, so one that started and now waits again counts as never started."""
    if service != "machined" and runtime(node).services.get(service, "") not in _STARTED:
        raise NodeError(f'rpc error: code = Unknown desc = log "{service}" was not registered')
    return res.service_log(node, service)


NVIDIA_VERSION_OPEN = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {v}  Release Build  "
    "(dvs-builder@U22-I3-AF03-09-1)  Thu Oct 30 06:09:39 UTC 2025\n"
    "GCC version:  gcc version 14.2.0 (GCC) \n"
)
NVIDIA_VERSION_PROPRIETARY = (
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  {v}  Thu Oct 30 06:09:39 UTC 2025\n"
    "GCC version:  gcc version 14.2.0 (GCC) \n"
)


def _proc_modules(node: SimNode, live: Collection[str], taint: str) -> str:
    """``/proc/modules`` as simnode prints it (simnode/derive.go procModulesText, which cites the kernel and
    Talos sources): the newest module first; refcount and users ``- -`` up to Talos 1.8, whose kernels lack
    CONFIG_MODULE_UNLOAD, counted from 1.9 (siderolabs/pkgs@v1.9.0 kernel/build/config-amd64:936)."""
    newest_first = [n for n in ("nvidia_uvm", "nvidia_drm", "nvidia_modeset", "nvidia") if n in live]
    unload = minor_of(node.talos_version) >= (1, 9)
    lines = []
    for name in newest_first:
        users = res.module_users(name, live)
        info = (f"{len(users)} {''.join(u + ',' for u in users) or '-'}") if unload else "- -"
        lines.append(f"{name} {res.MODULE_SIZES[name]} {info} Live {res.MODULE_ADDRS[name]} {taint}\n")
    return "".join(lines)


def read_file(node: SimNode, path: str) -> str:
    """Files of ``/proc`` and ``/etc`` the runbook reads; anything else does not exist."""
    rt = runtime(node)
    if path == "/proc/modules":
        return _proc_modules(node, rt.modules_live, "(PO)" if rt.driver_flavor == "proprietary" else "(O)")
    if path == "/proc/driver/nvidia/version" and rt.driver_version:
        fmt = NVIDIA_VERSION_OPEN if rt.driver_flavor == "open" else NVIDIA_VERSION_PROPRIETARY
        return fmt.format(v=rt.driver_version)
    if path == "/proc/sys/net/core/bpf_jit_harden":
        return f"{rt.bpf_jit_harden}\n"
    if path == "/etc/cri/conf.d/10-nvidia-container-runtime.part" and rt.toolkit_active:
        plugin = "io.containerd.grpc.v1.cri" if node.minor < (1, 8) else "io.containerd.cri.v1.runtime"
        return (
            f'[plugins."{plugin}".containerd.runtimes.nvidia]\n'
            '  runtime_type = "io.containerd.runc.v2"\n'
            f'[plugins."{plugin}".containerd.runtimes.nvidia.options]\n'
            '  BinaryName = "/usr/local/bin/nvidia-container-runtime"\n'
        )
    if path == "/proc/cmdline":
        args = " ".join([f"talos.platform={node.platform}", TALOS_CMDLINE, *booted_kernel_args(node)])
        return f"{args}\n"
    if path == "/proc/sys/kernel/random/boot_id":
        # new on every boot (the kernel's random boot_id, drivers/char/random.c proc_do_uuid; what talosctl's
        # tracker compares, talos@v1.12.0 cmd/talosctl/pkg/talos/action/tracker.go:345-366): derived from the
        # node's boot count, which a reboot raises (_reboot_effects)
        return f"{node.kernel_boot_id()}\n"
    if path == "/proc/version":
        return "Linux version 6.12.57-talos (@buildkitsandbox) #1 SMP Sat Nov  1 00:00:00 UTC 2025\n"
    # machined stats the path first; from 1.8 a missing one is NotFound (talos@v1.8.0 and v1.12.0
    # internal/app/machined/internal/server/v1alpha1/v1alpha1_server.go Read; v1.7.0 returns the bare error)
    code = "NotFound" if node.minor >= (1, 8) else "Unknown"
    raise NodeError(f"rpc error: code = {code} desc = stat {path}: no such file or directory")


def cmd_read(env: Env, p: fl.Parsed) -> int:
    if len(p.args) != 1:
        raise fl.UsageError(f"accepts 1 arg(s), received {len(p.args)}", "read")
    target = resolve_target(env, p)
    if len(target.nodes) > 1:
        raise CommandError('command "read" is not supported with multiple nodes')
    [(_addr, text, err)] = fan_out(env, target.nodes, lambda n: read_file(n, p.args[0]))
    if err and env.client_minor < (1, 6):
        # talosctl 1.3-1.5 collects the error apid puts in the stream's metadata through helpers.AppendErrors
        # (talos@v1.5.5 cmd/talosctl/cmd/talos/read.go:40-70, cmd/talosctl/pkg/talos/helpers/error.go:17-33;
        # pkg/machinery/client/client.go ReadStream's errCh, gone in 1.6); seen with the real talosctl v1.5.5
        raise CommandError(f"1 error occurred:\n {err}")
    if err:
        # the stream's first receive carries the node's error (talos@v1.12.0 cmd/talosctl/cmd/talos/read.go:46-49)
        raise CommandError(f"error reading: {err}")
    env.stdout.write(text or "")
    return 0


# ---- patch


_IMMEDIATE_MACHINE_KEYS = {
    "time",
    "certSANs",
    "install",
    "network",
    "sysfs",
    "sysctls",
    "logging",
    "controlPlane",
    "kubelet",
    "kernel",
    "registries",
    "nodeLabels",
    "nodeTaints",
    "nodeAnnotations",
}


def can_apply_immediately(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> bool:
    """Talos ≤1.13 ``CanApplyImmediate``: only some v1alpha1 fields change without a reboot (not files)."""
    o, n = v1alpha1_doc(old), v1alpha1_doc(new)
    om, nm = dict(o.get("machine") or {}), dict(n.get("machine") or {})
    for key in _IMMEDIATE_MACHINE_KEYS:
        om.pop(key, None)
        nm.pop(key, None)
    of, nf = dict(om.pop("features", {}) or {}), dict(nm.pop("features", {}) or {})
    for key in ("kubernetesTalosAPIAccess", "hostDNS", "imageCache"):
        of.pop(key, None)
        nf.pop(key, None)
    rest_o = {k: v for k, v in o.items() if k not in ("machine", "cluster")}
    rest_n = {k: v for k, v in n.items() if k not in ("machine", "cluster")}
    return om == nm and of == nf and rest_o == rest_n


def _set_back(new: dict[str, Any], old: dict[str, Any], key: str) -> None:
    if key in old:
        new[key] = old[key]
    else:
        new.pop(key, None)


def not_immediate(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> str:
    """``CanApplyImmediate``'s error: the new config with what applies immediately set back to the current one,
    diffed against the current one (talos@v1.12.0 internal/app/machined/pkg/runtime/v1alpha1/
    v1alpha1_runtime.go:196-202). The diff is the simulator's encoding (see ``_diff``)."""
    import copy  # noqa: PLC0415 - lazy (process start-up)

    from runbook_lib.sim import patching  # noqa: PLC0415 - lazy (process start-up)

    current, masked = v1alpha1_doc(old), copy.deepcopy(v1alpha1_doc(new))
    machine, was = masked.setdefault("machine", {}), current.get("machine") or {}
    for key in _IMMEDIATE_MACHINE_KEYS:
        _set_back(machine, was, key)
    if isinstance(machine.get("features"), dict):
        for key in ("kubernetesTalosAPIAccess", "hostDNS", "imageCache"):
            _set_back(machine["features"], was.get("features") or {}, key)
    _set_back(masked, current, "cluster")
    diff = _diff(patching.dump_yaml(current), patching.dump_yaml(masked))
    return f"this config change can't be applied in immediate mode\ndiff:\n{diff}"


def validate_config(config: list[dict[str, Any]], node_minor: tuple[int, int] = (1, 99)) -> str | None:
    """The subset of Talos's config validation a GPU runbook can trip over, as machined's error text.

    The v1alpha1 document's problems come wrapped as ``container.Validate`` wraps them (talos@v1.12.0
    pkg/machinery/config/container/container.go:541, machine type: types/v1alpha1/v1alpha1_validation.go:179;
    the nesting as the real talosctl v1.12.0 prints it against simnode). Not the real wording: a sysctl whose
    value is not a scalar, which the real client already fails to decode (``cannot unmarshal !!map into
    string``), and the document-kind and missing-v1alpha1 errors (no real capture here).
    """
    from runbook_lib.sim import patching  # noqa: PLC0415 - lazy (process start-up)

    kinds = [f'unknown document kind "{kind}"' for kind in patching.unknown_kinds(config, node_minor)]
    doc = v1alpha1_doc(config)
    if not doc:
        return "configuration validation failed: " + multierror(
            ["v1alpha1 configuration document is missing"]
        )
    machine = doc.get("machine") or {}
    problems: list[str] = []
    if machine.get("type") not in ("worker", "controlplane", "init"):
        problems.append(f'unknown machine type "{machine.get("type")}"')
    for key, value in (machine.get("sysctls") or {}).items():
        if not isinstance(value, str | int):
            problems.append(f"sysctl {key} value must be a string")
    errors = ([f"v1alpha1.Config: {multierror(problems)}"] if problems else []) + kinds
    return multierror(errors) if errors else None


def _diff_gap(node: SimNode) -> str:
    """The blank line between "Config diff:" and the diff: machined's generateDiff writes "Config diff:\\n\\n"
    from 1.8 (talos@v1.8.0 internal/app/machined/internal/server/v1alpha1/v1alpha1_server.go:299-310), 1.3-1.7
    "Config diff:\\n%s" (talos@v1.7.0 v1alpha1_server.go:233-240, v1.3.0:224-229). What follows there is go-cmp's
    report of the Go structs, which the fake does not write (it writes its YAML diff, as for 1.8+)."""
    return "\n" if node.minor >= (1, 8) else ""


def _diff(old: str, new: str) -> str:
    import difflib  # noqa: PLC0415 - lazy (process start-up)

    lines = list(difflib.unified_diff(old.splitlines(True), new.splitlines(True), "a", "b", n=3))
    if not lines:
        return "No changes."
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines).rstrip("\n")


def _reboot_effects(node: SimNode) -> None:
    from runbook_lib.sim.talosctl import images  # noqa: PLC0415 - lazy (process start-up)

    node.boot_count += 1
    node.booted_at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    if node.staged_config is not None:
        node.machine_config = node.staged_config
        node.staged_config = None
        node.config_version += 1
    if node.staged_upgrade is not None:
        node.talos_version = node.staged_upgrade["version"]
        node.schematic_id = node.staged_upgrade["schematic_id"]
        node.extensions = [images.to_installed_ext(e) for e in node.staged_upgrade["extensions"]]
        node.install_image = node.staged_upgrade["image"]
        node.kernel_args = node.staged_upgrade.get("kernel_args", node.kernel_args)
        node.staged_upgrade = None


def cmd_patch(env: Env, p: fl.Parsed) -> int:
    from runbook_lib.sim import patching  # noqa: PLC0415 - lazy (process start-up)

    if not 1 <= len(p.args) <= 2:
        raise fl.UsageError(f"accepts between 1 and 2 arg(s), received {len(p.args)}", "patch")
    patch_args = list(p.get("patch") or [])
    if p.get("patch-file"):
        patch_args.append("@" + p.get("patch-file"))
    if not patch_args:
        raise CommandError("either --patch or --patch-file should be defined")
    try:
        patches = patching.load_patches(patch_args, env.client_minor)
    except patching.PatchError as exc:
        raise CommandError(str(exc)) from None
    target = resolve_target(env, p)
    _refuse_unknown_keys(patches, env.client_minor)
    rtype = res.find_type(p.args[0])
    for address in target.nodes:
        if rtype is None or rtype.type != "MachineConfigs.config.talos.dev":
            name = rtype.type if rtype else p.args[0]
            raise CommandError(f"{address}: unsupported resource type: {name}")
        try:
            _patch_one(env, address, patches, p)
        except NodeError as exc:
            # A node that is down fails in ResolveResourceKind and a patch that does not merge in
            # configpatcher.Apply, both unprefixed; ApplyConfiguration's errors come back through
            # client.FilterMessages, named after their node (talos v1.12.0 cmd/talosctl/cmd/talos/patch.go:58-111,
            # helpers/resources.go:49, pkg/machinery/client/reply.go).
            raise CommandError(str(exc)) from None
    return 0


def _refuse_unknown_keys(patches: list[patching.Patch], client_minor: tuple[int, int]) -> None:
    """talosctl loads the patches strictly inside ``WithClient``, before any node is called (talos@v1.12.0
    cmd/talosctl/cmd/talos/patch.go:121-130, configpatcher/load.go:22-26): a misspelt key fails the command."""
    from runbook_lib.sim import patching  # noqa: PLC0415 - lazy (process start-up)
    from runbook_lib.sim.talosctl import configkeys  # noqa: PLC0415 - lazy (process start-up)

    for patch in patches:
        if isinstance(patch, patching.StrategicPatch):
            found = configkeys.unknown_keys(patch.documents, client_minor)
            if found is not None:
                raise CommandError(configkeys.error_text(*found, client_minor))


def _patch_one(env: Env, address: str, patches: list[patching.Patch], p: fl.Parsed) -> None:
    from runbook_lib.sim import patching  # noqa: PLC0415 - lazy (process start-up)

    mode = p.get("mode") or "auto"
    # talosctl v1.3.0 prints the results on stdout (cmd/talosctl/cmd/talos/patch.go:74-79, helpers/mode.go:
    # 122-131); from v1.3.1 on stderr (talos commit 8a9ff259e "fix: send diagnostic output to stderr
    # consistently"; v1.3.5 patch.go:75-86, v1.4.0 patch.go:73-78; seen from the real talosctl v1.3.5)
    out = env.stdout if normalize_talos_version(env.client_version) == "v1.3.0" else env.stderr
    dry_run = bool(p.get("dry-run"))
    node = _load_reachable(env, address)
    with locked_node(env.state_dir, node.name) as node:
        old_text = patching.encode_config(node.machine_config)
        try:
            new_config = patching.apply_patches(node.machine_config, patches)
        except patching.PatchError as exc:
            raise NodeError(str(exc)) from None
        new_text = patching.encode_config(new_config)
        refused = validate_config(new_config, node.minor)
        if refused:
            _apply_refused(out, address, f"rpc error: code = InvalidArgument desc = {refused}")
        if old_text.strip() == new_text.strip():
            out.write("Apply was skipped: no changes detected.\n")
            return
        immediate = can_apply_immediately(node.machine_config, new_config) or node.minor >= (1, 14)
        if mode == "staged":
            details = "Staged configuration to be applied after the next reboot"
        elif mode == "reboot" or (mode == "auto" and not immediate):
            details = "Applied configuration with a reboot"
        elif mode in ("no-reboot", "try") and not immediate:
            # machined refuses with CanApplyImmediate's error (talos@v1.12.0 v1alpha1_server.go:214-220)
            _apply_refused(
                out,
                address,
                "rpc error: code = InvalidArgument desc = " + not_immediate(node.machine_config, new_config),
            )
        else:
            details = "Applied configuration without a reboot"
        out.write(f"patched MachineConfigs.config.talos.dev/v1alpha1 at the node {address}\n")
        if dry_run:
            out.write(
                f"Dry run summary:\n{details} (skipped in dry-run).\nConfig diff:\n{_diff_gap(node)}"
                f"{_diff(old_text, new_text)}\n"
            )
            return
        out.write(_applied_details(details, mode, p, node.machine_config, new_config) + "\n")
        if mode == "staged":
            node.staged_config = new_config
            return
        node.machine_config = new_config
        node.config_version += 1
        if details.startswith("Applied configuration with a reboot"):
            _reboot_effects(node)


def _applied_details(
    details: str, mode: str, p: fl.Parsed, old: list[dict[str, Any]], new: list[dict[str, Any]]
) -> str:
    """What machined answers once applied (talos@v1.12.0 internal/app/machined/internal/server/v1alpha1/
    v1alpha1_server.go:226-232, 263-269, 310): auto mode that reboots says why, try mode when it reverts."""
    if mode == "auto" and details == "Applied configuration with a reboot":
        return f"{details}: {not_immediate(old, new)}"
    if mode == "try":
        timeout = _go_duration(p.get("timeout") or 60.0)
        return f"{details}\nThe config is applied in 'try' mode and will be automatically reverted back in {timeout}"
    return details


def _apply_refused(out: IO[str], address: str, message: str) -> None:
    """The node refused ApplyConfiguration: talosctl has already printed ``patched … at the node X`` (it
    prints it before returning the error, talos v1.12.0 patch.go:94-111) and the error names the node."""
    out.write(f"patched MachineConfigs.config.talos.dev/v1alpha1 at the node {address}\n")
    raise NodeError(multierror([f"{address}: {message}"]))


def _go_duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"


def cmd_machineconfig_patch(env: Env, p: fl.Parsed) -> int:
    from runbook_lib.sim import patching  # noqa: PLC0415 - lazy (process start-up)

    if len(p.args) != 1:
        raise fl.UsageError(f"accepts 1 arg(s), received {len(p.args)}", "machineconfig patch")
    try:
        out = patching.patch_file_offline(p.args[0], list(p.get("patch") or []), env.client_minor)
    except patching.PatchError as exc:
        raise CommandError(str(exc)) from None
    dest = p.get("output") or ""
    if dest:
        Path(dest).write_text(out)
    else:
        env.stdout.write(out)
    return 0


# ---- upgrade / reboot


def _progress(env: Env, nodes: list[str], outcome: dict[str, str | None]) -> None:
    env.stderr.write(f"watching nodes: [{' '.join(nodes)}]\n")
    for address in nodes:
        err = outcome.get(address)
        env.stderr.write(f"    * {address}: {'post check passed' if err is None else err}\n")


#: ``StartAllServices`` gives up after ``BootTimeout`` = 70 min and the boot fails; the node then reboots
#: into its previous image (talos@v1.12.0:internal/app/machined/pkg/runtime/v1alpha1/
#: v1alpha1_sequencer_tasks.go:419-490, pkg/machinery/constants/constants.go:956).
BOOT_TIMEOUT_S = 70 * 60.0
#: The simulator's time factor: simulated durations (the boot timeout) are real durations times it.
TIME_SCALE_ENV = "RUNBOOK_SIM_TIME_SCALE"


def time_scale() -> float:
    """``$RUNBOOK_SIM_TIME_SCALE`` (default 1: real durations); tests shrink it to keep real orderings fast."""
    raw = os.environ.get(TIME_SCALE_ENV, "").strip()
    if not raw:
        return 1.0
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise CommandError(f"{TIME_SCALE_ENV}={raw!r}: expected a number > 0 (1 = real durations)")
    return value


def persistenced_never_starts(node: SimNode, exts: list[InstalledExtension]) -> bool:
    """extensions#888, talos#9149: with the toolkit but a driver that cannot bind,
    ``ext-nvidia-persistenced`` waits for ``/sys/bus/pci/drivers/nvidia`` (its ``depends: path``) forever,
    the boot never finishes and the node rolls back.  The driver cannot bind without a GPU, without the
    kmod, on an unsupported GPU, or when the machine config does not load ``nvidia``: the kmod extension
    blacklists every NVIDIA module (extensions@v1.12.0:nvidia-gpu/nvidia-modules/lts/files/nvidia.conf),
    so only ``machine.kernel.modules`` / ``KernelModuleConfig`` loads it.  This is why the runbook patches
    the config before the upgrade.
    """
    has_toolkit = any(e.name.startswith(TOOLKIT_PREFIX) for e in exts)
    has_kmod = any(e.name.startswith(KMOD_PREFIXES) for e in exts)
    unbound = not has_kmod or not node.gpus or bool(node.faults.get("gpu_unsupported"))
    return has_toolkit and (unbound or "nvidia" not in configured_modules(node.machine_config))


def _boot_hang(timeout: float) -> NodeError:
    """What ``--wait`` sees of a boot that never finishes: its own ``--timeout``, or, when the boot
    timeout comes first, the node back on its previous image.  (The talosctl wording of either case is
    not taken from a real capture: no source shows it.)"""
    boot = BOOT_TIMEOUT_S * time_scale()
    time.sleep(min(timeout, boot))
    stuck = 'task startAllServices: service "ext-nvidia-persistenced" to be "up"'
    if timeout < boot:
        return NodeError(f"timeout waiting for the node to boot: {stuck}: context deadline exceeded")
    return NodeError(
        f"boot failed after {BOOT_TIMEOUT_S / 60:.0f}m0s: {stuck}: context deadline exceeded; "
        "the node rolled back to the previous image"
    )


def cmd_upgrade(env: Env, p: fl.Parsed) -> int:
    from runbook_lib.sim.talosctl import images  # noqa: PLC0415 - lazy (process start-up)

    if p.args:
        raise fl.UsageError(f'unknown command "{p.args[0]}" for "talosctl upgrade"', "upgrade")
    image = p.get("image") or images.default_installer(env.client_version)
    target = resolve_target(env, p)
    wait = bool(p.get("wait")) or bool(p.get("debug"))
    stage = bool(p.get("stage")) or bool(p.get("no-reboot"))
    timeout = float(p.get("timeout") or 1800.0)
    legacy = bool(p.get("legacy"))
    if legacy:  # talos@v1.13.0:cmd/talosctl/cmd/talos/upgrade.go:96-97, pkg/cli/output.go:24 Warning
        env.stderr.write(
            "WARNING: Forcing use of legacy upgrade method. This flag is deprecated and will be removed in Talos 1.18.\n"
        )

    def upgrade(node: SimNode) -> str:
        try:
            ref, exts = images.resolve(env.state_dir, image, node.faults)
            exts = images.with_install_extensions(env.state_dir, ref, exts, node.machine_config, node.faults)
        except images.ImageError as exc:
            raise NodeError(f"rpc error: code = Unknown desc = {exc}") from None
        hangs = bool(node.faults.get("upgrade_hangs")) or persistenced_never_starts(node, exts)
        fails = bool(node.faults.get("upgrade_fails"))
        with locked_node(env.state_dir, node.name) as n:
            if hangs or fails:
                n.boot_count += 1  # it tried the new image, did not come up, and rolled back
            else:
                n.staged_upgrade = {
                    "version": ref.version,
                    "schematic_id": ref.schematic_id,
                    "extensions": [images.ext_to_dict(e) for e in exts],
                    "image": image,
                    # the legacy MachineService.Upgrade: forced, or the only one this talosctl or node has
                    "kernel_args": kernel_args_after_upgrade(
                        n, legacy_api=legacy or env.client_minor < (1, 13) or n.minor < (1, 13)
                    ),
                }
                if not stage:
                    _reboot_effects(n)
        if hangs and wait:
            raise _boot_hang(timeout)
        if fails and wait:
            raise NodeError(
                f"upgrade failed: booted version {n.talos_version} does not match the expected {ref.version} "
                "(the node rolled back to the previous image)"
            )
        return datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S.%f +0000 UTC")

    results = fan_out(env, target.nodes, upgrade)
    errors = [f"{a}: {e}" for a, _r, e in results if e]
    if wait:
        _progress(env, [a for a, _r, _e in results], {a: e for a, _r, e in results})
    else:
        rows = [("NODE", "ACK", "STARTED")]
        rows += [(a, "Upgrade request received", r or "") for a, r, e in results if e is None]
        if len(rows) > 1:
            widths = [max(len(r[i]) for r in rows) for i in range(2)]
            for r in rows:
                env.stdout.write(f"{r[0].ljust(widths[0] + 3)}{r[1].ljust(widths[1] + 3)}{r[2]}\n")
    if errors:
        raise CommandError(multierror(errors))
    return 0


def cmd_reboot(env: Env, p: fl.Parsed) -> int:
    if p.args:
        raise fl.UsageError(f'unknown command "{p.args[0]}" for "talosctl reboot"', "reboot")
    target = resolve_target(env, p)
    wait = bool(p.get("wait")) or bool(p.get("debug"))

    def reboot(node: SimNode) -> None:
        with locked_node(env.state_dir, node.name) as n:
            _reboot_effects(n)

    results = fan_out(env, target.nodes, reboot)
    errors = [f"{a}: {e}" for a, _r, e in results if e]
    if wait:
        _progress(env, [a for a, _r, _e in results], {a: e for a, _r, e in results})
    if errors:
        raise CommandError(multierror(errors))
    return 0


HEALTH_CHECKS = (
    "etcd to be healthy",
    "etcd members to be consistent across nodes",
    "etcd members to be control plane nodes",
    "apid to be ready",
    "all nodes memory sizes",
    "all nodes disk sizes",
    "no diagnostics",
    "kubelet to be healthy",
    "all nodes to finish boot sequence",
    "all k8s nodes to report",
    "all control plane static pods to be running",
    "all control plane components to be ready",
    "all k8s nodes to report ready",
    "kube-proxy to report ready",
    "coredns to report ready",
    "all k8s nodes to report schedulable",
)


def cmd_health(env: Env, p: fl.Parsed) -> int:
    if p.args:
        raise fl.UsageError(f'unknown command "{p.args[0]}" for "talosctl health"', "health")
    target = resolve_target(env, p)
    [(_a, _n, err)] = fan_out(env, target.nodes[:1], lambda n: n)
    if err:
        raise CommandError(f"healthcheck error: {err}")
    nodes = load_nodes(env.state_dir)
    wanted = set(p.get("worker-nodes") or []) | set(p.get("control-plane-nodes") or [])
    if p.get("init-node"):
        wanted.add(p.get("init-node"))
    members = [n for n in nodes if not wanted or n.address in wanted]
    env.stderr.write(
        f"discovered nodes: [{' '.join(repr(n.address).replace(chr(39), chr(34)) for n in members)}]\n"
    )
    down = [
        n for n in members if not n.reachable or n.faults.get("unreachable") or n.faults.get("upgrade_hangs")
    ]
    for check in HEALTH_CHECKS:
        env.stderr.write(f"waiting for {check}: ...\n")
        if down and check == "all nodes to finish boot sequence":
            deadline = float(p.get("wait-timeout") or 1200.0)
            time.sleep(deadline)
            first = down[0]
            env.stderr.write(f"waiting for {check}: {first.address}: {dial_error(first.address)}\n")
            raise CommandError(
                "healthcheck error: rpc error: code = DeadlineExceeded desc = context deadline exceeded"
            )
        env.stderr.write(f"waiting for {check}: OK\n")
    return 0


def cmd_kubeconfig(env: Env, p: fl.Parsed) -> int:
    if len(p.args) > 1:
        raise fl.UsageError(f"accepts at most 1 arg(s), received {len(p.args)}", "kubeconfig")
    target = resolve_target(env, p)
    if len(target.nodes) > 1:
        raise CommandError('command "kubeconfig" is not supported with multiple nodes')
    [(_a, node, err)] = fan_out(env, target.nodes, lambda n: n)
    if err:
        raise CommandError(f"error copying: {err}")
    assert node is not None
    source = sim_paths(env.state_dir).kubeconfig
    if node.role != "controlplane" or not source.exists():
        raise CommandError(
            "error copying: rpc error: code = Unknown desc = open /system/secrets/kubernetes/kubeconfig: "
            "no such file or directory"
        )
    text = source.read_text()
    if p.args and p.args[0] == "-":
        env.stdout.write(text)
        return 0
    merge = bool(p.get("merge"))
    # as talosctl: without a path, merge into ~/.kube/config (or write ./kubeconfig with --merge=false)
    default = Path.home() / ".kube" / "config" if merge else Path.cwd()
    path = Path(p.args[0]) if p.args else default
    if path.is_dir():
        path = path / "kubeconfig"
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and p.get("merge"):
        _merge_kubeconfig(path, text, bool(p.get("force")))
    else:
        path.write_text(text)
    return 0


def _merge_kubeconfig(path: Path, text: str, force: bool) -> None:
    """``--merge``: add (or with ``--force`` replace) the cluster, user and context entries by name."""
    import yaml  # noqa: PLC0415 - lazy (process start-up)

    new = yaml.safe_load(text) or {}
    cur = yaml.safe_load(path.read_text()) or {}
    for key in ("clusters", "users", "contexts"):
        existing = {e.get("name"): e for e in cur.get(key) or []}
        for entry in new.get(key) or []:
            if entry.get("name") not in existing or force:
                existing[entry.get("name")] = entry
        cur[key] = list(existing.values())
    cur["current-context"] = new.get("current-context", cur.get("current-context"))
    path.write_text(yaml.safe_dump(cur, sort_keys=False))


COMMANDS: dict[str, Callable[[Env, fl.Parsed], int]] = {
    "version": cmd_version,
    "get": cmd_get,
    "read": cmd_read,
    "service": cmd_service,
    "logs": cmd_logs,
    "patch": cmd_patch,
    "machineconfig patch": cmd_machineconfig_patch,
    "upgrade": cmd_upgrade,
    "reboot": cmd_reboot,
    "health": cmd_health,
    "kubeconfig": cmd_kubeconfig,
}
ALIASES = {"mc": "machineconfig", "services": "service"}


def _suggest(word: str, options: list[str]) -> list[str]:
    return [o for o in options if o.startswith(word) or _levenshtein(word, o) <= 2]


def _levenshtein(a: str, b: str) -> int:
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def _client_version(state_dir: Path) -> str:
    override = os.environ.get("RUNBOOK_SIM_TALOSCTL_VERSION")
    if override:
        return override
    try:
        return str(load_cluster(state_dir).get("talosctl_version") or "v1.12.11")
    except FileNotFoundError:
        return "v1.12.11"


def find_command(words: list[str], subcommands: list[str]) -> tuple[str, int]:
    """The command path cobra would pick, and how many positional words it consumed."""
    if not words:
        return "", 0
    first = ALIASES.get(words[0], words[0])
    if first == "machineconfig" and len(words) > 1 and words[1] == "patch":
        return "machineconfig patch", 2
    if first in COMMANDS:
        return first, 1
    if first in subcommands:
        return f"<unsimulated>{first}", 1
    return f"<unknown>{words[0]}", 1


def main(
    argv: list[str] | None = None, *, stdout: IO[str] | None = None, stderr: IO[str] | None = None
) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    out = stdout or sys.stdout
    err = stderr or sys.stderr
    state_dir = default_state_dir()
    talos_faults = load_cluster_faults(state_dir).get("talos") if state_dir.exists() else None
    env = Env(
        state_dir=state_dir,
        client_version=_client_version(state_dir),
        stdout=out,
        stderr=err,
        cluster_faults=talos_faults if isinstance(talos_faults, dict) else {},
    )
    minor = env.client_minor
    root = fl.command_table("", minor) or {}
    words = fl.strip_flags_for_lookup(argv, minor)
    command, consumed = find_command(words, list(root.get("subcommands", [])))
    usage_for = command if command in COMMANDS else ""
    try:
        if command.startswith("<unknown>"):
            word = command[len("<unknown>") :]
            msg = f'unknown command "{word}" for "talosctl"'
            suggestions = _suggest(word, list(root.get("subcommands", [])))
            if suggestions:
                msg += "\n\nDid you mean this?\n" + "".join(f"\t{s}\n" for s in suggestions)
            raise fl.UsageError(msg, "")
        if command.startswith("<unsimulated>"):
            raise CommandError(f"talosctl simulator: {command[len('<unsimulated>') :]!r} is not simulated")
        if command == "":
            parsed = fl.parse("", argv, minor)
            out.write(fl.usage("", minor))
            return 0
        # drop the command words themselves (first occurrences) before parsing flags
        rest = list(argv)
        for w in words[:consumed]:
            rest.remove(w)
        parsed = fl.parse(command, rest, minor)
        err.write("".join(f"{line}\n" for line in fl.deprecation_lines(parsed, minor)))
        if parsed.get("help"):
            table = fl.command_table(command, minor) or {}
            out.write(f"{table.get('short', '')}\n\n{fl.usage(command, minor)}")
            return 0
        return COMMANDS[command](env, parsed)
    except fl.UsageError as exc:
        text = str(exc)
        err.write(text + "\n")
        err.write("\n" + fl.usage(exc.command if exc.command else usage_for, minor) + "\n")
        return 1
    except CommandError as exc:
        text = str(exc)
        err.write(text + "\n")
        if "arg(s)" in text or "flag" in text or "command" in text:
            err.write("\n" + fl.usage(usage_for, minor) + "\n")
        return 1
    except FileNotFoundError as exc:
        err.write(f"{exc}\n")
        return 1
