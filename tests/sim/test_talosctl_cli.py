"""The simulated talosctl's command line: flags, errors, streams and exit codes as the real CLI's.

Each test of a talosctl text runs on two legs (``leg``): the Python talosctl, and the real talosctl v1.12.0 against
simnode serving the same cluster (skipped without Go, ``tests/sim/test_fake_vs_real_talosctl.py``), so the text
asserted is the real one."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from runbook_lib.sim.cluster import ClusterSpec, create
from runbook_lib.sim.state import sim_paths
from runbook_lib.sim.talosctl import flags as fl
from tests.sim.talosctl_legs import LEGS, Leg, leg
from tests.sim.talosctl_run import talosctl
from tests.sim.test_real_talosctl import build

REF = Path(__file__).resolve().parents[2] / ".." / "shared" / "reference" / "talos"
COMMANDS = [
    "get",
    "health",
    "kubeconfig",
    "logs",
    "machineconfig patch",
    "patch",
    "read",
    "reboot",
    "service",
    "upgrade",
    "version",
]


@pytest.fixture(scope="module", params=LEGS)
def run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Leg]:
    state = tmp_path_factory.mktemp("sim")
    create(state, ClusterSpec(workers=2, talos_version="v1.12.0"))
    with leg(request.param, state, "v1.12.0") as answered:
        yield answered


def _reference_flags(version: str, command: str) -> set[tuple[str, str, str]]:
    """(shorthand, name, type) of every flag the published reference lists for a command."""
    path = REF / f"talosctl-cli.v{version}.md"
    if not path.exists():
        pytest.skip(f"talosctl reference {path} not present (../shared is not checked out)")
    sections = re.split(r"^## ", path.read_text(), flags=re.M)
    title = f"talosctl {command}".strip()
    section = next(s for s in sections if s.split("\n", 1)[0].strip() == title)
    flags: set[tuple[str, str, str]] = set()
    for block in re.findall(
        r"### Options(?: inherited from parent commands)?\n\n```\n(.*?)```", section, re.S
    ):
        for line in block.splitlines():
            m = re.match(r"^  (?:-(\w), )?\s*--([\w-]+)(?: (\S.*?))?\s{2,}", line)
            assert m, line
            flags.add((m.group(1) or "", m.group(2), (m.group(3) or "").strip()))
    return flags


@pytest.mark.parametrize("version", ["1.10", "1.11", "1.12", "1.13"])
@pytest.mark.parametrize("command", COMMANDS)
def test_flag_tables_match_the_real_cli_reference(version: str, command: str) -> None:
    major, minor = (int(x) for x in version.split("."))
    local, inherited = fl.flag_specs(command, (major, minor))
    ours = {(s.short, s.name, s.type) for s in local + inherited}
    assert ours == _reference_flags(version, command)


def test_older_clients_use_the_oldest_reference_table() -> None:
    assert fl.table_version((1, 7)) == "1.10"
    assert fl.table_version((1, 8)) == "1.10"
    _local, inherited = fl.flag_specs("get", (1, 8))
    assert "nodes" in {s.name for s in inherited}


def test_unknown_flag_is_rejected_with_usage_on_stderr(run: Leg) -> None:
    r = run("get", "extensions", "--bogus")
    assert r.returncode == 1
    assert r.stdout == ""
    assert r.stderr.startswith("unknown flag: --bogus\n\nUsage:\n  talosctl get <type> [<id>] [flags]\n")
    assert "  -o, --output string" in r.stderr


def test_unknown_shorthand_and_missing_value(run: Leg) -> None:
    r = run("get", "extensions", "-z")
    assert (r.returncode, r.stderr.splitlines()[0]) == (1, "unknown shorthand flag: 'z' in -z")
    r = run("upgrade", "--image")
    assert (r.returncode, r.stderr.splitlines()[0]) == (1, "flag needs an argument: --image")


def test_invalid_flag_values_are_rejected(run: Leg) -> None:
    r = run("upgrade", "--timeout", "soon", "-n", "10.5.0.3")
    assert r.returncode == 1
    assert r.stderr.startswith('invalid argument "soon" for "--timeout" flag: time: invalid duration "soon"')
    r = run("patch", "mc", "--mode", "sometimes", "-p", "{}")
    assert r.returncode == 1
    assert r.stderr.startswith('invalid argument "sometimes" for "-m, --mode" flag')


def test_unknown_command_suggests_like_cobra(run: Leg) -> None:
    r = run("gte", "extensions")
    assert r.returncode == 1
    assert r.stderr.startswith('unknown command "gte" for "talosctl"\n\nDid you mean this?\n')
    assert "\tget\n" in r.stderr


def test_flag_placement_before_the_command_is_accepted(run: Leg) -> None:
    r = run("-n", "10.5.0.3", "get", "extensions")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("NODE ")


def test_wrong_argument_count(run: Leg) -> None:
    r = run("get")
    assert r.returncode == 1
    assert r.stderr.startswith("accepts between 1 and 2 arg(s), received 0\n\nUsage:")


def test_nodes_not_set(tmp_path: Path, run: Leg) -> None:
    cfg = tmp_path / "talosconfig"
    cfg.write_text("context: c\ncontexts:\n    c:\n        endpoints:\n            - 10.5.0.2\n")
    r = subprocess.run(
        [str(run.binary), "--talosconfig", str(cfg), "get", "extensions"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 1
    assert r.stderr.startswith(
        "nodes are not set for the command: please use `--nodes` flag or configuration file to set the nodes "
        "to run the command against\n\nUsage:"
    )


def test_help_goes_to_stdout_and_exits_zero(run: Leg) -> None:
    r = run("patch", "--help")
    assert r.returncode == 0
    assert "--patch-file string" in r.stdout
    assert r.stderr == ""


def test_client_version_follows_the_cluster(tmp_path: Path) -> None:
    """Fake only: the Python talosctl takes the cluster's client release (``talosctl_version``)."""
    create(tmp_path, ClusterSpec(workers=1, talos_version="1.12"))
    r = talosctl(tmp_path, "upgrade", "--legacy", "-n", "10.5.0.3")
    assert r.returncode == 1 and r.stderr.startswith("unknown flag: --legacy")  # new in talosctl 1.13
    create(tmp_path, ClusterSpec(workers=1, talos_version="1.13"))
    r = talosctl(tmp_path, "version", "--client")
    assert r.stdout.splitlines()[1] == "\tTag:         v1.13.9"


@pytest.mark.parametrize("which", LEGS)
def test_a_deprecated_upgrade_flag_is_accepted_with_pflags_notice(tmp_path: Path, which: str) -> None:
    """talosctl 1.13 keeps ``upgrade --stage`` (and --force, --insecure, --preserve) for the legacy API, hidden and
    deprecated (talos@v1.13.0 cmd/talosctl/cmd/talos/upgrade.go:368-376): pflag names it on stderr."""
    create(tmp_path, ClusterSpec(workers=1, talos_version="v1.13.0"))
    binary = (
        build("build-talosctl.sh", "v1.13.0") if which == "real" else sim_paths(tmp_path).bin_dir / "talosctl"
    )
    r = subprocess.run(
        [str(binary), "upgrade", "--stage", "--help"], capture_output=True, text=True, check=False
    )
    assert (r.returncode, r.stderr) == (
        0,
        "Flag --stage has been deprecated, legacy flag for MachineService.Upgrade fallback, to be removed in "
        "Talos 1.18\n",
    )
    assert "--stage" not in r.stdout and "--legacy" in r.stdout  # hidden from the help
