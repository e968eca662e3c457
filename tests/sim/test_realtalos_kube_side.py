"""Which talosctl runs Talos 1.14 nodes depends on the Kubernetes side: talosctl 1.14's upgrade drain accepts only a
kubeconfig with Talos's structure, a client certificate and no token (talos@v1.14.1 pkg/kubeconfig/validate.go:29,
149-176, checked by cmd/talosctl/cmd/talos/kubeconfig.go:123). The real control plane writes one at
``talos_kubeconfig_path`` (simkube signs it with the CA key it keeps, realkube.write_talos_kubeconfig; the Python
Kubernetes API that wrote one too was retired in issue 15). Where it wrote none, simnode would hand out the token
kubeconfig, which talosctl 1.14 refuses at the drain after config-patch has changed every node (half-applied), so
``auto`` keeps the Python talosctl there, saying why, and ``real`` refuses before anything starts.

Fast: stand-in executables in a temporary tools cache, as tests/sim/test_realtalos.py; nothing runs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from runbook_lib.sim import cluster, realkube, realtalos
from runbook_lib.sim.state import talos_kubeconfig_path
from tests.sim.test_realtalos import tools as tools_112  # noqa: F401 - the fixture, extended below


@pytest.fixture
def tools(tools_112: Path) -> Path:  # noqa: F811 - the imported fixture, asked for by name
    """test_realtalos's tools cache (talosctl v1.12.0, simnode) with stand-ins for talosctl v1.13.0 and v1.14.1."""
    for version in ("v1.13.0", "v1.14.1"):
        path = tools_112 / "talosctl" / version / "talosctl"
        path.parent.mkdir(parents=True)
        path.write_text("#!/bin/sh\n")
        path.chmod(0o700)
    return tools_112


def _talos_kubeconfig(state: Path) -> None:
    path = talos_kubeconfig_path(state)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("apiVersion: v1\nkind: Config\n")


def test_talos_1_14_on_a_real_control_plane_that_wrote_its_talos_kubeconfig_runs_the_real_talosctl(
    tools: Path, tmp_path: Path
) -> None:
    _talos_kubeconfig(tmp_path)
    choice = realtalos.choose("v1.14.0", None, "fresh", kube="real", state_dir=tmp_path)
    assert choice.real and choice.reason == "real talosctl v1.14.1 against simnode", choice.reason


def test_talos_1_14_on_a_real_control_plane_that_wrote_no_talos_kubeconfig_keeps_the_python_talosctl_saying_why(
    tools: Path, tmp_path: Path
) -> None:
    """A state dir an older simkube wrote has no CA key to sign the admin certificate: simkube's reason, as
    realkube.write_talos_kubeconfig records it, reaches ``sim status``, with what to do."""
    realkube.write_talos_kubeconfig(
        tmp_path, {"talos_kubeconfig": "", "talos_kubeconfig_error": "no CA key: remove it"}, "https://x:1"
    )
    choice = realtalos.choose("v1.14.0", None, "fresh", kube="real", state_dir=tmp_path)
    assert not choice.real
    assert choice.reason.startswith("Python talosctl: the real control plane wrote no "), choice.reason
    assert "simkube: no CA key: remove it" in choice.reason, choice.reason


def test_talos_1_13_on_the_real_control_plane_still_runs_the_real_talosctl(tools: Path) -> None:
    """talosctl 1.13's drain takes the token kubeconfig (it has no such validation)."""
    choice = realtalos.choose("v1.13.2", None, "fresh", kube="real")
    assert choice.real and choice.reason == "real talosctl v1.13.0 against simnode", choice.reason


def test_real_mode_refuses_talos_1_14_on_a_real_control_plane_without_its_talos_kubeconfig_before_anything_starts(
    tools: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(realtalos.MODE_ENV, "real")
    with pytest.raises(
        realtalos.RealTalosError, match=r"RUNBOOK_SIM_TALOSCTL=real: the real control plane wrote no"
    ):
        realtalos.choose("v1.14.0", None, "fresh", kube="real", state_dir=tmp_path)


def test_start_talos_tells_choose_which_kubernetes_side_runs(
    tools: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``cluster.start_talos`` asks realkube (its supervisor runs: the real control plane), as ``runbook sim up``
    and ``runbook run`` start them in that order; without it and without a ``kube`` endpoint, none."""
    state = tmp_path / "state"
    cluster.create(state, cluster.ClusterSpec(workers=1, talos_version="v1.14.0"))
    (state / "endpoints.json").write_text('{"kube": "https://127.0.0.1:1"}')
    monkeypatch.setattr(realkube, "supervisor_pid", lambda _state: 4242)
    assert cluster.kube_side(state) == "real"
    monkeypatch.setattr(realkube, "supervisor_pid", lambda _state: None)
    (state / "endpoints.json").write_text("{}")
    assert cluster.kube_side(state) == "none"
