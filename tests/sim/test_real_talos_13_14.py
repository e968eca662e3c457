"""Talos 1.3 and 1.4 nodes on the real talosctl of their release (v1.3.5, v1.4.0) against simnode (issue 14, the
releases before the Image Factory).

Before 1.5 there is no Image Factory: the NVIDIA extensions reach a node through ``machine.install.extensions``,
which the installer run of an upgrade pulls beside the stock ``ghcr.io/siderolabs/installer`` (talos@v1.4.8
internal/pkg/install/install.go:59,103; v1.3.7:58,102; simnode/installext.go). The runbook's config patch lists
them and its image step upgrades to the stock installer (runbook_lib/model/profiles.py). What else differs from
1.5 and is simulated (simnode/legacy18.go, storage.go, lifecycle.go, each cited): the boot sequence's phase count
(19 in 1.3, 18 in 1.4), the upgrade's boot-partition phases, 1.3's phases ending with a second START, 1.3's base
services (no dashboard), and talosctl 1.3's upgrade post check, StorageService.Disks. talosctl v1.4.0 and v1.3.5
are the newest of their releases the Go module proxy serves; they are not built by ``.ci/run``: these tests skip,
saying so, unless they are in the tools cache.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from runbook_lib.sim import cluster, realtalos
from runbook_lib.sim.talosctl import images
from tests.sim.test_real_talos_13_16 import TRACK
from tests.sim.test_real_talos_110_111 import (
    Release,
    assert_run_applies_all_six_steps,
    assert_stops_at_its_step_on_the_last_worker,
    built_talosctl,
    run_args,
    run_env,
    serve,
)
from tests.sim.test_real_talosctl import Sim, build, start_simnode
from tests.sim.test_real_talosctl_lifecycle import REBOOT_MS, upgrade_argv
from tests.sim.test_sim_up_real_talosctl import runbook

pytestmark = pytest.mark.slow

#: (the nodes' release: the newest patch the simulator knows, state.LATEST_PATCH; the talosctl that pairs with it)
RELEASES = [("v1.4.8", "v1.4.0"), ("v1.3.7", "v1.3.5")]
IDS = [client for _talos, client in RELEASES]
NVIDIA = ("nvidia-open-gpu-kernel-modules", "nvidia-container-toolkit")


@pytest.fixture(scope="module", params=RELEASES, ids=IDS)
def release(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Release]:
    """A fresh cluster of the release: GPU workers on the stock installer, no modules patch."""
    talos, client = request.param
    yield from serve(tmp_path_factory.mktemp(f"fresh-{client}"), talos, client, "fresh")


def test_the_base_services_are_the_release_s(release: Release) -> None:
    """1.4 starts dashboard (talos@v1.4.8 v1alpha1_sequencer.go:122-123, v1alpha1_sequencer_tasks.go:833-843); 1.3
    has no dashboard service (no dashboard.go in v1.3.7 internal/app/machined/pkg/system/services/)."""
    proc = release.sim.run("-n", release.nodes[1], "service")
    assert proc.returncode == 0, proc.stderr
    ids = [re.split(r"\s+", line.strip())[1] for line in proc.stdout.splitlines()[1:]]
    base = ["apid", "containerd", "cri", "kubelet", "machined", "udevd"]
    expected = sorted([*base, "dashboard"]) if release.talos.startswith("v1.4.") else base
    assert ids == expected, proc.stdout


def test_a_node_on_the_stock_installer_lists_no_extension_at_all(release: Release) -> None:
    """The stock ghcr.io installer carries no extension, and no Image Factory built a 1.3/1.4 installer, so there
    is no virtual "schematic" extension either (the factory builds 1.5 and later: runbook_lib/sim/catalog.py);
    simnode and the Python talosctl listed one."""
    proc = release.sim.run("-n", release.nodes[1], "get", "extensions", "-o", "json")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "", proc.stdout


@pytest.mark.parametrize(("talos", "client"), RELEASES, ids=IDS)
def test_runbook_run_installs_the_extensions_from_the_config_and_a_second_run_changes_nothing(
    tmp_path: Path, talos: str, client: str
) -> None:
    """Issue 14 for 1.3 and 1.4: ``runbook run --set talos_version=<1.4.8> --apply`` with the real talosctl of the
    release. The config patch lists the ghcr.io NVIDIA images in machine.install.extensions; the image step upgrades
    to the stock installer with ``--preserve``, and the installer run installs them; a second run (simnode
    stopped and resumed from what it observed) finds nothing to change."""
    for observed in assert_run_applies_all_six_steps(tmp_path, talos, client, *TRACK):
        assert observed["image"] == f"ghcr.io/siderolabs/installer:{talos}", observed["image"]
        installed = [e["name"] for e in observed.get("config_extensions", [])]
        assert sorted(installed) == sorted(NVIDIA), observed
    [image] = (tmp_path / "records").glob("*/results/image.json")
    assert image.read_text().count('"--preserve"') == 3, "the image step's three upgrades pass --preserve"
    second = runbook(run_env(tmp_path, client), *run_args(tmp_path, talos, *TRACK))
    assert second.returncode == 0, second.stdout + second.stderr
    assert "nothing changed on the cluster" in second.stdout


def catalog_ref(talos: str, name: str) -> str:
    """The ghcr.io image of the official extension ``name`` for the release, from the factory room's catalog."""
    [ref] = [e["ref"] for e in images.official_extensions(talos) if e["name"] == f"siderolabs/{name}"]
    return ref


@pytest.mark.parametrize(("talos", "client"), RELEASES, ids=IDS)
@pytest.mark.parametrize("scenario", ["upgrade-fails", "upgrade-hangs"])
def test_a_fault_stops_the_run_at_its_step_on_the_faulty_node_only(
    tmp_path: Path, talos: str, client: str, scenario: str
) -> None:
    """test_real_faults' check on 1.3 and 1.4: the image step fails on gpu-worker-3 alone, with its diagnosis,
    also where talosctl 1.3 exits 0 (upgrade-fails: its installer fails, simnode/faults.go; upgrade-hangs: its new
    boot waits on ext-nvidia-persistenced and rolls back)."""
    assert_stops_at_its_step_on_the_last_worker(tmp_path, talos, client, scenario, *TRACK)


def with_install_extensions(config: str, images: list[str], *, modules: bool = True) -> str:
    """The node's config with machine.install.extensions listing ``images`` and the NVIDIA modules (without them
    the new boot waits for ext-nvidia-persistenced and rolls back: the runbook patches both before it upgrades)."""
    docs = [d for d in yaml.safe_load_all(config) if d]
    for doc in docs:
        if doc.get("version") == "v1alpha1" and "kind" not in doc:
            doc["machine"].setdefault("install", {})["extensions"] = [{"image": i} for i in images]
            names = ["nvidia", "nvidia_uvm", "nvidia_drm", "nvidia_modeset"] if modules else []
            if names:
                doc["machine"].setdefault("kernel", {})["modules"] = [{"name": m} for m in names]
    return yaml.safe_dump_all(docs, sort_keys=False)


def resolver(cluster_dir: Path, path: Path) -> Path:
    """simnode's -image-resolver for the cluster (as realtalos writes it for ``runbook sim up``)."""
    path.write_text(
        f'#!/bin/sh\nexec {sys.executable} -m runbook_lib.sim.realtalos resolve-image --state {cluster_dir} "$@"\n'
    )
    path.chmod(0o700)
    return path


@pytest.mark.parametrize(("talos", "client"), RELEASES, ids=IDS)
def test_an_extension_image_that_does_not_pull_fails_that_node_s_upgrade_only(
    tmp_path: Path, talos: str, client: str
) -> None:
    """Two workers upgraded in one ``talosctl upgrade --wait``: one lists the release's NVIDIA images in
    machine.install.extensions, the other also an image no registry has. The installer run's pull fails the
    upgrade task ("failed to pull image %q", talos@v1.4.8 internal/pkg/containers/image/image.go:90; its
    "failed to resolve reference … not found" is containerd's, as the Python talosctl words it, not captured), so
    that node keeps its image; the other boots with the extensions. talosctl 1.4 exits 1; talosctl 1.3 exits 0
    although a node failed, its tracker goroutine returning nil (talos@v1.3.5 cmd/talosctl/pkg/talos/action/
    tracker.go:172-185): the image step judges each node by its own lines (runbook_lib/steps/image.py)."""
    talosctl = built_talosctl(client)
    spec = cluster.ClusterSpec(workers=2, talos_version=talos, scenario="fresh")
    nodes = cluster.create(tmp_path / "cluster", spec)
    doc: dict[str, Any] = realtalos.nodes_document(tmp_path / "cluster", nodes, 0)
    kmod, toolkit = (catalog_ref(talos, name) for name in NVIDIA)
    missing = "ghcr.io/siderolabs/no-such-extension:v0.0.0"
    ok_node, bad_node = doc["nodes"][1], doc["nodes"][2]
    ok_node["machine_config"] = with_install_extensions(ok_node["machine_config"], [kmod, toolkit])
    bad_node["machine_config"] = with_install_extensions(bad_node["machine_config"], [kmod, missing])
    for node in doc["nodes"]:
        node["reboot_ms"] = REBOOT_MS
    state = tmp_path / "state"
    flags = [
        "-image-resolver",
        str(resolver(tmp_path / "cluster", tmp_path / "resolve")),
        "-time-factor",
        "0.01",
    ]
    proc = start_simnode(build("build-simnode.sh"), state, doc, *flags)
    sim = Sim(talosctl, state / "talosconfig")
    try:
        addresses = f"{ok_node['address']},{bad_node['address']}"
        argv = [*upgrade_argv(sim, addresses, f"ghcr.io/siderolabs/installer:{talos}", "60s"), "--preserve"]
        up = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120)
        exts = sim.run("-n", ok_node["address"], "get", "extensions", "-o", "json")
        bad_exts = sim.run("-n", bad_node["address"], "get", "extensions", "-o", "json")
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert up.returncode == (0 if client.startswith("v1.3.") else 1), up.stderr
    assert f'"{ok_node["address"]}": post check passed' in up.stderr, up.stderr
    failed = [line for line in up.stderr.splitlines() if line.startswith(f'"{bad_node["address"]}"')]
    assert any(f'failed to pull image "{missing}"' in line for line in failed), up.stderr
    assert all(name in exts.stdout for name in NVIDIA), exts.stdout
    assert not any(name in bad_exts.stdout for name in NVIDIA), bad_exts.stdout


def test_the_resolver_answers_an_extension_image_and_refuses_an_unknown_one(tmp_path: Path) -> None:
    """simnode asks ``resolve-image --extension REF`` (simnode/images.go lookupExtension); an image the catalog
    does not have is one the registry would answer 404 for."""
    spec = cluster.ClusterSpec(workers=1, talos_version="v1.4.8", scenario="fresh")
    cluster.create(tmp_path / "cluster", spec)
    ref = catalog_ref("v1.4.8", "nvidia-open-gpu-kernel-modules")
    answer = realtalos.resolve_extension(tmp_path / "cluster", ref)
    assert answer["name"] == "nvidia-open-gpu-kernel-modules" and answer["version"] == ref.rpartition(":")[2]
    assert answer["compatibility"] == ">= v1.4.0"
    script = resolver(tmp_path / "cluster", tmp_path / "resolve")
    run = subprocess.run(
        [script, "--extension", ref], capture_output=True, text=True, check=False, timeout=60
    )
    assert run.returncode == 0 and json.loads(run.stdout) == answer, run.stderr
    missing = subprocess.run(
        [script, "--extension", "ghcr.io/siderolabs/nope:1"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert missing.returncode == 1
    assert (
        'failed to resolve reference "ghcr.io/siderolabs/nope:1": ghcr.io/siderolabs/nope:1: not found'
        in missing.stderr
    )


#: The metal boot sequence's phase startEverything, which a hung boot's error names by number (simnode/legacy18.go
#: bootPhases): 18 in talos@v1.4.8 v1alpha1_sequencer.go Boot (validateConfig where 1.5 has extendPCRStartAll), 19
#: in v1.3.7 (udevSetup and udevd). BootTimeout is 70 min (pkg/machinery/constants/constants.go at both tags),
#: scaled to 12 s.
BOOT_PHASE = {"v1.4.8": 18, "v1.3.7": 19}


@pytest.mark.parametrize(("talos", "client"), RELEASES, ids=IDS)
def test_a_hung_boot_fails_naming_the_release_s_start_everything_phase(
    tmp_path: Path, talos: str, client: str
) -> None:
    """A worker upgraded with the NVIDIA images in machine.install.extensions but not the modules in its config
    waits for ext-nvidia-persistenced until BootTimeout; the boot sequence fails naming startEverything by its
    number, which the real tracker prints, and the node rolls back (exit 1 from talosctl 1.4, 0 from 1.3)."""
    talosctl = built_talosctl(client)
    nodes = cluster.create(
        tmp_path / "cluster", cluster.ClusterSpec(workers=1, talos_version=talos, scenario="fresh")
    )
    doc: dict[str, Any] = realtalos.nodes_document(tmp_path / "cluster", nodes, 0)
    worker = doc["nodes"][1]
    images = [catalog_ref(talos, name) for name in NVIDIA]
    worker["machine_config"] = with_install_extensions(worker["machine_config"], images, modules=False)
    worker["reboot_ms"] = REBOOT_MS
    state = tmp_path / "state"
    factor = str(12.0 / (70 * 60))
    flags = [
        "-image-resolver",
        str(resolver(tmp_path / "cluster", tmp_path / "resolve")),
        "-time-factor",
        factor,
    ]
    proc = start_simnode(build("build-simnode.sh"), state, doc, *flags)
    try:
        stock = f"ghcr.io/siderolabs/installer:{talos}"
        argv = [
            *upgrade_argv(Sim(talosctl, state / "talosconfig"), worker["address"], stock, "60s"),
            "--preserve",
        ]
        up = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    failure = f"sequence failed: error running phase {BOOT_PHASE[talos]} in boot sequence: task 1/1: failed"
    assert f'"{worker["address"]}": error: sequence error: {failure}' in up.stderr, up.stderr
    assert up.returncode == (0 if client.startswith("v1.3.") else 1), up.stderr
