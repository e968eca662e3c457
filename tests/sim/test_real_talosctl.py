"""The real talosctl v1.12.0 against simnode, the simulated Talos node API (issue 14, first slice).

Both binaries are built by the project's scripts (``tools/build-talosctl.sh``, ``tools/build-simnode.sh``) and
cached; the tests skip only when ``go`` is missing. What the real binary prints here is the truth the Python
simulator and the library's parsers are checked against: ``reality-gaps.md`` §2 rows 1-2 derived it from the
talosctl source (``talos@v1.12.0:cmd/talosctl/pkg/talos/helpers/resources.go:48-99``: the resource type is
resolved on the first node, then one COSI call per node, one after another, and each error is appended as
returned, without the node; apid refuses one-to-many for COSI, ``internal/app/apid/pkg/director/director.go:82-85``),
and these tests observe it from the binary.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.buildlock import build_lock
from tests.sim.test_talosctl_get import json_stream  # one JSON document per resource, back to back

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
TALOS = "v1.12.0"
LIVE = ["10.5.0.3", "10.5.0.4", "10.5.0.5"]
DEAD = "10.5.0.9"  # powered off: the dial fails with EHOSTUNREACH
REFUSED = "10.5.0.10"  # host up, apid not listening: ECONNREFUSED
NVRM = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.172.08  Release Build  (root@buildkitsandbox)  "
    "Tue Jul  8 17:59:45 UTC 2025\nGCC version:  gcc version 14.2.0 (GCC) \n"
)
L40S = {
    "id": "0000:01:00.0",
    "class": "Display controller",
    "subclass": "3D controller",
    "vendor": "NVIDIA Corporation",
    "product": "AD102GL [L40S]",
    "class_id": "0x03",
    "subclass_id": "0x02",
    "vendor_id": "0x10de",
    "product_id": "0x26b9",
    "driver": "nvidia",
}
MODULES_PATCHED = (
    "version: v1alpha1\nmachine:\n  type: worker\n  kernel:\n    modules:\n      - name: nvidia\n"
)


def unavailable(address: str, cause: str = "no route to host") -> str:
    """The gRPC error apid's backend returns for a node it cannot dial (grpc-go v1.76.0 wording)."""
    return (
        "rpc error: code = Unavailable desc = connection error: desc = "
        f'"transport: Error while dialing: dial tcp {address}:50000: connect: {cause}"'
    )


def went_down(address: str, cause: str = "no route to host") -> tuple[str, str]:
    """The two stderr shapes of a one-node `get` whose node goes away while it runs, depending on which of
    get's two calls meets it (talos v1.12.0 cmd/talosctl/pkg/talos/helpers/resources.go:49-51 returns the
    resource-definition lookup's error as it is; :81-91 hands the List error to get.go:189-192, which gathers
    it with go-multierror). The fresh-clone CI run of 3 Dec met the second one."""
    plain = unavailable(address, cause)
    return plain + "\n", f"1 error occurred:\n\t* {plain}\n\n\n"


def live_node(address: str, index: int) -> dict[str, object]:
    return {
        "name": f"gpu-{index}",
        "address": address,
        "talos_version": TALOS,
        "extensions": [
            {
                "image": "000.ghcr.io-siderolabs-nvidia-open-gpu-kernel-modules-production.sqsh",
                "name": "nvidia-open-gpu-kernel-modules-production",
                "version": f"570.172.{index:02d}-{TALOS}",
                "author": "Sidero Labs",
                "description": "NVIDIA open GPU kernel modules",
                "compatibility": f">= {TALOS}",
            }
        ],
        "kernel_modules": [
            {"name": "nvidia", "size": 1000 + index, "state": "Live", "address": "0xffffffffc0000000"}
        ],
        "services": [
            {
                "id": "ext-nvidia-persistenced",
                "state": "Running",
                "healthy": True,
                "events": [
                    {"msg": "Health check successful", "state": "Running", "ts": "2026-12-01T10:00:00Z"}
                ],
            },
            {
                "id": "udevd-trigger",
                "state": "Finished",
                "events": [
                    {
                        "msg": "Service finished successfully",
                        "state": "Finished",
                        "ts": "2026-12-01T10:00:00Z",
                    }
                ],
            },
        ],
        "machine_config": MODULES_PATCHED,
        "platform_metadata": {"platform": "metal", "hostname": f"gpu-{index}"},
        "pci_devices": [L40S],
        "files": {"/proc/driver/nvidia/version": NVRM} if index == 1 else {},
    }


NODES: dict[str, object] = {
    "nodes": [
        *(live_node(a, i) for i, a in enumerate(LIVE, 1)),
        {"name": "gpu-dead", "address": DEAD, "talos_version": TALOS, "down": "no-route-to-host"},
        {"name": "gpu-refused", "address": REFUSED, "talos_version": TALOS, "down": "connection-refused"},
    ]
}


def find_go() -> str | None:
    return shutil.which("go") or shutil.which("go", path="/usr/local/go/bin")


def build(script: str, *args: str) -> Path:
    """Run a build script (nice'd, one package at a time: the machine is shared) and return the binary."""
    go = find_go()
    if go is None:
        pytest.skip("go is not installed: the real talosctl and simnode are built from Go modules")
    env = {**os.environ, "PATH": f"{Path(go).parent}:{os.environ['PATH']}", "GOFLAGS": "-p=1"}
    with build_lock(script):  # parallel workers: one builds, the others then find it cached
        proc = subprocess.run(
            ["nice", "-n", "10", str(ROOT / "tools" / script), *args],
            capture_output=True,
            text=True,
            env=env,
            check=False,
            timeout=1800,
        )
    assert proc.returncode == 0, proc.stderr
    return Path(proc.stdout.strip().splitlines()[-1])


@dataclass(frozen=True)
class Sim:
    talosctl: Path
    talosconfig: Path

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.talosctl), "--talosconfig", str(self.talosconfig), *args],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )


@pytest.fixture(scope="module")
def simnode_bin() -> Path:
    return build("build-simnode.sh")


def start_simnode(binary: Path, state: Path, nodes: dict[str, object], *flags: str) -> subprocess.Popen[str]:
    """Start simnode (with ``flags``) and wait for its endpoint file (written once every node answers)."""
    state.mkdir(mode=0o700)
    nodes_file = state.parent / f"{state.name}-nodes.json"
    nodes_file.write_text(json.dumps(nodes))
    # A log file, not a pipe: nothing reads simnode's output while it runs, and a full pipe would stall it.
    log = state.parent / f"{state.name}-simnode.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [str(binary), "-nodes", str(nodes_file), "-state-dir", str(state), *flags],
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )
    deadline = time.monotonic() + 60
    while not (state / "endpoint").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            pytest.fail(f"simnode did not start: {log.read_text()}")
        time.sleep(0.05)
    return proc


@pytest.fixture(scope="module")
def sim(simnode_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sim]:
    talosctl = build("build-talosctl.sh", TALOS)
    state = tmp_path_factory.mktemp("simnode") / "state"
    proc = start_simnode(simnode_bin, state, NODES)
    yield Sim(talosctl, state / "talosconfig")
    proc.terminate()
    proc.wait(timeout=10)


def table_nodes(stdout: str) -> list[str]:
    """The NODE column of a ``get`` table, header excluded."""
    return [line.split()[0] for line in stdout.splitlines()[1:] if line.strip()]


def version_nodes(stdout: str) -> list[str]:
    """The nodes of a ``version`` reply, sorted: one-to-many replies arrive in completion order, not ``-n`` order."""
    return sorted(line.split()[-1] for line in stdout.splitlines() if line.strip().startswith("NODE:"))


def test_talosconfig_and_state_dir_are_owner_only(sim: Sim) -> None:
    """The talosconfig holds the admin key: the directory and the file are the owner's only."""
    assert sim.talosconfig.parent.stat().st_mode & 0o777 == 0o700
    assert sim.talosconfig.stat().st_mode & 0o077 == 0
    cfg = yaml.safe_load(sim.talosconfig.read_text())
    assert cfg["context"] == "simnode"
    assert cfg["contexts"]["simnode"]["endpoints"] == [
        (sim.talosconfig.parent / "endpoint").read_text().strip()
    ]


def test_version_reports_every_node(sim: Sim) -> None:
    proc = sim.run("-n", ",".join(LIVE), "version")
    assert proc.returncode == 0, proc.stderr
    assert version_nodes(proc.stdout) == LIVE
    assert proc.stdout.count(f"Tag:         {TALOS}") == 1 + len(LIVE)  # client + each server


def test_get_extensions_json_carries_each_nodes_metadata(sim: Sim) -> None:
    proc = sim.run("-n", ",".join(LIVE), "get", "extensions", "-o", "json")
    assert proc.returncode == 0, proc.stderr
    docs = json_stream(proc.stdout)
    assert [d["node"] for d in docs] == LIVE
    first = docs[0]
    assert first["metadata"]["type"] == "ExtensionStatuses.runtime.talos.dev"  # type: ignore[index]
    assert first["metadata"]["id"] == "000.ghcr.io-siderolabs-nvidia-open-gpu-kernel-modules-production"  # type: ignore[index]
    assert first["metadata"]["owner"] == "runtime.ExtensionStatusController"  # type: ignore[index]
    meta = first["spec"]["metadata"]  # type: ignore[index]
    assert meta["version"] == f"570.172.01-{TALOS}"
    assert meta["compatibility"] == {"talos": {"version": f">= {TALOS}"}}


def test_get_modules_resolves_the_alias_and_prints_the_state_column(sim: Sim) -> None:
    """``modules`` is an alias of LoadedKernelModule with one print column, State (machinery's definition)."""
    table = sim.run("-n", LIVE[0], "get", "modules")
    assert table.returncode == 0, table.stderr
    assert table.stdout.split("\n")[0].split() == ["NODE", "NAMESPACE", "TYPE", "ID", "VERSION", "STATE"]
    assert table.stdout.split("\n")[1].split()[2:] == ["LoadedKernelModule", "nvidia", "1", "Live"]
    docs = json_stream(sim.run("-n", LIVE[0], "get", "modules", "-o", "json").stdout)
    assert docs[0]["spec"] == {
        "address": "0xffffffffc0000000",
        "referenceCount": 0,
        "size": 1001,
        "state": "Live",
    }


def test_services_lists_finished_one_shots_but_get_services_does_not(sim: Sim) -> None:
    """``services`` (ServiceList) shows every service; the Service resource exists only while Running."""
    listed = sim.run("-n", LIVE[0], "services")
    assert listed.returncode == 0, listed.stderr
    rows = [line.split()[:4] for line in listed.stdout.splitlines()[1:]]
    assert rows == [
        [LIVE[0], "ext-nvidia-persistenced", "Running", "OK"],
        [LIVE[0], "udevd-trigger", "Finished", "?"],
    ]
    resources = sim.run("-n", LIVE[0], "get", "services")
    assert [line.split()[3] for line in resources.stdout.splitlines()[1:]] == ["ext-nvidia-persistenced"]


def test_get_machineconfig_yaml_returns_the_config(sim: Sim) -> None:
    proc = sim.run("-n", LIVE[1], "get", "machineconfig", "-o", "yaml")
    assert proc.returncode == 0, proc.stderr
    doc = yaml.safe_load(proc.stdout)
    assert doc["node"] == LIVE[1]
    assert doc["metadata"]["id"] == "v1alpha1"
    assert yaml.safe_load(doc["spec"]) == yaml.safe_load(MODULES_PATCHED)


def test_read_streams_the_file_and_a_missing_one_is_not_found(sim: Sim) -> None:
    """``read`` is one node at a time (talosctl refuses several); a missing file is NotFound with os.Stat's text."""
    found = sim.run("-n", LIVE[0], "read", "/proc/driver/nvidia/version")
    assert (found.returncode, found.stdout) == (0, NVRM)
    missing = sim.run("-n", LIVE[1], "read", "/proc/driver/nvidia/version")
    assert missing.returncode == 1
    assert missing.stderr == (
        "error reading: rpc error: code = NotFound desc = stat /proc/driver/nvidia/version: no such file or directory\n"
    )
    dead = sim.run("-n", DEAD, "read", "/proc/driver/nvidia/version")
    assert dead.stderr == f"error reading: {unavailable(DEAD)}\n"


def test_platformmetadata_and_pcidevices_carry_talos_types_and_owners(sim: Sim) -> None:
    meta = yaml.safe_load(sim.run("-n", LIVE[2], "get", "platformmetadata", "-o", "yaml").stdout)
    assert meta["metadata"]["type"] == "PlatformMetadatas.talos.dev"
    assert meta["metadata"]["owner"] == "network.PlatformConfigApplyController"
    assert meta["spec"] == {"platform": "metal", "hostname": "gpu-3"}
    table = sim.run("-n", LIVE[0], "get", "pcidevices")
    assert table.stdout.splitlines()[0].split()[-4:] == ["CLASS", "SUBCLASS", "VENDOR", "PRODUCT"]
    (dev,) = json_stream(sim.run("-n", LIVE[0], "get", "pcidevices", "-o", "json").stdout)
    assert dev["metadata"]["id"] == L40S["id"]  # type: ignore[index]
    assert dev["spec"] == {k: v for k, v in L40S.items() if k != "id"}


def test_get_with_the_first_node_dead_fails_the_whole_call(sim: Sim) -> None:
    """reality-gaps §2 row 2: the type is resolved on nodes[0]; its error is the whole output, no node named."""
    proc = sim.run("-n", ",".join([DEAD, *LIVE]), "get", "extensions")
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert proc.stderr == unavailable(DEAD) + "\n"


@pytest.mark.parametrize("position", ["middle", "end"])
def test_get_with_a_later_node_dead_lists_the_others_and_names_no_node(sim: Sim, position: str) -> None:
    """reality-gaps §2 row 1: every other node's rows print (nodes after the dead one too), rc 1, and the
    error item carries no ``<node>: `` prefix, so only the dial address inside the text tells which node."""
    order = [LIVE[0], DEAD, *LIVE[1:]] if position == "middle" else [*LIVE, DEAD]
    proc = sim.run("-n", ",".join(order), "get", "extensions")
    assert proc.returncode == 1
    assert table_nodes(proc.stdout) == LIVE
    assert proc.stderr == f"1 error occurred:\n\t* {unavailable(DEAD)}\n\n\n"


def test_get_with_a_refusing_node_reports_connection_refused(sim: Sim) -> None:
    proc = sim.run("-n", f"{LIVE[0]},{REFUSED}", "get", "modules")
    assert proc.returncode == 1
    assert table_nodes(proc.stdout) == [LIVE[0]]
    assert proc.stderr == f"1 error occurred:\n\t* {unavailable(REFUSED, 'connection refused')}\n\n\n"


@pytest.mark.parametrize("position", ["head", "middle", "end"])
def test_version_with_a_dead_node_warns_with_the_node_and_exits_zero(sim: Sim, position: str) -> None:
    """``version`` is one-to-many through apid: each node's error comes back as a reply with its hostname, and
    talosctl prints it as a WARNING naming the node while the call still succeeds (rc 0) for the others."""
    order = {"head": [DEAD, *LIVE], "middle": [LIVE[0], DEAD, *LIVE[1:]], "end": [*LIVE, DEAD]}[position]
    proc = sim.run("-n", ",".join(order), "version")
    assert proc.returncode == 0
    assert version_nodes(proc.stdout) == LIVE
    assert proc.stderr == f"WARNING: 1 error occurred:\n\t* {DEAD}: {unavailable(DEAD)}\n\n\n"


def test_unregistered_resource_type_is_not_found(sim: Sim) -> None:
    """A resource type that is not registered answers NotFound from the first node, as a real node does."""
    proc = sim.run("-n", LIVE[0], "get", "nosuchtype")
    assert proc.returncode == 1
    assert proc.stderr == 'rpc error: code = NotFound desc = resource "nosuchtype" is not registered\n'


@pytest.mark.parametrize(
    ("node", "message"),
    [
        (
            {"name": "gpu-x", "address": "10.5.0.3:50000", "talos_version": TALOS},
            '"address" "10.5.0.3:50000"',
        ),
        ({"name": "gpu-x", "address": "10.5.0.3", "talos_version": TALOS, "down": "maybe"}, '"down" "maybe"'),
        (
            {"name": "gpu-x", "address": "10.5.0.3", "talos_version": TALOS, "colour": "red"},
            'unknown field "colour"',
        ),
        (
            {
                "name": "gpu-x",
                "address": "10.5.0.3",
                "talos_version": TALOS,
                "machine_config": "version: v1alpha1\nmachine:\n  kernal: {}\n",
            },
            # simnode decodes with pkg/machinery v1.13's loader, which names the document (configloader)
            'node gpu-x (10.5.0.3): "machine_config": error decoding document /v1alpha1/ (line 1): unknown keys found',
        ),
    ],
)
def test_bad_nodes_file_exits_2_naming_the_node_and_writes_nothing(
    simnode_bin: Path, tmp_path: Path, node: dict[str, object], message: str
) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    nodes_file = tmp_path / "nodes.json"
    nodes_file.write_text(json.dumps({"nodes": [node]}))
    proc = subprocess.run(
        [str(simnode_bin), "-nodes", str(nodes_file), "-state-dir", str(state)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert proc.returncode == 2
    assert message in proc.stderr
    assert list(state.iterdir()) == []


LATENCY_S = 0.5


@pytest.fixture(scope="module")
def slow_sim(simnode_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sim]:
    """Four live nodes, each answering every call after LATENCY_S (standing for the network round trip)."""
    talosctl = build("build-talosctl.sh", TALOS)
    state = tmp_path_factory.mktemp("simnode-latency") / "state"
    nodes = [
        {**live_node(a, i), "latency_ms": int(LATENCY_S * 1000)} for i, a in enumerate([*LIVE, "10.5.0.6"], 1)
    ]
    proc = start_simnode(simnode_bin, state, {"nodes": nodes})
    yield Sim(talosctl, state / "talosconfig")
    proc.terminate()
    proc.wait(timeout=10)


def timed(sim: Sim, *args: str) -> float:
    start = time.monotonic()
    proc = sim.run(*args)
    assert proc.returncode == 0, proc.stderr
    return time.monotonic() - start


def test_get_visits_nodes_one_after_another_version_fans_out(slow_sim: Sim) -> None:
    """reality-gaps §2 row 3: ``get -n a,b,c,d`` costs one round trip per node, in sequence (plus the type lookup
    on the first node and the client version check), while ``version`` asks all nodes at once through apid."""
    nodes = ",".join([*LIVE, "10.5.0.6"])
    get_s = timed(slow_sim, "-n", nodes, "get", "extensions")
    version_s = timed(slow_sim, "-n", nodes, "version")
    assert get_s >= 4 * LATENCY_S
    assert version_s < 3 * LATENCY_S


FLEET = [f"10.6.{i // 250}.{i % 250 + 1}" for i in range(1000)]
FLEET_DEAD = {"head": FLEET[0], "middle": FLEET[500], "end": FLEET[-1]}


@pytest.fixture(scope="module")
def fleet(simnode_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sim]:
    """1,000 nodes with one extension each; the first, the 501st and the last are powered off."""
    talosctl = build("build-talosctl.sh", TALOS)
    state = tmp_path_factory.mktemp("simnode-fleet") / "state"
    ext = [{"name": "nvidia-open-gpu-kernel-modules-production", "version": f"570.172.08-{TALOS}"}]
    nodes = [
        {"name": f"gpu-{i}", "address": a, "talos_version": TALOS, "extensions": ext}
        | ({"down": "no-route-to-host"} if a in FLEET_DEAD.values() else {})
        for i, a in enumerate(FLEET)
    ]
    proc = start_simnode(simnode_bin, state, {"nodes": nodes})
    yield Sim(talosctl, state / "talosconfig")
    proc.terminate()
    proc.wait(timeout=10)


def fleet_order(position: str) -> tuple[str, list[str], list[str]]:
    """The dead node of ``position``, the 999 live ones, and the ``-n`` list with the dead one there."""
    dead = FLEET_DEAD[position]
    others = [a for a in FLEET if a not in FLEET_DEAD.values()]
    where = {"head": 0, "middle": 499, "end": len(others)}[position]
    return dead, others, [*others[:where], dead, *others[where:]]


@pytest.mark.parametrize("position", ["head", "middle", "end"])
def test_fleet_version_fails_only_the_dead_node(fleet: Sim, position: str) -> None:
    dead, others, order = fleet_order(position)
    proc = fleet.run("-n", ",".join(order), "version")
    assert proc.returncode == 0
    assert version_nodes(proc.stdout) == sorted(others)
    assert proc.stderr == f"WARNING: 1 error occurred:\n\t* {dead}: {unavailable(dead)}\n\n\n"


@pytest.mark.parametrize("position", ["head", "middle", "end"])
def test_fleet_get_with_a_dead_node(fleet: Sim, position: str) -> None:
    """Only a dead node at the head of the list blanks the call; elsewhere the 999 others print, rc 1, and the
    error names no node (so a caller must read the dial address to attribute it)."""
    dead, others, order = fleet_order(position)
    proc = fleet.run("-n", ",".join(order), "get", "extensions")
    assert proc.returncode == 1
    if position == "head":
        assert (proc.stdout, proc.stderr) == ("", unavailable(dead) + "\n")
    else:
        assert table_nodes(proc.stdout) == others
        assert proc.stderr == f"1 error occurred:\n\t* {unavailable(dead)}\n\n\n"


# ApplyConfiguration through `talosctl patch machineconfig` (machined's logic rewritten in simnode/apply.go:
# talos@v1.12.0:internal/app/machined/internal/server/v1alpha1/v1alpha1_server.go:173-343 and
# internal/app/machined/pkg/runtime/v1alpha1/v1alpha1_runtime.go:119-206). The node configs are generated by
# the real `talosctl gen config`, so Talos's validation passes them as it would a real node's.
MODULES_PATCH = "machine:\n  kernel:\n    modules:\n      - name: nvidia\n"
TYPO_PATCH = "machine:\n  kernal:\n    modules:\n      - name: nvidia\n"
FILES_PATCH = "machine:\n  files:\n    - content: x\n      path: /var/etc/x\n      permissions: 0o644\n      op: create\n"
APPLY = {"dry": "10.5.1.1", "auto": "10.5.1.2", "reboot": "10.5.1.3", "modes": "10.5.1.4"}
REBOOT_S = 2.0


def wait_for(
    probe: Callable[[], subprocess.CompletedProcess[str]],
    done: Callable[[subprocess.CompletedProcess[str]], bool],
    timeout: float = 10.0,
) -> subprocess.CompletedProcess[str]:
    """Run ``probe`` until ``done`` holds for its result; fail with the last output after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not done(result := probe()):
        assert time.monotonic() < deadline, result.stderr
        time.sleep(0.1)
    return result


@pytest.fixture(scope="module")
def apply_sim(simnode_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Sim, Path]]:
    """Four nodes running a worker config from the real `talosctl gen config`; patches in a directory."""
    talosctl = build("build-talosctl.sh", TALOS)
    tmp = tmp_path_factory.mktemp("simnode-apply")
    argv = [
        "gen",
        "config",
        "sim",
        "https://10.5.0.2:6443",
        "--output-types",
        "worker",
        "-o",
        str(tmp / "worker.yaml"),
    ]
    gen = subprocess.run([str(talosctl), *argv], capture_output=True, text=True, check=False, timeout=60)
    assert gen.returncode == 0, gen.stderr
    worker = (tmp / "worker.yaml").read_text()
    nodes = [
        {"name": f"gpu-{role}", "address": a, "talos_version": TALOS, "machine_config": worker}
        | ({"reboot_ms": int(REBOOT_S * 1000)} if role == "reboot" else {})
        for role, a in APPLY.items()
    ]
    for name, text in {"modules": MODULES_PATCH, "typo": TYPO_PATCH, "files": FILES_PATCH}.items():
        (tmp / f"{name}.yaml").write_text(text)
    proc = start_simnode(simnode_bin, tmp / "state", {"nodes": nodes})
    yield Sim(talosctl, tmp / "state" / "talosconfig"), tmp
    proc.terminate()
    proc.wait(timeout=10)


def active_config(sim: Sim, node: str) -> tuple[int, dict[str, object]]:
    """The MachineConfig resource's version and its v1alpha1 document (the first; 1.12 adds others)."""
    doc = yaml.safe_load(sim.run("-n", node, "get", "machineconfig", "-o", "yaml").stdout)
    return doc["metadata"]["version"], next(yaml.safe_load_all(doc["spec"]))


def patch(sim: Sim, patches: Path, node: str, name: str, *flags: str) -> subprocess.CompletedProcess[str]:
    return sim.run("-n", node, "patch", "machineconfig", "--patch", f"@{patches / name}.yaml", *flags)


def test_patch_dry_run_shows_the_mode_and_diff_and_changes_nothing(apply_sim: tuple[Sim, Path]) -> None:
    sim, patches = apply_sim
    node = APPLY["dry"]
    proc = patch(sim, patches, node, "modules", "--dry-run")
    assert proc.returncode == 0
    assert proc.stderr.startswith(
        f"patched MachineConfigs.config.talos.dev/v1alpha1 at the node {node}\n"
        "Dry run summary:\nApplied configuration without a reboot (skipped in dry-run).\nConfig diff:\n\n--- a\n+++ b\n"
    )
    assert "+    kernel:\n+        modules:\n+            - name: nvidia\n" in proc.stderr
    files = patch(sim, patches, node, "files", "--dry-run")
    assert "Applied configuration with a reboot (skipped in dry-run)." in files.stderr
    assert active_config(sim, node)[0] == 1


def test_patch_with_a_misspelt_key_is_refused_before_any_call(apply_sim: tuple[Sim, Path]) -> None:
    """reality-gaps §2 row 4: the real client decodes strictly (configpatcher); nothing reaches the node."""
    sim, patches = apply_sim
    node = APPLY["dry"]
    proc = patch(sim, patches, node, "typo")
    assert proc.returncode == 1
    assert (
        proc.stderr
        == "unknown keys found during decoding:\nmachine:\n    kernal:\n        modules:\n            - name: nvidia\n\n"
    )
    assert active_config(sim, node)[0] == 1


def test_patch_auto_applies_a_kernel_modules_change_without_a_reboot(apply_sim: tuple[Sim, Path]) -> None:
    """machine.kernel is one of the sections machined applies immediately (v1alpha1_runtime.go:152)."""
    sim, patches = apply_sim
    node = APPLY["auto"]
    proc = patch(sim, patches, node, "modules")
    assert (proc.returncode, proc.stderr.splitlines()[1:]) == (0, ["Applied configuration without a reboot"])
    version, cfg = active_config(sim, node)
    assert version == 2
    assert cfg["machine"]["kernel"] == {"modules": [{"name": "nvidia"}]}  # type: ignore[index]
    # Patching again appends: the strategic merge of machine.kernel.modules has no merge key (real machinery).
    again = patch(sim, patches, node, "modules")
    assert "Apply was skipped" not in again.stderr
    assert active_config(sim, node)[1]["machine"]["kernel"] == {"modules": [{"name": "nvidia"}] * 2}  # type: ignore[index]


def test_patch_auto_with_a_files_change_reboots_the_node(apply_sim: tuple[Sim, Path]) -> None:
    """machine.files is not immediate: auto mode answers "with a reboot" and the reason, the node's API goes
    away (connection refused) and comes back running the new config."""
    sim, patches = apply_sim
    node = APPLY["reboot"]
    proc = patch(sim, patches, node, "files")
    assert proc.returncode == 0
    assert proc.stderr.splitlines()[1] == (
        "Applied configuration with a reboot: this config change can't be applied in immediate mode"
    )
    seen_down = wait_for(lambda: sim.run("-n", node, "get", "machineconfig"), lambda p: p.returncode != 0)
    assert seen_down.stderr in went_down(node, "connection refused")
    # apid's reconnect back-off (up to 15 s) is part of the wait, as on a real cluster.
    wait_for(lambda: sim.run("-n", node, "get", "machineconfig"), lambda p: p.returncode == 0, REBOOT_S + 20)
    assert active_config(sim, node)[1]["machine"]["files"][0]["path"] == "/var/etc/x"  # type: ignore[index]


def test_patch_no_reboot_refuses_a_reboot_change_and_staged_keeps_it_for_later(
    apply_sim: tuple[Sim, Path],
) -> None:
    sim, patches = apply_sim
    node = APPLY["modes"]
    refused = patch(sim, patches, node, "files", "--mode", "no-reboot")
    assert refused.returncode == 1
    assert refused.stderr.splitlines()[1:3] == [
        "1 error occurred:",
        f"\t* {node}: rpc error: code = InvalidArgument desc = this config change can't be applied in immediate mode",
    ]
    staged = patch(sim, patches, node, "files", "--mode", "staged")
    assert (staged.returncode, staged.stderr.splitlines()[1:]) == (
        0,
        ["Staged configuration to be applied after the next reboot"],
    )
    assert active_config(sim, node)[0] == 1


def test_talosctl_1_13_reads_and_dry_runs_against_simnode(apply_sim: tuple[Sim, Path]) -> None:
    """The 1.13 client speaks the same API for these calls: version, get, and patch --dry-run all work.

    simnode serves pkg/machinery v1.13.0's API and resource definitions whatever talos_version a node reports, except
    the 1.13-only services (ImageService, LifecycleService), which only nodes reporting 1.13 or later serve.
    """
    sim, patches = apply_sim
    client = Sim(build("build-talosctl.sh", "v1.13.0"), sim.talosconfig)
    node = APPLY["dry"]
    version = client.run("-n", node, "version")
    assert (version.returncode, version_nodes(version.stdout)) == (0, [node])
    assert "Tag:         v1.13.0" in version.stdout  # the client's own tag
    dry = patch(client, patches, node, "modules", "--dry-run")
    assert dry.returncode == 0
    assert "Applied configuration without a reboot (skipped in dry-run)." in dry.stderr


def test_a_node_switched_down_and_up_while_running(simnode_bin: Path, tmp_path: Path) -> None:
    """SIGHUP re-reads the nodes file's "down": the node's open connections close and dials fail as for a
    powered-off host; switched back, it answers again (after apid's reconnect back-off)."""
    talosctl = build("build-talosctl.sh", TALOS)
    nodes: dict[str, object] = {"nodes": [live_node(a, i) for i, a in enumerate(LIVE[:2], 1)]}
    proc = start_simnode(simnode_bin, tmp_path / "state", nodes)
    sim, target = Sim(talosctl, tmp_path / "state" / "talosconfig"), LIVE[1]
    nodes_file = tmp_path / "state-nodes.json"
    try:
        assert sim.run("-n", target, "get", "extensions").returncode == 0  # a connection to the node is open
        nodes["nodes"][1]["down"] = "no-route-to-host"  # type: ignore[index]
        nodes_file.write_text(json.dumps(nodes))
        proc.send_signal(signal.SIGHUP)
        down = wait_for(lambda: sim.run("-n", target, "get", "extensions"), lambda p: p.returncode != 0)
        assert down.stderr in went_down(target)
        assert sim.run("-n", LIVE[0], "get", "extensions").returncode == 0
        del nodes["nodes"][1]["down"]  # type: ignore[index]
        nodes_file.write_text(json.dumps(nodes))
        proc.send_signal(signal.SIGHUP)
        wait_for(lambda: sim.run("-n", target, "get", "extensions"), lambda p: p.returncode == 0, 20)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
