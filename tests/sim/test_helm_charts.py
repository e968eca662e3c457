"""What the simulated charts render per version, and helm's ``--set`` typing, without a cluster.

What the real helm renders from the charts the simulator serves (the device plugin's affinity and its switch, the
GPU Operator's values in the ClusterPolicy, the default namespace's refusal) is checked in
``tests/sim/test_real_helm_charts.py`` (issue 15 item 4); what stays here is the Python helm's own (its flag and
``--set`` parsing, its version pick) and chart versions the simulator's repository does not serve (0.13, 0.14).
"""

from __future__ import annotations

import pytest

from runbook_lib.sim import charts
from runbook_lib.sim.helm.cli import HelmError, parse, parse_duration
from runbook_lib.sim.helm.strvals import parse_set


def _ds(objs: list[dict]) -> dict:
    return next(o for o in objs if o["kind"] == "DaemonSet")


@pytest.mark.parametrize("version", ["0.13.0", "0.14.5"])
def test_charts_before_015_have_no_default_affinity(version: str) -> None:
    _, objs = charts.render("nvidia-device-plugin", version, {}, "nvidia-device-plugin", "kube-system")
    assert "affinity" not in _ds(objs)["spec"]["template"]["spec"]


def test_version_selection_like_helm() -> None:
    assert charts.pick_version(charts.DEVICE_PLUGIN_VERSIONS, None) == "0.20.0"
    assert charts.pick_version(charts.DEVICE_PLUGIN_VERSIONS, "0.17.2") == "0.17.2"
    assert charts.pick_version(charts.DEVICE_PLUGIN_VERSIONS, ">=0.14, <0.15") == "0.14.5"
    assert charts.pick_version(charts.GPU_OPERATOR_VERSIONS, "26.3.1") == "v26.3.1"
    assert charts.pick_version(charts.DEVICE_PLUGIN_VERSIONS, "9.9.9") is None


def test_set_values_are_typed_as_helm_types_them() -> None:
    vals: dict = {}
    parse_set("a.b=true,c=3,d=null,e=0.13,f[1].g=x,h={a,b}", vals)
    assert vals == {
        "a": {"b": True},
        "c": 3,
        "d": None,
        "e": "0.13",
        "f": [None, {"g": "x"}],
        "h": ["a", "b"],
    }
    strings: dict = {}
    parse_set("c=3", strings, as_string=True)
    assert strings == {"c": "3"}


def test_flag_parsing_errors_and_durations() -> None:
    with pytest.raises(HelmError, match="unknown flag: --bogus"):
        parse(["install", "a", "b", "--bogus"])
    with pytest.raises(HelmError, match=r"unknown shorthand flag: 'z' in -z"):
        parse(["list", "-z"])
    args = parse(
        ["-n", "kube-system", "upgrade", "--install", "x", "repo/chart", "--set=a=1", "--set", "b=2"]
    )
    assert (args.command, args.positional, args.many("set"), args.one("namespace")) == (
        "upgrade",
        ["x", "repo/chart"],
        ["a=1", "b=2"],
        "kube-system",
    )
    assert parse_duration("5m0s") == 300 and parse_duration("1h30m") == 5400
    with pytest.raises(HelmError, match='invalid duration "5 minutes"'):
        parse_duration("5 minutes")
