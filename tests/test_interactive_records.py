"""Issue 17.1: what a person approves in JupyterLab is sealed into a change record, in the same chain.

The gate is driven as tests/test_gates.py drives it (no browser): the Approve button is clicked
programmatically.  The browser test (tests/ui, make test-ui) clicks the real button and checks the record.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nbformat
import pytest
import yaml

from runbook_lib.cli import main
from runbook_lib.clients.proc import Journal, JournalEntry
from runbook_lib.model.params import Params, load_params
from runbook_lib.notebook import records
from runbook_lib.notebook.gates import ApprovalGate, gated
from runbook_lib.notebook.interactive_record import InteractiveRecorder
from runbook_lib.notebook.lock import LOCKS_ENV, Busy
from runbook_lib.notebook.runner import cluster_lock
from runbook_lib.steps.results import NodeResult, StepResult

PARAMS = Path(__file__).resolve().parents[1] / "params" / "simulated.yaml"
NODES = ["gpu-worker-1", "gpu-worker-2", "gpu-worker-3"]
NOTEBOOK = "02-config-patch.interactive.ipynb"  # rebuilt from the cells the kernel ran
CELLS = ['# Parameters\nparams_file = "params/simulated.yaml"\n', 'run_step("config-patch")']


class Cluster:
    """A config-patch step on a dict: a plan per node, and an apply that journals one change per node."""

    def __init__(self, journal: Journal) -> None:
        self.state = dict.fromkeys(NODES, "old")
        self.journal = journal

    def _result(self, only: list[str] | None, applied: bool) -> StepResult:
        result = StepResult(step="config-patch", applied=applied)
        for name in only or NODES:
            node = NodeResult(name, f"10.5.0.{11 + NODES.index(name)}")
            node.status = "unchanged" if self.state[name] == "new" else ("changed" if applied else "planned")
            result.nodes.append(node)
        return result

    def plan(self, only: list[str] | None) -> StepResult:
        self.journal.add(JournalEntry("command", "talosctl get machineconfig", ("talosctl", "get", "mc")))
        return self._result(only, applied=False)

    def apply(self, only: list[str] | None, progress: Callable[[int, int], None]) -> StepResult:
        result = self._result(only, applied=True)
        for name in only or NODES:
            if self.state[name] == "old":
                argv = ("talosctl", "-n", name, "patch", "mc", "--patch", "@nvidia.yaml")
                self.journal.add(JournalEntry("command", "patch", argv, 0, changes_cluster=True, diff="+x"))
                self.state[name] = "new"
        progress(1, 1)
        return result


@pytest.fixture
def params() -> Params:
    return load_params(PARAMS)


@pytest.fixture(autouse=True)
def locks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cluster apply locks of these tests, apart from the machine's (``~/.cache``)."""
    monkeypatch.setenv(LOCKS_ENV, str(tmp_path / "locks"))


def recorder(params: Params, journal: Journal, root: Path) -> InteractiveRecorder:
    return InteractiveRecorder(
        "config-patch",
        "02-config-patch.ipynb",
        params,
        journal,
        params_file=str(PARAMS),
        root=root,
        history=lambda: list(CELLS),
    )


def approve(params: Params, root: Path, only: tuple[str, ...] = ()) -> tuple[ApprovalGate, Cluster]:
    journal = Journal()
    cluster = Cluster(journal)
    gate = ApprovalGate(
        "config-patch", cluster.plan, cluster.apply, nodes=NODES, recorder=recorder(params, journal, root)
    )
    gate.plan()
    if only:
        gate.picker.value = only
    gate.button.click()
    return gate, cluster


def test_an_approval_is_sealed_into_the_chain_with_its_changes(params: Params, tmp_path: Path) -> None:
    root = tmp_path / "records"
    gate, cluster = approve(params, root, only=("gpu-worker-2",))
    assert cluster.state["gpu-worker-2"] == "new"
    (path,) = records.sealed_records(root)
    assert re.fullmatch(r"\d{8}T\d{6}Z-sim-gpu-interactive-[0-9a-f]{8}", path.name)
    assert records.verify(root) == []
    data = records.load_record(path)
    assert data["outcome"] == "changed" and data["apply"] is True
    assert [c["argv"] for c in data["changes"]] == [
        ["talosctl", "-n", "gpu-worker-2", "patch", "mc", "--patch", "@nvidia.yaml"]
    ]
    assert data["steps"][0]["plan_shown"]["counts"] == {"planned": 1}
    notebook = nbformat.read(path / NOTEBOOK, as_version=4)
    nbformat.validate(notebook)
    assert [c.source for c in notebook.cells] == CELLS and notebook.cells[0].outputs == []
    assert "config-patch: applied" in notebook.cells[1].outputs[0].data["text/html"]
    assert (path / "html" / "02-config-patch.interactive.html").is_file()
    assert data["note"].startswith("approved interactively (JupyterLab Approve button): the kernel cannot")
    assert yaml.safe_load((path / "params.yaml").read_text())["cluster"] == params.cluster
    assert str(path) in gate.status.value  # the person sees where the record is


def test_the_approval_rendering_is_a_whole_html_page_that_declares_utf8(
    params: Params, tmp_path: Path
) -> None:
    """The record's html/ file is opened on its own in a browser: without a declared charset a browser may
    decode the rendering's arrows and dashes as windows-1252 (HTML Living Standard, "determining the
    character encoding": a fallback when nothing declares one)."""
    root = tmp_path / "records"
    approve(params, root, only=("gpu-worker-2",))
    (path,) = records.sealed_records(root)
    page = (path / "html" / "02-config-patch.interactive.html").read_text(encoding="utf-8")
    assert page.lower().startswith("<!doctype html>"), page[:80]
    assert '<meta charset="utf-8">' in page[:400], page[:400]
    assert (
        "<title>config-patch: applied</title>" in page and "config-patch: applied" in page.split("<body>")[1]
    )
    assert records.verify(root) == []


def test_plan_only_and_a_refused_approval_record_nothing(params: Params, tmp_path: Path) -> None:
    root = tmp_path / "records"
    journal = Journal()
    cluster = Cluster(journal)
    gate = ApprovalGate(
        "config-patch", cluster.plan, cluster.apply, nodes=NODES, recorder=recorder(params, journal, root)
    )
    gate.plan()  # the cell ran: a plan on screen, nothing applied
    assert records.sealed_records(root) == []
    cluster.state["gpu-worker-1"] = "new"  # the cluster moved: the click applies nothing
    gate.button.click()
    assert "nothing was applied" in gate.status.value
    assert records.sealed_records(root) == []


def test_apply_true_cell_records_only_when_it_changed_something(params: Params, tmp_path: Path) -> None:
    root = tmp_path / "records"
    journal = Journal()
    cluster = Cluster(journal)
    cluster.state = dict.fromkeys(NODES, "new")
    hook = recorder(params, journal, root)
    found = []
    for before in ("new", "old"):  # nothing to change, then one node to patch
        cluster.state["gpu-worker-3"] = before
        gated(
            "config-patch",
            cluster.plan,
            cluster.apply,
            apply=True,
            nodes=NODES,
            selected=None,
            show=False,
            recorder=hook,
        )
        found.append(len(records.sealed_records(root)))
    assert found == [0, 1]
    (path,) = records.sealed_records(root)
    assert records.load_record(path)["interactive"]["approved"] is False
    assert records.load_record(path)["note"].startswith("applied by a notebook cell run with apply true")
    assert len(records.load_record(path)["changes"]) == 1


def test_interactive_and_headless_records_share_one_chain_and_tampering_is_found(
    params: Params, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "records"
    headless = records.create_record_dir(root, params.cluster)
    records.seal(headless, {"cluster": params.cluster, "outcome": "planned", "steps": []})
    approve(params, root)
    chain = records.check(root)
    assert chain.problems == [] and chain.order[0] == headless and len(chain.order) == 2
    interactive = chain.order[1]
    assert main(["records", "show", interactive.name, "--dir", str(root)]) == 0
    shown = capsys.readouterr().out
    assert "changes to the cluster: 3" in shown and "[config-patch] talosctl -n gpu-worker-1 patch" in shown
    cells = interactive / NOTEBOOK
    cells.write_text(cells.read_text().replace("config-patch", "preflight"))
    assert main(["records", "verify", "--dir", str(root)]) != 0
    assert f"{interactive.name}: edited file {NOTEBOOK}" in capsys.readouterr().out


def test_two_people_approving_at_once_chain_in_one_order(tmp_path: Path) -> None:
    """Four people, four clusters, one records folder: four records in one chain, none forked."""
    root = tmp_path / "records"
    clusters = [load_params(PARAMS, ["target=cluster", f"cluster=lab-{n}"]) for n in range(4)]
    threads = [threading.Thread(target=approve, args=(params, root)) for params in clusters]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    chain = records.check(root)
    assert chain.problems == [] and len(chain.order) == 4 and chain.aborted == []


def test_a_kernel_killed_mid_apply_leaves_an_aborted_run(params: Params, tmp_path: Path) -> None:
    root = tmp_path / "records"
    journal = Journal()
    cluster = Cluster(journal)

    def killed(only: list[str] | None, progress: Callable[[int, int], None]) -> StepResult:
        raise KeyboardInterrupt  # the kernel was interrupted (or killed) while applying

    gate = ApprovalGate(
        "config-patch", cluster.plan, killed, nodes=NODES, recorder=recorder(params, journal, root)
    )
    gate.plan()
    with pytest.raises(KeyboardInterrupt):
        gate.approve()
    chain = records.check(root)
    assert chain.problems == [] and [p.name for p in chain.aborted] == [
        p.name for p in records.sealed_records(root)
    ]


@pytest.mark.slow
def test_approve_in_a_kernel_on_the_simulated_cluster_is_recorded_and_scrubbed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The notebook's own call (``run_step``) in an IPython shell, then a programmatic Approve click."""
    from IPython.core.interactiveshell import InteractiveShell

    from runbook_lib.cli.cmd_run import _simulated_cluster
    from runbook_lib.notebook import steps
    from runbook_lib.steps.context import SIM_STATE_ENV

    root = tmp_path / "records"
    monkeypatch.setenv(records.RECORDS_ENV, str(root))
    monkeypatch.delenv(steps.RESULT_FILE_ENV, raising=False)
    params = load_params(PARAMS)
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))  # its history database stays here
    shell = InteractiveShell.instance()
    try:
        with _simulated_cluster(params, str(tmp_path / "sim")) as env:
            monkeypatch.setenv(SIM_STATE_ENV, env[SIM_STATE_ENV])
            secret = records.secret_values(Path(env[SIM_STATE_ENV]) / "talosconfig")[0]
            shell.run_cell(f"key = {secret!r}  # a cell that printed the talosconfig key", store_history=True)
            cell = f"from runbook_lib.notebook.steps import run_step\nrun_step('config-patch', params_file={str(PARAMS)!r}, show=False)"
            assert shell.run_cell(cell, store_history=True).success
            assert records.sealed_records(root) == []  # the plan alone records nothing
            gate = steps.GATES["config-patch"]
            gate.picker.value = ("gpu-worker-2",)
            gate.button.click()
            assert gate.applied is not None and gate.applied.counts() == {"changed": 1}
    finally:
        InteractiveShell.clear_instance()
    (path,) = records.sealed_records(root)
    assert main(["records", "verify", "--dir", str(root)]) == 0
    assert main(["records", "show", "--dir", str(root)]) == 0
    shown = capsys.readouterr().out
    assert "changes to the cluster: 1" in shown and "10.5.0.12" in shown and "patch" in shown
    cells = json.loads((path / NOTEBOOK).read_text())["cells"]
    assert any("run_step('config-patch'" in c["source"] and c["outputs"] for c in cells)
    assert all(secret not in f.read_text() for f in path.rglob("*") if f.is_file())
    assert records.REDACTED in (path / NOTEBOOK).read_text()


def test_a_records_folder_that_cannot_hold_the_record_stops_the_apply(params: Params, tmp_path: Path) -> None:
    root = tmp_path / "records"
    root.write_text("not a folder")
    gate, cluster = approve(params, root)
    assert set(cluster.state.values()) == {"old"}  # nothing unrecorded reached the cluster
    assert f"the records folder {root} cannot hold a change record" in gate.status.value
    assert "RUNBOOK_RECORDS" in gate.status.value


def test_a_kernel_in_the_notebooks_folder_records_where_runbook_run_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """JupyterLab starts each kernel in its notebook's folder (``jupyter lab notebooks/``)."""
    from runbook_lib.notebook.interactive_record import default_root
    from runbook_lib.notebook.runner import NOTEBOOKS, REPO

    monkeypatch.delenv(records.RECORDS_ENV, raising=False)
    monkeypatch.chdir(NOTEBOOKS)
    assert default_root() == REPO / "records"
    monkeypatch.chdir(tmp_path)
    assert default_root() == tmp_path / "records"
    monkeypatch.setenv(records.RECORDS_ENV, str(tmp_path / "elsewhere"))
    monkeypatch.chdir(NOTEBOOKS)
    assert default_root() == tmp_path / "elsewhere"


def test_an_approval_waits_for_no_one_while_another_run_changes_the_cluster(
    params: Params, tmp_path: Path
) -> None:
    """F8 of the 1 Dec attack, for approvals: an ``--apply`` run (or another approval) holds the cluster."""
    root = tmp_path / "records"
    with cluster_lock(params):  # what `runbook run --apply` holds for its whole run
        gate, cluster = approve(params, root)
    assert set(cluster.state.values()) == {"old"} and gate.applied is None
    assert "is being changed by another run" in gate.status.value
    assert records.sealed_records(root) == []
    again, cluster = approve(params, root)  # once that run ended (the refused click left nothing held)
    assert again.applied is not None and set(cluster.state.values()) == {"new"}


KILLED_KERNEL = """
import sys, time
from pathlib import Path
from runbook_lib.clients.proc import Journal
from runbook_lib.model.params import load_params
from runbook_lib.notebook.gates import ApprovalGate
from tests.test_interactive_records import NODES, PARAMS, Cluster, recorder

journal = Journal()
cluster = Cluster(journal)

def apply(only, progress):
    cluster.apply(["gpu-worker-1"], progress)  # the first node's patch reached the cluster
    argv = ("talosctl", "-n", "gpu-worker-2", "patch", "mc", "--patch", "@nvidia.yaml")
    with journal.pending("command", "talosctl -n gpu-worker-2 patch", argv):  # as Runner.run marks a change
        print("in flight", flush=True)
        time.sleep(600)  # killed here

gate = ApprovalGate("config-patch", cluster.plan, apply, nodes=NODES,
                    recorder=recorder(load_params(PARAMS), journal, Path(sys.argv[1])))
gate.plan()
gate.approve()
"""


def test_a_kernel_killed_mid_change_leaves_a_journal_that_seal_aborted_seals(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """SIGKILL (what a dead kernel gets) while the second node's patch is in flight: the record directory
    must hold the journal as it was written, so ``runbook records seal-aborted`` lists the change that reached
    the cluster and the one in flight, as it does for ``runbook run`` (runner: results/<step>.journal.jsonl)."""
    import select
    import sys

    from runbook_lib.notebook.interrupts import IN_FLIGHT

    root = tmp_path / "records"
    kernel = subprocess.Popen(
        [sys.executable, "-c", KILLED_KERNEL, str(root)],
        cwd=Path(__file__).resolve().parents[1],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert kernel.stdout is not None
        ready, _w, _x = select.select([kernel.stdout], [], [], 180)  # generous: a loaded CI machine
        assert ready, "the approval did not reach its second change within 180 s"
        assert kernel.stdout.readline().strip() == "in flight"
    finally:
        kernel.kill()  # SIGKILL: no finally block, no end marker, no seal
        kernel.wait(timeout=60)
    (path,) = [p for p in root.iterdir() if p.is_dir()]
    assert [p.name for p in records.check(root).aborted] == [path.name]
    assert main(["records", "seal-aborted", path.name, "--dir", str(root)]) == 0
    assert main(["records", "verify", "--dir", str(root)]) == 0
    capsys.readouterr()
    data = records.load_record(path)
    # the parameters' cluster, not "sim-gpu-interactive" from the folder's name: a rollback of it was refused
    # as another cluster's record (review, stop 53)
    assert data["cluster"] == "sim-gpu"
    assert [(s["name"], s["status"]) for s in data["steps"]] == [("config-patch", "aborted")]
    assert "2 change(s) from its journal (1 in flight: it may or may not" in data["steps"][0]["summary"]
    changes = {(c["argv"][2], c.get("interrupt")) for c in data["changes"]}
    assert changes == {("gpu-worker-1", None), ("gpu-worker-2", IN_FLIGHT)}
    page = (path / "index.html").read_text(encoding="utf-8")
    assert 'href="02-config-patch.interactive.ipynb"' in page  # the cells the kernel ran before it died


def test_a_failed_approval_shows_its_error_as_text(params: Params, tmp_path: Path) -> None:
    """The error is tool output (``CommandResult.check`` quotes stderr), and Go prints a nil value as ``<nil>``
    (golang/go src/fmt/print.go, ``nilAngleString``): in the status line, and in the record's static rendering
    of it, such text must be shown, not taken for a tag and dropped."""
    from runbook_lib.errors import PermanentError

    stderr = "error applying patch: rpc error: code = Unknown desc = <nil>"
    journal = Journal()
    cluster = Cluster(journal)

    def failing(only: list[str] | None, progress: Callable[[int, int], None]) -> StepResult:
        raise PermanentError(f"talosctl patch failed (exit 1): talosctl -n 10.5.0.12 patch mc\n{stderr}")

    gate = ApprovalGate(
        "config-patch", cluster.plan, failing, nodes=NODES, recorder=recorder(params, journal, tmp_path / "r")
    )
    gate.plan()
    gate.button.click()
    assert "desc = &lt;nil&gt;" in gate.status.value and "<nil>" not in gate.status.value


@pytest.mark.slow
def test_a_notebook_that_names_its_nodes_by_address_shows_its_gate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The notebooks' parameters cell says ``nodes`` takes names or addresses; an address reached the gate's node
    picker, whose options are names, and the cell failed with ``TraitError: Invalid selection: value not found``
    before any plan was shown (notebook audit, 7 Dec 2026). The picker shows the node's name; Approve applies
    there only."""
    from IPython.core.interactiveshell import InteractiveShell

    from runbook_lib.cli.cmd_run import _simulated_cluster
    from runbook_lib.notebook import steps
    from runbook_lib.steps.context import SIM_STATE_ENV

    monkeypatch.setenv(records.RECORDS_ENV, str(tmp_path / "records"))
    monkeypatch.delenv(steps.RESULT_FILE_ENV, raising=False)
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    shell = InteractiveShell.instance()
    try:
        with _simulated_cluster(load_params(PARAMS), str(tmp_path / "sim")) as env:
            monkeypatch.setenv(SIM_STATE_ENV, env[SIM_STATE_ENV])
            cell = (
                "from runbook_lib.notebook.steps import run_step\n"
                f"run_step('config-patch', params_file={str(PARAMS)!r}, nodes=['10.5.0.12'], show=False)"
            )
            ran = shell.run_cell(cell, store_history=True)
            assert ran.success, ran.error_in_exec
            gate = steps.GATES["config-patch"]
            assert gate.picker.value == ("gpu-worker-2",)
            gate.button.click()
            assert gate.applied is not None and gate.applied.counts() == {"changed": 1}
            assert [n.node for n in gate.applied.nodes] == ["gpu-worker-2"]
    finally:
        InteractiveShell.clear_instance()


def test_an_approval_that_goes_on_from_an_interrupted_run_keeps_its_rollback_whole(
    params: Params, tmp_path: Path
) -> None:
    """An ``--apply`` run interrupted in its image step, then finished by Approve clicks in JupyterLab: the
    approval's record said nothing of the run it went on from, so a rollback of the interrupted run alone (the
    command its report printed) went ahead and left what the approval changed (stop 52's open item). It records
    ``continues`` as ``runbook run`` does, and that rollback is refused naming the approval."""
    from runbook_lib.errors import PermanentError
    from runbook_lib.model.params import validate
    from runbook_lib.notebook import rollback_records

    root = tmp_path / "records"
    interrupted = records.create_record_dir(root, params.cluster)
    change = {"step": "image", "argv": ["talosctl", "-n", "10.5.0.11", "upgrade"], "exit_code": 0}
    records.seal(
        interrupted,
        {"cluster": params.cluster, "outcome": "interrupted", "steps": [], "changes": [change]},
    )
    approve(params, root, only=("gpu-worker-2",))
    approval = max(records.sealed_records(root), key=lambda p: p.name)
    assert approval.name.startswith(interrupted.name[:8]) and "-interactive-" in approval.name
    assert records.load_record(approval)["continues"] == interrupted.name
    data = yaml.safe_load(PARAMS.read_text())
    alone = validate(data | {"rollback": {"records": [interrupted.name]}}, source="test")
    with pytest.raises(PermanentError) as refused:
        rollback_records.load_evidence(alone, root)
    assert approval.name in refused.value.message
    assert refused.value.hint == f"roll them back together: add --from {approval.name} to this rollback"
    together = validate(data | {"rollback": {"records": [interrupted.name, approval.name]}}, source="test")
    evidence = rollback_records.load_evidence(together, root)  # named together: not refused
    assert evidence.records == [interrupted.name, approval.name]


def test_an_approval_killed_mid_change_still_names_the_run_it_went_on_from(
    params: Params, tmp_path: Path
) -> None:
    """A kernel killed while its approval upgrades nodes: ``records seal-aborted`` sealed it without the run it
    went on from, so a rollback of that interrupted run alone went ahead and left what the approval had changed
    (review, stop 53). The approval's folder holds it from the start, and the aborted record carries it."""
    from runbook_lib.errors import PermanentError
    from runbook_lib.model.params import validate
    from runbook_lib.notebook import rollback_records

    root = tmp_path / "records"
    interrupted = records.create_record_dir(root, params.cluster)
    change = {"step": "image", "argv": ["talosctl", "-n", "10.5.0.11", "upgrade"], "exit_code": 0}
    records.seal(
        interrupted, {"cluster": params.cluster, "outcome": "interrupted", "steps": [], "changes": [change]}
    )
    journal = Journal()
    killed = recorder(params, journal, root)
    path = killed.started()
    argv = ("talosctl", "-n", "10.5.0.12", "patch", "mc", "--patch", "@nvidia.yaml")
    journal.add(JournalEntry("command", "patch", argv, 0, changes_cluster=True, diff="+x"))
    killed.journal.sink_to(None)  # the kernel dies here: no finished(), no seal
    assert main(["records", "seal-aborted", path.name, "--dir", str(root)]) == 0
    data = records.load_record(path)
    assert data["outcome"] == "aborted" and data["continues"] == interrupted.name
    assert [c["argv"][2] for c in data["changes"]] == ["10.5.0.12"]
    alone = validate(
        yaml.safe_load(PARAMS.read_text()) | {"rollback": {"records": [interrupted.name]}}, source="test"
    )
    with pytest.raises(PermanentError) as refused:
        rollback_records.load_evidence(alone, root)
    assert path.name in refused.value.message


def test_an_approval_is_sealed_before_it_releases_the_cluster(
    params: Params, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review of stop 53: the approval released the cluster lock and sealed after, so a run or approval that
    took the lock in between read this record as unsealed and followed the one before it (``continues``)."""
    seen: list[bool] = []
    seal = records.seal

    def seal_and_look(path: Path, data: dict[str, object], **kwargs: Any) -> str:
        try:
            with cluster_lock(params):
                seen.append(False)  # the lock was free while this record was still unsealed
        except Busy:
            seen.append(True)
        return seal(path, data, **kwargs)

    monkeypatch.setattr(records, "seal", seal_and_look)
    gate, _ = approve(params, tmp_path / "records")
    assert gate.applied is not None and seen == [True]
    with cluster_lock(params):  # released once sealed
        pass
