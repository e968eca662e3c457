"""Talos 1.9, 1.10 and 1.11 nodes on the real talosctl of their release (v1.9.0, v1.10.0, v1.11.0) against simnode
(issue 14).

simnode is built on pkg/machinery v1.13.0; a node reporting 1.9, 1.10 or 1.11 answers as those releases' machined
where the difference reaches the runbook (each cited in simnode/legacy.go). ``.ci/run`` builds v1.10.0 and v1.11.0
(since 4 Dec 2026), not v1.9.0; a release that is not built skips, saying so, until ``tools/build-talosctl.sh
v1.9.0`` / ``v1.10.0`` / ``v1.11.0`` builds it.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from runbook_lib.model.boot_assets import installer_kind
from runbook_lib.sim import cluster, realtalos
from tests.fault_cases import RUN_CASES, STEPS, assert_fails_on_one_node
from tests.sim.talosctl_legs import built_talosctl
from tests.sim.test_real_faults import NODE_READY_SECONDS, TIME_SCALE, UPGRADE_SECONDS
from tests.sim.test_real_talosctl import Sim, build, start_simnode
from tests.sim.test_sim_up_real_talosctl import runbook, step_lines

pytestmark = pytest.mark.slow

#: (the nodes' release: the newest patch the simulator knows, state.LATEST_PATCH; the talosctl that pairs with it)
RELEASES = [("v1.11.6", "v1.11.0"), ("v1.10.9", "v1.10.0"), ("v1.9.6", "v1.9.0")]
MODULES_PATCH = "machine:\n  kernel:\n    modules:\n      - name: nvidia\n"


@dataclass(frozen=True)
class Release:
    sim: Sim
    nodes: list[str]  # the addresses: control plane first, then the GPU workers
    talos: str


def serve(tmp: Path, talos: str, client: str, scenario: str) -> Iterator[Release]:
    """simnode serving the nodes ``runbook sim up`` makes for the release and scenario (as
    ``realtalos.nodes_document`` writes them), and the real talosctl of that release."""
    talosctl = built_talosctl(client)
    simnode = build("build-simnode.sh")
    spec = cluster.ClusterSpec(workers=2, talos_version=talos, scenario=scenario)
    nodes = cluster.create(tmp / "cluster", spec)
    proc = start_simnode(simnode, tmp / "state", realtalos.nodes_document(tmp / "cluster", nodes, 0))
    yield Release(Sim(talosctl, tmp / "state" / "talosconfig"), [n.address for n in nodes], talos)
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture(scope="module", params=RELEASES, ids=[r[1] for r in RELEASES])
def release(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Release]:
    """A fresh cluster of the release: GPU workers on the vanilla schematic, no modules patch."""
    talos, client = request.param
    yield from serve(tmp_path_factory.mktemp(f"fresh-{client}"), talos, client, "fresh")


@pytest.fixture(scope="module", params=RELEASES, ids=[r[1] for r in RELEASES])
def gpu_ready(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Release]:
    """GPU workers on the NVIDIA schematic with the modules patch: the NVIDIA modules are loaded."""
    talos, client = request.param
    yield from serve(tmp_path_factory.mktemp(f"ready-{client}"), talos, client, "gpu-ready")


def test_get_machineconfig_spec_is_the_config_document_as_that_release_sends_it(release: Release) -> None:
    """talos@v1.11.0 (and v1.10.0) pkg/machinery/resources/config/machine_config.go: the spec's YAML is the
    config document itself (``MarshalYAMLBytes``), with no ``talos.dev/yaml-spec`` annotation; 1.12 made it a
    YAML string and added the annotation (talos commit 92eeaa482, "fix: update YAML library"). talosctl 1.11's
    ``-o yaml`` prints that document as the spec string (cmd/talosctl/cmd/talos/output/yaml.go mcYamlRepr)."""
    proc = release.sim.run("-n", release.nodes[1], "get", "machineconfig", "-o", "yaml")
    assert proc.returncode == 0, proc.stderr
    doc = yaml.safe_load(proc.stdout)
    config = yaml.safe_load(doc["spec"])
    assert isinstance(config, dict) and config["version"] == "v1alpha1", doc["spec"][:200]
    assert config["machine"]["install"]["image"].endswith(release.talos)
    assert "talos.dev/yaml-spec" not in proc.stdout


def patch_dry_run(release: Release, tmp: Path, patch: str) -> subprocess.CompletedProcess[str]:
    """``talosctl patch machineconfig --patch @<file> --dry-run`` on the first GPU worker."""
    path = tmp / "patch.yaml"
    path.write_text(patch)
    return release.sim.run(
        "-n", release.nodes[1], "patch", "machineconfig", "--patch", f"@{path}", "--dry-run"
    )


def test_patch_dry_run_prints_the_config_diff(release: Release, tmp_path: Path) -> None:
    """talosctl 1.11's ``patch`` marshals the spec and patches it as a document (talos@v1.11.0:cmd/talosctl/cmd/
    talos/patch.go:53-58): against a node answering 1.13's string spec it failed with the decoder's ``recovered:
    expected a mapping node``. The diff is machined's DiffToString, unchanged from 1.10 to 1.12."""
    proc = patch_dry_run(release, tmp_path, MODULES_PATCH)
    assert proc.returncode == 0, proc.stderr
    assert "Dry run summary:" in proc.stderr + proc.stdout
    assert "+    kernel:\n+        modules:\n+            - name: nvidia\n" in proc.stderr
    [header] = [line for line in proc.stderr.splitlines() if line.startswith("@@")]
    if release.talos.startswith("v1.9."):
        # talos@v1.9.0:pkg/machinery/config/configdiff/configdiff.go:112 prints the hunk header's " @@\n" to
        # machined's stdout (cyan.Printf), not into the diff: the header runs on into the hunk's first line
        # (fixed by talos commit f35b58779, "fix: fix diff printing", first in v1.10.0).
        assert header.startswith("@@ -27,6 +27,9         hostDNS:"), header
    else:
        assert header == "@@ -27,6 +27,9 @@", header


def test_a_misspelt_key_is_still_refused_naming_it(release: Release, tmp_path: Path) -> None:
    """The release's own config decoding is strict: talosctl refuses the patch before any call changes the node."""
    proc = patch_dry_run(release, tmp_path, MODULES_PATCH.replace("modules", "modlues"))
    assert proc.returncode != 0
    assert "modlues" in proc.stderr, proc.stderr


NVIDIA_MODULES = ["nvidia", "nvidia_drm", "nvidia_modeset", "nvidia_uvm"]


def test_proc_modules_lists_the_loaded_nvidia_modules(gpu_ready: Release) -> None:
    """What verify reads before Talos 1.11 (runbook_lib/model/profiles.py module_check): ``talosctl read
    /proc/modules``, in the kernel's format (name size refcount users state address taints), newest first
    (nvidia, loaded first, last). Refcount and users are numbers and ``name,`` lists on these releases, whose
    kernels have CONFIG_MODULE_UNLOAD (siderolabs/pkgs@v1.9.0 kernel/build/config-amd64:936, set up to v1.14.0;
    Talos's own parser reads the refcount as a number: talos@v1.11.0 internal/app/machined/pkg/controllers/
    runtime/loaded_kernel_module.go:111). The Talos docs' sample ``nvidia_uvm 1146880 - - Live …`` is a 1.0-era
    kernel's, without it (pkgs@v1.8.0 :889), copied unchanged into later docs."""
    proc = gpu_ready.sim.run("-n", gpu_ready.nodes[1], "read", "/proc/modules")
    assert proc.returncode == 0, proc.stderr
    rows = {line.split()[0]: line.split() for line in proc.stdout.splitlines()}
    assert sorted(rows) == NVIDIA_MODULES and proc.stdout.splitlines()[-1].startswith("nvidia "), proc.stdout
    assert rows["nvidia"][2:5] == ["2", "nvidia_uvm,nvidia_modeset,", "Live"], proc.stdout
    assert rows["nvidia_modeset"][2:4] == ["1", "nvidia_drm,"] and rows["nvidia_drm"][2:4] == ["0", "-"]
    assert all(r[5].startswith("0x") for r in rows.values()), proc.stdout


def test_get_modules_is_the_config_s_module_specs_on_1_10_and_the_loaded_modules_from_1_11(
    gpu_ready: Release,
) -> None:
    """``modules`` is KernelModuleSpec's alias on 1.10 (the config's machine.kernel.modules, no State column) and
    LoadedKernelModule's from 1.11 (talos@v1.10.0 / v1.11.0:pkg/machinery/resources/runtime/kernel_module_spec.go,
    loaded_kernel_module.go)."""
    proc = gpu_ready.sim.run("-n", gpu_ready.nodes[1], "get", "modules")
    assert proc.returncode == 0, proc.stderr
    header, *rows = [line.split() for line in proc.stdout.splitlines() if line.strip()]
    assert sorted(r[3] for r in rows) == NVIDIA_MODULES, proc.stdout
    if not gpu_ready.talos.startswith("v1.11."):  # 1.9 as 1.10 (v1.9.0, same files)
        assert header[-1] == "VERSION" and {r[2] for r in rows} == {"KernelModuleSpec"}, proc.stdout
    else:
        assert header[-1] == "STATE" and {(r[2], r[-1]) for r in rows} == {("LoadedKernelModule", "Live")}


# ---------------------------------------------------------------- runbook run on 1.11 and 1.10


def run_env(tmp: Path, client: str) -> dict[str, str]:
    """A user who built the release's talosctl and asks for it (``real`` would build a missing one for minutes:
    the test skips instead), with Talos's durations scaled down as in test_real_faults."""
    built_talosctl(client)
    build("build-simnode.sh")
    return {
        **os.environ,
        "RUNBOOK_SIM_TALOSCTL": "real",
        "RUNBOOK_SIM_TIME_SCALE": TIME_SCALE,
        "RUNBOOK_RECORDS": str(tmp / "records"),
    }


def run_args(tmp: Path, talos: str, *more: str) -> list[str]:
    args = ["run", "-p", "params/simulated.yaml", "--set", f"talos_version={talos}", "--apply"]
    args += ["--set", f"timeouts.upgrade_seconds={UPGRADE_SECONDS}"]
    return [*args, "--state", str(tmp / "state"), "--no-progress", *more]


@pytest.mark.parametrize(("talos", "client"), RELEASES, ids=[r[1] for r in RELEASES])
def test_runbook_run_applies_all_six_steps_and_a_second_run_changes_nothing(
    tmp_path: Path, talos: str, client: str
) -> None:
    """Issue 14 for 1.9-1.11: ``runbook run --set talos_version=<1.11.x> --apply`` with the real talosctl of the
    release. Before simnode answered as these releases the config-patch step failed on every node with talosctl's
    ``recovered: expected a mapping node``; before 1.11 verify reads ``/proc/modules``, which simnode did not serve.
    The image step upgrades to the factory's installer for the release (``installer`` before 1.10)."""
    env = run_env(tmp_path, client)
    for observed in assert_run_applies_all_six_steps(tmp_path, talos, client):
        assert f"/{installer_kind(talos, 'metal')}/" in observed["image"] and observed["image"].endswith(
            f":{talos}"
        )
    second = runbook(env, *run_args(tmp_path, talos))
    assert second.returncode == 0, second.stdout + second.stderr
    assert "nothing changed on the cluster" in second.stdout


def assert_run_applies_all_six_steps(
    tmp_path: Path, talos: str, client: str, *more: str
) -> list[dict[str, Any]]:
    """``runbook run --apply`` (with ``more`` arguments) of a fresh cluster of the release passes, changing
    config-patch, image and kubernetes; every GPU worker is booted on the release. Returns simnode's observed state
    of each worker."""
    run = runbook(run_env(tmp_path, client), *run_args(tmp_path, talos, *more))
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"simulated Talos nodes: real talosctl {client} against simnode" in run.stderr
    changed = ["config-patch", "image", "kubernetes"]  # preflight, verify and cuda-test: ok
    assert [s for s, outcome in step_lines(run.stdout).items() if outcome != "ok"] == changed, run.stdout
    out = []
    for node in ("gpu-worker-1", "gpu-worker-2", "gpu-worker-3"):
        observed = json.loads((tmp_path / "state" / "simnode" / "observed" / f"{node}.json").read_text())
        assert observed["talos_version"] == talos and observed["booted"], observed
        out.append(observed)
    return out


@pytest.mark.parametrize(("talos", "client"), RELEASES, ids=[r[1] for r in RELEASES])
@pytest.mark.parametrize("scenario", ["upgrade-fails", "toolkit-missing"])
def test_a_fault_stops_the_run_at_its_step_on_the_faulty_node_only(
    tmp_path: Path, talos: str, client: str, scenario: str
) -> None:
    """test_real_faults' check on the older releases: the step, the node (scenarios.py breaks the last worker)
    and the diagnosis tests/fault_cases.py expects, whichever talosctl answers."""
    assert_stops_at_its_step_on_the_last_worker(tmp_path, talos, client, scenario)


def assert_stops_at_its_step_on_the_last_worker(
    tmp_path: Path, talos: str, client: str, scenario: str, *extra: str
) -> None:
    """``runbook run`` of the scenario on the release fails at the step tests/fault_cases.py expects, there on
    gpu-worker-3 only (scenarios.py breaks the last worker), with its diagnosis, and runs no later step."""
    expected, needle = RUN_CASES[scenario]
    assert expected is not None
    more = ["--steps", ",".join(STEPS), "--set", f"simulation.scenario={scenario}"]
    more += ["--set", f"timeouts.node_ready_seconds={NODE_READY_SECONDS}", *extra]
    proc = runbook(run_env(tmp_path, client), *run_args(tmp_path, talos, *more))
    assert f"simulated Talos nodes: real talosctl {client} against simnode" in proc.stderr, proc.stderr
    outcomes = [step_lines(proc.stdout).get(step) for step in STEPS]
    stop = STEPS.index(expected)
    assert proc.returncode != 0 and set(outcomes[:stop]) <= {"ok", "changed"}, proc.stdout + proc.stderr
    assert outcomes[stop:] == ["failed"] + [None] * (len(STEPS) - stop - 1), proc.stdout
    [result] = (tmp_path / "records").glob(f"*/results/{expected}.json")
    failing = assert_fails_on_one_node(json.loads(result.read_text())["result"], needle)
    assert failing["node"] == "gpu-worker-3", failing["node"]
