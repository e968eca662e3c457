"""On-disk state of the simulated Talos GPU cluster, and what a node would show given that state.

Every simulator room (``talosctl``, the Kubernetes API, the factory) is a separate process that reads and
writes this directory, so the state is plain files: one JSON file per node (so a command that touches one
node of a 1,000-node fleet reads one file) plus ``cluster.json`` for cluster-wide facts and the
address → name index.  Writes are atomic (temp file + ``os.replace``) and mutations of one node are
serialised across processes with ``fcntl`` locks, because the runbook fans out to nodes concurrently.

``runtime(node)`` is the heart of the simulation's honesty: it derives what a real node would report
(modules Live, driver version, runtime handlers, services) from the inputs that decide it on a real node
(installed extensions, machine config, GPUs, faults), so no test can put a node into an impossible state.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import re
import tempfile
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

STATE_ENV = "RUNBOOK_SIM_STATE"
# The empty schematic (= model.schematic.VANILLA_SCHEMATIC_ID), spelt out: importing the schematic module
# would cost every simulated talosctl process its YAML emitter (benchmarks/bench_fleet.py).
VANILLA_SCHEMATIC = "376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba"

# Kubernetes version shipped by default with each Talos minor (Talos support matrix).
KUBERNETES_FOR_TALOS: dict[str, str] = {
    "1.3": "1.26.0",
    "1.4": "1.27.1",
    "1.5": "1.28.0",
    "1.6": "1.29.0",
    "1.7": "1.30.0",
    "1.8": "1.31.1",
    "1.9": "1.32.0",
    "1.10": "1.33.0",
    "1.11": "1.34.0",
    "1.12": "1.35.0",
    "1.13": "1.36.0",
    "1.14": "1.37.0",
}
# The patch release a bare "1.12" means: the newest patch named in the CLI references, else a late one.
LATEST_PATCH: dict[str, str] = {
    "1.3": "v1.3.7",
    "1.4": "v1.4.8",
    "1.5": "v1.5.5",
    "1.6": "v1.6.7",
    "1.7": "v1.7.7",
    "1.8": "v1.8.4",
    "1.9": "v1.9.6",
    "1.10": "v1.10.9",
    "1.11": "v1.11.6",
    "1.12": "v1.12.11",
    "1.13": "v1.13.9",
    "1.14": "v1.14.0",
}

_VERSION_RE = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?(-[0-9A-Za-z.\-]+)?$")


def normalize_talos_version(version: str) -> str:
    """``1.12`` → ``v1.12.11``; ``1.12.3`` → ``v1.12.3``: users type either, nodes report the full tag."""
    m = _VERSION_RE.match(version.strip())
    if not m:
        raise ValueError(f"not a Talos version: {version!r}")
    minor = f"{m.group(1)}.{m.group(2)}"
    if m.group(3) is None:
        if minor not in LATEST_PATCH:
            raise ValueError(f"unknown Talos minor version {minor}; known: {', '.join(LATEST_PATCH)}")
        return LATEST_PATCH[minor]
    return f"v{minor}.{m.group(3)}{m.group(4) or ''}"


def minor_of(version: str) -> tuple[int, int]:
    """(1, 12) for ``v1.12.7``: feature gates compare minors, never patch levels."""
    m = _VERSION_RE.match(version.strip())
    if not m:
        raise ValueError(f"not a Talos version: {version!r}")
    return int(m.group(1)), int(m.group(2))


@dataclass
class Gpu:
    model: str
    memory_mib: int
    bus_id: str
    uuid: str


@dataclass
class InstalledExtension:
    name: str
    """Name as the extension's manifest says, without the ``siderolabs/`` prefix (what ``get extensions`` shows)."""
    version: str
    image: str
    author: str = "Sidero Labs"
    description: str = ""


@dataclass
class SimNode:
    name: str
    address: str
    talos_version: str
    schematic_id: str = VANILLA_SCHEMATIC
    extensions: list[InstalledExtension] = field(default_factory=list)
    machine_config: list[dict[str, Any]] = field(default_factory=list)
    gpus: list[Gpu] = field(default_factory=list)
    reachable: bool = True
    faults: dict[str, Any] = field(default_factory=dict)
    latency_ms: float = 0.0
    role: str = "worker"
    config_version: int = 1
    """Resource version of ``MachineConfig`` (bumped on each applied change, as the real resource is)."""
    staged_config: list[dict[str, Any]] | None = None
    """Config applied with ``--mode staged``: takes effect at the next reboot."""
    staged_upgrade: dict[str, Any] | None = None
    """``upgrade --stage``: image to boot into at the next reboot."""
    boot_count: int = 1
    boot_id: str = ""
    """The kernel's boot ID simnode serves at ``/proc/sys/kernel/random/boot_id`` (its observation file); empty for
    the Python simulator's nodes, whose boot ID :meth:`kernel_boot_id` derives."""
    booted_at: str = "2026-11-29T10:00:00Z"
    install_image: str = ""
    """The image the node was last installed/upgraded from (what ``upgrade`` history would show)."""
    platform: str = "metal"
    """Talos platform the node booted on (``PlatformMetadata`` ``spec.platform``: ``metal``, ``aws``…)."""
    kernel_args: list[str] | None = None
    """Extra arguments on the booted command line; ``None``: the config's ``extraKernelArgs`` (as installed)."""

    def kernel_boot_id(self) -> str:
        """The boot ID the node's kernel reports, new on every boot: simnode's, or for the Python simulator's nodes
        one derived from the boot (its talosctl serves it at ``/proc/sys/kernel/random/boot_id``; the GPU node
        agent posts it as the kubelet does)."""
        return self.boot_id or str(
            uuid.uuid5(uuid.NAMESPACE_URL, f"{self.name}/{self.boot_count}/{self.booted_at}")
        )

    @property
    def minor(self) -> tuple[int, int]:
        return minor_of(self.talos_version)


@dataclass
class NodeRuntime:
    """What the node reports, derived from its state; see ``runtime``."""

    modules_live: dict[str, str]
    driver_version: str | None
    driver_flavor: Literal["open", "proprietary"] | None
    driver_error: str | None
    toolkit_active: bool
    toolkit_driver_version: str | None
    cri_runtime_handlers: set[str]
    default_runtime: str
    services: dict[str, str]
    bpf_jit_harden: int
    configured_modules: list[str]


@dataclass(frozen=True)
class SimPaths:
    state_dir: Path
    talosconfig: Path
    kubeconfig: Path
    bin_dir: Path
    endpoints: Path
    cluster: Path
    nodes_dir: Path
    faults: Path
    pid: Path
    log: Path


def sim_paths(state_dir: Path | str) -> SimPaths:
    d = Path(state_dir)
    return SimPaths(
        state_dir=d,
        talosconfig=d / "talosconfig",
        kubeconfig=d / "kubeconfig",
        bin_dir=d / "bin",
        endpoints=d / "endpoints.json",
        cluster=d / "cluster.json",
        nodes_dir=d / "nodes",
        faults=d / "faults.json",
        pid=d / "daemon.pid",
        log=d / "daemon.log",
    )


def talos_kubeconfig_path(state_dir: Path | str) -> Path:
    """The admin kubeconfig with Talos's structure (a client certificate, no token) that the real control plane
    writes (simkube, through realkube.write_talos_kubeconfig) and a simulated control-plane node hands out (simnode
    ``-talos-kubeconfig``): talosctl 1.14's drain refuses any other (talos@v1.14.1 pkg/kubeconfig/validate.go:29)."""
    return Path(state_dir) / "kube" / "talos-admin.kubeconfig"


def talos_kubeconfig_error_path(state_dir: Path | str) -> Path:
    """Why the real control plane wrote no ``talos_kubeconfig_path`` (simkube's error), for the reason
    ``realtalos.choose`` gives when it keeps 1.14 nodes on the Python talosctl; removed once it is written."""
    return Path(state_dir) / "kube" / "talos-admin.kubeconfig.error"


def default_state_dir() -> Path:
    """``$RUNBOOK_SIM_STATE`` or ``<repo>/.sim/default``, so every room and the library agree without flags."""
    env = os.environ.get(STATE_ENV)
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / ".sim" / "default"


# ---------------------------------------------------------------- serialisation


def _node_to_dict(node: SimNode) -> dict[str, Any]:
    return dataclasses.asdict(node)


def node_from_dict(data: dict[str, Any]) -> SimNode:
    data = dict(data)
    data["extensions"] = [InstalledExtension(**e) for e in data.get("extensions", [])]
    data["gpus"] = [Gpu(**g) for g in data.get("gpus", [])]
    known = {f.name for f in dataclasses.fields(SimNode)}
    return SimNode(**{k: v for k, v in data.items() if k in known})


def atomic_write(path: Path, data: str | bytes) -> None:
    """Write so that a concurrent reader sees the old or the new file, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _node_file(state_dir: Path | str, name: str) -> Path:
    return sim_paths(state_dir).nodes_dir / f"{name}.json"


def load_cluster(state_dir: Path | str) -> dict[str, Any]:
    """Cluster-wide facts: name, talosctl client version, node index (name ↔ address)."""
    p = sim_paths(state_dir).cluster
    try:
        data: dict[str, Any] = json.loads(p.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"no simulated cluster at {state_dir} (run `runbook sim up`)") from None
    return data


def save_cluster(state_dir: Path | str, data: dict[str, Any]) -> None:
    atomic_write(sim_paths(state_dir).cluster, json.dumps(data, indent=1))


_INDEX_CACHE: dict[str, tuple[int, int, dict[str, str]]] = {}
_INDEX_LOCK = threading.Lock()


def _index(state_dir: Path | str) -> dict[str, str]:
    """Address/name → node file name, parsed once per process while ``cluster.json`` is unchanged.

    A fan-out to 1,000 nodes resolves 1,000 addresses; re-reading the index each time would dominate.
    """
    path = sim_paths(state_dir).cluster
    try:
        st = path.stat()
    except FileNotFoundError:
        raise FileNotFoundError(f"no simulated cluster at {state_dir} (run `runbook sim up`)") from None
    key = str(path)
    with _INDEX_LOCK:
        cached = _INDEX_CACHE.get(key)
        if cached is not None and cached[:2] == (st.st_mtime_ns, st.st_size):
            return cached[2]
        cluster = load_cluster(state_dir)
        idx: dict[str, str] = {}
        for entry in cluster.get("nodes", []):
            idx[entry["address"]] = entry["name"]
            idx[entry["name"]] = entry["name"]
        _INDEX_CACHE[key] = (st.st_mtime_ns, st.st_size, idx)
        return idx


def resolve_name(state_dir: Path | str, name_or_address: str) -> str | None:
    """Node file name for an address or a name, or None when nothing answers there."""
    return _index(state_dir).get(name_or_address)


def load_node(state_dir: Path | str, name_or_address: str) -> SimNode:
    name = resolve_name(state_dir, name_or_address)
    if name is None:
        raise KeyError(name_or_address)
    return node_from_dict(json.loads(_node_file(state_dir, name).read_text()))


def load_nodes(state_dir: Path | str) -> list[SimNode]:
    cluster = load_cluster(state_dir)
    return [
        node_from_dict(json.loads(_node_file(state_dir, e["name"]).read_text()))
        for e in cluster.get("nodes", [])
    ]


def save_node(state_dir: Path | str, node: SimNode) -> None:
    atomic_write(_node_file(state_dir, node.name), json.dumps(_node_to_dict(node), separators=(",", ":")))


@contextlib.contextmanager
def locked_node(state_dir: Path | str, name_or_address: str) -> Iterator[SimNode]:
    """Read-modify-write one node under an exclusive lock; the node is saved when the block exits cleanly."""
    name = resolve_name(state_dir, name_or_address)
    if name is None:
        raise KeyError(name_or_address)
    lock_path = sim_paths(state_dir).nodes_dir / f".{name}.lock"
    with open(lock_path, "a+") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            node = load_node(state_dir, name)
            yield node
            save_node(state_dir, node)
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


def load_cluster_faults(state_dir: Path | str) -> dict[str, Any]:
    """Cluster-wide faults, one section per room (``talos``, ``factory``, …); empty when absent."""
    try:
        data = json.loads(sim_paths(state_dir).faults.read_text())
    except (FileNotFoundError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def save_cluster_faults(state_dir: Path | str, faults: dict[str, Any]) -> None:
    atomic_write(sim_paths(state_dir).faults, json.dumps(faults, indent=1))


# ---------------------------------------------------------------- derived state

NVIDIA_MODULES = ("nvidia", "nvidia_uvm", "nvidia_drm", "nvidia_modeset")
KMOD_PREFIXES = ("nvidia-open-gpu-kernel-modules", "nonfree-kmod-nvidia")
TOOLKIT_PREFIX = "nvidia-container-toolkit"
FABRICMANAGER_PREFIX = "nvidia-fabricmanager"


def kmod_extension(node: SimNode) -> InstalledExtension | None:
    for ext in node.extensions:
        if ext.name.startswith(KMOD_PREFIXES):
            return ext
    return None


def toolkit_extension(node: SimNode) -> InstalledExtension | None:
    for ext in node.extensions:
        if ext.name.startswith(TOOLKIT_PREFIX):
            return ext
    return None


def driver_of(version: str) -> str:
    """``580.105.08-v1.12.0`` → ``580.105.08``: both kmod and toolkit tags start with the driver version."""
    return version.split("-", 1)[0]


def v1alpha1_doc(config: list[dict[str, Any]]) -> dict[str, Any]:
    for doc in config:
        if "kind" not in doc and doc.get("version") == "v1alpha1":
            return doc
    return {}


def configured_modules(config: list[dict[str, Any]]) -> list[str]:
    """Module names the config asks to load: ``machine.kernel.modules`` plus 1.14 ``KernelModuleConfig`` docs."""
    names: list[str] = []
    machine = v1alpha1_doc(config).get("machine") or {}
    for mod in (machine.get("kernel") or {}).get("modules") or []:
        if isinstance(mod, dict) and mod.get("name"):
            names.append(str(mod["name"]))
    for doc in config:
        if doc.get("kind") == "KernelModuleConfig" and doc.get("name"):
            names.append(str(doc["name"]))
    return names


#: Talos' own arguments on a metal/cloud command line (image-factory internal/integration/pxe_test.go).
TALOS_CMDLINE = (
    "console=tty0 init_on_alloc=1 slab_nomerge pti=on consoleblank=0 nvme_core.io_timeout=4294967295 "
    "printk.devkmsg=on ima_template=ima-ng ima_appraise=fix ima_hash=sha512"
)


def booted_kernel_args(node: SimNode) -> list[str]:
    """The extra arguments the node booted with (``extraKernelArgs`` of its config until an upgrade says)."""
    if node.kernel_args is not None:
        return list(node.kernel_args)
    return kernel_args_after_upgrade(node, legacy_api=True)  # the installer that installed it applied them


def kernel_args_after_upgrade(node: SimNode, *, legacy_api: bool) -> list[str]:
    """What GRUB boots after an upgrade: ``extraKernelArgs`` only through the legacy upgrade API.

    talosctl 1.13+ upgrades through ``LifecycleService.Upgrade``, which does not pass
    ``.machine.install.extraKernelArgs``: with ``grubUseUKICmdline`` false the node reboots without them and
    nothing reports an error (docs:public/talos/v1.13/.../upgrading-talos.mdx:121-137).  With it true the
    command line is the UKI's and ``extraKernelArgs`` never applied.  Derived from the docs, not observed.
    """
    install = (v1alpha1_doc(node.machine_config).get("machine") or {}).get("install") or {}
    if install.get("grubUseUKICmdline") is True or not legacy_api:
        return []
    return [str(a) for a in install.get("extraKernelArgs") or []]


def sysctls(config: list[dict[str, Any]]) -> dict[str, str]:
    machine = v1alpha1_doc(config).get("machine") or {}
    out = {str(k): str(v) for k, v in (machine.get("sysctls") or {}).items()}
    for doc in config:
        if doc.get("kind") == "SysctlConfig":
            out.update({str(k): str(v) for k, v in (doc.get("sysctls") or {}).items()})
    return out


_DEFAULT_RUNTIME_RE = re.compile(r'default_runtime_name\s*=\s*"([^"]+)"')


def _default_runtime(node: SimNode, handlers: set[str]) -> str:
    machine = v1alpha1_doc(node.machine_config).get("machine") or {}
    runtime_name = "runc"
    parts = [
        str(f.get("content", ""))
        for f in machine.get("files") or []
        if isinstance(f, dict) and str(f.get("path", "")).startswith("/etc/cri/conf.d/")
    ]
    # Talos 1.14: CRICustomizationConfig documents carry the same TOML fragment (talos@v1.14.0-rc.1
    # pkg/machinery/config/types/cri/customization.go).
    parts += [
        str(d.get("content", "")) for d in node.machine_config if d.get("kind") == "CRICustomizationConfig"
    ]
    for content in parts:
        m = _DEFAULT_RUNTIME_RE.search(content)
        if m:
            runtime_name = m.group(1)
    return runtime_name


def unsupported_gpu_message(gpu: Gpu, driver: str) -> str:
    """The kernel's words when a driver branch does not know the GPU (extensions#227)."""
    return (
        f"NVRM: The NVIDIA GPU {gpu.bus_id} (PCI ID: 10de:2330)\n"
        f"NVRM: installed in this system is not supported by the\n"
        f"NVRM: NVIDIA {driver} driver release.\n"
        "NVRM: Please see 'Appendix A - Supported NVIDIA GPU Products'\n"
        "NVRM: in this release's README, available on the operating system\n"
        "NVRM: specific graphics driver download page at www.nvidia.com.\n"
        f"nvidia: probe of {gpu.bus_id} failed with error -1\n"
        "NVRM: The NVIDIA probe routine failed for 1 device(s).\n"
        "NVRM: None of the NVIDIA devices were initialized."
    )


BASE_SERVICES_WORKER = (
    "apid",
    "auditd",
    "containerd",
    "cri",
    "dashboard",
    "kubelet",
    "machined",
    "syslogd",
    "udevd",
)
#: The base services without a health check: every other one implements HealthcheckedService, dashboard does
#: not (talos@v1.9.0 to v1.13.0 internal/app/machined/pkg/system/services/*.go HealthFunc), so its health is
#: unknown ("?" in ``talosctl service``) and its last event is its process runner's, not "Health check successful".
UNCHECKED_SERVICES = frozenset({"dashboard"})
#: The release a base service first runs on, where it is not every simulated one: machined's boot sequence
#: starts dashboard from 1.4, syslogd from 1.7 and auditd from 1.9 (talos@v1.4.0, v1.7.0, v1.9.0
#: internal/app/machined/pkg/runtime/v1alpha1/v1alpha1_sequencer_tasks.go:821, :636, :363 LoadAndStart; their
#: services/<id>.go is not in the tree of the release before).
SERVICE_SINCE = {"dashboard": (1, 4), "syslogd": (1, 7), "auditd": (1, 9)}


def base_services(minor: tuple[int, int]) -> tuple[str, ...]:
    """The base services a worker of the ``minor`` release runs (``SERVICE_SINCE``): what ``talosctl service``
    lists before any extension's."""
    return tuple(s for s in BASE_SERVICES_WORKER if minor >= SERVICE_SINCE.get(s, (0, 0)))


def runtime(node: SimNode) -> NodeRuntime:
    """What a real node with these extensions, this config, these GPUs and these faults would report.

    The rules are the ones that bite in practice: the kmod extension blacklists the modules, so they load
    only when the machine config lists them; ``nvidia`` needs a GPU its branch supports; the toolkit only
    registers the ``nvidia`` handler; ``nvidia-persistenced`` waits for the driver to bind.
    """
    kmod = kmod_extension(node)
    toolkit = toolkit_extension(node)
    wanted = configured_modules(node.machine_config)
    modules_live: dict[str, str] = {}
    driver_version: str | None = None
    driver_flavor: Literal["open", "proprietary"] | None = None
    driver_error: str | None = None
    if kmod is not None and "nvidia" in wanted:
        drv = driver_of(kmod.version)
        if not node.gpus:
            driver_error = "NVRM: No NVIDIA GPU found."
        elif node.faults.get("gpu_unsupported"):
            driver_error = unsupported_gpu_message(node.gpus[0], drv)
        else:
            driver_version = drv
            driver_flavor = "proprietary" if kmod.name.startswith("nonfree") else "open"
            for mod in NVIDIA_MODULES:
                if mod in wanted:
                    modules_live[mod] = "Live"
    handlers = {"runc"}
    if toolkit is not None:
        handlers.add("nvidia")
    harden_raw = sysctls(node.machine_config).get("net.core.bpf_jit_harden", "2")
    try:
        harden = int(harden_raw)
    except ValueError:
        harden = 2
    services = dict.fromkeys(base_services(node.minor), "Running")
    if toolkit is not None:
        services["ext-nvidia-persistenced"] = "Running" if driver_version else "Waiting"
        if node.minor >= (1, 13):
            services["ext-nvidia-cdi-gen"] = "Finished" if driver_version else "Waiting"
    for ext in node.extensions:
        if ext.name.startswith(FABRICMANAGER_PREFIX):
            services["ext-nvidia-fabricmanager"] = "Running" if driver_version else "Waiting"
    return NodeRuntime(
        modules_live=modules_live,
        driver_version=driver_version,
        driver_flavor=driver_flavor,
        driver_error=driver_error,
        toolkit_active=toolkit is not None,
        toolkit_driver_version=driver_of(toolkit.version) if toolkit else None,
        cri_runtime_handlers=handlers,
        default_runtime=_default_runtime(node, handlers),
        services=dict(sorted(services.items())),
        bpf_jit_harden=harden,
        configured_modules=wanted,
    )
