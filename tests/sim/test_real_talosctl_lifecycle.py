"""The real talosctl v1.12.0 against simnode: node state derived from the installed image and the machine config,
and the upgrade and reboot lifecycle (issue 14, second slice).

What a node derives (simnode/derive.go cites each fact): the extensions are the installer image's; the NVIDIA
modules are Live only with a kmod extension installed AND the modules in ``machine.kernel.modules`` (the extension
blacklists them, ``extensions@v1.12.0:nvidia-gpu/nvidia-modules/lts/files/nvidia.conf``); ``ext-nvidia-persistenced``
runs only with the driver bound (``depends: path: /sys/bus/pci/drivers/nvidia``); from Talos 1.13
``ext-nvidia-cdi-gen`` is a one-shot that Finishes, so it shows in ``talosctl services`` but has no Service
resource.

The upgrade is the legacy ``MachineService.Upgrade`` that ``talosctl upgrade --wait`` drives through its action
tracker (``talos@v1.12.0:cmd/talosctl/pkg/talos/action/tracker.go``, ``node.go``): events stream, boot ID read
before and after, node unavailable and back. simnode runs with ``-time-factor`` so Talos's BootTimeout (70 min)
lasts BOOT_TIMEOUT_S here.
"""

from __future__ import annotations

import json
import queue
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.sim.test_real_talosctl import Sim, build, start_simnode, unavailable, wait_for

pytestmark = pytest.mark.slow

TALOS = "v1.12.0"
BOOT_TIMEOUT_S = 12.0
TIME_FACTOR = BOOT_TIMEOUT_S / (70 * 60)
# A reboot must outlast talosctl's 1 s re-watch tick (simnode/lifecycle.go) by more than a loaded machine can
# delay the tracker: its re-watch must still find the node down, or it watches the new boot with tail 0 and
# misses its "ready" (as it would on a real node that rebooted in under a second, which none does).
REBOOT_MS = 3000
# The tracker opens its event watch concurrently with the upgrade call (talos@v1.12.0:cmd/talosctl/pkg/talos/action/
# node.go:75-97): it sees the sequence's first events only because the node pulls the installer before the call
# answers. simnode's default pull (10 s Talos-scale) times TIME_FACTOR is 29 ms; tests that assert those events
# give it a second, a margin no scheduling delay of a loaded machine reaches.
EARLY_EVENTS = {"pull_ms": 1000}
# VANILLA_ID is Image Factory's ID of the empty schematic; NVIDIA_ID is an arbitrary 64-hex ID standing for the
# NVIDIA schematic (simnode does not compute IDs: the nodes file's "images" maps a reference to what it installs).
VANILLA_ID = "376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba"
NVIDIA_ID = "ffd6a1a0c4a5f4a8ec9b8e4c47c6f2c7d4cbb5f1dc70b9e9ea4d37e9b1a4c2a1"


def installer(schematic: str, version: str) -> str:
    return f"factory.talos.dev/metal-installer/{schematic}:{version}"


def schematic_ext(schematic: str) -> dict[str, str]:
    """Image Factory's virtual "schematic" extension (reality-gaps §2 row 29)."""
    return {"name": "schematic", "version": schematic, "description": "", "compatibility": ""}


def nvidia_exts(version: str) -> list[dict[str, str]]:
    return [
        {
            "image": "000.ghcr.io-siderolabs-nvidia-open-gpu-kernel-modules-lts.sqsh",
            "name": "nvidia-open-gpu-kernel-modules-lts",
            "version": f"570.172.08-{version}",
            "compatibility": f">= {version}",
        },
        {
            "image": "001.ghcr.io-siderolabs-nvidia-container-toolkit-lts.sqsh",
            "name": "nvidia-container-toolkit-lts",
            "version": "570.172.08-v1.17.8",
            "compatibility": f">= {version}",
        },
        schematic_ext(NVIDIA_ID),
    ]


VANILLA = installer(VANILLA_ID, TALOS)
NVIDIA = installer(NVIDIA_ID, TALOS)
VANILLA_13 = installer(VANILLA_ID, "v1.13.0")
NVIDIA_13 = installer(NVIDIA_ID, "v1.13.0")
IMAGES = {
    VANILLA: {"talos_version": TALOS, "extensions": [schematic_ext(VANILLA_ID)]},
    VANILLA_13: {"talos_version": "v1.13.0", "extensions": [schematic_ext(VANILLA_ID)]},
    NVIDIA: {"talos_version": TALOS, "extensions": nvidia_exts(TALOS)},
    NVIDIA_13: {"talos_version": "v1.13.0", "extensions": nvidia_exts("v1.13.0")},
}
MODULES = ["nvidia", "nvidia_uvm", "nvidia_drm", "nvidia_modeset"]
MODULES_PATCH = "machine:\n  kernel:\n    modules:\n" + "".join(f"      - name: {m}\n" for m in MODULES)
BASE_SERVICES = [{"id": "apid", "state": "Running", "healthy": True}]

# node role -> (address, image, modules in its config)
ROLES = {
    "bound": ("10.5.2.1", NVIDIA, True),
    "unpatched": ("10.5.2.2", NVIDIA, False),
    "v113": ("10.5.2.3", NVIDIA_13, True),
    "upgrade": ("10.5.2.4", VANILLA, True),
    "hang": ("10.5.2.5", VANILLA, False),
    "hang-long": ("10.5.2.6", VANILLA, False),
    "reboot": ("10.5.2.7", VANILLA, False),
    "rescue": ("10.5.2.8", VANILLA, False),
    "client113": ("10.5.2.9", VANILLA, True),
    "tails": ("10.5.2.10", VANILLA, True),
    "life113": ("10.5.2.11", VANILLA_13, True),
    "drain113": ("10.5.2.12", VANILLA_13, True),
    "staged": ("10.5.2.13", VANILLA, True),
}


@dataclass(frozen=True)
class Cluster:
    sim: Sim
    patches: Path

    def addr(self, role: str) -> str:
        return ROLES[role][0]


def worker_configs(talosctl: Path, tmp: Path) -> tuple[str, str]:
    """A worker config from the real ``talosctl gen config``, and the same patched with the NVIDIA modules by the
    real ``talosctl machineconfig patch``."""
    run = [str(talosctl), "gen", "config", "sim", "https://10.5.0.2:6443", "--output-types", "worker", "-o"]
    gen = subprocess.run(
        [*run, str(tmp / "worker.yaml")], capture_output=True, text=True, check=False, timeout=60
    )
    assert gen.returncode == 0, gen.stderr
    (tmp / "modules.yaml").write_text(MODULES_PATCH)
    patch = [
        str(talosctl),
        "machineconfig",
        "patch",
        str(tmp / "worker.yaml"),
        "--patch",
        f"@{tmp / 'modules.yaml'}",
    ]
    patched = subprocess.run(
        [*patch, "-o", str(tmp / "worker-modules.yaml")],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert patched.returncode == 0, patched.stderr
    return (tmp / "worker.yaml").read_text(), (tmp / "worker-modules.yaml").read_text()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    talosctl = build("build-talosctl.sh", TALOS)
    tmp = tmp_path_factory.mktemp("simnode-lifecycle")
    plain, with_modules = worker_configs(talosctl, tmp)
    nodes = [
        {
            "name": f"gpu-{role}",
            "address": address,
            "talos_version": IMAGES[image]["talos_version"],
            "image": image,
            "machine_config": with_modules if modules else plain,
            "services": BASE_SERVICES,
            "reboot_ms": REBOOT_MS,
        }
        | (EARLY_EVENTS if role in ("upgrade", "client113", "staged") else {})
        for role, (address, image, modules) in ROLES.items()
    ]
    state = tmp / "state"
    proc = start_simnode(
        build("build-simnode.sh"), state, {"nodes": nodes, "images": IMAGES}, "-time-factor", str(TIME_FACTOR)
    )
    yield Cluster(Sim(talosctl, state / "talosconfig"), tmp)
    proc.terminate()
    proc.wait(timeout=10)


def get_ids(sim: Sim, node: str, kind: str) -> list[str]:
    proc = sim.run("-n", node, "get", kind, "-o", "yaml")
    assert proc.returncode == 0, proc.stderr
    return sorted(d["metadata"]["id"] for d in yaml.safe_load_all(proc.stdout) if d)


def extension_names(sim: Sim, node: str) -> list[str]:
    proc = sim.run("-n", node, "get", "extensions", "-o", "yaml")
    assert proc.returncode == 0, proc.stderr
    return sorted(d["spec"]["metadata"]["name"] for d in yaml.safe_load_all(proc.stdout) if d)


def service_states(sim: Sim, node: str) -> dict[str, str]:
    """SERVICE -> STATE of ``talosctl services`` (the ServiceList API: Finished and Waiting services too)."""
    proc = sim.run("-n", node, "services")
    assert proc.returncode == 0, proc.stderr
    return {line.split()[1]: line.split()[2] for line in proc.stdout.splitlines()[1:] if line.strip()}


def test_modules_live_and_persistenced_running_with_the_extension_and_the_config(cluster: Cluster) -> None:
    sim, node = cluster.sim, cluster.addr("bound")
    assert extension_names(sim, node) == [
        "nvidia-container-toolkit-lts",
        "nvidia-open-gpu-kernel-modules-lts",
        "schematic",
    ]
    assert get_ids(sim, node, "modules") == sorted(MODULES)
    assert service_states(sim, node) == {"apid": "Running", "ext-nvidia-persistenced": "Running"}
    assert get_ids(sim, node, "services") == ["apid", "ext-nvidia-persistenced"]


def test_without_the_modules_in_the_config_nothing_loads_until_the_patch(cluster: Cluster) -> None:
    """The extension alone loads nothing (it blacklists the modules); persistenced waits for the driver's path.
    machine.kernel applies without a reboot, so the patch loads the modules and the service starts."""
    sim, node = cluster.sim, cluster.addr("unpatched")
    assert get_ids(sim, node, "modules") == []
    assert service_states(sim, node)["ext-nvidia-persistenced"] == "Waiting"
    assert get_ids(sim, node, "services") == ["apid"]
    waiting = sim.run("-n", node, "service", "ext-nvidia-persistenced")
    assert 'Waiting for file "/sys/bus/pci/drivers/nvidia" to exist' in waiting.stdout
    patched = sim.run("-n", node, "patch", "machineconfig", "--patch", f"@{cluster.patches / 'modules.yaml'}")
    assert patched.stderr.splitlines()[1:] == ["Applied configuration without a reboot"]
    assert get_ids(sim, node, "modules") == sorted(MODULES)
    assert service_states(sim, node)["ext-nvidia-persistenced"] == "Running"


def test_cdi_gen_finishes_on_1_13_listed_by_services_not_by_get(cluster: Cluster) -> None:
    sim, node = cluster.sim, cluster.addr("v113")
    assert service_states(sim, node) == {
        "apid": "Running",
        "ext-nvidia-cdi-gen": "Finished",
        "ext-nvidia-persistenced": "Running",
    }
    assert get_ids(sim, node, "services") == ["apid", "ext-nvidia-persistenced"]


def tracker_lines(stderr: str, node: str) -> list[str]:
    """The non-terminal reporter's lines for ``node``: ``"<node>": <message>`` (tracker.go:291-295)."""
    prefix = f'"{node}": '
    return [line.removeprefix(prefix) for line in stderr.splitlines() if line.startswith(prefix)]


RETRYING = "unavailable, retrying..."


def settled(lines: list[str]) -> list[str]:
    """The lines without the tracker's ``unavailable, retrying...``: it prints one whenever a watch attempt meets
    an Unavailable node (node.go), and in full-suite runs one sometimes came first or last, so positions are
    checked on the other lines (the order of those retries was not pinned down: see the session notes)."""
    return [line for line in lines if line != RETRYING]


def upgrade_argv(sim: Sim, node: str, image: str, timeout: str) -> list[str]:
    talosconfig = ["--talosconfig", str(sim.talosconfig)]
    return [
        str(sim.talosctl),
        *talosconfig,
        "-n",
        node,
        "upgrade",
        "--image",
        image,
        "--wait",
        "--timeout",
        timeout,
    ]


def upgrade(cluster: Cluster, node: str, image: str, timeout: str) -> subprocess.CompletedProcess[str]:
    argv = upgrade_argv(cluster.sim, node, image, timeout)
    return subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120)


def boot_id(sim: Sim, node: str) -> str:
    proc = sim.run("-n", node, "read", "/proc/sys/kernel/random/boot_id")
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_upgrade_wait_to_the_nvidia_image_with_the_modules_patched_first(cluster: Cluster) -> None:
    sim, node = cluster.sim, cluster.addr("upgrade")
    before = boot_id(sim, node)
    proc = upgrade(cluster, node, NVIDIA, "60s")
    assert proc.returncode == 0, proc.stderr
    lines = tracker_lines(proc.stderr, node)
    steady = settled(lines)
    assert steady[:2] == ["waiting for actor ID", steady[1]]
    assert steady[1].startswith("actor ID: ")
    assert lines[lines.index("task: stopAllServices action: START") + 1 :][:2] == [
        "error: stopAllServices task completed",  # node.go:270-272: printed as an error, then retried
        "unavailable, retrying...",
    ]
    assert steady[-2:] == ["events check condition met", "post check passed"]
    assert boot_id(sim, node) != before
    assert "nvidia-open-gpu-kernel-modules-lts" in extension_names(sim, node)
    assert get_ids(sim, node, "modules") == sorted(MODULES)


def test_upgrade_to_the_nvidia_image_without_the_modules_hangs_the_boot_past_timeout(
    cluster: Cluster,
) -> None:
    """reality-gaps §1 finding 3 and §2 row 7: the boot waits for ext-nvidia-persistenced; the tracker hits
    --timeout (shorter than BootTimeout) and exits 1, the last thing it printed being the node stuck booting: the
    timeout itself is not printed (the per-node update races the expired context, node.go:108-115, and the final
    error is suppressed, tracker.go:181). Later the node rolls back to its previous image."""
    sim, node = cluster.sim, cluster.addr("hang")
    start = time.monotonic()
    proc = upgrade(cluster, node, NVIDIA, f"{BOOT_TIMEOUT_S * 2 / 3}s")
    assert proc.returncode == 1
    lines = tracker_lines(proc.stderr, node)
    assert "stage: BOOTING ready: false unmetCond: []" in lines
    assert "post check passed" not in lines
    assert time.monotonic() - start < BOOT_TIMEOUT_S
    assert "nvidia-open-gpu-kernel-modules-lts" in extension_names(sim, node)  # booted the new image, stuck
    rolled_back = wait_for(
        lambda: sim.run("-n", node, "get", "extensions", "-o", "yaml"),
        lambda p: p.returncode == 0 and "nvidia" not in p.stdout,
        BOOT_TIMEOUT_S + 30,
    )
    assert VANILLA_ID in rolled_back.stdout


def test_a_hung_boot_within_timeout_fails_on_the_boot_sequence_error(cluster: Cluster) -> None:
    """With --timeout longer than BootTimeout the tracker is connected when the boot sequence fails: machined
    publishes the failed sequence (actor ID "", the one the tracker watches after the reboot) and node.go:292-294
    turns it into an error. Derived from the source, not observed on hardware: reality-gaps §2 row 7's "a node
    that rolls back within --timeout passes the post-check" does not hold while the node's API is reachable
    during the hung boot."""
    sim, node = cluster.sim, cluster.addr("hang-long")
    proc = upgrade(cluster, node, NVIDIA, "60s")
    assert proc.returncode == 1
    failure = (
        "sequence failed: error running phase 9 in boot sequence: task 1/1: failed, 1 error occurred:\n"
        "\t* context deadline exceeded\n\n"
    )
    # node.go:276-282 prints the message where the code goes and the code where the message goes.
    assert f'"{node}": sequence: boot action: NOOP error: [code: {failure} message: FATAL]\n' in proc.stderr
    assert f'"{node}": error: sequence error: {failure}\n' in proc.stderr
    last = tracker_lines(proc.stderr, node)[-1]  # go-retry's ErrorSet of every distinct error of the watch
    assert last.endswith("error(s) occurred:"), proc.stderr
    assert "post check passed" not in proc.stderr
    wait_for(lambda: sim.run("-n", node, "version"), lambda p: p.returncode == 0, BOOT_TIMEOUT_S + 30)


def test_reboot_waits_for_a_new_boot_id(cluster: Cluster) -> None:
    """The tracker's re-watch after the node went away tails the new boot's whole history (node.go:163-173) and
    meets its "ready". Which sequence lines it printed is not asserted: machined answers Reboot at once and starts
    the sequence (v1alpha1_server.go:343-370), the tracker's watch is not guaranteed to be in place by then
    (node.go:75-97), and a watch first placed after the node went down takes the reboot's actor ID and so prints
    none of the new boot's events (actor "", node.go:138-158,247)."""
    sim, node = cluster.sim, cluster.addr("reboot")
    before = boot_id(sim, node)
    proc = sim.run("-n", node, "reboot")
    assert proc.returncode == 0, proc.stderr
    lines = tracker_lines(proc.stderr, node)
    assert "events check condition met" in lines
    assert settled(lines)[-1] == "post check passed"
    assert boot_id(sim, node) != before


@dataclass(frozen=True)
class Event:
    """One event as ``talosctl events`` prints it."""

    id: str
    kind: str  # the type URL's message name: SequenceEvent, PhaseEvent, TaskEvent, MachineStatusEvent
    actor: str
    source: str
    message: str


def parse_events(lines: list[str]) -> list[Event]:
    """``talosctl events`` prints a header, then each event as two tab-aligned lines flushed together: node, ID,
    type URL; then actor (often empty), source, message (talos@v1.12.0:cmd/talosctl/cmd/talos/events.go:67-128,
    format ``"%s\t%s\t%s\n%s\t%s\t%s\n"``). The second line's cells start where the first line's do."""
    body = lines[1:]
    events = []
    for first, second in zip(body[::2], body[1::2], strict=True):
        _, event_id, type_url = first.split()
        id_at, type_at = first.index(event_id), first.index(type_url)
        kind = type_url.rsplit(".", 1)[-1]
        source, message = second[id_at:type_at].strip(), second[type_at:].strip()
        events.append(Event(event_id, kind, second[:id_at].strip(), source, message))
    return events


def talosctl_events(
    sim: Sim, node: str, *flags: str, until: str | None, timeout: float = 30.0
) -> list[Event]:
    """The events the real ``talosctl events`` prints, up to the first whose second line contains ``until``
    (then the process is stopped: it streams for as long as the node's stream lasts), or with ``until`` None
    all of them until the stream ends (the node went down). Fails after ``timeout`` with what it got."""
    argv = [str(sim.talosctl), "--talosconfig", str(sim.talosconfig), "-n", node, "events", *flags]
    lines: queue.Queue[str | None] = queue.Queue()
    got: list[str] = []
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) as proc:
        reader = threading.Thread(target=pump, args=(proc, lines), daemon=True)
        reader.start()
        deadline = time.monotonic() + timeout
        try:
            while (line := lines.get(timeout=max(deadline - time.monotonic(), 0.01))) is not None:
                got.append(line)
                if until is not None and until in line and len(got) % 2 == 1:  # header + whole events
                    break
            else:
                assert until is None, f"talosctl events {flags} ended before {until!r}: {got}"
        except queue.Empty:
            pytest.fail(f"talosctl events {flags}: nothing with {until!r} within {timeout} s; got {got}")
        finally:
            proc.kill()
            # the reader sees EOF once the process is gone; leaving the block first closed stdout under it
            # (ValueError: I/O operation on closed file, in the reader thread)
            reader.join(timeout=60)
    return parse_events(got)


def pump(proc: subprocess.Popen[str], lines: queue.Queue[str | None]) -> None:
    """Forward a process's stdout lines to ``lines``, then None at its end."""
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.put(line.rstrip("\n"))
    lines.put(None)


def test_events_tail_since_and_duration_select_from_the_boots_history(cluster: Cluster) -> None:
    """machined keeps each boot's events in a ring buffer (NewEvents(1000, 10), talos@v1.12.0:internal/app/machined/
    pkg/runtime/v1alpha1/v1alpha1_controller.go:49) and places a watch by tail count, after an event ID, or by age
    (v1alpha1_events.go:124-156); the buffer is machined's memory, so after a reboot it starts with the boot."""
    sim, node = cluster.sim, cluster.addr("tails")
    assert sim.run("-n", node, "reboot").returncode == 0
    # the boot ends ready; "RUNNING" alone also matches each service's Running event (service_runner.go:73-93)
    ready = "ready: true"
    boot = talosctl_events(sim, node, "--tail", "-1", until=ready)
    assert (boot[0].kind, boot[0].source, boot[0].message) == ("SequenceEvent", "boot", "START")
    assert (boot[-1].kind, boot[-1].message) == ("MachineStatusEvent", "ready: true, unmet conditions: []")
    assert talosctl_events(sim, node, "--tail", "2", until=ready) == boot[-2:]
    assert talosctl_events(sim, node, "--since", boot[2].id, until=ready) == boot[3:]
    assert talosctl_events(sim, node, "--duration", "1h", until=ready) == boot
    bad = sim.run("-n", node, "events", "--since", "not-an-xid")
    assert bad.returncode == 1
    assert "rpc error: code = Unknown desc = error parsing tail_id: xid: invalid ID" in bad.stderr


# The upgrade sequence on a metal node up to the reboot (talos@v1.12.0:internal/app/machined/pkg/runtime/v1alpha1/
# v1alpha1_sequencer.go:423-470; task names from v1alpha1_sequencer_tasks.go): phase -> task.
UPGRADE_SEQUENCE = {
    "drain": "cordonAndDrainNode",
    "cleanup": "stopAllPods",
    "dbus": "stopDBus",
    "stopServices": "stopServicesForUpgrade",
    "unmount": "unmountPodMounts",
    "unmountBind": "unmountSystemDiskBindMounts",
    "unmountSystem": "unmountEphemeralPartition",
    "volumeFinalize": "teardownLifecycle",
    "upgrade": "upgrade",
    "meta": "reloadMeta",
    "kexec": "kexecPrepare",
}
# simnode's upgrade: the pull 5 s before the answer, the install 15 s after it. The install is the window in which
# the test starts two talosctl processes and places their watches before apid stops: at 0.2 (6 s) a machine at
# load 30 could start them too late, and the second watch then finds the node down and prints nothing.
SLOW_FACTOR = 0.5


def test_a_watch_opened_after_the_upgrade_call_gets_the_sequence_from_its_start(tmp_path: Path) -> None:
    """machined pulls the installer before it answers Upgrade (v1alpha1_server.go:497-501), then runs the sequence
    while its API still serves, until stopAllServices stops apid; a watch opened meanwhile tails the sequence from
    its start, filtered by the actor ID the call returned (v1alpha1_events.go:193-196), and ends with the boot."""
    node = "10.5.5.1"
    with vanilla_cluster(tmp_path, [node], factor=SLOW_FACTOR) as cluster:
        sim, start = cluster.sim, time.monotonic()
        up = sim.run("-n", node, "upgrade", "--image", NVIDIA, "--wait=false")
        assert up.returncode == 0, up.stderr
        assert "Upgrade request received" in up.stdout
        assert time.monotonic() - start >= 10 * SLOW_FACTOR
        actor = talosctl_events(sim, node, "--tail", "-1", until="upgrade")[-1].actor
        mine = talosctl_events(sim, node, "--tail", "-1", "--actor-id", actor, until=None, timeout=60)
    expected = [("upgrade", "START")]
    for phase, task in UPGRADE_SEQUENCE.items():
        expected += [(phase, "START"), (task, "START"), (task, "STOP"), (phase, "STOP")]
    expected += [("stopEverything", "START"), ("stopAllServices", "START")]
    assert [(e.source, e.message) for e in mine] == expected
    assert {e.actor for e in mine} == {actor}
    assert len(actor) == 36  # machined's uuid.New()


def test_upgrade_to_an_image_simnode_does_not_know_fails_on_that_node(cluster: Cluster) -> None:
    """machined validates (pulls) the installer image before anything starts (v1alpha1_server.go:497-501);
    simnode's stand-in for a pull failure is an image missing from "images", with machined's wrapper."""
    sim, node = cluster.sim, cluster.addr("bound")
    missing = installer(VANILLA_ID, "v1.99.0")
    proc = upgrade(cluster, node, missing, "30s")
    assert proc.returncode == 1
    assert tracker_lines(proc.stderr, node)[-1] == (
        f'rpc error: code = Unknown desc = error validating installer image "{missing}": simnode: not one of the '
        f'nodes file\'s "images" [{" ".join(sorted(IMAGES))}]'  # Go's %v of a []string
    )
    assert extension_names(sim, node)[0] == "nvidia-container-toolkit-lts"  # nothing changed


@pytest.mark.parametrize(
    ("change", "flags", "message"),
    [
        (
            {"image": "factory.talos.dev/metal-installer/x:v1.12.0"},
            [],
            '"image" "factory.talos.dev/metal-installer/x',
        ),
        ({"talos_version": "v1.13.0"}, [], 'differs from the image\'s "v1.12.0"'),
        (
            {"extensions": [{"name": "x", "version": "1"}]},
            [],
            '"extensions" and "kernel_modules" come from "image"',
        ),
        (
            {"services": [{"id": "ext-nvidia-persistenced", "state": "Running"}]},
            [],
            "comes from the image's extensions",
        ),
        ({}, ["-time-factor", "0"], "-time-factor 0 must be in (0, 1]"),
    ],
)
def test_bad_image_input_exits_2_naming_the_node(
    tmp_path: Path, change: dict[str, object], flags: list[str], message: str
) -> None:
    node = {"name": "gpu-x", "address": "10.5.0.3", "talos_version": TALOS, "image": VANILLA, **change}
    nodes_file = tmp_path / "nodes.json"
    nodes_file.write_text(json.dumps({"nodes": [node], "images": IMAGES}))
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    argv = [str(build("build-simnode.sh")), "-nodes", str(nodes_file), "-state-dir", str(state), *flags]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)
    assert proc.returncode == 2
    assert message in proc.stderr
    if not flags:
        assert "nodes[0] (gpu-x)" in proc.stderr
    assert list(state.iterdir()) == []


FLEET8 = [f"10.5.3.{i}" for i in range(1, 9)]


@contextmanager
def vanilla_cluster(
    tmp_path: Path, addresses: list[str], down: str = "", factor: float = TIME_FACTOR
) -> Iterator[Cluster]:
    """A simnode of its own at -time-factor ``factor``: ``addresses`` on the vanilla image with the modules in
    their config; ``down`` is powered off."""
    talosctl = build("build-talosctl.sh", TALOS)
    _, with_modules = worker_configs(talosctl, tmp_path)
    nodes = [
        {
            "name": f"gpu-{i}",
            "address": a,
            "talos_version": TALOS,
            "image": VANILLA,
            "machine_config": with_modules,
            "reboot_ms": REBOOT_MS,
        }
        | ({"down": "no-route-to-host"} if a == down else {})
        for i, a in enumerate(addresses)
    ]
    flags = ("-time-factor", str(factor))
    proc = start_simnode(
        build("build-simnode.sh"), tmp_path / "state", {"nodes": nodes, "images": IMAGES}, *flags
    )
    try:
        yield Cluster(Sim(talosctl, tmp_path / "state" / "talosconfig"), tmp_path)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_eight_node_upgrade_with_wait_in_one_call(tmp_path: Path) -> None:
    """``upgrade -n <8 nodes> --wait``: the tracker follows every node at once (tracker.go:160-200, one goroutine
    per node), so the call lasts about one node's upgrade, not eight. Measured, printed (run with -s)."""
    with vanilla_cluster(tmp_path, FLEET8) as cluster:
        start = time.monotonic()
        up = upgrade(cluster, ",".join(FLEET8), NVIDIA, "60s")
        elapsed = time.monotonic() - start
        print(f"8-node upgrade --wait: {elapsed:.1f} s")
        assert up.returncode == 0, up.stderr
        assert all(settled(tracker_lines(up.stderr, a))[-1] == "post check passed" for a in FLEET8)
        assert elapsed < 4 * REBOOT_MS / 1000 + 5
        assert all(get_ids(cluster.sim, a, "modules") == sorted(MODULES) for a in FLEET8)


def test_upgrade_wait_with_a_dead_node_fails_it_at_once_and_upgrades_the_other(tmp_path: Path) -> None:
    """The tracker reads each node's boot ID before the upgrade (node.go:80-85): a dead node fails there, with
    apid's dial error, and is never upgraded; the live node goes through; rc 1, long before --timeout."""
    live, dead = "10.5.4.1", "10.5.4.2"
    with vanilla_cluster(tmp_path, [live, dead], down=dead) as cluster:
        start = time.monotonic()
        up = upgrade(cluster, f"{live},{dead}", NVIDIA, "60s")
        assert up.returncode == 1
        assert time.monotonic() - start < 30
        assert settled(tracker_lines(up.stderr, dead))[0] == unavailable(dead)
        assert "waiting for actor ID" not in tracker_lines(up.stderr, dead)
        assert settled(tracker_lines(up.stderr, live))[-1] == "post check passed"


def test_a_hung_boot_completes_when_the_modules_are_patched_in_time(cluster: Cluster) -> None:
    """Derived, not observed on hardware: startAllServices waits on conditions, not on a deadline alone
    (v1alpha1_sequencer_tasks.go:470-500), machined accepts an apply while booting, and machine.kernel applies
    without a reboot; so patching the modules during the hang lets persistenced start and the boot finish."""
    sim, node = cluster.sim, cluster.addr("rescue")
    with subprocess.Popen(
        upgrade_argv(sim, node, NVIDIA, "60s"),
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    ) as up:
        wait_for(lambda: sim.run("-n", node, "services"), lambda p: "Waiting" in p.stdout, 30)
        patched = sim.run(
            "-n", node, "patch", "machineconfig", "--patch", f"@{cluster.patches / 'modules.yaml'}"
        )
        assert patched.returncode == 0, patched.stderr
        _, stderr = up.communicate(timeout=60)
    assert up.returncode == 0, stderr
    assert settled(tracker_lines(stderr, node))[-1] == "post check passed"
    assert get_ids(sim, node, "modules") == sorted(MODULES)


def test_a_1_13_client_upgrades_a_1_12_node_the_legacy_way_without_draining(cluster: Cluster) -> None:
    """talos@v1.13.0:cmd/talosctl/cmd/talos/upgrade.go:115-126: a node outside the LifecycleService's version
    range makes the 1.13 client fall back to the legacy Upgrade before it would drain (:143), so --drain
    (default true) has no effect on a 1.12 node."""
    client = Sim(build("build-talosctl.sh", "v1.13.0"), cluster.sim.talosconfig)
    node = cluster.addr("client113")
    proc = upgrade(Cluster(client, cluster.patches), node, NVIDIA, "60s")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines()[:2] == [
        "New upgrade API is not available, falling back to legacy",
        f"WARNING: {node}: server version 1.12.0 is older than client version 1.13.0",
    ]
    assert settled(tracker_lines(proc.stderr, node))[-1] == "post check passed"
    assert "phase: drain action: START" in tracker_lines(proc.stderr, node)  # the node's own drain phase


def talosctl_113(cluster: Cluster) -> Sim:
    return Sim(build("build-talosctl.sh", "v1.13.0"), cluster.sim.talosconfig)


def test_a_1_13_client_upgrades_a_1_13_node_through_the_lifecycle_service(cluster: Cluster) -> None:
    """talos@v1.13.0:cmd/talosctl/cmd/talos/upgrade.go:81-168: a node in the new API's range gets the image pulled by
    the ImageService (image.go:237-307: "<node>: pulled image <name>@<digest>"), installed by the LifecycleService
    (its output, then "Exit code: 0" and "<node>: upgrade completed", :199-234), then Reboot with the tracker.
    simnode serves both services only on nodes running 1.13 or later (simnode/lifecycle113.go); the installer's own
    output lines are simnode's (no source gives their wording) and are not asserted."""
    sim, node = cluster.sim, cluster.addr("life113")
    before = boot_id(sim, node)
    proc = talosctl_113(cluster).run(
        "-n", node, "upgrade", "--image", NVIDIA_13, "--drain=false", "--timeout", "60s"
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    pulled = f"{node}: pulled image factory.talos.dev/metal-installer/{NVIDIA_ID}@sha256:"
    assert lines[0].startswith(pulled) and len(lines[0]) == len(pulled) + 64
    done = lines.index(f"{node}: upgrade completed")
    assert lines[done - 1] == f"{node}: Exit code: 0"
    tracker = tracker_lines("\n".join(lines[done + 1 :]), node)
    steady = settled(tracker)  # Reboot answers at once: the first watch may find the node already down
    assert steady[:2] == ["waiting for actor ID", steady[1]] and steady[1].startswith("actor ID: ")
    assert "events check condition met" in tracker  # the new boot's "ready" (see the reboot test)
    assert settled(tracker)[-1] == "post check passed"
    assert "New upgrade API is not available" not in proc.stderr
    assert boot_id(sim, node) != before
    assert "nvidia-open-gpu-kernel-modules-lts" in extension_names(sim, node)
    assert get_ids(sim, node, "modules") == sorted(MODULES)


def test_a_1_13_upgrade_with_drain_installs_then_fails_fetching_the_kubeconfig(cluster: Cluster) -> None:
    """--drain defaults to true and runs after the install, before the reboot (upgrade.go:136-148); it fetches
    the kubeconfig through the Talos API first (drain.go:33-38, kubeclient.go:21-25), which only a control-plane
    node serves (machinehelper.go:33-35). simnode's talosconfig endpoint reaches a worker, so the real talosctl
    stops there: the new image is installed but the node was not rebooted, and boots it at its next reboot.
    Draining through the real control plane, with a control-plane endpoint: tests/sim/test_real_talos_113.py."""
    sim, node = cluster.sim, cluster.addr("drain113")
    proc = talosctl_113(cluster).run("-n", node, "upgrade", "--image", NVIDIA_13, "--timeout", "60s")
    assert proc.returncode == 1
    assert f"{node}: upgrade completed" in proc.stderr.splitlines()
    assert proc.stderr.splitlines()[-1] == (
        "error creating Kubernetes client for drain: error fetching kubeconfig from Talos API: rpc error: "
        "code = Unimplemented desc = kubeconfig is only available on control plane nodes"
    )
    assert "waiting for actor ID" not in proc.stderr
    assert "nvidia-open-gpu-kernel-modules-lts" not in extension_names(sim, node)
    assert sim.run("-n", node, "reboot").returncode == 0
    assert "nvidia-open-gpu-kernel-modules-lts" in extension_names(sim, node)


def test_a_staged_upgrade_reboots_installs_before_the_api_starts_and_boots_the_new_image(
    cluster: Cluster,
) -> None:
    """--stage (talos@v1.12.0:internal/app/machined/internal/server/v1alpha1/v1alpha1_server.go:525-560): machined
    records the image in META and runs the stageUpgrade sequence, the reboot's phases (v1alpha1_sequencer.go:367-390),
    with no upgrade phase of its own; the next boot runs the install sequence before apid starts
    (internal/app/machined/main.go:263-271, v1alpha1_sequencer.go:151-188), which installs the image and reboots into
    it. The tracker sees the node go down and come back on the new image."""
    sim, node = cluster.sim, cluster.addr("staged")
    before = boot_id(sim, node)
    proc = sim.run("-n", node, "upgrade", "--image", NVIDIA, "--stage", "--wait", "--timeout", "60s")
    assert proc.returncode == 0, proc.stderr
    lines = tracker_lines(proc.stderr, node)
    assert "sequence: stageUpgrade action: START" in lines
    assert "phase: upgrade action: START" not in lines
    assert settled(lines)[-1] == "post check passed"
    assert boot_id(sim, node) != before
    assert "nvidia-open-gpu-kernel-modules-lts" in extension_names(sim, node)
