"""Talos 1.5 and 1.6 nodes on the real talosctl of their release (v1.5.5, v1.6.7) against simnode (issue 14, the
releases before 1.7).

talosctl v1.6.7 and v1.5.5 build with today's Go (``tools/build-talosctl.sh v1.6.7`` / ``v1.5.5``; the module proxy
refuses v1.5.5's go.mod, so the script takes it from the module's zip, recorded in substitutions.txt); 1.4 and 1.3
nodes keep the Python talosctl (see the README). simnode answers a 1.6 node as a 1.7 one (simnode/legacy18.go):
what the runbook calls is unchanged between talos@v1.6.7 and v1.7.0 (internal/app/machined/internal/server/v1alpha1/
v1alpha1_server.go: ApplyConfiguration, Read, Upgrade, ServiceList identical but for error constructors;
v1alpha1_sequencer.go: the same boot and upgrade phases; cmd/installer/pkg/install/manifest.go: an upgrade without
``--preserve`` re-creates EPHEMERAL as in 1.7; the ExtensionStatus, KernelModuleSpec, Service, MachineConfig,
PlatformMetadata and Nodename resources unchanged; talosctl's upgrade and tracker unchanged). The one difference
the runbook meets is the base services: no syslogd before 1.7 (state.SERVICE_SINCE). A 1.5 node answers as a 1.6
one: from talos@v1.5.5 to v1.6.7 those files change only in the upgrade's etcd lock of a control-plane node and
library renames, the upgrade sequence and manifest.go are identical, and the metal boot sequence has two more
phases (containerd, legacyCleanup: v1alpha1_sequencer.go Boot, simnode/legacy18.go bootPhases). talosctl 1.5's
``read`` also collects errors the node streams in its messages' metadata (pkg/machinery/client/client.go Read at
v1.5.5, dropped in 1.6). The binaries are not built by ``.ci/run``: these tests skip, saying so, unless they are in
the tools cache.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runbook_lib.model.profiles import DRIVER_TABLE
from runbook_lib.sim.state import minor_of
from tests.sim.test_real_talos_17_18 import assert_no_cluster_secret_recorded, upgrade_without_preserve
from tests.sim.test_real_talos_110_111 import (
    MODULES_PATCH,
    Release,
    assert_run_applies_all_six_steps,
    built_talosctl,
    patch_dry_run,
    run_args,
    run_env,
    serve,
)
from tests.sim.test_real_talosctl import Sim, build, start_simnode
from tests.sim.test_real_talosctl_lifecycle import (
    BASE_SERVICES,
    NVIDIA_ID,
    REBOOT_MS,
    VANILLA_ID,
    schematic_ext,
    upgrade_argv,
    worker_configs,
)
from tests.sim.test_sim_up_real_talosctl import runbook

pytestmark = pytest.mark.slow

#: (the nodes' release: the newest patch the simulator knows, state.LATEST_PATCH; the talosctl that pairs with it)
RELEASES = [("v1.6.7", "v1.6.7"), ("v1.5.5", "v1.5.5")]
IDS = [client for _talos, client in RELEASES]
#: params/simulated.yaml's ``track: lts`` is refused before 1.8 (one driver per release then).
TRACK = ("--set", "track=null")


@pytest.fixture(scope="module", params=RELEASES, ids=IDS)
def release(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Release]:
    """A fresh cluster of the release: GPU workers on the vanilla schematic, no modules patch."""
    talos, client = request.param
    yield from serve(tmp_path_factory.mktemp(f"fresh-{client}"), talos, client, "fresh")


def test_the_base_services_are_1_5_and_1_6_s(release: Release) -> None:
    """talos@v1.6.7 v1alpha1_sequencer_tasks.go starts no syslogd (v1.7.0:636 does) nor auditd (v1.9.0:363); nor does
    v1.5.5's, which starts dashboard (:622) as every release from 1.4."""
    proc = release.sim.run("-n", release.nodes[1], "service")
    assert proc.returncode == 0, proc.stderr
    ids = [re.split(r"\s+", line.strip())[1] for line in proc.stdout.splitlines()[1:]]
    assert ids == ["apid", "containerd", "cri", "dashboard", "kubelet", "machined", "udevd"], proc.stdout


def test_patch_dry_run_diff_is_go_cmp_s_report(release: Release, tmp_path: Path) -> None:
    """talos@v1.6.7 v1alpha1_server.go:227-240, as v1.7.0 and v1.5.5 (:227-240): ``cmp.Diff`` of the two v1alpha1 structs after
    ``Config diff:`` (no blank line), the summary line the config-patch step reads as on every release."""
    proc = patch_dry_run(release, tmp_path, MODULES_PATCH)
    assert proc.returncode == 0, proc.stderr
    assert "Dry run summary:\nApplied configuration without a reboot (skipped in dry-run).\n" in proc.stderr
    assert "Config diff:\n" in proc.stderr and "Config diff:\n\n" not in proc.stderr, proc.stderr
    [added] = [line for line in proc.stderr.splitlines() if line.startswith("+")]
    assert "MachineKernel:" in added and '"nvidia"' in added, added


def test_no_pcidevices_and_a_missing_file_is_unknown(release: Release) -> None:
    """No hardware.PCIDevice before 1.8 (talos@v1.6.7 and v1.5.5 v1alpha2_state.go register none); Read returns
    os.Stat's error as is, which gRPC sends as Unknown (v1alpha1_server.go Read, as v1.7.0; v1.5.5:1292-1295)."""
    proc = release.sim.run("-n", release.nodes[1], "get", "pcidevices")
    assert proc.returncode != 0 and "pcidevices" in proc.stderr, proc.stdout + proc.stderr
    proc = release.sim.run("-n", release.nodes[1], "read", "/var/lib/no-such-file")
    assert "code = Unknown desc = stat /var/lib/no-such-file: no such file or directory" in proc.stderr


@pytest.mark.parametrize(("talos", "client"), RELEASES, ids=IDS)
def test_runbook_run_applies_all_six_steps_and_a_second_run_changes_nothing(
    tmp_path: Path, talos: str, client: str
) -> None:
    """Issue 14 for 1.5 and 1.6: ``runbook run -p params/simulated.yaml --set talos_version=v1.6.7 --apply`` with
    the real talosctl of the release against simnode (1.5: the Image Factory installer, profiles.py). The image step passes ``--preserve`` (below 1.8 an upgrade without it wipes
    /var); the record carries no cluster secret (the go-cmp dry-run diff prints the whole config struct)."""
    for observed in assert_run_applies_all_six_steps(tmp_path, talos, client, *TRACK):
        assert observed["image"].endswith(f":{talos}"), observed["image"]
    [image] = (tmp_path / "records").glob("*/results/image.json")
    journal = image.read_text()
    assert journal.count('"--preserve"') == 3, "the image step's three upgrades pass --preserve"
    assert_no_cluster_secret_recorded(tmp_path)
    second = runbook(run_env(tmp_path, client), *run_args(tmp_path, talos, *TRACK))
    assert second.returncode == 0, second.stdout + second.stderr
    assert "nothing changed on the cluster" in second.stdout


@pytest.mark.parametrize(("talos", "client"), RELEASES, ids=IDS)
def test_the_library_s_upgrade_keeps_var_and_one_without_preserve_wipes_it(
    tmp_path: Path, talos: str, client: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """reality-gaps.md §1 finding 4 on 1.6: the 1.6 installer, as 1.7's, resets the partition table and re-creates
    EPHEMERAL with no filesystem when forced (talos@v1.6.7 cmd/installer/pkg/install/manifest.go:105,147;
    machined forces it without ``--preserve``, internal/pkg/install/install.go). The library's config patch and
    image upgrade keep /var; the real talosctl's ``upgrade`` without ``--preserve`` runs ``removeAllPods`` and
    the node comes back without the file."""
    upgrade = upgrade_without_preserve(tmp_path, talos, client, monkeypatch)
    assert upgrade.wiped, upgrade
    assert "task: removeAllPods" in upgrade.upgrade.stderr, upgrade.upgrade.stderr


#: The metal boot sequence's last phase, startEverything, which a hung boot's error names by number
#: (simnode/legacy18.go bootPhases): 16 phases in talos@v1.6.7 v1alpha1_sequencer.go Boot, as v1.7.0; 18 in v1.5.5
#: (:210-281: containerd after env, legacyCleanup after overlay). BootTimeout is 70 min at both tags
#: (pkg/machinery/constants/constants.go), scaled to BOOT_TIMEOUT_S.
BOOT_PHASE = {"v1.6.7": 16, "v1.5.5": 18}
BOOT_TIMEOUT_S = 12.0


def nvidia_image(talos: str) -> dict[str, Any]:
    """What the release's NVIDIA schematic installs: one driver per release before 1.8 (profiles.DRIVER_TABLE),
    extension names without a track suffix."""
    driver, _production, toolkit = DRIVER_TABLE[minor_of(talos)]
    exts = [
        ("nvidia-open-gpu-kernel-modules", f"{driver}-{talos}"),
        ("nvidia-container-toolkit", f"{driver}-{toolkit}"),
    ]
    listed = [
        {"image": f"{i:03d}.ghcr.io-siderolabs-{name}.sqsh", "name": name, "version": version}
        | {"compatibility": f">= {talos}"}
        for i, (name, version) in enumerate(exts)
    ]
    return {"talos_version": talos, "extensions": [*listed, schematic_ext(NVIDIA_ID)]}


@pytest.mark.parametrize(("talos", "client"), RELEASES, ids=IDS)
def test_a_hung_boot_fails_naming_the_release_s_last_boot_phase(
    tmp_path: Path, talos: str, client: str
) -> None:
    """A worker upgraded to the NVIDIA image without the modules in its config waits for ext-nvidia-persistenced
    until BootTimeout; the boot sequence fails naming startEverything by its number, which the real tracker
    prints. simnode numbered a 1.5 node's as 1.6's 16 before it knew 1.5's sequence."""
    talosctl = built_talosctl(client)
    plain, _with_modules = worker_configs(talosctl, tmp_path)
    vanilla, nvidia = (f"factory.talos.dev/installer/{s}:{talos}" for s in (VANILLA_ID, NVIDIA_ID))
    images = {
        vanilla: {"talos_version": talos, "extensions": [schematic_ext(VANILLA_ID)]},
        nvidia: nvidia_image(talos),
    }
    address = "10.5.2.6"
    node = {"name": "gpu-hang", "address": address, "talos_version": talos, "image": vanilla}
    node |= {"machine_config": plain, "services": BASE_SERVICES, "reboot_ms": REBOOT_MS}
    factor = str(BOOT_TIMEOUT_S / (70 * 60))
    state = tmp_path / "state"
    proc = start_simnode(
        build("build-simnode.sh"), state, {"nodes": [node], "images": images}, "-time-factor", factor
    )
    try:
        argv = [*upgrade_argv(Sim(talosctl, state / "talosconfig"), address, nvidia, "60s"), "--preserve"]
        up = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert up.returncode == 1, up.stderr
    failure = f"sequence failed: error running phase {BOOT_PHASE[talos]} in boot sequence: task 1/1: failed"
    assert f'"{address}": error: sequence error: {failure}' in up.stderr, up.stderr
