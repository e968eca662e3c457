"""The simulated chart repositories release their loopback port when ``helm repo index`` fails.

``serve``/``serve_mirror`` bind their HTTP server before indexing, and the supervisor (``realkube``) registers
``stop()`` only once they return: a failing helm left the port bound for the supervisor's life. The helm here is
a stand-in that fails as ``_run`` reports any helm failure (exit status and stderr), so no real helm is needed.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from runbook_lib.sim import chartrepo


def failing_helm(tmp_path: Path) -> Path:
    helm = tmp_path / "helm"
    helm.write_text(f"#!{sys.executable}\nimport sys\nsys.stderr.write('Error: disk full\\n')\nsys.exit(1)\n")
    helm.chmod(0o755)
    return helm


def test_a_mirror_whose_index_fails_releases_its_port(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[chartrepo.ChartRepo] = []

    class Recorded(chartrepo.ChartRepo):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    source = chartrepo.ChartRepo(tmp_path / "source")  # never started: only its (empty) directory is read
    try:
        monkeypatch.setattr(chartrepo, "ChartRepo", Recorded)
        with pytest.raises(RuntimeError, match=r"helm repo index failed \(exit 1\): Error: disk full"):
            chartrepo.serve_mirror(failing_helm(tmp_path), source, tmp_path / "mirror")
    finally:
        source.stop()
    assert len(made) == 1 and made[0].server.socket.fileno() == -1  # closed: the port is not left bound
