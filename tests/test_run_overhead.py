"""The fixed costs of ``runbook run`` stay out of the places every run pays them (issue 8, the 8-node run).

The run's one kernel imports the step code, and ``runbook run`` itself starts a Python process: an import
added to either is paid by every run.  These tests pin
what must stay lazy, and that work moved to worker threads still finishes, or fails, before the seal.
"""

from __future__ import annotations

import contextlib
import gc
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from runbook_lib.clients.kube import Kube
from runbook_lib.notebook import runner
from runbook_lib.notebook.steps import STEPS, StepSpec

HEAVY = ("kubernetes", "nbconvert", "IPython", "ipywidgets")


def _loaded_after(statement: str) -> dict[str, bool]:
    code = f"import json, sys\n{statement}\nprint(json.dumps({{m: m in sys.modules for m in {HEAVY!r}}}))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    loaded: dict[str, bool] = json.loads(out.stdout)
    return loaded


def test_the_cli_starts_without_the_kubernetes_client_nbconvert_or_ipython():
    assert _loaded_after("import runbook_lib.cli") == dict.fromkeys(HEAVY, False)


def test_a_kernel_imports_no_kubernetes_client_or_widgets_for_the_step_code():
    loaded = _loaded_after(
        "import runbook_lib.notebook.steps, runbook_lib.steps.verify, runbook_lib.steps.patch"
    )
    assert not loaded["kubernetes"] and not loaded["ipywidgets"]


def test_kube_builds_only_the_api_groups_it_calls():
    kube = Kube(client.ApiClient())
    assert not {"core", "apps", "node_api", "version_api", "custom"} & set(vars(kube))
    assert kube.version_api is kube.version_api  # built once, on first use
    assert not {"core", "apps", "node_api", "custom"} & set(vars(kube))


def test_background_work_is_finished_by_wait_and_a_failure_is_raised_once(tmp_path: Path):
    background = runner._Background()
    done: list[str] = []
    background.stop_kernel(lambda: done.append("kernel"))

    def broken() -> None:
        raise OSError("disk full")

    background.stop_kernel(broken)
    with pytest.raises(OSError, match="disk full"):
        background.wait()
    assert done == ["kernel"]
    background.wait()  # the runner calls it again on the way out: nothing left, nothing raised


def test_an_early_read_that_failed_is_read_again(tmp_path: Path):
    background = runner._Background()

    def failing() -> dict[str, str] | None:
        raise RuntimeError("no helm")

    job = background.early(failing)
    assert background.result_or_none(job) is None
    assert background.result_or_none(background.early(lambda: {"helm": "v3"})) == {"helm": "v3"}
    background.wait()


@pytest.mark.parametrize("step", STEPS, ids=[s.name for s in STEPS])
def test_kernel_warm_up_imports_the_step_code_and_leaves_no_names(step: StepSpec) -> None:
    """The run's kernel runs this before its first notebook: the notebook must find its namespace untouched."""
    namespace: dict[str, object] = {}
    try:
        exec(runner.warm_code([step]), namespace)  # the code the runner sends to a kernel
    finally:
        gc.unfreeze()  # the warm-up freezes what the kernel imported (see warm_code): not this process's
    assert set(namespace) == {"__builtins__"}
    assert f"runbook_lib.steps.{step.module}" in sys.modules
    for api in step.kubernetes_apis:  # the classes the step calls are the ones built ahead
        assert api in runner.warm_code([step]) and getattr(client, api).__module__ in sys.modules


def test_the_runs_kernel_warms_the_code_of_every_step_it_will_run() -> None:
    code = runner.warm_code(STEPS)
    for step in STEPS:
        assert f"runbook_lib.steps.{step.module}" in code
        assert all(code.count(repr(api)) == 1 for api in step.kubernetes_apis)  # each class built once


@pytest.mark.slow
def test_first_cell_output_is_kept_with_the_quick_ready_client(tmp_path: Path) -> None:
    """ReadyClient skips jupyter_client's 0.2 s IOPub flush: the first cell's output must still be captured."""
    import nbformat
    import papermill

    source = tmp_path / "first.ipynb"
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("print('first output')"),
        nbformat.v4.new_code_cell("print('second')"),
    ]
    nbformat.write(nb, source)
    for attempt in range(3):
        kernel = runner._new_kernel()
        try:
            assert isinstance(kernel.km.client(), runner.ReadyClient)
            kernel.km.start_kernel(extra_arguments=["--HistoryManager.hist_file=:memory:"])
            out = tmp_path / f"out{attempt}.ipynb"
            papermill.execute_notebook(
                str(source), str(out), kernel_name=runner.KERNEL, progress_bar=False, km=kernel.km
            )
        finally:
            kernel.stop()
        cells = nbformat.read(out, as_version=4).cells
        assert [o.get("text") for o in cells[0].outputs] == ["first output\n"]
        assert [o.get("text") for o in cells[1].outputs] == ["second\n"]


def test_the_runner_imports_papermill_without_building_jsonschemas_iri_grammars() -> None:
    """papermill -> nbformat -> jsonschema imports ``rfc3987_syntax`` when it is installed (jsonschema 4.26.0
    ``_format.py``: ``with suppress(ImportError): from rfc3987_syntax import is_valid_syntax`` registers the
    ``iri`` format checks), and that module compiles 38 lark grammars at import: 1-8 s of the runbook process's
    CPU per run on this 2-core machine (cProfile of an 8-node ``runbook run``: 20 of 60 s), while the first
    kernel starts.  nbformat validates notebooks without a FormatChecker, so the ``iri`` checks are never used
    by the runner: it must not pay for them, and papermill must still work."""
    code = (
        "import sys\nfrom runbook_lib.notebook import runner\nrunner.import_before_threads()\nimport papermill, nbformat\n"
        "print(sys.modules.get('rfc3987_syntax') is not None, 'lark' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert out.stdout.split() == ["False", "False"]


def _cuda_outcome(status: str, journal: list[dict[str, object]]) -> runner.StepOutcome:
    return runner.StepOutcome("cuda-test", "06-cuda-test.ipynb", status, journal=journal)


def test_the_runner_looks_for_left_test_pods_only_when_the_step_may_have_left_some() -> None:
    """After cuda-test the runner lists the run's test pods through the Kubernetes client and deletes what is left
    (attack F5/F6: a Ctrl-C or a dead kernel).  That list cost the runbook process the CoreV1Api import and a
    client per run (9.5 s of 64 in a cProfile of an 8-node run at load 25), also after a step that ended ``ok``
    having deleted every pod it created, as its journal shows (entries as an 8-node run journaled them)."""
    pods = ["default/cuda-smi-gpu-0000-cbd7d091", "default/cuda-vectoradd-gpu-0000-cbd7d091"]
    created = [{"kind": "api", "summary": f"create Pod {p}"} for p in pods]
    deleted = [{"kind": "api", "summary": f"delete Pod {p}"} for p in pods]
    assert not runner.test_pods_may_be_left(_cuda_outcome("ok", created + deleted))
    assert runner.test_pods_may_be_left(_cuda_outcome("ok", created + deleted[:1]))
    for status in ("failed", "interrupted"):
        assert runner.test_pods_may_be_left(_cuda_outcome(status, created + deleted))


def _executed_notebook(path: Path) -> None:
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("print('ok')")]
    nbformat.write(nb, path)


@pytest.mark.slow
def test_the_html_copies_are_made_by_a_process_of_their_own_and_its_failure_stops_the_seal(
    tmp_path: Path,
) -> None:
    """nbconvert's import cost the runbook process 1.5-5 s before the first step (it had to be on the main
    thread, F1); the copies are now made by ``html_worker`` in its own process.  A copy it cannot write must
    still keep the record from being sealed, with the reason."""
    good, bad = tmp_path / "good", tmp_path / "bad"
    for record in (good, bad):
        record.mkdir()
        _executed_notebook(record / "01-preflight.ipynb")
    (good / "html").mkdir()  # the runner makes it; "bad" lacks it, so its copy cannot be written
    background = runner._Background()
    background.export_html(good, "01-preflight.ipynb")
    background.export_html(good, "02-config-patch.ipynb")  # a step that never ran: no copy, no failure
    background.wait()
    assert "ok" in (good / "html" / "01-preflight.html").read_text()
    assert not (good / "html" / "02-config-patch.html").exists()
    background = runner._Background()
    background.export_html(bad, "01-preflight.ipynb")
    with pytest.raises(RuntimeError, match=r"HTML copies were not written \(exit 1\).*01-preflight.html"):
        background.wait()


#: A stand-in step notebook (``run(notebooks_dir=...)``): it writes what its kernel's environment holds into the
#: result file ``runbook run`` names, so the run needs no cluster.
_ENV_REPORT = """\
import json, os
with open(os.environ['RUNBOOK_RESULT_FILE'], 'w') as out:
    seen = {k: os.environ.get(k) for k in ('RUNBOOK_TEST_CLUSTER', 'RUNBOOK_RUN_ID')}
    json.dump({'status': 'ok', 'summary': json.dumps(seen), 'journal': []}, out)
"""


def _kernel_children() -> set[int]:
    """The Jupyter kernels this test process started (children only: never another worker's)."""
    import psutil

    return {
        child.pid
        for child in psutil.Process().children(recursive=True)
        if "ipykernel_launcher" in " ".join(child.cmdline())
    }


@pytest.mark.slow
def test_the_runs_kernel_starts_while_the_cluster_comes_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``runbook run`` that brings the simulator up waits seconds for it (its Talos nodes and the real Kubernetes
    control plane), and the kernel's start and warm-up (~1.5 s of CPU on 2 cores, 4-13 s at load 15-20: the largest
    part of the 8-node run's own time, benchmarks/bench_small_run.py) waited until it was up.  The kernel now starts
    first; the first step still sees the cluster's environment and the run id in its kernel."""
    import nbformat

    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    nb = nbformat.v4.new_notebook()  # type: ignore[no-untyped-call]
    parameters = nbformat.v4.new_code_cell("params_file = ''\napply = False\nnodes = []\noverrides = []")  # type: ignore[no-untyped-call]
    parameters.metadata["tags"] = ["parameters"]
    nb.cells = [parameters, nbformat.v4.new_code_cell(_ENV_REPORT)]  # type: ignore[no-untyped-call]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, notebooks / STEPS[0].notebook)  # type: ignore[no-untyped-call]
    before = _kernel_children()

    @contextlib.contextmanager
    def cluster(_params: object) -> Iterator[dict[str, str]]:
        deadline = time.monotonic() + 120  # generous: the kernel's start under the suite's load
        while not _kernel_children() - before:  # the cluster comes up only once the run's kernel is starting
            assert time.monotonic() < deadline, "the run started no kernel while its cluster came up"
            time.sleep(0.05)
        yield {"RUNBOOK_TEST_CLUSTER": "up"}

    monkeypatch.setenv(
        "RUNBOOK_SIM_STATE", str(tmp_path / "no-sim")
    )  # no cluster: the version reads just fail
    outcome = runner.run(
        Path(__file__).resolve().parents[1] / "params" / "simulated.yaml",
        steps=[STEPS[0].name],
        apply=False,
        records_root=tmp_path / "records",
        cluster=cluster,
        progress=False,
        notebooks_dir=notebooks,
        html=False,
    )
    run_id = outcome.record.name.rsplit("-", 1)[-1]
    assert json.loads(outcome.steps[0].summary) == {"RUNBOOK_TEST_CLUSTER": "up", "RUNBOOK_RUN_ID": run_id}


#: ``python -m runbook_lib.notebook.html_worker`` with an exit handler that says whether Python's clean-up at exit ran
_HTML_WORKER = (
    "import atexit, sys\n"
    "atexit.register(lambda: print('clean-up at exit ran', file=sys.stderr))\n"
    "from runbook_lib.notebook import html_worker\n"
    "sys.exit(html_worker.main())\n"
)


@pytest.mark.slow
def test_the_html_process_ends_once_its_copies_are_written_without_pythons_clean_up(tmp_path: Path) -> None:
    """The runner waits for the HTML process to exit before it seals the record, at the end of every run.  Python's
    clean-up at exit of a process that imported nbconvert took 0.3 s of CPU (1.0-3.8 s of wall time at load 20,
    measured on 2 Dec), all of it in the run's wall time; the process now ends as soon as its last copy is written,
    its output flushed.  Its copies, its failure message and its exit code stay as they were."""
    good, bad = tmp_path / "good", tmp_path / "bad"
    for record in (good, bad):
        record.mkdir()
        _executed_notebook(record / "01-preflight.ipynb")
    (good / "html").mkdir()  # "bad" lacks it: its copy cannot be written

    def worker(record: Path) -> subprocess.CompletedProcess[str]:
        line = f"{record}\t01-preflight.ipynb\n"
        argv = [sys.executable, "-c", _HTML_WORKER]
        return subprocess.run(argv, input=line, capture_output=True, text=True, timeout=600, check=False)

    done = worker(good)
    assert done.returncode == 0 and "clean-up at exit ran" not in done.stderr, done.stderr
    assert "ok" in (good / "html" / "01-preflight.html").read_text()
    failed = worker(bad)
    assert failed.returncode == 1 and "clean-up at exit ran" not in failed.stderr
    assert "runbook html copies: FileNotFoundError" in failed.stderr and "01-preflight.html" in failed.stderr
