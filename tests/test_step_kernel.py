"""``runbook run`` executes its step notebooks one after another in ONE Jupyter kernel (issue 16 point 5: six
kernel start-ups bounded the 8-node run's own time, benchmarks/README.md), and each step still behaves as if it
had its own: its own executed notebook in the record with execution counts from 1, no name of an earlier step's
notebook in its namespace, a warning the library gave in an earlier step shown again, its own result file.

The steps here are stand-in notebooks (``run(notebooks_dir=...)``) that report what their kernel looks like, so
the run needs no cluster: each writes the result file ``runbook run`` names in ``RUNBOOK_RESULT_FILE``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import nbformat
import pytest

from runbook_lib.model.params import load_params
from runbook_lib.notebook import records, runner
from runbook_lib.notebook.lock import LOCKS_ENV, Busy
from runbook_lib.notebook.steps import RESULT_FILE_ENV, STEPS
from runbook_lib.steps.context import SIM_STATE_ENV

REPO = Path(__file__).resolve().parents[1]
PARAMS = REPO / "params" / "simulated.yaml"
#: A module in the notebooks directory (the kernel's working directory) that warns from one code location.
HELPER = (
    "import warnings\n\n\ndef warn() -> None:\n"
    "    warnings.warn('the library warns here', UserWarning, stacklevel=1)\n"
)
PARAMETERS = "params_file = ''\napply = False\nnodes = []\noverrides = []"
REPORT = """\
import json, os, helper
helper.warn()
seen = sorted(name for name in globals() if not name.startswith('_'))
print(json.dumps({'pid': os.getpid(), 'names': seen, 'cwd': os.getcwd()}))
set_by_this_step = True
status = 'failed' if FAIL else 'ok'
with open(os.environ[ENV], 'w') as out:
    json.dump({'status': status, 'summary': status, 'journal': []}, out)
assert status == 'ok', 'this step fails'
"""


def _notebooks(tmp_path: Path, failing: str | None = None) -> Path:
    folder = tmp_path / "notebooks"
    folder.mkdir()
    (folder / "helper.py").write_text(HELPER)
    for step in STEPS[:3]:
        nb = nbformat.v4.new_notebook()  # type: ignore[no-untyped-call]
        parameters = nbformat.v4.new_code_cell(PARAMETERS)  # type: ignore[no-untyped-call]
        parameters.metadata["tags"] = ["parameters"]
        report = REPORT.replace("FAIL", repr(step.name == failing)).replace("ENV", repr(RESULT_FILE_ENV))
        nb.cells = [parameters, nbformat.v4.new_code_cell(report)]  # type: ignore[no-untyped-call]
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nbformat.write(nb, folder / step.notebook)  # type: ignore[no-untyped-call]
    return folder


def _run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str | None = None, *, html: bool = False
) -> runner.RunOutcome:
    monkeypatch.setenv(SIM_STATE_ENV, str(tmp_path / "no-sim"))  # no cluster: the version reads just fail
    return runner.run(
        PARAMS,
        steps=[s.name for s in STEPS[:3]],
        apply=False,
        records_root=tmp_path / "records",
        progress=False,
        notebooks_dir=_notebooks(tmp_path, failing),
        html=html,
    )


def _executed(record: Path, notebook: str) -> tuple[dict[str, Any], list[int | None], str]:
    """What the step's executed notebook in the record printed, its code cells' execution counts, its stderr."""
    notebook_node = nbformat.read(record / notebook, as_version=4)  # type: ignore[no-untyped-call]
    cells = [c for c in notebook_node.cells if c.cell_type == "code"]
    report = cells[-1]
    printed = "".join(o.get("text", "") for o in report.outputs if o.get("name") == "stdout")
    stderr = "".join(o.get("text", "") for o in report.outputs if o.get("name") == "stderr")
    return json.loads(printed), [c.execution_count for c in cells], stderr


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.slow
def test_the_steps_share_one_kernel_and_each_notebook_starts_as_in_a_fresh_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outcome = _run(tmp_path, monkeypatch, html=True)
    assert [(s.name, s.status) for s in outcome.steps] == [(s.name, "ok") for s in STEPS[:3]]
    for step in STEPS[:3]:  # the HTML copy of each step's own executed notebook
        assert (
            "set_by_this_step" in (outcome.record / "html" / f"{Path(step.notebook).stem}.html").read_text()
        )
    seen = [_executed(outcome.record, s.notebook) for s in STEPS[:3]]
    assert len({report["pid"] for report, _, _ in seen}) == 1, "one kernel runs every step notebook"
    first = seen[0][0]["names"]
    assert "set_by_this_step" not in first
    for report, counts, stderr in seen:
        assert report["names"] == first, "no name an earlier step's notebook set is defined"
        assert counts == list(range(1, len(counts) + 1)), "each executed notebook counts its cells from 1"
        assert "the library warns here" in stderr, "each step shows the library's warning"
        assert report["cwd"] == str(tmp_path / "notebooks")
    assert records.load_record(outcome.record)["outcome"] == "unchanged"
    assert not _alive(seen[0][0]["pid"]), "the run's kernel is stopped when the run ends"


@pytest.mark.slow
def test_a_failed_step_ends_the_run_and_its_kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    outcome = _run(tmp_path, monkeypatch, failing=STEPS[1].name)
    assert [(s.name, s.status) for s in outcome.steps] == [(STEPS[0].name, "ok"), (STEPS[1].name, "failed")]
    assert "this step fails" in str(outcome.steps[1].error)
    report, _, _ = _executed(outcome.record, STEPS[1].notebook)
    assert not (outcome.record / STEPS[2].notebook).exists()
    assert not _alive(report["pid"])


@pytest.mark.slow
def test_an_apply_run_is_sealed_before_it_releases_the_cluster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review of stop 53: ``runbook run --apply`` released its cluster lock and sealed after, so a JupyterLab
    approval or run that took the lock in between read this record as unsealed and followed the one before."""
    monkeypatch.setenv(SIM_STATE_ENV, str(tmp_path / "no-sim"))
    monkeypatch.setenv(LOCKS_ENV, str(tmp_path / "locks"))
    params = load_params(PARAMS)
    seen: list[bool] = []
    seal = records.seal

    def seal_and_look(path: Path, data: dict[str, Any], **kwargs: Any) -> str:
        try:
            with runner.cluster_lock(params):
                seen.append(False)  # the lock was free while this record was still unsealed
        except Busy:
            seen.append(True)
        return seal(path, data, **kwargs)

    monkeypatch.setattr(records, "seal", seal_and_look)
    outcome = runner.run(
        PARAMS,
        steps=[s.name for s in STEPS[:3]],
        apply=True,
        records_root=tmp_path / "records",
        progress=False,
        notebooks_dir=_notebooks(tmp_path),
        html=False,
    )
    assert records.load_record(outcome.record)["apply"] is True and seen == [True]
    with runner.cluster_lock(params):  # released once sealed
        pass
