"""Rollback (issue 17 point 5): the GPU nodes back to where the runbook found them, from its change records.

The rollback's design (which evidence, which order, which Kubernetes objects) is the project's own; the
Talos behaviour it relies on is cited where it is used: ``$patch: delete`` selectors (talos@v1.12.0
pkg/machinery/config/configloader/internal/decoder/delete.go ``makeSequenceSelector`` and selector.go
``deleteForPath``/``deleteStructFrom``), JSON6902 refused on multi-document configs (talos@v1.12.0
pkg/machinery/config/configpatcher/json6902.go), and ``talosctl rollback`` only swapping boot entries
(talos@v1.12.0 cmd/talosctl/cmd/talos/rollback.go, internal/app/machined/internal/server/v1alpha1/
v1alpha1_server.go ``Rollback``).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from runbook_lib.cli import main
from runbook_lib.cli.cmd_run import _simulated_cluster
from runbook_lib.errors import PermanentError
from runbook_lib.model.machineconfig import parse_documents
from runbook_lib.model.params import load_params, validate
from runbook_lib.model.rollback import evidence_from_records, removal_documents
from runbook_lib.notebook import records
from runbook_lib.notebook.lock import LOCKS_ENV
from runbook_lib.notebook.record_content import StepOutcome, journal_record
from runbook_lib.notebook.runner import select_steps
from runbook_lib.notebook.steps import GATES, RESULT_FILE_ENV, ROLLBACK, run_step
from runbook_lib.sim import patching, realtalos
from runbook_lib.sim.state import VANILLA_SCHEMATIC, load_node
from runbook_lib.steps import gpu_operator_handover
from runbook_lib.steps import rollback as rollback_step
from runbook_lib.steps.context import SIM_STATE_ENV, Context, connect
from runbook_lib.steps.image import image_upgrade
from runbook_lib.steps.kubernetes import kubernetes_layer
from runbook_lib.steps.patch import config_patch, read_configs
from runbook_lib.steps.results import StepResult
from runbook_lib.steps.rollback import rollback
from tests.realplane import use_real_plane
from tests.simcluster import (
    clear_fault,
    factory_only,
    failing_boot_id_read,
    inject_fault,
    node_state,
    sim_cluster,
)

PARAMS = str(Path(__file__).resolve().parents[1] / "params" / "simulated.yaml")
MODULES_PATCH = (
    "machine:\n  kernel:\n    modules:\n    - name: nvidia\n    - name: nvidia_uvm\n"
    "  sysctls:\n    net.core.bpf_jit_harden: '1'\n"
)


@pytest.fixture(autouse=True)
def locks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cluster apply locks of these tests, apart from the machine's (``~/.cache``)."""
    monkeypatch.setenv(LOCKS_ENV, str(tmp_path / "locks"))


# -- the simulator deletes as Talos does ---------------------------------------------------------------------


def test_sim_list_item_delete_removes_the_first_item_matching_its_first_key() -> None:
    """talos@v1.12.0 decoder/delete.go ``makeSequenceSelector``: a ``$patch: delete`` item in any list is a
    selector on its first other key (not only in the lists Talos merges by key); selector.go
    ``deleteStructFrom`` removes the first match and fails with "lookup failed" when none matches."""
    config = [
        {"machine": {"kernel": {"modules": [{"name": "zfs"}, {"name": "nvidia"}, {"name": "nvidia_uvm"}]}}}
    ]
    patch = patching.StrategicPatch(
        [{"machine": {"kernel": {"modules": [{"name": "nvidia", "$patch": "delete"}]}}}]
    )
    out = patching.apply_strategic(config, patch)
    assert out[0]["machine"]["kernel"]["modules"] == [{"name": "zfs"}, {"name": "nvidia_uvm"}]
    with pytest.raises(patching.PatchError, match="lookup failed"):
        patching.apply_strategic(out, patch)


# -- removal patches (pure) ----------------------------------------------------------------------------------


def _v1alpha1(**machine: Any) -> list[dict[str, Any]]:
    return [{"version": "v1alpha1", "machine": machine}]


def test_removal_deletes_what_the_runbook_added_and_restores_an_overwritten_sysctl() -> None:
    """The node had zfs and bpf_jit_harden 2; the runbook added the NVIDIA modules and set 1."""
    added = parse_documents(MODULES_PATCH)
    current = _v1alpha1(
        kernel={"modules": [{"name": "zfs"}, {"name": "nvidia"}, {"name": "nvidia_uvm"}]},
        sysctls={"net.core.bpf_jit_harden": "1", "vm.swappiness": "10"},
    )
    before = {"net.core.bpf_jit_harden": "2"}
    assert removal_documents(added, current, before, "before-image") == []
    (patch,) = removal_documents(added, current, before, "after-image")
    assert patch == {
        "machine": {
            "kernel": {
                "modules": [
                    {"name": "nvidia", "$patch": "delete"},
                    {"name": "nvidia_uvm", "$patch": "delete"},
                ]
            },
            "sysctls": {"net.core.bpf_jit_harden": "2"},
        }
    }
    out = patching.apply_strategic(current, patching.StrategicPatch([patch]))
    assert out[0]["machine"]["kernel"]["modules"] == [{"name": "zfs"}]
    assert out[0]["machine"]["sysctls"] == {"net.core.bpf_jit_harden": "2", "vm.swappiness": "10"}


def test_removal_leaves_what_is_gone_or_changed_since() -> None:
    """Talos fails a delete whose target is missing (selector.go ``ErrLookupFailed``): only what is still
    there, with the value the runbook set, is removed."""
    added = parse_documents(MODULES_PATCH)
    current = _v1alpha1(
        kernel={"modules": [{"name": "nvidia_uvm"}]}, sysctls={"net.core.bpf_jit_harden": "0"}
    )
    (patch,) = removal_documents(added, current, {"net.core.bpf_jit_harden": None}, "after-image")
    assert patch == {"machine": {"kernel": {"modules": [{"name": "nvidia_uvm", "$patch": "delete"}]}}}


def test_talos_1_14_documents_are_deleted_and_the_default_runtime_goes_before_the_image() -> None:
    """1.14 configs are multi-document (``KernelModuleConfig``), where Talos refuses JSON6902 patches
    (json6902.go): whole documents go with a document-level ``$patch: delete``."""
    added = [
        {"apiVersion": "v1alpha1", "kind": "KernelModuleConfig", "name": "nvidia"},
        {
            "apiVersion": "v1alpha1",
            "kind": "CRICustomizationConfig",
            "name": "nvidia-default-runtime",
            "content": "x",
        },
    ]
    current = [*_v1alpha1(), *added, {"apiVersion": "v1alpha1", "kind": "KernelModuleConfig", "name": "zfs"}]
    first = removal_documents(added, current, {}, "before-image")
    then = removal_documents(added, current, {}, "after-image")
    assert first == [
        {
            "apiVersion": "v1alpha1",
            "kind": "CRICustomizationConfig",
            "name": "nvidia-default-runtime",
            "$patch": "delete",
        }
    ]
    assert then == [
        {"apiVersion": "v1alpha1", "kind": "KernelModuleConfig", "name": "nvidia", "$patch": "delete"}
    ]
    out = patching.apply_strategic(current, patching.StrategicPatch([*first, *then]))
    assert [d.get("name") for d in out if "kind" in d] == ["zfs"]


def test_a_normal_run_never_includes_the_rollback() -> None:
    assert ROLLBACK.name not in [s.name for s in select_steps(None, None)]
    assert select_steps(["rollback"], None) == [ROLLBACK]
    with pytest.raises(PermanentError, match="rollback runs alone"):
        select_steps(["image", "rollback"], None)


# -- on the simulated cluster, from records shaped as `runbook run` seals them --------------------------------

WORKERS = ["talos-worker-1", "talos-worker-2", "talos-worker-3", "talos-worker-4"]
ADDRESS = {name: f"10.5.0.{3 + i}" for i, name in enumerate(WORKERS)}


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[Path]:
    """Four fresh GPU workers and the Image Factory (the real talosctl against simnode under ``auto``)."""
    state = tmp_path / "sim"
    with factory_only(state, workers=4, scenario="fresh"):
        yield state


@pytest.fixture
def sim_with_api(tmp_path: Path) -> Iterator[Path]:
    """As ``sim``, with the Kubernetes API: a patch that reboots its node drains it first (``steps/drains.py``)."""
    state = tmp_path / "sim"
    with sim_cluster(state, workers=4, scenario="fresh"):
        yield state


def _ctx(state: Path, **extra: Any) -> Context:
    nodes = [{"name": name, "address": ADDRESS[name]} for name in WORKERS]
    data = {"cluster": "sim-gpu", "talos_version": "v1.12.7", "nodes": nodes, "track": "lts", "apply": True}
    return connect(validate({**data, **extra}, source="test"), state_dir=state)


def _record(name: str, *steps: tuple[str, Context, StepResult]) -> tuple[str, dict[str, Any]]:
    """The ``record.json`` ``runbook run`` seals for these steps (each with its own kernel's journal)."""
    return name, {
        "cluster": "sim-gpu",
        "params": steps[0][1].params.public_dict(),
        "steps": [
            StepOutcome(s, f"{s}.ipynb", r.status, result=r.to_dict()).to_record() for s, _c, r in steps
        ],
        "changes": [
            journal_record(s, e.to_dict())
            for s, ctx, _r in steps
            for e in ctx.journal.entries
            if e.changes_cluster
        ],
    }


def _patch_and_upgrade(state: Path, names: list[str], **extra: Any) -> tuple[str, dict[str, Any]]:
    patch_ctx, image_ctx = _ctx(state, **extra), _ctx(state, **extra)
    patched = config_patch(patch_ctx, only=names)
    upgraded = image_upgrade(image_ctx, only=names, settle_timeout=30.0, poll_interval=0.1)
    return _record("run-1", ("config-patch", patch_ctx, patched), ("image", image_ctx, upgraded))


def _calls(ctx: Context) -> list[tuple[str, str]]:
    """(what, node) of every cluster change, in order: 'upgrade' or 'patch' (a talosctl call, per node address),
    'drain' or 'uncordon' (kubectl, the node's name)."""
    out = []
    for entry in ctx.journal.changes():
        argv = list(entry.argv or ())
        if not argv:  # an API call (the drain's cordon mark on the Node)
            continue
        if argv[1:2] in (["drain"], ["uncordon"]):
            out.append((argv[1], argv[2]))
            continue
        what = "upgrade" if "upgrade" in argv else "patch" if "patch" in argv else " ".join(argv)
        out += [(what, address) for address in argv[argv.index("-n") + 1].split(",")]
    return out


def _workload_on(node: str) -> dict[str, Any]:
    """A pod with no controller on ``node`` (``kubectl drain --force`` evicts those too)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web"},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "web", "image": "registry.k8s.io/pause:3.10"}],
            "tolerations": [{"operator": "Exists"}],
        },
    }


def _config(ctx: Context, name: str) -> list[dict[str, Any]]:
    configs, _errors = read_configs(ctx, [n for n in ctx.params.nodes if n.name == name])
    return configs[ADDRESS[name]]


def _modules(ctx: Context, name: str) -> list[str]:
    machine = next(d for d in _config(ctx, name) if "machine" in d)["machine"]
    return [m["name"] for m in (machine.get("kernel") or {}).get("modules") or []]


@pytest.mark.slow
def test_after_a_half_finished_rollout_only_the_changed_nodes_go_back(sim: Path) -> None:
    """The first run patched three nodes, then its image rollout stopped at worker-2 (the failure budget;
    that node rolled itself back) with worker-3 untouched; worker-4 was never part of it."""
    inject_fault(sim, "talos-worker-2", "upgrade_fails")
    record = _patch_and_upgrade(sim, WORKERS[:3])
    steps = {s["name"]: s["result"] for s in record[1]["steps"]}
    assert [g["nodes"] for g in steps["image"]["node_groups"] if g["status"] == "changed"] == [WORKERS[:1]]
    clear_fault(sim, "talos-worker-2", "upgrade_fails")
    ctx = _ctx(sim, rollout_concurrency=2, rollout={"canary": 1})  # the rollout controls apply here too
    plan = rollback(ctx, apply=False, evidence=evidence_from_records([record]))
    assert [plan.node(n).status for n in WORKERS] == ["planned", "planned", "planned", "unchanged"]
    assert plan.data["batches"] == [WORKERS[:1], WORKERS[1:3]]
    assert ctx.journal.changes() == []
    # each node's plan is numbered as it runs, with the command of each part (it began at "# 2." or "# 3."
    # when an earlier part was not needed, and a patch showed no command)
    upgraded, patched = plan.node("talos-worker-1").diff or "", plan.node("talos-worker-2").diff or ""
    assert upgraded.startswith("# 1. back to the image the runbook found\n") and " upgrade " in upgraded
    assert "\n# 2. remove the modules patch (after the image)\n" in upgraded
    assert patched.startswith("# 1. remove the modules patch\n"), "no image to wait for (walkthrough)"
    command = (
        f"-n {ADDRESS['talos-worker-2']} patch machineconfig --patch @removal.yaml  # removal.yaml holds:\n"
    )
    assert command in patched and "# 2." not in patched
    result = rollback(ctx, evidence=evidence_from_records([record]), settle_timeout=30.0, poll_interval=0.1)
    assert [result.node(n).status for n in WORKERS] == ["changed", "changed", "changed", "unchanged"]
    calls = _calls(ctx)
    assert [a for what, a in calls if what == "upgrade"] == [ADDRESS["talos-worker-1"]]
    # the plan showed the upgrade as it ran, its --timeout too (it had printed --wait=true alone)
    ran = next(e.argv for e in ctx.journal.changes() if "upgrade" in e.argv)
    assert f"\n{shlex.join(ran)}\n" in upgraded, (ran, upgraded)
    assert sorted(a for what, a in calls if what == "patch") == sorted(ADDRESS[n] for n in WORKERS[:3])
    assert all(node_state(sim, n).schematic_id == VANILLA_SCHEMATIC for n in WORKERS)
    assert all("nvidia" not in _modules(ctx, n) for n in WORKERS)
    again = rollback(_ctx(sim), apply=False, evidence=evidence_from_records([record]))
    assert {n.status for n in again.nodes} == {"unchanged"}


def _result_file(step: str, ctx: Context, result: StepResult) -> str:
    """``results/<step>.json`` as a step's kernel writes it (``notebook.steps._payload``)."""
    payload = {
        "step": step,
        "status": result.status,
        "summary": result.summary(),
        "result": result.to_dict(),
        "journal": [e.to_dict() for e in ctx.journal.entries],
    }
    return json.dumps(payload, default=str)


@pytest.mark.slow
def test_an_aborted_run_that_upgraded_nodes_before_it_died_rolls_them_back(sim: Path) -> None:
    """A run killed in its Kubernetes step after its config-patch and image steps finished: ``records
    seal-aborted`` kept their journals but not their results, so rollback knew the nodes were upgraded but not
    the image it found them on, and refused them ("the record lacks its image before")."""
    patch_ctx, image_ctx = _ctx(sim), _ctx(sim)
    patched = config_patch(patch_ctx, only=WORKERS[:2])
    upgraded = image_upgrade(image_ctx, only=WORKERS[:2], settle_timeout=30.0, poll_interval=0.1)
    assert patched.ok and upgraded.ok
    root = sim.parent / "records"
    path = records.create_record_dir(root, "sim-gpu")
    (path / "params.yaml").write_text(json.dumps(patch_ctx.params.public_dict()))
    (path / "results").mkdir()
    for number, (step, ctx, result) in enumerate(
        [("config-patch", patch_ctx, patched), ("image", image_ctx, upgraded)], start=1
    ):
        (path / f"0{number}-{step}.ipynb").write_text("{}")
        (path / "results" / f"{step}.json").write_text(_result_file(step, ctx, result))
    (path / "03-kubernetes.ipynb").write_text("{}")  # running when the kernel died: no result
    records.seal_aborted(path)

    evidence = evidence_from_records([(path.name, records.load_record(path))])
    for name in WORKERS[:2]:
        node = evidence.nodes[name]
        assert node.missing == [], node.missing
        assert node.image is not None and node.image.schematic_id == VANILLA_SCHEMATIC, node.image
    plan = rollback(_ctx(sim), apply=False, evidence=evidence)
    assert [plan.node(n).status for n in WORKERS] == ["planned", "planned", "unchanged", "unchanged"]


@pytest.mark.slow
def test_a_node_whose_boot_id_cannot_be_read_gets_no_removal_patch(sim: Path, tmp_path: Path) -> None:
    """The removal is applied without a dry run, so rollback reads every node's boot ID first, to tell a
    reboot it causes from the node's answers before it (``reboots``). A node whose read failed was patched all
    the same, and a reboot there would have been waited for only until the node answered, which it still does
    before it goes down (talos v1.13.0 v1alpha1_server.go:242-250): now it is not patched, and says why."""
    patch_ctx = _ctx(sim)
    patched = config_patch(patch_ctx, only=WORKERS[:2])
    assert patched.ok
    record = _record("run-1", ("config-patch", patch_ctx, patched))
    ctx = _ctx(sim, rollout={"max_failures": 1})  # the canary's failure does not stop the second node
    first = ADDRESS[WORKERS[0]]
    ctx.talosctl.binary = failing_boot_id_read(tmp_path, ctx.talosctl.binary, first)
    result = rollback(ctx, evidence=evidence_from_records([record]), settle_timeout=30.0, poll_interval=0.1)
    refused = result.node(WORKERS[0])
    assert refused.status == "failed" and "boot ID could not be read" in refused.message, refused.to_dict()
    assert "i/o timeout" in refused.message
    assert [a for what, a in _calls(ctx) if what == "patch"] == [ADDRESS[WORKERS[1]]]
    assert "nvidia" in _modules(ctx, WORKERS[0]) and "nvidia" not in _modules(ctx, WORKERS[1])
    assert result.node(WORKERS[1]).status == "changed"


@pytest.mark.slow
def test_the_image_comes_back_before_the_modules_patch_and_a_node_still_on_it_keeps_them(sim: Path) -> None:
    """The reverse of the config-patch-then-image order: an NVIDIA image without the modules in its config
    hangs at boot (kmod blacklist, talos@v1.12.0 v1alpha1_sequencer_tasks.go BootTimeout)."""
    record = _patch_and_upgrade(sim, WORKERS[:2])
    inject_fault(sim, "talos-worker-2", "upgrade_fails")  # the way back fails on worker-2
    ctx = _ctx(sim, rollout={"max_failures": 1})
    result = rollback(ctx, evidence=evidence_from_records([record]), settle_timeout=30.0, poll_interval=0.1)
    first = ADDRESS["talos-worker-1"]
    assert [w for w, a in _calls(ctx) if a == first] == ["upgrade", "patch"]
    assert result.node("talos-worker-1").status == "changed"
    failed = result.node("talos-worker-2")
    assert failed.status == "failed" and "modules patch is kept" in failed.message
    assert [w for w, a in _calls(ctx) if a == ADDRESS["talos-worker-2"]] == ["upgrade"]
    assert "nvidia" in _modules(ctx, "talos-worker-2")
    assert node_state(sim, "talos-worker-2").schematic_id != VANILLA_SCHEMATIC
    # fixed and run again, the rollback resumes: only the node left goes back
    clear_fault(sim, "talos-worker-2", "upgrade_fails")
    again = _ctx(sim)
    resumed = rollback(
        again, evidence=evidence_from_records([record]), settle_timeout=30.0, poll_interval=0.1
    )
    assert [resumed.node(n).status for n in WORKERS[:2]] == ["unchanged", "changed"]
    assert [w for w, _a in _calls(again)] == ["upgrade", "patch"]
    assert "nvidia" not in _modules(again, "talos-worker-2")


@pytest.mark.slow
def test_what_the_node_had_before_is_kept(sim: Path) -> None:
    """A module and a sysctl value the node had before the runbook stay: only what it added goes."""
    ctx = _ctx(sim)
    own = "machine:\n  kernel:\n    modules:\n    - name: zfs\n  sysctls:\n    net.core.bpf_jit_harden: '2'\n"
    assert ctx.talosctl.patch_machineconfig([ADDRESS["talos-worker-1"]], own, dry_run=False).ok
    patch_ctx = _ctx(sim)
    record = _record("run-1", ("config-patch", patch_ctx, config_patch(patch_ctx, only=WORKERS[:1])))
    assert _modules(ctx, "talos-worker-1")[:2] == ["zfs", "nvidia"]
    result = rollback(_ctx(sim), evidence=evidence_from_records([record]), poll_interval=0.1)
    assert result.node("talos-worker-1").status == "changed"
    assert _modules(ctx, "talos-worker-1") == ["zfs"]
    machine = next(d for d in _config(ctx, "talos-worker-1") if "machine" in d)["machine"]
    assert machine["sysctls"]["net.core.bpf_jit_harden"] == "2"


@pytest.mark.slow
def test_a_node_without_evidence_is_refused_and_nothing_is_changed(sim: Path) -> None:
    name, data = _patch_and_upgrade(sim, WORKERS[:2])
    image = next(s for s in data["steps"] if s["name"] == "image")["result"]
    for group in image["node_groups"]:
        if "talos-worker-1" in group["nodes"]:
            del group["data"]["before"]  # a record that does not say where the node was found
    ctx = _ctx(sim)
    result = rollback(ctx, evidence=evidence_from_records([(name, data)]), poll_interval=0.1)
    refused = result.node("talos-worker-1")
    assert refused.status == "failed" and "lacks its image before" in refused.message
    assert result.node("talos-worker-2").status == "skipped"
    assert ctx.journal.changes() == []


# -- headless: `runbook rollback`, its own sealed run -------------------------------------------------------


@pytest.mark.slow
def test_runbook_rollback_plans_then_applies_from_a_record_into_its_own_record(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    env = ["--records", str(tmp_path / "records"), "--state", str(tmp_path / "sim"), "--no-progress"]
    steps = "config-patch,image,kubernetes"
    assert main(["run", "-p", PARAMS, "--steps", steps, "--apply", *env]) == 0
    applied = records.resolve(tmp_path / "records", None)

    assert main(["rollback", "-p", PARAMS, "--from", applied.name[-8:], *env]) == 0
    plan = records.load_record(records.resolve(tmp_path / "records", None))
    assert plan["outcome"] == "planned" and plan["changes"] == []
    assert plan["params"]["rollback"]["records"] == [str(applied)]
    planned = capsys.readouterr().out  # a plan says it in its plan lines, once, not as something done
    assert "rolled back:" not in planned and "not undone by the rollback" not in planned, planned
    assert planned.count("nvidia.com/gpu.present-") == 1, planned
    # what Approve runs, as the forward plan shows its own (operator walkthrough): the Kubernetes layer first,
    # then per group of nodes the installer they go back to and the removal patch
    # the run's own helm and kubeconfig, pasteable (operator walkthrough, stop 52: the shell's default context)
    helm = f"{tmp_path}/sim/bin/helm --kubeconfig {tmp_path}/sim/kubeconfig"
    would = planned.index(
        f"  would: {helm} uninstall nvidia-device-plugin -n kube-system --wait --timeout 300s (first: "
    )
    nodes = planned.index("  gpu-worker-1, gpu-worker-2, gpu-worker-3: back to Talos v1.12.7, schematic ")
    assert would < nodes, planned
    assert "-n <node> upgrade --image 127.0.0.1:" in planned and f"{VANILLA_SCHEMATIC}:v1.12.7" in planned
    assert "        - name: nvidia\n          $patch: delete\n" in planned, planned
    assert main(["rollback", "-p", PARAMS, "--from", applied.name, "--apply", *env]) == 0
    out = capsys.readouterr().out  # what it did and what it left, not only the counts (operator walkthrough)
    assert (
        f"rolled back:\n  {helm} uninstall nvidia-device-plugin -n kube-system --wait --timeout 300s\n" in out
    ), out
    assert "  gpu-worker-1, gpu-worker-2, gpu-worker-3: back to Talos v1.12.7, schematic " in out, out
    left = "not undone by the rollback, put back by hand if needed:\n  "
    assert (
        f"{left}{applied.name}: label nvidia.com/gpu.present added to 3 node(s) that had none; to remove "
        in out
    )
    sim = (tmp_path / "sim").resolve()  # the run's kubectl and kubeconfig: pasted, it asks this cluster
    label = "label node gpu-worker-1 gpu-worker-2 gpu-worker-3 nvidia.com/gpu.present-\n"
    assert f"{sim}/bin/kubectl --kubeconfig {sim}/kubeconfig {label}" in out, out
    assert out.count("nvidia.com/gpu.present-") == 1, "the notes do not repeat the list (walkthrough)"
    # README audit (stop 50): pasted, that kubectl met the simulator the rollback had stopped
    assert f"`runbook sim up --keep --state {tmp_path / 'sim'}`" in out, out
    assert out.splitlines()[-1].startswith("anchor: "), out
    done = records.load_record(records.resolve(tmp_path / "records", None))
    assert done["outcome"] == "changed" and done["steps_requested"] == ["rollback"]
    argvs = [" ".join(c.get("argv", [])) for c in done["changes"]]
    first_upgrade = next(i for i, a in enumerate(argvs) if " upgrade " in a)
    assert "uninstall nvidia-device-plugin" in argvs[0]  # the Kubernetes layer first
    assert all(" patch " not in a for a in argvs[:first_upgrade])  # no modules removed before an image
    assert {load_node(tmp_path / "sim", n).schematic_id for n in ("gpu-worker-1", "gpu-worker-2")} == {
        VANILLA_SCHEMATIC
    }
    # what a user sees next: the runbook plans the whole way again, Kubernetes layer included
    assert main(["run", "-p", PARAMS, "--steps", "config-patch", *env]) == 0
    assert records.load_record(records.resolve(tmp_path / "records", None))["outcome"] == "planned"
    assert main(["run", "-p", PARAMS, "--steps", "kubernetes", *env]) == 0
    kube = records.load_record(records.resolve(tmp_path / "records", None))["steps"][0]["result"]["data"]
    assert any("RuntimeClass nvidia" in c for c in kube["changes"]) and any(
        "helm" in c for c in kube["changes"]
    )
    assert main(["records", "verify", "--dir", str(tmp_path / "records")]) == 0


@pytest.mark.slow
def test_runbook_rollback_refuses_a_missing_or_edited_record_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    env = ["--records", str(tmp_path / "records"), "--state", str(tmp_path / "sim"), "--no-progress"]
    assert main(["run", "-p", PARAMS, "--steps", "config-patch", "--apply", *env]) == 0
    applied = records.resolve(tmp_path / "records", None)
    capsys.readouterr()
    assert main(["rollback", "-p", PARAMS, "--from", "no-such-record", *env]) == 2
    assert "rollback.records: no record matches 'no-such-record'" in capsys.readouterr().err
    record_json = applied / "record.json"
    record_json.write_text(record_json.read_text().replace('"nvidia"', '"nvidia-x"'))
    assert main(["rollback", "-p", PARAMS, "--from", applied.name, *env]) == 2
    assert f"{applied.name} is not intact (" in capsys.readouterr().err
    assert records.sealed_records(tmp_path / "records") == [applied]  # no rollback record was started


@pytest.mark.slow
def test_the_default_runtime_goes_before_the_image_and_the_modules_after_it(sim_with_api: Path) -> None:
    """The image step set ``nvidia`` as default runtime after the upgrade (containerd refuses a default runtime
    it has no definition for, see ``steps.patch.nodes_with_nvidia_runtime``): going back, it goes first."""
    sim = sim_with_api
    record = _patch_and_upgrade(sim, WORKERS[:1], default_runtime_patch=True)
    machine = next(d for d in _config(_ctx(sim), "talos-worker-1") if "machine" in d)["machine"]
    assert machine.get("files"), "the image step applied the default-runtime file"
    ctx = _ctx(sim, default_runtime_patch=True)
    ctx.kube.create_pod("default", _workload_on("talos-worker-1"))
    result = rollback(ctx, evidence=evidence_from_records([record]), settle_timeout=30.0, poll_interval=0.1)
    assert result.node("talos-worker-1").status == "changed"
    assert [w for w, _a in _calls(ctx)] == ["drain", "patch", "uncordon", "upgrade", "patch"]
    # the removal of the default runtime reboots the node (Talos <= 1.13): drained first, as config-patch drains
    assert "kubectl drain talos-worker-1 first" in (result.node("talos-worker-1").diff or "")
    assert ctx.kube.pod("default", "web") is None, "the workload was not evicted before the reboot"
    assert not (ctx.kube.node("talos-worker-1") or {}).get("spec", {}).get("unschedulable")
    machine = next(d for d in _config(ctx, "talos-worker-1") if "machine" in d)["machine"]
    assert not machine.get("files") and not (machine.get("kernel") or {}).get("modules")


@pytest.mark.slow
def test_a_run_and_its_resume_roll_back_together_to_where_the_first_found_the_nodes(sim: Path) -> None:
    inject_fault(sim, "talos-worker-2", "upgrade_fails")
    first = _patch_and_upgrade(sim, WORKERS[:3])  # stops at worker-2
    clear_fault(sim, "talos-worker-2", "upgrade_fails")
    resume_ctx = _ctx(sim)
    resumed = image_upgrade(resume_ctx, only=WORKERS[:3], settle_timeout=30.0, poll_interval=0.1)
    assert resumed.data["done"] == WORKERS[1:3]
    second = _record("run-2", ("image", resume_ctx, resumed))
    evidence = evidence_from_records([first, second])
    assert {n: e.image.record for n, e in evidence.nodes.items() if e.image} == {
        "talos-worker-1": "run-1",
        "talos-worker-2": "run-1",  # run-1 tried it first: its 'before' is where the runbook found it
        "talos-worker-3": "run-2",
    }
    ctx = _ctx(sim, rollout={"max_failures": "100%"})
    result = rollback(ctx, evidence=evidence, settle_timeout=30.0, poll_interval=0.1)
    assert [result.node(n).status for n in WORKERS] == ["changed", "changed", "changed", "unchanged"]
    assert sorted(a for w, a in _calls(ctx) if w == "upgrade") == sorted(ADDRESS[n] for n in WORKERS[:3])
    assert all(node_state(sim, n).schematic_id == VANILLA_SCHEMATIC for n in WORKERS)


@pytest.mark.slow
def test_a_rollback_from_a_resume_alone_names_the_run_it_follows_and_keeps_the_layer_its_nodes_need(
    sim: Path, tmp_path: Path
) -> None:
    """A run patched workers 1-3 and upgraded worker-1; the run after it (a resume, or the fix its report
    printed) upgraded worker-2 and installed the device plugin. Rolled back from the second record alone, the
    plan said of worker-1 "no record shows the runbook changed this node", named worker-3's patch as perhaps
    the site's own, and removed the device plugin worker-1 still needed on its NVIDIA image (operator
    walkthrough, 6 Dec 2026). It now names the first run for every node it changed, and keeps the layer."""
    from runbook_lib.notebook import rollback_records

    patch_ctx, image_ctx, resume_ctx = _ctx(sim), _ctx(sim), _ctx(sim)
    patched = config_patch(patch_ctx, only=WORKERS[:3])
    upgraded = image_upgrade(image_ctx, only=WORKERS[:1], settle_timeout=30.0, poll_interval=0.1)
    resumed = image_upgrade(resume_ctx, only=WORKERS[1:2], settle_timeout=30.0, poll_interval=0.1)
    layer = StepResult(
        step="kubernetes", applied=True
    )  # what the resume's Kubernetes step records it created
    layer.data["created"] = [
        {"kind": "helm-release", "name": "nvidia-device-plugin", "namespace": "kube-system"}
    ]
    runs = [
        _record("run-1", ("config-patch", patch_ctx, patched), ("image", image_ctx, upgraded))[1],
        _record("run-2", ("image", resume_ctx, resumed), ("kubernetes", resume_ctx, layer))[1],
    ]
    root = tmp_path / "records"
    names: list[str] = []
    for minute, data in enumerate(runs):
        path = records.create_record_dir(root, "sim-gpu", now=datetime(2026, 12, 6, 20, minute, tzinfo=UTC))
        records.seal(path, {**data, **({"continues": names[-1]} if names else {})})
        names.append(path.name)
    ctx = _ctx(sim, rollback={"records": [names[1]]}, apply=False)
    result = rollback(ctx, evidence=rollback_records.load_evidence(ctx.params, root))
    assert [result.node(n).status for n in WORKERS] == ["unchanged", "planned", "unchanged", "unchanged"]
    assert result.node(WORKERS[0]).message == (
        f"left as it is: no named record changed it, but {names[0]} did, an earlier run of this cluster (not named)"
    )
    assert result.node(WORKERS[3]).message == "no record shows the runbook changed this node: left as it is"
    notes = "\n".join(result.notes)
    assert (
        f"{', '.join(WORKERS[:3])}: also changed by {names[0]}, an earlier run of this cluster that is not named: "
        f"what it did to them stays; to undo it too, add --from {names[0]}"
    ) in notes, notes
    assert "which no named record applied" not in notes, "the patch's run is known: not 'perhaps the site's'"
    assert (
        f"{WORKERS[1]}: the machine config keeps the runbook's modules patch, which {names[0]} "
        "applied (not named), also on the nodes this rollback takes back"
    ) in notes, notes
    assert (
        f"the Kubernetes layer is kept: {WORKERS[0]} (changed by an earlier run that is not named)" in notes
    )
    assert not result.data.get("kubernetes") and not [c for c in result.checks if not c.ok], result.checks


def test_the_notebook_call_without_records_names_the_parameter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """JupyterLab's path (``run_step``, the Approve gate): no evidence, no rollback, and nothing contacted."""
    monkeypatch.setenv(records.RECORDS_ENV, str(tmp_path))
    with pytest.raises(PermanentError, match=r"rollback.records is empty") as raised:
        run_step("rollback", params_file=PARAMS, show=False, check_injected=False)
    assert "runbook records list" in str(raised.value)
    for ref, problem in [(str(tmp_path / "nope"), "is not a record directory"), ("nope", "no records in")]:
        with pytest.raises(PermanentError, match=f"rollback.records: .*{problem}"):
            run_step("rollback", params_file=PARAMS, overrides=[f"rollback.records=[{ref}]"], show=False)


@pytest.mark.slow
def test_only_the_kubernetes_objects_the_runbook_created_are_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A RuntimeClass ``nvidia`` the cluster had before the run stays; the Helm release the run installed
    goes (the kubernetes step records what it created in ``data.created``); node labels stay, and are named.
    On the real control plane and the real helm (``use_real_plane``)."""
    use_real_plane(monkeypatch)
    with sim_cluster(tmp_path, scenario="gpu-ready", apply=True) as (params, ctx):
        ctx.kube.create_runtime_class("nvidia", "nvidia", dry_run=False)
        installed = kubernetes_layer(ctx, timeout_s=60)
        assert installed.ok
        record = _record("run-1", ("kubernetes", ctx, installed))
        record[1]["params"] = params.public_dict()
        back = connect(params, state_dir=tmp_path)
        result = rollback(back, evidence=evidence_from_records([record]), poll_interval=0.1)
        assert result.ok and {n.status for n in result.nodes} == {"unchanged"}
        own = f"{back.endpoints.helm} --kubeconfig {back.endpoints.kubeconfig}"  # the run's own, pasteable
        assert result.data["kubernetes"] == [
            f"{own} uninstall nvidia-device-plugin -n kube-system --wait --timeout 300s"
        ]
        # what it does not undo is named in the plan, for a person to decide, as the command that undoes it
        assert any(
            "label nvidia.com/gpu.present added to 2 node(s) that had none; to remove it: kubectl label node "
            "talos-worker-1 talos-worker-2 nvidia.com/gpu.present-" in n
            for n in result.data["not_undone"]
        ), result.data["not_undone"]
        assert back.helm.release("nvidia-device-plugin", "kube-system") is None
        assert back.kube.runtime_class("nvidia") is not None
        # the rollback again (the go-on of one interrupted after the layer went): the layer is gone, so the label
        # comes off every node, not only those still to go back (none here: the walkthrough's re-run named fewer)
        again = rollback(connect(params, state_dir=tmp_path), evidence=evidence_from_records([record]))
        assert again.ok and again.data["kubernetes"] == [], again.data
        label = "to remove it: kubectl label node talos-worker-1 talos-worker-2 nvidia.com/gpu.present-"
        assert any(n.endswith(label) for n in again.data["not_undone"]), again.data["not_undone"]


@pytest.mark.slow
def test_a_kubernetes_step_that_left_changes_but_no_result_is_named_not_passed_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step killed after helm installed its release (or an aborted run's step) leaves its journal's changes in
    the record and no result. Rollback read only results, so it said nothing of them and the release stayed
    unmentioned; now the plan fails its Kubernetes check, naming the record and what the journal shows."""
    use_real_plane(monkeypatch)
    with sim_cluster(tmp_path, scenario="gpu-ready", apply=True) as (params, ctx):
        installed = kubernetes_layer(ctx, timeout_s=60)
        assert installed.ok
        name, data = _record("run-1", ("kubernetes", ctx, installed))
        for step in data["steps"]:
            step.pop("result", None)  # as a killed kernel leaves it: the journal, no result
        plan = rollback(
            connect(params, state_dir=tmp_path), apply=False, evidence=evidence_from_records([(name, data)])
        )
        assert ctx.helm.release("nvidia-device-plugin", "kube-system") is not None
    (check,) = [c for c in plan.checks if c.name == "Kubernetes layer"]
    assert not check.ok, check
    assert "run-1: the Kubernetes step changed the cluster" in check.message, check
    assert "helm upgrade --install nvidia-device-plugin" in check.message, check
    assert "left no result" in check.message and "one the site had that it upgraded" in check.message
    assert "(helm history nvidia-device-plugin -n kube-system shows whether" in check.fix, "no placeholders"


def test_labels_the_kubernetes_step_added_are_left_with_the_kubectl_commands_that_put_them_back() -> None:
    """Found by an operator walkthrough: the rollback listed ``label node gpu-worker-1 nvidia.com/gpu.present=true``
    for each node, the change it made, not how to undo it. The step now records each label's value before
    (``data.labelled``); ``kubectl label node A B key-`` removes a label from each node named, ``key=v
    --overwrite`` sets it back (kubectl's label command: k8s.io/kubectl@v0.35.0 pkg/cmd/label/label.go, its
    examples ``kubectl label pods foo bar-`` and ``--overwrite``; several names of one type are the resource
    builder's ``ResourceTypeOrNameArgs``)."""
    labelled = [
        {"node": "gpu-1", "label": "nvidia.com/gpu.present", "before": None},
        {"node": "gpu-2", "label": "nvidia.com/gpu.present", "before": "false"},
        {"node": "gpu-3", "label": "nvidia.com/gpu.present", "before": None},
    ]
    changes = [f"label node gpu-{i} nvidia.com/gpu.present=true" for i in (1, 2, 3)]
    changes.append("create namespace gpu-operator")
    kube = {"name": "kubernetes", "status": "changed"}
    kube["result"] = {"applied": True, "data": {"changes": changes, "labelled": labelled}}
    record = {"params": {"nodes": []}, "steps": [kube]}
    evidence = evidence_from_records([("run-1", record)])
    whole = StepResult(step="rollback", applied=False)
    rollback_step._not_undone(whole, evidence, {"gpu-1"}, layer_goes=True)
    assert whole.data["not_undone"] == [
        "run-1: label nvidia.com/gpu.present added to 2 node(s) that had none; to remove it: "
        "kubectl label node gpu-1 gpu-3 nvidia.com/gpu.present-",
        "run-1: label nvidia.com/gpu.present changed from 'false' on 1 node(s); to put it back: "
        "kubectl label node gpu-2 nvidia.com/gpu.present=false --overwrite",
        "run-1: create namespace gpu-operator",
    ]
    # only gpu-1 goes back and the Kubernetes layer stays (some nodes stay, or the release was there before the
    # run): the label is taken off gpu-1 alone (review of 6 Dec 2026: off every node it would take the device
    # plugin off the nodes that keep their GPUs)
    some = StepResult(step="rollback", applied=False)
    rollback_step._not_undone(some, evidence, {"gpu-1"}, layer_goes=False)
    assert some.data["not_undone"] == [
        # the count is the run's (2 labelled where it had none), the command names the node that goes back
        "run-1: label nvidia.com/gpu.present added to 2 node(s) that had none; to remove it on the 1 that go back: "
        "kubectl label node gpu-1 nvidia.com/gpu.present- (only the nodes that go back: the others keep it while "
        "the plugin runs)",
        # none of its nodes goes back: said to be kept, with the command that undoes it anyway (README audit)
        # no claim that a plugin stays (a run whose helm install failed had none: review of 184e8cb)
        "run-1: label nvidia.com/gpu.present changed from 'false' on 1 node(s); kept, as none of them goes back (a "
        "device plugin schedules only where it is set: put it back only where the GPUs are no longer used: "
        "kubectl label node gpu-2 nvidia.com/gpu.present=false --overwrite)",
        "run-1: create namespace gpu-operator",
    ]
    del kube["result"]["data"]["labelled"]  # a record from before 6 Dec 2026: the changes as they were said
    assert evidence_from_records([("run-1", record)]).not_undone == [f"run-1: {c}" for c in changes]
    # the GPU Operator's release goes: its CRDs and the GFD/NFD labels stay, which no record lists (operator
    # walkthrough, stop 54: the rollback named only the namespace)
    operator = StepResult(step="rollback", applied=False)
    rollback_step._not_undone(operator, evidence, {"gpu-1"}, layer_goes=True, operator_goes=True)
    left = operator.data["not_undone"]
    assert left[-2:] == list(rollback_step.OPERATOR_LEFTOVERS), left
    assert "kubectl delete crd clusterpolicies.nvidia.com" in left[-2] and "nvidia.com/gpu.*" in left[-1]


def test_the_label_comes_off_every_node_only_when_the_layer_the_runbook_created_is_gone() -> None:
    """A rollback run again after one that removed the layer (its go-on after an interrupt) reads the layer as
    gone (``data["kubernetes"] == []``): the label comes off every labelled node. Not when the run upgraded a
    site's release (it created none): that plugin stays and serves the nodes that stay (review of 7 Dec 2026)."""
    labelled = [{"node": f"gpu-{i}", "label": "nvidia.com/gpu.present", "before": None} for i in (1, 2)]
    kube: dict[str, Any] = {"name": "kubernetes", "status": "changed"}
    release = {"kind": "helm-release", "name": "nvidia-device-plugin", "namespace": "kube-system"}
    gone = StepResult(step="rollback", applied=False)
    gone.data["kubernetes"] = []
    runtime_class = {"kind": "RuntimeClass", "name": "nvidia"}
    for created, expected in (([release], True), ([], False), ([runtime_class], False)):
        kube["result"] = {"applied": True, "data": {"changes": [], "labelled": labelled, "created": created}}
        evidence = evidence_from_records([("run-1", {"params": {"nodes": []}, "steps": [kube]})])
        assert rollback_step.layer_goes(None, gone, evidence) is expected, created
        assert rollback_step.layer_goes(None, StepResult(step="rollback", applied=False), evidence) is False
        # a RuntimeClass the run created goes, a site's release it upgraded stays: the plugin stays (review)
        removing = gpu_operator_handover.Leftovers((), True)
        assert (
            rollback_step.layer_goes(removing, StepResult(step="rollback", applied=False), evidence)
            is expected
        )


def test_an_upgrade_of_a_release_the_run_did_not_create_is_listed_as_not_undone_with_helm_rollback() -> None:
    """A run that upgraded a release an earlier run (or someone) installed created nothing: its rollback removed
    nothing and said nothing of the upgrade, counted as undone (operator walkthrough, 6 Dec 2026). A release the
    run created is removed, so its install is not listed."""
    upgrade = (
        "helm upgrade --install nvidia-device-plugin nvdp/nvidia-device-plugin --version 0.18.0 -n kube-system "
        "--set runtimeClassName=nvidia (keeping the release's other values)"
    )
    kube = {"name": "kubernetes", "status": "changed"}
    kube["result"] = {"applied": True, "data": {"changes": [upgrade], "created": []}}
    record = {"params": {"nodes": []}, "steps": [kube]}
    assert evidence_from_records([("run-2", record)]).not_undone == [
        f"run-2: {upgrade}: an upgrade of a release the run did not create; to go back: helm history "
        "nvidia-device-plugin -n kube-system, then helm rollback nvidia-device-plugin <revision> -n kube-system"
    ]
    created = {"kind": "helm-release", "name": "nvidia-device-plugin", "namespace": "kube-system"}
    installed = {"name": "kubernetes", "status": "changed"}
    installed["result"] = {"applied": True, "data": {"changes": [upgrade], "created": [created]}}
    first = {"params": {"nodes": []}, "steps": [installed]}
    assert evidence_from_records([("run-1", first)]).not_undone == []
    # run-1 installed it, run-2 upgraded it: rolled back together, the release goes, so no helm rollback (review)
    assert evidence_from_records([("run-1", first), ("run-2", record)]).not_undone == []


def test_what_a_resultless_kubernetes_step_removed_is_listed_as_not_undone_not_as_to_remove() -> None:
    """The step retires the device plugin for the GPU Operator (``helm uninstall``, ``delete RuntimeClass``):
    a journal holding only those leaves nothing to remove, and the plan must not ask a person to remove it."""
    uninstall = ["helm", "uninstall", "nvidia-device-plugin", "-n", "kube-system", "--wait"]
    record = {
        "params": {"nodes": []},
        "steps": [{"name": "kubernetes", "status": "aborted"}],
        "changes": [
            {
                "step": "kubernetes",
                "kind": "command",
                "argv": uninstall,
                "exit_code": 0,
                "changes_cluster": True,
            },
            {
                "step": "kubernetes",
                "kind": "api",
                "summary": "delete RuntimeClass nvidia",
                "changes_cluster": True,
            },
        ],
    }
    evidence = evidence_from_records([("run-1", record)])
    assert evidence.kubernetes_missing == []
    assert evidence.not_undone == [
        "run-1: helm uninstall nvidia-device-plugin -n kube-system --wait (from its journal)",
        "run-1: delete RuntimeClass nvidia (from its journal)",
    ]
    install = ["helm", "upgrade", "--install", "gpu-operator", "gpu-operator", "-n", "gpu-operator"]
    record["changes"].append(
        {"step": "kubernetes", "kind": "command", "argv": install, "exit_code": 0, "changes_cluster": True}
    )
    (missing,) = evidence_from_records([("run-1", record)]).kubernetes_missing
    assert "(1 change(s): helm upgrade --install gpu-operator gpu-operator -n" in missing, missing


@pytest.mark.slow
def test_approve_in_jupyterlab_rolls_back_and_seals_an_interactive_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The notebook's own call (``run_step``), then the Approve button clicked programmatically, as
    tests/test_interactive_records.py drives it: the same gate and the same record chain as every step."""
    root, state = tmp_path / "records", tmp_path / "sim"
    monkeypatch.setenv(records.RECORDS_ENV, str(root))
    monkeypatch.delenv(RESULT_FILE_ENV, raising=False)
    with _simulated_cluster(load_params(PARAMS), str(state)) as env:
        monkeypatch.setenv(SIM_STATE_ENV, env[SIM_STATE_ENV])
        run = [
            "run",
            "-p",
            PARAMS,
            "--steps",
            "config-patch,image",
            "--apply",
            "--no-progress",
            "--state",
            str(state),
        ]
        assert main(run) == 0
        (applied,) = records.sealed_records(root)
        plan = run_step(
            "rollback", params_file=PARAMS, overrides=[f"rollback.records=[{applied.name}]"], show=False
        )
        assert plan.counts() == {"planned": 3} and records.sealed_records(root) == [applied]
        gate = GATES["rollback"]
        gate.button.click()
        assert gate.applied is not None and gate.applied.counts() == {"changed": 3}
        ctx = connect(load_params(PARAMS), state_dir=state)
        configs, _errors = read_configs(ctx, list(ctx.params.nodes))
    sealed = records.sealed_records(root)
    assert len(sealed) == 2 and "-interactive-" in sealed[1].name
    data = records.load_record(sealed[1])
    assert data["steps"][0]["name"] == "rollback" and data["outcome"] == "changed"
    assert any("upgrade" in c.get("argv", []) for c in data["changes"])
    assert main(["records", "verify", "--dir", str(root)]) == 0
    assert all("nvidia" not in json.dumps(docs) for docs in configs.values())
    assert {load_node(state, n.name).schematic_id for n in ctx.params.nodes} == {VANILLA_SCHEMATIC}


@pytest.mark.slow
def test_the_real_talosctl_against_simnode_takes_the_removal_patches_and_the_way_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ``$patch: delete`` removal patches through the real talosctl v1.12.0 into simnode, which patches with
    Talos's own machinery (pkg/machinery v1.12.0): the format is Talos's, not only our simulator's."""
    if realtalos.cached_talosctl("v1.12.0") is None or realtalos.cached_simnode() is None:
        pytest.skip("the real talosctl v1.12.0 and simnode are not built (make tools builds them)")
    monkeypatch.setenv(realtalos.MODE_ENV, "real")
    env = ["--records", str(tmp_path / "records"), "--state", str(tmp_path / "sim"), "--no-progress"]
    assert main(["run", "-p", PARAMS, "--steps", "config-patch,image", "--apply", *env]) == 0
    assert main(["rollback", "-p", PARAMS, "--from", "latest", "--apply", *env]) == 0
    done = records.load_record(records.resolve(tmp_path / "records", None))
    assert done["versions"]["talosctl"] == "v1.12.0" and done["outcome"] == "changed"
    assert [c["exit_code"] for c in done["changes"]] == [0] * 6  # an upgrade and a removal patch per node
    assert main(["run", "-p", PARAMS, "--steps", "config-patch", *env]) == 0  # the patch is planned again
    assert records.load_record(records.resolve(tmp_path / "records", None))["outcome"] == "planned"


def test_a_way_back_from_a_node_below_1_8_asks_for_preserve_by_the_release_the_node_runs(
    sim: Path,
) -> None:
    """``--preserve`` is needed when the release the node *runs* is below 1.8: its machined builds the upgrade
    sequence from the flag, and without it a control-plane node removes its pods and leaves etcd before the
    installer runs (talos@v1.7.0 internal/app/machined/pkg/runtime/v1alpha1/v1alpha1_sequencer.go:462-488).
    Rollback took the running release from the parameters (v1.9.0), not from the node, so a node moved back to
    v1.7.7 by hand since the records, and rolled back to its recorded v1.8.3, went without it. The node's state
    is written here as ``talosctl version`` reads it (``NodeState``); only the flag is under test."""
    from runbook_lib.model.rollback import FoundImage, NodeEvidence
    from runbook_lib.steps.image import NodeState
    from runbook_lib.steps.rollback import _node_plan

    ctx = _ctx(sim, talos_version="v1.9.0")
    node = ctx.params.nodes[0]
    found = NodeEvidence(node.name, node.address, image=FoundImage("record-1", "v1.8.3", None))
    for running, preserve in (("v1.7.7", True), ("v1.9.0", False)):
        plan = _node_plan(ctx, node, found, config=[], state=NodeState(version=running), fact=None)
        assert plan is not None and plan.preserve is preserve, (running, plan)
        assert ("--preserve" in plan.upgrade_argv(ctx)) is preserve
    # whether talosctl drains first (its upgrade deadline) also follows the node and the client, not a guess:
    # a 1.9 node is below the new upgrade API's range, so talosctl 1.13 takes the legacy path, without a drain
    # (talos@v1.13.0 cmd/talosctl/cmd/talos/upgrade.go:85, 115-126)
    for running, client, drains in (("v1.9.0", "v1.13.9", False), ("v1.13.9", "v1.13.9", True)):
        state = NodeState(version=running, client_version=client)
        plan = _node_plan(ctx, node, found, config=[], state=state, fact=None)
        assert plan is not None and plan.drains is drains, (running, plan)


@pytest.mark.slow
def test_a_cordon_an_interrupted_run_left_is_lifted_by_the_rollback(sim_with_api: Path) -> None:
    """A run interrupted between a drain and its uncordon leaves the node cordoned and marked as the runbook's
    (``drains.CORDON_MARK``); rolling that run back must undo it too. Before, only config-patch looked for it, so
    a rollback left the node unschedulable, with nothing in the record saying why. An administrator's cordon
    (no mark) stays."""
    from runbook_lib.steps.drains import CORDON_MARK

    sim = sim_with_api
    record = _patch_and_upgrade(sim, WORKERS[:2])
    ctx = _ctx(sim)
    body = {"metadata": {"annotations": {CORDON_MARK: "true"}}, "spec": {"unschedulable": True}}
    ctx.kube.core.patch_node("talos-worker-2", body)  # as a drain the interruption cut short leaves it
    ctx.kube.core.patch_node("talos-worker-3", {"spec": {"unschedulable": True}})  # an administrator's
    plan = rollback(_ctx(sim, apply=False), evidence=evidence_from_records([record]))
    assert any("talos-worker-2 still carries the cordon a run could not lift" in n for n in plan.notes), (
        plan.notes
    )
    assert (ctx.kube.node("talos-worker-2") or {})["spec"].get("unschedulable"), "a plan changed nothing"
    lift = (
        f"kubectl uncordon talos-worker-2 && kubectl annotate node talos-worker-2 {CORDON_MARK}-  (the cordon a "
        "run left)"
    )
    assert lift in plan.data["changes"], "a change Approve approves, not a note only (walkthrough)"
    result = rollback(ctx, evidence=evidence_from_records([record]), settle_timeout=30.0, poll_interval=0.1)
    assert result.ok, result.notes
    worker2 = ctx.kube.node("talos-worker-2") or {}
    assert not worker2["spec"].get("unschedulable") and CORDON_MARK not in worker2["metadata"].get(
        "annotations", {}
    )
    assert "lifted the cordon a run could not lift on talos-worker-2" in result.notes
    assert result.data["uncordoned"] == [lift], "what the terminal's 'rolled back:' lists, as the record does"
    # the cordon alone left to undo (a run cut after a drain, before its patch): still a plan, and a change
    ctx.kube.core.patch_node("talos-worker-2", body)
    alone = rollback(_ctx(sim, apply=False), evidence=evidence_from_records([record]))
    assert alone.status == "planned" and alone.data["changes"] == [lift], alone.to_dict()
    lifted = rollback(ctx, evidence=evidence_from_records([record]), settle_timeout=30.0, poll_interval=0.1)
    assert lifted.status == "changed" and lifted.data["uncordoned"] == [lift], lifted.to_dict()
    assert (ctx.kube.node("talos-worker-3") or {})["spec"].get("unschedulable"), (
        "the administrator's cordon went"
    )


@pytest.mark.slow
def test_a_rollback_the_api_server_would_refuse_halfway_changes_nothing(
    sim_with_api: Path, tmp_path: Path
) -> None:
    """The default runtime's removal reboots the node, so the rollback drains it; a user who may not evict pods
    would have its drain refused after the rollback began. Asked of the real API server's RBAC authorizer before
    any change: the plan names the refusal, and applying changes nothing."""
    from tests.rbac import as_restricted_user

    sim = sim_with_api
    record = _patch_and_upgrade(sim, WORKERS[:1], default_runtime_patch=True)
    planner = as_restricted_user(_ctx(sim, default_runtime_patch=True, apply=False), tmp_path)
    plan = rollback(planner, evidence=evidence_from_records([record]))
    [asked] = [c for c in plan.checks if c.name == "Kubernetes permissions"]
    assert asked.ok and "applying would be refused: " in asked.message
    assert (
        "create pods/eviction in every namespace, as the run drains the nodes a removal patch reboots"
        in asked.message
    )
    ctx = as_restricted_user(_ctx(sim, default_runtime_patch=True), tmp_path)
    result = rollback(ctx, evidence=evidence_from_records([record]), settle_timeout=30.0, poll_interval=0.1)
    [refused] = [c for c in result.checks if c.name == "Kubernetes permissions"]
    assert (
        not refused.ok
        and not result.ok
        and "auth can-i create pods --subresource=eviction -A --kubeconfig " in refused.fix
    )
    assert _calls(ctx) == [] and result.node("talos-worker-1").status == "skipped"
    machine = next(d for d in _config(ctx, "talos-worker-1") if "machine" in d)["machine"]
    assert machine.get("files"), "the default runtime was removed all the same"


@pytest.mark.slow
def test_a_refused_node_s_fix_names_the_records_in_the_folder_that_changed_it_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by an operator walkthrough: a change applied in two runs (config-patch, then ``continue with: runbook
    run --from image …``) leaves two records; a rollback from the first alone refused every node ("the record that
    changed it"), naming neither the record nor the flag. The fix now names the later record as ``--from``, and
    with it the plan passes."""
    env = ["--records", str(tmp_path / "records"), "--state", str(tmp_path / "sim"), "--no-progress"]
    assert main(["run", "-p", PARAMS, "--steps", "config-patch", "--apply", *env]) == 0
    patched = records.resolve(tmp_path / "records", None)
    assert main(["run", "-p", PARAMS, "--steps", "image", "--apply", *env]) == 0
    upgraded = records.resolve(tmp_path / "records", None)
    capsys.readouterr()
    # refused before anything runs, naming the later run that went on from it (walkthrough, stop 52); before,
    # the plan ran and refused every node, naming the same record
    assert main(["rollback", "-p", PARAMS, "--from", patched.name, *env]) == 2
    err = capsys.readouterr().err
    assert f"hint: roll them back together: add --from {upgraded.name} to this rollback" in err, err
    assert main(["rollback", "-p", PARAMS, "--from", patched.name, "--from", upgraded.name, *env]) == 0
    plan = records.load_record(records.resolve(tmp_path / "records", None))
    assert plan["outcome"] == "planned", plan["steps"]
    carried = "the machine config carries the runbook's modules patch, which no named record applied"
    assert carried not in capsys.readouterr().out
    # the other way round: from the later record alone the image goes back and the patch stays; that was said
    # nowhere (walkthrough, 6 Dec 2026), now a note names the nodes and what to add
    # nowhere (walkthrough, 6 Dec 2026), now a note names the nodes and the record to add: the image run follows
    # the config-patch run (`continues`), so the note knows which run applied the patch
    assert main(["rollback", "-p", PARAMS, "--from", upgraded.name, *env]) == 0
    out = capsys.readouterr().out
    assert (
        "note: gpu-worker-1, gpu-worker-2, gpu-worker-3: the machine config keeps the runbook's modules patch, "
        f"which {patched.name} applied (not named), also on the nodes this rollback takes back to the image they "
        f"were found on; to remove it too, add --from {patched.name}"
    ) in out, out


def test_the_records_a_refusal_suggests_are_the_cluster_s_changing_runs_and_a_broken_one_stops_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review of 6 Dec 2026: one unreadable record made every rollback fail, and an interrupted run (outcome
    ``interrupted``), the record a user most often forgets, was never suggested. Which nodes a record changed is
    ``evidence_from_records``' answer (tested above); here it is stubbed to the record's ``touched`` list."""
    from runbook_lib.model.rollback import Evidence
    from runbook_lib.notebook import rollback_records

    def touched(found: list[tuple[str, dict[str, Any]]]) -> Evidence:
        return Evidence(
            [n for n, _d in found], {node: None for _n, d in found for node in d.get("touched", [])}
        )  # type: ignore[misc]

    monkeypatch.setattr(rollback_records, "evidence_from_records", touched)
    root = tmp_path / "records"
    made = []
    for minute, (cluster, outcome, nodes) in enumerate(
        [
            ("sim-gpu", "changed", ["gpu-1"]),  # the named one
            ("sim-gpu", "interrupted", ["gpu-1"]),
            ("sim-gpu", "planned", ["gpu-1"]),
            ("other", "changed", ["gpu-1"]),
            ("sim-gpu", "changed", ["gpu-2"]),
        ]
    ):
        path = records.create_record_dir(root, cluster, now=datetime(2026, 12, 6, 12, minute, tzinfo=UTC))
        records.seal(path, {"cluster": cluster, "outcome": outcome, "steps": [], "touched": nodes})
        made.append(path)
    (made[-1] / "record.json").write_text("{not json")  # damaged after its seal
    found = rollback_records._unnamed(root, "sim-gpu", {made[0].resolve()}, made[0].name)
    assert found == {"gpu-1": [made[1].name]}, found


def test_the_folder_s_other_records_are_read_only_at_the_first_refusal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rollback that refuses no node read every newer record of the folder all the same, for a hint it never
    printed (stop 45's note: a 1,000-node record is large); now they are read at the first refusal, once."""
    import yaml

    from runbook_lib.notebook import rollback_records

    root = tmp_path / "records"
    named = records.create_record_dir(root, "sim-gpu", now=datetime(2026, 12, 6, 12, 0, tzinfo=UTC))
    records.seal(named, {"cluster": "sim-gpu", "outcome": "changed", "steps": []})
    for minute in (1, 2):
        later = records.create_record_dir(root, "sim-gpu", now=datetime(2026, 12, 6, 12, minute, tzinfo=UTC))
        records.seal(later, {"cluster": "sim-gpu", "outcome": "changed", "steps": []})
    read: list[str] = []
    real_load = records.load_record
    monkeypatch.setattr(records, "load_record", lambda path: read.append(path.name) or real_load(path))
    data = yaml.safe_load(Path(PARAMS).read_text()) | {"rollback": {"records": [named.name]}}
    evidence = rollback_records.load_evidence(validate(data, source="test"), root, suggest=True)
    assert read.count(named.name) == 1 and len(read) == 1, read  # the named record only
    assert evidence.unnamed("gpu-worker-1") == [] and len(read) == 3, (
        read
    )  # the first refusal reads the others
    assert evidence.unnamed("gpu-worker-2") == [] and len(read) == 3, read  # once


def test_a_node_an_interrupted_image_step_upgraded_goes_back_to_what_the_run_s_preflight_found() -> None:
    """SIGTERM during the image step seals the record with the upgrade in its journal but no image-step result:
    the node was refused ("the record lacks its image before") though the run's own preflight had read its
    release and schematic (operator walkthrough, 6 Dec 2026). The preflight's reading now stands in; a record
    whose preflight did not keep the schematic still refuses the node."""
    argv = [
        "talosctl",
        "-n",
        "10.5.0.11",
        "upgrade",
        "--image",
        "factory.talos.dev/x/y:v1.12.7",
        "--wait=true",
    ]
    change = {"step": "image", "argv": argv, "exit_code": 0}
    preflight = {"name": "preflight", "status": "ok"}
    seen = {"talos_version": "v1.12.7", "schematic_id": "376567988ad3"}
    # as a sealed record keeps it (record_content.group_nodes; a SIGTERM-sealed walkthrough record's shape)
    preflight["result"] = {"node_groups": [{"nodes": ["gpu-worker-1"], "status": "ok", "data": seen}]}
    record = {
        "params": {"nodes": [{"name": "gpu-worker-1", "address": "10.5.0.11"}]},
        "steps": [preflight, {"name": "image", "status": "interrupted"}],
        "changes": [change],
    }
    node = evidence_from_records([("run-1", record)]).nodes["gpu-worker-1"]
    assert node.missing == [] and node.image is not None
    assert (node.image.version, node.image.schematic_id) == ("v1.12.7", "376567988ad3")
    preflight["result"]["node_groups"][0]["status"] = "failed"  # e.g. its extensions could not be read
    refused = evidence_from_records([("run-1", record)]).nodes["gpu-worker-1"]
    assert refused.image is None, "a node preflight did not pass is not trusted to say its image"
    preflight["result"]["node_groups"][0]["status"] = "ok"
    del seen["schematic_id"]  # a preflight from before 6 Dec 2026, or one that could not read the extensions
    old = evidence_from_records([("run-1", record)]).nodes["gpu-worker-1"]
    assert old.image is None and old.missing == [
        "run-1: the node was upgraded but the record lacks its image before"
    ]


def test_a_rollback_of_records_later_runs_went_on_from_is_refused_naming_them(tmp_path: Path) -> None:
    """After an interrupted ``--apply`` run and the ``--from image --apply`` that finished it, the interrupt's
    printed rollback (of the first record alone) took the nodes back to stock Talos and left the GPU Operator
    the second run had installed, on nodes without drivers, saying nothing (operator walkthrough, stop 52). A
    rollback of records that later runs went on from (``continues``) is refused before anything runs, naming
    them; named together, or once a later rollback undid them, it goes on. A later run that continued nothing,
    or changed nothing, is not in the way."""
    from runbook_lib.notebook import rollback_records

    root = tmp_path / "records"

    def sealed(minute: int, **data: Any) -> Path:
        path = records.create_record_dir(root, "sim-gpu", now=datetime(2026, 12, 7, 13, minute, tzinfo=UTC))
        records.seal(path, {"cluster": "sim-gpu", "outcome": "changed", "steps": [], **data})
        return path

    change = [{"argv": ["helm", "upgrade", "--install"], "changes_cluster": True}]
    first = sealed(0, outcome="interrupted", changes=change)
    sealed(1, outcome="unchanged", changes=[])  # a --steps verify in between
    went_on = sealed(2, continues=first.name, changes=change)
    checked = sealed(3, continues=went_on.name, changes=[])  # continued, changed nothing
    sealed(4, changes=change)  # another change, not a continuation
    data = yaml.safe_load(Path(PARAMS).read_text())

    def load(*named: Path) -> None:
        params = validate(data | {"rollback": {"records": [p.name for p in named]}}, source="test")
        rollback_records.load_evidence(params, root)

    with pytest.raises(PermanentError) as refused:
        load(first)
    assert went_on.name in refused.value.message and checked.name not in refused.value.message
    assert refused.value.hint == f"roll them back together: add --from {went_on.name} to this rollback"
    load(first, went_on)
    # a rollback of the later run alone keeps its Kubernetes layer while the earlier run's nodes keep the NVIDIA
    # image: it undid nothing of the layer, and does not let the earlier one through (review of 5466089)
    sealed(
        5, outcome="unchanged", steps=[{"name": "rollback"}], params={"rollback": {"records": [went_on.name]}}
    )
    with pytest.raises(PermanentError):
        load(first)
    both = [str(first), str(went_on)]  # as the CLI records them: paths
    sealed(6, steps=[{"name": "rollback"}], params={"rollback": {"records": both}})
    load(first)
    # named by path, the hint gives paths: a bare name is looked up in the records folder (review)
    params = validate(data | {"rollback": {"records": [str(first)]}}, source="test")
    later = sealed(7, continues=first.name, changes=change)
    with pytest.raises(PermanentError) as by_path:
        rollback_records.load_evidence(params, tmp_path / "elsewhere")
    assert by_path.value.hint == f"roll them back together: add --from {later} to this rollback"
    # a later run whose every changing call failed changed nothing that stays (review)
    refused = [{**change[0], "exit_code": 1}]
    sealed(8, steps=[{"name": "rollback"}], params={"rollback": {"records": [*both, str(later)]}})
    sealed(9, continues=first.name, changes=refused)
    load(first)
