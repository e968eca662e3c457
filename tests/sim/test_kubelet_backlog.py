"""The simulated kubelets' proxy socket takes a burst of connections as a real kubelet's listener does.

Found in the suite (2 Dec): kube-apiserver v1.35 answered a cuda-test log read HTTP 500 after "dial unix
…/kubelet.sock: connect: resource temporarily unavailable": socketserver's listen backlog of 5 was full while
cuda-test read a dozen pod logs at once. A real kubelet listens through Go's net.Listen, backlog somaxconn
(go/src/net/sock_linux.go ``maxListenerBacklog``).
"""

from __future__ import annotations

import socket
from pathlib import Path

from runbook_lib.sim import kubeletapi

BURST = 24  # two nodes' worth of cuda-test log reads, more than socketserver's default backlog of 5


def test_a_burst_of_connections_waits_in_the_backlog_instead_of_being_refused(tmp_path: Path) -> None:
    proxy = kubeletapi.KubeletProxy(
        tmp_path / "k.sock", tmp_path / "cert.pem", tmp_path / "key.pem", kubeletapi.Logs()
    )  # not serving yet: every connection stays in the listen backlog, as under a burst
    clients: list[socket.socket] = []
    try:
        for _ in range(BURST):
            client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            client.setblocking(False)
            clients.append(client)
            client.connect(str(tmp_path / "k.sock"))  # EAGAIN (BlockingIOError) once the backlog is full
    finally:
        for client in clients:
            client.close()
        proxy.server_close()
