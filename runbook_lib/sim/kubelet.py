"""Controllers, scheduler and one kubelet per simulated Talos node, running in a thread beside the API server.

Everything a pod does here is decided by the Talos state of its node (``state.runtime(node)``): whether the
``nvidia`` runtime handler exists (toolkit extension), whether the driver is loaded (kmod extension + modules
patch + a supported GPU), whether the legacy ``nvidia-container-cli`` hook trips over ``bpf_jit_harden``.
So a runbook that skips a step meets the same symptom it would meet on real hardware, and fixing the node
state (through the simulated ``talosctl``) fixes the pods.

Time is compressed: image pulls and container starts take one tick, crash-loop back-off is capped at a few
seconds, and a change of the node's Talos state restarts back-off at once (as a reboot would).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import logging
import os
import shlex
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from runbook_lib.sim import realtalos
from runbook_lib.sim import state as sim_state
from runbook_lib.sim.kubeapi import nvidia
from runbook_lib.sim.kubeapi.errors import ApiError
from runbook_lib.sim.kubeapi.faults import FaultFile, matches
from runbook_lib.sim.kubeapi.resources import BY_KEY
from runbook_lib.sim.kubeapi.selectors import node_matches_affinity, tolerates
from runbook_lib.sim.kubeapi.store import Store, now

log = logging.getLogger("runbook_lib.sim.kubelet")
PODS = BY_KEY["v1/pods"]
NODES = BY_KEY["v1/nodes"]
EVENTS = BY_KEY["v1/events"]
NAMESPACES = BY_KEY["v1/namespaces"]
DAEMONSETS = BY_KEY["apps/v1/daemonsets"]
DEPLOYMENTS = BY_KEY["apps/v1/deployments"]
JOBS = BY_KEY["batch/v1/jobs"]
RUNTIMECLASSES = BY_KEY["node.k8s.io/v1/runtimeclasses"]
CLUSTERPOLICIES = BY_KEY["nvidia.com/v1/clusterpolicies"]
CONFIGMAPS = BY_KEY["v1/configmaps"]

GPU_RESOURCE = "nvidia.com/gpu"
BACKOFF_START_S = 0.5
BACKOFF_MAX_S = 4.0
RETRY_S = 2.0
IDLE_TICK_S = 1.0
# Talos minor → (containerd, kernel) as the node reports them.
_CONTAINERD = {
    (1, 7): "1.7.16",
    (1, 8): "2.0.0",
    (1, 9): "2.0.1",
    (1, 10): "2.0.5",
    (1, 11): "2.1.4",
    (1, 12): "2.1.5",
    (1, 13): "2.2.1",
    (1, 14): "2.2.3",
}
_KERNEL = {
    (1, 7): "6.6.28-talos",
    (1, 8): "6.6.43-talos",
    (1, 9): "6.12.6-talos",
    (1, 10): "6.12.25-talos",
    (1, 11): "6.12.45-talos",
    (1, 12): "6.12.57-talos",
    (1, 13): "6.18.2-talos",
    (1, 14): "6.18.9-talos",
}
NVIDIA_PCI_LABEL = "feature.node.kubernetes.io/pci-10de.present"


# --- what a container does ----------------------------------------------------------------------------


@dataclass
class Outcome:
    """What a container does once its sandbox exists: run forever, or exit with a code; or fail to start."""

    log: str = ""
    exit_code: int | None = None
    """None: keeps running."""
    start_error: str | None = None
    ready: bool = True
    registers: dict[str, int] = field(default_factory=dict)
    """Device-plugin resources this container registers with the kubelet while it runs."""
    node_labels: dict[str, str] = field(default_factory=dict)
    """Labels a feature-discovery container puts on its node while it runs."""


@dataclass
class NodeView:
    sim: sim_state.SimNode
    rt: sim_state.NodeRuntime
    fingerprint: str


def failing_pull(image: str, sim: sim_state.SimNode, cluster_faults: dict[str, Any]) -> bool:
    """Does pulling ``image`` fail on this node (the ``image_pull_error`` fault: the cluster's or the node's)?"""
    return matches(cluster_faults.get("image_pull_error", False), image) or matches(
        sim.faults.get("image_pull_error", False), image
    )


def cri_pull_error(image: str) -> str:
    """containerd's error for an image the registry does not have ("not found"), as the CRI returns it: the
    ErrImagePull container's waiting message (kubernetes@v1.35.0 pkg/kubelet/images/image_manager.go:410-411)."""
    return (
        f'rpc error: code = NotFound desc = failed to pull and unpack image "{image}": failed to resolve '
        f'reference "{image}": {image}: not found'
    )


def pull_failure(image: str) -> str:
    """The kubelet's Failed event for that pull (image_manager.go:361)."""
    return f'Failed to pull image "{image}": {cri_pull_error(image)}'


def pull_backoff(image: str) -> str:
    """The container's waiting message in ImagePullBackOff: "Back-off pulling image %q" wrapped with the last
    pull's "ErrImagePull: <CRI error>" (image_manager.go:336-348, 362-367, since Kubernetes 1.31); the BackOff
    event keeps the short text."""
    return f'Back-off pulling image "{image}": ErrImagePull: {cri_pull_error(image)}'


def _mtime(path: Path) -> int:
    """A file's mtime in ns, 0 when it does not exist."""
    try:
        return os.stat(path).st_mtime_ns
    except FileNotFoundError:
        return 0


#: The kubelet's Ready condition while its container runtime does not answer: the runtime status sync stops, so
#: after its threshold ``runtimeErrors`` says "container runtime is down" and ``ReadyCondition`` posts it as
#: the message of Ready=False, reason KubeletNotReady (kubernetes@v1.35.0 pkg/kubelet/runtime.go:124,
#: pkg/kubelet/nodestatus/setters.go:505-512). Simplified: after 3 minutes a real kubelet appends
#: "PLEG is not healthy: ..." (runtime.go:128), which no simulated node does.
RUNTIME_DOWN_REASON = "KubeletNotReady"
RUNTIME_DOWN_MESSAGE = "container runtime is down"


def cri_down(rt: sim_state.NodeRuntime) -> bool:
    """containerd's CRI does not load when its default runtime has no definition ("no corresponding runtime
    configured in `containerd.runtimes`", containerd internal/cri/config/config.go ``ValidateRuntimeConfig``),
    e.g. ``default_runtime_name = "nvidia"`` before the toolkit extension brings the ``nvidia`` runtime."""
    return rt.default_runtime not in rt.cri_runtime_handlers


def _cri_down(view: NodeView) -> bool:
    return cri_down(view.rt)


def _ready_condition(unreachable: bool, cri_down: bool) -> dict[str, str]:
    """The node's Ready condition: Unknown when the kubelet stopped posting, False while the CRI is down
    (``RUNTIME_DOWN_MESSAGE``)."""
    if unreachable:
        return {
            "type": "Ready",
            "status": "Unknown",
            "reason": "NodeStatusUnknown",
            "message": "Kubelet stopped posting node status.",
        }
    if cri_down:
        return {
            "type": "Ready",
            "status": "False",
            "reason": RUNTIME_DOWN_REASON,
            "message": RUNTIME_DOWN_MESSAGE,
        }
    return {
        "type": "Ready",
        "status": "True",
        "reason": "KubeletReady",
        "message": "kubelet is posting ready status",
    }


def _gpu_access(view: NodeView, handler: str) -> tuple[bool, str | None, str]:
    """Can a container started with ``handler`` use the GPUs? Returns (visible, start_error, why-not).

    Start errors are the OCI runtime's words when the nvidia hook itself fails; "why-not" is what CUDA or
    NVML inside the container would say.
    """
    if handler != "nvidia":
        return False, None, "CUDA driver version is insufficient for CUDA runtime version"
    rt = view.rt
    legacy = view.sim.minor < (1, 13)
    prefix = (
        "failed to create containerd task: failed to create shim task: OCI runtime create failed: runc create "
        "failed: unable to start container process: error during container init: error running prestart hook #0: "
        "exit status 1, stdout: , stderr: Auto-detected mode as 'legacy'\n"
    )
    if rt.driver_version is None:
        if legacy:
            return (
                False,
                prefix + "nvidia-container-cli: initialization error: nvml error: driver not loaded: unknown",
                "",
            )
        return (
            False,
            "failed to create containerd task: failed to create shim task: OCI runtime create failed: could not "
            "apply required modification to OCI specification: error modifying OCI spec: failed to inject CDI "
            "devices: unresolvable CDI devices nvidia.com/gpu=all: unknown",
            "",
        )
    if rt.toolkit_driver_version and rt.toolkit_driver_version != rt.driver_version:
        return False, None, "Failed to initialize NVML: Driver/library version mismatch"
    if legacy and rt.bpf_jit_harden > 1:
        return (
            False,
            prefix
            + "nvidia-container-cli: mount error: failed to add device rules: unable to generate new device "
            "filter program from existing programs: unable to create new device filters program: load program: "
            "invalid argument: last insn is not an exit or jmp: unknown",
            "",
        )
    return True, None, ""


def _argv(container: dict[str, Any]) -> list[str]:
    return [str(x) for x in (container.get("command") or []) + (container.get("args") or [])]


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: str(e.get("value", "")) for e in container.get("env") or [] if isinstance(e, dict)}


def _shell_script(argv: list[str]) -> str | None:
    if len(argv) >= 3 and argv[0].endswith("sh") and argv[1] in ("-c", "-ec", "-xc"):
        return argv[2]
    return None


def _smi(argv: list[str], view: NodeView) -> str:
    driver = view.rt.driver_version or ""
    if "-L" in argv:
        return nvidia.nvidia_smi_list(view.sim.gpus)
    query = next((a.split("=", 1)[1] for a in argv if a.startswith("--query-gpu=")), None)
    if query:
        fmt = next((a.split("=", 1)[1] for a in argv if a.startswith("--format=")), "csv")
        return nvidia.nvidia_smi_query(driver, view.sim.gpus, query.split(","), "noheader" in fmt)
    return nvidia.nvidia_smi(driver, view.sim.gpus)


def program(
    pod: dict[str, Any], container: dict[str, Any], view: NodeView, handler: str, config_replicas: int
) -> Outcome:
    """Decide what ``container`` of ``pod`` does on this node with this runtime handler."""
    image = str(container.get("image") or "")
    argv = _argv(container)
    env = _env(container)
    visible, start_error, why = _gpu_access(view, handler)
    wants_gpu = handler == "nvidia"
    if wants_gpu and start_error:
        return Outcome(start_error=start_error)
    if "k8s-device-plugin" in image and not any("gpu-feature-discovery" in a for a in argv):
        fail_on_init = env.get("FAIL_ON_INIT_ERROR", "true").lower() != "false"
        ok = visible and bool(view.sim.gpus)
        log = nvidia.device_plugin_log(ok, GPU_RESOURCE, fail_on_init)
        if ok:
            return Outcome(log=log, registers={GPU_RESOURCE: len(view.sim.gpus) * max(config_replicas, 1)})
        return Outcome(log=log, exit_code=1 if fail_on_init else None)
    if "gpu-feature-discovery" in image or any("gpu-feature-discovery" in a for a in argv):
        if not visible:
            return Outcome(
                log="E1129 gpu-feature-discovery: failed to initialize NVML: "
                + (why or "ERROR_LIBRARY_NOT_FOUND")
                + "\n",
                exit_code=1,
            )
        g = view.sim.gpus[0] if view.sim.gpus else None
        labels = {"nvidia.com/gpu.count": str(len(view.sim.gpus)), "nvidia.com/gpu.present": "true"}
        if g:
            labels["nvidia.com/gpu.product"] = g.model.replace(" ", "-")
            labels["nvidia.com/gpu.memory"] = str(g.memory_mib)
        return Outcome(log="I1129 gpu-feature-discovery: Writing labels to output file\n", node_labels=labels)
    if "node-feature-discovery" in image and (
        "worker" in (pod["metadata"].get("name") or "") or "nfd-worker" in argv
    ):
        labels = {NVIDIA_PCI_LABEL: "true"} if view.sim.gpus else {}
        return Outcome(log="I1129 nfd-worker: feature discovery completed\n", node_labels=labels)
    if "nvidia/driver" in image or image.rsplit("/", maxsplit=1)[-1].startswith("driver:"):
        return Outcome(
            log="========== NVIDIA Software Installer ==========\n\nStarting installation of NVIDIA driver\n"
            "Could not resolve Linux kernel version\n",
            exit_code=1,
        )
    if "container-toolkit" in image and "gpu-operator" not in image:
        return Outcome(
            log='time="2026-11-29T00:00:00Z" level=error msg="error running nvidia-toolkit: unable to setup '
            'runtime: unable to write containerd config: open /etc/containerd/config.toml: read-only file system"\n',
            exit_code=1,
        )
    script = _shell_script(argv)
    words = shlex.split(script) if script else argv
    if "vectoradd" in image:
        if visible and view.sim.gpus:
            return Outcome(log=nvidia.VECTORADD_PASS, exit_code=0)
        return Outcome(log=nvidia.vectoradd_fail(why or "no CUDA-capable device is detected"), exit_code=1)
    if words and (words[0] == "nvidia-smi" or words[0].endswith("/nvidia-smi") or "nvidia-smi" in words[:1]):
        if not wants_gpu:
            return Outcome(
                start_error="failed to create containerd task: failed to create shim task: OCI runtime create failed: "
                'runc create failed: unable to start container process: error during container init: exec: "nvidia-smi": '
                "executable file not found in $PATH: unknown"
            )
        if why:
            return Outcome(log=why + "\n", exit_code=9 if "NVML" in why else 255)
        return Outcome(log=_smi(words, view), exit_code=0)
    if "nvidia-smi" in (script or "") and wants_gpu and not why:
        return Outcome(log=_smi(shlex.split(script or "")[1:], view), exit_code=0)
    if words:
        head = words[0].rsplit("/", 1)[-1]
        if head == "echo":
            return Outcome(log=" ".join(words[1:]) + "\n", exit_code=0)
        if head in ("true",):
            return Outcome(exit_code=0)
        if head in ("false",):
            return Outcome(exit_code=1)
        if head == "exit" and len(words) > 1 and words[1].isdigit():
            return Outcome(exit_code=int(words[1]))
        if script and "sleep" not in script and "echo" in script:
            out = [
                seg.strip()[5:].strip().strip("'\"")
                for seg in script.split("&&")
                if seg.strip().startswith("echo ")
            ]
            return Outcome(log="".join(o + "\n" for o in out), exit_code=0)
    return Outcome()


# --- the controllers ----------------------------------------------------------------------------------


@dataclass
class PodRun:
    """Kubelet-private bookkeeping for one pod (by uid)."""

    started: bool = False
    next_try: float = 0.0
    backoff: float = BACKOFF_START_S
    restarts: dict[str, int] = field(default_factory=dict)
    registers: dict[str, int] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    fingerprint: str = ""
    pull_failures: int = 0


def _set_status(st: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
    def apply(o: dict[str, Any]) -> None:
        keep = {k: v for k, v in (o.get("status") or {}).items() if k == "conditions"}
        o["status"] = {**keep, **st}

    return apply


def _add_labels(labels: dict[str, str]) -> Callable[[dict[str, Any]], None]:
    def apply(o: dict[str, Any]) -> None:
        o["metadata"].setdefault("labels", {}).update(labels)

    return apply


def _set_conditions(conditions: list[dict[str, Any]]) -> Callable[[dict[str, Any]], None]:
    def apply(o: dict[str, Any]) -> None:
        o["status"]["conditions"] = conditions

    return apply


def _set_ready(ready: bool) -> Callable[[dict[str, Any]], None]:
    def apply(o: dict[str, Any]) -> None:
        for c in o["status"].get("conditions") or []:
            if c.get("type") in ("Ready", "ContainersReady") and c.get("status") != str(ready):
                c["status"] = "True" if ready else "False"
                c["lastTransitionTime"] = now()
                if ready:
                    c.pop("reason", None)
                    c.pop("message", None)
                else:
                    c["reason"] = "NodeNotReady" if c["type"] == "Ready" else "ContainersNotReady"
        for cs in o["status"].get("containerStatuses") or []:
            cs["ready"] = ready

    return apply


def _owner(obj: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": obj["metadata"]["name"],
        "uid": obj["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _owned_by(obj: dict[str, Any], uid: str) -> bool:
    return any(r.get("uid") == uid for r in obj["metadata"].get("ownerReferences") or [])


def _template_hash(template: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]


def _pod_ready(pod: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


def _gpu_request(pod: dict[str, Any]) -> int:
    total = 0
    for c in pod["spec"].get("containers") or []:
        res = c.get("resources") or {}
        val = (res.get("limits") or {}).get(GPU_RESOURCE) or (res.get("requests") or {}).get(GPU_RESOURCE)
        if val:
            with contextlib.suppress(ValueError):
                total += int(str(val))
    return total


class Controllers:
    """All control loops in one thread: simple to reason about, and one tick sees a consistent store."""

    def __init__(self, store: Store, state_dir: Path, tick_s: float = 0.1) -> None:
        self.store = store
        self.state_dir = Path(state_dir)
        self.tick_s = tick_s
        self.faults = FaultFile(self.state_dir)
        self.views: dict[str, NodeView] = {}
        self._mtimes: dict[str, tuple[int, int]] = {}
        self._cluster_mtime: int | None = None
        self.runs: dict[str, PodRun] = {}
        self._event_index: dict[tuple[str, str, str], tuple[str, str]] = {}
        self._last_event: dict[tuple[str, str], float] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.errors: list[str] = []
        self._names: list[str] = []
        self._fault_key = ""
        self._seen_changes = -1
        self._next_due = 0.0
        self._retry_at: dict[tuple[str, str], float] = {}

    # --- lifecycle -------------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="sim-controllers", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.run_once()
            except Exception as exc:  # a controller bug must not kill the API server
                log.exception("controller tick failed")
                self.errors.append(repr(exc))
                del self.errors[:-20]
            self._stop.wait(self.tick_s)

    def run_once(self) -> None:
        faults = self.faults.read()
        nodes_changed = self._sync_nodes(faults)
        t = time.monotonic()
        if not nodes_changed and self.store.changes == self._seen_changes and t < self._next_due:
            return  # idle: nothing changed and no timer is due, so leave the CPU to the API threads
        self._seen_changes = self.store.changes
        self._daemonsets()
        self._deployments()
        self._jobs()
        self._gpu_operator()
        self._schedule(faults)
        self._kubelets(faults)
        self._node_resources()
        due = [r.next_try for r in self.runs.values() if not r.started]
        due += list(self._retry_at.values())
        self._next_due = min([t + IDLE_TICK_S, *due])

    # --- events ----------------------------------------------------------------------------------------

    def event(
        self,
        obj: dict[str, Any],
        reason: str,
        message: str,
        *,
        warning: bool = False,
        component: str = "kubelet",
        host: str | None = None,
        throttle: float = 0.0,
    ) -> None:
        meta = obj["metadata"]
        ns = meta.get("namespace") or "default"
        key = (meta["uid"], reason, message)
        tkey = (meta["uid"], reason)
        t = time.monotonic()
        if throttle and t - self._last_event.get(tkey, -1e9) < throttle:
            return
        self._last_event[tkey] = t
        ts = now()
        existing = self._event_index.get(key)
        if existing is not None:
            try:
                self.store.mutate(
                    EVENTS,
                    existing[0],
                    existing[1],
                    lambda e: e.update(count=int(e.get("count") or 1) + 1, lastTimestamp=ts),
                )
                return
            except ApiError:
                pass
        name = f"{meta['name']}.{int(time.time() * 1e9) & 0xFFFFFFFFFFFFFF:x}"
        ev: dict[str, Any] = {
            "metadata": {"name": name, "namespace": ns},
            "involvedObject": {
                "apiVersion": obj.get("apiVersion"),
                "kind": obj.get("kind"),
                "name": meta["name"],
                "namespace": meta.get("namespace"),
                "uid": meta["uid"],
                "resourceVersion": meta.get("resourceVersion"),
            },
            "reason": reason,
            "message": message,
            "source": {"component": component, **({"host": host} if host else {})},
            "firstTimestamp": ts,
            "lastTimestamp": ts,
            "count": 1,
            "type": "Warning" if warning else "Normal",
            "reportingComponent": component,
            "reportingInstance": host or "",
        }
        if ev["involvedObject"]["namespace"] is None:
            del ev["involvedObject"]["namespace"]
        try:
            self.store.create(EVENTS, ns, ev)
            self._event_index[key] = (ns, name)
        except ApiError:
            pass

    # --- nodes -----------------------------------------------------------------------------------------

    def _sync_nodes(self, faults: dict[str, Any]) -> bool:
        """Reload node files whose mtime changed and update their Node objects; True when anything changed."""
        paths = sim_state.sim_paths(self.state_dir)
        try:
            cmt = os.stat(paths.cluster).st_mtime_ns
        except FileNotFoundError:
            return False
        if cmt != self._cluster_mtime:
            try:
                cluster = sim_state.load_cluster(self.state_dir)
            except (OSError, ValueError):
                return False
            self._names = [e["name"] for e in cluster.get("nodes", [])]
            self._cluster_mtime = cmt
        names = self._names
        changed: set[str] = set()
        for name in names:
            p = paths.nodes_dir / f"{name}.json"
            # With the real talosctl, simnode's observed file is the node's Talos state (realtalos.with_observed).
            observed = realtalos.observed_file(self.state_dir, name)
            try:
                mt = (os.stat(p).st_mtime_ns, _mtime(observed))
            except FileNotFoundError:
                continue
            if self._mtimes.get(name) == mt and name in self.views:
                continue
            try:
                node = realtalos.with_observed(sim_state.node_from_dict(json.loads(p.read_text())), observed)
            except (OSError, ValueError):
                continue
            self._mtimes[name] = mt
            rt = sim_state.runtime(node)
            fp = json.dumps(
                [
                    node.talos_version,
                    node.schematic_id,
                    node.boot_count,
                    rt.driver_version,
                    sorted(rt.cri_runtime_handlers),
                    rt.default_runtime,
                    rt.bpf_jit_harden,
                    rt.toolkit_driver_version,
                ],
                default=str,
            )
            old = self.views.get(name)
            self.views[name] = NodeView(node, rt, fp)
            changed.add(name)
            if old is not None and (old.fingerprint != fp or old.sim.boot_count != node.boot_count):
                self._node_changed(name, rebooted=old.sim.boot_count != node.boot_count)
        for gone in [n for n in self.views if n not in names]:
            self.views.pop(gone)
            with contextlib.suppress(ApiError):
                self.store.delete(NODES, "", gone)
        # Node objects are rewritten only when their Talos state or the faults changed (or they are missing):
        # rebuilding 1,000 node statuses every tick would starve the API threads.
        fault_key = json.dumps(faults, sort_keys=True, default=str)
        everything = fault_key != self._fault_key
        self._fault_key = fault_key
        upserted = False
        for name in names:
            if name in self.views and (
                everything or name in changed or self.store.peek(NODES, "", name) is None
            ):
                self._upsert_node(self.views[name], faults)
                upserted = True
        return upserted or bool(changed)

    def _node_changed(self, name: str, *, rebooted: bool) -> None:
        """Talos state changed: containers waiting to restart try again now; a reboot restarts everything."""
        items, _ = self.store.list(PODS, field_selector=f"spec.nodeName={name}")
        for pod in items:
            run = self.runs.get(pod["metadata"]["uid"])
            if run is None:
                continue
            run.next_try = 0.0
            run.backoff = BACKOFF_START_S
            if rebooted and pod["status"].get("phase") in ("Running", "Pending"):
                run.started = False
                run.registers = {}

    def _not_ready(self, view: NodeView, faults: dict[str, Any]) -> bool:
        return (
            (not view.sim.reachable)
            or bool(view.sim.faults.get("node_not_ready"))
            or matches(faults.get("node_not_ready", False), view.sim.name)
        )

    def _upsert_node(self, view: NodeView, faults: dict[str, Any]) -> None:
        sim = view.sim
        minor = sim.minor
        kube = sim_state.KUBERNETES_FOR_TALOS.get(f"{minor[0]}.{minor[1]}", "1.34.0")
        machine = sim_state.v1alpha1_doc(sim.machine_config).get("machine") or {}
        labels = {
            "beta.kubernetes.io/arch": "amd64",
            "beta.kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "kubernetes.io/hostname": sim.name,
            "kubernetes.io/os": "linux",
        }
        if sim.role in ("controlplane", "control-plane", "init"):
            labels["node-role.kubernetes.io/control-plane"] = ""
        labels.update({str(k): str(v) for k, v in (machine.get("nodeLabels") or {}).items()})
        taints = [
            {
                "key": str(k),
                "value": str(v).split(":")[0],
                "effect": str(v).split(":")[-1] if ":" in str(v) else "NoSchedule",
            }
            for k, v in (machine.get("nodeTaints") or {}).items()
        ]
        if sim.role in ("controlplane", "control-plane", "init") and not (
            (sim_state.v1alpha1_doc(sim.machine_config).get("cluster") or {}).get(
                "allowSchedulingOnControlPlanes"
            )
        ):
            taints.append({"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"})
        not_ready = self._not_ready(view, faults)
        if not_ready:
            taints += [
                {"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"},
                {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"},
            ]
        elif _cri_down(view):
            taints.append({"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"})
        ready_cond = _ready_condition(not_ready, _cri_down(view))
        capacity = {
            "cpu": "16",
            "memory": "65851340Ki",
            "pods": "110",
            "ephemeral-storage": "488245288Ki",
            "hugepages-2Mi": "0",
        }
        status = {
            "capacity": capacity,
            "allocatable": {**capacity, "cpu": "15950m", "memory": "65224652Ki"},
            "conditions": [
                {
                    "type": "MemoryPressure",
                    "status": "False",
                    "reason": "KubeletHasSufficientMemory",
                    "message": "kubelet has sufficient memory available",
                },
                {
                    "type": "DiskPressure",
                    "status": "False",
                    "reason": "KubeletHasNoDiskPressure",
                    "message": "kubelet has no disk pressure",
                },
                {
                    "type": "PIDPressure",
                    "status": "False",
                    "reason": "KubeletHasSufficientPID",
                    "message": "kubelet has sufficient PID available",
                },
                ready_cond,
            ],
            "addresses": [
                {"type": "InternalIP", "address": sim.address},
                {"type": "Hostname", "address": sim.name},
            ],
            "nodeInfo": {
                "machineID": hashlib.md5(sim.name.encode()).hexdigest(),
                "systemUUID": hashlib.md5(sim.address.encode()).hexdigest(),
                "bootID": hashlib.md5(f"{sim.name}-{sim.boot_count}".encode()).hexdigest(),
                "kernelVersion": _KERNEL.get(minor, "6.12.57-talos"),
                "osImage": f"Talos ({sim.talos_version})",
                "containerRuntimeVersion": f"containerd://{_CONTAINERD.get(minor, '2.1.5')}",
                "kubeletVersion": f"v{kube}",
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        }
        existing = self.store.peek(NODES, "", sim.name)
        if existing is None:
            obj = {
                "metadata": {
                    "name": sim.name,
                    "labels": labels,
                    "annotations": {
                        "talos.dev/owned-labels": json.dumps(sorted(machine.get("nodeLabels") or {}))
                    },
                },
                "spec": {"taints": taints} if taints else {},
                "status": status,
            }
            with contextlib.suppress(ApiError):
                self.store.create(NODES, "", obj)
            return

        def apply(n: dict[str, Any]) -> None:
            n["metadata"].setdefault("labels", {}).update(labels)
            keep = [
                t
                for t in (n.get("spec") or {}).get("taints") or []
                if not t["key"].startswith("node.kubernetes.io/unreachable")
                and t["key"] != "node-role.kubernetes.io/control-plane"
                and t["key"] not in (machine.get("nodeTaints") or {})
            ]
            spec = n.setdefault("spec", {})
            if keep + taints:
                spec["taints"] = keep + taints
            else:
                spec.pop("taints", None)
            old = n.get("status") or {}
            ext = {k: v for k, v in (old.get("capacity") or {}).items() if "/" in k}
            ext_alloc = {k: v for k, v in (old.get("allocatable") or {}).items() if "/" in k}
            n["status"] = copy.deepcopy(status)
            n["status"]["capacity"].update(ext)
            n["status"]["allocatable"].update(ext_alloc)
            for c in n["status"]["conditions"]:
                prev = next((p for p in old.get("conditions") or [] if p.get("type") == c["type"]), None)
                c["lastHeartbeatTime"] = prev.get("lastHeartbeatTime", now()) if prev else now()
                same = prev is not None and prev.get("status") == c["status"]
                c["lastTransitionTime"] = prev.get("lastTransitionTime", now()) if same and prev else now()

        self._update(NODES, "", sim.name, apply)

    def _update(
        self, res: Any, ns: str, name: str, fn: Callable[[dict[str, Any]], None], sub: str | None = None
    ) -> None:
        """Apply ``fn`` and write only when it changed something (writes cost a model validation)."""
        cur = self.store.peek(res, ns, name)
        if cur is None:
            return
        new = copy.deepcopy(cur)
        fn(new)
        if new != cur:
            with contextlib.suppress(ApiError):
                self.store.mutate(res, ns, name, fn, sub)

    def _node_objs(self) -> list[dict[str, Any]]:
        items, _ = self.store.list(NODES)
        return items

    # --- DaemonSets ------------------------------------------------------------------------------------

    def _ds_eligible(self, ds: dict[str, Any], node: dict[str, Any]) -> bool:
        tspec = ds["spec"]["template"].get("spec") or {}
        if not node_matches_affinity(node, tspec):
            return False
        tol = [
            *(tspec.get("tolerations") or []),
            {"key": "node.kubernetes.io/unreachable", "operator": "Exists"},
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists"},
        ]
        return tolerates((node.get("spec") or {}).get("taints"), tol) is None

    def _daemonsets(self) -> None:
        dss, _ = self.store.list(DAEMONSETS)
        if not dss:
            return
        nodes = self._node_objs()
        all_pods, _ = self.store.list(PODS)
        by_owner: dict[str, list[dict[str, Any]]] = {}
        for p in all_pods:
            for r in p["metadata"].get("ownerReferences") or []:
                by_owner.setdefault(r.get("uid", ""), []).append(p)
        for ds in dss:
            meta = ds["metadata"]
            uid = meta["uid"]
            thash = _template_hash(ds["spec"]["template"])
            pods = by_owner.get(uid, [])
            on_node = {p["spec"].get("nodeName"): p for p in pods}
            eligible = [n for n in nodes if self._ds_eligible(ds, n)]
            eligible_names = {n["metadata"]["name"] for n in eligible}
            for p in pods:
                outdated = p["metadata"].get("labels", {}).get("controller-revision-hash") != thash
                if (
                    p["spec"].get("nodeName") not in eligible_names
                    or outdated
                    or p["status"].get("phase") in ("Failed", "Succeeded")
                ):
                    with contextlib.suppress(ApiError):
                        self.store.delete(PODS, meta["namespace"], p["metadata"]["name"])
                        self.event(
                            ds,
                            "SuccessfulDelete",
                            f"Deleted pod: {p['metadata']['name']}",
                            component="daemonset-controller",
                        )
                    on_node.pop(p["spec"].get("nodeName"), None)
            for n in eligible:
                nname = n["metadata"]["name"]
                if nname in on_node:
                    continue
                if time.monotonic() < self._retry_at.get((uid, nname), 0.0):
                    continue
                tmpl = copy.deepcopy(ds["spec"]["template"])
                pmeta = tmpl.setdefault("metadata", {})
                pmeta["generateName"] = meta["name"] + "-"
                pmeta.setdefault("labels", {}).update(
                    {
                        "controller-revision-hash": thash,
                        "pod-template-generation": str(meta.get("generation", 1)),
                    }
                )
                pmeta["ownerReferences"] = [_owner(ds)]
                spec = tmpl.setdefault("spec", {})
                spec["nodeName"] = nname
                tol = spec.setdefault("tolerations", [])
                for key, effect in (
                    ("node.kubernetes.io/not-ready", "NoExecute"),
                    ("node.kubernetes.io/unreachable", "NoExecute"),
                    ("node.kubernetes.io/disk-pressure", "NoSchedule"),
                    ("node.kubernetes.io/memory-pressure", "NoSchedule"),
                    ("node.kubernetes.io/pid-pressure", "NoSchedule"),
                    ("node.kubernetes.io/unschedulable", "NoSchedule"),
                ):
                    tol.append({"key": key, "operator": "Exists", "effect": effect})
                try:
                    pod = self.store.create(PODS, meta["namespace"], {"metadata": pmeta, "spec": spec})
                    self.event(
                        ds,
                        "SuccessfulCreate",
                        f"Created pod: {pod['metadata']['name']}",
                        component="daemonset-controller",
                    )
                    self.event(
                        pod,
                        "Scheduled",
                        f"Successfully assigned {meta['namespace']}/{pod['metadata']['name']} to {nname}",
                        component="default-scheduler",
                    )
                    on_node[nname] = pod
                except ApiError as err:
                    self._retry_at[(uid, nname)] = time.monotonic() + RETRY_S
                    self.event(
                        ds,
                        "FailedCreate",
                        f"Error creating: {err.message}",
                        warning=True,
                        component="daemonset-controller",
                    )
            current = [p for p in on_node.values() if p["spec"].get("nodeName") in eligible_names]
            ready = sum(1 for p in current if _pod_ready(p))
            st = {
                "currentNumberScheduled": len(current),
                "desiredNumberScheduled": len(eligible),
                "numberMisscheduled": 0,
                "numberReady": ready,
                "numberAvailable": ready,
                "updatedNumberScheduled": sum(
                    1
                    for p in current
                    if p["metadata"].get("labels", {}).get("controller-revision-hash") == thash
                ),
                "observedGeneration": meta.get("generation", 1),
            }
            if len(eligible) - ready:
                st["numberUnavailable"] = len(eligible) - ready
            self._update(
                DAEMONSETS,
                meta["namespace"],
                meta["name"],
                _set_status(st),
                "status",
            )

    # --- Deployments and Jobs --------------------------------------------------------------------------

    def _new_pod(
        self, owner: dict[str, Any], extra_labels: dict[str, str], name_prefix: str
    ) -> dict[str, Any] | None:
        meta = owner["metadata"]
        tmpl = copy.deepcopy(owner["spec"]["template"])
        pmeta = tmpl.setdefault("metadata", {})
        pmeta["generateName"] = name_prefix
        pmeta.setdefault("labels", {}).update(extra_labels)
        pmeta["ownerReferences"] = [_owner(owner)]
        try:
            pod = self.store.create(
                PODS, meta["namespace"], {"metadata": pmeta, "spec": tmpl.get("spec") or {}}
            )
        except ApiError as err:
            key = (meta["uid"], "create")
            if time.monotonic() >= self._retry_at.get(key, 0.0):
                self._retry_at[key] = time.monotonic() + RETRY_S
                comp = "job-controller" if owner["kind"] == "Job" else "replicaset-controller"
                self.event(
                    owner, "FailedCreate", f"Error creating: {err.message}", warning=True, component=comp
                )
            return None
        comp = "job-controller" if owner["kind"] == "Job" else "replicaset-controller"
        self.event(owner, "SuccessfulCreate", f"Created pod: {pod['metadata']['name']}", component=comp)
        return pod

    def _deployments(self) -> None:
        deps, _ = self.store.list(DEPLOYMENTS)
        for d in deps:
            meta = d["metadata"]
            thash = _template_hash(d["spec"]["template"])
            pods, _ = self.store.list(PODS, meta["namespace"])
            mine = [p for p in pods if _owned_by(p, meta["uid"])]
            for p in mine:
                if p["metadata"].get("labels", {}).get("pod-template-hash") != thash or p["status"].get(
                    "phase"
                ) in ("Failed", "Succeeded"):
                    with contextlib.suppress(ApiError):
                        self.store.delete(PODS, meta["namespace"], p["metadata"]["name"])
            mine = [
                p
                for p in mine
                if p["metadata"].get("labels", {}).get("pod-template-hash") == thash
                and p["status"].get("phase") not in ("Failed", "Succeeded")
            ]
            want = int(d["spec"].get("replicas", 1))
            for _ in range(want - len(mine)):
                pod = self._new_pod(d, {"pod-template-hash": thash}, f"{meta['name']}-{thash}-")
                if pod is None:
                    break
                mine.append(pod)
            for p in mine[want:]:
                with contextlib.suppress(ApiError):
                    self.store.delete(PODS, meta["namespace"], p["metadata"]["name"])
            mine = mine[:want]
            ready = sum(1 for p in mine if _pod_ready(p))
            available = ready >= want
            st: dict[str, Any] = {
                "observedGeneration": meta.get("generation", 1),
                "replicas": len(mine),
                "updatedReplicas": len(mine),
                "readyReplicas": ready,
                "availableReplicas": ready,
                "conditions": [
                    {
                        "type": "Available",
                        "status": "True" if available else "False",
                        "reason": "MinimumReplicasAvailable" if available else "MinimumReplicasUnavailable",
                        "message": "Deployment has minimum availability."
                        if available
                        else "Deployment does not have minimum availability.",
                    },
                    {
                        "type": "Progressing",
                        "status": "True",
                        "reason": "NewReplicaSetAvailable" if available else "ReplicaSetUpdated",
                        "message": f'ReplicaSet "{meta["name"]}-{thash}" has successfully progressed.'
                        if available
                        else f'ReplicaSet "{meta["name"]}-{thash}" is progressing.',
                    },
                ],
            }
            if want - ready > 0:
                st["unavailableReplicas"] = want - ready
            if not ready:
                st.pop("readyReplicas")
                st.pop("availableReplicas")

            def apply(o: dict[str, Any], st: dict[str, Any] = st) -> None:
                old = {c["type"]: c for c in (o.get("status") or {}).get("conditions") or []}
                for c in st["conditions"]:
                    prev = old.get(c["type"])
                    c["lastUpdateTime"] = c["lastTransitionTime"] = (
                        prev["lastTransitionTime"]
                        if prev and prev.get("status") == c["status"] and prev.get("lastTransitionTime")
                        else now()
                    )
                o["status"] = st

            self._update(DEPLOYMENTS, meta["namespace"], meta["name"], apply, "status")

    def _jobs(self) -> None:
        jobs, _ = self.store.list(JOBS)
        for j in jobs:
            meta, spec = j["metadata"], j["spec"]
            status = j.get("status") or {}
            done = any(
                c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
                for c in status.get("conditions") or []
            )
            if done:
                ttl = spec.get("ttlSecondsAfterFinished")
                if ttl is not None and status.get("completionTime"):
                    fin = (
                        time.mktime(time.strptime(status["completionTime"], "%Y-%m-%dT%H:%M:%SZ"))
                        - time.timezone
                    )
                    if time.time() - fin >= float(ttl):
                        with contextlib.suppress(ApiError):
                            self.store.delete(JOBS, meta["namespace"], meta["name"])
                continue
            if spec.get("suspend"):
                continue
            pods, _ = self.store.list(PODS, meta["namespace"])
            mine = [p for p in pods if _owned_by(p, meta["uid"])]
            succeeded = sum(1 for p in mine if p["status"].get("phase") == "Succeeded")
            failed = sum(1 for p in mine if p["status"].get("phase") == "Failed")
            failed += sum(
                sum(int(cs.get("restartCount") or 0) for cs in p["status"].get("containerStatuses") or [])
                for p in mine
            )
            active = [p for p in mine if p["status"].get("phase") in ("Pending", "Running")]
            completions = int(spec.get("completions") or 1)
            backoff = int(spec.get("backoffLimit") if spec.get("backoffLimit") is not None else 6)
            conditions: list[dict[str, Any]] = []
            ts = now()
            if succeeded >= completions:
                conditions = [
                    {
                        "type": "SuccessCriteriaMet",
                        "status": "True",
                        "reason": "CompletionsReached",
                        "message": "Reached expected number of succeeded pods",
                        "lastProbeTime": ts,
                        "lastTransitionTime": ts,
                    },
                    {
                        "type": "Complete",
                        "status": "True",
                        "reason": "CompletionsReached",
                        "message": "Reached expected number of succeeded pods",
                        "lastProbeTime": ts,
                        "lastTransitionTime": ts,
                    },
                ]
                self.event(j, "Completed", "Job completed", component="job-controller")
            elif failed > backoff:
                conditions = [
                    {
                        "type": "FailureTarget",
                        "status": "True",
                        "reason": "BackoffLimitExceeded",
                        "message": "Job has reached the specified backoff limit",
                        "lastProbeTime": ts,
                        "lastTransitionTime": ts,
                    },
                    {
                        "type": "Failed",
                        "status": "True",
                        "reason": "BackoffLimitExceeded",
                        "message": "Job has reached the specified backoff limit",
                        "lastProbeTime": ts,
                        "lastTransitionTime": ts,
                    },
                ]
                for p in active:
                    with contextlib.suppress(ApiError):
                        self.store.delete(PODS, meta["namespace"], p["metadata"]["name"])
                active = []
                self.event(
                    j,
                    "BackoffLimitExceeded",
                    "Job has reached the specified backoff limit",
                    warning=True,
                    component="job-controller",
                )
            elif not active and succeeded + len(active) < completions:
                pod = self._new_pod(j, {}, f"{meta['name']}-")
                if pod is not None:
                    active.append(pod)
            st: dict[str, Any] = {"startTime": status.get("startTime") or ts, "uncountedTerminatedPods": {}}
            if active:
                st["active"] = len(active)
            st["ready"] = sum(1 for p in active if _pod_ready(p))
            st["terminating"] = 0
            if succeeded:
                st["succeeded"] = succeeded
            if failed:
                st["failed"] = failed
            if conditions:
                st["conditions"] = conditions
                if conditions[-1]["type"] == "Complete":
                    st["completionTime"] = ts

            def apply(o: dict[str, Any], st: dict[str, Any] = st) -> None:
                o["status"] = st

            cur = self.store.peek(JOBS, meta["namespace"], meta["name"])
            if (
                cur is not None
                and {k: v for k, v in (cur.get("status") or {}).items()} != st
                and (
                    conditions
                    or {k: v for k, v in (cur.get("status") or {}).items() if k != "startTime"}
                    != {k: v for k, v in st.items() if k != "startTime"}
                )
            ):
                with contextlib.suppress(ApiError):
                    self.store.mutate(JOBS, meta["namespace"], meta["name"], apply, "status")

    # --- GPU Operator (the operator pod's behaviour) ----------------------------------------------------

    def _gpu_operator(self) -> None:
        policies, _ = self.store.list(CLUSTERPOLICIES)
        if not policies:
            return
        pods, _ = self.store.list(PODS, label_selector="app.kubernetes.io/component=gpu-operator")
        op = next(
            (
                p
                for p in pods
                if _pod_ready(p) and "gpu-operator" in str(p["spec"]["containers"][0].get("image", ""))
            ),
            None,
        )
        if op is None:
            return
        ns = op["metadata"]["namespace"]
        cp = policies[0]
        spec = cp.get("spec") or {}
        # Runtime class the operator owns.
        rc_name = str((spec.get("operator") or {}).get("runtimeClass") or "nvidia")
        if self.store.peek(RUNTIMECLASSES, "", rc_name) is None:
            with contextlib.suppress(ApiError):
                self.store.create(
                    RUNTIMECLASSES,
                    "",
                    {
                        "metadata": {
                            "name": rc_name,
                            "labels": {"app.kubernetes.io/component": "gpu-operator"},
                            "ownerReferences": [_owner(cp) | {"blockOwnerDeletion": True}],
                        },
                        "handler": rc_name,
                    },
                )
        # Node labels: GPU nodes (as NFD found them) get the operator's deploy labels.
        for n in self._node_objs():
            labels = n["metadata"].get("labels") or {}
            if labels.get(NVIDIA_PCI_LABEL) != "true":
                continue
            want = {
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.deploy.device-plugin": "true",
                "nvidia.com/gpu.deploy.gpu-feature-discovery": "true",
                "nvidia.com/gpu.deploy.operator-validator": "true",
                "nvidia.com/gpu.deploy.container-toolkit": "true",
                "nvidia.com/gpu.deploy.driver": "true",
            }
            if any(labels.get(k) != v for k, v in want.items()):
                self._update(
                    NODES,
                    "",
                    n["metadata"]["name"],
                    _add_labels(want),
                )
        operands: list[tuple[str, str, str, bool]] = [
            (
                "nvidia-device-plugin-daemonset",
                "nvcr.io/nvidia/k8s-device-plugin:v0.18.1",
                "nvidia.com/gpu.deploy.device-plugin",
                True,
            ),
            (
                "gpu-feature-discovery",
                "nvcr.io/nvidia/k8s-device-plugin:v0.18.1",
                "nvidia.com/gpu.deploy.gpu-feature-discovery",
                True,
            ),
        ]
        if (spec.get("driver") or {}).get("enabled", True):
            operands.append(
                (
                    "nvidia-driver-daemonset",
                    "nvcr.io/nvidia/driver:580.105.08",
                    "nvidia.com/gpu.deploy.driver",
                    False,
                )
            )
        if (spec.get("toolkit") or {}).get("enabled", True):
            operands.append(
                (
                    "nvidia-container-toolkit-daemonset",
                    "nvcr.io/nvidia/k8s/container-toolkit:v1.18.1-ubuntu20.04",
                    "nvidia.com/gpu.deploy.container-toolkit",
                    False,
                )
            )
        ready_all = True
        for name, image, selector, use_rc in operands:
            ds = self.store.peek(DAEMONSETS, ns, name)
            if ds is None:
                container: dict[str, Any] = {
                    "name": name.replace("-daemonset", "").replace("nvidia-", "") or name,
                    "image": image,
                    "securityContext": {"privileged": True},
                }
                if name == "gpu-feature-discovery":
                    container["command"] = ["gpu-feature-discovery"]
                pod_spec: dict[str, Any] = {
                    "containers": [container],
                    "nodeSelector": {selector: "true"},
                    "priorityClassName": "system-node-critical",
                    "serviceAccountName": name.replace("-daemonset", ""),
                    "tolerations": [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
                    "volumes": [
                        {"name": "device-plugin", "hostPath": {"path": "/var/lib/kubelet/device-plugins"}},
                        {
                            "name": "driver-install-dir",
                            "hostPath": {
                                "path": str(
                                    ((spec.get("hostPaths") or {}).get("driverInstallDir"))
                                    or "/run/nvidia/driver"
                                )
                            },
                        },
                    ],
                }
                if use_rc:
                    pod_spec["runtimeClassName"] = rc_name
                body = {
                    "metadata": {
                        "name": name,
                        "namespace": ns,
                        "labels": {"app": name, "app.kubernetes.io/managed-by": "gpu-operator"},
                        "ownerReferences": [_owner(cp)],
                    },
                    "spec": {
                        "selector": {"matchLabels": {"app": name}},
                        "template": {"metadata": {"labels": {"app": name}}, "spec": pod_spec},
                    },
                }
                with contextlib.suppress(ApiError):
                    self.store.create(DAEMONSETS, ns, body)
                ready_all = False
                continue
            st = ds.get("status") or {}
            if st.get("numberReady", 0) < st.get("desiredNumberScheduled", 0):
                ready_all = False
        state = "ready" if ready_all else "notReady"
        cond = {
            "type": "Ready" if ready_all else "Error",
            "status": "True" if ready_all else "False",
            "reason": "Reconciled" if ready_all else "OperandNotReady",
            "message": ""
            if ready_all
            else "ClusterPolicy is not ready, states not ready: [state-device-plugin]",
        }
        self._update(
            CLUSTERPOLICIES,
            "",
            cp["metadata"]["name"],
            lambda o: o.__setitem__("status", {"namespace": ns, "state": state, "conditions": [cond]}),
            "status",
        )

    # --- scheduler -------------------------------------------------------------------------------------

    def _schedule(self, faults: dict[str, Any]) -> None:
        pending, _ = self.store.list(PODS, field_selector="spec.nodeName=,status.phase=Pending")
        if not pending:
            return
        nodes = self._node_objs()
        all_pods, _ = self.store.list(PODS)
        used: dict[str, int] = {}
        count: dict[str, int] = {}
        for p in all_pods:
            n = p["spec"].get("nodeName")
            if n and p["status"].get("phase") in ("Pending", "Running"):
                used[n] = used.get(n, 0) + _gpu_request(p)
                count[n] = count.get(n, 0) + 1
        for pod in pending:
            ns = pod["metadata"]["namespace"]
            if pod["spec"].get("schedulerName", "default-scheduler") != "default-scheduler":
                continue
            if matches(faults.get("pods_pending", False), ns):
                continue
            want = _gpu_request(pod)
            reasons: dict[str, int] = {}
            fits: list[dict[str, Any]] = []
            for n in nodes:
                nname = n["metadata"]["name"]
                taint = tolerates((n.get("spec") or {}).get("taints"), pod["spec"].get("tolerations"))
                if (n.get("spec") or {}).get("unschedulable"):
                    r = "node(s) were unschedulable"
                elif taint is not None:
                    r = f"node(s) had untolerated taint {{{taint['key']}: {taint.get('value', '')}}}"
                elif not node_matches_affinity(n, pod["spec"]):
                    r = "node(s) didn't match Pod's node affinity/selector"
                elif (
                    want
                    and int(str(((n.get("status") or {}).get("allocatable") or {}).get(GPU_RESOURCE, "0")))
                    - used.get(nname, 0)
                    < want
                ):
                    r = f"Insufficient {GPU_RESOURCE}"
                else:
                    fits.append(n)
                    continue
                reasons[r] = reasons.get(r, 0) + 1
            if not fits:
                total = len(nodes)
                parts = ", ".join(sorted(f"{c} {r}" for r, c in reasons.items()))
                pre_parts = []
                victims = sum(c for r, c in reasons.items() if r.startswith("Insufficient"))
                if total - victims:
                    pre_parts.append(f"{total - victims} Preemption is not helpful for scheduling")
                if victims:
                    pre_parts.append(f"{victims} No preemption victims found for incoming pod")
                msg = f"0/{total} nodes are available: " + (
                    parts + "." if parts else "no nodes available to schedule pods."
                )
                if total:
                    msg += f" preemption: 0/{total} nodes are available: {', '.join(sorted(pre_parts))}."
                cond = {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": msg,
                    "lastProbeTime": None,
                    "lastTransitionTime": now(),
                }
                cur = [c for c in pod["status"].get("conditions") or [] if c.get("type") == "PodScheduled"]
                if not cur or cur[0].get("message") != msg:
                    self._update(
                        PODS,
                        ns,
                        pod["metadata"]["name"],
                        _set_conditions([cond]),
                        "status",
                    )
                self.event(
                    pod, "FailedScheduling", msg, warning=True, component="default-scheduler", throttle=5.0
                )
                continue
            best = min(fits, key=lambda n: (count.get(n["metadata"]["name"], 0), n["metadata"]["name"]))
            bname = best["metadata"]["name"]
            used[bname] = used.get(bname, 0) + want
            count[bname] = count.get(bname, 0) + 1
            with contextlib.suppress(ApiError):
                self.store.mutate(
                    PODS, ns, pod["metadata"]["name"], lambda o, b=bname: o["spec"].__setitem__("nodeName", b)
                )
                self.event(
                    pod,
                    "Scheduled",
                    f"Successfully assigned {ns}/{pod['metadata']['name']} to {bname}",
                    component="default-scheduler",
                )

    # --- kubelets --------------------------------------------------------------------------------------

    def _handler(self, pod: dict[str, Any], view: NodeView) -> str:
        rc_name = pod["spec"].get("runtimeClassName")
        if not rc_name:
            return view.rt.default_runtime
        rc = self.store.peek(RUNTIMECLASSES, "", rc_name)
        return str(rc.get("handler")) if rc else str(rc_name)

    def _config_replicas(self, pod: dict[str, Any]) -> int:
        """Time-slicing replicas from the device plugin's config map (``sharing.timeSlicing``), if any."""
        for v in pod["spec"].get("volumes") or []:
            cm = (v.get("configMap") or {}).get("name")
            if not cm:
                continue
            obj = self.store.peek(CONFIGMAPS, pod["metadata"]["namespace"], cm)
            for text in ((obj or {}).get("data") or {}).values():
                try:
                    cfg = yaml.safe_load(text) or {}
                except yaml.YAMLError:
                    continue
                for r in (((cfg.get("sharing") or {}).get("timeSlicing") or {}).get("resources")) or []:
                    if r.get("name") == GPU_RESOURCE:
                        return int(r.get("replicas") or 1)
        return 1

    def _kubelets(self, faults: dict[str, Any]) -> None:
        pods, _ = self.store.list(PODS)
        live = set()
        tnow = time.monotonic()
        for pod in pods:
            uid = pod["metadata"]["uid"]
            live.add(uid)
            nname = pod["spec"].get("nodeName")
            if not nname or pod["status"].get("phase") in ("Succeeded", "Failed"):
                continue
            view = self.views.get(nname)
            if view is None:
                continue
            run = self.runs.setdefault(uid, PodRun())
            if self._not_ready(view, faults):
                # The node lifecycle controller marks pods of a lost node not ready (MarkPodsNotReady).
                if _pod_ready(pod):
                    self._update(
                        PODS,
                        pod["metadata"]["namespace"],
                        pod["metadata"]["name"],
                        _set_ready(False),
                        "status",
                    )
                continue
            if run.started and pod["status"].get("phase") == "Running" and not _pod_ready(pod):
                running = all(
                    (cs.get("state") or {}).get("running")
                    for cs in pod["status"].get("containerStatuses") or []
                )
                if running and pod["status"].get("containerStatuses"):
                    self._update(
                        PODS,
                        pod["metadata"]["namespace"],
                        pod["metadata"]["name"],
                        _set_ready(True),
                        "status",
                    )
            if view.sim.faults.get("pods_pending"):
                continue
            if run.started or tnow < run.next_try:
                continue
            self._start_pod(pod, view, run, faults)
        for uid in [u for u in self.runs if u not in live]:
            self.runs.pop(uid)

    def _waiting(self, pod: dict[str, Any], reason: str, message: str | None = None) -> None:
        def apply(o: dict[str, Any]) -> None:
            st = o["status"]
            statuses = []
            for c in o["spec"]["containers"]:
                w: dict[str, Any] = {"reason": reason}
                if message:
                    w["message"] = message
                prev: dict[str, Any] = next(
                    (s for s in st.get("containerStatuses") or [] if s["name"] == c["name"]), {}
                )
                statuses.append(
                    {
                        "name": c["name"],
                        "image": c.get("image", ""),
                        "imageID": prev.get("imageID", ""),
                        "ready": False,
                        "restartCount": prev.get("restartCount", 0),
                        "started": False,
                        "state": {"waiting": w},
                        **({"lastState": prev["lastState"]} if prev.get("lastState") else {}),
                    }
                )
            st["containerStatuses"] = statuses
            st["phase"] = "Pending"
            st.setdefault("startTime", now())
            st["hostIP"] = (
                self.views[o["spec"]["nodeName"]].sim.address if o["spec"]["nodeName"] in self.views else ""
            )
            self._conditions(
                st, scheduled=True, ready=False, initialized=True, sandbox=reason != "ContainerCreating"
            )

        self._update(PODS, pod["metadata"]["namespace"], pod["metadata"]["name"], apply, "status")

    @staticmethod
    def _conditions(
        st: dict[str, Any], *, scheduled: bool, ready: bool, initialized: bool, sandbox: bool
    ) -> None:
        old = {c["type"]: c for c in st.get("conditions") or []}
        out = []
        for typ, ok in (
            ("PodReadyToStartContainers", sandbox),
            ("Initialized", initialized),
            ("Ready", ready),
            ("ContainersReady", ready),
            ("PodScheduled", scheduled),
        ):
            s = "True" if ok else "False"
            prev = old.get(typ)
            c = {
                "type": typ,
                "status": s,
                "lastProbeTime": None,
                "lastTransitionTime": prev["lastTransitionTime"]
                if prev and prev.get("status") == s and prev.get("lastTransitionTime")
                else now(),
            }
            if not ok and typ in ("Ready", "ContainersReady"):
                c["reason"] = "ContainersNotReady"
                c["message"] = (
                    "containers with unready status: ["
                    + " ".join(x["name"] for x in st.get("containerStatuses") or [])
                    + "]"
                )
            out.append(c)
        st["conditions"] = out

    def _start_pod(self, pod: dict[str, Any], view: NodeView, run: PodRun, faults: dict[str, Any]) -> None:
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        host = view.sim.name
        handler = self._handler(pod, view)
        if handler not in view.rt.cri_runtime_handlers:
            self._waiting(pod, "ContainerCreating")
            self.event(
                pod,
                "FailedCreatePodSandBox",
                f'Failed to create pod sandbox: rpc error: code = Unknown desc = failed to get sandbox runtime: no runtime for "{handler}" is configured',
                warning=True,
                host=host,
            )
            run.next_try = time.monotonic() + RETRY_S
            return
        # Image pulls.
        for c in pod["spec"]["containers"]:
            image = str(c.get("image") or "")
            if failing_pull(image, view.sim, faults):
                run.pull_failures += 1
                if run.pull_failures == 1:
                    self.event(pod, "Pulling", f'Pulling image "{image}"', host=host)
                    self.event(pod, "Failed", pull_failure(image), warning=True, host=host)
                    self.event(pod, "Failed", "Error: ErrImagePull", warning=True, host=host)
                    self._waiting(pod, "ErrImagePull", cri_pull_error(image))
                else:
                    self.event(pod, "BackOff", f'Back-off pulling image "{image}"', host=host)
                    self.event(pod, "Failed", "Error: ImagePullBackOff", warning=True, host=host)
                    self._waiting(pod, "ImagePullBackOff", pull_backoff(image))
                run.next_try = time.monotonic() + min(BACKOFF_START_S * 2**run.pull_failures, BACKOFF_MAX_S)
                return
        run.pull_failures = 0
        replicas = self._config_replicas(pod)
        outcomes = {c["name"]: program(pod, c, view, handler, replicas) for c in pod["spec"]["containers"]}
        restart_policy = pod["spec"].get("restartPolicy", "Always")
        first = run.restarts == {}
        for c in pod["spec"]["containers"]:
            self.store.clear_log(ns, name, c["name"])
            out = outcomes[c["name"]]
            image = c.get("image", "")
            if first:
                self.event(pod, "Pulled", f'Container image "{image}" already present on machine', host=host)
            if out.start_error:
                self.event(pod, "Failed", f"Error: {out.start_error}", warning=True, host=host)
                continue
            self.event(pod, "Created", f"Created container: {c['name']}", host=host)
            self.event(pod, "Started", f"Started container {c['name']}", host=host)
            if out.log:
                self.store.append_log(ns, name, c["name"], out.log, done=out.exit_code is not None)
            elif out.exit_code is not None:
                self.store.append_log(ns, name, c["name"], "", done=True)
        ts = now()
        any_restart = False
        all_done = all(o.exit_code is not None or o.start_error for o in outcomes.values())
        failed = any((o.exit_code or 0) != 0 or o.start_error for o in outcomes.values())
        statuses = []
        for c in pod["spec"]["containers"]:
            out = outcomes[c["name"]]
            rc = run.restarts.get(c["name"], 0)
            image = str(c.get("image", ""))
            base = {
                "name": c["name"],
                "image": image,
                "imageID": f"{image.split(':')[0]}@sha256:{hashlib.sha256(image.encode()).hexdigest()}",
                "containerID": f"containerd://{hashlib.sha256((name + c['name'] + str(rc)).encode()).hexdigest()}",
                "restartCount": rc,
            }
            code = 128 if out.start_error else out.exit_code
            if code is None:
                statuses.append(
                    {**base, "ready": out.ready, "started": True, "state": {"running": {"startedAt": ts}}}
                )
                continue
            term = {
                "exitCode": code,
                "reason": "StartError" if out.start_error else ("Completed" if code == 0 else "Error"),
                "startedAt": "1970-01-01T00:00:00Z" if out.start_error else ts,
                "finishedAt": ts,
                "containerID": base["containerID"],
            }
            if out.start_error:
                term["message"] = out.start_error
            restart = restart_policy == "Always" or (restart_policy == "OnFailure" and code != 0)
            if restart:
                any_restart = True
                self.event(
                    pod,
                    "BackOff",
                    f"Back-off restarting failed container {c['name']} in pod {name}_{ns}({pod['metadata']['uid']})",
                    warning=True,
                    host=host,
                )
                run.restarts[c["name"]] = rc + 1
                statuses.append(
                    {
                        **base,
                        "restartCount": rc + 1,
                        "ready": False,
                        "started": False,
                        "state": {
                            "waiting": {
                                "reason": "CrashLoopBackOff",
                                "message": f"back-off {int(run.backoff * 10)}s restarting failed container={c['name']} pod={name}_{ns}({pod['metadata']['uid']})",
                            }
                        },
                        "lastState": {"terminated": term},
                    }
                )
            else:
                statuses.append({**base, "ready": False, "started": False, "state": {"terminated": term}})
        registers: dict[str, int] = {}
        labels: dict[str, str] = {}
        for o in outcomes.values():
            if o.exit_code is None and not o.start_error:
                registers.update(o.registers)
                labels.update(o.node_labels)
        run.registers, run.labels = registers, labels
        if any_restart:
            run.next_try = time.monotonic() + run.backoff
            run.backoff = min(run.backoff * 2, BACKOFF_MAX_S)
            phase = "Running"
        else:
            run.started = True
            phase = "Running" if not all_done else ("Failed" if failed else "Succeeded")
        ready = all(s.get("ready") for s in statuses) and phase == "Running"

        def apply(o: dict[str, Any]) -> None:
            st = o["status"]
            st["phase"] = phase
            st["containerStatuses"] = statuses
            st["hostIP"] = view.sim.address
            st["hostIPs"] = [{"ip": view.sim.address}]
            st["podIP"] = st.get("podIP") or f"10.244.{abs(hash(host)) % 250}.{abs(hash(name)) % 250 + 2}"
            st["podIPs"] = [{"ip": st["podIP"]}]
            st.setdefault("startTime", ts)
            self._conditions(
                st, scheduled=True, ready=ready, initialized=True, sandbox=phase in ("Running", "Pending")
            )

        self._update(PODS, ns, name, apply, "status")
        if not any_restart and phase == "Running":
            run.next_try = float("inf")

    def _node_resources(self) -> None:
        """Node allocatable from registered device plugins, and labels from feature discovery."""
        per_node: dict[str, dict[str, int]] = {}
        labels: dict[str, dict[str, str]] = {}
        pods, _ = self.store.list(PODS, field_selector="status.phase=Running")
        for p in pods:
            run = self.runs.get(p["metadata"]["uid"])
            n = p["spec"].get("nodeName")
            if run is None or not n or not run.started:
                continue
            for k, v in run.registers.items():
                per_node.setdefault(n, {})[k] = per_node.get(n, {}).get(k, 0) + v
            labels.setdefault(n, {}).update(run.labels)
        for name in self.views:
            node = self.store.peek(NODES, "", name)
            if node is None:
                continue
            reg = per_node.get(name, {})
            cap = (node.get("status") or {}).get("capacity") or {}
            alloc = (node.get("status") or {}).get("allocatable") or {}
            want_cap = {k: str(v) for k, v in reg.items()}
            # Once registered, a resource stays in capacity; allocatable drops to 0 when its plugin goes away.
            for k in cap:
                if "/" in k and k not in want_cap:
                    want_cap[k] = "0"
            lbl = labels.get(name, {})
            node_labels = node["metadata"].get("labels") or {}
            if all(cap.get(k) == v and alloc.get(k) == v for k, v in want_cap.items()) and all(
                node_labels.get(k) == v for k, v in lbl.items()
            ):
                continue

            def apply(o: dict[str, Any], want: dict[str, str] = want_cap, lbl: dict[str, str] = lbl) -> None:
                o["status"].setdefault("capacity", {}).update(want)
                o["status"].setdefault("allocatable", {}).update(want)
                o["metadata"].setdefault("labels", {}).update(lbl)

            self._update(NODES, "", name, apply)
