"""Many processes, one ledger on a real PostgreSQL: never more than `max_domains_down` domains out.

8 spawned processes share one fleet (8 domains of 4 hosts). Each loops like a train: ask for its
next domain until granted, hold it 20-50 ms, release it, pause, go on, until it has held 5. Every process logs, from its
own clock (CLOCK_MONOTONIC, one clock for the machine), the interval during which it held a domain:
from just after the grant returned (committed) to just before it called release. Those intervals lie
inside the real leases, so if the ledger is right no instant is covered by more than
`max_domains_down` of them. The audit, replayed in order, must say the same.

The real runs take the server-side functions (railyard.ledger.pg). The check is shown to bite: the
same run against a deliberately broken ledger (the Python path without its lock, and 30 ms between what
it reads and what it writes) must produce overlaps the check catches.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import random
import time
from collections.abc import Iterator
from multiprocessing import resource_tracker
from typing import Any

import pytest

from railyard.ledger import Budget, Ledger
from tests.support.postgres import PostgresServer, running_postgres

PROCS = 8
GRANTS = 5  # holdings per process and scenario
DEADLINE_S = 120  # a process without its holdings by then was starved (not a timing test: a slow machine passes)
DOMAINS = {f"d{i}": [f"d{i}h{j}" for j in range(4)] for i in range(8)}


def budget(max_down: int) -> Budget:
    return Budget(total_hosts=32, maintenance_hosts=4 * max_down, failure_hosts=0, max_domains_down=max_down)


# ---- the overlap math ------------------------------------------------------------------------------------
def max_overlap(intervals: list[tuple[float, float, str]]) -> tuple[int, float]:
    """(most intervals covering one instant, that instant). Touching ends do not overlap."""
    events = sorted([(t0, 1) for t0, _, _ in intervals] + [(t1, -1) for _, t1, _ in intervals])
    best, at, n = 0, 0.0, 0
    for t, step in events:  # at equal times -1 sorts first: an end frees before a start takes
        n += step
        if n > best:
            best, at = n, t
    return best, at


def audit_replay(led: Ledger) -> int:
    """Most domains out at once, replaying the audit in order (lease and release rows)."""
    ops = {o["id"]: o["domain"] for o in led.operations_like("p")}
    out: dict[str, str] = {}
    best = 0
    for r in led.audit_rows(limit=10**9):
        if r["action"] == "lease" and r["hosts"]:
            out[r["op_id"]] = ops[r["op_id"]]
        elif r["action"] == "release":
            out.pop(r["op_id"], None)
        best = max(best, len(set(out.values())))
    return best


def test_overlap_math():
    assert max_overlap([]) == (0, 0.0)
    assert max_overlap([(0, 1, "a"), (1, 2, "b"), (2, 3, "c")])[0] == 1  # back to back
    assert max_overlap([(0, 2, "a"), (1, 3, "b"), (2.5, 4, "c")]) == (2, 1)
    assert max_overlap([(0, 10, "a"), (1, 2, "b"), (3, 4, "c"), (3.5, 3.6, "d")]) == (3, 3.5)


# ---- the workers (spawned) -------------------------------------------------------------------------------
@contextlib.contextmanager
def broken_ledger(mod: Any) -> Iterator[None]:
    """The ledger without its lock (it reads without taking it), and with time between what it reads
    and what it writes. Patches the private step `acquire_domain` takes the lock and reads with."""
    locked_read = mod._lock_and_read_view

    def unlocked_slow_read(c: Any, ops: Any, op_id: str, priority: int, now: float, hosts: Any) -> Any:
        v = mod._read_view(c, op_id, priority, now, hosts)
        time.sleep(0.03)
        return v

    mod._lock_and_read_view = unlocked_slow_read
    try:
        yield
    finally:
        mod._lock_and_read_view = locked_read


def worker(idx: int, scenarios: list[dict[str, Any]], barrier: Any, out: Any) -> None:
    """Take domains one after the other until `grants` holdings are done (or the deadline passes)."""
    import railyard.ledger.leasing as mod
    from railyard.ledger import Ledger

    for sc in scenarios:
        led = Ledger(sc["url"], pg_functions=not sc["broken"])  # the broken one is the Python path's
        b = budget(sc["max_down"])
        rnd = random.Random(idx * 1000 + sc["max_down"])
        order = [f"d{(idx + i) % len(DOMAINS)}" for i in range(len(DOMAINS))]
        intervals: list[tuple[float, float, str]] = []
        waits = errors = k = 0
        barrier.wait(timeout=120)
        deadline = time.monotonic() + sc["deadline"]
        with broken_ledger(mod) if sc["broken"] else contextlib.nullcontext():
            while len(intervals) < sc["grants"] and time.monotonic() < deadline:
                dom = order[k % len(order)]
                op = f"p{idx}-{k}"
                try:
                    d = led.acquire_domain(op, train=f"t{idx}", domain=dom, hosts=DOMAINS[dom], budget=b)
                except Exception:  # only the broken ledger: two processes inserting one host
                    errors += 1
                    k += 1
                    continue
                if not d.granted:
                    assert d.outcome == "wait", d
                    waits += 1
                    time.sleep(rnd.uniform(0.002, 0.01))
                    continue
                t0 = time.monotonic()
                time.sleep(rnd.uniform(0.02, 0.05))  # drain, upgrade, check, return
                t1 = time.monotonic()
                assert led.release(op) == DOMAINS[dom]
                intervals.append((t0, t1, dom))
                k += 1
                time.sleep(rnd.uniform(0.002, 0.01))  # between two stops
        out.put({"name": sc["name"], "idx": idx, "intervals": intervals, "waits": waits, "errors": errors})
        led.dispose()


@pytest.fixture(scope="module")
def pg() -> Iterator[PostgresServer]:
    yield from running_postgres()


@pytest.fixture(scope="module")
def runs(pg: PostgresServer) -> dict[str, dict[str, Any]]:
    """Every scenario, one after the other, by the same 8 processes."""
    scenarios = [
        {"name": "max1", "max_down": 1, "broken": False, "grants": GRANTS, "deadline": DEADLINE_S},
        {"name": "max2", "max_down": 2, "broken": False, "grants": GRANTS, "deadline": DEADLINE_S},
        {"name": "broken", "max_down": 1, "broken": True, "grants": 3, "deadline": DEADLINE_S},
    ]
    for sc in scenarios:
        sc["url"] = pg.create_database(f"conc_{sc['name']}")
        Ledger(sc["url"]).dispose()  # tables made once, before the race
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(PROCS), ctx.Queue()
    procs = [ctx.Process(target=worker, args=(i, scenarios, barrier, out)) for i in range(PROCS)]
    for p in procs:
        p.start()
    try:
        got = [out.get(timeout=300) for _ in range(PROCS * len(scenarios))]
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
                p.join()
        # The barrier's and queue's semaphores started spawn's resource tracker, a process that would
        # otherwise outlive the session (tests/conftest.py counts it as left running): stop it.
        out.close()
        del barrier, out
        resource_tracker._resource_tracker._stop()
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    res: dict[str, dict[str, Any]] = {}
    for sc in scenarios:
        mine = [g for g in got if g["name"] == sc["name"]]
        led = Ledger(sc["url"])
        res[sc["name"]] = {
            "max_down": sc["max_down"],
            "intervals": [iv for g in mine for iv in g["intervals"]],
            "grants": {g["idx"]: len(g["intervals"]) for g in mine},
            "waits": sum(g["waits"] for g in mine),
            "errors": sum(g["errors"] for g in mine),
            "replay": audit_replay(led),
            "left": led.holdings(),
        }
        led.dispose()
    return res


@pytest.mark.parametrize("name", ["max1", "max2"])
def test_never_more_domains_out_than_allowed(runs, name):
    r = runs[name]
    most, at = max_overlap(r["intervals"])
    print(f"{name}: {len(r['intervals'])} holdings, grants per process {r['grants']}, {r['waits']} refusals")
    assert most <= r["max_down"], f"{most} domains held at once (t={at:.6f}) with max_domains_down={r['max_down']}"
    assert most == r["max_down"]  # the limit was reached: the run did contend
    assert r["replay"] <= r["max_down"]
    assert r["errors"] == 0 and r["left"] == {}
    assert r["waits"] > 0  # refusals happened, and were only refusals


@pytest.mark.parametrize("name", ["max1", "max2"])
def test_every_process_gets_grants(runs, name):
    grants = runs[name]["grants"]
    assert sorted(grants) == list(range(PROCS))
    assert min(grants.values()) == GRANTS, grants


def test_the_check_catches_a_broken_ledger(runs):
    r = runs["broken"]
    most, _ = max_overlap(r["intervals"])
    print(f"broken: {len(r['intervals'])} holdings, up to {most} domains at once, {r['errors']} insert conflicts")
    assert most > r["max_down"], f"a ledger without its lock went unnoticed ({len(r['intervals'])} holdings)"
