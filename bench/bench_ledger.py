"""Ledger throughput on a real PostgreSQL, side by side with the database's own floor, same run.

One private PostgreSQL (tests/support/postgres.py: Debian's server, unix socket, durability at
PostgreSQL's defaults: fsync on, synchronous_commit on) serves both measurements, one after the other:

- floor: PROCS processes, each looping a one-row UPDATE of its own row, one commit each (psycopg2,
  no ORM): what the server and this machine's disk can commit, with the same settings. Measured
  for SECONDS/2 before the ledger and SECONDS/2 after it; the floor is the mean of the two.
- ledger: PROCS processes, each looping `Ledger.acquire_domain` of a domain of its own (8 hosts)
  then `Ledger.release` of it. A *lease operation* is one of those calls (one transaction that changes
  leases); pairs/s is printed too. The ledger holds REPAIRS hosts leased to repairs throughout (a
  big fleet's failure buffer), so a lease that reads every lease row pays for it. Every acquire
  must be granted (the budget allows PROCS domains out at once); any refusal is reported. The
  whole fleet is one pool (no `pool_hosts`), every acquire takes the ledger lock, as in production.
  The ledger's tables are vacuumed and analysed before the measurement, as autovacuum will have done
  on any real ledger: plans are made on real statistics (without them, a plan that reads the whole
  leases table for one operation's leases went unnoticed here).

    .venv/bin/python bench/bench_ledger.py [--seconds 10 --procs 8 --repairs 256 --ledger PATH]

`--ledger PATH` measures another ledger.py (e.g. a copy of an older version) on the same server.
Prints a table, then one JSON object of the figures as the last line.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "include")]

from tests.support.postgres import running_postgres  # noqa: E402

HOSTS_PER_DOMAIN = 8
DOMAINS_PER_PROC = 4
GOAL_OPS = 1000
GOAL_FLOOR_SHARE = 0.5


def load_ledger(path: str | None) -> ModuleType:
    if not path:
        import railyard.ledger

        return railyard.ledger
    spec = importlib.util.spec_from_file_location("railyard_bench_ledger", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def fleet(procs: int) -> dict[str, list[str]]:
    return {f"w{p}-d{d}": [f"w{p}-d{d}-h{h}" for h in range(HOSTS_PER_DOMAIN)]
            for p in range(procs) for d in range(DOMAINS_PER_PROC)}


def budget(mod: ModuleType, procs: int, repairs: int) -> Any:
    return mod.Budget(total_hosts=75_000, maintenance_hosts=procs * HOSTS_PER_DOMAIN,
                      failure_hosts=repairs + 100, max_domains_down=procs)


# ---- workers (spawned) -------------------------------------------------------------------------------
def _ledger_worker(url: str, ledger_path: str | None, idx: int, procs: int, repairs: int, seconds: float,
                   ready: Any, go: Any, out: Any) -> None:
    mod = load_ledger(ledger_path)
    led = mod.Ledger(url)
    doms = [d for d in fleet(procs).items() if d[0].startswith(f"w{idx}-")]
    b = budget(mod, procs, repairs)
    refused: list[str] = []

    def pair(k: int) -> None:
        name, hosts = doms[k % len(doms)]
        op = f"bench-{idx}-{k}"
        d = led.acquire_domain(op, train=f"t{idx}", domain=name, hosts=hosts, budget=b)
        if not d.granted:
            refused.append(d.reason)
        led.release(op, reason="bench")

    pair(-1)  # warm: connection, compiled statements
    ready.put(idx)
    go.wait()
    c0 = time.process_time()
    t0 = time.time()
    end = time.monotonic() + seconds
    k = 0
    while time.monotonic() < end:
        pair(k)
        k += 1
    out.put({"idx": idx, "ops": 2 * k, "pairs": k, "t0": t0, "t1": time.time(), "refused": refused[:3],
             "n_refused": len(refused), "cpu": time.process_time() - c0})
    led.dispose()


def _floor_worker(dsn: dict[str, str], idx: int, seconds: float, ready: Any, go: Any, out: Any) -> None:
    import psycopg2

    conn = psycopg2.connect(**dsn)
    cur = conn.cursor()
    cur.execute("UPDATE floor SET n = n + 1 WHERE id = %s", (idx,))
    conn.commit()
    ready.put(idx)
    go.wait()
    c0 = time.process_time()
    t0 = time.time()
    end = time.monotonic() + seconds
    k = 0
    while time.monotonic() < end:
        cur.execute("UPDATE floor SET n = n + 1 WHERE id = %s", (idx,))
        conn.commit()
        k += 1
    out.put({"idx": idx, "ops": k, "t0": t0, "t1": time.time(), "cpu": time.process_time() - c0})
    conn.close()


def busy_s() -> float:
    """CPU seconds this machine has spent busy since boot, all cores (/proc/stat: not idle, not iowait)."""
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(f[:8]) - f[3] - f[4]) / os.sysconf("SC_CLK_TCK")


def _run(target: Any, args_of: Any, procs: int) -> tuple[list[dict[str, Any]], float]:
    """Start `procs` spawned workers, release them together once all are warm, collect their counts; with the
    machine's busy CPU seconds over the run (server, clients and all)."""
    ctx = mp.get_context("spawn")
    ready, out, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    ps = [ctx.Process(target=target, args=(*args_of(i), ready, go, out)) for i in range(procs)]
    for p in ps:
        p.start()
    try:
        for _ in ps:
            ready.get(timeout=120)
        b0 = busy_s()
        go.set()
        res = [out.get(timeout=300) for _ in ps]
        busy = busy_s() - b0
    finally:
        for p in ps:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join()
    if any(p.exitcode != 0 for p in ps):
        raise RuntimeError(f"a worker failed: exit codes {[p.exitcode for p in ps]}")
    return res, busy


def cpu_per_op_ms(res: list[dict[str, Any]], busy: float) -> tuple[float, float]:
    """(CPU of the whole machine, CPU of the clients) per operation, in ms, given the machine's busy seconds."""
    ops = sum(r["ops"] for r in res)
    return 1000 * busy / ops, 1000 * sum(r["cpu"] for r in res) / ops


def window(res: list[dict[str, Any]]) -> float:
    return max(r["t1"] for r in res) - min(r["t0"] for r in res)


def rate(res: list[dict[str, Any]], key: str = "ops") -> float:
    return sum(r[key] for r in res) / window(res)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--procs", type=int, default=8)
    ap.add_argument("--repairs", type=int, default=256, help="hosts leased to repairs throughout")
    ap.add_argument("--ledger", default=None, help="path of another ledger.py to measure instead")
    a = ap.parse_args(argv)
    with contextlib.contextmanager(running_postgres)() as pg:
        import psycopg2

        pg.create_database("floor")
        dsn = {"host": str(pg.socket_dir), "user": "postgres", "dbname": "floor"}
        conn = psycopg2.connect(**dsn)
        with conn.cursor() as cur:
            cur.execute("CREATE TABLE floor (id integer PRIMARY KEY, n bigint NOT NULL)")
            cur.executemany("INSERT INTO floor VALUES (%s, 0)", [(i,) for i in range(a.procs)])
        conn.commit()
        with conn.cursor() as cur:
            cur.execute("SELECT name, setting FROM pg_settings WHERE name IN "
                        "('fsync', 'synchronous_commit', 'full_page_writes', 'wal_sync_method')")
            settings = dict(cur.fetchall())
        conn.close()

        url = pg.create_database("ledger")
        mod = load_ledger(a.ledger)
        led = mod.Ledger(url)
        for i in range(a.repairs):
            led.lease_repair(f"repair-{i}", f"broken-{i}", domain=f"rack-{i % 64}", reason="bench: broken")
        led.dispose()
        conn = psycopg2.connect(**(dsn | {"dbname": "ledger"}))
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("VACUUM ANALYZE")  # as autovacuum will have: plans made on real statistics
        conn.close()

        load0 = os.getloadavg()[0]
        floor_before, busy_before = _run(_floor_worker, lambda i: (dsn, i, a.seconds / 2), a.procs)
        lease, busy_lease = _run(_ledger_worker, lambda i: (url, a.ledger, i, a.procs, a.repairs, a.seconds), a.procs)
        floor_after, busy_after = _run(_floor_worker, lambda i: (dsn, i, a.seconds / 2), a.procs)

    floors = (rate(floor_before), rate(floor_after))
    floor_ops, lease_ops, pairs = sum(floors) / 2, rate(lease), rate(lease, "pairs")
    refused = sum(r["n_refused"] for r in lease)
    share = lease_ops / floor_ops
    ok = lease_ops >= GOAL_OPS and share >= GOAL_FLOOR_SHARE and refused == 0
    which = a.ledger or "include/railyard/ledger/core.py"
    print(f"PostgreSQL {', '.join(f'{k}={v}' for k, v in sorted(settings.items()))}; {a.procs} processes, "
          f"{a.seconds:.0f} s each; {a.repairs} hosts leased to repairs; ledger: {which}")
    print(f"  {'':44}{'per second':>12}")
    print(f"  {'floor: 1-row UPDATE + commit (psycopg2)':44}{floor_ops:>12.0f}   (before {floors[0]:.0f}, after "
          f"{floors[1]:.0f})")
    print(f"  {'ledger: lease ops (acquire or release)':44}{lease_ops:>12.0f}   ({pairs:.0f} acquire+release pairs/s)")
    print(f"  {'ledger / floor':44}{share:>12.2f}")
    f_cpu, f_cli = cpu_per_op_ms(floor_before + floor_after, busy_before + busy_after)
    l_cpu, l_cli = cpu_per_op_ms(lease, busy_lease)
    cores = os.cpu_count() or 1
    l_busy = busy_lease / (cores * window(lease))
    print(f"  CPU per operation (whole machine; the clients' part): floor {f_cpu:.3f} ms ({f_cli:.3f}), "
          f"ledger {l_cpu:.3f} ms ({l_cli:.3f});")
    print(f"  the {cores} cores were {l_busy:.0%} busy during the ledger's run; so {cores}/CPU per op = "
          f"{cores / l_cpu * 1000:.0f} lease ops/s is this machine's bound for that work")
    if refused:
        print(f"  {refused} acquires were refused, e.g. {next(r['refused'][0] for r in lease if r['refused'])}")
    print(f"  goal: >= {GOAL_OPS} lease ops/s and >= {GOAL_FLOOR_SHARE} x floor: {'met' if ok else 'NOT met'}")
    print(f"  (1-minute load average {load0:.1f} when the measurements began, on {os.cpu_count()} CPUs: other work on "
          "the machine lowers both figures, the ledger's more)")
    out = {"bench": "ledger_pg", "procs": a.procs, "seconds": a.seconds, "repairs": a.repairs, "ledger": which,
           "floor_txn_per_s": round(floor_ops), "lease_ops_per_s": round(lease_ops),
           "floor_before_per_s": round(floors[0]), "floor_after_per_s": round(floors[1]),
           "lease_pairs_per_s": round(pairs), "lease_over_floor": round(share, 3), "refused": refused,
           "floor_cpu_ms_per_op": round(f_cpu, 4), "lease_cpu_ms_per_op": round(l_cpu, 4),
           "lease_client_cpu_ms_per_op": round(l_cli, 4), "lease_busy_share": round(l_busy, 3),
           "loadavg": round(load0, 2),
           "settings": settings, "goal_met": ok}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
