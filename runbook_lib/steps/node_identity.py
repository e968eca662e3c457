"""Preflight's check that each node of ``nodes:`` is the machine its Kubernetes Node is: its ``name`` is a Node's
name, and its ``address`` is not another Node's address.

Why the name: the Kubernetes step labels and waits for each node's Node by name, and the CUDA test pins a pod to
it; a misspelt name passed preflight, and an ``--apply`` run upgraded the whole fleet before the Kubernetes step
waited five minutes for a Node that does not exist (operator walkthrough, stop 52).

Why the address: every Talos call goes to the address. Given the control plane's address for a GPU worker, the
run said "no NVIDIA GPU among the node's 2 PCI devices … remove gpu-worker-2 from nodes: it is not a GPU node",
while the worker was a GPU node at another address (operator walkthrough, stop 53); given another worker's, it
would upgrade that machine under this node's name. Only an address that another Node lists in its
``status.addresses`` (kubelet's InternalIP, ExternalIP, Hostname) fails the node: a node reached by an address
Kubernetes does not list (a DNS name, a management network) is not in question.

One paged list of the Nodes (``Kube.iter_nodes``, a few requests at 1,000 nodes), read whatever the steps are.
"""

from __future__ import annotations

import difflib
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any

from runbook_lib.errors import RunbookError
from runbook_lib.model.params import Node

from . import permissions
from .context import Context
from .results import Check

#: (connect, read) seconds for the list: a read at 1,000 nodes may take as long as the cordon check's.
LIST_TIMEOUT = (5.0, 60.0)
CHECK = "Kubernetes node"
#: The address types ``kubectl get node -o wide`` shows (k8s.io/api@v0.35.0 core/v1 types.go NodeAddressType).
IP_TYPES = ("InternalIP", "ExternalIP")


@dataclass(frozen=True)
class KubeNodes:
    """The Kubernetes Nodes as preflight needs them."""

    names: frozenset[str]
    owners: dict[str, frozenset[str]]
    """Address (each of a Node's ``status.addresses``) -> the Nodes that list it (a stale Node may still list an
    address DHCP gave to a new machine, and NAT'd Nodes may share an ExternalIP: review, stop 53)."""
    ips: dict[str, tuple[str, ...]]
    """The Node's name -> its InternalIP and ExternalIP addresses, as ``kubectl get node -o wide`` shows them."""
    by_name: bool
    """Whether the run's steps find nodes by name, so a node whose name no Node has fails."""

    @classmethod
    def of(cls, listed: Iterable[dict[str, Any]], *, by_name: bool) -> KubeNodes:
        names: set[str] = set()
        owners: dict[str, set[str]] = {}
        ips: dict[str, tuple[str, ...]] = {}
        for obj in listed:
            name = str((obj.get("metadata") or {}).get("name") or "")
            names.add(name)
            entries = [e for e in (obj.get("status") or {}).get("addresses") or [] if isinstance(e, dict)]
            for entry in entries:
                if entry.get("address"):
                    owners.setdefault(str(entry["address"]), set()).add(name)
            ips[name] = tuple(
                str(e["address"]) for e in entries if e.get("type") in IP_TYPES and e.get("address")
            )
        shared = {address: frozenset(owned) for address, owned in owners.items()}
        return cls(frozenset(names), shared, ips, by_name)


def read(ctx: Context, steps: Collection[str] | None) -> tuple[KubeNodes | None, str]:
    """The Nodes, or (None, why they could not be read: a note, as a refused list turned the name check off
    silently, review of 5466089)."""
    by_name = permissions.runs_step(steps, "kubernetes") or permissions.runs_step(steps, "cuda-test")
    try:
        return KubeNodes.of(ctx.kube.iter_nodes(timeout_s=LIST_TIMEOUT), by_name=by_name), ""
    except RunbookError as exc:
        what = "names and addresses" if by_name else "addresses"
        return None, f"the nodes' {what} were not checked against the Kubernetes Nodes: {exc.message}"


def checks(node: Node, nodes: KubeNodes) -> list[Check]:
    """The failed check of ``node`` against the Nodes, if any: a name no Node has when the steps find nodes by
    name (the Node its address belongs to is the likely meaning), else an address another Node lists. A name
    no Node has is not checked further for a run that does not use names: its Talos calls go to the machine the
    address names."""
    owned = nodes.owners.get(node.address, frozenset())
    if node.name not in nodes.names:
        owner = min(owned) if len(owned) == 1 else None
        return [_no_such_node(node, nodes.names, owner)] if nodes.by_name else []
    others = elsewhere(node, nodes)
    return [_another_nodes_address(node, others, nodes)] if others else []


def elsewhere(node: Node, nodes: KubeNodes) -> list[str]:
    """The other Nodes that list ``node``'s address, when its own Node does not: its Talos calls would go to
    another machine (then its PCI bus says nothing of this node). Empty for a node whose Node lists it too."""
    owned = nodes.owners.get(node.address, frozenset())
    return [] if node.name in owned else sorted(owned)


def _another_nodes_address(node: Node, owners: list[str], nodes: KubeNodes) -> Check:
    own = nodes.ips.get(node.name) or ()
    where = f"; Node {node.name} is at {', '.join(own)}" if own else ""
    owner = " and ".join(owners)
    whose = f"Kubernetes Node {owner}'s" if len(owners) == 1 else f"listed by Kubernetes Nodes {owner}"
    return Check(
        CHECK,
        False,
        f"address {node.address} is {whose}, not {node.name}'s{where}",
        cause="every talosctl call of the runbook goes to the node's `address`: it would read and change "
        f"{owner} under the name {node.name}",
        fix=f"give {node.name} its own address in `nodes:` (`kubectl get node {node.name} -o wide` shows it)",
    )


def _no_such_node(node: Node, names: frozenset[str], owner: str | None) -> Check:
    """A node whose ``name`` is no Kubernetes Node's, with the Node its address is (else the closest name)."""
    close = [owner] if owner is not None else difflib.get_close_matches(node.name, sorted(names), n=1)
    guess = f" (did you mean {', '.join(close)}?)" if close else ""
    return Check(
        CHECK,
        False,
        f"the cluster has no Kubernetes Node named {node.name!r}{guess}",
        cause="the Kubernetes step and the CUDA test find each node's Node by the node's name in `nodes:`",
        fix="give the node its Kubernetes Node's name in `nodes:` (`kubectl get nodes` lists them), or take it "
        "out of `nodes:` if it has not joined the cluster",
    )
