"""The simulated kube-apiserver: a stdlib threaded HTTP server over :mod:`.store`.

Started by the simulator daemon through ``make_server(state_dir)`` and ``on_started(state_dir, url)``; the
library reaches it only through the kubeconfig ``on_started`` writes, with the official client, exactly as it
would reach a real cluster.  The controllers and kubelets (:mod:`runbook_lib.sim.kubelet`) run in a thread of
the same process and write through the same store, so watches see their changes.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import secrets
import shutil
import ssl
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml

from runbook_lib.sim import state as sim_state
from runbook_lib.sim.kubelet import Controllers

from . import resources as rt
from . import tables
from .errors import ApiError, bad_request, unauthorized
from .faults import FaultFile
from .resources import Resource
from .selectors import parse_field_selector, parse_label_selector
from .store import Store, WatchEntry

logger = logging.getLogger("runbook_lib.sim.kubeapi")

KUBE_VERSION = {
    "major": "1",
    "minor": "34",
    "emulationMajor": "1",
    "emulationMinor": "34",
    "minCompatibilityMajor": "1",
    "minCompatibilityMinor": "33",
    "gitVersion": "v1.34.1",
    "gitCommit": "93248f9ae092f571eb6b8a1ed9fee1a7a3ec3a84",
    "gitTreeState": "clean",
    "buildDate": "2025-09-09T19:43:16Z",
    "goVersion": "go1.24.6",
    "compiler": "gc",
    "platform": "linux/amd64",
}
WATCH_DEFAULT_TIMEOUT_S = 1800.0


def version_info(state_dir: Path) -> dict[str, str]:
    """``/version`` for the Kubernetes release the simulated Talos version ships (every field the client requires)."""
    info = dict(KUBE_VERSION)
    try:
        kube = str(json.loads((Path(state_dir) / "cluster.json").read_text()).get("kubernetes_version") or "")
    except (OSError, ValueError):
        kube = ""
    parts = kube.lstrip("v").split(".")
    if len(parts) == 3 and all(p.isdigit() for p in parts):
        info.update(
            major=parts[0],
            minor=parts[1],
            emulationMajor=parts[0],
            emulationMinor=parts[1],
            minCompatibilityMajor=parts[0],
            minCompatibilityMinor=str(max(int(parts[1]) - 1, 0)),
            gitVersion=f"v{kube.lstrip('v')}",
        )
    return info


def token_path(state_dir: Path) -> Path:
    return Path(state_dir) / "kube" / "token"


def kubeconfig_path(state_dir: Path) -> Path:
    return Path(sim_state.sim_paths(Path(state_dir)).kubeconfig)


class KubeServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(
        self,
        state_dir: Path,
        token: str,
        *,
        start_controllers: bool = True,
        tls: tuple[Path, Path] | None = None,
    ) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.tls = tls
        if tls is not None:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(certfile=str(tls[0]), keyfile=str(tls[1]))
            # As kube-apiserver's --client-ca-file: a client certificate this CA signed authenticates its holder
            # (the Talos admin kubeconfig's, see admin_client_cert); clients without one still use the token.
            ctx.load_verify_locations(cafile=str(tls[0]))
            ctx.verify_mode = ssl.CERT_OPTIONAL
            # Handshakes happen in the handler threads, so one slow client cannot stall accept().
            self.socket = ctx.wrap_socket(self.socket, server_side=True, do_handshake_on_connect=False)
        self.state_dir = Path(state_dir)
        self.token = token
        self.store = Store()
        self.store.load(snapshot_path(self.state_dir), cluster_stamp(self.state_dir))
        self.faults = FaultFile(self.state_dir)
        self.version_info = version_info(self.state_dir)
        self.controllers: Any = None
        if start_controllers:
            self.controllers = Controllers(self.store, self.state_dir)
            self.controllers.start()

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"{'https' if self.tls else 'http'}://{host!s}:{port}"

    def shutdown(self) -> None:
        if self.controllers is not None:
            self.controllers.stop()
        super().shutdown()
        self.store.save(snapshot_path(self.state_dir), cluster_stamp(self.state_dir))


def snapshot_path(state_dir: Path) -> Path:
    return Path(state_dir) / "kube" / "store.json"


def cluster_stamp(state_dir: Path) -> str:
    """Identifies the cluster a snapshot belongs to: a re-created cluster must not inherit old objects."""
    try:
        return str(os.stat(Path(state_dir) / "cluster.json").st_mtime_ns)
    except FileNotFoundError:
        return ""


def make_server(state_dir: Path, *, start_controllers: bool = True) -> KubeServer:
    """Bind to a free loopback port with a fresh bearer token (kept in ``<state>/kube/token``, mode 0600)."""
    token = secrets.token_urlsafe(32)
    path = token_path(state_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token)
    return KubeServer(
        Path(state_dir), token, start_controllers=start_controllers, tls=serving_cert(Path(state_dir))
    )


def serving_cert(state_dir: Path) -> tuple[Path, Path] | None:
    """A self-signed serving certificate for 127.0.0.1 (made once per state dir with the ``openssl`` CLI).

    HTTPS matters beyond realism: Go clients (kubectl, real helm) never send a bearer token over plain HTTP.
    Without ``openssl`` the server falls back to HTTP, which the Python client still accepts.
    """
    subject = ["-subj", "/CN=kube-apiserver", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"]
    return openssl_keypair(
        Path(state_dir) / "kube", "apiserver", [*subject, "-addext", "basicConstraints=critical,CA:TRUE"]
    )


def openssl_keypair(d: Path, name: str, args: list[str]) -> tuple[Path, Path] | None:
    """``<d>/<name>.crt`` and its P-256 key ``<name>.key`` (mode 0600), made once with ``openssl req -x509``
    and ``args`` (subject, extensions, issuer); None without ``openssl`` or when it fails (logged)."""
    made = make_keypair(d, name, args)
    return made if isinstance(made, tuple) else None


def make_keypair(
    d: Path, name: str, args: list[str], *, issuer: Path | None = None
) -> tuple[Path, Path] | str:
    """``openssl_keypair``, or why not: openssl's own error, also logged (the daemon's log), so a failure is said
    where it happens. Made again when ``issuer`` (its CA's certificate) is newer: a certificate signed by a CA
    made since is refused (401)."""
    cert, key = d / f"{name}.crt", d / f"{name}.key"
    stale = issuer is not None and cert.exists() and issuer.stat().st_mtime > cert.stat().st_mtime
    if cert.exists() and key.exists() and not stale:
        return cert, key
    openssl = shutil.which("openssl")
    if openssl is None:
        return _keypair_failed(name, "no openssl on PATH")
    d.mkdir(parents=True, exist_ok=True)
    cmd = [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    cmd += ["-keyout", str(key), "-out", str(cert), "-days", "3650", *args]
    result = subprocess.run(cmd, capture_output=True, check=False, timeout=30)
    if result.returncode != 0:
        error = result.stderr.decode(errors="replace").strip()  # openssl's messages: no key material
        return _keypair_failed(name, f"openssl req failed (exit {result.returncode}): {error}")
    key.chmod(0o600)
    return cert, key


def _keypair_failed(name: str, why: str) -> str:
    logger.warning("certificate %s not made: %s", name, why)
    return why


def kubeconfig(url: str, token: str, ca: bytes | None = None) -> dict[str, Any]:
    cluster: dict[str, Any] = {"server": url}
    if ca is not None and url.startswith("https"):
        cluster["certificate-authority-data"] = base64.b64encode(ca).decode()
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "talos-sim", "cluster": cluster}],
        "users": [{"name": "admin@talos-sim", "user": {"token": token}}],
        "contexts": [
            {
                "name": "admin@talos-sim",
                "context": {"cluster": "talos-sim", "user": "admin@talos-sim", "namespace": "default"},
            }
        ],
        "current-context": "admin@talos-sim",
        "preferences": {},
    }


#: Talos's admin certificate subject (talos@v1.14.1 pkg/machinery/constants/constants.go:268-275, used by
#: pkg/kubeconfig/generate.go:35-52): kube-apiserver maps O to the user's groups, and system:masters is the admin.
ADMIN_COMMON_NAME = "admin"
ADMIN_ORGANIZATION = "system:masters"
#: The simulated cluster's name (cluster.CLUSTER_NAME, which imports this module's package).
CLUSTER_NAME = "talos-gpu-sim"


def admin_client_cert(state_dir: Path, ca: tuple[Path, Path]) -> tuple[Path, Path] | str:
    """The admin client certificate and key (made once per state dir with the ``openssl`` CLI, again when the CA
    is newer), signed by the serving certificate, which is this API server's CA; with the usages Talos gives it
    (generate.go:80-93). Else why not (openssl's error)."""
    args = [
        "-CA",
        str(ca[0]),
        "-CAkey",
        str(ca[1]),
        "-subj",
        f"/O={ADMIN_ORGANIZATION}/CN={ADMIN_COMMON_NAME}",
    ]
    args += ["-addext", "basicConstraints=CA:FALSE", "-addext", "extendedKeyUsage=clientAuth"]
    args += ["-addext", "keyUsage=critical,digitalSignature,keyEncipherment"]
    return make_keypair(Path(state_dir) / "kube", "admin", args, issuer=ca[0])


def talos_kubeconfig(url: str, ca: bytes, client: tuple[bytes, bytes]) -> dict[str, Any]:
    """What kubeconfig.Generate writes (generate.go:102-124): one cluster named after the cluster, one user
    ``admin@<cluster>`` with the client certificate and key only, one context in namespace default."""
    name = CLUSTER_NAME
    b64 = base64.b64encode
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": name, "cluster": {"server": url, "certificate-authority-data": b64(ca).decode()}}
        ],
        "users": [
            {
                "name": f"admin@{name}",
                "user": {
                    "client-certificate-data": b64(client[0]).decode(),
                    "client-key-data": b64(client[1]).decode(),
                },
            }
        ],
        "contexts": [
            {
                "name": f"admin@{name}",
                "context": {"cluster": name, "namespace": "default", "user": f"admin@{name}"},
            }
        ],
        "current-context": f"admin@{name}",
    }


def _write_private(path: Path, doc: dict[str, Any]) -> None:
    """Write ``doc`` as YAML, mode 0600, replacing ``path`` in one step (readers never see half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        yaml.safe_dump(doc, f, sort_keys=False)
    os.replace(tmp, path)


def write_talos_kubeconfig(state_dir: Path, url: str) -> Path | None:
    """Write the Talos-structured admin kubeconfig for ``url`` (none over plain HTTP or without ``openssl``).

    Without it, why is kept beside it (``talos_kubeconfig_error_path``): ``realtalos.choose`` then keeps 1.14 nodes
    on the Python talosctl saying so, instead of a run that fails later at the drain with no hint."""
    ca = (Path(state_dir) / "kube" / "apiserver.crt", Path(state_dir) / "kube" / "apiserver.key")
    if not url.startswith("https") or not ca[0].exists():
        client: tuple[Path, Path] | str = (
            f"the API serves plain HTTP ({url}): no serving certificate was made"
        )
    else:
        client = admin_client_cert(state_dir, ca)
    path, why = sim_state.talos_kubeconfig_path(state_dir), sim_state.talos_kubeconfig_error_path(state_dir)
    if isinstance(client, str):
        path.unlink(missing_ok=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        why.write_text(client + "\n")
        return None
    doc = talos_kubeconfig(url, ca[0].read_bytes(), (client[0].read_bytes(), client[1].read_bytes()))
    _write_private(path, doc)
    why.unlink(missing_ok=True)
    return path


def on_started(state_dir: Path, url: str) -> Path:
    """Write the kubeconfig (mode 0600) pointing at ``url`` with the token of the running server."""
    token = token_path(state_dir).read_text().strip()
    path = kubeconfig_path(state_dir)
    cert = Path(state_dir) / "kube" / "apiserver.crt"
    _write_private(path, kubeconfig(url, token, cert.read_bytes() if cert.exists() else None))
    write_talos_kubeconfig(state_dir, url)
    return path


def serve_in_thread(state_dir: Path, *, start_controllers: bool = True) -> KubeServer:
    """Tests and tools: start a server and write its kubeconfig, in this process."""
    srv = make_server(state_dir, start_controllers=start_controllers)
    threading.Thread(target=srv.serve_forever, name="sim-kubeapi", daemon=True).start()
    on_started(state_dir, srv.url)
    return srv


# --- request handling ---------------------------------------------------------------------------------


def openapi_v3(path: str) -> dict[str, Any] | None:
    """A permissive OpenAPI v3 index and per group-version documents.

    kubectl refuses to create or apply anything when it cannot download OpenAPI ("failed to download
    openapi"); schemas that name each kind and accept any fields let it through, while the server itself
    still validates every object with the client's models.
    """
    p = path.rstrip("/")
    gvs = [("", "v1")] + [(g, v) for g, vs in rt.groups().items() for v in vs]

    def key(g: str, v: str) -> str:
        return f"apis/{g}/{v}" if g else f"api/{v}"

    if p == "/openapi/v3":
        return {
            "paths": {key(g, v): {"serverRelativeURL": f"/openapi/v3/{key(g, v)}?hash=sim"} for g, v in gvs}
        }
    for g, v in gvs:
        if p == f"/openapi/v3/{key(g, v)}":
            schemas = {
                f"io.k8s.sim.{g or 'core'}.{v}.{r.kind}": {
                    "type": "object",
                    "x-kubernetes-preserve-unknown-fields": True,
                    "x-kubernetes-group-version-kind": [{"group": g, "kind": r.kind, "version": v}],
                }
                for r in rt.resources_of(g, v)
            }
            paths: dict[str, Any] = {}
            for r in rt.resources_of(g, v):
                base = f"/{key(g, v)}" + ("/namespaces/{namespace}" if r.namespaced else "") + f"/{r.plural}"
                gvk = {"group": g, "kind": r.kind, "version": v}
                params = [{"name": "fieldValidation", "in": "query", "schema": {"type": "string"}}]
                paths[base] = {
                    "post": {
                        "parameters": params,
                        "x-kubernetes-action": "post",
                        "x-kubernetes-group-version-kind": gvk,
                    }
                }
                paths[base + "/{name}"] = {
                    verb: {
                        "parameters": params,
                        "x-kubernetes-action": verb,
                        "x-kubernetes-group-version-kind": gvk,
                    }
                    for verb in ("put", "patch")
                }
            return {
                "openapi": "3.0.0",
                "info": {"title": "Kubernetes", "version": "v1.35.0"},
                "paths": paths,
                "components": {"schemas": schemas},
            }
    return None


class _Route:
    def __init__(self, res: Resource, ns: str, name: str, sub: str) -> None:
        self.res, self.ns, self.name, self.sub = res, ns, name, sub


def _route(path: str) -> _Route | None:
    parts = [p for p in path.strip("/").split("/") if p]
    if parts[:2] == ["api", "v1"]:
        group, version, rest = "", "v1", parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    if not rest:
        return None
    ns = ""
    if rest[0] == "namespaces" and len(rest) >= 3:
        ns, rest = rest[1], rest[2:]
    res = rt.BY_KEY.get(f"{group}/{version}/{rest[0]}" if group else f"{version}/{rest[0]}")
    if res is None:
        return None
    if ns and not res.namespaced:
        return None
    name = rest[1] if len(rest) > 1 else ""
    sub = rest[2] if len(rest) > 2 else ""
    if len(rest) > 3 or (sub and sub not in res.subresources):
        return None
    return _Route(res, ns, name, sub)


def _discovery_list(group: str, version: str) -> dict[str, Any]:
    items: list[dict[str, Any]] = []
    for r in rt.resources_of(group, version):
        items.append(
            {
                "name": r.plural,
                "singularName": r.singular,
                "namespaced": r.namespaced,
                "kind": r.kind,
                "verbs": list(r.verbs),
                **({"shortNames": list(r.short_names)} if r.short_names else {}),
            }
        )
        for sub in r.subresources:
            verbs = (
                ["get"]
                if sub == "log"
                else (["create"] if sub in ("binding", "eviction") else ["get", "patch", "update"])
            )
            kind = {"log": "Pod", "binding": "Binding", "eviction": "Eviction"}.get(sub, r.kind)
            items.append(
                {
                    "name": f"{r.plural}/{sub}",
                    "singularName": "",
                    "namespaced": r.namespaced,
                    "kind": kind,
                    "verbs": verbs,
                }
            )
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{group}/{version}" if group else version,
        "resources": items,
    }


def _group(name: str, versions: list[str]) -> dict[str, Any]:
    vs = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
    return {"kind": "APIGroup", "apiVersion": "v1", "name": name, "versions": vs, "preferredVersion": vs[0]}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes; with Nagle on, every answer waits ~40 ms for a delayed ACK.
    disable_nagle_algorithm = True
    server: KubeServer
    server_version = "talos-sim-kube-apiserver"

    def log_message(self, format: str, *args: Any) -> None:  # quiet: the daemon has no console
        return

    # --- plumbing --------------------------------------------------------------------------------------

    def _send(self, code: int, body: Any, ctype: str = "application/json") -> None:
        data = (
            body
            if isinstance(body, bytes)
            else (body.encode() if isinstance(body, str) else json.dumps(body).encode())
        )
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-cache, private")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _error(self, err: ApiError) -> None:
        self._send(err.code, err.status())

    def _body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            try:
                return yaml.safe_load(raw)
            except yaml.YAMLError as exc:
                raise bad_request(f"couldn't get version/kind; json parse error: {exc}") from None

    def _authorized(self) -> bool:
        header = self.headers.get("Authorization", "")
        if header.startswith("Bearer ") and secrets.compare_digest(header[7:].strip(), self.server.token):
            return True
        return self._admin_certificate()

    def _admin_certificate(self) -> bool:
        """A client certificate the CA verified (CERT_OPTIONAL: ``getpeercert`` is empty otherwise) whose O is
        system:masters: kube-apiserver's x509 authenticator makes O the groups, and that group is the admin."""
        conn = self.connection
        cert = conn.getpeercert() if isinstance(conn, ssl.SSLSocket) else None
        subject = cert.get("subject", ()) if cert else ()
        return any(tuple(attr) == ("organizationName", ADMIN_ORGANIZATION) for rdn in subject for attr in rdn)

    def _handle(self) -> None:
        split = urlsplit(self.path)
        path, query = split.path, {k: v[-1] for k, v in parse_qs(split.query, keep_blank_values=True).items()}
        faults = self.server.faults.read()
        latency = float(faults.get("api_latency_ms") or 0)
        if latency > 0:
            time.sleep(latency / 1000.0)
        if path.rstrip("/") in ("/healthz", "/livez", "/readyz"):
            self._send(200, "ok", "text/plain; charset=utf-8")
            return
        if path.startswith("/openapi/v3") and self._authorized():
            doc = openapi_v3(path)
            if doc is not None:
                self._send(200, doc)
                return
        if path in ("/version", "/version/"):
            self._send(200, self.server.version_info)
            return
        if not self._authorized():
            self._error(unauthorized())
            return
        try:
            if self._discovery(path):
                return
            route = _route(path)
            if route is None:
                self._send(
                    404,
                    {
                        "kind": "Status",
                        "apiVersion": "v1",
                        "metadata": {},
                        "status": "Failure",
                        "message": "the server could not find the requested resource",
                        "reason": "NotFound",
                        "details": {},
                        "code": 404,
                    },
                )
                return
            self._dispatch(route, query, faults)
        except ApiError as err:
            self._error(err)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _discovery(self, path: str) -> bool:
        p = path.rstrip("/")
        if self.command != "GET":
            return False
        if p == "/api":
            host = f"{self.server.server_address[0]!s}:{self.server.server_address[1]}"
            self._send(
                200,
                {
                    "kind": "APIVersions",
                    "versions": ["v1"],
                    "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": host}],
                },
            )
        elif p == "/apis":
            self._send(
                200,
                {
                    "kind": "APIGroupList",
                    "apiVersion": "v1",
                    "groups": [_group(g, vs) for g, vs in rt.groups().items()],
                },
            )
        elif p == "/api/v1":
            self._send(200, _discovery_list("", "v1"))
        elif p.startswith("/apis/") and p.count("/") == 2 and p.split("/")[2] in rt.groups():
            g = p.split("/")[2]
            self._send(200, _group(g, rt.groups()[g]))
        elif (
            p.startswith("/apis/")
            and p.count("/") == 3
            and p.split("/")[3] in rt.groups().get(p.split("/")[2], [])
        ):
            self._send(200, _discovery_list(p.split("/")[2], p.split("/")[3]))
        else:
            return False
        return True

    # --- verbs -----------------------------------------------------------------------------------------

    def _dispatch(self, r: _Route, q: dict[str, str], faults: dict[str, Any]) -> None:
        store = self.server.store
        method = self.command
        dry_run = q.get("dryRun") == "All"
        if method == "GET" and r.sub == "log":
            self._log(r, q)
        elif method == "GET" and not r.name:
            if q.get("watch") in ("true", "1"):
                self._watch(r, q, faults)
            else:
                self._list(r, q)
        elif method == "GET":
            obj = store.get(r.res, r.ns, r.name)
            if tables.wants_table(self.headers.get("Accept", "")):
                self._send(200, tables.table(r.res, [obj], obj["metadata"].get("resourceVersion", "")))
            else:
                self._send(200, obj)
        elif method == "POST" and r.sub == "eviction":
            # The Eviction API (kubectl drain): no PodDisruptionBudgets here, so an eviction is a delete.
            self._body()
            store.delete(r.res, r.ns, r.name)
            self._send(
                201, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}
            )
        elif method == "POST" and r.sub == "binding":
            body = self._body() or {}
            node = (body.get("target") or {}).get("name", "")
            store.mutate(r.res, r.ns, r.name, lambda o: o["spec"].__setitem__("nodeName", node))
            self._send(
                201, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}
            )
        elif method == "POST" and not r.name:
            body = self._body()
            if not isinstance(body, dict):
                raise bad_request("the body of the request was in an unknown format")
            self._send(201, store.create(r.res, r.ns, body, dry_run=dry_run))
        elif method == "PUT" and r.name:
            body = self._body()
            if not isinstance(body, dict):
                raise bad_request("the body of the request was in an unknown format")
            self._send(200, store.replace(r.res, r.ns, r.name, body, r.sub or None, dry_run=dry_run))
        elif method == "PATCH" and r.name:
            self._send(
                200,
                store.patch(
                    r.res,
                    r.ns,
                    r.name,
                    self.headers.get("Content-Type", ""),
                    self._body(),
                    r.sub or None,
                    dry_run=dry_run,
                ),
            )
        elif method == "DELETE" and r.name:
            self._body()
            obj = store.delete(r.res, r.ns, r.name, dry_run=dry_run)
            if r.res.plural == "pods":
                self._send(200, obj)
            else:
                details: dict[str, Any] = {
                    "name": r.name,
                    "kind": r.res.plural,
                    "uid": obj["metadata"]["uid"],
                }
                if r.res.group:
                    details["group"] = r.res.group
                self._send(
                    200,
                    {
                        "kind": "Status",
                        "apiVersion": "v1",
                        "metadata": {},
                        "status": "Success",
                        "details": details,
                    },
                )
        elif method == "DELETE":
            self._body()
            items, _ = store.list(r.res, r.ns, q.get("labelSelector"), q.get("fieldSelector"))
            deleted = []
            for o in list(items):
                with contextlib.suppress(ApiError):
                    deleted.append(
                        store.delete(r.res, r.ns or o["metadata"].get("namespace", ""), o["metadata"]["name"])
                    )
            self._send(
                200,
                {
                    "kind": f"{r.res.kind}List",
                    "apiVersion": r.res.api_version,
                    "metadata": {"resourceVersion": str(store.rv)},
                    "items": deleted,
                },
            )
        else:
            self._send(
                405,
                ApiError(
                    405,
                    "MethodNotAllowed",
                    "the server does not allow this method on the requested resource",
                ).status(),
            )

    def _list(self, r: Resource | _Route, q: dict[str, str]) -> None:
        assert isinstance(r, _Route)
        items, rv = self.server.store.list(r.res, r.ns, q.get("labelSelector"), q.get("fieldSelector"))
        items = sorted(items, key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"]))
        meta: dict[str, Any] = {"resourceVersion": rv}
        limit = int(q.get("limit") or 0)
        start = int(q.get("continue") or 0) if (q.get("continue") or "").isdigit() else 0
        if limit:
            page = items[start : start + limit]
            if start + limit < len(items):
                meta["continue"] = str(start + limit)
                meta["remainingItemCount"] = len(items) - start - limit
            items = page
        if tables.wants_table(self.headers.get("Accept", "")):
            self._send(200, tables.table(r.res, items, rv) | {"metadata": meta})
            return
        body = {
            "kind": f"{r.res.kind}List",
            "apiVersion": r.res.api_version,
            "metadata": meta,
            "items": items,
        }
        self._send(200, body)

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _start_stream(self, ctype: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache, private")
        self.end_headers()

    def _watch(self, r: _Route, q: dict[str, str], faults: dict[str, Any]) -> None:
        store = self.server.store
        lsel = parse_label_selector(q.get("labelSelector"))
        fsel = parse_field_selector(q.get("fieldSelector"))
        timeout = float(q.get("timeoutSeconds") or WATCH_DEFAULT_TIMEOUT_S)
        drop_after = faults.get("watch_drop_after_s")
        started = time.monotonic()
        deadline = started + timeout

        as_table = tables.wants_table(self.headers.get("Accept", ""))

        def shape(o: dict[str, Any]) -> dict[str, Any]:
            """``kubectl get -w`` asks for Tables in the watch stream too."""
            return tables.table(r.res, [o], o["metadata"].get("resourceVersion", "")) if as_table else o

        def wanted(e: WatchEntry) -> bool:
            if e.res != r.res.key or (r.ns and e.namespace != r.ns):
                return False
            if r.name and e.obj["metadata"]["name"] != r.name:
                return False
            return lsel(e.obj["metadata"].get("labels") or {}) and fsel(e.obj)

        rv_text = q.get("resourceVersion") or ""
        initial: list[dict[str, Any]] = []
        gone: ApiError | None = None
        with store.lock:
            if rv_text in ("", "0"):
                items, _ = store.list(r.res, r.ns)
                initial = [
                    o
                    for o in items
                    if (not r.name or o["metadata"]["name"] == r.name)
                    and lsel(o["metadata"].get("labels") or {})
                    and fsel(o)
                ]
                last = store.rv
            else:
                try:
                    last = int(rv_text)
                    store.events_since(last)
                except ValueError:
                    raise bad_request(f'invalid resource version "{rv_text}"') from None
                except ApiError as err:
                    gone, last = err, store.rv
        self._start_stream("application/json")
        if gone is not None:
            self._chunk(json.dumps({"type": "ERROR", "object": gone.status()}).encode() + b"\n")
            self._chunk(b"")
            return
        for o in initial:
            self._chunk(json.dumps({"type": "ADDED", "object": shape(o)}).encode() + b"\n")
        while True:
            now = time.monotonic()
            if drop_after is not None and now - started >= float(drop_after):
                # A dropped connection: no terminating chunk, the socket just closes.
                self.close_connection = True
                return
            if now >= deadline:
                break
            with store.cond:
                try:
                    entries = store.events_since(last)
                except ApiError as err:
                    self._chunk(json.dumps({"type": "ERROR", "object": err.status()}).encode() + b"\n")
                    break
                if not entries:
                    wait = min(deadline - now, 0.5)
                    if drop_after is not None:
                        wait = min(wait, max(0.0, float(drop_after) - (now - started)))
                    store.cond.wait(max(wait, 0.01))
                    continue
            for e in entries:
                last = e.rv
                if wanted(e):
                    self._chunk(json.dumps({"type": e.type, "object": shape(e.obj)}).encode() + b"\n")
        self._chunk(b"")

    def _log(self, r: _Route, q: dict[str, str]) -> None:
        store = self.server.store
        pod = store.get(r.res, r.ns, r.name)
        names = [c["name"] for c in pod["spec"].get("containers") or []]
        container = q.get("container") or ""
        if not container:
            if len(names) != 1:
                raise bad_request(
                    f"a container name must be specified for pod {r.name}, choose one of: [{' '.join(names)}]"
                )
            container = names[0]
        elif container not in names + [c["name"] for c in pod["spec"].get("initContainers") or []]:
            raise bad_request(f"container {container} is not valid for pod {r.name}")
        if not pod["spec"].get("nodeName"):
            raise bad_request(f"pod {r.name} does not have a host assigned")
        status = next(
            (
                s
                for s in (pod.get("status") or {}).get("containerStatuses") or []
                if s.get("name") == container
            ),
            None,
        )
        waiting = ((status or {}).get("state") or {}).get("waiting")
        log = store.read_log(r.ns, r.name, container)
        if (status is None or waiting) and (log is None or not log.lines):
            reason = (waiting or {}).get("reason") or "ContainerCreating"
            phrase = {
                "ErrImagePull": "trying and failing to pull image",
                "ImagePullBackOff": "trying and failing to pull image",
            }.get(reason, reason)
            raise bad_request(f'container "{container}" in pod "{r.name}" is waiting to start: {phrase}')
        tail = int(q["tailLines"]) if (q.get("tailLines") or "").lstrip("-").isdigit() else None
        lines = list(log.lines) if log else []
        if tail is not None:
            lines = lines[-tail:] if tail > 0 else []
        if q.get("follow") not in ("true", "1"):
            self._send(200, "".join(lines), "text/plain")
            return
        self._start_stream("text/plain")
        if lines:
            self._chunk("".join(lines).encode())
        sent = len(log.lines) if log else 0
        deadline = time.monotonic() + WATCH_DEFAULT_TIMEOUT_S
        while time.monotonic() < deadline:
            with store.cond:
                log = store.read_log(r.ns, r.name, container)
                if store.peek(r.res, r.ns, r.name) is None:
                    break
                new = log.lines[sent:] if log else []
                done = bool(log and log.done)
                if not new and not done:
                    store.cond.wait(0.5)
                    continue
            if new:
                self._chunk("".join(new).encode())
                sent += len(new)
            if done:
                break
        self._chunk(b"")

    do_GET = _handle
    do_POST = _handle
    do_PUT = _handle
    do_PATCH = _handle
    do_DELETE = _handle
    do_HEAD = _handle


__all__ = ["KubeServer", "make_server", "on_started", "serve_in_thread"]
