"""`paused()`: the cyclic garbage collector off for a block that builds many long-lived objects.

Python's collector runs a pass each time allocations outnumber deallocations by a threshold, and
each full pass walks every live object: building a large structure in one go (a fleet's hosts from
one answer, thousands of Airflow tasks from the config) sets off passes that only re-walk what is
being built and kept. Nothing is lost by pausing: cyclic garbage made meanwhile is collected at
the next pass after the block.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def paused() -> Iterator[None]:
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
