"""``runbook run`` (the notebooks, headless, into a change record) and ``runbook records list|show|verify``.

Why the simulator is started here and not in the runner: the runner is library code and must not know the
simulator exists (it reaches clusters through tools and kubeconfigs only); the CLI is the one layer allowed
to bring one up, so it hands the runner a start/stop pair.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import dataclasses
import difflib
import gc
import shlex
import signal
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from runbook_lib.cli import live, run_report
from runbook_lib.cli.cmd_params import add_set_arg
from runbook_lib.errors import PermanentError, RunbookError
from runbook_lib.model.params import Params, approval, parse_set, read_params_file
from runbook_lib.notebook import lock, records, runner
from runbook_lib.notebook.steps import STEP_NAMES
from runbook_lib.sim import cluster as sim_cluster
from runbook_lib.sim import realkube, scenarios
from runbook_lib.sim import state as sim_state
from runbook_lib.steps.context import SIM_STATE_ENV


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    run = sub.add_parser(
        "run",
        help="run the runbook notebooks headless (papermill) into a new change record",
        description=(
            "Executes the step notebooks in order, stops at the first failing step, and writes "
            "records/<UTC time>-<cluster>-<run id>/. Without --apply (and apply: true in the "
            "parameters) every step only plans and dry-runs."
        ),
    )
    run.add_argument(
        "-p", "--params", metavar="PARAMS", help="parameter file (default: params/simulated.yaml)"
    )
    run.add_argument(
        "--steps",
        metavar="A,B",
        help=f"only these steps, in runbook order ({', '.join(STEP_NAMES)}); with --apply, a run of config-patch "
        "or image runs preflight first",
    )
    run.add_argument(
        "--from",
        dest="from_step",
        metavar="STEP",
        help="resume at STEP; without -p it reuses the parameters of the latest record",
    )
    add_run_options(run)
    run.set_defaults(handler=_run)


def add_run_options(parser: argparse.ArgumentParser) -> None:
    """The options of a command that runs notebooks into a record (``run``, ``rollback``)."""
    parser.add_argument("--apply", action="store_true", help="change the cluster (default: plan and dry-run)")
    add_set_arg(parser)
    parser.add_argument(
        "--records", metavar="DIR", help="records directory (default: $RUNBOOK_RECORDS or ./records)"
    )
    parser.add_argument(
        "--state",
        metavar="DIR",
        help="simulator state directory (target simulated; default: $RUNBOOK_SIM_STATE or <repo>/.sim/default)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def _root(value: str | None) -> Path:
    return Path(value) if value else records.default_root()


# ---------------------------------------------------------------------------------------------------------
# runbook run


def _refuse_sim_up_cluster(
    state_dir: Path, differs: list[str] | None, files: SimLeases, params: Params
) -> None:
    """Refuse (exit 2, nothing changed) to replace a simulator `runbook sim up` started for other parameters.

    Why: a cluster brought up with ``runbook sim up --scenario upgrade-fails`` (a fault to try) was wiped and
    recreated by the next ``runbook run -p params/simulated.yaml`` (its scenario ``fresh``), which then passed
    with no fault, and stopped it; ``runbook rollback`` did the same to the half-applied state it was to undo.
    A run-started simulator is still replaced when stopped: its state is the runs' own."""
    pid = sim_cluster.daemon_pid(state_dir)
    if not differs or pid is None:
        return
    try:
        started_by_run = files.started.read_text(encoding="utf-8").strip() == str(pid)
    except FileNotFoundError:
        started_by_run = False
    if started_by_run:
        return
    raise lock.Busy(
        f"the simulated cluster at {state_dir} was started by `runbook sim up` for other parameters "
        f"({'; '.join(differs)}); nothing was changed",
        # the real values and state dir in the commands: a bare `runbook sim down` stops .sim/default, which may
        # be another cluster (found by an operator walkthrough)
        hint=f"run with the parameters it was made for{_its_sets(state_dir, params)}, stop it first "
        f"(`{shlex.join(['runbook', 'sim', 'down', '--state', str(state_dir)])}`), or give this run its own --state DIR",
    )


def _its_sets(state_dir: Path, params: Params) -> str:
    """`` (--set K=V …)``: the overrides that make these parameters the cluster's, where a --set can."""
    info = sim_state.load_cluster(state_dir)
    sets = []
    if info.get("scenario") != params.simulation.scenario:
        sets.append(f"--set simulation.scenario={info.get('scenario')}")
    if info.get("talos_version") != sim_state.normalize_talos_version(params.talos_version):
        sets.append(f"--set talos_version={info.get('talos_version')}")
    workers = [n for n in info.get("nodes", []) if n.get("role") == "worker"]
    if [(n.get("name"), n.get("address")) for n in workers] != [(n.name, n.address) for n in params.nodes]:
        sets.append(_nodes_set(workers))
    return f" ({' '.join(sets)})" if sets else ""


#: GPU nodes a hint spells out as ``--set nodes=[…]`` at most; more are a parameter file's, not a command line's.
NODES_IN_A_SET = 8


def _nodes_set(workers: list[dict[str, Any]]) -> str:
    """The cluster's GPU nodes as the ``--set nodes=[…]`` that makes a run's nodes theirs (a YAML flow list:
    ``params.parse_set``), or where to read them when there are many. Why: the hint named only the scenario and
    the release, and a run refused for other GPU nodes had no command to follow (operator walkthrough)."""
    if len(workers) > NODES_IN_A_SET:
        first = workers[0]
        return (
            f"nodes: its {len(workers)} GPU nodes, from {first.get('name')} at {first.get('address')}, as "
            "`runbook sim status` lists them"
        )
    flow = ", ".join(f"{{name: {n.get('name')}, address: {n.get('address')}}}" for n in workers)
    return shlex.join(["--set", f"nodes=[{flow}]"])


def _refuse_to_replace_for_a_plan(state_dir: Path, differs: list[str] | None, params: Params) -> None:
    """Refuse (exit 2, nothing changed) to replace a simulated cluster made for other parameters in a plan.

    Why: a plan changes nothing, yet a plan-only ``runbook run --set talos_version=v1.13.2`` (or a plan-only
    rollback) on the state a 1.12 ``--apply`` run had left re-created the cluster, wiping what that run applied
    and the state its rollback was to undo, and then said "plan only: nothing was changed on the cluster" (found
    by an operator walkthrough). An ``--apply`` run still replaces it, as the README says."""
    if not differs or params.apply:
        return
    raise lock.Busy(
        f"the simulated cluster at {state_dir} was made for other parameters ({'; '.join(differs)}); a plan "
        "would replace it, so nothing was started or changed",
        hint="give the plan its own --state DIR, plan with the parameters the cluster was made for, or, if these "
        "parameters are the ones you meant (a typo here would be built too), run with --apply to replace it (a new "
        "cluster: nodes on the parameters' Talos release, nothing applied, what was applied to this one lost)",
    )


@dataclass(frozen=True)
class SimLeases:
    """Where runs that share one simulator meet (owner-only files under ``lock.locks_dir()``): a lock that
    orders bringing it up and stopping it, one lease per run using it, and a mark saying a run started it
    (with the daemon's pid), so the last run out stops only a simulator a run started."""

    lifecycle: Path
    leases: Path
    started: Path

    @classmethod
    def of(cls, state_dir: Path) -> SimLeases:
        key = str(state_dir)
        return cls(
            lock.key_path("sim", key, ".lock"),
            lock.key_path("sim", key, ".leases"),
            lock.key_path("sim", key, ".started-by-run"),
        )


def resolve_state(state: str | Path | None) -> Path:
    """``--state``, else the default (``$RUNBOOK_SIM_STATE`` or ``<repo>/.sim/default``). An empty one (a script's
    unset ``--state "$DIR"``) is refused: it was read as the default, so ``sim down --purge --state ''`` removed
    that state (attack re-run, 7 Dec 2026) and a run used, or made, the default simulator (review)."""
    if state is None:
        return sim_state.default_state_dir().resolve()
    if not str(state).strip():
        raise PermanentError(
            "--state is empty", hint="give the simulator's state directory, or leave out --state"
        )
    return Path(state).resolve()


@contextlib.contextmanager
def _simulated_cluster(params: Params, state: str | Path | None) -> Iterator[dict[str, str]]:
    """Bring the simulated cluster up for this run; the last run using it stops it (state is kept).

    The state is reused when it was made for these parameters, so a second run sees what the first left.
    Why leases: a run that ended stopped the simulator under a concurrent run, which then failed with a
    misleading "Image Factory did not answer" (F8 of the 1 Dec attack).
    """
    state_dir = resolve_state(state)
    scenario = params.simulation.scenario
    if scenario not in scenarios.SCENARIOS:
        raise PermanentError(
            f"unknown simulation.scenario {params.simulation.scenario!r}",
            hint=f"scenarios: {', '.join(sorted(scenarios.SCENARIOS))} (`runbook sim scenarios`)",
        )
    files = SimLeases.of(state_dir)
    with contextlib.ExitStack() as held_lease:
        with lock.held(files.lifecycle):
            own = held_lease.enter_context(lock.lease(files.leases))
            _bring_up(params, state_dir, scenario, files, own)
        try:
            yield {SIM_STATE_ENV: str(state_dir)}
        finally:
            with lock.held(files.lifecycle):
                last = not lock.live_leases(files.leases, own=own)
                held_lease.close()
                if last:
                    _stop_if_a_run_started_it(state_dir, files)


def _bring_up(params: Params, state_dir: Path, scenario: str, files: SimLeases, own: Path) -> None:
    """Use the simulator as it runs when it was made for these parameters, else (re)create and start it;
    never under another run that uses it, nor over one `runbook sim up` started (exit 2 naming it)."""
    differs = sim_cluster.state_differs(state_dir, params, scenario)
    matches = differs == []
    if matches and sim_cluster.daemon_pid(state_dir) is not None:
        # Already up for these parameters (another run's, or `runbook sim up -p` for a JupyterLab session).
        return
    _refuse_sim_up_cluster(state_dir, differs, files, params)
    _refuse_to_replace_for_a_plan(state_dir, differs, params)
    others = [] if matches else lock.live_leases(files.leases, own=own)
    if others:
        raise lock.Busy(
            f"the simulated cluster at {state_dir} is used by another run with other parameters "
            f"({others[0]}); nothing was started",
            hint="wait for that run to finish, or give this run its own --state DIR",
        )
    try:  # no control plane built, or RUNBOOK_SIM_KUBE=python: refused before anything is stopped or written
        realkube.choose(realkube.kubernetes_for_talos(params.talos_version))
    except ValueError as exc:
        raise PermanentError(str(exc)) from None
    realkube.stop(state_dir)
    sim_cluster.stop_daemon(state_dir)
    if not matches:
        try:
            sim_cluster.create(state_dir, sim_cluster.spec_from_params(params))
        except ValueError as exc:
            raise PermanentError(str(exc)) from None
        # a replaced state is said so: what earlier runs changed on it, and their rollbacks' ground, is gone, and
        # this run's report speaks only of the new one (review, stop 52)
        replaced = (
            f"; it replaced the one made for other parameters ({'; '.join(differs)}), and what runs had "
            "changed on that one is gone"
            if differs
            else ""
        )
        sys.stderr.write(f"simulated cluster created in {state_dir} (scenario {scenario}){replaced}\n")
    try:
        info = realkube.start_servers(state_dir)  # the real Kubernetes control plane when built
        spec = sim_cluster.spec_from_params(params)
        talos = sim_cluster.start_talos(state_dir, spec, sim_state.load_nodes(state_dir))  # real when built
    except (RuntimeError, ValueError) as exc:
        realkube.stop(state_dir)
        sim_cluster.stop_talos(state_dir)
        sim_cluster.stop_daemon(state_dir)
        raise PermanentError(str(exc)) from None
    sys.stderr.write(
        f"simulated Talos nodes: {talos.reason}\nsimulated Kubernetes: {realkube.summary(state_dir)}\n"
    )
    files.started.write_text(str(info.get("pid")), encoding="utf-8")


@dataclass
class SimulatorHook:
    """The cluster hook of ``runbook run`` and ``runbook rollback`` (:func:`_simulated_cluster`), which remembers
    whether the run used the simulator, to say after it how to start it again (``run_report.simulator_stopped``)."""

    state_dir: Path
    used: bool = False

    def __call__(self, params: Params) -> contextlib.AbstractContextManager[dict[str, str]]:
        self.used = True
        return _simulated_cluster(params, self.state_dir)

    def stopped_after(self) -> bool:
        """The run used the simulator, and it is down now (the run stopped the one it started)."""
        return self.used and sim_cluster.daemon_pid(self.state_dir) is None


def _stop_if_a_run_started_it(state_dir: Path, files: SimLeases) -> None:
    """Stop the daemon when a run started it (its pid is in the mark); one started by ``runbook sim up``
    is left running, as found."""
    try:
        mark = files.started.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return
    if mark == str(sim_cluster.daemon_pid(state_dir)):
        realkube.stop(state_dir)
        sim_cluster.stop_talos(state_dir)
        sim_cluster.stop_daemon(state_dir)
    files.started.unlink(missing_ok=True)


def _terminate(signum: int, _frame: object) -> None:
    """SIGTERM (a CI timeout) unwinds like Ctrl-C, so the record is sealed and the simulator stopped."""
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """SIGTERM raises ``_terminate``'s SystemExit while the command runs, and the caller's handler is back after:
    ``runbook_lib.cli.main`` called in a Python process (a script, a notebook, a test) must not leave that
    process's SIGTERM raising wherever it happens to be later."""
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def _unknown_steps(names: list[str], flag: str) -> str:
    """``unknown step(s) X in --steps (did you mean 'Y'?)`` for the names that are not steps, or ""."""
    unknown = [name for name in names if name not in STEP_NAMES]
    if not unknown:
        return ""
    close = [match for name in unknown for match in difflib.get_close_matches(name, STEP_NAMES, n=1)]
    guess = f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""
    return f"unknown step{'(s)' if flag == '--steps' else ''} {', '.join(unknown)} in {flag}{guess}"


def _checked_steps(steps: str | None, from_step: str | None) -> list[str] | None:
    """``--steps`` as a list, checked with ``--from`` before anything starts (exit 2, "did you mean")."""
    names = [s.strip() for s in steps.split(",") if s.strip()] if steps else None
    problems = [
        _unknown_steps(names or [], "--steps"),
        _unknown_steps([from_step] if from_step else [], "--from"),
    ]
    if any(problems):
        raise PermanentError("; ".join(p for p in problems if p), hint=f"steps: {', '.join(STEP_NAMES)}")
    return names


def _checked_records_root(value: str | None) -> Path:
    """The records folder, checked before the simulator starts: a directory this user can create a record
    in, or one that can be created.

    Why: ``--records /dev/null`` or ``/proc/self`` died with a traceback once the simulator was up (F12).
    The check creates and removes an empty directory where the first record directory would go.
    """
    root = _root(value)
    name = f"--records {value}" if value else f"records folder {root} ($RUNBOOK_RECORDS or ./records)"
    existing = root.absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        what = "not a directory" if existing == root.absolute() else f"{existing} is not a directory"
        raise PermanentError(f"{name}: {what}", hint="give a directory for the change records")
    try:
        Path(tempfile.mkdtemp(prefix=".runbook-check-", dir=existing)).rmdir()
    except OSError as exc:
        raise PermanentError(
            f"{name}: cannot create a record there ({exc.strerror})",
            hint="give a directory you can write for the change records",
        ) from None
    return root


def _resume_values(root: Path, *, apply: bool) -> dict[str, Any]:
    """The parameters of the latest record, for ``--from`` without ``-p``; never its approval.

    Why ``apply`` is reset: an approval is given for one command line.  The latest record of an applied run
    holds ``apply: true``, and resuming with it changed the cluster on a bare ``runbook run --from STEP``
    (F3 of the 1 Dec attack); the README shows ``runbook run --from verify`` as a harmless resume.
    """
    latest = _latest_run(root)
    values = latest.get("params")
    if not isinstance(values, dict):
        raise PermanentError("the latest record holds no parameters to resume with", hint="give -p PARAMS")
    mode = "approved to change the cluster" if apply else "plan only (add --apply to change the cluster)"
    sys.stderr.write(f"resuming with the parameters of {latest.get('record')}, {mode}\n")
    return {**values, "apply": False}


def _said_without_flag(params_file: str | None, overrides: Sequence[str]) -> str:
    """A line for stderr when the parameters, not ``--apply``, approve this run; "" otherwise.

    Why: ``apply: true`` in a parameter file approves ``runbook run`` as ``--apply`` does (papermill's notebooks
    read it so), and a CI plan job running ``runbook run -p FILE`` with such a file changed the cluster without a
    word (operator walkthrough, stop 54). A file that cannot be read says nothing here: loading it says why."""
    where = ""
    if any(parse_set(item)[0] == "apply" for item in overrides):  # the last --set of apply decides
        where = "a --set apply=true" if _set_approves(overrides) else ""
    elif params_file is not None:
        try:
            data = read_params_file(params_file)
        except RunbookError:
            return ""
        with contextlib.suppress(ValueError):
            where = f"apply: true in {params_file}" if approval(data.get("apply", False)) else ""
    if not where:
        return ""
    return f"runbook run: {where} approves this run's changes (no --apply given); add --set apply=false to plan only\n"


def _set_approves(overrides: Sequence[str]) -> bool:
    """Whether a ``--set apply=true`` approves this run (the last ``--set`` of a key wins, as it is applied)."""
    approved = False
    for item in overrides:
        key, value = parse_set(item)
        if key == "apply":
            with contextlib.suppress(ValueError):  # not an approval: the parameters' check says why
                approved = approval(value)
    return approved


def _intact(path: Path, data: dict[str, Any]) -> dict[str, Any]:
    """``data`` when its record is intact. Why: ``--from`` resumed from a record.json edited after sealing (a
    node's address, ``rollout_concurrency``) without a word, where rollback refuses such a record as evidence
    (attack re-run, 7 Dec 2026)."""
    problems = records.intact_problems(path)
    if problems:
        raise PermanentError(
            f"the latest run's record {path.name} is not intact ({problems[0]}): its parameters are not resumed",
            hint="`runbook records verify` names every problem; give -p PARAMS",
        )
    return data


def _latest_run(root: Path) -> dict[str, Any]:
    """The newest record of a run, passing over newer rollback records (named on stderr).

    Why: an operator who rolled back and then resumes means their last run; the rollback's parameters are
    those it was given for undoing (found by an operator walkthrough: ``--from verify`` resumed from one). Only
    records of the newest record's cluster are looked at: a folder may hold several clusters' records, and
    resuming another cluster's parameters would plan (or with ``--apply`` change) the wrong cluster."""
    newest = records.resolve(root, None)
    cluster = records.load_record(newest).get("cluster")
    passed: list[str] = []
    older = [
        p
        for p in reversed(records.sealed_records(root))
        if p.name < newest.name and not records.is_unsealed(p)
    ]
    for path in [newest, *older]:
        data = records.load_record(path)
        if data.get("cluster") != cluster:
            continue  # another cluster's run: never resumed in the place of the rollback's cluster's
        if not any(step.get("name") == "rollback" for step in records.listed(data, "steps")):
            if passed:
                sys.stderr.write(f"passing over the rollback record(s) {', '.join(passed)}\n")
            return _intact(path, data)
        passed.append(path.name)
    raise PermanentError(
        f"the records of cluster {cluster!r} in {root} are all of rollbacks: none holds a run's parameters to "
        "resume with",
        hint="give -p PARAMS",
    )


def _own_selection(steps: list[str] | None, from_step: str | None) -> tuple[str, ...]:
    """``--steps A,B`` / ``--from STEP`` as given, when they leave preflight out (run_report.Invocation.selection)."""
    if not (steps or from_step) or "preflight" in [s.name for s in runner.select_steps(steps, from_step)]:
        return ()  # preflight is among the steps selected: its own fix is this run's
    return (*(["--steps", ",".join(steps)] if steps else []), *(["--from", from_step] if from_step else []))


def quiet_interrupt(kind: type[BaseException], value: BaseException, traceback: TracebackType | None) -> None:
    """Ctrl-C ends the process as an unhandled Ctrl-C does (by SIGINT: a shell shows 130), but without a
    Python traceback: the run has sealed its record and said where (``runner.run``)."""
    if not issubclass(kind, KeyboardInterrupt):
        sys.__excepthook__(kind, value, traceback)


def _run(args: argparse.Namespace) -> int:
    with sigterm_unwinds():
        return _run_steps(args)


def _run_steps(args: argparse.Namespace) -> int:
    # At exit, the interpreter's last garbage collection walks every object the run left (the notebook
    # tooling, the Kubernetes client): ~0.15 s of every `runbook run`.  Freezing them first skips that walk;
    # the process ends right after, and nothing of the record is left to write by then (it is sealed, and
    # atexit handlers registered before this one, such as temporary-directory clean-up, still run).
    atexit.register(gc.freeze)
    steps = _checked_steps(args.steps, args.from_step)
    params_file: str | None = args.params
    resume_values: dict[str, Any] | None = None
    root = _checked_records_root(args.records)
    state_dir = resolve_state(args.state)
    if args.from_step and params_file is None:
        resume_values = _resume_values(root, apply=args.apply or _set_approves(args.overrides or ()))
    elif params_file is None:
        params_file = "params/simulated.yaml"
    if not args.apply and resume_values is None:
        sys.stderr.write(_said_without_flag(params_file, args.overrides or ()))
    invocation = run_report.Invocation(
        params_file,
        args.overrides or (),
        args.records,
        args.state,
        apply=bool(args.apply),
        selection=_own_selection(steps, args.from_step),
        picked=bool(args.steps),
    )
    cluster = SimulatorHook(state_dir)
    opened: list[Path] = []  # the run's record, once it exists (run_report.after_interrupt)
    try:
        outcome = runner.run(
            params_file,
            steps=steps,
            from_step=args.from_step,
            apply=True if args.apply else None,
            overrides=args.overrides,
            base=resume_values,
            records_root=root,
            cluster=cluster,
            cluster_key=str(state_dir),
            progress=not args.no_progress,
            on_event=lambda event: live.print_event(event, invocation.with_params),
            on_record=opened.append,
        )
    except (KeyboardInterrupt, SystemExit) as exc:
        record = opened[0] if opened else None
        sys.stderr.write(run_report.after_interrupt(record, invocation))  # "" unless the record applied
        if isinstance(exc, KeyboardInterrupt):
            sys.excepthook = quiet_interrupt  # this process ends by it: no traceback under what was said
        raise
    stopped = cluster.stopped_after()
    # approved by the file or a --set, not --apply: the go-on commands repeat the approval all the same (review)
    invocation = dataclasses.replace(invocation, apply=outcome.apply)
    sys.stdout.write(run_report.report(outcome, invocation, simulator_stopped_after=stopped))
    return 0 if outcome.ok else 1
