"""``runbook sim up -p FILE`` with flags that contradict the parameter file."""

from __future__ import annotations

from pathlib import Path

import pytest

from runbook_lib.cli import main

PARAMS = str(Path(__file__).resolve().parents[1] / "params" / "simulated.yaml")


def test_a_talos_version_flag_that_contradicts_the_parameter_file_is_refused_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by an operator walkthrough: ``sim up -p params/simulated.yaml --talos-version v1.13.2`` brought up
    v1.12.7 nodes (the file's) without a word, while ``--scenario`` on the same line did override the file."""
    state = tmp_path / "state"
    assert main(["sim", "up", "--state", str(state), "-p", PARAMS, "--talos-version", "v1.13.2"]) == 2
    err = capsys.readouterr().err
    assert f"--talos-version v1.13.2 contradicts talos_version v1.12.7 in {PARAMS}" in err, err
    assert not (state / "cluster.json").exists()
