"""Issue 17 review (operator's experience): gaps found by trying the README's commands as an operator and an
attacker would, each with the test that showed it.

The rollback's approval rule is the project's own (README "Rollback": ``runbook rollback ... --from <record>``
plans, ``--apply`` applies); no Talos behaviour is involved in these tests.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from runbook_lib.cli import main
from runbook_lib.notebook import records
from runbook_lib.notebook.lock import LOCKS_ENV
from runbook_lib.sim.state import load_nodes

PARAMS = Path(__file__).resolve().parents[1] / "params" / "simulated.yaml"


@pytest.fixture(autouse=True)
def locks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cluster apply locks of these tests, apart from the machine's (``~/.cache``)."""
    monkeypatch.setenv(LOCKS_ENV, str(tmp_path / "locks"))


def _gpu_nodes(state: Path) -> dict[str, tuple[str, int]]:
    """Each GPU node's schematic and config version: what a rollback would change."""
    return {n.name: (n.schematic_id, n.config_version) for n in load_nodes(state) if n.gpus}


@pytest.mark.slow
def test_rollback_without_apply_only_plans_whatever_the_parameters_say_about_apply(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``runbook rollback -p FILE --from RECORD`` is the README's *plan* command.  A team's parameter file that
    says ``apply: true`` (so ``runbook run -p FILE`` applies in CI), or a ``--set apply=true``, must not turn
    it into a rollback of every GPU node: only ``--apply`` on the rollback's own command line approves it."""
    env = ["--records", str(tmp_path / "records"), "--state", str(tmp_path / "sim"), "--no-progress"]
    assert main(["run", "-p", str(PARAMS), "--steps", "config-patch,image", "--apply", *env]) == 0
    applied = records.resolve(tmp_path / "records", None)
    changed = _gpu_nodes(tmp_path / "sim")
    apply_true = tmp_path / "prod.yaml"
    apply_true.write_text(yaml.safe_dump({**yaml.safe_load(PARAMS.read_text()), "apply": True}))
    capsys.readouterr()

    for how in (["-p", str(apply_true)], ["-p", str(PARAMS), "--set", "apply=true"]):
        assert main(["rollback", *how, "--from", applied.name, *env]) == 0
        assert _gpu_nodes(tmp_path / "sim") == changed, f"rolled back without --apply ({' '.join(how)})"
        plan = records.load_record(records.resolve(tmp_path / "records", None))
        assert (plan["outcome"], plan["apply"], plan["changes"]) == ("planned", False, [])
        assert "add --apply" in capsys.readouterr().err
