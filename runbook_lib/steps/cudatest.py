"""Step: CUDA test — prove that pods on each GPU node really run CUDA tools.

Why two pods per node: the Talos docs' test (``runtimeClassName: nvidia`` running ``nvidia-smi``) requests
no ``nvidia.com/gpu``, so it passes even when the device plugin is broken (facts §1.5).  The second pod
requests one GPU, which only schedules where the device plugin advertises it.  The optional vectoradd sample
shows CUDA compute, not just the driver, and runs on both paths as Talos CI does (talos@v1.13.0
internal/integration/api/extensions_nvidia.go:368-465): with ``runtimeClassName: nvidia`` only (the runtime
hook path, CI's "CUDA test") and, with ``request_gpu``, also requesting one GPU (the device plugin/CDI path,
CI's "CUDA CDI test").  Pods get per-run names and a run label (under ``runbook run``,
its record's run id), and are deleted in a ``finally`` (also on error or Ctrl-C: ``runbook run`` interrupts
the cell rather than killing its kernel), so two runs never collide.  Should the ``finally`` not get to
run (the kernel died, or did not end within the grace time), ``runbook run`` deletes the pods carrying its
run id itself (``runbook_lib.notebook.interrupts.remove_test_pods``): nothing is left behind.
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from runbook_lib.errors import RetryableError, RunbookError
from runbook_lib.model.diagnosis import match_failures
from runbook_lib.model.params import Node
from runbook_lib.model.parsers import OutputParseError, extensions_from_resources, parse_nvidia_smi

from . import drains, fixes, kube_diagnosis
from .context import Context
from .results import Check, NodeResult, StepResult

MANAGED_BY = {"app.kubernetes.io/managed-by": "talos-gpu-runbooks"}
RUN_LABEL = "talos-gpu-runbooks/run-id"
TEST_NAMESPACE = "default"
_DNS_SAFE = re.compile(r"[^a-z0-9-]")
#: Name prefixes of the NVIDIA kernel-module extensions, every track (facts §1.2).
KMOD_EXTENSIONS = ("nvidia-open-gpu-kernel-modules", "nonfree-kmod-nvidia")


@dataclass(frozen=True)
class TestPod:
    kind: str
    """``smi``/``vectoradd`` (runtime class only) or ``gpu``/``vectoradd-gpu`` (also request nvidia.com/gpu)."""
    node: Node
    name: str
    manifest: dict[str, Any]


def pod_manifest(
    name: str, node: Node, image: str, run_id: str, *, request_gpu: bool, command: list[str] | None
) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "cuda", "image": image}
    if command:
        container["command"] = command
    if request_gpu:
        container["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    spec: dict[str, Any] = {
        "runtimeClassName": "nvidia",
        "restartPolicy": "Never",
        "containers": [container],
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    }
    if request_gpu:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node.name}  # scheduled: proves the device plugin
    else:
        spec["nodeName"] = node.name  # bypasses the scheduler, as the docs' kubectl run test effectively does
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {**MANAGED_BY, RUN_LABEL: run_id}},
        "spec": spec,
    }


def build_pods(ctx: Context, nodes: list[Node], run_id: str) -> list[TestPod]:
    plan = ctx.plan
    params = ctx.params.cuda_test
    pods: list[TestPod] = []
    for node in nodes:
        base = _DNS_SAFE.sub("-", node.name.lower())[:40]
        wanted: list[tuple[str, str, bool, list[str] | None]] = [
            ("smi", plan.cuda_smi_image, False, ["nvidia-smi"])
        ]
        if params.request_gpu:
            wanted.append(("gpu", plan.cuda_smi_image, True, ["nvidia-smi"]))
        if plan.cuda_vectoradd_image:
            wanted.append(("vectoradd", plan.cuda_vectoradd_image, False, None))
            if params.request_gpu:
                wanted.append(("vectoradd-gpu", plan.cuda_vectoradd_image, True, None))
        for kind, image, gpu, command in wanted:
            name = f"cuda-{kind}-{base}-{run_id}"
            pods.append(
                TestPod(
                    kind,
                    node,
                    name,
                    pod_manifest(name, node, image, run_id, request_gpu=gpu, command=command),
                )
            )
    return pods


def cuda_test(
    ctx: Context,
    *,
    only: list[str] | None = None,
    apply: bool | None = None,
    progress: Callable[[int, int], None] | None = None,
    run_id: str | None = None,
    node_drivers: dict[str, str] | None = None,
) -> StepResult:
    """Run the test pods on each GPU node (or ``only`` those), wait, parse, compare, clean up.

    The pods pull images and run on the GPU nodes, so they too wait for approval: with ``apply`` off the
    step only lists the pods it would create.
    """
    nodes = ctx.nodes(only)
    do_apply = ctx.apply if apply is None else apply
    result = StepResult(step="cuda-test", applied=do_apply)
    if not do_apply:
        return _plan_only(ctx, nodes, result)
    run_id = run_id or secrets.token_hex(3)
    result.data["run_id"] = run_id
    drivers, unread = extension_drivers(ctx, nodes) if node_drivers is None else (node_drivers, {})
    cordoned = _cordoned(ctx, nodes)
    every = build_pods(ctx, nodes, run_id)
    # only the pods kube-scheduler places (nodeSelector): those bound by nodeName run on a cordoned node too
    held_back = [p for p in every if p.node.name in cordoned and "nodeName" not in p.manifest["spec"]]
    pods = [p for p in every if p not in held_back]
    attempted: list[TestPod] = []
    try:
        refused = _create_pods(ctx, pods, attempted)
        waiting = {p.name for p in pods} - set(refused)
        timeout = ctx.params.cuda_test.timeout_seconds
        on_node = {p.name: p.node.name for p in pods if p.name in waiting}
        finished, stalled = _wait(ctx, run_id, on_node, timeout, progress) if waiting else ({}, None)
        early = stalled.stall.down if stalled else []
        down = _down_nodes(ctx, finished, on_node, early, waited_out=not (stalled and stalled.gave_up))
        checks = ctx.kube.each(
            lambda pod: (
                _refused(ctx, pod, refused[pod.name])
                if pod.name in refused
                else _judge(
                    ctx,
                    pod,
                    finished.get(pod.name),
                    drivers.get(pod.node.name),
                    driver_unread=unread.get(pod.node.name),
                    node_down=down.get(pod.node.name),
                    stopped_early=bool(stalled and stalled.gave_up),
                )
            ),
            pods,
        )
        checks += [_on_cordoned(p, cordoned[p.node.name]) for p in held_back]
        result.nodes += _node_results(nodes, [*pods, *held_back], checks)
        held = sorted(n for n, why in down.items() if why.held)
        if held:
            result.notes.append(_left_on_down_nodes(run_id, held))
    finally:
        _delete_pods(ctx, attempted, run_id, result)
    fixes.name_own_installers(ctx, result)
    return result.finish()


def _cordoned(ctx: Context, nodes: list[Node]) -> dict[str, bool]:
    """The GPU nodes whose Node is cordoned (True: with the runbook's mark, ``drains.CORDON_MARK``); {} when the
    Nodes cannot be read (the pods then find out). Why: kube-scheduler places no pod on a cordoned node, so
    its test pods stayed Pending for the whole timeout, then were blamed on what holds the node's GPUs or room
    (operator walkthrough, 6 Dec 2026)."""
    names = {n.name for n in nodes}
    try:
        found = ctx.kube.nodes()
    except RunbookError:
        return {}
    cordons = {str(n["metadata"]["name"]): drains.cordon_of(n) for n in found}
    return {name: marked for name, marked in cordons.items() if name in names and marked is not None}


def _on_cordoned(pod: TestPod, marked: bool) -> Check:
    """A test pod not created: its node is cordoned."""
    whose = (
        "with the runbook's mark (a run or rollback interrupted after its drain)" if marked else "by someone"
    )
    return Check(
        TITLES[pod.kind],
        False,
        f"not run: Node {pod.node.name} is cordoned {whose}, so kube-scheduler places no pod there (this pod "
        "asks for a GPU through it)",
        fix=drains.uncordon_command(pod.node.name, marked=marked) + "  # then run the cuda-test step again",
    )


def _left_on_down_nodes(run_id: str, down: list[str]) -> str:
    """Test pods bound to a node that is not Ready stay Terminating after their delete until its kubelet confirms
    their end: one that stopped posting does when it returns, one that reports its node not Ready once it can stop
    them (with no network it can; with its container runtime down it cannot). Forcing it is the site's call, so
    the step names the command, not runs it."""
    return (
        f"the test pods bound to {', '.join(down)} (not Ready) may stay Terminating until the node's kubelet "
        "confirms their end; "
        f"to remove them now: kubectl -n {TEST_NAMESPACE} delete pods -l {RUN_LABEL}={run_id} --field-selector "
        f"spec.nodeName=<node> --force --grace-period=0"
    )


def _plan_only(ctx: Context, nodes: list[Node], result: StepResult) -> StepResult:
    """The pods each node would run, with no pod created: the pods pull images and run on the GPU nodes, so
    they wait for approval like every change. Deterministic (no run id): the approval gate compares this plan
    with a fresh one before applying."""
    kinds = sorted({p.kind for p in build_pods(ctx, nodes[:1], "plan")})
    for node in nodes:
        result.nodes.append(
            NodeResult(
                node.name, node.address, status="planned", message="would run pods: " + ", ".join(kinds)
            )
        )
    result.notes.append("plan only (apply is off): no test pod was created")
    return result.finish()


def _create_pods(ctx: Context, pods: list[TestPod], attempted: list[TestPod]) -> dict[str, str]:
    """Create the pods concurrently, each one listed in ``attempted`` before its call: a pod whose creation
    was cut short (an error, Ctrl-C) may still exist, and the caller deletes every pod listed there.

    Returns, by pod name, why a pod could not be created.  Why not raise: the API server refuses a pod for a
    reason the operator must see on the node's line, such as ``pods "…" is forbidden: pod rejected:
    RuntimeClass "nvidia" not found`` (HTTP 403 from the RuntimeClass admission plugin, kubernetes v1.35.0
    plugin/pkg/admission/runtimeclass/admission.go:158), which is what a cluster upgraded to Talos 1.13
    without the GPU Operator's RuntimeClass answers.  Raised, it ended the step with no node's result, no
    fix, and the pods that were created still judged by nobody.
    """
    refused: dict[str, str] = {}

    def create(pod: TestPod) -> None:
        attempted.append(pod)
        try:
            ctx.kube.create_pod(TEST_NAMESPACE, pod.manifest)
        except RunbookError as exc:
            refused[pod.name] = exc.message

    ctx.kube.each(create, pods)
    return refused


def _refused(ctx: Context, pod: TestPod, why: str) -> Check:
    """A pod the API server did not create: failed, with the known fault's fix when the refusal names one."""
    return _diagnosed(
        ctx,
        TITLES[pod.kind],
        pod,
        f"the pod could not be created: {why}",
        why,
        fix="remove what the API server's answer names (a missing RuntimeClass, an admission policy, RBAC on "
        f"pods in namespace {TEST_NAMESPACE}), then run the cuda-test step again",
    )


def _node_results(nodes: list[Node], pods: list[TestPod], checks: list[Check]) -> list[NodeResult]:
    """One result per node from its pods' checks: ok when all passed; the failures' messages, each once (a fault
    of the node, such as an image it cannot pull, fails its four pods with the same words) and none that another
    continues, else the first check's, as the node's line."""
    by_node = {n.name: NodeResult(node=n.name, address=n.address) for n in nodes}
    for pod, check in zip(pods, checks, strict=True):
        by_node[pod.node.name].checks.append(check)
    for res in by_node.values():
        res.status = "ok" if all(c.ok for c in res.checks) else "failed"
        failed = list(dict.fromkeys(c.message for c in res.checks if not c.ok))
        # "pod still Pending after 300 s" beside "pod still Pending after 300 s: <the scheduler's reason>"
        said = [m for m in failed if not any(o.startswith(f"{m}: ") for o in failed)]
        res.message = "; ".join(said) or res.checks[0].message
    return list(by_node.values())


def _delete_pods(ctx: Context, pods: list[TestPod], run_id: str, result: StepResult) -> None:
    """Delete every pod whose creation was attempted, by the run's label (:meth:`Kube.delete_pods`: a page
    of pods per call, each pod journalled).

    Why a failure here is a note, not an error: the delete runs in the step's ``finally``, so an error raised
    here (a 503 from a busy API server, a connection cut) replaced the step's result, and the nodes that had
    just passed were reported as nothing at all; after an earlier error it would have hidden that error too.
    The pods still there carry the run label, which ``runbook run`` deletes after the step (it looks whenever
    a created pod has no journalled delete); the note gives the command for a notebook run.
    """
    if not pods:
        result.data["pods_deleted"] = 0
        return
    selector = f"{RUN_LABEL}={run_id}"
    try:
        result.data["pods_deleted"] = len(ctx.kube.delete_pods(TEST_NAMESPACE, selector))
    except RunbookError as exc:
        result.data["pods_deleted"] = None
        result.notes.append(
            f"the test pods could not all be deleted ({exc.message}); those left carry the label {selector}: "
            f"`runbook run` deletes them after this step, or run `kubectl -n {TEST_NAMESPACE} delete pods -l "
            f"{selector}`"
        )


def extension_drivers(ctx: Context, nodes: list[Node]) -> tuple[dict[str, str], dict[str, str]]:
    """Driver version of each node's kernel-module extension (one fan-out call), to compare with nvidia-smi;
    and, by node name, why a node's extensions could not be read.

    Why the errors: a node with no driver to compare passed its nvidia-smi checks, so a failed read looked
    like a matching driver.  ``Talosctl.get`` already tells which node failed (``talosctl get`` names none).
    """
    fan = ctx.talosctl.get("extensions", [n.address for n in nodes])
    by_address = fan.by_node()
    out: dict[str, str] = {}
    errors: dict[str, str] = {}
    for node in nodes:
        if node.address in fan.errors:
            errors[node.name] = fan.errors[node.address]
        for ext in extensions_from_resources(by_address.get(node.address, [])):
            if ext.name.startswith(KMOD_EXTENSIONS):
                out[node.name] = ext.version.split("-", 1)[0]
    return out, errors


def _wait(
    ctx: Context,
    run_id: str,
    on_node: dict[str, str],
    timeout: float,
    progress: Callable[[int, int], None] | None,
) -> tuple[dict[str, dict[str, Any]], _DownPods]:
    """Watch this run's pods (name -> node) until each has finished (Succeeded/Failed), the timeout, or every
    pod left cannot finish (``_DownPods``); returns the last seen, and what the early stop found."""
    names = set(on_node)
    seen: dict[str, dict[str, Any]] = {}
    done: set[str] = set()
    stalled = _DownPods(ctx, on_node, done, seen)

    def finished(obj: dict[str, Any]) -> bool:
        name = obj["metadata"]["name"]
        seen[name] = obj
        stalled.saw(name, obj)
        if (obj.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            done.add(name)
            if progress:
                progress(len(done), len(names))
        return done >= names

    ctx.kube.watch_until(
        ctx.kube.core.list_namespaced_pod,
        finished,
        timeout=timeout,
        until="every test pod finished",
        give_up=stalled.held,
        namespace=TEST_NAMESPACE,
        label_selector=f"{RUN_LABEL}={run_id}",
    )
    for name in names - set(seen):
        pod = ctx.kube.pod(TEST_NAMESPACE, name)
        if pod:
            seen[name] = pod
    return seen, stalled


@dataclass(frozen=True)
class _Down:
    """Why a node's pods did not finish: the node's ``state``; ``unreachable``: its kubelet stopped posting
    (Ready Unknown), so nothing there serves a log; ``held``: the pods bound to it may stay Terminating (the node
    exists; pod garbage collection deletes those of a Node that is gone); ``waited``: " after 300 s" when the
    wait ran out rather than stopped early."""

    state: str
    unreachable: bool
    waited: str = ""
    held: bool = True

    def said(self) -> str:
        """The end of the pods' "pod still Pending…"."""
        return f"{self.waited}: {self.state}"


def _down_nodes(
    ctx: Context,
    seen: dict[str, dict[str, Any]],
    on_node: dict[str, str],
    early: list[str],
    *,
    waited_out: bool = True,
) -> dict[str, _Down]:
    """By node, why the pods left there did not finish, for a node that is not Ready or gone: the early stop's
    words, or, after the whole timeout, the Node's own Ready condition.

    Why look after a timeout too: the early stop fires only when every pod left is on a node down for a minute,
    so a Ready node whose pods hang (an image it cannot pull), or a node down for less than the minute, let the
    wait run out, and the down node's pods were reported "still Pending after 300 s" like any slow pod, with no
    word of the node nor of its pods that stay Terminating. The Nodes are read by ``_ready_conditions``; when
    they cannot be, only the early stop's nodes are named."""
    left = sorted({node for name, node in on_node.items() if _phase(seen.get(name)) not in _FINISHED})
    if not left:
        return {}
    nodes = _ready_conditions(ctx, left)
    grace = f"{kube_diagnosis.DOWN_GRACE_S:.0f} s"
    # not after an early stop: the wait did not run to its timeout
    waited = f" after {ctx.params.cuda_test.timeout_seconds} s" if waited_out else ""
    down: dict[str, _Down] = {}
    for name in left:
        obj = None if nodes is None else nodes.get(name)
        if name in early:
            # a list that failed: as the early stop saw it
            unknown = nodes is None or (obj is not None and _stopped_posting(obj))
            down[name] = _Down(f"node {name} has not been Ready for {grace} or more", unknown)
        elif nodes is not None and obj is None:  # its pods are deleted with it (pod GC), none stays
            down[name] = _Down(f"node {name} no longer exists", False, waited, held=False)
        elif obj is not None and (found := _not_ready(obj, name, waited)):
            down[name] = found
    return down


def _not_ready(node: dict[str, Any], name: str, waited: str = "") -> _Down | None:
    """The Node's not-Ready state in its own Ready condition's words, or None when it is Ready."""
    check = kube_diagnosis.node_not_ready(node, name)
    return None if check is None else _Down(check.message, _stopped_posting(node), waited)


def _stopped_posting(node: dict[str, Any]) -> bool:
    """The node lifecycle controller set Ready Unknown: the node's kubelet stopped posting."""
    return (kube_diagnosis.condition(node, "Ready") or {}).get("status") == "Unknown"


#: Up to this many Nodes are read one GET each after the pod wait; more, in one paged list (``_ready_conditions``).
NODE_GETS_MAX = 20


def _ready_conditions(ctx: Context, names: list[str]) -> dict[str, dict[str, Any]] | None:
    """The Nodes named (only their name and Ready condition kept), missing ones left out; None when they cannot
    be read. Why two ways: a few nodes cost a GET each, and the first that fails ends the look (an API server
    that stopped answering costs one timeout, not one per node); many cost the paged list of every Node
    (``Kube.iter_nodes``: 5 requests for 1,000 nodes, not 1,000 GETs), of which only those named are kept."""
    try:
        if len(names) <= NODE_GETS_MAX:
            found = (ctx.kube.node(name) for name in names)
            objs = [obj for obj in found if obj is not None]
        else:
            wanted = set(names)
            objs = [n for n in ctx.kube.iter_nodes() if n["metadata"]["name"] in wanted]
    except RunbookError:
        return None
    return {
        n["metadata"]["name"]: {
            "metadata": {"name": n["metadata"]["name"]},
            "status": {"conditions": [c for c in [kube_diagnosis.condition(n, "Ready")] if c]},
        }
        for n in objs
    }


_FINISHED = ("Succeeded", "Failed")


def _phase(obj: dict[str, Any] | None) -> str:
    return str(((obj or {}).get("status") or {}).get("phase", "Unknown"))


class _DownPods:
    """Whether every test pod not finished cannot finish, so waiting on cannot help: it is on a node that is
    down, or its image has failed to pull for a minute (not counting a registry's "later", such as a 429 rate
    limit: ``kube_diagnosis.pull_failing``).

    Why: the pods bound to a down node by ``spec.nodeName`` stay Pending, as no kubelet starts them, and those
    left to kube-scheduler meet the ``node.kubernetes.io/unreachable`` (or ``not-ready``) NoSchedule taint, which
    they do not tolerate (kubernetes v1.35.0 node_lifecycle_controller.go:84-91, 550-560); a pod already running
    there is never reported finished either (no kubelet posts its end). A pod whose image the node cannot pull
    waits in ``ErrImagePull``/``ImagePullBackOff``, retried with a back-off from 10 s up to 5 minutes (kubernetes
    v1.35.0 pkg/kubelet/kubelet.go:177, 225, 681; images/image_manager.go:335-348): the step waited its whole
    ``cuda_test.timeout_seconds`` for every other node's verdict either way (an operator walkthrough met
    301 s for an image tag that does not exist). The mark of progress is the number of pods finished
    (``kube_diagnosis.Stall`` says how the Nodes are then read); a pull counts once it has failed for
    ``DOWN_GRACE_S``, a pull that is only slow (``Pulling``) never does. A pod kube-scheduler cannot place
    counts only beside such a pull on its node: a pod stuck pulling keeps the GPU it was given, so the node's
    other GPU pod waits for it ("Insufficient nvidia.com/gpu"); placed apart, it may be waiting for a GPU a
    workload frees."""

    def __init__(
        self, ctx: Context, on_node: dict[str, str], done: set[str], seen: dict[str, dict[str, Any]]
    ) -> None:
        self.on_node, self.done = on_node, done
        self.stall = kube_diagnosis.Stall(ctx.kube)
        self.gave_up = False
        self._pull_failing: dict[str, float] = {}
        self._seen = seen  # the wait's last look at each pod, which it keeps up to date

    def saw(self, name: str, obj: dict[str, Any]) -> None:
        """Note since when the pod's image pull has been failing (the watch's events)."""
        if kube_diagnosis.pull_failing(obj):
            self._pull_failing.setdefault(name, time.monotonic())
        else:
            self._pull_failing.pop(name, None)

    def held(self) -> str | None:
        if not self.stall.quiet(len(self.done)):
            return None
        left = [name for name in self.on_node if name not in self.done]
        now, grace = time.monotonic(), kube_diagnosis.DOWN_GRACE_S
        pulls = [n for n in left if now - self._pull_failing.get(n, now) >= grace]
        pulling_on = {self.on_node[n] for n in pulls if _requests_gpu(self._seen.get(n))}
        waiting = [n for n in left if self.on_node[n] in pulling_on and self._unschedulable(n)]
        nodes = {self.on_node[n] for n in left if n not in pulls and n not in waiting}
        down = self.stall.down_among(nodes) if nodes else []
        if nodes and not down:
            return None
        self.gave_up = True
        said = (
            [f"{len(pulls)} wait in an image pull that has failed for {grace:.0f} s or more"] if pulls else []
        )
        said += [f"{len(waiting)} wait for the GPU such a pod holds on its node"] if waiting else []
        said += [f"on {', '.join(down)}, not Ready for {grace:.0f} s or more"] if down else []
        return "the pods left cannot finish: " + "; ".join(said)

    def _unschedulable(self, name: str) -> bool:
        """kube-scheduler could not place the pod (its PodScheduled condition is False)."""
        scheduled = kube_diagnosis.condition(self._seen.get(name) or {}, "PodScheduled") or {}
        return scheduled.get("status") == "False"


def _requests_gpu(pod: dict[str, Any] | None) -> bool:
    """The pod asks for ``nvidia.com/gpu`` (then, scheduled, it holds one while it waits)."""
    containers = ((pod or {}).get("spec") or {}).get("containers") or []
    return any("nvidia.com/gpu" in ((c.get("resources") or {}).get("limits") or {}) for c in containers)


#: Each test pod's check, by its kind.
TITLES = {
    "smi": "nvidia-smi (runtimeClass nvidia)",
    "gpu": "nvidia-smi with nvidia.com/gpu: 1",
    "vectoradd": "CUDA vectoradd (runtimeClass nvidia)",
    "vectoradd-gpu": "CUDA vectoradd with nvidia.com/gpu: 1",
}


def _judge(
    ctx: Context,
    pod: TestPod,
    obj: dict[str, Any] | None,
    node_driver: str | None,
    *,
    driver_unread: str | None = None,
    node_down: _Down | None = None,
    stopped_early: bool = False,
) -> Check:
    """The pod's check; ``node_down`` says why its node, not Ready, kept a pod from finishing (``_down_nodes``)."""
    title = TITLES[pod.kind]
    phase = _phase(obj)
    log, unread = _read_log(ctx, pod, node_down) if phase in _FINISHED else ("", None)
    if unread is not None:
        if phase == "Succeeded":
            return Check(
                title,
                False,
                f"the pod succeeded, but its log could not be read: {unread}",
                cause="the API server could not fetch the log from the node's kubelet",
                fix=f"run the cuda-test step again; if the log stays unreadable, check the node's kubelet "
                f"(`talosctl -n {pod.node.address} service kubelet`) and that `kubectl logs` works for its pods",
            )
        log = f"(no log: {unread})"  # a pod rejected before any container ran has no log (HTTP 400)
    if phase == "Succeeded":
        if pod.kind.startswith("vectoradd"):
            ok = "Test PASSED" in log
            return Check(
                title,
                ok,
                "Test PASSED" if ok else "the sample did not print Test PASSED",
                evidence=log[-500:],
            )
        return _judge_smi(ctx, title, pod, log, node_driver, driver_unread=driver_unread)
    reason = (
        f"pod ended {phase}"
        if phase == "Failed"
        else f"pod still {phase}{node_down.said()}"
        if node_down
        else f"pod still {phase}"
        if stopped_early
        else f"pod still {phase} after {ctx.params.cuda_test.timeout_seconds} s"
    )
    # A pod that never started says why in its own status (the scheduler's or the kubelet's words).
    stuck = kube_diagnosis.pod_not_started(obj, pod.node.name, "CUDA test") if obj else None
    if stuck is not None and phase == "Pending":
        return _failed(ctx, title, pod, f"{reason}: {stuck.message}", log, fix=_not_started_fix(pod, stuck))
    return _failed(ctx, title, pod, reason, log)


def _not_started_fix(pod: TestPod, stuck: Check) -> str:
    """What to do about a test pod that never started, with commands that still work once the step has deleted
    its pods (before: ``kubectl describe pod`` of a pod that no longer exists, found by an operator
    walkthrough). ``talosctl image pull`` pulls into the CRI namespace by default, as the kubelet does
    (talosctl reference v1.10-v1.13 ``talosctl image pull``)."""
    address, node = pod.node.address, pod.node.name
    if stuck.name.endswith("image pulled"):
        image = str(pod.manifest["spec"]["containers"][0]["image"])
        return (
            f"talosctl -n {address} image pull {image}   # the node's own pull shows the registry's answer; then "
            "set cuda_test.smi_image / cuda_test.vectoradd_image to an image the node can pull, or let the node "
            "reach the registry (a mirror, a pull secret)"
        )
    return (
        f"kubectl describe node {node}; kubectl get pods -A --field-selector spec.nodeName={node}   # what holds "
        "its GPUs or room (the scheduler's reason above); free it, then run the cuda-test step again"
    )


def _judge_smi(
    ctx: Context, title: str, pod: TestPod, log: str, node_driver: str | None, *, driver_unread: str | None
) -> Check:
    """A succeeded nvidia-smi pod: its GPUs, and its driver against the node's extension driver.

    A node whose extensions could not be read fails here: without the comparison a driver from another track
    than the kernel module would pass unseen.
    """
    try:
        smi = parse_nvidia_smi(log)
    except OutputParseError as exc:  # an empty or foreign log is the pod's fault, not the step's
        return _failed(
            ctx, title, pod, f"nvidia-smi printed nothing the runbook recognises: {exc.message}", log
        )
    if smi.error or not smi.gpus:
        return _failed(ctx, title, pod, f"nvidia-smi ran but reported {smi.error or 'no GPUs'}", log)
    gpus = ", ".join(sorted({g.name for g in smi.gpus}))
    message = f"{len(smi.gpus)} GPU(s) ({gpus}), driver {smi.driver_version}, CUDA {smi.cuda_version}"
    if pod.kind == "gpu" and len(smi.gpus) > 1:
        return _not_isolated(pod, message, log)
    if driver_unread is not None:
        command = f"talosctl -n {pod.node.address} get extensions"
        return Check(
            title,
            False,
            f"{message}; but the node's extension driver could not be compared: "
            f"`{command}` failed: {driver_unread.strip()}",
            cause="talosctl could not read the node's extensions, so nvidia-smi's driver was compared with "
            "nothing (a driver from another track than the kernel module would pass unseen)",
            fix=f"{command}   # why it fails (the node's Talos API or the talosconfig's endpoint); "
            "once it lists the node's extensions, run the cuda-test step again",
            evidence=log[-500:],
        )
    if node_driver and smi.driver_version and smi.driver_version != node_driver:
        return Check(
            title,
            False,
            f"{message}; but the node's extension carries driver {node_driver}",
            cause="kernel module and userspace driver differ",
            fix="use the same track for the kernel-module and toolkit extensions",
            evidence=log[-500:],
        )
    if not node_driver:
        message = f"{message}; {_not_compared(node_driver)}"
    return Check(title, True, message, evidence=log[:2000])


def _not_isolated(pod: TestPod, message: str, log: str) -> Check:
    """The pod that requested one GPU lists more: what it was allocated did not reach the container, so every
    pod on the node can use GPUs the scheduler counts as another's.

    Why a failure: the device plugin hands the container its devices' UUIDs in ``NVIDIA_VISIBLE_DEVICES``, which
    wins over the CUDA image's ``all`` (NVIDIA/k8s-device-plugin@v0.18.0 internal/plugin/server.go:344-346,
    479-481; containerd@v2.2.3 internal/cri/server/container_create.go:762-768), or, with CDI (the GPU Operator
    from 25.10), containerd injects the one device and the spec sets ``void``; so an unprivileged pod that sets
    no ``NVIDIA_VISIBLE_DEVICES`` of its own, like this one, lists one GPU. Read in the code: no capture from a
    multi-GPU Talos node was found; pods listing more than they asked are captured in NVIDIA/gpu-operator#1021
    and NVIDIA/k8s-device-plugin#1294. The runtime-class-only pod is not judged so: with no request it keeps the
    image's ``all``, which the toolkit accepts by default.
    """
    return Check(
        TITLES[pod.kind],
        False,
        f"{message}; but the pod requested nvidia.com/gpu: 1: GPU isolation is not in effect",
        cause="the devices allocated to the container did not limit what it sees (a device plugin whose "
        "deviceListStrategy the node's container toolkit does not honour, or a runtime that injects every GPU), "
        "so pods use GPUs the scheduler counts as another pod's",
        fix="kubectl get ds -A -o yaml | grep -A1 DEVICE_LIST_STRATEGY   # none set means envvar, the plugin's "
        "default; the GPU Operator sets cdi-annotations,cdi-cri. In a pod requesting nvidia.com/gpu: 1 on "
        f"{pod.node.name}, `printenv NVIDIA_VISIBLE_DEVICES` prints one GPU-<uuid> (envvar) or void (CDI); "
        "all is the image's own value, which the allocation did not replace",
        evidence=log[-1500:],
    )


def _not_compared(node_driver: str | None) -> str:
    """Why nvidia-smi's driver was compared with nothing on a node whose extensions were read.

    Not a failure: a Talos node can load an NVIDIA driver no kernel-module extension carries. The Talos
    "NVIDIA GPU (Proprietary drivers)" guide before v1.4.8 copies the modules into a custom installer and
    installs only the toolkit extension (siderolabs/talos
    website/content/v1.4/talos-guides/configuration/nvidia-gpu-proprietary.md). But a pass must not read as a
    matching driver, so the node's line says it.
    """
    if node_driver is None:
        return (
            "driver not compared: `talosctl get extensions` lists no NVIDIA kernel-module extension "
            f"({'*, '.join(KMOD_EXTENSIONS)}*) on the node, so its driver came from elsewhere (e.g. a custom "
            "installer with the modules built in)"
        )
    return "driver not compared: the node's NVIDIA kernel-module extension reports no driver version"


#: Attempts at a log read the API server answers with a retryable error (5xx), and the pause before each retry.
LOG_READ_ATTEMPTS = 3
LOG_READ_PAUSE_S = 0.5


def _read_log(ctx: Context, pod: TestPod, node_down: _Down | None = None) -> tuple[str, str | None]:
    """The pod's log, or why it could not be read.

    Why retry: the API server fetches a log from the node's kubelet, and that hop can fail for a moment while
    the pod itself succeeded (seen as HTTP 500 on the real control plane); a step that crashed on it, or failed
    a GPU that worked, would send the operator after the wrong fault. A 4xx is final (a pod rejected before any
    container ran has no log: HTTP 400). Not when the pod's Node is not Ready (``node_down``, or read once after
    the first 5xx): its kubelet, which serves the log, is down or cut off, so a retry only adds the API server's
    dial to it again; the reason names the node. A 429 (a busy API server) is retried without that read.
    """
    last = ""
    for attempt in range(LOG_READ_ATTEMPTS):
        if attempt:
            time.sleep(LOG_READ_PAUSE_S * attempt)
        try:
            return ctx.kube.pod_log(TEST_NAMESPACE, pod.name), None
        except RetryableError as exc:
            last = exc.message
            server_hop = exc.status is not None and exc.status >= 500
        except RunbookError as exc:
            return "", exc.message
        if node_down is None and attempt == 0 and server_hop:
            node_down = _node_down_now(ctx, pod.node.name)
        if node_down is not None and node_down.unreachable:
            return "", f"{last} ({node_down.state}; its kubelet serves the log)"
    return "", last


def _node_down_now(ctx: Context, name: str) -> _Down | None:
    """The Node's not-Ready state, or None when it is Ready, gone or cannot be read."""
    try:
        obj = ctx.kube.node(name)
    except RunbookError:
        return None
    return None if obj is None else _not_ready(obj, name)


def _failed(
    ctx: Context, title: str, pod: TestPod, reason: str, log: str, *, fix: str | None = None
) -> Check:
    events = ctx.kube.events_for(TEST_NAMESPACE, "Pod", pod.name)
    text = "\n".join(f"{e.get('reason')}: {e.get('message')}" for e in events) + "\n" + log
    return _diagnosed(ctx, title, pod, reason, text, fix=fix)


def _diagnosed(
    ctx: Context, title: str, pod: TestPod, reason: str, text: str, *, fix: str | None = None
) -> Check:
    """A failed check: the known fault ``text`` shows (its cause and fix filled for the node), else ``reason``
    with ``fix`` (by default the command that shows the pod)."""
    known = match_failures(text)
    if known:
        entry = known[0]
        return Check(
            title,
            False,
            f"{reason}: {entry.title}",
            cause=entry.cause,
            fix=f"{entry.fix}: {ctx.node_context(pod.node.address, schematic=ctx.plan.schematic_of(pod.node.name)).fill(entry.command, new_schematic=entry.new_schematic)}",
            evidence=text.strip()[-1500:],
        )
    return Check(
        title,
        False,
        reason,
        evidence=text.strip()[-1500:],
        fix=fix
        or f"kubectl -n {TEST_NAMESPACE} describe pod {pod.name}  # re-run this step to see it (pods are deleted afterwards)",
    )
