"""What ``runbook run`` prints after the runner's report (``runbook_lib/cli/run_report.py``): the operator's own
``-p FILE --set …`` in the fixes, and after a partial run the steps left with the command that continues.

Found by an operator walkthrough (Stop 44's note): the fixes said ``runbook run -p <parameters> …``, which a
shell copy-paste turns into a redirection from a file named ``parameters``; after ``--steps config-patch,image
--apply`` nothing said verify, kubernetes and cuda-test were still to run; the step line read ``image  changed
… image-upgrade: changed (3 changed)``. The wording is this project's own (no upstream source defines it).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest

from runbook_lib.cli import main
from runbook_lib.cli.run_report import Invocation, report, simulator_stopped, steps_left
from runbook_lib.model.text import PARAMS_PLACEHOLDER
from runbook_lib.notebook import records
from runbook_lib.notebook.record_content import RunOutcome, StepOutcome

REPO = Path(__file__).resolve().parents[1]
PARAMS = str(REPO / "params" / "simulated.yaml")


def _outcome(*steps: tuple[str, str, str], failed: str | None = None) -> RunOutcome:
    outcomes = [StepOutcome(name, f"{name}.ipynb", status, 1.0, summary) for name, status, summary in steps]
    if failed:
        outcomes[-1].error = {"ename": "StepFailed", "evalue": outcomes[-1].summary + "\n  gpu-3: fix: x"}
    return RunOutcome(Path("/r/rec"), "changed", outcomes, "ab" * 32, 3, failed_step=failed)


def test_fixes_name_the_run_s_own_parameter_file_overrides_and_places() -> None:
    invocation = Invocation("my params.yaml", ["rollout_concurrency=3"], "/tmp/rec", "/tmp/st", apply=True)
    fixed = invocation.with_params(
        "re-run: runbook run -p <parameters> --steps image --apply; see runbook schematic show -p <parameters>"
    )
    assert PARAMS_PLACEHOLDER not in fixed
    run = "runbook run -p 'my params.yaml' --set rollout_concurrency=3 --records /tmp/rec --state /tmp/st"
    assert f"re-run: {run} --steps image --apply;" in fixed
    # `runbook schematic show` takes no --records or --state: it would refuse them
    assert fixed.endswith("runbook schematic show -p 'my params.yaml' --set rollout_concurrency=3")


def test_a_resumed_run_has_no_file_to_name_and_keeps_the_placeholder() -> None:
    text = "re-run: runbook run -p <parameters> --steps image --apply"
    assert Invocation(None, ["x=1"]).with_params(text) == text


def test_every_fix_in_the_library_uses_the_one_placeholder_the_cli_replaces() -> None:
    """A fix written ``-p <params.yaml>`` would stay a placeholder on the terminal (three spellings existed)."""
    found = {
        f"{path.relative_to(REPO)}: {match}"
        for path in (REPO / "runbook_lib").rglob("*.py")
        for match in re.findall(r"runbook (?:run|schematic show) -p <[^>]*>", path.read_text())
        if not match.endswith(PARAMS_PLACEHOLDER)
    }
    assert not found, found


def test_a_preflight_fix_in_a_run_that_did_not_name_preflight_re_runs_that_run() -> None:
    """``--steps config-patch --apply`` runs preflight first (runner.with_preflight); an unreachable node's fix
    said ``re-run: runbook run … --steps preflight``, a plan-only preflight that passes and leads nowhere
    (walkthrough, 6 Dec 2026). It now names the run's own command; a fix naming other steps is left as it is."""
    fix = "then re-run: runbook run -p <parameters> --steps preflight; or take the node out of `nodes:`"
    own = Invocation("p.yaml", ("a=1",), "r", None, apply=True, selection=("--steps", "config-patch"))
    assert own.with_params(fix) == (
        "then re-run: runbook run -p p.yaml --set a=1 --steps config-patch --records r --apply; or take the node "
        "out of `nodes:`"
    )
    other = "re-run: runbook run -p <parameters> --steps preflight,verify"
    assert (
        own.with_params(other)
        == "re-run: runbook run -p p.yaml --set a=1 --records r --steps preflight,verify"
    )
    asked = Invocation("p.yaml", (), None, None, apply=True)  # the run named preflight (or ran them all)
    assert asked.with_params(fix).startswith("then re-run: runbook run -p p.yaml --steps preflight;")


def test_steps_left_after_a_partial_run_and_none_after_a_failure_a_plan_or_the_last_step() -> None:
    done = _outcome(("config-patch", "changed", ""), ("image", "changed", ""))
    assert steps_left(done) == ["verify", "kubernetes", "cuda-test"]
    # a gap counts: continuing at kubernetes would skip the image the Kubernetes layer needs (review)
    gap = _outcome(("preflight", "ok", ""), ("config-patch", "changed", ""), ("verify", "ok", ""))
    assert steps_left(gap) == ["image", "kubernetes", "cuda-test"]
    assert steps_left(_outcome(("verify", "ok", ""))) == []  # a health check changed nothing: nothing is left
    assert steps_left(_outcome(("image", "failed", "image: failed (1 failed)"), failed="image")) == []
    assert (
        steps_left(_outcome(("config-patch", "planned", ""), ("image", "skipped", "waits for apply"))) == []
    )
    assert steps_left(_outcome(("verify", "ok", ""), ("kubernetes", "ok", ""), ("cuda-test", "ok", ""))) == []
    # the preflight an --apply run adds is not where the run started: --from verify left nothing before it
    resumed = _outcome(("preflight", "ok", ""), ("verify", "ok", ""), ("kubernetes", "changed", ""))
    assert steps_left(resumed) == ["cuda-test"]


def test_step_lines_say_the_step_name_once_and_name_the_counts_as_nodes() -> None:
    outcome = _outcome(
        ("image", "changed", "image: changed (3 changed)"),
        ("kubernetes", "failed", "kubernetes: failed (3 ok)"),
    )
    outcome.failed_step = "kubernetes"
    outcome.steps[-1].error = {"evalue": "kubernetes: failed (3 ok)\n  hint: x"}
    text = report(outcome, Invocation("p.yaml"))
    assert re.search(r"^image +changed +1\.0 s  nodes: 3 changed$", text, re.M), text
    assert "\nstopped at kubernetes: nodes: 3 ok\n" in text and "kubernetes: kubernetes" not in text


@pytest.mark.slow
def test_a_partial_run_says_what_is_left_and_its_command_continues_the_same_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    place = ["--records", str(tmp_path / "records"), "--state", str(tmp_path / "sim")]
    steps = ["--steps", "config-patch", "--apply", "--no-progress"]
    assert main(["run", "-p", PARAMS, "--set", "rollout_concurrency=3", *place, *steps]) == 0
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith("not run yet: "))
    left, command = line.removeprefix("not run yet: ").split("; continue with: ")
    assert left == "image, verify, kubernetes, cuda-test"
    argv = shlex.split(command)
    assert argv[:4] == ["runbook", "run", "--from", "image"] and argv[-1] == "--apply"
    assert main([*argv[1:], "--no-progress"]) == 0  # the printed command, as the operator pastes it
    rest = records.load_record(records.resolve(tmp_path / "records", None))
    assert [s["name"] for s in rest["steps"]] == ["preflight", "image", "verify", "kubernetes", "cuda-test"]
    assert rest["outcome"] == "changed" and rest["verification"]["cuda-test"]["status"] == "ok"
    assert rest["params"]["rollout_concurrency"] == 3  # the same parameters, the same records folder
    assert "not run yet" not in capsys.readouterr().out  # the runbook is done


@pytest.mark.slow
def test_a_failed_node_s_fix_is_a_command_the_operator_can_paste(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The last worker fails its upgrade (scenario ``upgrade-fails``); the fix's re-run, pasted, runs the image
    step again on the same cluster with the same overrides, into the same records folder."""
    place = ["--records", str(tmp_path / "records"), "--state", str(tmp_path / "sim")]
    sets = ["--set", "simulation.scenario=upgrade-fails", "--set", "rollout_concurrency=3"]
    assert main(["run", "-p", PARAMS, *sets, *place, "--steps", "config-patch,image", "--apply"]) == 1
    out = capsys.readouterr().out
    assert PARAMS_PLACEHOLDER not in out and "not run yet" not in out
    fix = next(
        line for line in out.splitlines() if "fix (upgrade): " in line and "re-run the image step" in line
    )
    command = re.search(r"(runbook run .*--apply)", fix)
    assert command, fix
    argv = shlex.split(command.group(1))
    assert argv[2:] == ["-p", PARAMS, *sets, *place, "--steps", "image", "--apply"]
    # the run's own talosctl and talosconfig: a bare `talosctl -n` asks the shell's default context (walkthrough)
    state = (tmp_path / "sim").resolve()
    assert f"(`{state}/bin/talosctl --talosconfig {state}/talosconfig -n 10.5.0.13 dmesg`)" in fix, fix
    assert main([*argv[1:], "--no-progress"]) == 1  # the fault is still on: it fails again, on that node only
    again = records.load_record(records.resolve(tmp_path / "records", None))
    assert [s["name"] for s in again["steps"]] == ["preflight", "image"]  # a new record in the same folder
    out = capsys.readouterr().out
    failures = re.findall(r"^image: (\S+) \(\S+\) failed: ", out, re.M)
    assert failures == ["gpu-worker-3"] and "nodes: 1 failed, 2 unchanged" in out, out


@pytest.mark.slow
def test_a_plan_and_the_run_that_applies_it_name_the_same_installer(tmp_path: Path) -> None:
    """Each run starts the simulator again; its factory took a new free port each time, so the installer in the
    plan's record (``<factory host:port>/installer/<schematic>:<version>``) was not the one the applying run
    upgraded to (operator walkthrough, stop 45). The real factory has one address."""
    place = ["--records", str(tmp_path / "records"), "--state", str(tmp_path / "sim"), "--no-progress"]
    steps = ["--steps", "config-patch,image"]
    assert main(["run", "-p", PARAMS, *place, *steps]) == 0
    planned = records.load_record(records.resolve(tmp_path / "records", None))
    assert main(["run", "-p", PARAMS, *place, *steps, "--apply"]) == 0
    applied = records.load_record(records.resolve(tmp_path / "records", None))

    def installers(record: dict[str, object]) -> dict[str, str]:
        [image] = [s for s in record["steps"] if s["name"] == "image"]  # type: ignore[attr-defined]
        return image["result"]["data"]["installer_images"]  # type: ignore[no-any-return]

    assert installers(planned) == installers(applied) and len(installers(planned)) == 3, installers(planned)


def test_an_apply_run_of_checks_only_is_not_said_to_have_found_the_planned_state() -> None:
    """``runbook run --steps cuda-test --apply`` changes nothing and looks at no planned state: its record said
    "every step found it already in the planned state" (operator walkthrough, 6 Dec 2026)."""
    from runbook_lib.notebook.record_content import run_note

    checks = run_note(
        apply=True, failed_step=None, changed=False, stop_note="", steps=["preflight", "cuda-test"]
    )
    assert checks == "nothing changed on the cluster: the run's steps (preflight, cuda-test) only check it"
    whole = run_note(
        apply=True, failed_step=None, changed=False, stop_note="", steps=["preflight", "kubernetes"]
    )
    assert whole.endswith("every step found it already in the planned state")


def test_a_failed_apply_run_of_the_runbook_names_how_to_go_on_from_the_failed_step_once_fixed() -> None:
    """The image step's fix re-runs the image step alone; verify, the Kubernetes layer and the CUDA test were
    left for the operator to remember (operator walkthrough, 6 Dec 2026). A ``--steps`` run ran only those, and
    a plan is re-run as it is: neither gets the line."""
    steps = [("preflight", "ok", "preflight: ok"), ("config-patch", "changed", "x"), ("image", "failed", "y")]
    outcome = _outcome(*steps, failed="image")
    whole = report(outcome, Invocation("p.yaml", (), "/r", None, apply=True))
    assert (
        "once image is fixed, continue with: runbook run --from image -p p.yaml --records /r --apply  # image "
        "again (it redoes only what is not done), then verify, kubernetes, cuda-test\n"
    ) in whole, whole
    picked = report(outcome, Invocation("p.yaml", (), "/r", None, apply=True, picked=True))
    planned = report(outcome, Invocation("p.yaml", (), "/r", None, apply=False))
    assert "continue with" not in picked and "continue with" not in planned
    # refused for a config without the modules patch (`--from image` after a rollback): the go-on starts at the
    # patch, not at the image step it would only fail again (operator walkthrough, 6 Dec 2026)
    from runbook_lib.model.text import MODULES_PATCH_MISSING

    refused = {
        "status": "failed",
        "message": f"{MODULES_PATCH_MISSING} (upgrading now would hang the boot …)",
    }
    outcome.steps[-1].result = {"nodes": [refused, {**refused, "node": "gpu-2"}]}
    said = report(outcome, Invocation("p.yaml", (), "/r", None, apply=True))
    assert (
        "the image step needs the modules patch first; continue with: runbook run --from config-patch -p p.yaml "
        "--records /r --apply  # config-patch, then image, verify, kubernetes, cuda-test\n"
    ) in said, said


def test_an_interrupted_apply_run_says_how_to_go_on_or_undo_it(tmp_path: Path) -> None:
    """SIGTERM or Ctrl-C during an --apply run said only where the record is (operator walkthrough, 6 Dec 2026);
    an interrupted upgrade is when a rollback is wanted. From the sealed record: the step it was in, and the
    rollback of that record."""
    from runbook_lib.cli.run_report import after_interrupt

    record = tmp_path / "records" / "20261206T200000Z-sim-gpu-abcdef12"
    record.mkdir(parents=True)
    steps = [{"name": "preflight", "status": "ok"}, {"name": "image", "status": "interrupted"}]
    own = {"params_file": "p.yaml", "overrides": []}
    records.seal(record, {"apply": True, "steps": steps, **own}, secrets=[])
    # a concurrent run of the same parameters made a newer record: the run's own record is the one it opened
    # (runner.run(on_record=)), not the folder's newest (review of 8d27fe4's stop)
    newer = tmp_path / "records" / "20261206T200001Z-sim-gpu-99999999"
    newer.mkdir()
    records.seal(newer, {"apply": True, "steps": steps[:1], **own}, secrets=[])

    # approved by the file or a --set, not --apply: the go-on still repeats the approval (review of 70aa799)
    invocation = Invocation("p.yaml", (), str(tmp_path / "records"), None, apply=False)
    said = after_interrupt(record, invocation)
    place = f"--records {tmp_path / 'records'}"
    assert said == (
        f"once it is safe to go on: runbook run --from image -p p.yaml {place} --apply\n"
        f"to undo what it changed instead (plan first, then --apply): runbook rollback -p p.yaml {place} "
        f"--from {record.name}\n"
    )
    assert after_interrupt(None, invocation) == "", (
        "interrupted before it opened a record: it changed nothing"
    )
    assert after_interrupt(tmp_path / "none", invocation) == "", "no record to read: nothing said"
    picked = Invocation("p.yaml", (), str(tmp_path / "records"), None, apply=True, picked=True)
    only_undo = after_interrupt(record, picked)
    assert "go on" not in only_undo and "runbook rollback" in only_undo, "--from would run unselected steps"
    plan = tmp_path / "plan" / record.name
    plan.mkdir(parents=True)
    records.seal(plan, {"apply": False, "steps": steps, **own}, secrets=[])
    assert after_interrupt(plan, invocation) == "", "a plan changed nothing"


def test_the_notes_of_steps_that_ran_are_printed_under_their_step() -> None:
    """verify's note of a GPU node cordoned without the runbook's mark lived only in the executed notebook: the
    run printed `verify ok` (operator walkthrough, 6 Dec 2026). The rollout schedule, which the batch lines
    repeat, and a planned step's notes (in its plan lines) are not said again."""
    cordon = (
        "cordoned without the runbook's mark (an administrator's, or one an interrupted talosctl upgrade left): "
        "gpu-2: no new pod, the CUDA test's included, is scheduled there until someone uncordons them"
    )
    outcome = _outcome(("image", "changed", "nodes: 3 changed"), ("verify", "ok", "nodes: 3 ok"))
    outcome.steps[0].result = {"notes": ["rollout: 3 node(s) in 3 batch(es) of 1, 1, 1 (x); stops"]}
    outcome.steps[1].result = {"notes": [cordon]}
    text = outcome.report()
    assert f"\nnotes:\n  verify: {cordon}\nrecord: /r/rec" in text, text
    assert "rollout: 3 node(s)" not in text
    outcome.steps[0].result = {"notes": [cordon]}  # the image step notes the same cordon (review)
    assert outcome.report().count(cordon) == 1
    outcome.steps[0].result = {}
    outcome.steps[1].status = "planned"
    assert "notes:" not in outcome.report()
    outcome.steps[0].result = {"notes": [f"note {i}" for i in range(20)]}
    many = outcome.report()
    assert "  image: note 11\n  … (8 more in the record)\n" in many and "note 12" not in many, many


def test_an_interrupted_run_names_the_node_calls_the_interrupt_cut_short(tmp_path: Path) -> None:
    """ "once it is safe to go on" followed an interrupt while the node whose upgrade was stopped showed only in
    `records show` (operator walkthrough, 6 Dec 2026): the calls cut short are named by node, with the preflight
    that shows where those nodes are. Shaped as a SIGTERM-sealed record keeps them (interrupts.read_journal)."""
    from runbook_lib.cli.run_report import after_interrupt
    from runbook_lib.notebook import interrupts

    record = tmp_path / "records" / "20261206T200000Z-sim-gpu-abcdef12"
    record.mkdir(parents=True)
    upgrade = ["/usr/bin/talosctl", "-n", "10.5.0.12", "upgrade", "--image", "x:v1.12.7", "--wait=true"]
    changes = [
        {"step": "image", "argv": [*upgrade[:2], "10.5.0.11", *upgrade[3:]], "exit_code": 0},
        {"step": "image", "argv": upgrade, "exit_code": 1, "interrupt": interrupts.AFTER},
        {
            "step": "image",
            "argv": [*upgrade[:2], "10.5.0.13", *upgrade[3:]],
            "interrupt": interrupts.IN_FLIGHT,
        },
        {
            "step": "kubernetes",
            "argv": ["/x/helm", "upgrade", "-n", "kube-system"],
            "interrupt": interrupts.AFTER,
        },
    ]
    nodes = [{"name": f"gpu-worker-{i}", "address": f"10.5.0.1{i}"} for i in (1, 2)]
    steps = [{"name": "preflight", "status": "ok"}, {"name": "image", "status": "interrupted"}]
    records.seal(
        record,
        {
            "apply": True,
            "params_file": "p.yaml",
            "overrides": [],
            "steps": steps,
            "changes": changes,
            "params": {"nodes": nodes},
        },
        secrets=[],
    )
    invocation = Invocation("p.yaml", (), str(tmp_path / "records"), None, apply=True)
    said = after_interrupt(record, invocation)
    place = f"--records {tmp_path / 'records'}"
    assert said.startswith(
        "cut short by the interrupt (see where these nodes are before going on: runbook run -p p.yaml --steps "
        f"preflight {place}):\n"
        "  gpu-worker-2: talosctl upgrade, exit 1 after the interrupt\n"
        "  10.5.0.13: talosctl upgrade, in flight: it may have reached the node\n"
        "once it is safe to go on: "
    ), said


def test_a_fix_s_talosctl_is_the_run_s_own_binary_and_talosconfig() -> None:
    """A fix said `talosctl -n 10.5.0.12 dmesg` while the run used another talosconfig: pasted, it asked the
    shell's default context, perhaps another cluster with the same addresses (operator walkthrough, 6 Dec 2026)."""
    from runbook_lib.steps.fixes import talosctl_as_run
    from runbook_lib.steps.results import Check, NodeResult, StepResult, rewrite_runnable

    result = StepResult(step="image", applied=True)
    node = NodeResult("gpu-1", "10.0.0.1", status="failed", message="see `talosctl -n 10.0.0.1 dmesg`")
    node.checks.append(Check("upgrade", False, "failed", fix="read (`talosctl -n 10.0.0.1 dmesg`); then x"))
    # a cause that gives a command (the unsupported GPU's: attack re-run, 7 Dec 2026)
    node.checks.append(Check("driver", False, "no GPU", cause="see talosctl -n 10.0.0.1 dmesg | grep NVRM"))
    result.nodes.append(node)
    result.checks.append(Check("tools", False, "x", fix="/opt/talosctl -n 1.2.3.4 version; mytalosctl -n a"))
    rewrite_runnable(result, talosctl_as_run("/opt/bin/talosctl", "/etc/talos dev/config"))
    assert (
        node.checks[0].fix
        == "read (`/opt/bin/talosctl --talosconfig '/etc/talos dev/config' -n 10.0.0.1 dmesg`); then x"
    )
    assert node.checks[1].cause.startswith("see /opt/bin/talosctl --talosconfig '/etc/talos dev/config' -n ")
    assert node.message == "see `talosctl -n 10.0.0.1 dmesg`", "what the step saw is quoted as it ran"
    assert result.checks[0].fix == "/opt/talosctl -n 1.2.3.4 version; mytalosctl -n a", (
        "not inside other words"
    )
    plain = talosctl_as_run("talosctl", None)
    assert plain("talosctl -n a dmesg") == "talosctl -n a dmesg"
    assert talosctl_as_run("talosctl", "/c")("talosctl -n a dmesg") == "talosctl --talosconfig /c -n a dmesg"


def test_a_printed_kubectl_command_is_the_run_s_own_kubectl_and_kubeconfig() -> None:
    """The rollback's `kubectl label node … nvidia.com/gpu.present-`, pasted, asked the shell's default context
    ("connection to the server localhost:8080 was refused" on the simulator; perhaps another cluster on a real
    site): operator walkthrough, 7 Dec 2026. Fixes, notes and the not-undone list get the run's kubectl."""
    from runbook_lib.steps.fixes import kubectl_as_run
    from runbook_lib.steps.results import Check, StepResult, rewrite_runnable

    result = StepResult(step="rollback", applied=True)
    result.checks.append(
        Check("pods", False, "kubectl logs failed", fix="kubectl -n ns logs p; kubectl uncordon n")
    )
    result.notes.append("run-1: to remove it: kubectl label node a b nvidia.com/gpu.present-")
    result.data["not_undone"] = ["run-1: to remove it: kubectl label node a b nvidia.com/gpu.present-"]
    done = "/s/kubectl auth can-i get pods --kubeconfig /s/k; kubectl --kubeconfig /x get nodes"
    result.checks.append(Check("can-i", False, "x", fix=done))
    rewrite_runnable(result, kubectl_as_run("/s/kubectl", "/s/kube config"))
    own = "/s/kubectl --kubeconfig '/s/kube config'"
    assert result.checks[0].fix == f"{own} -n ns logs p; {own} uncordon n"
    assert result.checks[0].message == "kubectl logs failed", "what the step saw is quoted as it ran"
    assert result.notes == [f"run-1: to remove it: {own} label node a b nvidia.com/gpu.present-"]
    assert result.data["not_undone"] == result.notes
    assert result.checks[1].fix == done, "a command that has its kubeconfig, or a path, is left alone"
    assert kubectl_as_run("kubectl", None)("kubectl get nodes") == "kubectl get nodes"


def test_a_failed_run_that_stopped_the_simulator_says_how_to_start_it_for_its_fixes() -> None:
    """Operator walkthrough (stop 48): a pasted ``talosctl … dmesg`` fix failed to connect, as the run had stopped
    the simulator it started. Said only when a fix is a tool command, the run failed and the simulator is down."""
    failed = _outcome(("preflight", "failed", "1 node failed"), failed="preflight")
    failed.steps[-1].error = {
        "ename": "StepFailed",
        "evalue": "1 node failed\n    fix: `talosctl -n 10.5.0.13 dmesg`",
    }
    where = Invocation("p.yaml", (), None, "/tmp/my state")
    said = report(failed, where, simulator_stopped_after=True)
    assert "start it as the run left it first, `runbook sim up --keep --state '/tmp/my state'`" in said, said
    assert "simulated cluster" not in report(failed, where), "the simulator is still up: nothing to say"
    passed = _outcome(("preflight", "ok", "3 nodes ok"))
    assert "simulated cluster" not in report(passed, where, simulator_stopped_after=True)
    no_tool = _outcome(("preflight", "failed", "1 node failed"), failed="preflight")
    assert "simulated cluster" not in report(no_tool, where, simulator_stopped_after=True), (
        "fix: x is no command"
    )


def test_the_anchor_stays_the_last_line_and_a_passed_runs_commands_get_the_simulator_line() -> None:
    """README audit (stop 50): the go-on lines came after ``anchor: …`` (a CI step's ``tail -1`` read the wrong
    line), and a passed rollback's ``kubectl label node … nvidia.com/gpu.present-`` met a stopped simulator."""
    rolled = _outcome(("verify", "ok", "3 nodes ok"))
    undone = "kubectl --kubeconfig /s/kubeconfig label node gpu-1 nvidia.com/gpu.present-"
    rolled.steps[0].result = {"notes": [f"not undone: {undone}"]}
    said = report(rolled, Invocation("p.yaml", (), None, "/s"), simulator_stopped_after=True)
    assert "`runbook sim up --keep --state /s`" in said, said
    assert said.splitlines()[-1].startswith("anchor: "), said
    partial = _outcome(("preflight", "ok", "ok"), ("config-patch", "changed", "3 nodes patched"))
    said = report(partial, Invocation("p.yaml", (), None, None, apply=True))
    assert "not run yet: image" in said and said.splitlines()[-1].startswith("anchor: "), said
    assert said.splitlines()[-2].startswith("record: "), said


def test_a_hint_that_preflight_names_the_writes_is_not_turned_into_this_runs_command() -> None:
    """Review of eed6b00: ``runbook run -p <parameters> --steps preflight` names every write`` became the run's own
    ``--steps kubernetes --apply`` (the selection rewrite of preflight fixes), which pasted re-applied."""
    from runbook_lib.errors import FORBIDDEN_HINT

    own = Invocation("p.yaml", (), None, None, apply=True, selection=("--steps", "kubernetes"), picked=True)
    said = own.with_params(f"refused: {FORBIDDEN_HINT}")
    assert "`runbook run -p p.yaml --steps preflight` names every write a run needs" in said, said
    fix = own.with_params("re-run: runbook run -p <parameters> --steps preflight")
    assert "re-run: runbook run -p p.yaml --steps kubernetes --apply" in fix, (
        "a preflight fix still means this run"
    )


def test_a_plans_would_lines_are_no_command_for_the_simulator_line() -> None:
    """Review of eed6b00: a plan's ``would: helm upgrade --install …`` made the report say to start the simulator
    to run "a command above"."""
    text = "kubernetes would change:\n  would: helm upgrade --install nvidia-device-plugin -n kube-system\n"
    assert simulator_stopped(text, Invocation("p.yaml", (), None, "/s")) == ""


def test_a_failed_apply_run_says_whether_it_changed_the_cluster_and_how_to_undo_it(tmp_path: Path) -> None:
    """``stopped at preflight`` said nothing of the cluster, so an operator whose ``--apply`` run failed could not
    tell whether half-made changes were waiting (walkthrough, stop 52). From the record's ``changes``, which
    journal every call that changes the cluster, failed or not: none, or how many, where to see them and the
    rollback of this record. A plan and a passed run get neither line."""
    record = tmp_path / "records" / "20261207T130000Z-sim-gpu-abcdef12"
    record.mkdir(parents=True)
    records.seal(record, {"apply": True, "steps": [], "params_file": "p.yaml", "overrides": []}, secrets=[])
    steps = [("preflight", "ok", "preflight: ok"), ("config-patch", "changed", "x"), ("image", "failed", "y")]
    invocation = Invocation("p.yaml", (), str(tmp_path / "records"), None, apply=True)

    def said(changes: int, *, apply: bool = True, failed: str | None = "image") -> str:
        outcome = _outcome(*steps, failed=failed)
        outcome.record, outcome.changes, outcome.apply = record, changes, apply
        return report(outcome, invocation)

    place = f"--records {tmp_path / 'records'}"
    assert (
        f"before it stopped, this run made 5 calls that change the cluster (runbook records show {record.name} "
        f"{place} lists them); to undo them instead of going on (plan first, then --apply): runbook rollback -p "
        f"p.yaml {place} --from {record.name}\n"
    ) in said(5)
    assert "nothing was changed on the cluster: this run made no call that changes it\n" in said(0)
    assert "1 call that changes" in said(1)
    # a refused upgrade changed nothing: counted apart from the others (review, stop 52)
    failed = record.parent / "20261207T130100Z-sim-gpu-abcdef13"
    failed.mkdir()
    upgrade = {"argv": ["talosctl", "-n", "10.5.0.12", "upgrade"], "changes_cluster": True, "exit_code": 1}
    records.seal(
        failed, {"apply": True, "steps": [], "changes": [upgrade, {**upgrade, "exit_code": 0}]}, secrets=[]
    )
    record = failed
    assert (
        "this run made 2 calls that change the cluster (1 of them failed and may have changed nothing; "
        in said(2)
    )
    for quiet in (said(5, apply=False), said(5, failed=None), said(0, apply=False)):
        assert "nothing was changed" not in quiet and "before it stopped" not in quiet


def test_a_printed_helm_command_is_the_run_s_own_helm_and_kubeconfig() -> None:
    """The rollback's plan and summary printed ``helm uninstall gpu-operator -n gpu-operator …`` beside talosctl
    lines with their ``--talosconfig``: pasted, it acted on the shell's default context, perhaps another cluster
    (operator walkthrough, stop 52). Prose such as "helm release" and a command already given one stay."""
    from runbook_lib.steps.fixes import helm_as_run

    own = helm_as_run("/s/helm", "/s/kube config")
    assert own("helm uninstall x -n y --wait; helm status x -n y") == (
        "/s/helm --kubeconfig '/s/kube config' uninstall x -n y --wait; "
        "/s/helm --kubeconfig '/s/kube config' status x -n y"
    )
    assert own("the helm release x") == "the helm release x"
    assert own(own("helm history x")) == own("helm history x"), "applied twice, prefixed once"
    assert helm_as_run("helm", None)("helm list -A") == "helm list -A"
    # the chart listing a chart_version fix gives (walkthrough, stop 54: a bare helm, not found in that shell)
    assert own("list them with: helm search repo nvdp/nvidia-device-plugin --versions") == (
        "list them with: /s/helm --kubeconfig '/s/kube config' search repo nvdp/nvidia-device-plugin --versions"
    )


def test_a_plan_names_what_the_kubernetes_step_will_install_though_it_waits_for_apply() -> None:
    """A first plan leaves the Kubernetes step out (it plans once the nodes are changed) and said only "waits
    for apply": no chart, version or namespace, so a chart pinned newer than the release's default went
    unnoticed (operator walkthrough, stop 53)."""
    from runbook_lib.model.params import load_params
    from runbook_lib.notebook.runner import _waits
    from runbook_lib.notebook.steps import STEPS

    params = load_params(Path(__file__).resolve().parents[1] / "params" / "simulated.yaml")
    by_name = {s.name: s for s in STEPS}
    helm = params.device_plugin
    assert _waits(by_name["kubernetes"], params) == (
        "waits for apply; it will then run helm upgrade --install nvidia-device-plugin "
        f"nvdp/nvidia-device-plugin --version {helm.chart_version} -n kube-system"
    )
    assert _waits(by_name["cuda-test"], params) == "waits for apply"


def test_an_interrupted_rollback_says_which_nodes_it_had_taken_back(tmp_path: Path) -> None:
    """Operator walkthrough (stop 53): Ctrl-C during an --apply rollback printed only the command that goes on,
    not which nodes were back. From the sealed record: the calls that finished before the interrupt, by node, and
    the ones it cut short."""
    from runbook_lib.cli.run_report import after_rollback_interrupt
    from runbook_lib.notebook.interrupts import IN_FLIGHT

    record = tmp_path / "records" / "20261207T200000Z-sim-gpu-abcdef12"
    record.mkdir(parents=True)
    nodes = [{"name": f"gpu-worker-{i}", "address": f"10.5.0.1{i}"} for i in (1, 2, 3)]
    image = "factory.talos.dev/metal-installer/376567988ad3:v1.12.0"

    def upgrade(address: str, **more: Any) -> dict[str, Any]:
        return {"argv": ["talosctl", "-n", address, "upgrade", "--image", image], "exit_code": 0, **more}

    changes = [
        upgrade("10.5.0.11"),
        upgrade("10.5.0.12"),
        {"argv": ["helm", "-n", "kube-system", "uninstall", "nvidia-device-plugin"], "exit_code": 0},
        {
            "argv": ["talosctl", "-n", "10.5.0.11,10.5.0.12", "patch", "mc", "--patch", "@p.yaml"],
            "exit_code": 1,
        },
        upgrade("10.5.0.13", exit_code=None, interrupt=IN_FLIGHT),
    ]
    data = {"apply": True, "params": {"nodes": nodes}, "changes": changes, "steps": []}
    records.seal(record, data, secrets=[])
    said = after_rollback_interrupt(record, Invocation("p.yaml", (), None, None, apply=True))
    assert said == (
        "done before the interrupt:\n"
        "  gpu-worker-1: talosctl upgrade, done\n"
        "  gpu-worker-2: talosctl upgrade, done\n"
        "  gpu-worker-1, gpu-worker-2: talosctl patch, exit 1: it may have changed some of them, or none\n"
        "cut short by the interrupt (the plan of the rollback below shows where these nodes are now):\n"
        "  gpu-worker-3: talosctl upgrade, in flight: it may have reached the node\n"
    ), said
    assert after_rollback_interrupt(None, Invocation("p.yaml")) == ""
