"""Installing the GPU Operator chart by hand with the real helm 4.1.4 on the real control plane and the simulated
GPU Operator: ported from tests/sim/test_helm.py, which checked these against the Python helm and Python API
retired on 2 Dec 2026 (its NFD case: our gpu-operator chart has no NFD subchart, so the operands stand in).

A RuntimeClass ``nvidia`` applied by hand earlier (the device-plugin route's manifest) does not stop the GPU
Operator route. Why it holds on a real cluster: the pods the operator starts only name the class (``runtimeClassName: nvidia``),
and the API server admits a pod whose RuntimeClass exists, whoever made it (kubernetes@v1.35.0
plugin/pkg/admission/runtimeclass/admission.go); the runbook's check asks for name and handler only
(runbook_lib/steps/operator_runtime_class.py). Whether the real operator then adopts the hand-made object
(``transformRuntimeClass`` in gpu-operator@v26.3.3 controllers/object_controls.go) was not checked in its source
this session; the simulated operator leaves it as it is (runbook_lib/sim/gpuoperator.py ``_runtime_classes``), so
this test asserts nothing about its owner.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from runbook_lib.sim import realkube
from runbook_lib.sim.state import load_nodes
from runbook_lib.steps.kubernetes import kubernetes_layer
from tests.sim.test_gpu_operator_real import (  # noqa: F401 - tools: a fixture
    NAMESPACE,
    WORKERS,
    context,
    kubectl,
    started,
    tools,
)
from tests.sim.waiting import wait_for

pytestmark = pytest.mark.slow

HAND_MADE = "apiVersion: node.k8s.io/v1\nkind: RuntimeClass\nmetadata: {name: nvidia}\nhandler: nvidia\n"


def test_a_leftover_hand_made_runtime_class_does_not_stop_the_gpu_operator_route(
    tools: realkube.Tools,  # noqa: F811 - the fixture imported above
    tmp_path: Path,
) -> None:
    with started(tools, tmp_path, "gpu-ready") as state:
        manifest = tmp_path / "runtimeclass.yaml"
        manifest.write_text(HAND_MADE)
        kubectl(state, "apply", "-f", str(manifest))
        result = kubernetes_layer(context(state), apply=True, timeout_s=180)
        assert result.ok, result.to_dict()
        gpus = {n.name: len(n.gpus) for n in load_nodes(state) if n.name in WORKERS}
        assert {n.node: n.data["allocatable_gpus"] for n in result.nodes} == gpus
        runtime_class = json.loads(kubectl(state, "get", "runtimeclass", "nvidia", "-o", "json"))
        assert runtime_class["handler"] == "nvidia"


def test_the_operator_in_a_namespace_helm_creates_gets_no_operand_past_pod_security(
    tools: realkube.Tools,  # noqa: F811 - the fixture imported above
    tmp_path: Path,
) -> None:
    """``helm install ... --create-namespace`` makes a namespace without Pod Security labels, where Talos's
    admission defaults enforce baseline (the reason the runbook labels its namespace privileged): the operator
    runs, but the API server refuses every operand pod for its hostPath volumes, as the DaemonSets' events say
    (kube-apiserver v1.36.0's PodSecurity admission, k8s.io/pod-security-admission policy
    check_hostPathVolumes.go)."""
    with started(tools, tmp_path, "gpu-ready") as state:
        helm = [str(state / "bin" / "helm"), "--kubeconfig", str(state / "kubeconfig")]
        mirror = json.loads((state / "endpoints.json").read_text())["charts_mirror"]
        install = ["install", "gpu-operator", "nvidia/gpu-operator", "-n", NAMESPACE, "--create-namespace"]
        off = ["--set", "driver.enabled=false", "--set", "toolkit.enabled=false"]
        for argv in (["repo", "add", "nvidia", mirror], [*install, *off]):
            proc = subprocess.run([*helm, *argv], capture_output=True, text=True, timeout=120, check=False)
            assert proc.returncode == 0, proc.stderr

        def refused() -> list[str]:
            events = json.loads(
                kubectl(
                    state,
                    "get",
                    "events",
                    "-n",
                    NAMESPACE,
                    "--field-selector",
                    "reason=FailedCreate",
                    "-o",
                    "json",
                )
            )["items"]
            return [e["message"] for e in events]

        messages = wait_for(refused, 120)
        assert 'is forbidden: violates PodSecurity "baseline:latest": hostPath volumes (volume' in messages[0]
