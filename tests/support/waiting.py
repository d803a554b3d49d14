"""Polling until something holds, for tests that drive real servers."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def until(what: str, probe: Callable[[], T], timeout: float = 180, every: float = 0.2) -> T:
    """`probe()` until it returns something true, which is returned; AssertionError naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = probe()
        if got:
            return got
        time.sleep(every)
    raise AssertionError(f"{what}: not within {timeout:.0f}s")
