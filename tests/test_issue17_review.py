"""Issue 17 review (operator's experience): gaps found by trying the README's commands as an operator and an
attacker would, each with the test that showed it.

The rollback's approval rule is the project's own (README "Rollback": ``runbook rollback ... --from <record>``
plans, ``--apply`` applies); no Talos behaviour is involved in these tests.
"""

from __future__ import annotations

import json
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from runbook_lib.cli import main
from runbook_lib.clients.proc import Journal, JournalEntry
from runbook_lib.model.params import Params, load_params, validate
from runbook_lib.model.rollback import evidence_from_records
from runbook_lib.notebook import records
from runbook_lib.notebook.gates import ApprovalGate
from runbook_lib.notebook.lock import LOCKS_ENV
from runbook_lib.notebook.runner import StepOutcome, cluster_lock
from runbook_lib.sim.state import VANILLA_SCHEMATIC, load_nodes
from runbook_lib.steps.context import connect
from runbook_lib.steps.kubernetes import kubernetes_layer
from runbook_lib.steps.results import StepResult
from runbook_lib.steps.rollback import rollback
from tests.realplane import use_real_plane
from tests.simcluster import node_state, sim_cluster
from tests.test_interactive_records import NODES, Cluster, approve, recorder
from tests.test_interrupts import _default_sigint, expected_status, interrupt, running_sim, wait_until
from tests.test_rollback import ADDRESS, WORKERS, _patch_and_upgrade, sim  # noqa: F401 - sim: a fixture

PARAMS = Path(__file__).resolve().parents[1] / "params" / "simulated.yaml"


@pytest.fixture(autouse=True)
def locks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cluster apply locks of these tests, apart from the machine's (``~/.cache``)."""
    monkeypatch.setenv(LOCKS_ENV, str(tmp_path / "locks"))


@pytest.fixture
def params() -> Params:
    return load_params(PARAMS)


def _gpu_nodes(state: Path) -> dict[str, tuple[str, int]]:
    """Each GPU node's schematic and config version: what a rollback would change."""
    return {n.name: (n.schematic_id, n.config_version) for n in load_nodes(state) if n.gpus}


@pytest.mark.slow
def test_rollback_without_apply_only_plans_whatever_the_parameters_say_about_apply(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``runbook rollback -p FILE --from RECORD`` is the README's *plan* command.  A team's parameter file that
    says ``apply: true`` (so ``runbook run -p FILE`` applies in CI), or a ``--set apply=true``, must not turn
    it into a rollback of every GPU node: only ``--apply`` on the rollback's own command line approves it."""
    env = ["--records", str(tmp_path / "records"), "--state", str(tmp_path / "sim"), "--no-progress"]
    assert main(["run", "-p", str(PARAMS), "--steps", "config-patch,image", "--apply", *env]) == 0
    applied = records.resolve(tmp_path / "records", None)
    changed = _gpu_nodes(tmp_path / "sim")
    apply_true = tmp_path / "prod.yaml"
    apply_true.write_text(yaml.safe_dump({**yaml.safe_load(PARAMS.read_text()), "apply": True}))
    capsys.readouterr()

    for how in (["-p", str(apply_true)], ["-p", str(PARAMS), "--set", "apply=true"]):
        assert main(["rollback", *how, "--from", applied.name, *env]) == 0
        assert _gpu_nodes(tmp_path / "sim") == changed, f"rolled back without --apply ({' '.join(how)})"
        plan = records.load_record(records.resolve(tmp_path / "records", None))
        assert (plan["outcome"], plan["apply"], plan["changes"]) == ("planned", False, [])
        assert "add --apply" in capsys.readouterr().err


@pytest.mark.slow
def test_a_record_whose_node_names_sit_at_other_addresses_is_refused_not_taken_as_done(sim: Path) -> None:  # noqa: F811
    """A record of another cluster that carries the same name (every simulated cluster is ``sim-gpu``; staging
    and production may share one), or a parameter file whose names moved to other machines: the record's
    ``talos-worker-1`` is not the parameters' ``talos-worker-1``.  Before, the rollback read the machine the
    parameters name, found nothing of the runbook on it and reported "already where the runbook found it",
    while the node the record changed kept the NVIDIA image and modules.  Now the node is refused, naming both
    addresses, and nothing is changed."""
    record = _patch_and_upgrade(sim, WORKERS[:1])
    moved = {
        **ADDRESS,
        "talos-worker-1": ADDRESS["talos-worker-3"],
        "talos-worker-3": ADDRESS["talos-worker-1"],
    }
    nodes = [{"name": name, "address": moved[name]} for name in WORKERS]
    data = {"cluster": "sim-gpu", "talos_version": "v1.12.7", "nodes": nodes, "track": "lts", "apply": True}
    ctx = connect(validate(data, source="test"), state_dir=sim)
    result = rollback(ctx, evidence=evidence_from_records([record]), poll_interval=0.1)
    refused = result.node("talos-worker-1")
    assert refused.status == "failed", refused.message
    assert ADDRESS["talos-worker-1"] in refused.message and ADDRESS["talos-worker-3"] in refused.message
    assert ctx.journal.changes() == []
    assert node_state(sim, "talos-worker-1").schematic_id != VANILLA_SCHEMATIC  # still to be rolled back


# -- records verify on interactive records (Done when: "detects tampering with interactive records as it does
# with headless ones") ----------------------------------------------------------------------------------------


def _drop_first_change(path: Path) -> None:
    data = json.loads((path / "record.json").read_text())
    assert data["changes"], "the approval journaled its changes"
    data["changes"] = data["changes"][1:]
    (path / "record.json").write_text(json.dumps(data, indent=2))


INTERACTIVE_TAMPERING: dict[str, tuple[Callable[[Path], object], str]] = {
    "a result edited": (
        lambda p: (p / "results" / "config-patch.json").write_text("{}"),
        "edited file results/config-patch.json",
    ),
    "the rebuilt notebook's rendering deleted": (
        lambda p: (p / "html" / "02-config-patch.interactive.html").unlink(),
        "removed file html/02-config-patch.interactive.html",
    ),
    "the front page edited": (
        lambda p: (p / "index.html").write_text("<html>all green, nothing changed</html>"),
        "edited file index.html",
    ),
    "a change dropped from the journal in record.json": (_drop_first_change, "edited file record.json"),
    "a file added": (
        lambda p: (p / "results" / "extra.json").write_text("{}"),
        "inserted file results/extra.json",
    ),
}


@pytest.mark.parametrize("how", sorted(INTERACTIVE_TAMPERING))
def test_records_verify_names_tampering_with_an_interactive_record(
    how: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An approval's record, followed by a headless one (so it is not the newest, which an anchor guards)."""
    root = tmp_path / "records"
    params = load_params(PARAMS)
    approve(params, root)
    (interactive,) = records.sealed_records(root)
    headless = records.create_record_dir(root, params.cluster)
    records.seal(headless, {"cluster": params.cluster, "outcome": "planned", "steps": []})
    assert main(["records", "verify", "--dir", str(root)]) == 0
    tamper, expected = INTERACTIVE_TAMPERING[how]
    tamper(interactive)
    capsys.readouterr()
    assert main(["records", "verify", "--dir", str(root)]) == 1
    assert f"{interactive.name}: {expected}" in capsys.readouterr().out


def test_records_verify_names_a_deleted_interactive_record(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "records"
    params = load_params(PARAMS)
    approve(params, root)
    approve(params, root, only=("gpu-worker-1",))  # a second approval, chained after the first
    first, second = records.check(root).order
    shutil.rmtree(first)
    capsys.readouterr()
    assert main(["records", "verify", "--dir", str(root)]) == 1
    assert f"{first.name}: record removed" in capsys.readouterr().out
    assert second.is_dir()


def _journal_then_die(
    cluster: Cluster,
) -> Callable[[list[str] | None, Callable[[int, int], None]], StepResult]:
    def apply(only: list[str] | None, progress: Callable[[int, int], None]) -> StepResult:
        argv = ("talosctl", "-n", "gpu-worker-1", "patch", "mc", "--patch", "@nvidia.yaml")
        cluster.journal.add(JournalEntry("command", "patch", argv, 0, changes_cluster=True, diff="+x"))
        raise KeyboardInterrupt  # the kernel was interrupted after one change reached the cluster

    return apply


def test_records_verify_names_an_edited_journal_of_a_sealed_aborted_approval(
    params: Params, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An approval whose kernel died keeps its journal (``results/<step>.journal.jsonl``); once ``runbook
    records seal-aborted`` sealed it, the journal is evidence like any file: editing it is named."""
    root = tmp_path / "records"
    journal = Journal()
    cluster = Cluster(journal)
    gate = ApprovalGate(
        "config-patch",
        cluster.plan,
        _journal_then_die(cluster),
        nodes=NODES,
        recorder=recorder(params, journal, root),
    )
    gate.plan()
    with pytest.raises(KeyboardInterrupt):
        gate.approve()
    (aborted,) = records.check(root).aborted
    assert main(["records", "seal-aborted", aborted.name, "--dir", str(root)]) == 0
    assert main(["records", "verify", "--dir", str(root)]) == 0
    kept = aborted / "results" / "config-patch.journal.jsonl"
    assert "gpu-worker-1" in kept.read_text()
    kept.write_text("")  # the change that reached the cluster, erased from the journal
    capsys.readouterr()
    assert main(["records", "verify", "--dir", str(root)]) == 1
    assert f"{aborted.name}: edited file results/config-patch.journal.jsonl" in capsys.readouterr().out


# -- the rollback interrupted, and its apply lock ----------------------------------------------------------


def _upgraded_in(data: dict[str, Any]) -> set[str]:
    """The node addresses the record says the rollback ran ``talosctl upgrade`` on."""
    out: set[str] = set()
    for change in data["changes"]:
        argv = [str(a) for a in change.get("argv") or []]
        if change.get("step") == "rollback" and "upgrade" in argv:
            out.update(argv[argv.index("-n") + 1].split(","))
    return out


@pytest.mark.slow
def test_a_rollback_stopped_by_ctrl_c_seals_every_upgrade_that_reached_a_node(tmp_path: Path) -> None:
    """Ctrl-C once the first node is back on its old image (every call 700 ms, one node per batch): the record
    is sealed as interrupted and names the upgrade of every node that is back, as ``runbook run`` does."""
    with running_sim(tmp_path, "fresh", latency_ms=700, nodes_ready=False) as live:  # Talos only
        common = [
            "-p",
            str(PARAMS),
            "--state",
            str(live.state),
            "--records",
            str(live.records),
            "--no-progress",
        ]
        sets = [a for o in live.overrides for a in ("--set", o)]
        assert main(["run", *common, *sets, "--apply", "--steps", "config-patch,image"]) == 0
        applied = records.resolve(live.records, None)

        def back() -> set[str]:
            return {
                n.address for n in load_nodes(live.state) if n.gpus and n.schematic_id == VANILLA_SCHEMATIC
            }

        assert back() == set()
        argv = [
            sys.executable,
            "-m",
            "runbook_lib",
            "rollback",
            *common,
            *sets,
            "--apply",
            "--from",
            applied.name,
        ]
        proc = subprocess.Popen(
            argv,
            cwd=PARAMS.parents[1],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=_default_sigint,  # noqa: PLW1509 - the child must see SIGINT (tests/test_interrupts.py)
        )
        wait_until(proc, lambda: bool(back()), "a node back on its old image")
        status, err = interrupt(proc, [signal.SIGINT])
        assert status == expected_status([signal.SIGINT]), err
        assert "the record is sealed at" in err and "Traceback" not in err, err  # said, not crashed
        # the command the user ran
        assert "runbook rollback: SIGINT" in err and "runbook run:" not in err, err
        assert main(["records", "verify", "--dir", str(live.records)]) == 0
        data = records.load_record(records.resolve(live.records, None))
        assert (data["outcome"], data["steps_requested"]) == ("interrupted", ["rollback"])
        # the anchor a CI log keeps, as after a finished run (walkthrough, stop 54: an interrupted run had none)
        anchor = next(line for line in err.splitlines() if line.startswith("anchor: "))
        assert main(shlex.split(anchor.removeprefix("anchor: "))[1:]) == 0, anchor
        on_nodes = back()
        assert on_nodes != {n.address for n in load_nodes(live.state) if n.gpus}, "stopped mid-rollback"
        assert on_nodes <= _upgraded_in(data), (
            f"back on the old image, not in the record: {on_nodes - _upgraded_in(data)}"
        )


def test_a_rollback_with_apply_is_refused_while_another_run_changes_the_cluster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``runbook rollback --apply`` takes the cluster's apply lock like ``runbook run --apply``: while another
    run (or a JupyterLab approval) holds it, exit 2 naming the holder, no tool run, no record started."""
    root, state = tmp_path / "records", tmp_path / "sim"
    params = load_params(PARAMS)
    evidence = records.create_record_dir(root, params.cluster)
    records.seal(evidence, {"cluster": params.cluster, "outcome": "changed", "params": params.public_dict()})
    capsys.readouterr()
    with cluster_lock(params, str(state)):
        argv = ["rollback", "-p", str(PARAMS), "--from", evidence.name, "--apply"]
        assert main([*argv, "--records", str(root), "--state", str(state), "--no-progress"]) == 2
    assert "is being changed by another run" in capsys.readouterr().err
    assert records.sealed_records(root) == [evidence] and [p for p in root.iterdir() if p.is_dir()] == [
        evidence
    ]
    assert not state.exists()  # the simulator was not even created


def test_a_forged_record_that_breaks_the_chain_is_no_evidence_for_a_rollback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Someone who can write the records folder copies a record, edits where the nodes were "found" (any
    version and schematic the Image Factory serves) and writes a fresh ``SHA256SUMS``.  The copy is intact on
    its own, but ``records verify`` names it as inserted; before, ``runbook rollback --from`` took it as
    evidence and planned every node's downgrade to it.  The README promises records "sealed, intact and of
    this cluster, or nothing runs"."""
    root, state = tmp_path / "records", tmp_path / "sim"
    params = load_params(PARAMS)
    genuine = records.create_record_dir(root, params.cluster)
    records.seal(genuine, {"cluster": params.cluster, "outcome": "changed", "params": params.public_dict()})
    forged = root / genuine.name.replace(genuine.name[:8], "29991231")
    shutil.copytree(genuine, forged)
    data = records.load_record(forged)
    data["record"] = forged.name
    (forged / "record.json").write_text(json.dumps(data, indent=1))
    (forged / "SHA256SUMS").unlink()
    records.write_manifest(forged)
    assert records.verify_record(forged) == []  # intact on its own ...
    assert any(p.startswith(f"{forged.name}: ") for p in records.verify(root))  # ... but not in the chain
    capsys.readouterr()
    env = ["--records", str(root), "--state", str(state), "--no-progress"]
    assert main(["rollback", "-p", str(PARAMS), "--from", forged.name, *env]) == 2
    err = capsys.readouterr().err
    assert f"rollback.records: {forged.name} is not intact" in err and "inserted record" in err
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == sorted([genuine.name, forged.name])
    assert main(["rollback", "-p", str(PARAMS), "--from", genuine.name, *env]) == 2  # the chain is broken


def test_the_record_of_a_rollback_is_refused_as_evidence_with_the_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A rollback's record holds ``talosctl upgrade`` calls and ``$patch: delete`` patches, not where the runbook
    found the nodes.  Named in ``--from`` (say, with every record of the cluster), every node was refused with
    "the record does not say what sysctl … was before" and "upgraded but the record lacks its image before",
    and told to "name the record that changed it": the reason must be that it is a rollback's record."""
    root = tmp_path / "records"
    params = load_params(PARAMS)
    undo = records.create_record_dir(root, params.cluster)
    step = {"name": "rollback", "status": "changed", "result": {"step": "rollback", "nodes": []}}
    record = {
        "cluster": params.cluster,
        "outcome": "changed",
        "steps_requested": ["rollback"],
        "steps": [step],
    }
    records.seal(undo, {**record, "params": params.public_dict()})
    capsys.readouterr()
    env = ["--records", str(root), "--state", str(tmp_path / "sim"), "--no-progress"]
    assert main(["rollback", "-p", str(PARAMS), "--from", undo.name, *env]) == 2
    err = capsys.readouterr().err
    assert f"rollback.records: {undo.name} is the record of a rollback" in err
    assert not (tmp_path / "sim").exists()  # refused before the simulator started


@pytest.mark.slow
def test_the_rollback_logs_its_batches_for_the_front_page_timeline(sim: Path, tmp_path: Path) -> None:  # noqa: F811
    """The rollback rolls out in the ``rollout`` batches like the image and config-patch steps, but logged no
    batch: its record's front page said it was "a record from before the steps logged their rollout batches,
    or a step interrupted" and drew no batch, although the rollback had finished.  Now each batch is logged
    (canary 1, then 2) and drawn."""
    record = _patch_and_upgrade(sim, WORKERS[:3])
    nodes = [{"name": name, "address": ADDRESS[name]} for name in WORKERS]
    data = {"cluster": "sim-gpu", "talos_version": "v1.12.7", "nodes": nodes, "track": "lts", "apply": True}
    params = validate({**data, "rollout_concurrency": 2, "rollout": {"canary": 1}}, source="test")
    result = rollback(
        connect(params, state_dir=sim), evidence=evidence_from_records([record]), poll_interval=0.1
    )
    assert result.ok, result.summary()
    path = records.create_record_dir(tmp_path / "records", "sim-gpu")
    step = StepOutcome("rollback", "07-rollback.ipynb", result.status, result=result.to_dict()).to_record()
    records.seal(path, {"cluster": "sim-gpu", "outcome": "changed", "steps": [step], "changes": []})
    page = (path / "index.html").read_text(encoding="utf-8")
    assert "has no per-batch entries" not in page
    assert "batch 1/2 · 1 node: talos-worker-1 · " in page
    assert "batch 2/2 · 2 nodes: talos-worker-2, talos-worker-3 · " in page


def test_the_rollback_notebooks_overrides_cannot_approve_it() -> None:
    """07-rollback.ipynb passes its ``apply`` parameter (False unless papermill or the person sets it) next to
    ``overrides``: an ``apply=true`` among the overrides, or in the parameter file, must not win over it, so
    the cell plans and only the Approve button (or ``apply = True`` itself) changes the cluster."""
    from runbook_lib.notebook.steps import load

    records_set = 'rollback.records=["20261201T193219Z-sim-gpu-f505a407"]'
    assert load(str(PARAMS), apply=False, overrides=["apply=true", records_set]).apply is False
    assert load(str(PARAMS), apply=True, overrides=["apply=false", records_set]).apply is True


@pytest.mark.slow
def test_naming_every_gpu_node_removes_the_kubernetes_layer_as_naming_none_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``nodes`` listing every GPU node (the notebook's ``nodes`` parameter filled in, headless with
    ``apply``) is the whole cluster: the Kubernetes layer the run created goes first.  Before, any ``nodes``
    kept it with the note "only some GPU nodes go back", leaving the device plugin on nodes losing their
    driver (the JupyterLab node picker already passes no list when every node is picked, gates.py).
    On the real control plane and the real helm (``use_real_plane``)."""
    use_real_plane(monkeypatch)
    with sim_cluster(tmp_path, scenario="gpu-ready", apply=True) as (params, ctx):
        installed = kubernetes_layer(ctx, timeout_s=240)  # generous: a loaded CI machine
        assert installed.ok
        record = ("run-1", {"cluster": params.cluster, "params": params.public_dict()})
        step = StepOutcome("kubernetes", "05-kubernetes.ipynb", installed.status, result=installed.to_dict())
        record[1]["steps"] = [step.to_record()]
        back = connect(params, state_dir=tmp_path)
        every = [n.name for n in params.nodes]
        result = rollback(back, only=every, evidence=evidence_from_records([record]), poll_interval=0.1)
        assert result.ok, result.summary()
        own = f"{back.endpoints.helm} --kubeconfig {back.endpoints.kubeconfig}"  # the run's own (stop 52)
        assert (
            f"{own} uninstall nvidia-device-plugin -n kube-system --wait --timeout 300s"
            in result.data.get("kubernetes", [])
        )
        assert "the Kubernetes layer is kept: only some GPU nodes go back" not in result.notes
        assert back.helm.release("nvidia-device-plugin", "kube-system") is None
