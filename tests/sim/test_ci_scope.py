"""What CI builds before ``make test`` (issue 14 point 1: "at least the current releases 1.10-1.13 and the newest
1.14 tag available"): without a release's talosctl its tests skip, so a release dropped from ``.ci/run`` would
leave CI green with that release untested."""

from __future__ import annotations

from runbook_lib.model.versions import TalosVersion
from tests.sim.talosctl_legs import ci_releases, not_built


def test_ci_builds_the_talosctl_of_talos_1_10_to_1_14() -> None:
    minors = {TalosVersion.parse(release).minor for release in ci_releases()}
    assert {10, 11, 12, 13, 14} <= minors, ci_releases()


def test_a_skipped_release_says_whether_ci_builds_it() -> None:
    assert "one of those .ci/run builds" in not_built("v1.10.0")
    assert ".ci/run does not build it" in not_built("v1.9.0")
    assert "tools/build-talosctl.sh v1.9.0" in not_built("v1.9.0")
