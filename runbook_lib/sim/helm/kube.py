"""The few Kubernetes calls ``helm`` makes, over HTTP with the kubeconfig, as the real binary does."""

from __future__ import annotations

import atexit
import base64
import os
import tempfile
from pathlib import Path
from typing import Any

import requests
import yaml

from runbook_lib.sim.kubeapi import resources as rt


class KubeError(Exception):
    def __init__(self, code: int, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason


class Kube:
    def __init__(self, kubeconfig: str | None, context: str | None) -> None:
        path = (
            kubeconfig
            or os.environ.get("KUBECONFIG", "").split(os.pathsep)[0]
            or str(Path.home() / ".kube" / "config")
        )
        state = os.environ.get("RUNBOOK_SIM_STATE")
        if not kubeconfig and not os.environ.get("KUBECONFIG") and state and not Path(path).exists():
            path = str(Path(state) / "kubeconfig")  # the simulated cluster's own kubeconfig
        try:
            cfg = yaml.safe_load(Path(path).read_text()) or {}
        except FileNotFoundError:
            raise KubeError(
                0,
                "Kubernetes cluster unreachable: invalid configuration: no configuration has been provided, "
                "try setting KUBERNETES_MASTER environment variable",
            ) from None
        ctx_name = context or cfg.get("current-context")
        ctx = next((c["context"] for c in cfg.get("contexts") or [] if c.get("name") == ctx_name), None)
        if ctx is None:
            raise KubeError(0, f'Kubernetes cluster unreachable: context "{ctx_name}" does not exist')
        cluster = next(c["cluster"] for c in cfg.get("clusters") or [] if c.get("name") == ctx.get("cluster"))
        user: dict[str, Any] = (
            next((u["user"] for u in cfg.get("users") or [] if u.get("name") == ctx.get("user")), {}) or {}
        )
        self.server = str(cluster["server"]).rstrip("/")
        self.namespace = str(ctx.get("namespace") or "default")
        self.session = requests.Session()
        if user.get("token"):
            self.session.headers["Authorization"] = f"Bearer {user['token']}"
        self.session.headers["User-Agent"] = "helm/v3.18.0 (linux/amd64) kubernetes/7e0bb5a"
        # Passed per request: requests lets $REQUESTS_CA_BUNDLE override a session-level setting.
        self.verify: bool | str = True
        if cluster.get("insecure-skip-tls-verify"):
            self.verify = False
        elif cluster.get("certificate-authority-data"):
            with tempfile.NamedTemporaryFile("wb", delete=False, suffix=".crt") as f:
                f.write(base64.b64decode(cluster["certificate-authority-data"]))
            self.verify = f.name
            atexit.register(os.unlink, f.name)
        elif cluster.get("certificate-authority"):
            self.verify = str(cluster["certificate-authority"])

    def _url(self, res: rt.Resource, ns: str, name: str = "", sub: str = "") -> str:
        base = (
            f"{self.server}/api/{res.version}"
            if not res.group
            else f"{self.server}/apis/{res.group}/{res.version}"
        )
        if res.namespaced and ns:
            base += f"/namespaces/{ns}"
        base += f"/{res.plural}"
        if name:
            base += f"/{name}"
        if sub:
            base += f"/{sub}"
        return base

    def _call(self, method: str, url: str, **kw: Any) -> Any:
        try:
            r = self.session.request(method, url, timeout=30, verify=self.verify, **kw)
        except requests.exceptions.SSLError:
            raise KubeError(
                0,
                f'Kubernetes cluster unreachable: Get "{self.server}/version": tls: failed to verify certificate: '
                "x509: certificate signed by unknown authority",
            ) from None
        except requests.ConnectionError:
            raise KubeError(
                0,
                f'Kubernetes cluster unreachable: Get "{self.server}/version": dial tcp: connect: connection refused',
            ) from None
        if r.status_code >= 400:
            try:
                body = r.json()
            except ValueError:
                body = {"message": r.text}
            raise KubeError(r.status_code, str(body.get("message", r.reason)), str(body.get("reason", "")))
        return r.json() if r.content else None

    @staticmethod
    def resource(obj: dict[str, Any]) -> rt.Resource:
        res = rt.by_kind(str(obj.get("apiVersion")), str(obj.get("kind")))
        if res is None:
            raise KubeError(
                0,
                f'resource mapping not found for name: "{obj.get("metadata", {}).get("name")}" namespace: "" from "": '
                f'no matches for kind "{obj.get("kind")}" in version "{obj.get("apiVersion")}"\n'
                "ensure CRDs are installed first",
            )
        return res

    def get(self, res: rt.Resource, ns: str, name: str) -> dict[str, Any] | None:
        try:
            out: dict[str, Any] = self._call("GET", self._url(res, ns, name))
            return out
        except KubeError as e:
            if e.code == 404:
                return None
            raise

    def list(self, res: rt.Resource, ns: str, selector: str = "") -> list[dict[str, Any]]:
        out = self._call("GET", self._url(res, ns), params={"labelSelector": selector} if selector else None)
        return list(out.get("items") or [])

    def create(self, res: rt.Resource, ns: str, obj: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = self._call("POST", self._url(res, ns), json=obj)
        return out

    def replace(self, res: rt.Resource, ns: str, name: str, obj: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = self._call("PUT", self._url(res, ns, name), json=obj)
        return out

    def patch(self, res: rt.Resource, ns: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = self._call(
            "PATCH",
            self._url(res, ns, name),
            json=body,
            headers={"Content-Type": "application/merge-patch+json"},
        )
        return out

    def delete(self, res: rt.Resource, ns: str, name: str) -> None:
        try:
            self._call("DELETE", self._url(res, ns, name), json={"propagationPolicy": "Background"})
        except KubeError as e:
            if e.code != 404:
                raise
