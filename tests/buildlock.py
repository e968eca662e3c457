"""One build at a time per binary, across every pytest process on the machine (pytest-xdist workers, the
controller, other sessions): ``tools/build-*.sh`` check the cache, then build; two processes that both find it
empty would both build (``build-kube.sh``'s ``<component>.tmp`` is even the same file). Under the lock the
second waits, then finds the binary cached."""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager

from runbook_lib.sim import realtalos


@contextmanager
def build_lock(name: str) -> Iterator[None]:
    """An exclusive ``flock`` on ``<tools cache>/.<name>.lock``, released when the block ends (also when the
    process dies: the kernel drops it with the file descriptor)."""
    cache = realtalos.tools_cache()
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / f".{name}.lock").open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
