"""The notebooks: stored clean, documented parameters, and executed headless against the simulated cluster
through `runbook run` (healthy, fault scenarios, plan-only default, resume), with a verifiable record."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import nbformat
import pytest

from runbook_lib.cli import main
from runbook_lib.notebook import records
from runbook_lib.notebook.steps import NOTEBOOK_PARAMETERS, ROLLBACK, STEPS, StepSpec
from tests.fault_cases import CASES
from tests.realplane import use_real_plane

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = REPO / "notebooks"
PARAMS = str(REPO / "params" / "simulated.yaml")
ALL = sorted(NOTEBOOKS.glob("*.ipynb"))


@pytest.mark.parametrize("path", ALL, ids=lambda p: p.name)
def test_notebook_is_stored_without_outputs(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert cell.outputs == [], f"{path.name} cell {index} has outputs: clear them before committing"
            assert cell.execution_count is None, f"{path.name} cell {index} has an execution count"
    assert "widgets" not in nb.metadata and "papermill" not in nb.metadata


def test_every_step_has_its_notebook_in_order() -> None:
    names = [p.name for p in ALL]
    assert names[0] == "00-overview.ipynb"
    assert names[1:] == [s.notebook for s in (*STEPS, ROLLBACK)]  # the rollback last: not a runbook step
    overview = nbformat.read(NOTEBOOKS / "00-overview.ipynb", as_version=4)
    text = "".join(c.source for c in overview.cells if c.cell_type == "markdown")
    assert all(f"({s.notebook})" in text for s in (*STEPS, ROLLBACK))
    rollback = nbformat.read(NOTEBOOKS / ROLLBACK.notebook, as_version=4)
    assert rollback.cells[0].source.startswith(f"# {len(STEPS) + 1} · {ROLLBACK.title}\n")


def test_the_modules_patch_comes_before_the_image_upgrade() -> None:
    """Upgrading first boots the kmod extension, which blacklists the NVIDIA modules
    (extensions@v1.12.0:nvidia-gpu/nvidia-modules/lts/files/nvidia.conf), with no config that loads them:
    ``ext-nvidia-persistenced`` waits for ``/sys/bus/pci/drivers/nvidia`` and the boot rolls back after
    ``BootTimeout`` = 70 min (talos@v1.12.0 v1alpha1_sequencer_tasks.go:419-490, constants.go:956;
    siderolabs/extensions#888, siderolabs/talos#9149).  The v1.3-v1.5 docs also patch first."""
    names = [s.name for s in STEPS]
    assert names.index("config-patch") < names.index("image")
    assert [s.notebook for s in STEPS][:4] == [
        "01-preflight.ipynb",
        "02-config-patch.ipynb",
        "03-image.ipynb",
        "04-verify.ipynb",
    ]
    for index, step in enumerate(STEPS, start=1):
        nb = nbformat.read(NOTEBOOKS / step.notebook, as_version=4)
        assert nb.cells[0].source.startswith(f"# {index} · {step.title}\n"), step.notebook
        if index < len(STEPS):
            following = STEPS[index]
            assert f"[{index + 1} · {following.title}]({following.notebook})" in nb.cells[-1].source


@pytest.mark.parametrize("step", (*STEPS, ROLLBACK), ids=lambda s: s.name)
def test_parameters_cell_is_typed_and_documented(step: StepSpec) -> None:
    import papermill

    path = NOTEBOOKS / step.notebook
    found = papermill.inspect_notebook(str(path))
    assert list(found) == list(NOTEBOOK_PARAMETERS)
    for name, info in found.items():
        assert info["inferred_type_name"] not in ("None", ""), name
        assert len(info["help"]) > 20, f"{name} needs a help comment"
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code[0].metadata.get("tags") == ["parameters"]
    assert len(code) == 2 and code[1].source.count("run_step(") == 1  # one library call per step
    prose = " ".join(c.source for c in nb.cells if c.cell_type == "markdown")
    assert "Why" in prose and "When it fails" in prose


# ---------------------------------------------------------------------------------------------------------
# Executed headless against the simulated cluster


@pytest.fixture
def sim_env(tmp_path: Path) -> dict[str, Path]:
    return {"records": tmp_path / "records", "state": tmp_path / "sim"}


def run(env: dict[str, Path], *args: str) -> int:
    return main(
        ["run", "--records", str(env["records"]), "--state", str(env["state"]), "--no-progress", *args]
    )


def latest(env: dict[str, Path]) -> dict[str, Any]:
    return records.load_record(records.resolve(env["records"], None))


def assert_no_secrets(env: dict[str, Path], printed: str = "") -> None:
    """No secret of the kubeconfig or talosconfig in any record file, nor in what the run ``printed``."""
    secrets = records.secret_values(env["state"] / "kubeconfig", env["state"] / "talosconfig")
    kube = (env["state"] / "kubeconfig").read_text()
    token = next(line.split("token:", 1)[1].strip() for line in kube.splitlines() if "token:" in line)
    assert token in secrets and len(secrets) >= 4
    assert not [s for s in secrets if s in printed], "the run printed secret material"
    for file in env["records"].rglob("*"):
        if file.is_file():
            text = file.read_text(errors="replace")
            leaked = [s[:6] + "…" for s in secrets if s in text]
            assert not leaked, f"{file} contains secret material {leaked}"


def kernel_children() -> list[int]:
    """Kernels this test process (``runbook run`` in-process) still has running."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (stat.parent / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == os.getpid() and b"ipykernel" in cmdline:
            found.append(int(stat.parent.name))
    return found


def code_execution_counts(notebook: Path) -> list[int | None]:
    nb = nbformat.read(notebook, as_version=4)
    return [c.get("execution_count") for c in nb.cells if c.cell_type == "code"]


@pytest.mark.slow
def test_healthy_cluster_end_to_end_then_a_second_run_changes_nothing(
    sim_env: dict[str, Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole runbook on the real Kubernetes control plane (issue 15: kube-apiserver, kwok's kubelets, the
    real helm), as ``runbook run`` brings it up where ``make kube-tools`` built it; skipped, saying so, where not.
    No secret of its kubeconfig or talosconfig reaches a record or the run's output."""
    use_real_plane(monkeypatch)
    assert run(sim_env, "-p", PARAMS, "--apply") == 0
    first = latest(sim_env)
    assert first["outcome"] == "changed" and first["failed_step"] is None
    assert [s["name"] for s in first["steps"]] == [s.name for s in STEPS]
    assert all(s["status"] in ("ok", "changed") for s in first["steps"])
    changed_by = {c["step"] for c in first["changes"]}
    assert {"image", "config-patch", "kubernetes"} <= changed_by
    upgrade = next(c for c in first["changes"] if "upgrade" in c.get("argv", []))
    assert upgrade["exit_code"] == 0 and any(a == "--image" for a in upgrade["argv"])
    assert first["verification"]["verify"]["status"] == "ok"
    assert first["verification"]["cuda-test"]["status"] == "ok"
    assert first["who"]["user"] and first["runbook"].get("commit") is not None
    assert first["params"]["kubeconfig"] is None and first["versions"]["talosctl"]
    record_dir = records.resolve(sim_env["records"], None)
    # what it follows is in its folder from the start, for seal-aborted should the run be killed (stop 53)
    assert json.loads((record_dir / records.CONTINUES_FILE).read_text()) == {"continues": None}
    for step in STEPS:
        assert (record_dir / step.notebook).exists() and (
            record_dir / "html" / f"{Path(step.notebook).stem}.html"
        ).exists()
        # kernels are started and warmed ahead of their step: the warm-up leaves no trace in the notebook
        counts = code_execution_counts(record_dir / step.notebook)
        assert counts == list(range(1, len(counts) + 1)), (step.notebook, counts)
    assert kernel_children() == []

    assert run(sim_env, "-p", PARAMS, "--apply") == 0
    second = latest(sim_env)
    assert second["previous"]["record"] == first["record"]
    assert first["continues"] is None and second["continues"] is None, (
        "the first finished its change (cuda-test)"
    )
    steps = {s["name"]: s for s in second["steps"]}
    assert steps["image"]["status"] == "ok" and steps["config-patch"]["status"] == "ok"
    assert second["changes"] == [] and second["outcome"] == "unchanged"
    assert "nothing changed on the cluster" in second["note"]
    assert run(sim_env, "--from", "verify") == 0  # resumes with the parameters of the latest record
    resumed = latest(sim_env)
    assert [s["name"] for s in resumed["steps"]] == ["verify", "kubernetes", "cuda-test"]
    assert resumed["params"] == {**second["params"], "apply": False}  # never the approval (F3)
    assert resumed["changes"] == []
    assert resumed["continues"] is None, "read from `second`, which says it follows none"
    assert main(["records", "verify", "--dir", str(sim_env["records"])]) == 0
    printed = capsys.readouterr()
    # the real control plane's kubeconfig (simkube's bearer token): F2 of the attack of 2026-12-01 put a
    # kubeconfig token in an executed notebook; nothing of it in the records nor on stdout/stderr
    assert_no_secrets(sim_env, printed.out + printed.err)


@pytest.mark.slow
def test_default_run_only_plans_and_changes_nothing(
    sim_env: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """One plan shows the whole change: the config diff, the installer each node goes to, the Kubernetes objects
    and the chart with its values. Verify and the CUDA test, which check applied changes, wait. Found by an
    operator walkthrough: the plan stopped after config-patch and never showed the image or the chart."""
    assert run(sim_env, "-p", PARAMS) == 0
    plan = latest(sim_env)
    assert plan["apply"] is False and plan["outcome"] == "planned" and plan["changes"] == []
    statuses = {s["name"]: s["status"] for s in plan["steps"]}
    assert statuses == {
        "preflight": "ok",
        "config-patch": "planned",
        "image": "planned",
        "verify": "skipped",
        "kubernetes": "skipped",  # its dry run needs the writes' permissions: an apply's (review)
        "cuda-test": "skipped",
    }
    assert "verify, kubernetes, cuda-test, which need them applied, were not run" in str(plan["note"])
    assert "run with --apply" in str(plan["note"])
    out = capsys.readouterr().out
    image = "/metal-installer/40b13a8d4f3202c7d7c95f0cc0fa5cecea2d480ea9f1f1dd3122395cd68f6e9d:v1.12.7 (now: "
    assert (
        "\nimage would change (applied only with --apply):\n  gpu-worker-1, gpu-worker-2, gpu-worker-3: upgrade to "
        in out
    )
    assert image in out, out
    # the same run plans the config patch first: no "would be refused" (review: the gated step lacked the steps)
    assert "would be refused" not in out, out
    assert (
        run(sim_env, "-p", PARAMS, "--steps", "image") == 0
    )  # alone, its plan says the apply would be refused
    assert (
        "note: applying this step now would be refused: the machine config of gpu-worker-1"
        in capsys.readouterr().out
    )
    assert run(sim_env, "-p", PARAMS, "--steps", "kubernetes") == 0  # its own plan: what it would create
    out = capsys.readouterr().out
    chart = "helm upgrade --install nvidia-device-plugin nvdp/nvidia-device-plugin --version 0.18.0 -n kube-system"
    assert f"  would: {chart} --set runtimeClassName=nvidia\n" in out, out
    assert (
        "  would: label nvidia.com/gpu.present=true on gpu-worker-1, gpu-worker-2, gpu-worker-3\n" in out
    ), out
    # kernels started ahead for the steps that did not run are stopped too
    assert kernel_children() == []
    # the cluster is as it was: the image is still planned on every node
    assert run(sim_env, "-p", PARAMS, "--steps", "image") == 0
    again = latest(sim_env)
    assert again["steps"][0]["result"]["counts"] == {"planned": 3}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("scenario", "steps", "step", "failing", "diagnosis"),
    [
        (
            "unreachable-node",
            None,
            "preflight",
            ["gpu-worker-3"],
            "10.5.0.13:50000: connect: connection refused",
        ),
        # the real talosctl: "talosctl upgrade failed: sequence: upgrade action: NOOP error: ..." (simnode's failed
        # installer, simnode/faults.go); the Python one adds "rolled back" (no source): both say "upgrade failed"
        ("upgrade-fails", None, "image", ["gpu-worker-3"], CASES["upgrade-fails"][1]),
        ("driver-mismatch", "preflight,verify", "verify", None, "tracks lts and production are mixed"),
        ("extensions-no-patch", "preflight,verify", "verify", None, "NVIDIA kernel modules not loaded"),
    ],
)
def test_fault_stops_at_the_right_step_with_the_diagnosis(
    sim_env: dict[str, Path],
    scenario: str,
    steps: str | None,
    step: str,
    failing: list[str] | None,
    diagnosis: str,
) -> None:
    limit = ["--steps", steps] if steps else []
    assert run(sim_env, "-p", PARAMS, "--apply", *limit, "--set", f"simulation.scenario={scenario}") == 1
    data = latest(sim_env)
    assert data["outcome"] == "failed" and data["failed_step"] == step
    assert data["steps"][-1]["name"] == step
    error = data["steps"][-1]["error"]
    assert error["ename"] == "StepFailed" and diagnosis in error["evalue"]
    groups = data["steps"][-1]["result"]["node_groups"]
    failed = sorted(name for g in groups if g["status"] == "failed" for name in g["nodes"])
    assert failed == (failing or ["gpu-worker-1", "gpu-worker-2", "gpu-worker-3"])
    record_dir = records.resolve(sim_env["records"], None)
    executed = nbformat.read(record_dir / next(s.notebook for s in STEPS if s.name == step), as_version=4)
    assert any("papermill-error-cell-tag" in c.metadata.get("tags", []) for c in executed.cells)
    assert records.verify(sim_env["records"]) == []
    assert_no_secrets(sim_env)


@pytest.mark.slow
def test_misspelt_notebook_parameter_stops_the_notebook(tmp_path: Path) -> None:
    import papermill

    with pytest.raises(papermill.PapermillExecutionError) as info:
        papermill.execute_notebook(
            str(NOTEBOOKS / "01-preflight.ipynb"),
            str(tmp_path / "out.ipynb"),
            parameters={"params_file": PARAMS, "aply": True},
            kernel_name="python3",
            progress_bar=False,
        )
    assert info.value.ename == "ParametersInvalid" and "did you mean 'apply'" in info.value.evalue


@pytest.mark.slow
def test_overview_notebook_executes_and_shows_the_plan(tmp_path: Path) -> None:
    import papermill

    out = tmp_path / "overview.ipynb"
    papermill.execute_notebook(
        str(NOTEBOOKS / "00-overview.ipynb"),
        str(out),
        parameters={"params_file": PARAMS},
        kernel_name="python3",
        progress_bar=False,
    )
    html = json.dumps(nbformat.read(out, as_version=4).cells[-1].outputs)
    assert "sim-gpu" in html and "nvidia-open-gpu-kernel-modules-lts" in html


def test_bad_run_arguments_fail_before_anything_runs(
    sim_env: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(sim_env, "-p", PARAMS, "--steps", "preflight,verfy") == 2
    assert "unknown step(s) verfy" in capsys.readouterr().err
    assert run(sim_env, "-p", PARAMS, "--set", "simulation.scenario=nope") == 2
    assert "--set simulation.scenario=nope: simulation.scenario: unknown scenario" in capsys.readouterr().err
    assert run(sim_env, "-p", PARAMS, "--set", "aply=true") == 2
    assert "did you mean 'apply'" in capsys.readouterr().err
    assert not sim_env["records"].exists()  # no half record


@pytest.mark.slow
def test_a_list_parameter_given_as_text_stops_the_notebook_naming_papermill_y(tmp_path: Path) -> None:
    """`papermill … -p nodes '["10.5.0.11"]'` passes text, which was read one character at a time: "unknown
    node(s) [, ", 1, 0 …" (cloud-user walkthrough, 7 Dec 2026). papermill's -p always passes text for a list
    (papermill.cli's _resolve_type reads only numbers and booleans); the error names the parameter and -y."""
    import papermill

    with pytest.raises(papermill.PapermillExecutionError) as info:
        papermill.execute_notebook(
            str(NOTEBOOKS / "01-preflight.ipynb"),
            str(tmp_path / "out.ipynb"),
            parameters={"params_file": PARAMS, "nodes": '["10.5.0.11"]'},
            kernel_name="python3",
            progress_bar=False,
        )
    assert info.value.ename == "ParametersInvalid", info.value.evalue
    assert "nodes: must be a list of text, not str" in info.value.evalue
    assert "-y 'nodes: [...]'" in info.value.evalue
