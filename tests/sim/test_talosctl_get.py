"""``version``, ``get``, ``read``, ``services`` of the simulated talosctl on Talos 1.7, 1.8, 1.12, 1.13 and 1.14.

The fixtures' clusters of 1.12 and 1.13 are also answered by the real talosctl of that release against simnode
(the ``real`` legs, skipped without Go: ``tests/sim/test_fake_vs_real_talosctl.py``), so a text asserted here is
the real one; what simnode does not serve is skipped there with the reason, and a known difference is a strict
xfail naming it. 1.7, 1.8 and 1.14 run the Python talosctl only (no talosctl of theirs is built here)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from runbook_lib.sim.cluster import ClusterSpec, create
from runbook_lib.sim.faults import inject
from tests.sim.talosctl_legs import LEGS, Leg, leg

VERSIONS = ["1.7", "1.8", "1.12", "1.13", "1.14"]
REAL = {"1.12": "v1.12.0", "1.13": "v1.13.0"}  # releases with a real talosctl leg
LEGGED = [pytest.param((v, "fake"), id=v) for v in VERSIONS] + [
    pytest.param((v, "real"), id=f"{v}-real", marks=pytest.mark.slow) for v in REAL
]
W1, W2 = "10.5.0.3", "10.5.0.4"


def _cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, scenario: str
) -> Iterator[tuple[str, Leg]]:
    version, which = request.param
    state = tmp_path_factory.mktemp(f"{scenario}-{version}-{which}")
    create(state, ClusterSpec(workers=2, talos_version=REAL.get(version, version), scenario=scenario))
    with leg(which, state, REAL.get(version, "")) as run:
        yield version, run


@pytest.fixture(scope="module", params=LEGGED)
def ready(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Leg]]:
    """A cluster whose GPU workers already run the NVIDIA schematic with the modules patch."""
    yield from _cluster(request, tmp_path_factory, "gpu-ready")


@pytest.fixture(scope="module", params=LEGGED)
def fresh(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Leg]]:
    yield from _cluster(request, tmp_path_factory, "fresh")


def fake_only(run: Leg, why: str) -> None:
    """What simnode does not serve: the real leg is skipped, saying why."""
    if run.real:
        pytest.skip(f"real talosctl leg: {why}")


def json_stream(text: str) -> list[dict[str, object]]:
    decoder = json.JSONDecoder()
    objs, idx = [], 0
    text = text.strip()
    while idx < len(text):
        obj, end = decoder.raw_decode(text, idx)
        objs.append(obj)
        idx = end
        while idx < len(text) and text[idx].isspace():
            idx += 1
    return objs


def test_version_reports_node_tag(fresh: tuple[str, Leg]) -> None:
    version, run = fresh
    r = run("version", "-n", W1)
    assert r.returncode == 0, r.stderr
    server = r.stdout.split("Server:\n", 1)[1]
    assert f"\tNODE:        {W1}\n" in server
    assert re.search(rf"\tTag:         v{re.escape(version)}\.\d+\n", server)


def test_fresh_node_shows_only_the_vanilla_schematic(fresh: tuple[str, Leg]) -> None:
    _v, run = fresh
    r = run("get", "extensions", "-n", W1)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["NODE", "NAMESPACE", "TYPE", "ID", "VERSION", "NAME", "VERSION"]
    assert lines[1].split() == [
        W1,
        "runtime",
        "ExtensionStatus",
        "0",
        "1",
        "schematic",
        "376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba",
    ]
    assert len(lines) == 2


def test_fresh_node_has_no_driver(fresh: tuple[str, Leg]) -> None:
    _v, run = fresh
    r = run("read", "/proc/driver/nvidia/version", "-n", W1)
    assert r.returncode == 1
    assert "no such file or directory" in r.stderr
    assert run("read", "/proc/modules", "-n", W1).stdout == ""
    if not run.real:  # simnode serves no /proc/sys files (the runbook reads none through talosctl)
        assert run("read", "/proc/sys/net/core/bpf_jit_harden", "-n", W1).stdout == "2\n"


def test_extensions_named_per_version(ready: tuple[str, Leg]) -> None:
    version, run = ready
    r = run("get", "extensions", "-n", W1, "-o", "json")
    assert r.returncode == 0, r.stderr
    objs = json_stream(r.stdout)
    names = [o["spec"]["metadata"]["name"] for o in objs]  # type: ignore[index]
    suffix = "" if version == "1.7" else "-lts"
    assert names == [
        f"nvidia-open-gpu-kernel-modules{suffix}",
        f"nvidia-container-toolkit{suffix}",
        "schematic",
    ]
    kmod_version = objs[0]["spec"]["metadata"]["version"]  # type: ignore[index]
    assert re.fullmatch(rf"\d+\.\d+\.\d+-v{re.escape(version)}\.\d+", str(kmod_version))


def test_json_output_is_a_stream_of_indented_objects(ready: tuple[str, Leg]) -> None:
    _v, run = ready
    r = run("get", "extensions", "-n", f"{W1},{W2}", "-o", "json")
    assert not r.stdout.lstrip().startswith("[")
    assert r.stdout.startswith('{\n    "metadata": {\n        "created"')
    objs = json_stream(r.stdout)
    assert [o["node"] for o in objs] == [W1] * 3 + [W2] * 3
    assert "\\u003e= v" in r.stdout  # Go's json escapes '>' in the compatibility constraint


def test_yaml_output_documents(ready: tuple[str, Leg]) -> None:
    _v, run = ready
    r = run("get", "extensions", "-n", W1, "-o", "yaml")
    docs = list(yaml.safe_load_all(r.stdout))
    assert len(docs) == 3
    assert all(d["node"] == W1 for d in docs)
    assert docs[0]["metadata"]["type"] == "ExtensionStatuses.runtime.talos.dev"
    assert docs[0]["metadata"]["owner"] == "runtime.ExtensionStatusController"
    assert r.stdout.startswith(f"node: {W1}\nmetadata:\n    namespace: runtime\n")


def test_modules_live_only_from_1_11(ready: tuple[str, Leg]) -> None:
    version, run = ready
    r = run("get", "modules", "-n", W1)
    if version in ("1.7", "1.8"):
        # Before 1.11 ``modules`` is KernelModuleSpec: what the config asks to load, not what is loaded
        # (talos@v1.10.0 and v1.8.0 pkg/machinery/resources/runtime/kernel_module_spec.go:46; checked against the
        # real talosctl v1.10.0 in test_fake_vs_real_talosctl.py), so it cannot tell a module Live
        assert r.returncode == 0, r.stderr
        rows = [line.split() for line in r.stdout.splitlines()[1:]]
        assert {(row[2], row[3]) for row in rows} == {
            ("KernelModuleSpec", m) for m in ("nvidia", "nvidia_uvm", "nvidia_drm", "nvidia_modeset")
        }
        return
    assert r.returncode == 0, r.stderr
    rows = [line.split() for line in r.stdout.splitlines()[1:]]
    assert {row[3] for row in rows} == {"nvidia", "nvidia_uvm", "nvidia_drm", "nvidia_modeset"}
    if version == "1.14":
        # KernelModuleStatus with TYPE and a lowercase STATE (talos v1.14.0-rc.1
        # pkg/machinery/resources/runtime/kernel_module_status.go:53-66, kernelmodulestate_enumer.go)
        assert r.stdout.splitlines()[0].split() == [
            "NODE",
            "NAMESPACE",
            "TYPE",
            "ID",
            "VERSION",
            "TYPE",
            "STATE",
        ]
        assert {row[2] for row in rows} == {"KernelModuleStatus"}
        assert {(row[5], row[6]) for row in rows} == {("dynamic", "live")}
        spec = json_stream(run("get", "modules", "nvidia", "-n", W1, "-o", "json").stdout)[0]["spec"]
        assert spec["state"] == "live" and "name" not in spec  # type: ignore[index,operator]
        return
    assert {row[2] for row in rows} == {"LoadedKernelModule"}
    assert {row[5] for row in rows} == {"Live"}


def test_proc_files_show_the_open_driver(ready: tuple[str, Leg]) -> None:
    version, run = ready
    mods = run("read", "/proc/modules", "-n", W1).stdout
    # refcount and users: "- -" without CONFIG_MODULE_UNLOAD, Talos's kernels up to 1.8 (siderolabs/pkgs@v1.8.0
    # kernel/build/config-amd64:889), numbers from 1.9 (pkgs@v1.9.0 :936)
    unload = "- -" if version in ("1.7", "1.8") else "0 -"
    assert re.search(rf"^nvidia_uvm \d+ {unload} Live 0x[0-9a-f]+ \(O\)$", mods, re.M), mods
    drv = run("read", "/proc/driver/nvidia/version", "-n", W1).stdout
    m = re.search(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)", drv)
    assert m and drv.startswith("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64")
    ext = json_stream(run("get", "extensions", "0", "-n", W1, "-o", "json").stdout)[0]
    assert str(ext["spec"]["metadata"]["version"]).startswith(m.group(1) + "-")  # type: ignore[index]


def test_bpf_jit_harden_follows_the_patch(ready: tuple[str, Leg]) -> None:
    version, run = ready
    fake_only(run, "simnode serves no /proc/sys files (the runbook reads none through talosctl)")
    value = run("read", "/proc/sys/net/core/bpf_jit_harden", "-n", W1).stdout.strip()
    assert value == ("2" if version in ("1.13", "1.14") else "1")


def test_services_depend_on_toolkit_and_version(ready: tuple[str, Leg], fresh: tuple[str, Leg]) -> None:
    version, run = ready
    r = run("services", "-n", W1)
    assert r.returncode == 0, r.stderr
    # siderolabs/talos v1.13.0 cmd/talosctl/cmd/talos/service.go:86-100: tabwriter, padding 3
    assert re.match(r"NODE +SERVICE +STATE +HEALTH +LAST CHANGE +LAST EVENT\n", r.stdout)
    states = {line.split()[1]: line.split()[2] for line in r.stdout.splitlines()[1:]}
    assert states["ext-nvidia-persistenced"] == "Running"
    cdi = version in ("1.13", "1.14")
    assert states.get("ext-nvidia-cdi-gen") == ("Finished" if cdi else None)
    if cdi:
        assert re.search(
            r"ext-nvidia-cdi-gen +Finished +\? +\S+ ago +Service finished successfully\n", r.stdout
        )
    # the Service resource exists only while the service runs: a Finished one-shot has none
    # (talos v1.13.0 internal/app/machined/pkg/controllers/v1alpha1/service.go:73-92)
    ids = [line.split()[3] for line in run("get", "services", "-n", W1).stdout.splitlines()[1:]]
    assert "ext-nvidia-persistenced" in ids and "ext-nvidia-cdi-gen" not in ids
    _v, fresh_run = fresh
    listed = fresh_run("service", "-n", W1).stdout.splitlines()[1:]
    assert listed and not [line for line in listed if line.split()[1].startswith("ext-nvidia")]


@pytest.mark.parametrize("which", LEGS)
def test_services_of_a_dead_node_are_a_warning_named_after_it(tmp_path: Path, which: str) -> None:
    """ServiceList is one-to-many: ``FilterMessages`` prefixes each error with its node and talosctl prints
    them with ``cli.Warning`` (talos v1.13.0 cmd/talosctl/cmd/talos/service.go:76-83,
    pkg/machinery/client/reply.go)."""
    create(tmp_path, ClusterSpec(workers=2, talos_version="v1.13.0", scenario="gpu-ready"))
    inject(tmp_path, W1, "unreachable")
    with leg(which, tmp_path, "v1.13.0") as run:
        r = run("services", "-n", f"{W1},{W2}")
        alone = run("services", "-n", W1)
    assert r.returncode == 0
    assert r.stderr.startswith(f"WARNING: 1 error occurred:\n\t* {W1}: rpc error: code = Unavailable")
    assert {line.split()[0] for line in r.stdout.splitlines()[1:]} == {W2}
    assert alone.returncode == 1 and alone.stderr.startswith(
        f"error listing services: 1 error occurred:\n\t* {W1}: "
    )


def test_members_list_the_cluster(fresh: tuple[str, Leg]) -> None:
    _v, run = fresh
    fake_only(run, "simnode serves no Member resources (the runbook reads none)")
    r = run("get", "members", "-o", "jsonpath={.spec.machineType}")
    assert r.stdout.splitlines() == ["controlplane", "worker", "worker"]


def test_machineconfig_yaml_spec_is_the_config(fresh: tuple[str, Leg]) -> None:
    v, run = fresh
    doc = yaml.safe_load(run("get", "mc", "-n", W1, "-o", "yaml").stdout)
    # talosctl 1.7 prints the spec as the config document, 1.8+ as its YAML text (talos commit d9db360ab, v1.8.0)
    config = doc["spec"] if v == "1.7" else yaml.safe_load(doc["spec"])
    assert config["machine"]["type"] == "worker"
    assert doc["metadata"]["id"] == "v1alpha1"


@pytest.mark.parametrize("which", LEGS)
def test_unreachable_nodes_errors_name_no_node(tmp_path: Path, which: str) -> None:
    """talos v1.12.0 cmd/talosctl/cmd/talos/get.go:185-209 appends each node's COSI error raw."""
    create(tmp_path, ClusterSpec(workers=3, talos_version="v1.12.0"))
    inject(tmp_path, W2, "unreachable", "no_route")
    inject(tmp_path, "10.5.0.5", "unreachable")
    with leg(which, tmp_path, "v1.12.0") as run:
        r = run("get", "extensions", "-n", f"{W1},{W2},10.5.0.5")
    assert r.returncode == 1
    assert [line.split()[0] for line in r.stdout.splitlines()[1:]] == [W1]
    assert r.stderr == (
        "2 errors occurred:\n"
        '\t* rpc error: code = Unavailable desc = connection error: desc = "transport: Error while dialing: '
        f'dial tcp {W2}:50000: connect: no route to host"\n'
        '\t* rpc error: code = Unavailable desc = connection error: desc = "transport: Error while '
        'dialing: dial tcp 10.5.0.5:50000: connect: connection refused"\n\n\n'
    )


@pytest.mark.parametrize("which", LEGS)
def test_a_dead_first_node_fails_the_whole_get_before_any_output(tmp_path: Path, which: str) -> None:
    """The type is resolved on the first ``-n`` node only (talos v1.12.0
    cmd/talosctl/pkg/talos/helpers/resources.go:48-52): no header, no rows of the live nodes."""
    create(tmp_path, ClusterSpec(workers=2, talos_version="v1.12.0"))
    inject(tmp_path, W1, "unreachable")
    with leg(which, tmp_path, "v1.12.0") as run:
        r = run("get", "extensions", "-n", f"{W1},{W2}")
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr == (
        'rpc error: code = Unavailable desc = connection error: desc = "transport: Error while dialing: '
        f'dial tcp {W1}:50000: connect: connection refused"\n'
    )


def test_read_refuses_several_nodes(fresh: tuple[str, Leg]) -> None:
    _v, run = fresh
    r = run("read", "/proc/modules", "-n", f"{W1},{W2}")
    assert r.returncode == 1
    assert r.stderr.startswith('command "read" is not supported with multiple nodes\n\nUsage:')


def test_missing_resource_id(fresh: tuple[str, Leg]) -> None:
    _v, run = fresh
    r = run("get", "extensions", "7", "-n", W1)
    assert r.returncode == 1
    assert "resource ExtensionStatuses.runtime.talos.dev(runtime/7@undefined) doesn't exist" in r.stderr


def test_cdi_gen_log_lists_what_the_generator_could_not_locate(ready: tuple[str, Leg]) -> None:
    """``talosctl logs`` prints ``<node>: <line>`` (talos v1.13.0 cmd/talosctl/cmd/talos/logs.go:92); the
    Could-not-locate lines are the ones Talos CI quotes (internal/integration/api/extensions_nvidia.go:160-169)."""
    version, run = ready
    r = run("logs", "ext-nvidia-cdi-gen", "-n", W1)
    if version not in ("1.13", "1.14"):  # no CDI generator before 1.13, so no log (circular.go:235-247)
        assert r.returncode == 1 and r.stdout == "", r
        assert r.stderr.endswith('desc = log "ext-nvidia-cdi-gen" was not registered\n'), r.stderr
        return
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert all(line.startswith(f"{W1}: time=") for line in lines)
    assert sum("Could not locate" in line for line in lines) == 9
    assert f'{W1}: time="' in lines[0] and "X11/xorg.conf.d/10-nvidia.conf: not found" in r.stdout


def test_get_modules_and_proc_modules_agree_on_refcount_and_users(ready: tuple[str, Leg]) -> None:
    """Talos builds its module resource from /proc/modules (talos@v1.12.0 internal/app/machined/pkg/controllers/
    runtime/loaded_kernel_module.go ParseModules: ``dependencies`` is the users column), so on one node they say
    the same; the fake gave every module ``dependencies: [nvidia]`` (the users reversed) and simnode's resource
    a zero refcount beside /proc/modules' 2 (review, stop 52)."""
    version, run = ready
    if version in ("1.7", "1.8"):
        pytest.skip(f"Talos {version} has no module resource (LoadedKernelModule from 1.11)")
    line = next(
        r for r in run("read", "/proc/modules", "-n", W1).stdout.splitlines() if r.startswith("nvidia ")
    )
    assert line.split()[2:4] == ["2", "nvidia_uvm,nvidia_modeset,"], line
    spec = json_stream(run("get", "modules", "nvidia", "-n", W1, "-o", "json").stdout)[0]["spec"]
    assert spec["referenceCount"] == 2 and spec["dependencies"] == ["nvidia_uvm", "nvidia_modeset"], spec  # type: ignore[index]
    drm = json_stream(run("get", "modules", "nvidia_drm", "-n", W1, "-o", "json").stdout)[0]["spec"]
    assert drm["referenceCount"] == 0 and "dependencies" not in drm, drm  # type: ignore[index,operator]
