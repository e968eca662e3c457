"""The simulated cluster's Talos side on the real talosctl and simnode (issue 14, the wiring).

Our Python ``talosctl`` was written from the same assumptions as the library, so it cannot catch the library's
mistakes about the real client. When the binaries are built (``make tools``), ``runbook sim up`` and
``runbook run`` on ``target: simulated`` run simnode (``simnode/``: the Talos API of the simulated nodes, in Go,
on Talos's own machinery) with the nodes the scenario produced, and point ``bin/talosctl`` and the talosconfig
at the real talosctl of the nodes' release. The simulated kubelet then follows each node's state as simnode
observes it (``with_observed``), so a config applied or an upgrade made by the real talosctl reaches Kubernetes.

The switch is ``RUNBOOK_SIM_TALOSCTL``: ``auto`` (default: real when a talosctl of the nodes' minor release
and simnode for the current sources are in the tools cache, else Python), ``real`` (build them if needed;
an error when impossible) or ``python``. What simnode cannot do yet falls back to the Python talosctl with a
one-line reason (``runbook sim status`` shows it): releases simnode does not serve (``SIMNODE_RELEASES``: it
serves Talos 1.3 to 1.14), and scenarios with faults simnode does not simulate.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from runbook_lib.model.boot_assets import installer_kind
from runbook_lib.sim import catalog, pidfile, realfaults
from runbook_lib.sim import scenarios as sim_scenarios
from runbook_lib.sim.realfaults import down_kind, extension_faults, fault_fields
from runbook_lib.sim.state import (
    TOOLKIT_PREFIX,
    UNCHECKED_SERVICES,
    VANILLA_SCHEMATIC,
    InstalledExtension,
    SimNode,
    atomic_write,
    base_services,
    load_nodes,
    minor_of,
    sim_paths,
    talos_kubeconfig_error_path,
    talos_kubeconfig_path,
    toolkit_extension,
)
from runbook_lib.sim.talosctl import images
from runbook_lib.sim.talosctl.hardware import pci_specs

MODE_ENV = "RUNBOOK_SIM_TALOSCTL"
MODES = ("auto", "real", "python")
#: Every scenario of ``runbook sim scenarios`` runs on simnode: ``realfaults`` makes their faults node state. A
#: node with a fault it does not map falls back to the Python talosctl with the reason (``up``).
SCENARIOS = tuple(sim_scenarios.SCENARIOS)
ROOT = Path(__file__).resolve().parents[2]
SIMNODE_SRC = ROOT / "simnode"
#: A reboot keeps the node's API down this long: more than the real tracker's 1 s re-watch tick
#: (simnode/lifecycle.go), so ``upgrade --wait`` sees the new boot (ours, no source). 3 s, not 1.5: the tracker's
#: re-watch must still find the node down when a loaded machine delays it (tests' runs on a busy CI machine), or
#: it watches the new boot with tail 0, misses its "ready" and waits until --timeout (as in
#: tests/sim/test_real_talosctl_lifecycle.py's REBOOT_MS).
REBOOT_MS = 3000
START_TIMEOUT_S = 60.0
#: The node releases simnode serves. It is built on pkg/machinery v1.13.0 (simnode/go.mod) and answers as each of
#: these releases where they differ in what the runbook meets: the 1.13 upgrade API only to 1.13 nodes
#: (simnode/lifecycle113.go), the 1.12 dry-run diff before 1.13 (configdiff112.go), and before 1.12 the
#: MachineConfig spec as a YAML document, ``get modules`` before 1.11 as the config's module specs,
#: ``/proc/modules``, and 1.9's dry-run diff (simnode/legacy.go, configdiff112.go, each cited). simnode is built on
#: pkg/machinery v1.14.1 (simnode/go.mod): 1.14 nodes get 1.14's KernelModuleStatus and apply modes
#: (simnode/state.go, apply.go). 1.7 and 1.8 nodes as 1.9's plus their differences (simnode/legacy18.go): no
#: PCIDevice before 1.8, 1.7's go-cmp dry-run diff, and an upgrade without ``--preserve`` to a 1.7 installer wiping
#: /var. 1.6 nodes as 1.7's (what the runbook calls is unchanged from talos@v1.6.7 to v1.7.0: tests/sim/
#: test_real_talos_13_16.py), but for their base services (no syslogd, state.SERVICE_SINCE). 1.5 nodes as 1.6's but
#: for the boot sequence's phase count (simnode/legacy18.go bootPhases; the rest compared at talos@v1.5.5 in
#: tests/sim/test_real_talos_13_16.py). 1.4 and 1.3 nodes (talosctl v1.4.0 and v1.3.5, the newest the module proxy
#: serves) as 1.5's but for what changed, each cited where simnode makes it: extensions come from
#: machine.install.extensions beside the stock ghcr.io installer (simnode/installext.go), the boot and upgrade
#: sequences' phases (legacy18.go bootPhases, kexecPhasesOf), and talosctl 1.3's upgrade post check calls
#: StorageService.Disks (simnode/storage.go).
SIMNODE_RELEASES = (
    (1, 3),
    (1, 4),
    (1, 5),
    (1, 6),
    (1, 7),
    (1, 8),
    (1, 9),
    (1, 10),
    (1, 11),
    (1, 12),
    (1, 13),
    (1, 14),
)
#: The talosctl a minor release pairs with when none of it is cached, where its ``.0`` cannot be built: the Go module
#: proxy refuses talos v1.14.0 ("403 This module version is not available", 2026-12-02) and serves v1.14.1. For 1.6
#: the newest patch, v1.6.7, is the one built (v1.6.8 is refused likewise; v1.6.0 is served, not tried); for 1.5
#: v1.5.5 (its go.mod taken from its zip, tools/build-talosctl.sh; v1.5.0 is served, not tried); for 1.4 and 1.3
#: v1.4.0 and v1.3.5 (v1.4.1-v1.4.8 and v1.3.6-v1.3.7 are refused, 2026-12-02).
DEFAULT_CLIENT = {(1, 3): "v1.3.5", (1, 4): "v1.4.0", (1, 5): "v1.5.5", (1, 6): "v1.6.7", (1, 14): "v1.14.1"}
#: Releases simnode serves that ``auto`` still leaves to the Python talosctl, and why (``real`` runs them). None
#: since 1.14's control-plane node hands out a client-certificate kubeconfig talosctl 1.14's drain accepts
#: (talos@v1.14.1 pkg/kubeconfig/validate.go:29; simnode -talos-kubeconfig, written by
#: realkube.write_talos_kubeconfig on the real control plane).
AUTO_PYTHON: dict[tuple[int, int], str] = {}


class RealTalosError(ValueError):
    """``RUNBOOK_SIM_TALOSCTL=real`` cannot be honoured (the message says why and what would fix it)."""


@dataclass(frozen=True)
class Choice:
    """Which talosctl the simulated cluster runs, and the one-line reason ``sim status`` shows."""

    real: bool
    reason: str
    talosctl: str = ""
    simnode: str = ""


# ---------------------------------------------------------------- choosing


def tools_cache() -> Path:
    """Where ``make tools`` caches the binaries (the build scripts' ``RUNBOOK_TOOLS_CACHE``)."""
    env = os.environ.get("RUNBOOK_TOOLS_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "talos-gpu-runbooks"


def simnode_hash(src: Path = SIMNODE_SRC) -> str:
    """The cache key ``tools/build-simnode.sh`` computes: sha256sum of go.mod, go.sum and *.go, sorted."""
    names = sorted(
        f"./{p.name}" for p in src.iterdir() if p.suffix == ".go" or p.name in ("go.mod", "go.sum")
    )
    listing = "".join(f"{hashlib.sha256((src / n).read_bytes()).hexdigest()}  {n}\n" for n in names)
    return hashlib.sha256(listing.encode()).hexdigest()[:16]


def cached_simnode() -> Path | None:
    if not SIMNODE_SRC.is_dir():
        return None
    path = tools_cache() / "simnode" / simnode_hash() / "simnode"
    return path if os.access(path, os.X_OK) else None


def cached_talosctl(version: str) -> Path | None:
    """The cached talosctl of ``version`` exactly, else the newest cached one of the same minor release."""
    root = tools_cache() / "talosctl"
    exact = root / version / "talosctl"
    if os.access(exact, os.X_OK):
        return exact
    minor = minor_of(version)
    same = [p for p in root.glob("v*/talosctl") if _minor(p.parent.name) == minor and os.access(p, os.X_OK)]
    return max(same, key=lambda p: _patch(p.parent.name), default=None)


def _minor(tag: str) -> tuple[int, int] | None:
    try:
        return minor_of(tag)
    except ValueError:
        return None


def _patch(tag: str) -> int:
    digits = tag.split("-", maxsplit=1)[0].rsplit(".", 1)[-1]
    return int(digits) if digits.isdigit() else -1


def _build(script: str, *args: str) -> Path:
    """Build with the project's script (``real`` mode only); its last line is the binary's path."""
    go = shutil.which("go") or shutil.which("go", path="/usr/local/go/bin")
    if go is None:
        raise RealTalosError(f"{MODE_ENV}=real: go is not installed, so {script} cannot build the binary")
    env = {**os.environ, "PATH": f"{Path(go).parent}:{os.environ.get('PATH', '')}"}
    proc = subprocess.run(
        [str(ROOT / "tools" / script), *args], capture_output=True, text=True, env=env, check=False
    )
    if proc.returncode != 0:
        raise RealTalosError(
            f"{MODE_ENV}=real: tools/{script} {' '.join(args)} failed: {proc.stderr.strip()}"
        )
    return Path(proc.stdout.strip().splitlines()[-1])


def mode() -> str:
    value = os.environ.get(MODE_ENV, "auto") or "auto"
    if value not in MODES:
        raise RealTalosError(f"{MODE_ENV}={value!r} is not one of {', '.join(MODES)}")
    return value


def choose(
    talos_version: str,
    talosctl_version: str | None,
    scenario: str,
    *,
    kube: str = "none",
    state_dir: Path | None = None,
) -> Choice:
    """Real talosctl + simnode when the mode, the release, the scenario and the Kubernetes side allow it; else why
    not. ``kube`` is the side ``cluster.kube_side`` found (``real`` or ``none``); ``state_dir`` holds the real
    control plane's Talos kubeconfig."""
    wanted = mode()
    if wanted == "python":
        return Choice(False, f"Python talosctl: {MODE_ENV}=python")
    client = talosctl_version or talosctl_version_for(talos_version)
    why_not = _unsupported(talos_version, client, scenario) or _drain_refused(talos_version, kube, state_dir)
    if why_not:
        if wanted == "real":
            raise RealTalosError(f"{MODE_ENV}=real: {why_not}")
        return Choice(False, f"Python talosctl: {why_not}")
    if wanted == "auto" and minor_of(talos_version) in AUTO_PYTHON:
        return Choice(False, f"Python talosctl: {AUTO_PYTHON[minor_of(talos_version)]}")
    talosctl, simnode = cached_talosctl(client), cached_simnode()
    if wanted == "real":
        talosctl = talosctl or _build("build-talosctl.sh", client)
        simnode = simnode or _build("build-simnode.sh")
    if talosctl is None or simnode is None:
        missing = f"no talosctl {client} built" if talosctl is None else "simnode not built for these sources"
        # `make tools` builds only its TALOS_VERSIONS (v1.12.0 by default): name the tag this cluster needs
        build = f"make tools TALOS_VERSIONS={client}" if talosctl is None else "make tools"
        return Choice(False, f"Python talosctl: {missing} ({build}, or {MODE_ENV}=real builds it)")
    return Choice(True, f"real talosctl {talosctl.parent.name} against simnode", str(talosctl), str(simnode))


def _drain_refused(talos_version: str, kube: str, state_dir: Path | None) -> str:
    """Why talosctl 1.14+'s upgrade drain would refuse the kubeconfig this Kubernetes side gives, or ``""``.

    talosctl 1.14's drain accepts only a kubeconfig with Talos's structure, a client certificate and no token
    (talos@v1.14.1 pkg/kubeconfig/validate.go:29, cmd/talosctl/pkg/talos/kubeclient/kubeclient.go:30). The real
    control plane's simkube writes one at ``talos_kubeconfig_path`` with the CA key it keeps, or why not beside
    it; without it the run would stop at the image step's drain after
    config-patch changed every node. No Kubernetes (a test's ``daemon=False`` cluster) has nothing to drain through.
    """
    if minor_of(talos_version) < (1, 14) or kube == "none":
        return ""
    if state_dir is None or talos_kubeconfig_path(state_dir).is_file():
        return ""
    try:
        why = talos_kubeconfig_error_path(state_dir).read_text(errors="replace").strip()
    except OSError:
        why = "no error was recorded"
    return (
        f"the real control plane wrote no {talos_kubeconfig_path(state_dir)}, the client-certificate kubeconfig "
        f"talosctl 1.14's upgrade drain needs ({why})"
    )


def talosctl_version_for(talos_version: str) -> str:
    """The talosctl the nodes' release pairs with: the same minor release (``v1.12.7`` → a cached ``v1.12.x``,
    else ``v1.12.0``, the tag ``make tools`` builds; ``DEFAULT_CLIENT`` where that tag cannot be built)."""
    major, minor = minor_of(talos_version)
    cached = cached_talosctl(talos_version)
    return cached.parent.name if cached else DEFAULT_CLIENT.get((major, minor), f"v{major}.{minor}.0")


def _unsupported(talos_version: str, client: str, scenario: str) -> str:
    if minor_of(talos_version) not in SIMNODE_RELEASES:
        served = [f"{major}.{minor}" for major, minor in SIMNODE_RELEASES]
        return (
            f"simnode does not simulate a {talos_version} node's API (checked against Talos's sources "
            f"for {served[0]} to {served[-1]}; real: Talos {', '.join(served)} nodes only)"
        )
    if minor_of(client) != minor_of(talos_version):
        return f"talosctl {client} is not the nodes' release {talos_version} (simnode pairs them)"
    if scenario not in SCENARIOS:
        return f"scenario {scenario} has faults simnode does not simulate yet (real: {', '.join(SCENARIOS)})"
    if not SIMNODE_SRC.is_dir():
        return f"simnode's sources are not at {SIMNODE_SRC} (an installed copy of the project)"
    return ""


# ---------------------------------------------------------------- simnode's nodes file


def _compat(talos_version: str) -> str:
    major, minor = minor_of(talos_version)
    return f">= v{major}.{minor}.0"


def extension_specs(
    talos_version: str, extensions: list[InstalledExtension], schematic: str
) -> list[dict[str, Any]]:
    """The ExtensionStatus list a node shows, as the Python talosctl lists it (``sim/talosctl/resources.py``):
    the schematic's extensions by index, then Image Factory's virtual ``schematic`` extension."""
    out: list[dict[str, Any]] = [
        {
            "image": f"{i}.sqsh",
            "name": e.name,
            "version": e.version,
            "author": e.author,
            "description": e.description,
            "compatibility": _compat(talos_version),
        }
        for i, e in enumerate(extensions)
    ]
    if minor_of(talos_version) < catalog.FIRST_FACTORY_MINOR:
        return out  # no Image Factory built a 1.3/1.4 installer: no virtual "schematic" extension
    out.append(
        {
            "name": "schematic",
            "version": schematic,
            "author": "Image Factory",
            "description": "This is a virtual extension representing the schematic ID used to build the image.",
        }
    )
    return out


def _pci_devices(node: SimNode) -> list[dict[str, Any]]:
    return [{"id": bus_id, **spec} for bus_id, spec in pci_specs(node)]


def installed_image(node: SimNode) -> str:
    """The installer the node runs: its ``install_image`` on the stock schematic, else the factory installer of
    its schematic (scenarios such as ``gpu-ready`` set the schematic and extensions, not ``install_image``)."""
    if node.schematic_id == VANILLA_SCHEMATIC:
        return node.install_image
    return f"factory.talos.dev/{installer_kind(node.talos_version, node.platform)}/{node.schematic_id}:{node.talos_version}"


def node_entry(node: SimNode, latency_ms: float) -> dict[str, Any]:
    """One node of simnode's nodes file: derived from its installer image and config (simnode/README.md),
    with its faults (``realfaults``)."""
    return {
        "name": node.name,
        "address": node.address,
        "talos_version": node.talos_version,
        "image": installed_image(node),
        "machine_config": yaml.safe_dump_all(node.machine_config, sort_keys=False),
        "services": [_base_service(s) for s in base_services(node.minor)],
        "platform_metadata": _platform_metadata(node),
        "pci_devices": _pci_devices(node),
        "reboot_ms": REBOOT_MS,
    } | fault_fields(node, latency_ms)


def _base_service(service: str) -> dict[str, Any]:
    """A base service running since boot; ``healthy`` only where it has a health check (``UNCHECKED_SERVICES``):
    simnode derives machined's events from it (simnode/services.go)."""
    if service in UNCHECKED_SERVICES:
        return {"id": service, "state": "Running"}
    return {"id": service, "state": "Running", "healthy": True}


def _platform_metadata(node: SimNode) -> dict[str, Any]:
    """What the node's platform reports. Metal reports a hostname only from ``talos.hostname=`` on the kernel
    cmdline (talos@v1.12.0 internal/app/machined/pkg/runtime/v1alpha1/platform/metal/metal.go:194-196), which
    the simulated nodes do not have; the Kubernetes node name talosctl's drain looks up is the Nodename resource's
    (talos@v1.13.0 cmd/talosctl/pkg/talos/nodedrain/nodedrain.go:47-62), which simnode gives the node's name
    (simnode/kubeconfig.go). Other platforms keep the node's name as their hostname (not checked against a
    source: their metadata is not simulated further)."""
    if node.platform == "metal":
        return {"platform": node.platform}
    return {"platform": node.platform, "hostname": node.name}


def nodes_document(state_dir: Path, nodes: list[SimNode], latency_ms: float) -> dict[str, Any]:
    """simnode's nodes file for the scenario's nodes; each node's current image installs what it runs now.

    A node simnode already ran (its observed file, kept by a stopped simnode: ``runbook run`` stops the
    simulator it started) resumes as it was observed: the release, installer and config the real talosctl left.
    """
    images: dict[str, dict[str, Any]] = {}
    entries = []
    for node in nodes:
        entry = node_entry(node, latency_ms)
        listed = extension_specs(node.talos_version, node.extensions, node.schematic_id)
        if minor_of(node.talos_version) < catalog.FIRST_FACTORY_MINOR and node.extensions:
            # before the Image Factory the stock installer installs no extension: a node's came from its
            # machine.install.extensions, installed beside the image's (simnode/installext.go)
            entry["config_extensions"], listed = listed, []
        spec: dict[str, Any] = {"talos_version": node.talos_version, "extensions": listed}
        if any(f in node.faults for f in ("driver_mismatch", "toolkit_missing")):
            # the node lists its schematic's extensions with the fault applied: the image installs them unfaulted
            spec = resolve_image(state_dir, installed_image(node))
            if swaps := extension_faults(spec["extensions"], listed) or _toolkit_faults(node):
                entry["extension_faults"] = swaps
        if images.setdefault(installed_image(node), spec) != spec:
            raise RealTalosError(
                f"node {node.name}: its image {installed_image(node)} installs what another node's does not"
            )
        entries.append(entry)
    return {"images": images, "nodes": [_resume(state_dir, e, images) for e in entries]}


def _resume(state_dir: Path, entry: dict[str, Any], images: dict[str, dict[str, Any]]) -> dict[str, Any]:
    try:
        obs = json.loads(observed_file(state_dir, entry["name"]).read_text())
    except (OSError, ValueError):
        return entry
    image = str(obs.get("image") or entry["image"])
    if image not in images:
        images[image] = resolve_image(state_dir, image)
    config = obs.get("machine_config") or entry["machine_config"]
    resumed = {"talos_version": images[image]["talos_version"], "image": image, "machine_config": config}
    if obs.get("config_extensions"):  # what an install from machine.install.extensions added (Talos 1.3/1.4)
        resumed["config_extensions"] = obs["config_extensions"]
    return entry | resumed


def _toolkit_faults(node: SimNode) -> list[dict[str, Any]]:
    """The extension faults of a node that runs no NVIDIA toolkit yet (the stock image): each toolkit of its
    release dropped or swapped as the fault says, so the image the upgrade brings lists it faulted (simnode keeps
    a node's extension faults across the images it boots, simnode/faults.go). Why: ``extension_faults`` swaps
    only what the current image installs, and a fault injected before the upgrade had nothing to apply to (the
    Python talosctl applies it to what the upgrade installs, ``images.resolve``). The replacement has no
    ``image``: simnode then gives it the index of the toolkit it replaces as its ID."""
    if toolkit_extension(node) is not None:
        return []
    out: list[dict[str, Any]] = []
    for info in images.official_extensions(node.talos_version):
        toolkit = images.to_installed(info)
        if not toolkit.name.startswith(TOOLKIT_PREFIX):
            continue
        image, listed = (
            extension_specs(node.talos_version, exts, "")[:-1]
            for exts in ([toolkit], images.apply_extension_faults([toolkit], node.talos_version, node.faults))
        )
        for fault in extension_faults(image, listed):
            fault.get("replace", {}).pop("image", None)
            out.append(fault)
    return out


def resolve_image(state_dir: Path, ref: str) -> dict[str, Any]:
    """simnode's ``-image-resolver``: what an installer image installs, from the factory room's catalog and
    schematics (what the Python talosctl's upgrade resolves, ``sim/talosctl/images.py``)."""
    parsed, installed = images.resolve(state_dir, ref, {})
    return {
        "talos_version": parsed.version,
        "extensions": extension_specs(parsed.version, installed, parsed.schematic_id),
    }


def resolve_extension(state_dir: Path, ref: str) -> dict[str, Any]:
    """simnode's ``-image-resolver --extension REF``: the system extension image a ``machine.install.extensions``
    entry names (simnode/installext.go), from the factory room's catalog of the release it was built for, as the
    Python talosctl's upgrade looks it up (``images.with_install_extensions``); ``ImageError`` when no release of
    the catalog has that image (the registry would answer 404)."""
    for version in reversed(catalog.talos_versions()):
        for info in catalog.available_extensions(state_dir, version):
            if info.ref == ref:
                fields = {
                    "name": info.name,
                    "ref": info.ref,
                    "author": info.author,
                    "description": info.description,
                }
                ext = images.to_installed({k: str(v or "") for k, v in fields.items()})
                return {
                    "name": ext.name,
                    "version": ext.version,
                    "author": ext.author,
                    "description": ext.description,
                    "compatibility": _compat(version),
                }
    raise images.ImageError(f'failed to resolve reference "{ref}": {ref}: not found')


# ---------------------------------------------------------------- running simnode


@dataclass(frozen=True)
class Paths:
    dir: Path  # simnode's -state-dir: talosconfig, endpoint, observed/
    nodes: Path
    resolver: Path
    pid: Path
    log: Path
    choice: Path


def paths(state_dir: Path) -> Paths:
    d = Path(state_dir)
    return Paths(
        d / "simnode",
        d / "simnode-nodes.json",
        d / "bin" / ".resolve-image",
        d / "simnode.pid",
        d / "simnode.log",
        d / "talosctl.json",
    )


def forget(state_dir: Path) -> None:
    """A new cluster (``cluster.create``): no simnode state of an earlier one is resumed."""
    p = paths(state_dir)
    shutil.rmtree(p.dir, ignore_errors=True)
    p.choice.unlink(missing_ok=True)


def observed_file(state_dir: Path, name: str) -> Path:
    return paths(state_dir).dir / "observed" / f"{name}.json"


def _resolver_script(state_dir: Path) -> str:
    quote = shlex.quote
    return (
        f"#!/bin/sh\n# simnode's -image-resolver for the cluster in {quote(str(state_dir))}\n"
        f"exec {quote(sys.executable)} -m runbook_lib.sim.realtalos resolve-image "
        f'--state {quote(str(state_dir))} "$@"\n'
    )


#: simnode's -time-factor when ``RUNBOOK_SIM_TIME_SCALE`` is unset: at 1 an upgrade keeps a node up ~40 s
#: (installer pull and install, simnode/lifecycle.go), over 2 minutes for the demo's 3 nodes; at 0.05 it is 2 s
#: and a boot waiting on a service fails after 3.5 min instead of 70.
DEFAULT_TIME_FACTOR = 0.05


def time_factor() -> float:
    """simnode's -time-factor: ``RUNBOOK_SIM_TIME_SCALE`` (the Python simulator's scale of Talos's durations),
    else ``DEFAULT_TIME_FACTOR``."""
    try:
        value = float(os.environ.get("RUNBOOK_SIM_TIME_SCALE", DEFAULT_TIME_FACTOR))
    except ValueError:
        return DEFAULT_TIME_FACTOR
    return min(max(value, 1e-6), 1.0)


def start(state_dir: Path, choice: Choice, nodes: list[SimNode], latency_ms: float) -> None:
    """Write the nodes file, start simnode, wait until every node answers, then point the cluster's
    talosconfig and ``bin/talosctl`` at it and the real talosctl."""
    stop(state_dir)
    p = paths(state_dir)
    atomic_write(p.nodes, json.dumps(nodes_document(state_dir, nodes, latency_ms)))
    atomic_write(p.resolver, _resolver_script(state_dir.resolve()))
    p.resolver.chmod(0o700)
    p.dir.mkdir(mode=0o700, exist_ok=True)
    p.dir.chmod(0o700)
    (p.dir / "endpoint").unlink(missing_ok=True)
    argv = [
        choice.simnode,
        "-nodes",
        str(p.nodes),
        "-state-dir",
        str(p.dir),
        "-image-resolver",
        str(p.resolver),
    ]
    argv += ["-time-factor", repr(time_factor())]
    # The control-plane node hands out the cluster's kubeconfig, as machined does: talosctl 1.13's upgrade
    # --drain cordons and drains through it (simnode/kubeconfig.go). Read at each call: it may come later.
    argv += ["-kubeconfig", str(sim_paths(state_dir).kubeconfig.resolve())]
    # ... or, while it names the same server, the one with Talos's structure (client certificate) the real
    # control plane writes beside it: talosctl 1.14's drain refuses any other (realkube.write_talos_kubeconfig).
    argv += ["-talos-kubeconfig", str(talos_kubeconfig_path(state_dir).resolve())]
    argv += _daemon_flags(state_dir)
    # owner-only whatever the umask, as the daemon's log (cluster.start_daemon; attack report F14)
    with os.fdopen(os.open(p.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600), "ab") as log:
        os.fchmod(log.fileno(), 0o600)
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, umask=0o077
        )
    atomic_write(p.pid, f"{proc.pid} {pidfile.start_time(proc.pid) or ''}\n")
    _wait_endpoint(proc, p)
    _point_at_real(state_dir, choice, p)


def _daemon_flags(state_dir: Path) -> list[str]:
    """``-parent-pid``/``-parent-start`` naming the state dir's running daemon, so simnode stops with it
    (simnode/parent.go), as realkube's supervisor follows it; none when no daemon runs (a test's
    ``daemon=False`` cluster: simnode then runs until :func:`stop`).

    Why: simnode runs in its own session; a caller that stopped only the daemon (``cluster.stop_daemon``)
    or a daemon killed with SIGKILL left it serving a cluster nobody ran (tests/sim/test_simnode_follows_daemon.py).
    """
    recorded = pidfile.read(sim_paths(state_dir).pid)
    if recorded is None or recorded[1] is None or not pidfile.is_daemon(*recorded, state_dir):
        return []
    return ["-parent-pid", str(recorded[0]), "-parent-start", recorded[1]]


def _wait_endpoint(proc: subprocess.Popen[bytes], p: Paths) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while not (p.dir / "endpoint").exists():
        if proc.poll() is not None:
            tail = p.log.read_text(errors="replace").strip().splitlines()[-1:]
            raise RealTalosError(f"simnode exited with {proc.returncode}: {' '.join(tail)} (log: {p.log})")
        if time.monotonic() > deadline:
            stop(p.dir.parent)
            raise RealTalosError(f"simnode did not serve within {START_TIMEOUT_S:.0f} s (log: {p.log})")
        time.sleep(0.05)


def _point_at_real(state_dir: Path, choice: Choice, p: Paths) -> None:
    sp = sim_paths(state_dir)
    atomic_write(sp.talosconfig, (p.dir / "talosconfig").read_bytes())
    sp.talosconfig.chmod(0o600)
    talosctl = sp.bin_dir / "talosctl"
    talosctl.unlink(missing_ok=True)
    talosctl.symlink_to(choice.talosctl)
    record(state_dir, choice)


def record(state_dir: Path, choice: Choice) -> None:
    """Which talosctl the cluster runs and why (``runbook sim status``)."""
    atomic_write(paths(state_dir).choice, json.dumps(asdict(choice)))


def recorded(state_dir: Path) -> Choice | None:
    try:
        return Choice(**json.loads(paths(state_dir).choice.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def _is_simnode(pid: int, started: str | None, state_dir: Path) -> bool:
    """The pid is still the simnode this state dir started (start time and ``-state-dir`` checked)."""
    if pidfile.start_time(pid) is None or (started is not None and pidfile.start_time(pid) != started):
        return False
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return os.fsencode(str(paths(state_dir).dir)) in argv


def stop(state_dir: Path, timeout: float = 10.0) -> bool:
    """Stop this state dir's simnode (by its pid, checked); True if one was running."""
    p = paths(state_dir)
    recorded_pid = pidfile.read(p.pid)
    stopped = False
    if recorded_pid is not None and _is_simnode(recorded_pid[0], recorded_pid[1], state_dir):
        with contextlib.suppress(ProcessLookupError):
            os.kill(recorded_pid[0], signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while pidfile.start_time(recorded_pid[0]) is not None and time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(recorded_pid[0], os.WNOHANG)
            time.sleep(0.05)
        stopped = True
    p.pid.unlink(missing_ok=True)
    return stopped


def up(
    state_dir: Path,
    nodes: list[SimNode],
    *,
    talos_version: str,
    talosctl_version: str | None,
    scenario: str,
    latency_ms: float,
    kube: str = "none",
    keep: bool = False,
) -> Choice:
    """What ``runbook sim up`` and ``runbook run`` call after creating the cluster and starting its Kubernetes side
    (``kube``, see ``choose``): real talosctl when chosen, else the Python one stays (the reason is recorded).
    ``keep`` (``sim up --keep``) refuses the Python one where simnode holds the nodes' state: it would start over
    from the node files, losing what the real talosctl did to them (review of 6 Dec 2026)."""
    choice = choose(talos_version, talosctl_version, scenario, kube=kube, state_dir=state_dir)
    if choice.real and (faults := sorted({f for n in nodes for f in realfaults.unsupported(n)})):
        why = f"faults {', '.join(faults)} are not simulated by simnode yet"
        if mode() == "real":
            raise RealTalosError(f"{MODE_ENV}=real: {why}")
        choice = Choice(False, f"Python talosctl: {why}")
    if choice.real:
        start(state_dir, choice, nodes, latency_ms)
    elif keep and paths(state_dir).dir.exists():
        raise RealTalosError(
            f"{choice.reason}: simnode holds these nodes' state (what runs did through the real talosctl), which "
            "the Python talosctl would not keep"
        )
    else:
        stop(state_dir)
        shutil.rmtree(paths(state_dir).dir, ignore_errors=True)  # no stale observed state for the kubelet
        record(state_dir, choice)
    return choice


# ---------------------------------------------------------------- faults switched while it runs

#: ``runbook sim fault NODE unreachable VALUE`` switches simnode's ``down`` (``realfaults.DOWN_KINDS``).
SYNC_TIMEOUT_S = 10.0


def running_pid(state_dir: Path) -> int | None:
    """The pid of the simnode serving this state dir's nodes, None when none does."""
    recorded_pid = pidfile.read(paths(state_dir).pid)
    if recorded_pid is None or not _is_simnode(recorded_pid[0], recorded_pid[1], state_dir):
        return None
    return recorded_pid[0]


def check_switchable(state_dir: Path, fault: str) -> None:
    """Refuse a Talos fault simnode cannot switch while it runs (its SIGHUP applies ``down`` only): written to
    the node file only, the real talosctl would never see it."""
    if fault in realfaults.TALOS_FAULTS - {"unreachable"} and running_pid(state_dir) is not None:
        raise RealTalosError(
            f"fault {fault}: simnode serves these nodes to the real talosctl and switches only 'unreachable' "
            f"while it runs; it reads {fault} when it starts (a scenario's, or one switched while it is down), "
            f"or run the Python talosctl ({MODE_ENV}=python runbook sim up) to switch it by hand"
        )


def sync_faults(state_dir: Path) -> bool:
    """Make simnode take nodes down or bring them back as their ``unreachable`` fault says (nodes file +
    SIGHUP), and wait until each node's observed file shows it and the real talosctl reaches every node that
    was down and is wanted up (``_wait_answering``); False when no simnode runs here."""
    p = paths(state_dir)
    pid = running_pid(state_dir)
    if pid is None:
        return False
    nodes = load_nodes(state_dir)
    wanted = {n.name: down_kind(n) for n in nodes}
    back = [n.address for n in nodes if not wanted[n.name] and _observed_down(state_dir, n.name)]
    doc = json.loads(p.nodes.read_text())
    for entry in doc["nodes"]:
        entry["down"] = wanted.get(entry["name"], "")
    atomic_write(p.nodes, json.dumps(doc))
    os.kill(pid, signal.SIGHUP)
    deadline = time.monotonic() + SYNC_TIMEOUT_S
    while not all(_observed_down(state_dir, name) == down for name, down in wanted.items()):
        if time.monotonic() > deadline:
            raise RealTalosError(
                f"simnode did not apply the faults within {SYNC_TIMEOUT_S:.0f} s (log: {p.log})"
            )
        time.sleep(0.05)
    _wait_answering(state_dir, back)
    return True


#: How long a node brought back may still refuse: simnode's apid front redials a node only after apid's
#: backoff, which grows to 15 s (simnode/front.go ``apidBackoff``, talos@v1.12.0
#: internal/app/apid/pkg/backend/apid.go:95-118), so a node that was down long waits up to that; doubled.
ANSWER_TIMEOUT_S = 30.0


def _wait_answering(state_dir: Path, addresses: list[str]) -> None:
    """Until ``talosctl version`` reaches every node in ``addresses``. Why: simnode marks a node up (its
    observed file) before its apid front redials it, and until then every call fails with the old dial error
    (``connection refused``), as a real apid does while its backoff lasts; ``runbook sim fault --clear``
    returned into that window (tests/sim/test_fault_clear_reachable.py). Exit 0 is not enough for several
    nodes: ``version`` is one-to-many and names a failing node in a ``WARNING:`` while the others answer
    (``_refusing``), so each round asks again only the nodes still refusing."""
    sp = sim_paths(state_dir)
    argv = [str(sp.bin_dir / "talosctl"), "--talosconfig", str(sp.talosconfig)]
    deadline = time.monotonic() + ANSWER_TIMEOUT_S
    pending, why = list(addresses), ""
    while pending:
        try:
            done = subprocess.run(
                [*argv, "-n", ",".join(pending), "version"],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
            pending, why = _refusing(pending, done.returncode, done.stderr), done.stderr.strip()
        except subprocess.TimeoutExpired:
            why = "talosctl version did not return within 30 s"
        if not pending:
            return
        if time.monotonic() > deadline:
            raise RealTalosError(
                f"nodes {', '.join(pending)} still refuse talosctl {ANSWER_TIMEOUT_S:.0f} s after simnode "
                f"brought them back: {(why.splitlines() or [''])[-1].strip()} (log: {paths(state_dir).log})"
            )
        time.sleep(0.1)


def _refusing(addresses: list[str], returncode: int, stderr: str) -> list[str]:
    """The nodes of a ``talosctl -n a,b version`` that did not answer: every one when it failed (talos@v1.12.0
    pkg/machinery/client/reply.go FilterMessages fails only when no node answered; a failing endpoint names
    its own address, not the nodes behind it), else those its ``WARNING:`` names (``<node>: <error>``)."""
    if returncode != 0:
        return list(addresses)
    return [a for a in addresses if re.search(rf"(?<![\w.]){re.escape(a)}(?![\w.])", stderr)]


def _observed_down(state_dir: Path, name: str) -> str:
    try:
        return str(json.loads(observed_file(state_dir, name).read_text()).get("down") or "")
    except (OSError, ValueError):
        return "?"


# ---------------------------------------------------------------- what the kubelet reads


#: libyaml's parser where PyYAML has it (the same documents as SafeLoader, ~10× faster)
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@functools.lru_cache(maxsize=64)
def _config_documents(text: str) -> tuple[dict[str, Any], ...]:
    """A machine config's documents, parsed once per distinct text (each caller copies them). Why: the node
    agent reads every node this way every 0.5 s, and a fleet's nodes share a few configs; at 1,000 nodes parsing
    each node's YAML was 2.57 s of CPU per pass (tests/sim/test_nodeagent_reads.py)."""
    return tuple(d for d in yaml.load_all(text, Loader=_YAML_LOADER) if d)


def with_observed(node: SimNode, path: Path) -> SimNode:
    """The node as simnode observes it now (its file, when there is one): release, extensions, schematic,
    config, reachability and boot, so the simulated kubelet follows what the real talosctl changed."""
    try:
        obs: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        return node
    exts = obs.get("extensions") or []
    node.talos_version = str(obs.get("talos_version") or node.talos_version)
    node.install_image = str(obs.get("image") or node.install_image)
    node.schematic_id = next(
        (str(e["version"]) for e in exts if e.get("name") == "schematic"), node.schematic_id
    )
    node.extensions = [
        InstalledExtension(
            name=e["name"],
            version=e["version"],
            image=e.get("image", ""),
            author=e.get("author", ""),
            description=e.get("description", ""),
        )
        for e in exts
        if e.get("name") != "schematic"
    ]
    node.machine_config = copy.deepcopy(list(_config_documents(str(obs.get("machine_config") or ""))))
    node.reachable = not obs.get("down")
    boot_id = str(obs.get("boot_id") or "")
    node.boot_id = boot_id
    node.boot_count = int(hashlib.sha256(boot_id.encode()).hexdigest()[:12], 16)
    return node


def observed_nodes(state_dir: Path) -> list[SimNode]:
    """Every node as simnode observes it (the node files where simnode does not run)."""
    return [with_observed(n, observed_file(state_dir, n.name)) for n in load_nodes(state_dir)]


def main(argv: list[str]) -> int:
    """``python -m runbook_lib.sim.realtalos resolve-image --state DIR [--extension] REF`` (simnode's
    -image-resolver: an installer image, or with ``--extension`` a system extension image)."""
    extension = argv[3:4] == ["--extension"]
    if extension:
        argv = argv[:3] + argv[4:]
    if len(argv) != 4 or argv[0] != "resolve-image" or argv[1] != "--state":
        sys.stderr.write(
            "usage: python -m runbook_lib.sim.realtalos resolve-image --state DIR [--extension] IMAGE\n"
        )
        return 2
    resolve = resolve_extension if extension else resolve_image
    try:
        sys.stdout.write(json.dumps(resolve(Path(argv[2]), argv[3])) + "\n")
    except images.ImageError as exc:
        sys.stderr.write(f"{exc}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
