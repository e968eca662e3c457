"""A RuntimeClass ``nvidia`` applied by hand earlier (the device-plugin route's manifest) does not stop the GPU
Operator route: ported from tests/sim/test_helm.py, which checked it against the Python helm and Python API
retired on 2 Dec 2026, to the real control plane, the real helm 4.1.4 and the simulated GPU Operator.

Why it holds on a real cluster: the pods the operator starts only name the class (``runtimeClassName: nvidia``),
and the API server admits a pod whose RuntimeClass exists, whoever made it (kubernetes@v1.35.0
plugin/pkg/admission/runtimeclass/admission.go); the runbook's check asks for name and handler only
(runbook_lib/steps/operator_runtime_class.py). Whether the real operator then adopts the hand-made object
(``transformRuntimeClass`` in gpu-operator@v26.3.3 controllers/object_controls.go) was not checked in its source
this session; the simulated operator leaves it as it is (runbook_lib/sim/gpuoperator.py ``_runtime_classes``), so
this test asserts nothing about its owner.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runbook_lib.sim import realkube
from runbook_lib.sim.state import load_nodes
from runbook_lib.steps.kubernetes import kubernetes_layer
from tests.sim.test_gpu_operator_real import WORKERS, context, kubectl, started, tools  # noqa: F401 - fixture

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
