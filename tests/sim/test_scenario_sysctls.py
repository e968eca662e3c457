"""A simulated node that a scenario leaves patched holds its machine config as Talos would hold it.

Talos keeps ``machine.sysctls`` as a map of strings: ``MachineSysctls map[string]string`` (siderolabs/talos
``pkg/machinery/config/types/v1alpha1/v1alpha1_types.go``), and its config schema says each value is a string
(``../shared/reference/talos/config.schema.v1.12.json``, ``v1alpha1.MachineConfig`` ``sysctls``:
``patternProperties`` ``.*`` ``type: string``; the same in v1.10, v1.11 and v1.13). The ``config-patched`` and
``gpu-ready`` scenarios stored ``net.core.bpf_jit_harden`` as the integer 1, a value no Talos node can hold and
not what the runbook's patch writes (the string ``"1"``, ``runbook_lib/model/profiles.py``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from runbook_lib.model.profiles import profile_for
from runbook_lib.sim import cluster
from runbook_lib.sim.state import load_nodes, runtime

SCHEMAS = Path(__file__).resolve().parents[3] / "shared" / "reference" / "talos"


def _v1alpha1_errors(doc: dict[str, Any], minor: int) -> list[str]:
    """What Talos's config schema of ``1.<minor>`` says is wrong in the ``v1alpha1`` document ``doc``."""
    jsonschema = pytest.importorskip("jsonschema")
    path = SCHEMAS / f"config.schema.v1.{minor}.json"
    if not path.exists():
        pytest.skip(f"{path} not present (../shared is not beside the project)")
    schema = json.loads(path.read_text(encoding="utf-8"))
    validator = jsonschema.Draft202012Validator({"$defs": schema["$defs"], "$ref": "#/$defs/v1alpha1.Config"})
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]


@pytest.mark.parametrize("scenario", ["config-patched", "gpu-ready"])
@pytest.mark.parametrize("minor", [10, 11, 12])
def test_a_patched_scenario_node_holds_the_sysctl_as_talos_and_the_runbook_do(
    tmp_path: Path, scenario: str, minor: int
) -> None:
    cluster.create(tmp_path, cluster.ClusterSpec(workers=1, talos_version=f"1.{minor}", scenario=scenario))
    worker = next(n for n in load_nodes(tmp_path) if n.role == "worker")
    (v1alpha1,) = [doc for doc in worker.machine_config if doc.get("version") == "v1alpha1"]
    assert _v1alpha1_errors(v1alpha1, minor) == []
    assert v1alpha1["machine"]["sysctls"] == dict(profile_for(f"v1.{minor}.0").sysctls)
    assert runtime(worker).bpf_jit_harden == 1  # the simulated node still applies it
