"""cuda-test on a node whose extensions include no NVIDIA kernel-module extension: nvidia-smi's driver is
compared with nothing, and the node's line says so instead of passing as if it matched.

Can a Talos node run an NVIDIA driver without ``nvidia-open-gpu-kernel-modules*``/``nonfree-kmod-nvidia*``?
Yes: the Talos "NVIDIA GPU (Proprietary drivers)" guide for releases before v1.4.8 builds a custom kernel and
copies the modules (signed by that kernel) into a custom installer's ``/lib/modules``; only the toolkit is an
extension, and the guide's own ``talosctl get extensions`` lists ``nvidia-container-toolkit`` alone while
``/proc/driver/nvidia/version`` shows the loaded driver (siderolabs/talos
website/content/v1.4/talos-guides/configuration/nvidia-gpu-proprietary.md at commit 0cdcb2e0, the docs branch,
not a release tag: "Building the installer image (Talos prior to v1.4.8)"). Whether a later release can do the
same (a user-built extension under another name, on a custom-built kernel) was not found in a source. So such a node is not inconsistent by itself; the check passes on what the pod printed and
says that the driver was not compared, and why.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from runbook_lib.clients.proc import CommandResult, Runner
from runbook_lib.steps.cudatest import _judge, build_pods, extension_drivers
from runbook_lib.steps.results import Check
from tests.sim.test_real_kube_pods import context
from tests.test_cuda_log_read import SMI, FlakyLogs

#: nvidia-smi's driver in SMI, and the kernel-module extension that carries it on the other node.
DRIVER = "570.172.08"
KMOD = ("nvidia-open-gpu-kernel-modules-production", f"{DRIVER}-v1.12.7")
TOOLKIT = ("nvidia-container-toolkit-production", f"{DRIVER}-v1.17.8")


def _extension(node: str, index: int, name: str, version: str) -> dict[str, Any]:
    """One ExtensionStatus as ``talosctl get extensions -o json`` prints it (tests/test_talosctl_client.py)."""
    return {
        "node": node,
        "metadata": {"namespace": "runtime", "type": "ExtensionStatuses.runtime.talos.dev", "id": str(index)},
        "spec": {"image": f"{index:03d}.{name}.sqsh", "metadata": {"name": name, "version": version}},
    }


class Extensions(Runner):
    """``talosctl get extensions``: the kernel-module and toolkit extensions on ``with_kmod``, the toolkit
    alone on every other node (the guide's custom-installer node)."""

    def __init__(self, with_kmod: str) -> None:
        super().__init__()
        self.with_kmod = with_kmod

    def run(self, argv: Sequence[str], **kwargs: Any) -> CommandResult:
        nodes = argv[list(argv).index("-n") + 1].split(",")
        docs = []
        for node in nodes:
            installed = [KMOD, TOOLKIT] if node == self.with_kmod else [TOOLKIT]
            docs += [_extension(node, i, *ext) for i, ext in enumerate(installed)]
        stdout = "".join(json.dumps(doc, indent=4) + "\n" for doc in docs)
        return CommandResult(tuple(argv), 0, stdout, "", 0.01)


def _smi_checks() -> dict[str, Check]:
    """Each node's nvidia-smi check, the node's driver read from its extensions as cuda-test reads it."""
    ctx = context(FlakyLogs(failures=0, log=SMI))
    first, other = ctx.params.nodes[0], ctx.params.nodes[2]
    ctx.talosctl.runner = Extensions(with_kmod=first.address)
    drivers, unread = extension_drivers(ctx, [first, other])
    assert unread == {}
    checks = {}
    for node in (first, other):
        pod = next(p for p in build_pods(ctx, [node], "abc123") if p.kind == "smi")
        obj = {"metadata": {"name": pod.name, "namespace": "default"}, "status": {"phase": "Succeeded"}}
        checks[node.name] = _judge(ctx, pod, obj, drivers.get(node.name))
    return checks


def test_a_node_without_a_kernel_module_extension_passes_saying_its_driver_was_not_compared() -> None:
    checks = _smi_checks()
    compared, alone = checks["gpu-worker-1"], checks["gpu-worker-3"]
    assert compared.ok and "not compared" not in compared.message, compared
    assert alone.ok, alone
    assert alone.message.startswith(
        f"1 GPU(s) (NVIDIA L4), driver {DRIVER}, CUDA 12.8; driver not compared: "
    )
    assert "no NVIDIA kernel-module extension" in alone.message
    assert "nvidia-open-gpu-kernel-modules" in alone.message and "nonfree-kmod-nvidia" in alone.message


def test_a_kernel_module_extension_with_another_driver_still_fails() -> None:
    """The comparison itself is unchanged: a node whose extension carries another driver fails."""
    ctx = context(FlakyLogs(failures=0, log=SMI))
    node = ctx.params.nodes[0]
    pod = next(p for p in build_pods(ctx, [node], "abc123") if p.kind == "smi")
    obj = {"metadata": {"name": pod.name, "namespace": "default"}, "status": {"phase": "Succeeded"}}
    check = _judge(ctx, pod, obj, "580.105.08")
    assert not check.ok and "the node's extension carries driver 580.105.08" in check.message, check
