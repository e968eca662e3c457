"""The Python talosctl (``runbook_lib/sim/talosctl``) against the real talosctl on the same node state (issue 14,
point 4: "one truth").

The fake stays where the real talosctl cannot run the scenario: releases whose talosctl is not built (``.ci/run``
builds those ``tests/sim/talosctl_legs.ci_releases`` lists), faults simnode does not simulate, and Talos 1.14 nodes whose Kubernetes side cannot issue the client-certificate
kubeconfig talosctl 1.14's drain needs (``realtalos.choose``). talosctl 1.14 itself builds: v1.14.0 is not on the Go
module proxy, v1.14.1 is (``tools/build-talosctl.sh v1.14.1``, tests/sim/test_real_talos_114.py).

What it prints is checked here against what the real binary prints, for every command the runbook runs
(``runbook_lib/clients/talosctl.py``, ``runbook_lib/steps/``), asking the fake to be the same release as the real
binary. The node state is one simulated cluster: the fake reads its
node files, simnode serves the same nodes through the nodes file ``runbook_lib.sim.realtalos`` derives from them
(what ``runbook sim up`` does on the real path).

Only what must differ is normalised, each by a named function below that says why: what differs by nature
(clocks, PIDs, build stamps, reply order) for every case (NORMALISE), and each known difference that stays for
the exact cases and releases it affects (KNOWN: one side's output rewritten, with its reason and source, or
"UNSOURCED" where none was found). Everything else must be equal, so a new difference in any case fails; and a
known difference that is gone fails too, until its entry goes. A difference that is the fake's or simnode's fault
is fixed there rather than listed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest
import yaml

from runbook_lib.sim import cluster, realtalos
from runbook_lib.sim.patching import dump_yaml
from runbook_lib.sim.state import save_node, sim_paths
from tests.sim.talosctl_legs import serve_with_simnode

pytestmark = pytest.mark.slow

#: Releases with a real talosctl (``make tools``); a release simnode does not serve yet
#: is skipped with the reason ``realtalos`` gives.
RELEASES = (
    "v1.3.5",
    "v1.4.0",
    "v1.5.5",
    "v1.6.7",
    "v1.7.0",
    "v1.8.0",
    "v1.9.0",
    "v1.10.0",
    "v1.11.0",
    "v1.12.0",
    "v1.13.0",
)
#: Releases whose talosctl prints MachineConfig's spec as the document and whose machined writes go-cmp's dry-run diff.
BEFORE_1_8 = frozenset({"v1.3.5", "v1.4.0", "v1.5.5", "v1.6.7", "v1.7.0"})
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


def pids(text: str) -> str:
    """A process's PID in a service event ("Started task <id> (PID <pid>) …", "Process … started with PID <pid>",
    talos@v1.12.0 internal/app/machined/pkg/system/runner/containerd/containerd.go:224, runner/process/
    process.go:457): the kernel assigns it, the fake and simnode each make one up. Only non-zero PIDs are
    rewritten: a running task never has PID 0, so a 0 stays a difference."""
    return re.sub(r"(?<=PID )[1-9]\d*\b", "<pid>", text)


NORMALISE: tuple[Callable[[str], str], ...] = (
    build_stamps,
    reply_order,
    timestamps,
    resource_versions,
    pids,
    table_padding,
)


# ---------------------------------------------------------------- known differences (each: one side, exact cases)

#: /proc/modules' NVIDIA lines in simnode's order (the reverse of machine.kernel.modules).
_SIMNODE_MODULE_ORDER = ("nvidia_modeset", "nvidia_drm", "nvidia_uvm", "nvidia")


def module_values(text: str) -> str:
    """UNSOURCED, on the fake's side: a loaded NVIDIA module's size, address and dependencies, and the load order
    in /proc/modules. No source here gives a real node's values: the fake prints example sizes and addresses (one
    line from the Talos docs' sample, ``nvidia_uvm 1146880 - - Live 0xffffffffc2733000``, the others made up);
    simnode size 0 and one address for all (simnode/README.md: module sizes not modelled). Refcount and users
    (``dependencies``, the modules using one) are compared as they are: both count the modelled users (stop 52). Neither order is sourced (the fake: uvm, drm, modeset, nvidia; simnode: the reverse of
    machine.kernel.modules). Not settled either: talos@v1.12.0 internal/app/machined/pkg/controllers/runtime/
    loaded_kernel_module.go ParseModules reads the refcount with strconv.Atoi, so the docs' ``- -`` cannot be what
    a 1.11+ node's /proc/modules holds: both print numbers from 1.9 (stop 52, siderolabs/pkgs@v1.9.0
    kernel/build/config-amd64:936 CONFIG_MODULE_UNLOAD=y), compared as they are. Rewritten to simnode's values
    and order."""
    text = re.sub(r'("size":|size:) \d+', r"\1 0", text)
    text = re.sub(r'("address": "|address: )0x[0-9a-f]+', r"\g<1>0xffffffffc0000000", text)
    lines = text.splitlines(keepends=True)
    rows = [i for i, line in enumerate(lines) if re.match(r"nvidia\w* \d+ ", line)]
    ordered = sorted(
        (lines[i] for i in rows), key=lambda line: _SIMNODE_MODULE_ORDER.index(line.split(" ", 1)[0])
    )
    for i, line in zip(rows, ordered, strict=True):
        lines[i] = re.sub(r" \d+ (\S+ \S+ Live) 0x[0-9a-f]+", r" 0 \1 0xffffffffc0000000", line)
    return "".join(lines)


def usage_prose(text: str) -> str:
    """On the real side: the prose of a usage text (``Aliases:`` and each flag's description), which the fake's
    flag tables leave out on purpose (runbook_lib/sim/talosctl/flagtables.py: the interface, not the
    documentation); the flags, their order and their columns stay compared."""
    text = re.sub(r"\nAliases:\n(?:  .*\n)+", "", text)
    return re.sub(r"^(\s+(?:-\w, )?--[\w-]+(?: \w+)?\s{3,})\S.*$", r"\1", text, flags=re.M)


def _relayout_config(text: str, encode: Callable[[Any], str]) -> str:
    """The machine config in ``get machineconfig``'s output (``-o yaml``: the ``spec: |`` block, 4 spaces in, or
    talosctl 1.7's ``spec:`` document, its raw config bytes 4 spaces in (as_document in
    runbook_lib/sim/talosctl/resources.py); ``-o json``: the ``"spec"`` string) decoded and encoded again with
    ``encode``, documents joined by ``---``."""

    def relayout(config: str) -> str:
        return "---\n".join(encode(doc) for doc in yaml.safe_load_all(config) if doc is not None)

    def json_spec(match: re.Match[str]) -> str:
        return match[1] + json.dumps(relayout(json.loads(match[2])))

    text = re.sub(r'^(\s*"spec": )("(?:[^"\\]|\\.)*")$', json_spec, text, flags=re.M)
    block = re.search(r"^spec:(?: \|)?\n((?:    .*\n)+)", text, flags=re.M)
    if block is None:
        return text
    config = relayout("".join(line[4:] for line in block[1].splitlines(keepends=True)))
    return (
        text[: block.start(1)]
        + "".join("    " + line for line in config.splitlines(keepends=True))
        + text[block.end(1) :]
    )


def _yaml_v4_layout(doc: Any) -> str:
    """A document as go.yaml.in/yaml/v4 lays it out: 2-space indent, a sequence's items at their key's indent."""
    return yaml.safe_dump(doc, sort_keys=False, width=float("inf"))


def fake_config_layout(text: str) -> str:
    """On the fake's side, Talos 1.12+: the fake lays the config out at 4-space indent with indented sequences
    (runbook_lib/sim/patching.py dump_yaml, Go's gopkg.in/yaml.v3), while machinery 1.12 encodes with
    go.yaml.in/yaml/v4 (talos@v1.12.0 pkg/machinery/go.mod:33: 2-space, sequences at their key's indent), as
    simnode does. Rewritten to the v4 layout; keys, order and values stay compared."""
    return _relayout_config(text, _yaml_v4_layout)


def simnode_config_layout(text: str) -> str:
    """On the real side, Talos 1.7-1.11: simnode encodes the config with machinery v1.14.1 (yaml v4 layout), a
    real node of those releases with its gopkg.in/yaml.v3 fork (talos@v1.11.0 pkg/machinery/go.mod:11,43 and
    config/encoder/encoder.go:14; the same fork at v1.7.0 and v1.8.0, go.mod:7 and encoder.go:13: 4-space indent,
    indented sequences), which the fake's layout follows. Rewritten to the fake's layout; keys, order and values
    stay compared. Not for talosctl 1.7's ``-o json``, whose spec is the document as JSON (no layout)."""
    return _relayout_config(text, dump_yaml)


def config_diff_context(text: str) -> str:
    """On both sides, the dry run's config diff: its hunks come from Talos's encoder, which orders keys by its
    struct fields (sysctls before features), adds the defaults machinery sets (simnode's v1.14.1 adds
    ``grubUseUKICmdline``, not checked against a 1.12 node) and double-quotes strings that look like numbers
    (``"1"``); the fake keeps its documents' order and single-quotes them. Reduced to the changed lines, without
    indentation and with one quote style: what the patch adds or removes stays compared, and everything before
    the diff (the summary) too."""
    head, sep, diff = text.partition("Config diff:\n")
    if not sep:
        return text
    changed = [
        line[0] + line[1:].strip().replace("'", '"')
        for line in diff.splitlines()
        if line[:1] in ("+", "-") and not line.startswith(("+++", "---"))
    ]
    return head + sep + "\n".join(changed) + "\n"


def go_cmp_report(text: str) -> str:
    """On both sides, Talos 1.7's dry-run diff body: machined 1.3-1.7 writes go-cmp's report of the two Go config
    structs (talos@v1.7.0 internal/app/machined/internal/server/v1alpha1/v1alpha1_server.go:227-240, cmp.Diff),
    which simnode writes (simnode/legacy18.go dryRunDiff) and the fake does not: it cannot know the Go field
    names (``MachineSysctls``) nor go-cmp's layout, which go-cmp itself varies at random per process (regular or
    non-breaking spaces, cmp/report_text.go). The body after "Config diff:\n" is replaced by a marker on both
    sides; the summary, and whether a blank line follows "Config diff:" (1.8+ only), stay compared. So the fake's
    1.3-1.7 dry-run diff is a YAML diff where the real one is go-cmp's: a difference a user of the fake sees."""
    head, sep, diff = text.partition("Config diff:\n")
    if not sep:
        return text
    return head + sep + ("\n" if diff.startswith("\n") else "") + "<go-cmp report>\n"


def client_encoded_config(text: str) -> str:
    """On the fake's side, the config after a patch: talosctl patches the node's config itself and sends machinery's
    encoding of the result (talos@v1.7.0 cmd/talosctl/cmd/talos/patch.go:48-60, ``cfg.Bytes()``; the node keeps
    those bytes, pkg/machinery/config/container/container.go:191-202), which omits the empty ``registries``
    (v1alpha1_types.go:261, omitempty); the fake keeps its own document. (Sysctl values, :239 ``map[string]string``,
    were a second difference until the scenarios held them as strings too, 2de0322.) Seen where the spec is JSON (talosctl 1.7); for 1.8+ the same holds for the YAML text
    (key order and quoting too), which no case compares exactly. Rewritten to the client's values."""
    return re.sub(r'\n\s*"registries": \{\},', "", text)


@dataclass(frozen=True)
class Known:
    """A difference that stays: ``rewrite`` makes exactly it on ``side``'s output (stdout and stderr) equal to
    the other side's, for ``cases`` on ``releases``. Each must still change its side where it applies, so a fixed
    difference fails the test until its entry goes."""

    rewrite: Callable[[str], str]
    side: Literal["fake", "real", "both"]
    cases: frozenset[str]
    releases: frozenset[str] = frozenset(RELEASES)


_CONFIG_READS = frozenset({"machineconfig-json", "machineconfig-yaml"})
KNOWN: tuple[Known, ...] = (
    Known(module_values, "fake", frozenset({"read-proc-modules"})),
    Known(module_values, "fake", frozenset({"modules-json"}), frozenset({"v1.11.0", "v1.12.0", "v1.13.0"})),
    Known(usage_prose, "real", frozenset({"read-two-nodes"})),
    Known(fake_config_layout, "fake", _CONFIG_READS, frozenset({"v1.12.0", "v1.13.0"})),
    Known(
        simnode_config_layout, "real", _CONFIG_READS, frozenset({"v1.8.0", "v1.9.0", "v1.10.0", "v1.11.0"})
    ),
    Known(simnode_config_layout, "real", frozenset({"machineconfig-yaml"}), BEFORE_1_8),
    Known(config_diff_context, "both", frozenset({"patch-dry-run"}), frozenset(RELEASES) - BEFORE_1_8),
    Known(go_cmp_report, "both", frozenset({"patch-dry-run"}), BEFORE_1_8),
    Known(client_encoded_config, "fake", frozenset({"patch-label-spec"}), BEFORE_1_8),
)


Outcome = tuple[int, str, str]


def normalised(run: Run) -> Outcome:
    """The run with the normalisations every case gets (NORMALISE)."""
    out, err = run.stdout, run.stderr
    for fn in NORMALISE:
        out, err = fn(out), fn(err)
    return run.rc, out, err


def same(pair: Pair, case: str, fake: Run, real: Run) -> None:
    """Exit code, stdout and stderr equal after the normalisations and the case's known differences, each of
    which must still be there."""
    sides = {"fake": normalised(fake), "real": normalised(real)}
    for known in KNOWN:
        if case in known.cases and pair.release in known.releases:
            sides = _rewrite(known, sides, f"{case} on {pair.release}")
    assert sides["fake"] == sides["real"]


def _rewrite(known: Known, sides: dict[str, Outcome], where: str) -> dict[str, Outcome]:
    """``sides`` with ``known``'s rewrite made, which must still change something: the other side's output for
    one side, or, for both, a difference there was before."""
    out = dict(sides)
    for side in ("fake", "real") if known.side == "both" else (known.side,):
        rc, stdout, stderr = sides[side]
        out[side] = (rc, known.rewrite(stdout), known.rewrite(stderr))
    still = sides["fake"] != sides["real"] if known.side == "both" else out != sides
    assert still, f"{known.rewrite.__name__}: no difference left in {where}; take it out of KNOWN"
    return out


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


@pytest.mark.parametrize("case", list(READS))
def test_a_read_prints_what_the_real_talosctl_prints(pair: Pair, case: str) -> None:
    same(pair, case, *pair.both(*READS[case]))


# ---------------------------------------------------------------- patches


def test_a_dry_run_patch_prints_the_real_summary_and_diff(pair: Pair) -> None:
    args = ("-n", W1, "patch", "machineconfig", "--patch", f"@{pair.patches / 'sysctl.yaml'}", "--dry-run")
    same(pair, "patch-dry-run", *pair.both(*args))


def test_a_patch_with_a_misspelt_key_is_refused_as_the_real_talosctl_refuses_it(pair: Pair) -> None:
    """reality-gaps.md §2 row 4: the real client decodes the patch strictly and stops before any node call."""
    args = ("-n", W1, "patch", "machineconfig", "--patch", f"@{pair.patches / 'misspelt.yaml'}", "--dry-run")
    same(pair, "patch-misspelt", *pair.both(*args))


def test_a_patch_on_a_list_with_a_dead_node_stops_where_the_real_one_stops(pair: Pair) -> None:
    args = ("-n", f"{DEAD},{W1}", "patch", "mc", "--patch", f"@{pair.patches / 'sysctl.yaml'}", "--dry-run")
    same(pair, "patch-dead-node", *pair.both(*args))


def test_an_applied_patch_reports_and_leaves_the_config_the_real_one_leaves(pair: Pair) -> None:
    """A node-label patch applies without a reboot on both (machined's immediate-apply set,
    talos@v1.12.0 internal/app/machined/pkg/runtime/v1alpha1/v1alpha1_runtime.go), so nothing waits on a boot."""
    label = pair.patches / "label.yaml"
    same(pair, "patch-label", *pair.both("-n", W2, "patch", "machineconfig", "--patch", f"@{label}"))
    fake, real = pair.both("-n", W2, "get", "machineconfig", "-o", "jsonpath={.spec}")
    for run in (fake, real):
        config = next(yaml.safe_load_all(run.stdout))
        assert config["machine"]["nodeLabels"] == {"example.com/gpu": "tested"}, run.stdout
    if (
        pair.release in BEFORE_1_8
    ):  # talosctl 1.7's spec is the document: JSON, in json.MarshalIndent's layout
        same(pair, "patch-label-spec", fake, real)


def test_a_patch_the_node_refuses_prints_the_real_error(pair: Pair) -> None:
    """machined's validation error, after the node's ``patched`` line, in nested multierrors."""
    same(
        pair,
        "patch-refused",
        *pair.both("-n", W1, "patch", "machineconfig", "-p", "machine:\n  type: gpu\n", "--dry-run"),
    )


# ---------------------------------------------------------------- what both sides once got wrong


def test_simnode_lists_services_as_machined_does(pair: Pair) -> None:
    """The fake and simnode once agreed on a wrong table (dashboard "OK", "Health check successful"), so the
    comparison alone cannot hold this: machined lists its services sorted by ID (talos@v1.12.0
    internal/app/machined/pkg/system/system.go:386-397); a service with a health check ends on "Health check
    successful" (service_runner.go:109-147); dashboard has none (services/dashboard.go implements no HealthFunc),
    so its health is "?" and its last event its process runner's with a real PID (runner/process/process.go:457)."""
    real = pair.real_run("-n", W1, "service")
    rows = [re.split(r" {2,}", line.strip()) for line in real.stdout.splitlines()[1:]]
    assert [row[1] for row in rows] == sorted(row[1] for row in rows), real.stdout
    last = {row[1]: (row[3], row[5]) for row in rows}
    assert last["apid"] == ("OK", "Health check successful"), real.stdout
    if pair.release.startswith("v1.3."):  # no dashboard service before 1.4 (talos@v1.3.7 has no dashboard.go)
        assert "dashboard" not in last, real.stdout
        return
    health, event = last["dashboard"]
    assert health == "?" and re.fullmatch(
        r'Process Process\(\["/sbin/dashboard"\]\) started with PID [1-9]\d*', event
    )
    assert re.search(r"\(PID [1-9]\d*\)", last["ext-nvidia-persistenced"][1]), real.stdout
