"""``Kube.watch_until`` reads the watch stream as the API's JSON, without the client's models (issue 16: the
model round trip cost the runbook 24 s of CPU while cuda-test waited for 4,000 pods), and still handles the
stream's ERROR events: a 410 Expired re-establishes the watch, any other Status is raised naming it.

The event lines are shaped as kube-apiserver writes them: one JSON object per line, ``type`` and ``object``
(k8s.io/apimachinery@v0.35.0 pkg/watch/watch.go event types); an ERROR event's object is a metav1.Status, for
a resource version too old the one ``NewResourceExpired`` builds (pkg/api/errors/errors.go:274-281: Failure,
410, reason Expired).  The live stream is checked on the real control plane by tests/sim/test_real_control_plane.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from runbook_lib.clients.kube import Kube
from runbook_lib.clients.proc import Journal
from runbook_lib.errors import RetryableError


def pod(name: str, phase: str) -> dict[str, Any]:
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "namespace": "default",
            "resourceVersion": "42",
            "creationTimestamp": "2026-12-03T09:00:00Z",
        },
        "status": {"phase": phase},
    }


def expired(rv: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": f"too old resource version: {rv} (1234)",
        "reason": "Expired",
        "code": 410,
    }


class Stream:
    """urllib3's response as the client hands it over with ``_preload_content=False``: the lines in chunks."""

    def __init__(self, events: list[dict[str, Any]]) -> None:
        self.body = b"".join(json.dumps(e).encode() + b"\n" for e in events)
        self.closed = self.released = False

    def stream(self, amt: Any = None, decode_content: Any = None) -> Iterator[bytes]:
        for i in range(0, len(self.body), 7):  # a line split over chunks, as TCP delivers it
            yield self.body[i : i + 7]

    def close(self) -> None:
        self.closed = True

    def release_conn(self) -> None:
        self.released = True


class ListFn:
    def __init__(self, *streams: Stream) -> None:
        self.streams = list(streams)
        self.calls: list[dict[str, Any]] = []
        self.__name__ = "list_namespaced_pod"  # the journal names the wait by it

    def __call__(self, **kwargs: Any) -> Stream:
        self.calls.append(kwargs)
        return self.streams.pop(0)


def kube() -> Kube:
    return Kube(api_client=None, journal=Journal())  # type: ignore[arg-type]  # the watch only calls list_fn


def running(obj: dict[str, Any]) -> bool:
    return obj["status"]["phase"] == "Running"


def test_watch_gives_the_objects_as_the_api_wrote_them_and_closes_the_stream() -> None:
    first = Stream(
        [
            {"type": "ADDED", "object": pod("a", "Pending")},
            {"type": "MODIFIED", "object": pod("a", "Running")},
        ]
    )
    list_fn = ListFn(first)
    got = kube().watch_until(list_fn, running, timeout=5.5, namespace="default")
    assert got == pod("a", "Running")  # the timestamp as the API wrote it, no model round trip
    assert list_fn.calls == [
        {
            "watch": True,
            "timeout_seconds": 5,
            "allow_watch_bookmarks": True,
            "_preload_content": False,
            "_request_timeout": (30.0, 10.0),  # a silent connection is dead 5 s after the server's end
            "namespace": "default",
        }
    ]
    assert first.closed and first.released


def test_a_410_expired_event_re_establishes_the_watch() -> None:
    gone = Stream(
        [{"type": "ADDED", "object": pod("a", "Pending")}, {"type": "ERROR", "object": expired("7")}]
    )
    again = Stream([{"type": "ADDED", "object": pod("a", "Running")}])
    list_fn = ListFn(gone, again)
    assert kube().watch_until(list_fn, running, timeout=5) == pod("a", "Running")
    assert len(list_fn.calls) == 2 and gone.closed
    assert "resource_version" not in list_fn.calls[1], "an expired version was asked for again"


def test_a_watch_that_ends_resumes_from_the_last_version_seen_a_bookmarks_too() -> None:
    """As client-go's reflector: after a watch the server ended (each ``give_up`` interval, or a dropped
    connection) the next starts from the newest resource version, so the server sends only what changed since
    and not every object again (k8s.io/client-go@v0.35.0 tools/cache/reflector.go:500-534, ``watch``, passes
    its ``LastSyncResourceVersion``, and asks for bookmarks)."""
    bookmark = {"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": "57"}}
    first = Stream(
        [{"type": "ADDED", "object": pod("a", "Pending")}, {"type": "BOOKMARK", "object": bookmark}]
    )
    second = Stream([{"type": "MODIFIED", "object": pod("a", "Running")}])
    list_fn = ListFn(first, second)
    asked: list[int] = []

    def give_up() -> str | None:
        asked.append(1)
        return None

    got = kube().watch_until(list_fn, running, timeout=5, give_up=give_up, check_every_s=1)
    assert got == pod("a", "Running")
    assert "resource_version" not in list_fn.calls[0]
    assert list_fn.calls[1]["resource_version"] == "57" and list_fn.calls[1]["timeout_seconds"] == 1
    assert asked == [1], "give_up is asked once between the two watches"


def test_give_up_ends_the_wait_with_its_reason_in_the_journal() -> None:
    k = kube()
    list_fn = ListFn(Stream([{"type": "ADDED", "object": pod("a", "Pending")}]))
    got = k.watch_until(list_fn, running, timeout=30, until="a Running", give_up=lambda: "gpu-3 is down")
    assert got == pod("a", "Pending") and len(list_fn.calls) == 1
    (entry,) = k.journal.entries
    assert entry.summary.endswith("until a Running (not reached: gpu-3 is down)"), entry.summary


def test_another_error_event_is_raised_naming_its_status() -> None:
    status = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "etcdserver: request timed out",
        "reason": "InternalError",
        "code": 500,
    }
    broken = Stream([{"type": "ERROR", "object": status}])
    with pytest.raises(RetryableError) as raised:  # a 500 may pass: retryable, as every 5xx
        kube().watch_until(ListFn(broken), running, timeout=5)
    assert "watch: HTTP 500 InternalError: etcdserver: request timed out" in str(raised.value)
    assert broken.closed


def test_a_bookmark_is_not_an_object() -> None:
    bookmark = {
        "type": "BOOKMARK",
        "object": {"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": "9"}},
    }
    stream = Stream([bookmark, {"type": "ADDED", "object": pod("a", "Running")}])
    seen: list[dict[str, Any]] = []

    def done(obj: dict[str, Any]) -> bool:
        seen.append(obj)
        return running(obj)

    kube().watch_until(ListFn(stream), done, timeout=5)
    assert seen == [pod("a", "Running")]
