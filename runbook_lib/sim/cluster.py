"""Create, inspect and tear down a simulated cluster (what ``runbook sim up|status|down`` does).

``create`` writes the state directory the rooms share, a talosconfig shaped like a real one (context with
endpoints and nodes), and a ``talosctl`` executable in ``bin/`` that runs the simulator's (``realtalos`` replaces
it with the real one where built; ``realkube`` writes ``bin/kubectl`` and ``bin/helm``, the real clients), so
the library uses the simulated cluster exactly as it would use a real one: through a tool path, a talosconfig
and a kubeconfig.  ``start_daemon`` runs the HTTP rooms (the Image Factory) and the tool server in one detached
process and waits until it has published its URLs in ``endpoints.json``.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import hashlib
import ipaddress
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from runbook_lib.model.params import Params
from runbook_lib.sim import machineconfig, pidfile, realkube, realtalos, toolserver
from runbook_lib.sim.scenarios import apply_scenario
from runbook_lib.sim.state import (
    Gpu,
    SimNode,
    SimPaths,
    atomic_write,
    load_cluster,
    load_nodes,
    normalize_talos_version,
    runtime,
    save_cluster,
    save_node,
    sim_paths,
)

FIRST_ADDRESS = ipaddress.IPv4Address("10.5.0.2")
CLUSTER_NAME = "talos-gpu-sim"
DEFAULT_GPU = ("NVIDIA L4", 23034)
# Written by ``create``: what makes a directory one ``sim down --purge`` may delete.
MARKER = ".runbook-sim-state"
MARKER_TEXT = "talos-gpu-runbooks simulated cluster state (runbook sim down --purge deletes this directory)\n"


@dataclass
class ClusterSpec:
    workers: int = 2
    control_planes: int = 1
    talos_version: str = "1.12"
    scenario: str = "fresh"
    latency_ms: float = 0.0
    gpus_per_worker: int = 1
    gpu_model: str = DEFAULT_GPU[0]
    gpu_memory_mib: int = DEFAULT_GPU[1]
    talosctl_version: str | None = None
    worker_nodes: tuple[tuple[str, str], ...] = ()
    """(name, address) of each GPU worker, e.g. from a parameter file; default ``talos-worker-N``."""


def state_differs(state_dir: Path, params: Params, scenario: str) -> list[str] | None:
    """How the simulator's state differs from what these parameters make (empty: it was made for them, and a
    second run sees the cluster the first one left); None when there is no state."""
    try:
        info = load_cluster(state_dir)
    except (FileNotFoundError, ValueError):
        return None
    workers = [(n["name"], n["address"]) for n in info.get("nodes", []) if n.get("role") == "worker"]
    talos = normalize_talos_version(params.talos_version)
    differs = [
        f"scenario {info.get('scenario')}, this run's {scenario}" if info.get("scenario") != scenario else "",
        f"Talos {info.get('talos_version')}, this run's {talos}"
        if info.get("talos_version") != talos
        else "",
        _nodes_differ(workers, [(n.name, n.address) for n in params.nodes]),
    ]
    return [d for d in differs if d]


#: Nodes a difference names at most on each side.
NODES_NAMED = 3


def _nodes_differ(cluster: list[tuple[str, str]], run: list[tuple[str, str]]) -> str:
    """Which GPU nodes differ, by name and address (empty when none). Why: "other GPU nodes (names or addresses)"
    left a person to find the typo in a list (operator walkthrough, stop 53)."""
    if cluster == run:
        return ""
    only_run = [f"{n} at {a}" for n, a in run if (n, a) not in cluster]
    only_cluster = [f"{n} at {a}" for n, a in cluster if (n, a) not in run]
    if not only_run and not only_cluster:
        return "the same GPU nodes in another order than this run's"

    def named(nodes: list[str]) -> str:
        more = len(nodes) - NODES_NAMED
        return ", ".join(nodes[:NODES_NAMED]) + (f" and {more} more" if more > 0 else "")

    parts = [f"this run's {named(only_run)} not among its GPU nodes"] if only_run else []
    parts += [f"its {named(only_cluster)} not among this run's"] if only_cluster else []
    return "; ".join(parts)


def spec_from_state(state_dir: Path) -> ClusterSpec:
    """The spec a state directory's cluster was created with, as far as starting its servers again needs it
    (``runbook sim up --keep``). FileNotFoundError when there is none."""
    info = load_cluster(state_dir)
    nodes = [n for n in load_nodes(state_dir) if n.role == "worker"]
    talosctl = info.get("talosctl_version")
    return ClusterSpec(
        workers=len(nodes),
        talos_version=str(info.get("talos_version")),
        scenario=str(info.get("scenario") or "fresh"),
        latency_ms=nodes[0].latency_ms if nodes else 0.0,
        # only a client version chosen at creation (--talosctl-version); by default it follows the release
        talosctl_version=str(talosctl) if talosctl and talosctl != info.get("talos_version") else None,
        worker_nodes=tuple((n.name, n.address) for n in nodes),
    )


def spec_from_params(params: Params) -> ClusterSpec:
    """The simulated cluster a parameter file describes: its GPU nodes, Talos release and scenario."""
    return ClusterSpec(
        workers=len(params.nodes),
        talos_version=params.talos_version,
        scenario=params.simulation.scenario,
        latency_ms=params.simulation.latency_ms,
        worker_nodes=tuple((n.name, n.address) for n in params.nodes),
    )


def _gpu(node_name: str, index: int, model: str, memory: int) -> Gpu:
    digest = hashlib.sha256(f"{node_name}/{index}".encode()).digest()
    return Gpu(
        model=model,
        memory_mib=memory,
        bus_id=f"0000:{index + 1:02x}:00.0",
        uuid=f"GPU-{uuid.UUID(bytes=digest[:16])}",
    )


def _fake_b64(label: str) -> str:
    return base64.b64encode(hashlib.sha256(label.encode()).digest() * 2).decode()


def talosconfig_text(endpoints: list[str], nodes: list[str]) -> str:
    doc = {
        "context": CLUSTER_NAME,
        "contexts": {
            CLUSTER_NAME: {
                "endpoints": endpoints,
                "nodes": nodes,
                "ca": _fake_b64("ca"),
                "crt": _fake_b64("crt"),
                "key": _fake_b64("key"),
            }
        },
    }
    return yaml.safe_dump(doc, sort_keys=False, indent=4)


def _wrapper(module: str, state_dir: Path, client: Path | None) -> str:
    """A tiny executable bound to this state dir, runnable wherever the library expects the real binary.

    With a compiled ``simtool`` it hands the call to the daemon's tool server (a Go binary's start-up cost
    instead of a Python interpreter's); ``simtool`` itself falls back to ``python -m`` when no server
    listens, so the wrapper works with or without the daemon.
    """
    tool = module.rsplit(".", 1)[-1]
    quote = shlex.quote  # every path is the user's: a ' or $(...) in it must stay data
    head = (
        f"#!/bin/sh\n# simulated {tool} for the cluster in {quote(str(state_dir))}\n"
        f"umask 077\nRUNBOOK_SIM_STATE={quote(str(state_dir))} exec "
    )
    if client is None:
        return f'{head}{quote(sys.executable)} -m {module} "$@"\n'
    name = toolserver.socket_name(state_dir)
    return f'{head}{quote(str(client))} {quote(name)} {quote(sys.executable)} {module} "$@"\n'


def check_state_path(state_dir: Path) -> None:
    """Refuse a state path with a line break or another control character before anything is written.

    The path goes into the ``bin/`` wrappers (a shell script) and into the ``export`` line ``sim up``
    prints for a shell; quoting keeps ``'`` and ``$(...)`` inert, but a line break has no business in it.
    """
    bad = sorted({repr(ch) for ch in str(state_dir) if ord(ch) < 32 or ord(ch) == 127})
    if bad:
        kind = "a line break" if {"\n", "\r"} & set(str(state_dir)) else "a control character"
        raise ValueError(
            f"state directory {str(state_dir)!r} contains {kind} ({', '.join(bad)}); "
            "choose a --state (or RUNBOOK_SIM_STATE) path without control characters"
        )


def _check_replaceable(state_dir: Path) -> None:
    """``create`` replaces ``nodes/`` and the config files: refuse a directory that holds something else.

    A directory from before the marker existed still counts as state when it has ``cluster.json``.
    """
    if not state_dir.exists() and not state_dir.is_symlink():
        return
    legacy = sim_paths(state_dir).cluster.is_file()
    if state_dir.is_dir() and (is_state_dir(state_dir) or legacy or not any(state_dir.iterdir())):
        return
    raise ValueError(
        f"--state {state_dir} is not a simulator state directory (no {MARKER} file) and is not empty: "
        "nothing written; choose a new or empty directory"
    )


def private_dir(path: Path) -> None:
    """Create ``path`` (if needed) readable, writable and enterable by its owner only, whatever the umask.

    The runbook executes ``bin/talosctl`` from the state and trusts the node files: a directory another
    local user can write (umask 000 made them 0777) would let that user run commands as the owner.
    """
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.chmod(0o700)


def write_binaries(state_dir: Path) -> None:
    paths = sim_paths(state_dir)
    private_dir(paths.bin_dir)
    client = toolserver.client_binary()
    for name, module in (("talosctl", "runbook_lib.sim.talosctl"),):
        target = paths.bin_dir / name
        atomic_write(target, _wrapper(module, state_dir.resolve(), client))
        target.chmod(0o700)


def create(state_dir: Path, spec: ClusterSpec) -> list[SimNode]:
    """Write a fresh cluster into ``state_dir`` (replacing any node files there).

    The spec is checked before anything is removed: a bad one leaves the cluster that was there."""
    version = normalize_talos_version(spec.talos_version)
    check_spec(spec)
    paths = sim_paths(state_dir)
    check_state_path(state_dir)
    _check_replaceable(state_dir)
    private_dir(state_dir)
    atomic_write(state_dir / MARKER, MARKER_TEXT)
    if paths.nodes_dir.exists():
        shutil.rmtree(paths.nodes_dir)
    realtalos.forget(state_dir)
    realkube.forget(state_dir)
    private_dir(paths.nodes_dir)
    cp_address = str(FIRST_ADDRESS)
    endpoint = f"https://{cp_address}:6443"
    nodes = _new_nodes(spec, version, endpoint, seed=str(state_dir))
    apply_scenario(spec.scenario, state_dir, nodes)
    for node in nodes:
        save_node(state_dir, node)
    save_cluster(
        state_dir,
        {
            "name": CLUSTER_NAME,
            "talos_version": version,
            "talosctl_version": normalize_talos_version(spec.talosctl_version or version),
            "kubernetes_version": realkube.kubernetes_for_talos(version),
            "endpoint": endpoint,
            "scenario": spec.scenario,
            "nodes": [{"name": n.name, "address": n.address, "role": n.role} for n in nodes],
        },
    )
    atomic_write(paths.talosconfig, talosconfig_text([cp_address], [cp_address]))
    os.chmod(paths.talosconfig, 0o600)
    write_binaries(state_dir)
    return nodes


def check_spec(spec: ClusterSpec) -> None:
    """Worker names for every worker, none at a control plane's address: `runbook sim up` asks before it stops
    a running cluster, `create` before it removes one."""
    if spec.worker_nodes and len(spec.worker_nodes) != spec.workers:
        raise ValueError(f"{spec.workers} workers but {len(spec.worker_nodes)} worker names")
    cp_addresses = {str(FIRST_ADDRESS + i) for i in range(spec.control_planes)}
    clash = [addr for _name, addr in spec.worker_nodes if addr in cp_addresses]
    if clash:
        free = FIRST_ADDRESS + spec.control_planes
        raise ValueError(f"GPU node address {clash[0]} is the simulated control plane's; use {free} and up")


def _new_nodes(spec: ClusterSpec, version: str, endpoint: str, *, seed: str) -> list[SimNode]:
    """The control planes (``talos-cp-N`` from 10.5.0.2) then the workers (``spec.worker_nodes``' names and
    addresses, or ``talos-worker-N`` after the control planes), each with stock ``talosctl gen config``
    machine config of its role and, on workers, ``spec.gpus_per_worker`` GPUs."""
    base = {
        role: machineconfig.worker_config(version, cluster_name=CLUSTER_NAME, endpoint=endpoint, seed=seed)
        for role in ("worker", "controlplane")
    }
    base["controlplane"][0]["machine"]["type"] = "controlplane"
    nodes: list[SimNode] = []
    for i in range(spec.control_planes + spec.workers):
        is_cp = i < spec.control_planes
        role = "controlplane" if is_cp else "worker"
        name = f"talos-cp-{i + 1}" if is_cp else f"talos-worker-{i - spec.control_planes + 1}"
        address = str(FIRST_ADDRESS + i)
        if not is_cp and spec.worker_nodes:
            name, address = spec.worker_nodes[i - spec.control_planes]
        gpus = (
            []
            if is_cp
            else [_gpu(name, g, spec.gpu_model, spec.gpu_memory_mib) for g in range(spec.gpus_per_worker)]
        )
        nodes.append(
            SimNode(
                name=name,
                address=address,
                talos_version=version,
                machine_config=copy.deepcopy(base[role]),
                gpus=gpus,
                latency_ms=spec.latency_ms,
                role=role,
                install_image=machineconfig.installer_image(version),
            )
        )
    return nodes


# ---------------------------------------------------------------- daemon control


@contextlib.contextmanager
def running(state_dir: Path, spec: ClusterSpec, *, daemon: bool = True) -> Iterator[SimPaths]:
    """A simulated cluster for the duration of a block, on the Python talosctl (``benchmarks/bench_fleet.py``:
    its figures are the Python simulator's; ``runbook run`` and ``runbook sim up`` call ``start_talos``)."""
    create(state_dir, spec)
    if daemon:
        start_daemon(state_dir)
    try:
        yield sim_paths(state_dir)
    finally:
        if daemon:
            stop_daemon(state_dir)


def start_talos(
    state_dir: Path, spec: ClusterSpec, nodes: list[SimNode], *, keep: bool = False
) -> realtalos.Choice:
    """The real talosctl against simnode when built and the scenario allows it, else the Python talosctl
    (``realtalos``; ``RUNBOOK_SIM_TALOSCTL`` switches); ``keep``: see ``realtalos.up``."""
    version = normalize_talos_version(spec.talos_version)
    talosctl = normalize_talos_version(spec.talosctl_version) if spec.talosctl_version else None
    return realtalos.up(
        state_dir,
        nodes,
        talos_version=version,
        talosctl_version=talosctl,
        scenario=spec.scenario,
        latency_ms=spec.latency_ms,
        kube=kube_side(state_dir),
        keep=keep,
    )


def kube_side(state_dir: Path) -> str:
    """Which Kubernetes API serves the cluster now: ``real`` (realkube's supervisor runs the real control plane)
    or ``none`` (the Python API server, ``python`` here before, was retired on 2 Dec 2026). ``runbook sim up`` and
    ``runbook run`` start it before the Talos side, whose talosctl choice depends on it (talosctl 1.14's drain,
    ``realtalos.choose``)."""
    return "real" if realkube.supervisor_pid(state_dir) is not None else "none"


def talos_mode() -> str:
    """``RUNBOOK_SIM_TALOSCTL`` checked (``auto``, ``real`` or ``python``): ``sim up`` refuses a bad value before
    anything is written."""
    return realtalos.mode()


def check_talos_fault(state_dir: Path, fault: str) -> None:
    """A fault the Talos side cannot take now is refused (``realtalos.check_switchable``)."""
    realtalos.check_switchable(state_dir, fault)


def sync_talos_faults(state_dir: Path) -> bool:
    """simnode (when it runs this cluster's nodes) takes nodes down or back as their ``unreachable`` fault says."""
    return realtalos.sync_faults(state_dir)


def stop_talos(state_dir: Path) -> bool:
    """Stop the cluster's simnode (``runbook sim down``); True if one was running."""
    return realtalos.stop(state_dir)


def daemon_pid(state_dir: Path) -> int | None:
    """The pid of this state dir's running daemon; None when ``daemon.pid`` is missing or names another process."""
    recorded = pidfile.read(sim_paths(state_dir).pid)
    if recorded is None or not pidfile.is_daemon(recorded[0], recorded[1], state_dir):
        return None
    return recorded[0]


def is_state_dir(state_dir: Path) -> bool:
    """True for a directory ``create`` made (its marker file is there), so deleting it loses no user data."""
    marker = state_dir / MARKER
    return state_dir.is_dir() and not state_dir.is_symlink() and marker.is_file() and not marker.is_symlink()


def foreign_pid(state_dir: Path) -> int | None:
    """A live pid in ``daemon.pid`` that is not this simulator's daemon (stale file, pid reused): left alone."""
    recorded = pidfile.read(sim_paths(state_dir).pid)
    if recorded is None or pidfile.start_time(recorded[0]) is None or daemon_pid(state_dir) is not None:
        return None
    return recorded[0]


def start_daemon(state_dir: Path, timeout: float = 15.0, rooms: list[str] | None = None) -> dict[str, Any]:
    """Start the rooms' HTTP servers and the tool server in one detached process; return its ``endpoints.json``.

    ``rooms`` limits the HTTP rooms (``[]``: the tool server only, what talosctl-only benchmarks need).
    """
    paths = sim_paths(state_dir)
    pid = daemon_pid(state_dir)
    if pid is not None:
        stop_daemon(state_dir)
    with contextlib.suppress(FileNotFoundError):
        paths.endpoints.unlink()
    log = os.fdopen(os.open(paths.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600), "ab")
    os.fchmod(log.fileno(), 0o600)
    proc = subprocess.Popen(
        [sys.executable, "-m", "runbook_lib.sim.daemon", "--state", str(state_dir)]
        + ([] if rooms is None else ["--rooms", ",".join(rooms)]),
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
        start_new_session=True,
        env={**os.environ, "RUNBOOK_SIM_STATE": str(state_dir)},
        umask=0o077,  # what the daemon, its rooms and its tool server create is the owner's only
    )
    log.close()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if paths.endpoints.exists():
            data: dict[str, Any] = json.loads(paths.endpoints.read_text())
            if data.get("pid") == proc.pid:
                return data
        if proc.poll() is not None:
            raise RuntimeError(f"simulator daemon exited with {proc.returncode}; see {paths.log}")
        time.sleep(0.05)
    _stop_unstarted(proc)
    raise RuntimeError(f"simulator daemon did not start within {timeout:.0f}s (stopped it); see {paths.log}")


def _stop_unstarted(proc: subprocess.Popen[bytes]) -> None:
    """Stop a daemon that missed its start timeout, with its children (its own session, so its process group):
    it has not written ``endpoints.json`` yet, so nothing else (``runbook sim down`` included) knows its pid."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=5)
            return
        except subprocess.TimeoutExpired:
            continue


def _terminate(pid: int, started: str | None, state_dir: Path, timeout: float) -> bool:
    """SIGTERM, then SIGKILL after ``timeout``, the daemon ``pid``, and only if it is this state dir's daemon.

    The pid is pinned with a pidfd before it is checked, so the signals reach the process that was checked
    even if it exits and its pid is reused in between.
    """
    try:
        pinned = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    try:
        if not pidfile.is_daemon(pid, started, state_dir):
            return False
        signal.pidfd_send_signal(pinned, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and pidfile.start_time(pid) is not None:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)  # our own child (runbook run, tests) would stay a zombie
            time.sleep(0.05)
        if pidfile.start_time(pid) is not None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(pinned, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        return True
    finally:
        os.close(pinned)


def stop_daemon(state_dir: Path, timeout: float = 10.0) -> bool:
    """Stop the daemon of this state dir by its pid; True if one was running."""
    paths = sim_paths(state_dir)
    recorded = pidfile.read(paths.pid)
    stopped = recorded is not None and _terminate(recorded[0], recorded[1], state_dir, timeout)
    with contextlib.suppress(FileNotFoundError):
        paths.pid.unlink()
    return stopped


def status(state_dir: Path) -> dict[str, Any]:
    """A summary fit for printing: where things are, which daemon runs, and each node's state."""
    paths = sim_paths(state_dir)
    cluster = load_cluster(state_dir)
    endpoints: dict[str, Any] = {}
    if paths.endpoints.exists():
        endpoints = json.loads(paths.endpoints.read_text())
    pid = daemon_pid(state_dir)
    nodes = []
    # As simnode observes them (the real talosctl's upgrades and patches live there); before, the node files
    # the Python talosctl writes, so after a real-talosctl --apply every node still showed the stock schematic.
    for n in realtalos.observed_nodes(state_dir):
        rt = runtime(n)
        nodes.append(
            {
                "name": n.name,
                "address": n.address,
                "role": n.role,
                "talos": n.talos_version,
                "schematic": n.schematic_id[:12],
                "extensions": [e.name for e in n.extensions],
                "gpus": len(n.gpus),
                "driver": rt.driver_version or "-",
                "faults": sorted(n.faults),
            }
        )
    return {
        "state_dir": str(state_dir),
        "talosconfig": str(paths.talosconfig),
        "kubeconfig": str(paths.kubeconfig) if paths.kubeconfig.exists() else None,
        "bin_dir": str(paths.bin_dir),
        "daemon_pid": pid,
        "endpoints": {k: v for k, v in endpoints.items() if not k.endswith("pid")} if pid else {},
        "talos_version": cluster.get("talos_version"),
        "talosctl": choice.reason if (choice := realtalos.recorded(state_dir)) else "Python talosctl",
        "scenario": cluster.get("scenario"),
        "nodes": nodes,
    }
