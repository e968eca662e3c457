"""The Python talosctl (``runbook_lib/sim/talosctl``) against the real talosctl on the same node state (issue 14,
point 4: "one truth").

The fake stays where the real talosctl cannot run the scenario: releases simnode does not serve (before 1.9), faults
simnode does not simulate, and Talos 1.14 nodes whose Kubernetes side cannot issue the client-certificate
kubeconfig talosctl 1.14's drain needs (``realtalos.choose``). talosctl 1.14 itself builds: v1.14.0 is not on the Go
module proxy, v1.14.1 is (``tools/build-talosctl.sh v1.14.1``, tests/sim/test_real_talos_114.py).

What it prints is checked here against what the real binary prints, for every command the runbook runs
(``runbook_lib/clients/talosctl.py``, ``runbook_lib/steps/``), asking the fake to be the same release as the real
binary. The node state is one simulated cluster: the fake reads its
node files, simnode serves the same nodes through the nodes file ``runbook_lib.sim.realtalos`` derives from them
(what ``runbook sim up`` does on the real path).

Only what must differ is normalised, each by a named function below that says why. A difference that is the
fake's fault is fixed in the fake; one that is not fixed yet is ``xfail(strict=True)`` with the exact difference,
so that fixing it (or a change on either side) turns the test red until the mark goes.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from runbook_lib.sim import cluster, realtalos
from runbook_lib.sim.state import save_node, sim_paths
from tests.sim.talosctl_legs import serve_with_simnode

pytestmark = pytest.mark.slow

#: Releases with a real talosctl (``make tools``); a release simnode does not serve yet
#: is skipped with the reason ``realtalos`` gives.
RELEASES = ("v1.10.0", "v1.11.0", "v1.12.0", "v1.13.0")
W1, W2, DEAD = "10.5.0.3", "10.5.0.4", "10.5.0.5"  # the gpu-ready scenario's workers; the last one is down
SYSCTL_PATCH = 'machine:\n  sysctls:\n    vm.nr_hugepages: "64"\n'
MISSPELT_PATCH = (
    "machine:\n  kernel:\n    modules:\n      - name: nvidia\n      - nmae: nvidia_uvm\n  kernal: {}\n"
)
LABEL_PATCH = "machine:\n  nodeLabels:\n    example.com/gpu: tested\n"


@dataclass(frozen=True)
class Run:
    rc: int
    stdout: str
    stderr: str


@dataclass(frozen=True)
class Pair:
    """One cluster state, answered by the fake (``talosctl-python``) and by the real talosctl on simnode."""

    release: str
    state: Path
    real: Path
    patches: Path

    def fake_run(self, *args: str) -> Run:
        env = {k: v for k, v in os.environ.items() if k != "RUNBOOK_SIM_TALOSCTL_VERSION"}
        fake = self.state / "bin" / "talosctl-python"
        return _run([str(fake), "--talosconfig", str(self.state / "talosconfig-python"), *args], env)

    def real_run(self, *args: str) -> Run:
        talosconfig = sim_paths(self.state).talosconfig
        return _run([str(self.real), "--talosconfig", str(talosconfig), *args], dict(os.environ))

    def both(self, *args: str) -> tuple[Run, Run]:
        return self.fake_run(*args), self.real_run(*args)


def _run(argv: list[str], env: dict[str, str]) -> Run:
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120, check=False)
    return Run(proc.returncode, proc.stdout, proc.stderr)


def _start(release: str, tmp: Path) -> Pair:
    """A 3-worker gpu-ready cluster of ``release`` with its last worker down (no route), then simnode on it."""
    state = tmp / "state"
    nodes = cluster.create(state, cluster.ClusterSpec(workers=3, talos_version=release, scenario="gpu-ready"))
    dead = next(n for n in nodes if n.address == DEAD)
    dead.faults["unreachable"] = "no_route"
    save_node(state, dead)
    talosctl = serve_with_simnode(state, release)
    patches = tmp / "patches"
    patches.mkdir()
    for name, text in (("sysctl", SYSCTL_PATCH), ("misspelt", MISSPELT_PATCH), ("label", LABEL_PATCH)):
        (patches / f"{name}.yaml").write_text(text)
    return Pair(release, state, talosctl, patches)


@pytest.fixture(scope="module", params=RELEASES)
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    started = _start(request.param, tmp_path_factory.mktemp(f"pair-{request.param}"))
    yield started
    realtalos.stop(started.state)


# ---------------------------------------------------------------- normalisations (each: what, and why)


def build_stamps(text: str) -> str:
    """``version``'s SHA and Go version lines: the client's are stamped by the build (the real one is built with
    the local Go and no git SHA: ``undefined``), the server's are simnode's, which leaves them empty (no source
    gives a release's values: simnode/README.md, ``sha``/``go_version``)."""
    return re.sub(r"^(\t(?:SHA|Go version):) .*$", r"\1 <build>", text, flags=re.M)


def reply_order(text: str) -> str:
    """One-to-many replies (``version``'s server blocks, ``service``'s rows) come in the order the nodes answer,
    which apid does not guarantee (talos@v1.12.0 internal/app/apid/pkg/backend/apid.go: replies as they arrive);
    the blocks are put in node order, each node's own lines kept in its order."""
    lines = text.splitlines(keepends=True)
    if "Server:\n" in lines:  # version: blocks start at NODE
        head = lines[: lines.index("Server:\n") + 1]
        blocks: list[list[str]] = []
        for line in lines[len(head) :]:
            if line.startswith("\tNODE:") or not blocks:
                blocks.append([])
            blocks[-1].append(line)
        return "".join(head + [line for block in sorted(blocks, key=lambda b: b[0]) for line in block])
    if lines and lines[0].startswith("NODE "):  # service table: stable sort by the NODE column
        return "".join(lines[:1] + sorted(lines[1:], key=lambda line: line.split(" ", 1)[0]))
    return text


def timestamps(text: str) -> str:
    """When resources were created or updated, and a service's time since its last event: the fake's are fixed
    in its node files, simnode's are its start time (the clock differs between two programs by nature)."""
    text = re.sub(r'^(\s*"?(?:created|updated)"?:) .*?(,?)$', r"\1 <time>\2", text, flags=re.M)
    return re.sub(r"(?<=   )(?:\d+h)?(?:\d+m)?\d+(?:\.\d+)?s ago|(?<=   ) ago", "<since> ago", text)


def resource_versions(text: str) -> str:
    """``metadata.version``: how many times the resource changed since its controller made it; the fake counts
    from cluster creation, simnode from its start (the number is the runtime's, not the node's state)."""
    return re.sub(r'^(\s*"?version"?:) \d+(,?)$', r"\1 <n>\2", text, flags=re.M)


def table_padding(text: str) -> str:
    """A ``service`` table's columns: tabwriter pads each to its widest cell (padding 3), so a normalised cell
    (a time) changes the padding of its column; the cells are compared, separated by one tab."""
    lines = text.splitlines(keepends=True)
    if not lines or not lines[0].startswith("NODE "):
        return text
    return "".join("\t".join(re.split(r" {2,}", line.rstrip("\n").rstrip())) + "\n" for line in lines)


NORMALISE: tuple[Callable[[str], str], ...] = (
    build_stamps,
    reply_order,
    timestamps,
    resource_versions,
    table_padding,
)


def same(fake: Run, real: Run) -> None:
    """Exit code, stdout and stderr equal after the normalisations."""

    def norm(run: Run) -> tuple[int, str, str]:
        out, err = run.stdout, run.stderr
        for fn in NORMALISE:
            out, err = fn(out), fn(err)
        return run.rc, out, err

    assert norm(fake) == norm(real)


# ---------------------------------------------------------------- reads


READS = {
    "version": ("-n", f"{W1},{W2}", "version"),
    "version-one-dead": ("-n", f"{W1},{DEAD},{W2}", "version"),
    "version-all-dead": ("-n", DEAD, "version"),
    "extensions-json": ("-n", f"{W1},{W2}", "get", "extensions", "-o", "json"),
    "extensionstatus-table": ("-n", f"{W1},{W2}", "get", "extensionstatus"),
    "modules-table": ("-n", f"{W1},{W2}", "get", "modules"),
    "modules-json": ("-n", W1, "get", "modules", "-o", "json"),
    "loadedkernelmodules-table": ("-n", W1, "get", "loadedkernelmodules"),
    "services-table": ("-n", f"{W1},{W2}", "get", "services"),
    "service-json": ("-n", W1, "get", "service", "-o", "json"),
    "platformmetadata-json": ("-n", f"{W1},{W2}", "get", "platformmetadata", "-o", "json"),
    "pcidevices-json": ("-n", f"{W1},{W2}", "get", "pcidevices", "-o", "json"),
    "machineconfig-json": ("-n", W1, "get", "machineconfig", "-o", "json"),
    "machineconfig-yaml": ("-n", W1, "get", "machineconfig", "-o", "yaml"),
    "read-driver-version": ("-n", W1, "read", "/proc/driver/nvidia/version"),
    "read-proc-modules": ("-n", W1, "read", "/proc/modules"),
    "read-missing-file": ("-n", W1, "read", "/proc/nope"),
    "read-two-nodes": ("-n", f"{W1},{W2}", "read", "/proc/modules"),
    "get-dead-head": ("-n", f"{DEAD},{W1}", "get", "extensions"),
    "get-dead-middle": ("-n", f"{W1},{DEAD},{W2}", "get", "extensions"),
    "get-dead-end": ("-n", f"{W1},{W2},{DEAD}", "get", "extensions"),
    "get-unknown-type": ("-n", W1, "get", "nosuchresource"),
    "get-missing-id": ("-n", W1, "get", "extensions", "99"),
    "service-one-dead": ("-n", f"{W1},{DEAD},{W2}", "service"),
}

#: Differences not fixed yet (exact, per case): each xfail is strict, so a fix turns it red until removed.
SPEC_TEXT = (
    "the config text (on 1.10 and 1.11 simnode encodes with 1.13's machinery, which a real node of theirs does not): the real "
    "one is Talos's encoder (struct field order, e.g. sysctls before features; sysctl "
    "values as strings, '\"1\"'; from 1.12 2-space indent with sequences at their key's indent), the fake's keeps "
    "its documents' key order and values at 4-space indent"
)
KNOWN: dict[str, str] = {
    "platformmetadata-json": (
        "spec.hostname: simnode's node has the hostname realtalos.node_entry gives it (for the Kubernetes node "
        "--drain finds), the fake's metal node none (metal reports one only from talos.hostname= on the kernel "
        "cmdline: talos@v1.12.0 internal/app/machined/pkg/runtime/v1alpha1/platform/metal/metal.go:194-196); "
        "on 1.10 and 1.11 also the owner: simnode says network.PlatformConfigApplyController (1.12's), the fake "
        "network.PlatformConfigController (talos@v1.11.0 internal/app/machined/pkg/controllers/network/"
        "platform_config.go:112)"
    ),
    "machineconfig-json": SPEC_TEXT,
    "machineconfig-yaml": SPEC_TEXT,
    "read-proc-modules": (
        "sizes, addresses and order: simnode prints 'nvidia_modeset 0 - - Live 0xffffffffc0000000 (O)' (size 0, "
        "one address, modeset/drm/uvm/nvidia), the fake 'nvidia_uvm 1146880 - - Live 0xffffffffc2733000 (O)' "
        "(uvm/drm/modeset/nvidia): no source here for a real node's sizes, addresses or load order"
    ),
    "read-two-nodes": (
        "usage text: the real one has 'Aliases:\n  read, cat' and each flag's description; the fake's flag tables "
        "(runbook_lib/sim/talosctl/flagtables.py) have no descriptions or aliases"
    ),
    "service-one-dead": (
        "simnode lists ext-* services after the others, machined sorts by ID (talos@v1.12.0 "
        "internal/app/machined/pkg/system/system.go:394); simnode's base services have no events ('<none>', "
        "realtalos.node_entry gives none), the fake's say 'Health check successful'; simnode's task PID is 0, the "
        "fake's 1005"
    ),
}


#: Differences of some releases only: (case, releases) -> the exact difference.
KNOWN_FOR: dict[tuple[str, tuple[str, ...]], str] = {
    ("modules-json", ("v1.11.0", "v1.12.0", "v1.13.0")): (
        "LoadedKernelModule spec: simnode has size 0, one address (0xffffffffc0000000) and no dependencies, the fake "
        "example sizes, addresses and 'dependencies: [nvidia]' for the modules on top of nvidia (no source here for "
        "a real node's values; simnode/README.md: module sizes not modelled)"
    ),
}


def _case(name: str) -> object:
    reason = KNOWN.get(name)
    marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
    return pytest.param(name, id=name, marks=marks)


@pytest.mark.parametrize("case", [_case(name) for name in READS])
def test_a_read_prints_what_the_real_talosctl_prints(
    pair: Pair, case: str, request: pytest.FixtureRequest
) -> None:
    for (name, releases), reason in KNOWN_FOR.items():
        if name == case and pair.release in releases:
            request.applymarker(pytest.mark.xfail(strict=True, reason=reason))
    same(*pair.both(*READS[case]))


# ---------------------------------------------------------------- patches


@pytest.mark.xfail(strict=True, reason=f"the dry run's diff: {SPEC_TEXT}")
def test_a_dry_run_patch_prints_the_real_summary_and_diff(pair: Pair) -> None:
    args = ("-n", W1, "patch", "machineconfig", "--patch", f"@{pair.patches / 'sysctl.yaml'}", "--dry-run")
    same(*pair.both(*args))


def test_a_patch_with_a_misspelt_key_is_refused_as_the_real_talosctl_refuses_it(pair: Pair) -> None:
    """reality-gaps.md §2 row 4: the real client decodes the patch strictly and stops before any node call."""
    args = ("-n", W1, "patch", "machineconfig", "--patch", f"@{pair.patches / 'misspelt.yaml'}", "--dry-run")
    same(*pair.both(*args))


def test_a_patch_on_a_list_with_a_dead_node_stops_where_the_real_one_stops(pair: Pair) -> None:
    args = ("-n", f"{DEAD},{W1}", "patch", "mc", "--patch", f"@{pair.patches / 'sysctl.yaml'}", "--dry-run")
    same(*pair.both(*args))


def test_an_applied_patch_reports_and_leaves_the_config_the_real_one_leaves(pair: Pair) -> None:
    """A node-label patch applies without a reboot on both (machined's immediate-apply set,
    talos@v1.12.0 internal/app/machined/pkg/runtime/v1alpha1/v1alpha1_runtime.go), so nothing waits on a boot."""
    label = pair.patches / "label.yaml"
    same(*pair.both("-n", W2, "patch", "machineconfig", "--patch", f"@{label}"))
    fake, real = pair.both("-n", W2, "get", "machineconfig", "-o", "jsonpath={.spec}")
    assert "example.com/gpu: tested" in fake.stdout
    assert "example.com/gpu: tested" in real.stdout


def test_a_patch_the_node_refuses_prints_the_real_error(pair: Pair) -> None:
    """machined's validation error, after the node's ``patched`` line, in nested multierrors."""
    same(*pair.both("-n", W1, "patch", "machineconfig", "-p", "machine:\n  type: gpu\n", "--dry-run"))
