"""The simulated Kubernetes API's garbage collection at fleet scale.

Deleting an object deletes its dependents (objects whose ``metadata.ownerReferences`` name its uid). The store
found them by scanning every object of every kind on each delete, under the store's lock: with 1,000 GPU nodes
the cuda-test step's 4,000 test pods took 0.5-0.8 s per delete on a loaded 2-core machine
(``benchmarks/bench_whole_change.py``, 1 Dec 2026: 384 deletes in 203 s), so the run never finished. Kubernetes'
garbage collector keeps an ownership graph instead, each owner with its dependents
(kubernetes@v1.35.0:pkg/controller/garbagecollector/graph_builder.go, ``uidToNode`` and ``node.dependents``); so
does the simulator now.
"""

from __future__ import annotations

import time
from typing import Any

from runbook_lib.sim.kubeapi.resources import BY_KEY
from runbook_lib.sim.kubeapi.store import Store

PODS, NODES, DAEMONSETS = BY_KEY["v1/pods"], BY_KEY["v1/nodes"], BY_KEY["apps/v1/daemonsets"]


def pod(name: str, node: str, owner: dict[str, Any] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if owner:
        meta["ownerReferences"] = [
            {
                "apiVersion": "apps/v1",
                "kind": "DaemonSet",
                "name": owner["metadata"]["name"],
                "uid": owner["metadata"]["uid"],
            }
        ]
    return {"metadata": meta, "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]}}


def daemonset(store: Store, name: str) -> dict[str, Any]:
    labels = {"app": name}
    spec = {
        "selector": {"matchLabels": labels},
        "template": {
            "metadata": {"labels": labels},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]},
        },
    }
    return store.create(DAEMONSETS, "kube-system", {"metadata": {"name": name}, "spec": spec})


def test_deleting_1000_test_pods_among_4000_objects_takes_no_scan_of_them_all() -> None:
    store = Store()
    for i in range(1000):
        store.create(NODES, "", {"metadata": {"name": f"gpu-{i:04d}"}})
    for i in range(3000):
        store.create(PODS, "default", pod(f"cuda-{i:04d}", f"gpu-{i % 1000:04d}"))
    started = time.thread_time()  # CPU time of this thread: a loaded machine does not make it longer
    for i in range(1000):
        store.delete(PODS, "default", f"cuda-{i:04d}")
    assert time.thread_time() - started < 3.0  # scanning every object took 15-30 ms of CPU per delete
    assert len(store.objects["v1/pods"]) == 2000


def test_deleting_an_owner_deletes_only_the_dependents_it_still_owns() -> None:
    store = Store()
    owner = daemonset(store, "nvidia-device-plugin")
    store.create(NODES, "", {"metadata": {"name": "gpu-0"}})
    for name in ("plugin-a", "plugin-b", "orphaned"):
        store.create(PODS, "kube-system", pod(name, "gpu-0", owner))
    store.create(PODS, "kube-system", pod("unrelated", "gpu-0"))
    # an update that drops the owner reference: the pod is no longer a dependent
    store.mutate(PODS, "kube-system", "orphaned", lambda o: o["metadata"].pop("ownerReferences"))
    store.delete(DAEMONSETS, "kube-system", "nvidia-device-plugin")
    assert sorted(name for _ns, name in store.objects["v1/pods"]) == ["orphaned", "unrelated"]
