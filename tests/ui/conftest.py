"""Fixtures for the JupyterLab browser test: a simulated cluster, a throw-away JupyterLab, a headless Chromium.

Why these tests are opt-in: they need Debian's ``chromium`` and the ``playwright`` package
(``tests/ui/install.sh``) and take a minute or two, so ``make test`` leaves them out and ``make test-ui``
asks for them (``RUNBOOK_UI_TESTS=1`` or ``-m ui``).  Asked for but unable to run is a failure, not a skip.

Why the notebooks are copied: a user's JupyterLab saves outputs into the notebooks it runs; the test must
never write into the repository's notebooks.  The copy keeps the repository layout (``notebooks/`` next to
``params/``), so the notebooks' own ``../params/simulated.yaml`` default is what the test exercises.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.ui.labserver import Lab, jupyterlab
from tests.ui.support import BREAK_APPROVE, REPO, SCENARIO, ConsoleErrors, SimNodes, Workspace, runbook

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]
SCREENSHOTS_KEY = pytest.StashKey[Path]()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "ui: drives JupyterLab in headless Chromium (make test-ui)")


def _asked(config: pytest.Config) -> bool:
    if os.environ.get("RUNBOOK_UI_TESTS") == "1":
        return True
    markexpr = str(config.getoption("markexpr", "") or "")
    return re.search(r"(?<!not )\bui\b", markexpr) is not None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _asked(config):
        return
    ui_items = [item for item in items if item.get_closest_marker("ui")]
    if ui_items:
        config.hook.pytest_deselected(items=ui_items)
        items[:] = [item for item in items if not item.get_closest_marker("ui")]


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    shots = config.stash.get(SCREENSHOTS_KEY, None)
    if shots is not None:
        terminalreporter.write_line(f"JupyterLab screenshots: {shots}")


# ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def ui_workspace(tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config) -> Workspace:
    if shutil.which("chromium") is None:
        pytest.fail("Debian's chromium is not installed: run tests/ui/install.sh (make test-ui does)")
    base = tmp_path_factory.mktemp("ui")
    root = base / "root"
    shutil.copytree(
        REPO / "notebooks", root / "notebooks", ignore=shutil.ignore_patterns(".ipynb_checkpoints")
    )
    params = yaml.safe_load((REPO / "params" / "simulated.yaml").read_text())
    params.setdefault("simulation", {})["scenario"] = SCENARIO
    params_file = root / "params" / "simulated.yaml"
    params_file.parent.mkdir(parents=True)
    params_file.write_text(yaml.safe_dump(params, sort_keys=False))
    screenshots = Path(os.environ.get("RUNBOOK_UI_SCREENSHOTS") or base / "screenshots")
    screenshots.mkdir(parents=True, exist_ok=True)
    pytestconfig.stash[SCREENSHOTS_KEY] = screenshots
    return Workspace(
        base=base,
        root=root,
        params_file=params_file,
        sim_state=base / "sim",
        screenshots=screenshots,
        cluster=str(params["cluster"]),
        node_names=[n["name"] for n in params["nodes"]],
        node_addresses=[n["address"] for n in params["nodes"]],
    )


@pytest.fixture(scope="session")
def sim_session(ui_workspace: Workspace) -> Iterator[Workspace]:
    """Stops the simulator at the end of the session, whatever the tests did."""
    try:
        yield ui_workspace
    finally:
        if (ui_workspace.sim_state / "cluster.json").exists():
            runbook("sim", "down", "--state", str(ui_workspace.sim_state))


@pytest.fixture
def new_cluster(sim_session: Workspace) -> Callable[[str], SimNodes]:
    """Start a new simulated cluster in a given scenario, where the notebooks' kernels look for it.

    ``sim up`` replaces whatever cluster the state directory held.  The scenario only tells the simulator
    what state to start in; the notebooks keep reading the same parameter file.
    """

    def start(scenario: str) -> SimNodes:
        params = yaml.safe_load(sim_session.params_file.read_text())
        params["simulation"]["scenario"] = scenario
        params_file = sim_session.base / f"sim-{scenario}.yaml"
        params_file.write_text(yaml.safe_dump(params, sort_keys=False))
        runbook("sim", "up", "-p", str(params_file), "--state", str(sim_session.sim_state))
        return SimNodes(sim_session)

    return start


@pytest.fixture
def fresh_cluster(new_cluster: Callable[[str], SimNodes]) -> SimNodes:
    """Extensions installed, modules not configured: what the config-patch step is for."""
    return new_cluster(SCENARIO)


#: Test-only switch: every kernel starts with the Approve handler replaced by a no-op, so a person can see
#: the main test fail on a broken button (``RUNBOOK_UI_BREAK_APPROVE=1 make test-ui``).
BREAK_APPROVE_ENV = "RUNBOOK_UI_BREAK_APPROVE"


@pytest.fixture(scope="session")
def lab(sim_session: Workspace) -> Iterator[Lab]:
    """JupyterLab whose kernels see the simulated cluster and a private IPython profile."""
    ipython_dir = sim_session.base / "ipython"
    startup = ipython_dir / "profile_default" / "startup"
    startup.mkdir(parents=True, exist_ok=True)
    if os.environ.get(BREAK_APPROVE_ENV) == "1":
        (startup / "00-break-approve.py").write_text(BREAK_APPROVE)
    env = {
        "RUNBOOK_SIM_STATE": str(sim_session.sim_state),
        "IPYTHONDIR": str(ipython_dir),
        "RUNBOOK_RECORDS": str(sim_session.records),  # approvals' change records, never the repository's
    }
    with jupyterlab(sim_session.root, sim_session.base / "lab", env) as server:
        yield server


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("the playwright package is not installed: run tests/ui/install.sh (make test-ui does)")
    with sync_playwright() as p:
        chromium = p.chromium.launch(
            executable_path=shutil.which("chromium"), headless=True, args=CHROMIUM_ARGS
        )
        try:
            yield chromium
        finally:
            chromium.close()


FAILED_KEY = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.when == "call" and report.failed:
        item.stash[FAILED_KEY] = True
    return report


@pytest.fixture
def page(
    browser: Any, lab: Lab, request: pytest.FixtureRequest, ui_workspace: Workspace
) -> Iterator[tuple[Any, ConsoleErrors]]:
    """A browser tab; when the test fails, the page as it was is saved next to the other screenshots.

    Afterwards the test's kernels are shut down, so the next test does not share two cores with them.
    """
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    errors = ConsoleErrors()
    tab = context.new_page()
    tab.on("console", errors.console)
    tab.on("pageerror", errors.page_error)
    try:
        yield tab, errors
    finally:
        if request.node.stash.get(FAILED_KEY, False):
            tab.screenshot(path=str(ui_workspace.screenshots / f"FAILED-{request.node.name}.png"))
        context.close()
        lab.close_sessions()
