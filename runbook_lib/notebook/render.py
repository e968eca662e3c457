"""HTML and Markdown views of a :class:`StepResult` that stay readable at 1,000 nodes.

Why this shape: a person looking at a step wants, in this order, the verdict, what needs attention (failing
nodes with their diagnosis and the fix), what will change (each distinct diff once, with the nodes it
applies to), and only then the full table, which is collapsed and capped because the record keeps all of
it.  Everything that came from a cluster is escaped: tool output is data, never markup.
"""

from __future__ import annotations

from collections import defaultdict
from html import escape
from typing import Any

from runbook_lib.model.text import any_node, shortened
from runbook_lib.steps.results import Check, NodeResult, StepResult

#: Rows of the full node table, and failing nodes shown in detail, before "N more in the record".
TABLE_LIMIT = 50
FAILING_LIMIT = 20
DIFF_LIMIT = 10
#: Distinct inventories ("what was checked" lines) shown before "N more in the record".
INVENTORY_LIMIT = 20

_COLOURS = {
    "failed": "#c62828",
    "planned": "#1565c0",
    "changed": "#ef6c00",
    "unchanged": "#2e7d32",
    "ok": "#2e7d32",
    "skipped": "#757575",
}
_PRE = "white-space:pre-wrap;background:#f6f8fa;padding:6px;border-radius:4px;font-size:90%"


def show_html(html: str) -> None:
    """Display HTML as a regular output, so it lands in the executed notebook (not in widget state).

    IPython is imported here, not at module level: a kernel has it loaded already, and ``runbook run``
    (which imports this package for the step list) then does not pay ~0.05 s for it at start-up.
    """
    from IPython.display import HTML, display  # noqa: PLC0415 - lazy (CLI start-up)

    display(HTML(html))  # type: ignore[no-untyped-call]


def show_widget(obj: Any) -> None:
    from IPython.display import display  # noqa: PLC0415 - lazy (CLI start-up)

    display(obj)  # type: ignore[no-untyped-call]


def _mode(result: StepResult) -> str:
    if result.applied:
        return "applied"
    if result.status == "planned" or result.data.get("planned"):
        return "plan only: nothing changed"
    return "nothing changed"


def _badge(status: str) -> str:
    colour = _COLOURS.get(status, "#555")
    return (
        f'<span style="background:{colour};color:#fff;padding:1px 6px;border-radius:3px;'
        f'font-weight:bold">{escape(status)}</span>'
    )


def diff_groups(result: StepResult) -> list[tuple[str, list[str]]]:
    """Distinct diffs with the nodes that share each one, most nodes first."""
    groups: dict[str, list[str]] = defaultdict(list)
    for node in result.sorted_nodes():
        if node.diff:
            groups[node.diff].append(node.node)
    for group in result.data.get("groups", []) or []:
        if isinstance(group, dict) and group.get("patch"):
            names = groups[str(group["patch"])]
            names.extend(n for n in group.get("nodes", []) if n not in names)
    return sorted(groups.items(), key=lambda item: (-len(item[1]), item[0]))


def _inventory(result: StepResult) -> list[dict[str, Any]]:
    groups = result.data.get("inventory")
    return [g for g in groups if isinstance(g, dict)] if isinstance(groups, list) else []


def _inventory_notes(result: StepResult) -> list[str]:
    """The inventory's own notes, and the nodes it leaves out (they did not answer: see the failing nodes)."""
    groups = _inventory(result)
    notes = [str(n) for n in result.data.get("inventory_notes") or []]
    missing = len(result.nodes) - sum(int(g.get("count", 0)) for g in groups)
    if missing > 0:
        # not only "did not answer": a node whose /proc/modules could not be parsed answered (review, stop 52)
        notes.append(
            f"{missing} node(s) are not in this list: they did not answer, or their answer could not be read "
            "(see the failing nodes)"
        )
    if len(groups) > INVENTORY_LIMIT:
        notes.append(f"{len(groups) - INVENTORY_LIMIT} more distinct node inventories in the record")
    return notes


def _sources(result: StepResult) -> str:
    sources = result.data.get("inventory_sources") or {}
    return "; ".join(f"{field}: {source}" for field, source in sources.items())


def _inventory_html(result: StepResult) -> list[str]:
    """ "What was checked": one line per distinct set of node facts (1,000 identical nodes are one line),
    the node names behind a fold, and where each fact came from."""
    groups = _inventory(result)
    if not groups:
        return []
    out = ['<h4>What was checked</h4><ul class="runbook-inventory">']
    for group in groups[:INVENTORY_LIMIT]:
        names = [str(n) for n in group.get("nodes", [])]
        line = f"<li>{escape(str(group.get('line', '')))}"
        if len(names) > 1:
            line += f"<details><summary>nodes</summary>{escape(shortened(names, 50))}</details>"
        out.append(line + "</li>")
    out.append("</ul>")
    out += [f"<p>{escape(note)}</p>" for note in _inventory_notes(result)]
    if _sources(result):
        out.append(f'<p style="font-size:85%;color:#555">Sources: {escape(_sources(result))}</p>')
    return out


def _inventory_markdown(result: StepResult) -> list[str]:
    groups = _inventory(result)
    if not groups:
        return []
    lines = ["", "**What was checked**", ""]
    lines += [f"- {group.get('line', '')}" for group in groups[:INVENTORY_LIMIT]]
    lines += [f"- {note}" for note in _inventory_notes(result)]
    if _sources(result):
        lines += ["", f"Sources: {_sources(result)}"]
    return lines


def _check_html(check: Check) -> str:
    parts = [f"<b>{escape(check.name)}</b>: {escape(check.message)}"]
    if check.cause:
        parts.append(f"<br><i>cause:</i> {escape(check.cause)}")
    if check.fix:
        parts.append(f'<br><i>fix:</i> <code style="white-space:pre-wrap">{escape(check.fix)}</code>')
    if check.evidence:
        parts.append(f'<pre style="{_PRE}">{escape(check.evidence)}</pre>')
    return "<li>" + "".join(parts) + "</li>"


def _failing_node_html(node: NodeResult) -> str:
    head = f"<b>{escape(node.node)}</b> ({escape(node.address)})"
    if node.message:
        head += f": {escape(node.message)}"
    checks = "".join(_check_html(c) for c in node.failed_checks)
    body = f"<ul>{checks}</ul>" if checks else ""
    if node.diff:
        body += f'<pre style="{_PRE}">{escape(node.diff)}</pre>'
    return f"<li>{head}{body}</li>"


def _dry_run_html(result: StepResult) -> list[str]:
    """The machine-config diff talosctl's dry run printed for each group of nodes (``data.groups[].dry_run``,
    redacted by the step), the first node's answer per group as ``runbook run`` prints it (:func:`config_diff`:
    the group's output holds one answer per node, 1,000 of them at 1,000 nodes: review of 4421311). Why: the notebook
    showed only the patch, while ``runbook run`` printed this diff, the one machined checked; whoever clicks
    Approve should see it (cloud-user walkthrough, 7 Dec 2026)."""
    groups = [g for g in result.data.get("groups", []) or [] if isinstance(g, dict) and g.get("dry_run")]
    out = []
    for group in groups[:DIFF_LIMIT]:
        names = [str(n) for n in group.get("nodes") or []]
        out.append(
            f"<p>{escape(shortened(names))}: machine config diff (talosctl's dry run"
            f"{f', one answer of {len(names)}' if len(names) > 1 else ''})</p>"
            f'<pre class="runbook-diff" style="{_PRE}">{escape(chr(10).join(config_diff(str(group["dry_run"]))))}</pre>'
        )
    if len(groups) > DIFF_LIMIT:
        out.append(f"<p>{len(groups) - DIFF_LIMIT} more dry-run diffs in the record.</p>")
    return out


def config_diff(dry_run: str) -> list[str]:
    """The hunks of the ``Config diff:`` machined answers a dry run with (talos@v1.12.0
    internal/app/machined/internal/server/v1alpha1/v1alpha1_server.go:330), which talosctl prints for the first
    node of the group, without its ``--- a``/``+++ b`` header; the first node's whole answer when it has none.

    The hunks end at the first line no diff line starts like (talos/pkg/machinery@v1.12.0
    config/configdiff/configdiff.go:80-127 writes ``@@``, ``-``, ``+``, `` `` and ``\\ No newline``): the next
    node's answer, or talosctl's error for a node that is down, which names no node, came right after the hunks
    and was shown as a line of them (review of 51a7060). A node that refused the patch answers with no diff: its
    ``patched … at the node`` line and the error (talos@v1.12.0 cmd/talosctl/cmd/talos/patch.go:103-111), shown
    whole, where an empty box read as "no changes"."""
    first = _first_answer(dry_run)
    _head, found, text = "\n".join(first).partition("Config diff:")
    if not found:
        return first
    lines: list[str] = []
    for line in text.strip("\n").splitlines():
        if line in ("--- a", "+++ b"):
            continue
        if not (line.startswith(("@@", "-", "+", " ", "\\")) or line == "No changes."):
            break
        lines.append(line)
    return lines or first


def _first_answer(output: str) -> list[str]:
    """The first node's answer of a group's dry-run output: up to the second ``patched … at the node`` line."""
    lines: list[str] = []
    for line in output.strip("\n").splitlines():
        if line.startswith("patched ") and any(seen.startswith("patched ") for seen in lines):
            break
        lines.append(line)
    while lines and not lines[-1].strip():
        lines.pop()
    return lines


def render_html(result: StepResult, *, limit: int = TABLE_LIMIT, title: str | None = None) -> str:
    counts = result.counts()
    mode = _mode(result)
    out = [
        f'<div class="runbook-step" data-step="{escape(result.step)}">',
        f"<h3>{escape(title or result.step)} {_badge(result.status)}</h3>",
        f"<p>{escape(mode)} · {len(result.nodes)} node(s) · {result.duration_s:.1f} s</p>",
    ]
    if counts:
        cells = "".join(f"<td>{_badge(s)} {n}</td>" for s, n in counts.items())
        out.append(f'<table class="runbook-counts"><tr>{cells}</tr></table>')
    failed_checks = [c for c in result.checks if not c.ok]
    if failed_checks:
        out.append("<h4>Failed checks</h4><ul>" + "".join(_check_html(c) for c in failed_checks) + "</ul>")
    failing = result.failing()
    if failing:
        out.append(f"<h4>Failing nodes ({len(failing)})</h4><ul>")
        out += [_failing_node_html(n) for n in failing[:FAILING_LIMIT]]
        out.append("</ul>")
        if len(failing) > FAILING_LIMIT:
            out.append(f"<p>{len(failing) - FAILING_LIMIT} more failing nodes in the record.</p>")
    out += _inventory_html(result)
    groups = diff_groups(result)
    if groups:
        out.append("<h4>Changes</h4>")
        for diff, names in groups[:DIFF_LIMIT]:
            out.append(
                f"<p>{len(names)} node(s): {escape(shortened(names))}</p>"
                f'<pre class="runbook-diff" style="{_PRE}">{escape(diff)}</pre>'
            )
        if len(groups) > DIFF_LIMIT:
            out.append(f"<p>{len(groups) - DIFF_LIMIT} more distinct changes in the record.</p>")
    out += _dry_run_html(result)
    changes = result.data.get("changes")
    if isinstance(changes, list) and changes:
        out.append("<ul>" + "".join(f"<li>{escape(str(c))}</li>" for c in changes) + "</ul>")
    passed = [c for c in result.checks if c.ok]
    if passed:
        out.append(
            "<p>Passed: " + ", ".join(f"{escape(c.name)} ({escape(c.message)})" for c in passed) + "</p>"
        )
    if result.notes:
        out.append("<ul>" + "".join(f"<li>{escape(n)}</li>" for n in result.notes) + "</ul>")
    if result.nodes:
        rows = result.sorted_nodes()
        out.append(f"<details><summary>All nodes ({len(rows)})</summary>")
        out.append("<table><tr><th>node</th><th>address</th><th>status</th><th>message</th></tr>")
        for node in rows[:limit]:
            out.append(
                f"<tr><td>{escape(node.node)}</td><td>{escape(node.address)}</td>"
                f"<td>{_badge(node.status)}</td><td>{escape(node.message)}</td></tr>"
            )
        out.append("</table>")
        if len(rows) > limit:
            out.append(f"<p>{len(rows) - limit} more in the record.</p>")
        out.append("</details>")
    out.append("</div>")
    return "\n".join(out)


def html_page(body: str, title: str) -> str:
    """``body`` (a :func:`render_html` fragment) as a page of its own, for a file opened directly in a
    browser: without ``<meta charset>`` a browser may fall back to windows-1252 and garble the arrows."""
    return (
        f'<!doctype html>\n<html><head><meta charset="utf-8"><title>{escape(title)}</title></head>\n'
        f"<body>{body}</body></html>\n"
    )


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(result: StepResult, *, limit: int = TABLE_LIMIT, title: str | None = None) -> str:
    lines = [f"### {title or result.step}: {result.status}", ""]
    counts = ", ".join(f"{n} {s}" for s, n in result.counts().items())
    mode = _mode(result)
    lines.append(f"{mode}; {len(result.nodes)} node(s){': ' + counts if counts else ''}")
    for check in (c for c in result.checks if not c.ok):
        lines.append(f"- **{check.name}**: {check.message}" + (f" — fix: `{check.fix}`" if check.fix else ""))
    failing = result.failing()
    if failing:
        lines += ["", f"**Failing nodes ({len(failing)})**", ""]
        for node in failing[:FAILING_LIMIT]:
            lines.append(f"- **{node.node}** ({node.address}): {node.message}")
            for check in node.failed_checks:
                if _quoted(node, check):  # the node's line said it: the check's fix alone, named by the check
                    lines += [f"  - fix ({check.name}): `{check.fix}`"] if check.fix else []
                    continue
                lines.append(
                    f"  - {check.name}: {check.message}" + (f" — fix: `{check.fix}`" if check.fix else "")
                )
        if len(failing) > FAILING_LIMIT:
            lines.append(f"- … {len(failing) - FAILING_LIMIT} more failing nodes in the record")
    lines += _inventory_markdown(result)
    for diff, names in diff_groups(result)[:DIFF_LIMIT]:
        lines += ["", f"{len(names)} node(s): {shortened(names)}", "", "```diff", diff.rstrip("\n"), "```"]
    for note in result.notes:
        lines.append(f"- {note}")
    if result.nodes:
        rows = result.sorted_nodes()
        lines += ["", "| node | address | status | message |", "|---|---|---|---|"]
        lines += [
            f"| {_md(n.node)} | {_md(n.address)} | {n.status} | {_md(n.message)} |" for n in rows[:limit]
        ]
        if len(rows) > limit:
            lines.append(f"\n{len(rows) - limit} more in the record.")
    return "\n".join(lines) + "\n"


def _quoted(node: NodeResult, check: Check) -> bool:
    """The node's line is the check's message, one of its ``"; "``-joined parts, or ends with it after a
    prefix (a failed upgrade's line is "talosctl upgrade failed: " and talosctl's whole error block): printed
    again, it pushed the fix below the terminal's fold (found by an operator walkthrough). Not any substring: a
    short message ("pod ended Failed") inside a longer line says something else."""
    said, line = check.message, node.message
    return bool(said) and (line == said or said in line.split("; ") or line.endswith(f": {said}"))


def failure_hint(result: StepResult) -> str:
    """Where the stopped step's cause is: its failing nodes, or its own checks when no node failed (a refused
    ``helm list``, an unreachable API). Why: "see the failing nodes above" followed a failure with no node."""
    if result.failing():
        return "see the failing nodes above for the cause and the fix"
    return "see the step's failed check above for the cause and the fix"


def failure_text(result: StepResult, *, limit: int = 5) -> str:
    """A plain-text diagnosis for the exception that stops a headless run (it lands in the error cell)."""
    lines = [result.summary()]
    for check in (c for c in result.checks if not c.ok):
        fix = f"\n    fix: {check.fix}" if check.fix else ""
        lines.append(f"  {check.name}: {_under(check.message)}{fix}")
    groups = _alike_failures(result.failing())
    for group in groups[:limit]:
        node = group[0]
        # a group's lines say <node> where each node's said its own name or address
        say = (
            (lambda text: text)
            if len(group) == 1
            else (lambda text, n=node: any_node(text, n.address, n.node))
        )
        who = f"{node.node} ({node.address})" if len(group) == 1 else f"{shortened([n.node for n in group])}"
        lines.append(
            f"  {who}{f' ({len(group)} nodes)' if len(group) > 1 else ''}: {_under(say(node.message))}"
        )
        for check in node.failed_checks:
            if _quoted(node, check):  # the node's line said it: the check's fix alone, named by the check
                lines += [f"    fix ({check.name}): {say(check.fix)}"] if check.fix else []
                continue
            lines.append(f"    {check.name}: {_under(say(check.message))}")
            if check.fix:
                lines.append(f"    fix: {say(check.fix)}")
    more = sum(len(g) for g in groups[limit:])
    if more:
        lines.append(f"  … {more} more failing nodes (see the rendered table and the record)")
    return "\n".join(lines)


#: Where a message's continuation lines start: under the text of its ``  <node>:`` or ``    <check>:`` line.
CONTINUATION = " " * 6


def _under(text: str) -> str:
    """``text`` with its continuation lines indented (``CONTINUATION``). Why: talosctl's quoted lines
    (``error: sequence error: …``) were printed flush left inside an indented node block, where they read as
    the report's own lines (operator walkthrough, 6 Dec 2026). For messages only: a fix stays as written, since
    its heredoc (``cat > gpu-worker-patch.yaml <<EOF`` … ``EOF``) ends only at a flush-left ``EOF`` and a
    patch's ``---`` separates documents only there (review of 7 Dec 2026)."""
    return text.replace("\n", "\n" + CONTINUATION)


def _alike_failures(failing: list[NodeResult]) -> list[list[NodeResult]]:
    """The failing nodes in groups that say the same (line, checks and fixes), in order of first failure.

    Why: 250 nodes refused for the same reason (a rollback's records, a talosconfig that reaches none) printed
    five alike blocks and "245 more failing nodes", which hid whether the rest failed alike or otherwise."""
    groups: dict[tuple[Any, ...], list[NodeResult]] = {}
    for node in failing:
        # alike but for the node's own name and address, which its fix often names (fixes.unreachable: review)
        said = tuple(
            (c.name, *(any_node(t, node.address, node.node) for t in (c.message, c.fix, c.cause)))
            for c in node.failed_checks
        )
        groups.setdefault((any_node(node.message, node.address, node.node), said), []).append(node)
    return list(groups.values())
