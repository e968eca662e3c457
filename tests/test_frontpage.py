"""A record's front page (issue 17, point 2): ``index.html`` in every sealed record, readable from disk with
no server and no network, at 1,000 nodes too, sealed in SHA256SUMS and scrubbed like every record file.

The records below are built with the library's own result objects (:mod:`runbook_lib.steps.results`) and
grouped as ``runbook run`` stores them (:func:`runbook_lib.notebook.record_content.group_nodes`); the changes have
the journal's shape as ``runbook run`` wrote them for the simulated cluster.
"""

from __future__ import annotations

import html
import itertools
import json
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from runbook_lib.cli import main
from runbook_lib.notebook import frontpage, records
from runbook_lib.notebook.record_content import group_nodes
from runbook_lib.steps.results import Check, NodeResult, StepResult
from tests import test_rollout
from tests.simcluster import inject_fault

PATCH_DIFF = "machine:\n  kernel:\n    modules:\n    - name: nvidia\n    - name: nvidia_uvm\n"
CAUSE = "the kernel modules and the container toolkit carry different driver versions"
FIX = "talosctl -n 10.0.0.7 upgrade --image factory.talos.dev/metal-installer/40b13a8d:v1.12.7"


class Page(HTMLParser):
    """The elements of index.html a reader (and the browser) would use."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str]]] = []
        self.scripts: list[str] = []
        self._in_script = False
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, {k: v or "" for k, v in attrs}))
        self._in_script = tag == "script"

    def handle_endtag(self, tag: str) -> None:
        self._in_script = False

    def handle_data(self, data: str) -> None:
        if self._in_script:
            self.scripts.append(data)

    def cells(self) -> list[dict[str, str]]:
        return [attrs for _tag, attrs in self.tags if "data-node" in attrs]

    def links(self) -> list[str]:
        return [attrs["href"] for tag, attrs in self.tags if tag == "a" and "href" in attrs]


def node_name(index: int) -> str:
    return f"gpu-{index:04d}"


def fleet_step(step: str, count: int, failing: set[int], status: str = "ok") -> dict[str, Any]:
    """A step's result for ``count`` nodes as ``runbook run`` stores it (grouped); ``failing`` nodes fail
    the driver-match check with a diagnosis."""
    result = StepResult(step=step, applied=True)
    for index in range(count):
        name = node_name(index)
        node = NodeResult(node=name, address=f"10.0.{index // 250}.{index % 250 + 1}", status=status)  # type: ignore[arg-type]
        node.checks = [Check("modules", True, "loaded")]
        if index in failing:
            node.status = "failed"
            node.message = "the NVIDIA extensions carry different drivers"
            node.checks.append(Check("driver-match", False, node.message, fix=FIX, cause=CAUSE))
        result.nodes.append(node)
    return {
        "name": step,
        "notebook": f"04-{step}.ipynb",
        "status": result.status,
        "duration_s": 12.5,
        "summary": result.summary(),
        "result": group_nodes(result.finish().to_dict()),
    }


def patch_change(index: int, at: float) -> dict[str, Any]:
    address = f"10.0.{index // 250}.{index % 250 + 1}"
    argv = ["talosctl", "--talosconfig", "/home/op/.talos/config", "-n", address, "patch", "machineconfig"]
    argv += ["--patch", f"@/tmp/runbook-patch-{index:08x}/patch-0.yaml"]
    return {
        "step": "config-patch",
        "kind": "command",
        "summary": " ".join(argv[:4]),
        "argv": argv,
        "exit_code": 0,
        "duration_s": 0.4,
        "changes_cluster": True,
        "diff": PATCH_DIFF,
        "at": at,
    }


def fleet_record(count: int, failing: set[int]) -> dict[str, Any]:
    nodes = [{"name": node_name(i), "address": f"10.0.{i // 250}.{i % 250 + 1}"} for i in range(count)]
    patch = fleet_step("config-patch", count, set(), status="changed")
    patch["notebook"] = "02-config-patch.ipynb"
    return {
        "cluster": "fleet",
        "target": "talos",
        "started": "2026-12-01T16:52:03+00:00",
        "finished": "2026-12-01T17:40:00+00:00",
        "duration_s": 2877.0,
        "who": {"user": "alice", "host": "ops-1"},
        "runbook": {"commit": "7db4f9b62ebefaa848e8c4ec4ab1e79987b7e535", "dirty": False},
        "params_file": "params/fleet.yaml",
        "overrides": ["rollout_concurrency=10"],
        "apply": True,
        "outcome": "failed" if failing else "changed",
        "failed_step": "verify" if failing else None,
        "note": "",
        "params": {"cluster": "fleet", "talos_version": "v1.12.7", "rollout_concurrency": 10, "nodes": nodes},
        "steps": [patch, fleet_step("verify", count, failing)],
        "changes": [patch_change(i, 1796143925.0 + i * 0.5) for i in range(count)],
    }


def sealed(tmp_path: Path, record: dict[str, Any], secrets: tuple[str, ...] = ()) -> tuple[Path, str]:
    path = records.create_record_dir(tmp_path / "records", "fleet")
    for notebook in ("02-config-patch.ipynb", "04-verify.ipynb"):
        (path / notebook).write_text("{}")
    (path / "html").mkdir()
    (path / "html" / "02-config-patch.html").write_text("<html></html>")
    records.seal(path, record, secrets=secrets)
    return path, (path / frontpage.INDEX).read_text(encoding="utf-8")


def test_front_page_is_sealed_in_the_manifest_and_verifies(tmp_path: Path) -> None:
    path, _text = sealed(tmp_path, fleet_record(3, set()))
    assert frontpage.INDEX in records.read_manifest(path)
    assert records.verify(path.parent) == []
    (path / frontpage.INDEX).write_text("<html>all green</html>")
    assert records.verify(path.parent) == [f"{path.name}: edited file {frontpage.INDEX}"]


def test_front_page_needs_no_server_and_no_network(tmp_path: Path) -> None:
    _path, text = sealed(tmp_path, fleet_record(5, {2}))
    page = Page(text)
    external = [
        (tag, attrs)
        for tag, attrs in page.tags
        if any(re.match(r"\s*(https?:)?//", attrs.get(key, "")) for key in ("src", "href", "action"))
    ]
    assert external == []
    assert not [tag for tag, attrs in page.tags if tag in ("link", "iframe", "img") or "src" in attrs]
    assert "@import" not in text and "url(" not in text


def test_thousand_nodes_one_cell_each_failed_ones_carry_their_diagnosis(tmp_path: Path) -> None:
    failing = {7, 500, 999}
    _path, text = sealed(tmp_path, fleet_record(1000, failing))
    cells = Page(text).cells()
    assert sorted(cell["data-node"] for cell in cells) == [node_name(i) for i in range(1000)]
    by_name = {cell["data-node"]: cell for cell in cells}
    for index in failing:
        cell = by_name[node_name(index)]
        assert "failed" in cell["class"].split()
        assert "verify" in cell["title"] and "different drivers" in cell["title"]
    assert "changed" in by_name[node_name(8)]["class"].split()  # patched, then verified ok
    assert "different drivers" not in by_name[node_name(8)]["title"]
    # failing nodes come first, so they are found at a glance
    assert [cell["data-node"] for cell in cells[:3]] == sorted(node_name(i) for i in failing)
    # the click panel (with the fix) is in the page once per distinct diagnosis, not once per node
    assert text.count(FIX) == 1
    assert len(text.encode()) < 400_000, f"{len(text.encode())} bytes for 1,000 nodes"


def test_changes_are_shown_once_per_distinct_diff_with_the_nodes_they_went_to(tmp_path: Path) -> None:
    _path, text = sealed(tmp_path, fleet_record(1000, set()))
    assert text.count("name: nvidia_uvm") == 1
    assert "1000 nodes" in text and node_name(0) in text


def test_page_names_who_when_which_commit_parameters_outcome_and_steps(tmp_path: Path) -> None:
    _path, text = sealed(tmp_path, fleet_record(3, {1}))
    for expected in (
        "alice",
        "ops-1",
        "2026-12-01T16:52:03+00:00",
        "7db4f9b62ebefaa848e8c4ec4ab1e79987b7e535",
        "params/fleet.yaml",
        "rollout_concurrency=10",
        "12.5 s",
        "verify: failed (1 failed, 2 ok)",
        "stopped at verify",
    ):
        assert expected in text, expected
    assert re.search(r'class="outcome failed"[^>]*>\s*failed', text)


def test_timeline_without_logged_batches_shows_the_calls_and_says_so(tmp_path: Path) -> None:
    """A record whose steps logged no batches (sealed before ``data["rollout"]`` existed, or a step interrupted
    before it returned its result) has only the journal's calls: the page says so rather than guess batches."""
    _path, text = sealed(tmp_path, fleet_record(4, set()))
    bars = [attrs for tag, attrs in Page(text).tags if "bar" in attrs.get("class", "").split()]
    assert len(bars) == 4 and all(node_name(i) in bars[i]["title"] for i in range(4))
    assert "no per-batch entries" in text


def test_timeline_of_a_thousand_calls_is_bounded(tmp_path: Path) -> None:
    _path, text = sealed(tmp_path, fleet_record(1000, set()))
    bars = [attrs for tag, attrs in Page(text).tags if "bar" in attrs.get("class", "").split()]
    assert 0 < len(bars) <= frontpage.TIMELINE_BARS
    assert sum(int(re.search(r"(\d+) call", b["title"])[1]) for b in bars) == 1000  # type: ignore[index]


def test_links_lead_to_the_executed_notebooks_and_their_html_in_the_record(tmp_path: Path) -> None:
    path, text = sealed(tmp_path, fleet_record(3, set()))
    local = [href for href in Page(text).links() if not href.startswith("#")]
    assert set(local) == {"02-config-patch.ipynb", "html/02-config-patch.html", "04-verify.ipynb"}
    assert all((path / href).is_file() for href in local)


def test_markup_in_a_node_message_is_shown_as_text(tmp_path: Path) -> None:
    record = fleet_record(2, set())
    group = record["steps"][1]["result"]["node_groups"][0]
    group["message"] = '<script>alert("x")</script>'
    _path, text = sealed(tmp_path, record)
    assert '<script>alert("x")' not in text and "&lt;script&gt;alert" in text.replace("\\u003c", "&lt;")


def test_secret_material_is_scrubbed_from_the_front_page(tmp_path: Path) -> None:
    token = "kube-token-7f3a9c1e5b2d4f6a8c0e"
    record = fleet_record(2, {1})
    record["changes"][0]["diff"] = f"token: {token}\n"
    record["steps"][1]["result"]["node_groups"][0]["failed"][0]["fix"] = f"curl -H 'Bearer {token}'"
    _path, text = sealed(tmp_path, record, secrets=(token,))
    assert token not in text and records.REDACTED in text


def test_a_record_without_results_still_gets_a_page(tmp_path: Path) -> None:
    path = records.create_record_dir(tmp_path / "records", "sim-gpu")
    records.seal(
        path, {"cluster": "sim-gpu", "outcome": "ok", "steps": [{"name": "preflight", "status": "ok"}]}
    )
    text = (path / frontpage.INDEX).read_text()
    assert "preflight" in text and "no per-node results" in text


def test_an_aborted_record_gets_a_page_from_what_the_run_left(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "records"
    path = records.create_record_dir(root, "sim-gpu", run_id="00000002")
    (path / "01-preflight.ipynb").write_text("{}")
    (path / "02-config-patch.ipynb").write_text("{}")
    (path / "params.yaml").write_text("cluster: sim-gpu\ntarget: simulated\napply: true\n")
    (path / "results").mkdir()
    step = fleet_step("preflight", 3, {2})
    result = {"step": "preflight", "status": "failed", "summary": step["summary"], "result": step["result"]}
    (path / "results" / "preflight.json").write_text(json.dumps(result))
    assert main(["records", "seal-aborted", path.name, "--dir", str(root)]) == 0
    capsys.readouterr()
    assert main(["records", "verify", "--dir", str(root)]) == 0
    text = (path / frontpage.INDEX).read_text()
    assert re.search(r'class="outcome aborted"', text) and "running when the run ended" in text
    cells = {cell["data-node"]: cell for cell in Page(text).cells()}
    assert set(cells) == {node_name(i) for i in range(3)}
    assert "failed" in cells[node_name(2)]["class"].split()


@pytest.mark.slow
def test_a_run_on_the_simulated_cluster_writes_a_front_page(tmp_path: Path) -> None:
    root = tmp_path / "records"
    argv = ["run", "--records", str(root), "--state", str(tmp_path / "sim"), "--no-progress"]
    params = str(Path(__file__).resolve().parents[1] / "params" / "simulated.yaml")
    assert main([*argv, "-p", params, "--apply", "--steps", "preflight,config-patch"]) == 0
    path = records.resolve(root, None)
    text = (path / frontpage.INDEX).read_text()
    assert frontpage.INDEX in records.read_manifest(path)
    cells = {cell["data-node"]: cell["class"] for cell in Page(text).cells()}
    assert cells == {f"gpu-worker-{i}": "n changed" for i in (1, 2, 3)}
    assert "name: nvidia_uvm" in text and "html/02-config-patch.html" in Page(text).links()


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs chromium (apt-get install chromium)")
def test_in_a_real_browser_the_panel_shows_the_nodes_diagnosis_from_disk(tmp_path: Path) -> None:
    """Headless Chromium opens the sealed page from file:// (no server) with ``#node=<name>``, which runs
    the same function a click does; the panel must then hold that node's cause and fix."""
    path, _text = sealed(tmp_path, fleet_record(1000, {500}))
    url = f"file://{path / frontpage.INDEX}#node={node_name(500)}"
    browser = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", url]
    dom = subprocess.run(browser, capture_output=True, text=True, timeout=120, check=True).stdout
    panel = re.search(r'<div id="panel">(.*?)</div></div>', dom, re.S)
    assert panel is not None, "the panel is still hidden"
    assert f"{node_name(500)} · failed" in panel[1] and CAUSE in panel[1] and html.escape(FIX) in panel[1]


def test_a_failed_change_says_so_and_a_shared_command_names_no_single_node(tmp_path: Path) -> None:
    record = fleet_record(3, set())
    record["changes"][2]["exit_code"] = 1
    _path, text = sealed(tmp_path, record)
    assert "2 nodes: gpu-0000, gpu-0001" in text and "1 node: gpu-0002 · exit 1" in text
    assert "-n &lt;node&gt; patch machineconfig" in text


def test_a_page_that_cannot_be_built_never_leaves_the_record_unsealed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(_path: Path, _record: object) -> str:
        raise KeyError("steps")

    monkeypatch.setattr(frontpage, "render", broken)
    path, text = sealed(tmp_path, fleet_record(3, set()))
    assert "could not be built (KeyError" in text and "record.json" in text
    assert records.verify(path.parent) == []


def test_helm_namespace_flag_is_not_taken_for_a_node(tmp_path: Path) -> None:
    """helm's ``-n`` is ``--namespace`` (helm v3 pkg/cli/environment.go, EnvSettings.AddFlags); only
    talosctl's ``-n`` names nodes.  The argv is the one the simulated run journalled for the device plugin."""
    record = fleet_record(2, set())
    argv = ["/tmp/sim/bin/helm", "upgrade", "--install", "nvidia-device-plugin", "nvdp/nvidia-device-plugin"]
    argv += ["--version", "0.18.0", "-n", "kube-system", "--set", "runtimeClassName=nvidia"]
    helm = {"step": "kubernetes", "kind": "command", "summary": " ".join(argv[:4]), "argv": argv}
    record["changes"].append({**helm, "exit_code": 0, "duration_s": 3.0, "at": 1796143990.0})
    _path, text = sealed(tmp_path, record)
    summary = next(s for s in re.findall(r"<summary>(.*?)</summary>", text) if "kubernetes" in s)
    assert "kube-system" not in summary and "1 call" in summary
    bars = [attrs for tag, attrs in Page(text).tags if "bar" in attrs.get("class", "").split()]
    assert not bars[-1]["title"].startswith("kube-system")


def test_a_change_in_flight_at_an_interrupt_and_a_failed_ones_stderr_are_shown(tmp_path: Path) -> None:
    """The marks are the ones runbook_lib/notebook/interrupts.py writes (IN_FLIGHT, AFTER); stderr is what
    record_content.journal_record keeps for a failed change."""
    from runbook_lib.notebook import interrupts

    record = fleet_record(3, set())
    record["changes"][1]["interrupt"] = interrupts.IN_FLIGHT
    record["changes"][2].update(exit_code=1, stderr="rpc error: code = Unavailable desc = connection refused")
    _path, text = sealed(tmp_path, record)
    assert f"1 node: gpu-0001 · {interrupts.IN_FLIGHT}" in text
    assert "code = Unavailable desc = connection refused" in text


def test_a_step_that_raised_shows_its_error(tmp_path: Path) -> None:
    """The error is what runner.run_notebook records for a cell that raised ({"ename", "evalue", ...})."""
    record = fleet_record(2, set())
    error = {"ename": "PermanentError", "evalue": "talosctl not found on PATH\nhint: set tools.talosctl"}
    record["steps"][1] = {"name": "verify", "status": "failed", "duration_s": 0.2, "error": error}
    _path, text = sealed(tmp_path, record)
    assert "PermanentError: talosctl not found on PATH\nhint: set tools.talosctl" in text


# ---------------------------------------------------------------------------------------------------------
# Rollout batches and what verify checked (issue 17 point 2: "a timeline of the rollout batches")


image_sim = test_rollout.image_sim  # the simulated cluster of the rollout tests, config-patched


def bars_of(text: str, kind: str) -> list[dict[str, str]]:
    return [attrs for _tag, attrs in Page(text).tags if kind in attrs.get("class", "").split()]


@pytest.mark.slow
def test_patch_rollout_journals_each_batch_and_the_page_draws_it(tmp_path: Path) -> None:
    """The batches as the config-patch step ran them on the simulated cluster (canary 1, then 2, failure
    budget 1): each batch with its nodes, start, duration and outcome, in the result and on the page."""
    from runbook_lib.steps.patch import config_patch
    from tests.simcluster import sim_cluster
    from tests.test_rollout import _record_applies, _unreachable_when_applied

    rollout = {"canary": 1, "max_failures": 1}
    state = tmp_path / "sim"
    with sim_cluster(state, workers=4, daemon=False, apply=True, rollout_concurrency=2, rollout=rollout) as (
        params,
        ctx,
    ):
        names = [n.name for n in params.nodes]
        _record_applies(ctx, _unreachable_when_applied(state, [names[1]]))
        result = config_patch(ctx)
    batches = result.data["rollout"]
    assert [b["nodes"] for b in batches] == [names[:1], names[1:3], names[3:]]
    assert [b["outcome"] for b in batches] == ["ok", "failed", "ok"]
    assert batches[1]["failed"] == [names[1]]
    for before, after in itertools.pairwise(batches):
        assert after["started"] >= before["started"] + before["duration_s"] - 0.01  # one after the other
    record = fleet_record(4, set())
    record["steps"][0].update(result=group_nodes(result.to_dict()), status=result.status)
    _path, text = sealed(tmp_path, record)
    bars = bars_of(text, "batch")
    assert len(bars) == 3 and "failed" in bars[1]["class"].split()
    assert f"batch 2/3 · 2 nodes: {names[1]}, {names[2]}" in bars[1]["title"]
    assert f"failed: {names[1]}" in bars[1]["title"]
    assert "no per-batch entries" not in text


def rollout_result(count: int, failed_batch: int) -> tuple[list[dict[str, Any]], list[list[str]]]:
    """The ``rollout`` entries of a 1,000-node patch as the step writes them (canary 1, concurrency 8:
    126 batches, 8 s each), the batch ``failed_batch`` with one failed node, the budget then used up."""
    from runbook_lib.model.rollout import schedule

    plan = schedule(count, concurrency=8, canary=1, max_failures=0, pause_seconds=0)
    planned = plan.batches([node_name(i) for i in range(count)])
    entries = []
    for index, nodes in enumerate(planned[: failed_batch + 1]):
        failed = [nodes[0]] if index == failed_batch else []
        started = 1796143925.0 + index * 8.5
        entry = {
            "batch": index + 1,
            "of": len(planned),
            "nodes": nodes,
            "started": started,
            "duration_s": 8.0,
        }
        entries.append(entry | {"failed": failed, "outcome": "failed" if failed else "ok"})
    return entries, planned


def test_a_thousand_node_rollout_draws_every_batch_and_stays_small(tmp_path: Path) -> None:
    record = fleet_record(1000, set())
    entries, planned = rollout_result(1000, 120)
    data = record["steps"][0]["result"].setdefault("data", {})
    data.update(rollout=entries, batches=planned)
    _path, text = sealed(tmp_path, record)
    bars = bars_of(text, "batch")
    assert len(planned) == 128 and len(bars) == 121
    assert [b for b in bars if "failed" in b["class"].split()] == [bars[120]]
    assert "batch 121/128" in bars[120]["title"] and f"failed: {planned[120][0]}" in bars[120]["title"]
    assert "7 batch(es) never started" in text and f"{sum(map(len, planned[121:]))} node(s)" in text
    assert len(text.encode()) < 400_000, f"{len(text.encode())} bytes"


def test_the_page_shows_what_verify_checked_one_line_per_group(tmp_path: Path) -> None:
    """The lines are ``record.json``'s ``verification.verify.checked`` as runner.py writes them
    (model/inventory.py InventoryGroup.line)."""
    record = fleet_record(1000, {7})
    common = "Talos v1.12.7, schematic 40b13a8d4f32…, driver 580.105.08, nvidia.com/gpu allocatable 1"
    lines = [f"999 nodes: {common}", f"{node_name(7)}: Talos v1.12.7, driver 570.172.08"]
    record["verification"] = {"verify": {"status": "failed", "checked": lines}}
    _path, text = sealed(tmp_path, record)
    section = re.search(r"<h2>What verify checked</h2>(.*?)</section>", text, re.S)
    assert section is not None
    assert [html.unescape(t) for t in re.findall(r"<li>(.*?)</li>", section[1])] == lines


@pytest.mark.slow
def test_image_rollout_logs_its_batches_and_the_page_says_where_it_stopped(
    tmp_path: Path, image_sim: Path
) -> None:
    """A failed canary (rollout.canary 1, failure budget 0) on the simulated cluster: one batch logged, the
    other batch of the schedule never started, and the page says which nodes that left untouched."""
    inject_fault(image_sim, "talos-worker-1", "upgrade_fails")
    ctx = test_rollout._image_ctx(image_sim, apply=True, rollout_concurrency=2, rollout={"canary": 1})
    result = test_rollout._upgrade(ctx)
    assert [(b["nodes"], b["failed"]) for b in result.data["rollout"]] == [(["talos-worker-1"],) * 2]
    record = fleet_record(3, set())
    record["steps"][0].update(name="image", result=group_nodes(result.to_dict()), status=result.status)
    _path, text = sealed(tmp_path, record)
    assert "image: 1 batch(es) never started" in text and "2 node(s) not touched" in text
    assert "failed" in bars_of(text, "batch")[0]["class"].split()


# ---------------------------------------------------------------------------------------------------------
# The notebooks' HTML renderings open from disk with no network (issue 17 point 2)


class Rendering(HTMLParser):
    """What a browser would fetch from an HTML rendering, and the text it would show."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.loads: list[str] = []
        self.text: list[str] = []
        self._hidden = 0
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.loads += [value or "" for key, value in attrs if key in ("src", "href") and tag != "a"]
        self._hidden += tag in ("script", "style")

    def handle_endtag(self, tag: str) -> None:
        self._hidden -= tag in ("script", "style") and self._hidden > 0

    def handle_data(self, data: str) -> None:
        if self._hidden:
            self.loads += re.findall(r"""(?:import\s*\(|@import|url\()\s*["']?(https?://[^"')\s]+)""", data)
        elif data.strip():
            self.text.append(" ".join(data.split()))


def run_record(tmp_path: Path, *extra: str) -> Path:
    root = tmp_path / "records"
    params = str(Path(__file__).resolve().parents[1] / "params" / "simulated.yaml")
    argv = ["run", "--records", str(root), "--state", str(tmp_path / "sim"), "--no-progress", "-p", params]
    main([*argv, "--steps", "preflight,config-patch", *extra])
    return records.resolve(root, None)


@pytest.mark.slow
def test_html_renderings_load_nothing_from_the_network_and_show_the_widgets_final_state(
    tmp_path: Path,
) -> None:
    """nbconvert's lab template loads require.js, MathJax and (for notebooks with widget state, as papermill
    stores it) @jupyter-widgets/html-manager from cdnjs/unpkg (nbconvert 7.17 share/jupyter/nbconvert/
    templates/lab/index.html.j2, base/jupyter_widgets.html.j2).  A record must open from disk with no
    network, and the gate's widgets (node picker, Approve button, status line, progress bar) must read as
    their final state, not as an empty box waiting for a script."""
    planned = run_record(tmp_path)
    applied = run_record(tmp_path, "--apply")
    for record in (planned, applied):
        for page in sorted((record / "html").glob("*.html")):
            text = page.read_text(encoding="utf-8")
            rendering = Rendering(text)
            assert [u for u in rendering.loads if re.match(r"\s*(https?:)?//", u)] == [], page
            assert "<script src=" not in text and "cdnjs" not in text and "unpkg" not in text, page
    shown = " ".join(Rendering((planned / "html" / "02-config-patch.html").read_text()).text)
    assert "Approve and apply" in shown
    assert "Review the plan above, then approve to apply exactly it." in shown
    assert "nodes: gpu-worker-1, gpu-worker-2, gpu-worker-3" in shown
    shown = " ".join(Rendering((applied / "html" / "02-config-patch.html").read_text()).text)
    assert "3/3 nodes" in shown


def test_each_steps_batches_are_drawn_next_to_its_calls_in_step_order(tmp_path: Path) -> None:
    """A run of config-patch then image (the calls as fleet_record journals them, the image step's batches
    and upgrade call later): a reader follows one step at a time, batches above that step's calls."""
    record = fleet_record(2, set())
    entries, planned = rollout_result(2, 1)
    record["steps"][0]["result"].setdefault("data", {}).update(rollout=entries, batches=planned)
    image = fleet_step("image", 2, set(), status="changed")
    later = [{**e, "started": e["started"] + 60} for e in entries]
    image["result"].setdefault("data", {}).update(rollout=later, batches=planned)
    record["steps"].insert(1, image)
    upgrade = patch_change(0, 1796143990.0) | {"step": "image", "diff": None}
    record["changes"].append(upgrade)
    _path, text = sealed(tmp_path, record)
    lanes = [html.unescape(t) for t in re.findall(r"<span class=lname>(.*?)</span>", text)]
    assert lanes == ["config-patch batches", "config-patch calls", "image batches", "image calls"]
