"""What a run's ``record.json`` says: the step outcomes, the journal folded for reading, the verdict.

Why a module of its own: ``runbook run`` (:mod:`.runner`) and a step applied from JupyterLab
(:mod:`.interactive_record`) write the same record format, and neither should reach into the other's
internals for it.  Everything here is pure: it shapes data, the callers write and seal it
(:func:`.records.seal`).
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runbook_lib.model import rollout
from runbook_lib.model.text import any_node
from runbook_lib.notebook.render import CONTINUATION, config_diff
from runbook_lib.steps.dryrun import REFUSED

#: The runbook's checkout: its git commit goes into every record (``records.git_info``).
REPO = Path(__file__).resolve().parents[2]


@dataclass
class StepOutcome:
    name: str
    notebook: str
    status: str
    duration_s: float = 0.0
    summary: str = ""
    result: dict[str, Any] | None = None
    plan_shown: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    journal: list[dict[str, Any]] = field(default_factory=list)

    def to_record(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "notebook": self.notebook,
            "status": self.status,
            "duration_s": round(self.duration_s, 3),
            "summary": self.summary,
        }
        if self.result is not None:
            out["result"] = group_nodes(self.result)
        if self.plan_shown is not None:
            out["plan_shown"] = self.plan_shown
        if self.error is not None:
            out["error"] = self.error
        return out


@dataclass
class RunOutcome:
    """A sealed run as ``runbook run`` reports it on the terminal.

    ``scrub`` blanks the run's secrets in the report, as the seal blanks them in the record: the steps' results
    and errors here are the ones read before the seal, and a terminal or CI log leaves the machine too (a
    kubeconfig token that ended in a newline was printed twice, quoted by the client's ``Invalid header value``).
    """

    record: Path
    outcome: str
    steps: list[StepOutcome]
    manifest_sha256: str
    changes: int
    failed_step: str | None = None
    note: str = ""
    scrub: Callable[[str], str] = field(default=lambda text: text, repr=False)
    apply: bool = False
    """The run was approved (``--apply``, ``--set apply=true`` or ``apply: true`` in its file)."""

    @property
    def ok(self) -> bool:
        return self.failed_step is None

    def report(self, omit_notes: tuple[str, ...] = ()) -> str:
        """The terminal's report; ``omit_notes``: how notes begin that the caller printed another way."""
        lines = [
            f"{s.name:<13} {s.status:<10} {s.duration_s:6.1f} s  {step_line_summary(s.summary, s.name, s.status)}".rstrip()
            for s in self.steps
        ]
        for step in self.steps:
            planned = plan_lines(step.result) if step.status == "planned" else []
            if planned:
                # the CUDA test changes nothing that stays (its pods are deleted), which an --apply run says too:
                # "would change" contradicted it (operator walkthrough, stop 52)
                what = (
                    "would run (only with --apply; its test pods are deleted after)"
                    if step.name == "cuda-test"
                    else "would change (applied only with --apply)"
                )
                lines += [f"\n{step.name} {what}:", *planned]
        lines += step_notes(self.steps, omit_notes)
        refused = [line for step in self.steps for line in refusal_lines(step.name, step.result)]
        if refused:
            lines += [
                f"\n{REFUSED} to this kubeconfig's user (a plan names them and goes on):",
                *refused,
            ]
        if self.failed_step:
            failed = next(s for s in self.steps if s.name == self.failed_step)
            if failed.error:
                text = compact_failure(str(failed.error.get("evalue", "")).splitlines() or [""])
                text[0] = step_line_summary(text[0], failed.name, "failed")
                shown = cut_failure(text)
                cut = "\n  … (the full diagnosis is in the record)" if len(shown) < len(text) else ""
                lines.append(f"\nstopped at {self.failed_step}: " + "\n".join(shown) + cut)
        if self.note:
            lines.append(self.note)
        lines.append(f"record: {self.record}")
        # The anchor: kept outside the records folder (a CI log), it proves the newest record too.
        folder = shlex.quote(
            str(self.record.parent)
        )  # the folder it is checked in: not whatever ./records is
        lines.append(f"anchor: runbook records verify --records {folder} --expect {self.manifest_sha256}")
        return self.scrub("\n".join(lines) + "\n")


#: Notes of the steps that ran (not planned) ``runbook run``'s report shows at most; all are in the record.
NOTES_MAX = 12


def step_notes(steps: list[StepOutcome], omit: tuple[str, ...] = ()) -> list[str]:
    """The notes of the steps that ran, each under its step's name, for the terminal ([] without any).

    Why: a step that passes may still have something to say a person must act on (verify: a GPU node someone
    else cordoned; the config-patch step: a default runtime deferred to the image step; cuda-test: test pods it
    could not delete), and ``runbook run`` printed only the step lines, so headless those lived only in the
    executed notebooks (operator walkthrough, 6 Dec 2026). A planned step's notes are in its plan lines."""
    notes = [
        f"  {step.name}: {note}"
        for step in steps
        if step.status != "planned" and step.result
        for note in step.result.get("notes") or []
        if not str(note).startswith(("plan only", rollout.NOTE_PREFIX, *omit))  # the batch lines said it
    ]
    said: dict[str, str] = {}  # the image step and verify both note an unmarked cordon: once (review)
    for line in notes:
        said.setdefault(line.split(": ", 1)[1], line)
    notes = list(said.values())
    if len(notes) > NOTES_MAX:
        notes = [*notes[:NOTES_MAX], f"  … ({len(notes) - NOTES_MAX} more in the record)"]
    return ["\nnotes:", *notes] if notes else []


#: Lines of a failed step's diagnosis ``runbook run``'s report shows at most; the whole of it is in the record.
STOPPED_LINES_MAX = 16
#: A shell here-document's opening (``<<EOF``, ``<<-'EOF'``): its word, which a line of its own ends.
_HEREDOC = re.compile(r"(?<!<)<<(?!<)-?\s*(['\"]?)\\?([A-Za-z_][A-Za-z0-9_]*)\1")


#: A fix's first line in a diagnosis: ``    fix: …``, or ``    fix (<check>): …`` where the node's line said the
#: check's message (``render.failure_text``).
_FIX_LINE = re.compile(r"    fix(?: \([^)]*\))?: ")


def _heredoc_word(line: str) -> str:
    """The word that ends the here-document a fix's line opens (``<<'EOF'``), or "". Only a fix's lines count:
    its first (``    fix: …``, ``    fix (<check>): …``) and the ones it continues with flush left; tool output quoted under a node
    (``1 << shift``, ``<<<``) is not a command (review of c62d224)."""
    if not (_FIX_LINE.match(line) or (line and not line[0].isspace())):
        return ""
    found = _HEREDOC.search(line)
    return found.group(2) if found else ""


def cut_failure(lines: list[str]) -> list[str]:
    """At most :data:`STOPPED_LINES_MAX` of a diagnosis's lines, never ending inside a fix's here-document.

    Why: a fix such as ``talosctl … patch mc --patch @- <<'EOF'`` cut before its ``EOF`` line waits for input
    when pasted, and what was typed next becomes the patch (review of 7470dc3). Such a fix goes whole, its
    command line included, and the record holds it."""
    if len(lines) <= STOPPED_LINES_MAX:
        return lines
    kept = lines[:STOPPED_LINES_MAX]
    opened: int | None = None
    word = ""
    for index, line in enumerate(kept):
        if opened is None:
            word = _heredoc_word(line)
            opened = index if word else None
        elif line.strip() == word:
            opened = None
    return kept if opened is None else kept[: max(opened, 1)]


def compact_failure(lines: list[str]) -> list[str]:
    """A failed step's diagnosis for the terminal: unchanged when it fits; else each block (a node's line or a
    step check's, ``  <name>: …``) keeps its first continuation lines and its checks with their causes and
    fixes, and the rest of what it quotes (a talosctl upgrade's sequence errors) is said to be in the record.

    Why: a hung boot's node line quoted ten lines of talosctl's output, which filled the report's budget, so the
    likely cause and the fix (the checks below it) were cut (operator walkthrough, 6 Dec 2026). The first
    continuation lines stay: a message's cause may be on its second line (helm's ``Error: …``, a validation
    error's ``* …``: review)."""
    if len(lines) <= STOPPED_LINES_MAX:
        return lines
    out: list[str] = []
    left: int | None = None  # continuation lines still shown of the current block; None: every line is shown
    word = ""  # the here-document a fix is in: its lines (a patch's "  kernel: {}") are the fix's, kept whole
    for line in lines:
        if word:
            word = "" if line.strip() == word else word
            out.append(line)
            continue
        # a continuation line is indented by render.CONTINUATION (flush left in records before 7 Dec 2026)
        continued = not line.startswith("  ") or line.startswith(CONTINUATION)
        if not continued and not line.startswith("   "):  # a node's or a check's line (or the hint)
            left = QUOTED_KEPT
            out.append(line)
        elif not continued:  # the node's checks: what they say follows, fix commands included
            left = None
            out.append(line)
        elif left is None or left > 0:
            left = None if left is None else left - 1
            out.append(line)
        elif not out[-1].endswith(_QUOTED):
            out.append(f"    {_QUOTED}")
        if out[-1] is line:  # shown: a here-document it opens is shown whole (one left out stays out)
            word = _heredoc_word(line)
    return out


#: Continuation lines of a node's or a check's line kept in the terminal when a diagnosis is compacted.
QUOTED_KEPT = 3
_QUOTED = "(the tool's output: in the record)"


def refusal_lines(step: str, result: dict[str, Any] | None) -> list[str]:
    """The checks of a plan that passed only because it is a plan: writes the kubeconfig's user may not make
    (preflight's and rollback's permission checks, a dry-run write the API server refused: steps/dryrun.py),
    each with its fix. Why: they passed, so the terminal showed none of them, only a count in a note; a reviewer
    or a CI job planning with a read-only identity saw a green plan (operator walkthrough, 6 Dec 2026)."""
    lines: list[str] = []
    for check in (result or {}).get("checks") or []:
        message = str(check.get("message", ""))
        if check.get("ok") and REFUSED in message:
            lines.append(f"  {step}: {check.get('name')}: {message}")
            lines += [f"    fix: {check['fix']}"] if check.get("fix") else []
    return lines


def step_line_summary(summary: str, name: str, status: str) -> str:
    """The step's summary without the step's name and status the line already shows, its counts named as nodes.

    Why: the line read ``image  changed  20.0 s  image-upgrade: changed (3 changed)``, and the kubernetes step's
    ``kubernetes: changed (3 ok)`` looked like a contradiction (found by an operator walkthrough): the counts are
    the nodes', the status the step's (a chart installed on nodes that each were already fine)."""
    prefix = f"{name}: {status} ("
    if summary.startswith(prefix) and summary.endswith(")"):
        return "nodes: " + summary[len(prefix) : -1]
    return summary


#: Lines a planned step shows in ``runbook run``'s report at most; the whole plan is in the record.
PLAN_LINES_MAX = 40


def plan_lines(result: dict[str, Any] | None) -> list[str]:
    """What a planned step would change, for the terminal: each group of nodes with its machine-config diff
    (talosctl's dry run), else each distinct planned node line with its nodes and what they would run, after the
    cluster-wide changes (``data.changes``); then the step's notes.

    Why: a plan-only ``runbook run`` printed ``config-patch planned (3 planned)`` and nothing of the diff, which
    lived only in the executed notebook (found by an operator walkthrough): headless, the change could not be
    reviewed before ``--apply``. Identical nodes are said once, so 1,000 nodes print as one group."""
    if not result:
        return []
    grouped: list[str] = []
    for group in (result.get("data") or {}).get("groups") or []:
        if isinstance(group, dict) and group.get("dry_run"):
            grouped.append(f"  {_names(group.get('nodes') or [])}: machine config diff (talosctl's dry run):")
            grouped += ["    " + line for line in config_diff(str(group["dry_run"]))]
    # the cluster-wide changes first: a rollback removes its Kubernetes layer before any node
    lines = [f"  would: {change}" for change in _planned_changes(result)]
    lines += grouped or node_lines(result, "planned", diffs=True)
    lines += [f"  note: {n}" for n in result.get("notes") or [] if not str(n).startswith("plan only")]
    if len(lines) > PLAN_LINES_MAX:
        lines = [*lines[:PLAN_LINES_MAX], "  … (the whole plan is in the record)"]
    return lines


def _planned_changes(result: dict[str, Any]) -> list[str]:
    """The cluster-wide changes a step plans (``data.changes``: the Kubernetes step's RuntimeClass, labels, Helm
    release with its values), node labels folded into one line per label.

    Why: the Kubernetes step's plan showed only "no allocatable nvidia.com/gpu yet" per node, not the chart,
    namespace and values it would install (found by an operator walkthrough)."""
    changes = (result.get("data") or {}).get("changes")
    if not isinstance(changes, list):
        return []
    labelled: dict[str, list[str]] = {}  # label -> its nodes, in the step's order
    for parts in (str(c).split(" ") for c in changes):
        if parts[:2] == ["label", "node"] and len(parts) == 4:
            labelled.setdefault(parts[3], []).append(parts[2])
    out: list[str] = []
    for change in map(str, changes):
        parts = change.split(" ")
        if parts[:2] != ["label", "node"] or len(parts) != 4:
            out.append(change)
        elif parts[2] == labelled[parts[3]][0]:  # the label's first node: one line for all of them
            out.append(f"label {parts[3]} on {_names(labelled[parts[3]])}")
    return out


def node_lines(result: dict[str, Any] | None, status: str, *, diffs: bool = False) -> list[str]:
    """Each distinct message of the step's nodes in ``status``, with the nodes that have it (1,000 alike: one
    line). ``diffs``: each with what the nodes' ``diff`` says they would run (the image step's upgrade command,
    the rollback's removal patches and installer), the node's address written ``<node>`` so alike nodes stay one
    group. Why: a rollback plan said only "back to Talos v1.12.7, schematic …; remove the runbook's config patch",
    not the patches and the installer that Approve runs, which the forward plan shows (operator walkthrough)."""
    groups: dict[tuple[str, str], list[str]] = {}
    for node in (result or {}).get("nodes") or []:
        if node.get("status") == status and node.get("message"):
            diff = (
                any_node(str(node.get("diff") or ""), node.get("address"), node.get("node")) if diffs else ""
            )
            groups.setdefault((str(node["message"]), diff), []).append(str(node.get("node")))
    lines: list[str] = []
    for (message, diff), names in groups.items():
        lines.append(f"  {_names(names)}: {message}")
        lines += ["    " + line for line in diff.splitlines()]
    return lines


def _names(names: list[Any]) -> str:
    shown = ", ".join(str(n) for n in names[:3])
    return shown + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def journal_record(step: str, entry: dict[str, Any]) -> dict[str, Any]:
    """A journal entry as the record keeps it: what ran, how it ended, and stderr only when it failed."""
    keep = {"kind", "summary", "argv", "exit_code", "duration_s", "changes_cluster", "diff", "at"}
    keep.add("interrupt")  # finished after the interrupt, or in flight then (see interrupts.read_journal)
    out = {"step": step, **{k: v for k, v in entry.items() if k in keep and v not in (None, "", [])}}
    if entry.get("exit_code") not in (0, None) and entry.get("stderr"):
        out["stderr"] = entry["stderr"]
    return out


def node_of(argv: list[str]) -> tuple[list[str], str | None]:
    """A talosctl argv with the ``-n`` value replaced by a placeholder, and that value.

    Only talosctl's ``-n`` is ``--nodes``; helm's (and kubectl's) ``-n`` is ``--namespace``, which must stay.
    """
    if Path(argv[0]).name.startswith("talosctl") and "-n" in argv:
        i = argv.index("-n")
        if i + 1 < len(argv):
            return [*argv[: i + 1], "<nodes>", *argv[i + 2 :]], argv[i + 1]
    return argv, None


def fold_commands(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per distinct successful read-only command of a step, listing the nodes it ran on.

    Why: talosctl refuses ``read`` for several nodes, so a fleet-wide verify journals one identical command
    per node; at 1,000 nodes that would dominate the record.  Changes and failures are never folded.
    """
    out: list[dict[str, Any]] = []
    folded: dict[tuple[str, str], dict[str, Any]] = {}
    for entry in entries:
        argv = entry.get("argv")
        if not argv or entry.get("changes_cluster") or entry.get("exit_code") not in (0, None):
            out.append(entry)
            continue
        generic, node = node_of(list(argv))
        if node is None or "," in node:
            out.append(entry)
            continue
        key = (entry["step"], json.dumps(generic))
        if key in folded:
            folded[key]["nodes"].append(node)
            folded[key]["duration_s"] = round(
                folded[key].get("duration_s", 0.0) + entry.get("duration_s", 0.0), 3
            )
            continue
        item = {**entry, "argv": generic, "nodes": [node]}
        folded[key] = item
        out.append(item)
    return out


#: Read-only commands naming more nodes than this keep a summary of their ``-n`` list in the record.
NODE_LIST_LIMIT = 10


def abbreviate_node_lists(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Read-only fan-out calls name every node in ``-n``: keep the count and ends, not 1,000 addresses.

    Commands that changed the cluster keep their full argv: those are the ones a reviewer re-runs.
    """
    out = []
    for entry in entries:
        argv = entry.get("argv")
        kept = entry
        if argv and not entry.get("changes_cluster") and "-n" in argv:
            i = argv.index("-n")
            nodes = argv[i + 1].split(",") if i + 1 < len(argv) else []
            if len(nodes) > NODE_LIST_LIMIT:
                summary = f"<{len(nodes)} nodes: {nodes[0]} … {nodes[-1]}>"
                kept = {**entry, "argv": [*argv[: i + 1], summary, *argv[i + 2 :]]}
        out.append(kept)
    return out


def group_nodes(result: dict[str, Any]) -> dict[str, Any]:
    """A step result with nodes whose outcome is identical stored once, with the list of their names.

    Why: at fleet scale most nodes report the same thing; the record keeps every node's outcome (each
    name appears in exactly one group) at a fraction of the size.  Addresses are in ``params``.
    """
    nodes = result.get("nodes")
    if not isinstance(nodes, list):
        return result
    groups: dict[str, dict[str, Any]] = {}
    for node in nodes:
        common = {k: v for k, v in node.items() if k not in ("node", "address")}
        key = json.dumps(common, sort_keys=True, default=str)
        groups.setdefault(key, {"nodes": [], **common})["nodes"].append(node.get("node"))
    out = {k: v for k, v in result.items() if k != "nodes"}
    out["node_groups"] = list(groups.values())
    return out


def compact_plan(plan: dict[str, Any]) -> dict[str, Any]:
    """The plan with per-node fields dropped where they equal the cluster-wide ones (said once)."""
    nodes = []
    for node in plan.get("nodes", []):
        same = (
            node.get("schematic_id") == plan.get("schematic_id")
            and node.get("installer_image") == plan.get("installer_image")
            and node.get("extensions") == plan.get("extensions")
        )
        nodes.append({"name": node["name"], "address": node["address"]} if same else node)
    return {**plan, "nodes": nodes}


def outcome_word(
    *, interrupted: bool, failed_step: str | None, outcomes: list[StepOutcome], changed: bool
) -> str:
    """The run's one-word verdict, the first thing a reader of the record looks at."""
    if interrupted:
        return "interrupted"
    if failed_step:
        return "failed"
    if any(o.status == "planned" for o in outcomes):
        return "planned"
    return "changed" if changed else "unchanged"


#: The steps that change the cluster when applied; the others only look at it (cuda-test's pods are removed).
CHANGING_STEPS = ("config-patch", "image", "kubernetes", "rollback")


def run_note(
    *, apply: bool, failed_step: str | None, changed: bool, stop_note: str, steps: list[str] | None = None
) -> str:
    """The sentence that says why a run changed nothing, or where a plan-only run stopped. ``steps``: the run's
    (None: every step). Why: an ``--apply`` run of checks only (``--steps cuda-test``) was said to have found
    the cluster "already in the planned state", which it never looked at."""
    if apply and not failed_step and not changed:
        if steps is not None and not set(steps) & set(CHANGING_STEPS):
            return f"nothing changed on the cluster: the run's steps ({', '.join(steps)}) only check it"
        return "nothing changed on the cluster: every step found it already in the planned state"
    if not apply and not changed:
        return stop_note or "plan only: nothing was changed on the cluster"
    return stop_note


def verification(outcomes: list[StepOutcome]) -> dict[str, Any]:
    """verify's and cuda-test's verdicts; the full per-node results are in the record's ``steps``."""
    return {
        o.name: {
            "status": o.result.get("status"),
            "counts": o.result.get("counts"),
            "failing": [n["node"] for n in o.result.get("nodes", []) if n.get("status") == "failed"],
            # what verify saw, one line per distinct node inventory (the groups are in results/verify.json)
            "checked": [g.get("line") for g in (o.result.get("data") or {}).get("inventory") or []],
        }
        for o in outcomes
        if o.name in ("verify", "cuda-test") and o.result
    }


def journal_sections(outcomes: list[StepOutcome]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The record's ``changes`` (every call that changed the cluster, in full) and ``commands`` (every call,
    repeated reads folded and long node lists abbreviated)."""
    return split_journal([journal_record(o.name, e) for o in outcomes for e in o.journal])


def split_journal(entries: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """:func:`journal_sections` of entries already in the record's form (:func:`journal_record`)."""
    changes = [e for e in entries if e.get("changes_cluster")]
    return changes, abbreviate_node_lists(fold_commands(entries))
