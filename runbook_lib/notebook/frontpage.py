"""A record's front page: ``index.html``, what a run did, readable at a glance from disk.

Why a page and not only ``record.json``: a record is six notebooks and a JSON file, and the person who
reviews a change (often days later, often not the operator) needs who ran it, when, from which commit, what
it changed and which nodes failed and why, without a server, a Jupyter install or network access.  So the
page is one self-contained file: inline CSS, one small inline script (the click panel), no external
resources.  It is written before the record is sealed, so it is scrubbed of secrets like every record file
and listed in ``SHA256SUMS`` (an edited page is detected by ``runbook records verify``).

Why it stays small at fleet scale: one element per node in the grid, each distinct diagnosis stored once
(nodes point to it by index), identical changes shown once with the nodes they went to, and the timeline
folded into at most :data:`TIMELINE_BARS` bars per step.

The timeline draws the rollout batches the config-patch and image steps log in their result
(``data["rollout"]``: nodes, start, duration, outcome; ``steps/patch.py`` ``log_batch``) and, on the same time
axis, each cluster-changing call by its journal time.  A step that has no batch log (a record from before
batches were logged, or a step interrupted before it returned its result) shows its calls only, and the page
says so.
"""

from __future__ import annotations

import html
import json
import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from string import Template
from typing import Any

import yaml

INDEX = "index.html"
#: Most bars drawn per step in the timeline; more calls are folded into this many time slices.
TIMELINE_BARS = 100
#: Up to this many nodes the grid shows each node's name in its cell; above, small squares.
LABELLED_NODES = 64
#: Most distinct changes shown; the rest are counted (all of them are in record.json).
CHANGE_GROUPS = 60
#: Rows of a step's batch table (failed batches are always listed); the rest are in results/<step>.json.
BATCH_ROWS = 200
#: Most "what verify checked" lines shown (one per group of identical nodes); the rest are in record.json.
CHECKED_LINES = 50
#: A node's worst status across the steps decides its colour (first = worst).
RANK = ("failed", "aborted", "planned", "changed", "unchanged", "ok", "skipped", "no-result")
_TITLE_MAX = 240


def write(path: Path, record: Mapping[str, Any]) -> None:
    """Write ``index.html`` into the record directory ``path`` (called by ``seal`` before it scrubs).

    Why any error is caught: a record that a page bug left unsealed would lose the run's evidence, so a
    page that cannot be built is replaced by one that says so, and the record is sealed all the same.
    """
    try:
        text = render(path, record)
    except Exception as exc:  # see the docstring: sealing must not depend on the page
        text = _fallback(path, exc)
    (path / INDEX).write_text(text, encoding="utf-8")


def _fallback(path: Path, error: Exception) -> str:
    body = (
        f"<h1>{_e(path.name)}</h1><p>The front page could not be built ({_e(type(error).__name__)}: "
        f"{_e(str(error)[:300])}); <code>record.json</code> holds everything the run recorded.</p>"
    )
    return _PAGE.substitute(title=_e(path.name), css=_CSS, body=body, script="")


def render(path: Path, record: Mapping[str, Any]) -> str:
    """The page for the record in ``path``: ``record`` is what ``seal`` writes to record.json, and files of
    the directory (the notebooks, their HTML, an aborted run's results) are linked or read for what it
    lacks.  Every value is escaped: node messages and command output are text, never markup."""
    steps = _steps(path, record)
    body = "".join(
        (
            _header(path, record),
            _steps_section(path, steps),
            _grid_section(record, steps),
            _checked_section(record, steps),
            _timeline_section(record, steps),
            _changes_section(record),
            _params_section(record),
        )
    )
    title = f"{record.get('cluster', '?')} · {record.get('outcome', '?')} · {path.name}"
    return _PAGE.substitute(title=_e(title), css=_CSS, body=body, script=_SCRIPT)


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _mapping(record: Mapping[str, Any], key: str) -> dict[str, Any]:
    value = record.get(key)
    return value if isinstance(value, dict) else {}


def _dicts(value: object) -> list[dict[str, Any]]:
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


# ---------------------------------------------------------------------------------------------------------
# Steps and their per-node results


@dataclass
class _Step:
    name: str
    status: str
    duration: object
    summary: str
    notebook: str | None
    groups: list[dict[str, Any]] = field(default_factory=list)
    error: str = ""
    rollout: list[dict[str, Any]] = field(default_factory=list)
    """The batches the step ran (``data["rollout"]``), in order."""
    planned: list[list[str]] = field(default_factory=list)
    """The node names of each batch of the step's schedule (``data["batches"]``)."""
    checked: list[str] = field(default_factory=list)
    """Verify's "what was checked" lines (``data["inventory"]``), one per group of identical nodes."""


def _steps(path: Path, record: Mapping[str, Any]) -> list[_Step]:
    """The record's steps with their per-node groups; an aborted run's come from ``results/<step>.json``."""
    out = []
    for step in _dicts(record.get("steps")):
        name = str(step.get("name", "?"))
        result = step.get("result")
        if not isinstance(result, dict):
            result = _result_file(path, name)
        notebook = step.get("notebook") or _notebook_of(path, name)
        data = _mapping(result, "data")
        planned = data.get("batches")
        out.append(
            _Step(
                name,
                str(step.get("status", "?")),
                step.get("duration_s"),
                str(step.get("summary", "")),
                str(notebook) if notebook else None,
                _groups(result),
                _error(step.get("error")),
                _dicts(data.get("rollout")),
                [list(map(str, b)) for b in planned if isinstance(b, list)]
                if isinstance(planned, list)
                else [],
                [str(g.get("line")) for g in _dicts(data.get("inventory")) if g.get("line")],
            )
        )
    return out


def _notebook_of(path: Path, step: str) -> str | None:
    """An aborted run's notebook of ``step``: ``runbook run``'s, or an approval's rebuilt one."""
    for pattern in (f"[0-9][0-9]-{step}.ipynb", f"[0-9][0-9]-{step}.interactive.ipynb"):
        found = next(iter(sorted(path.glob(pattern))), None)
        if found is not None:
            return found.name
    return None


def _error(error: object) -> str:
    """What a step that raised recorded (``ename: evalue``), or nothing."""
    if not isinstance(error, dict) or not error.get("ename"):
        return ""
    return f"{error['ename']}: {error.get('evalue', '')}"


def _result_file(path: Path, name: str) -> dict[str, Any]:
    try:
        data = json.loads((path / "results" / f"{name}.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return {}
    result = data.get("result") if isinstance(data, dict) else None
    return result if isinstance(result, dict) else {}


def _groups(result: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Node groups as ``runbook run`` stores them, or one group per node from an ungrouped result."""
    groups = _dicts(result.get("node_groups"))
    if groups:
        return groups
    return [{**node, "nodes": [node.get("node")]} for node in _dicts(result.get("nodes"))]


def _header(path: Path, record: Mapping[str, Any]) -> str:
    outcome = str(record.get("outcome", "?"))
    who, code = _mapping(record, "who"), _mapping(record, "runbook")
    commit = code.get("commit") or code.get("note") or "unknown"
    dirty = " (working tree differed from it)" if code.get("dirty") else ""
    facts = [
        ("who", f"{who.get('user', '?')}@{who.get('host', '?')}" if who else "not recorded"),
        ("started", record.get("started", "?")),
        ("finished", record.get("finished", "not recorded")),
        ("duration", _seconds(record.get("duration_s"))),
        ("runbook commit", f"{commit}{dirty}"),
        ("parameters", record.get("params_file", "not recorded")),
        ("--set", ", ".join(map(str, record.get("overrides") or [])) or "none"),
        ("mode", _MODES.get(str(record.get("apply")), "not recorded")),
        ("target", record.get("target", "?")),
        ("previous record", _mapping(record, "previous").get("record", "none (first record)")),
    ]
    late = _mapping(record, "sealed_after_abort")
    if late:
        facts.append(("sealed after abort", f"{late.get('at')} by {late.get('user')}@{late.get('host')}"))
    rows = "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in facts)
    notes = [f"stopped at {record['failed_step']}"] if record.get("failed_step") else []
    notes += [str(record["note"])] if record.get("note") else []
    note = f"<p class=note>{_e(' · '.join(notes))}</p>" if notes else ""
    return (
        f'<header><h1>{_e(record.get("cluster", "?"))} <span class="outcome {_e(outcome)}">{_e(outcome)}</span>'
        f"</h1><p class=rec>{_e(path.name)}</p>{note}<dl>{rows}</dl></header>"
    )


_MODES = {"True": "apply", "False": "plan only"}


def _seconds(value: object) -> str:
    return f"{value} s" if isinstance(value, int | float) else "not recorded"


def _steps_section(path: Path, steps: list[_Step]) -> str:
    rows = []
    for step in steps:
        notebook = _link(path, step.notebook, step.notebook)
        rendered = _link(path, f"html/{Path(step.notebook).stem}.html", "HTML") if step.notebook else "—"
        rows.append(
            f'<tr><td>{_e(step.name)}</td><td><span class="st {_e(step.status)}">{_e(step.status)}</span></td>'
            f"<td class=num>{_e(_seconds(step.duration))}</td><td>{_e(step.summary)}{_pre_err(step.error)}</td>"
            f"<td>{notebook}</td><td>{rendered}</td></tr>"
        )
    head = "<tr><th>step</th><th>status</th><th>duration</th><th>summary</th><th>notebook</th><th>rendered</th></tr>"
    return f"<section><h2>Steps</h2><table>{head}{''.join(rows)}</table></section>"


def _pre_err(text: str) -> str:
    return f"<pre class=err>{_e(text)}</pre>" if text else ""


def _link(path: Path, rel: str | None, text: str | None) -> str:
    """A relative link to a file of the record, only when it is there (no dead links in a sealed record)."""
    if not rel or not (path / rel).is_file():
        return "—"
    return f'<a href="{_e(rel)}">{_e(text)}</a>'


# ---------------------------------------------------------------------------------------------------------
# The node grid


@dataclass
class _Node:
    name: str
    outcomes: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    @property
    def status(self) -> str:
        return min(
            (str(group.get("status")) for _step, group in self.outcomes), key=_rank, default="no-result"
        )


def _rank(status: str) -> int:
    return RANK.index(status) if status in RANK else RANK.index("no-result")


def _nodes(record: Mapping[str, Any], steps: list[_Step]) -> list[_Node]:
    """Every node of the run (the parameters' list, then any only a result names), worst first."""
    params = _mapping(record, "params")
    nodes = {str(n.get("name")): _Node(str(n.get("name"))) for n in _dicts(params.get("nodes"))}
    for step in steps:
        for group in step.groups:
            for name in group.get("nodes") or []:
                node = nodes.setdefault(str(name), _Node(str(name)))
                node.outcomes.append((step.name, group))
    return sorted(nodes.values(), key=lambda n: (_rank(n.status), _natural(n.name)))


def _natural(name: str) -> list[Any]:
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", name)]


def _grid_section(record: Mapping[str, Any], steps: list[_Step]) -> str:
    nodes = _nodes(record, steps)
    if not nodes or not any(n.outcomes for n in nodes):
        return "<section><h2>Nodes</h2><p>This record holds no per-node results.</p></section>"
    details: dict[str, int] = {}
    titles: list[str] = []
    labelled = len(nodes) <= LABELLED_NODES
    cells = []
    for node in nodes:
        text = _node_details(node)
        if text not in details:
            details[text] = len(details)
            titles.append(_node_title(node))
        index = details[text]
        title = _e(f"{node.name} · {node.status}{titles[index]}")
        label = _e(node.name) if labelled else ""
        cells.append(
            f'<button type=button class="n {_e(node.status)}" data-node="{_e(node.name)}" data-d={index} '
            f'title="{title}">{label}</button>'
        )
    data = json.dumps(list(details), separators=(",", ":")).replace("<", "\\u003c")
    size = "" if labelled else " small"
    return (
        f"<section><h2>Nodes ({len(nodes)})</h2>{_legend(nodes)}<p class=hint>Hover a node for its "
        f'outcome, click it for its diagnosis.</p><div class="grid{size}">{"".join(cells)}</div>'
        "<div id=panel hidden><h3></h3><div></div></div>"
        f'<script type="application/json" id=details>{data}</script></section>'
    )


def _legend(nodes: list[_Node]) -> str:
    counts: dict[str, int] = {}
    for node in nodes:
        counts[node.status] = counts.get(node.status, 0) + 1
    items = sorted(counts.items(), key=lambda item: _rank(item[0]))
    return (
        "<p class=legend>"
        + "".join(f'<span><i class="n {_e(s)}"></i>{_e(s)} {n}</span>' for s, n in items)
        + "</p>"
    )


def _failures(node: _Node) -> Iterable[tuple[str, dict[str, Any]]]:
    return ((step, group) for step, group in node.outcomes if group.get("status") == "failed")


def _node_title(node: _Node) -> str:
    """What the hover shows after the name and status: the first failure with its cause, else each step."""
    for step, group in _failures(node):
        checks = _dicts(group.get("failed"))
        message = group.get("message") or (checks[0].get("message") if checks else "")
        cause = next((c.get("cause") for c in checks if c.get("cause")), "")
        text = f" at {step}: {message}" + (f" (cause: {cause})" if cause else "")
        return text if len(text) <= _TITLE_MAX else text[: _TITLE_MAX - 1] + "…"
    return " — " + ", ".join(f"{step} {group.get('status')}" for step, group in node.outcomes)


def _node_details(node: _Node) -> str:
    """The click panel's HTML for a node (the same for every node with the same outcomes)."""
    rows = "".join(
        f'<tr><td>{_e(step)}</td><td><span class="st {_e(group.get("status"))}">{_e(group.get("status"))}'
        f"</span></td><td>{_e(group.get('message', ''))}</td></tr>"
        for step, group in node.outcomes
    )
    checks = "".join(
        f"<div class=check><b>{_e(step)} · {_e(check.get('name'))}</b>: {_e(check.get('message', ''))}"
        + (f"<p>cause: {_e(check['cause'])}</p>" if check.get("cause") else "")
        + (f"<p>fix:</p><pre>{_e(check['fix'])}</pre>" if check.get("fix") else "")
        + "</div>"
        for step, group in _failures(node)
        for check in _dicts(group.get("failed"))
    )
    return f"<table>{rows}</table>{checks}"


# ---------------------------------------------------------------------------------------------------------
# What verify checked


def _checked_section(record: Mapping[str, Any], steps: list[_Step]) -> str:
    """Verify's "what was checked" lines (one per group of identical nodes), as ``runbook records show``
    prints them: ``verification.<step>.checked``, else the lines of the step's grouped inventory."""
    verification = _mapping(record, "verification")
    blocks = []
    for step in steps:
        saved = verification.get(step.name)
        lines = saved.get("checked") if isinstance(saved, dict) else None
        lines = [str(line) for line in lines or step.checked if line]
        if not lines:
            continue
        shown = "".join(f"<li>{_e(line)}</li>" for line in lines[:CHECKED_LINES])
        more = len(lines) - CHECKED_LINES
        rest = f"<p>{more} more groups are in record.json.</p>" if more > 0 else ""
        label = f"<p>{_e(step.name)}:</p>" if step.name != "verify" else ""
        blocks.append(f"{label}<ul class=checked>{shown}</ul>{rest}")
    if not blocks:
        return ""
    return f"<section><h2>What verify checked</h2>{''.join(blocks)}</section>"


# ---------------------------------------------------------------------------------------------------------
# Timeline of the rollout batches and of the calls that changed the cluster


@dataclass
class _Call:
    step: str
    start: float
    end: float
    what: str
    failed: bool


def _calls(record: Mapping[str, Any]) -> list[_Call]:
    names = _addresses(record)
    calls = []
    for change in _dicts(record.get("changes")):
        at = change.get("at")
        if not isinstance(at, int | float):
            continue
        duration = change.get("duration_s")
        duration = duration if isinstance(duration, int | float) else 0.0
        node = _node_arg(change.get("argv"))
        what = names.get(node, node) if node else str(change.get("summary", change.get("kind", "?")))
        code = change.get("exit_code")
        calls.append(_Call(str(change.get("step", "?")), at - duration, at, what, code not in (0, None)))
    return calls


def _batches(steps: list[_Step]) -> list[_Call]:
    """Each logged batch as a span of the timeline, ``what`` being its hover text."""
    out = []
    for step in steps:
        for entry in step.rollout:
            start, duration = entry.get("started"), entry.get("duration_s")
            if isinstance(start, int | float) and isinstance(duration, int | float):
                title = _batch_title(entry, start, duration)
                out.append(_Call(step.name, start, start + duration, title, entry.get("outcome") == "failed"))
    return out


def _batch_title(entry: Mapping[str, Any], start: float, duration: float) -> str:
    """``batch 2/3 · 2 nodes: gpu-1, gpu-2 · 17:05:03 UTC · 12.3 s · failed: gpu-1``."""
    failed = [str(name) for name in entry.get("failed") or []]
    text = (
        f"batch {entry.get('batch', '?')}/{entry.get('of', '?')} · {_node_list(entry.get('nodes'))} · "
        f"{_clock(start)} · {duration:.1f} s"
    )
    return text + (f" · failed: {_short(failed)}" if failed else "")


def _short(names: list[str]) -> str:
    """Up to six names, else the first three and the last two: the ends of a long list say where it is."""
    return ", ".join(names if len(names) <= 6 else [*names[:3], "…", *names[-2:]])


def _node_list(names: object) -> str:
    names = [str(name) for name in names] if isinstance(names, list) else []
    return f"{len(names)} node{'s' if len(names) != 1 else ''}: {_short(names)}"


def _addresses(record: Mapping[str, Any]) -> dict[str, str]:
    params = _mapping(record, "params")
    return {str(n.get("address")): str(n.get("name")) for n in _dicts(params.get("nodes"))}


def _node_index(argv: object) -> int | None:
    """Where a talosctl argv names its node (the value of ``-n``/``--nodes``).

    Only talosctl's ``-n`` is ``--nodes``: helm's is ``--namespace`` (helm v3 pkg/cli/environment.go).
    """
    if not isinstance(argv, list) or not argv or not Path(str(argv[0])).name.startswith("talosctl"):
        return None
    flag = next((i for i, arg in enumerate(argv) if arg in ("-n", "--nodes")), None)
    return flag + 1 if flag is not None and flag + 1 < len(argv) else None


def _node_arg(argv: object) -> str | None:
    index = _node_index(argv)
    return str(argv[index]) if index is not None and isinstance(argv, list) else None


_NO_BATCHES = (
    "<p class=note>This record has no per-batch entries (a record from before the steps logged their "
    "rollout batches, or a step interrupted before it returned its result), so batches cannot be drawn. "
    "Shown: each call that changed the cluster, from its start to its end (journal time and duration).</p>"
)
_WITH_BATCHES = (
    "<p class=hint>Batches: one bar per rollout batch (green: every node went through, red: a node failed; "
    "hover for its nodes, start and duration). Calls: each call that changed the cluster.</p>"
)


def _timeline_section(record: Mapping[str, Any], steps: list[_Step]) -> str:
    calls, batches = _calls(record), _batches(steps)
    note = _WITH_BATCHES if batches else _NO_BATCHES
    if not calls and not batches:
        return f"<section><h2>Timeline</h2>{note}<p>No timed changes in this record.</p></section>"
    spans = calls + batches
    t0 = min(c.start for c in spans)
    span = max(max(c.end for c in spans) - t0, 1e-3)
    lanes: dict[tuple[str, str], list[_Call]] = {}
    for kind, members in (("batches", batches), ("calls", calls)):
        for item in members:
            lanes.setdefault((item.step, kind), []).append(item)
    order = {step.name: index for index, step in enumerate(steps)}  # a step's batches above its calls
    lanes = dict(sorted(lanes.items(), key=lambda lane: order.get(lane[0][0], len(order))))
    rows = "".join(
        f"<div class=lane><span class=lname>{_e(step)} {kind}</span><div class=track>"
        f"{''.join(_batch_bars(members, t0, span) if kind == 'batches' else _bars(members, t0, span))}"
        "</div></div>"
        for (step, kind), members in lanes.items()
    )
    axis = f"<p class=axis><span>{_clock(t0)}</span><span>{_e(f'{span:.1f}')} s</span><span>{_clock(t0 + span)}</span></p>"
    tables = "".join(_batch_table(step) for step in steps if step.rollout)
    return f"<section><h2>Timeline</h2>{note}<div class=timeline>{rows}</div>{axis}{tables}</section>"


def _clock(moment: float) -> str:
    return datetime.fromtimestamp(moment, UTC).strftime("%H:%M:%S UTC")


def _batch_bars(batches: list[_Call], t0: float, span: float) -> Iterable[str]:
    """One bar per batch (a batch holds at least one node, so at most one bar per node)."""
    for batch in batches:
        yield _bar(
            batch.start,
            batch.end,
            t0,
            span,
            title=batch.what,
            kind="batch " + ("failed" if batch.failed else "ok"),
        )


def _bars(calls: list[_Call], t0: float, span: float) -> Iterable[str]:
    """One bar per call, or per time slice holding several calls when there are more than TIMELINE_BARS."""
    if len(calls) <= TIMELINE_BARS:
        for call in calls:
            title = f"{call.what}: {_clock(call.start)}, {call.end - call.start:.1f} s" + (
                ", failed" if call.failed else ""
            )
            yield _bar(
                call.start, call.end, t0, span, title=title, kind="bar failed" if call.failed else "bar"
            )
        return
    slices: dict[int, list[_Call]] = {}
    for call in calls:
        slot = min(int((call.start - t0) / span * TIMELINE_BARS), TIMELINE_BARS - 1)
        slices.setdefault(slot, []).append(call)
    for members in slices.values():
        failed = sum(c.failed for c in members)
        title = f"{len(members)} calls: {members[0].what} … {members[-1].what}" + (
            f", {failed} failed" if failed else ""
        )
        start, end = min(c.start for c in members), max(c.end for c in members)
        yield _bar(start, end, t0, span, title=title, kind="bar failed" if failed else "bar")


def _bar(start: float, end: float, t0: float, span: float, *, title: str, kind: str) -> str:
    left = (start - t0) / span * 100
    width = max((end - start) / span * 100, 0.0)
    return f'<i class="{kind}" style="left:{left:.2f}%;width:{width:.2f}%" title="{_e(title)}"></i>'


def _batch_table(step: _Step) -> str:
    """The step's batches as rows (every failed one, and the first BATCH_ROWS), and the batches the
    schedule had that never started."""
    rows = [e for i, e in enumerate(step.rollout) if i < BATCH_ROWS or e.get("outcome") == "failed"]
    body = "".join(_batch_row(entry) for entry in rows)
    more = len(step.rollout) - len(rows)
    rest = f"<p>{more} more batches are in results/{_e(step.name)}.json.</p>" if more > 0 else ""
    head = "<tr><th>batch</th><th>started</th><th>duration</th><th>nodes</th><th>outcome</th></tr>"
    never = step.planned[len(step.rollout) :]
    stopped = (
        f"<p class=note>{_e(step.name)}: {len(never)} batch(es) never started (the rollout stopped when the "
        f"failure budget was used up): {sum(map(len, never))} node(s) not touched.</p>"
        if never
        else ""
    )
    return (
        f"{stopped}<details><summary>{_e(step.name)}: {len(step.rollout)} batch(es)</summary>"
        f"<table>{head}{body}</table>{rest}</details>"
    )


def _batch_row(entry: Mapping[str, Any]) -> str:
    start, duration = entry.get("started"), entry.get("duration_s")
    when = _clock(start) if isinstance(start, int | float) else "?"
    outcome = str(entry.get("outcome", "?"))
    failed = [str(name) for name in entry.get("failed") or []]
    return (
        f"<tr><td class=num>{_e(entry.get('batch', '?'))}</td><td>{when}</td><td class=num>"
        f"{_e(_seconds(duration))}</td><td>{_e(_node_list(entry.get('nodes')))}</td><td>"
        f'<span class="st {_e(outcome)}">{_e(outcome)}</span>'
        f"{_e(' ' + _short(failed)) if failed else ''}</td></tr>"
    )


# ---------------------------------------------------------------------------------------------------------
# Changes and parameters


def _changes_section(record: Mapping[str, Any]) -> str:
    changes = _dicts(record.get("changes"))
    if not changes:
        return "<section><h2>Changes</h2><p>No change reached the cluster.</p></section>"
    groups: dict[str, list[dict[str, Any]]] = {}
    for change in changes:
        groups.setdefault(_change_key(change), []).append(change)
    shown = list(groups.values())[:CHANGE_GROUPS]
    more = len(groups) - len(shown)
    rest = f"<p>{more} more distinct changes are in record.json.</p>" if more > 0 else ""
    return (
        f"<section><h2>Changes ({len(changes)})</h2>{''.join(_change_block(g, record) for g in shown)}"
        f"{rest}</section>"
    )


def _change_key(change: Mapping[str, Any]) -> str:
    """Identical changes to different nodes share a key: the diff, or the command with its node left out."""
    command = _any_node(change.get("argv"))
    body = change.get("diff") or (json.dumps(command) if command else change.get("summary"))
    fields = ("step", "kind", "exit_code", "stderr", "interrupt")
    return json.dumps([body, *(change.get(key) for key in fields)], default=str)


def _any_node(argv: object) -> list[str]:
    """The command with the node it went to (``-n <address>``) left out, as several nodes share it."""
    command = [str(arg) for arg in argv] if isinstance(argv, list) else []
    index = _node_index(command)
    if index is not None:
        command[index] = "<node>"
    return command


def _change_block(group: list[dict[str, Any]], record: Mapping[str, Any]) -> str:
    first = group[0]
    argv = _any_node(first.get("argv")) if len(group) > 1 else first.get("argv")
    command = shlex.join(map(str, argv)) if isinstance(argv, list) and argv else str(first.get("summary", ""))
    command = command.replace("'<node>'", "<node>")  # a placeholder, not a word to quote
    failed = " failed" if first.get("exit_code") not in (0, None) else ""
    stderr = _pre_err(str(first.get("stderr") or ""))
    diff = f"<pre class=diff>{_diff_lines(str(first['diff']))}</pre>" if first.get("diff") else ""
    return (
        f'<details class="change{failed}" open><summary><b>{_e(first.get("step", "?"))}</b> · '
        f"{_e(first.get('kind', '?'))} · {_e(_where(group, record))}</summary><pre class=cmd>{_e(command)}"
        f"</pre>{stderr}{diff}</details>"
    )


def _where(group: list[dict[str, Any]], record: Mapping[str, Any]) -> str:
    """Which nodes (or how many calls) a change went to, and how it ended when not plainly."""
    names = _addresses(record)
    targets = [names.get(n, n) for n in (_node_arg(c.get("argv")) for c in group) if n]
    where = _node_list(targets) if targets else f"{len(group)} call{'s' if len(group) != 1 else ''}"
    if group[0].get("exit_code") not in (0, None):
        where += f" · exit {group[0]['exit_code']}"
    return where + (f" · {group[0]['interrupt']}" if group[0].get("interrupt") else "")


def _diff_lines(text: str) -> str:
    """A unified diff with added and removed lines coloured; other text as it is."""
    out = []
    for line in text.splitlines():
        kind = {"+": "add", "-": "del", "@": "hunk"}.get(line[:1], "")
        if line.startswith(("+++", "---")):
            kind = "file"
        out.append(f"<span class={kind}>{_e(line)}</span>" if kind else _e(line))
    return "\n".join(out)


def _params_section(record: Mapping[str, Any]) -> str:
    params = record.get("params")
    if not isinstance(params, dict):
        return "<section><h2>Parameters</h2><p>Not recorded.</p></section>"
    shown = dict(params)
    nodes = _dicts(params.get("nodes"))
    if len(nodes) > LABELLED_NODES:
        shown["nodes"] = f"{len(nodes)} nodes (names in the grid above, addresses in record.json)"
    text = yaml.safe_dump(shown, sort_keys=False, default_flow_style=False)
    return (
        "<section><h2>Parameters</h2><details><summary>the validated parameters (paths only, never file "
        f"contents)</summary><pre>{_e(text)}</pre></details></section>"
    )


_CSS = """
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0 auto;max-width:1300px;padding:16px 24px;color:#1d232a}
h1{font-size:22px;margin:4px 0}h2{font-size:17px;margin:22px 0 8px;border-bottom:1px solid #dde;padding-bottom:4px}
.rec{color:#667;margin:0;font-family:ui-monospace,monospace}.note{background:#fff8e0;border-left:4px solid #d9a400;padding:6px 10px}
dl{display:grid;grid-template-columns:max-content 1fr;gap:2px 14px;margin:10px 0}dt{color:#667}dd{margin:0;font-family:ui-monospace,monospace;word-break:break-all}
table{border-collapse:collapse}td,th{padding:4px 10px;border-bottom:1px solid #eef;text-align:left;vertical-align:top}.num{text-align:right;white-space:nowrap}
.outcome,.st{display:inline-block;padding:1px 8px;border-radius:10px;color:#fff;font-size:13px;vertical-align:middle}
.failed,.aborted,.interrupted{background:#c62828}.planned{background:#1565c0}.changed{background:#2e7dd7}
.unchanged,.ok{background:#2e7d32}.skipped,.no-result,.malformed{background:#8a8f98}
.grid{display:flex;flex-wrap:wrap;gap:3px}.n{border:0;border-radius:3px;color:#fff;font:12px ui-monospace,monospace;padding:3px 6px;cursor:pointer}
.grid.small .n{width:14px;height:14px;padding:0}.n:focus,.n:hover{outline:2px solid #111}
.legend span{margin-right:14px}.legend i.n{display:inline-block;width:12px;height:12px;padding:0;margin-right:4px;vertical-align:-1px}
.hint{color:#667;margin:4px 0}#panel{border:1px solid #ccd;border-radius:6px;padding:8px 12px;margin-top:10px;background:#fafbff}
#panel h3{margin:2px 0 6px}#panel td,.check{white-space:pre-line}.check{margin:6px 0}.check p{margin:2px 0}
pre{background:#f5f6f8;padding:8px;overflow-x:auto;white-space:pre-wrap;margin:4px 0}
.diff .add{color:#1b5e20;background:#e6f4e6}.diff .del{color:#b71c1c;background:#fdeaea}.diff .hunk{color:#1565c0}.diff .file{font-weight:bold}
.change{border:1px solid #e3e5ea;border-radius:6px;padding:4px 10px;margin:6px 0}.change.failed{border-color:#c62828;background:none}
.change summary{cursor:pointer}.err{color:#b71c1c}.timeline{border:1px solid #e3e5ea;border-radius:6px;padding:6px}
.lane{display:flex;align-items:center;height:22px}.lname{width:160px;flex:none;color:#445}.track{position:relative;flex:1;height:14px;background:#f2f3f6}
.bar{position:absolute;top:0;height:14px;min-width:2px;background:#2e7dd7;opacity:.8}.bar.failed{background:#c62828}
.axis{display:flex;justify-content:space-between;color:#667;margin:2px 0 0 160px}
.batch{position:absolute;top:0;height:14px;min-width:2px;box-sizing:border-box;border-right:1px solid #fff}.batch:nth-child(even){opacity:.8}
.checked{margin:4px 0;padding-left:20px;font-family:ui-monospace,monospace;font-size:13px}
"""

_SCRIPT = """
function showNode(cell) {
  var details = JSON.parse(document.getElementById('details').textContent);
  var panel = document.getElementById('panel');
  panel.hidden = false;
  panel.querySelector('h3').textContent = cell.getAttribute('data-node') + ' · ' + cell.className.slice(2);
  panel.querySelector('div').innerHTML = details[+cell.getAttribute('data-d')];
}
document.addEventListener('click', function (event) {
  var cell = event.target.closest('[data-node]');
  if (cell) showNode(cell);
});
if (location.hash.indexOf('#node=') === 0) {  // index.html#node=<name> opens that node's panel
  var wanted = decodeURIComponent(location.hash.slice(6));
  document.querySelectorAll('[data-node]').forEach(function (cell) {
    if (cell.getAttribute('data-node') === wanted) { showNode(cell); cell.focus(); }
  });
}
"""

_PAGE = Template(
    """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>$title</title><style>$css</style></head>
<body>$body<script>$script</script></body></html>
"""
)
