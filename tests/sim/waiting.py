"""Waiting for the simulator's background controllers in tests: poll until a condition holds."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(fn: Callable[[], Any], timeout: float = 10.0) -> Any:
    """Return ``fn()``'s first truthy value; fail with the last value seen after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s (last value: {value!r})")
        time.sleep(0.05)
