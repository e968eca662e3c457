"""Preflight checks that the chart repository has the ``chart_version`` the Kubernetes step installs, before the
config-patch and image steps change the GPU nodes.

Found by an operator walkthrough (stop 54): ``--set gpu_operator.chart_version=v26.3.33`` (a typo) planned green,
and an ``--apply`` run patched and upgraded every GPU node before the Kubernetes step's ``helm upgrade`` said
``chart "gpu-operator" matching v26.3.33 not found``; on a real cluster the nodes were left on the NVIDIA image
with no GPU Operator. The chart repository here is the simulator's, read by the real helm.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from runbook_lib.cli import main
from runbook_lib.notebook import records

pytestmark = pytest.mark.slow

PARAMS = str(Path(__file__).resolve().parents[1] / "params" / "simulated.yaml")


def test_a_chart_version_the_repository_lacks_stops_the_run_before_any_node_changes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    place = ["--records", str(tmp_path / "records"), "--state", str(tmp_path / "sim"), "--no-progress"]
    typo = ["--set", "device_plugin.chart_version=0.99.9"]
    try:
        assert main(["run", "-p", PARAMS, *typo, *place]) == 1, "a plan that cannot be applied is not green"
        planned = capsys.readouterr().out
        assert (
            "chart: device_plugin.chart_version 0.99.9: no nvdp/nvidia-device-plugin chart in" in planned
        ), planned
        assert main(["run", "-p", PARAMS, *typo, *place, "--apply"]) == 1
        said = capsys.readouterr().out
        data = records.load_record(records.resolve(tmp_path / "records", None))
        assert data["failed_step"] == "preflight" and data["changes"] == [], said
        assert "set device_plugin.chart_version to one of them" in said, said
        assert main(["run", "-p", PARAMS, *place, "--steps", "preflight"]) == 0, (
            "the chart the file names is there"
        )
    finally:
        main(["sim", "down", "--state", str(tmp_path / "sim")])
