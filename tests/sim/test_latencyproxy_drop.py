"""``watch_drop_after_s`` on the real control plane: the relay in front of kube-apiserver (``latencyproxy``) cuts a
connection whose client has been quiet that long, as a load balancer's idle timeout cuts a watch, and the
library's waits (``KubeClient.watch_until`` re-lists and re-watches) survive it: the kubernetes step completes.

Before, the fault existed only on the Python API server (``kubeapi/server.py``, retired 2 Dec 2026). Which timeout a real load
balancer applies is not sourced here: the figure is the test's.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from runbook_lib.sim import latencyproxy, realkube
from runbook_lib.sim.state import save_cluster_faults
from runbook_lib.steps.kubernetes import kubernetes_layer
from tests.sim.test_latencyproxy import echo
from tests.sim.test_sim_up_real_kube import context, down, tools, up

__all__ = ["echo", "tools"]  # fixtures


@contextlib.contextmanager
def connected(upstream: tuple[str, int], drop_after_s: float) -> Iterator[socket.socket]:
    """A client connection through a relay to ``upstream`` that cuts after ``drop_after_s`` quiet seconds."""
    relay = latencyproxy.LatencyProxy(upstream, lambda: 0.0, drop_after_s=lambda: drop_after_s)
    relay.start()
    try:
        with socket.create_connection(("127.0.0.1", relay.port), timeout=30) as conn:
            yield conn
    finally:
        relay.stop()


def test_a_connection_whose_client_is_quiet_is_cut_after_the_fault_s_seconds(echo: tuple[str, int]) -> None:
    with connected(echo, 0.5) as conn:
        sent = time.monotonic()  # before the relay sees the bytes and starts its own count
        conn.sendall(b"watch")
        assert conn.recv(100) == b"watch"
        assert conn.recv(100) == b""  # cut: no more bytes, the peer closed
        assert time.monotonic() - sent >= 0.45


def test_a_client_that_keeps_sending_is_not_cut(echo: tuple[str, int]) -> None:
    # a 3 s limit: a loaded machine's scheduling stall between two sends must not pass for a quiet client;
    # sending for 4 s, longer than the limit, so a relay that cut by the connection's age would fail this
    with connected(echo, 3.0) as conn:
        until = time.monotonic() + 4.0
        while time.monotonic() < until:
            conn.sendall(b"x")
            assert conn.recv(100) == b"x"
            time.sleep(0.1)


def test_no_fault_no_cut(echo: tuple[str, int]) -> None:
    with connected(echo, 0.0) as conn:
        conn.sendall(b"a")
        assert conn.recv(100) == b"a"
        time.sleep(0.5)  # the reaper's 0.1 s tick, five times over: a cut would have happened
        conn.sendall(b"b")
        assert conn.recv(100) == b"b"


@pytest.mark.slow
def test_the_kubernetes_step_completes_while_the_relay_cuts_its_watches(
    tools: realkube.Tools, tmp_path: Path
) -> None:
    state = tmp_path / "sim"
    up(state, tools, 2, "gpu-ready")
    try:
        save_cluster_faults(state, {"watch_drop_after_s": 1})
        ctx = context(state, ["talos-worker-1", "talos-worker-2"])
        result = kubernetes_layer(ctx, apply=True, timeout_s=120)
        assert result.ok, result.to_dict()
        assert all(n.data["allocatable_gpus"] == 1 for n in result.nodes)
        assert "cut a client connection quiet for 1.0 s" in (state / "realkube.log").read_text()
    finally:
        down(state)
