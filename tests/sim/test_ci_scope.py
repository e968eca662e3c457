"""What CI builds before ``make test`` (issue 14 point 1: "at least the current releases 1.10-1.13 and the newest
1.14 tag available"): without a release's talosctl its tests skip, so a release dropped from ``.ci/run`` would
leave CI green with that release untested.  The releases are the ones the tests ask for by exact tag
(``talosctl_legs.built_talosctl``, which ``serve_with_simnode`` calls too, wants that tag's build, not another patch of the minor)."""

from __future__ import annotations

from pathlib import Path

import pytest

from runbook_lib.model.versions import TalosVersion
from tests.sim import talosctl_legs, test_fake_vs_real_talosctl, test_real_talos_110_111, test_real_talos_114
from tests.sim.talosctl_legs import ci_releases, not_built


def _current(release: str) -> bool:
    """Talos 1.10 to 1.14: the releases issue 14 names."""
    version = TalosVersion.parse(release)
    return (version.major, version.minor) >= (1, 10)


def test_ci_builds_the_talosctl_tags_the_tests_of_talos_1_10_to_1_14_run() -> None:
    wanted = {client for _nodes, client in test_real_talos_110_111.RELEASES if _current(client)}
    wanted |= {release for release in test_fake_vs_real_talosctl.RELEASES if _current(release)}
    wanted.add(test_real_talos_114.CLIENT)
    assert {TalosVersion.parse(r).minor for r in wanted} >= {10, 11, 12, 13, 14}, wanted
    assert wanted <= set(ci_releases()), f".ci/run builds {ci_releases()}, the tests want {sorted(wanted)}"


def test_a_commented_out_build_line_is_not_a_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ci_run = tmp_path / "run"
    ci_run.write_text('#!/bin/sh\n# time make tools TALOS_VERSIONS="v1.12.0"\nmake test\n', encoding="utf-8")
    monkeypatch.setattr(talosctl_legs, "CI_RUN", ci_run)
    assert ci_releases() == ()
    ci_run.write_text(
        '#!/bin/sh\n    time make tools TALOS_VERSIONS="v1.12.0 v1.13.0"\nmake test\n', encoding="utf-8"
    )
    assert ci_releases() == ("v1.12.0", "v1.13.0")


def test_a_skipped_release_says_whether_ci_builds_it() -> None:
    built_by_ci = ci_releases()[0]
    assert ".ci/run builds it" in not_built(built_by_ci)
    never = "v1.99.0"
    assert never not in ci_releases()
    assert ".ci/run does not build it" in not_built(never)
    assert f"tools/build-talosctl.sh {never}" in not_built(never)
