"""HTML renderings of executed notebooks that open from disk with no network, widgets included.

Why: a change record is read later, often from a downloaded CI artifact on a machine without network, and
nbconvert's ``lab`` template loads require.js and MathJax from cdnjs, and for a notebook with widget state
(papermill stores it in ``metadata.widgets``) the ``@jupyter-widgets/html-manager`` from unpkg, which then
draws the widgets (nbconvert 7.17 ``share/jupyter/nbconvert/templates/lab/index.html.j2`` and
``base/jupyter_widgets.html.j2``).  Offline, the gate's node picker, Approve button, status line and
progress bar were an empty box.  So the template here drops those script tags, and :func:`static_widgets`
replaces each widget output with static HTML of the widget's final state, read from the stored state: the
status line's text, the selected nodes, the button's label, the progress value.

What is lost: nothing the runbook's notebooks use.  They have no math (MathJax), no Mermaid diagrams and no
JavaScript outputs; a widget kind this module does not know is shown by its name.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from html import escape
from typing import Any

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
#: The nbconvert template: the ``lab`` template without any script it would load from the network.
TEMPLATE_FILE = "runbook-offline.html.j2"
_TEMPLATE = """{%- extends 'index.html.j2' -%}
{%- block html_head_js -%}{%- endblock html_head_js -%}
{%- block jupyter_widgets -%}{%- endblock jupyter_widgets -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
"""
#: Nested boxes deeper than this are not drawn (a state that refers to itself would never end).
_MAX_DEPTH = 20
#: Selected nodes named in a node picker before "and N more".
_PICKED_NAMES = 20
_NOT_LIVE = "a record shows the notebook as it ran: the button works only in a live JupyterLab kernel"

Draw = Callable[[str], str]


def skip_iri_format_checks() -> None:
    """Keep jsonschema from importing ``rfc3987_syntax``, which compiles 38 lark grammars when imported.

    papermill imports nbformat, which imports jsonschema, whose ``_format.py`` (jsonschema 4.26.0) registers
    the ``iri``/``iri-reference`` format checks only ``with suppress(ImportError): from rfc3987_syntax import
    …``.  Installed with jupyter-events' ``jsonschema[format-nongpl]``, it cost the runbook process 1-8 s of
    CPU per run on 2 cores (cProfile of an 8-node ``runbook run``), while the first kernel starts; nbconvert
    (``html_worker``) imports it too.  nbformat validates notebooks without a FormatChecker, so those checks
    are never used here; a ``None`` entry in
    ``sys.modules`` makes that import raise ImportError, which jsonschema expects.  Done only when nothing
    imported it yet."""
    sys.modules.setdefault("rfc3987_syntax", None)  # type: ignore[arg-type]


def exporter() -> Any:
    """nbconvert's HTML exporter with the offline template (nbconvert and jinja2 imported only here)."""
    from jinja2 import DictLoader  # noqa: PLC0415 - lazy: nbconvert's import costs ~0.7 s
    from nbconvert import HTMLExporter  # noqa: PLC0415 - lazy, as above

    return HTMLExporter(  # type: ignore[no-untyped-call]
        template_name="lab",
        template_file=TEMPLATE_FILE,
        extra_loaders=[DictLoader({TEMPLATE_FILE: _TEMPLATE})],
    )


def static_widgets(notebook: dict[str, Any]) -> dict[str, Any]:
    """Replace every widget output of ``notebook`` (an nbformat 4 dict, changed in place) with static HTML
    of the widget's final state, and drop the stored widget state (it only feeds the widget scripts)."""
    metadata = notebook.get("metadata")
    stored = metadata.pop("widgets", None) if isinstance(metadata, dict) else None
    state = _mapping(_mapping(stored).get(WIDGET_STATE)).get("state")
    models = state if isinstance(state, dict) else {}
    for cell in notebook.get("cells") or []:
        for output in cell.get("outputs") or []:
            data = output.get("data") if isinstance(output, dict) else None
            if isinstance(data, dict) and WIDGET_VIEW in data:
                view = _mapping(data.pop(WIDGET_VIEW))
                shown = _widget(models, str(view.get("model_id", "")), 0)
                data["text/html"] = shown or f"<pre>{escape(str(data.get('text/plain', '')))}</pre>"
    return notebook


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def _widget(models: Mapping[str, Any], model_id: str, depth: int) -> str:
    """The static HTML of one widget model (and its children), or "" when the state does not hold it."""
    model = _mapping(models.get(model_id.removeprefix("IPY_MODEL_")))
    if not model or depth > _MAX_DEPTH:
        return ""
    state = _mapping(model.get("state"))
    name = str(model.get("model_name", ""))
    draw = _DRAW.get(name)
    if draw is not None:
        return draw(state, lambda child: _widget(models, child, depth + 1))
    if "value" in state:
        return _described(state, escape(str(state["value"])))
    return f"<span>({escape(name or 'widget')})</span>"


def _described(state: Mapping[str, Any], body: str) -> str:
    label = escape(str(state.get("description") or ""))
    return f"<div>{label + ': ' if label else ''}{body}</div>"


def _box(direction: str) -> Callable[[Mapping[str, Any], Draw], str]:
    def draw(state: Mapping[str, Any], child: Draw) -> str:
        inner = "".join(child(str(c)) for c in state.get("children") or [])
        return (
            f'<div style="display:flex;flex-direction:{direction};gap:6px;align-items:baseline">{inner}</div>'
        )

    return draw


def _html(state: Mapping[str, Any], _child: Draw) -> str:
    """An HTML widget's value is markup the library wrote (cluster text in it is escaped there)."""
    return _described(state, str(state.get("value") or ""))


def _label(state: Mapping[str, Any], _child: Draw) -> str:
    return f"<span>{escape(str(state.get('value') or ''))}</span>"


def _button(state: Mapping[str, Any], _child: Draw) -> str:
    return f'<button type="button" disabled title="{escape(_NOT_LIVE)}">{escape(str(state.get("description", "")))}</button>'


def _picker(state: Mapping[str, Any], _child: Draw) -> str:
    """A node picker: which of its options were selected when the notebook was saved."""
    labels = [str(label) for label in state.get("_options_labels") or []]
    index = state.get("index") or []
    picked = [labels[i] for i in index if isinstance(i, int) and 0 <= i < len(labels)]
    names = ", ".join(picked[:_PICKED_NAMES])
    more = f" and {len(picked) - _PICKED_NAMES} more" if len(picked) > _PICKED_NAMES else ""
    of = f" ({len(picked)} of {len(labels)})" if len(picked) != len(labels) else ""
    return _described(state, escape(f"{names}{more}{of}" if picked else "none selected"))


def _progress(state: Mapping[str, Any], _child: Draw) -> str:
    value, top = escape(str(state.get("value", 0))), escape(str(state.get("max", 1)))
    bar = f'<progress value="{value}" max="{top}" title="{value}/{top}"></progress>'
    return _described(state, bar)


def _output(state: Mapping[str, Any], _child: Draw) -> str:
    """An Output widget: what was displayed in it last (HTML as the library rendered it, else text)."""
    parts = []
    for output in state.get("outputs") or []:
        data = _mapping(_mapping(output).get("data"))
        if "text/html" in data:
            parts.append(_text(data["text/html"]))
        elif "text/plain" in data or "text" in output:
            parts.append(f"<pre>{escape(_text(data.get('text/plain', output.get('text', ''))))}</pre>")
    return f"<div>{''.join(parts)}</div>"


def _text(value: object) -> str:
    return "".join(map(str, value)) if isinstance(value, list) else str(value)


_DRAW: dict[str, Callable[[Mapping[str, Any], Draw], str]] = {
    "HBoxModel": _box("row"),
    "VBoxModel": _box("column"),
    "HTMLModel": _html,
    "LabelModel": _label,
    "ButtonModel": _button,
    "SelectMultipleModel": _picker,
    "IntProgressModel": _progress,
    "FloatProgressModel": _progress,
    "OutputModel": _output,
}
