"""Fix commands name each node's own platform installer (``steps.fixes.own_installers``)."""

from __future__ import annotations

from runbook_lib.model.versions import TalosVersion
from runbook_lib.steps import fixes
from runbook_lib.steps.results import Check, NodeResult, StepResult

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
