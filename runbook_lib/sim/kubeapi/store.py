"""The in-memory object store behind the simulated API: metadata, resourceVersions, watch history, pod logs.

One lock guards everything: requests are small and the controllers batch their writes, so a single lock is
both simpler and fast enough for 1,000 nodes.  Writes never mutate a stored dict in place (they store a new
one), so readers may serialise what they got after releasing the lock.
"""

from __future__ import annotations

import builtins
import copy
import json
import os
import threading
import uuid
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from . import admission
from .errors import ApiError, already_exists, conflict, gone, namespace_not_found, not_found
from .patch import apply_patch
from .resources import BY_KEY, Resource
from .selectors import parse_field_selector, parse_label_selector

WATCH_HISTORY = 50_000
DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class WatchEntry:
    rv: int
    type: str
    res: str
    namespace: str
    obj: dict[str, Any]


@dataclass
class PodLog:
    lines: list[str] = field(default_factory=list)
    done: bool = False


def _owner_uids(obj: dict[str, Any]) -> list[str]:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return [str(r["uid"]) for r in refs if isinstance(r, dict) and r.get("uid")]


class Store:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.cond = threading.Condition(self.lock)
        self.rv = 1
        self.objects: dict[str, dict[tuple[str, str], dict[str, Any]]] = {k: {} for k in BY_KEY}
        self.history: deque[WatchEntry] = deque(maxlen=WATCH_HISTORY)
        self.logs: dict[tuple[str, str, str], PodLog] = {}
        self.dependents: dict[str, dict[tuple[str, str, str], None]] = {}
        """Owner uid -> (resource key, namespace, name) of each object whose ownerReferences name it, in the order
        they were stored: the garbage collector's ownership graph (kubernetes@v1.35.0:pkg/controller/
        garbagecollector/graph_builder.go), so a delete need not scan every object for dependents."""
        self.changes = 0
        """Bumped on every write; controllers compare it to skip work when nothing changed."""
        for ns in DEFAULT_NAMESPACES:
            self.create(BY_KEY["v1/namespaces"], "", {"metadata": {"name": ns}})

    # --- helpers ---------------------------------------------------------------------------------------

    def _next_rv(self) -> str:
        self.rv += 1
        return str(self.rv)

    def _emit(self, typ: str, res: Resource, ns: str, obj: dict[str, Any]) -> None:
        self.history.append(WatchEntry(self.rv, typ, res.key, ns, obj))
        self.changes += 1
        self.cond.notify_all()

    def _put(self, key: str, ns: str, name: str, obj: dict[str, Any]) -> None:
        """Store ``obj`` (caller holds the lock) and index it under each owner it names."""
        self._unindex(key, ns, name)
        self.objects[key][(ns, name)] = obj
        for uid in _owner_uids(obj):
            self.dependents.setdefault(uid, {})[(key, ns, name)] = None

    def _unindex(self, key: str, ns: str, name: str) -> None:
        for uid in _owner_uids(self.objects[key].get((ns, name)) or {}):
            self.dependents.get(uid, {}).pop((key, ns, name), None)

    def _check_ns(self, res: Resource, ns: str) -> None:
        if res.namespaced and (ns, ns) not in {("", "")} and ("", ns) not in self.objects["v1/namespaces"]:
            raise namespace_not_found(ns)

    def oldest_rv(self) -> int:
        return self.history[0].rv if self.history else self.rv

    # --- reads -----------------------------------------------------------------------------------------

    def get(self, res: Resource, ns: str, name: str) -> dict[str, Any]:
        with self.lock:
            obj = self.objects[res.key].get((ns if res.namespaced else "", name))
            if obj is None:
                raise not_found(res, name)
            return copy.deepcopy(obj)

    def peek(self, res: Resource, ns: str, name: str) -> dict[str, Any] | None:
        """The stored object itself (do not mutate): for hot read paths."""
        return self.objects[res.key].get((ns if res.namespaced else "", name))

    def list(
        self,
        res: Resource,
        ns: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> tuple[list[dict[str, Any]], str]:
        lsel = parse_label_selector(label_selector)
        fsel = parse_field_selector(field_selector)
        with self.lock:
            items = [
                o
                for (ons, _), o in self.objects[res.key].items()
                if (not ns or ons == ns)
                and lsel((o.get("metadata") or {}).get("labels") or {})
                and (not field_selector or fsel(o))
            ]
            return items, str(self.rv)

    # --- writes ----------------------------------------------------------------------------------------

    def create(self, res: Resource, ns: str, obj: dict[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {}) or {}
        obj["metadata"] = meta
        with self.lock:
            if res.namespaced:
                self._check_ns(res, ns)
                if meta.get("namespace") and meta["namespace"] != ns:
                    raise ApiError(
                        400,
                        "BadRequest",
                        "the namespace of the provided object does not match the namespace sent on the request",
                    )
                meta["namespace"] = ns
            else:
                meta.pop("namespace", None)
                ns = ""
            if res.plural == "pods":
                # Admission sees the object before the registry generates its name, so rejections of
                # controller-made pods name the generateName prefix, as on a real cluster.
                shown = dict(
                    obj, metadata={**meta, "name": meta.get("name") or meta.get("generateName") or ""}
                )
                admission.default(res, shown)
                admission.admit_pod(
                    res,
                    shown,
                    self.objects["v1/namespaces"].get(("", ns)),
                    ns,
                    lambda n: self.objects["node.k8s.io/v1/runtimeclasses"].get(("", n)),
                )
            if not meta.get("name") and meta.get("generateName"):
                for _ in range(20):
                    cand = meta["generateName"] + admission.random_suffix()
                    if (ns, cand) not in self.objects[res.key]:
                        meta["name"] = cand
                        break
            name = str(meta.get("name") or "")
            if name and (ns, name) in self.objects[res.key]:
                raise already_exists(res, name)
            if (
                ns
                and (("", ns) in self.objects["v1/namespaces"])
                and self.objects["v1/namespaces"][("", ns)].get("metadata", {}).get("deletionTimestamp")
            ):
                raise ApiError(
                    403,
                    "Forbidden",
                    f'{res.qualified} "{name}" is forbidden: unable to create new content in namespace {ns} '
                    "because it is being terminated",
                )
            obj["apiVersion"], obj["kind"] = res.api_version, res.kind
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = now()
            meta.pop("resourceVersion", None)
            meta.pop("deletionTimestamp", None)
            if res.plural not in (
                "pods",
                "events",
                "namespaces",
                "nodes",
                "configmaps",
                "secrets",
                "serviceaccounts",
            ):
                meta["generation"] = 1
            admission.default(res, obj)
            if res.plural == "pods":
                admission.apply_runtime_class(
                    obj, lambda n: self.objects["node.k8s.io/v1/runtimeclasses"].get(("", n))
                )
            obj = admission.validate(res, obj)
            if dry_run:
                return obj
            obj["metadata"]["resourceVersion"] = self._next_rv()
            self._put(res.key, ns, name, obj)
            self._emit("ADDED", res, ns, obj)
            return copy.deepcopy(obj)

    def _write(  # noqa: PLR0917
        self,
        res: Resource,
        ns: str,
        name: str,
        new: dict[str, Any],
        old: dict[str, Any],
        subresource: str | None,
        *,
        dry_run: bool = False,
    ) -> dict[str, Any]:
        meta = new.setdefault("metadata", {})
        rv = meta.get("resourceVersion")
        if rv and str(rv) != old["metadata"]["resourceVersion"]:
            raise conflict(res, name)
        if meta.get("name", name) != name:
            raise ApiError(400, "BadRequest", "the name of the object does not match the name on the URL")
        # Immutable metadata is kept from the stored object.
        for key in ("uid", "creationTimestamp", "namespace", "generation", "deletionTimestamp"):
            if key in old["metadata"]:
                meta[key] = old["metadata"][key]
            else:
                meta.pop(key, None)
        meta["name"] = name
        new["apiVersion"], new["kind"] = res.api_version, res.kind
        if subresource == "status":
            # The status subresource changes only status; the main resource ignores status changes.
            merged = copy.deepcopy(old)
            merged["status"] = new.get("status")
            new = merged
        elif res.subresources and "status" in res.subresources and res.plural != "nodes":
            new["status"] = copy.deepcopy(old.get("status"))
        admission.check_immutable(res, old, new)
        admission.default(res, new)
        new = admission.validate(res, new)
        if subresource != "status" and "generation" in old["metadata"] and new.get("spec") != old.get("spec"):
            new["metadata"]["generation"] = old["metadata"]["generation"] + 1
        strip = {k: v for k, v in new.items()}
        strip_old = {k: v for k, v in old.items()}
        strip["metadata"] = {k: v for k, v in new["metadata"].items() if k != "resourceVersion"}
        strip_old["metadata"] = {k: v for k, v in old["metadata"].items() if k != "resourceVersion"}
        if strip == strip_old:
            return copy.deepcopy(old)  # no-op writes do not bump resourceVersion
        if dry_run:
            return copy.deepcopy(new)  # admitted and validated, never stored (dryRun=All)
        new["metadata"]["resourceVersion"] = self._next_rv()
        self._put(res.key, ns, name, new)
        self._emit("MODIFIED", res, ns, new)
        return copy.deepcopy(new)

    def _existing(self, res: Resource, ns: str, name: str) -> dict[str, Any]:
        """The stored object (caller holds the lock), or the apiserver's 404."""
        old = self.objects[res.key].get((ns, name))
        if old is None:
            raise not_found(res, name)
        return old

    def replace(
        self,
        res: Resource,
        ns: str,
        name: str,
        obj: dict[str, Any],
        subresource: str | None = None,
        *,
        dry_run: bool = False,
    ) -> dict[str, Any]:
        ns = ns if res.namespaced else ""
        with self.lock:
            old = self._existing(res, ns, name)
            return self._write(res, ns, name, copy.deepcopy(obj), old, subresource, dry_run=dry_run)

    def patch(  # noqa: PLR0917
        self,
        res: Resource,
        ns: str,
        name: str,
        content_type: str,
        body: Any,
        subresource: str | None = None,
        *,
        dry_run: bool = False,
    ) -> dict[str, Any]:
        ns = ns if res.namespaced else ""
        with self.lock:
            old = self._existing(res, ns, name)
            new = apply_patch(copy.deepcopy(old), content_type, body)
            # A patch that carries no resourceVersion must not conflict.
            if not ((body if isinstance(body, dict) else {}).get("metadata") or {}).get("resourceVersion"):
                new.setdefault("metadata", {})["resourceVersion"] = old["metadata"]["resourceVersion"]
            return self._write(res, ns, name, new, old, subresource, dry_run=dry_run)

    def mutate(
        self, res: Resource, ns: str, name: str, fn: Any, subresource: str | None = None
    ) -> dict[str, Any]:
        """Read-modify-write under the lock, for controllers (no conflicts possible)."""
        ns = ns if res.namespaced else ""
        with self.lock:
            old = self._existing(res, ns, name)
            new = copy.deepcopy(old)
            fn(new)
            return self._write(res, ns, name, new, old, subresource)

    def delete(self, res: Resource, ns: str, name: str, *, dry_run: bool = False) -> dict[str, Any]:
        ns = ns if res.namespaced else ""
        with self.lock:
            if dry_run:
                # kube-apiserver answers a dry-run delete (404 included) but keeps the object: Store.Delete
                # passes dryrun.IsDryRun(options.DryRun) to DryRunnableStorage.Delete, which then only reads
                # the object and validates (kubernetes staging/src/k8s.io/apiserver/pkg/registry/generic/
                # registry/store.go and dryrun.go).
                return self.get(res, ns, name)
            self._unindex(res.key, ns, name)
            obj = self.objects[res.key].pop((ns, name), None)
            if obj is None:
                raise not_found(res, name)
            obj = copy.deepcopy(obj)
            obj["metadata"]["deletionTimestamp"] = now()
            obj["metadata"]["resourceVersion"] = self._next_rv()
            self._emit("DELETED", res, ns, obj)
            if res.plural == "pods":
                for key in [k for k in self.logs if k[0] == ns and k[1] == name]:
                    self.logs.pop(key, None)
            if res.plural == "namespaces":
                for other in BY_KEY.values():
                    if other.namespaced:
                        for ons, oname in [k for k in self.objects[other.key] if k[0] == name]:
                            self.delete(other, ons, oname)
            self._collect_garbage(obj["metadata"]["uid"])
            return obj

    def _collect_garbage(self, owner_uid: str) -> None:
        for key, ons, oname in list(self.dependents.pop(owner_uid, {})):
            if (ons, oname) in self.objects[key]:  # not already deleted as another owner's dependent
                self.delete(BY_KEY[key], ons, oname)

    # --- watch -----------------------------------------------------------------------------------------

    def events_since(self, rv: int) -> builtins.list[WatchEntry]:
        """Entries newer than ``rv``; raises 410 Gone when history no longer reaches back that far."""
        if self.history and rv < self.history[0].rv - 1 and rv < self.rv:
            raise gone(f"too old resource version: {rv} ({self.history[0].rv - 1})")
        out: builtins.list[WatchEntry] = []
        for e in reversed(self.history):
            if e.rv <= rv:
                break
            out.append(e)
        out.reverse()
        return out

    # --- persistence -----------------------------------------------------------------------------------

    def save(self, path: Path, stamp: str) -> None:
        """Snapshot objects (not logs or watch history) so a daemon restart keeps releases and RuntimeClasses."""
        with self.lock:
            doc = {
                "stamp": stamp,
                "rv": self.rv,
                "objects": {k: list(v.values()) for k, v in self.objects.items() if v},
            }
            data = json.dumps(doc)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # may hold Secrets
        with os.fdopen(fd, "w") as f:
            f.write(data)
        os.replace(tmp, path)

    def load(self, path: Path, stamp: str) -> bool:
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            return False
        if doc.get("stamp") != stamp or not stamp:
            return False
        with self.lock:
            for key, items in (doc.get("objects") or {}).items():
                if key not in self.objects:
                    continue
                for o in items:
                    meta = o.get("metadata") or {}
                    self._put(key, meta.get("namespace", ""), meta.get("name", ""), o)
            self.rv = max(self.rv, int(doc.get("rv") or 0))
            self.changes += 1
        return True

    # --- pod logs --------------------------------------------------------------------------------------

    def append_log(self, ns: str, pod: str, container: str, text: str, *, done: bool = False) -> None:
        with self.lock:
            log = self.logs.setdefault((ns, pod, container), PodLog())
            if text:
                log.lines.extend(text.splitlines(keepends=True))
            log.done = log.done or done
            self.cond.notify_all()

    def clear_log(self, ns: str, pod: str, container: str) -> None:
        with self.lock:
            self.logs.pop((ns, pod, container), None)

    def read_log(self, ns: str, pod: str, container: str) -> PodLog | None:
        return self.logs.get((ns, pod, container))
