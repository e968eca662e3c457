"""A node the patch reboots but Kubernetes does not know by the parameters' name is not patched.

Why: ``kubectl drain <name>`` of a name Kubernetes does not know drains nothing, and skipping the drain would reboot
a node with its pods still on it whenever ``nodes[].name`` differs from the node's Kubernetes name (talosctl's own
drain asks the node for that name: talos@v1.13.0 cmd/talosctl/pkg/talos/nodedrain/nodedrain.go:47-63). The
Kubernetes client answers as the real one does for a missing Node (``read_node`` 404 -> ``Kube.node`` None).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from runbook_lib.steps import drains


class _Kubectl:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def drain(self, node: str, *, timeout_s: float) -> Any:
        self.calls.append(node)
        return SimpleNamespace(ok=True, stderr="")


def test_a_node_kubernetes_does_not_know_by_that_name_is_reported_not_drained_and_not_skipped() -> None:
    kubectl = _Kubectl()
    ctx = SimpleNamespace(
        params=SimpleNamespace(timeouts=SimpleNamespace(drain_seconds=300)),
        kube=SimpleNamespace(node=lambda name: None),
        kubectl=kubectl,
    )
    outcome = drains.drain(ctx, ["gpu-7"])  # type: ignore[arg-type]
    assert outcome.cordoned == [] and kubectl.calls == []
    assert "no Kubernetes Node named gpu-7" in outcome.failed["gpu-7"]
    assert "nodes[].name" in outcome.failed["gpu-7"]
