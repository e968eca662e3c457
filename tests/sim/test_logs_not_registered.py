"""``talosctl logs`` for a service with no log yet, the real talosctl v1.12.0 against simnode.

Real Talos keeps one in-memory log per service, created only when the service's runner first opens its writer
(siderolabs/talos v1.13.0 internal/app/machined/pkg/system/runner/process/process.go:198,
runner/containerd/containerd.go:170, runner/goroutine/goroutine.go:123): every service the node has started since
boot has one, a Finished one-shot included; a service still Waiting, or one the node does not have, has none, and
reading it fails with ``log "<id>" was not registered`` (internal/app/machined/pkg/runtime/logging/circular.go:
235-247). apid delivers that as the node's Metadata.Error, which talosctl prints as ``ERROR: <error>`` (no node
named) and then exits 1 (cmd/talosctl/cmd/talos/logs.go:74-106; Talos's own CLI test expects
``ERROR:.+ log "servicenotfound" was not registered`` and a failure, internal/integration/cli/logs.go:52-60).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from runbook_lib.sim.cluster import ClusterSpec, create
from runbook_lib.sim.faults import inject
from tests.sim.talosctl_legs import LEGS, leg
from tests.sim.test_real_talosctl import TALOS, Sim, build, live_node, start_simnode

NODE = "10.5.0.3"
W1, W2 = "10.5.0.3", "10.5.0.4"


def not_registered(service: str) -> re.Pattern[str]:
    """The line talosctl prints for the node's error: gRPC code Unknown (a plain Go error from machined)."""
    return re.compile(
        rf'^ERROR: rpc error: code = Unknown desc = log "{re.escape(service)}" was not registered$'
    )


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sim]:
    """One node: ext-nvidia-persistenced still Waiting (never started), udevd-trigger Finished."""
    node = live_node(NODE, 1)
    services = node["services"]
    assert isinstance(services, list)
    node["services"] = [
        {
            "id": "ext-nvidia-persistenced",
            "state": "Waiting",
            "events": [
                {
                    "msg": 'Waiting for file "/sys/bus/pci/drivers/nvidia" to exist',
                    "state": "Waiting",
                    "ts": "2026-12-01T10:00:00Z",
                }
            ],
        },
        *(s for s in services if s["id"] == "udevd-trigger"),
    ]
    talosctl = build("build-talosctl.sh", TALOS)
    state = tmp_path_factory.mktemp("simnode-logs") / "state"
    proc = start_simnode(build("build-simnode.sh"), state, {"nodes": [node]})
    yield Sim(talosctl, state / "talosconfig")
    proc.terminate()
    proc.wait(timeout=10)


@pytest.mark.slow
@pytest.mark.parametrize("service", ["nosuchservice", "ext-nvidia-persistenced"])
def test_a_service_with_no_log_fails_with_not_registered_and_exit_1(sim: Sim, service: str) -> None:
    proc = sim.run("-n", NODE, "logs", service)
    assert proc.returncode == 1, proc
    assert proc.stdout == ""
    assert [line for line in proc.stderr.splitlines() if not_registered(service).match(line)], proc.stderr


@pytest.mark.slow
def test_a_finished_one_shot_has_a_log_and_reads_with_exit_0(sim: Sim) -> None:
    proc = sim.run("-n", NODE, "logs", "udevd-trigger")
    assert proc.returncode == 0, proc
    assert "ERROR" not in proc.stderr


@pytest.mark.parametrize("which", LEGS)
def test_a_node_error_in_logs_exits_1_after_the_other_nodes_lines(tmp_path: Path, which: str) -> None:
    """One dead node of two: talosctl prints the live node's lines, the dead one's error as ``ERROR: <error>``
    naming no node, and exits 1 (talos v1.12.0/v1.13.0 cmd/talosctl/cmd/talos/logs.go: ``gotErrors`` then
    ``os.Exit(1)``); the Python talosctl exited 0, so a script checking the exit code saw success."""
    create(tmp_path, ClusterSpec(workers=2, talos_version="v1.13.0", scenario="gpu-ready"))
    inject(tmp_path, W1, "unreachable")
    with leg(which, tmp_path, "v1.13.0") as run:
        r = run("logs", "ext-nvidia-cdi-gen", "-n", f"{W1},{W2}")
    assert r.returncode == 1, r
    assert r.stderr.startswith("ERROR: rpc error: code = Unavailable"), r.stderr  # no node prefix
    lines = r.stdout.splitlines()
    assert lines and all(line.startswith(f"{W2}: ") for line in lines)


@pytest.mark.parametrize("which", LEGS)
def test_both_talosctls_fail_a_service_the_node_never_ran(tmp_path: Path, which: str) -> None:
    """The Python talosctl answered an unknown service with an empty log and exit 0; on both legs now the error
    of machined's log manager (circular.go:235-247) and exit 1, while a Finished one-shot still reads."""
    create(tmp_path, ClusterSpec(workers=1, talos_version="v1.13.0", scenario="gpu-ready"))
    with leg(which, tmp_path, "v1.13.0") as run:
        missing = run("logs", "nosuchservice", "-n", W1)
        finished = run("logs", "ext-nvidia-cdi-gen", "-n", W1)
    assert missing.returncode == 1 and missing.stdout == "", missing
    assert not_registered("nosuchservice").match(missing.stderr.rstrip("\n")), missing.stderr
    assert finished.returncode == 0 and finished.stdout.startswith(f"{W1}: "), finished
