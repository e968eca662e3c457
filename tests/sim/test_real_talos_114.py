"""Talos 1.14 nodes on the real talosctl v1.14.1 against simnode (issue 14).

talos v1.14.0 is not served by the Go module proxy (403, 2026-12-02); v1.14.1 is, and ``tools/build-talosctl.sh
v1.14.1`` builds it from its own sources with two dependency versions the proxy refuses replaced by the nearest it
serves (cosi-project/runtime v1.16.3 -> v1.16.2, jsimonetti/rtnetlink/v2 at a 2026-08 pseudo-version -> v2.3.0;
``substitutions.txt`` beside the binary lists them). ``.ci/run`` builds it (since 4 Dec 2026); elsewhere these
tests skip, saying so, unless it is built. simnode is built on pkg/machinery v1.14.1 (with the same cosi-project/runtime substitution): a
1.14 node loads ``KernelModuleConfig`` documents, lists its modules as ``KernelModuleStatus`` (``get modules``,
state ``live``) and applies every mode without a reboot (simnode/state.go, legacy.go, apply.go, each cited).
"""

from __future__ import annotations

import base64
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from runbook_lib.clients.talosctl import Talosctl
from runbook_lib.sim import cluster, realtalos
from runbook_lib.sim.state import talos_kubeconfig_path
from tests.sim.test_real_talos_110_111 import (
    Release,
    assert_run_applies_all_six_steps,
    assert_stops_at_its_step_on_the_last_worker,
    built_talosctl,
    patch_dry_run,
    serve,
)
from tests.sim.test_real_talosctl import Sim, build, start_simnode

pytestmark = pytest.mark.slow

CLIENT = "v1.14.1"  # the talosctl: the 1.14 patch the Go module proxy serves
#: The nodes' release: the simulated Image Factory's catalog has v1.14.0 and v1.14.0-rc.1 (runbook_lib/sim), not
#: v1.14.1; a talosctl of the same minor release drives them, as realtalos pairs them.
TALOS = "v1.14.0"
#: The Talos 1.14 docs' modules patch (siderolabs/docs public/talos/v1.14/.../nvidia-gpu.mdx, as
#: ../shared/docs/talos-nvidia.md §1.3 quotes it): one KernelModuleConfig document per module; two suffice here.
KERNEL_MODULE_CONFIG = (
    "apiVersion: v1alpha1\nkind: KernelModuleConfig\nname: nvidia\n---\n"
    "apiVersion: v1alpha1\nkind: KernelModuleConfig\nname: nvidia_uvm\n"
)


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Release]:
    """Fresh Talos 1.14.0 GPU workers (vanilla schematic, no modules config) and the real talosctl v1.14.1."""
    yield from serve(tmp_path_factory.mktemp("fresh-114"), TALOS, CLIENT, "fresh")


def test_a_kernel_module_config_patch_dry_run_prints_the_new_documents(
    fresh: Release, tmp_path: Path
) -> None:
    """talosctl 1.14 merges the KernelModuleConfig documents into the node's config and sends the whole config;
    a machined on 1.13's machinery refuses them (``"KernelModuleConfig" "v1alpha1": not registered``, tests/sim/test_real_talos_113_to_114.py). The dry run in the default mode (auto) says
    the config applies without a reboot, as 1.14's machined does for every mode (talos@v1.14.1:internal/app/
    machined/internal/server/v1alpha1/v1alpha1_server.go:236-245)."""
    proc = patch_dry_run(fresh, tmp_path, KERNEL_MODULE_CONFIG)
    assert proc.returncode == 0, proc.stderr
    assert "Applied configuration without a reboot (skipped in dry-run)." in proc.stderr, proc.stderr
    assert "+kind: KernelModuleConfig\n+name: nvidia\n" in proc.stderr, proc.stderr


def test_a_misspelt_key_in_a_kernel_module_config_is_refused_naming_it(
    fresh: Release, tmp_path: Path
) -> None:
    """The 1.14 config decoding is strict for the new document kinds too: talosctl refuses the patch before any
    call changes the node, naming the key."""
    proc = patch_dry_run(
        fresh, tmp_path, KERNEL_MODULE_CONFIG.replace("name: nvidia_uvm", "nmae: nvidia_uvm")
    )
    assert proc.returncode != 0
    assert "nmae" in proc.stderr, proc.stderr


@pytest.fixture(scope="module")
def gpu_ready(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Release]:
    """1.14.0 GPU workers on the NVIDIA schematic with the modules config: the NVIDIA modules are loaded."""
    yield from serve(tmp_path_factory.mktemp("ready-114"), TALOS, CLIENT, "gpu-ready")


def test_get_modules_lists_kernel_module_status_live_on_1_14(gpu_ready: Release) -> None:
    """1.14 moved the ``modules`` alias from LoadedKernelModule to KernelModuleStatus, its type and state printed
    lowercase (talos@v1.14.1:pkg/machinery/resources/runtime/kernel_module_status.go:50-68, kernel_module_type.go,
    kernelmodulestate_enumer.go; written from /proc/modules by internal/app/machined/pkg/controllers/runtime/
    kernel_module_status.go:209-227). The runbook's verify reads these (``live``; profiles.py module_check)."""
    proc = gpu_ready.sim.run("-n", gpu_ready.nodes[1], "get", "modules")
    assert proc.returncode == 0, proc.stderr
    header, *rows = [line.split() for line in proc.stdout.splitlines() if line.strip()]
    assert header[-2:] == ["TYPE", "STATE"], proc.stdout
    assert sorted(r[3] for r in rows) == ["nvidia", "nvidia_drm", "nvidia_modeset", "nvidia_uvm"], proc.stdout
    assert {(r[2], r[-2], r[-1]) for r in rows} == {("KernelModuleStatus", "dynamic", "live")}, proc.stdout


def _openssl_pair(d: Path, name: str, *args: str) -> tuple[bytes, bytes]:
    """A P-256 certificate and key made with the ``openssl`` CLI (``req -x509``; ``-CA`` signs it)."""
    if shutil.which("openssl") is None:
        pytest.skip("no openssl on PATH to make the kubeconfigs' certificates")
    key, crt = d / f"{name}.key", d / f"{name}.crt"
    cmd = ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    subprocess.run([*cmd, "-keyout", str(key), "-out", str(crt), "-days", "1", *args], check=True, timeout=30)
    return crt.read_bytes(), key.read_bytes()


def _kubeconfig(server: str, ca: bytes, user: dict[str, str]) -> str:
    """A kubeconfig in Talos's structure (talos@v1.14.1 pkg/kubeconfig/generate.go:102-124) with ``user``."""
    name = "talos-gpu-sim"
    cluster = {"server": server, "certificate-authority-data": base64.b64encode(ca).decode()}
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": name, "cluster": cluster}],
            "users": [{"name": f"admin@{name}", "user": user}],
            "contexts": [
                {
                    "name": f"admin@{name}",
                    "context": {"cluster": name, "namespace": "default", "user": f"admin@{name}"},
                }
            ],
            "current-context": f"admin@{name}",
        }
    )


def _write_kubeconfigs(state: Path, talos_server: str, token_server: str) -> tuple[Path, Path]:
    """A token kubeconfig naming ``token_server`` (what an API server's admin token gives) and, at
    ``talos_kubeconfig_path``, the admin client certificate signed by the cluster CA (CN=admin, O=system:masters,
    client auth: generate.go:35-93) naming ``talos_server``. Made here with openssl: the Python Kubernetes API
    that used to write both was retired (issue 15); the real control plane's own is tested in
    test_real_talos_114_real_plane.py."""
    pki = state / "pki"
    pki.mkdir(parents=True, exist_ok=True)
    ca, _ca_key = _openssl_pair(
        pki, "ca", "-subj", "/CN=kubernetes", "-addext", "basicConstraints=critical,CA:TRUE"
    )
    signed = [
        "-CA",
        str(pki / "ca.crt"),
        "-CAkey",
        str(pki / "ca.key"),
        "-subj",
        "/O=system:masters/CN=admin",
    ]
    signed += ["-addext", "basicConstraints=CA:FALSE", "-addext", "extendedKeyUsage=clientAuth"]
    signed += ["-addext", "keyUsage=critical,digitalSignature,keyEncipherment"]
    cert, key = _openssl_pair(pki, "admin", *signed)
    token = state / "kubeconfig"
    token.write_text(_kubeconfig(token_server, ca, {"token": "t0ken"}))
    talos = talos_kubeconfig_path(state)
    talos.parent.mkdir(parents=True, exist_ok=True)
    b64 = {"client-certificate-data": cert, "client-key-data": key}
    talos.write_text(_kubeconfig(talos_server, ca, {k: base64.b64encode(v).decode() for k, v in b64.items()}))
    return token, talos


def test_talosctl_1_14_accepts_the_kubeconfig_a_control_plane_node_hands_out_and_refuses_a_token_one(
    tmp_path: Path,
) -> None:
    """``talosctl kubeconfig`` validates what the node sends as the drain does (talos@v1.14.1
    cmd/talosctl/cmd/talos/kubeconfig.go:123, pkg/kubeconfig/validate.go): the client-certificate kubeconfig
    passes. Once ``-kubeconfig`` names another server (a real control plane started later in the state dir),
    simnode serves that token kubeconfig, not the stale one, and talosctl refuses it with Talos's error."""
    talosctl = built_talosctl(CLIENT)
    nodes = cluster.create(tmp_path / "cluster", cluster.ClusterSpec(workers=1, talos_version=TALOS))
    token, _ = _write_kubeconfigs(tmp_path, "https://127.0.0.1:6443", "https://127.0.0.1:6443")
    flags = ("-kubeconfig", str(token), "-talos-kubeconfig", str(talos_kubeconfig_path(tmp_path)))
    doc = realtalos.nodes_document(tmp_path / "cluster", nodes, 0)
    proc = start_simnode(build("build-simnode.sh"), tmp_path / "state", doc, *flags)
    try:
        sim, cp = Sim(talosctl, tmp_path / "state" / "talosconfig"), nodes[0].address
        fetched = sim.run("-n", cp, "kubeconfig", "-")
        # Only return codes and stderr in messages: stdout holds a (throwaway) client key.
        fetched_rc = fetched.returncode
        assert fetched_rc == 0, fetched.stderr
        [user] = yaml.safe_load(fetched.stdout)["users"]
        assert set(user["user"]) == {"client-certificate-data", "client-key-data"}, user["name"]
        _write_kubeconfigs(tmp_path, "https://127.0.0.1:6443", "https://127.0.0.1:7443")
        refused = sim.run("-n", cp, "kubeconfig", "-")
        refused_rc = refused.returncode
        assert refused_rc != 0, "talosctl 1.14 accepted a token kubeconfig"
        assert 'user field "token" is not allowed' in refused.stderr, refused.stderr
    finally:
        proc.terminate()
        proc.wait(timeout=10)


# ---------------------------------------------------------------- runbook run on Talos 1.14.1


# talosctl v1.14.1's upgrade drain validates the admin kubeconfig the control-plane node hands out and refuses one
# without Talos's structure (talos@v1.14.1:pkg/kubeconfig/validate.go:29, 'user field "token" is not allowed'):
# simnode serves the client-certificate kubeconfig the real control plane writes
# (tests/sim/test_real_talos_114_real_plane.py), so these pass where v1.14.1 and Kubernetes v1.37.2 (or the nearest
# built release standing in for it) are built.


def test_runbook_run_applies_all_six_steps_with_the_real_talosctl_1_14(tmp_path: Path) -> None:
    """Issue 14's "done when" for 1.14: ``runbook run -p params/simulated.yaml --set talos_version=v1.14.0
    --apply`` with the real talosctl v1.14.1: the KernelModuleConfig patch, the factory installer through the
    1.13+ LifecycleService upgrade (drained through the real control plane), verify's ``get modules``
    (KernelModuleStatus ``live``), the GPU Operator and the CUDA tests."""
    for observed in assert_run_applies_all_six_steps(tmp_path, TALOS, CLIENT):
        assert "/metal-installer/" in observed["image"], observed["image"]
        assert "kind: KernelModuleConfig" in observed["machine_config"]
        assert {m["name"] for m in observed["kernel_modules"]} >= {"nvidia", "nvidia_uvm"}


def test_a_failed_upgrade_stops_the_run_at_the_image_step_on_the_faulty_node_only(tmp_path: Path) -> None:
    """test_real_faults' check on 1.14: the installer fails on the last worker only (scenarios.py), the image
    step fails there with tests/fault_cases.py's diagnosis and the later steps do not run."""
    assert_stops_at_its_step_on_the_last_worker(tmp_path, TALOS, CLIENT, "upgrade-fails")


@pytest.fixture(scope="module")
def one_worker_down(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Release, str]]:
    """1.14.0 GPU workers (three), the second one powered off (simnode's ``down``: no route to host)."""
    tmp = tmp_path_factory.mktemp("down-114")
    talosctl, simnode = built_talosctl(CLIENT), build("build-simnode.sh")
    spec = cluster.ClusterSpec(workers=3, talos_version=TALOS, scenario="gpu-ready")
    nodes = cluster.create(tmp / "cluster", spec)
    doc = realtalos.nodes_document(tmp / "cluster", nodes, 0)
    dead = nodes[2].address
    for node in doc["nodes"]:  # type: ignore[union-attr]
        if node["address"] == dead:
            node["down"] = "no-route-to-host"
    proc = start_simnode(simnode, tmp / "state", doc)
    yield Release(Sim(talosctl, tmp / "state" / "talosconfig"), [n.address for n in nodes], TALOS), dead
    proc.terminate()
    proc.wait(timeout=10)


def test_one_dead_node_fails_only_itself_in_the_services_and_version_reads(
    one_worker_down: tuple[Release, str],
) -> None:
    """talosctl 1.14 asks each node on its own and prints a dead node's error as ``error from node <X>: …``
    (``error getting version from node <X>: …`` for ``version``), without the ``* <X>:`` lines of 1.13 (talos
    v1.14.0-rc.1 cmd/talosctl/cmd/talos/service.go:102, version.go:77). The library read only the 1.13 form, so
    one dead node failed ``services not read`` on every node of its call (up to 250), and ``version`` left the
    dead node without its error."""
    release, dead = one_worker_down
    workers = release.nodes[1:]
    talosctl = Talosctl(str(release.sim.talosctl), talosconfig=str(release.sim.talosconfig))

    services, errors = talosctl.services(workers)
    assert list(errors) == [dead], errors
    assert "no route to host" in errors[dead]
    assert sorted(services) == sorted(n for n in workers if n != dead)
    assert all(services[n]["kubelet"].running for n in services)

    _client, servers, down = talosctl.version(workers)
    assert list(down) == [dead] and "no route to host" in down[dead], down
    assert sorted(servers) == sorted(n for n in workers if n != dead)
