"""The one call each step notebook makes: load and validate parameters, connect, run the step behind the
gate, render, store the result for the change record, and raise on failure so a headless run stops.

Why notebooks stay this thin: everything a notebook does must also be testable and runnable without
Jupyter, and a notebook that holds logic drifts from the library.  Why the notebook parameters are checked
here: papermill only *warns* about a parameter the notebook does not declare, so ``-p aply True`` would
silently plan instead of apply; here it is an error with a "did you mean".
"""

from __future__ import annotations

import ast
import difflib
import functools
import importlib
import inspect
import json
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runbook_lib.clients.proc import Journal
from runbook_lib.errors import ParameterProblem, ParametersInvalid, PermanentError
from runbook_lib.model.params import Params, load_params
from runbook_lib.model.plan import build_plan
from runbook_lib.model.rollout import NOTE_PREFIX, schedule
from runbook_lib.steps.context import Context, connect
from runbook_lib.steps.events import Events
from runbook_lib.steps.fixes import helm_as_run, kubectl_as_run, talosctl_as_run
from runbook_lib.steps.results import StepResult, rewrite_runnable

from .live_events import events_file, file_sink
from .render import failure_hint, failure_text, render_html, show_html

if TYPE_CHECKING:  # imported when a step changes the cluster: see run_step
    from .gates import ApprovalGate, Progress, Recorder

#: Set by ``runbook run``: where this step's result, plan and journal go (JSON), for the change record.
RESULT_FILE_ENV = "RUNBOOK_RESULT_FILE"
#: Set by ``runbook run``: its run id, which labels the CUDA test pods (so the run can remove leftovers).
RUN_ID_ENV = "RUNBOOK_RUN_ID"
#: Set by ``runbook run``: the steps it runs, comma-separated, so preflight checks what those need and no more
#: (a ``--steps preflight,verify`` health check needs no write permission).
RUN_STEPS_ENV = "RUNBOOK_RUN_STEPS"
#: The parameters every step notebook declares (its ``parameters`` cell).
NOTEBOOK_PARAMETERS = ("params_file", "apply", "nodes", "overrides")


@dataclass(frozen=True)
class StepSpec:
    name: str
    notebook: str
    module: str
    function: str
    title: str
    changes_cluster: bool
    """Runs behind the approval gate (plan first; apply only when approved)."""
    kubernetes_apis: tuple[str, ...] = ()
    """The Kubernetes client's API classes the step calls: ``runbook run`` builds them in its kernel ahead."""
    plans_alone: bool = False
    """Its plan reads only what it changes itself (a node's installed image), which an earlier step does not
    change: a plan-only run still plans it after an earlier step planned changes. Verify and the CUDA test check
    what the applied changes leave, so they wait; so does the Kubernetes layer, whose dry run is authorized as
    the writes (a read-only identity's plan names each refused one: steps/dryrun.py) and which writes helm's
    repository list."""

    @property
    def uses_kubernetes(self) -> bool:
        return bool(self.kubernetes_apis)


STEPS: tuple[StepSpec, ...] = (
    StepSpec(
        "preflight",
        "01-preflight.ipynb",
        "preflight",
        "preflight",
        "Preflight",
        False,
        ("VersionApi", "NodeV1Api"),
    ),
    # The modules patch before the upgrade: booting the kmod extension (which blacklists the NVIDIA
    # modules) without a config that loads them hangs the boot on ext-nvidia-persistenced for BootTimeout
    # (70 min) and rolls the node back (talos@v1.12.0 v1alpha1_sequencer_tasks.go:419-490, constants.go:956;
    # siderolabs/extensions#888, siderolabs/talos#9149).  Without the extension the modules patch only
    # makes KernelModuleSpecController retry (talos@v1.12.0 .../controllers/runtime/kernel_module_spec.go).
    StepSpec("config-patch", "02-config-patch.ipynb", "patch", "config_patch", "Config patch", True),
    StepSpec(
        "image", "03-image.ipynb", "image", "image_upgrade", "Image and upgrade", True, plans_alone=True
    ),
    StepSpec("verify", "04-verify.ipynb", "verify", "verify", "Verification", False),
    StepSpec(
        "kubernetes",
        "05-kubernetes.ipynb",
        "kubernetes",
        "kubernetes_layer",
        "Kubernetes layer",
        True,
        ("CoreV1Api", "AppsV1Api", "NodeV1Api", "CustomObjectsApi"),
    ),
    StepSpec("cuda-test", "06-cuda-test.ipynb", "cudatest", "cuda_test", "CUDA test", True, ("CoreV1Api",)),
)
STEP_NAMES: tuple[str, ...] = tuple(s.name for s in STEPS)
#: Not one of the runbook's steps (``runbook run`` never runs it): it undoes them, only when asked
#: (``runbook rollback``, or its notebook), from the change records ``rollback.records`` names.
ROLLBACK = StepSpec(
    "rollback", "07-rollback.ipynb", "rollback", "rollback", "Rollback", True, ("CoreV1Api", "NodeV1Api")
)


#: The gate each step's cell showed last in this kernel: a cell (or a test) can click it programmatically.
GATES: dict[str, ApprovalGate] = {}


class StepFailed(PermanentError):
    """A step found problems; the message carries the diagnosis, so the record's error cell explains it."""


def spec(step: str) -> StepSpec:
    for item in (*STEPS, ROLLBACK):
        if item.name == step:
            return item
    close = difflib.get_close_matches(step, STEP_NAMES, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise PermanentError(f"unknown step {step!r}", hint=f"{hint}steps: {', '.join(STEP_NAMES)}")


def step_function(step: str) -> Callable[..., StepResult]:
    item = spec(step)
    try:
        module = importlib.import_module(f"runbook_lib.steps.{item.module}")
    except ModuleNotFoundError as exc:
        raise PermanentError(f"step {step!r} is not available in this version ({exc})") from None
    fn: Callable[..., StepResult] = getattr(module, item.function)
    return fn


def run_steps() -> list[str] | None:
    """The steps ``runbook run`` runs (:data:`RUN_STEPS_ENV`); None outside it (a notebook user may run all)."""
    named = os.environ.get(RUN_STEPS_ENV)
    return [s for s in named.split(",") if s] if named else None


def _call(fn: Callable[..., StepResult], ctx: Context, **kwargs: Any) -> StepResult:
    """Pass only the keywords the step takes (not every step has a rollout or an apply switch)."""
    accepted = inspect.signature(fn).parameters
    result = fn(ctx, **{k: v for k, v in kwargs.items() if k in accepted})
    # the printed talosctl and kubectl commands as this run calls them (steps.fixes.talosctl_as_run)
    talosctl = talosctl_as_run(ctx.endpoints.talosctl, ctx.endpoints.talosconfig)
    kubectl = kubectl_as_run(ctx.endpoints.kubectl, ctx.endpoints.kubeconfig)
    helm = helm_as_run(ctx.endpoints.helm, ctx.endpoints.kubeconfig)
    rewrite_runnable(result, lambda text: helm(kubectl(talosctl(text))))
    return result


# ---------------------------------------------------------------------------------------------------------
# Notebook parameters


def injected_parameter_names(history: Sequence[str]) -> list[str]:
    """Names papermill injected (its cell starts with ``# Parameters``), from the kernel's input history."""
    names: list[str] = []
    for source in history:
        if not source.lstrip().startswith("# Parameters"):
            continue
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        for node in tree.body:
            targets = node.targets if isinstance(node, ast.Assign) else []
            if isinstance(node, ast.AnnAssign):
                targets = [node.target]
            names += [t.id for t in targets if isinstance(t, ast.Name)]
    return names


def check_notebook_parameters(names: Iterable[str], declared: Sequence[str] = NOTEBOOK_PARAMETERS) -> None:
    problems = []
    for name in names:
        if name in declared:
            continue
        close = difflib.get_close_matches(name, declared, n=1)
        suggestion = f"did you mean {close[0]!r}? " if close else ""
        problems.append(
            ParameterProblem(
                "notebook parameters",
                name,
                f"unknown notebook parameter; {suggestion}notebook parameters: {', '.join(declared)}; "
                "other settings go in the params file or in overrides (KEY=VALUE)",
            )
        )
    if problems:
        raise ParametersInvalid(problems)


def _kernel_history() -> list[str]:
    # Imported here: in a kernel IPython is loaded already, and ``runbook run`` need not load it.
    from IPython import get_ipython  # noqa: PLC0415 - lazy (CLI start-up)

    shell = get_ipython()
    if shell is None:
        return []
    history = shell.user_ns.get("In", [])
    return [h for h in history if isinstance(h, str)]


def load(params_file: str | None, *, apply: bool | None, overrides: Sequence[str]) -> Params:
    values = {"apply": apply} if apply is not None else None
    return load_params(params_file or None, list(overrides), values)


# ---------------------------------------------------------------------------------------------------------
# The step call


def journal_file(result_file: Path) -> Path:
    """Where a step's journal is appended as it happens (next to its result): read when it never ends."""
    return result_file.with_name(result_file.stem + ".journal.jsonl")


def _step_journal() -> Journal:
    target = os.environ.get(RESULT_FILE_ENV)
    if not target:
        return Journal()
    sink = journal_file(Path(target))
    sink.parent.mkdir(parents=True, exist_ok=True)
    return Journal(sink=sink)


def _write_result(payload: dict[str, Any]) -> None:
    target = os.environ.get(RESULT_FILE_ENV)
    if not target:
        return
    path = Path(target)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, default=str) + "\n", encoding="utf-8")


def _payload(
    item: StepSpec, params: Params, journal: Journal, result: StepResult, plan: StepResult | None
) -> dict[str, Any]:
    return {
        "step": item.name,
        "status": result.status,
        "ok": result.ok,
        "summary": result.summary(),
        "result": result.to_dict(),
        "plan_shown": plan.to_dict() if plan is not None else None,
        "journal": [e.to_dict() for e in journal.entries],
        "params": params.public_dict(),
    }


def _interactive_recorder(
    item: StepSpec, params: Params, journal: Journal, params_file: str | None, overrides: Sequence[str]
) -> Recorder | None:
    """Outside ``runbook run`` (which records the run itself), approvals get their own sealed record."""
    if os.environ.get(RESULT_FILE_ENV):
        return None
    from .interactive_record import InteractiveRecorder  # noqa: PLC0415 - lazy (kernel start-up)

    return InteractiveRecorder(
        item.name, item.notebook, params, journal, params_file=params_file, overrides=tuple(overrides)
    )


def _check_lists(**values: object) -> None:
    """``nodes`` and ``overrides`` must be lists of text. Why: ``papermill -p nodes '["10.5.0.11"]'`` passes the
    text, which was read one character at a time (``unknown node(s) [, ", 1, 0 …``; a cloud-user walkthrough,
    7 Dec 2026); papermill gives a list only through ``-y``/``-f`` (YAML)."""
    problems = [
        ParameterProblem(
            "notebook parameters",
            name,
            f"must be a list of text, not {type(value).__name__} {value!r}; with papermill, pass a list as YAML: "
            f"`papermill NOTEBOOK OUT -y '{name}: [...]'` (-p passes text)",
        )
        for name, value in values.items()
        if value is not None and not _text_list(value)
    ]
    if problems:
        raise ParametersInvalid(problems)


def _text_list(value: object) -> bool:
    return isinstance(value, (list, tuple)) and all(isinstance(item, str) for item in value)


def run_step(
    step: str,
    *,
    params_file: str | None = None,
    apply: bool | None = None,
    nodes: Sequence[str] | None = None,
    overrides: Sequence[str] = (),
    show: bool = True,
    check_injected: bool = True,
) -> StepResult:
    """Run one runbook step the way its notebook does; raise :class:`StepFailed` when it fails.

    ``apply`` None takes the parameter file's value (default false: plan and dry-run only).
    """
    item = spec(step)
    if check_injected:
        check_notebook_parameters(injected_parameter_names(_kernel_history()))
    _check_lists(nodes=nodes, overrides=overrides)
    params = load(params_file, apply=apply, overrides=overrides)
    fn = step_function(step)
    if item is ROLLBACK:  # its evidence, read and checked before anything runs (rollback_records)
        from .rollback_records import load_evidence  # noqa: PLC0415 - lazy (only this step reads records)

        fn = functools.partial(fn, evidence=load_evidence(params, suggest=True))
    journal = _step_journal()
    ctx = connect(params, journal=journal)
    if os.environ.get(RESULT_FILE_ENV):  # runbook run follows the rollout's events (live_events.py)
        ctx.events = Events(file_sink(events_file(Path(os.environ[RESULT_FILE_ENV])), item.name))
    # unknown nodes fail here, before anything runs; addresses become the names the gate's picker shows (an
    # address failed there with "Invalid selection": notebook audit, 7 Dec 2026)
    only = [node.name for node in ctx.nodes(list(nodes))] if nodes else None
    plan: StepResult | None = None
    if item.changes_cluster:
        result, plan = _run_gated(
            item, fn, ctx, params, journal, only=only, show=show, source=(params_file, overrides)
        )
    else:
        result = _call(fn, ctx, only=only, steps=run_steps())
        if show:
            show_html(render_html(result, title=item.title))
    _write_result(_payload(item, params, journal, result, plan if plan is not result else None))
    if not result.ok:
        raise StepFailed(failure_text(result), hint=failure_hint(result))
    return result


def _run_gated(
    item: StepSpec,
    fn: Callable[..., StepResult],
    ctx: Context,
    params: Params,
    journal: Journal,
    *,
    only: list[str] | None,
    show: bool,
    source: tuple[str | None, Sequence[str]],
) -> tuple[StepResult, StepResult | None]:
    """A step that changes the cluster: planned, shown, and applied only through its approval gate.

    Returns the result and the plan that was shown.  ``params`` are the notebook's as loaded (the record's),
    not ``ctx.params``, which carry the simulator's chart repository.  ``source`` (the parameter file and overrides) goes into
    the record an interactive approval writes.  Only the gated steps import the gate (and ipywidgets,
    ~0.08 s): every step notebook pays its imports in a fresh kernel, so a read-only step should not pay for
    widgets it never shows.
    """
    from .gates import gated  # noqa: PLC0415 - lazy (kernel start-up)

    gate: ApprovalGate | None = None

    def plan_fn(chosen: list[str] | None) -> StepResult:
        return _call(fn, ctx, only=chosen, apply=False, steps=run_steps())

    def apply_fn(chosen: list[str] | None, progress: Progress) -> StepResult:
        run_id = os.environ.get(RUN_ID_ENV) or None
        return _call(fn, ctx, only=chosen, apply=True, progress=progress, run_id=run_id, steps=run_steps())

    def on_applied(applied: StepResult) -> None:
        _write_result(_payload(item, params, journal, applied, gate.shown if gate else None))

    result, gate = gated(
        item.name,
        plan_fn,
        apply_fn,
        apply=params.apply,
        nodes=[n.name for n in params.nodes],
        selected=only,
        show=show,
        on_applied=on_applied,
        title=item.title,
        recorder=_interactive_recorder(item, params, journal, *source),
    )
    if gate is not None:
        GATES[item.name] = gate
    return result, gate.shown if gate else None


def _rollout_line(params: Params, nodes: int) -> str:
    """How the config-patch and image steps will roll out over ``nodes`` GPU nodes (the schedule the plan
    shows, model/rollout.py), with the budget as written (``"5%"``) when it is a percentage.  Nodes already
    done are skipped, so a step may change fewer."""
    rollout = params.rollout
    text = schedule(
        nodes,
        concurrency=params.rollout_concurrency,
        canary=rollout.canary,
        max_failures=rollout.max_failures,
        pause_seconds=rollout.pause_seconds,
    ).describe()
    percent = isinstance(rollout.max_failures, str)
    budget = f" (rollout.max_failures {rollout.max_failures})" if percent else ""
    return text.removeprefix(NOTE_PREFIX) + budget


def overview(params_file: str | None, *, overrides: Sequence[str] = (), show: bool = True) -> str:
    """The validated parameters' plan as a short table (pure: nothing is contacted)."""
    check_notebook_parameters(injected_parameter_names(_kernel_history()), declared=("params_file",))
    params = load(params_file, apply=None, overrides=overrides)
    plan = build_plan(params)
    rows = [
        ("cluster", f"{plan.cluster} ({plan.target})"),
        ("Talos", plan.talos_version),
        ("driver", f"{plan.driver_flavor}" + (f", {plan.track} track" if plan.track else "")),
        ("extensions", ", ".join(plan.extensions)),
        ("installer image", plan.installer_image or "-"),
        (
            "Kubernetes layer",
            f"{plan.kubernetes_layer}: {plan.helm.chart} {plan.helm.version} in {plan.helm.namespace}",
        ),
        (
            "GPU nodes",
            f"{len(plan.nodes)} ({', '.join(n.name for n in plan.nodes[:5])}{' …' if len(plan.nodes) > 5 else ''})",
        ),
        ("rollout", f"{_rollout_line(params, len(plan.nodes))}; apply: {plan.apply}"),
    ]
    html = (
        "<table>"
        + "".join(f"<tr><th>{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in rows)
        + "</table>"
    )
    html += "".join(f"<p>note: {escape(n)}</p>" for n in plan.notes)
    if show:
        show_html(html)
    return html
