"""Server-side printing (``meta.k8s.io/v1`` Table) so a plain ``kubectl get`` shows the familiar columns.

kubectl asks for ``as=Table`` and prints whatever cells the server sends; without this it can only show
NAME and AGE, which hides exactly what an operator looks at (node Ready, DaemonSet DESIRED/READY, pod STATUS).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from .resources import Resource

Row = list[Any]


def age(ts: str | None) -> str:
    """k8s.io/apimachinery's HumanDuration, the AGE column."""
    if not ts:
        return "<unknown>"
    try:
        then = datetime.strptime(ts, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return "<unknown>"
    s = max(int((datetime.now(UTC) - then).total_seconds()), 0)
    if s < 120:
        return f"{s}s"
    m = s // 60
    if m < 10:
        return f"{m}m{s % 60}s" if s % 60 else f"{m}m"
    if m < 180:
        return f"{m}m"
    h = m // 60
    if h < 8:
        return f"{h}h{m % 60}m" if m % 60 else f"{h}h"
    if h < 48:
        return f"{h}h"
    return f"{h // 24}d"


def _node(o: dict[str, Any]) -> Row:
    st = o.get("status") or {}
    ready: dict[str, Any] = next((c for c in st.get("conditions") or [] if c.get("type") == "Ready"), {})
    status = "Ready" if ready.get("status") == "True" else "NotReady"
    if (o.get("spec") or {}).get("unschedulable"):
        status += ",SchedulingDisabled"
    roles = ",".join(
        sorted(
            k.split("/", 1)[1]
            for k in (o["metadata"].get("labels") or {})
            if k.startswith("node-role.kubernetes.io/")
        )
    )
    return [
        status,
        roles or "<none>",
        age(o["metadata"].get("creationTimestamp")),
        (st.get("nodeInfo") or {}).get("kubeletVersion", ""),
    ]


def _pod(o: dict[str, Any]) -> Row:
    st = o.get("status") or {}
    cs = st.get("containerStatuses") or []
    total = len((o.get("spec") or {}).get("containers") or [])
    ready = sum(1 for c in cs if c.get("ready"))
    reason = st.get("phase", "Pending")
    for c in cs:
        state = c.get("state") or {}
        if state.get("waiting", {}).get("reason"):
            reason = state["waiting"]["reason"]
        elif state.get("terminated", {}).get("reason") and reason not in ("Succeeded",):
            reason = state["terminated"]["reason"]
    if reason == "Succeeded":
        reason = "Completed"
    restarts = sum(int(c.get("restartCount") or 0) for c in cs)
    return [f"{ready}/{total}", reason, restarts, age(o["metadata"].get("creationTimestamp"))]


def _ds(o: dict[str, Any]) -> Row:
    st = o.get("status") or {}
    sel = ((o.get("spec") or {}).get("template") or {}).get("spec", {}).get("nodeSelector") or {}
    return [
        st.get("desiredNumberScheduled", 0),
        st.get("currentNumberScheduled", 0),
        st.get("numberReady", 0),
        st.get("updatedNumberScheduled", 0),
        st.get("numberAvailable", 0),
        ",".join(f"{k}={v}" for k, v in sel.items()) or "<none>",
        age(o["metadata"].get("creationTimestamp")),
    ]


def _deploy(o: dict[str, Any]) -> Row:
    st = o.get("status") or {}
    want = (o.get("spec") or {}).get("replicas", 1)
    return [
        f"{st.get('readyReplicas', 0)}/{want}",
        st.get("updatedReplicas", 0),
        st.get("availableReplicas", 0),
        age(o["metadata"].get("creationTimestamp")),
    ]


def _job(o: dict[str, Any]) -> Row:
    st = o.get("status") or {}
    conds = {c.get("type"): c.get("status") for c in st.get("conditions") or []}
    status = (
        "Complete"
        if conds.get("Complete") == "True"
        else ("Failed" if conds.get("Failed") == "True" else "Running")
    )
    return [
        status,
        f"{st.get('succeeded', 0)}/{(o.get('spec') or {}).get('completions', 1)}",
        age(o["metadata"].get("creationTimestamp")),
    ]


def _event(o: dict[str, Any]) -> Row:
    inv = o.get("involvedObject") or {}
    return [
        age(o.get("lastTimestamp")),
        o.get("type", ""),
        o.get("reason", ""),
        f"{str(inv.get('kind', '')).lower()}/{inv.get('name', '')}",
        o.get("message", ""),
    ]


def _generic(o: dict[str, Any]) -> Row:
    return [age(o["metadata"].get("creationTimestamp"))]


_COLUMNS: dict[str, tuple[list[str], Callable[[dict[str, Any]], Row]]] = {
    "nodes": (["Status", "Roles", "Age", "Version"], _node),
    "pods": (["Ready", "Status", "Restarts", "Age"], _pod),
    "daemonsets": (["Desired", "Current", "Ready", "Up-to-date", "Available", "Node Selector", "Age"], _ds),
    "deployments": (["Ready", "Up-to-date", "Available", "Age"], _deploy),
    "jobs": (["Status", "Completions", "Age"], _job),
    "events": (["Last Seen", "Type", "Reason", "Object", "Message"], _event),
    "runtimeclasses": (
        ["Handler", "Age"],
        lambda o: [o.get("handler", ""), age(o["metadata"].get("creationTimestamp"))],
    ),
    "namespaces": (
        ["Status", "Age"],
        lambda o: [
            (o.get("status") or {}).get("phase", "Active"),
            age(o["metadata"].get("creationTimestamp")),
        ],
    ),
}


def wants_table(accept: str) -> bool:
    return "as=Table" in accept


def table(res: Resource, items: list[dict[str, Any]], rv: str) -> dict[str, Any]:
    names, fn = _COLUMNS.get(res.plural, (["Age"], _generic))
    # Events hide Name (priority 1) as the real server does; pods add IP and Node for ``-o wide``.
    cols = [
        {
            "name": "Name",
            "type": "string",
            "format": "name",
            "description": "",
            "priority": 1 if res.plural == "events" else 0,
        }
    ]
    cols += [{"name": n, "type": "string", "format": "", "description": "", "priority": 0} for n in names]
    wide = res.plural == "pods"
    if wide:
        cols += [
            {"name": n, "type": "string", "format": "", "description": "", "priority": 1}
            for n in ("IP", "Node")
        ]
    rows = [
        {
            "cells": [o["metadata"]["name"], *fn(o)]
            + (
                [
                    (o.get("status") or {}).get("podIP") or "<none>",
                    (o.get("spec") or {}).get("nodeName") or "<none>",
                ]
                if wide
                else []
            ),
            "object": {
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": o["metadata"],
            },
        }
        for o in items
    ]
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": rv},
        "columnDefinitions": cols,
        "rows": rows,
    }
