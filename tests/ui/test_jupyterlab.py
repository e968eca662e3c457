"""The runbook as a person uses it in JupyterLab: run the config-patch notebook, read the plan, click Approve.

What a headless run cannot show: that the plan, the diff and the gate's widgets render in a real browser,
that the *button* (not the ``apply`` parameter) changes the cluster, and that the cluster is untouched
until it is clicked.  The simulated nodes are checked through the simulated ``talosctl``, as a user would.
Run with ``make test-ui``; screenshots go to the folder printed at the end (``RUNBOOK_UI_SCREENSHOTS``
chooses it; ``RUNBOOK_UI_DOCS=1`` also refreshes ``docs/screenshots/``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import nbformat
import pytest
import yaml

from tests.ui.labserver import Lab
from tests.ui.support import BREAK_APPROVE, REPO, SEALED_MS, ConsoleErrors, SimNodes, Workspace, runbook

pytestmark = [pytest.mark.ui, pytest.mark.slow]

APPROVE = "Approve and apply"
DOCS_SCREENSHOTS = REPO / "docs" / "screenshots"
DOCS_LIMIT_BYTES = 200_000


def _modules(config: dict[str, Any]) -> list[str]:
    machine = config.get("machine") or {}
    kernel = machine.get("kernel") or {}
    return [m.get("name") for m in kernel.get("modules") or []]


def _assert_carries(config: dict[str, Any], patch: dict[str, Any], node: str) -> None:
    """Every module and sysctl of the approved patch is in the node's machine config."""
    missing = [m for m in _modules(patch) if m not in _modules(config)]
    assert not missing, f"{node}: modules {missing} from the approved patch are not in its machine config"
    wanted = (patch.get("machine") or {}).get("sysctls") or {}
    have = (config.get("machine") or {}).get("sysctls") or {}
    wrong = {k: v for k, v in wanted.items() if str(have.get(k)) != str(v)}
    assert not wrong, f"{node}: sysctls {wrong} from the approved patch are not in its machine config"


def _to_docs(shot: Path, name: str) -> None:
    if os.environ.get("RUNBOOK_UI_DOCS") != "1":
        return
    assert shot.stat().st_size <= DOCS_LIMIT_BYTES, f"{shot} is over {DOCS_LIMIT_BYTES} bytes"
    DOCS_SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(shot, DOCS_SCREENSHOTS / name)


def _plan_and_gate(nb: Any, ws: Workspace, nodes: SimNodes) -> tuple[Any, dict[str, Any]]:
    """Run the config-patch notebook with apply false; return the Approve button and the patch shown."""
    from playwright.sync_api import expect

    before = nodes.all_configs()
    nb.run_all()
    nb.assert_no_error_outputs()
    plan = nb.step_output("config-patch", "plan")
    expect(plan).to_have_count(1)
    expect(plan.locator("h3")).to_contain_text("planned")
    diff = plan.locator("pre.runbook-diff")
    expect(diff.first).to_be_visible()
    diff_text = diff.first.inner_text()
    patch = yaml.safe_load(diff_text)
    assert _modules(patch), f"the diff shown names no kernel modules:\n{diff_text}"
    shown = " ".join(plan.locator("p").all_inner_texts())
    for name in ws.node_names:
        assert name in shown, f"the plan's diff does not list {name}: {shown!r}"
    table = nb.open_node_table(plan)
    assert table == dict.fromkeys(ws.node_names, "planned"), f"plan node table: {table}"

    approve = nb.button(APPROVE)
    expect(approve).to_be_visible()
    expect(approve).to_be_enabled()
    assert nodes.all_configs() == before, "running the notebook with apply false changed a node's config"
    return approve, patch


def _approve_and_wait(nb: Any, approve: Any, ws: Workspace, *, timeout_ms: int) -> None:
    """Click Approve; the progress bar must reach done and the result table show every node patched."""
    from playwright.sync_api import expect

    approve.click()
    bar = nb.panel.locator(".widget-hprogress .progress-bar")
    expect(bar).to_have_class(re.compile(r"progress-bar-success"), timeout=timeout_ms)
    expect(bar).to_have_attribute("style", re.compile(r"width:\s*100%"))
    total = len(ws.node_names)
    expect(nb.panel.locator(".widget-label", has_text=f"{total}/{total} nodes")).to_be_visible(timeout=5_000)
    applied = nb.step_output("config-patch", "applied")
    expect(applied).to_have_count(1, timeout=SEALED_MS)
    table = nb.open_node_table(applied)
    assert table == dict.fromkeys(ws.node_names, "changed"), f"applied node table: {table}"
    expect(approve).to_be_disabled()
    logged = nb.log_console_count()
    assert logged in ("", "0"), f"the kernel logged {logged} message(s) outside any cell (a callback failed?)"


def test_config_patch_approved_in_jupyterlab_changes_the_nodes(
    lab: Lab, fresh_cluster: SimNodes, ui_workspace: Workspace, page: tuple[Any, ConsoleErrors]
) -> None:
    from playwright.sync_api import expect

    from tests.ui.notebook_page import Notebook, check_clean

    tab, console = page
    nb = Notebook(tab, ui_workspace.screenshots)

    # The overview: its plan renders, and its table links to the step notebooks.
    nb.open(lab, "notebooks/00-overview.ipynb")
    nb.run_all()
    nb.assert_no_error_outputs()
    overview = nb.panel.locator(".jp-OutputArea-output table")
    expect(overview).to_contain_text(ui_workspace.cluster)
    expect(overview).to_contain_text(ui_workspace.node_names[0])
    nb.center(overview)
    _to_docs(nb.screenshot("01-overview"), "00-overview.png")
    nb.follow_link("Config patch", "02-config-patch.ipynb")

    # apply false: plan, diff and gate render; nothing changes.
    approve, patch = _plan_and_gate(nb, ui_workspace, fresh_cluster)
    nb.center(approve)
    _to_docs(nb.screenshot("02-config-patch-plan"), "02-config-patch.png")
    check_clean(console)

    # The button applies the plan shown.
    _approve_and_wait(nb, approve, ui_workspace, timeout_ms=120_000)
    nb.center(nb.step_output("config-patch", "applied"))
    nb.screenshot("03-config-patch-applied")
    for address, config in fresh_cluster.all_configs().items():
        _assert_carries(config, patch, address)

    # The verification notebook is green on every node (its "Next" link comes after the image step).
    nb.open(lab, "notebooks/04-verify.ipynb")
    nb.run_all()
    nb.assert_no_error_outputs()
    verify = nb.step_output("verify")
    expect(verify).to_have_count(1)
    expect(verify.locator("h3")).to_contain_text("ok")
    expect(verify.locator("h4", has_text="Fail")).to_have_count(0)  # no "Failed checks" / "Failing nodes"
    expect(verify.locator("h4", has_text="What was checked")).to_have_count(1)  # what verify saw, grouped
    table = nb.open_node_table(verify)
    assert table == dict.fromkeys(ui_workspace.node_names, "ok"), f"verify node table: {table}"
    nb.center(verify)
    _to_docs(nb.screenshot("04-verify"), "04-verify.png")
    check_clean(console)


def _sealed_record(nb: Any, ws: Workspace) -> Path:
    """The record the approval sealed, as the gate's status line names it, checked by ``records verify``."""
    from playwright.sync_api import expect

    named = nb.panel.locator(".widget-html code", has_text="-interactive-")
    expect(named).to_have_count(1, timeout=SEALED_MS)
    record = Path(named.inner_text().strip())
    assert record.parent == ws.records, f"the approval sealed {record}, not a record in {ws.records}"
    runbook("records", "verify", "--dir", str(ws.records))  # exit 0: the chain and every file intact
    data = json.loads((record / "record.json").read_text(encoding="utf-8"))
    assert (data["interactive"]["approved"], data["outcome"]) == (True, "changed"), data["note"]
    assert {change["step"] for change in data["changes"]} == {"config-patch"}
    return record


def _applied_cell(record: Path, ws: Workspace) -> str:
    """The rebuilt notebook's step cell as it stood after the approval: the applied result, every node."""
    notebook = nbformat.read(record / "02-config-patch.interactive.ipynb", as_version=4)  # type: ignore[no-untyped-call]
    shown = [
        output["data"]["text/html"]
        for cell in notebook.cells
        if "run_step(" in cell.source
        for output in cell.outputs
        if "text/html" in output.get("data", {})
    ]
    assert len(shown) == 1, f"the step cell of the rebuilt notebook shows {len(shown)} results"
    assert 'data-step="config-patch"' in shown[0] and "applied" in shown[0]
    assert all(name in shown[0] for name in ws.node_names), "the applied result does not name every node"
    return str(shown[0])


def test_an_approval_in_jupyterlab_is_a_sealed_record_whose_front_page_renders(
    lab: Lab, fresh_cluster: SimNodes, ui_workspace: Workspace, page: tuple[Any, ConsoleErrors]
) -> None:
    """Issue 17: the Approve click leaves a change record like ``runbook run``'s, in the same chain, that
    ``runbook records verify`` accepts, holding the notebook as it stood after the approval; its
    ``index.html`` opens from disk in the same browser with the node grid and the step list."""
    from playwright.sync_api import expect

    from tests.ui.notebook_page import Notebook, check_clean

    tab, console = page
    nb = Notebook(tab, ui_workspace.screenshots)
    nb.open(lab, "notebooks/02-config-patch.ipynb")
    approve, _patch = _plan_and_gate(nb, ui_workspace, fresh_cluster)
    _approve_and_wait(nb, approve, ui_workspace, timeout_ms=120_000)
    record = _sealed_record(nb, ui_workspace)
    _applied_cell(record, ui_workspace)

    tab.goto((record / "index.html").as_uri())
    cells = tab.locator(".grid [data-node]")
    expect(cells).to_have_count(len(ui_workspace.node_names))
    assert sorted(cells.evaluate_all("cs => cs.map(c => c.dataset.node)")) == sorted(ui_workspace.node_names)
    for cell in cells.all():
        expect(cell).to_have_class(re.compile(r"\bchanged\b"))
    steps = tab.locator("section", has=tab.locator("h2", has_text="Steps")).locator(
        "tr", has_text="config-patch"
    )
    expect(steps).to_have_count(1)
    expect(steps.locator(".st")).to_have_text("changed")
    expect(steps.get_by_role("link", name="02-config-patch.interactive.ipynb")).to_be_visible()
    expect(tab.locator("h1 .outcome")).to_have_text("changed")
    cells.first.click()
    expect(tab.locator("#panel")).to_contain_text("config-patch")
    _to_docs(nb.screenshot("06-interactive-record-front-page"), "record-interactive.png")
    check_clean(console)


def _break_approve(ws: Workspace) -> str:
    """A copy of the config-patch notebook whose Approve handler does nothing (the mutation to catch)."""
    src = ws.root / "notebooks" / "02-config-patch.ipynb"
    nb = nbformat.read(src, as_version=4)  # type: ignore[no-untyped-call]
    nb.cells.insert(0, nbformat.v4.new_code_cell(BREAK_APPROVE))  # type: ignore[no-untyped-call]
    # Beside notebooks/, not in it: the other tests' screenshots show the notebooks folder.  The notebook's
    # ../params/simulated.yaml still resolves.
    target = ws.root / "mutants" / "02-config-patch-broken-approve.ipynb"
    target.parent.mkdir(exist_ok=True)
    nbformat.write(nb, target)  # type: ignore[no-untyped-call]
    return f"mutants/{target.name}"


def test_a_no_op_approve_handler_fails_the_ui_check(
    lab: Lab, fresh_cluster: SimNodes, ui_workspace: Workspace, page: tuple[Any, ConsoleErrors]
) -> None:
    """The check above must catch an Approve button that does nothing, and the nodes must stay unchanged."""
    from tests.ui.notebook_page import Notebook

    tab, _console = page
    nb = Notebook(tab, ui_workspace.screenshots)
    nb.open(lab, _break_approve(ui_workspace))
    before = fresh_cluster.all_configs()
    approve, _patch = _plan_and_gate(nb, ui_workspace, fresh_cluster)
    with pytest.raises(AssertionError, match=r"progress-bar-success"):
        _approve_and_wait(nb, approve, ui_workspace, timeout_ms=15_000)
    nb.screenshot("05-broken-approve-caught")
    assert fresh_cluster.all_configs() == before


def test_run_all_is_pressed_again_once_when_the_first_press_started_nothing(
    lab: Lab, new_cluster: Any, ui_workspace: Workspace, page: tuple[Any, ConsoleErrors]
) -> None:
    """The page object's second press (CI 4 Dec 2026: a Run All that started no cell): a first press that does
    nothing, as then, is warned with what the page showed, and the second one runs the notebook once."""
    from tests.ui.notebook_page import Notebook

    new_cluster("fresh")
    tab, _console = page
    nb = Notebook(tab, ui_workspace.screenshots)
    presses: list[int] = []
    press = nb._press_run_all

    def first_press_lost() -> None:
        presses.append(1)
        if len(presses) > 1:
            press()

    nb._press_run_all = first_press_lost  # type: ignore[method-assign]
    nb.open(lab, "notebooks/01-preflight.ipynb")
    with pytest.warns(UserWarning, match=r"started no cell within 30 s, pressed it again; current tab"):
        nb.run_all()
    nb.assert_no_error_outputs()
    assert len(presses) == 2
    prompts = nb.panel.locator(
        ".jp-CodeCell .jp-InputPrompt"
    ).all_text_contents()  # as notebook_page reads them
    assert prompts == ["[1]:", "[2]:"], f"the cells ran more than once or not at all: {prompts}"


def test_preflight_and_image_plan_in_jupyterlab(
    lab: Lab, new_cluster: Any, ui_workspace: Workspace, page: tuple[Any, ConsoleErrors]
) -> None:
    """From the overview through preflight to the image step's plan, on nodes still on the vanilla image."""
    from playwright.sync_api import expect

    from tests.ui.notebook_page import Notebook, check_clean

    nodes = new_cluster("fresh")
    before = nodes.all_configs()
    tab, console = page
    nb = Notebook(tab, ui_workspace.screenshots)
    nb.open(lab, "notebooks/00-overview.ipynb")
    nb.follow_link("Preflight", "01-preflight.ipynb")
    nb.run_all()
    nb.assert_no_error_outputs()
    preflight = nb.step_output("preflight")
    expect(preflight.locator("h3")).to_contain_text("ok")
    assert nb.open_node_table(preflight) == dict.fromkeys(ui_workspace.node_names, "ok")
    nb.center(preflight)
    _to_docs(nb.screenshot("10-preflight"), "01-preflight.png")

    nb.follow_link("Config patch", "02-config-patch.ipynb")  # the next step after preflight
    nb.open(lab, "notebooks/03-image.ipynb")
    nb.run_all()
    nb.assert_no_error_outputs()
    plan = nb.step_output("image", "plan")
    expect(plan.locator("h3")).to_contain_text("planned")
    assert nb.open_node_table(plan) == dict.fromkeys(ui_workspace.node_names, "planned")
    approve = nb.button(APPROVE)
    expect(approve).to_be_enabled()
    nb.center(approve)
    _to_docs(nb.screenshot("11-image-plan"), "03-image.png")
    assert nodes.all_configs() == before, "planning the image upgrade changed a node"
    check_clean(console)


def test_kubernetes_layer_approved_then_cuda_test_in_jupyterlab(
    lab: Lab, new_cluster: Any, ui_workspace: Workspace, page: tuple[Any, ConsoleErrors]
) -> None:
    """On GPU-ready nodes: approve the Kubernetes layer in the browser, then the CUDA test pods pass."""
    from playwright.sync_api import expect

    from tests.ui.notebook_page import Notebook, check_clean

    new_cluster("gpu-ready")
    tab, console = page
    nb = Notebook(tab, ui_workspace.screenshots)
    nb.open(lab, "notebooks/05-kubernetes.ipynb")
    nb.run_all()
    nb.assert_no_error_outputs()
    plan = nb.step_output("kubernetes", "plan")
    expect(plan.locator("h3")).to_contain_text("planned")
    approve = nb.button(APPROVE)
    expect(approve).to_be_enabled()
    nb.center(approve)
    _to_docs(nb.screenshot("12-kubernetes-plan"), "05-kubernetes.png")

    approve.click()
    expect(nb.panel.locator(".widget-hprogress .progress-bar")).to_have_class(
        re.compile(r"progress-bar-success"), timeout=120_000
    )
    applied = nb.step_output("kubernetes", "applied")
    expect(applied).to_have_count(1, timeout=SEALED_MS)
    expect(applied.locator("h3")).not_to_contain_text("failed")
    nb.center(applied)
    nb.screenshot("13-kubernetes-applied")

    nb.follow_link("CUDA test", "06-cuda-test.ipynb")
    nb.run_all()
    nb.assert_no_error_outputs()
    # The test pods run on the GPU nodes, so they too wait for Approve.
    expect(nb.step_output("cuda-test", "plan").locator("h3")).to_contain_text("planned")
    approve = nb.button(APPROVE)
    expect(approve).to_be_enabled()
    approve.click()
    expect(nb.panel.locator(".widget-hprogress .progress-bar").last).to_have_class(
        re.compile(r"progress-bar-success"), timeout=120_000
    )
    cuda = nb.step_output("cuda-test", "applied")
    expect(cuda).to_have_count(1, timeout=SEALED_MS)
    expect(cuda.locator("h3")).to_contain_text("ok")
    assert nb.open_node_table(cuda) == dict.fromkeys(ui_workspace.node_names, "ok")
    nb.center(cuda)
    _to_docs(nb.screenshot("14-cuda-test"), "06-cuda-test.png")
    check_clean(console)
