"""``make bench`` runs issue 16's benchmarks, ``make bench-full`` every one (``benchmarks/__main__.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.__main__ import QUICK, selected

HERE = Path(__file__).resolve().parents[1] / "benchmarks"


def test_make_bench_runs_every_quick_script_and_bench_full_runs_them_all() -> None:
    quick = [p.stem.removeprefix("bench_") for p in selected(HERE, [], full=False)]
    assert sorted(quick) == sorted(QUICK)  # a renamed script would silently drop out of make bench
    full = selected(HERE, [], full=True)
    assert {p.name for p in full} == {p.name for p in HERE.glob("bench_*.py")} and "bench_fleet" not in quick


def test_names_pick_scripts_in_either_set() -> None:
    assert [p.stem for p in selected(HERE, ["fleet"], full=False)] == ["bench_fleet"]
    assert selected(HERE, ["no_such_bench"], full=True) == []


def test_bench_fleets_runbook_runs_do_not_ask_for_the_retired_python_kubernetes_api(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``RUNBOOK_SIM_KUBE=python`` is refused with exit 2 since 2 Dec 2026: bench_fleet's ``runbook run`` figures
    run on the real control plane its ``simulator_for`` starts, whatever the caller's environment says."""
    import importlib

    monkeypatch.setenv("RUNBOOK_SIM_KUBE", "python")
    from benchmarks import bench_fleet

    env = importlib.reload(bench_fleet).PYTHON_SIM_ENV
    assert "RUNBOOK_SIM_KUBE" not in env and env["RUNBOOK_SIM_TALOSCTL"] == "python"


def test_the_real_talosctl_benchmarks_runbook_run_does_not_ask_for_the_retired_python_kubernetes_api() -> (
    None
):
    """``bench_real_talosctl``'s 1,000-node ``runbook run`` (``real_fleet.watched_run``) set
    ``RUNBOOK_SIM_KUBE=python``, refused with exit 2 since the Python API server was retired (2 Dec 2026): its
    environment must leave the Kubernetes side to ``runbook run``'s own choice (the real control plane)."""
    from benchmarks import real_fleet

    env = real_fleet.run_env({"RUNBOOK_SIM_KUBE": "python", "HOME": "/h"})
    assert "RUNBOOK_SIM_KUBE" not in env and env["RUNBOOK_SIM_TALOSCTL"] == "real" and env["HOME"] == "/h"


def test_the_process_tree_counts_helm_and_leaves_the_control_plane_out(tmp_path: Path) -> None:
    """Issue 16 point 3 counts "every talosctl/helm child alive at once"; the real control plane's binaries are the
    simulated cluster's, not the runbook's."""
    from benchmarks import real_fleet

    cache = "/root/.cache/talos-gpu-runbooks"
    assert real_fleet.kind_of_argv([b"/x/bin/helm", b"upgrade"]) == "helm"
    for argv in (
        [f"{cache}/kube/v1.35.0/bin/kube-apiserver".encode()],
        [f"{cache}/kwok/v0.8.0/bin/kwok".encode()],
    ):
        assert real_fleet.kind_of_argv(argv) == "simulator"
    assert real_fleet.kind_of_argv([b"/usr/bin/python3", b"-m", b"ipykernel_launcher"]) == "kernel"


def test_a_kernels_fork_before_its_exec_is_not_counted_as_another_kernel() -> None:
    """A kernel starting a talosctl forks first: until the exec the child shows the kernel's command line and
    pages. The 1,000-node run of 2 Dec counted 7 "kernels" (1,064 MB PSS) with one kernel per run: such forks."""
    import subprocess
    import sys
    import time

    from benchmarks import real_fleet

    code = "import os, time\nif os.fork() == 0:\n    time.sleep(30); os._exit(0)\ntime.sleep(30)\n"
    proc = subprocess.Popen([sys.executable, "-c", code, "ipykernel_launcher"])
    try:
        deadline = time.monotonic() + 10
        while len(real_fleet.descendants(proc.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        (child,) = real_fleet.descendants(proc.pid) - {proc.pid}
        assert real_fleet.kind_of(proc.pid, 1) == "kernel"
        assert real_fleet.kind_of(child, 1) == "other"
    finally:
        proc.kill()
        proc.wait()
