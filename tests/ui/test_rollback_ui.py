"""Issue 17.5 in JupyterLab: the rollback notebook plans the way back, and its Approve button puts the nodes back.

A headless ``runbook run`` patches a fresh cluster (the change to undo); the parameter file then names that
record in ``rollback.records`` as a user would, and the rollback notebook is run and approved in the browser.
Run with ``make test-ui``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from runbook_lib.notebook import records
from tests.ui.labserver import Lab
from tests.ui.support import SEALED_MS, SimNodes, Workspace, runbook

pytestmark = [pytest.mark.ui, pytest.mark.slow]

APPROVE = "Approve and apply"


def _modules(config: dict[str, Any]) -> list[str]:
    kernel = (config.get("machine") or {}).get("kernel") or {}
    return [str(m.get("name")) for m in kernel.get("modules") or []]


def test_rollback_approved_in_jupyterlab_takes_the_nodes_back(
    lab: Lab, new_cluster: Any, ui_workspace: Workspace, page: tuple[Any, Any]
) -> None:
    from playwright.sync_api import expect

    from tests.ui.notebook_page import Notebook, check_clean

    ws = ui_workspace
    nodes: SimNodes = new_cluster("fresh")  # vanilla nodes: the modules patch may go (no NVIDIA image)
    run_params = ws.base / "sim-fresh.yaml"  # what new_cluster started the simulator with
    where = ("--records", str(ws.records), "--state", str(ws.sim_state), "--no-progress")
    runbook("run", "-p", str(run_params), "--steps", "config-patch", "--apply", *where)
    applied = records.resolve(ws.records, None)  # the newest record in the chain: that run's
    assert all("nvidia" in _modules(c) for c in nodes.all_configs().values())

    saved = ws.params_file.read_text()
    params = yaml.safe_load(saved)
    params["rollback"] = {"records": [str(applied)]}
    ws.params_file.write_text(yaml.safe_dump(params, sort_keys=False))
    tab, console = page
    nb = Notebook(tab, ws.screenshots)
    try:
        nb.open(lab, "notebooks/07-rollback.ipynb")
        nb.run_all()
        nb.assert_no_error_outputs()
        plan = nb.step_output("rollback", "plan")
        expect(plan).to_have_count(1)
        expect(plan.locator("h3")).to_contain_text("planned")
        expect(plan.locator("pre.runbook-diff").first).to_contain_text("$patch: delete")
        assert nb.open_node_table(plan) == dict.fromkeys(ws.node_names, "planned")
        assert all("nvidia" in _modules(c) for c in nodes.all_configs().values()), "the plan changed a node"
        approve = nb.button(APPROVE)
        expect(approve).to_be_enabled()
        nb.center(approve)
        nb.screenshot("07-rollback-plan")
        approve.click()
        bar = nb.panel.locator(".widget-hprogress .progress-bar")
        expect(bar).to_have_class(re.compile(r"progress-bar-success"), timeout=180_000)
        done = nb.step_output("rollback", "applied")
        expect(done).to_have_count(1, timeout=SEALED_MS)
        assert nb.open_node_table(done) == dict.fromkeys(ws.node_names, "changed")
        nb.screenshot("07-rollback-applied")
        check_clean(console)
    finally:
        ws.params_file.write_text(saved)
    assert all("nvidia" not in _modules(c) for c in nodes.all_configs().values())
    named = nb.panel.locator(".widget-html code", has_text="-interactive-")
    expect(named).to_have_count(1, timeout=SEALED_MS)
    record = Path(named.inner_text().strip())
    data = json.loads((record / "record.json").read_text(encoding="utf-8"))
    assert data["steps"][0]["name"] == "rollback" and data["outcome"] == "changed"
    runbook("records", "verify", "--dir", str(ws.records))
