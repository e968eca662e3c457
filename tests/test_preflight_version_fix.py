"""What preflight tells a node on another Talos release than the plan (``preflight._version_check``)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from runbook_lib.model.params import load_params
from runbook_lib.model.plan import build_plan
from runbook_lib.steps.preflight import _version_check

PARAMS = Path(__file__).resolve().parents[1] / "params" / "simulated.yaml"


def _ctx(talos: str, *sets: str) -> Any:
    """The parts of a Context the check reads: the parameters and their plan (nothing is contacted)."""
    params = load_params(PARAMS, [f"talos_version={talos}", *sets])
    return SimpleNamespace(params=params, plan=build_plan(params))


def test_a_node_on_an_older_release_is_told_how_to_move_it_keeping_its_extensions() -> None:
    """The fix said "upgrade the node to <release> first": with the stock installer, as a reader would, the node
    loses its NVIDIA extensions (facts §2.1; notebook audit, 7 Dec 2026). No command to paste: a hand-written one
    lacked -n, the run's talosconfig, --preserve and --legacy (review of 77170ba)."""
    check = _version_check(_ctx("v1.12.7"), "v1.12.6")
    assert not check.ok and check.message == "runs v1.12.6, the plan is for v1.12.7"
    assert check.fix.startswith("set talos_version: v1.12.6, or upgrade the node to v1.12.7 first")
    assert (
        "Image Factory installer whose schematic has the extensions it runs" in check.fix
        and "stock installer drops" in check.fix
    )
    assert "talosctl" not in check.fix and "--preserve" not in check.fix and "device plugin" not in check.fix
    assert _version_check(_ctx("v1.12.7"), "v1.12.7").ok


@pytest.mark.parametrize(("layer", "handover"), [("gpu-operator", True), ("device-plugin", False)])
def test_going_to_1_13_the_device_plugin_goes_first_only_where_the_gpu_operator_replaces_it(
    layer: str, handover: bool
) -> None:
    """The Talos 1.13 upgrade notes remove the device plugin before the upgrade, for the GPU Operator; a plan that
    keeps the device plugin by request (kubernetes_layer: device-plugin) must not be told to remove it (review of
    77170ba: GPU pods would stop being scheduled)."""
    check = _version_check(_ctx("v1.13.9", f"kubernetes_layer={layer}"), "v1.12.7")
    assert ("uninstalling the device plugin's Helm release" in check.fix) is handover, check.fix


def test_below_talos_1_8_the_fix_says_preserve() -> None:
    """Up to 1.7 the installer wipes EPHEMERAL (/var) without --preserve (talos@v1.7.0 internal/pkg/install/
    install.go:292; upgrade_risks.preserve_needed), which the image step always passes there."""
    check = _version_check(_ctx("v1.7.6", "track=null"), "v1.7.4")
    assert "and --preserve, as the image step passes it where either release is below Talos 1.8" in check.fix


def test_a_node_newer_than_the_plan_is_not_told_to_upgrade_to_it() -> None:
    """The image step moves no node back ("no downgrade"): the only fix is the parameter."""
    check = _version_check(_ctx("v1.12.6"), "v1.12.7")
    assert check.fix == "set talos_version: v1.12.7", check.fix


def test_before_the_image_factory_no_factory_installer_is_named_and_preserve_still_is() -> None:
    """Below Talos 1.5 there is no Image Factory (boot_assets.py); extensions come from machine.install.extensions.
    --preserve is still needed there (the image step passes it; without it /var is wiped: review of 0225717)."""
    check = _version_check(_ctx("v1.4.8", "track=null"), "v1.3.7")
    assert check.fix == (
        "set talos_version: v1.3.7, or upgrade the node to v1.4.8 first, with --preserve, as the image step passes "
        "it where either release is below Talos 1.8"
    ), check.fix


def test_nodes_on_several_releases_get_one_note_saying_one_run_covers_one_release() -> None:
    """Two nodes, one on v1.12.6 and one on v1.12.8 under a v1.12.7 plan, were told "set talos_version: v1.12.6"
    and "set talos_version: v1.12.8": no one value passes both (cloud-user walkthrough, 7 Dec 2026)."""
    from runbook_lib.steps.preflight import _mixed_releases
    from runbook_lib.steps.results import NodeResult, StepResult

    result = StepResult(step="preflight", applied=False)
    for name, release in (("gpu-1", "v1.12.6"), ("gpu-2", "v1.12.8"), ("gpu-3", "v1.12.6"), ("gpu-4", None)):
        node = NodeResult(node=name, address=f"10.5.0.{name[-1]}")
        node.data = {"talos_version": release} if release else {}
        result.nodes.append(node)
    _mixed_releases(result)
    assert result.notes == [
        "the nodes run 2 Talos releases (v1.12.6: gpu-1, gpu-3; v1.12.8: gpu-2): one run covers one release "
        "(talos_version), so bring them to one release first, or run the runbook for each release with its nodes "
        "(`nodes`, or one parameter file per release)"
    ]
    result.nodes = result.nodes[:1]
    result.notes = []
    _mixed_releases(result)
    assert result.notes == []
