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


def test_a_release_the_simulated_factory_lacks_is_refused_before_a_cluster_is_made(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Operator walkthrough (stop 54): a run on v1.14.1 made a cluster the simulated factory could not serve
    (its newest 1.14 is v1.14.0), failed preflight at the factory, and its half-made state then refused the
    corrected parameters as made for other parameters. The release is refused first, naming the ones it has."""
    state = tmp_path / "sim"
    place = ["--state", str(state), "--records", str(tmp_path / "records"), "--no-progress"]
    assert main(["run", "-p", PARAMS, "--set", "talos_version=v1.14.1", *place]) == 2
    err = capsys.readouterr().err
    assert "Talos v1.14.1 is not a release the simulated Image Factory serves (its 1.14 releases: " in err, (
        err
    )
    assert "v1.14.0)" in err, err
    assert not state.exists() and not (tmp_path / "records").exists()
