"""Preflight and the talosctl client version (issue 13, shared/docs/reality-gaps.md §1 finding 9)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from runbook_lib.clients.helm import Helm
from runbook_lib.sim import catalog
from runbook_lib.steps.preflight import preflight
from tests.simcluster import python_talosctl, sim_cluster

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    ("target", "client", "ok"),
    [("v1.14.0", "v1.13.9", False), ("v1.14.0", "v1.14.0", True), ("v1.12.7", "v1.13.9", True)],
)
def test_preflight_refuses_a_talosctl_older_than_the_target_release(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, target: str, client: str, ok: bool
) -> None:
    """talosctl loads and merges patches client-side (talos@v1.13.0:cmd/talosctl/cmd/talos/patch.go,
    ``configpatcher.LoadPatches``), and 1.14's ``KernelModuleConfig`` is registered only in the 1.14
    machinery: talosctl 1.13 answers ``"KernelModuleConfig" "v1alpha1": not registered``
    (talos@v1.13.0:pkg/machinery/config/internal/registry/registry.go:79).  So an older client must stop
    the run before the config-patch step; a newer client is fine."""
    python_talosctl(
        monkeypatch, "the client's version is RUNBOOK_SIM_TALOSCTL_VERSION, which the real one ignores"
    )
    monkeypatch.setenv("RUNBOOK_SIM_TALOSCTL_VERSION", client)
    with sim_cluster(tmp_path / "sim", talos_version=target, workers=1) as (_params, ctx):
        result = preflight(ctx)
    [check] = [c for c in result.checks if c.name == "talosctl"]
    assert check.ok is ok, check
    assert result.ok is ok
    if not ok:
        assert "v1.13.9" in check.message and "v1.14" in check.message
        assert "v1.14" in check.fix and "tools.talosctl" in check.fix


@pytest.mark.parametrize(("printed", "ok"), [("v3.13.3+gc8b9489", False), ("v3.14.0+g3fc9f4b", True)])
def test_preflight_refuses_a_helm_older_than_3_14(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, printed: str, ok: bool
) -> None:
    """The Kubernetes step upgrades an existing release with ``--reset-then-reuse-values`` (helm 3.14 on:
    helm@v3.14.0 cmd/helm/upgrade.go:255), so the site's values stay; helm 3.13 stops with ``unknown flag`` after the
    step may have changed other things. The "helm" here is a stand-in printing what ``helm version --short``
    prints (helm@v3.13.0 cmd/helm/version.go:94-103): only the real helm 4.1.4 is built here."""
    helm = tmp_path / "helm"
    helm.write_text(f"#!/bin/sh\necho {printed}\n")
    helm.chmod(0o755)
    python_talosctl(monkeypatch, "the helm check does not depend on the talosctl")
    with sim_cluster(tmp_path / "sim", workers=1) as (_params, ctx):
        result = preflight(replace(ctx, helm=Helm(str(helm))))
    [check] = [c for c in result.checks if c.name == "helm"]
    assert check.ok is ok, check
    if not ok:
        assert "3.14" in check.message and "tools.helm" in check.fix


@pytest.mark.parametrize("default_runtime_patch", [True, False])
def test_preflight_needs_kubectl_only_where_a_patch_reboots_the_nodes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, default_runtime_patch: bool
) -> None:
    """The default-runtime patch reboots the nodes up to Talos 1.13, and the config-patch step drains each with
    kubectl first (``steps/drains.py``): without kubectl the canary would fail there. Preflight says so before any
    node changes, and only then: the modules patch alone reboots nothing."""
    python_talosctl(monkeypatch, "the kubectl check does not depend on the talosctl")
    with sim_cluster(tmp_path / "sim", workers=1, default_runtime_patch=default_runtime_patch) as (
        _params,
        ctx,
    ):
        without = replace(ctx, endpoints=replace(ctx.endpoints, kubectl=str(tmp_path / "no-kubectl")))
        result = preflight(without)
    checks = [c for c in result.checks if c.name == "kubectl"]
    if not default_runtime_patch:
        assert checks == [] and "kubectl" not in result.data["versions"]
        return
    [check] = checks
    assert not check.ok and not result.ok
    assert "command not found" in check.message and "tools.kubectl" in check.fix, check


@pytest.mark.parametrize(("target", "ok"), [("v1.12.77", False), ("v1.12.7", True), ("v1.14.0-rc.1", True)])
def test_preflight_refuses_a_release_the_image_factory_does_not_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, target: str, ok: bool
) -> None:
    """A mistyped release (v1.12.77) passed preflight and planned the modules patch; only the image step, after
    the patch was applied, asked the factory for its extensions and got a 404. The factory lists what it builds
    (``GET /versions``: siderolabs/image-factory README at 03bd46f); the simulated one lists the releases of
    its catalog, the newest five of that line named."""
    python_talosctl(monkeypatch, "the factory check does not depend on the talosctl")
    with sim_cluster(tmp_path / "sim", talos_version=target, workers=1) as (_params, ctx):
        result = preflight(ctx)
        unchecked = preflight(ctx, steps=["preflight", "verify"])  # no image step: the factory is not asked
    [check] = [c for c in result.checks if c.name == "image factory"]
    assert check.ok is ok and result.ok is ok, check
    assert not [c for c in unchecked.checks if c.name == "image factory"]
    if not ok:
        line = [v for v in catalog.factory_versions() if v.startswith("v1.12.") and "-" not in v]
        assert (
            f"does not build Talos v1.12.77: the factory knows {', '.join(line[-5:])} in that"
            in check.message
        )
        assert "talos_version" in check.fix
    if target.endswith(
        "-rc.1"
    ):  # not in GET /versions (only the newest line's alpha and beta are), still built
        assert "serves the extensions of Talos v1.14.0-rc.1" in check.message, check.message


@pytest.mark.parametrize(
    ("extra", "ok"), [("siderolabs/iscsi-tools", True), ("siderolabs/iscsi-tool", False)]
)
def test_preflight_refuses_extensions_the_factory_does_not_offer_for_the_release(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extra: str, ok: bool
) -> None:
    """The preflight notebook said it checked that the extensions exist in the Image Factory; only the image step
    did, after the config-patch step had patched the nodes, so a misspelt extra extension stopped `runbook run
    --apply` half way (notebook audit, 7 Dec 2026). Preflight resolves every schematic's extensions as the image
    step does (one GET /version/<v>/extensions/official), and names the one that does not exist."""
    python_talosctl(monkeypatch, "the factory check does not depend on the talosctl")
    with sim_cluster(tmp_path / "sim", workers=1, extra_extensions=[extra]) as (_params, ctx):
        result = preflight(ctx)
    [check] = [c for c in result.checks if c.name == "image factory extensions"]
    assert check.ok is ok and result.ok is ok, check
    if ok:
        assert "siderolabs/iscsi-tools" in check.message and "nvidia-container-toolkit" in check.message, (
            check
        )
    else:
        assert "siderolabs/iscsi-tool does not exist for Talos v1.12.7" in check.message, check.message
        assert "did you mean siderolabs/iscsi-tools" in check.message
        assert "extra_extensions" in check.fix


def test_an_extension_only_one_nodes_override_names_is_refused_naming_that_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A misspelt extension in one node's overrides.extra_extensions was refused without naming the node (review
    of 77170ba); with `nodes` limited to the other node, it is not that run's business."""
    from runbook_lib.model.params import validate
    from runbook_lib.steps.context import connect

    python_talosctl(monkeypatch, "the factory check does not depend on the talosctl")
    with sim_cluster(tmp_path / "sim", workers=2) as (params, _ctx):
        data = params.public_dict()
        data["nodes"][1]["overrides"] = {"extra_extensions": ["siderolabs/iscsi-tool"]}
        ctx = connect(validate(data, source="test"), state_dir=tmp_path / "sim")
        result = preflight(ctx)
        other = preflight(ctx, only=[params.nodes[0].name])
    [check] = [c for c in result.checks if c.name == "image factory extensions"]
    assert not check.ok and check.message.startswith(f"{params.nodes[1].name}: "), check.message
    assert "siderolabs/iscsi-tool does not exist" in check.message
    [fine] = [c for c in other.checks if c.name == "image factory extensions"]
    assert fine.ok, fine


def test_a_talosconfig_talosctl_cannot_read_is_named_not_called_unreachable_nodes(tmp_path: Path) -> None:
    """Attack re-run (7 Dec 2026): a talosconfig that is not YAML made preflight say of every node "unreachable:
    … bring the node back (power, network …)". The real talosctl's error (run here) names the talosconfig; so
    does preflight now, with the parameter as the fix."""
    import subprocess

    from runbook_lib.model.params import Node
    from runbook_lib.sim import realtalos
    from runbook_lib.steps.preflight import _unreachable
    from runbook_lib.steps.results import NodeResult

    binary = realtalos.cached_talosctl("v1.12.0")
    if binary is None:
        pytest.skip("the real talosctl v1.12.0 is not built (make setup)")
    bad = tmp_path / "talosconfig"
    bad.write_text("context: a: b\n")
    run = subprocess.run(
        [str(binary), "--talosconfig", str(bad), "-n", "10.5.0.11", "version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    error = run.stderr.strip().splitlines()[-1]
    assert error.startswith(f'failed to open config file "{bad}": yaml: '), run.stderr
    res = NodeResult(node="gpu-1", address="10.5.0.11")
    _unreachable(res, Node(name="gpu-1", address="10.5.0.11"), {"10.5.0.11": error})
    assert res.status == "failed" and res.message.startswith("talosctl cannot read its talosconfig: "), res
    (check,) = res.checks
    assert "`talosconfig` parameter" in check.fix and "power" not in check.fix, check

    # the record's versions say so too, not "talos_unreachable: <every node>" (review of 7470dc3)
    from types import SimpleNamespace

    from runbook_lib.notebook.runner import _talos_versions

    talosctl = SimpleNamespace(version=lambda addresses: (None, {}, dict.fromkeys(addresses, error)))
    versions = _talos_versions(SimpleNamespace(talosctl=talosctl), ["10.5.0.11", "10.5.0.12"])  # type: ignore[arg-type]
    assert "talos_unreachable" not in versions, versions
    assert versions["talosctl_error"].startswith(
        "talosctl cannot read its talosconfig: failed to open config"
    )
    mixed = {"10.5.0.11": error, "10.5.0.12": "rpc error: code = Unavailable desc = connection refused"}
    talosctl = SimpleNamespace(version=lambda addresses: (None, {}, mixed))
    versions = _talos_versions(SimpleNamespace(talosctl=talosctl), list(mixed))  # type: ignore[arg-type]
    assert versions["talos_unreachable"] == ["10.5.0.12"], (
        "a node that did not answer is still named (review)"
    )


def test_a_node_name_no_kubernetes_node_has_fails_preflight_with_the_close_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A misspelt node name passed preflight, and ``runbook run --apply`` upgraded the whole fleet before the
    Kubernetes step waited five minutes for a Node of that name (operator walkthrough, stop 52). Preflight now
    lists the Nodes when the run's steps find nodes by name, and fails the node, naming the close names; a run
    of steps that do not (``--steps config-patch,image``) is not held back by it."""
    python_talosctl(monkeypatch, "the check reads the Kubernetes Nodes, not the Talos API")
    with sim_cluster(tmp_path / "sim", workers=2) as (params, ctx):
        first, second = params.nodes
        typo = second.model_copy(update={"name": second.name.replace("worker", "wroker")})
        misspelt = replace(ctx, params=params.model_copy(update={"nodes": [first, typo]}))
        result = preflight(misspelt)
        talos_only = preflight(misspelt, steps=["preflight", "config-patch", "image"])
    assert not result.ok
    by_name = {n.node: n for n in result.nodes}
    assert by_name[first.name].status == "ok"
    [check] = [c for c in by_name[typo.name].checks if c.name == "Kubernetes node"]
    assert check.message == (
        f"the cluster has no Kubernetes Node named {typo.name!r} (did you mean {second.name}?)"
    ), check.message
    assert "kubectl get nodes" in check.fix
    assert not any(c.name == "Kubernetes node" for n in talos_only.nodes for c in n.checks)


def test_node_names_not_checked_are_said_so() -> None:
    """A refused ``list nodes`` (or a read that timed out) turned the name check off with no word (review of
    5466089): the reason comes back for preflight's note, naming what was not checked."""
    from types import SimpleNamespace

    from runbook_lib.errors import PermanentError
    from runbook_lib.steps import node_identity

    def refused(**_kw: object) -> list[object]:
        raise PermanentError('nodes is forbidden: User "ci" cannot list resource "nodes"')

    ctx = SimpleNamespace(kube=SimpleNamespace(iter_nodes=refused))
    nodes, why = node_identity.read(ctx, None)  # type: ignore[arg-type]
    assert nodes is None and why == (
        "the nodes' names and addresses were not checked against the Kubernetes Nodes: nodes is forbidden: "
        'User "ci" cannot list resource "nodes"'
    ), why
    nodes, why = node_identity.read(ctx, ["preflight", "config-patch", "image"])  # type: ignore[arg-type]
    assert why.startswith("the nodes' addresses were not checked"), why


def test_a_node_given_another_nodes_address_fails_preflight_naming_both(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GPU worker given the control plane's address (a copy-paste slip): preflight said "no NVIDIA GPU among
    the node's 2 PCI devices … remove gpu-worker-2 from nodes: it is not a GPU node", reading the control plane's
    PCI bus, while the worker was a GPU node at its own address (operator walkthrough, stop 53); given another
    GPU worker's address, the run would upgrade that machine under this name. The Node that lists the address
    is named, and where this node is; also for a run that does not find nodes by name."""
    python_talosctl(monkeypatch, "the check reads the Kubernetes Nodes' addresses")
    with sim_cluster(tmp_path / "sim", workers=2) as (params, ctx):
        first, second = params.nodes
        listed = {n["metadata"]["name"]: n for n in ctx.kube.iter_nodes()}
        others = [name for name in listed if name not in (first.name, second.name)]
        plane = others[0]
        internal = next(
            a["address"] for a in listed[plane]["status"]["addresses"] if a["type"] == "InternalIP"
        )
        moved = second.model_copy(update={"address": internal})
        slipped = replace(ctx, params=params.model_copy(update={"nodes": [first, moved]}))
        for steps in (None, ["preflight", "config-patch", "image"]):
            result = preflight(slipped, steps=steps)
            assert not result.ok
            by_name = {n.node: n for n in result.nodes}
            assert by_name[first.name].status == "ok"
            failed = [c for c in by_name[second.name].checks if not c.ok]
            assert [c.message for c in failed] == [
                f"address {internal} is Kubernetes Node {plane}'s, not {second.name}'s; Node {second.name} is "
                f"at {second.address}"
            ], failed
            assert f"kubectl get node {second.name} -o wide" in failed[0].fix


def test_an_address_two_nodes_list_fails_only_the_node_whose_own_node_does_not() -> None:
    """A stale NotReady Node may still list the address DHCP gave to a new machine, and NAT'd Nodes may share an
    ExternalIP: the first Node by name that listed it was taken as its only owner, and the node whose own Node
    lists it failed as "address 10.0.0.5 is Kubernetes Node a-old-worker's, not gpu-1's; Node gpu-1 is at
    10.0.0.5" (review, stop 53)."""
    from runbook_lib.model.params import Node
    from runbook_lib.steps import node_identity

    def node(name: str, *addresses: str) -> dict[str, object]:
        listed = [{"type": "InternalIP", "address": a} for a in addresses]
        return {"metadata": {"name": name}, "status": {"addresses": listed}}

    listed = [node("a-old-worker", "10.0.0.5"), node("gpu-1", "10.0.0.5"), node("gpu-2", "10.0.0.6")]
    nodes = node_identity.KubeNodes.of(listed, by_name=True)
    assert node_identity.checks(Node(name="gpu-1", address="10.0.0.5"), nodes) == []
    [wrong] = node_identity.checks(Node(name="gpu-2", address="10.0.0.5"), nodes)
    assert wrong.message == (
        "address 10.0.0.5 is listed by Kubernetes Nodes a-old-worker and gpu-1, not gpu-2's; Node gpu-2 is at "
        "10.0.0.6"
    )
    [typo] = node_identity.checks(Node(name="gpu-l", address="10.0.0.6"), nodes)
    assert "(did you mean gpu-2?)" in typo.message, typo.message


def test_a_node_that_does_not_answer_is_told_its_address_may_be_wrong() -> None:
    """An operator walkthrough (stop 53) mistyped an address: preflight said only "bring the node back (power,
    network …)". The fix now also names the address to check in ``nodes:``."""
    from runbook_lib.model.params import Node
    from runbook_lib.steps.preflight import _unreachable
    from runbook_lib.steps.results import NodeResult

    refused = (
        'rpc error: code = Unavailable desc = connection error: desc = "transport: Error while dialing: dial tcp '
        '10.5.0.111:50000: connect: connection refused"'
    )
    res = NodeResult(node="gpu-1", address="10.5.0.111")
    _unreachable(res, Node(name="gpu-1", address="10.5.0.111"), {"10.5.0.111": refused})
    (check,) = res.checks
    assert (
        "power" in check.fix
        and "correct its address in `nodes:` if 10.5.0.111 is not the node's" in check.fix
    )
    from runbook_lib.steps import fixes

    assert "correct its address" not in fixes.unreachable("10.5.0.111", "image", after_preflight=True)
    assert "correct its address" in fixes.unreachable("10.5.0.111", "image"), (
        "a plan may ask it first (review)"
    )
