"""Talos 1.7 and 1.8 nodes on the real talosctl of their release (v1.7.0, v1.8.0) against simnode (issue 14).

simnode answers a node reporting 1.7 or 1.8 as those releases' machined where the difference reaches the runbook
(simnode/legacy18.go cites each): an upgrade without ``--preserve`` to a 1.7 installer wipes EPHEMERAL (/var), no
PCIDevice resource before 1.8, the dry-run diff is go-cmp's report in 1.7, a missing file is gRPC Unknown in 1.7;
as on 1.9-1.11, MachineConfig's spec is the config document and ``modules`` is KernelModuleSpec's alias
(simnode/legacy.go). The binaries are not built by ``.ci/run`` (see ``tests/sim/talosctl_legs.ci_releases``): these
tests skip, saying so, unless ``tools/build-talosctl.sh v1.7.0`` / ``v1.8.0`` built them.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from runbook_lib.sim import realtalos
from runbook_lib.sim.state import SimNode, load_nodes
from runbook_lib.steps.image import image_upgrade
from runbook_lib.steps.patch import config_patch
from tests.sim.talosctl_run import talosctl
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
from tests.sim.test_sim_up_real_talosctl import runbook
from tests.simcluster import node_state, runs_real_talosctl, sim_cluster

pytestmark = pytest.mark.slow

#: (the nodes' release: the newest patch the simulator knows, state.LATEST_PATCH; the talosctl that pairs with it)
RELEASES = [("v1.8.4", "v1.8.0"), ("v1.7.7", "v1.7.0")]
IDS = [client for _talos, client in RELEASES]


def before_1_8(talos: str) -> bool:
    return talos.startswith("v1.7.")


def track_args(talos: str) -> tuple[str, ...]:
    """params/simulated.yaml's ``track: lts`` is refused before 1.8 (one driver per release then)."""
    return ("--set", "track=null") if before_1_8(talos) else ()


@pytest.fixture(scope="module", params=RELEASES, ids=IDS)
def release(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Release]:
    """A fresh cluster of the release: GPU workers on the vanilla schematic, no modules patch."""
    talos, client = request.param
    yield from serve(tmp_path_factory.mktemp(f"fresh-{client}"), talos, client, "fresh")


def test_patch_dry_run_diff_is_go_cmp_s_report_on_1_7_and_configdiff_s_from_1_8(
    release: Release, tmp_path: Path
) -> None:
    """talos@v1.7.0 internal/app/machined/internal/server/v1alpha1/v1alpha1_server.go:221-240: the dry run's diff is
    ``cmp.Diff`` of the two v1alpha1 structs after ``Config diff:``; v1.8.0 (:299-310) prints configdiff's
    unified YAML diff after ``Config diff:`` and a blank line, its hunk header running on as 1.9's (configdiff.go
    identical to v1.9.0's). The summary line the config-patch step reads is the same in both."""
    proc = patch_dry_run(release, tmp_path, MODULES_PATCH)
    assert proc.returncode == 0, proc.stderr
    assert "Dry run summary:\nApplied configuration without a reboot (skipped in dry-run).\n" in proc.stderr
    if before_1_8(release.talos):
        assert "Config diff:\n" in proc.stderr and "@@" not in proc.stderr, proc.stderr
        [added] = [line for line in proc.stderr.splitlines() if line.startswith("+")]
        assert "MachineKernel:" in added and '"nvidia"' in added, added
    else:
        assert "Config diff:\n\n" in proc.stderr
        assert "+    kernel:\n+        modules:\n+            - name: nvidia\n" in proc.stderr
        [header] = [line for line in proc.stderr.splitlines() if line.startswith("@@")]
        assert not header.endswith("@@"), header


def test_pcidevices_exist_from_1_8(release: Release) -> None:
    """What preflight's GPU check needs (README: Talos >= 1.8 ``talosctl get pcidevices``, older releases a note):
    talos@v1.8.0 v1alpha2_state.go registers hardware.PCIDevice, v1.7.0's has no such resource."""
    proc = release.sim.run("-n", release.nodes[1], "get", "pcidevices")
    if before_1_8(release.talos):
        assert proc.returncode != 0 and "pcidevices" in proc.stderr, proc.stdout + proc.stderr
    else:
        assert proc.returncode == 0, proc.stderr
        assert "NVIDIA" in proc.stdout, proc.stdout


def test_a_missing_file_is_unknown_on_1_7_and_not_found_from_1_8(release: Release) -> None:
    """talos@v1.7.0 v1alpha1_server.go Read returns os.Stat's error as is (gRPC Unknown); v1.8.0 answers NotFound."""
    proc = release.sim.run("-n", release.nodes[1], "read", "/var/lib/no-such-file")
    code = "Unknown" if before_1_8(release.talos) else "NotFound"
    assert proc.returncode != 0, proc.stdout
    assert f"code = {code} desc = stat /var/lib/no-such-file: no such file or directory" in proc.stderr


# ---------------------------------------------------------------- runbook run


@pytest.mark.parametrize(("talos", "client"), RELEASES, ids=IDS)
def test_runbook_run_applies_all_six_steps_and_on_1_7_a_second_run_changes_nothing(
    tmp_path: Path, talos: str, client: str
) -> None:
    """Issue 14 for 1.7 and 1.8: ``runbook run --set talos_version=<1.7.x> --apply`` with the real talosctl of the
    release against simnode. The image step passes ``--preserve`` below 1.8 only. A 1.7 node's dry-run diff is
    go-cmp's report of the whole config struct, cluster secret included (``ClusterSecret: "..."``): the change
    record must not carry it."""
    for observed in assert_run_applies_all_six_steps(tmp_path, talos, client, *track_args(talos)):
        assert observed["image"].endswith(f":{talos}"), observed["image"]
    [image] = (tmp_path / "records").glob("*/results/image.json")
    upgrades = [e["argv"] for e in json.loads(image.read_text())["journal"] if "upgrade" in e.get("argv", [])]
    assert len(upgrades) == 3 and all(("--preserve" in argv) == before_1_8(talos) for argv in upgrades), (
        upgrades
    )
    assert_no_cluster_secret_recorded(tmp_path)
    if not before_1_8(talos):
        return  # 1.8 answers the runbook as 1.9 does, whose second run test_real_talos_110_111 checks
    second = runbook(run_env(tmp_path, client), *run_args(tmp_path, talos, *track_args(talos)))
    assert second.returncode == 0, second.stdout + second.stderr
    assert "nothing changed on the cluster" in second.stdout


def assert_no_cluster_secret_recorded(tmp_path: Path) -> None:
    """No record file holds the nodes' cluster secret or machine token (their config: simulator's node files)."""
    secrets = set()
    for node in load_nodes(tmp_path / "state"):
        for doc in node.machine_config:
            secrets |= {str(doc["cluster"]["secret"]), str(doc["machine"]["token"])}
    leaks = [
        str(path)
        for path in (tmp_path / "records").rglob("*")
        if path.is_file() and any(s in path.read_text(errors="replace") for s in secrets)
    ]
    assert not leaks, f"the cluster secret or machine token is in {leaks}"


# ---------------------------------------------------------------- /var across the upgrade

#: A file on EPHEMERAL standing for a local persistent volume's data (ours: no Talos source names one).
VAR_FILE = "/var/mnt/local-pv/data"


def with_var_file(entry_of: Any) -> Any:
    """realtalos.node_entry, each node also holding VAR_FILE (simnode serves the nodes file's "files")."""

    def entry(node: SimNode, latency_ms: float) -> dict[str, Any]:
        out: dict[str, Any] = entry_of(node, latency_ms)
        return out | {"files": {**out.get("files", {}), VAR_FILE: f"written on {node.name}\n"}}

    return entry


@pytest.mark.parametrize(("talos", "client"), RELEASES, ids=IDS)
def test_the_library_s_upgrade_keeps_var_and_one_without_preserve_wipes_it_on_1_7_only(
    tmp_path: Path, talos: str, client: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """reality-gaps.md §1 finding 4: Talos <= 1.7 wipes EPHEMERAL on upgrade unless ``--preserve`` (talos@v1.7.0
    internal/pkg/install/install.go:292 ``WithForce(!in.GetPreserve())``, cmd/installer/pkg/install/manifest.go:119
    resets the partition table); the 1.8 installer ignores it (talos@v1.8.0 cmd/installer/pkg/install/
    install.go:213-215). The library's config patch and image upgrade leave each node's /var as it was; then the
    real talosctl's ``upgrade`` without ``--preserve`` to the same installer runs 1.7's cleanup ``removeAllPods``
    and the node comes back without the file on 1.7, with it on 1.8."""
    upgrade = upgrade_without_preserve(tmp_path, talos, client, monkeypatch)
    assert upgrade.wiped == before_1_8(talos), upgrade
    assert ("task: removeAllPods" in upgrade.upgrade.stderr) == before_1_8(talos), upgrade.upgrade.stderr


@dataclass(frozen=True)
class VarUpgrade:
    """What ``upgrade_without_preserve`` saw: the upgrade's output, and whether VAR_FILE is gone from the node
    (its read fails as a missing file and simnode's observed state lacks it)."""

    upgrade: subprocess.CompletedProcess[str]
    wiped: bool


def upgrade_without_preserve(
    tmp_path: Path, talos: str, client: str, monkeypatch: pytest.MonkeyPatch
) -> VarUpgrade:
    """A 1-worker cluster of the release whose nodes hold VAR_FILE: the library's config patch and image upgrade
    (which must keep it), then the real talosctl's ``upgrade --wait`` without ``--preserve`` to the same installer."""
    built_talosctl(client)
    monkeypatch.setattr(realtalos, "node_entry", with_var_file(realtalos.node_entry))
    state = tmp_path / "sim"
    with sim_cluster(state, talos_version=talos, workers=1) as (_params, ctx):
        assert runs_real_talosctl(state), realtalos.recorded(state)
        assert config_patch(ctx, apply=True).ok
        upgraded = image_upgrade(ctx, apply=True, settle_timeout=10.0, poll_interval=0.1)
        assert upgraded.ok, upgraded.summary()
        [gpu] = [n for n in load_nodes(state) if n.gpus]
        assert talosctl(state, "-n", gpu.address, "read", VAR_FILE).stdout == f"written on {gpu.name}\n"
        image = node_state(state, gpu.name).install_image
        proc = talosctl(state, "-n", gpu.address, "upgrade", "--image", image, "--wait", "--timeout=50s")
        assert proc.returncode == 0, proc.stderr
        read = talosctl(state, "-n", gpu.address, "read", VAR_FILE)
        observed = json.loads(realtalos.observed_file(state, gpu.name).read_text())
    if read.returncode == 0:
        assert read.stdout == f"written on {gpu.name}\n", read.stdout
        return VarUpgrade(proc, wiped=False)
    assert f"stat {VAR_FILE}: no such file or directory" in read.stderr, read.stderr
    assert VAR_FILE not in observed.get("files", {}), observed.get("files")
    return VarUpgrade(proc, wiped=True)
