"""The services a simulated worker lists are its release's: ``talosctl service`` on the Python talosctl, and the
nodes file simnode serves the real talosctl from (``realtalos.node_entry``).

The fake and simnode once agreed on ``auditd`` for 1.8 nodes, so comparing the two (tests/sim/
test_fake_vs_real_talosctl.py) could not catch it; this holds both to machined's boot sequence at each tag
(talos@<tag> internal/app/machined/pkg/runtime/v1alpha1/v1alpha1_sequencer_tasks.go, the ``LoadAndStart`` calls):
``dashboard`` from v1.4.0 (:821; services/dashboard.go is not in v1.3.0), ``syslogd`` from v1.7.0 (:636; not in
v1.6.0), ``auditd`` from v1.9.0 (:363; services/auditd.go is not in v1.8.0). ``machined`` is a service at every
one of them (v1.3.0 internal/app/machined/main.go:254).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from runbook_lib.sim import realtalos
from runbook_lib.sim.cluster import ClusterSpec, create
from tests.sim.talosctl_run import talosctl

COMMON = {"apid", "containerd", "cri", "kubelet", "machined", "udevd"}
#: The base services a worker of each minor release runs (from the sources in the module docstring).
EXPECTED = {
    "1.3": COMMON,
    "1.4": COMMON | {"dashboard"},
    "1.6": COMMON | {"dashboard"},
    "1.7": COMMON | {"dashboard", "syslogd"},
    "1.8": COMMON | {"dashboard", "syslogd"},
    "1.9": COMMON | {"dashboard", "syslogd", "auditd"},
    "1.13": COMMON | {"dashboard", "syslogd", "auditd"},
}
WORKER = "10.5.0.3"


@pytest.mark.parametrize("minor", list(EXPECTED))
def test_a_worker_lists_the_base_services_of_its_release(minor: str, tmp_path: Path) -> None:
    nodes = create(tmp_path, ClusterSpec(workers=1, talos_version=minor, scenario="fresh"))
    listed = talosctl(tmp_path, "-n", WORKER, "service")
    assert listed.returncode == 0, listed.stderr
    ids = {re.split(r"\s+", line.strip())[1] for line in listed.stdout.splitlines()[1:]}
    assert ids == EXPECTED[minor], listed.stdout
    worker = next(n for n in nodes if n.address == WORKER)
    served = {s["id"] for s in realtalos.node_entry(worker, 0.0)["services"]}
    assert served == EXPECTED[minor]
