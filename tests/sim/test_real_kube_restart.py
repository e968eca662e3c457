"""The real control plane keeps its cluster between runs (issue 15, point 5).

A real cluster's etcd survives a control-plane restart, so a second ``runbook run --apply`` finds the
RuntimeClass and the Helm release the first one made and changes nothing. ``runbook run`` stops the simulator
it started, so the second run restarts simkube on the same ``<state>/kube``. Every wait polls for the condition
it needs with a generous deadline (a loaded machine delays every process). Skipped, saying what to build, when
the control plane is not built (``make kube-tools``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from runbook_lib.sim import cluster, realkube
from tests.sim.test_sim_up_real_kube import _cmdline, runbook
from tests.sim.test_sim_up_real_kube import tools as tools  # noqa: PLC0414  (the module-scoped fixture)
from tests.sim.waiting import wait_for

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def processes_of(state: Path) -> list[str]:
    """Command lines of the processes that name this state dir (simkube, etcd, kube-apiserver, kwok, ...)."""
    found = (_cmdline(p) for p in Path("/proc").glob("[0-9]*"))
    return [line for line in found if str(state) in line]


def run_apply(state: Path, records: Path) -> tuple[subprocess.CompletedProcess[str], dict[str, object]]:
    """``runbook run -p params/simulated.yaml --apply`` (what ``make demo`` runs) and its record's data."""
    before = set(records.glob("*/record.json"))
    params = str(ROOT / "params" / "simulated.yaml")
    args = ["run", "-p", params, "--apply", "--state", str(state), "--records", str(records), "--no-progress"]
    proc = runbook(*args, mode="real")
    (new,) = set(records.glob("*/record.json")) - before
    return proc, json.loads(new.read_text())


def test_a_second_run_resumes_the_clusters_etcd_and_changes_nothing(
    tools: realkube.Tools, tmp_path: Path
) -> None:
    """Without ``runbook sim up``: each run starts the real control plane and stops all of it; the second
    sees the RuntimeClass and Helm release the first installed (etcd kept in ``<state>/kube``)."""
    state, records = tmp_path / "sim", tmp_path / "records"
    try:
        first, data = run_apply(state, records)
        assert first.returncode == 0, first.stdout + first.stderr
        assert data["outcome"] == "changed", first.stdout
        assert wait_for(lambda: not processes_of(state), timeout=60) is True
        second, data = run_apply(state, records)
        assert second.returncode == 0, second.stdout + second.stderr
        assert data["outcome"] == "unchanged", second.stdout
        assert "nothing changed on the cluster" in second.stdout
        assert wait_for(lambda: not processes_of(state), timeout=60) is True
    finally:
        realkube.stop(state)
        runbook("sim", "down", "--state", str(state), mode="real")


def start_simkube(tools: realkube.Tools, state: Path) -> tuple[subprocess.Popen[str], dict[str, object]]:
    """simkube on ``state`` until it prints its ready line (it exits with an error otherwise)."""
    proc = subprocess.Popen(
        [str(tools.simkube), "--state", str(state), "--bin", str(tools.kube_bin),
         "--components", "etcd,kube-apiserver"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.wait(timeout=60)
        raise AssertionError(f"simkube exited {proc.returncode}: {proc.stderr.read() if proc.stderr else ''}")
    return proc, json.loads(line)


def stop_simkube(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)


def kubectl(tools: realkube.Tools, kubeconfig: object, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(tools.kubectl), "--kubeconfig", str(kubeconfig), *args],
        capture_output=True,
        text=True,
        check=False,
    )


def test_simkube_restarted_on_its_state_dir_serves_what_it_stored(
    tools: realkube.Tools, tmp_path: Path
) -> None:
    """The objects, the CA and the admin's token survive; the restart is about as quick as the first start."""
    state = tmp_path / "kube"
    proc, ready = start_simkube(tools, state)
    try:
        created = kubectl(tools, ready["kubeconfig"], "create", "configmap", "kept", "--from-literal=a=1")
        assert created.returncode == 0, created.stderr
        ca = (state / "pki" / "ca.crt").read_bytes()
    finally:
        stop_simkube(proc)
    proc, again = start_simkube(tools, state)
    try:
        got = kubectl(tools, again["kubeconfig"], "get", "configmap", "kept", "-o", "jsonpath={.data.a}")
        assert (got.returncode, got.stdout) == (0, "1"), got.stderr
        assert (state / "pki" / "ca.crt").read_bytes() == ca
        # "about the same": etcd replays a small WAL; generous for a loaded 2-core machine
        assert float(str(again["startup_seconds"])) < 3 * float(str(ready["startup_seconds"])) + 10
        assert again["server"] == ready["server"]  # the same endpoint: kubeconfigs saved before keep working
        issuer = identity(tools, Path(str(again["kubeconfig"])))[0]
    finally:
        stop_simkube(proc)
    assert issuer == ready["server"]


def test_simkube_serves_elsewhere_when_its_port_was_taken_and_keeps_its_issuer(
    tools: realkube.Tools, tmp_path: Path
) -> None:
    """The port of the earlier start is the other program's now: simkube starts on a new one rather than not at
    all, says so on stderr, and keeps the service-account issuer (tokens it signed stay valid)."""
    state = tmp_path / "kube"
    proc, ready = start_simkube(tools, state)
    stop_simkube(proc)
    port = int(str(ready["server"]).rsplit(":", 1)[1])
    with socket.create_server(("127.0.0.1", port)):
        proc, again = start_simkube(tools, state)
        try:
            issuer = identity(tools, Path(str(again["kubeconfig"])))[0]
        finally:
            stop_simkube(proc)
    assert again["server"] != ready["server"] and issuer == ready["server"]
    assert proc.stderr is not None
    assert f"port {port} of the earlier start is taken: serving on {again['server'].rsplit(':', 1)[1]}" in (
        proc.stderr.read()
    )


@pytest.mark.parametrize("leftover", ["notes.txt", "pki/ca.crt"])
def test_simkube_refuses_a_state_dir_it_did_not_finish_writing(
    tools: realkube.Tools, tmp_path: Path, leftover: str
) -> None:
    """A directory with files but without simkube's completion mark (another program's, or a start that died
    half-way) is refused with exit 2 naming it, and left as it was."""
    state = tmp_path / "kube"
    (state / leftover).parent.mkdir(parents=True, exist_ok=True)
    (state / leftover).write_text("not simkube's\n")
    proc = subprocess.run(
        [str(tools.simkube), "--state", str(state), "--bin", str(tools.kube_bin)],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert f"--state {state}" in proc.stderr and "simkube-state.json" in proc.stderr
    assert sorted(p.relative_to(state).as_posix() for p in state.rglob("*") if p.is_file()) == [leftover]


def test_a_new_cluster_starts_its_control_plane_from_an_empty_etcd(tmp_path: Path) -> None:
    """``runbook sim up`` (or a run with other parameters) re-creates the cluster: the earlier control plane's
    etcd goes with the old nodes, so none of the old cluster's objects is resumed; its endpoint and credentials
    (PKI, tokens, port and issuer) stay, as a Talos cluster re-created from the same secrets keeps them."""
    state = tmp_path / "sim"
    cluster.create(state, cluster.ClusterSpec(workers=1))
    (state / "kube" / "etcd" / "member" / "wal").mkdir(parents=True)
    (state / "kube" / "pki").mkdir()
    (state / "kube" / "pki" / "ca.crt").write_text("the old CA\n")
    (state / "kube" / "simkube-state.json").write_text('{"simkube_state_format": 1}\n')
    cluster.create(state, cluster.ClusterSpec(workers=1))
    assert not (state / "kube" / "etcd").exists()
    assert (state / "kube" / "pki" / "ca.crt").read_text() == "the old CA\n"


def test_a_new_cluster_drops_a_control_plane_state_simkube_never_finished(tmp_path: Path) -> None:
    """Without simkube's completion mark, simkube would refuse the directory on start: it goes whole."""
    state = tmp_path / "sim"
    cluster.create(state, cluster.ClusterSpec(workers=1))
    (state / "kube" / "pki").mkdir(parents=True)
    (state / "kube" / "pki" / "ca.crt").write_text("half-written\n")
    cluster.create(state, cluster.ClusterSpec(workers=1))
    assert not (state / "kube").exists()


def sim(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``runbook sim ARGS --state STATE`` on the real control plane; the Talos side is the Python simulator
    (this test is about the Kubernetes endpoint, and simnode would only add its start-up)."""
    env = {**os.environ, "RUNBOOK_SIM_KUBE": "real", "RUNBOOK_SIM_TALOSCTL": "python"}
    argv = [sys.executable, "-m", "runbook_lib", "sim", *args, "--state", str(state)]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300, check=False, cwd=ROOT)


def identity(tools: realkube.Tools, kubeconfig: Path) -> tuple[str, str]:
    """The service-account issuer (OIDC discovery) and signing keys (JWKS) the API server publishes, read with
    ``kubeconfig``: what a pod's projected token is checked against, inside and outside the cluster."""
    got = [kubectl(tools, kubeconfig, "get", "--raw", path) for path in OIDC_PATHS]
    assert all(g.returncode == 0 for g in got), [g.stderr for g in got]
    return json.loads(got[0].stdout)["issuer"], got[1].stdout


OIDC_PATHS = ("/.well-known/openid-configuration", "/openid/v1/jwks")


def test_a_saved_kubeconfig_keeps_working_after_sim_down_and_up(
    tools: realkube.Tools, tmp_path: Path
) -> None:
    """``runbook sim down`` then ``runbook sim up`` on the same state dir re-creates the cluster (new nodes, an
    empty etcd), and, as a Talos cluster re-created from the same machine-config secrets (``cluster.ca``,
    ``cluster.serviceAccount``, ``cluster.controlPlane.endpoint``: config.schema.v1.12.json), its API server keeps
    its address, CA and credentials, and its service-account issuer and signing key (Talos sets
    ``--service-account-issuer`` and ``--api-audiences`` to the control-plane endpoint: siderolabs/talos@v1.12.0
    internal/app/machined/pkg/controllers/k8s/control_plane_static_pod.go, manageAPIServer). So a kubeconfig the
    user copied before still works. Before: a new port (and issuer, CA and token) on every ``sim up``."""
    state, saved = tmp_path / "sim", tmp_path / "saved-kubeconfig"
    try:
        first = sim(state, "up", "--nodes", "1")
        assert first.returncode == 0, first.stderr
        shutil.copy(state / "kubeconfig", saved)
        created = kubectl(tools, saved, "create", "configmap", "of-the-old-cluster", "--from-literal=a=1")
        assert created.returncode == 0, created.stderr
        before = identity(tools, saved)
        assert sim(state, "down").returncode == 0
        again = sim(state, "up", "--nodes", "1")
        assert again.returncode == 0, again.stderr
        nodes = kubectl(tools, saved, "get", "nodes", "-o", "name")
        assert (nodes.returncode, nodes.stdout) == (0, "node/talos-cp-1\nnode/talos-worker-1\n"), nodes.stderr
        gone = kubectl(tools, saved, "get", "configmap", "of-the-old-cluster")
        assert gone.returncode == 1 and "NotFound" in gone.stderr  # the cluster itself is new
        assert identity(tools, saved) == before
    finally:
        sim(state, "down")
    assert wait_for(lambda: not processes_of(state), timeout=60) is True
