"""``device_plugin.repo_url`` / ``gpu_operator.repo_url``: where helm gets the NVIDIA charts.

Air-gapped sites pull charts from a mirror, and the simulated cluster serves its own repository, so the URL
is a parameter. Defaults are the repositories NVIDIA's install docs add: ``helm repo add nvdp
https://nvidia.github.io/k8s-device-plugin`` (NVIDIA/k8s-device-plugin README.md, "Deployment via helm", at
v0.18.0) and ``helm repo add nvidia https://helm.ngc.nvidia.com/nvidia`` (NVIDIA/gpu-operator, the GPU
Operator install docs the Talos 1.13 guide follows).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from runbook_lib.model.params import load_params
from runbook_lib.model.plan import build_plan
from runbook_lib.steps.kubernetes import kubernetes_layer
from tests.simcluster import sim_cluster
from tests.test_params import GOOD, problems, write

MIRROR = "https://charts.example.internal/nvidia"


def test_defaults_are_nvidias_repositories(tmp_path: Path) -> None:
    params = load_params(write(tmp_path, GOOD))
    assert params.device_plugin.repo_url == "https://nvidia.github.io/k8s-device-plugin"
    assert params.gpu_operator.repo_url == "https://helm.ngc.nvidia.com/nvidia"
    assert build_plan(params).helm.repo_url == "https://nvidia.github.io/k8s-device-plugin"
    on_1_13 = load_params(write(tmp_path, {**GOOD, "talos_version": "v1.13.2"}))
    assert build_plan(on_1_13).helm.repo_url == "https://helm.ngc.nvidia.com/nvidia"


@pytest.mark.parametrize(("section", "talos"), [("device_plugin", "v1.12.7"), ("gpu_operator", "v1.13.2")])
def test_a_mirror_url_reaches_the_plan(tmp_path: Path, section: str, talos: str) -> None:
    params = load_params(
        write(tmp_path, {**GOOD, "talos_version": talos, section: {"repo_url": MIRROR + "/"}})
    )
    assert build_plan(params).helm.repo_url == MIRROR  # a trailing slash is dropped, as helm does


@pytest.mark.parametrize("section", ["device_plugin", "gpu_operator"])
@pytest.mark.parametrize(
    "url",
    ["nvidia.github.io/k8s-device-plugin", "oci://nvcr.io/nvidia", "https://", "http://a b", "file:///x"],
)
def test_a_url_that_is_not_http_names_the_parameter(tmp_path: Path, section: str, url: str) -> None:
    (problem,) = problems(tmp_path, {**GOOD, section: {"repo_url": url}})
    assert problem.startswith(f"{tmp_path}/cluster.yaml: {section}.repo_url:")
    assert "must be an http(s) URL of a Helm chart repository" in problem


@pytest.mark.slow
def test_the_kubernetes_step_adds_the_repository_of_the_parameter(tmp_path: Path) -> None:
    """The step runs ``helm repo add nvdp <repo_url>``: here the simulated helm, which knows only NVIDIA's
    URLs, answers the mirror with helm's unreachable-repository error, in helm's words: ``looks like %q is not a
    valid chart repository or cannot be reached`` (helm/helm pkg/cmd/repo_add.go, ``repoAddOptions.run``, the wrap
    of ``DownloadIndexFile``'s error; read at commit 0e32b3a, the helm v3 line of that file; the real helm 4.1.4
    printed the same words for this URL on this machine). The step reports it.

    On the Python helm; the real helm with the simulator's own mirror, and a wrong one that fails the step
    before anything changes: ``tests/sim/test_real_chart_mirror.py``."""
    with sim_cluster(tmp_path, scenario="gpu-ready", device_plugin={"repo_url": MIRROR}) as (params, ctx):
        result = kubernetes_layer(ctx)
    commands = [" ".join(e.argv[1:5]) for e in ctx.journal.entries if e.argv]
    assert f"repo add nvdp {MIRROR}" in commands
    (failed,) = [c for c in result.checks if not c.ok]
    assert MIRROR in failed.message
    assert f'looks like "{MIRROR}" is not a valid chart repository or cannot be reached' in (
        failed.message + failed.evidence
    ), failed


def test_runbook_runs_kernels_still_take_the_simulators_chart_repository(tmp_path: Path) -> None:
    """``runbook run`` writes the validated parameters, defaults included (``Params.public_dict``), to the record's
    ``params.yaml``, and each step's kernel loads them from there: a default ``repo_url`` is then *set* in that
    file.  It must still go to the simulator's repository (an 8-node ``runbook run --apply`` on the real control
    plane failed ``helm repo add nvdp https://nvidia.github.io/k8s-device-plugin``: no network), while a mirror the
    user set is kept."""
    import yaml

    user = load_params(write(tmp_path, {**GOOD, "gpu_operator": {"repo_url": MIRROR}}))
    as_recorded = tmp_path / "params.yaml"
    as_recorded.write_text(yaml.safe_dump(user.public_dict(), sort_keys=False))
    served = load_params(as_recorded).with_chart_repo("http://127.0.0.1:40000")
    assert served.device_plugin.repo_url == "http://127.0.0.1:40000"
    assert served.gpu_operator.repo_url == MIRROR
