"""The two legs the tests of the Python talosctl run on (issue 14, point 4): the Python talosctl, and the real
talosctl of the same release against simnode serving the same simulated cluster.

simnode gets the nodes file ``runbook_lib.sim.realtalos`` derives from the cluster's node files (what ``runbook
sim up`` does on the real path), so both legs answer from one node state. The real leg is marked slow and
skipped where it cannot run: no Go to build the binaries (``tests/sim/test_real_talosctl.py`` ``build``), or a
release simnode does not serve.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from runbook_lib.sim import realtalos
from runbook_lib.sim.state import load_nodes, minor_of, sim_paths

#: The releases built here when missing (Talos 1.12's, ``make setup``'s default, and 1.13's); the others skip.
SET_UP_RELEASES = ("v1.12.0", "v1.13.0")
CI_RUN = Path(__file__).resolve().parents[2] / ".ci" / "run"


#: ``.ci/run``'s one command line that builds the talosctl releases (``time`` before it allowed; a comment is not one).
CI_TOOLS_LINE = re.compile(r'^[ \t]*(?:time[ \t]+)?make tools TALOS_VERSIONS="([^"]*)"', re.MULTILINE)


def ci_releases() -> tuple[str, ...]:
    """The talosctl releases ``.ci/run`` builds before ``make test``: its one ``make tools TALOS_VERSIONS="..."``
    line; empty when ``.ci/run`` is missing (an installed copy) or has no such line, or more than one."""
    try:
        found = CI_TOOLS_LINE.findall(CI_RUN.read_text(encoding="utf-8"))
    except OSError:
        return ()
    return tuple(found[0].split()) if len(found) == 1 else ()


def not_built(release: str) -> str:
    """Why a test of ``release``'s talosctl skips: the command that builds it and whether CI does (on CI, a
    release it builds that is missing means its ``make tools`` did not run)."""
    if release in ci_releases():
        ci = ".ci/run builds it: on CI, its make tools did not run (go missing?)"
    else:
        ci = ".ci/run does not build it"
    return f"talosctl {release} is not built (tools/build-talosctl.sh {release}; {ci})"


def built_talosctl(release: str) -> Path:
    """The cached talosctl of exactly ``release`` (not another patch of its minor); skip, saying how to build it
    and whether CI does, when it is not built: a cold build inside pytest costs 5-8 min of CPU."""
    path = realtalos.cached_talosctl(release)
    if path is None or path.parent.name != release:
        pytest.skip(not_built(release))
    return path


def serve_with_simnode(state: Path, release: str) -> Path:
    """Serve the cluster in ``state`` to the real talosctl of ``release`` through simnode (the nodes file
    ``realtalos`` derives from the node files), keeping the fake's ``bin/talosctl-python`` and
    ``talosconfig-python``; returns the real binary. Skips when simnode does not serve the release or Go is
    missing (``build``)."""
    if minor_of(release) not in realtalos.SIMNODE_RELEASES:
        pytest.skip(f"simnode does not serve Talos {release} nodes yet (realtalos.SIMNODE_RELEASES)")
    if release not in SET_UP_RELEASES:
        built_talosctl(release)
    # imported here: test_real_talosctl imports test_talosctl_get, whose fixtures use this module
    from tests.sim.test_real_talosctl import build

    talosctl, simnode = build("build-talosctl.sh", release), build("build-simnode.sh")
    paths = sim_paths(state)
    # realtalos.start points bin/talosctl and the talosconfig at the real pair: keep the fake's first.
    shutil.copy(paths.bin_dir / "talosctl", paths.bin_dir / "talosctl-python")
    shutil.copy(paths.talosconfig, state / "talosconfig-python")
    choice = realtalos.Choice(True, "differential test", str(talosctl), str(simnode))
    realtalos.start(state, choice, load_nodes(state), 0.0)
    return talosctl


LEGS = ("fake", pytest.param("real", marks=pytest.mark.slow))


@dataclass(frozen=True)
class Leg:
    """``talosctl`` as the tests of the fake call it (``tests/sim/talosctl_run.py``), on one leg: the Python
    talosctl, or the real one of the same release against simnode serving the same cluster."""

    name: str
    state: Path
    binary: Path

    def __call__(self, *args: str) -> subprocess.CompletedProcess[str]:
        talosconfig = sim_paths(self.state).talosconfig
        return subprocess.run(
            [str(self.binary), "--talosconfig", str(talosconfig), *args],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    @property
    def real(self) -> bool:
        return self.name == "real"


@contextmanager
def leg(name: str, state: Path, release: str) -> Iterator[Leg]:
    """The cluster already created in ``state``, answered by the fake or (``real``) by the real talosctl."""
    if name == "fake":
        yield Leg(name, state, sim_paths(state).bin_dir / "talosctl")
        return
    talosctl = serve_with_simnode(state, release)
    try:
        yield Leg(name, state, talosctl)
    finally:
        realtalos.stop(state)
