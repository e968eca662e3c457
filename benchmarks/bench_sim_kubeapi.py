"""Fleet-scale benchmark of the simulated Kubernetes API: 1,000 GPU nodes stay responsive.

Measures, with the official client through the generated kubeconfig: how long until all Node objects are
registered; list latency with a label selector and a field selector while the controllers run; and how long
the device plugin DaemonSet takes to become Ready on every node with ``nvidia.com/gpu`` allocatable.

Run: ``python -m benchmarks sim_kubeapi`` (or ``make bench``).  Exits 1 when a target is missed.
Targets (2-core machine): nodes registered ≤ 15 s; median list-with-selector ≤ 0.5 s; single GET ≤ 0.01 s;
device plugin Ready on 1,000 nodes ≤ 60 s.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from kubernetes import client, config

from runbook_lib.sim import charts
from runbook_lib.sim.cluster import ClusterSpec, create
from runbook_lib.sim.kubeapi import server
from runbook_lib.sim.state import sim_paths

NODES = 1000
REGISTER_TARGET_S = 15.0
LIST_TARGET_S = 0.5
GET_TARGET_S = 0.01
ROLLOUT_TARGET_S = 60.0


def timed(fn: Callable[[], object], n: int) -> float:
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="bench-kube-") as tmp:
        state = Path(tmp)
        create(state, ClusterSpec(workers=NODES, talos_version="1.12", scenario="gpu-ready"))
        t0 = time.perf_counter()
        srv = server.serve_in_thread(state)
        try:
            api = config.new_client_from_config(config_file=str(sim_paths(state).kubeconfig))
            core, apps, node = client.CoreV1Api(api), client.AppsV1Api(api), client.NodeV1Api(api)
            while len(core.list_node().items) < NODES + 1:
                time.sleep(0.2)
            registered = time.perf_counter() - t0
            list_sel = timed(
                lambda: core.list_node(label_selector="!node-role.kubernetes.io/control-plane"), 10
            )
            list_field = timed(lambda: core.list_node(field_selector="metadata.name=talos-worker-500"), 10)
            get_one = timed(lambda: core.read_node("talos-worker-500"), 20)
            node.create_runtime_class(
                client.V1RuntimeClass(metadata=client.V1ObjectMeta(name="nvidia"), handler="nvidia")
            )
            _, objs = charts.render(
                "nvidia-device-plugin", "0.13.0", {"runtimeClassName": "nvidia"}, "dp", "kube-system"
            )
            t0 = time.perf_counter()
            apps.create_namespaced_daemon_set("kube-system", objs[0])
            rollout = None
            while time.perf_counter() - t0 < ROLLOUT_TARGET_S * 2:
                st = apps.read_namespaced_daemon_set_status("dp-nvidia-device-plugin", "kube-system").status
                if st.desired_number_scheduled == NODES and st.number_ready == NODES:
                    rollout = time.perf_counter() - t0
                    break
                time.sleep(0.5)
            with_gpu = sum(
                1 for n in core.list_node().items if (n.status.allocatable or {}).get("nvidia.com/gpu")
            )
            list_busy = timed(
                lambda: core.list_node(label_selector="!node-role.kubernetes.io/control-plane"), 5
            )
        finally:
            srv.shutdown()
            srv.server_close()
    print(f"{NODES} nodes registered:              {registered:6.2f} s  (target ≤ {REGISTER_TARGET_S:.0f} s)")
    print(f"list nodes, label selector (median): {list_sel:6.3f} s  (target ≤ {LIST_TARGET_S} s)")
    print(f"list nodes, field selector (median): {list_field:6.3f} s")
    print(
        f"get one node (median):               {get_one * 1000:6.1f} ms (target ≤ {GET_TARGET_S * 1000:.0f} ms)"
    )
    shown = f"{rollout:6.2f} s" if rollout is not None else "  never"
    print(
        f"device plugin Ready on {NODES} nodes:   {shown}  (target ≤ {ROLLOUT_TARGET_S:.0f} s); nodes with GPUs: {with_gpu}"
    )
    print(f"list nodes after rollout (median):   {list_busy:6.3f} s")
    ok = (
        registered <= REGISTER_TARGET_S
        and list_sel <= LIST_TARGET_S
        and get_one <= GET_TARGET_S
        and rollout is not None
        and rollout <= ROLLOUT_TARGET_S
        and with_gpu == NODES
    )
    print("OK" if ok else "FAIL: target missed")
    return 0 if ok else 1


if __name__ == "__main__":
    if (rc := main()) != 0:
        sys.exit(rc)
