"""The simulated cluster on the real Kubernetes control plane (issue 15): what ``runbook sim up`` starts.

One supervisor process per state dir (``python -m runbook_lib.sim.realkube --state DIR``) runs, and on
SIGTERM stops, everything that makes the simulated cluster's Kubernetes real:

- ``simkube`` (etcd, kube-apiserver, kube-controller-manager, kube-scheduler of the Kubernetes release the
  nodes' Talos ships, with Talos's admission settings); its admin kubeconfig becomes ``<state>/kubeconfig``;
- a Node object per simulated node, kept Ready (lease heartbeats) and its pods run by kwok;
- the GPU node agent (``nodeagent``): ``nvidia.com/gpu`` from each node's simulated Talos state;
- the simulated GPU Operator controller (``gpuoperator``): the operand DaemonSets of the chart's ClusterPolicy;
- the chart repository (``chartrepo``): our stand-in charts packaged by the real helm, on 127.0.0.1.

``<state>/bin/helm`` and ``bin/kubectl`` become the real clients (helm's repositories and cache kept in the
state dir, so runs never share ``~/.config/helm``), and ``endpoints.json`` gets ``kube`` and ``charts``,
which the library reads as it reads the Image Factory's URL. The nodes' Kubernetes release runs it where
``make kube-tools`` built it, else the nearest built release stands in (``choose``); nothing built is an error
naming what to build. ``RUNBOOK_SIM_KUBE`` is ``real`` or unset: the Python API server that ran where nothing was
built (``RUNBOOK_SIM_KUBE=python``) was retired on 2 Dec 2026.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import os
import select
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runbook_lib.sim import kwokstages, pidfile
from runbook_lib.sim.realtalos import time_factor
from runbook_lib.sim.state import (
    KUBERNETES_FOR_TALOS,
    atomic_write,
    load_cluster,
    load_nodes,
    minor_of,
    normalize_talos_version,
    sim_paths,
    talos_kubeconfig_error_path,
    talos_kubeconfig_path,
)

MODE_ENV = "RUNBOOK_SIM_KUBE"
MODULE = "runbook_lib.sim.realkube"
ROOT = Path(__file__).resolve().parents[2]
KWOK_VERSION = "v0.8.0"
CLIENTS_PACKAGE_VERSION = "2.2.2"  # tools/install-kube-clients.sh: kubectl 1.35.2, helm 4.1.4
log = logging.getLogger(MODULE)
#: How long a start waits for kwok to hold every played node's Lease (``nodeagent.await_leases``): our choice,
#: meant to be generous for 1,000 nodes on a loaded machine (not measured at that size).
LEASES_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Tools:
    """The cached binaries (built by ``make kube-tools``); nothing here builds or downloads."""

    simkube: Path
    kube_bin: Path
    kwok: Path
    stages: Path
    kubectl: Path
    helm: Path


def cache_root() -> Path:
    return Path(os.environ.get("RUNBOOK_TOOLS_CACHE") or Path.home() / ".cache" / "talos-gpu-runbooks")


def simkube_key() -> str:
    """The cache key ``tools/build-simkube.sh`` uses: SHA-256 over ``sha256sum go.mod ./*.go``'s output."""
    src = ROOT / "simkube"
    files = ["go.mod", *sorted(f"./{p.name}" for p in src.glob("*.go"))]
    listing = "".join(f"{hashlib.sha256((src / f).read_bytes()).hexdigest()}  {f}\n" for f in files)
    return hashlib.sha256(listing.encode()).hexdigest()[:16]


#: The Kubernetes release ``make kube-tools`` is asked to build for a minor whose version in the Talos profile
#: (``state.KUBERNETES_FOR_TALOS``) it does not build: Talos 1.14 ships 1.37.0 (talos@v1.14.1
#: pkg/machinery/constants/constants.go:381); tools/build-kube.sh builds v1.37.2 for it. Not because v1.37.0 is
#: missing: the proxy's version list of k8s.io/kubernetes (``go list -m -versions``) is partial here (no v1.35.0 or
#: v1.36.0 either, which build), and ``go mod download k8s.io/kubernetes@v1.37.0`` fetched it on 2 Dec 2026;
#: whether v1.37.0 builds with tools/build-kube.sh was not tried.
BUILT_FOR_MINOR = {"1.37": "v1.37.2"}
KUBE_BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")


def kube_bin(kubernetes_version: str) -> Path:
    """The cached control plane of exactly this release, else the newest cached patch of its minor release.

    Why a patch may stand in: a Kubernetes patch release is the minor's release branch plus cherry-picked fixes
    (kubernetes/sig-release release-engineering/versioning.md: "X.Y.Z, Z > 0 ... Patch releases are released as
    we cherrypick commits into the release-X.Y branch"), so it serves the same API groups, versions and kinds as
    the minor's .0, which is what the runbook and the clients meet. kube-apiserver reports its own patch
    (``kubectl version``); the Nodes keep the profile's kubelet version."""
    root = cache_root() / "kube"
    exact = root / f"v{kubernetes_version.lstrip('v')}" / "bin"
    if all((exact / b).is_file() for b in KUBE_BINARIES):
        return exact
    minor = ".".join(kubernetes_version.lstrip("v").split(".")[:2])
    same = [
        d / "bin"
        for d in root.glob(f"v{minor}.*")
        if d.name.rsplit(".", 1)[-1].isdigit() and all((d / "bin" / b).is_file() for b in KUBE_BINARIES)
    ]
    return max(same, key=lambda b: int(b.parent.name.rsplit(".", 1)[-1]), default=exact)


def kubernetes_for_talos(talos_version: str) -> str:
    """The Kubernetes release the nodes of this Talos release run (``KUBERNETES_FOR_TALOS``; 1.35.0 for a minor
    it does not know): what ``cluster.create`` records and ``choose`` is asked for before anything starts."""
    major, minor = minor_of(normalize_talos_version(talos_version))
    return KUBERNETES_FOR_TALOS.get(f"{major}.{minor}", "1.35.0")


def build_hint(kubernetes_version: str) -> str:
    """What to run to build this release's control plane: ``KUBE_VERSIONS``, as the README and .ci/run say it."""
    version = kubernetes_version.lstrip("v")
    tag = BUILT_FOR_MINOR.get(".".join(version.split(".")[:2]), f"v{version}")
    return f"make kube-tools KUBE_VERSIONS={tag}"


#: The Kubernetes minors each Talos minor supports, oldest and newest: what ``talosctl upgrade-k8s`` checks
#: (siderolabs/talos pkg/machinery/compatibility/kubernetes_version.go ``SupportedWith``; the bounds are
#: ``MinimumKubernetesVersion`` and ``MaximumKubernetesVersion`` (x.y.99: all of minor y) in
#: compatibility/talos13/talos13.go ... talos114/talos114.go), read at each release's tag on 2 Dec 2026: v1.3.7,
#: v1.4.8, v1.5.5, v1.6.7, v1.7.0, v1.8.0, v1.9.0, v1.10.0, v1.11.0, v1.12.0, v1.13.0 and v1.14.0-rc.1 (the newest
#: 1.14 tag of the mirror read). Until then the table said 1.27 for 1.6's oldest, where every 1.6 tag and main say
#: 1.24.0 (where the 27 came from is not known; tests/sim/test_supported_kubernetes.py). The release's support
#: matrix may list fewer,
#: e.g. website/content/v1.4/introduction/support-matrix.md "1.27, 1.26, 1.22" where its code says 1.25.0 (we
#: follow the code).
SUPPORTED_KUBERNETES: dict[str, tuple[int, int]] = {
    "1.3": (24, 26),
    "1.4": (25, 27),
    "1.5": (26, 28),
    "1.6": (24, 29),
    "1.7": (25, 30),
    "1.8": (26, 31),
    "1.9": (27, 32),
    "1.10": (28, 33),
    "1.11": (29, 34),
    "1.12": (30, 35),
    "1.13": (31, 36),
    "1.14": (32, 37),
}
RETIRED = (
    f"{MODE_ENV}=python: the Python Kubernetes API server was retired (2 Dec 2026); unset {MODE_ENV} (or set it "
    "to real) to run the real control plane, which make kube-tools builds"
)


def _tools(kube: Path) -> Tools:
    cache = cache_root()
    kwok = cache / "kwok" / KWOK_VERSION
    clients = cache / "kube-clients" / CLIENTS_PACKAGE_VERSION / "bin"
    simkube = (
        cache / "simkube" / simkube_key() / "simkube" if (ROOT / "simkube").is_dir() else Path("/nonexistent")
    )
    return Tools(
        simkube, kube, kwok / "bin" / "kwok", kwok / "stages.yaml", clients / "kubectl", clients / "helm"
    )


def _missing(tools: Tools) -> list[str]:
    wanted = [tools.simkube, tools.kwok, tools.stages, tools.kubectl, tools.helm]
    wanted += [tools.kube_bin / b for b in KUBE_BINARIES]
    return [str(p) for p in wanted if not p.is_file()]


def find_tools(kubernetes_version: str) -> Tools | str:
    """The cached binaries for this Kubernetes release (``kube_bin``), or why they cannot be used (what to run)."""
    tools = _tools(kube_bin(kubernetes_version))
    missing = _missing(tools)
    if missing:
        return f"not built: {', '.join(missing)} ({build_hint(kubernetes_version)})"
    return tools


def _release(name: str) -> tuple[int, int, int] | None:
    parts = name.lstrip("v").split(".")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        return None
    return int(parts[0]), int(parts[1]), int(parts[2])


def built_releases() -> list[str]:
    """The Kubernetes releases whose control plane is in the cache (``v1.35.0``...), oldest first."""
    found = [
        (release, d.name)
        for d in (cache_root() / "kube").glob("v*")
        if (release := _release(d.name)) and all((d / "bin" / b).is_file() for b in KUBE_BINARIES)
    ]
    return [name for _, name in sorted(found)]


def nearest_release(kubernetes_version: str) -> str | None:
    """The built release nearest to this one: itself, else its minor's newest built patch, else the nearest minor
    (on a tie the newer), else None."""
    wanted = _release(kubernetes_version)
    if wanted is None:
        return None

    def distance(name: str) -> tuple[int, int, int, int]:
        major, minor, patch = _release(name) or (0, 0, 0)
        apart = abs(major - wanted[0]) * 1000 + abs(minor - wanted[1])
        return (int((major, minor, patch) != wanted), apart, -minor, -patch)

    return min(built_releases(), key=distance, default=None)


def requested(env: dict[str, str] | None = None) -> str:
    """``RUNBOOK_SIM_KUBE``: ``real``, ``python`` (retired: ``check_mode`` refuses it) or ``""`` (unset: the real
    control plane); anything else is an error naming the variable, raised before anything is written."""
    value = (os.environ if env is None else env).get(MODE_ENV, "")
    if value not in ("", "real", "python"):
        raise ValueError(
            f"{MODE_ENV}={value!r} is not a choice: use real (the real control plane) or leave it unset"
        )
    return value


def check_mode(env: dict[str, str] | None = None) -> None:
    """``RUNBOOK_SIM_KUBE`` refused, before anything is written, unless it is ``real`` or unset."""
    if requested(env) == "python":
        raise ValueError(RETIRED)


def choose(kubernetes_version: str, env: dict[str, str] | None = None) -> Tools:
    """The tools of the real control plane of the nodes' Kubernetes release, else of the nearest built release
    standing in for it (``nearest_release``; ``plane_summary`` says so). Why a stand-in rather than the Python API
    server, retired on 2 Dec 2026: a real kube-apiserver of a near release answers the runbook as a real cluster
    does, where the Python one only imitated it.

    Nothing built, ``RUNBOOK_SIM_KUBE=python`` or any value but ``real``/unset: a ValueError naming what is missing
    and what to run (exit 2 through PermanentError; callers ask before anything starts).
    """
    check_mode(env)
    found = find_tools(kubernetes_version)
    if isinstance(found, Tools):
        return found
    stand_in = nearest_release(kubernetes_version)
    if stand_in is not None:
        tools = _tools(kube_bin(stand_in))
        if not _missing(tools):
            return tools
        found = f"not built: {', '.join(_missing(tools))} ({build_hint(kubernetes_version)})"
    go = shutil.which("go") or Path("/usr/local/go/bin/go").is_file()
    needs = "" if go else "; make kube-tools needs Go (not on PATH nor in /usr/local/go/bin) and npm"
    prefix = (
        f"{MODE_ENV}=real but the control plane" if requested(env) == "real" else "the real control plane"
    )
    raise ValueError(f"{prefix} is {found}{needs}")


def plane_summary(kubernetes: str, talos: str, release: str) -> str:
    """Which control plane serves the nodes' Kubernetes ``kubernetes`` (shipped by Talos ``talos``): ``release``
    itself, its patch release, or a stand-in of another minor and whether Talos supports that one
    (``SUPPORTED_KUBERNETES``). What ``sim up``, ``sim status`` and ``runbook run`` print."""
    wanted = f"v{kubernetes.lstrip('v')}"
    if release == wanted:
        return f"real control plane {wanted}"
    if release.rsplit(".", 1)[0] == wanted.rsplit(".", 1)[0]:
        return f"real control plane {wanted} on its patch release {release}"
    talos_minor = ".".join(talos.lstrip("v").split(".")[:2])
    low, high = SUPPORTED_KUBERNETES.get(talos_minor, (0, 0))
    where = "inside" if low <= (_release(release) or (0, 0, 0))[1] <= high else "outside"
    return (
        f"real control plane {release} standing in for {wanted}, which Talos {talos} ships (not built: "
        f"{build_hint(kubernetes)}; {where} the Kubernetes 1.{low}-1.{high} Talos {talos_minor} supports)"
    )


# ---------------------------------------------------------------- the parent's side: start, stop, status


def _paths(state_dir: Path) -> dict[str, Path]:
    return {
        "pid": state_dir / "realkube.pid",
        "info": state_dir / "realkube.json",
        "log": state_dir / "realkube.log",
        "logs": state_dir / "logs",
        "kube": state_dir / "kube",
        "charts": state_dir / "charts",
        "charts_mirror": state_dir / "charts-mirror",
        "helm_home": state_dir / "helm",
        "stages": state_dir / "kwok-stages.yaml",
    }


def forget(state_dir: Path) -> None:
    """A new cluster (``cluster.create``): its control plane starts from an empty etcd, not the earlier one's.

    What simkube keeps beside etcd stays: its CA, tokens, API server port and service-account issuer and key, as
    a Talos cluster re-created from the same machine-config secrets keeps its endpoint (``cluster.ca``,
    ``cluster.serviceAccount``, ``cluster.controlPlane.endpoint``), so a kubeconfig a user saved from an earlier
    ``runbook sim up`` of this state dir keeps working. A directory simkube never finished writing (no
    ``simkube-state.json``) would be refused on start, so it goes whole."""
    kube = _paths(state_dir)["kube"]
    if (kube / "simkube-state.json").is_file():
        shutil.rmtree(kube / "etcd", ignore_errors=True)
    else:
        shutil.rmtree(kube, ignore_errors=True)


def write_clients(state_dir: Path, tools: Tools) -> None:
    """``bin/helm`` and ``bin/kubectl`` run the real clients; helm keeps its repositories in the state dir."""
    bin_dir = sim_paths(state_dir).bin_dir
    home = _paths(state_dir)["helm_home"]
    quote = shlex.quote
    helm_env = " ".join(
        f"HELM_{kind}_HOME={quote(str(home / kind.lower()))}" for kind in ("CONFIG", "CACHE", "DATA")
    )
    scripts = {
        "helm": f'#!/bin/sh\nexport {helm_env}\nexec {quote(str(tools.helm))} "$@"\n',
        "kubectl": f'#!/bin/sh\nexec {quote(str(tools.kubectl))} "$@"\n',
    }
    for name, text in scripts.items():
        atomic_write(bin_dir / name, text)
        (bin_dir / name).chmod(0o700)


def supervisor_pid(state_dir: Path) -> int | None:
    """The live supervisor of this state dir (pid, start time and command line checked), else None."""
    recorded = pidfile.read(_paths(state_dir)["pid"])
    if recorded is None or not _is_supervisor(recorded[0], recorded[1], state_dir):
        return None
    return recorded[0]


def _is_supervisor(pid: int, started: str | None, state_dir: Path) -> bool:
    if pidfile.start_time(pid) is None or (started is not None and pidfile.start_time(pid) != started):
        return False
    try:
        argv = [os.fsdecode(a) for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")]
    except OSError:
        return False
    if MODULE not in argv or "--state" not in argv[:-1]:
        return False
    return os.path.realpath(argv[argv.index("--state") + 1]) == os.path.realpath(state_dir)


def start(state_dir: Path, tools: Tools, timeout: float = 240.0) -> dict[str, Any]:
    """Start the supervisor detached and wait until it published ``realkube.json``; its contents.

    A supervisor that fails stops what it started; its log's tail is in the error."""
    paths = _paths(state_dir)
    stop(state_dir)
    write_clients(state_dir, tools)
    paths["info"].unlink(missing_ok=True)
    with open(os.open(paths["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", MODULE, "--state", str(state_dir)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,
            umask=0o077,
        )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(FileNotFoundError, ValueError):
            info: dict[str, Any] = json.loads(paths["info"].read_text())
            if info.get("pid") == proc.pid:
                return info
        if proc.poll() is not None:
            raise RuntimeError(f"the real control plane did not start: {_tail(paths['log'])}")
        time.sleep(0.2)
    stop(state_dir)
    raise RuntimeError(f"the real control plane did not start within {timeout:.0f}s; see {paths['log']}")


def _tail(path: Path, lines: int = 8) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return f"(no log at {path})"
    return " | ".join(text[-lines:]) + f" (log: {path})"


def stop(state_dir: Path, timeout: float = 90.0) -> bool:
    """SIGTERM this state dir's supervisor and wait until it stopped everything; True if one was running."""
    pid = supervisor_pid(state_dir)
    if pid is None:
        _paths(state_dir)["pid"].unlink(missing_ok=True)
        return False
    pinned = os.pidfd_open(pid)
    try:
        signal.pidfd_send_signal(pinned, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and pidfile.start_time(pid) is not None:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)  # our own child (tests) would stay a zombie
            time.sleep(0.1)
        if pidfile.start_time(pid) is not None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(pinned, signal.SIGKILL)
    finally:
        os.close(pinned)
    _paths(state_dir)["pid"].unlink(missing_ok=True)
    return True


def start_servers(state_dir: Path) -> dict[str, Any]:
    """The simulator daemon (Image Factory, tool server) and the real control plane (``choose``: the nodes'
    release or the nearest built one); the endpoints. What `runbook sim up` and `runbook run` start; a failed
    start, or one interrupted (Ctrl-C: before, the daemon and a half-started control plane stayed up), stops
    what started, and nothing starts when no control plane is built (ValueError)."""
    from runbook_lib.sim import cluster  # noqa: PLC0415 - cluster's own imports would be circular

    tools = choose(str(load_cluster(state_dir)["kubernetes_version"]))
    endpoints = cluster.start_daemon(state_dir)
    try:
        info = start(state_dir, tools)
    except BaseException:  # a failed start, or a Ctrl-C while it waits: neither half outlives the call
        stop(state_dir)
        cluster.stop_daemon(state_dir)
        raise
    return endpoints | {k: info[k] for k in ("kube", "charts", "charts_mirror")}


def summary(state_dir: Path) -> str:
    """``plane_summary`` of this state dir's cluster: the release its supervisor started (``realkube.json``),
    else the one ``choose`` would take now."""
    cluster = load_cluster(state_dir)
    kubernetes = str(cluster.get("kubernetes_version", "?"))
    try:
        release = str(json.loads(_paths(state_dir)["info"].read_text()).get("kube_release") or "")
    except (OSError, ValueError):
        release = ""
    release = release or nearest_release(kubernetes) or f"v{kubernetes}"
    return plane_summary(kubernetes, str(cluster.get("talos_version", "?")), release)


def describe(state_dir: Path) -> str:
    """One line for ``runbook sim status``: which Kubernetes serves this cluster, its components and versions."""
    pid = supervisor_pid(state_dir)
    if pid is None:
        return "not running (runbook sim up starts the real control plane)"
    try:
        info = json.loads(_paths(state_dir)["info"].read_text())
        plane = summary(state_dir)
    except (OSError, ValueError):
        return f"real control plane starting (supervisor pid {pid})"
    alive = [name for name, p in info.get("components", {}).items() if pidfile.start_time(int(p)) is not None]
    return (
        f"{plane} (supervisor pid {pid}: {', '.join(alive) or 'no component running'}; "
        f"kwok {KWOK_VERSION}; GPU node agent; simulated GPU Operator v26.3.3 controller for the gpu-operator "
        f"chart; kubectl 1.35.2 and helm 4.1.4 in bin/; logs in {_paths(state_dir)['logs']})"
    )


# ---------------------------------------------------------------- the supervisor


def _daemon_gone(state_dir: Path) -> Callable[[], bool]:
    """A check that the simulator daemon running now (whose ``sim up`` started this supervisor) has stopped.

    Why: ``runbook run`` and anything else that stops or replaces the daemon know nothing of this process;
    following the daemon means nothing of the real control plane outlives the simulator it belongs to."""
    recorded = pidfile.read(sim_paths(state_dir).pid)
    if recorded is None or not pidfile.is_daemon(recorded[0], recorded[1], state_dir):
        return lambda: False
    pid, started = recorded
    return lambda: not pidfile.is_daemon(pid, started, state_dir)


#: simkube's mark of a state directory whose first start finished (simkube/state.go ``stateMark``).
SIMKUBE_MARK = "simkube-state.json"


def _start_simkube(
    state_dir: Path, tools: Tools, logs: Path, kubelet_proxy: Path
) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    """:func:`_start_simkube_once`, again once when a component lost its port: simkube asks the kernel for free
    ports and its components bind them a moment later, so another process can take one in between (simkube/
    supervise.go ``freePorts``); a CI run failed so ("bind: address already in use", CI105, stop 53). A first
    start that failed leaves a state directory without simkube's mark, which simkube refuses to resume: it is
    emptied for the second try."""
    kube = _paths(state_dir)["kube"]
    fresh = not (kube / SIMKUBE_MARK).exists()
    try:
        return _start_simkube_once(state_dir, tools, logs, kubelet_proxy)
    except RuntimeError as exc:
        if "bind: address already in use" not in str(exc):
            raise
    if fresh:
        shutil.rmtree(kube, ignore_errors=True)
    return _start_simkube_once(state_dir, tools, logs, kubelet_proxy)


def _start_simkube_once(
    state_dir: Path, tools: Tools, logs: Path, kubelet_proxy: Path
) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    """simkube on ``<state>/kube``; the JSON line it prints when ready. A restart resumes the cluster an earlier
    start left there (etcd, PKI, tokens), as a real control plane does; ``forget`` empties it for a new one."""
    kube = _paths(state_dir)["kube"]
    err = open(os.open(logs / "simkube.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w")  # noqa: SIM115
    proc = subprocess.Popen(
        [
            str(tools.simkube),
            "--state",
            str(kube),
            "--bin",
            str(tools.kube_bin),
            "--kubelet-proxy-socket",
            str(kubelet_proxy),
            "--cluster-name",
            str(load_cluster(state_dir).get("name") or "simkube"),
        ],
        stdout=subprocess.PIPE,
        stderr=err,
        text=True,
    )
    err.close()
    assert proc.stdout is not None
    readable, _, _ = select.select([proc.stdout], [], [], 180)
    line = proc.stdout.readline() if readable else ""
    if not line:
        proc.kill()
        proc.wait()
        raise RuntimeError(f"simkube did not start: {_tail(logs / 'simkube.log')}")
    return proc, json.loads(line)


def _start_kwok(tools: Tools, kubeconfig: Path, logs: Path, stages: Path) -> subprocess.Popen[bytes]:
    """kwok for every node whose kubelet runs (``nodeagent.KUBELET_LABEL``, which the agent takes off while the
    node is down), renewing each node's Lease as a kubelet does (``nodeLeaseDurationSeconds`` 40, the kubelet's
    default: kubernetes@v1.35.0 pkg/kubelet/apis/config/v1beta1/defaults.go). Without renewals the node
    lifecycle controller marks the node Unknown, and its pods not ready, once ``--node-monitor-grace-period``
    (50 s, pkg/controller/nodelifecycle/config/v1alpha1/defaults.go) passes. A label, not an annotation: kwok
    filters annotations on its side and so never sees a node leave (sigs.k8s.io/kwok@v0.8.0
    pkg/utils/informer/informer.go), while a label selector makes the API server send it a deletion, on which
    kwok stops renewing the node's Lease (pkg/kwok/controllers/node_controller.go, ``onNodeUnmanagedFunc``).
    Its stages: ``write_stages``."""
    from runbook_lib.sim.nodeagent import KUBELET_LABEL, KUBELET_RUNNING  # noqa: PLC0415 - the Kubernetes client is slow to import

    out = open(os.open(logs / "kwok.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb")  # noqa: SIM115
    with out:
        return subprocess.Popen(
            [
                str(tools.kwok),
                "--kubeconfig",
                str(kubeconfig),
                "--config",
                str(stages),
                f"--manage-nodes-with-label-selector={KUBELET_LABEL}={KUBELET_RUNNING}",
                "--node-lease-duration-seconds=40",
            ],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
        )


def write_stages(state_dir: Path, tools: Tools) -> Path:
    """``<state>/kwok-stages.yaml``: kwok's Node stages and our pod stages, their delays scaled by the Talos
    side's time factor (``RUNBOOK_SIM_TIME_SCALE``), so pods start and end on the simulator's clock."""
    return kwokstages.write(_paths(state_dir)["stages"], tools.stages, time_factor())


def write_talos_kubeconfig(state_dir: Path, ready: dict[str, Any], url: str) -> None:
    """The admin kubeconfig with Talos's structure (client certificate, no token) that simkube wrote, its server
    the user's relay ``url``, at ``talos_kubeconfig_path`` (0600), where simnode hands it out to talosctl 1.14's
    drain, which refuses the token one (talos@v1.14.1 pkg/kubeconfig/validate.go:29). Else why not, at
    ``talos_kubeconfig_error_path`` (``realtalos.choose`` gives it as the reason), and no stale kubeconfig."""
    path, why = talos_kubeconfig_path(state_dir), talos_kubeconfig_error_path(state_dir)
    if not ready.get("talos_kubeconfig"):
        path.unlink(missing_ok=True)
        atomic_write(why, f"simkube: {ready.get('talos_kubeconfig_error') or 'no Talos-shaped kubeconfig'}\n")
        return
    config = json.loads(Path(ready["talos_kubeconfig"]).read_text())
    for entry in config["clusters"]:
        entry["cluster"]["server"] = url
    atomic_write(path, json.dumps(config, indent=1))
    path.chmod(0o600)
    why.unlink(missing_ok=True)


def _publish(state_dir: Path, info: dict[str, Any]) -> None:
    """``realkube.json`` (what ``start`` waits for) and ``kube``/``charts``/``charts_mirror`` in
    ``endpoints.json``."""
    endpoints_file = sim_paths(state_dir).endpoints
    with contextlib.suppress(FileNotFoundError, ValueError):
        endpoints = json.loads(endpoints_file.read_text())
        endpoints |= {k: info[k] for k in ("kube", "charts", "charts_mirror")}
        atomic_write(endpoints_file, json.dumps(endpoints, indent=1))
    atomic_write(_paths(state_dir)["info"], json.dumps(info, indent=1))


def _stop_process(proc: subprocess.Popen[Any], timeout: float) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def _running(state_dir: Path, tools: Tools) -> Iterator[dict[str, Any]]:
    """Everything started in order; on exit (or a failed start) stopped in reverse order."""
    # Imported here: the Kubernetes client costs ~0.4 s, which every `runbook` command would pay otherwise.
    from runbook_lib.sim import (  # noqa: PLC0415
        chartrepo,
        gpuoperator,
        kubeletapi,
        kubesystem,
        latencyproxy,
        nodeagent,
    )

    paths = _paths(state_dir)
    paths["logs"].mkdir(mode=0o700, exist_ok=True)
    with contextlib.ExitStack() as stack:
        pki = paths["kube"] / "pki"  # simkube's own serving certificate, written once it starts
        logs = kubeletapi.Logs()
        proxy = kubeletapi.KubeletProxy(
            state_dir / "kubelet.sock", pki / "apiserver.crt", pki / "apiserver.key", logs
        )
        proxy.start()
        stack.callback(proxy.stop)
        simkube, ready = _start_simkube(state_dir, tools, paths["logs"], proxy.socket_path)
        stack.callback(_stop_process, simkube, 60)
        # The user's kubeconfig goes through the relay (the network a test may slow: ``api_latency_ms``); the
        # simulated cluster's own components use simkube's, straight to kube-apiserver.
        relay = latencyproxy.serve_for_users(state_dir, Path(ready["kubeconfig"]), ready["server"])
        stack.callback(relay.stop)
        write_talos_kubeconfig(state_dir, ready, relay.url)
        kubeconfig = Path(ready["kubeconfig"])
        core = nodeagent.api(kubeconfig)
        kubernetes = str(load_cluster(state_dir)["kubernetes_version"])
        nodeagent.register(core, load_nodes(state_dir), kubernetes)
        kubesystem.apply(core.api_client, kubernetes)  # what Talos's manifest controller applies
        nodeagent.release_leases(core)  # the last start's kwok held them: the new one takes over at once
        kwok = _start_kwok(tools, kubeconfig, paths["logs"], write_stages(state_dir, tools))
        stack.callback(_stop_process, kwok, 30)
        if missing := nodeagent.await_leases(core, LEASES_TIMEOUT_S):
            log.warning("kwok holds no Lease for %s after %s s: their pods wait", missing, LEASES_TIMEOUT_S)
        log.info("pods left waiting for kwok, looked at again: %d", nodeagent.nudge_pods(core))
        repo = chartrepo.serve(tools.helm, paths["charts"], paths["logs"] / "charts.log")
        stack.callback(repo.stop)
        mirror = chartrepo.serve_mirror(
            tools.helm, repo, paths["charts_mirror"], paths["logs"] / "charts-mirror.log"
        )
        stack.callback(mirror.stop)
        # The simulated GPU Operator runs on every cluster, as the chart's operator would once installed: it does
        # nothing until a ClusterPolicy exists and the operator pod is Ready (nodes may reach Talos 1.13 mid-run).
        operator = gpuoperator.GpuOperator(state_dir, kubeconfig, logs)
        agent = nodeagent.NodeAgent(state_dir, kubeconfig, logs, admits=operator.admits)
        agent.start()
        stack.callback(agent.stop)
        operator.start()
        stack.callback(operator.stop)
        yield {
            "pid": os.getpid(),
            "kube": relay.url,
            "charts": repo.url,
            "charts_mirror": mirror.url,
            "components": ready["pids"],
            "kube_release": tools.kube_bin.parent.name,
        }


def serve(state_dir: Path) -> int:
    """The supervisor's main: start everything, publish, wait for SIGTERM/SIGINT, stop everything."""
    kubernetes = str(load_cluster(state_dir).get("kubernetes_version", "1.35.0"))
    tools = choose(kubernetes, {MODE_ENV: "real"})  # raises without the binaries
    stop_event = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda _s, _f: stop_event.set())
    pidfile.write(_paths(state_dir)["pid"])
    daemon_gone = _daemon_gone(state_dir)
    try:
        with _running(state_dir, tools) as info:
            _publish(state_dir, info)
            log.info("real control plane up: %s", {k: v for k, v in info.items() if k != "components"})
            while not stop_event.wait(1.0):
                if daemon_gone():
                    log.info("the simulator daemon stopped: stopping the real control plane")
                    break
    finally:
        _paths(state_dir)["info"].unlink(missing_ok=True)
    log.info("real control plane stopped")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}")
    parser.add_argument("--state", required=True, type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    return serve(args.state.resolve())


if __name__ == "__main__":
    sys.exit(main())
