"""Suite-wide defaults: which talosctl and Kubernetes API answer the simulated cluster in each test.

- ``RUNBOOK_SIM_TALOSCTL=auto``: every test that starts the simulator through ``runbook run`` or ``runbook sim up``
  (in process or as a subprocess: ``tests/test_notebooks.py``, ``test_rollback.py``, ``test_run_safety.py``,
  ``test_interrupts.py``, ``test_issue17_review.py``, ``test_frontpage.py``, ``tests/sim/test_sim_cluster.py``...)
  runs the real talosctl of the nodes' release against simnode when both are in the tools cache (``make tools``;
  ``.ci/run`` builds simnode and the talosctl releases ``tests/sim/talosctl_legs.ci_releases`` reads first). Otherwise the Python talosctl answers and
  ``runbook sim status`` says why: no talosctl of that release built, simnode not built for the current sources
  (``simnode/*.go`` edited during the session: the session start builds it, see below), a release simnode does not
  serve (``runbook_lib/sim/realtalos.py`` ``SIMNODE_RELEASES``), a fault simnode does not simulate.
- The library tests that build their cluster with ``tests/simcluster.py`` (``sim_cluster``, ``factory_only``:
  the steps called directly, e.g. ``test_runbook_faults.py``, ``test_image_step.py``, ``test_step_verify.py``,
  ``test_step_patch.py``, ``test_rollout.py``, ``test_rollback.py``) follow the same rule: they start simnode
  and the real talosctl when both are built (``simcluster.talosctl_choice`` says which runs), inject faults and
  edit nodes where simnode sees them (``inject_fault``, ``clear_fault``, ``serve_node_files``) and read nodes as
  it holds them (``node_state``). A test whose scenario simnode does not simulate, or that tests the Python
  talosctl itself, keeps the Python one and says why (``simcluster.python_talosctl(monkeypatch, why)``).
- simnode current: when a talosctl is built and simnode's sources changed since ``make tools``, the session
  start rebuilds simnode (``tools/build-simnode.sh``, ~3 s warm), and ends the session with the reason if that
  fails (``pytest_sessionstart`` below): ``auto`` never falls back to the Python talosctl unnoticed.
- Tests that need one talosctl set the switch themselves (``RUNBOOK_SIM_TALOSCTL=real``: the ``tests/sim/test_*real*``
  files; the Python one: ``benchmarks/bench_fleet.py``'s figures).
- ``RUNBOOK_SIM_KUBE`` left unset (issue 15, one truth): the Kubernetes side follows ``runbook sim up``'s rule
  (``runbook_lib.sim.realkube.choose``): the real control plane of the nodes' Kubernetes release (simkube, kwok as
  the kubelets, the node agent, the simulated GPU Operator, the chart repository) where ``make kube-tools`` built
  it, else the nearest built release standing in for it (issue 15 retired the Python API server: no test pins
  ``RUNBOOK_SIM_KUBE=python`` any more, the Talos-only ones included). Tests of one plane set theirs
  (``tests/sim/*real*``).

Talos's durations run at ``RUNBOOK_SIM_TIME_SCALE`` = 0.01 (``TIME_SCALE``), as the real-talosctl acceptance
test runs them (``tests/sim/test_sim_up_real_talosctl.py``), not at simnode's default 0.05: measured on the
2-core machine, ``runbook run --apply``'s image step on 3 nodes with the real talosctl took 22.3 s at 0.05 and
20.1 s at 0.01 (each upgrade's installer pull and install: 2 s → 0.4 s), and a boot that hangs fails after 42 s
instead of 3.5 min. What it leaves alone: the 3 s a reboot keeps a simnode node's API down
(``runbook_lib/sim/realtalos.py`` ``REBOOT_MS``, not scaled: the real tracker misses a faster reboot on a loaded
machine), and the Python talosctl's hung boot, which sleeps ``min(--timeout, 70 min × scale)``: the tests give
it timeouts of at most 30 s, under the 42 s it now takes.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import orphans
from tests.buildlock import build_lock

#: Talos's durations for every simulator the suite starts (simnode's -time-factor, the Python talosctl's boot).
TIME_SCALE = "0.01"

os.environ.setdefault("RUNBOOK_SIM_TALOSCTL", "auto")
os.environ.setdefault("RUNBOOK_SIM_TIME_SCALE", TIME_SCALE)


#: The files that take longest (measured with ``--durations``, see README "Tests"), started first under
#: pytest-xdist so they do not form the tail of a parallel run: ``--dist loadfile`` hands out whole files in
#: collection order. A file missing from the list only runs later; the order of the rest is unchanged.
LONG_FILES: tuple[str, ...] = (  # longest first; measured with -n 3 on 2 Dec 2026 (total test time per file)
    "tests/sim/test_real_kube_nodes.py",
    "tests/sim/test_real_faults.py",
    "tests/sim/test_real_talos_110_111.py",
    "tests/sim/test_gpu_operator_real.py",
    "tests/sim/test_sim_up_real_kube.py",
    "tests/test_rollback.py",
    "tests/sim/test_fake_vs_real_talosctl.py",
    "tests/test_step_kubernetes.py",
    "tests/sim/test_talosctl_get.py",
    "tests/test_interrupts.py",
)


def stop_orphaned_clusters(config: pytest.Config) -> None:
    """Mark this session's base temporary directory as ours and stop the simulated clusters of killed
    sessions (``tests/orphans.py``): they would take the CPU this session's tests are timed against."""
    factory = getattr(
        config, "_tmp_path_factory", None
    )  # pytest's TempPathFactory (the tmp_path_factory fixture)
    if factory is None:
        return
    basetemp = factory.getbasetemp()
    orphans.mark_owner(basetemp)
    found = orphans.orphans(basetemp.parent, current=basetemp)
    if found:
        stopped = orphans.stop([pid for pid, _dir in found])
        dirs = ", ".join(sorted({d.name for _pid, d in found}))
        sys.stderr.write(f"stopped {len(stopped)} processes of killed pytest sessions ({dirs})\n")


def pytest_sessionstart(session: pytest.Session) -> None:
    """simnode (and simkube, when a control plane is built) built for the current sources before any test, when a
    talosctl is built: else ``auto`` runs the
    Python talosctl everywhere without a word (``tests/simcluster.py`` ``ensure_current_simnode``). A failed
    build ends the session before any test runs, saying what to do. Under pytest-xdist only the controller
    does it, before it starts the workers (its own ``pytest_sessionstart`` is ``trylast``), under
    ``build_lock`` against any other pytest run on the machine: workers never build."""
    if hasattr(session.config, "workerinput"):
        return
    stop_orphaned_clusters(session.config)
    from tests.simcluster import StaleSimnode, ensure_current_simkube, ensure_current_simnode

    for name, ensure in (("simnode", ensure_current_simnode), ("simkube", ensure_current_simkube)):
        try:
            with build_lock(name):
                built = ensure()
        except StaleSimnode as exc:
            pytest.exit(str(exc), returncode=pytest.ExitCode.USAGE_ERROR)
        if built is not None:
            sys.stderr.write(f"{name} rebuilt for the current sources: {built}\n")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In an xdist worker, the ``LONG_FILES`` first (a stable sort: each file's tests keep their order and
    stay together). Every worker collects the same order, as xdist requires; a serial run is left as is."""
    if not hasattr(config, "workerinput"):
        return
    rank = {name: index for index, name in enumerate(LONG_FILES)}
    root = Path(str(config.rootpath))
    items.sort(key=lambda item: rank.get(item.path.relative_to(root).as_posix(), len(rank)))


#: The signals whose handler a test must give back as it found it (``signal_handlers_given_back``).
GUARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _handler_name(handler: object) -> str:
    if handler is signal.default_int_handler:
        return "Python's (KeyboardInterrupt)"
    return handler.name if isinstance(handler, signal.Handlers) else repr(handler)


def pytest_report_header(config: pytest.Config) -> str | None:
    """Say when this pytest started with SIGINT ignored (a background job of a non-interactive shell: ``cmd &``
    in a script), which its xdist workers inherit: a Ctrl-C test that did not set Python's handler itself would
    fail there with 'DID NOT RAISE KeyboardInterrupt' (CI of 2 Dec, 473b074)."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        return "SIGINT is ignored in this pytest and its workers (started in the background?)"
    return None


@pytest.fixture(autouse=True)
def signal_handlers_given_back(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail (at teardown, naming it) a test that leaves SIGINT's or SIGTERM's handler changed, and put the
    handler back. Why: an xdist worker runs many files in one process, and a handler left behind makes a later
    file's test fail far from its cause (CI of 2 Dec, 473b074: two in-process tests of test_interrupts.py did
    not see Ctrl-C). What a worker started with is not checked here: a pytest started as a background job of
    a non-interactive shell (``cmd &`` in a script) starts with SIGINT ignored, and Python and xdist's workers
    keep it so; the tests that need Ctrl-C set Python's handler themselves."""
    before = {sig: signal.getsignal(sig) for sig in GUARDED_SIGNALS}
    yield
    changed = {sig: signal.getsignal(sig) for sig in GUARDED_SIGNALS if signal.getsignal(sig) != before[sig]}
    for sig in changed:
        signal.signal(sig, before[sig] if before[sig] is not None else signal.SIG_DFL)
    if changed:
        left = "; ".join(
            f"{signal.Signals(sig).name} was {_handler_name(before[sig])}, now {_handler_name(handler)}"
            for sig, handler in changed.items()
        )
        pytest.fail(f"{request.node.nodeid} left a signal handler changed (put back): {left}", pytrace=False)
