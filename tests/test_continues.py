"""Which earlier run of its cluster a run follows (``record.json``'s ``continues``), and what reads it.

Found by an operator walkthrough (6 Dec 2026): an --apply run interrupted in its image step, resumed with
``--from image --apply``, left two records; a rollback named with the second said of the nodes the first had
upgraded "no record shows the runbook changed this node", and the interrupted resume's rollback line named
only its own record.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from runbook_lib.cli.run_report import Invocation, after_interrupt
from runbook_lib.model.params import validate
from runbook_lib.notebook import continues, records, rollback_records

PARAMS = Path(__file__).resolve().parents[1] / "params" / "simulated.yaml"
UPGRADE = ["talosctl", "-n", "10.5.0.11", "upgrade", "--image", "factory.talos.dev/x/y:v1.12.7"]


def _seal(
    root: Path, minute: int, data: dict[str, Any], cluster: str = "sim-gpu", sealed_at: int | None = None
) -> Path:
    """A sealed record begun at 20:<minute> on 6 Dec 2026 and sealed 30 s later (or at 20:<sealed_at>)."""
    begun = datetime(2026, 12, 6, 20, minute, tzinfo=UTC)
    path = records.create_record_dir(root, cluster, now=begun)
    records.seal(path, {"cluster": cluster, "steps": [], **data})
    sealed = (
        begun.timestamp() + 30
        if sealed_at is None
        else datetime(2026, 12, 6, 20, sealed_at, tzinfo=UTC).timestamp()
    )
    os.utime(path / records.RECORD_JSON, (sealed, sealed))
    return path


def _upgraded_gpu_worker_1() -> dict[str, Any]:
    """An --apply run interrupted in its image step after upgrading gpu-worker-1 (shape of a sealed record:
    the preflight's reading stands in for the image step's lost result)."""
    seen = {"talos_version": "v1.12.7", "schematic_id": "376567988ad3"}
    preflight = {"nodes": ["gpu-worker-1"], "status": "ok", "data": seen}
    return {
        "params": {"nodes": [{"name": "gpu-worker-1", "address": "10.5.0.11"}]},
        "outcome": "interrupted",
        "steps": [
            {"name": "preflight", "status": "ok", "result": {"node_groups": [preflight]}},
            {"name": "image", "status": "interrupted"},
        ],
        "changes": [{"step": "image", "argv": UPGRADE, "exit_code": 0}],
    }


def test_a_run_follows_the_newest_run_of_its_cluster_that_changed_it(tmp_path: Path) -> None:
    root = tmp_path / "records"
    assert continues.continued_run(root, "sim-gpu") is None, "no folder yet: nothing to carry on"
    run = _seal(root, 0, {"outcome": "interrupted", "changes": [{"step": "image"}]})
    _seal(root, 1, {"outcome": "planned", "changes": []})  # a plan between them changed nothing
    _seal(root, 2, {"outcome": "changed", "changes": [{"step": "image"}]}, cluster="other")
    broken = _seal(root, 3, {"outcome": "changed", "changes": [{"step": "image"}]})
    (broken / records.RECORD_JSON).write_text("{not json")  # damaged: not one to carry on, and no crash
    assert continues.continued_run(root, "sim-gpu") == run.name
    _seal(root, 4, {"outcome": "changed", "steps": [{"name": "rollback"}], "changes": [{"step": "rollback"}]})
    assert continues.continued_run(root, "sim-gpu") is None, "a rollback undid what came before it"
    _seal(root, 5, {"outcome": "failed", "changes": [{"step": "image"}], "steps_requested": ["image"]})
    part = _seal(
        root, 6, {"outcome": "changed", "changes": [{}], "steps_requested": ["config-patch", "image"]}
    )
    assert continues.continued_run(root, "sim-gpu") == part.name, "passed, but not through cuda-test"
    whole = {"outcome": "changed", "changes": [{}], "steps_requested": ["verify", "kubernetes", "cuda-test"]}
    _seal(root, 7, whole)
    assert continues.continued_run(root, "sim-gpu") is None, (
        "a finished change: weeks later, nothing to follow"
    )
    approved = _seal(root, 8, {"outcome": "changed", "changes": [{}], "steps_requested": ["image"]})
    assert continues.continued_run(root, "sim-gpu") == approved.name
    # a JupyterLab approval's record is named <time>-<cluster>-interactive-<id>: its rollback ends the chain
    notebook = records.create_record_dir(
        root, "sim-gpu-interactive", now=datetime(2026, 12, 6, 20, 9, tzinfo=UTC)
    )
    records.seal(notebook, {"cluster": "sim-gpu", "steps": [{"name": "rollback"}], "changes": [{}]})
    assert continues.continued_run(root, "sim-gpu") is None, "the review: notebook records were passed over"


def test_the_chain_stops_at_a_link_it_cannot_follow(tmp_path: Path) -> None:
    root = tmp_path / "records"
    first = _seal(root, 0, {"changes": [{"step": "image"}]})
    second = _seal(root, 1, {"continues": first.name})
    third = {"cluster": "sim-gpu", "continues": second.name}
    assert [name for name, _d in continues.chain(root, third)] == [second.name, first.name]
    assert list(continues.chain(root, {"cluster": "other", "continues": second.name})) == []
    assert list(continues.chain(root, {"cluster": "sim-gpu", "continues": "gone"})) == []
    assert list(continues.chain(root, {"cluster": "sim-gpu", "continues": "../x"})) == []
    loop = _seal(root, 2, {"continues": "LOOP"})
    data = records.load_record(loop) | {"continues": loop.name}
    (loop / records.RECORD_JSON).write_text(json.dumps(data))
    assert [n for n, _d in continues.chain(root, {"cluster": "sim-gpu", "continues": loop.name})] == [
        loop.name
    ]


def test_a_rollback_named_with_the_resume_alone_knows_what_the_run_it_follows_changed(
    tmp_path: Path,
) -> None:
    root = tmp_path / "records"
    interrupted = _seal(root, 0, _upgraded_gpu_worker_1())
    resumed = _seal(root, 1, {"outcome": "changed", "continues": interrupted.name, "changes": []})
    data = yaml.safe_load(PARAMS.read_text()) | {"rollback": {"records": [resumed.name]}}
    evidence = rollback_records.load_evidence(validate(data, source="test"), root)
    assert evidence.nodes == {} and evidence.continued == {"gpu-worker-1": [interrupted.name]}
    data["rollback"]["records"] = [interrupted.name, resumed.name]
    both = rollback_records.load_evidence(validate(data, source="test"), root)
    assert both.continued == {} and "gpu-worker-1" in both.nodes, "named: evidence, no longer a hint"


def test_an_interrupted_resume_s_rollback_line_names_the_runs_it_follows(tmp_path: Path) -> None:
    root = tmp_path / "records"
    interrupted = _seal(root, 0, _upgraded_gpu_worker_1())
    steps = [{"name": "preflight", "status": "ok"}, {"name": "image", "status": "interrupted"}]
    own = {"apply": True, "params_file": "p.yaml", "overrides": []}
    resumed = _seal(root, 1, {**own, "steps": steps, "continues": interrupted.name})
    invocation = Invocation("p.yaml", (), str(root), None, apply=True, selection=("--from", "image"))
    said = after_interrupt(resumed, invocation)
    assert f"--records {root} --from {interrupted.name} --from {resumed.name}\n" in said, said
    whole = Invocation("p.yaml", (), str(root), None, apply=True)  # a whole run after a failed one: the same
    said = after_interrupt(resumed, whole)
    assert f"--from {interrupted.name} --from {resumed.name}\n" in said, said


def test_records_show_names_the_run_a_record_follows(tmp_path: Path, capsys: Any) -> None:
    """`continues` was only in record.json: `records show` did not say it (operator walkthrough, 6 Dec 2026)."""
    from runbook_lib.cli import main

    root = tmp_path / "records"
    first = _seal(root, 0, {"changes": [{"step": "image"}]})
    second = _seal(root, 1, {"continues": first.name})
    assert main(["records", "show", second.name, "--dir", str(root)]) == 0
    assert (
        f"\nfollows:  {first.name} (the cluster's earlier run that changed it)\n" in capsys.readouterr().out
    )
    assert main(["records", "show", first.name, "--dir", str(root)]) == 0
    assert "follows:" not in capsys.readouterr().out


def test_the_run_followed_is_found_reading_few_records(tmp_path: Path, monkeypatch: Any) -> None:
    """An hourly CI plan gate leaves hundreds of plan records (a 1,000-node record.json is about 1 MB): the
    newest record of the cluster that says which run it follows answers, and other clusters' are passed over
    by their names, unread."""
    root = tmp_path / "records"
    run = _seal(root, 0, {"changes": [{"step": "image"}]})
    for minute in range(1, 6):
        _seal(root, minute, {"outcome": "planned", "changes": [], "continues": run.name})
    _seal(root, 6, {"changes": [{"step": "image"}]}, cluster="other")
    read: list[str] = []
    real = records.load_record
    monkeypatch.setattr(records, "load_record", lambda path: read.append(path.name) or real(path))
    assert continues.continued_run(root, "sim-gpu") == run.name
    assert len(read) == 1 and "-sim-gpu-" in read[0], read
    _seal(root, 7, {"outcome": "planned", "changes": [], "continues": None})  # it followed none
    assert continues.continued_run(root, "sim-gpu") is None


def test_a_run_an_overlapping_plan_could_not_see_is_still_followed(tmp_path: Path) -> None:
    """A plan takes no lock: one that began while an --apply run was running recorded the run before that one,
    and the next run trusted it (review). A run sealed since the plan began is read."""
    root = tmp_path / "records"
    _seal(root, 0, {"changes": [{"step": "image"}], "outcome": "failed"})
    overlapped = _seal(root, 10, {"changes": [{"step": "image"}], "outcome": "failed"}, sealed_at=40)
    first = sorted(p.name for p in root.iterdir())[0]
    _seal(root, 15, {"outcome": "planned", "changes": [], "continues": first})
    assert continues.continued_run(root, "sim-gpu") == overlapped.name


def test_approvals_one_step_at_a_time_end_their_chain_with_the_cuda_test(tmp_path: Path) -> None:
    """A person approving config-patch, image, kubernetes and cuda-test in JupyterLab, one notebook after the
    other: each approval follows the one before, and the CUDA test's, which changes nothing (its pods are not
    changes), finishes the change. The chain went on past it: a run a month later followed the Kubernetes
    approval, and a rollback of the four together was refused for it (review, stop 53)."""
    root = tmp_path / "records"
    before: str | None = None
    for minute, step in enumerate(["config-patch", "image", "kubernetes"]):
        data = {"apply": True, "outcome": "changed", "changes": [{}], "steps_requested": [step]}
        before = _seal(root, minute, {**data, "continues": before}).name
        assert continues.continued_run(root, "sim-gpu") == before, step
    tested = {"apply": True, "outcome": "unchanged", "changes": [], "steps_requested": ["cuda-test"]}
    _seal(root, 5, {**tested, "continues": before})
    assert continues.continued_run(root, "sim-gpu") is None, "the CUDA test passed: the change is finished"
    _seal(root, 6, {**tested, "apply": False, "outcome": "planned", "continues": None})
    assert continues.continued_run(root, "sim-gpu") is None
    failed = {**tested, "outcome": "failed"}
    _seal(root, 7, {**failed, "continues": None})  # a later failed test finished nothing, changed nothing
    assert continues.continued_run(root, "sim-gpu") is None


NODES = [{"name": f"gpu-worker-{i}", "address": f"10.5.0.1{i}"} for i in (1, 2, 3)]


def _patched(addresses: str) -> dict[str, Any]:
    return {
        "step": "config-patch",
        "argv": ["talosctl", "-n", addresses, "patch", "mc", "--patch", "@p.yaml"],
    }


def _tested(minute: int, root: Path, passed: list[str], follows: str, **more: Any) -> Path:
    """An --apply record through the CUDA test, which passed on ``passed`` (as ``record_content.group_nodes``
    stores the step's nodes), following ``follows``; the first two GPU nodes in its parameters."""
    result = {"node_groups": [{"nodes": passed, "status": "ok"}]}
    data = {
        "apply": True,
        "outcome": "unchanged",
        "changes": [],
        "steps_requested": ["cuda-test"],
        "steps": [{"name": "cuda-test", "status": "ok", "result": result}],
        "params": {"nodes": NODES[:2]},
        "continues": follows,
    }
    return _seal(root, minute, {**data, **more})


def test_a_cuda_test_of_some_nodes_after_a_failed_run_does_not_end_its_chain(tmp_path: Path) -> None:
    """Reviews of stop 53 and of 29edd31: a run patched both nodes and failed on gpu-worker-2; a JupyterLab
    approval of the CUDA test with gpu-worker-1 picked (an approval records every node and applies the picked
    ones) passed, and ended the chain, so the resume that fixed gpu-worker-2 followed no run and its rollback knew
    nothing of the failed run's changes. A test that passed on every node the chain changed ends it."""
    root = tmp_path / "records"
    changed = {
        "params": {"nodes": NODES[:2]},
        "outcome": "failed",
        "changes": [_patched("10.5.0.11,10.5.0.12")],
    }
    failed = _seal(root, 0, changed)
    _tested(1, root, ["gpu-worker-1"], failed.name)
    assert continues.continued_run(root, "sim-gpu") == failed.name, "gpu-worker-2 was never tested"
    _tested(2, root, ["gpu-worker-1", "gpu-worker-2"], failed.name)
    assert continues.continued_run(root, "sim-gpu") is None, "every node passed: the change is finished"


def test_a_node_taken_out_of_the_parameters_does_not_keep_the_chain_open(tmp_path: Path) -> None:
    """Review of f44b2b1: R1 patched three nodes and failed; gpu-worker-3 was gone for good and taken out of
    `nodes:` (the runbook's own fix for a node that does not answer); R2 went through the CUDA test on the other
    two. Requiring gpu-worker-3's test kept the chain open for 20 runs, and a failed run's printed rollback took
    the nodes back to before R1. A node the runs changed that this run's parameters still list must pass."""
    root = tmp_path / "records"
    three = {
        "params": {"nodes": NODES},
        "outcome": "failed",
        "changes": [_patched("10.5.0.11,10.5.0.12,10.5.0.13")],
    }
    first = _seal(root, 0, three)
    upgraded = {"outcome": "changed", "changes": [_patched("10.5.0.12")]}
    resumed = _tested(1, root, ["gpu-worker-2"], first.name, **upgraded)
    assert continues.continued_run(root, "sim-gpu") == resumed.name, "gpu-worker-1 is listed and untested"
    _tested(2, root, ["gpu-worker-1", "gpu-worker-2"], resumed.name, **upgraded)
    assert continues.continued_run(root, "sim-gpu") is None
