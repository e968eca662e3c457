"""API errors carried as the ``Status`` bodies a real kube-apiserver sends.

Clients (the official Python client, kubectl, helm) branch on ``code``/``reason`` and show ``message``, so each
constructor reproduces the apiserver's wording for its case.
"""

from __future__ import annotations

from typing import Any

from .resources import Resource


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details

    def status(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details is not None:
            body["details"] = self.details
        return body


def _details(res: Resource, name: str) -> dict[str, Any]:
    d: dict[str, Any] = {"name": name, "kind": res.plural}
    if res.group:
        d["group"] = res.group
    return d


def not_found(res: Resource, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{res.qualified} "{name}" not found', _details(res, name))


def already_exists(res: Resource, name: str) -> ApiError:
    return ApiError(409, "AlreadyExists", f'{res.qualified} "{name}" already exists', _details(res, name))


def conflict(res: Resource, name: str) -> ApiError:
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {res.qualified} "{name}": the object has been modified; '
        "please apply your changes to the latest version and try again",
        _details(res, name),
    )


def forbidden(res: Resource, name: str, why: str) -> ApiError:
    return ApiError(403, "Forbidden", f'{res.qualified} "{name}" is forbidden: {why}', _details(res, name))


def invalid(res: Resource, name: str, causes: list[tuple[str, str, str]]) -> ApiError:
    """``causes`` are (field, reason, message), e.g. ("handler", "FieldValueRequired", "Required value")."""
    text = ", ".join(f"{f}: {m}" if f else m for f, _, m in causes)
    if len(causes) > 1:
        text = "[" + text + "]"
    details: dict[str, Any] = {
        "name": name,
        "kind": res.kind,
        "causes": [{"reason": r, "message": m, "field": f} for f, r, m in causes],
    }
    if res.group:
        details["group"] = res.group
    return ApiError(422, "Invalid", f'{res.qualified_kind} "{name}" is invalid: {text}', details)


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def unauthorized() -> ApiError:
    return ApiError(401, "Unauthorized", "Unauthorized")


def gone(message: str) -> ApiError:
    return ApiError(410, "Expired", message)


def namespace_not_found(ns: str) -> ApiError:
    return ApiError(404, "NotFound", f'namespaces "{ns}" not found', {"name": ns, "kind": "namespaces"})
