"""The relay between the user's kubeconfig and the real control plane's kube-apiserver (``latencyproxy``): what
makes the ``api_latency_ms`` fault hold on the real control plane (tests/test_kube_fanout.py runs there with it).
Against a plain TCP echo server here, so the timing is the relay's alone; ports picked free by the kernel."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


def delays(port: int, payloads: list[bytes], gap_s: float) -> tuple[list[float], bytes]:
    """Send ``payloads`` ``gap_s`` apart on one connection (TCP_NODELAY: each leaves as its own segment, not
    coalesced with the next); the seconds each took to come back, from its own send to its echo's last byte,
    and every byte that came back."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        want = b"".join(payloads)
        sent: list[float] = []
        got = bytearray()
        arrived: list[tuple[float, int]] = []  # (when, bytes back so far)

        def read() -> None:
            while len(got) < len(want) and (chunk := conn.recv(65536)):
                got.extend(chunk)
                arrived.append((time.monotonic(), len(got)))

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        for payload in payloads:
            sent.append(time.monotonic())
            conn.sendall(payload)
            time.sleep(gap_s)
        reader.join(timeout=30)
        ends = [sum(map(len, payloads[: i + 1])) for i in range(len(payloads))]
        back = [next(t for t, total in arrived if total >= end) for end in ends]
        return [b - s for s, b in zip(sent, back, strict=True)], bytes(got)


def test_each_request_is_answered_the_fault_s_latency_later_in_order_and_not_one_behind_the_other(echo):
    latency = {"ms": 1500.0}
    relay = latencyproxy.LatencyProxy(echo, lambda: latency["ms"])
    relay.start()
    try:
        took, got = delays(relay.port, [b"GET /a\r\n", b"GET /b\r\n", b"GET /c\r\n"], gap_s=0.3)
        assert got == b"GET /a\r\nGET /b\r\nGET /c\r\n"  # in order
        # each chunk waits from its own arrival: 1.5 s each. A relay that held each chunk its latency after
        # the one before it left would take 1.5, 2.7 and 3.9 s: the bound leaves the right one a second of a
        # loaded machine's scheduling and still fails that one.
        assert all(1.49 <= t < 2.5 for t in took), took
        latency["ms"] = 0  # the fault cleared while the relay runs: no longer 1.5 s per round trip
        took_now, _ = round_trip(relay.port, [b"ping"])
        assert took_now < 1.4, took_now
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


class DialledWhileStopping(latencyproxy.LatencyProxy):
    """A relay whose dial to kube-apiserver returns only once ``stop()`` has closed every connection it knew
    of (its join on the accept thread is where it waits): the race of a client accepted just before stop."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        super().__init__(upstream, lambda: 0.0)
        self.dialling, self.stopping = threading.Event(), threading.Event()
        join = self._thread.join

        def join_once_stopping(timeout: float | None = None) -> None:
            self.stopping.set()
            join(timeout)

        self._thread.join = join_once_stopping  # type: ignore[method-assign]

    def _dial(self) -> socket.socket:
        self.dialling.set()
        assert self.stopping.wait(timeout=30), "stop() never reached its join"
        return super()._dial()


def test_a_client_accepted_while_the_relay_stops_is_hung_up_not_relayed_forever(echo):
    relay = DialledWhileStopping(echo)
    relay.start()
    with socket.create_connection(("127.0.0.1", relay.port), timeout=30) as conn:
        assert relay.dialling.wait(timeout=30)  # accepted
        relay.stop()  # the accept thread is dialling: it registers the connection after stop() cleared them
        assert not relay._open
        conn.settimeout(10)
        with contextlib.suppress(ConnectionResetError):
            assert conn.recv(100) == b""  # hung up: no thread left relaying it


def test_a_relay_whose_kubeconfig_cannot_be_written_releases_its_port(tmp_path, monkeypatch):
    made: list[latencyproxy.LatencyProxy] = []

    class Recorded(latencyproxy.LatencyProxy):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(latencyproxy, "LatencyProxy", Recorded)
    (tmp_path / "kube").mkdir()
    with pytest.raises(FileNotFoundError):
        latencyproxy.serve_for_users(tmp_path, tmp_path / "missing.kubeconfig", "https://127.0.0.1:6443")
    assert len(made) == 1 and made[0]._listener.fileno() == -1  # closed: the port is not left bound
