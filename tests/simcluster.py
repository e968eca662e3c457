"""A simulated cluster for library tests: the same binaries, kubeconfig and URLs a user gets.

Tests import the simulator only here, to create and tear down a cluster; the library under test reaches it
exactly as it reaches a real one (``runbook_lib.steps.context.connect``).

The Talos side follows the rule ``runbook sim up`` follows (``RUNBOOK_SIM_TALOSCTL``, ``auto`` in the suite:
``tests/conftest.py``): the real talosctl of the nodes' release against simnode when both are built for these
sources and the scenario's faults are simulated by simnode, else the Python talosctl. Which one answers is
recorded (``talosctl_choice``). With the real talosctl the node files keep what the scenario made and simnode
keeps what the talosctl changed, so tests read nodes with ``node_state`` and inject faults with ``inject_fault``.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from runbook_lib.model.params import Params
from runbook_lib.sim import cluster, factory, faults, realkube, realtalos
from runbook_lib.sim.state import SimNode, load_cluster, load_node, load_nodes
from runbook_lib.steps.context import Context, connect
from runbook_lib.steps.reboots import BOOT_ID_PATH
from tests.realplane import _params as gpu_params
from tests.realplane import ready_if_real, stop_servers


@contextmanager
def _talos(state_dir: Path, spec: cluster.ClusterSpec) -> Iterator[realtalos.Choice]:
    """simnode and the real talosctl when ``auto`` picks them (what ``runbook sim up`` starts), stopped after."""
    try:
        yield cluster.start_talos(state_dir, spec, load_nodes(state_dir))
    finally:
        cluster.stop_talos(state_dir)


@contextmanager
def sim_cluster(
    state_dir: Path,
    *,
    talos_version: str = "v1.12.7",
    workers: int = 2,
    scenario: str = "fresh",
    daemon: bool = True,
    latency_ms: float = 0.0,
    **params: Any,
) -> Iterator[tuple[Params, Context]]:
    """Create a simulated cluster, start its servers, and yield validated params + a connected context.

    ``latency_ms`` is every node's simulated round trip per talosctl call (what makes serial calls visible).
    ``daemon=False`` starts no Kubernetes API or Image Factory (simnode still answers the Talos API).
    The Kubernetes side is the one ``runbook sim up`` picks (``RUNBOOK_SIM_KUBE``, ``realkube.start_servers``):
    on the real control plane it yields once every Node is Ready and untainted (``tests/realplane.py``).
    """
    spec = cluster.ClusterSpec(
        workers=workers, talos_version=talos_version, scenario=scenario, latency_ms=latency_ms
    )
    cluster.create(state_dir, spec)
    if daemon:
        realkube.start_servers(state_dir)  # the real control plane when RUNBOOK_SIM_KUBE chooses it
    else:
        (state_dir / "endpoints.json").write_text("{}")
    try:
        with _talos(state_dir, spec):
            p = gpu_params(state_dir, talos_version, params)
            ctx = connect(p, state_dir=state_dir)
            ready_if_real(ctx, state_dir)  # as real_cluster: no pod before the not-ready taint is lifted
            yield p, ctx
    finally:
        if daemon:
            stop_servers(state_dir)


@contextmanager
def factory_only(
    state_dir: Path, *, workers: int, scenario: str, talos_version: str = "v1.12.7"
) -> Iterator[factory.FactoryServer]:
    """A simulated cluster whose only HTTP server is the Image Factory, run in this process: what the image,
    rollout and rollback tests need, without the daemon's start-up. The Talos side is simnode with the real
    talosctl when ``auto`` picks them (simnode resolves installer images from the factory's schematics in the
    state directory), else the Python talosctl reading the state directory."""
    spec = cluster.ClusterSpec(workers=workers, talos_version=talos_version, scenario=scenario)
    cluster.create(state_dir, spec)
    with factory.running(state_dir) as server:
        (state_dir / "endpoints.json").write_text(json.dumps({"factory": server.url}))
        with _talos(state_dir, spec):
            yield server


def talosctl_choice(state_dir: Path) -> realtalos.Choice:
    """Which talosctl answers the cluster and why (what ``runbook sim status`` prints)."""
    choice = realtalos.recorded(state_dir)
    assert choice is not None, f"no talosctl recorded in {state_dir}: the cluster was not started here"
    return choice


def runs_real_talosctl(state_dir: Path) -> bool:
    """True when the real talosctl against simnode answers the cluster."""
    return talosctl_choice(state_dir).real


def node_state(state_dir: Path, name: str) -> SimNode:
    """The node as the talosctl answering it holds it: simnode's observed state (release, image, schematic,
    extensions, config) with the real talosctl, the node file with the Python one."""
    return realtalos.with_observed(load_node(state_dir, name), realtalos.observed_file(state_dir, name))


def inject_fault(state_dir: Path, node: str, fault: str, value: Any = True) -> None:
    """Switch a fault on for one node, where the talosctl answering it sees it (``_faults_to_simnode``)."""
    faults.inject(state_dir, node, fault, value)
    _faults_to_simnode(state_dir, node, fault)


def clear_fault(state_dir: Path, node: str, fault: str) -> None:
    """Switch a fault off for one node, where the talosctl answering it sees it (``_faults_to_simnode``)."""
    faults.clear(state_dir, node, fault)
    _faults_to_simnode(state_dir, node, fault)


def _faults_to_simnode(state_dir: Path, node: str, fault: str) -> None:
    """simnode switches ``unreachable`` while it runs (what ``runbook sim fault`` does); other Talos faults it
    takes from its nodes file when it starts, so it is restarted on the nodes as it observed them (what a new
    ``runbook sim up --scenario`` would serve). A fault simnode does not simulate fails the test, which must
    then say why it runs the Python talosctl (``python_talosctl``). Nothing to do for the Python talosctl,
    which reads the node files at each call."""
    if not runs_real_talosctl(state_dir):
        return
    if fault == "unreachable":
        cluster.sync_talos_faults(state_dir)  # returns once talosctl meets each node as its fault says
        return
    _restart_simnode(state_dir, f"{fault} on {node}")


def serve_node_files(state_dir: Path) -> None:
    """A test edited the node files after the cluster started (``locked_node``, ``install_nvidia``): simnode
    serves them as written from now on (what it observed so far is dropped); nothing to do for the Python
    talosctl, which reads them at each call."""
    if runs_real_talosctl(state_dir):
        shutil.rmtree(realtalos.paths(state_dir).dir / "observed", ignore_errors=True)
        _restart_simnode(state_dir, "the edited node files")


def _restart_simnode(state_dir: Path, what: str) -> None:
    made, nodes = load_cluster(state_dir), load_nodes(state_dir)
    spec = cluster.ClusterSpec(
        talos_version=made["talos_version"], scenario=made["scenario"], latency_ms=nodes[0].latency_ms
    )
    choice = cluster.start_talos(state_dir, spec, nodes)
    assert choice.real, f"{what}: {choice.reason}; this test must run the Python talosctl (python_talosctl)"


def python_talosctl(monkeypatch: pytest.MonkeyPatch, why: str) -> None:
    """This test's cluster runs the Python talosctl whatever ``RUNBOOK_SIM_TALOSCTL`` says. ``why`` names what
    simnode or the real talosctl does not do that the test needs (a fault it does not simulate, a text only
    the Python talosctl prints, the Python talosctl itself under test); it is not otherwise used."""
    assert why
    monkeypatch.setenv(realtalos.MODE_ENV, "python")


def node_config(ctx: Context, address: str) -> str:
    """The node's machine config as talosctl shows it (what a user would look at)."""
    return ctx.talosctl.run(["get", "machineconfig", "-o", "yaml"], [address]).stdout


# ---------------------------------------------------------------- simnode current for the sources


class StaleSimnode(RuntimeError):
    """A talosctl is built but simnode is not built for these sources, and building it failed: ``auto`` would
    run the Python talosctl in every test without saying so."""


def _run_build_script(name: str) -> Path:
    """``tools/<name>`` with Go on PATH: the binary's path (its last output line), ``StaleSimnode`` on failure."""
    go = shutil.which("go") or shutil.which("go", path="/usr/local/go/bin")
    path = f"{Path(go).parent}:{os.environ.get('PATH', '')}" if go else os.environ.get("PATH", "")
    script = str(realtalos.ROOT / "tools" / name)
    done = subprocess.run(
        [script], capture_output=True, text=True, env={**os.environ, "PATH": path}, check=False
    )
    if done.returncode != 0:
        raise StaleSimnode(f"tools/{name} failed: {done.stderr.strip()[-2000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


def build_simnode() -> Path:
    """``tools/build-simnode.sh`` (what ``make tools`` runs; ~3 s warm on the 2-core machine): the binary's path."""
    return _run_build_script("build-simnode.sh")


def ensure_current_simnode(build: Callable[[], Path] = build_simnode) -> Path | None:
    """Build simnode for the current sources when a talosctl is built (``make tools`` ran) but simnode's
    sources changed since: otherwise ``RUNBOOK_SIM_TALOSCTL=auto`` falls back to the Python talosctl in every
    test, unnoticed. Nothing to do with no talosctl built, with ``python`` chosen, or with simnode current.
    Returns the simnode built, None when none was needed; ``StaleSimnode`` when the build failed."""
    if realtalos.mode() == "python" or not realtalos.SIMNODE_SRC.is_dir():
        return None
    if not any(realtalos.tools_cache().glob("talosctl/v*/talosctl")) or realtalos.cached_simnode():
        return None
    try:
        built = build()
    except (OSError, StaleSimnode) as exc:
        raise StaleSimnode(
            f"talosctl is built in {realtalos.tools_cache()} but simnode is not built for the sources in "
            f"{realtalos.SIMNODE_SRC} (hash {realtalos.simnode_hash()}), and building it failed: {exc}. Fix the "
            f"build and run `make tools`, or run the tests on the Python talosctl knowingly with "
            f"{realtalos.MODE_ENV}=python"
        ) from exc
    if realtalos.cached_simnode() is None:
        raise StaleSimnode(
            f"simnode built at {built}, but not for the sources' hash {realtalos.simnode_hash()}"
        )
    return built


def build_simkube() -> Path:
    """``tools/build-simkube.sh`` (what ``make kube-tools`` runs; standard library only, seconds warm)."""
    return _run_build_script("build-simkube.sh")


def ensure_current_simkube(build: Callable[[], Path] = build_simkube) -> Path | None:
    """Build simkube for the current sources when a control plane is built (``make kube-tools`` ran) but
    simkube's sources changed since: ``realkube.find_tools`` would call the plane "not built" and every test that
    starts the simulator would stop on it (the Python Kubernetes API they once fell back to, unnoticed, was retired
    in issue 15). Nothing to do with no control plane built, or with simkube current."""
    if not (realtalos.ROOT / "simkube").is_dir():
        return None
    wanted = realkube.cache_root() / "simkube" / realkube.simkube_key() / "simkube"
    if not any(realkube.cache_root().glob("kube/v*/bin/kube-apiserver")) or wanted.is_file():
        return None
    try:
        built = build()
    except (OSError, StaleSimnode) as exc:
        raise StaleSimnode(
            f"a Kubernetes control plane is built in {realkube.cache_root()} but simkube is not built for the "
            f"sources in {realtalos.ROOT / 'simkube'} (key {realkube.simkube_key()}), and building it failed: "
            f"{exc}. Fix the build and run `make kube-tools`"
        ) from exc
    return built


def failing_boot_id_read(tmp_path: Path, real: str, address: str) -> str:
    """A talosctl whose ``read`` of the boot ID fails on ``address``, with the error gRPC gives a call that
    times out (a transient network failure: simnode has no fault that fails one call and answers the next);
    every other call is the real talosctl's."""
    script = tmp_path / "talosctl-boot-id-fails"
    error = (
        'rpc error: code = Unavailable desc = connection error: desc = "transport: Error while dialing: '
        f'dial tcp {address}:50000: i/o timeout"'
    )
    script.write_text(
        "#!/bin/sh\n"
        f'case " $* " in *" -n {address} "*" {BOOT_ID_PATH} "*) echo \'{error}\' >&2; exit 1;; esac\n'
        f'exec {shlex.quote(real)} "$@"\n'
    )
    script.chmod(0o755)
    return str(script)
