"""``runbook sim up|status|down|scenarios|fault``: the built-in simulated Talos GPU cluster.

``up`` prints exactly what a user needs to point the library (or their own shell) at the simulated
cluster, the same three things a real cluster needs: a talosctl binary, a talosconfig and a kubeconfig.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any

from runbook_lib.cli import cmd_run
from runbook_lib.errors import PermanentError
from runbook_lib.model.params import load_params
from runbook_lib.model.versions import TalosVersion
from runbook_lib.notebook import lock
from runbook_lib.sim import cluster, faults, realkube, scenarios, toolserver
from runbook_lib.sim.state import load_nodes, sim_paths


def _state(args: argparse.Namespace) -> Path:
    """``--state`` as ``runbook run`` reads it (``cmd_run.resolve_state``: an empty one is refused)."""
    return cmd_run.resolve_state(args.state)


def _add_state(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--state",
        metavar="DIR",
        help="state directory (default: $RUNBOOK_SIM_STATE or <repo>/.sim/default)",
    )


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sim = sub.add_parser("sim", help="create, inspect and stop the built-in simulated Talos GPU cluster")
    sim_sub = sim.add_subparsers(dest="sim_command", metavar="ACTION", required=True)

    up = sim_sub.add_parser("up", help="create a simulated cluster and start its API servers")
    _add_state(up)
    up.add_argument(
        "-p",
        "--params",
        metavar="FILE",
        help="take the GPU nodes (names, addresses), Talos release and scenario from a parameter file",
    )
    up.add_argument(
        "--nodes",
        type=int,
        default=2,
        metavar="N",
        help="GPU worker nodes (default 2; with -p, the file's nodes)",
    )
    up.add_argument(
        "--control-planes", type=int, default=1, metavar="N", help="control plane nodes (default 1)"
    )
    up.add_argument(
        "--talos-version",
        metavar="V",
        help="Talos version of every node (default 1.12; with -p, the file's talos_version, which this may not "
        "contradict)",
    )
    up.add_argument("--talosctl-version", metavar="V", help="version the simulated talosctl client reports")
    up.add_argument(
        "--scenario",
        choices=sorted(scenarios.SCENARIOS),
        help="faults/state bundle (default: the parameter file's simulation.scenario, else fresh)",
    )
    up.add_argument(
        "--latency-ms",
        type=float,
        metavar="MS",
        help="per-call latency of every node (default: the parameter file's simulation.latency_ms, else 0)",
    )
    up.add_argument(
        "--gpus-per-node",
        type=int,
        default=1,
        metavar="N",
        help="GPUs in each GPU worker (default 1); a pod's nvidia-smi lists those it requested, or all",
    )
    up.add_argument(
        "--no-daemon",
        action="store_true",
        help="only write the state: no Kubernetes API or Image Factory, and the Python talosctl answers the "
        "nodes (simnode follows the daemon, so without one it is not started)",
    )
    up.add_argument(
        "--keep",
        action="store_true",
        help="start the servers on the cluster the state directory holds (what earlier runs left on its nodes "
        "and in its Kubernetes API), creating nothing; with -p, refused when it was made for other parameters",
    )
    up.set_defaults(handler=_up)

    status = sim_sub.add_parser("status", help="show the simulated cluster and its servers")
    _add_state(status)
    status.add_argument("--json", action="store_true")
    status.set_defaults(handler=_status)

    down = sim_sub.add_parser("down", help="stop the simulator's servers (state is kept unless --purge)")
    _add_state(down)
    down.add_argument("--purge", action="store_true", help="also delete the state directory")
    down.set_defaults(handler=_down)

    scen = sim_sub.add_parser("scenarios", help="list the named scenarios and faults")
    scen.set_defaults(handler=_scenarios)

    fault = sim_sub.add_parser("fault", help="switch a fault on (or off) for one node")
    _add_state(fault)
    fault.add_argument("node", help="node name or address")
    fault.add_argument("fault", choices=sorted(faults.FAULTS))
    fault.add_argument("value", nargs="?", default="true", help="fault value (default true; JSON allowed)")
    fault.add_argument("--clear", action="store_true", help="switch the fault off instead")
    fault.set_defaults(handler=_fault)


def _up(args: argparse.Namespace) -> int:
    state_dir = _state(args)
    if args.keep:
        return _up_kept(args, state_dir)
    spec = _spec(args)
    _refuse_bad_modes(spec, daemon=not args.no_daemon)  # before anything is stopped or written
    try:
        cluster.check_spec(spec)  # likewise: a bad spec leaves the running cluster running
    except ValueError as exc:
        raise PermanentError(str(exc)) from None
    previous = _replaced(state_dir)
    realkube.stop(state_dir)
    cluster.stop_daemon(state_dir)
    try:
        nodes = cluster.create(state_dir, spec)
    except ValueError as exc:
        raise PermanentError(str(exc)) from None
    if previous:
        sys.stdout.write(previous)
    endpoints: dict[str, Any] = {}
    if not args.no_daemon:
        try:
            endpoints = realkube.start_servers(state_dir)
        except (RuntimeError, ValueError) as exc:
            raise PermanentError(str(exc)) from None
    talos = "" if args.no_daemon else f" ({_start_talos(state_dir, spec, nodes)})"
    _print_up(state_dir, spec, nodes, endpoints, talos)
    return 0


def _up_kept(args: argparse.Namespace, state_dir: Path) -> int:
    """``sim up --keep``: the servers started again on the cluster a state directory holds; nothing created.

    Why: ``runbook run`` stops the simulator it started, and ``sim up`` created a new cluster, so an operator who
    wanted to look at what a run left (``kubectl get pods``, ``talosctl get extensions``) could not (found while
    checking the rollback's ``kubectl label`` command by hand). A cluster already running is left as it is."""
    chosen = [flag for flag, value in _create_flags(args) if value]
    if chosen:
        raise PermanentError(
            f"--keep starts the cluster as it was created; {', '.join(chosen)} would make another one",
            hint="leave them out, or create a new cluster without --keep",
        )
    try:
        spec = cluster.spec_from_state(state_dir)
    except (FileNotFoundError, ValueError):
        raise PermanentError(
            f"no simulated cluster at {state_dir} to keep",
            hint="create one: runbook sim up -p FILE (or runbook run, which creates it)",
        ) from None
    if args.params:
        params = load_params(args.params)
        differs = cluster.state_differs(state_dir, params, params.simulation.scenario)
        if differs:
            raise PermanentError(
                f"the simulated cluster at {state_dir} was made for other parameters than {args.params} "
                f"({'; '.join(differs)}); nothing was started",
                hint="leave out -p to start it as it is, or create one for the file without --keep",
            )
    nodes = load_nodes(state_dir)
    files = cmd_run.SimLeases.of(state_dir.resolve())  # as a run keys it (cmd_run.resolve_state)
    with lock.held(files.lifecycle):  # not while a run brings this cluster up or stops it
        if cluster.daemon_pid(state_dir) is not None:
            # a run that started it would stop it when it ends: it is this command's now, as `sim up` leaves it
            files.started.unlink(missing_ok=True)
            sys.stdout.write(f"already running: the simulated cluster at {state_dir} was left as it is\n")
            _print_up(state_dir, spec, nodes, _published(state_dir), "", kept=True)
            return 0
        _refuse_bad_modes(spec, daemon=True)
        realkube.stop(state_dir)
        try:
            endpoints = realkube.start_servers(state_dir)
        except (RuntimeError, ValueError) as exc:
            raise PermanentError(str(exc)) from None
        talos = _start_talos(state_dir, spec, nodes, keep=True)
    _print_up(state_dir, spec, nodes, endpoints, f" ({talos})", kept=True)
    return 0


def _replaced(state_dir: Path) -> str:
    """The line saying which cluster a plain ``sim up`` replaces ("" when the directory held none). Why: what
    runs had changed on it (patched and upgraded nodes, a release, records' evidence for a rollback) went without
    a word, while ``--keep`` would have started it as it was."""
    try:
        was = cluster.spec_from_state(state_dir)
    except (
        OSError,
        ValueError,
        KeyError,
        TypeError,
        AttributeError,
    ):  # a damaged state is replaced all the same
        return ""
    return (
        f"replaced the simulated cluster at {state_dir} (Talos {was.talos_version}, created as scenario "
        f"{was.scenario}): what runs had changed on it is gone; `runbook sim up --keep` starts a cluster as "
        "runs left it\n"
    )


def _create_flags(args: argparse.Namespace) -> list[tuple[str, object]]:
    """The ``sim up`` flags that describe a cluster to create, and whether each was given."""
    return [
        ("--scenario", args.scenario),
        ("--talos-version", args.talos_version),
        ("--talosctl-version", args.talosctl_version),
        ("--latency-ms", args.latency_ms is not None),
        ("--no-daemon", args.no_daemon),
    ]


def _published(state_dir: Path) -> dict[str, Any]:
    """The endpoints a running simulator published (``endpoints.json``), or none."""
    try:
        data = json.loads(sim_paths(state_dir).endpoints.read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _spec(args: argparse.Namespace) -> cluster.ClusterSpec:
    """The cluster to create: from the flags, or from ``-p``'s parameters with the flags given explicitly
    winning over the file."""
    if args.nodes < 0 or args.control_planes < 1:
        raise PermanentError("need at least one control plane node and a non-negative number of workers")
    if not args.params:
        return cluster.ClusterSpec(
            workers=args.nodes,
            control_planes=args.control_planes,
            talos_version=args.talos_version or "1.12",
            scenario=args.scenario or "fresh",
            latency_ms=args.latency_ms or 0.0,
            gpus_per_worker=args.gpus_per_node,
            talosctl_version=args.talosctl_version,
        )
    from_params = cluster.spec_from_params(load_params(args.params))
    _same_release(args.talos_version, from_params.talos_version, args.params)
    return dataclasses.replace(
        from_params,
        control_planes=args.control_planes,
        gpus_per_worker=args.gpus_per_node,
        talosctl_version=args.talosctl_version,
        scenario=args.scenario or from_params.scenario,
        latency_ms=from_params.latency_ms if args.latency_ms is None else args.latency_ms,
    )


def _same_release(flag: str | None, in_file: str, params_file: str) -> None:
    """``--talos-version`` beside ``-p`` must name the file's release: the runbook plans for the file's, and its
    preflight fails every node on another. Before, the flag was ignored without a word (found by an operator
    walkthrough: ``sim up -p FILE --talos-version v1.13.2`` brought up v1.12.7 nodes)."""
    wanted, have = TalosVersion.parse_or_none(flag), TalosVersion.parse_or_none(in_file)
    if wanted is None or have is None or wanted == have:
        return
    if not wanted.is_release and wanted.minor_line == have.minor_line:  # "1.12" names the file's line
        return
    raise PermanentError(
        f"--talos-version {flag} contradicts talos_version {in_file} in {params_file}",
        hint="set talos_version in the parameter file (the runbook plans for it), or leave out -p",
    )


def _refuse_bad_modes(spec: cluster.ClusterSpec, *, daemon: bool) -> None:
    """A bad ``RUNBOOK_SIM_KUBE`` or ``RUNBOOK_SIM_TALOSCTL``, or no control plane built, is refused before a
    running cluster is stopped or anything is written."""
    try:
        realkube.check_mode()
        if daemon:
            realkube.choose(realkube.kubernetes_for_talos(spec.talos_version))
        cluster.talos_mode()
    except ValueError as exc:
        raise PermanentError(str(exc)) from None


def _print_up(
    state_dir: Path,
    spec: cluster.ClusterSpec,
    nodes: list[Any],
    endpoints: dict[str, Any],
    talos: str,
    *,
    kept: bool = False,
) -> None:
    """What ``sim up`` started, and the one line that points a shell's talosctl/kubectl at it. ``kept``: a cluster
    ``--keep`` started as runs left it, which its scenario no longer describes (an operator walkthrough read
    "scenario fresh" of nodes a run had patched)."""
    paths = sim_paths(state_dir)
    out = sys.stdout
    scenario = (
        f"created as scenario {spec.scenario}, as runs left it" if kept else f"scenario {spec.scenario}"
    )
    out.write(f"simulated cluster: {len(nodes)} nodes ({nodes[0].talos_version}, {scenario})\n")
    out.write(f"state:       {state_dir}\n")
    out.write(f"talosctl:    {paths.bin_dir / 'talosctl'}{talos}\n")
    out.write(f"talosconfig: {paths.talosconfig}\n")
    if paths.kubeconfig.exists() and endpoints.get("kube"):
        out.write(f"kubeconfig:  {paths.kubeconfig}\n")
    if "charts" in endpoints:
        out.write(f"kubernetes:  {realkube.summary(state_dir)}\n")
    for key in ("kube", "charts", "charts_mirror", "factory", "tools"):
        if key in endpoints:
            out.write(f"{key + ':':<12} {endpoints[key]}\n")
    if endpoints and "tools" not in endpoints and toolserver.client_binary() is not None:
        out.write(f"tools:       not listening, tools run as plain processes (why: {paths.log})\n")
    out.write("nodes:\n")
    for n in nodes:
        gpus = f"{len(n.gpus)}x {n.gpus[0].model}" if n.gpus else "no GPU"
        out.write(f"  {n.address:<12} {n.name:<18} {n.role:<13} {gpus}\n")
    # quoted: a state path with `$(…)` in it ran, pasted (attack re-run, 7 Dec 2026); $PATH stays expanded
    kubeconfig = f" KUBECONFIG={shlex.quote(str(paths.kubeconfig))}" if paths.kubeconfig.exists() else ""
    out.write(
        f"\nUse it from a shell:\n  export PATH={shlex.quote(str(paths.bin_dir))}:$PATH "
        f"TALOSCONFIG={shlex.quote(str(paths.talosconfig))}{kubeconfig}\n"
    )


def _start_talos(state_dir: Path, spec: cluster.ClusterSpec, nodes: list[Any], *, keep: bool = False) -> str:
    """The real talosctl against simnode, or the Python one; the one-line reason (``RUNBOOK_SIM_TALOSCTL``)."""
    try:
        return cluster.start_talos(state_dir, spec, nodes, keep=keep).reason
    except ValueError as exc:  # RUNBOOK_SIM_TALOSCTL=real that cannot be honoured: nothing left running
        _stop_all(state_dir)
        raise PermanentError(str(exc)) from None
    except BaseException:  # simnode that did not start, Ctrl-C: the control plane must not outlive sim up
        _stop_all(state_dir)
        raise


def _stop_all(state_dir: Path) -> bool:
    """Everything ``sim up`` starts, stopped before returning; True if something ran. The real control plane
    first, and waited for (``realkube.stop``): left alone it would stop only once it noticed the daemon gone."""
    kube = realkube.stop(state_dir)
    return cluster.stop_talos(state_dir) | cluster.stop_daemon(state_dir) | kube


def _status(args: argparse.Namespace) -> int:
    state_dir = _state(args)
    try:
        info = cluster.status(state_dir)
    except FileNotFoundError as exc:
        raise PermanentError(str(exc)) from None
    if args.json:
        sys.stdout.write(json.dumps(info, indent=2) + "\n")
        return 0
    out = sys.stdout
    out.write(f"state:       {info['state_dir']}\n")
    out.write(f"talosconfig: {info['talosconfig']}\n")
    out.write(f"kubeconfig:  {info['kubeconfig'] or '-'}\n")
    daemon = f"running (pid {info['daemon_pid']})" if info["daemon_pid"] else "stopped"
    out.write(f"daemon:      {daemon}\n")
    for key, url in info["endpoints"].items():
        out.write(f"{key + ':':<12} {url}\n")
    out.write(f"talosctl:    {info['talosctl']}\n")
    out.write(f"kubernetes:  {realkube.describe(state_dir)}\n")
    out.write(f"scenario:    created as {info['scenario']} (the nodes below are as runs left them)\n")
    out.write(
        f"{'ADDRESS':<12} {'NAME':<18} {'ROLE':<13} {'TALOS':<10} {'SCHEMATIC':<13} {'DRIVER':<11} FAULTS\n"
    )
    for n in info["nodes"]:
        out.write(
            f"{n['address']:<12} {n['name']:<18} {n['role']:<13} {n['talos']:<10} {n['schematic']:<13} "
            f"{n['driver']:<11} {','.join(n['faults']) or '-'}\n"
        )
    return 0


def _down(args: argparse.Namespace) -> int:
    state_dir = _state(args)
    if args.purge and state_dir.exists() and not cluster.is_state_dir(state_dir):
        raise PermanentError(
            f"--state {state_dir} is not a simulator state directory (no {cluster.MARKER} file): not deleted",
            hint="--purge deletes only a directory `runbook sim up` created; check --state / RUNBOOK_SIM_STATE",
        )
    foreign = cluster.foreign_pid(state_dir)
    if foreign is not None:
        sys.stderr.write(
            f"{sim_paths(state_dir).pid} names process {foreign}, which is not this simulator's daemon "
            "(stale pid file): left alone\n"
        )
    files = cmd_run.SimLeases.of(state_dir.resolve())  # as a run keys it (cmd_run.resolve_state)
    with lock.held(files.lifecycle):  # no run takes a lease, nor brings it up, until it is stopped or removed
        _refuse_while_used(state_dir, files)
        stopped = _stop_all(state_dir)
        sys.stdout.write("simulator stopped\n" if stopped else "simulator was not running\n")
        if args.purge and state_dir.exists():
            shutil.rmtree(state_dir)
            sys.stdout.write(f"removed {state_dir}\n")
    return 0


def _refuse_while_used(state_dir: Path, files: cmd_run.SimLeases) -> None:
    """Refuse to stop a simulator a ``runbook run`` is using. Why: ``sim down`` under an ``--apply`` run in its
    image step left that run in ``talosctl upgrade`` until its 30-minute timeout, and its record then said an
    upgrade the node never had "finished after the interrupt" (attack re-run, 7 Dec 2026)."""
    holders = lock.live_leases(files.leases)
    if holders:
        raise PermanentError(
            f"the simulated cluster at {state_dir} is in use by {len(holders)} run(s) ({'; '.join(holders)}): "
            "not stopped",
            hint="let the run end (the last run out stops a simulator a run started), or interrupt it (Ctrl-C, "
            "which seals its record), then run sim down again",
        )


def _scenarios(_args: argparse.Namespace) -> int:
    sys.stdout.write("Scenarios (runbook sim up --scenario NAME):\n")
    for name, scen in scenarios.SCENARIOS.items():
        sys.stdout.write(f"  {name:<20} {scen.description}\n")
    sys.stdout.write("\nFaults (runbook sim fault NODE NAME [VALUE]):\n")
    for name, text in faults.FAULTS.items():
        sys.stdout.write(f"  {name:<20} {text}\n")
    return 0


def _restart_hint(args: argparse.Namespace, state_dir: Path, clear: bool) -> str:
    """The three commands that switch a fault simnode reads only at its start, on the cluster as it is."""
    state = shlex.join(["--state", str(state_dir)])
    switch = shlex.join([args.node, args.fault, *(["--clear"] if clear else [args.value])])
    return (
        f"runbook sim down {state}; runbook sim fault {state} {switch}; runbook sim up --keep {state} "
        "(the nodes keep what runs did to them)"
    )


def _fault(args: argparse.Namespace) -> int:
    state_dir = _state(args)
    try:
        load_nodes(state_dir)
    except FileNotFoundError:  # a traceback before (walkthrough, stop 52)
        create = shlex.join(["runbook", "sim", "up", "--state", str(state_dir), "-p", "FILE"])
        raise PermanentError(
            f"no simulated cluster at {state_dir}", hint=f"create it first: {create}"
        ) from None
    try:
        value: Any = json.loads(args.value)
    except ValueError:
        value = args.value
    clear = args.clear or value is False or value is None  # `FAULT false` switches it off, as --clear does
    try:
        # clearing too: a cleared upgrade_fails was reported "cleared" while simnode kept failing the upgrade
        # (found by an operator walkthrough)
        cluster.check_talos_fault(state_dir, args.fault)
    except ValueError as exc:
        raise PermanentError(str(exc), hint=_restart_hint(args, state_dir, clear)) from None
    try:
        if clear:
            faults.clear(state_dir, args.node, args.fault)
        else:
            faults.inject(state_dir, args.node, args.fault, value)
    except KeyError:
        names = ", ".join(n.name for n in load_nodes(state_dir))
        raise PermanentError(f"no node {args.node!r} in {state_dir}", hint=f"its nodes: {names}") from None
    if args.fault == "unreachable":
        cluster.sync_talos_faults(state_dir)  # simnode, when it runs the nodes, takes the node down too
    sys.stdout.write(f"{'cleared' if clear else 'set'} {args.fault} on {args.node}\n")
    return 0
