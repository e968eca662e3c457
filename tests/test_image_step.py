"""The image-upgrade step against the simulated cluster (simulated talosctl + simulated Image Factory)."""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from runbook_lib.model.params import load_params
from runbook_lib.model.schematic import schematic_for
from runbook_lib.sim import factory
from runbook_lib.sim.scenarios import configure_modules, register_schematic
from runbook_lib.sim.state import VANILLA_SCHEMATIC, InstalledExtension, locked_node
from runbook_lib.sim.talosctl import images
from runbook_lib.steps.context import Context, connect
from runbook_lib.steps.image import image_upgrade
from runbook_lib.steps.results import StepResult
from tests.simcluster import (
    factory_only,
    inject_fault,
    node_state,
    runs_real_talosctl,
    serve_node_files,
)

LTS = ["siderolabs/nvidia-open-gpu-kernel-modules-lts", "siderolabs/nvidia-container-toolkit-lts"]
GPU_ID = schematic_for(LTS).id
WORKERS = ["talos-worker-1", "talos-worker-2", "talos-worker-3"]

pytestmark = pytest.mark.slow


def _sim(
    tmp_path: Path, scenario: str = "config-patched", version: str = "v1.12.7"
) -> Iterator[tuple[Path, factory.FactoryServer]]:
    # config-patched: the runbook's config-patch step runs before the image step (an upgrade of a node
    # whose config does not load the NVIDIA modules hangs at boot and rolls back; see notebook/steps.py)
    state = tmp_path / "sim"
    with factory_only(state, workers=3, scenario=scenario, talos_version=version) as server:
        _real_clients_without_a_cluster(state)
        yield state, server


def _real_clients_without_a_cluster(state: Path) -> None:
    """``bin/helm`` and ``bin/kubectl`` as the real clients with no Kubernetes API to reach (this simulator has
    none): the Python helm that stood in here was retired with the Python API server (issue 15)."""
    from runbook_lib.sim import realkube

    tools = realkube.find_tools("1.35.0")
    if not isinstance(tools, realkube.Tools):
        pytest.skip(f"the real helm is {tools}")
    realkube.write_clients(state, tools)


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[tuple[Path, factory.FactoryServer]]:
    yield from _sim(tmp_path)


def _ctx(
    state: Path, *, apply: bool, concurrency: int = 1, version: str = "v1.12.7", **extra: object
) -> Context:
    nodes = [{"name": f"talos-worker-{i}", "address": f"10.5.0.{2 + i}"} for i in (1, 2, 3)]
    data = {
        "cluster": "sim-gpu",
        "target": "simulated",
        "talos_version": version,
        "nodes": nodes,
        "track": "lts",
        "apply": apply,
        "rollout_concurrency": concurrency,
        **extra,
    }
    path = state.parent / "params.yaml"
    path.write_text(yaml.safe_dump(data))
    return connect(load_params(str(path), []), state_dir=state)


def _run(ctx: Context) -> StepResult:
    return image_upgrade(ctx, settle_timeout=5.0, poll_interval=0.1)


def test_dry_run_returns_exact_commands_and_changes_nothing(sim: tuple[Path, factory.FactoryServer]) -> None:
    state, server = sim
    ctx = _ctx(state, apply=False)
    result = image_upgrade(ctx)
    assert [n.status for n in result.nodes] == ["planned"] * 3
    host = server.url.removeprefix("http://")
    commands = result.data["commands"]
    assert len(commands) == 3
    for command, address in zip(commands, ["10.5.0.3", "10.5.0.4", "10.5.0.5"], strict=True):
        assert " upgrade --image " in command
        assert f"{host}/metal-installer/{GPU_ID}:v1.12.7" in command
        assert f"-n {address}" in command
    assert all(node_state(state, w).schematic_id == VANILLA_SCHEMATIC for w in WORKERS)
    assert not ctx.journal.changes()
    assert all(c.ok for c in result.checks)  # the factory resolved the extensions even in a dry run
    assert [m for m, _ in server.requests if m == "POST"] == []  # ...but nothing was registered


def test_the_plan_shows_each_node_s_upgrade_as_it_then_runs(sim: tuple[Path, factory.FactoryServer]) -> None:
    """Approve applies what was shown: the plan's command for a node is the argv its apply ran, flag for flag.
    The plan had printed ``--wait=true`` without the ``--timeout=<timeouts.upgrade_seconds>s`` the run adds
    (stop 48 walkthrough), so a pasted command waited talosctl's own 30 minutes (``talosctl upgrade --help``:
    "--timeout duration ... (default 30m0s)")."""
    state, _server = sim
    planned = image_upgrade(_ctx(state, apply=False, timeouts={"upgrade_seconds": 1234}))
    ctx = _ctx(state, apply=True, timeouts={"upgrade_seconds": 1234})
    applied = image_upgrade(ctx, settle_timeout=5.0, poll_interval=0.1)
    assert applied.ok, applied.to_dict()
    ran = sorted(list(e.argv) for e in ctx.journal.changes() if "upgrade" in e.argv)
    assert sorted(shlex.split(c) for c in planned.data["commands"]) == ran
    assert all("--timeout=1234s" in argv for argv in ran), ran


def test_apply_moves_nodes_to_the_gpu_schematic_then_skips_them(
    sim: tuple[Path, factory.FactoryServer],
) -> None:
    state, _server = sim
    result = _run(_ctx(state, apply=True))
    assert result.ok, result.to_dict()
    assert result.data["done"] == WORKERS
    for worker in WORKERS:
        node = node_state(state, worker)
        assert node.schematic_id == GPU_ID
        names = {e.name: e.version for e in node.extensions}
        assert names["nvidia-open-gpu-kernel-modules-lts"] == "580.126.20-v1.12.7"
        assert names["nvidia-container-toolkit-lts"].startswith("580.126.20-")
    again_ctx = _ctx(state, apply=True)
    again = _run(again_ctx)
    assert [n.status for n in again.nodes] == ["unchanged"] * 3
    assert not again_ctx.journal.changes()  # a second run changes nothing


def test_every_upgrade_passes_an_image(sim: tuple[Path, factory.FactoryServer]) -> None:
    state, _server = sim
    ctx = _ctx(state, apply=True, concurrency=2)
    _run(ctx)
    upgrades = [e.argv for e in ctx.journal.changes() if "upgrade" in e.argv]
    # one talosctl process per batch chunk (steps/image.py _groups): every node in exactly one of them
    upgraded = [node for argv in upgrades for node in argv[argv.index("-n") + 1].split(",")]
    assert sorted(upgraded) == sorted(n.address for n in ctx.params.nodes)
    # the machine configs are read once before the upgrades (the installer's facts and the config-patch check both
    # use them): at 1,000 nodes each read took ~8 s (benchmarks/README.md, bench_whole_change, 2 Dec 12:33)
    argvs = [e.argv for e in ctx.journal.entries]
    first_upgrade = next(i for i, argv in enumerate(argvs) if "upgrade" in argv)
    assert sum("machineconfig" in argv for argv in argvs[:first_upgrade]) == 1
    for argv in upgrades:
        assert argv[argv.index("--image") + 1].endswith(f"/metal-installer/{GPU_ID}:v1.12.7")


def test_stops_at_first_failure_and_reports_done_failed_untouched(
    sim: tuple[Path, factory.FactoryServer],
) -> None:
    state, _server = sim
    inject_fault(state, "talos-worker-2", "upgrade_fails")
    result = _run(_ctx(state, apply=True))
    assert not result.ok
    assert result.data["done"] == ["talos-worker-1"]
    assert result.data["failed"] == ["talos-worker-2"]
    assert result.data["untouched"] == ["talos-worker-3"]
    # The Python talosctl says the node "rolled back" (no source). The real talosctl prints the sequence error
    # Talos publishes when the installer fails and the node keeps its image (simnode/faults.go failInstall:
    # talos@v1.12.0 internal/pkg/install/install.go:261, v1alpha1_controller.go:139-157 and :275-317).
    failure = 'task "upgrade" failed: exit code 1' if runs_real_talosctl(state) else "rolled back"
    assert failure in result.node("talos-worker-2").message
    assert node_state(state, "talos-worker-1").schematic_id == GPU_ID
    assert node_state(state, "talos-worker-3").schematic_id == VANILLA_SCHEMATIC


def test_factory_problem_fails_before_any_change(sim: tuple[Path, factory.FactoryServer]) -> None:
    state, _server = sim
    factory.set_faults(state, missing_extensions={"v1.12.7": [LTS[1]]})
    ctx = _ctx(state, apply=True)
    result = _run(ctx)
    assert not result.ok
    assert [n.status for n in result.nodes] == ["skipped"] * 3
    failed = [c for c in result.checks if not c.ok]
    assert failed and "nvidia-container-toolkit-lts does not exist for Talos v1.12.7" in failed[0].message
    assert not ctx.journal.changes()


def test_unreadable_node_blocks_the_rollout(sim: tuple[Path, factory.FactoryServer]) -> None:
    state, _server = sim
    inject_fault(state, "talos-worker-3", "unreachable", "refused")
    ctx = _ctx(state, apply=True)
    result = _run(ctx)
    assert result.data["failed"] == ["talos-worker-3"]
    assert "connection refused" in result.node("talos-worker-3").message
    assert result.data["untouched"] == ["talos-worker-1", "talos-worker-2"]
    assert not ctx.journal.changes()


def test_nodes_already_on_the_gpu_schematic_are_skipped(tmp_path: Path) -> None:
    for state, _server in _sim(tmp_path, scenario="gpu-ready"):
        ctx = _ctx(state, apply=True)
        result = _run(ctx)
        assert [n.status for n in result.nodes] == ["unchanged"] * 3
        assert not ctx.journal.changes()


def test_concurrency_finishes_the_batch_then_stops(sim: tuple[Path, factory.FactoryServer]) -> None:
    state, _server = sim
    inject_fault(state, "talos-worker-1", "upgrade_fails")
    result = _run(_ctx(state, apply=True, concurrency=2))
    assert result.data["failed"] == ["talos-worker-1"]
    assert result.data["done"] == ["talos-worker-2"]  # same batch, ran alongside
    assert result.data["untouched"] == ["talos-worker-3"]
    assert node_state(state, "talos-worker-3").schematic_id == VANILLA_SCHEMATIC


def test_hanging_upgrade_times_out_and_stops_the_rollout(sim: tuple[Path, factory.FactoryServer]) -> None:
    """extensions#888: the node waits for ext-nvidia-persistenced forever; the step must not wait forever."""
    state, _server = sim
    inject_fault(state, "talos-worker-1", "upgrade_hangs")
    result = image_upgrade(
        _ctx(state, apply=True), upgrade_timeout=2.0, settle_timeout=2.0, poll_interval=0.1
    )
    assert result.data["failed"] == ["talos-worker-1"]
    message = result.node("talos-worker-1").message
    if runs_real_talosctl(state):
        # At --timeout the real talosctl's reporter returns ctx.Err() with the command's errors suppressed
        # (talos@v1.12.0 cmd/talosctl/pkg/talos/action/tracker.go:168-180, :282-284): it prints no timeout line,
        # only the progress up to then, which the step sums up as the last phase.
        assert "talosctl upgrade failed" in message and "(last phase: " in message, message
    else:
        assert (
            "timed out" in message or "context deadline exceeded" in message
        )  # talosctl --timeout fires first
    assert result.data["untouched"] == ["talos-worker-2", "talos-worker-3"]


def test_newer_node_is_not_downgraded(sim: tuple[Path, factory.FactoryServer]) -> None:
    state, _server = sim
    ctx = _ctx(state, apply=True, version="v1.12.6")
    result = _run(ctx)
    assert [n.status for n in result.nodes] == ["failed"] * 3
    assert "refusing to downgrade" in result.nodes[0].message
    assert not ctx.journal.changes()


def test_minor_upgrade_plan_warns_about_the_1_13_switch(sim: tuple[Path, factory.FactoryServer]) -> None:
    state, server = sim
    result = image_upgrade(_ctx(state, apply=False, version="v1.13.2"))
    assert [n.status for n in result.nodes] == ["planned"] * 3
    # this simulator has no Kubernetes API: the device plugin cannot be looked up, which the plan says
    handover = next(c for c in result.checks if "before the Talos 1.13 upgrade" in c.name)
    assert not handover.ok and "kubectl delete runtimeclass nvidia" in handover.fix
    gpu_113 = next(iter(result.data["boot_assets"]))
    assert (
        result.data["boot_assets"][gpu_113]["iso"] == f"{server.url}/image/{gpu_113}/v1.13.2/metal-amd64.iso"
    )


@pytest.mark.slow
def test_before_the_image_factory_the_upgrade_waits_for_the_install_extensions_patch(tmp_path):
    from runbook_lib.steps.patch import config_patch
    from tests.simcluster import sim_cluster

    with sim_cluster(tmp_path, talos_version="v1.4.8", apply=True) as (params, ctx):
        result = image_upgrade(ctx)
        assert not result.ok and all(n.status == "failed" for n in result.nodes)
        assert "run the config-patch step first" in result.nodes[0].message
        assert not any("upgrade" in e.argv for e in ctx.journal.changes())
        assert config_patch(ctx).ok  # adds machine.install.extensions (and the modules)
        planned = image_upgrade(ctx, apply=False)
        assert all("ghcr.io/siderolabs/installer:v1.4.8" in c for c in planned.data["commands"])


def _sim_with_kubernetes(tmp_path: Path, scenario: str, version: str) -> Iterator[tuple[Path, str]]:
    """``_sim`` with the cluster's Kubernetes API (``sim_cluster``'s daemon; its Image Factory URL yielded):
    talosctl 1.13's upgrade drains the node first through it (its default --drain, with the kubeconfig the
    control plane hands out: talos@v1.13.0 cmd/talosctl/cmd/talos/upgrade.go:143-144,360). Without one the
    real talosctl's upgrade of a 1.13 node fails ("error creating Kubernetes client for drain"), as it would
    on a cluster without Kubernetes."""
    from tests.simcluster import sim_cluster

    state = tmp_path / "sim"
    with sim_cluster(state, workers=3, scenario=scenario, talos_version=version):
        yield state, json.loads((state / "endpoints.json").read_text())["factory"]


def _boot_with(state: Path, node: str, names: list[str]) -> None:
    """The node booted an Image Factory schematic with these extensions (``get extensions`` lists their manifest
    names), as the scenario storage-extensions does; served as edited from now on.

    Why a schematic: a node's ExtensionStatus lists exactly the layers of the image it booted (talos@v1.12.0
    internal/app/machined/pkg/controllers/runtime/extension_status.go: ``/etc/extensions.yaml``, read once), so
    a node with extensions runs an image that installs them, and simnode derives the list from that image."""
    refs = [f"siderolabs/{name}" for name in names]
    with locked_node(state, node) as sim_node:
        available = {e["name"]: e for e in images.official_extensions(sim_node.talos_version)}
        sim_node.schematic_id = register_schematic(state, refs)
        sim_node.extensions = [images.to_installed(available[ref]) for ref in refs]
    serve_node_files(state)


def _install_extensions_listed(state: Path, node: str, names: list[str]) -> None:
    """Before the Image Factory (Talos 1.3-1.4) a node runs the extensions its installer pulled from
    ``machine.install.extensions``, with no schematic (the Python talosctl: simnode serves Talos 1.9+)."""
    with locked_node(state, node) as sim_node:
        for name in names:
            image = f"ghcr.io/siderolabs/{name}:v0.1.6"
            sim_node.extensions.append(InstalledExtension(name, "v0.1.6", image))


def test_extensions_the_plan_lacks_block_the_upgrade_with_the_line_that_keeps_them(
    sim: tuple[Path, factory.FactoryServer],
) -> None:
    """docs:public/talos/v1.12/platform-specific-installations/boot-assets.mdx:236-250: after an upgrade to
    another schematic the node runs exactly that schematic's extensions, so iscsi-tools would be gone."""
    state, _server = sim
    _boot_with(state, "talos-worker-2", ["iscsi-tools", "qemu-guest-agent"])
    keep = "extra_extensions: [siderolabs/iscsi-tools, siderolabs/qemu-guest-agent]"
    plan = image_upgrade(_ctx(state, apply=False))
    node = plan.node("talos-worker-2")
    assert node.status == "failed"
    assert "siderolabs/iscsi-tools, siderolabs/qemu-guest-agent" in node.message
    assert [c.fix for c in node.checks if not c.ok] == [
        f"add to the parameters: {keep} (every GPU node), or to this node's overrides: {keep}"
    ]
    assert plan.data["dropped_extensions"] == {
        "talos-worker-2": ["siderolabs/iscsi-tools", "siderolabs/qemu-guest-agent"]
    }
    ctx = _ctx(state, apply=True)
    refused = _run(ctx)
    assert not ctx.journal.changes()  # nothing half-applied: no node was upgraded
    assert refused.data["untouched"] == ["talos-worker-1", "talos-worker-3"]
    kept = _run(_ctx(state, apply=True, extra_extensions=[e.strip() for e in keep[19:-1].split(",")]))
    assert kept.ok, kept.to_dict()
    names = {e.name for e in node_state(state, "talos-worker-2").extensions}
    assert {"iscsi-tools", "qemu-guest-agent", "nvidia-open-gpu-kernel-modules-lts"} <= names


def _set_platform(state: Path, node: str, platform: str) -> None:
    with locked_node(state, node) as sim_node:
        sim_node.platform = platform
    serve_node_files(state)


def test_cloud_node_is_upgraded_with_the_installer_of_its_platform(
    sim: tuple[Path, factory.FactoryServer],
) -> None:
    """docs v1.12 boot-assets.mdx:243-249 upgrade AWS nodes with ``factory.talos.dev/aws-installer/<id>``;
    the platform is ``spec.platform`` of the node's PlatformMetadata (talos@v1.13.0:pkg/machinery/resources/
    runtime/platform_metadata.go)."""
    state, server = sim
    _set_platform(state, "talos-worker-1", "aws")
    host = server.url.removeprefix("http://")
    plan = image_upgrade(_ctx(state, apply=False))
    assert plan.data["installer_images"]["talos-worker-1"] == f"{host}/aws-installer/{GPU_ID}:v1.12.7"
    assert plan.data["installer_images"]["talos-worker-2"] == f"{host}/metal-installer/{GPU_ID}:v1.12.7"
    ctx = _ctx(state, apply=True)
    assert _run(ctx).ok
    images = {
        e.argv[e.argv.index("-n") + 1]: e.argv[e.argv.index("--image") + 1] for e in ctx.journal.changes()
    }
    assert images["10.5.0.3"] == f"{host}/aws-installer/{GPU_ID}:v1.12.7"
    assert images["10.5.0.4"].startswith(f"{host}/metal-installer/")


def test_grub_node_with_kernel_args_is_upgraded_with_legacy_on_talos_1_13(tmp_path: Path) -> None:
    """docs:public/talos/v1.13/.../upgrading-talos.mdx:121-137: talosctl 1.13's new upgrade API does not
    pass ``extraKernelArgs``, and with ``grubUseUKICmdline`` false GRUB boots without them, silently;
    ``--legacy`` keeps them (flag in talos@v1.13.0:cmd/talosctl/cmd/talos/upgrade.go:368)."""
    for state, _factory in _sim_with_kubernetes(tmp_path, "kernel-args-before-1-12", "v1.13.2"):
        for worker in WORKERS:
            with locked_node(state, worker) as node:
                configure_modules(node)  # the config-patch step comes first
        serve_node_files(state)
        plan = image_upgrade(_ctx(state, apply=False, version="v1.13.3"))
        legacy = [c for c in plan.data["commands"] if " --legacy" in c]
        assert len(legacy) == 1 and "-n 10.5.0.5" in legacy[0]  # the scenario's last worker
        assert any("extraKernelArgs" in n and "--legacy" in n for n in plan.notes)
        ctx = _ctx(state, apply=True, version="v1.13.3")
        assert _run(ctx).ok
        argvs = {e.argv[e.argv.index("-n") + 1]: e.argv for e in ctx.journal.changes()}
        assert "--legacy" in argvs["10.5.0.5"]
        assert "--legacy" not in argvs["10.5.0.3"]  # generated by 1.13: grubUseUKICmdline true
        cmdline = ctx.talosctl.read("/proc/cmdline", ["10.5.0.5"])["10.5.0.5"].text or ""
        assert cmdline.split()[-2:] == ["intel_iommu=on", "iommu=pt"]


def test_simulated_new_upgrade_api_drops_kernel_args_that_legacy_keeps(tmp_path: Path) -> None:
    """The simulator reproduces the silent loss the image step avoids (docs v1.13 upgrading-talos.mdx:121-137):
    the same upgrade with talosctl 1.13 keeps ``extraKernelArgs`` with ``--legacy`` and drops them without."""
    for state, factory_url in _sim_with_kubernetes(tmp_path, "kernel-args-before-1-12", "v1.13.2"):
        with locked_node(state, "talos-worker-3") as node:
            configure_modules(node)
        serve_node_files(state)
        ctx = _ctx(state, apply=True, version="v1.13.2")
        image = f"{factory_url.removeprefix('http://')}/metal-installer/{VANILLA_SCHEMATIC}:v1.13.2"
        assert _args_after_upgrade(ctx, image, legacy=True) == ["intel_iommu=on", "iommu=pt"]
        assert _args_after_upgrade(ctx, image, legacy=False) == []


def _args_after_upgrade(ctx: Context, image: str, *, legacy: bool) -> list[str]:
    run = ctx.talosctl.upgrade("10.5.0.5", image, wait=True, timeout=30, legacy=legacy)
    assert run.ok, run.stderr
    text = ctx.talosctl.read("/proc/cmdline", ["10.5.0.5"])["10.5.0.5"].text or ""
    return [a for a in text.split() if a in ("intel_iommu=on", "iommu=pt")]


def test_aws_scenario_plans_the_aws_installer_for_every_node(tmp_path: Path) -> None:
    for state, server in _sim(tmp_path, scenario="aws"):
        plan = image_upgrade(_ctx(state, apply=False))
        host = server.url.removeprefix("http://")
        assert set(plan.data["installer_images"].values()) == {f"{host}/aws-installer/{GPU_ID}:v1.12.7"}


def test_storage_extensions_scenario_is_refused_with_the_line_that_keeps_iscsi_tools(tmp_path: Path) -> None:
    for state, _server in _sim(tmp_path, scenario="storage-extensions"):
        plan = image_upgrade(_ctx(state, apply=False))
        assert [n.status for n in plan.nodes] == ["planned", "planned", "failed"]
        fix = [c.fix for c in plan.nodes[2].checks if not c.ok]
        assert fix[0].startswith("add to the parameters: extra_extensions: [siderolabs/iscsi-tools] (every")


def test_before_the_image_factory_other_extensions_are_kept_by_the_config_and_not_refused(
    tmp_path: Path,
) -> None:
    """Talos 1.3-1.4 install what ``machine.install.extensions`` lists, and the patch appends the NVIDIA images
    to that list (the field has no ``merge:"replace"``, talos@v1.4.8:pkg/machinery/config/types/v1alpha1/
    v1alpha1_types.go:1317), so an iscsi-tools image listed there stays: no schematic replaces it."""
    from tests.simcluster import sim_cluster

    with sim_cluster(tmp_path, talos_version="v1.4.8") as (_params, ctx):
        _install_extensions_listed(tmp_path, "talos-worker-1", ["iscsi-tools"])
        plan = image_upgrade(ctx, apply=False)
        assert [n.status for n in plan.nodes] == ["planned", "planned"]
        assert "dropped_extensions" not in plan.data


def test_the_line_that_keeps_extensions_adds_to_what_the_parameters_already_ask(
    sim: tuple[Path, factory.FactoryServer],
) -> None:
    state, _server = sim
    _boot_with(state, "talos-worker-2", ["iscsi-tools", "zfs"])
    nodes = [{"name": f"talos-worker-{i}", "address": f"10.5.0.{2 + i}"} for i in (1, 2, 3)]
    nodes[1]["overrides"] = {"extra_extensions": ["siderolabs/zfs"]}
    plan = image_upgrade(
        _ctx(state, apply=False, nodes=nodes, extra_extensions=["siderolabs/util-linux-tools"])
    )
    (check,) = [c for c in plan.node("talos-worker-2").checks if not c.ok]
    assert check.fix == (
        "add to the parameters: extra_extensions: [siderolabs/util-linux-tools, siderolabs/iscsi-tools] "
        "(every GPU node), or to this node's overrides: extra_extensions: [siderolabs/zfs, siderolabs/iscsi-tools]"
    )


def test_extension_the_config_still_installs_on_talos_1_9_is_not_refused(tmp_path: Path) -> None:
    """Up to Talos 1.9 the installer also pulls the images ``machine.install.extensions`` lists
    (talos@v1.9.6:internal/pkg/install/install.go:59-104; gone in v1.10.0), so an extension listed there
    survives the new schematic; one only in the old schematic does not."""
    for state, _server in _sim(tmp_path, version="v1.9.6"):
        with locked_node(state, "talos-worker-1") as node:
            install = node.machine_config[0]["machine"]["install"]
            install["extensions"] = [{"image": "ghcr.io/siderolabs/iscsi-tools:v0.1.6"}]
        _boot_with(state, "talos-worker-1", ["iscsi-tools"])
        _boot_with(state, "talos-worker-2", ["iscsi-tools"])
        plan = image_upgrade(_ctx(state, apply=False, version="v1.9.6"))
        assert [n.status for n in plan.nodes] == ["planned", "failed", "planned"]


def _same_cluster_on(params: object, version: str, state: Path, *, apply: bool, **extra: object) -> Context:
    """The simulated cluster of ``sim_cluster`` seen with parameters for another release (a user moving on)."""
    from runbook_lib.model.params import validate

    nodes = [{"name": n.name, "address": n.address} for n in params.nodes]  # type: ignore[attr-defined]
    data = {
        "cluster": "test",
        "target": "simulated",
        "talos_version": version,
        "apply": apply,
        "nodes": nodes,
    }
    return connect(validate({**data, **extra}, source="test"), state_dir=state)


def test_upgrade_to_1_13_removes_the_device_plugin_and_its_runtime_class_first(tmp_path: Path) -> None:
    """siderolabs/docs public/talos/v1.13/configure-your-talos-cluster/lifecycle-management/upgrading-talos.mdx
    :53-70: "Before upgrading to Talos 1.13, uninstall the nvidia-device-plugin helm chart and delete the nvidia
    runtimeclass" (found with ``helm list -A``), and only after the upgrade switch to the GPU Operator. The
    Kubernetes step cannot do it first (it would install the operator onto 1.12 nodes), so the image step plans
    the removal, shows it, and runs it, once approved, before the first node is upgraded."""
    from runbook_lib.steps.kubernetes import kubernetes_layer
    from tests.simcluster import sim_cluster

    with sim_cluster(tmp_path, scenario="gpu-ready", apply=True) as (params, ctx):
        assert kubernetes_layer(ctx, timeout_s=60).ok  # Talos 1.12: device plugin and RuntimeClass nvidia
        plan = image_upgrade(_same_cluster_on(params, "v1.13.2", tmp_path, apply=False))
        assert plan.data["before_upgrade"] == [
            # as it runs: pasted without --wait it returned before the plugin's pods were gone
            "helm uninstall nvidia-device-plugin -n kube-system --wait --timeout 300s",
            "kubectl delete runtimeclass nvidia",
        ]
        assert ctx.helm.release("nvidia-device-plugin", "kube-system") is not None  # a plan changes nothing
        assert ctx.kube.runtime_class("nvidia") is not None

        ctx13 = _same_cluster_on(params, "v1.13.2", tmp_path, apply=True)
        result = image_upgrade(ctx13, settle_timeout=10.0, poll_interval=0.1)
        assert result.ok, result.to_dict()
        assert ctx13.helm.release("nvidia-device-plugin", "kube-system") is None
        assert ctx13.kube.runtime_class("nvidia") is None
        order = [e.summary for e in ctx13.journal.changes()]
        first_upgrade = next(i for i, s in enumerate(order) if "upgrade" in s and "helm" not in s)
        removal = [i for i, s in enumerate(order) if "uninstall" in s or "delete RuntimeClass" in s]
        assert len(removal) == 2 and max(removal) < first_upgrade, order
        assert (
            image_upgrade(_same_cluster_on(params, "v1.13.2", tmp_path, apply=False)).data.get(
                "before_upgrade", []
            )
            == []
        )  # nothing left to remove, nodes on 1.13


def test_device_plugin_kept_on_1_13_by_request_is_not_removed_by_the_image_step(tmp_path: Path) -> None:
    """`kubernetes_layer: device-plugin` keeps the device plugin on Talos 1.13+: nothing to remove."""
    from runbook_lib.steps.kubernetes import kubernetes_layer
    from tests.simcluster import sim_cluster

    with sim_cluster(tmp_path, scenario="gpu-ready", apply=True) as (params, ctx):
        assert kubernetes_layer(ctx, timeout_s=60).ok
        keep = _same_cluster_on(params, "v1.13.2", tmp_path, apply=False, kubernetes_layer="device-plugin")
        assert image_upgrade(keep).data.get("before_upgrade", []) == []


def test_upgrade_to_1_13_is_refused_when_the_device_plugin_cannot_be_looked_up(
    sim: tuple[Path, factory.FactoryServer],
) -> None:
    """The docs' order (device plugin gone, then 1.13) cannot be checked without the Kubernetes API (this
    simulator has none): no node is upgraded, and the fix is the docs' own commands (upgrading-talos.mdx:53-70)."""
    state, _server = sim
    ctx = _ctx(state, apply=True, version="v1.13.2")
    result = _run(ctx)
    assert not result.ok
    assert {n.message for n in result.nodes} == {"not touched: the device plugin could not be removed first"}
    check = next(c for c in result.checks if "before the Talos 1.13 upgrade" in c.name)
    # the real helm 4.1.4's words here: the kubeconfig of a cluster without Kubernetes does not exist
    assert "helm list -A failed" in check.message and "kubeconfig: no such file" in check.message
    assert "helm list -A" in check.fix
    assert not any("upgrade" in e.argv for e in ctx.journal.changes())
    assert all(node_state(state, w).schematic_id == VANILLA_SCHEMATIC for w in WORKERS)


@pytest.mark.parametrize(
    ("fault", "cause"),
    [("toolkit_missing", "nvidia-container-toolkit"), ("driver_mismatch", "driver")],
)
def test_a_node_that_came_back_stably_wrong_fails_at_once_not_after_node_ready_seconds(
    tmp_path: Path, fault: str, cause: str
) -> None:
    """toolkit-missing / driver-mismatch: the upgrade succeeded (talosctl --wait returns once the boot ID changed,
    talos@v1.12.0 cmd/talosctl/pkg/talos/action/tracker.go post check), the node answers and reports the same
    wrong extensions read after read; waiting node_ready_seconds (default 300 s) for it to change was the whole
    wait of a real run. The node fails after a few identical reads, with its diagnosis; the others pass."""
    for state, _server in _sim(tmp_path):
        inject_fault(state, "talos-worker-3", fault)
        ctx = _ctx(state, apply=True, rollout={"max_failures": 1})
        result = image_upgrade(ctx, settle_timeout=60.0, poll_interval=0.1)
    assert result.data["done"] == ["talos-worker-1", "talos-worker-2"]
    assert result.data["failed"] == ["talos-worker-3"]
    node = result.node("talos-worker-3")
    assert "missing extensions siderolabs/nvidia-container-toolkit-lts" in node.message, node.message
    assert any(cause in (c.cause or "") + c.message for c in node.checks if not c.ok), node.checks
    reads = [
        e for e in ctx.journal.entries if e.argv and "extensions" in e.argv and "10.5.0.5" in " ".join(e.argv)
    ]
    assert len(reads) <= 6, (
        f"{len(reads)} reads of the node's extensions: it waited for a change that never came"
    )
