"""On PostgreSQL, `Ledger.acquire_domain` and `Ledger.release` run as server-side functions
(railyard.ledger.pg); the Python path stays for SQLite and for what the functions hand back to it.

Differential: random scenarios run step by step through both, each on a database of its own on one
private server (tests/support/postgres.py), with one fake clock. Every decision, message and list of
released hosts must be the same, and after every step so must every row of the leases, operations,
waiters, audit and the ledger lock. The functions' database sorts text by an ICU collation when the
server has ICU, so that a sort the functions forgot to make Python's (code points) shows. The names
mix case, punctuation, a quote and a non-ASCII letter (the last two go back to the Python path).

Also: the functions are created once by many ledgers starting at once, and an acquire returns only
once its transaction is on disk (it commits asynchronously, then flushes: see railyard.ledger.pg).
"""

from __future__ import annotations

import itertools
import random
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg2
import pytest
from sqlalchemy import text

from railyard.ledger import Budget, Ledger
from railyard.ledger import pg as ledger_pg
from tests.support.postgres import PostgresServer, running_postgres

DOMAINS = {
    "pod-A": ["Rack-a1", "rack-a2", "rack_a10"],
    "pod_b": ["rack-B1", "rack.b2", "Rack-b3"],
    "Pod-c": ["c-1", "C-2", "c_3"],
    "pod.d": ["d~1", "D 2", "d-3"],
    "pod-e": ["e'1", "e-2", "E-3"],
    "odd": ['q"1', "q-2", "r\u00fcck-3"],  # JSON the functions do not write: the Python path's
}
HOSTS = sorted(h for hs in DOMAINS.values() for h in hs)
DOMAIN_OF = {h: d for d, hs in DOMAINS.items() for h in hs}
TRAINS = ["Op-1", "op_2", "op-3", "OP-4", "op-5"]
EMERGENCIES = ["em-A", "em_b"]
SEEDS = [1, 2, 3]
STEPS = 100
_names = itertools.count()

# What every decision family the functions make looks like: each must be seen decided by them. (The
# floor's own refusal never comes first: within both buffers, serving stays above the floor.)
FAMILIES = {
    "already": r" already holds ", "took_over": r" took over \d+ host\(s\) of ", "took": r" took \S+ \(\d+ hosts\)$",
    "yield": r"^yielding to .+, waiting since \d+$", "held": r"^\d+ host\(s\) of .+ held by ",
    "max_down": r"^max_domains_down=\d+ reached: ", "failure": r"^failure buffer exhausted: ",
    "maintenance": r"^maintenance buffer: ", "free": r" can be taken now$",
}


@pytest.fixture(scope="module")
def pg() -> Iterator[PostgresServer]:
    yield from running_postgres()


def icu_database(pg: PostgresServer, name: str) -> str:
    """A database whose text sorts by ICU's en-US rules ('a' < 'B', '-' and '_' ignored first), if the
    server has ICU; else a plain one."""
    conn = psycopg2.connect(host=str(pg.socket_dir), user="postgres", dbname="postgres")
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            try:
                cur.execute(f'CREATE DATABASE "{name}" TEMPLATE template0 ENCODING UTF8 LOCALE \'C\' '
                            "LOCALE_PROVIDER icu ICU_LOCALE 'en-US'")
                return pg.url(name)
            except psycopg2.Error:
                pass
    finally:
        conn.close()
    return pg.create_database(name)


class Clock:
    """time.time() for the ledger: one value per step, the same for both paths."""

    def __init__(self) -> None:
        self.now = 1_800_000_000.25

    def time(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def decided(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any]]:
    """(statement, row or None) of every call of the functions: None = handed to the Python path."""
    calls: list[tuple[str, Any]] = []
    real = ledger_pg.call

    def spy(chan: ledger_pg.Channel, sql: str, args: tuple[Any, ...]) -> Any:
        row = real(chan, sql, args)
        calls.append(("acquire" if sql == chan.fns.acquire else "release", row))
        return row

    monkeypatch.setattr(ledger_pg, "call", spy)
    return calls


def snapshot(led: Ledger) -> dict[str, list[Any]]:
    q = {
        "leases": 'SELECT host, op_id, domain, since, kind FROM leases ORDER BY host COLLATE "C"',
        "operations": 'SELECT id, kind, train, domain, state, created_at, updated_at, detail FROM operations '
                      'ORDER BY id COLLATE "C"',
        "waiters": 'SELECT op_id, priority, since, seen_at FROM waiters ORDER BY op_id COLLATE "C"',
        "audit": "SELECT at, actor, op_id, action, hosts, reason FROM audit ORDER BY id",
        "ledger_lock": "SELECT id, n FROM ledger_lock",
    }
    with led.engine.connect() as c:
        return {k: [tuple(r) for r in c.execute(text(s))] for k, s in q.items()}


def step(rnd: random.Random, py: Ledger) -> tuple[str, dict[str, Any]]:
    """One random call: what it is and its arguments (drawn from the state the Python path sees)."""
    held = py.holdings()
    r = rnd.random()
    if r < 0.55:
        em = rnd.random() < 0.3
        op = rnd.choice(EMERGENCIES if em else TRAINS)
        dom = rnd.choice(sorted(DOMAINS))
        hosts = DOMAINS[dom] if rnd.random() < 0.8 else rnd.sample(DOMAINS[dom], rnd.randint(1, 3))
        total = rnd.randint(8, 24)
        budget = Budget(total_hosts=total, maintenance_hosts=rnd.randint(2, 10), failure_hosts=rnd.randint(0, 4),
                        max_domains_down=rnd.randint(1, 3))
        pool = None if rnd.random() < 0.6 else sorted(set(rnd.sample(HOSTS, rnd.randint(3, 12))) | set(hosts))
        unavailable = rnd.sample(HOSTS, rnd.choice([0, 0, 1, 2, 3]))
        takeover = []
        if em and rnd.random() < 0.7:
            takeover = sorted({held[h] for h in hosts if h in held and held[h] in TRAINS}) or [rnd.choice(TRAINS)]
        return "acquire_domain", dict(op_id=op, train=f"t-{op[-1]}", domain=dom, hosts=hosts, budget=budget,
                               pool_hosts=pool, unavailable=unavailable, kind="emergency" if em else "train_stop",
                               take_over_from=takeover, probe=rnd.random() < 0.15,
                               actor=rnd.choice(["railyard", "ann"]))
    ops = sorted(set(held.values()) | set(TRAINS) | set(EMERGENCIES))
    if r < 0.85:
        only = None if rnd.random() < 0.7 else rnd.sample(HOSTS, rnd.randint(1, 6))
        return "release", dict(op_id=rnd.choice(ops), hosts=only, reason=rnd.choice(["", "done", "back in service"]))
    if r < 0.95:
        h = rnd.choice(HOSTS)
        return "lease_repair", dict(op_id=f"rep-{h}", host=h, domain=DOMAIN_OF[h], reason="broken")
    src = rnd.choice(ops)
    return "handover", dict(hosts=[h for h, o in held.items() if o == src], from_op=src, to_op=rnd.choice(ops),
                            kind="train_stop", reason="test")


@pytest.mark.parametrize("seed", SEEDS)
def test_the_functions_decide_and_write_as_the_python_path(pg, clock, decided, seed):
    py = Ledger(pg.create_database(f"diff_py_{seed}_{next(_names)}"), pg_functions=False, clock=clock.time)
    fn = Ledger(icu_database(pg, f"diff_fn_{seed}_{next(_names)}"), clock=clock.time)
    try:
        assert py._pg is None and fn._pg is not None
        rnd = random.Random(seed)
        for i in range(STEPS):
            clock.now += rnd.choice([0.1, 0.5, 1.0, 2.5, 7.0, 12.0])
            what, kw = step(rnd, py)
            n_calls = len(decided)
            got_py, got_fn = getattr(py, what)(**kw), getattr(fn, what)(**kw)
            assert got_fn == got_py, (i, what, kw)
            assert snapshot(fn) == snapshot(py), (i, what, kw)
            if what == "acquire_domain" and decided[n_calls:] and decided[n_calls][1] is not None:
                record_family(got_fn.reason)
    finally:
        py.dispose()
        fn.dispose()


SEEN: set[str] = set()


def record_family(reason: str) -> None:
    SEEN.update(k for k, rx in FAMILIES.items() if re.search(rx, reason))


def test_every_kind_of_decision_was_made_by_the_functions():
    """The scenarios above are no use if the functions handed everything back: each family of
    decision was made by them at least once (deterministic: the seeds are fixed)."""
    if not SEEN:
        pytest.skip("runs after the differential tests")
    assert SEEN == set(FAMILIES), sorted(set(FAMILIES) - SEEN)


def test_the_functions_are_made_once_by_many_ledgers_starting_at_once(pg):
    url = pg.create_database(f"start_{next(_names)}")
    made: list[Ledger] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(6)

    def start() -> None:
        try:
            barrier.wait(timeout=30)
            made.append(Ledger(url))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=start) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    try:
        assert not errors, errors
        assert len(made) == 6 and all(led._pg is not None for led in made)
        budget = Budget(total_hosts=18, maintenance_hosts=6, failure_hosts=1, max_domains_down=1)
        assert made[0].acquire_domain("op", train="t", domain="pod-A", hosts=DOMAINS["pod-A"], budget=budget).granted
        assert made[5].release("op") == sorted(DOMAINS["pod-A"])
        with made[0].engine.connect() as c:
            n = c.execute(text("SELECT count(*) FROM pg_proc WHERE proname LIKE 'railyard\\_%'")).scalar_one()
        assert n == 4  # json, decide, acquire, release: one of each
    finally:
        for led in made:
            led.dispose()


def test_a_postgresql_url_without_a_driver_gets_the_functions(pg, monkeypatch):
    """`postgresql://` (SQLAlchemy 2.1's default driver there is psycopg 3) and `postgres://` open the ledger
    on psycopg2, with its lease functions: the tested path, not an untested one."""
    url = pg.create_database(f"plain_{next(_names)}")
    assert url.startswith("postgresql+psycopg2://")
    for plain in ("postgresql://" + url.split("://", 1)[1], "postgres://" + url.split("://", 1)[1]):
        monkeypatch.setenv("RAILYARD_LEDGER_URL", plain)
        led = Ledger()
        try:
            assert led.engine.dialect.driver == "psycopg2" and led._pg is not None
            budget = Budget(total_hosts=18, maintenance_hosts=6, failure_hosts=1, max_domains_down=1)
            assert led.acquire_domain("op", train="t", domain="pod-A", hosts=DOMAINS["pod-A"], budget=budget).granted
            assert led.release("op") == sorted(DOMAINS["pod-A"])
        finally:
            led.dispose()


@pytest.mark.parametrize("items", [[], ["gpu-a01", "gpu-a02"], [""], ['a"b', "c\\d", "e,f", "{g}", "h i", "NULL"],
                                   ["plain", 'then a "quote"']])
def test_host_lists_reach_the_server_as_they_are(pg, items):
    """`text_array` (its fast path for names with nothing to escape, and the other) is the array the server reads."""
    conn = psycopg2.connect(host=str(pg.socket_dir), user="postgres", dbname="postgres")
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT %s::text[]", (ledger_pg.text_array(items),))
            assert cur.fetchone()[0] == items
            cur.execute("SELECT %s::text[]", (ledger_pg.text_array(iter(items)),))  # any iterable, once
            assert cur.fetchone()[0] == items
    finally:
        conn.close()


def wal_syncs(cur: Any) -> int:
    """The server's count of WAL flushes to disk, with this connection's own counts reported first."""
    cur.execute("SELECT pg_stat_force_next_flush()")
    cur.execute("SELECT 1")
    cur.execute("SELECT pg_stat_clear_snapshot()")
    cur.execute("SELECT wal_sync FROM pg_stat_wal")
    return int(cur.fetchone()[0])


def test_an_acquire_returns_once_its_grant_is_on_disk(pg):
    """Each acquire commits asynchronously (the ledger lock goes at once) and then flushes the log in a
    second transaction before it returns: N acquires and releases one after the other make at least
    2N flushes, where N asynchronous commits alone make a few (the WAL writer's)."""
    url = pg.create_database(f"flush_{next(_names)}")
    budget = Budget(total_hosts=100, maintenance_hosts=50, failure_hosts=1, max_domains_down=10)
    conn = psycopg2.connect(host=str(pg.socket_dir), user="postgres", dbname="postgres")
    conn.autocommit = True
    n = 30
    try:
        with conn.cursor() as cur:
            cur.execute("CREATE TABLE IF NOT EXISTS logged (n int)")
            before = wal_syncs(cur)
            for _ in range(n):
                cur.execute("BEGIN; SET LOCAL synchronous_commit = off; INSERT INTO logged VALUES (1); COMMIT")
            async_only = wal_syncs(cur) - before
            led = Ledger(url)
            assert led._pg is not None
            before = wal_syncs(cur)
            for i in range(n):
                d = led.acquire_domain(f"op{i}", train="t", domain=f"d{i}", hosts=[f"d{i}h0", f"d{i}h1"], budget=budget)
                assert d.granted, d
                assert led.release(f"op{i}") == [f"d{i}h0", f"d{i}h1"]
            led.dispose()  # its sessions end, and report what they flushed
            time.sleep(0.5)
            both = wal_syncs(cur) - before
    finally:
        conn.close()
    assert async_only < n / 2, async_only  # the check can tell
    assert both >= 2 * n, both  # an acquire's flush and a release's, each


def test_lease_operations_read_by_index_on_a_table_with_statistics(pg):
    """Once autovacuum has analysed a small leases table, a plan of the planner's own choosing reads
    the whole table for one operation's leases, as many dead rows as the churn of stops has left. The
    functions keep to indexes whatever the statistics: no acquire or release after ANALYZE scans
    `leases`, `operations` or `audit` sequentially."""
    name = f"stats_{next(_names)}"
    led = Ledger(pg.create_database(name))
    assert led._pg is not None
    budget = Budget(total_hosts=1000, maintenance_hosts=100, failure_hosts=50, max_domains_down=5)
    for i in range(40):
        led.lease_repair(f"repair-{i}", f"broken-{i}", domain=f"rack-{i % 4}", reason="broken")
    conn = psycopg2.connect(host=str(pg.socket_dir), user="postgres", dbname=name)
    conn.autocommit = True
    tables = ("leases", "operations", "audit")

    def seq_scans(cur: Any) -> dict[str, int]:
        # A session reports its counts as it exits, before it leaves pg_stat_activity; dispose() only
        # closes the client's side, so wait for the server's side to be gone before reading.
        deadline = time.monotonic() + 10
        while _backend_pids(cur, name) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _backend_pids(cur, name), "the ledger's sessions outlived dispose() by 10 s"
        cur.execute("SELECT pg_stat_clear_snapshot()")
        cur.execute("SELECT relname, seq_scan FROM pg_stat_user_tables WHERE relname = ANY(%s)", (list(tables),))
        return dict(cur.fetchall())

    try:
        with conn.cursor() as cur:
            cur.execute("ANALYZE")
            led.dispose()  # new sessions: plans made on the statistics
            before = seq_scans(cur)
            for i in range(20):
                hosts = [f"d{i % 3}h{h}" for h in range(4)]
                assert led.acquire_domain(f"op{i}", train="t", domain=f"d{i % 3}", hosts=hosts, budget=budget).granted
                assert led.release(f"op{i}", hosts=hosts[:1] if i % 2 else None) == (hosts[:1] if i % 2 else hosts)
                if i % 2:
                    assert led.release(f"op{i}") == hosts[1:]
            led.dispose()  # its sessions end, and report what they read
            after = seq_scans(cur)
    finally:
        conn.close()
    assert set(before) == set(tables), before  # the check can see each table
    assert {t: after[t] - before[t] for t in tables} == dict.fromkeys(tables, 0)


def _backend_pids(cur: Any, db: str) -> set[int]:
    cur.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()", (db,))
    return {r[0] for r in cur.fetchall()}


def test_the_lease_calls_own_connection_is_replaced_when_the_server_drops_it(pg, monkeypatch):
    """Lease calls keep one connection of their own (ledger_pg.Channel). One the server ended while it was
    idle is pinged first and replaced: the next acquire is granted, on a new session."""
    name = f"chan_{next(_names)}"
    led = Ledger(pg.create_database(name))
    assert led._pg is not None
    budget = Budget(total_hosts=100, maintenance_hosts=50, failure_hosts=1, max_domains_down=10)
    conn = psycopg2.connect(host=str(pg.socket_dir), user="postgres", dbname="postgres")
    conn.autocommit = True
    try:
        assert led.acquire_domain("op1", train="t", domain="d1", hosts=["h1", "h2"], budget=budget).granted
        first = led._pg.connection().get_backend_pid()
        with conn.cursor() as cur:
            cur.execute("SELECT pg_terminate_backend(%s)", (first,))
            assert cur.fetchone()[0] is True
        monkeypatch.setattr(ledger_pg, "PING_IDLE_S", 0.0)  # idle long enough to be pinged
        time.sleep(0.2)
        assert led.release("op1") == ["h1", "h2"]
        assert led.acquire_domain("op2", train="t", domain="d2", hosts=["h3"], budget=budget).granted
        second = led._pg.connection().get_backend_pid()
        assert second != first
        with conn.cursor() as cur:
            assert first not in _backend_pids(cur, name)
    finally:
        led.dispose()
        conn.close()


def test_a_forked_child_never_uses_its_parents_lease_connection(pg):
    """A process forked after a lease call (as Airflow's workers fork task processes) opens its own
    connection for its calls, and leaves the parent's session alone: the parent's next calls still work
    on the same session."""
    import os

    name = f"fork_{next(_names)}"
    led = Ledger(pg.create_database(name))
    assert led._pg is not None
    budget = Budget(total_hosts=100, maintenance_hosts=50, failure_hosts=1, max_domains_down=10)
    try:
        assert led.acquire_domain("parent-1", train="t", domain="d1", hosts=["h1"], budget=budget).granted
        parent_pid = led._pg.connection().get_backend_pid()
        r, w = os.pipe()
        child = os.fork()
        if child == 0:  # the child: one acquire and release of its own, then report its session
            code = 1
            try:
                os.close(r)
                ok = led.acquire_domain("child-1", train="t", domain="d2", hosts=["h2"], budget=budget).granted
                ok = ok and led.release("child-1") == ["h2"]
                os.write(w, f"{int(ok)} {led._pg.connection().get_backend_pid()}".encode())
                code = 0
            finally:
                os._exit(code)
        os.close(w)
        with os.fdopen(r) as f:
            ok, child_pid = f.read().split()
        _, status = os.waitpid(child, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
        assert ok == "1"
        assert int(child_pid) != parent_pid
        assert led.release("parent-1") == ["h1"]  # the parent's session survived the child's exit
        assert led._pg.connection().get_backend_pid() == parent_pid
    finally:
        led.dispose()


def test_an_acquire_waits_for_a_writer_that_bumps_the_ledger_lock(pg):
    """The functions take the ledger lock as a row lock (FOR UPDATE); an older Railyard on the same
    database bumps the row instead (UPDATE). Each must wait for the other: an acquire started while
    such a writer holds the lock returns only after that writer commits, and then sees its lease."""
    name = f"lock_{next(_names)}"
    led = Ledger(pg.create_database(name))
    assert led._pg is not None
    budget = Budget(total_hosts=100, maintenance_hosts=50, failure_hosts=1, max_domains_down=1)
    other = psycopg2.connect(host=str(pg.socket_dir), user="postgres", dbname=name)
    got: list[Any] = []
    try:
        with other.cursor() as cur:  # the older writer: bump the lock, lease d1, commit later
            cur.execute("UPDATE ledger_lock SET n = n + 1 WHERE id = 1")
            cur.execute("INSERT INTO operations (id, kind, train, domain, state, created_at, updated_at, detail) "
                        "VALUES ('old-op', 'train_stop', 't', 'd1', 'active', 0, 0, '{}')")
            cur.execute("INSERT INTO leases (host, op_id, domain, since, kind) VALUES ('h1', 'old-op', 'd1', 0, "
                        "'train_stop')")
        t = threading.Thread(target=lambda: got.append(
            led.acquire_domain("new-op", train="t", domain="d2", hosts=["h2"], budget=budget)))
        t.start()
        t.join(timeout=1.5)
        assert t.is_alive() and not got  # waiting for the lock
        other.commit()
        t.join(timeout=30)
        assert got and got[0].outcome == "wait", got  # it saw d1 out: max_domains_down=1
        assert got[0].reason == "max_domains_down=1 reached: d1 out", got[0]
    finally:
        other.close()
        led.dispose()
