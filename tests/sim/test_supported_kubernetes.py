"""The Kubernetes minors ``runbook sim up`` says a Talos release supports, when another control-plane release stands
in for the one the nodes ship (``realkube.plane_summary``), follow talosctl's own check at each release's tag."""

from __future__ import annotations

from runbook_lib.sim import realkube


def test_talos_1_6_supports_kubernetes_1_24_to_1_29_as_its_code_at_v1_6_7_says() -> None:
    """talos@v1.6.7 pkg/machinery/compatibility/talos16/talos16.go:25-28: ``MinimumKubernetesVersion``
    1.24.0, ``MaximumKubernetesVersion`` 1.29.99 (the same at v1.6.0 and on main). The table had 1.27-1.29, so a
    1.25 control plane standing in for 1.6's was called outside what Talos 1.6 supports."""
    line = realkube.plane_summary("1.29.0", "v1.6.7", "v1.25.0")
    assert line.endswith("inside the Kubernetes 1.24-1.29 Talos 1.6 supports)"), line


def test_talos_1_13_supports_kubernetes_1_31_to_1_36_as_its_code_at_v1_13_0_says() -> None:
    """talos@v1.13.0 pkg/machinery/compatibility/talos113/talos113.go: 1.31.0 to 1.36.99; a 1.30 stand-in is
    outside it."""
    line = realkube.plane_summary("1.36.0", "v1.13.0", "v1.30.0")
    assert line.endswith("outside the Kubernetes 1.31-1.36 Talos 1.13 supports)"), line
