"""COSI resources a simulated node serves to ``talosctl get``, and talosctl's three output formats.

Resource types, namespaces, IDs, owners and print columns are those of the real resources, because the
library keys on them (e.g. ``spec.metadata.name`` of ``ExtensionStatuses.runtime.talos.dev``), and the
table/YAML/JSON writers reproduce talosctl's: tabwriter padding 3, ``---`` between YAML documents with a
leading ``node:`` key, and JSON as a *stream* of 4-space-indented objects with Go's key order and escaping.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Collection
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from runbook_lib.sim.state import UNCHECKED_SERVICES, SimNode, minor_of, runtime, v1alpha1_doc
from runbook_lib.sim.talosctl import hardware

if TYPE_CHECKING:
    from types import ModuleType


def _patching() -> ModuleType:
    """Imported on first use: ``get`` of most resources needs no YAML encoder, and each talosctl call is a
    new process (see main.py)."""
    from runbook_lib.sim import patching  # noqa: PLC0415 - lazy (process start-up)

    return patching


Resource = dict[str, Any]


@dataclass(frozen=True)
class ResourceType:
    type: str
    """Full type name, e.g. ``ExtensionStatuses.runtime.talos.dev``."""
    short: str
    """Singular kind as the TYPE column shows it."""
    namespace: str
    aliases: tuple[str, ...]
    columns: tuple[tuple[str, str], ...]
    """Extra print columns: (header, dotted path in spec)."""
    since: tuple[int, int] = (1, 0)
    node_scoped_members: bool = False
    until: tuple[int, int] = (99, 0)
    """First Talos minor whose nodes no longer serve this entry (its aliases moved to another type)."""

    def served_by(self, minor: tuple[int, int]) -> bool:
        return self.since <= minor < self.until


_LOADED_MODULES = ResourceType(
    "LoadedKernelModules.runtime.talos.dev",
    "LoadedKernelModule",
    "runtime",
    ("loadedkernelmodule", "loadedkernelmodules", "module", "modules"),
    (("STATE", "state"),),
    since=(1, 11),
    until=(1, 14),
)
TYPES: tuple[ResourceType, ...] = (
    ResourceType(
        # talos@v1.8.0:pkg/machinery/resources/hardware/pcidevice.go (see hardware.py)
        "PCIDevices.hardware.talos.dev",
        "PCIDevice",
        "hardware",
        ("pcidevice", "pcidevices"),
        (("CLASS", "class"), ("SUBCLASS", "subclass"), ("VENDOR", "vendor"), ("PRODUCT", "product")),
        since=(1, 8),
    ),
    ResourceType(
        "ExtensionStatuses.runtime.talos.dev",
        "ExtensionStatus",
        "runtime",
        ("extensionstatus", "extensionstatuses", "extension", "extensions", "es"),
        (("NAME", "metadata.name"), ("VERSION", "metadata.version")),
    ),
    _LOADED_MODULES,
    ResourceType(
        # What the config asks to load, one per machine.kernel.modules entry (KernelModuleConfigController);
        # up to 1.10 it holds the ``modules`` alias (talos@v1.10.0 pkg/machinery/resources/runtime/
        # kernel_module_spec.go:46; v1.11.0 drops it for LoadedKernelModule; the same at v1.3.0).
        "KernelModuleSpecs.runtime.talos.dev",
        "KernelModuleSpec",
        "runtime",
        ("kernelmodulespec", "kernelmodulespecs", "modules"),
        (),
        until=(1, 11),
    ),
    # Talos 1.14 moved the ``module``/``modules`` aliases to KernelModuleStatus, whose state is an enumer
    # ``-text`` type printed lowercase: live, loading, unloading, built-in (siderolabs/talos v1.14.0-rc.1
    # pkg/machinery/resources/runtime/kernel_module_status.go:25-60, kernelmodulestate_enumer.go); the
    # deprecated LoadedKernelModule is still served, without the aliases (loaded_kernel_module.go).
    ResourceType(
        "KernelModuleStatuses.runtime.talos.dev",
        "KernelModuleStatus",
        "runtime",
        ("kernelmodulestatus", "kernelmodulestatuses", "module", "modules"),
        (("TYPE", "type"), ("STATE", "state")),
        since=(1, 14),
    ),
    replace(_LOADED_MODULES, aliases=_LOADED_MODULES.aliases[:2], since=(1, 14), until=(99, 0)),
    ResourceType(
        "MachineConfigs.config.talos.dev",
        "MachineConfig",
        "config",
        ("machineconfig", "machineconfigs", "mc", "mcs"),
        (),
    ),
    ResourceType(
        # The type's group says v1alpha1, its namespace is ``runtime`` (talos@v1.12.0
        # pkg/machinery/resources/v1alpha1/v1alpha1.go:13 NamespaceName).
        "Services.v1alpha1.talos.dev",
        "Service",
        "runtime",
        ("service", "services", "svc"),
        (("RUNNING", "running"), ("HEALTHY", "healthy"), ("HEALTH UNKNOWN", "unknown")),
    ),
    ResourceType(
        # talos@v1.13.0:pkg/machinery/resources/runtime/platform_metadata.go:17-76 (type, ID, print columns;
        # the aliases are COSI's automatic ones: singular and plural of the lowercased name).
        "PlatformMetadatas.talos.dev",
        "PlatformMetadata",
        "runtime",
        ("platformmetadata", "platformmetadatas"),
        (("PLATFORM", "platform"), ("TYPE", "instanceType"), ("REGION", "region"), ("ZONE", "zone")),
    ),
    ResourceType(
        "Members.cluster.talos.dev",
        "Member",
        "cluster",
        ("member", "members"),
        (
            ("HOSTNAME", "hostname"),
            ("MACHINE TYPE", "machineType"),
            ("OS", "operatingSystem"),
            ("ADDRESSES", "addresses"),
        ),
        node_scoped_members=True,
    ),
)


def serves(type_name: str, minor: tuple[int, int]) -> bool:
    """Whether a node of Talos ``minor`` has resource type ``type_name`` registered at all."""
    return any(t.type == type_name and t.served_by(minor) for t in TYPES)


def find_type(name: str, minor: tuple[int, int] = (1, 13)) -> ResourceType | None:
    """The type ``name`` resolves to on a node of Talos ``minor`` (``ResolveResourceKind``), if any."""
    low = name.lower()
    for t in TYPES:
        if t.served_by(minor) and (low in t.aliases or low == t.type.lower() or low == t.short.lower()):
            return t
    return None


_OWNERS = {
    "PCIDevices.hardware.talos.dev": "hardware.PCIDevicesController",
    "ExtensionStatuses.runtime.talos.dev": "runtime.ExtensionStatusController",
    "LoadedKernelModules.runtime.talos.dev": "runtime.LoadedKernelModuleController",
    "KernelModuleSpecs.runtime.talos.dev": "runtime.KernelModuleConfigController",
    "KernelModuleStatuses.runtime.talos.dev": "runtime.KernelModuleStatusController",
    "MachineConfigs.config.talos.dev": "",
    "Services.v1alpha1.talos.dev": "v1alpha1.ServiceController",
    "Members.cluster.talos.dev": "cluster.MemberController",
    "PlatformMetadatas.talos.dev": "network.PlatformConfigApplyController",
}


def _owner(t: ResourceType, node: SimNode) -> str:
    """The controller that writes the resource. Talos 1.14 writes the deprecated LoadedKernelModule from
    KernelModuleStatusController (talos@v1.14.0-rc.1 .../controllers/runtime/kernel_module_status.go:196); up to
    1.13 its own LoadedKernelModuleController does (talos@v1.13.0 .../runtime/loaded_kernel_module.go:32)."""
    if t.type == "LoadedKernelModules.runtime.talos.dev" and node.minor >= (1, 14):
        return "runtime.KernelModuleStatusController"
    return _OWNERS[t.type]


def _meta(t: ResourceType, node: SimNode, rid: str, version: int = 1) -> dict[str, Any]:
    return {
        "namespace": t.namespace,
        "type": t.type,
        "id": rid,
        "version": version,
        "owner": _owner(t, node),
        "phase": "running",
        "created": node.booted_at,
        "updated": node.booted_at,
    }


def _compat(version: str) -> str:
    major, minor = minor_of(version)
    return f">= v{major}.{minor}.0"


def extensions(t: ResourceType, node: SimNode, _peers: list[SimNode]) -> list[Resource]:
    out: list[Resource] = []
    for i, ext in enumerate(node.extensions):
        spec_meta: dict[str, Any] = {
            "name": ext.name,
            "version": ext.version,
            "author": ext.author,
            "description": ext.description or "",
            "compatibility": {"talos": {"version": _compat(node.talos_version)}},
        }
        out.append(
            {"metadata": _meta(t, node, str(i)), "spec": {"image": f"{i}.sqsh", "metadata": spec_meta}}
        )
    if minor_of(node.talos_version) < (1, 5):
        # the Image Factory builds 1.5 and later (sim/catalog.py FIRST_FACTORY_MINOR, not imported here: process
        # start-up): no factory built a 1.3/1.4 installer, so no virtual "schematic" extension
        return out
    schematic_meta = {
        "name": "schematic",
        "version": node.schematic_id,
        "author": "Image Factory",
        "description": "This is a virtual extension representing the schematic ID used to build the image.",
        # no compatibility of its own, printed empty as talosctl prints the zero struct (seen from the real
        # talosctl v1.12.0 on machinery's ExtensionStatus: tests/sim/test_fake_vs_real_talosctl.py)
        "compatibility": {"talos": {"version": ""}},
    }
    idx = str(len(node.extensions))
    out.append({"metadata": _meta(t, node, idx), "spec": {"image": "", "metadata": schematic_meta}})
    return out


MODULE_SIZES = {"nvidia": 14241792, "nvidia_modeset": 1552384, "nvidia_uvm": 1146880, "nvidia_drm": 77824}
MODULE_ADDRS = {
    "nvidia": "0xffffffffc0e00000",
    "nvidia_modeset": "0xffffffffc0c5d000",
    "nvidia_uvm": "0xffffffffc2733000",
    "nvidia_drm": "0xffffffffc0c45000",
}


#: The modelled NVIDIA modules that use each one (simnode/derive.go nvidiaUsers, which cites why).
NVIDIA_USERS = {"nvidia": ("nvidia_uvm", "nvidia_modeset"), "nvidia_modeset": ("nvidia_drm",)}


def module_users(name: str, live: Collection[str]) -> list[str]:
    """The loaded modules that use ``name``: /proc/modules' users column and the resource's ``dependencies``."""
    return [u for u in NVIDIA_USERS.get(name, ()) if u in live]


def modules(t: ResourceType, node: SimNode, _peers: list[SimNode]) -> list[Resource]:
    """LoadedKernelModule (1.11+) or KernelModuleStatus (1.14): the spec has no name, the ID is the module."""
    rt = runtime(node)
    status = t.short == "KernelModuleStatus"
    out: list[Resource] = []
    for name, state in sorted(rt.modules_live.items()):
        spec: dict[str, Any] = {"type": "dynamic"} if status else {}
        # the modules that use this one, /proc/modules' users column, which Talos parses into the resource
        # (talos@v1.12.0 internal/app/machined/pkg/controllers/runtime/loaded_kernel_module.go ParseModules)
        users = module_users(name, rt.modules_live)
        spec |= {"size": MODULE_SIZES.get(name, 65536), "referenceCount": len(users)}
        if users:
            spec["dependencies"] = users  # omitempty
        spec |= {
            "state": state.lower() if status else state,
            "address": MODULE_ADDRS.get(name, "0xffffffffc0000000"),
        }
        out.append({"metadata": _meta(t, node, name), "spec": spec})
    return out


def module_specs(t: ResourceType, node: SimNode, _peers: list[SimNode]) -> list[Resource]:
    """KernelModuleSpec per configured module; its name's YAML key is ``string`` (the struct tag says so:
    talos@v1.10.0 pkg/machinery/resources/runtime/kernel_module_spec.go:26)."""
    machine = v1alpha1_doc(node.machine_config).get("machine") or {}
    out: list[Resource] = []
    for mod in (machine.get("kernel") or {}).get("modules") or []:
        if isinstance(mod, dict) and mod.get("name"):
            spec = {"string": str(mod["name"]), "parameters": list(mod.get("parameters") or [])}
            out.append({"metadata": _meta(t, node, str(mod["name"])), "spec": spec})
    return sorted(out, key=lambda r: str(r["metadata"]["id"]))  # COSI lists by ID


def machineconfig(t: ResourceType, node: SimNode, _peers: list[SimNode]) -> list[Resource]:
    """The active config. From 1.12 the resource carries the ``talos.dev/yaml-spec`` annotation that marks its
    spec as a YAML string (talos@v1.12.0 pkg/machinery/resources/config/machine_config.go:69-71; not at v1.11.0)."""
    meta = _meta(t, node, "v1alpha1", node.config_version)
    if node.minor >= (1, 12):
        meta["annotations"] = {"talos.dev/yaml-spec": "1"}
    return [{"metadata": meta, "spec": _patching().encode_config(node.machine_config)}]


def as_document(r: Resource) -> Resource:
    """A MachineConfig as talosctl 1.3-1.7 print it: the spec is the config document, not a YAML string. Those
    clients marshal the resource with ``resource.MarshalYAML`` and the spec's raw config bytes
    (talos@v1.7.0 cmd/talosctl/cmd/talos/output/json.go:39-64, yaml.go WriteResource; the same at v1.3.0); talos
    commit d9db360ab ("fix: properly output multi-doc machine config in get mc", first in v1.8.0) made it the
    string. Only the first document is kept: what those clients print for a multi-document config (which the
    commit fixed) is not simulated."""
    docs = _patching().decode_config(r["spec"])
    return {**r, "spec": docs[0] if docs else {}}


def services(t: ResourceType, node: SimNode, _peers: list[SimNode]) -> list[Resource]:
    rt = runtime(node)
    out: list[Resource] = []
    for name, state in rt.services.items():
        if state != "Running":
            # The resource exists only while the service runs: every other state (Finished included)
            # destroys it (siderolabs/talos v1.13.0 internal/app/machined/pkg/controllers/v1alpha1/service.go:73-92).
            continue
        # An extension service, and dashboard, have no health check, so their health is unknown: the resource
        # copies the event's Healthy/Unknown (talos@v1.12.0 internal/app/machined/pkg/controllers/v1alpha1/
        # service.go:77-81), and a status with no check has Unknown = Healthy == nil (pkg/system/health/status.go:29).
        unknown = not _health_checked(name)
        spec = {"running": True, "healthy": not unknown, "unknown": unknown}
        out.append({"metadata": _meta(t, node, name), "spec": spec})
    return out


def platform_metadata(t: ResourceType, node: SimNode, _peers: list[SimNode]) -> list[Resource]:
    """What the node's platform reported at boot; empty fields are left out (``omitempty``).

    Metal sets only ``platform`` (talos@v1.13.0:.../platform/metal/metal.go:190-191); AWS fills the
    instance fields from IMDS (.../platform/aws/aws.go:96-108).  Before 1.12 the owner was
    ``network.PlatformConfigController`` (platform_config.go at v1.11.0).
    """
    spec: dict[str, Any] = {"platform": node.platform}
    if node.platform == "aws":
        instance = "i-0" + hashlib.sha256(node.name.encode()).hexdigest()[:16]
        spec.update(
            hostname=f"ip-{node.address.replace('.', '-')}.ec2.internal",
            region="us-east-1",
            zone="us-east-1a",
            instanceType="g4dn.xlarge",
            instanceId=instance,
            providerId=f"aws:///us-east-1a/{instance}",
        )
    meta = _meta(t, node, "platformmetadata")
    if minor_of(node.talos_version) < (1, 12):
        meta["owner"] = "network.PlatformConfigController"
    return [{"metadata": meta, "spec": spec}]


#: The last event of a service in each state, as machined words it (siderolabs/talos v1.13.0:
#: system.go:191 "Service finished successfully", runner/containerd/containerd.go:225 "Started task …",
#: service_runner.go:162 "Waiting for %s" with pkg/conditions/files.go:43 "file %q to exist").
_LAST_EVENT = {
    "Finished": "Service finished successfully",
    "Waiting": 'Waiting for file "/sys/bus/pci/drivers/nvidia" to exist',
}


def _health_checked(service: str) -> bool:
    """Whether machined runs a health check for the service: not for extension services nor ``dashboard``
    (``UNCHECKED_SERVICES``)."""
    return not service.startswith("ext-") and service not in UNCHECKED_SERVICES


def _running_event(service: str, pid: int) -> str:
    """The last event of a running service: its health check's where it has one (service_runner.go:119-124 at
    talos@v1.12.0), else its runner's: dashboard's process runner (runner/process/process.go:457,504-506,
    services/dashboard.go:101-104), an extension's containerd task (runner/containerd/containerd.go:224)."""
    if _health_checked(service):
        return "Health check successful"
    if service == "dashboard":
        return f'Process Process(["/sbin/dashboard"]) started with PID {pid}'
    return f"Started task {service} (PID {pid}) for container {service}"


def service_rows(node: SimNode) -> list[tuple[str, str, str, float, str]]:
    """(service, state, health, seconds since the last change, last event) as ``talosctl services`` lists them.

    A service without a health check has health unknown (``?``, formatters.go:271-281). The PIDs are the
    kernel's: ours are made up (non-zero, one per row).
    """
    since = max(
        0.0,
        (datetime.now(UTC) - datetime.fromisoformat(node.booted_at.replace("Z", "+00:00"))).total_seconds(),
    )
    rows: list[tuple[str, str, str, float, str]] = []
    for name, state in runtime(node).services.items():
        health = "OK" if _health_checked(name) and state == "Running" else "?"
        event = _LAST_EVENT.get(state) or _running_event(name, 1000 + len(rows))
        rows.append((name, state, health, since, event))
    return rows


#: What ``nvidia-ctk cdi generate`` could not locate on a healthy node: the lines Talos CI quotes (siderolabs/talos
#: v1.13.0 internal/integration/api/extensions_nvidia.go:160-169), logged with ``Warningf("Could not locate %v:
#: %v")`` by nvidia-container-toolkit (logrus text format).
_CDI_NOT_SHIPPED = (
    "libnvidia-vulkan-producer.so.{v}",
    "X11/xorg.conf.d/10-nvidia.conf",
    "X11/xorg.conf.d/nvidia-drm-outputclass.conf",
    "vulkan/implicit_layer.d/nvidia_layers.json",
    "vulkan/icd.d/nvidia_icd.x86_64.json",
    "/nvidia-fabricmanager/socket",
    "/tmp/nvidia-mps",
    "nvidia-imex",
    "nvidia-imex-ctl",
)
#: Derived, not observed: with a toolkit of another driver the generator finds no user-space libraries of the
#: loaded driver's version.
_CDI_DRIVER_LIBS = (
    "libcuda.so.{v}",
    "libnvidia-ml.so.{v}",
    "libnvidia-ptxjitcompiler.so.{v}",
    "libnvidia-nvvm.so.{v}",
)


def service_log(node: SimNode, service: str) -> list[str]:
    """The lines ``talosctl logs <service>`` shows; only ``ext-nvidia-cdi-gen`` says anything here."""
    rt = runtime(node)
    if service != "ext-nvidia-cdi-gen" or rt.services.get(service) != "Finished" or not rt.driver_version:
        return []
    missing = list(_CDI_NOT_SHIPPED)
    if rt.toolkit_driver_version != rt.driver_version:
        missing += _CDI_DRIVER_LIBS
    stamp = f'time="{node.booted_at}"'
    lines = [f'{stamp} level=info msg="Using driver version {rt.driver_version}"']
    for name in (m.format(v=rt.driver_version) for m in missing):
        lines.append(f'{stamp} level=warning msg="Could not locate {name}: {name}: not found"')
    lines.append(f'{stamp} level=info msg="Generated CDI spec with version 0.8.0"')
    return lines


def members(t: ResourceType, node: SimNode, peers: list[SimNode]) -> list[Resource]:
    out: list[Resource] = []
    for peer in peers:
        spec = {
            "nodeId": peer.name,
            "addresses": [peer.address],
            "hostname": peer.name,
            "machineType": peer.role,
            "operatingSystem": f"Talos ({peer.talos_version})",
        }
        out.append({"metadata": _meta(t, node, peer.name), "spec": spec})
    return out


BUILDERS: dict[str, Callable[[ResourceType, SimNode, list[SimNode]], list[Resource]]] = {
    "PCIDevices.hardware.talos.dev": lambda t, node, _peers: [
        {"metadata": _meta(t, node, rid), "spec": spec} for rid, spec in hardware.pci_specs(node)
    ],
    "ExtensionStatuses.runtime.talos.dev": extensions,
    "LoadedKernelModules.runtime.talos.dev": modules,
    "KernelModuleSpecs.runtime.talos.dev": module_specs,
    "KernelModuleStatuses.runtime.talos.dev": modules,
    "MachineConfigs.config.talos.dev": machineconfig,
    "Services.v1alpha1.talos.dev": services,
    "Members.cluster.talos.dev": members,
    "PlatformMetadatas.talos.dev": platform_metadata,
}


def resources_for(t: ResourceType, node: SimNode, peers: list[SimNode]) -> list[Resource]:
    return BUILDERS[t.type](t, node, peers)


# ---------------------------------------------------------------- output writers


def _dig(obj: Any, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(obj, dict):
            return None
        obj = obj.get(part)
    return obj


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def tabwrite(table: list[list[str]]) -> str:
    """Go ``tabwriter`` (minwidth 0, padding 3): every column but the last padded to its widest cell."""
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    lines = ["".join(c.ljust(widths[i] + 3) for i, c in enumerate(r[:-1])) + r[-1] for r in table]
    return "\n".join(lines) + "\n"


def render_table(rtype: ResourceType, rows: list[tuple[str, ResourceType, Resource]]) -> str:
    """``get`` as a table; the header comes from the resource definition, so it is printed even when no
    resource matched."""
    header = ["NODE", "NAMESPACE", "TYPE", "ID", "VERSION", *(h for h, _ in rtype.columns)]
    table = [header]
    for node, t, res in rows:
        meta = res["metadata"]
        spec = res["spec"]
        extra = [_cell(_dig(spec, p)) for _, p in t.columns]
        table.append([node, meta["namespace"], t.short, meta["id"], str(meta["version"]), *extra])
    return tabwrite(table)


def _metadata_yaml(meta: dict[str, Any]) -> str:
    """COSI writes the metadata as plain scalars, whatever they look like (``id: 0``, an empty ``owner:``, an
    unquoted timestamp): cosi-project/runtime pkg/resource/metadata.go ``MarshalYAML`` builds the nodes itself."""
    lines = ["metadata:"]
    for key, value in meta.items():
        if isinstance(value, dict):
            lines += [f"    {key}:", *(f"        {k}: {v}" for k, v in value.items())]
        else:
            lines.append(f"    {key}: {value}" if value != "" else f"    {key}:")
    return "\n".join(lines) + "\n"


def render_yaml(rows: list[tuple[str, ResourceType, Resource]]) -> str:
    parts = []
    for node, _t, res in rows:
        body = _metadata_yaml(res["metadata"]) + _patching().dump_yaml({"spec": res["spec"]})
        parts.append(f"node: {node}\n{body}")
    return "---\n".join(parts)


def _go_json(value: Any) -> str:
    text = json.dumps(value, indent=4, sort_keys=True, ensure_ascii=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _plain(value: Any) -> Any:
    """A plain YAML scalar read back as YAML reads it: ``0`` an int, nothing a null (else the string)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, str) and re.fullmatch(r"[-+]?[0-9]+", value):
        return int(value)
    return None if value == "" else value


def render_json(rows: list[tuple[str, ResourceType, Resource]]) -> str:
    """talosctl marshals each resource to YAML and reads it back before writing JSON (talos@v1.12.0
    cmd/talosctl/cmd/talos/output/json.go:40-70), so the plain metadata scalars come out typed."""
    return "".join(
        _go_json({"node": node, "metadata": _plain(res["metadata"]), "spec": res["spec"]}) + "\n"
        for node, _t, res in rows
    )


def _scalar_text(value: Any) -> str:
    """A scalar as Go's ``fmt.Fprint`` writes it (``true``, not Python's ``True``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


_JSONPATH_RE = re.compile(r"^\{(.*)\}$")


def render_jsonpath(expr: str, rows: list[tuple[str, ResourceType, Resource]]) -> str:
    """The subset of kubectl-style JSONPath talosctl users write: ``{.spec.metadata.name}``, ``[n]``."""
    m = _JSONPATH_RE.match(expr.strip())
    if not m:
        raise ValueError(f"unrecognized character in action: {expr!r}")
    path = m.group(1).strip()
    out = []
    for node, _t, res in rows:
        obj: Any = {"node": node, **res}
        for part in re.findall(r"\.([^.\[\]]+)|\[(\d+)\]", path):
            key, idx = part
            if key:
                obj = obj.get(key) if isinstance(obj, dict) else None
            else:
                obj = obj[int(idx)] if isinstance(obj, list) and int(idx) < len(obj) else None
            if obj is None:
                break
        if obj is None:
            continue
        # printResult: a map, array or struct as json.MarshalIndent with 4 spaces (keys sorted), a scalar as text
        # (talos@v1.7.0 and v1.12.0 cmd/talosctl/cmd/talos/output/jsonpath.go:43-78)
        out.append(_go_json(obj) if isinstance(obj, dict | list) else _scalar_text(obj))
    return "".join(f"{line}\n" for line in out)
