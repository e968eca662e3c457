"""A watch, or any other call, whose connection goes silent ends instead of blocking the runbook for ever.

What a dropped connection looks like from the client: the API server answered the watch (status line and
headers, then chunks as events come), and then nothing, with no FIN and no RST, as when a load balancer or a
moved VIP forgets the flow. kubectl notices within about 45 s: client-go's HTTP/2 health check pings a
connection idle for 30 s and closes it when no answer comes in 15 s (k8s.io/apimachinery@v0.35.0
pkg/util/net/http.go:144-189, whose comment says a broken TCP connection otherwise lingers 13 to 30 minutes).
The official Python client has no such check (HTTP/1.1 over urllib3, no read timeout unless the call passes
``_request_timeout``: kubernetes 37.0.2 client/rest.py:235-246), so cuda-test, whose step timeout was only
checked when an event arrived, waited for ever and left its pods.

The server here is a plain socket speaking the API server's first bytes of a watch answer; the client is the
real one (``CoreV1Api.list_namespaced_pod`` through urllib3).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest
from kubernetes import client

from runbook_lib.clients import kube as kube_module
from runbook_lib.clients.kube import Kube
from runbook_lib.clients.proc import Journal
from runbook_lib.errors import RetryableError

#: The chunked 200 the API server starts a watch answer with (k8s.io/apiserver@v0.35.0
#: pkg/endpoints/handlers/watch.go: Content-Type application/json, flushed before the first event).
WATCH_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"


@pytest.fixture
def silent_api() -> Iterator[tuple[str, list[socket.socket]]]:
    """An API address that answers each watch with its head, then says nothing more (the flow forgotten)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    accepted: list[socket.socket] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            accepted.append(conn)
            conn.recv(65536)
            conn.sendall(WATCH_HEAD)

    threading.Thread(target=serve, daemon=True).start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}", accepted
    server.close()
    for conn in accepted:
        conn.close()


def client_of(address: str) -> Kube:
    """The library's client of the API at ``address``, through the official client as a kubeconfig builds it."""
    configuration = client.Configuration()
    configuration.host = address
    return Kube(client.ApiClient(configuration), Journal())


def test_a_watch_on_a_silent_connection_returns_at_its_deadline(
    silent_api: tuple[str, list[socket.socket]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kube_module, "WATCH_READ_GRACE_S", 1.0)
    address, accepted = silent_api
    kube = client_of(address)
    outcome: dict[str, object] = {}

    def wait() -> None:
        started = time.monotonic()
        outcome["last"] = kube.watch_until(
            kube.core.list_namespaced_pod,
            lambda obj: False,
            timeout=2,
            until="every test pod finished",
            namespace="default",
            label_selector="talos-gpu-runbooks/run-id=abc123",
        )
        outcome["took"] = time.monotonic() - started

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    waiter.join(15)
    assert not waiter.is_alive(), "the watch was still blocked 13 s after its 2 s timeout"
    assert outcome["last"] is None  # nothing was seen, and the caller gets to judge and clean up
    assert 2 <= float(str(outcome["took"])) < 6
    assert accepted, "the watch never reached the server"
    assert "until every test pod finished (not reached" in kube.journal.entries[-1].summary


def test_a_call_on_a_silent_connection_fails_naming_the_api_instead_of_blocking(
    silent_api: tuple[str, list[socket.socket]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Any other call, such as the pod list the steps make, on a connection that went silent: kube-apiserver
    answers every request that is not a watch or a stream within its ``--request-timeout`` (60 s by default,
    k8s.io/apiserver@v0.35.0 pkg/server/config.go:445), so a longer silence is a dead connection. Before,
    the call read until the kernel gave up on the connection (about 15 minutes of retransmissions for a request
    in flight; for ever when the server's host still acknowledges, as here)."""
    monkeypatch.setattr(kube_module, "REQUEST_READ_S", 1.0)
    address, _ = silent_api
    kube = client_of(address)
    outcome: dict[str, object] = {}

    def list_pods() -> None:
        try:
            kube.pods("default", "talos-gpu-runbooks/run-id=abc123")
        except Exception as exc:  # the outcome is asserted below
            outcome["error"] = exc

    caller = threading.Thread(target=list_pods, daemon=True)
    caller.start()
    caller.join(15)
    assert not caller.is_alive(), "the pod list was still blocked after 15 s"
    error = outcome["error"]
    assert isinstance(error, RetryableError), error
    assert "list pods" in error.message and "did not answer" in error.message, error.message
