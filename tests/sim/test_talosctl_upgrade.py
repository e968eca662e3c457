"""``upgrade``, ``reboot``, ``health``, ``kubeconfig``, faults and latency of the simulated talosctl."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from runbook_lib.sim.cluster import ClusterSpec, create
from runbook_lib.sim.faults import inject, set_cluster_fault
from runbook_lib.sim.scenarios import nvidia_extension_names, register_schematic
from runbook_lib.sim.state import driver_of, kmod_extension, load_node, runtime, sim_paths, toolkit_extension
from tests.sim.talosctl_legs import LEGS, leg
from tests.sim.talosctl_run import talosctl

W1, W2 = "10.5.0.3", "10.5.0.4"
MODULES_PATCH = "machine:\n  kernel:\n    modules:\n      - name: nvidia\n      - name: nvidia_uvm\n      - name: nvidia_drm\n      - name: nvidia_modeset\n"


def gpu_image(state: Path, version: str, talos: str, track: str = "lts") -> str:
    sid = register_schematic(state, nvidia_extension_names(talos, track))
    return f"factory.talos.dev/metal-installer/{sid}:{version}"


@pytest.mark.parametrize(
    ("minor", "version"), [("1.7", "v1.7.7"), ("1.8", "v1.8.4"), ("1.12", "v1.12.11"), ("1.13", "v1.13.9")]
)
def test_patch_then_upgrade_boots_the_schematic_and_loads_the_driver(
    tmp_path: Path, minor: str, version: str
) -> None:
    create(tmp_path, ClusterSpec(workers=1, talos_version=minor))
    r = talosctl(tmp_path, "patch", "mc", "-n", W1, "-p", MODULES_PATCH)
    assert r.returncode == 0, r.stderr
    assert runtime(load_node(tmp_path, W1)).modules_live == {}  # no kmod extension yet: nothing to load
    r = talosctl(tmp_path, "upgrade", "-n", W1, "--image", gpu_image(tmp_path, version, version))
    assert r.returncode == 0, r.stderr
    assert r.stderr == f"watching nodes: [{W1}]\n    * {W1}: post check passed\n"
    node = load_node(tmp_path, W1)
    kmod, toolkit = kmod_extension(node), toolkit_extension(node)
    assert kmod is not None and toolkit is not None
    assert kmod.version.endswith(f"-{version}")
    assert driver_of(kmod.version) == driver_of(toolkit.version)
    drv = talosctl(tmp_path, "read", "/proc/driver/nvidia/version", "-n", W1).stdout
    assert f"  {driver_of(kmod.version)}  " in drv


def test_plain_upgrade_drops_the_extensions(tmp_path: Path) -> None:
    create(tmp_path, ClusterSpec(workers=1, talos_version="1.12", scenario="gpu-ready"))
    r = talosctl(tmp_path, "upgrade", "-n", W1, "--image", "ghcr.io/siderolabs/installer:v1.12.11")
    assert r.returncode == 0, r.stderr
    node = load_node(tmp_path, W1)
    assert node.extensions == []
    assert runtime(node).driver_version is None


def test_minor_upgrade_changes_driver_and_services(tmp_path: Path) -> None:
    create(tmp_path, ClusterSpec(workers=1, talos_version="1.12", scenario="gpu-ready"))
    before = runtime(load_node(tmp_path, W1))
    r = talosctl(tmp_path, "upgrade", "-n", W1, "-i", gpu_image(tmp_path, "v1.13.9", "v1.13.9"))
    assert r.returncode == 0, r.stderr
    after = runtime(load_node(tmp_path, W1))
    assert load_node(tmp_path, W1).talos_version == "v1.13.9"
    assert before.driver_version != after.driver_version
    assert after.services.get("ext-nvidia-cdi-gen") == "Finished"


@pytest.mark.parametrize("which", LEGS)
def test_no_wait_prints_the_ack_table(tmp_path: Path, which: str) -> None:
    """On both legs: the Python talosctl and the real talosctl v1.12.0 on simnode (``tests/sim/talosctl_legs.py``)."""
    create(tmp_path, ClusterSpec(workers=2, talos_version="v1.12.0", scenario="config-patched"))
    img = gpu_image(tmp_path, "v1.12.0", "v1.12.0")
    with leg(which, tmp_path, "v1.12.0") as run:
        r = run("upgrade", "-n", f"{W1},{W2}", "-i", img, "--wait=false")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["NODE", "ACK", "STARTED"]
    # one row per node, in the order the replies arrive (apid's one-to-many: no order guaranteed)
    assert sorted(line.split()[0] for line in lines[1:]) == [W1, W2]
    assert all("Upgrade request received" in line for line in lines[1:])


def test_staged_upgrade_waits_for_reboot(tmp_path: Path) -> None:
    create(tmp_path, ClusterSpec(workers=1, talos_version="1.12", scenario="config-patched"))
    r = talosctl(tmp_path, "upgrade", "-n", W1, "-i", gpu_image(tmp_path, "v1.12.11", "v1.12.11"), "--stage")
    assert r.returncode == 0, r.stderr
    assert load_node(tmp_path, W1).extensions == []
    assert talosctl(tmp_path, "reboot", "-n", W1).returncode == 0
    assert kmod_extension(load_node(tmp_path, W1)) is not None


def test_unknown_schematic_and_unavailable_extension(tmp_path: Path) -> None:
    create(tmp_path, ClusterSpec(workers=1, talos_version="1.7"))
    r = talosctl(tmp_path, "upgrade", "-n", W1, "-i", "factory.talos.dev/installer/" + "ab" * 32 + ":v1.7.7")
    assert r.returncode == 1
    assert r.stderr.splitlines()[-3].startswith(
        f"\t* {W1}: rpc error: code = Unknown desc = failed to pull installer image"
    )
    lts = register_schematic(tmp_path, ["siderolabs/nvidia-open-gpu-kernel-modules-lts"])
    r = talosctl(tmp_path, "upgrade", "-n", W1, "-i", f"factory.talos.dev/installer/{lts}:v1.7.7")
    assert r.returncode == 1
    assert (
        'official extension "siderolabs/nvidia-open-gpu-kernel-modules-lts" is not available for Talos version v1.7.7'
        in r.stderr
    )
    assert load_node(tmp_path, W1).extensions == []


# ---------------------------------------------------------------- faults


def test_upgrade_fails_and_rolls_back(tmp_path: Path) -> None:
    create(tmp_path, ClusterSpec(workers=1, talos_version="1.12", scenario="upgrade-fails"))
    assert talosctl(tmp_path, "patch", "mc", "-n", W1, "-p", MODULES_PATCH).returncode == 0
    r = talosctl(tmp_path, "upgrade", "-n", W1, "-i", gpu_image(tmp_path, "v1.13.9", "v1.13.9"))
    assert r.returncode == 1
    assert r.stderr.startswith(f"watching nodes: [{W1}]\n")
    assert "1 error occurred:\n\t* 10.5.0.3: upgrade failed" in r.stderr
    assert load_node(tmp_path, W1).talos_version == "v1.12.11"


def test_upgrade_before_the_modules_patch_hangs_at_boot_and_rolls_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kmod extension blacklists the NVIDIA modules (extensions@v1.12.0:nvidia-gpu/nvidia-modules/lts/
    files/nvidia.conf), so without ``machine.kernel.modules`` the driver never binds;
    ``ext-nvidia-persistenced`` depends on ``/sys/bus/pci/drivers/nvidia`` (nvidia-persistenced.yaml), and
    ``StartAllServices`` waits ``BootTimeout`` = 70 min for it (talos@v1.12.0:internal/app/machined/pkg/
    runtime/v1alpha1/v1alpha1_sequencer_tasks.go:419-490, pkg/machinery/constants/constants.go:956), then
    the node reboots into its previous image (siderolabs/extensions#888, siderolabs/talos#9149).  The
    simulator's time scale shrinks the 70 minutes to 0.5 s here."""
    monkeypatch.setenv("RUNBOOK_SIM_TIME_SCALE", str(0.5 / (70 * 60)))
    create(tmp_path, ClusterSpec(workers=1, talos_version="1.12"))
    before = load_node(tmp_path, W1)
    start = time.monotonic()
    r = talosctl(tmp_path, "upgrade", "-n", W1, "-i", gpu_image(tmp_path, "v1.12.11", "v1.12.11"))
    assert 0.5 <= time.monotonic() - start < 30
    assert r.returncode == 1
    assert 'service "ext-nvidia-persistenced" to be "up"' in r.stderr and "rolled back" in r.stderr
    after = load_node(tmp_path, W1)
    assert after.extensions == before.extensions and after.talos_version == before.talos_version
    assert after.boot_count == before.boot_count + 1
    # the same upgrade after the modules patch boots
    assert talosctl(tmp_path, "patch", "mc", "-n", W1, "-p", MODULES_PATCH).returncode == 0
    r = talosctl(tmp_path, "upgrade", "-n", W1, "-i", gpu_image(tmp_path, "v1.12.11", "v1.12.11"))
    assert r.returncode == 0, r.stderr
    assert runtime(load_node(tmp_path, W1)).driver_version is not None


def test_upgrade_hangs_until_timeout(tmp_path: Path) -> None:
    create(tmp_path, ClusterSpec(workers=1, talos_version="1.12", scenario="upgrade-hangs"))
    start = time.monotonic()
    r = talosctl(
        tmp_path, "upgrade", "-n", W1, "-i", gpu_image(tmp_path, "v1.12.11", "v1.12.11"), "--timeout", "1s"
    )
    assert time.monotonic() - start >= 1.0
    assert r.returncode == 1
    assert 'service "ext-nvidia-persistenced" to be "up": context deadline exceeded' in r.stderr


def test_driver_mismatch_and_toolkit_missing(tmp_path: Path) -> None:
    create(tmp_path, ClusterSpec(workers=2, talos_version="1.12", scenario="config-patched"))
    inject(tmp_path, W1, "driver_mismatch")
    inject(tmp_path, W2, "toolkit_missing")
    r = talosctl(tmp_path, "upgrade", "-n", f"{W1},{W2}", "-i", gpu_image(tmp_path, "v1.12.11", "v1.12.11"))
    assert r.returncode == 0, r.stderr
    n1, n2 = load_node(tmp_path, W1), load_node(tmp_path, W2)
    k1, t1 = kmod_extension(n1), toolkit_extension(n1)
    assert k1 is not None and t1 is not None
    assert driver_of(k1.version) != driver_of(t1.version)
    assert t1.name == "nvidia-container-toolkit-production"
    assert toolkit_extension(n2) is None
    talosctl(tmp_path, "patch", "mc", "-n", W2, "-p", MODULES_PATCH)
    rt2 = runtime(load_node(tmp_path, W2))
    assert rt2.driver_version is not None and "nvidia" not in rt2.cri_runtime_handlers
    assert "ext-nvidia-persistenced" not in talosctl(tmp_path, "get", "services", "-n", W2).stdout


def test_unsupported_gpu_never_loads(tmp_path: Path) -> None:
    create(tmp_path, ClusterSpec(workers=1, talos_version="1.12", scenario="gpu-ready"))
    inject(tmp_path, W1, "gpu_unsupported")
    rt = runtime(load_node(tmp_path, W1))
    assert rt.driver_error is not None and "is not supported by the" in rt.driver_error
    assert rt.driver_error.startswith("NVRM: The NVIDIA GPU 0000:01:00.0")
    assert talosctl(tmp_path, "read", "/proc/modules", "-n", W1).stdout == ""
    assert talosctl(tmp_path, "read", "/proc/driver/nvidia/version", "-n", W1).returncode == 1
    services = talosctl(tmp_path, "get", "services", "-n", W1).stdout
    assert "ext-nvidia-persistenced" not in services  # it waits for the driver, so it never starts


def test_slow_node_and_concurrent_latency(tmp_path: Path) -> None:
    create(tmp_path, ClusterSpec(workers=20, talos_version="1.12", latency_ms=300))
    nodes = ",".join(f"10.5.0.{i}" for i in range(3, 23))
    start = time.monotonic()
    r = talosctl(tmp_path, "get", "extensions", "-n", nodes)
    elapsed = time.monotonic() - start
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.splitlines()) == 21
    assert 0.3 <= elapsed < 0.3 * 20 / 2  # concurrent, not 20 × the latency
    inject(tmp_path, W1, "slow_ms", 700)
    start = time.monotonic()
    talosctl(tmp_path, "version", "-n", W1)
    assert time.monotonic() - start >= 1.0


def test_unreachable_endpoint_fails_everything(tmp_path: Path) -> None:
    create(tmp_path, ClusterSpec(workers=1, talos_version="1.12"))
    inject(tmp_path, "10.5.0.2", "unreachable")
    r = talosctl(tmp_path, "version", "-n", W1)
    assert r.returncode == 1
    assert "dial tcp 10.5.0.2:50000: connect: connection refused" in r.stderr
    r = talosctl(tmp_path, "version", "-n", W1, "-e", W1)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("which", LEGS)
def test_version_warns_about_partial_failures(tmp_path: Path, which: str) -> None:
    """On both legs: the Python talosctl and the real talosctl v1.12.0 on simnode (``tests/sim/talosctl_legs.py``)."""
    create(tmp_path, ClusterSpec(workers=2, talos_version="v1.12.0"))
    inject(tmp_path, W2, "unreachable")
    with leg(which, tmp_path, "v1.12.0") as run:
        r = run("version", "-n", f"{W1},{W2}")
    assert r.returncode == 0
    assert f"\tNODE:        {W1}\n" in r.stdout
    assert r.stderr.startswith(f"WARNING: 1 error occurred:\n\t* {W2}: rpc error: code = Unavailable")


# ---------------------------------------------------------------- health / kubeconfig / reboot


def test_health_passes_then_times_out_on_a_dead_node(tmp_path: Path) -> None:
    create(tmp_path, ClusterSpec(workers=2, talos_version="1.12"))
    r = talosctl(tmp_path, "health")
    assert r.returncode == 0, r.stderr
    assert r.stderr.startswith('discovered nodes: ["10.5.0.2" "10.5.0.3" "10.5.0.4"]\n')
    assert r.stderr.endswith("waiting for all k8s nodes to report schedulable: OK\n")
    inject(tmp_path, W2, "unreachable")
    r = talosctl(tmp_path, "health", "--wait-timeout", "0.2s")
    assert r.returncode == 1
    assert (
        "healthcheck error: rpc error: code = DeadlineExceeded desc = context deadline exceeded" in r.stderr
    )


def test_kubeconfig_from_the_control_plane(tmp_path: Path) -> None:
    create(tmp_path, ClusterSpec(workers=1, talos_version="1.12"))
    r = talosctl(tmp_path, "kubeconfig", "-")
    assert r.returncode == 1  # no Kubernetes room running for this state dir
    kc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "sim", "cluster": {"server": "http://x"}}],
        "users": [],
        "contexts": [],
        "current-context": "",
    }
    sim_paths(tmp_path).kubeconfig.write_text(yaml.safe_dump(kc))
    r = talosctl(tmp_path, "kubeconfig", "-")
    assert r.returncode == 0, r.stderr
    assert yaml.safe_load(r.stdout)["clusters"][0]["name"] == "sim"
    out = tmp_path / "kc"
    assert talosctl(tmp_path, "kubeconfig", str(out)).returncode == 0
    assert yaml.safe_load(out.read_text())["kind"] == "Config"
    r = talosctl(tmp_path, "kubeconfig", "-", "-n", W1)
    assert r.returncode == 1


def test_reboot_counts_boots(tmp_path: Path) -> None:
    create(tmp_path, ClusterSpec(workers=2, talos_version="1.8"))
    r = talosctl(tmp_path, "reboot", "-n", f"{W1},{W2}", "--wait=false")
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")
    assert load_node(tmp_path, W1).boot_count == 2 and load_node(tmp_path, W2).boot_count == 2


def test_cluster_wide_faults(tmp_path: Path) -> None:
    create(tmp_path, ClusterSpec(workers=2, talos_version="1.12"))
    set_cluster_fault(tmp_path, "talos", {"unreachable": [W2], "slow_ms": 400})
    start = time.monotonic()
    r = talosctl(tmp_path, "get", "extensions", "-n", f"{W1},{W2}")
    assert time.monotonic() - start >= 0.4
    assert r.returncode == 1
    # `get` appends each node's error with no node prefix (talos v1.12.0 cmd/talosctl/cmd/talos/get.go:185-209)
    assert r.stderr.startswith("1 error occurred:\n\t* rpc error: code = Unavailable") and W2 in r.stderr


def test_no_reboot_upgrade_and_watch(tmp_path: Path) -> None:
    create(tmp_path, ClusterSpec(workers=1, talos_version="1.13", scenario="config-patched"))
    r = talosctl(
        tmp_path, "upgrade", "-n", W1, "-i", gpu_image(tmp_path, "v1.13.9", "v1.13.9"), "--no-reboot"
    )
    assert r.returncode == 0, r.stderr
    assert load_node(tmp_path, W1).extensions == []
    assert talosctl(tmp_path, "reboot", "-n", W1).returncode == 0
    assert kmod_extension(load_node(tmp_path, W1)) is not None
    r = talosctl(tmp_path, "get", "extensions", "-w", "-n", W1)
    assert r.returncode == 1 and "not simulated" in r.stderr


def test_toolkit_on_a_gpu_less_node_never_finishes_booting(tmp_path: Path) -> None:
    create(tmp_path, ClusterSpec(workers=1, talos_version="1.12"))
    img = gpu_image(tmp_path, "v1.12.11", "v1.12.11")
    r = talosctl(tmp_path, "upgrade", "-n", "10.5.0.2", "-i", img, "--timeout", "0.3s")  # the control plane
    assert r.returncode == 1
    assert "ext-nvidia-persistenced" in r.stderr
    assert load_node(tmp_path, "10.5.0.2").extensions == []


@pytest.mark.slow
@pytest.mark.parametrize("minor", ["1.7", "1.8", "1.12", "1.13"])
def test_every_fault_on_every_version(tmp_path: Path, minor: str) -> None:
    """One GPU rollout over eight workers, each with one fault, seen only through talosctl."""
    create(tmp_path, ClusterSpec(workers=8, talos_version=minor, scenario="config-patched"))
    version = load_node(tmp_path, W1).talos_version
    w = [f"10.5.0.{i}" for i in range(3, 11)]
    faults = [
        None,
        "driver_mismatch",
        "toolkit_missing",
        "gpu_unsupported",
        "upgrade_fails",
        "slow_ms",
        "unreachable",
        "upgrade_hangs",
    ]
    for address, fault in zip(w, faults, strict=True):
        if fault:
            inject(tmp_path, address, fault, 300 if fault == "slow_ms" else True)
    r = talosctl(
        tmp_path,
        "upgrade",
        "-n",
        ",".join(w),
        "-i",
        gpu_image(tmp_path, version, version),
        "--timeout",
        "0.5s",
    )
    assert r.returncode == 1
    failed = {
        line.split(":")[0].strip("\t* ")
        for line in r.stderr.split("errors occurred:\n", 1)[1].splitlines()
        if line.startswith("\t* ")
    }
    assert failed == {w[3], w[4], w[6], w[7]}
    ok = [w[0], w[1], w[2], w[5]]
    r = talosctl(tmp_path, "patch", "mc", "-n", ",".join(ok), "-p", MODULES_PATCH)
    assert r.returncode == 0, r.stderr

    def ext_versions(address: str) -> dict[str, str]:
        out = talosctl(tmp_path, "get", "extensions", "-n", address).stdout
        return {row.split()[5]: row.split()[6] for row in out.splitlines()[1:]}

    healthy = ext_versions(w[0])
    kmod = next(v for k, v in healthy.items() if k.startswith("nvidia-open-gpu-kernel-modules"))
    toolkit_name = next(k for k in healthy if k.startswith("nvidia-container-toolkit"))
    assert "nvidia_uvm" in talosctl(tmp_path, "read", "/proc/modules", "-n", w[0]).stdout
    assert kmod.split("-")[0] in talosctl(tmp_path, "read", "/proc/driver/nvidia/version", "-n", w[0]).stdout
    mismatch = ext_versions(w[1])
    toolkit_key = next(k for k in mismatch if k.startswith("nvidia-container-toolkit"))
    assert mismatch[toolkit_key].split("-")[0] != kmod.split("-")[0]
    assert toolkit_name not in ext_versions(w[2])
    assert talosctl(tmp_path, "read", "/proc/modules", "-n", w[2]).stdout != ""  # driver loads, no toolkit
    assert list(ext_versions(w[3])) == ["schematic"]  # rolled back
    assert list(ext_versions(w[4])) == ["schematic"]
    assert ext_versions(w[5]) == healthy
    assert talosctl(tmp_path, "version", "-n", w[6]).returncode == 1
    assert list(ext_versions(w[7])) == ["schematic"]


def test_preserve_is_accepted_but_hidden(tmp_path: Path) -> None:
    """``--preserve`` is registered in every talosctl, hidden from help from v1.8 (``MarkHidden``) and
    deprecated from v1.13 (talos@v1.8.0, v1.13.0: cmd/talosctl/cmd/talos/upgrade.go)."""
    create(tmp_path, ClusterSpec(workers=1, talos_version="1.12", scenario="config-patched"))
    r = talosctl(
        tmp_path, "upgrade", "-n", W1, "--preserve", "-i", gpu_image(tmp_path, "v1.12.11", "v1.12.11")
    )
    assert r.returncode == 0, r.stderr
    assert "preserve" not in talosctl(tmp_path, "upgrade", "--help").stdout


def test_stock_installer_installs_machine_install_extensions_before_the_factory(tmp_path: Path) -> None:
    """Talos 1.3-1.4 have no Image Factory: the installer pulls the images ``machine.install.extensions``
    lists (talos@v1.3.0:internal/pkg/install/install.go:58), so an upgrade to the stock installer after the
    config patch boots the NVIDIA extensions."""
    create(tmp_path, ClusterSpec(workers=1, talos_version="1.3"))
    kmod = "ghcr.io/siderolabs/nvidia-open-gpu-kernel-modules:515.65.01-v1.3.7"
    toolkit = "ghcr.io/siderolabs/nvidia-container-toolkit:515.65.01-v1.11.0"
    patch = MODULES_PATCH + f"  install:\n    extensions:\n      - image: {kmod}\n      - image: {toolkit}\n"
    assert talosctl(tmp_path, "patch", "mc", "-n", W1, "-p", patch).returncode == 0
    r = talosctl(tmp_path, "upgrade", "-n", W1, "-i", "ghcr.io/siderolabs/installer:v1.3.7")
    assert r.returncode == 0, r.stderr
    node = load_node(tmp_path, W1)
    assert sorted(e.image for e in node.extensions) == sorted([kmod, toolkit])
    assert runtime(node).driver_version == "515.65.01"
    missing = patch.replace("515.65.01-v1.11.0", "999.0-v0")
    create(tmp_path / "b", ClusterSpec(workers=1, talos_version="1.3"))
    assert talosctl(tmp_path / "b", "patch", "mc", "-n", W1, "-p", missing).returncode == 0
    r = talosctl(tmp_path / "b", "upgrade", "-n", W1, "-i", "ghcr.io/siderolabs/installer:v1.3.7")
    assert r.returncode == 1 and "nvidia-container-toolkit:999.0-v0" in r.stderr
