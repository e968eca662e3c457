"""The simulated Image Factory: the HTTP API of siderolabs/image-factory on loopback (facts §2.1).

Why: the runbook's factory client must be tested against the real protocol (status codes, content types,
plain-text errors, IDs computed by the same rules), including the failures that matter on a real site
(5xx, slow answers, an extension missing for a Talos version), without the network.  The library reaches
this server only through its URL, like a self-hosted factory.

Endpoints: ``POST /schematics``, ``GET /schematics/{id}``, ``GET /versions``,
``GET /version/{v}/extensions/official``, ``GET /version/{v}/overlays/official``,
``GET|HEAD /image/{id}/{v}/{path}``, ``GET /pxe/{id}/{v}/{path}``, and the registry's
``GET|HEAD /v2/{[platform-]installer[-secureboot]}/{id}/manifests/{v}`` so an installer can be checked.

Faults (``state_dir/faults.json``, key ``"factory"``; see :func:`set_faults`):

- ``"http_5xx": {"count": N, "status": 503, "path": "/schematics"}``: the next N matching requests fail;
- ``"drop": {"count": N}``: the next N requests get the connection closed without an answer;
- ``"delay_seconds": S`` (optionally ``"delay_count": N``): answers come S seconds late (client timeouts);
- ``"missing_extensions": {"v1.12.7": ["siderolabs/…"], "*": [...]}``: not offered for that version;
- ``"legacy_response": true``: ``POST /schematics`` answers ``{"id"}`` only (factories before v1.3.0);
- ``"wrong_id": true``: ``POST /schematics`` answers an ID that is not the schematic's (a broken proxy);
- ``"kmod_built_for": {"v1.12.7": "v1.12.6"}``: kernel-module tags of that version name another release
  (a stale mirror), see :func:`runbook_lib.sim.catalog.available_extensions`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import socket
import sys
import threading
import time
from collections.abc import Iterator
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from runbook_lib.errors import PermanentError
from runbook_lib.model.schematic import SchematicInvalid, parse_schematic
from runbook_lib.model.versions import TalosVersion
from runbook_lib.sim import catalog
from runbook_lib.sim.state import atomic_write

_ID = r"[0-9a-f]{64}"
_IMAGE_PATH = re.compile(
    r"^(?:kernel-(?:amd64|arm64)"
    r"|cmdline-[a-z0-9]+-(?:amd64|arm64)(?:-secureboot)?"
    r"|initramfs-(?:amd64|arm64)\.xz"
    r"|[a-z0-9]+-(?:amd64|arm64)(?:-secureboot)?(?:\.iso|-uki\.efi|\.raw\.xz|\.raw\.tar\.gz|\.vhd\.xz|\.ova|\.qcow2)"
    r"|(?:[a-z0-9]+-)?installer-(?:amd64|arm64)(?:-secureboot)?\.tar)$"
)
_PXE_PATH = re.compile(r"^[a-z0-9]+-(?:amd64|arm64)(?:-secureboot)?$")

OVERLAYS = [
    ("rpi_generic", "siderolabs/sbc-raspberrypi", "v0.1.5"),
    ("rock5b", "siderolabs/sbc-rockchip", "v0.1.6"),
    ("jetson_nano", "siderolabs/sbc-jetson", "v0.1.2"),
]


def set_faults(state_dir: Path | str, **faults: Any) -> None:
    """Replace the factory's faults (other rooms' sections of ``faults.json`` are kept)."""
    path = Path(state_dir) / "faults.json"
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        data = {}
    data["factory"] = faults
    Path(state_dir).mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(data, indent=1))


#: The port this state directory's factory last listened on. Why kept: the real Image Factory has one address
#: (factory.talos.dev), and the installer a node is upgraded to names it; a simulated factory on a new free port
#: at every start made a plan and the run that applied it (a later ``runbook run --apply`` starting the simulator
#: again) name different installers (found by an operator walkthrough). A port taken meanwhile is replaced.
PORT_FILE = "factory.port"


def _port_in(path: Path) -> int:
    """The port remembered in ``path``, or 0 (any free port) when there is none."""
    try:
        port = int(path.read_text().strip())
    except (OSError, ValueError):
        return 0
    return port if 1024 <= port <= 65535 else 0


class FactoryServer(ThreadingHTTPServer):
    """One factory instance over one state directory; counts fault budgets per switched-on fault."""

    daemon_threads = True
    block_on_close = False

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = Path(state_dir)
        self._lock = threading.Lock()
        self._spent: dict[str, int] = {}
        self.requests: list[tuple[str, str]] = []
        """(method, path) of every request received, for tests that count retries."""
        remembered = self.state_dir / PORT_FILE
        try:
            super().__init__(("127.0.0.1", _port_in(remembered)), _Handler)
        except OSError:  # taken meanwhile (another cluster's factory): any free port, remembered from now on
            super().__init__(("127.0.0.1", 0), _Handler)
        with contextlib.suppress(OSError):
            remembered.write_text(str(self.server_address[1]))

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that gave up (timeout) leaves a broken pipe: normal here, not worth a traceback."""
        exc = sys.exc_info()[1]
        if isinstance(exc, ConnectionError):
            return
        super().handle_error(request, client_address)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"

    def faults(self) -> tuple[dict[str, Any], str]:
        """The factory faults and a token that changes whenever faults.json is rewritten."""
        path = self.state_dir / "faults.json"
        try:
            stamp = str(path.stat().st_mtime_ns)
        except FileNotFoundError:
            stamp = "none"
        return catalog.factory_faults(self.state_dir), stamp

    def take(self, name: str, budget: int, stamp: str) -> bool:
        """Use one unit of a counted fault; False once its budget is spent (budgets reset on rewrite)."""
        key = f"{name}@{stamp}"
        with self._lock:
            used = self._spent.get(key, 0)
            if used >= budget:
                return False
            self._spent[key] = used + 1
            return True


class _Handler(BaseHTTPRequestHandler):
    server: FactoryServer
    protocol_version = "HTTP/1.1"
    server_version = "image-factory-sim"

    def setup(self) -> None:
        """No Nagle: headers and body go out as separate writes, which would stall ~40 ms per answer."""
        super().setup()
        with contextlib.suppress(OSError):
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the daemon's stderr is not a request log."""

    # -- plumbing -------------------------------------------------------------------------------------------
    def _send(self, status: int, body: bytes, content_type: str, extra: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (extra or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _text(self, status: int, message: str) -> None:
        """The factory's errors: plain text with a trailing newline."""
        self._send(status, (message.rstrip("\n") + "\n").encode(), "text/plain; charset=utf-8")

    def _json(self, status: int, data: Any) -> None:
        self._send(status, json.dumps(data).encode(), "application/json")

    def _faulted(self, path: str) -> bool:
        """Apply delay / drop / 5xx faults; True when the request has been answered (or dropped)."""
        with self.server._lock:
            self.server.requests.append((self.command, path))
        faults, stamp = self.server.faults()
        delay = float(faults.get("delay_seconds", 0) or 0)
        if delay > 0:
            count = faults.get("delay_count")
            if count is None or self.server.take("delay", int(count), stamp):
                time.sleep(delay)
        drop = faults.get("drop")
        if isinstance(drop, dict) and self.server.take("drop", int(drop.get("count", 1)), stamp):
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(2)
            return True
        spec = faults.get("http_5xx")
        if (
            isinstance(spec, dict)
            and path.startswith(str(spec.get("path", "/")))
            and self.server.take("http_5xx", int(spec.get("count", 1)), stamp)
        ):
            status = int(spec.get("status", 503))
            try:
                phrase = HTTPStatus(status).phrase.lower()
            except ValueError:
                phrase = "error"
            self._text(status, phrase)
            return True
        return False

    # -- verbs ------------------------------------------------------------------------------------------------
    def do_GET(self) -> None:
        self._dispatch()

    def do_HEAD(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        path = urlsplit(self.path).path
        if self._faulted(path):
            return
        if path.rstrip("/") != "/schematics":
            self._text(404, "404 page not found")
            return
        self._post_schematic(body)

    def _dispatch(self) -> None:
        parts = urlsplit(self.path)
        path = parts.path
        if self._faulted(path):
            return
        routes: list[tuple[str, Any]] = [
            (rf"^/schematics/({_ID})$", self._get_schematic),
            (r"^/versions$", lambda: self._versions(parse_qs(parts.query))),
            (r"^/version/([^/]+)/extensions/official$", self._extensions),
            (r"^/version/([^/]+)/overlays/official$", self._overlays),
            (rf"^/image/({_ID})/([^/]+)/([^/]+)$", self._image),
            (rf"^/pxe/({_ID})/([^/]+)/([^/]+)$", self._pxe),
            (rf"^/v2/([a-z0-9-]*installer(?:-secureboot)?)/({_ID})/manifests/([^/]+)$", self._manifest),
            (r"^/v2/?$", lambda: self._json(200, {})),
        ]
        for pattern, handler in routes:
            match = re.match(pattern, path)
            if match:
                handler(*match.groups())
                return
        self._text(404, "404 page not found")

    # -- endpoints --------------------------------------------------------------------------------------------
    def _post_schematic(self, body: bytes) -> None:
        try:
            schematic = parse_schematic(body)
            schematic.canonical_yaml()  # the few forms the offline emitter refuses are refused here too
        except SchematicInvalid as exc:
            self._text(400, exc.message)
            return
        if schematic.owner:
            self._text(400, "schematic owner is only supported on authenticated instances")
            return
        store = catalog.schematic_store(self.server.state_dir)
        schematic_id = store.put_schematic(schematic)
        faults, _ = self.server.faults()
        if faults.get("wrong_id"):
            schematic_id = hashlib.sha256(b"not-" + schematic.canonical_bytes()).hexdigest()
        if faults.get("legacy_response"):
            self._json(201, {"id": schematic_id})
        else:
            self._json(201, {"id": schematic_id, "schematic": schematic.canonical_yaml()})

    def _get_schematic(self, schematic_id: str) -> None:
        text = catalog.schematic_store(self.server.state_dir).get_yaml(schematic_id)
        if text is None:
            self._text(404, f"schematic {schematic_id} not found")
            return
        self._send(200, text.encode(), "application/yaml")

    def _versions(self, query: dict[str, list[str]]) -> None:
        if query.get("broken", ["false"])[0] == "true":
            self._json(200, [])
            return
        self._json(200, catalog.factory_versions())

    def _known_version(self, version: str) -> bool:
        try:
            return str(TalosVersion.parse(version)) in catalog.buildable() and version.startswith("v")
        except PermanentError:
            return False

    def _extensions(self, version: str) -> None:
        if not self._known_version(version):
            self._text(404, f"version {version} not found")
            return
        infos = catalog.available_extensions(self.server.state_dir, version)
        self._json(200, [info.to_json() for info in infos])

    def _overlays(self, version: str) -> None:
        if not self._known_version(version):
            self._text(404, f"version {version} not found")
            return
        out = []
        for name, image, tag in OVERLAYS:
            ref = f"ghcr.io/{image}:{tag}"
            digest = "sha256:" + hashlib.sha256(ref.encode()).hexdigest()
            out.append({"name": name, "image": image, "ref": ref, "digest": digest})
        self._json(200, out)

    def _buildable(self, schematic_id: str, version: str) -> bool:
        """Check what the factory checks before building: schematic, version, extensions (answers if not)."""
        if catalog.schematic_store(self.server.state_dir).get_yaml(schematic_id) is None:
            self._text(404, f"schematic {schematic_id} not found")
            return False
        if not self._known_version(version):
            self._text(404, f"version {version} not found")
            return False
        try:
            catalog.installer_extensions(self.server.state_dir, schematic_id, version)
        except catalog.ExtensionUnavailable as exc:
            self._text(400, exc.message)
            return False
        return True

    def _image(self, schematic_id: str, version: str, asset: str) -> None:
        if not _IMAGE_PATH.match(asset):
            self._text(404, f"unsupported image path {asset}")
            return
        if not self._buildable(schematic_id, version):
            return
        body = f"simulated Talos {version} asset {asset} for schematic {schematic_id}\n".encode()
        self._send(200, body, "application/octet-stream")

    def _pxe(self, schematic_id: str, version: str, target: str) -> None:
        if not _PXE_PATH.match(target):
            self._text(404, f"unsupported PXE target {target}")
            return
        if not self._buildable(schematic_id, version):
            return
        platform, arch = target.split("-")[:2]
        base = f"{self.server.url}/image/{schematic_id}/{version}"
        script = (
            "#!ipxe\n"
            f"kernel {base}/kernel-{arch} talos.platform={platform} console=tty0 init_on_alloc=1 slab_nomerge "
            "pti=on consoleblank=0 nvme_core.io_timeout=4294967295 printk.devkmsg=on ima_template=ima-ng "
            "ima_appraise=fix ima_hash=sha512\n"
            f"initrd {base}/initramfs-{arch}.xz\n"
            "boot\n"
        )
        self._send(200, script.encode(), "text/plain; charset=utf-8")

    def _manifest(self, _kind: str, schematic_id: str, version: str) -> None:
        if not self._buildable(schematic_id, version):
            return
        digest = "sha256:" + hashlib.sha256(f"{schematic_id}:{version}".encode()).hexdigest()
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [],
        }
        self._send(
            200,
            json.dumps(manifest).encode(),
            "application/vnd.oci.image.index.v1+json",
            {"Docker-Content-Digest": digest},
        )


def make_server(state_dir: Path) -> FactoryServer:
    """The daemon's entry point: a factory bound to the state directory's loopback port (``PORT_FILE``; a free
    one the first time or when it is taken), not yet serving."""
    return FactoryServer(Path(state_dir))


@contextlib.contextmanager
def running(state_dir: Path | str) -> Iterator[FactoryServer]:
    """Serve a factory in a background thread for the duration of a ``with`` block (tests, notebooks)."""
    server = make_server(Path(state_dir))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
