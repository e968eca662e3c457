"""What a person does with a notebook in JupyterLab, as Playwright calls: open, Run All, read outputs, click.

Why selectors are scoped to the visible notebook panel: following a link opens a second notebook in a new
tab, and the hidden panel of the first one stays in the page with the same classes.
"""

from __future__ import annotations

import re
import time
import uuid
import warnings
from pathlib import Path
from typing import Any

from playwright.sync_api import Locator, Page, expect
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from tests.ui.labserver import Lab

ACTIVE_PANEL = ".jp-NotebookPanel:not(.lm-mod-hidden)"
#: Error tracebacks and stderr streams: JupyterLab renders both with these MIME types.
ERROR_OUTPUTS = (
    '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"], '
    '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.error"]'
)
RUN_ALL_TIMEOUT_MS = 180_000

_RUN_ALL_STARTED = """
([panelSel]) => {
  const panel = document.querySelector(panelSel);
  if (!panel) return false;
  const prompts = [...panel.querySelectorAll('.jp-CodeCell .jp-InputPrompt')].map(p => p.textContent.trim());
  return prompts.some(p => /^\\[(\\*|\\d+)\\]:$/.test(p));
}
"""
_RUN_ALL_DONE = """
([panelSel]) => {
  const panel = document.querySelector(panelSel);
  if (!panel) return false;
  const prompts = [...panel.querySelectorAll('.jp-CodeCell .jp-InputPrompt')].map(p => p.textContent.trim());
  if (prompts.some(p => p === '[*]:')) return false;
  const idle = panel.querySelector('.jp-Notebook-ExecutionIndicator[data-status="idle"]');
  if (!idle) return false;
  const failed = panel.querySelector('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]');
  return failed !== null || (prompts.length > 0 && prompts.every(p => /^\\[\\d+\\]:$/.test(p)));
}
"""


class Notebook:
    def __init__(self, page: Page, screenshots: Path) -> None:
        self.page = page
        self.screenshots = screenshots
        self.notes: list[str] = []

    def _note(self, note: str) -> None:
        """A step a person would also have taken (a dialog answered, a button pressed again): kept and warned."""
        self.notes.append(note)
        warnings.warn(note, stacklevel=2)

    @property
    def panel(self) -> Locator:
        return self.page.locator(ACTIVE_PANEL)

    def open(self, lab: Lab, path: str) -> None:
        self.page.goto(lab.notebook_url(path, uuid.uuid4().hex))
        self.wait_for_tab(Path(path).name)

    def wait_for_tab(self, name: str, timeout_s: float = 120.0) -> None:
        """The notebook is the current tab and its kernel is connected and idle (ready to run).

        Why not just the toolbar's execution indicator: it says "idle" before a kernel is connected, and
        Run All in that window asks "Select Kernel" instead of running.  The status bar names the kernel
        and its state ("Python 3 (ipykernel) | Idle") only once the kernel is connected.  On a loaded
        machine JupyterLab itself sometimes opens "Select Kernel" with the notebook's kernel preselected
        (its kernelspecs had not loaded yet); a person would press Select, and so does this.
        """
        current = self.page.locator("#jp-main-dock-panel .lm-TabBar-tab.lm-mod-current .lm-TabBar-tabLabel")
        expect(current).to_have_text(name, timeout=60_000)
        kernel_idle = self.page.locator("#jp-main-statusbar").get_by_text(re.compile(r"\| Idle\s*$"))
        indicator = self.panel.locator('.jp-Notebook-ExecutionIndicator[data-status="idle"]')
        dialog = self.page.locator(".jp-Dialog", has_text="Select Kernel")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if dialog.count():
                self._note(f"{name}: JupyterLab asked 'Select Kernel'; pressed Select")
                dialog.get_by_role("button", name="Select Kernel").click()
            elif kernel_idle.count() and indicator.count():
                return
            self.page.wait_for_timeout(250)
        raise AssertionError(f"{name}: the kernel did not become idle within {timeout_s:.0f} s")

    def run_all(self) -> None:
        """Run → Run All Cells from the menu bar, and wait until every code cell has run (or one failed).

        Why a second press: once in the fresh-clone CI run of 4 Dec 2026 the menu's Run All Cells started no
        cell within 30 s, with the kernel reported idle and no dialog (JupyterLab 4.6's runAll returns without
        running when the notebook has no active cell or its session has no kernel yet,
        ``NotebookActions.runAll`` / ``runCell``). A person whose click did nothing clicks again; so does
        this, once, and the test warns with what the page showed, so the CI log keeps the evidence.
        """
        self._press_run_all()
        if not self._wait_started():
            seen = self._page_state("run-all-started-nothing")
            if self._started():  # started since the timeout: pressing again would run the cells twice
                self._note(f"Run → Run All Cells started a cell only after 30 s; {seen}")
            else:
                self._note(f"Run → Run All Cells started no cell within 30 s, pressed it again; {seen}")
                self._press_run_all()
                if not self._wait_started():
                    seen = self._page_state("run-all-started-nothing-again")
                    raise AssertionError(f"Run → Run All Cells, pressed twice, started no cell; {seen}")
        self.page.wait_for_function(_RUN_ALL_DONE, arg=[ACTIVE_PANEL], timeout=RUN_ALL_TIMEOUT_MS)

    def _wait_started(self) -> bool:
        try:
            self.page.wait_for_function(_RUN_ALL_STARTED, arg=[ACTIVE_PANEL], timeout=30_000)
        except PlaywrightTimeout:
            return False
        return True

    def _started(self) -> bool:
        """A cell has run or is running, or the kernel is busy (a queued Run All that has not reached a cell)."""
        busy = self.page.locator("#jp-main-statusbar").get_by_text(re.compile(r"\| Busy\s*$")).count() > 0
        return busy or bool(self.page.evaluate(_RUN_ALL_STARTED, [ACTIVE_PANEL]))

    def _press_run_all(self) -> None:
        self.panel.locator(".jp-Cell").first.click()
        self.page.get_by_role("menuitem", name="Run", exact=True).click()
        self.page.get_by_role("menuitem", name="Run All Cells", exact=True).click()

    def _page_state(self, shot: str) -> str:
        """What a person would look at when Run All did nothing: the tab, the status bar, prompts, dialogs."""
        current = self.page.locator("#jp-main-dock-panel .lm-TabBar-tab.lm-mod-current").all_inner_texts()
        status = self.page.locator("#jp-main-statusbar").all_inner_texts()
        prompts = self.panel.locator(".jp-CodeCell .jp-InputPrompt").all_inner_texts()
        dialogs = self.page.locator(".jp-Dialog").all_inner_texts()
        path = self.screenshot(shot)
        return (
            f"current tab: {current}; status bar: {[' '.join(s.split()) for s in status]}; "
            f"prompts: {prompts}; dialogs: {dialogs}; screenshot: {path}"
        )

    def error_outputs(self) -> list[str]:
        texts: list[str] = self.panel.locator(ERROR_OUTPUTS).all_inner_texts()
        return texts

    def assert_no_error_outputs(self) -> None:
        errors = self.error_outputs()
        assert not errors, "cells produced error output:\n" + "\n---\n".join(e[:2000] for e in errors)
        # textContent, as _RUN_ALL_DONE reads them: innerText is "" for a cell JupyterLab's windowed notebook
        # does not render (scrolled out of view), which a long plan output does to the parameters cell (seen
        # 6 Dec 2026 with jupyterlab 4.6.6: "cells not run: ['', '[2]:']" after every cell had run)
        prompts = self.panel.locator(".jp-CodeCell .jp-InputPrompt").all_text_contents()
        assert all(re.fullmatch(r"\[\d+\]:", p.strip()) for p in prompts), f"cells not run: {prompts}"

    def step_output(self, step: str, title: str | None = None) -> Locator:
        """A step's rendered result (``render_html``); ``title`` picks one when the cell shows several."""
        found = self.panel.locator(f'.runbook-step[data-step="{step}"]')
        if title is not None:
            found = found.filter(has=self.page.locator("h3", has_text=title))
        return found

    def open_node_table(self, result: Locator) -> dict[str, str]:
        """Unfold "All nodes" as a user would and read node → status."""
        # the node table's fold; verify also folds the node names of its "What was checked" groups
        details = result.locator("details").filter(has_text="All nodes")
        details.locator("summary").click()
        rows = details.locator("tr")
        expect(rows.first).to_be_visible()
        table: dict[str, str] = {}
        for row in rows.all():
            cells = row.locator("td").all_inner_texts()
            if cells:
                table[cells[0].strip()] = cells[2].strip()
        return table

    def button(self, label: str) -> Locator:
        # Role lookup of a widget button fails with "element is not visible" (test-infra.md §4).
        return self.panel.locator("button.jupyter-button", has_text=label)

    def log_console_count(self) -> str:
        """JupyterLab's status-bar log counter: kernel output with no cell (e.g. a button callback's error)."""
        item = self.page.locator(".jp-LogConsoleStatusItem")
        return item.inner_text().strip() if item.count() else ""

    def follow_link(self, name: str, target: str) -> None:
        link = self.panel.locator(".jp-RenderedMarkdown a", has_text=name).first
        link.scroll_into_view_if_needed()
        link.click()
        self.wait_for_tab(target)

    def center(self, locator: Locator) -> None:
        locator.evaluate("e => e.scrollIntoView({block: 'center'})")

    def screenshot(self, name: str) -> Path:
        path = self.screenshots / f"{name}.png"
        self.page.screenshot(path=str(path))
        return path


def check_clean(console: Any) -> None:
    assert not console.errors, "browser console errors:\n" + "\n".join(console.errors)
