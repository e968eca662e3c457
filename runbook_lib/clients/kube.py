"""The library's Kubernetes client: the official client through a kubeconfig, nothing else.

Why a thin wrapper rather than raw ``kubernetes.client`` calls in steps: every write goes through here so
it is journalled (records list every API change), reads are lists with selectors (one call for 1,000
nodes, not 1,000 GETs), and "wait" means *watch* with a timeout rather than polling.  The same code runs
against the simulated API server and a real cluster.
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
import time
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import urllib3
from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

from runbook_lib.errors import AUTHORIZER_REFUSAL, FORBIDDEN_HINT, Forbidden, PermanentError, RetryableError

from .fanout import concurrently
from .proc import Journal

_Item = TypeVar("_Item")
_Out = TypeVar("_Out")

Obj = dict[str, Any]

#: Pods per DELETE collection call of :meth:`Kube.delete_pods` (its docstring says why a page).
DELETE_PAGE = 500
#: Seconds a watch may stay silent past the timeout it asked the server for before its connection counts as
#: dead, and the seconds to wait for a connection to open (client-go's dialer: 30 s, k8s.io/client-go@v0.35.0
#: transport/cache.go). :meth:`Kube._events` says why.
WATCH_READ_GRACE_S = 5.0
WATCH_CONNECT_S = 30.0
#: Seconds between two questions to a wait's ``give_up`` (:meth:`Kube.watch_until`): a choice, short beside the
#: minutes the waits allow, long enough that its reads cost little.
GIVE_UP_CHECK_S = 10.0
#: Seconds any other call may read nothing before its connection counts as dead: twice kube-apiserver's own
#: ``--request-timeout`` default (60 s, k8s.io/apiserver@v0.35.0 pkg/server/config.go:445), after which it
#: answers every request that is not a watch or a stream itself. :func:`_with_read_timeout` says why.
REQUEST_READ_S = 120.0


def _model(cls: Any, data: Obj) -> Any:
    """Build a client model from a manifest; the 37.x models validate it (a bad manifest fails here)."""
    obj = cls.from_dict(data)
    if obj is None:  # pragma: no cover - from_dict only returns None for None input
        raise PermanentError(f"empty {cls.__name__} manifest")
    return obj


def _api_error(exc: ApiException, what: str) -> PermanentError | RetryableError:
    reason = ""
    try:
        body = json.loads(exc.body or "{}")
        reason = body.get("message", "")
    except (ValueError, TypeError):
        reason = str(exc.body or "")
    message = f"{what}: HTTP {exc.status} {exc.reason}: {reason}".rstrip(": ")
    if exc.status in (429, 500, 502, 503, 504) or exc.status == 0:
        return RetryableError(message, status=exc.status or None)
    if exc.status == 403 and AUTHORIZER_REFUSAL.search(reason):
        return Forbidden(message, hint=FORBIDDEN_HINT)
    return PermanentError(message)


def _refuse_broken_header(api_client: client.ApiClient, path: str | None) -> None:
    """The bearer token without the whitespace around it, and a clear error, without the value, for one no
    HTTP request may carry.

    Why: a ``token: |`` block, a pasted token or a ``tokenFile`` written by ``echo`` keeps its line break, and
    every request then failed with http.client's ``ValueError: Invalid header value b'Bearer <token>\\n'``
    (CPython 3.11 Lib/http/client.py ``putheader``, ``_is_illegal_header_value``: a line break not followed by a
    space or tab), in the middle of a step, quoting the token (attack F2 met it in the version probe). kubectl
    trims a ``tokenFile``'s content (client-go transport/token_source.go ``cachingTokenSource``, TrimSpace), so
    the ends are trimmed here too; the official client writes the token again before every request
    (kube_config.py ``_set_config``, ``refresh_api_key_hook``), hence the wrapped hook. A break inside the token
    is refused."""
    configuration = api_client.configuration
    hook = configuration.refresh_api_key_hook

    def trimmed(conf: Any) -> None:
        if hook is not None:
            hook(conf)
        conf.api_key = {key: _trim_bearer(str(value)) for key, value in (conf.api_key or {}).items()}

    trimmed(configuration)
    configuration.refresh_api_key_hook = trimmed
    for value in (configuration.api_key or {}).values():
        if re.search(r"\n(?![ \t])|\r(?![ \t\n])", str(value)):
            raise PermanentError(
                f"kubeconfig {path or '(default)'}: the user's token (token or tokenFile) contains a line break, "
                "which no HTTP request may carry",
                hint="write the token on one line (a quoted string, not a `token: |` block), or let "
                "`talosctl kubeconfig` write the file",
            )


def _trim_bearer(value: str) -> str:
    scheme, _, token = value.partition(" ")
    return f"{scheme} {token.strip()}" if scheme == "Bearer" else value.strip()


def _with_read_timeout(api_client: client.ApiClient) -> None:
    """Give every request of ``api_client`` that names no timeout of its own a connect and a read timeout.

    Why: the official client reads for ever unless a call passes ``_request_timeout`` (kubernetes 37.0.2
    client/rest.py:235-246), so a pooled connection a load balancer forgot (no FIN, no RST) blocked whatever
    call was sent on it until the kernel gave up, ~15 minutes of retransmissions.  kubectl does not wait like
    that: client-go pings a connection idle for 30 s (k8s.io/apimachinery@v0.35.0 pkg/util/net/http.go:171-189).
    The read timeout is far above anything the API server takes on such a call (it ends them itself after its
    request timeout); a call timed out raises the urllib3 error ``Kube._call`` turns into a retryable
    "did not answer".  Read at call time, so a test can shorten it.
    """
    rest = api_client.rest_client
    send: Callable[..., Any] = rest.request

    def request(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("_request_timeout") is None:
            kwargs["_request_timeout"] = (WATCH_CONNECT_S, REQUEST_READ_S)
        return send(*args, **kwargs)

    rest.request = request  # type: ignore[method-assign]  # the one request method every call goes through


class Kube:
    """Kubernetes operations the runbook needs, journalled, with dry-run support on writes.

    The API groups are built on first use: the 37.x client validates every API method with pydantic when
    its module is imported, which costs ~0.5 s for ``CoreV1Api`` and ~0.4 s for ``AppsV1Api`` (measured
    for issue 8).  A version check or a RuntimeClass read then pays only for the groups it calls.
    """

    def __init__(self, api_client: client.ApiClient, journal: Journal | None = None) -> None:
        self.api = api_client
        self.journal = journal if journal is not None else Journal()
        if api_client is not None:
            _with_read_timeout(api_client)

    @functools.cached_property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    @functools.cached_property
    def apps(self) -> client.AppsV1Api:
        return client.AppsV1Api(self.api)

    @functools.cached_property
    def node_api(self) -> client.NodeV1Api:
        return client.NodeV1Api(self.api)

    @functools.cached_property
    def version_api(self) -> client.VersionApi:
        return client.VersionApi(self.api)

    @functools.cached_property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api)

    @classmethod
    def from_kubeconfig(cls, path: str | None, journal: Journal | None = None) -> Kube:
        """Load a kubeconfig (its path only is ever recorded; never its contents)."""
        try:
            api_client = config.new_client_from_config(config_file=path)  # type: ignore[no-untyped-call]
        except (config.ConfigException, FileNotFoundError, OSError) as exc:
            raise PermanentError(
                f"cannot load kubeconfig {path or '(default)'}: {exc}",
                hint="set the `kubeconfig` parameter to the path of a valid kubeconfig",
            ) from None
        _refuse_broken_header(api_client, path)
        return cls(api_client, journal)

    @property
    def parallel_calls(self) -> int:
        """How many API calls :meth:`each` keeps in flight: the client's connection pool size.

        The official client's ``ApiClient`` is shared by threads through one urllib3 ``PoolManager`` whose
        pools keep ``configuration.connection_pool_maxsize`` connections (kubernetes 37.0.2
        client/configuration.py: ``cpu_count() * 5`` when unset; client/rest.py passes it as urllib3's
        ``maxsize``).  More threads than that would not be faster: urllib3 (``block=False``) opens a fresh
        connection for each extra request and discards it afterwards ("Connection pool is full"), a new
        TCP and TLS handshake per call.
        """
        return max(1, int(self.api.configuration.connection_pool_maxsize or 1))

    def each(self, fn: Callable[[_Item], _Out], items: Sequence[_Item]) -> list[_Out]:
        """``fn`` over ``items`` with at most :attr:`parallel_calls` in flight, results in item order.

        Why: a step's per-node calls one at a time cost ``nodes × calls × round trip`` (issue 16: 329 s of
        cuda-test at 1,000 nodes).  Errors and Ctrl-C as :func:`~runbook_lib.clients.fanout.concurrently`: calls
        in flight are waited for, so a caller's ``finally`` sees every call that may have reached the API
        (unless a further Ctrl-C comes while they are waited for: see there).
        """
        return concurrently(fn, items, self.parallel_calls)

    def to_dict(self, obj: Any) -> Obj:
        data: Obj = self.api.sanitize_for_serialization(obj)  # type: ignore[no-untyped-call]
        return data

    def _call(self, what: str, fn: Callable[[], Any], *, changes: bool = False) -> Any:
        """``fn`` with the client's errors turned into ours; ``changes``: a write, marked in flight in the
        journal's sink while it runs (an interrupted step's record then says it may have reached the API)."""
        in_flight = self.journal.pending("api", what) if changes else contextlib.nullcontext()
        try:
            with in_flight:
                return fn()
        except ApiException as exc:
            raise _api_error(exc, what) from None
        except urllib3.exceptions.HTTPError as exc:
            # Connection refused / timeouts surface as urllib3 errors, not ApiException, in client 37.
            raise RetryableError(
                f"{what}: the Kubernetes API did not answer: {exc}",
                hint="check the kubeconfig parameter and that the API server is reachable from here",
            ) from None

    def _read_or_none(self, what: str, fn: Callable[[], Any]) -> Obj | None:
        """A GET whose 404 means "not there yet" rather than an error."""

        def guarded() -> Any:
            try:
                return fn()
            except ApiException as exc:
                if exc.status == 404:
                    return None
                raise

        obj = self._call(what, guarded)
        return None if obj is None else self.to_dict(obj)

    # -- reads -------------------------------------------------------------------------------------------
    def server_version(self) -> str:
        info = self._call("get version", self.version_api.get_code)
        return str(info.git_version)

    def nodes(
        self, label_selector: str | None = None, *, timeout_s: tuple[float, float] | None = None
    ) -> list[Obj]:
        """``timeout_s``: (connect, read) seconds, for a caller that must not wait on an API that does not
        answer (the official client waits forever by default)."""
        result = self._call(
            "list nodes",
            lambda: self.core.list_node(label_selector=label_selector, _request_timeout=timeout_s),
        )
        return [self.to_dict(n) for n in result.items]

    def node(self, name: str) -> Obj | None:
        return self._read_or_none(f"read node {name}", lambda: self.core.read_node(name))

    def iter_nodes(self, *, page: int = 200, timeout_s: tuple[float, float] | None = None) -> Iterator[Obj]:
        """Every Node as the API's JSON, ``page`` at a time (``limit``/``continue``), through the API client
        alone.  Why not ``nodes()``: the generated ``CoreV1Api`` module costs a kernel ~22 MB just to import
        and its models ~15 MB more at 1,000 nodes (measured), for fields a read-only caller never reads;
        GET ``/api/v1/nodes`` is the request ``list_node`` builds (kubernetes 37.0.2
        ``CoreV1Api._list_node_serialize``: Accept JSON, BearerToken auth).  ``timeout_s`` as in :meth:`nodes`.
        """
        token: str | None = None
        while True:
            query: list[tuple[str, Any]] = [("limit", page)] + ([("continue", token)] if token else [])
            data = self._call(
                "list nodes", functools.partial(self._get_json, "/api/v1/nodes", query, timeout_s)
            )
            yield from data.get("items") or []
            token = (data.get("metadata") or {}).get("continue") or None
            if not token:
                return

    def _get_json(
        self, path: str, query: list[tuple[str, Any]], timeout_s: tuple[float, float] | None
    ) -> Obj:
        request = self.api.param_serialize(
            "GET",
            path,
            query_params=query,
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        response = self.api.call_api(*request, _request_timeout=timeout_s)
        response.read()  # type: ignore[no-untyped-call]
        if not 200 <= response.status <= 299:
            raise ApiException.from_response(http_resp=response, body=None, data=None)
        data: Obj = json.loads(response.data or b"{}")
        return data

    def kinds(self, api_version: str) -> dict[str, tuple[str, bool]]:
        """Kind -> (resource, namespaced) of one API group version, from the API server's discovery document
        (what kubectl's and helm's REST mapper read); {} for a group version the server does not serve (a CRD
        not installed). Discovery is readable by every authenticated user (``system:discovery``)."""
        path = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"

        def read() -> Obj:
            try:
                return self._get_json(path, [], None)
            except ApiException as exc:
                if exc.status == 404:
                    return {}
                raise

        found = self._call(f"discover {api_version}", read)
        return {
            str(r["kind"]): (str(r["name"]), bool(r.get("namespaced")))
            for r in found.get("resources") or []
            if "/" not in str(r.get("name", ""))
        }

    def allowed(
        self, verb: str, resource: str, *, group: str = "", subresource: str = "", namespace: str = ""
    ) -> tuple[bool, str]:
        """Whether the kubeconfig's user may ``verb`` the resource (``namespace`` "": in every namespace), and the
        authorizer's reason: the question ``kubectl auth can-i`` asks, a SelfSubjectAccessReview, which every
        authenticated user may create (RBAC's ``system:basic-user``, kubernetes@v1.35.0
        plugin/pkg/auth/authorizer/rbac/bootstrappolicy/policy.go) and which changes nothing."""
        review = _model(
            client.V1SelfSubjectAccessReview,
            {
                "spec": {
                    "resourceAttributes": {
                        "verb": verb,
                        "group": group,
                        "resource": resource,
                        "subresource": subresource,
                        "namespace": namespace,
                    }
                }
            },
        )
        api = client.AuthorizationV1Api(self.api)
        answer = self._call(f"can-i {verb} {resource}", lambda: api.create_self_subject_access_review(review))
        status = answer.status
        return bool(status.allowed), str(status.reason or status.evaluation_error or "")

    def namespace(self, name: str) -> Obj | None:
        return self._read_or_none(f"read namespace {name}", lambda: self.core.read_namespace(name))

    def runtime_class(self, name: str) -> Obj | None:
        return self._read_or_none(f"read runtimeclass {name}", lambda: self.node_api.read_runtime_class(name))

    def cluster_objects(self, group: str, version: str, plural: str) -> list[Obj] | None:
        """Cluster-scoped custom objects (e.g. the GPU Operator's ClusterPolicies); None when the API server
        does not serve them (their CRD is not installed), which a diagnosis reports differently from none."""
        listed = self._read_or_none(
            f"list {plural}.{group}", lambda: self.custom.list_cluster_custom_object(group, version, plural)
        )
        return None if listed is None else list(listed.get("items") or [])

    def lease(self, namespace: str, name: str) -> Obj | None:
        """A coordination.k8s.io Lease (a controller's leader election), None when there is none."""
        leases = client.CoordinationV1Api(self.api)
        return self._read_or_none(
            f"read lease {namespace}/{name}", lambda: leases.read_namespaced_lease(name, namespace)
        )

    def daemonsets(self, namespace: str, label_selector: str | None = None) -> list[Obj]:
        result = self._call(
            "list daemonsets",
            lambda: self.apps.list_namespaced_daemon_set(namespace, label_selector=label_selector),
        )
        return [self.to_dict(d) for d in result.items]

    def daemonset(self, namespace: str, name: str) -> Obj | None:
        return self._read_or_none(
            f"read daemonset {namespace}/{name}",
            lambda: self.apps.read_namespaced_daemon_set(name, namespace),
        )

    def controller_revisions(self, namespace: str, label_selector: str | None = None) -> list[Obj]:
        """apps/v1 ControllerRevisions: a DaemonSet's template history, the newest its current revision."""
        result = self._call(
            "list controllerrevisions",
            lambda: self.apps.list_namespaced_controller_revision(namespace, label_selector=label_selector),
        )
        return [self.to_dict(r) for r in result.items]

    def pod(self, namespace: str, name: str) -> Obj | None:
        return self._read_or_none(
            f"read pod {namespace}/{name}", lambda: self.core.read_namespaced_pod(name, namespace)
        )

    def pods(self, namespace: str, label_selector: str | None = None) -> list[Obj]:
        result = self._call(
            "list pods", lambda: self.core.list_namespaced_pod(namespace, label_selector=label_selector)
        )
        return [self.to_dict(p) for p in result.items]

    def pod_log(self, namespace: str, name: str) -> str:
        return str(
            self._call(
                f"log of {namespace}/{name}", lambda: self.core.read_namespaced_pod_log(name, namespace)
            )
        )

    def events_for(self, namespace: str, kind: str, name: str) -> list[Obj]:
        selector = f"involvedObject.kind={kind},involvedObject.name={name}"
        result = self._call(
            "list events", lambda: self.core.list_namespaced_event(namespace, field_selector=selector)
        )
        return [self.to_dict(e) for e in result.items]

    # -- writes (journalled; ``dry_run`` uses the API server's dry run) ---------------------------------
    def _dry(self, dry_run: bool) -> str | None:
        return "All" if dry_run else None

    def create_runtime_class(self, name: str, handler: str, *, dry_run: bool) -> Obj:
        body = _model(
            client.V1RuntimeClass,
            {
                "apiVersion": "node.k8s.io/v1",
                "kind": "RuntimeClass",
                "metadata": {"name": name},
                "handler": handler,
            },
        )
        created = self._call(
            f"create runtimeclass {name}",
            lambda: self.node_api.create_runtime_class(body, dry_run=self._dry(dry_run)),
            changes=not dry_run,
        )
        self.journal.record_api(
            f"create RuntimeClass {name} (handler {handler})" + (" [dry-run]" if dry_run else ""),
            diff=json.dumps({"kind": "RuntimeClass", "metadata": {"name": name}, "handler": handler}),
            changes_cluster=not dry_run,
        )
        return self.to_dict(created)

    def delete_runtime_class(self, name: str, *, dry_run: bool) -> None:
        self._call(
            f"delete runtimeclass {name}",
            lambda: self.node_api.delete_runtime_class(name, dry_run=self._dry(dry_run)),
            changes=not dry_run,
        )
        self.journal.record_api(
            f"delete RuntimeClass {name}" + (" [dry-run]" if dry_run else ""), changes_cluster=not dry_run
        )

    def ensure_namespace(self, name: str, labels: Mapping[str, str], *, dry_run: bool) -> str:
        """Create the namespace or add missing labels; returns what was done (``created``/``labelled``/``ok``)."""
        current = self.namespace(name)
        if current is None:
            body = _model(client.V1Namespace, {"metadata": {"name": name, "labels": dict(labels)}})
            self._call(
                f"create namespace {name}",
                lambda: self.core.create_namespace(body, dry_run=self._dry(dry_run)),
                changes=not dry_run,
            )
            self.journal.record_api(
                f"create Namespace {name} labels {dict(labels)}" + (" [dry-run]" if dry_run else ""),
                changes_cluster=not dry_run,
            )
            return "created"
        have = (current.get("metadata") or {}).get("labels") or {}
        missing = {k: v for k, v in labels.items() if have.get(k) != v}
        if not missing:
            return "ok"
        patch = {"metadata": {"labels": missing}}
        self._call(
            f"label namespace {name}",
            lambda: self.core.patch_namespace(name, patch, dry_run=self._dry(dry_run)),
            changes=not dry_run,
        )
        self.journal.record_api(
            f"label Namespace {name} {missing}" + (" [dry-run]" if dry_run else ""),
            diff=json.dumps(patch),
            changes_cluster=not dry_run,
        )
        return "labelled"

    def label_node(self, name: str, labels: Mapping[str, str], *, dry_run: bool) -> None:
        patch = {"metadata": {"labels": dict(labels)}}
        self._call(
            f"label node {name}",
            lambda: self.core.patch_node(name, patch, dry_run=self._dry(dry_run)),
            changes=not dry_run,
        )
        self.journal.record_api(
            f"label Node {name} {dict(labels)}" + (" [dry-run]" if dry_run else ""),
            diff=json.dumps(patch),
            changes_cluster=not dry_run,
        )

    def annotate_node(self, name: str, annotations: Mapping[str, str | None]) -> None:
        """Set (or, with None, remove) annotations on Node ``name`` (a strategic merge patch)."""
        patch = {"metadata": {"annotations": dict(annotations)}}
        self._call(f"annotate node {name}", lambda: self.core.patch_node(name, patch), changes=True)
        self.journal.record_api(f"annotate Node {name} {dict(annotations)}", diff=json.dumps(patch))

    def create_pod(self, namespace: str, manifest: Obj) -> Obj:
        body = _model(client.V1Pod, manifest)
        created = self._call(
            f"create pod {namespace}/{manifest['metadata']['name']}",
            lambda: self.core.create_namespaced_pod(namespace, body),
        )
        # Test pods are transient: journalled, but not counted as cluster changes.
        self.journal.record_api(
            f"create Pod {namespace}/{manifest['metadata']['name']}", changes_cluster=False
        )
        return self.to_dict(created)

    def delete_pod(self, namespace: str, name: str) -> bool:
        """Delete with the pod's own grace period (as ``kubectl delete pod``), never a force delete.

        Why: ``grace_period_seconds=0`` removes the object at once (k8s.io/apiserver@v0.35.0
        pkg/registry/generic/registry/store.go:1106-1116) while a real node may still run its containers,
        and the scheduler then counts their GPU as free. A finished pod goes at once either way
        (pkg/registry/core/pod/strategy.go:183-186); a running one (timeout, Ctrl-C) shows Terminating until
        its kubelet stopped it.
        """
        try:
            self.core.delete_namespaced_pod(name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise _api_error(exc, f"delete pod {namespace}/{name}") from None
        self.journal.record_api(f"delete Pod {namespace}/{name}", changes_cluster=False)
        return True

    def delete_pods(self, namespace: str, label_selector: str) -> list[str]:
        """Delete every pod ``label_selector`` matches, :data:`DELETE_PAGE` per call; the names deleted, each
        journalled as :meth:`delete_pod` journals one.

        Why not a DELETE per pod: the API server then deletes the page itself, one request instead of hundreds,
        and the client does not build a request and read an answer per pod.  What it saves is the client's
        CPU more than wall time (measured 3 Dec 2026 on the 1,000-node simulated cluster, two rounds of 1,000
        finished pods each, both ways on the same cluster: per-pod DELETEs with 10 in flight 22.2 s and 14.9 s,
        the runbook's process 16 s and 12 s of CPU; collection calls 10.9 s and 14.6 s, 5.7 s and 7.5 s of
        CPU).  The API server deletes a collection's items with one worker (``--delete-collection-workers``
        defaults to 1), so on a machine whose cores the control plane already saturates the two ways end up
        close: the whole cuda-test at 1,000 nodes spent 67 s deleting per pod and 91 s by collection, one run
        each, with the simulated nodes (kwok) taking most of the CPU in that phase (benchmarks/README.md).
        Graceful as :meth:`delete_pod`: the collection's default DeleteOptions are applied to each pod in turn
        (k8s.io/apiserver@v0.35.0 pkg/registry/generic/registry/store.go:1277-1283, ``e.Delete`` with a copy
        of the options).  With a ``limit`` the server deletes one listed page and answers with that page and
        its continue token (store.go:1343-1346); without one it deletes every page of 10,000 in a single
        request, which a big fleet can run into the API server's 60 s request timeout.  A running pod stays
        listed (Terminating) after its delete: it is journalled once, and deleting it again changes nothing.
        RBAC grants ``deletecollection`` apart from ``delete``: a user allowed only the second gets the
        pods deleted one by one (:meth:`_delete_each`).
        """
        deleted: dict[str, None] = {}
        token: str | None = None
        while True:
            page = self._call(
                f"delete pods in {namespace} with {label_selector}",
                functools.partial(self._delete_page, namespace, label_selector, token),
            )
            if page is None:
                return self._delete_each(namespace, label_selector)
            for item in page.get("items") or []:
                name = str(item["metadata"]["name"])
                if name not in deleted:
                    deleted[name] = None
                    self.journal.record_api(f"delete Pod {namespace}/{name}", changes_cluster=False)
            token = (page.get("metadata") or {}).get("continue") or None
            if not token:
                return list(deleted)

    def _delete_page(self, namespace: str, label_selector: str, token: str | None) -> Obj | None:
        """One DELETE collection call, answered as the API's JSON (a PodList of the page it deleted); None
        when RBAC forbids the verb.  An expired continue token (410: the snapshot it points into was
        compacted) starts over from the first page: what is left is still listed."""
        try:
            response: Any = self.core.delete_collection_namespaced_pod(
                namespace,
                label_selector=label_selector,
                limit=DELETE_PAGE,
                _continue=token,
                _preload_content=False,
            )
        except ApiException as exc:
            if exc.status == 403:
                return None
            if exc.status != 410 or token is None:
                raise
            return self._delete_page(namespace, label_selector, None)
        data: Obj = json.loads(response.data or b"{}")
        return data

    def _delete_each(self, namespace: str, label_selector: str) -> list[str]:
        """The listed pods deleted one call each, concurrently; each one even when another fails, the first
        failure raised once every deletion was tried (a 404 is a pod already gone: not counted)."""
        errors: list[Exception] = []

        def delete(name: str) -> str | None:
            try:
                return name if self.delete_pod(namespace, name) else None
            except Exception as exc:  # re-raised below, once the other deletions were tried
                errors.append(exc)
                return None

        names = [p["metadata"]["name"] for p in self.pods(namespace, label_selector)]
        deleted = [n for n in self.each(delete, names) if n is not None]
        if errors:
            raise errors[0]
        return deleted

    # -- waiting by watching ------------------------------------------------------------------------------
    def watch_until(
        self,
        list_fn: Callable[..., Any],
        done: Callable[[Obj], bool],
        *,
        timeout: float,
        until: str = "done",
        give_up: Callable[[], str | None] | None = None,
        check_every_s: float = GIVE_UP_CHECK_S,
        **kwargs: Any,
    ) -> Obj | None:
        """Watch a list endpoint until ``done(object)`` or the timeout; returns the last object seen.

        Re-establishes the watch when the server closes it early (watches drop on real clusters too).  The
        wait goes to the journal with its duration and whether it ended in time (``until`` says what it
        waited for): a record then shows how long the cluster took, apart from the runbook's own time.
        ``give_up``, asked every ``check_every_s`` (the server ends each watch then; a stalled cluster sends no
        events to judge it by), ends the wait early with its reason when what is awaited can no longer come (a
        node that is down holds it).
        """
        started = time.monotonic()
        reached, why = False, "timed out or failed"
        try:
            last, reached, gave_up = self._watch(
                list_fn, done, started + timeout, give_up=give_up, check_every_s=check_every_s, **kwargs
            )
            why = gave_up or why
            return last
        finally:
            selector = kwargs.get("label_selector")
            where = f" {selector}" if selector else ""
            verdict = "" if reached else f" (not reached: {why})"
            self.journal.record_api(
                f"wait: {list_fn.__name__}{where} until {until}{verdict}",
                changes_cluster=False,
                duration_s=time.monotonic() - started,
            )

    def _watch(
        self,
        list_fn: Callable[..., Any],
        done: Callable[[Obj], bool],
        deadline: float,
        *,
        give_up: Callable[[], str | None] | None,
        check_every_s: float,
        **kwargs: Any,
    ) -> tuple[Obj | None, bool, str | None]:
        """The last object seen, whether ``done`` said so before the deadline, and ``give_up``'s reason if it
        ended the wait.

        Each watch after the first resumes from the last resource version seen (as client-go's reflector does),
        so the server does not send every object again each time a watch ends: with ``give_up`` that is every
        ``check_every_s``, and a Node watch at 1,000 nodes would re-read the whole fleet each time."""
        last: Obj | None = None
        cursor: dict[str, str] = {}
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return last, False, None
            if give_up is not None:
                remaining = min(remaining, check_every_s)
            try:
                events = self._events(list_fn, max(1, int(remaining)), cursor, **kwargs)
                with contextlib.closing(events):
                    for obj in events:
                        last = obj
                        if done(obj):
                            return obj, True, None
                        if time.monotonic() >= deadline:
                            return last, False, None
            except ApiException as exc:
                if exc.status != 410:
                    raise _api_error(exc, "watch") from None
                cursor.clear()  # resourceVersion too old: start over from the current state
            except (ConnectionError, OSError, urllib3.exceptions.HTTPError):
                # A watch cut by the server or a load balancer (ProtocolError, read timeout): re-establish.
                time.sleep(0.2)
            why = give_up() if give_up is not None else None
            if why:
                return last, False, why

    @staticmethod
    def _events(
        list_fn: Callable[..., Any], timeout: int, cursor: dict[str, str], **kwargs: Any
    ) -> Generator[Obj, None, None]:
        """The watched objects as the API's JSON, one per event line, until the server ends the watch; from
        ``cursor``'s resource version when it has one, which each event (bookmarks too) moves on.

        Why not ``kubernetes.watch.Watch``: it turns every event into the client's model objects (JSON parsed,
        dumped and parsed again), which the library turned back into a dict: 1.6 ms of CPU per Pod event
        against 0.02 ms for the JSON alone (measured 3 Dec 2026), 24 s of the runbook's CPU while cuda-test
        waited for 4,000 pods on 2 saturated cores.  Its ``deserialize=False`` keeps the JSON but then fails
        on an ERROR event (kubernetes 37.0.2 watch.py reads ``raw_object``, which only the model path sets).
        An ERROR event carries a Status (k8s.io/apimachinery@v0.35.0 pkg/watch/watch.go ``Error``; 410
        Expired for a resource version too old) and is raised as the ApiException the caller handles.

        Why a read timeout: the server ends the watch itself after ``timeout`` seconds, so a connection silent
        for longer is dead (a load balancer or a moved VIP forgot the flow, with no FIN or RST).  kubectl finds
        such a connection within ~45 s by HTTP/2 pings (k8s.io/apimachinery@v0.35.0 pkg/util/net/http.go:
        171-189); the Python client has no check and, with no ``_request_timeout``, read for ever (kubernetes
        37.0.2 client/rest.py:235-246): cuda-test then never got back to its deadline nor deleted its pods.
        The read times out as a urllib3 error, which :meth:`_watch` answers like any dropped watch.
        """
        resume = {"resource_version": cursor["rv"]} if cursor.get("rv") else {}
        response = list_fn(
            watch=True,
            timeout_seconds=timeout,
            allow_watch_bookmarks=True,
            _preload_content=False,
            _request_timeout=(WATCH_CONNECT_S, timeout + WATCH_READ_GRACE_S),
            **resume,
            **kwargs,
        )
        try:
            for line in watch.watch.iter_resp_lines(response):  # type: ignore[no-untyped-call]
                event = json.loads(line)
                if event.get("type") == "ERROR":
                    status = event.get("object") or {}
                    raise ApiException(
                        status=status.get("code"), reason=f"{status.get('reason')}: {status.get('message')}"
                    )
                version = ((event.get("object") or {}).get("metadata") or {}).get("resourceVersion")
                if version:
                    cursor["rv"] = str(version)
                if event.get("type") != "BOOKMARK":
                    yield event["object"]
        finally:
            response.close()
            response.release_conn()
