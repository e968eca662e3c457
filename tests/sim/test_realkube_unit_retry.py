"""simkube's components bind ports simkube asked the kernel for a moment earlier (simkube/supervise.go
``freePorts``): another process can take one in between, and CI105 (stop 53) failed with kube-apiserver's "bind:
address already in use". ``realkube._start_simkube`` tries once more, emptying a first start's half state
directory, which simkube refuses to resume without its mark."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runbook_lib.sim import realkube

BIND = (
    "simkube did not start: simkube: kube-apiserver did not become ready: exited: exit status 1 | E1207 "
    '"command failed" err="failed to create listener: failed to listen on 127.0.0.1:39881: listen tcp '
    '127.0.0.1:39881: bind: address already in use"'
)


def _starts(monkeypatch: pytest.MonkeyPatch, errors: list[str]) -> list[bool]:
    """Each try of ``_start_simkube_once`` records whether the kube state directory held files; the first
    ``errors`` are raised in turn."""
    seen: list[bool] = []

    def once(state_dir: Path, *_a: Any) -> tuple[Any, dict[str, Any]]:
        kube = realkube._paths(state_dir)["kube"]
        seen.append(kube.exists() and any(kube.iterdir()))
        kube.mkdir(parents=True, exist_ok=True)
        (kube / "pki").mkdir(exist_ok=True)  # what a start that failed half-way leaves
        if errors:
            raise RuntimeError(errors.pop(0))
        return None, {"server": "https://127.0.0.1:1"}

    monkeypatch.setattr(realkube, "_start_simkube_once", once)
    return seen


def test_a_port_taken_between_simkube_asking_and_binding_is_tried_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = _starts(monkeypatch, [BIND])
    _proc, ready = realkube._start_simkube(tmp_path, None, tmp_path, tmp_path)  # type: ignore[arg-type]
    assert ready["server"] and seen == [False, False], "the half state was emptied before the second try"


def test_other_failures_and_a_second_lost_port_are_not_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = _starts(monkeypatch, ["simkube did not start: etcd: exited"])
    with pytest.raises(RuntimeError, match="etcd"):
        realkube._start_simkube(tmp_path, None, tmp_path, tmp_path)  # type: ignore[arg-type]
    assert len(seen) == 1
    seen = _starts(monkeypatch, [BIND, BIND])
    with pytest.raises(RuntimeError, match="address already in use"):
        realkube._start_simkube(tmp_path / "b", None, tmp_path, tmp_path)  # type: ignore[arg-type]
    assert len(seen) == 2


def test_a_resumed_state_is_kept_for_the_second_try(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kube = realkube._paths(tmp_path)["kube"]
    kube.mkdir(parents=True)
    (kube / realkube.SIMKUBE_MARK).write_text("{}")  # an earlier start finished: its etcd data is the cluster
    seen = _starts(monkeypatch, [BIND])
    realkube._start_simkube(tmp_path, None, tmp_path, tmp_path)  # type: ignore[arg-type]
    assert seen == [True, True] and (kube / realkube.SIMKUBE_MARK).exists()
