"""Talos patch semantics (detection, strategic merge, JSON6902) and ``talosctl patch mc`` / ``machineconfig patch``.

The ``talosctl patch`` tests on a 1.12 cluster run on two legs (``ext_cluster``): the Python talosctl and the real
talosctl v1.12.0 against simnode serving the same cluster (skipped without Go: ``tests/sim/talosctl_legs.py``); the
node's state is read back through talosctl (``get modules``), which both answer."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from runbook_lib.sim import patching, realtalos
from runbook_lib.sim.cluster import ClusterSpec, create
from runbook_lib.sim.faults import inject
from runbook_lib.sim.machineconfig import worker_config
from runbook_lib.sim.state import load_node, normalize_talos_version, runtime
from tests.sim.talosctl_legs import LEGS, Leg, leg
from tests.sim.talosctl_run import talosctl
from tests.sim.waiting import wait_for

REF = Path(__file__).resolve().parents[2] / ".." / "shared" / "reference" / "talos"
W1 = "10.5.0.3"
MODULES = {"machine": {"kernel": {"modules": [{"name": "nvidia"}, {"name": "nvidia_uvm"}]}}}


def validate_against_schema(config: list[dict[str, Any]], talos_minor: str) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema_minor = talos_minor if talos_minor in ("1.10", "1.11", "1.12", "1.13") else "1.10"
    path = REF / f"config.schema.v{schema_minor}.json"
    if not path.exists():
        pytest.skip(f"config schema {path} not present (../shared is not checked out)")
    schema = json.loads(path.read_text())
    for doc in config:
        jsonschema.validate(doc, schema)


# ---------------------------------------------------------------- detection


def test_patch_kind_detection() -> None:
    assert isinstance(patching.load_patch(b"machine:\n  sysctls: {a: '1'}\n"), patching.StrategicPatch)
    assert isinstance(
        patching.load_patch(b'[{"op": "add", "path": "/machine/x", "value": 1}]'), patching.JSONPatch
    )
    assert isinstance(patching.load_patch(b"- op: add\n  path: /machine/x\n  value: 1\n"), patching.JSONPatch)
    multi = b"apiVersion: v1alpha1\nkind: KernelModuleConfig\nname: nvidia\n---\nmachine: {}\n"
    p = patching.load_patch(multi)
    assert isinstance(p, patching.StrategicPatch) and len(p.documents) == 2
    with pytest.raises(patching.PatchError):
        patching.load_patch(b"- just\n- a list\n")


def test_bare_filename_only_from_talosctl_1_12(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "gpu.yaml").write_text(yaml.safe_dump(MODULES))
    assert isinstance(patching.load_patches(["gpu.yaml"], (1, 12))[0], patching.StrategicPatch)
    with pytest.raises(patching.PatchError):
        patching.load_patches(["gpu.yaml"], (1, 10))
    with pytest.raises(patching.PatchError, match=r"open missing\.yaml: no such file or directory"):
        patching.load_patches(["@missing.yaml"], (1, 10))


def test_consecutive_json_patches_are_merged() -> None:
    patches = patching.load_patches(
        ['[{"op":"add","path":"/a","value":1}]', "- op: add\n  path: /b\n  value: 2\n"], (1, 12)
    )
    assert len(patches) == 1 and isinstance(patches[0], patching.JSONPatch)
    assert len(patches[0].operations) == 2


# ---------------------------------------------------------------- merge semantics


def test_strategic_merge_appends_lists_so_reapplying_duplicates() -> None:
    cfg = worker_config("v1.12.11")
    patch = patching.StrategicPatch([MODULES])
    once = patching.apply_strategic(cfg, patch)
    twice = patching.apply_strategic(once, patch)
    names = [m["name"] for m in twice[0]["machine"]["kernel"]["modules"]]
    assert names == ["nvidia", "nvidia_uvm", "nvidia", "nvidia_uvm"]
    assert cfg[0]["machine"].get("kernel") is None  # the input is not modified


def test_strategic_merge_exceptions_and_deletes() -> None:
    cfg = worker_config("v1.12.11")
    patch = patching.StrategicPatch(
        [
            {
                "cluster": {"network": {"podSubnets": ["10.32.0.0/12"]}},
                "machine": {"features": {"$patch": "delete"}},
            }
        ]
    )
    out = patching.apply_strategic(cfg, patch)[0]
    assert out["cluster"]["network"]["podSubnets"] == ["10.32.0.0/12"]
    assert "features" not in out["machine"]
    ifaces = patching.StrategicPatch(
        [{"machine": {"network": {"interfaces": [{"interface": "eth0", "mtu": 9000}]}}}]
    )
    out2 = patching.apply_strategic(patching.apply_strategic(cfg, ifaces), ifaces)[0]
    assert out2["machine"]["network"]["interfaces"] == [{"interface": "eth0", "mtu": 9000}]


def test_multi_document_matched_by_kind_and_name() -> None:
    cfg = worker_config("v1.12.11")
    esc = {
        "apiVersion": "v1alpha1",
        "kind": "ExtensionServiceConfig",
        "name": "nut-client",
        "configFiles": [{"content": "a", "mountPath": "/etc/a"}],
    }
    step1 = patching.apply_strategic(cfg, patching.StrategicPatch([esc]))
    assert len(step1) == 2
    update = {
        **esc,
        "configFiles": [{"content": "b", "mountPath": "/etc/a"}, {"content": "c", "mountPath": "/etc/c"}],
    }
    step2 = patching.apply_strategic(step1, patching.StrategicPatch([update]))
    assert step2[1]["configFiles"] == [
        {"content": "b", "mountPath": "/etc/a"},
        {"content": "c", "mountPath": "/etc/c"},
    ]
    deleted = patching.apply_strategic(
        step2,
        patching.StrategicPatch(
            [
                {
                    "apiVersion": "v1alpha1",
                    "kind": "ExtensionServiceConfig",
                    "name": "nut-client",
                    "$patch": "delete",
                }
            ]
        ),
    )
    assert len(deleted) == 1
    with pytest.raises(patching.PatchError, match="not supported for multi-document"):
        patching.apply_json6902(step2, patching.JSONPatch([{"op": "add", "path": "/debug", "value": True}]))


def test_json6902_errors_are_reported() -> None:
    cfg = worker_config("v1.12.11")
    with pytest.raises(patching.PatchError):
        patching.apply_json6902(cfg, patching.JSONPatch([{"op": "remove", "path": "/machine/nothere"}]))


def test_encoding_is_go_yaml_style() -> None:
    text = patching.encode_config(
        patching.apply_strategic(worker_config("v1.12.11"), patching.StrategicPatch([MODULES]))
    )
    assert (
        "    kernel:\n        modules:\n            - name: nvidia\n            - name: nvidia_uvm\n" in text
    )
    assert "certSANs: []\n" in text


@pytest.mark.parametrize("version", ["1.7", "1.8", "1.12", "1.13"])
def test_generated_and_patched_configs_validate_against_the_schema(version: str) -> None:
    cfg = worker_config(normalize_talos_version(version))
    validate_against_schema(cfg, version)
    files = {
        "machine": {
            "files": [
                {
                    "content": '[plugins]\n  default_runtime_name = "nvidia"\n',
                    "path": "/etc/cri/conf.d/20-customization.part",
                    "op": "create",
                }
            ],
            "sysctls": {"net.core.bpf_jit_harden": "1"},
        }
    }
    patched = patching.apply_patches(cfg, [patching.StrategicPatch([MODULES, files])])
    validate_against_schema(patched, version)


# ---------------------------------------------------------------- through the CLI


@pytest.fixture(params=LEGS)
def ext_cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Leg]:
    """Two 1.12 workers with the NVIDIA extensions and no modules patch, on the fake or the real talosctl."""
    state = tmp_path / "state"
    create(state, ClusterSpec(workers=2, talos_version="v1.12.0", scenario="extensions-no-patch"))
    with leg(request.param, state, "v1.12.0") as run:
        yield run


def live_modules(run: Leg, node: str = W1) -> set[str]:
    """The modules ``talosctl get modules`` lists on the node (both legs serve LoadedKernelModule)."""
    r = run("get", "modules", "-n", node)
    assert r.returncode == 0, r.stderr
    return {line.split()[3] for line in r.stdout.splitlines()[1:]}


def take_down(run: Leg, address: str) -> None:
    """The node stops answering: the fault in its node file, and on the real leg simnode's ``down`` (SIGHUP)."""
    inject(run.state, address, "unreachable")
    if run.real:
        assert realtalos.sync_faults(run.state)


def test_dry_run_prints_a_diff_on_stderr_and_changes_nothing(ext_cluster: Leg, tmp_path: Path) -> None:
    patch = tmp_path / "gpu.yaml"
    patch.write_text(yaml.safe_dump(MODULES))
    r = ext_cluster("patch", "mc", "-n", W1, "--patch", f"@{patch}", "--dry-run")
    assert r.returncode == 0, r.stderr
    assert r.stdout == ""
    assert r.stderr.startswith(
        f"patched MachineConfigs.config.talos.dev/v1alpha1 at the node {W1}\n"
        "Dry run summary:\nApplied configuration without a reboot (skipped in dry-run).\nConfig diff:\n\n--- a\n+++ b\n@@ "
    )
    assert "+    kernel:\n+        modules:\n+            - name: nvidia\n" in r.stderr
    assert live_modules(ext_cluster) == set()


def test_apply_makes_modules_live_and_reapply_is_detected(ext_cluster: Leg) -> None:
    jp = json.dumps(
        [
            {
                "op": "add",
                "path": "/machine/kernel",
                "value": {"modules": [{"name": "nvidia"}, {"name": "nvidia_uvm"}]},
            }
        ]
    )
    r = ext_cluster("patch", "machineconfig", "-n", W1, "-p", jp)
    assert r.returncode == 0, r.stderr
    assert (
        r.stderr
        == f"patched MachineConfigs.config.talos.dev/v1alpha1 at the node {W1}\nApplied configuration without a reboot\n"
    )
    assert live_modules(ext_cluster) == {"nvidia", "nvidia_uvm"}
    r = ext_cluster("patch", "machineconfig", "-n", W1, "-p", jp)
    assert (r.returncode, r.stderr) == (0, "Apply was skipped: no changes detected.\n")


def test_files_change_reboots_in_auto_and_fails_in_no_reboot(ext_cluster: Leg, tmp_path: Path) -> None:
    patch = tmp_path / "rt.yaml"
    patch.write_text(
        yaml.safe_dump(
            {
                "machine": {
                    "files": [
                        {
                            "content": '[plugins]\n  default_runtime_name = "nvidia"\n',
                            "path": "/etc/cri/conf.d/20-customization.part",
                            "op": "create",
                        }
                    ]
                }
            }
        )
    )
    r = ext_cluster("patch", "mc", "-n", W1, "--patch-file", str(patch), "--mode", "no-reboot")
    assert r.returncode == 1
    # ApplyConfiguration's error, after the node's ``patched`` line (talos v1.12.0 patch.go:87-111)
    assert f"\n1 error occurred:\n\t* {W1}: rpc error: code = InvalidArgument" in r.stderr
    before = load_node(ext_cluster.state, W1).boot_count
    r = ext_cluster("patch", "mc", "-n", W1, "--patch-file", str(patch))
    assert r.returncode == 0, r.stderr
    # auto mode says why it reboots: CanApplyImmediate's error and diff (talos@v1.12.0 v1alpha1_server.go:226-232)
    assert r.stderr.startswith(
        f"patched MachineConfigs.config.talos.dev/v1alpha1 at the node {W1}\nApplied configuration with a reboot: "
        "this config change can't be applied in immediate mode\ndiff:\n--- a\n+++ b\n@@ "
    )
    assert "+    files:\n" in r.stderr
    if not ext_cluster.real:  # the fake's node file; simnode's reboot is test_real_talosctl's
        node = load_node(ext_cluster.state, W1)
        assert node.boot_count == before + 1
        assert runtime(node).default_runtime == "nvidia"


def test_staged_mode_applies_at_next_reboot(ext_cluster: Leg) -> None:
    r = ext_cluster("patch", "mc", "-n", W1, "-m", "staged", "-p", yaml.safe_dump(MODULES))
    assert r.returncode == 0, r.stderr
    assert r.stderr.endswith("Staged configuration to be applied after the next reboot\n")
    assert live_modules(ext_cluster) == set()
    r = ext_cluster("reboot", "-n", W1)
    assert r.returncode == 0, r.stderr

    def loaded() -> bool:  # simnode's node is down for reboot_ms, then apid reconnects (back-off)
        r = ext_cluster("get", "modules", "-n", W1)
        return r.returncode == 0 and {"nvidia", "nvidia_uvm"} <= set(r.stdout.split())

    wait_for(loaded, timeout=90)
    assert live_modules(ext_cluster) == {"nvidia", "nvidia_uvm"}


def test_patch_stops_at_the_first_failing_node(ext_cluster: Leg) -> None:
    """A node that is down fails in ``ResolveResourceKind``, whose error names no node (talos v1.12.0
    cmd/talosctl/cmd/talos/patch.go:139-144 -> helpers/resources.go:49)."""
    take_down(ext_cluster, W1)
    r = ext_cluster("patch", "mc", "-n", f"{W1},10.5.0.4", "-p", yaml.safe_dump(MODULES))
    assert r.returncode == 1
    assert r.stderr.startswith("rpc error: code = Unavailable")
    assert live_modules(ext_cluster, "10.5.0.4") == set()  # the second node was not patched


def test_a_patch_after_a_patched_node_names_the_node_only_in_refusals(ext_cluster: Leg) -> None:
    """The first node is patched (its ``patched … at the node`` line), then the second is down: the error
    names no node.  A node refusing ApplyConfiguration prints its ``patched`` line first and its error is
    named (talos v1.12.0 patch.go:87-111, pkg/machinery/client/reply.go ``FilterMessages``)."""
    take_down(ext_cluster, "10.5.0.4")
    r = ext_cluster("patch", "mc", "-n", f"{W1},10.5.0.4", "-p", yaml.safe_dump(MODULES))
    assert r.returncode == 1
    assert r.stderr.startswith(f"patched MachineConfigs.config.talos.dev/v1alpha1 at the node {W1}\n")
    assert "\nrpc error: code = Unavailable" in r.stderr and "* 10.5.0.4" not in r.stderr
    refused = ext_cluster("patch", "mc", "-n", W1, "-p", "machine:\n  type: gpu\n")
    assert refused.stderr.startswith(
        f"patched MachineConfigs.config.talos.dev/v1alpha1 at the node {W1}\n1 error occurred:\n\t* {W1}: rpc error: "
        "code = InvalidArgument desc = 1 error occurred:\n\t* v1alpha1.Config: "
    )


@pytest.mark.parametrize(("client", "stream"), [("v1.3.0", "stdout"), ("v1.3.7", "stderr")])
def test_talosctl_1_3_0_alone_prints_patch_results_on_stdout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, client: str, stream: str
) -> None:
    """talos v1.3.0 cmd/talosctl/cmd/talos/patch.go:74-79 (``fmt.Printf``) and helpers/mode.go:122-131
    (``fmt.Println``); from v1.3.1 both go to stderr (talos commit 8a9ff259e, "fix: send diagnostic output to
    stderr consistently"; the real talosctl v1.3.5 does, tests/sim/test_fake_vs_real_talosctl.py). The Python
    talosctl printed every 1.3 client's on stdout."""
    monkeypatch.setenv("RUNBOOK_SIM_TALOSCTL_VERSION", client)
    create(tmp_path, ClusterSpec(workers=1, talos_version="1.3", scenario="extensions-no-patch"))
    r = talosctl(tmp_path, "patch", "mc", "-n", W1, "-p", yaml.safe_dump(MODULES), "--dry-run")
    assert r.returncode == 0, r.stderr
    printed, other = (r.stdout, r.stderr) if stream == "stdout" else (r.stderr, r.stdout)
    assert printed.startswith(
        f"patched MachineConfigs.config.talos.dev/v1alpha1 at the node {W1}\nDry run summary:\n"
    )
    assert "patched" not in other


def test_invalid_result_is_rejected(ext_cluster: Leg) -> None:
    """machined validates the patched config and refuses it; talosctl has printed the node's ``patched`` line and
    the error names the node, nesting machined's and the container's multierrors (real talosctl v1.12.0)."""
    r = ext_cluster("patch", "mc", "-n", W1, "-p", "machine:\n  type: gpu\n")
    assert r.returncode == 1
    assert r.stderr == (
        f"patched MachineConfigs.config.talos.dev/v1alpha1 at the node {W1}\n1 error occurred:\n\t* {W1}: "
        "rpc error: code = InvalidArgument desc = 1 error occurred:\n\t* v1alpha1.Config: 1 error occurred:\n\t* "
        'unknown machine type "gpu"\n\n\n\n\n\n\n'
    )


def test_machineconfig_patch_offline(tmp_path: Path, ext_cluster: Leg) -> None:
    src = tmp_path / "worker.yaml"
    src.write_text(patching.encode_config(worker_config("v1.13.9")))
    out = tmp_path / "out.yaml"
    r = subprocess.run(
        [
            str(ext_cluster.binary),
            "machineconfig",
            "patch",
            str(src),
            "-p",
            yaml.safe_dump(MODULES),
            "-o",
            str(out),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    doc = yaml.safe_load(out.read_text())
    assert [m["name"] for m in doc["machine"]["kernel"]["modules"]] == ["nvidia", "nvidia_uvm"]
    r = subprocess.run(
        [str(ext_cluster.binary), "machineconfig", "patch", str(src), "-p", "[]", "-n", W1],
        capture_output=True,
        text=True,
        check=False,
    )
    assert (r.returncode, r.stderr.splitlines()[0]) == (1, "unknown shorthand flag: 'n' in -n")


def test_kernel_module_config_documents_need_talos_1_14(ext_cluster: Leg) -> None:
    kmc = "apiVersion: v1alpha1\nkind: KernelModuleConfig\nname: nvidia\n"
    with pytest.raises(patching.PatchError, match="KernelModuleConfig"):
        patching.load_patches([kmc], (1, 13))
    assert isinstance(patching.load_patches([kmc], (1, 14))[0], patching.StrategicPatch)
    r = ext_cluster("patch", "mc", "-n", W1, "-p", kmc)
    assert r.returncode == 1 and "KernelModuleConfig" in r.stderr


@pytest.mark.parametrize(
    ("release", "prefix"),
    [("1.12", ""), ("1.14", "error decoding document /v1alpha1/ (line 1): ")],
)
def test_a_misspelt_key_is_refused_before_any_node_is_called(
    tmp_path: Path, release: str, prefix: str
) -> None:
    """The patch is decoded strictly against the client's config types (siderolabs/gen xyaml.CheckUnknownKeys):
    the unknown part, keys sorted, lists reduced to their unknown items. Compared with the real talosctl
    1.11-1.13 in test_fake_vs_real_talosctl.py; the 1.14 text (no talosctl 1.14 builds) follows
    talos@v1.14.0-rc.1 pkg/machinery/config/configloader/internal/decoder/decoder.go:137, as 1.13's does."""
    create(tmp_path, ClusterSpec(workers=1, talos_version=release))
    typo = "machine:\n  kernel:\n    modules:\n      - name: nvidia\n      - nmae: nvidia_uvm\n  kernal: {}\n"
    r = talosctl(tmp_path, "patch", "mc", "-n", W1, "--dry-run", "-p", typo)
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr == (
        f"{prefix}unknown keys found during decoding:\nmachine:\n    kernal: {{}}\n    kernel:\n"
        "        modules:\n            - nmae: nvidia_uvm\n\n"
    )


def test_keys_the_decoder_accepts_but_the_schema_omits_pass(tmp_path: Path) -> None:
    """``machine.time`` and ``machine.registries`` are not in the 1.12 JSON schema but are fields of its Go types
    (talos@v1.12.0 pkg/machinery/config/types/v1alpha1/v1alpha1_types.go MachineConfig), which is what decodes."""
    create(tmp_path, ClusterSpec(workers=1, talos_version="1.12"))
    patch = (
        "machine:\n  time:\n    disabled: true\n  registries:\n    mirrors: {}\n  nodeLabels:\n    a/b: c\n"
    )
    r = talosctl(tmp_path, "patch", "mc", "-n", W1, "--dry-run", "-p", patch)
    assert r.returncode == 0, r.stderr
