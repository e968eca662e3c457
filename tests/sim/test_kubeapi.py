"""The simulated kube-apiserver, driven only through the official client 37 and a generated kubeconfig."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import urllib3
import yaml
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

from runbook_lib.sim import cluster
from runbook_lib.sim.kubeapi import server
from runbook_lib.sim.state import KUBERNETES_FOR_TALOS, save_cluster_faults, sim_paths
from tests.sim import waiting


class Sim:
    def __init__(self, state: Path, srv: server.KubeServer) -> None:
        self.state = state
        self.srv = srv
        self.kubeconfig = sim_paths(state).kubeconfig
        cert = state / "kube" / "apiserver.crt"
        self.ca: str | bool = str(cert) if srv.url.startswith("https") else True
        self.api = config.new_client_from_config(config_file=str(self.kubeconfig))
        self.core = client.CoreV1Api(self.api)
        self.apps = client.AppsV1Api(self.api)
        self.batch = client.BatchV1Api(self.api)
        self.node = client.NodeV1Api(self.api)


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[Sim]:
    cluster.create(tmp_path, cluster.ClusterSpec(workers=2, talos_version="1.12"))
    srv = server.serve_in_thread(tmp_path)
    try:
        yield Sim(tmp_path, srv)
    finally:
        srv.shutdown()
        srv.server_close()


def wait_for(fn: Callable[[], Any], timeout: float = 8.0) -> Any:
    return waiting.wait_for(fn, timeout)


def rc(name: str = "nvidia") -> client.V1RuntimeClass:
    return client.V1RuntimeClass(metadata=client.V1ObjectMeta(name=name), handler=name)


def pod(name: str, **spec: Any) -> client.V1Pod:
    containers = spec.pop(
        "containers", [client.V1Container(name="c", image="busybox:1.36", command=["sleep", "3600"])]
    )
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name), spec=client.V1PodSpec(containers=containers, **spec)
    )


def status_body(exc: ApiException) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(exc.body)
    return body


# --- auth, version, discovery -------------------------------------------------------------------------


def test_requests_without_the_kubeconfig_token_get_401_status(sim: Sim) -> None:
    url = sim.srv.url
    r = requests.get(f"{url}/api/v1/namespaces", timeout=5, verify=sim.ca)
    assert r.status_code == 401
    assert r.json() == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "Unauthorized",
        "reason": "Unauthorized",
        "code": 401,
    }
    cfg = yaml.safe_load(sim.kubeconfig.read_text())
    cfg["users"][0]["user"]["token"] = "wrong"
    bad = sim.state / "bad-kubeconfig"
    bad.write_text(yaml.safe_dump(cfg))
    with pytest.raises(ApiException) as err:
        client.CoreV1Api(config.new_client_from_config(config_file=str(bad))).list_namespace()
    assert err.value.status == 401


def test_kubeconfig_is_private_and_holds_a_fresh_token(tmp_path: Path) -> None:
    cluster.create(tmp_path, cluster.ClusterSpec(workers=1))
    tokens = []
    for _ in range(2):
        srv = server.serve_in_thread(tmp_path, start_controllers=False)
        kc = sim_paths(tmp_path).kubeconfig
        assert kc.stat().st_mode & 0o077 == 0
        tokens.append(yaml.safe_load(kc.read_text())["users"][0]["user"]["token"])
        srv.shutdown()
        srv.server_close()
    assert tokens[0] != tokens[1]


def test_version_is_complete_and_matches_the_talos_kubernetes(sim: Sim) -> None:
    info = client.VersionApi(sim.api).get_code()
    expected = KUBERNETES_FOR_TALOS["1.12"]
    assert info.git_version == f"v{expected}"
    assert (info.major, info.minor) == tuple(expected.split(".")[:2])
    assert info.platform and info.go_version and info.build_date


def test_discovery_lists_the_resources_the_runbooks_use(sim: Sim) -> None:
    groups = {g.name: g for g in client.ApisApi(sim.api).get_api_versions().groups}
    assert {"apps", "batch", "node.k8s.io", "nvidia.com"} <= set(groups)
    core = {r.name: r for r in sim.core.get_api_resources().resources}
    assert {"pods", "pods/log", "pods/status", "nodes", "nodes/status", "events", "namespaces"} <= set(core)
    assert core["nodes"].namespaced is False and core["pods"].namespaced is True
    node_k8s = client.NodeV1Api(sim.api).get_api_resources()
    assert [r.kind for r in node_k8s.resources] == ["RuntimeClass"]


# --- CRUD, metadata and Status bodies -----------------------------------------------------------------


def test_created_objects_carry_real_metadata_and_errors_are_apiserver_statuses(sim: Sim) -> None:
    made = sim.node.create_runtime_class(rc())
    assert made.metadata.uid and made.metadata.resource_version and made.metadata.creation_timestamp
    assert made.metadata.generation == 1
    with pytest.raises(ApiException) as err:
        sim.node.create_runtime_class(rc())
    assert err.value.status == 409
    assert status_body(err.value)["reason"] == "AlreadyExists"
    assert status_body(err.value)["message"] == 'runtimeclasses.node.k8s.io "nvidia" already exists'
    with pytest.raises(ApiException) as err:
        sim.node.read_runtime_class("missing")
    assert status_body(err.value)["reason"] == "NotFound"
    assert status_body(err.value)["message"] == 'runtimeclasses.node.k8s.io "missing" not found'
    assert status_body(err.value)["details"] == {
        "name": "missing",
        "group": "node.k8s.io",
        "kind": "runtimeclasses",
    }
    with pytest.raises(ApiException) as err:
        sim.core.read_namespaced_pod("missing", "default")
    assert status_body(err.value)["message"] == 'pods "missing" not found'


def test_put_with_a_stale_resource_version_conflicts(sim: Sim) -> None:
    made = sim.core.create_namespaced_config_map(
        "default", client.V1ConfigMap(metadata=client.V1ObjectMeta(name="cm"), data={"a": "1"})
    )
    made.data = {"a": "2"}
    updated = sim.core.replace_namespaced_config_map("cm", "default", made)
    assert int(updated.metadata.resource_version) > int(made.metadata.resource_version)
    assert updated.metadata.uid == made.metadata.uid
    made.data = {"a": "3"}
    with pytest.raises(ApiException) as err:
        sim.core.replace_namespaced_config_map("cm", "default", made)
    assert err.value.status == 409
    assert status_body(err.value)["reason"] == "Conflict"
    assert "the object has been modified" in status_body(err.value)["message"]


def test_invalid_objects_get_422_with_causes(sim: Sim) -> None:
    with pytest.raises(ApiException) as err:
        sim.node.create_runtime_class(rc("Not_Valid"))
    body = status_body(err.value)
    assert err.value.status == 422 and body["reason"] == "Invalid"
    assert body["message"].startswith(
        'RuntimeClass.node.k8s.io "Not_Valid" is invalid: metadata.name: Invalid value: "Not_Valid"'
    )
    assert body["details"]["causes"][0]["field"] == "metadata.name"
    job = client.V1Job(
        metadata=client.V1ObjectMeta(name="j"),
        spec=client.V1JobSpec(
            template=client.V1PodTemplateSpec(
                spec=client.V1PodSpec(containers=[client.V1Container(name="c", image="x")])
            )
        ),
    )
    with pytest.raises(ApiException) as err:
        sim.batch.create_namespaced_job("default", job)
    assert status_body(err.value)["message"] == (
        'Job.batch "j" is invalid: spec.template.spec.restartPolicy: Required value: valid values: "OnFailure", "Never"'
    )


def test_status_subresource_is_separate_from_the_main_resource(sim: Sim) -> None:
    save_cluster_faults(sim.state, {"pods_pending": True})  # keep the scheduler and kubelets out of the way
    sim.core.create_namespaced_pod("default", pod("s"))
    patched = sim.core.patch_namespaced_pod_status(
        "s", "default", {"status": {"phase": "Running"}, "metadata": {"labels": {"a": "b"}}}
    )
    assert patched.status.phase == "Running" and not (patched.metadata.labels or {})
    ignored = sim.core.patch_namespaced_pod(
        "s", "default", {"status": {"phase": "Failed"}, "metadata": {"labels": {"a": "b"}}}
    )
    assert ignored.status.phase == "Running" and ignored.metadata.labels == {"a": "b"}


def test_eviction_removes_the_pod(sim: Sim) -> None:
    sim.core.create_namespaced_pod("default", pod("e"))
    sim.core.create_namespaced_pod_eviction(
        "e", "default", client.V1Eviction(metadata=client.V1ObjectMeta(name="e", namespace="default"))
    )
    with pytest.raises(ApiException) as err:
        sim.core.read_namespaced_pod("e", "default")
    assert err.value.status == 404


def test_invalid_label_values_are_rejected(sim: Sim) -> None:
    with pytest.raises(ApiException) as err:
        sim.core.create_namespaced_config_map(
            "default",
            client.V1ConfigMap(metadata=client.V1ObjectMeta(name="cm", labels={"ok": "not valid!"})),
        )
    assert err.value.status == 422
    assert (
        'metadata.labels: Invalid value: "not valid!": a valid label must be an empty string'
        in status_body(err.value)["message"]
    )


def test_delete_then_404_and_namespace_scoping(sim: Sim) -> None:
    sim.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name="team")))
    sim.core.create_namespaced_config_map("team", client.V1ConfigMap(metadata=client.V1ObjectMeta(name="cm")))
    with pytest.raises(ApiException) as err:
        sim.core.create_namespaced_config_map(
            "nope", client.V1ConfigMap(metadata=client.V1ObjectMeta(name="cm"))
        )
    assert status_body(err.value)["message"] == 'namespaces "nope" not found'
    sim.core.delete_namespaced_config_map("cm", "team")
    with pytest.raises(ApiException) as err:
        sim.core.read_namespaced_config_map("cm", "team")
    assert err.value.status == 404
    sim.core.create_namespaced_config_map(
        "team", client.V1ConfigMap(metadata=client.V1ObjectMeta(name="cm2"))
    )
    sim.core.delete_namespace("team")
    assert [
        cm.metadata.name
        for cm in sim.core.list_config_map_for_all_namespaces().items
        if cm.metadata.namespace == "team"
    ] == []


# --- patch --------------------------------------------------------------------------------------------


def _ds(name: str = "ds") -> client.V1DaemonSet:
    labels = {"app": name}
    return client.V1DaemonSet(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1DaemonSetSpec(
            selector=client.V1LabelSelector(match_labels=labels),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels=labels),
                spec=client.V1PodSpec(
                    containers=[
                        client.V1Container(name="a", image="busybox:1"),
                        client.V1Container(name="b", image="busybox:1"),
                    ],
                    node_selector={"no-such": "node"},
                ),
            ),
        ),
    )


def test_strategic_merge_merges_containers_by_name_and_bumps_generation(sim: Sim) -> None:
    sim.apps.create_namespaced_daemon_set("default", _ds())
    patched = sim.apps.patch_namespaced_daemon_set(
        "ds",
        "default",
        {"spec": {"template": {"spec": {"containers": [{"name": "b", "image": "busybox:2"}]}}}},
    )
    images = {c.name: c.image for c in patched.spec.template.spec.containers}
    assert images == {"a": "busybox:1", "b": "busybox:2"}
    assert patched.metadata.generation == 2
    relabelled = sim.apps.patch_namespaced_daemon_set("ds", "default", {"metadata": {"labels": {"x": "y"}}})
    assert relabelled.metadata.generation == 2  # metadata-only changes leave generation alone


def test_merge_and_json_patch_content_types(sim: Sim) -> None:
    sim.apps.create_namespaced_daemon_set("default", _ds())
    merged = sim.apps.patch_namespaced_daemon_set(
        "ds",
        "default",
        {"spec": {"template": {"spec": {"containers": [{"name": "only", "image": "x:1"}]}}}},
        _content_type="application/merge-patch+json",
    )
    assert [c.name for c in merged.spec.template.spec.containers] == ["only"]
    jp = sim.apps.patch_namespaced_daemon_set(
        "ds",
        "default",
        [{"op": "add", "path": "/metadata/labels", "value": {"k": "v"}}],
        _content_type="application/json-patch+json",
    )
    assert jp.metadata.labels == {"k": "v"}


def test_node_labels_patch_keeps_status(sim: Sim) -> None:
    name = wait_for(
        lambda: [n.metadata.name for n in sim.core.list_node().items if "worker" in n.metadata.name]
    )[0]
    patched = sim.core.patch_node(name, {"metadata": {"labels": {"nvidia.com/gpu.present": "true"}}})
    assert patched.metadata.labels["nvidia.com/gpu.present"] == "true"
    assert patched.status.node_info.os_image.startswith("Talos (v1.12")


# --- list, selectors, watch ---------------------------------------------------------------------------


def test_label_and_field_selectors(sim: Sim) -> None:
    wait_for(lambda: len(sim.core.list_node().items) == 3)
    workers = sim.core.list_node(label_selector="!node-role.kubernetes.io/control-plane").items
    assert sorted(n.metadata.name for n in workers) == ["talos-worker-1", "talos-worker-2"]
    cp = sim.core.list_node(label_selector="node-role.kubernetes.io/control-plane").items
    assert [n.metadata.name for n in cp] == ["talos-cp-1"]
    inset = sim.core.list_node(label_selector="kubernetes.io/hostname in (talos-worker-2, nope)").items
    assert [n.metadata.name for n in inset] == ["talos-worker-2"]
    assert [
        n.metadata.name for n in sim.core.list_node(field_selector="metadata.name=talos-worker-1").items
    ] == ["talos-worker-1"]
    sim.core.create_namespaced_pod("default", pod("p1", node_name="talos-worker-1"))
    sim.core.create_namespaced_pod("default", pod("p2", node_name="talos-worker-2"))
    on1 = sim.core.list_pod_for_all_namespaces(field_selector="spec.nodeName=talos-worker-1").items
    assert [p.metadata.name for p in on1] == ["p1"]
    page = sim.core.list_node(limit=2)
    assert len(page.items) == 2 and page.metadata._continue
    rest = sim.core.list_node(limit=2, _continue=page.metadata._continue)
    assert len(rest.items) == 1 and not rest.metadata._continue


def test_watch_streams_added_modified_deleted_from_a_resource_version(sim: Sim) -> None:
    start = sim.core.list_namespaced_config_map("default").metadata.resource_version
    sim.core.create_namespaced_config_map(
        "default", client.V1ConfigMap(metadata=client.V1ObjectMeta(name="w"), data={"a": "1"})
    )
    sim.core.patch_namespaced_config_map("w", "default", {"data": {"a": "2"}})
    sim.core.delete_namespaced_config_map("w", "default")
    seen = [
        (e["type"], e["object"].metadata.name, (e["object"].data or {}).get("a"))
        for e in watch.Watch().stream(
            sim.core.list_namespaced_config_map, "default", resource_version=start, timeout_seconds=1
        )
    ]
    assert seen == [("ADDED", "w", "1"), ("MODIFIED", "w", "2"), ("DELETED", "w", "2")]


def test_watch_without_resource_version_replays_state_then_follows(sim: Sim) -> None:
    sim.core.create_namespaced_config_map(
        "default", client.V1ConfigMap(metadata=client.V1ObjectMeta(name="old"))
    )
    events: list[tuple[str, str]] = []

    def later() -> None:
        time.sleep(0.3)
        sim.core.create_namespaced_config_map(
            "default", client.V1ConfigMap(metadata=client.V1ObjectMeta(name="new"))
        )

    threading.Thread(target=later).start()
    w = watch.Watch()
    for e in w.stream(sim.core.list_namespaced_config_map, "default", timeout_seconds=3):
        events.append((e["type"], e["object"].metadata.name))
        if len(events) == 2:
            w.stop()
    assert events == [("ADDED", "old"), ("ADDED", "new")]


def test_watch_with_an_expired_resource_version_gets_410(sim: Sim) -> None:
    sim.srv.store.history.clear()
    for i in range(3):
        sim.core.create_namespaced_config_map(
            "default", client.V1ConfigMap(metadata=client.V1ObjectMeta(name=f"c{i}"))
        )
    with pytest.raises(ApiException) as err:
        list(
            watch.Watch().stream(
                sim.core.list_namespaced_config_map, "default", resource_version="1", timeout_seconds=1
            )
        )
    assert err.value.status == 410


# --- logs ---------------------------------------------------------------------------------------------


def test_pod_log_is_text_plain_and_follow_streams_it(sim: Sim) -> None:
    sim.core.create_namespaced_pod(
        "default",
        pod(
            "hello",
            restart_policy="Never",
            containers=[
                client.V1Container(
                    name="c", image="busybox:1.36", command=["sh", "-c", "echo hello from the sim"]
                )
            ],
        ),
    )
    wait_for(lambda: sim.core.read_namespaced_pod("hello", "default").status.phase == "Succeeded")
    assert sim.core.read_namespaced_pod_log("hello", "default") == "hello from the sim\n"
    stream = sim.core.read_namespaced_pod_log("hello", "default", follow=True, _preload_content=False)
    assert stream.headers["Content-Type"].startswith("text/plain")
    assert b"".join(stream.stream()) == b"hello from the sim\n"


def test_log_of_a_pod_still_waiting_is_a_400_like_kubectl_shows(sim: Sim) -> None:
    save_cluster_faults(sim.state, {"pods_pending": True})
    sim.core.create_namespaced_pod("default", pod("waits"))
    with pytest.raises(ApiException) as err:
        sim.core.read_namespaced_pod_log("waits", "default")
    assert err.value.status == 400
    assert status_body(err.value)["message"] == "pod waits does not have a host assigned"


# --- admission ----------------------------------------------------------------------------------------


def _hostpath_pod(name: str) -> client.V1Pod:
    return pod(
        name,
        volumes=[
            client.V1Volume(
                name="device-plugin",
                host_path=client.V1HostPathVolumeSource(path="/var/lib/kubelet/device-plugins"),
            ),
            client.V1Volume(name="cdi-root", host_path=client.V1HostPathVolumeSource(path="/var/run/cdi")),
        ],
    )


def test_pod_security_baseline_rejects_hostpath_outside_kube_system(sim: Sim) -> None:
    with pytest.raises(ApiException) as err:
        sim.core.create_namespaced_pod("default", _hostpath_pod("dp"))
    assert err.value.status == 403
    body = status_body(err.value)
    assert body["reason"] == "Forbidden"
    assert body["message"] == (
        'pods "dp" is forbidden: violates PodSecurity "baseline:latest": hostPath volumes (volumes "device-plugin", "cdi-root")'
    )
    assert sim.core.create_namespaced_pod("kube-system", _hostpath_pod("dp")).metadata.name == "dp"
    sim.core.create_namespace(
        client.V1Namespace(
            metadata=client.V1ObjectMeta(
                name="gpu-operator", labels={"pod-security.kubernetes.io/enforce": "privileged"}
            )
        )
    )
    assert sim.core.create_namespaced_pod("gpu-operator", _hostpath_pod("dp")).metadata.name == "dp"


def test_pod_security_reports_every_baseline_violation(sim: Sim) -> None:
    bad = pod(
        "bad",
        host_pid=True,
        containers=[
            client.V1Container(
                name="c",
                image="x:1",
                security_context=client.V1SecurityContext(privileged=True),
                ports=[client.V1ContainerPort(container_port=80, host_port=8080)],
            )
        ],
    )
    with pytest.raises(ApiException) as err:
        sim.core.create_namespaced_pod("default", bad)
    assert status_body(err.value)["message"] == (
        'pods "bad" is forbidden: violates PodSecurity "baseline:latest": host namespaces (hostPID=true), '
        'privileged (container "c" must not set securityContext.privileged=true), hostPort (container "c" uses hostPort 8080)'
    )


def test_restricted_namespace_label_enforces_restricted(sim: Sim) -> None:
    sim.core.create_namespace(
        client.V1Namespace(
            metadata=client.V1ObjectMeta(
                name="locked", labels={"pod-security.kubernetes.io/enforce": "restricted"}
            )
        )
    )
    with pytest.raises(ApiException) as err:
        sim.core.create_namespaced_pod("locked", pod("plain"))
    assert status_body(err.value)["message"].startswith(
        'pods "plain" is forbidden: violates PodSecurity "restricted:latest": '
    )
    assert "allowPrivilegeEscalation != false" in status_body(err.value)["message"]


def test_runtime_class_admission_rejects_unknown_classes(sim: Sim) -> None:
    with pytest.raises(ApiException) as err:
        sim.core.create_namespaced_pod("default", pod("gpu", runtime_class_name="nvidia"))
    assert err.value.status == 403
    assert (
        status_body(err.value)["message"]
        == 'pods "gpu" is forbidden: pod rejected: RuntimeClass "nvidia" not found'
    )
    sim.node.create_runtime_class(rc())
    assert (
        sim.core.create_namespaced_pod(
            "default", pod("gpu", runtime_class_name="nvidia")
        ).spec.runtime_class_name
        == "nvidia"
    )


# --- model validation ---------------------------------------------------------------------------------


def test_everything_served_validates_against_the_client_models(sim: Sim) -> None:
    sim.node.create_runtime_class(rc())
    sim.apps.create_namespaced_daemon_set("default", _ds())
    sim.core.create_namespaced_pod("default", pod("p"))
    wait_for(lambda: sim.core.read_namespaced_pod("p", "default").status.phase == "Running")
    for res in server.rt.RESOURCES:
        if res.model is None:
            continue
        model = getattr(client, res.model)
        items, _ = sim.srv.store.list(res)
        for item in items:
            assert model.from_dict(item) is not None
        # And through the HTTP path the client itself uses.
        prefix = f"/apis/{res.group}/{res.version}" if res.group else "/api/v1"
        raw = requests.get(
            f"{sim.srv.url}{prefix}/{res.plural}",
            headers={"Authorization": f"Bearer {sim.srv.token}"},
            timeout=5,
            verify=sim.ca,
        )
        assert raw.status_code == 200, res.plural
        for item in raw.json()["items"]:
            model.from_dict(item)


# --- faults -------------------------------------------------------------------------------------------


def test_api_latency_fault_delays_every_request(sim: Sim) -> None:
    t0 = time.monotonic()
    sim.core.list_namespace()
    fast = time.monotonic() - t0
    save_cluster_faults(sim.state, {"api_latency_ms": 400})
    t0 = time.monotonic()
    sim.core.list_namespace()
    assert time.monotonic() - t0 >= 0.4 > fast


def test_watch_drop_fault_cuts_the_stream_without_a_final_chunk(sim: Sim) -> None:
    save_cluster_faults(sim.state, {"watch_drop_after_s": 0.3})
    resp = sim.core.list_namespaced_config_map(
        "default", watch=True, timeout_seconds=30, _preload_content=False
    )
    t0 = time.monotonic()
    with pytest.raises((urllib3.exceptions.ProtocolError, urllib3.exceptions.HTTPError)):
        for _ in resp.stream():
            pass
    assert time.monotonic() - t0 < 5


# --- kubectl, where present ---------------------------------------------------------------------------


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed here")
def test_plain_kubectl_works_through_the_generated_kubeconfig(sim: Sim) -> None:
    wait_for(lambda: len(sim.core.list_node().items) == 3)
    env = {"KUBECONFIG": str(sim.kubeconfig), "PATH": "/usr/bin:/bin", "HOME": str(sim.state)}
    out = subprocess.run(
        ["kubectl", "get", "nodes", "-o", "json"],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert sorted(i["metadata"]["name"] for i in json.loads(out.stdout)["items"]) == [
        "talos-cp-1",
        "talos-worker-1",
        "talos-worker-2",
    ]
    table = subprocess.run(
        ["kubectl", "get", "nodes"], check=False, capture_output=True, text=True, env=env, timeout=60
    ).stdout.splitlines()
    assert table[0].split() == ["NAME", "STATUS", "ROLES", "AGE", "VERSION"]
    assert table[1].split()[:3] == ["talos-cp-1", "Ready", "control-plane"]
    out = subprocess.run(
        ["kubectl", "label", "node", "talos-worker-1", "nvidia.com/gpu.present=true"],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert sim.core.read_node("talos-worker-1").metadata.labels["nvidia.com/gpu.present"] == "true"
    out = subprocess.run(
        ["kubectl", "get", "pod", "nope"], check=False, capture_output=True, text=True, env=env, timeout=60
    )
    assert out.returncode == 1 and 'pods "nope" not found' in out.stderr
    manifest = "apiVersion: node.k8s.io/v1\nkind: RuntimeClass\nmetadata:\n  name: nvidia\nhandler: nvidia\n"
    out = subprocess.run(
        ["kubectl", "apply", "-f", "-"],
        input=manifest,
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert sim.node.read_runtime_class("nvidia").handler == "nvidia"


def test_objects_survive_a_server_restart_but_not_a_recreated_cluster(tmp_path: Path) -> None:
    cluster.create(tmp_path, cluster.ClusterSpec(workers=1))
    srv = server.serve_in_thread(tmp_path, start_controllers=False)
    api = config.new_client_from_config(config_file=str(sim_paths(tmp_path).kubeconfig))
    client.NodeV1Api(api).create_runtime_class(rc())
    srv.shutdown()
    srv.server_close()
    srv = server.serve_in_thread(tmp_path, start_controllers=False)
    api = config.new_client_from_config(config_file=str(sim_paths(tmp_path).kubeconfig))
    assert client.NodeV1Api(api).read_runtime_class("nvidia").handler == "nvidia"
    srv.shutdown()
    srv.server_close()
    time.sleep(0.01)
    cluster.create(tmp_path, cluster.ClusterSpec(workers=1))
    srv = server.serve_in_thread(tmp_path, start_controllers=False)
    api = config.new_client_from_config(config_file=str(sim_paths(tmp_path).kubeconfig))
    with pytest.raises(ApiException):
        client.NodeV1Api(api).read_runtime_class("nvidia")
    srv.shutdown()
    srv.server_close()


def test_dry_run_patch_and_put_validate_but_store_nothing(sim):
    core = sim.core
    node = core.list_node().items[0]
    name = node.metadata.name
    patched = core.patch_node(name, {"metadata": {"labels": {"dry": "run"}}}, dry_run="All")
    assert patched.metadata.labels["dry"] == "run"
    assert "dry" not in (core.read_node(name).metadata.labels or {})
    current = core.read_node(name)
    current.metadata.labels = {**(current.metadata.labels or {}), "dry": "put"}
    core.replace_node(name, current, dry_run="All")
    assert "dry" not in (core.read_node(name).metadata.labels or {})
