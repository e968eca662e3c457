"""cuda-test reading a finished pod's log: the read goes through the API server to the node's kubelet, and it can
fail on a real cluster while the pod itself succeeded (a kubelet restarting, a node's port unreachable). Seen in
the suite on the real control plane (tests/sim/test_real_kube_restart.py, 2 Dec): kube-apiserver v1.35 logged
``apiserver received an error that is not an metav1.Status: … Get "https://gpu-worker-1:10250/containerLogs/…":
dial unix …/kubelet.sock: connect: resource temporarily unavailable`` and answered the client HTTP 500, and the
whole step crashed with ``OutputParseError: not nvidia-smi output`` instead of judging the pod. (The dial error
was the simulated kubelet's listen backlog, fixed in runbook_lib/sim/kubeletapi.py; the step must survive the
same answer from a real kubelet.)"""

from __future__ import annotations

from typing import Any

from runbook_lib.errors import RetryableError
from runbook_lib.steps.cudatest import _judge, build_pods
from tests.sim.test_real_kube_pods import NODE, READY, STOPPED_POSTING, FixedKube, context, node_object

SMI = """Tue Dec  2 03:24:40 2026
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 570.172.08             Driver Version: 570.172.08     CUDA Version: 12.8     |
|-----------------------------------------+------------------------+----------------------+
| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |
| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |
|=========================================+========================+======================|
|   0  NVIDIA L4                      On  |   00000000:00:03.0 Off |                    0 |
| N/A   34C    P8             12W /   72W |       0MiB /  23034MiB |      0%      Default |
+-----------------------------------------+------------------------+----------------------+
"""
FAILED_READ = "log of default/{name}: HTTP 500 Internal Server Error: "


class FlakyLogs(FixedKube):
    """A kube whose log reads fail ``failures`` times with the client's HTTP 500, then answer nvidia-smi; its
    Node has the Ready condition ``ready``."""

    def __init__(self, failures: int, log: str = SMI, ready: dict[str, str] = READY) -> None:
        super().__init__([])
        self.failures = failures
        self.reads = 0
        self.log = log
        self.ready = ready

    def node(self, name: str) -> dict[str, Any] | None:
        return node_object(self.ready) if name == NODE else None

    def pod_log(self, namespace: str, name: str) -> str:
        self.reads += 1
        if self.reads <= self.failures:
            raise RetryableError(FAILED_READ.format(name=name).rstrip(": "), status=500)
        return self.log


def _judge_smi(kube: FlakyLogs) -> Any:
    ctx = context(kube)
    node = next(n for n in ctx.params.nodes if n.name == NODE)
    pod = next(p for p in build_pods(ctx, [node], "abc123") if p.kind == "smi")
    obj = {"metadata": {"name": pod.name, "namespace": "default"}, "status": {"phase": "Succeeded"}}
    return _judge(ctx, pod, obj, None)


def test_a_log_read_that_fails_once_is_read_again_and_the_pod_judged_on_its_output() -> None:
    kube = FlakyLogs(failures=1)
    check = _judge_smi(kube)
    assert check.ok and "NVIDIA L4" in check.message, check
    assert kube.reads == 2


def test_a_log_that_cannot_be_read_fails_the_check_saying_so_instead_of_crashing_the_step() -> None:
    kube = FlakyLogs(failures=100)
    check = _judge_smi(kube)
    assert not check.ok, check
    assert "could not be read" in check.message and "HTTP 500" in check.message, check
    assert "kubectl logs" in (check.fix or ""), check


def test_an_empty_nvidia_smi_log_fails_the_check_instead_of_crashing_the_step() -> None:
    """Before: OutputParseError ("the nvidia-smi output is empty") ended the whole step, every node unjudged."""
    check = _judge_smi(FlakyLogs(failures=0, log=""))
    assert not check.ok and "nvidia-smi printed nothing the runbook recognises" in check.message, check


def test_a_log_on_a_node_that_went_down_is_read_once_and_the_failure_names_the_node() -> None:
    """The pod succeeded, then its node stopped: the API server fetches logs from that node's kubelet, so each
    retry only waited for the same dial to fail again (kube-apiserver's 500 with the dial error, as above)."""
    kube = FlakyLogs(failures=100, ready=STOPPED_POSTING)
    check = _judge_smi(kube)
    assert kube.reads == 1, kube.reads
    assert not check.ok and "could not be read" in check.message, check
    assert f"node {NODE} is not Ready" in check.message and "Kubelet stopped posting" in check.message, check
