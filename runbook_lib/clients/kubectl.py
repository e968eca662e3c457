"""The library's kubectl client: only the node drain, which kubectl implements and the runbook does not redo.

Why kubectl and not the Kubernetes Python client: a drain is client-side logic (which pods to leave, evictions
retried while a PodDisruptionBudget refuses them, the wait until the pods are gone), and kubectl's drain package is
the one Talos itself uses for ``talosctl upgrade``/``reboot --drain`` (talos@v1.13.0
cmd/talosctl/pkg/talos/nodedrain/nodedrain.go:64-140, ``k8s.io/kubectl/pkg/drain``). The flags below are the
options Talos sets there, so a node the runbook reboots is drained as a Talos upgrade drains it.
"""

from __future__ import annotations

import json

from runbook_lib.errors import PermanentError

from .proc import CommandResult, KubeconfigTool, Runner

#: ``kubectl drain``'s flags for the options talosctl's drain sets (nodedrain.go:84-92): ``--force`` (pods with no
#: controller are deleted), ``--grace-period=-1`` (each pod's own terminationGracePeriodSeconds),
#: ``--ignore-daemonsets`` (their controller recreates them, and they tolerate the cordon),
#: ``--delete-emptydir-data`` (the node reboots: that data goes anyway).
DRAIN_FLAGS = ("--force", "--grace-period=-1", "--ignore-daemonsets", "--delete-emptydir-data")
#: How long kubectl itself may take beyond its drain ``--timeout``: its start, the cordon, its last poll.
SLACK_S = 30.0


class Kubectl(KubeconfigTool):
    def __init__(
        self, binary: str = "kubectl", *, kubeconfig: str | None = None, runner: Runner | None = None
    ) -> None:
        super().__init__(binary, kubeconfig=kubeconfig, runner=runner)

    def version(self) -> str:
        """The client's version (``kubectl version --client -o json``: ``clientVersion.gitVersion``)."""
        result = self.runner.run([self.binary, "version", "--client", "-o", "json"]).check("kubectl version")
        try:
            return str(json.loads(result.stdout)["clientVersion"]["gitVersion"])
        except (ValueError, KeyError, TypeError):
            raise PermanentError(
                f"kubectl version --client -o json printed no version: {result.stdout[:200]!r}"
            ) from None

    def drain(self, node: str, *, timeout_s: float) -> CommandResult:
        """Cordon ``node`` and evict its pods, DaemonSet and static pods left, within ``timeout_s``.

        kubectl retries an eviction a PodDisruptionBudget refuses every 5 s until its ``--timeout`` and leaves
        the node cordoned when it fails (k8s.io/kubectl@v0.35.0 pkg/drain/drain.go:300-314, pkg/cmd/drain/drain.go:156); the caller
        decides about the cordon."""
        args = ["drain", node, *DRAIN_FLAGS, f"--timeout={int(timeout_s)}s"]
        return self.runner.run(self.argv(args), timeout=timeout_s + SLACK_S, changes_cluster=True)

    def uncordon(self, node: str) -> CommandResult:
        return self.runner.run(self.argv(["uncordon", node]), changes_cluster=True)
