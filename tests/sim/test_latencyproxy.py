"""The relay between the user's kubeconfig and the real control plane's kube-apiserver (``latencyproxy``): what
makes the ``api_latency_ms`` fault hold on the real control plane (tests/test_kube_fanout.py runs there with it).
Against a plain TCP echo server here, so the timing is the relay's alone; ports picked free by the kernel."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from runbook_lib.sim import latencyproxy


@pytest.fixture
def echo() -> Iterator[tuple[str, int]]:
    """A TCP server that sends back whatever it receives, one thread per connection."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve(conn: socket.socket) -> None:
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data)

    def accept() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    yield server.getsockname()
    server.close()


def round_trip(port: int, payloads: list[bytes]) -> tuple[float, bytes]:
    """Send ``payloads`` at once on one connection; the seconds until every byte came back, and the bytes."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
        want = b"".join(payloads)
        started = time.monotonic()
        for payload in payloads:
            conn.sendall(payload)
        got = b""
        while len(got) < len(want):
            got += conn.recv(65536)
        return time.monotonic() - started, got


def test_each_request_is_answered_the_fault_s_latency_later_in_order_and_not_one_behind_the_other(echo):
    latency = {"ms": 300.0}
    relay = latencyproxy.LatencyProxy(echo, lambda: latency["ms"])
    relay.start()
    try:
        took, got = round_trip(relay.port, [b"GET /a\r\n", b"GET /b\r\n", b"GET /c\r\n"])
        assert got == b"GET /a\r\nGET /b\r\nGET /c\r\n"
        # each chunk waits from its own arrival: three pipelined requests take one latency, not three
        assert 0.3 <= took < 0.9, took
        latency["ms"] = 0  # the fault cleared while the relay runs
        took, _ = round_trip(relay.port, [b"ping"])
        assert took < 0.3, took
    finally:
        relay.stop()


def test_a_restarted_relay_listens_on_its_remembered_port_so_saved_kubeconfigs_keep_working(echo, tmp_path):
    first = latencyproxy.LatencyProxy(echo, lambda: 0.0)
    (tmp_path / "relay.json").write_text(f'{{"port": {first.port}}}')
    first.stop()
    again = latencyproxy.LatencyProxy(
        echo, lambda: 0.0, latencyproxy.remembered_port(tmp_path / "relay.json")
    )
    try:
        assert again.port == first.port
    finally:
        again.stop()
    assert latencyproxy.remembered_port(Path(tmp_path / "missing.json")) == 0
