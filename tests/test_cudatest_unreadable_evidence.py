"""cuda-test must not pass a node's nvidia-smi check on a driver comparison it could not make.

The step compares the driver nvidia-smi reports in the pod with the driver of the node's kernel-module extension
(``talosctl get extensions``).  When that read failed for a node, the node had no driver to compare and its
nvidia-smi checks passed as if they agreed.  Here the real cuda-test runs against a simulated Talos cluster (the
real talosctl against simnode where built) whose middle GPU node's Talos API cannot be reached through the
endpoint while its kubelet runs the pods (e.g. port 50000 filtered between the nodes, 10250 open), and
talosctl's calls are answered exactly as the real talosctl prints them for such a node (captured from
talosctl v1.12 against simnode: tests/sim/test_real_talosctl.py):

* ``get`` goes node after node (COSI is one-to-one through apid) and appends each node's error raw, naming no
  node, to a multierror printed on stderr after the other nodes' rows; exit 1 (siderolabs/talos v1.12.0
  cmd/talosctl/cmd/talos/get.go:185-209).  With the node first, the call fails before any row: the resource
  type is resolved on ``Nodes()[0]`` (cmd/talosctl/pkg/talos/helpers/resources.go:49).
* ``version`` (the client's follow-up to learn which node failed) is one-to-many: the node's error comes back
  as ``<node>: <error>`` in a ``WARNING:``, exit 0 (pkg/machinery/client/reply.go FilterMessages).
* the error is the one apid's backend returns for a node it cannot dial (grpc-go v1.76.0 wording).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from runbook_lib.clients.proc import CommandResult, Runner
from runbook_lib.steps.cudatest import cuda_test
from runbook_lib.steps.kubernetes import kubernetes_layer
from tests.simcluster import sim_cluster

pytestmark = pytest.mark.slow

#: The kubernetes step returns as soon as every GPU node advertises nvidia.com/gpu; generous for a loaded machine.
GPUS_WITHIN = 180


def unavailable(address: str) -> str:
    """apid's error for a node it cannot dial (as tests/sim/test_real_talosctl.py captured it)."""
    return (
        "rpc error: code = Unavailable desc = connection error: desc = "
        f'"transport: Error while dialing: dial tcp {address}:50000: connect: connection refused"'
    )


def multierror(item: str) -> str:
    """hashicorp/go-multierror's format for one error, as talosctl prints it (root.go: ``Fprintln``)."""
    return f"1 error occurred:\n\t* {item}\n\n\n"


class UnreachableTalosApi(Runner):
    """Every talosctl call runs for real through ``inner`` on the other nodes; ``refused``'s answer is the
    dial error, printed where and how the real talosctl prints it for ``get`` and ``version``."""

    def __init__(self, inner: Runner, refused: str) -> None:
        super().__init__(inner.journal)
        self.inner = inner
        self.refused = refused

    def run(self, argv: Sequence[str], **kwargs: Any) -> CommandResult:
        at = list(argv).index("-n") + 1 if "-n" in argv else 0
        nodes = argv[at].split(",") if at else []
        if self.refused not in nodes:
            return self.inner.run(argv, **kwargs)
        command = argv[at + 1]
        error = unavailable(self.refused)
        others = [n for n in nodes if n != self.refused]
        if command == "version" and not others:
            failed = "error getting version: " + multierror(f"{self.refused}: {error}")
            return CommandResult(tuple(argv), 1, "", failed, 0.01)
        if command == "get" and (nodes[0] == self.refused or not others):
            return CommandResult(tuple(argv), 1, "", error + "\n", 0.01)
        result = self.inner.run([*argv[:at], ",".join(others), *argv[at + 1 :]], **kwargs)
        if command == "version":
            warning = "WARNING: " + multierror(f"{self.refused}: {error}")
            return CommandResult(tuple(argv), result.exit_code, result.stdout, warning, result.duration_s)
        return CommandResult(
            tuple(argv), 1, result.stdout, result.stderr + multierror(error), result.duration_s
        )


def test_a_node_whose_extensions_cannot_be_read_fails_its_nvidia_smi_checks_instead_of_passing(tmp_path):
    with sim_cluster(tmp_path, scenario="gpu-ready", workers=3, apply=True) as (params, ctx):
        assert kubernetes_layer(ctx, timeout_s=GPUS_WITHIN).ok
        refused = params.nodes[1]
        ctx.talosctl.runner = UnreachableTalosApi(ctx.talosctl.runner, refused.address)
        result = cuda_test(ctx)
        by_name = {n.node: n for n in result.nodes}
        node = by_name[refused.name]
        assert node.status == "failed" and not result.ok, node.to_dict()
        smi = [c for c in node.checks if c.name.startswith("nvidia-smi")]
        assert len(smi) == 2 and not any(c.ok for c in smi), node.to_dict()
        for check in smi:
            assert "NVIDIA L4" in check.message  # what the pod printed is still shown
            assert f"`talosctl -n {refused.address} get extensions` failed: " in check.message
            assert f"dial tcp {refused.address}:50000: connect: connection refused" in check.message
            assert f"talosctl -n {refused.address} get extensions" in (check.fix or "")
        # the vectoradd runs compare no driver: judged on their own output
        assert all(c.ok for c in node.checks if c.name.startswith("CUDA vectoradd")), node.to_dict()
        # the nodes whose extensions were read are still compared, and pass
        assert all(n.status == "ok" for n in result.nodes if n is not node), result.to_dict()
