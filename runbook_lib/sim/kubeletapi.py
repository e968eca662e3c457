"""The simulated nodes' kubelet API, as far as the API server asks for it: container logs.

Why a proxy: ``kubectl logs`` (and the runbook's ``read_namespaced_pod_log``) makes the API server call the
node's kubelet at ``https://<InternalIP>:<kubeletEndpoint port>/containerLogs/<ns>/<pod>/<container>``
(kubernetes@v1.35.0 pkg/registry/core/pod/strategy.go ``LogLocation``). The simulated nodes' addresses
(10.5.0.x) are not routable, so simkube starts kube-apiserver with an egress selector that sends its
"cluster" traffic through this HTTP CONNECT proxy (``simkube --kubelet-proxy``). Whatever node the API server
asks for, the proxy (a unix socket in the private state directory) answers as that node's kubelet: it terminates TLS itself (with the control plane's own
serving certificate: the API server does not verify kubelet certificates unless
``--kubelet-certificate-authority`` is set, which neither Talos's flags nor simkube's set) and serves the log
the node agent recorded for that container.
"""

from __future__ import annotations

import http.server
import os
import socketserver
import ssl
import threading
import urllib.parse
from pathlib import Path

KUBELET_PORT = 10250  # the kubelet's default --port, what a Talos node's kubelet serves
MAX_SOCKET_PATH = 107  # sockaddr_un.sun_path holds 108 bytes with the terminating NUL


class Logs:
    """Container logs by (namespace, pod, container), written by the node agent, read by the kubelet API."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._logs: dict[tuple[str, str, str], str] = {}

    def put(self, namespace: str, pod: str, container: str, text: str) -> None:
        with self._lock:
            self._logs[(namespace, pod, container)] = text

    def get(self, namespace: str, pod: str, container: str) -> str | None:
        with self._lock:
            return self._logs.get((namespace, pod, container))


class _KubeletHandler(http.server.BaseHTTPRequestHandler):
    """One request of the API server to a node's kubelet, read from the TLS tunnel."""

    server: KubeletProxy
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        path = urllib.parse.urlsplit(self.path).path.strip("/").split("/")
        if len(path) == 4 and path[0] == "containerLogs":
            text = self.server.logs.get(path[1], path[2], path[3])
            if text is not None:
                self._reply(200, text)
                return
        self._reply(404, "404 page not found\n")

    def _reply(self, code: int, text: str) -> None:
        body = text.encode()
        self.send_response(code)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        return


class _ConnectHandler(socketserver.StreamRequestHandler):
    """``CONNECT host:port``: answer 200, then be that host's kubelet on the same connection."""

    server: KubeletProxy

    def handle(self) -> None:
        request = self.rfile.readline(4096).decode("latin-1").split()
        while self.rfile.readline(4096) not in (b"\r\n", b"\n", b""):
            pass  # headers: nothing in them matters here
        if len(request) < 2 or request[0] != "CONNECT":
            self.wfile.write(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n")
            return
        self.wfile.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        self.wfile.flush()
        try:
            tls = self.server.tls().wrap_socket(self.connection, server_side=True)
        except (ssl.SSLError, OSError):
            return
        with tls:
            _KubeletHandler(tls, self.client_address, self.server)


class KubeletProxy(socketserver.ThreadingUnixStreamServer):
    """The HTTP CONNECT proxy on unix socket ``socket_path`` (what ``simkube --kubelet-proxy-socket`` takes)."""

    daemon_threads = True
    #: listen(2) backlog. socketserver's default of 5 made kube-apiserver's concurrent log reads (cuda-test reads
    #: a dozen pods' logs at once) fail with "dial unix …/kubelet.sock: connect: resource temporarily
    #: unavailable" (EAGAIN: backlog full), which the API server answers as HTTP 500. A real kubelet listens
    #: through Go's net.Listen, whose backlog is the system's somaxconn (go/src/net/sock_linux.go
    #: ``maxListenerBacklog``), so it does not refuse a dozen connections at once.
    request_queue_size = 4096

    def __init__(self, socket_path: Path, cert: Path, key: Path, logs: Logs) -> None:
        if len(os.fsencode(socket_path)) > MAX_SOCKET_PATH:
            raise RuntimeError(
                f"the state directory's path is too long for a unix socket ({socket_path}): use a shorter --state"
            )
        socket_path.unlink(missing_ok=True)
        super().__init__(str(socket_path), _ConnectHandler)
        socket_path.chmod(0o600)
        self.socket_path, self.cert, self.key, self.logs = socket_path, cert, key, logs
        self._context: ssl.SSLContext | None = None
        self._thread = threading.Thread(target=self.serve_forever, name="kubelet-proxy", daemon=True)

    def tls(self) -> ssl.SSLContext:
        """The TLS context, made on first use: the certificate exists only once simkube has written it."""
        if self._context is None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(self.cert, self.key)
            self._context = context
        return self._context

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
        self.socket_path.unlink(missing_ok=True)
