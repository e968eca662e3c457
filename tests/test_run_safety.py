"""``runbook run`` safety: no random crash, nothing applied without approval on this command line, no
crash on a failing version probe, bad arguments refused before anything starts, concurrent runs locked.

Issue 18; the attack report /work/shared/docs/attack-2026-12-01.md (F1, F2, F3, F8, F12) gives the commands.
"""

from __future__ import annotations

import getpass
import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from runbook_lib.cli import cmd_run, main
from runbook_lib.clients.kube import Kube
from runbook_lib.clients.talosctl import Talosctl
from runbook_lib.errors import PermanentError
from runbook_lib.model.params import Params, validate
from runbook_lib.notebook import lock, records, runner
from runbook_lib.sim import cluster as sim_cluster

REPO = Path(__file__).resolve().parents[1]
PARAMS = str(REPO / "params" / "simulated.yaml")

# ---------------------------------------------------------------------------------------------------------
# F1: the import race between the main thread and the run's worker threads

#: Runs ``runbook run`` in a fresh interpreter and prints, as JSON, every module that a thread other than
#: the main thread imported for the first time.  Two threads importing the same package at once is what
#: handed one of them a partially initialised ``requests.utils`` (CPython's import deadlock avoidance).
_TRACE_THREAD_IMPORTS = textwrap.dedent(
    """
    import importlib.abc, json, sys, threading

    off_main = []

    class Tracer(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name not in sys.modules and threading.current_thread() is not threading.main_thread():
                off_main.append([threading.current_thread().name, name])
            return None

    sys.meta_path.insert(0, Tracer())
    from runbook_lib.cli import main

    code = main(sys.argv[1:])
    print(json.dumps({"exit": code, "off_main": off_main}))
    """
)


@pytest.mark.slow
def test_run_worker_threads_import_nothing_so_no_import_race_is_possible(tmp_path: Path) -> None:
    """F1: ~1 run in 4 died with ``ImportError: cannot import name 'parse_dict_header' from partially
    initialized module 'requests.utils'``: worker threads imported requests (the Kubernetes client) while the
    main thread imported papermill.  Timing-dependent, so the test checks the cause, deterministically: every
    module a worker thread needs is imported on the main thread before (a multi-step run: kernels started
    ahead, stopped, HTML copies, version reads)."""
    argv = ["run", "-p", PARAMS, "--set", "simulation.scenario=gpu-ready", "--no-progress"]
    argv += ["--records", str(tmp_path / "records"), "--state", str(tmp_path / "sim")]
    proc = subprocess.run(
        [sys.executable, "-c", _TRACE_THREAD_IMPORTS, *argv],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.splitlines()[-1])
    assert report["exit"] == 0, proc.stdout
    assert report["off_main"] == [], report["off_main"][:40]


# ---------------------------------------------------------------------------------------------------------
# F3: `--from` resumes with the parameters of the latest record, but never with its approval


def _run(tmp_path: Path, *args: str) -> int:
    return main(
        [
            "run",
            "--records",
            str(tmp_path / "records"),
            "--state",
            str(tmp_path / "sim"),
            "--no-progress",
            *args,
        ]
    )


def _latest(tmp_path: Path) -> dict[str, Any]:
    return records.load_record(records.resolve(tmp_path / "records", None))


@pytest.mark.slow
def test_resume_without_apply_only_plans_even_after_an_applied_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """F3: after ``run --apply``, a bare ``run --from config-patch`` (the README's resume) patched every node,
    because the latest record's parameters hold ``apply: true``."""
    assert _run(tmp_path, "-p", PARAMS, "--apply", "--steps", "preflight") == 0
    assert _latest(tmp_path)["apply"] is True
    assert _run(tmp_path, "--from", "config-patch", "--steps", "config-patch") == 0
    resumed = _latest(tmp_path)
    assert resumed["apply"] is False and resumed["params"]["apply"] is False
    assert resumed["changes"] == [] and resumed["steps"][0]["status"] == "planned"
    assert "--apply" in capsys.readouterr().err  # says how to apply


def test_an_applying_run_of_some_steps_runs_preflight_first_and_a_plan_or_a_rollback_does_not() -> None:
    def names(steps: list[str] | None, from_step: str | None = None, *, apply: bool) -> list[str]:
        return [s.name for s in runner.with_preflight(runner.select_steps(steps, from_step), apply=apply)]

    assert names(["config-patch"], apply=True) == ["preflight", "config-patch"]
    assert names(None, "image", apply=True) == ["preflight", "image", "verify", "kubernetes", "cuda-test"]
    assert names(["preflight", "image"], apply=True) == ["preflight", "image"]  # not twice
    assert names(["config-patch"], apply=False) == ["config-patch"]  # a plan changes nothing
    assert names(["verify"], apply=True) == ["verify"]  # nothing it runs changes the cluster
    # the Kubernetes layer and the CUDA test need no Talos node checks: a kubeconfig-only machine runs them (review)
    assert names(None, "verify", apply=True) == ["verify", "kubernetes", "cuda-test"]
    assert names(["cuda-test"], apply=True) == ["cuda-test"]
    assert names(["rollback"], apply=True) == ["rollback"]  # its plan asks for its own writes


def test_from_and_steps_that_select_no_step_are_an_error_naming_both(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Attack re-run (7 Dec 2026): ``runbook run --from verify --steps preflight`` ended in an IndexError
    traceback (exit 1); it is a usage error (exit 2) before anything starts, naming both options."""
    with pytest.raises(PermanentError, match=r"--from verify and --steps preflight select no step"):
        runner.select_steps(["preflight"], "verify")
    assert main(["run", "-p", PARAMS, "--from", "verify", "--steps", "preflight"]) == 2
    err = capsys.readouterr().err
    assert "select no step" in err and "Traceback" not in err, err


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (
            ["run", "--steps", "preflight", "--steps", "image"],
            "--steps given twice: give it once (several steps",
        ),
        (["run", "-p", PARAMS, "-p", "params/example-cluster.yaml"], "-p/--params given twice"),
        (["rollback", "--from", "a", "--records", "r1", "--records", "r2"], "--records given twice"),
    ],
)
def test_a_single_value_option_given_twice_is_a_usage_error(
    argv: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Attack re-run (stop 49): ``--steps preflight --steps image`` ran the image step alone (the last won)."""
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert named in capsys.readouterr().err


def test_repeatable_options_still_repeat(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["params", "check", PARAMS, "--set", "rollout_concurrency=2", "--set", "rollout.canary=1"]
    assert main(argv) == 0, capsys.readouterr().err


@pytest.mark.slow
def test_an_applying_run_without_preflight_stops_at_its_failure_before_any_change(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--steps config-patch --apply`` patched the nodes with none of preflight's checks, and said nothing of
    it (operator walkthrough, stop 44): here the last worker does not answer, which preflight fails before any
    change (a full run stops there too), where the config patch went ahead on the other nodes."""
    sets = ["--set", "simulation.scenario=unreachable-node"]
    assert _run(tmp_path, "-p", PARAMS, *sets, "--steps", "config-patch", "--apply") == 1
    record = _latest(tmp_path)
    assert [s["name"] for s in record["steps"]] == ["preflight"], record["steps"]
    assert record["changes"] == []
    out = capsys.readouterr().out
    assert "stopped at preflight" in out
    # its fix re-runs this command, not a plan-only preflight (walkthrough)
    assert (
        f"re-run: runbook run -p {PARAMS} --set simulation.scenario=unreachable-node --steps config-patch"
        in out
    )
    assert "--steps preflight" not in out, out
    # the run stopped the simulator it started: its talosctl fix needs it up again (walkthrough, stop 48)
    state = str(tmp_path / "sim")
    up = f"runbook sim up --keep --state {state}"
    assert "the simulated cluster this run used is stopped" in out and f"`{up}`" in out, out
    assert main(up.split()[1:]) == 0
    main(["sim", "down", "--state", state])


# ---------------------------------------------------------------------------------------------------------
# F2: a version probe that fails in an unexpected way is recorded, generically, and never crashes the run

TOKEN = "MARKERNLTOKENabcdefghij0123456789"


def _cluster_params(tmp_path: Path, token_line: str, server: str) -> Params:
    """Target ``cluster`` with a kubeconfig whose token is written as ``token_line``; the tools do not exist
    (their probes fail the ordinary way)."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        textwrap.dedent(
            f"""\
            apiVersion: v1
            kind: Config
            clusters: [{{name: c, cluster: {{server: "{server}"}}}}]
            users: [{{name: u, user: {{{token_line}}}}}]
            contexts: [{{name: x, context: {{cluster: c, user: u}}}}]
            current-context: x
            """
        )
    )
    data = yaml.safe_load(Path(PARAMS).read_text())
    missing = str(tmp_path / "missing-tool")
    data.update(target="cluster", kubeconfig=str(kubeconfig), tools={"talosctl": missing, "helm": missing})
    return validate(data, source="test")


#: A token with a line break inside: no HTTP request may carry it (its ends are trimmed, as kubectl trims a
#: tokenFile's). Its tail is what must never be printed.
BROKEN_TOKEN_LINE = f'token: "{TOKEN[:13]}\\n{TOKEN[13:]}"'


def test_a_token_with_a_line_break_is_a_recorded_probe_error_without_the_token(tmp_path: Path) -> None:
    """F2: ``token: |`` (or a pasted token) leaves a newline in the bearer token; the Kubernetes client then
    raises ``ValueError: Invalid header value b'Bearer …\\n'`` (http.client's header check), which escaped
    ``collect_versions`` and left the record unsealed.  Its text quotes the token, so it is not stored. A
    newline at its end is now trimmed (as kubectl trims a tokenFile); one inside is refused, naming the file."""
    with socket.create_server(("127.0.0.1", 0)) as api:  # connections are accepted by the kernel's backlog
        server = f"http://127.0.0.1:{api.getsockname()[1]}"
        params = _cluster_params(tmp_path, BROKEN_TOKEN_LINE, server)
        versions = runner.collect_versions(params)
    error = versions["kubernetes_error"]
    assert "the user's token (token or tokenFile) contains a line break" in error  # before: ValueError
    assert TOKEN[13:] not in json.dumps(versions)
    assert "talosctl_error" in versions and "helm_error" in versions  # the other probes still reported


def test_a_token_the_kubernetes_client_quotes_in_an_error_is_not_printed_by_runbook_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The record was scrubbed of the kubeconfig's token, but ``runbook run``'s report was built from the
    steps' results before the seal: a token with a newline reached the terminal twice, in the step's line
    and in ``stopped at cuda-test: Invalid header value b'Bearer …\\n'`` (found on 6 Dec 2026)."""
    talosctl = tmp_path / "talosctl"
    talosctl.write_text("#!/bin/sh\necho 'error: connection refused' >&2\nexit 1\n")
    talosctl.chmod(0o755)
    with socket.create_server(("127.0.0.1", 0)) as api:
        params = _cluster_params(tmp_path, BROKEN_TOKEN_LINE, f"http://127.0.0.1:{api.getsockname()[1]}")
        data = params.public_dict() | {"tools": {"talosctl": str(talosctl)}}
        params_file = tmp_path / "params.yaml"
        params_file.write_text(yaml.safe_dump(data))
        args = ["run", "-p", str(params_file), "--steps", "cuda-test", "--apply", "--no-progress"]
        code = main([*args, "--records", str(tmp_path / "records")])
    out, err = capsys.readouterr()
    assert code == 1, out + err
    assert "stopped at cuda-test" in out
    assert TOKEN[13:] not in out + err
    assert f"kubeconfig {tmp_path / 'kubeconfig'}: the user's token (token or tokenFile) contains" in out
    assert not [
        p
        for p in (tmp_path / "records").rglob("*")
        if p.is_file() and TOKEN[13:] in p.read_text(errors="replace")
    ]


@pytest.mark.parametrize("form", ["token", "tokenFile"])
def test_a_token_ending_in_a_newline_is_sent_trimmed_as_kubectl_sends_a_token_file(
    tmp_path: Path, form: str
) -> None:
    """``echo "$TOKEN" > token`` or a ``token: |`` block ends the token with a newline: kubectl trims a tokenFile's
    content (client-go transport/token_source.go), and the official Python client sends it as it is, which
    http.client refuses. Both forms are sent trimmed, also after the client writes the token again before a
    request (kube_config.py ``refresh_api_key_hook``)."""
    (tmp_path / "token").write_text(f"{TOKEN}\n")
    line = f'token: "{TOKEN}\\n"' if form == "token" else f'tokenFile: "{tmp_path / "token"}"'
    params = _cluster_params(tmp_path, line, "http://127.0.0.1:1")
    kube = Kube.from_kubeconfig(params.kubeconfig)
    assert kube.api.configuration.get_api_key_with_prefix("BearerToken") == f"Bearer {TOKEN}"


# ---------------------------------------------------------------------------------------------------------
# F12: a fleet whose node list is longer than one argument may be

#: Prints what ``talosctl version`` prints (siderolabs/talos v1.12.0 cmd/talosctl/cmd/talos/version.go: a
#: ``Client:`` block, then one ``Server:`` block with ``NODE:`` and ``Tag:`` per node) for the ``-n`` list.
_FAKE_TALOSCTL = """#!/bin/sh
while [ "$1" != "-n" ]; do shift; done
printf 'Client:\\n\\tTag:         v1.12.7\\n'
echo "$2" | tr ',' '\\n' | while read -r node; do
    printf 'Server:\\n\\tNODE:        %s\\n\\tTag:         v1.12.7\\n' "$node"
done
"""


def test_talosctl_version_of_twenty_thousand_nodes_is_not_one_oversized_argument(tmp_path: Path) -> None:
    """F12: 20,000 nodes made ``-n a,b,…`` ~280 KB, over Linux's 128 KiB limit for one argument
    (MAX_ARG_STRLEN), so ``talosctl version`` died with ``OSError: [Errno 7] Argument list too long`` in
    ``collect_versions``, after the steps ran, leaving the record unsealed."""
    fake = tmp_path / "talosctl"
    fake.write_text(_FAKE_TALOSCTL)
    fake.chmod(0o755)
    nodes = [f"10.{i // 65536}.{i // 256 % 256}.{i % 256}" for i in range(20_000)]
    assert len(",".join(nodes)) > 128 * 1024
    client, servers, errors = Talosctl(str(fake)).version(nodes)
    assert client == "v1.12.7" and errors == {}
    assert servers == dict.fromkeys(nodes, "v1.12.7")


# ---------------------------------------------------------------------------------------------------------
# F12 (CLI rows): bad arguments are exit 2 with a clear message, before the simulator starts


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--steps", "preflight,verfy"], "unknown step(s) verfy in --steps (did you mean 'verify'?)"),
        (["--from", "verfy"], "unknown step verfy in --from (did you mean 'verify'?)"),
        (["--from", "config"], "did you mean 'config-patch'?"),
        (["--records", "/dev/null"], "--records /dev/null: not a directory"),
        (["--records", "/proc/self"], "--records /proc/self: cannot create a record there"),
        (["--records", "/dev/null/records"], "--records /dev/null/records: /dev/null is not a directory"),
    ],
)
def test_bad_run_arguments_are_refused_before_the_simulator_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], expected: str
) -> None:
    """F12: ``--records /dev/null`` and ``/proc/self`` died with FileExistsError/FileNotFoundError after the
    simulator started; ``--steps …,verfy`` had no "did you mean" and ``--from verfy`` was argparse's usage."""
    argv = ["run", "-p", PARAMS, "--state", str(tmp_path / "sim"), "--no-progress", *args]
    if "--records" not in args:
        argv += ["--records", str(tmp_path / "records")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert expected in err
    assert not (tmp_path / "sim").exists() and not (tmp_path / "records").exists()


# ---------------------------------------------------------------------------------------------------------
# F8: concurrent runs: one applying run per records folder and per cluster; the simulator outlives a run
# that another run still uses

#: Every talosctl call pays this per node, so a run is still in its first step when the next one starts.
SLOW = ["--set", "simulation.latency_ms=1500"]


def _start(records_dir: Path, state: Path, *args: str) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "runbook_lib", "run", "-p", PARAMS, "--no-progress", *SLOW, *args]
    argv += ["--records", str(records_dir), "--state", str(state)]
    return subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_until_running(proc: subprocess.Popen[str], records_dir: Path) -> None:
    """Until ``proc`` is in its steps: its record directory exists once its cluster is up."""
    deadline = time.monotonic() + 120
    while not (records_dir.is_dir() and any(p.is_dir() for p in records_dir.iterdir())):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the run did not reach its steps"
        time.sleep(0.1)


def _finish(proc: subprocess.Popen[str]) -> tuple[int, str]:
    out, err = proc.communicate(timeout=300)
    return proc.returncode, out + err


@pytest.mark.slow
def test_a_second_applying_run_on_the_same_records_or_cluster_stops_and_names_the_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """F8 (C2, C3): two ``--apply`` runs on one simulator both upgraded and patched every node."""
    state = tmp_path / "sim"
    first = _start(tmp_path / "records", state, "--apply", "--steps", "preflight")
    try:
        _wait_until_running(first, tmp_path / "records")
        for records_dir, sim, what in (
            (tmp_path / "records", tmp_path / "sim2", "records folder"),  # another cluster, same records
            (tmp_path / "other", state, "simulated cluster"),  # the same cluster, other records
        ):
            argv = ["run", "-p", PARAMS, "--apply", "--steps", "preflight", "--no-progress", *SLOW]
            assert main([*argv, "--records", str(records_dir), "--state", str(sim)]) == 2
            err = capsys.readouterr().err
            assert what in err and f"pid {first.pid}," in err and "nothing was started" in err
        assert not (tmp_path / "other").exists() and not (tmp_path / "sim2").exists()
        # a plan-only run only reads: it may run alongside
        assert (
            main(
                [
                    "run",
                    "-p",
                    PARAMS,
                    "--steps",
                    "preflight",
                    "--no-progress",
                    "--state",
                    str(state),
                    "--records",
                    str(tmp_path / "plan"),
                ]
            )
            == 0
        )
    finally:
        code, output = _finish(first)
    assert code == 0, output


@pytest.mark.slow
def test_a_run_that_ends_first_leaves_the_simulator_to_the_run_still_using_it(tmp_path: Path) -> None:
    """F8 (C6): the run that started the simulator stopped it when it ended, and the concurrent run failed
    with "Image Factory … did not answer".  Now the last run out stops it."""
    state = tmp_path / "sim"
    starter = _start(tmp_path / "a", state, "--steps", "preflight")
    try:
        _wait_until_running(starter, tmp_path / "a")
        joiner = _start(tmp_path / "b", state, "--steps", "preflight,image")
        try:
            _wait_until_running(joiner, tmp_path / "b")
            assert _finish(starter)[0] == 0
            code, output = _finish(joiner)
            assert code == 0, output
        finally:
            joiner.kill()
    finally:
        starter.kill()
    assert sim_cluster.daemon_pid(state) is None  # stopped by the last run out


def _take(path: Path) -> None:
    with lock.exclusive(path, "the cluster 'a'"):
        pass


def test_a_held_lock_names_its_holder_but_not_set_values(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The refusal says who to wait for: user, host, pid, start time and command; a ``--set`` value may be
    a secret, so only its key is shown."""
    argv = ["runbook", "run", "--apply", "--set", "registry_token=s3cr3t-value", "--set=b=s3cr3t-2"]
    monkeypatch.setattr(sys, "argv", argv)
    with lock.exclusive(tmp_path / "x.lock", "the cluster 'a'"), pytest.raises(lock.Busy) as info:
        _take(tmp_path / "x.lock")
    text = str(info.value)
    assert f"{getpass.getuser()}@{socket.gethostname()}, pid {os.getpid()}, since 20" in text
    assert "runbook run --apply --set 'registry_token=…' '--set=b=…'" in text and "s3cr3t" not in text
    _take(tmp_path / "x.lock")  # released with the block


def test_a_killed_runs_lease_is_not_counted_and_is_removed(tmp_path: Path) -> None:
    leases = tmp_path / "leases"
    leases.mkdir()
    (leases / "4242-dead.lease").write_text("{}")  # what a SIGKILLed run leaves: the file, no lock
    with lock.lease(leases) as mine, lock.lease(leases):
        assert len(lock.live_leases(leases, own=mine)) == 1  # the other live one, not mine, not the dead
    assert not (leases / "4242-dead.lease").exists()
    assert lock.live_leases(leases) == [] and not leases.exists()  # the directory goes with its last lease


def test_a_run_needing_other_simulator_parameters_leaves_a_simulator_in_use_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run whose parameters do not match the simulator's state recreates it: never under another run
    that uses it (here a lease held as that run would hold it)."""
    state = tmp_path / "sim"
    with lock.lease(cmd_run.SimLeases.of(state.resolve()).leases):
        assert _run(tmp_path, "-p", PARAMS, "--steps", "preflight") == 2
    assert "used by another run with other parameters" in capsys.readouterr().err
    assert not state.exists() and not (tmp_path / "records").exists()


def test_a_run_for_other_parameters_leaves_a_simulator_sim_up_started_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by an operator walkthrough: ``runbook sim up -p params/simulated.yaml --scenario upgrade-fails``, then
    ``runbook run -p params/simulated.yaml --apply`` (scenario ``fresh``) wiped that cluster, made a fresh one,
    passed with no fault, and stopped it; ``runbook rollback`` did the same to the state it was to undo. Here
    the daemon ``sim up`` left running is this process's pid (no run's mark names it)."""
    state = (tmp_path / "sim").resolve()
    params = validate(yaml.safe_load(Path(PARAMS).read_text()), source=PARAMS)
    spec = sim_cluster.spec_from_params(params)
    sim_cluster.create(state, sim_cluster.ClusterSpec(**{**spec.__dict__, "scenario": "upgrade-fails"}))
    made = (state / "cluster.json").read_bytes()
    monkeypatch.setattr(sim_cluster, "daemon_pid", lambda _state: os.getpid())

    assert _run(tmp_path, "-p", PARAMS, "--steps", "preflight") == 2
    err = capsys.readouterr().err
    assert (
        "started by `runbook sim up` for other parameters (scenario upgrade-fails, this run's fresh)" in err
    )
    assert "(--set simulation.scenario=upgrade-fails)" in err, err  # the value, not a placeholder
    assert f"`runbook sim down --state {state}`" in err, err  # a bare one stops .sim/default (walkthrough)
    assert (state / "cluster.json").read_bytes() == made, "nothing was changed"
    assert not (tmp_path / "records").exists()


def test_the_hint_for_a_simulator_made_for_other_nodes_gives_the_set_that_names_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hint named the scenario and the release only: refused for other GPU nodes (`runbook sim up --nodes 2`,
    then a run of params/simulated.yaml), the operator had no command to follow (walkthrough, 6 Dec 2026)."""
    state = (tmp_path / "sim").resolve()
    params = validate(yaml.safe_load(Path(PARAMS).read_text()), source=PARAMS)
    spec = sim_cluster.spec_from_params(params)
    two = (("talos-worker-1", "10.5.0.3"), ("talos-worker-2", "10.5.0.4"))
    sim_cluster.create(state, sim_cluster.ClusterSpec(**{**spec.__dict__, "workers": 2, "worker_nodes": two}))
    monkeypatch.setattr(sim_cluster, "daemon_pid", lambda _state: os.getpid())
    assert _run(tmp_path, "-p", PARAMS, "--steps", "preflight") == 2
    err = capsys.readouterr().err
    given = (
        "--set 'nodes=[{name: talos-worker-1, address: 10.5.0.3}, {name: talos-worker-2, address: 10.5.0.4}]'"
    )
    assert f"({given})" in err, err
    monkeypatch.setattr(sim_cluster, "daemon_pid", lambda _state: None)  # the run may start it: as made for
    try:
        assert (
            _run(tmp_path, "-p", PARAMS, "--steps", "preflight", "--set", given.split(" ", 1)[1].strip("'"))
            == 0
        )
    finally:
        # the run could not see the simulator it started (daemon_pid is patched), so it left it running: its
        # control plane, kwok and simnode took CPU from the rest of the suite until the machine was reset
        monkeypatch.undo()
        main(["sim", "down", "--state", str(state)])


def test_a_plan_for_other_parameters_does_not_replace_the_simulated_cluster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by an operator walkthrough: after a 1.12 ``--apply`` run, a plan-only ``runbook run --set
    talos_version=v1.13.2`` on the same state re-created the cluster (what was applied and the state its rollback
    was to undo were gone) and ended "plan only: nothing was changed on the cluster"."""
    state = (tmp_path / "sim").resolve()
    params = validate(yaml.safe_load(Path(PARAMS).read_text()), source=PARAMS)
    sim_cluster.create(state, sim_cluster.spec_from_params(params))
    made = (state / "cluster.json").read_bytes()

    assert _run(tmp_path, "-p", PARAMS, "--steps", "preflight", "--set", "talos_version=v1.13.2") == 2
    err = capsys.readouterr().err
    assert "was made for other parameters (Talos v1.12.7, this run's v1.13.2); a plan would replace it" in err
    assert "--apply to replace it" in err and "--state DIR" in err
    assert (state / "cluster.json").read_bytes() == made, "nothing was changed"
    assert not (tmp_path / "records").exists()


@pytest.mark.slow
def test_resume_passes_over_a_newer_rollback_record_to_the_last_runs_parameters(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by an operator walkthrough: ``runbook run --from verify`` after a rollback resumed with the
    rollback's parameters (the newest record), not those of the run the operator means."""
    assert _run(tmp_path, "-p", PARAMS, "--steps", "preflight", "--set", "rollout_concurrency=3") == 0
    run = _latest(tmp_path)["record"]
    rollback = ["rollback", "--records", str(tmp_path / "records"), "--state", str(tmp_path / "sim")]
    assert main([*rollback, "-p", PARAMS, "--from", run]) == 0
    assert any(s.get("name") == "rollback" for s in _latest(tmp_path)["steps"])
    capsys.readouterr()

    assert _run(tmp_path, "--from", "preflight", "--steps", "preflight") == 0
    err = capsys.readouterr().err
    assert f"resuming with the parameters of {run}" in err and "passing over the rollback record" in err, err
    assert _latest(tmp_path)["params"]["rollout_concurrency"] == 3

    # attack re-run (stop 49): a --set given with --from and no -p was silently outweighed by the record's value
    assert (
        _run(tmp_path, "--from", "preflight", "--steps", "preflight", "--set", "rollout_concurrency=4") == 0
    )
    assert _latest(tmp_path)["params"]["rollout_concurrency"] == 4
    assert _latest(tmp_path)["overrides"] == ["rollout_concurrency=4"]


@pytest.mark.slow
def test_a_run_logged_to_a_file_has_no_progress_bar(tmp_path: Path) -> None:
    """Found by an operator walkthrough: `make demo` redirected to a log mixed tqdm's carriage-return bar into
    the live lines. stderr here is a file, as in a CI log; the bar is left out, the step lines stay."""
    log = tmp_path / "run.log"
    with log.open("w") as err:
        where = ["--records", str(tmp_path / "records"), "--state", str(tmp_path / "sim")]
        proc = subprocess.run(
            [sys.executable, "-m", "runbook_lib", "run", "-p", PARAMS, "--steps", "preflight", *where],
            check=False,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            cwd=REPO,
            timeout=600,
        )
    assert proc.returncode == 0, proc.stdout + log.read_text()
    assert "step/s" not in log.read_text() and "\r" not in log.read_text(), log.read_text()
    assert "preflight     ok" in proc.stdout


@pytest.mark.slow
def test_resume_after_a_rollback_stays_on_the_rollbacks_cluster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Review of 3e79e9a: one records folder, a run on this cluster, then a run on another, then a rollback
    here; passing over the rollback resumed the other cluster's newer run."""
    assert _run(tmp_path, "-p", PARAMS, "--steps", "preflight") == 0
    here = _latest(tmp_path)["record"]
    other = [
        "run",
        "--records",
        str(tmp_path / "records"),
        "--state",
        str(tmp_path / "sim2"),
        "--no-progress",
    ]
    assert main([*other, "-p", PARAMS, "--set", "cluster=staging", "--steps", "preflight"]) == 0
    assert _latest(tmp_path)["cluster"] == "staging"
    rollback = ["rollback", "--records", str(tmp_path / "records"), "--state", str(tmp_path / "sim")]
    assert main([*rollback, "-p", PARAMS, "--from", here]) == 0
    capsys.readouterr()

    assert _run(tmp_path, "--from", "preflight", "--steps", "preflight") == 0
    assert f"resuming with the parameters of {here}" in capsys.readouterr().err
    assert _latest(tmp_path)["cluster"] != "staging"


def test_a_simulator_made_for_other_nodes_is_refused_naming_the_node_that_differs(tmp_path: Path) -> None:
    """The refusal said "other GPU nodes (names or addresses) than this run's", leaving a person to find the
    typo in the list (operator walkthrough, stop 53). It names the node on each side."""
    state = (tmp_path / "sim").resolve()
    params = validate(yaml.safe_load(Path(PARAMS).read_text()), source=PARAMS)
    sim_cluster.create(state, sim_cluster.spec_from_params(params))
    first = params.nodes[0]
    typo = validate(
        {
            **yaml.safe_load(Path(PARAMS).read_text()),
            "nodes": [
                {"name": first.name, "address": "10.5.0.111"},
                *[n.model_dump() for n in params.nodes[1:]],
            ],
        },
        source=PARAMS,
    )
    (differs,) = sim_cluster.state_differs(state, typo, params.simulation.scenario) or [""]
    assert differs == (
        f"this run's {first.name} at 10.5.0.111 not among its GPU nodes; its {first.name} at {first.address} "
        "not among this run's"
    )
    assert sim_cluster.state_differs(state, params, params.simulation.scenario) == []


def test_a_run_the_parameter_file_approves_says_so_without_apply(tmp_path: Path) -> None:
    """Operator walkthrough (stop 54): ``apply: true`` in a parameter file approves ``runbook run`` as --apply
    does, and a CI plan job running ``runbook run -p FILE`` changed the cluster without a word."""
    approving = tmp_path / "approving.yaml"
    approving.write_text(Path(PARAMS).read_text().replace("\napply: false\n", "\napply: true\n"))
    said = cmd_run._said_without_flag(str(approving), [])
    assert said.startswith(
        f"runbook run: apply: true in {approving} approves this run's changes (no --apply"
    ), said
    assert "--set apply=false" in said
    assert cmd_run._said_without_flag(str(approving), ["apply=false"]) == "", (
        "the last --set of apply decides"
    )
    assert cmd_run._said_without_flag(str(PARAMS), ["apply=true"]).startswith(
        "runbook run: a --set apply=true"
    )
    assert cmd_run._said_without_flag(str(PARAMS), []) == ""
