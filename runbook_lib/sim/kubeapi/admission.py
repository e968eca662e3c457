"""What happens to an object between the request body and the store, as on a Talos-provisioned cluster.

Order as in kube-apiserver: defaulting, mutating admission (RuntimeClass), validation (the client's own
pydantic models plus the few field rules the runbooks can trip), then validating admission (Pod Security with
Talos's defaults: ``enforce: baseline`` everywhere except ``kube-system``).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from typing import Any

import kubernetes.client
import pydantic

from .errors import ApiError, forbidden, invalid
from .resources import Resource

_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_VALUE_RE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_SUFFIX_CHARS = "bcdfghjklmnpqrstvwxz2456789"
PSA_LABEL = "pod-security.kubernetes.io/enforce"
# Talos's generated AdmissionControl config (pkg/machinery/config/generate/init.go).
PSA_DEFAULT_LEVEL = "baseline"
PSA_EXEMPT_NAMESPACES = frozenset({"kube-system"})

_BASELINE_CAPS = {
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
}


def random_suffix(n: int = 5) -> str:
    return "".join(random.choice(_SUFFIX_CHARS) for _ in range(n))


def _quantities(d: dict[str, Any] | None) -> None:
    """Accept ints for quantities as the apiserver does (it re-serialises them as strings)."""
    if isinstance(d, dict):
        for k, v in list(d.items()):
            if isinstance(v, int | float) and not isinstance(v, bool):
                d[k] = str(v)


def _normalise_pod_spec(spec: dict[str, Any]) -> None:
    for c in (spec.get("containers") or []) + (spec.get("initContainers") or []):
        if not isinstance(c, dict):
            continue
        res = c.get("resources") or {}
        _quantities(res.get("limits"))
        _quantities(res.get("requests"))
        # Extended resources: requests default to limits.
        for k, v in (res.get("limits") or {}).items():
            if "/" in k and k not in (res.get("requests") or {}):
                res.setdefault("requests", {})[k] = v
        if res:
            c["resources"] = res


def default_pod_spec(spec: dict[str, Any]) -> None:
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("securityContext", {})
    _normalise_pod_spec(spec)
    for c in spec.get("containers") or []:
        if not isinstance(c, dict):
            continue
        image = str(c.get("image") or "")
        tagless = ":" not in image.rsplit("/", 1)[-1] and "@" not in image
        c.setdefault("imagePullPolicy", "Always" if tagless or image.endswith(":latest") else "IfNotPresent")
        c.setdefault("terminationMessagePath", "/dev/termination-log")
        c.setdefault("terminationMessagePolicy", "File")
        c.setdefault("resources", {})


def _qos(spec: dict[str, Any]) -> str:
    containers = spec.get("containers") or []
    if all(not (c.get("resources") or {}) for c in containers):
        return "BestEffort"
    guaranteed = all(
        (c.get("resources") or {}).get("limits", {}).get("cpu")
        and (c.get("resources") or {}).get("limits", {}).get("memory")
        for c in containers
    )
    return "Guaranteed" if guaranteed else "Burstable"


def default(res: Resource, obj: dict[str, Any]) -> None:
    """Server-side defaults for the kinds the runbooks create, so reads look like a real cluster's."""
    spec = obj.get("spec")
    if res.plural == "pods" and isinstance(spec, dict):
        default_pod_spec(spec)
        spec.setdefault("serviceAccountName", "default")
        spec.setdefault("enableServiceLinks", True)
        spec.setdefault("priority", 0)
        tol = spec.setdefault("tolerations", [])
        for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"):
            if not any(t.get("key") == key for t in tol if isinstance(t, dict)):
                tol.append(
                    {"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
                )
        status = obj.setdefault("status", {})
        status.setdefault("phase", "Pending")
        status.setdefault("qosClass", _qos(spec))
    elif res.plural in ("daemonsets", "deployments", "jobs") and isinstance(spec, dict):
        tmpl = spec.setdefault("template", {})
        if isinstance(tmpl.get("spec"), dict):
            default_pod_spec(tmpl["spec"])
        if res.plural == "daemonsets":
            spec.setdefault(
                "updateStrategy", {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}}
            )
            spec.setdefault("revisionHistoryLimit", 10)
            st = obj.setdefault("status", {})
            for k in (
                "currentNumberScheduled",
                "numberMisscheduled",
                "desiredNumberScheduled",
                "numberReady",
            ):
                st.setdefault(k, 0)
        elif res.plural == "deployments":
            spec.setdefault("replicas", 1)
            spec.setdefault("revisionHistoryLimit", 10)
            spec.setdefault("progressDeadlineSeconds", 600)
            spec.setdefault(
                "strategy",
                {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}},
            )
            obj.setdefault("status", {})
        else:
            uid = obj["metadata"]["uid"]
            name = obj["metadata"]["name"]
            spec.setdefault("backoffLimit", 6)
            spec.setdefault("completions", 1)
            spec.setdefault("parallelism", 1)
            spec.setdefault("completionMode", "NonIndexed")
            spec.setdefault("suspend", False)
            if not spec.get("manualSelector"):
                spec.setdefault("selector", {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}})
                labels = tmpl.setdefault("metadata", {}).setdefault("labels", {})
                labels.update(
                    {
                        "batch.kubernetes.io/controller-uid": uid,
                        "batch.kubernetes.io/job-name": name,
                        "controller-uid": uid,
                        "job-name": name,
                    }
                )
            obj.setdefault("status", {})
    elif res.plural == "namespaces":
        labels = obj["metadata"].setdefault("labels", {})
        labels.setdefault("kubernetes.io/metadata.name", obj["metadata"]["name"])
        obj.setdefault("spec", {"finalizers": ["kubernetes"]})
        obj.setdefault("status", {"phase": "Active"})
    elif res.plural == "secrets":
        obj.setdefault("type", "Opaque")
    elif res.plural == "nodes" and isinstance(obj.get("status"), dict):
        _quantities(obj["status"].get("capacity"))
        _quantities(obj["status"].get("allocatable"))


def _model(res: Resource) -> Any:
    return getattr(kubernetes.client, res.model) if res.model else None


def validate(res: Resource, obj: dict[str, Any]) -> dict[str, Any]:
    """Validate with the client's own model and return the object as the model serialises it.

    Round-tripping through the model drops unknown fields, as the apiserver does, and guarantees that
    whatever the simulator serves, the strict client 37 can read back.
    """
    name = str((obj.get("metadata") or {}).get("name") or "")
    causes: list[tuple[str, str, str]] = []
    if not name:
        causes.append(
            ("metadata.name", "FieldValueRequired", "Required value: name or generateName is required")
        )
    elif res.plural != "events" and not _NAME_RE.match(name):
        causes.append(
            (
                "metadata.name",
                "FieldValueInvalid",
                f'Invalid value: "{name}": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric '
                "characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', "
                "regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')",
            )
        )
    for value in ((obj.get("metadata") or {}).get("labels") or {}).values():
        if not is_label_value(value):
            causes.append(
                (
                    "metadata.labels",
                    "FieldValueInvalid",
                    f'Invalid value: "{value}": a valid label must be an empty string or consist of alphanumeric '
                    "characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. "
                    "'MyValue',  or 'my_value',  or '12345', regex used for validation is "
                    "'(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')",
                )
            )
    spec = obj.get("spec") or {}
    if res.plural == "runtimeclasses" and not obj.get("handler"):
        causes.append(("handler", "FieldValueRequired", "Required value"))
    if res.plural == "pods" and not spec.get("containers"):
        causes.append(("spec.containers", "FieldValueRequired", "Required value"))
    if res.plural in ("daemonsets", "deployments", "jobs"):
        tspec = (spec.get("template") or {}).get("spec") or {}
        if not tspec.get("containers"):
            causes.append(("spec.template.spec.containers", "FieldValueRequired", "Required value"))
        if res.plural == "jobs" and tspec.get("restartPolicy") not in ("Never", "OnFailure"):
            causes.append(
                (
                    "spec.template.spec.restartPolicy",
                    "FieldValueRequired",
                    'Required value: valid values: "OnFailure", "Never"',
                )
            )
        if res.plural != "jobs":
            tl = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
            sel = spec.get("selector") or {}
            if not sel:
                causes.append(("spec.selector", "FieldValueRequired", "Required value"))
            elif any(tl.get(k) != v for k, v in (sel.get("matchLabels") or {}).items()):
                causes.append(
                    (
                        "spec.template.metadata.labels",
                        "FieldValueInvalid",
                        f"Invalid value: {tl!r}: `selector` does not match template `labels`",
                    )
                )
    model = _model(res)
    if model is not None:
        try:
            validated = model.from_dict(obj)
        except pydantic.ValidationError as exc:
            for err in exc.errors():
                loc = ".".join(str(p) for p in err["loc"])
                causes.append((loc, "FieldValueInvalid", f"Invalid value: {err['msg']}"))
            validated = None
        if causes:
            raise invalid(res, name, causes)
        assert validated is not None
        return dict(json.loads(validated.to_json()))
    if causes:
        raise invalid(res, name, causes)
    return obj


# --- Pod Security "baseline" --------------------------------------------------------------------------


def _plural(n: int, one: str, many: str) -> str:
    return one if n == 1 else many


def _quote(names: list[str]) -> str:
    return ", ".join(f'"{n}"' for n in names)


def baseline_violations(spec: dict[str, Any]) -> list[str]:
    """The checks of k8s.io/pod-security-admission's baseline policy, with its messages, in its order."""
    out: list[str] = []
    containers = (spec.get("initContainers") or []) + (spec.get("containers") or [])
    host_ns = [f"{f}=true" for f in ("hostNetwork", "hostPID", "hostIPC") if spec.get(f)]
    if host_ns:
        out.append(f"host namespaces ({', '.join(host_ns)})")
    priv = [c["name"] for c in containers if ((c.get("securityContext") or {}).get("privileged"))]
    if priv:
        out.append(
            f"privileged ({_plural(len(priv), 'container', 'containers')} {_quote(priv)} must not set "
            "securityContext.privileged=true)"
        )
    caps: list[str] = []
    bad_caps: list[str] = []
    for c in containers:
        added = ((c.get("securityContext") or {}).get("capabilities") or {}).get("add") or []
        extra = [a for a in added if a not in _BASELINE_CAPS]
        if extra:
            caps.append(c["name"])
            bad_caps.extend(a for a in extra if a not in bad_caps)
    if caps:
        out.append(
            f"non-default capabilities ({_plural(len(caps), 'container', 'containers')} {_quote(caps)} must not "
            f"include {_quote(bad_caps)} in securityContext.capabilities.add)"
        )
    hp = [v["name"] for v in spec.get("volumes") or [] if isinstance(v, dict) and v.get("hostPath")]
    if hp:
        out.append(f"hostPath volumes ({_plural(len(hp), 'volume', 'volumes')} {_quote(hp)})")
    ports: list[str] = []
    port_names: list[str] = []
    for c in containers:
        for p in c.get("ports") or []:
            if p.get("hostPort"):
                if c["name"] not in port_names:
                    port_names.append(c["name"])
                ports.append(str(p["hostPort"]))
    if ports:
        out.append(
            f"hostPort ({_plural(len(port_names), 'container', 'containers')} {_quote(port_names)} "
            f"{_plural(len(ports), 'uses hostPort', 'use hostPorts')} {', '.join(ports)})"
        )
    return out


def restricted_violations(spec: dict[str, Any]) -> list[str]:
    out = baseline_violations(spec)
    containers = (spec.get("initContainers") or []) + (spec.get("containers") or [])
    ape = [
        c["name"]
        for c in containers
        if (c.get("securityContext") or {}).get("allowPrivilegeEscalation") is not False
    ]
    if ape:
        out.append(
            f"allowPrivilegeEscalation != false ({_plural(len(ape), 'container', 'containers')} {_quote(ape)} must "
            "set securityContext.allowPrivilegeEscalation=false)"
        )
    drop = [
        c["name"]
        for c in containers
        if "ALL" not in (((c.get("securityContext") or {}).get("capabilities") or {}).get("drop") or [])
    ]
    if drop:
        out.append(
            f"unrestricted capabilities ({_plural(len(drop), 'container', 'containers')} {_quote(drop)} must set "
            'securityContext.capabilities.drop=["ALL"])'
        )
    psc = spec.get("securityContext") or {}
    nonroot = [
        c["name"]
        for c in containers
        if not ((c.get("securityContext") or {}).get("runAsNonRoot") or psc.get("runAsNonRoot"))
    ]
    if nonroot:
        out.append(
            f"runAsNonRoot != true (pod or {_plural(len(nonroot), 'container', 'containers')} {_quote(nonroot)} "
            "must set securityContext.runAsNonRoot=true)"
        )
    if not (psc.get("seccompProfile") or {}).get("type"):
        out.append(
            "seccompProfile (pod or containers "
            f"{_quote([c['name'] for c in containers])} must set securityContext.seccompProfile.type to "
            '"RuntimeDefault" or "Localhost")'
        )
    return out


def psa_level(ns_obj: dict[str, Any] | None, ns: str) -> str:
    labels = ((ns_obj or {}).get("metadata") or {}).get("labels") or {}
    if PSA_LABEL in labels:
        return str(labels[PSA_LABEL])
    if ns in PSA_EXEMPT_NAMESPACES:
        return "privileged"
    return PSA_DEFAULT_LEVEL


def admit_pod(
    res: Resource,
    obj: dict[str, Any],
    ns_obj: dict[str, Any] | None,
    ns: str,
    get_runtime_class: Callable[[str], dict[str, Any] | None],
) -> None:
    """RuntimeClass admission then Pod Security; raises the 403 a real apiserver answers."""
    spec = obj.get("spec") or {}
    name = obj["metadata"]["name"]
    rc_name = spec.get("runtimeClassName")
    if rc_name:
        rc = get_runtime_class(rc_name)
        if rc is None:
            raise forbidden(res, name, f'pod rejected: RuntimeClass "{rc_name}" not found')
    level = psa_level(ns_obj, ns)
    if level == "privileged":
        return
    violations = restricted_violations(spec) if level == "restricted" else baseline_violations(spec)
    if violations:
        raise forbidden(res, name, f'violates PodSecurity "{level}:latest": ' + ", ".join(violations))


def apply_runtime_class(
    obj: dict[str, Any], get_runtime_class: Callable[[str], dict[str, Any] | None]
) -> None:
    """The mutating half of RuntimeClass admission: overhead and scheduling constraints."""
    spec = obj.get("spec") or {}
    rc = get_runtime_class(str(spec.get("runtimeClassName") or ""))
    if rc:
        overhead = (rc.get("overhead") or {}).get("podFixed")
        if overhead and not spec.get("overhead"):
            spec["overhead"] = overhead
        sched = rc.get("scheduling") or {}
        if sched.get("nodeSelector"):
            spec.setdefault("nodeSelector", {}).update(sched["nodeSelector"])
        for t in sched.get("tolerations") or []:
            spec.setdefault("tolerations", []).append(t)


def check_immutable(res: Resource, old: dict[str, Any], new: dict[str, Any]) -> None:
    name = old["metadata"]["name"]
    if res.plural == "pods":
        o, n = dict(old.get("spec") or {}), dict(new.get("spec") or {})
        if o.get("nodeName") and n.get("nodeName") != o.get("nodeName"):
            raise invalid(
                res,
                name,
                [
                    (
                        "spec",
                        "FieldValueForbidden",
                        "Forbidden: pod updates may not change fields other than `spec.containers[*].image`, `spec.initContainers[*].image`, `spec.activeDeadlineSeconds`, `spec.tolerations` (only additions to existing tolerations), `spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)",
                    )
                ],
            )
    if res.plural == "runtimeclasses" and old.get("handler") != new.get("handler"):
        raise invalid(
            res,
            name,
            [("handler", "FieldValueInvalid", f'Invalid value: "{new.get("handler")}": field is immutable')],
        )
    if res.plural in ("daemonsets", "deployments") and (old.get("spec") or {}).get("selector") != (
        new.get("spec") or {}
    ).get("selector"):
        raise invalid(
            res, name, [("spec.selector", "FieldValueInvalid", "Invalid value: field is immutable")]
        )


def is_label_value(v: object) -> bool:
    return isinstance(v, str) and len(v) <= 63 and bool(_LABEL_VALUE_RE.match(v))


__all__ = ["ApiError", "admit_pod", "apply_runtime_class", "default", "random_suffix", "validate"]
