"""What an interrupted ``runbook rollback --apply`` says: where its record is, and the command that goes on.

Found by an operator walkthrough (6 Dec 2026): SIGTERM after the rollback's first batch printed only "the
record is sealed at …", and the operator did not know whether running the rollback again was safe.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from runbook_lib.cli import cmd_rollback, main
from tests.test_continues import PARAMS, _seal, _upgraded_gpu_worker_1


@pytest.mark.parametrize("stop", [KeyboardInterrupt(), SystemExit(143)], ids=["sigint", "sigterm"])
def test_an_interrupted_rollback_prints_the_command_that_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], stop: BaseException
) -> None:
    root = tmp_path / "records"
    record = _seal(root, 0, _upgraded_gpu_worker_1())

    def interrupted(*_args: object, **_kwargs: object) -> None:
        raise stop  # as runner.run re-raises the interrupt once the rollback's record is sealed

    monkeypatch.setattr(cmd_rollback.runner, "run", interrupted)
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)  # put back what the quiet interrupt sets
    place = ["--records", str(root), "--state", str(tmp_path / "sim")]
    argv = [
        "rollback",
        "-p",
        str(PARAMS),
        "--set",
        "rollout_concurrency=2",
        *place,
        "--from",
        record.name[:15],
    ]
    with pytest.raises(type(stop)):
        main([*argv, "--apply"])
    err = capsys.readouterr().err
    # the full name: the prefix given may match the interrupted rollback's own record too (review)
    again = f"runbook rollback -p {PARAMS} --set rollout_concurrency=2 {' '.join(place)} --from {record.name}"
    assert f"to go on once it is safe: {again}  # plan first" in err, err
    with pytest.raises(type(stop)):
        main(argv)  # a plan that was interrupted changed nothing: nothing to go on with
    assert "to go on" not in capsys.readouterr().err
