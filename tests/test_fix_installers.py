"""Fix commands name each node's own platform installer (``steps.fixes.own_installers``)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from runbook_lib.model.versions import TalosVersion
from runbook_lib.steps import fixes
from runbook_lib.steps.results import Check, NodeResult, StepResult

PARAMS = Path(__file__).resolve().parents[1] / "params" / "simulated.yaml"
UPGRADE = "talosctl -n {a} upgrade --image factory.talos.dev/metal-installer/abc:v1.12.7"


def _result(*platforms: str | None) -> tuple[StepResult, dict[str, str | None]]:
    result = StepResult(step="image", applied=False)
    for index, _platform in enumerate(platforms):
        address = f"10.5.0.{11 + index}"
        node = NodeResult(node=f"gpu-{index}", address=address)
        node.checks = [Check("schematic and extensions", False, "rolled back", fix=UPGRADE.format(a=address))]
        result.nodes.append(node)
    return result, {f"10.5.0.{11 + i}": p for i, p in enumerate(platforms)}


def test_each_nodes_fix_names_the_installer_of_its_own_platform() -> None:
    """An AWS node's fix named metal-installer while the image step upgrades it with aws-installer (image-factory
    internal/frontend/http/registry.go:74-100; talos@v1.14.1 pkg/images/images.go:79); a node whose platform is
    unknown, or no image name can carry, keeps the metal one (Talos profiles review, 7 Dec 2026)."""
    result, platforms = _result("aws", "metal", None, "Not An Image")
    assert all(fixes.names_metal_installer(node) for node in result.nodes)
    fixes.own_installers(result, platforms, TalosVersion.parse("v1.12.7"))
    aws, metal, unknown, bad = (node.checks[0].fix for node in result.nodes)
    assert "factory.talos.dev/aws-installer/abc:v1.12.7" in aws and "metal" not in aws
    assert all("/metal-installer/" in fix for fix in (metal, unknown, bad))
    assert not fixes.names_metal_installer(result.nodes[0])


class _PlatformTalosctl:
    """Answers ``get platformmetadata`` as ``Talosctl.get`` returns it (by node), and counts the nodes asked."""

    def __init__(self, platform: str) -> None:
        self.platform = platform
        self.asked: list[list[str]] = []

    def get(self, resource: str, addresses: list[str]) -> Any:
        from runbook_lib.model.parsers import TalosResource

        assert resource == "platformmetadata"
        self.asked.append(list(addresses))
        spec = {"platform": self.platform}
        found = {
            a: [TalosResource(a, "runtime", "PlatformMetadatas", "metadata", "1", spec=spec)]
            for a in addresses
        }
        return SimpleNamespace(by_node=lambda: found)


def test_a_cuda_test_fix_upgrades_the_node_by_its_address_to_its_own_schematic_and_installer(
    tmp_path: Path,
) -> None:
    """cuda-test filled the Kubernetes name into ``talosctl -n`` and the fleet's schematic into the upgrade, which
    drops a node's own extra extensions, and named metal-installer on AWS (reviews of 6b1cc22 and f73d516). The
    platform is read only for the node whose fix needs it."""
    from runbook_lib.model.params import load_params, validate
    from runbook_lib.steps import cudatest
    from runbook_lib.steps.context import connect

    data = load_params(PARAMS).public_dict()
    data["nodes"][1]["overrides"] = {"extra_extensions": ["siderolabs/iscsi-tools"]}
    for name in ("talosconfig", "kubeconfig"):  # a real cluster's: connect() contacts nothing
        (tmp_path / name).write_text("{}\n")
        data[name] = str(tmp_path / name)
    data["target"] = "cluster"
    params = validate(data, source="test")
    stub = _PlatformTalosctl("aws")
    ctx = replace(connect(params), talosctl=stub)
    node = params.nodes[1]
    own = next(p.schematic_id for p in ctx.plan.nodes if p.name == node.name)
    assert own != ctx.plan.schematic_id, "the node's overrides give it a schematic of its own"
    pod = cudatest.TestPod("smi", node, "cuda-smi-x", {})
    check = cudatest._diagnosed(ctx, "nvidia-smi", pod, "failed", 'no runtime for "nvidia" is configured')
    result = StepResult(step="cuda-test", applied=True)
    result.nodes = [NodeResult(node=n.name, address=n.address) for n in params.nodes]
    result.nodes[1].checks = [check]
    fixes.name_own_installers(ctx, result)
    fix = result.nodes[1].checks[0].fix
    assert f"talosctl -n {node.address} upgrade --image " in fix and f"/aws-installer/{own}:" in fix, fix
    assert stub.asked == [[node.address]], "only the node with an upgrade fix is asked its platform"
