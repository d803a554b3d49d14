"""Polling until something holds, for tests that drive real servers."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
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


def alive(pid: int) -> bool:
    """The process runs (it exists and is not a zombie)."""
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False
