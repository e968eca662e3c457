"""The chart repository parameter on the real control plane: an air-gapped site's mirror, with the real helm 4.1.4.

The simulator serves the same charts at two URLs (``endpoints.json`` ``charts`` and ``charts_mirror``,
``runbook_lib/sim/chartrepo.py``) and logs every request each one answers, so a test can show which one helm
read. A ``repo_url`` the parameters set is used as given on target simulated too (``Params.with_chart_repo``).
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest

from runbook_lib.model.params import Params, validate
from runbook_lib.steps.context import Context, connect
from runbook_lib.steps.kubernetes import kubernetes_layer
from tests.realplane import real_cluster

pytestmark = pytest.mark.slow

GPUS_WITHIN = 180  # as tests/test_step_kubernetes.py: the step returns as soon as the GPUs are advertised


def _requests(state_dir: Path, log: str) -> list[str]:
    path = state_dir / "logs" / log
    return path.read_text().splitlines() if path.exists() else []


def _with_repo(params: Params, url: str, state_dir: Path) -> Context:
    """A context for these parameters with ``device_plugin.repo_url: <url>`` in them, as a user writes it."""
    data: dict[str, Any] = params.model_dump(mode="json", exclude_unset=True)
    data["device_plugin"] = {**data.get("device_plugin", {}), "repo_url": url}
    return connect(validate(data, source="test"), state_dir=state_dir)


def test_the_step_installs_from_the_mirror_of_the_parameters_and_a_wrong_mirror_changes_nothing(
    tmp_path: Path,
) -> None:
    """A wrong mirror (a port where nothing listens: helm's ``cannot be reached``) fails the step naming the
    parameter and the URL before anything is changed, where it used to create RuntimeClass ``nvidia`` first;
    the mirror the simulator serves installs the release, and the default repository sees no request."""
    with socket.socket() as closed, real_cluster(tmp_path, scenario="gpu-ready", apply=True) as (params, _):
        closed.bind(("127.0.0.1", 0))  # bound, never listening: a connection is refused, and no one takes it
        wrong = f"http://127.0.0.1:{closed.getsockname()[1]}/nvidia"
        ctx = _with_repo(params, wrong, tmp_path)
        failed = kubernetes_layer(ctx, timeout_s=GPUS_WITHIN)
        assert not failed.ok
        (check,) = [c for c in failed.checks if not c.ok]
        assert "device_plugin.repo_url" in check.message and wrong in check.message, check
        assert "device_plugin.repo_url" in check.fix, check
        assert ctx.kube.runtime_class("nvidia") is None
        assert ctx.helm.release("nvidia-device-plugin", "kube-system") is None
        assert ctx.journal.changes() == []

        mirror = json.loads((tmp_path / "endpoints.json").read_text())["charts_mirror"]
        ctx = _with_repo(params, mirror, tmp_path)
        assert ctx.plan.helm.repo_url == mirror
        done = kubernetes_layer(ctx, timeout_s=GPUS_WITHIN)
        assert done.ok, done.to_dict()
        assert all(n.data["allocatable_gpus"] == 1 for n in done.nodes)
    served = _requests(tmp_path, "charts-mirror.log")
    assert "GET /nvidia/index.yaml 200" in served
    assert any(
        line.startswith("GET /nvidia/nvidia-device-plugin-") and line.endswith(" 200") for line in served
    )
    assert _requests(tmp_path, "charts.log") == []


def _repository_entry(ctx: Context, name: str) -> dict[str, Any]:
    """The entry of this machine's helm for repository ``name``, as helm wrote it in its repositories file."""
    import yaml

    path = ctx.helm.run(["env", "HELM_REPOSITORY_CONFIG"]).stdout.strip()
    entries = yaml.safe_load(Path(path).read_text())["repositories"]
    return next(e for e in entries if e["name"] == name)


def test_the_users_own_repository_entry_is_used_as_it_is_and_never_overwritten(tmp_path: Path) -> None:
    """A site's helm often has the repository already, with what it needs to read it: credentials (NGC), a CA
    file (a mirror). The step ran ``helm repo add <name> <url> --force-update``, which replaces the whole entry
    (helm@v4.1.4 pkg/cmd/repo_add.go:93, 191-216): the credentials were erased from the user's helm. Now an entry
    with the planned URL is used as it is; one with another URL and credentials stops the step before any change,
    naming both URLs, the parameter and what replacing it would erase, and stays as it was."""
    with real_cluster(tmp_path, scenario="gpu-ready", apply=True) as (params, ctx):
        urls = json.loads((tmp_path / "endpoints.json").read_text())
        site = ["--username", "site-robot", "--password", "robot-pass-51c9"]
        ctx.helm.run(["repo", "add", "nvdp", urls["charts_mirror"], *site]).check("helm repo add")

        refused = kubernetes_layer(_with_repo(params, urls["charts"], tmp_path), timeout_s=GPUS_WITHIN)
        (check,) = [c for c in refused.checks if not c.ok]
        assert "device_plugin.repo_url" in check.message, check
        assert urls["charts"] in check.message and urls["charts_mirror"] in check.message, check
        assert "with a username, a password that replacing it would erase" in check.message, check
        assert "robot-pass-51c9" not in json.dumps(refused.to_dict())
        assert f"device_plugin.repo_url: {urls['charts_mirror']}" in check.fix, check
        assert ctx.kube.runtime_class("nvidia") is None and not refused.data.get("changes")
        assert _repository_entry(ctx, "nvdp")["url"] == urls["charts_mirror"]

        mirror = _with_repo(params, urls["charts_mirror"], tmp_path)
        done = kubernetes_layer(mirror, timeout_s=GPUS_WITHIN)
        assert done.ok, done.to_dict()
        entry = _repository_entry(ctx, "nvdp")
        assert entry["username"] == "site-robot" and entry["password"] == "robot-pass-51c9", entry
        assert not [e.argv for e in mirror.journal.entries if e.argv[1:3] == ("repo", "add")]


def test_an_entry_that_holds_only_its_url_follows_the_parameter(tmp_path: Path) -> None:
    """The runbook's own entry from a run with another mirror (or the simulator's repository on another port after
    a restart) holds nothing an overwrite could lose, so a changed ``repo_url`` replaces it, as before."""
    with real_cluster(tmp_path, scenario="gpu-ready", apply=True) as (params, ctx):
        urls = json.loads((tmp_path / "endpoints.json").read_text())
        ctx.helm.run(["repo", "add", "nvdp", urls["charts_mirror"]]).check("helm repo add")
        done = kubernetes_layer(_with_repo(params, urls["charts"], tmp_path), timeout_s=GPUS_WITHIN)
        assert done.ok, done.to_dict()
        assert _repository_entry(ctx, "nvdp")["url"] == urls["charts"]
