"""The suite never falls back to the Python talosctl unnoticed because simnode's sources changed without
``make tools`` (``tests/conftest.py`` ``pytest_sessionstart`` → ``tests/simcluster.py``
``ensure_current_simnode``): with a talosctl built and simnode stale, simnode is rebuilt, and a failed build ends
the session with what to do."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from runbook_lib.sim import realkube, realtalos
from tests.simcluster import StaleSimnode, build_simnode, ensure_current_simkube, ensure_current_simnode

REPO = Path(__file__).resolve().parents[1]


def _talosctl_cache(tmp_path: Path) -> Path:
    """A tools cache where ``make tools`` built talosctl v1.12.0 and no simnode for these sources."""
    cache = tmp_path / "cache"
    talosctl = cache / "talosctl" / "v1.12.0" / "talosctl"
    talosctl.parent.mkdir(parents=True)
    talosctl.write_text("#!/bin/sh\n")
    talosctl.chmod(0o755)
    return cache


def _cache_with_talosctl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = _talosctl_cache(tmp_path)
    monkeypatch.setenv("RUNBOOK_TOOLS_CACHE", str(cache))
    monkeypatch.setenv(realtalos.MODE_ENV, "auto")
    return cache


def _fake_build(cache: Path, calls: list[str], out: Path | None = None) -> Path:
    calls.append("build")
    out = out or cache / "simnode" / realtalos.simnode_hash() / "simnode"
    out.parent.mkdir(parents=True)
    out.write_text("#!/bin/sh\n")
    out.chmod(0o755)
    return out


def test_a_stale_simnode_is_rebuilt_when_a_talosctl_is_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = _cache_with_talosctl(tmp_path, monkeypatch)
    calls: list[str] = []
    assert realtalos.choose("v1.12.7", None, "fresh").real is False  # what auto would silently do
    built = ensure_current_simnode(lambda: _fake_build(cache, calls))
    assert calls == ["build"] and built == realtalos.cached_simnode()
    assert realtalos.choose("v1.12.7", None, "fresh").real  # the real talosctl now
    assert ensure_current_simnode(lambda: _fake_build(cache, calls)) is None and calls == ["build"]


def test_a_failed_build_says_what_is_stale_and_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _cache_with_talosctl(tmp_path, monkeypatch)

    def broken() -> Path:
        raise StaleSimnode("tools/build-simnode.sh failed: ./main.go:1:1: syntax error")

    with pytest.raises(StaleSimnode) as caught:
        ensure_current_simnode(broken)
    message = str(caught.value)
    assert "simnode is not built for the sources" in message and realtalos.simnode_hash() in message
    assert "syntax error" in message and "make tools" in message and "RUNBOOK_SIM_TALOSCTL=python" in message


@pytest.mark.parametrize("case", ["no talosctl built", "python chosen"])
def test_nothing_is_built_when_auto_could_not_run_the_real_talosctl_anyway(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    if case == "no talosctl built":
        monkeypatch.setenv("RUNBOOK_TOOLS_CACHE", str(tmp_path / "empty"))
    else:
        _cache_with_talosctl(tmp_path, monkeypatch)
        monkeypatch.setenv(realtalos.MODE_ENV, "python")
    assert ensure_current_simnode(lambda: pytest.fail("nothing to build")) is None


def test_the_build_script_answers_with_the_cached_simnode_of_these_sources() -> None:
    """The session start built it if it was stale, so the script finds it in the cache (no Go build here)."""
    if realtalos.cached_simnode() is None:
        pytest.skip("simnode is not built (no talosctl built: the session start did not need it)")
    assert build_simnode() == realtalos.cached_simnode()


def test_a_session_ends_before_any_test_when_the_stale_simnode_does_not_build(tmp_path: Path) -> None:
    """Through pytest itself: a cache with a talosctl and no simnode, where the build cannot write simnode (its
    cache folder is a file): the session stops with the reason before its one test runs."""
    cache = _talosctl_cache(tmp_path)
    (cache / "simnode").write_text("not a folder")
    env = {**os.environ, "RUNBOOK_TOOLS_CACHE": str(cache), "RUNBOOK_SIM_TALOSCTL": "auto"}
    one_test = f"{Path(__file__).relative_to(REPO)}::test_the_build_script_answers_with_the_cached_simnode_of_these_sources"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", one_test, "-q", "-p", "no:cacheprovider"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        check=False,
        timeout=120,
    )
    out = done.stdout + done.stderr
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, out
    assert "simnode is not built for the sources" in out and "tools/build-simnode.sh failed" in out, out
    assert "passed" not in out and "skipped" not in out, out


def _kube_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A tools cache where ``make kube-tools`` built Kubernetes v1.35.0 and no simkube for these sources."""
    cache = tmp_path / "cache"
    apiserver = cache / "kube" / "v1.35.0" / "bin" / "kube-apiserver"
    apiserver.parent.mkdir(parents=True)
    apiserver.write_text("#!/bin/sh\n")
    apiserver.chmod(0o755)
    monkeypatch.setenv("RUNBOOK_TOOLS_CACHE", str(cache))
    monkeypatch.delenv(realkube.MODE_ENV, raising=False)
    return cache


def _fake_simkube_build(cache: Path, calls: list[str]) -> Path:
    return _fake_build(cache, calls, cache / "simkube" / realkube.simkube_key() / "simkube")


def test_a_stale_simkube_is_rebuilt_when_a_control_plane_is_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the suite's Kubernetes side unset (real where built), simkube sources edited since ``make
    kube-tools`` would leave every test that starts the simulator without a control plane (``realkube.find_tools``
    says "not built"); the session start rebuilds it, as it does simnode."""
    cache = _kube_cache(tmp_path, monkeypatch)
    calls: list[str] = []
    built = ensure_current_simkube(lambda: _fake_simkube_build(cache, calls))
    assert calls == ["build"] and built is not None and built.is_file()
    assert ensure_current_simkube(lambda: _fake_simkube_build(cache, calls)) is None and calls == ["build"]


def test_simkube_is_left_alone_without_a_control_plane(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = _kube_cache(tmp_path, monkeypatch)
    calls: list[str] = []
    monkeypatch.setenv("RUNBOOK_TOOLS_CACHE", str(tmp_path / "empty"))
    assert ensure_current_simkube(lambda: _fake_simkube_build(cache, calls)) is None and calls == []


def test_a_failed_simkube_build_says_what_is_stale_and_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _kube_cache(tmp_path, monkeypatch)

    def broken() -> Path:
        raise StaleSimnode("tools/build-simkube.sh failed: ./main.go:1: syntax error")

    with pytest.raises(StaleSimnode) as failed:
        ensure_current_simkube(broken)
    message = str(failed.value)
    assert "simkube" in message and "syntax error" in message and "make kube-tools" in message
    assert "RUNBOOK_SIM_KUBE=python" not in message  # retired (issue 15): no longer a way out
