"""Change records: sealed by a manifest, chained, scrubbed of secrets, and checked by `runbook records verify`."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
import yaml

from runbook_lib.cli import main
from runbook_lib.errors import PermanentError
from runbook_lib.notebook import records

TOKEN = "kube-token-7f3a9c1e5b2d4f6a8c0e"
TALOS_KEY = "LS0tLS1CRUdJTiBFRDI1NTE5IFBSSVZBVEUgS0VZLS0tLS0KTUM0Q0FRQXdCUVlESzJWd0JDSUVJRm9vYmFy"


def make_configs(tmp_path: Path) -> tuple[Path, Path]:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"token": TOKEN}}],
            }
        )
    )
    talosconfig = tmp_path / "talosconfig"
    talosconfig.write_text(
        yaml.safe_dump(
            {
                "context": "c",
                "contexts": {"c": {"endpoints": ["10.5.0.2"], "key": TALOS_KEY, "ca": "Y2EtY2VydC1kYXRh"}},
            }
        )
    )
    return kubeconfig, talosconfig


def write_record(
    root: Path, cluster: str = "sim-gpu", text: str = "executed notebook", run_id: str | None = None
) -> Path:
    path = records.create_record_dir(root, cluster, run_id=run_id)
    (path / "01-preflight.ipynb").write_text(json.dumps({"cells": [{"source": text}]}))
    (path / "html").mkdir()
    (path / "html" / "01-preflight.html").write_text(f"<html>{text}</html>")
    records.seal(
        path, {"cluster": cluster, "outcome": "ok", "steps": [{"name": "preflight", "status": "ok"}]}
    )
    return path


@pytest.fixture
def chain(tmp_path: Path) -> tuple[Path, list[Path]]:
    root = tmp_path / "records"
    paths = [write_record(root, run_id=f"0000000{i}") for i in range(3)]
    return root, paths


def test_intact_chain_verifies_and_links_each_record_to_the_previous_manifest(
    chain: tuple[Path, list[Path]],
) -> None:
    root, paths = chain
    assert records.verify(root) == []
    first, second, _ = (records.load_record(p) for p in paths)
    assert first["previous"] is None
    assert second["previous"]["record"] == paths[0].name
    assert second["previous"]["sha256sums"] == records.sha256_file(paths[0] / records.MANIFEST)
    assert main(["records", "verify", "--dir", str(root)]) == 0


def test_record_names_sort_chronologically_and_name_the_cluster(tmp_path: Path) -> None:
    path = records.create_record_dir(tmp_path, "prod-gpu", run_id="abcdef12")
    assert path.name.endswith("-prod-gpu-abcdef12")
    assert path.name[:8].isdigit() and path.name[8] == "T" and path.name[15] == "Z"


def test_edited_file_is_named(chain: tuple[Path, list[Path]], capsys: pytest.CaptureFixture[str]) -> None:
    root, paths = chain
    (paths[1] / "html" / "01-preflight.html").write_text("<html>all green, honest</html>")
    problems = records.verify(root)
    assert problems == [f"{paths[1].name}: edited file html/01-preflight.html"]
    assert main(["records", "verify", "--dir", str(root)]) != 0
    assert "edited file html/01-preflight.html" in capsys.readouterr().out


def test_removed_file_is_named(chain: tuple[Path, list[Path]]) -> None:
    root, paths = chain
    (paths[0] / "01-preflight.ipynb").unlink()
    assert records.verify(root) == [f"{paths[0].name}: removed file 01-preflight.ipynb"]


def test_inserted_file_is_named(chain: tuple[Path, list[Path]]) -> None:
    root, paths = chain
    (paths[2] / "extra.txt").write_text("slipped in")
    assert records.verify(root) == [f"{paths[2].name}: inserted file extra.txt"]


def test_removed_record_breaks_the_chain(
    chain: tuple[Path, list[Path]], capsys: pytest.CaptureFixture[str]
) -> None:
    root, paths = chain
    shutil.rmtree(paths[1])
    problems = records.verify(root)
    assert any(paths[1].name in p and "removed" in p for p in problems), problems
    assert main(["records", "verify", "--dir", str(root)]) != 0
    assert paths[1].name in capsys.readouterr().out


def test_removed_oldest_record_is_detected(chain: tuple[Path, list[Path]]) -> None:
    root, paths = chain
    shutil.rmtree(paths[0])
    assert any(paths[0].name in p for p in records.verify(root))


def test_rewritten_manifest_of_an_older_record_is_detected(chain: tuple[Path, list[Path]]) -> None:
    """Someone edits a file and regenerates its SHA256SUMS: the next record's chain hash exposes it."""
    root, paths = chain
    (paths[0] / "01-preflight.ipynb").write_text("{}")
    records.write_manifest(paths[0])
    problems = records.verify(root)
    assert problems == [f"{paths[0].name}: {records.MANIFEST} changed after {paths[1].name} was recorded"]


def test_inserted_record_is_detected(chain: tuple[Path, list[Path]]) -> None:
    root, paths = chain
    forged = root / (paths[0].name[:-8] + "ffffffff")
    shutil.copytree(paths[0], forged)
    problems = records.verify(root)
    assert problems and any("inserted record" in p or forged.name in p for p in problems), problems


def test_unsealed_record_is_an_aborted_run_not_a_problem(tmp_path: Path) -> None:
    root = tmp_path / "records"
    path = records.create_record_dir(root, "sim-gpu")
    assert records.verify(root) == []
    assert records.check(root).aborted == [path]


def test_seal_aborted_keeps_a_finished_steps_result_and_survives_a_damaged_one(tmp_path: Path) -> None:
    """The results of the steps an aborted run finished go into its record (rollback reads them); a result
    whose node list is not a list of mappings is left out instead of stopping the seal."""
    root = tmp_path / "records"
    path = records.create_record_dir(root, "sim-gpu")
    (path / "results").mkdir()
    good = {
        "step": "image",
        "nodes": [{"node": "w1", "status": "changed", "data": {"before": {"version": "v1"}}}],
    }
    for number, (step, result) in enumerate([("image", good), ("verify", {"nodes": ["w1"]})], start=1):
        (path / f"0{number}-{step}.ipynb").write_text("{}")
        payload = {"step": step, "status": "changed", "summary": "", "result": result, "journal": []}
        (path / "results" / f"{step}.json").write_text(json.dumps(payload))
    records.seal_aborted(path)
    steps = {s["name"]: s for s in records.load_record(path)["steps"]}
    assert steps["image"]["result"]["node_groups"] == [
        {"nodes": ["w1"], "status": "changed", "data": {"before": {"version": "v1"}}}
    ]
    assert "result" not in steps["verify"]


def test_seal_scrubs_secret_material_from_every_file(tmp_path: Path) -> None:
    kubeconfig, talosconfig = make_configs(tmp_path)
    secrets = records.secret_values(kubeconfig, talosconfig)
    assert TOKEN in secrets and TALOS_KEY in secrets
    root = tmp_path / "records"
    path = records.create_record_dir(root, "sim-gpu")
    (path / "step.ipynb").write_text(f"Authorization: Bearer {TOKEN}\n")
    (path / "out.html").write_text(f"<pre>key: {TALOS_KEY}</pre>")
    records.seal(path, {"cluster": "sim-gpu", "leak": f"token={TOKEN}"}, secrets=secrets)
    for file in path.rglob("*"):
        if file.is_file():
            text = file.read_text()
            assert TOKEN not in text and TALOS_KEY not in text, file
    # the decoded form of a base64 key is secret too
    assert "-----BEGIN ED25519 PRIVATE KEY-----" in secrets
    assert records.REDACTED in (path / "step.ipynb").read_text()
    assert records.verify(root) == []


def test_the_token_a_kubeconfig_keeps_in_a_token_file_is_a_secret_too(tmp_path: Path) -> None:
    """Review of 8521977: ``tokenFile`` (relative to the kubeconfig, as kubectl reads it) was not collected, so a
    record or report quoting that token kept it."""
    (tmp_path / "sa-token").write_text(f"{TOKEN}\n")
    cfg = tmp_path / "kubeconfig"
    cfg.write_text(yaml.safe_dump({"users": [{"name": "u", "user": {"tokenFile": "sa-token"}}]}))
    assert records.secret_values(cfg) == [TOKEN]


def test_short_values_are_not_treated_as_secrets(tmp_path: Path) -> None:
    cfg = tmp_path / "kubeconfig"
    cfg.write_text(yaml.safe_dump({"users": [{"user": {"token": "x"}}]}))
    assert records.secret_values(cfg) == []


def test_git_info_reports_commit_and_dirty_flag() -> None:
    info = records.git_info(Path(__file__).resolve().parents[1])
    if info["commit"] is None:
        pytest.skip(f"not a git checkout: {info.get('note')}")
    assert len(info["commit"]) == 40
    assert isinstance(info["dirty"], bool)


def test_list_and_show(chain: tuple[Path, list[Path]], capsys: pytest.CaptureFixture[str]) -> None:
    root, paths = chain
    assert main(["records", "list", "--dir", str(root)]) == 0
    out = capsys.readouterr().out
    assert all(p.name in out for p in paths)
    assert main(["records", "show", paths[1].name[-8:], "--dir", str(root)]) == 0
    shown = capsys.readouterr().out
    assert paths[1].name in shown and "preflight" in shown
    assert main(["records", "show", "nope", "--dir", str(root)]) == 2


def test_list_tells_apart_two_clusters_of_the_same_name_by_their_nodes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A staging copy of production's parameter file keeps its ``cluster`` name: the list named both runs
    ``sim-gpu`` alike, and rollback refuses the record whose nodes sit at other addresses (walkthrough)."""
    root = tmp_path / "records"
    for run_id, first in (("00000001", "10.5.0.11"), ("00000002", "10.9.0.11")):
        path = records.create_record_dir(root, "sim-gpu", run_id=run_id)
        nodes = [{"name": f"gpu-{i}", "address": first[:-1] + str(i)} for i in (1, 2)]
        records.seal(path, {"cluster": "sim-gpu", "outcome": "ok", "params": {"nodes": nodes}, "steps": []})
    assert main(["records", "list", "--dir", str(root)]) == 0
    out = capsys.readouterr().out
    assert "[2 node(s) from 10.5.0.11]" in out and "[2 node(s) from 10.9.0.11]" in out, out


def test_records_commands_take_the_records_folder_as_runbook_run_names_it(
    chain: tuple[Path, list[Path]], capsys: pytest.CaptureFixture[str]
) -> None:
    """``runbook run --records DIR`` wrote it; ``runbook records show --records DIR`` must read it (it took only
    ``--dir``, exit 2: found by an operator walkthrough)."""
    root, paths = chain
    assert main(["records", "show", "--records", str(root)]) == 0
    assert paths[-1].name in capsys.readouterr().out
    assert main(["records", "verify", "--records", str(root)]) == 0


def test_show_gives_a_failed_steps_diagnosis_without_the_exception_class_and_evenly_indented(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by an operator walkthrough: ``records show`` printed ``error: StepFailed: kubernetes: failed (…)``,
    repeating the step's line with the exception's class, and the diagnosis under it indented less."""
    root = tmp_path / "records"
    path = records.create_record_dir(root, "sim-gpu")
    summary = "kubernetes: failed (1 failed, 2 ok)"
    diagnosis = f"{summary}\n  gpu-worker-3 (10.5.0.13): node not Ready\n    fix: talosctl -n 10.5.0.13 service kubelet"
    steps = [
        {"name": "kubernetes", "status": "failed", "summary": summary,
         "error": {"ename": "StepFailed", "evalue": diagnosis}},
        {"name": "cuda-test", "status": "failed", "error": {"ename": "ValueError", "evalue": "boom"}},
    ]  # fmt: skip
    records.seal(path, {"cluster": "sim-gpu", "outcome": "failed", "steps": steps})
    assert main(["records", "show", "--dir", str(root)]) == 0
    out = capsys.readouterr().out
    assert "StepFailed" not in out and summary not in out, out
    assert re.search(r"^  kubernetes +failed .* s  nodes: 1 failed, 2 ok$", out, re.M), (
        out
    )  # the name said once
    assert (
        "      gpu-worker-3 (10.5.0.13): node not Ready\n        fix: talosctl -n 10.5.0.13 service kubelet"
        in out
    )
    assert "    error: ValueError: boom" in out  # an unexpected exception keeps its class


def test_show_names_each_patch_by_its_content_not_by_a_temporary_file_that_is_gone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by an operator walkthrough: ``records show`` listed ``--patch @/tmp/runbook-patch-…/patch-0.yaml``,
    a file removed when the step ended. The record keeps each patch as its change's ``diff``; identical patches
    (1,000 nodes patched alike) are shown once."""
    root = tmp_path / "records"
    path = records.create_record_dir(root, "sim-gpu")
    modules = "machine:\n  kernel:\n    modules:\n    - name: nvidia\n"
    runtime = "machine:\n  files:\n  - path: /etc/cri/conf.d/20-customization.part\n"

    def patch(node: str, tmp: str, body: str) -> dict[str, object]:
        argv = ["talosctl", "-n", node, "patch", "machineconfig", "--patch", f"@/tmp/{tmp}/patch-0.yaml"]
        return {"step": "config-patch", "argv": argv, "exit_code": 0, "changes_cluster": True, "diff": body}

    changes = [
        patch("10.5.0.11", "a1", modules),
        patch("10.5.0.12", "b2", modules),
        patch("10.5.0.11", "c3", runtime),
    ]
    changes.append(
        {"step": "kubernetes", "summary": "create RuntimeClass nvidia (handler nvidia)", "diff": "{}"}
    )
    records.seal(path, {"cluster": "sim-gpu", "outcome": "changed", "steps": [], "changes": changes})
    assert main(["records", "show", "--dir", str(root)]) == 0
    out = capsys.readouterr().out
    assert not any(f"/tmp/{tmp}/" in out for tmp in ("a1", "b2", "c3")), out
    assert (
        out.count("--patch @patch-1.yaml  (exit 0)") == 2
        and out.count("--patch @patch-2.yaml  (exit 0)") == 1
    )
    assert (
        "patch-1.yaml (the machine-config patch the changes above name):\n    machine:\n      kernel:" in out
    )
    assert out.count("- name: nvidia") == 1 and "  - path: /etc/cri/conf.d/20-customization.part" in out
    assert "[kubernetes] create RuntimeClass nvidia (handler nvidia)" in out


def test_identical_read_commands_fold_into_one_entry_per_step_but_changes_never_do():
    from runbook_lib.notebook.record_content import fold_commands

    reads = [
        {"step": "verify", "argv": ["talosctl", "-n", f"10.0.0.{i}", "read", "/proc/x"], "exit_code": 0}
        for i in range(3)
    ]
    change = {
        "step": "config-patch",
        "argv": ["talosctl", "-n", "10.0.0.1", "patch", "mc"],
        "exit_code": 0,
        "changes_cluster": True,
    }
    failed = {"step": "verify", "argv": ["talosctl", "-n", "10.0.0.9", "read", "/proc/x"], "exit_code": 1}
    folded = fold_commands([*reads, change, failed])
    assert folded[0]["nodes"] == ["10.0.0.0", "10.0.0.1", "10.0.0.2"] and "<nodes>" in folded[0]["argv"]
    assert change in folded and failed in folded and len(folded) == 3


def test_identical_node_outcomes_are_grouped_and_every_node_appears_once():
    from runbook_lib.notebook.record_content import abbreviate_node_lists, group_nodes

    result = {
        "step": "verify",
        "nodes": [
            {"node": "a", "address": "1", "status": "ok", "passed": ["modules"]},
            {"node": "b", "address": "2", "status": "failed", "failed": [{"name": "modules"}]},
            {"node": "c", "address": "3", "status": "ok", "passed": ["modules"]},
        ],
    }
    grouped = group_nodes(result)
    assert "nodes" not in grouped
    assert [g["nodes"] for g in grouped["node_groups"]] == [["a", "c"], ["b"]]
    many = ",".join(f"10.0.0.{i}" for i in range(20))
    read = {"argv": ["talosctl", "-n", many, "get", "extensions"], "exit_code": 0}
    change = {"argv": ["talosctl", "-n", many, "patch", "mc"], "exit_code": 0, "changes_cluster": True}
    short, kept = abbreviate_node_lists([read, change])
    assert short["argv"][2] == "<20 nodes: 10.0.0.0 … 10.0.0.19>" and kept["argv"][2] == many


def test_scrubbing_covers_the_tools_default_config_locations(monkeypatch, tmp_path):
    from runbook_lib.notebook.runner import config_paths

    monkeypatch.setenv("TALOSCONFIG", str(tmp_path / "tc"))
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path / 'a'}:{tmp_path / 'b'}")
    assert config_paths(None, None) == [str(tmp_path / "tc"), str(tmp_path / "a"), str(tmp_path / "b")]
    assert config_paths("/x/talos", "/y/kube") == ["/x/talos", "/y/kube"]


def test_helm_namespace_flag_is_not_folded_as_a_node_list() -> None:
    """F15: helm's ``-n`` is ``--namespace`` (helm/helm pkg/cli/environment.go at commit 00249a3, helm v3, AddFlags:
    ``fs.StringVarP(&s.namespace, "namespace", "n", ...)``); only talosctl's ``-n`` is ``--nodes``
    (/work/shared/reference/talos/talosctl-cli.v1.12.md: ``-n, --nodes strings``)."""
    from runbook_lib.notebook.record_content import fold_commands

    helm = {"step": "kubernetes", "argv": ["/x/bin/helm", "list", "-n", "kube-system", "-o", "json"]}
    talos = [
        {"step": "verify", "argv": ["/x/bin/talosctl", "-n", f"10.0.0.{i}", "read", "/p"], "exit_code": 0}
        for i in (1, 2)
    ]
    folded = fold_commands([helm, dict(helm), *talos])
    assert [e["argv"] for e in folded[:2]] == [helm["argv"], helm["argv"]]
    assert all("nodes" not in e for e in folded[:2])
    assert folded[2]["nodes"] == ["10.0.0.1", "10.0.0.2"] and len(folded) == 3


def _sealed_chain(tmp_path: Path) -> tuple[Path, list[Path]]:
    root = tmp_path / "records"
    return root, [write_record(root, run_id=f"0000000{i}") for i in range(2)]


@pytest.mark.parametrize(
    ("what", "tamper", "problem"),
    [
        ("list", lambda p: (p / records.RECORD_JSON).write_text("[1, 2]\n"), "not a JSON object"),
        ("bytes", lambda p: (p / records.MANIFEST).write_bytes(b"\xff\xfe  x\n"), "not UTF-8"),
        (
            "previous",
            lambda p: (p / records.RECORD_JSON).write_text(json.dumps({"previous": "x"})),
            "previous",
        ),
        (
            "steps",
            lambda p: (p / records.RECORD_JSON).write_text(json.dumps({"steps": "x", "who": 3})),
            None,
        ),
        ("binary", lambda p: (p / records.RECORD_JSON).write_bytes(b"\xff{}"), "not UTF-8"),
    ],
)
@pytest.mark.parametrize("command", ["verify", "list", "show"])
def test_malformed_record_is_named_never_a_crash(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    command: str,
    what: str,
    tamper: Any,
    problem: str | None,
) -> None:
    """F10 T24/T25/T30: a record.json that is a list, non-UTF-8 bytes, ``previous`` that is a string."""
    root, paths = _sealed_chain(tmp_path)
    tamper(paths[1])
    args = ["records", command, "--dir", str(root)] + ([paths[1].name] if command == "show" else [])
    code = main(args)
    captured = capsys.readouterr()
    text = (captured.out + captured.err).replace(str(tmp_path), "<tmp>")  # the test's name says "malformed"
    if command == "list":  # list reads only record.json: a bad one is named (exit 2), the others listed
        assert paths[0].name in text and paths[1].name in text
        assert ("malformed" in text) == (what in ("list", "binary")), text
        # a broken link is named too (it was listed without a word: attack re-run, 7 Dec 2026); a manifest that
        # is not UTF-8 is `records verify`'s, which reads every file
        assert code == (0 if what == "bytes" else 2), text
        return
    if command == "show" and what not in ("list", "binary"):  # shown, then named as not intact (exit 2)
        assert code == 2 and f"error: {paths[1].name} is not intact: " in text, text
        return
    assert code == (1 if command == "verify" else 2), text
    assert paths[1].name in text and "Traceback" not in text
    if problem:
        assert problem in text, text


def _unsealed(root: Path, run_id: str, text: str = "partial notebook") -> Path:
    path = records.create_record_dir(root, "sim-gpu", run_id=run_id)
    (path / "01-preflight.ipynb").write_text(json.dumps({"cells": [{"source": text}]}))
    return path


def _seal(path: Path) -> str:
    return records.seal(path, {"cluster": "sim-gpu", "outcome": "ok", "steps": []})


def test_records_sealed_out_of_name_order_chain_in_seal_order(tmp_path: Path) -> None:
    """F8 C3: a long run (older name) seals after a short run that started later (random run ids in the
    same second sort either way); verify must follow the chain, and the next seal must chain to the head."""
    root = tmp_path / "records"
    long_run = _unsealed(root, "00000001")
    short_run = _unsealed(root, "00000002")
    _seal(short_run)
    _seal(long_run)
    assert records.load_record(long_run)["previous"]["record"] == short_run.name
    assert records.verify(root) == []
    later = _unsealed(root, "00000000")  # sorts first by name in the same second, sealed last
    _seal(later)
    assert records.load_record(later)["previous"]["record"] == long_run.name
    assert records.verify(root) == []
    assert records.resolve(root, None) == later


def test_aborted_run_is_reported_as_aborted_never_as_tampering(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """F9: SIGKILL or a crash leaves a directory with no record.json and no SHA256SUMS; later records and
    `records verify` must not be poisoned by it, and it must stay visible until sealed as aborted."""
    root = tmp_path / "records"
    first = write_record(root, run_id="00000001")
    aborted = _unsealed(root, "00000002")
    later = write_record(root, run_id="00000003")
    assert records.load_record(later)["previous"]["record"] == first.name
    assert records.verify(root) == []
    assert main(["records", "verify", "--dir", str(root)]) == 0
    out = capsys.readouterr().out
    assert f"aborted run, not sealed: {aborted.name}" in out
    # with the folder as given: pasted, it looked in ./records and said "no records" (README audit, stop 50)
    assert f"runbook records seal-aborted {aborted.name} --records {root}\n" in out
    assert main(["records", "list", "--dir", str(root)]) == 0
    listed = capsys.readouterr().out
    assert (
        f"{aborted.name}  aborted" in listed and f"seal-aborted {aborted.name} --records {root}\n" in listed
    )


def test_seal_aborted_records_what_the_aborted_run_left(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "records"
    write_record(root, run_id="00000001")
    aborted = _unsealed(root, "00000002")
    later = write_record(root, run_id="00000003")
    assert main(["records", "seal-aborted", aborted.name[-8:], "--dir", str(root)]) == 0
    data = records.load_record(aborted)
    assert data["aborted"] is True and data["outcome"] == "aborted"
    assert [f["path"] for f in data["files"]] == ["01-preflight.ipynb"]
    assert data["previous"]["record"] == later.name  # appended to the chain when sealed
    capsys.readouterr()
    assert main(["records", "verify", "--dir", str(root)]) == 0
    assert "aborted run, not sealed" not in capsys.readouterr().out
    assert main(["records", "show", aborted.name, "--dir", str(root)]) == 0
    shown = capsys.readouterr().out
    assert "outcome aborted" in shown and "files it left: 01-preflight.ipynb" in shown
    assert main(["records", "seal-aborted", aborted.name, "--dir", str(root)]) == 2
    assert "already sealed" in capsys.readouterr().err


def test_seal_aborted_keeps_the_steps_and_changes_the_aborted_run_finished(tmp_path: Path) -> None:
    """A killed --apply run: the steps that finished wrote results/<step>.json (with their journal), the
    step in flight only its notebook.  The sealed record must say which changes are known, and that it
    applied."""
    root = tmp_path / "records"
    aborted = _unsealed(root, "00000002")
    (aborted / "02-config-patch.ipynb").write_text("{}")
    (aborted / "params.yaml").write_text("cluster: sim-gpu\ntarget: simulated\napply: true\n")
    (aborted / "results").mkdir()
    patch = {"kind": "command", "argv": ["talosctl", "-n", "10.5.0.11", "patch", "mc"], "exit_code": 0}
    journal = [{**patch, "changes_cluster": True}, {"kind": "command", "argv": ["talosctl", "get", "x"]}]
    result = {"step": "preflight", "status": "ok", "summary": "3 ok", "journal": journal}
    (aborted / "results" / "preflight.json").write_text(json.dumps(result))
    records.seal_aborted(aborted)
    data = records.load_record(aborted)
    assert data["apply"] is True
    assert data["steps"] == [
        {"name": "preflight", "status": "ok", "summary": "3 ok"},
        {
            "name": "config-patch",
            "status": "aborted",
            "summary": "running when the run ended: its changes are unknown",
        },
    ]
    assert [c["argv"] for c in data["changes"]] == [patch["argv"]] and data["changes"][0][
        "step"
    ] == "preflight"


def test_a_sealed_record_stripped_to_look_aborted_is_tampering(chain: tuple[Path, list[Path]]) -> None:
    root, paths = chain
    (paths[1] / records.RECORD_JSON).unlink()
    (paths[1] / records.MANIFEST).unlink()
    problems = records.verify(root)
    assert any(paths[1].name in p and paths[2].name in p for p in problems), problems


def test_renamed_record_is_named(chain: tuple[Path, list[Path]]) -> None:
    root, paths = chain
    renamed = paths[2].with_name(paths[2].name[:-8] + "abcdef01")
    paths[2].rename(renamed)
    problems = records.verify(root)
    assert any(renamed.name in p and "renamed" in p for p in problems), problems


def test_removed_newest_record_is_detected_against_its_anchor(
    chain: tuple[Path, list[Path]], capsys: pytest.CaptureFixture[str]
) -> None:
    """F10 T13: nothing after the newest record proves it, so only a hash kept elsewhere can."""
    root, paths = chain
    anchor = records.sha256_file(paths[2] / records.MANIFEST)
    assert main(["records", "list", "--dir", str(root)]) == 0
    assert f"SHA256SUMS {anchor}" in capsys.readouterr().out  # where a user finds the anchor
    shutil.rmtree(paths[2])
    assert main(["records", "verify", "--dir", str(root)]) == 0  # the limit the README states
    capsys.readouterr()
    assert main(["records", "verify", "--dir", str(root), "--expect", anchor]) == 1
    assert f"anchor {anchor}: no record's SHA256SUMS has this hash" in capsys.readouterr().out


def test_resealed_newest_record_is_detected_against_its_anchor(
    chain: tuple[Path, list[Path]], capsys: pytest.CaptureFixture[str]
) -> None:
    """F10 T05/T22: edit (or delete) a file of the newest record and recompute its SHA256SUMS."""
    root, paths = chain
    anchor = records.sha256_file(paths[2] / records.MANIFEST)
    (paths[2] / "html" / "01-preflight.html").unlink()
    records.write_manifest(paths[2])
    assert records.verify(root) == []
    assert main(["records", "verify", "--dir", str(root), "--expect", anchor[:16]]) == 1
    assert "re-sealed" in capsys.readouterr().out


def test_anchor_of_an_older_head_still_holds_after_later_runs(
    chain: tuple[Path, list[Path]], capsys: pytest.CaptureFixture[str]
) -> None:
    root, paths = chain
    anchor = records.sha256_file(paths[2] / records.MANIFEST)
    later = write_record(root, run_id="00000009")
    assert main(["records", "verify", "--dir", str(root), "--expect", anchor]) == 0
    out = capsys.readouterr().out
    assert "1 anchor(s) found" in out and f"head: {later.name}" in out


@pytest.mark.parametrize("value", ["xyz", "abc123", "g" * 64])
def test_anchor_that_is_not_a_hash_is_refused(
    chain: tuple[Path, list[Path]], capsys: pytest.CaptureFixture[str], value: str
) -> None:
    root, _ = chain
    assert main(["records", "verify", "--dir", str(root), "--expect", value]) == 2
    assert "--expect" in capsys.readouterr().err


def test_run_report_prints_the_full_anchor_and_how_to_check_it(tmp_path: Path) -> None:
    from runbook_lib.notebook.runner import RunOutcome

    digest = "ab" * 32
    report = RunOutcome(tmp_path / "rec", "unchanged", [], digest, 0).report()
    assert f"anchor: runbook records verify --records {tmp_path} --expect {digest}" in report


def test_an_anchor_is_not_found_in_a_missing_or_empty_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``records verify --expect`` answered "ok: 0 record(s) … 1 anchor(s) found" of a folder that does not
    exist, and of the ./records the printed anchor line pointed at when the run wrote elsewhere: deleting the
    whole folder passed the check (operator walkthrough, 6 Dec 2026)."""
    anchor = "0" * 64
    missing = tmp_path / "gone"
    assert main(["records", "verify", "--records", str(missing), "--expect", anchor]) == 1
    out = capsys.readouterr().out
    assert f"no records folder at {missing}" in out and f"anchor {anchor}: no record's SHA256SUMS" in out
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["records", "verify", "--records", str(empty), "--expect", anchor]) == 1
    assert f"anchor {anchor}: no record's" in capsys.readouterr().out
    assert main(["records", "verify", "--records", str(missing)]) == 1, "a missing folder is not intact"


#: A static kubeconfig token written as a block scalar (``token: |``), so its value ends in a newline (F2).
#: '+', '/' and '=' exercise the escaped forms; MRKR and ZQ9XW mark its two ends for grepping.
NL_TOKEN = "MRKRSECRET0123456789+abc/def=ZQ9XW"


def _kubeconfig_with_block_token(tmp_path: Path) -> Path:
    path = tmp_path / "kubeconfig-nl"
    path.write_text(
        f"apiVersion: v1\nkind: Config\nusers:\n- name: u\n  user:\n    token: |\n      {NL_TOKEN}\n"
    )
    return path


def _leaky_files(token: str) -> dict[str, str]:
    """The token as a run's files would hold it (F2): a traceback (ANSI colours, bytes repr) inside
    notebook JSON, JSON with \\u escapes (as Go's encoder or ensure_ascii writers emit), JSON in JSON, the
    HTML rendering with entities, and a URL-encoded query."""
    header = f"ValueError: Invalid header value b'Bearer {token}\\n'"
    traceback = f"\x1b[0;31mValueError\x1b[0m{header[10:]}"
    escaped = "".join(c if c.isalnum() else f"\\u{ord(c):04x}" for c in token)
    entities = "".join(c if c.isalnum() else f"&#{ord(c)};" for c in token)
    hexed = "".join(c if c.isalnum() else f"&#x{ord(c):X};" for c in token)
    return {
        "01-preflight.ipynb": json.dumps({"outputs": [{"evalue": header, "traceback": [traceback]}]}),
        "results/preflight.json": '{"error": "' + escaped + '"}',
        "results/nested.json": json.dumps({"log": json.dumps({"token": token + "\n"})}),
        "html/01-preflight.html": f"<pre>{html.escape(header)} {entities} {hexed}</pre>",
        "log.txt": f"GET /api?token={urllib.parse.quote(token, safe='')}",
    }


def test_a_token_with_a_trailing_newline_leaves_no_trace_in_any_form(tmp_path: Path) -> None:
    """F2: the token is collected with its newline, while files hold it escaped; grep every file."""
    secrets = records.secret_values(_kubeconfig_with_block_token(tmp_path))
    root = tmp_path / "records"
    path = records.create_record_dir(root, "sim-gpu")
    for rel, text in _leaky_files(NL_TOKEN).items():
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_text(text)
    (path / "binary.bin").write_bytes(b"\xff\xfe" + NL_TOKEN.encode() + b"\x00")
    records.seal(path, {"cluster": "sim-gpu", "leak": f"Bearer {NL_TOKEN}\n"}, secrets=secrets)
    for file in (p for p in path.rglob("*") if p.is_file()):
        data = file.read_bytes()
        assert b"MRKR" not in data and b"ZQ9XW" not in data, (file.name, data[:300])
    assert records.REDACTED in (path / "html" / "01-preflight.html").read_text()
    assert records.verify(root) == []


def test_params_yaml_holds_config_paths_never_their_contents(tmp_path: Path) -> None:
    """params.yaml is written from ``public_dict()``: the talosconfig/kubeconfig are paths only."""
    from runbook_lib.model.params import load_params

    kubeconfig, talosconfig = make_configs(tmp_path)
    params = load_params(
        "params/simulated.yaml",
        values={"target": "cluster", "kubeconfig": str(kubeconfig), "talosconfig": str(talosconfig)},
    )
    dumped = yaml.safe_dump(params.public_dict())
    assert str(kubeconfig) in dumped and str(talosconfig) in dumped
    assert TOKEN not in dumped and TALOS_KEY not in dumped and "users" not in dumped


@pytest.mark.parametrize(
    "content", [b"[1, 2]\n", b"\xff\xfe{}", json.dumps({"previous": "x", "params": "x"}).encode()]
)
def test_run_from_a_malformed_latest_record_is_refused_naming_it(tmp_path: Path, content: bytes) -> None:
    """F10: `run --from` crashed like verify did; it must exit 2 before anything runs, naming the record."""
    import subprocess
    import sys

    root, paths = _sealed_chain(tmp_path)
    (paths[1] / records.RECORD_JSON).write_bytes(content)
    proc = subprocess.run(
        [sys.executable, "-m", "runbook_lib", "run", "--from", "verify", "--records", str(root)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    if b"params" not in content:  # valid JSON without parameters: `_run` says so (without the name)
        assert paths[1].name in proc.stderr, proc.stderr


def test_run_from_a_latest_record_edited_after_sealing_is_refused_and_show_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Attack re-run (7 Dec 2026): a record.json edited after sealing (a node's address, rollout_concurrency),
    valid JSON with its link intact, was resumed from by ``run --from`` and shown by ``records show`` without a
    word, where ``records verify`` and rollback name it. ``--from`` now refuses it before anything runs (it
    would plan, or with --apply change, what the edit says), and ``show`` names it (exit 2)."""
    from runbook_lib.cli.cmd_run import _resume_values

    root, paths = _sealed_chain(tmp_path)
    record = paths[1] / records.RECORD_JSON
    data = json.loads(record.read_text())
    data["params"] = {"cluster": "sim-gpu", "rollout_concurrency": 3}
    record.write_text(json.dumps(data))
    with pytest.raises(
        PermanentError, match=r"record .* is not intact \(.*edited file record.json\)"
    ) as raised:
        _resume_values(root, apply=False)
    assert paths[1].name in raised.value.message and "records verify" in (raised.value.hint or "")
    assert main(["records", "show", paths[1].name, "--dir", str(root)]) == 2
    assert (
        f"error: {paths[1].name} is not intact: {paths[1].name}: edited file record.json"
        in capsys.readouterr().err
    )
    assert main(["records", "show", paths[0].name, "--dir", str(root)]) == 0  # an intact one still shows


def test_seal_aborted_seals_a_directory_whose_name_holds_no_time(tmp_path: Path) -> None:
    """Attack re-run (7 Dec 2026): ``records seal-aborted 20261207T999999Z-…`` crashed with a strptime
    ValueError right after ``records verify`` had suggested that command; it is sealed, its start unknown."""
    root = tmp_path / "records"
    path = records.create_record_dir(root, "sim-gpu", run_id="0000000a")
    odd = path.with_name("20261207T999999Z-sim-gpu-0000000a")
    path.rename(odd)
    (odd / "01-preflight.ipynb").write_text("{}")
    assert odd in records.check(root).aborted
    records.seal_aborted(odd)
    sealed = records.load_record(odd)
    assert sealed["outcome"] == "aborted" and sealed["started"] is None and sealed["cluster"] == "sim-gpu"
    assert records.verify(root) == []


def test_verify_waits_for_a_seal_in_progress_instead_of_reporting_it(chain: tuple[Path, list[Path]]) -> None:
    """A run sealing while `records verify` reads must not show up as a record without its manifest."""
    import fcntl
    import threading

    root, _ = chain
    sealing = records.create_record_dir(root, "sim-gpu", run_id="0000000a")
    result: list[list[str]] = []
    with (root / ".lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # what seal() holds while it writes record.json, then SHA256SUMS
        (sealing / records.RECORD_JSON).write_text("{}")
        reader = threading.Thread(target=lambda: result.append(records.verify(root)))
        reader.start()
        reader.join(0.5)
        assert reader.is_alive(), f"verify read a half-sealed record: {result}"
        (sealing / records.RECORD_JSON).unlink()
        fcntl.flock(lock, fcntl.LOCK_UN)
    reader.join(10)
    assert result == [[]]


def test_deeply_nested_record_json_is_named_not_a_crash(
    chain: tuple[Path, list[Path]], capsys: pytest.CaptureFixture[str]
) -> None:
    root, paths = chain
    (paths[2] / records.RECORD_JSON).write_text("[" * 200_000 + "]" * 200_000)
    assert main(["records", "verify", "--dir", str(root)]) == 1
    assert f"{paths[2].name}: {records.RECORD_JSON} is not valid JSON" in capsys.readouterr().out
    assert main(["records", "show", paths[2].name, "--dir", str(root)]) == 2


def test_file_replaced_by_a_symlink_to_an_identical_copy_is_named(
    chain: tuple[Path, list[Path]], tmp_path: Path
) -> None:
    """F10 T16: the bytes still hash the same, but the record no longer holds them (the target outside can
    change at any time)."""
    root, paths = chain
    outside = tmp_path / "copy.html"
    shutil.copy(paths[1] / "html" / "01-preflight.html", outside)
    (paths[1] / "html" / "01-preflight.html").unlink()
    (paths[1] / "html" / "01-preflight.html").symlink_to(outside)
    assert records.verify(root) == [f"{paths[1].name}: html/01-preflight.html is a symbolic link, not a file"]


def test_sealing_reads_only_the_head_of_earlier_records(
    chain: tuple[Path, list[Path]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fleet run's record.json is megabytes: sealing the next record must not parse each earlier one
    (100 such records made every seal take seconds)."""
    root, paths = chain

    def parse_whole(path: Path) -> dict[str, Any]:
        raise AssertionError(f"seal parsed all of {path.name}/record.json")

    monkeypatch.setattr(records, "load_record", parse_whole)
    later = write_record(root, run_id="0000000b")
    monkeypatch.undo()
    assert records.load_record(later)["previous"]["record"] == paths[2].name
    assert records.verify(root) == []


def test_a_run_still_seals_when_the_newest_record_lost_its_manifest(chain: tuple[Path, list[Path]]) -> None:
    """Tampering with the folder must be reported by verify, never stop the next run from sealing."""
    root, paths = chain
    (paths[2] / records.MANIFEST).unlink()
    later = write_record(root, run_id="0000000c")
    assert (later / records.MANIFEST).is_file()
    problems = records.verify(root)
    assert any(paths[2].name in p and "SHA256SUMS is missing" in p for p in problems), problems


def test_seal_aborted_scrubs_the_credentials_of_the_aborted_run(tmp_path: Path) -> None:
    """The aborted run never reached its seal-time scrub: seal-aborted does it, with the configs its
    params.yaml names."""
    kubeconfig = _kubeconfig_with_block_token(tmp_path)
    root = tmp_path / "records"
    aborted = _unsealed(root, "00000002", text=f"Invalid header value b'Bearer {NL_TOKEN}\\n'")
    (aborted / "params.yaml").write_text(f"target: cluster\nkubeconfig: {kubeconfig}\napply: false\n")
    assert main(["records", "seal-aborted", aborted.name, "--dir", str(root)]) == 0
    for file in (p for p in aborted.rglob("*") if p.is_file()):
        assert b"MRKR" not in file.read_bytes(), file.name


def test_seal_aborted_refuses_while_a_run_applies_into_the_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A directory without record.json may belong to a run still applying: sealing it would race that
    run's own seal.  An applying run holds the folder's apply lock (runbook_lib/notebook/lock.py)."""
    from runbook_lib.notebook import lock

    root = tmp_path / "records"
    running = _unsealed(root, "00000002")
    with lock.exclusive(root / lock.RECORDS_LOCK, f"the records folder {root}"):
        assert main(["records", "seal-aborted", running.name, "--dir", str(root)]) == 2
    assert "being changed by another run" in capsys.readouterr().err
    assert records.is_unsealed(running)
    assert main(["records", "seal-aborted", running.name, "--dir", str(root)]) == 0


def test_seal_aborted_lists_the_changes_the_step_in_flight_journalled(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """SIGKILL mid config-patch (F9, I3): the step never wrote its result, but its kernel appended each
    change to results/<step>.journal.jsonl as it happened (runbook_lib/clients/proc.py Journal sink); the
    aborted record must list the patch that returned and the one in flight."""
    import os
    import signal
    import subprocess
    import sys

    root = tmp_path / "records"
    aborted = _unsealed(root, "00000002")
    (aborted / "02-config-patch.ipynb").write_text("{}")
    sink = aborted / "results" / "config-patch.journal.jsonl"
    sink.parent.mkdir()
    writer = (
        "import sys, time\nfrom pathlib import Path\n"
        "from runbook_lib.clients.proc import CommandResult, Journal\n"
        "j = Journal(sink=Path(sys.argv[1]))\n"
        "j.record_command(CommandResult(('talosctl', '-n', '10.5.0.11', 'patch', 'mc'), 0, '', '', 0.1,"
        " changes_cluster=True))\n"
        "with j.pending('command', 'talosctl patch', ['talosctl', '-n', '10.5.0.12', 'patch', 'mc']):\n"
        "    print('in flight', flush=True); time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", writer, str(sink)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "in flight\n"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    assert main(["records", "seal-aborted", aborted.name, "--dir", str(root)]) == 0
    data = records.load_record(aborted)
    nodes = [c["argv"][2] for c in data["changes"]]
    assert nodes == ["10.5.0.11", "10.5.0.12"], data["changes"]
    assert "interrupt" not in data["changes"][0] and "in flight" in data["changes"][1]["interrupt"]
    step = data["steps"][-1]
    assert step["name"] == "config-patch" and step["status"] == "aborted" and "2 change" in step["summary"]


def test_records_are_not_writable_by_others_whatever_the_umask(tmp_path: Path) -> None:
    """Attack re-run (stop 49): under umask 000 a record was written 0666/0777, so any local user could edit or
    delete it. Readable by others stays (records are shared), and group write as the umask gives it (a team's
    setgid folder: a member seals another's aborted run, review of 70aa799)."""
    old = os.umask(0)
    try:
        root = tmp_path / "records"
        path = write_record(root, run_id="0000000b")
        aborted = _unsealed(root, "0000000c")
        records.seal_aborted(aborted)
    finally:
        os.umask(old)
    assert (root / ".lock").stat().st_mode & 0o007 == 0, "any user who opens the seal lock can hold it"
    for entry in [root, *root.rglob("*")]:
        if entry.name == ".lock":
            continue  # the seal lock, checked above: not part of any record
        mode = entry.stat().st_mode & 0o777
        assert mode & 0o002 == 0, f"{entry.relative_to(tmp_path)} is {oct(mode)}"
        assert mode & 0o004, f"{entry.relative_to(tmp_path)} is not readable by others"
        assert mode & 0o020, f"{entry.relative_to(tmp_path)} lost the group write its umask gave (review)"
    assert records.verify(root) == [] and path.is_dir()


def test_an_aborted_records_show_says_who_is_not_recorded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Attack re-run (stop 49): `records show` of a record sealed by seal-aborted said `by: ?@?`."""
    root = tmp_path / "records"
    aborted = _unsealed(root, "0000000d")
    assert main(["records", "seal-aborted", aborted.name, "--dir", str(root)]) == 0
    capsys.readouterr()
    assert main(["records", "show", aborted.name, "--dir", str(root)]) == 0
    shown = capsys.readouterr().out
    assert "by:       not recorded at " in shown and "?@?" not in shown, shown


def test_an_aborted_steps_summary_speaks_of_in_flight_calls_only_when_there_are_some(tmp_path: Path) -> None:
    """README audit (stop 50): every aborted step with changes said "one marked in flight may or may not have
    reached the cluster", though its journal marked none."""
    from runbook_lib.notebook.interrupts import IN_FLIGHT

    done = {"argv": ["talosctl", "patch"], "changes_cluster": True, "exit_code": 0}
    flying = {"argv": ["talosctl", "upgrade"], "changes_cluster": True, "interrupt": IN_FLIGHT}
    step, _ = records._in_flight_step("image", tmp_path / "image.json", lambda _p: [done])
    assert step["summary"] == "running when the run ended: 1 change(s) from its journal", step
    step, _ = records._in_flight_step("image", tmp_path / "image.json", lambda _p: [done, flying])
    assert step["summary"].endswith(
        "2 change(s) from its journal (1 in flight: it may or may not have reached the cluster)"
    )


def test_a_misspelt_records_folder_is_named_as_missing_and_one_change_is_singular(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Operator walkthrough, stop 53: ``records show --records recrods`` said "no records in recrods", as for an
    empty folder, and ``records list`` printed "1 changes"."""
    assert main(["records", "show", "--records", str(tmp_path / "recrods")]) == 2
    err = capsys.readouterr().err
    assert f"the records folder {tmp_path / 'recrods'} does not exist" in err, err
    assert main(["records", "list", "--records", str(tmp_path / "recrods")]) == 0
    assert "(the folder does not exist)" in capsys.readouterr().out
    root = tmp_path / "records"
    path = records.create_record_dir(root, "sim-gpu")
    records.seal(
        path, {"cluster": "sim-gpu", "outcome": "changed", "steps": [], "changes": [{"argv": ["x"]}]}
    )
    assert main(["records", "list", "--records", str(root)]) == 0
    line = capsys.readouterr().out.splitlines()[0]
    assert "   1 change   " in line and "changes" not in line, line
