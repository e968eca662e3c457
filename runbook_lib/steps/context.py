"""Everything a step needs to reach the cluster, built once per run from the validated parameters.

Why the simulated target is just paths: the simulator publishes, in its state directory, the same things a
real cluster gives a user (a talosconfig, a kubeconfig, the ``talosctl``/``helm`` executables and the
Image Factory URL in ``endpoints.json``).  The library reads those files and then runs exactly the code it
runs against a real cluster; it never imports the simulator.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from runbook_lib.clients.helm import Helm
from runbook_lib.clients.kubectl import Kubectl
from runbook_lib.clients.proc import Journal, Runner
from runbook_lib.clients.talosctl import Talosctl
from runbook_lib.errors import PermanentError
from runbook_lib.model.diagnosis import NodeContext
from runbook_lib.model.params import Node, Params
from runbook_lib.model.plan import Plan, build_plan

from .events import Events

if TYPE_CHECKING:  # imported on first use: see Context.kube
    from runbook_lib.clients.kube import Kube

#: Where the simulator keeps its state unless told otherwise (kept in step with ``runbook sim``).
SIM_STATE_ENV = "RUNBOOK_SIM_STATE"
DEFAULT_SIM_STATE = Path(__file__).resolve().parents[2] / ".sim" / "default"


@dataclass(frozen=True)
class Endpoints:
    """How to reach the cluster: tool paths, config paths (never contents) and the factory URL."""

    talosctl: str
    helm: str
    talosconfig: str | None
    kubeconfig: str | None
    image_factory_url: str
    chart_repo_url: str | None = None
    """The simulated cluster's own chart repository (``charts`` in ``endpoints.json``); None for a real one."""
    kubectl: str = "kubectl"


def sim_state_dir() -> Path:
    return Path(os.environ.get(SIM_STATE_ENV) or DEFAULT_SIM_STATE)


def resolve_endpoints(params: Params, state_dir: Path | None = None) -> Endpoints:
    """Real cluster: the parameters.  Simulated: the files the running simulator published, except a
    kubeconfig the parameters name that points at the simulated API server (:func:`_simulated_kubeconfig`)."""
    if params.target == "cluster":
        return Endpoints(
            talosctl=params.tools.talosctl,
            helm=params.tools.helm,
            talosconfig=_expand(params.talosconfig),
            # Only a single path: helm takes --kubeconfig as one file, while $KUBECONFIG may list several
            # (then helm and the Python client both read $KUBECONFIG themselves).
            kubeconfig=_expand(params.kubeconfig) or _single_path(os.environ.get("KUBECONFIG")),
            image_factory_url=params.image_factory_url,
            kubectl=params.tools.kubectl,
        )
    state = state_dir or sim_state_dir()
    endpoints_file = state / "endpoints.json"
    if not endpoints_file.exists():
        raise PermanentError(
            f"no simulated cluster is running at {state}",
            hint="start one with `runbook sim up -p <params file>` (or use `runbook run`, which starts it)",
        )
    published = json.loads(endpoints_file.read_text())
    return Endpoints(
        talosctl=str(state / "bin" / "talosctl"),
        helm=str(state / "bin" / "helm"),
        talosconfig=str(state / "talosconfig"),
        kubeconfig=_simulated_kubeconfig(params.kubeconfig, state),
        image_factory_url=str(published.get("factory") or params.image_factory_url),
        chart_repo_url=str(published["charts"]) if published.get("charts") else None,
        kubectl=str(state / "bin" / "kubectl"),
    )


def _check_running(state: Path, factory_url: str) -> None:
    """Refuse a simulated cluster whose servers are stopped: its endpoints file outlives them (``runbook run``
    stops the simulator it started), and a notebook then reported every node unreachable, "connection refused",
    with "bring the node back (power, network …)" as the fix (cloud-user walkthrough, 7 Dec 2026). Its Image
    Factory stands for the simulator: one TCP connect, no request. Only a refused connection is "stopped": a
    busy factory's full accept queue drops the connect until a retry, which a timeout would call stopped (review
    of 4421311). Called by :func:`connect`, not :func:`resolve_endpoints`, which the record's secret scrub
    uses: a scrub must not depend on the simulator being up (review of 4421311)."""
    where = urllib.parse.urlsplit(factory_url)
    if not where.hostname or not where.port:
        return
    try:
        socket.create_connection((where.hostname, where.port), timeout=3.0).close()
    except ConnectionRefusedError:
        up = shlex.join(["runbook", "sim", "up", "--keep", "--state", str(state), "-p"]) + " <params file>"
        raise PermanentError(
            f"the simulated cluster at {state} is stopped (its Image Factory {factory_url} refuses connections)",
            hint=f"start it again as it was left: `{up}` (`runbook run` starts it by itself)",
        ) from None
    except OSError:
        return  # not answering in time is not stopped: the steps' own calls say what is wrong


def _simulated_kubeconfig(named: str | None, state: Path) -> str:
    """The simulator's kubeconfig, or the one the parameters name when it points at the simulated API server.

    Why: a named kubeconfig was ignored without a word while the record's parameters named it, so the record
    misstated who made the plan (an operator planning as a read-only service account made on the simulator;
    walkthrough, 6 Dec 2026). Honouring any named file would let ``--set target=simulated`` on a real
    cluster's parameter file (``~/.kube/config``) run helm against that cluster (review): one whose current
    server is not the simulator's is refused, naming both."""
    own = state / "kubeconfig"
    if not named:
        return str(own)
    path = Path(os.path.expanduser(named))
    theirs, ours = _server_of(path), _server_of(own)
    if theirs is None or theirs != ours:
        raise PermanentError(
            f"kubeconfig {named}: on target: simulated only a kubeconfig of the simulated cluster is used, and this "
            f"one {'cannot be read' if theirs is None else 'points at ' + theirs}, not at {ours or 'the simulator'}",
            hint="leave kubeconfig unset (the simulator's), or make one against the simulated API server "
            f"(its server is in {own})",
        )
    return str(path)


def _server_of(path: Path) -> str | None:
    """The current context's cluster server in a kubeconfig, or None when it cannot be read."""
    try:
        config = yaml.safe_load(path.read_text())
        context = next(c for c in config["contexts"] if c["name"] == config["current-context"])["context"]
        cluster = next(c for c in config["clusters"] if c["name"] == context["cluster"])["cluster"]
        return str(cluster["server"])
    except (OSError, yaml.YAMLError, KeyError, TypeError, StopIteration):
        return None


def _single_path(value: str | None) -> str | None:
    return value if value and os.pathsep not in value else None


def _expand(path: str | None) -> str | None:
    return os.path.expanduser(path) if path else None


@dataclass
class Context:
    params: Params
    plan: Plan
    endpoints: Endpoints
    journal: Journal
    talosctl: Talosctl
    helm: Helm
    _kube: Kube | None = field(default=None, repr=False)
    events: Events = field(default_factory=Events, repr=False)
    """Where a rollout reports node failures and batch ends as they happen (``events.py``); nowhere by default."""
    _names: dict[str, str] | None = field(default=None, init=False, repr=False)

    @property
    def kube(self) -> Kube:
        """Connected on first use: the image, patch and verify steps need no Kubernetes API.

        The Kubernetes client is also *imported* only here: it costs ~0.4 s per process, which every step
        notebook's kernel (and ``runbook run`` itself) would otherwise pay at ``import`` time.
        """
        if self._kube is None:
            from runbook_lib.clients.kube import Kube  # noqa: PLC0415 - lazy (kernel start-up)

            self._kube = Kube.from_kubeconfig(self.endpoints.kubeconfig, self.journal)
        return self._kube

    @property
    def kubectl(self) -> Kubectl:
        """kubectl, for the one thing the runbook leaves to it: a node's drain (``clients/kubectl.py``)."""
        return Kubectl(self.endpoints.kubectl, kubeconfig=self.endpoints.kubeconfig, runner=self.helm.runner)

    @property
    def apply(self) -> bool:
        return self.params.apply

    def node_context(self, node: str, **known: Any) -> NodeContext:
        """What the fix commands for ``node`` fill in: the plan's Talos release, the factory the installers come
        from (``image_factory_url``: a site's own factory, the simulator's; before, every fix named
        factory.talos.dev), and what the caller ``known``s (schematics, the running release). ``node`` is its
        address (``talosctl -n``); the Kubernetes name its kubectl commands take is the parameters' name for it."""
        known.setdefault("node_name", self._names_by_address().get(node))
        try:
            return NodeContext.at_factory(
                self.endpoints.image_factory_url, node=node, talos=self.params.talos, **known
            )
        except PermanentError:
            return NodeContext(node=node, talos=self.params.talos, **known)

    def _names_by_address(self) -> dict[str, str]:
        """Each GPU node's Kubernetes name by its address, built once: verify asks it for every node (a scan per
        call cost 0.3 s at 1,000 nodes), and by address only, as every caller passes one (a name that is another
        node's address picked the wrong node: review of 6b1cc22)."""
        if self._names is None:
            self._names = {n.address: n.name for n in self.params.nodes}
        return self._names

    def nodes(self, only: list[str] | None = None) -> list[Node]:
        """The GPU nodes, or the chosen subset (names or addresses); unknown names are an error."""
        if not only:
            return list(self.params.nodes)
        known = {n.name: n for n in self.params.nodes} | {n.address: n for n in self.params.nodes}
        unknown = [name for name in only if name not in known]
        if unknown:
            raise PermanentError(
                f"unknown node(s) {', '.join(unknown)}",
                hint=f"GPU nodes in the parameters: {', '.join(n.name for n in self.params.nodes)}",
            )
        seen: dict[str, Node] = {}
        for name in only:
            seen.setdefault(known[name].name, known[name])
        return list(seen.values())


def connect(params: Params, *, journal: Journal | None = None, state_dir: Path | None = None) -> Context:
    """Build the clients for one run.  Nothing of the cluster is contacted yet; on ``target: simulated`` one TCP
    connect checks that the simulator is running (:func:`_check_running`)."""
    endpoints = resolve_endpoints(params, state_dir)
    if params.target == "simulated":
        _check_running(state_dir or sim_state_dir(), endpoints.image_factory_url)
    if endpoints.chart_repo_url:
        # The simulator serves the charts, as it serves the Image Factory: the plan shows the URL helm uses.
        params = params.with_chart_repo(endpoints.chart_repo_url)
    journal = journal if journal is not None else Journal()
    runner = Runner(journal)
    return Context(
        params=params,
        plan=build_plan(params),
        endpoints=endpoints,
        journal=journal,
        talosctl=Talosctl(endpoints.talosctl, talosconfig=endpoints.talosconfig, runner=runner),
        helm=Helm(endpoints.helm, kubeconfig=endpoints.kubeconfig, runner=runner),
    )


def wait_seconds(given: float | None, default: float, name: str) -> float:
    """A step's wait: the caller's ``name`` argument, else the ``timeouts`` parameter ``default``.

    Why not ``given or default``: that turned an explicit ``0`` into the parameter's value without a word.
    A wait of 0 s or less cannot be met (every node would time out at once), so it is refused, naming the
    argument, before the step reads or changes anything; the ``timeouts`` parameters refuse it the same way.
    """
    if given is None:
        return float(default)
    if given <= 0:
        raise PermanentError(
            f"{name}={given:g}: a wait must be more than 0 seconds",
            hint=f"leave {name} out to use the timeouts parameters ({float(default):g} s here), or give a "
            "positive number of seconds",
        )
    return float(given)
