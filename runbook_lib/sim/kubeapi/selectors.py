"""Label and field selectors, in both the query-string and the structured (``matchExpressions``) forms.

Controllers and the list handler share these so that what ``kubectl get -l`` shows and what a DaemonSet
selects can never disagree.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from .errors import bad_request

Predicate = Callable[[Mapping[str, str]], bool]

_SET_RE = re.compile(r"^\s*(!?)\s*([A-Za-z0-9._/-]+)\s*(?:(notin|in)\s*\(([^)]*)\))?\s*$")
_EQ_RE = re.compile(r"^\s*([A-Za-z0-9._/-]+)\s*(==|!=|=)\s*([A-Za-z0-9._-]*)\s*$")


def _split_top(text: str) -> list[str]:
    """Split on commas that are not inside ``in (a,b)`` parentheses."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur)
    return parts


def _eq(key: str, val: str, *, negate: bool) -> Predicate:
    return lambda ls: (ls.get(key) == val) != negate


def _in(key: str, values: set[str], *, negate: bool) -> Predicate:
    return lambda ls: (ls.get(key) in values) != negate


def _exists(key: str, *, negate: bool) -> Predicate:
    return lambda ls: (key in ls) != negate


def parse_label_selector(text: str | None) -> Predicate:
    if not text:
        return lambda labels: True
    preds: list[Predicate] = []
    for term in _split_top(text):
        m = _EQ_RE.match(term)
        if m:
            key, op, val = m.groups()
            preds.append(_eq(key, val, negate=op == "!="))
            continue
        m = _SET_RE.match(term)
        if not m:
            raise bad_request(f"unable to parse requirement: found '{term.strip()}', expected: identifier")
        neg, key, op, vals = m.groups()
        if op:
            values = {v.strip() for v in vals.split(",") if v.strip()}
            preds.append(_in(key, values, negate=op == "notin"))
        else:
            preds.append(_exists(key, negate=bool(neg)))
    return lambda labels: all(p(labels) for p in preds)


def field_value(obj: Mapping[str, Any], path: str) -> str:
    cur: Any = obj
    for part in path.split("."):
        if not isinstance(cur, Mapping):
            return ""
        cur = cur.get(part)
    if cur is None:
        return ""
    if isinstance(cur, bool):
        return "true" if cur else "false"
    return str(cur)


def parse_field_selector(text: str | None) -> Callable[[Mapping[str, Any]], bool]:
    if not text:
        return lambda obj: True
    terms: list[tuple[str, bool, str]] = []
    for term in text.split(","):
        if not term.strip():
            continue
        m = re.match(r"^\s*([A-Za-z0-9._]+)\s*(==|!=|=)\s*(.*?)\s*$", term)
        if not m:
            raise bad_request(f"invalid selector: '{text}'; can't understand '{term}'")
        terms.append((m.group(1), m.group(2) == "!=", m.group(3)))
    return lambda obj: all(
        (field_value(obj, p) != v) if neg else (field_value(obj, p) == v) for p, neg, v in terms
    )


def match_expressions(labels: Mapping[str, str], exprs: list[dict[str, Any]] | None) -> bool:
    """``matchExpressions`` of label selectors and node selector terms (In, NotIn, Exists, DoesNotExist, Gt, Lt)."""
    for e in exprs or []:
        key, op, values = e.get("key", ""), e.get("operator", ""), [str(v) for v in e.get("values") or []]
        has, val = key in labels, labels.get(key)
        if op == "In":
            ok = has and val in values
        elif op == "NotIn":
            ok = not has or val not in values
        elif op == "Exists":
            ok = has
        elif op == "DoesNotExist":
            ok = not has
        elif op in ("Gt", "Lt"):
            try:
                ok = has and (
                    int(str(val)) > int(values[0]) if op == "Gt" else int(str(val)) < int(values[0])
                )
            except (ValueError, IndexError):
                ok = False
        else:
            ok = False
        if not ok:
            return False
    return True


def match_label_selector(labels: Mapping[str, str], selector: Mapping[str, Any] | None) -> bool:
    """A structured ``LabelSelector``; an empty selector matches everything (as in DaemonSet/Job specs)."""
    if not selector:
        return True
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    return match_expressions(labels, selector.get("matchExpressions"))


def node_matches_affinity(node: Mapping[str, Any], pod_spec: Mapping[str, Any]) -> bool:
    """nodeSelector AND required node affinity (terms ORed, expressions ANDed), as the scheduler filters."""
    meta = node.get("metadata") or {}
    labels: Mapping[str, str] = meta.get("labels") or {}
    for k, v in (pod_spec.get("nodeSelector") or {}).items():
        if labels.get(k) != v:
            return False
    required = ((pod_spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = required.get("nodeSelectorTerms") or []
    if not terms:
        return True
    fields = {"metadata.name": meta.get("name", "")}
    for term in terms:
        if not term.get("matchExpressions") and not term.get("matchFields"):
            continue
        if match_expressions(labels, term.get("matchExpressions")) and match_expressions(
            fields, term.get("matchFields")
        ):
            return True
    return False


def tolerates(
    taints: list[dict[str, Any]] | None, tolerations: list[dict[str, Any]] | None
) -> dict[str, Any] | None:
    """The first NoSchedule/NoExecute taint not tolerated, or None when the pod tolerates them all."""
    for taint in taints or []:
        if taint.get("effect") not in ("NoSchedule", "NoExecute"):
            continue
        ok = False
        for t in tolerations or []:
            if t.get("effect") and t.get("effect") != taint.get("effect"):
                continue
            if t.get("operator") == "Exists":
                ok = not t.get("key") or t.get("key") == taint.get("key")
            else:
                ok = t.get("key") == taint.get("key") and (t.get("value") or "") == (taint.get("value") or "")
            if ok:
                break
        if not ok:
            return taint
    return None
