"""The network between the user's clients and the real control plane's kube-apiserver, with a latency a test sets.

The retired Python API server answered every request ``api_latency_ms`` later; we know of no
kube-apiserver flag that delays its answers (not checked against its whole option list), so on
the real control plane the delay is where a real one comes from: the network. This TCP relay sits between the
state's ``kubeconfig`` (kubectl, helm, the library) and kube-apiserver and holds every chunk the client sends for
``api_latency_ms`` before passing it on: one-way latency on the client's path, TLS untouched (the API server's
certificate names 127.0.0.1, whatever the port). A request on a kept-alive connection is answered that much later;
a new connection also pays it on each TLS handshake flight, as over a slow link. Chunks keep their order and are
not serialised behind each other: a chunk waits from when it arrived, not from when the one before it left.

``watch_drop_after_s`` (also in ``faults.json``) is the other half of a real network path: a load balancer in
front of the API server cuts a connection its client has sent nothing on for that long (an idle or stream
timeout; AWS's NLB idles out after 350 s, others differ: the figure is the test's, no source for a particular
one). A watch is one request and then only answers, so it is cut mid-stream, with no final chunk, like the Python
API server's fault of the same name; a kept-alive connection between requests is cut too, which clients redial.
Counted from the client's last bytes rather than the connection's age, so a request in flight is never cut just
because its connection is old.

The simulated cluster's own components (kwok, the node agent, the simulated operator) talk to kube-apiserver
directly, as a node's kubelet talks to its control plane over the cluster's network, not the user's.
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from runbook_lib.sim.faultfile import FaultFile
from runbook_lib.sim.state import atomic_write, sim_paths

log = logging.getLogger("runbook_lib.sim.latencyproxy")
CHUNK = 65536


class LatencyProxy:
    """Relays 127.0.0.1:``port`` to ``upstream``, delaying the client's bytes by ``latency_ms()`` milliseconds
    and cutting a connection whose client has sent nothing for ``drop_after_s()`` seconds (0: never)."""

    def __init__(
        self,
        upstream: tuple[str, int],
        latency_ms: Callable[[], float],
        port: int = 0,
        drop_after_s: Callable[[], float] = lambda: 0.0,
    ) -> None:
        self.upstream = upstream
        self.latency_ms = latency_ms
        self.drop_after_s = drop_after_s
        #: each relayed client socket: its upstream socket and when the client last sent bytes
        self._quiet: dict[socket.socket, tuple[socket.socket, float]] = {}
        self._listener = _listen(port)
        self.port: int = self._listener.getsockname()[1]
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="latency-proxy", daemon=True)
        self._reaper = threading.Thread(target=self._cut_quiet, name="latency-proxy-cut", daemon=True)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def start(self) -> None:
        self._thread.start()
        self._reaper.start()

    def stop(self) -> None:
        """Close the listener and every relayed connection (their threads end on the closed sockets)."""
        self._stopped.set()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept; close alone does not
        self._listener.close()
        with self._lock:
            for sock in self._open:
                _hang_up(sock)
            self._open.clear()
        if self._thread.ident is not None:  # started
            self._thread.join(timeout=5)

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = self._dial()
            except OSError as exc:
                log.warning("kube-apiserver at %s:%s refused the relay: %s", *self.upstream, exc)
                client.close()
                continue
            self._relay(client, server)

    def _dial(self) -> socket.socket:
        """A connection to kube-apiserver for one client (blocking, as the relay forwards)."""
        server = socket.create_connection(self.upstream, timeout=10)
        server.settimeout(None)
        return server

    def _relay(self, client: socket.socket, server: socket.socket) -> None:
        """The connection registered and its three threads started; closed instead when ``stop()`` ran while it
        was being dialled (checked under the lock ``stop()`` clears the set with, so none is left behind)."""
        with self._lock:
            stopped = self._stopped.is_set()
            if not stopped:
                self._open.update((client, server))
                self._quiet[client] = (server, time.monotonic())
        if stopped:
            _hang_up(client)
            _hang_up(server)
            return
        late: queue.SimpleQueue[tuple[float, bytes] | None] = queue.SimpleQueue()
        for target, args in (
            (self._read, (client, late)),
            (self._send_late, (late, server)),
            (self._pump, (server, client)),
        ):
            threading.Thread(target=target, args=args, daemon=True).start()

    def _read(self, src: socket.socket, late: queue.SimpleQueue[tuple[float, bytes] | None]) -> None:
        """The client's bytes, each chunk stamped with when it is due upstream (arrival + latency)."""
        try:
            while chunk := src.recv(CHUNK):
                now = time.monotonic()
                with self._lock:
                    if src in self._quiet:
                        self._quiet[src] = (self._quiet[src][0], now)
                late.put((now + max(self.latency_ms(), 0.0) / 1000.0, chunk))
        except OSError:
            pass
        late.put(None)

    def _send_late(self, late: queue.SimpleQueue[tuple[float, bytes] | None], dst: socket.socket) -> None:
        """Each chunk upstream once due, in order; the connection closed when the client's side ended."""
        try:
            while (item := late.get()) is not None:
                due, chunk = item
                if (wait := due - time.monotonic()) > 0:
                    time.sleep(wait)
                dst.sendall(chunk)
        except OSError:
            pass
        self._close(dst)

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        """kube-apiserver's answers to the client as they come; both ends closed when either ends."""
        try:
            while chunk := src.recv(CHUNK):
                dst.sendall(chunk)
        except OSError:
            pass
        self._close(src, dst)

    def _cut_quiet(self) -> None:
        """Every 0.1 s: the connections whose client has been quiet for ``drop_after_s()`` cut, both ends."""
        while not self._stopped.wait(0.1):
            limit = self.drop_after_s()
            if limit <= 0:
                continue
            now = time.monotonic()
            with self._lock:
                quiet = [(c, s) for c, (s, last) in self._quiet.items() if now - last >= limit]
            for client, server in quiet:
                log.info("cut a client connection quiet for %.1f s (watch_drop_after_s)", limit)
                self._close(client, server)

    def _close(self, *socks: socket.socket) -> None:
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        with self._lock:
            for sock in socks:
                self._quiet.pop(sock, None)
                if sock in self._open:
                    self._open.discard(sock)
                    sock.close()


def _hang_up(sock: socket.socket) -> None:
    """Shut both directions (wakes a thread blocked reading it, which close alone does not) and close."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


def _listen(port: int) -> socket.socket:
    """127.0.0.1:``port`` when free (a restart keeps the kubeconfig's endpoint), else a port the kernel picks."""
    for candidate in dict.fromkeys((port, 0)):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", candidate))
        except OSError:
            sock.close()
            continue
        sock.listen(4096)  # as Go's net.Listen takes somaxconn: a burst of connections is not refused
        return sock
    raise OSError("no loopback port for the API server's relay")


def remembered_port(path: Path) -> int:
    """The port an earlier start of this state dir's relay listened on (0: none), so kubeconfigs keep working."""
    try:
        return int(json.loads(path.read_text())["port"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def serve_for_users(state_dir: Path, direct_kubeconfig: Path, server: str) -> LatencyProxy:
    """The relay to ``server`` started, and ``<state>/kubeconfig`` (the user's) pointing at it; the relay's
    port kept in ``<state>/kube/relay.json`` and taken again on the next start when free, as simkube keeps its own
    (a kubeconfig saved before a restart keeps working). Its latency: ``api_latency_ms`` in ``faults.json``; its
    idle cut: ``watch_drop_after_s``."""
    host, _, port = server.removeprefix("https://").rstrip("/").rpartition(":")
    remembered = state_dir / "kube" / "relay.json"
    faults = FaultFile(state_dir)
    relay = LatencyProxy(
        (host, int(port)),
        lambda: float(faults.read().get("api_latency_ms") or 0),
        remembered_port(remembered),
        lambda: float(faults.read().get("watch_drop_after_s") or 0),
    )
    try:
        atomic_write(remembered, json.dumps({"port": relay.port}))
        config = yaml.safe_load(direct_kubeconfig.read_text())
        for entry in config.get("clusters") or []:
            entry["cluster"]["server"] = relay.url
        kubeconfig = sim_paths(state_dir).kubeconfig
        atomic_write(kubeconfig, yaml.safe_dump(config, sort_keys=False))
        kubeconfig.chmod(0o600)
        relay.start()
    except BaseException:
        relay.stop()  # the caller registers stop() only once this returns: the port is not left bound
        raise
    return relay
