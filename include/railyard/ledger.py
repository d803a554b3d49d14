"""The operations ledger: the durable record of which operation holds which hosts.

One operation per host at a time (the `leases` primary key), and taking a domain is one
serialised transaction that checks the buffers and `max_domains_down` before it leases anything.
Leases never expire by time: they are released only after the hosts are back or offboarded.
Every change writes an audit row (who, what, when, why).

Speed (bench/bench_ledger.py): the hot paths (`acquire_domain`, `release`) read only what they decide
on — the leases of the hosts in question and counts per kind and domain, never every lease row.
On PostgreSQL with psycopg2 each is one call of a PL/pgSQL function that makes the same decision with
the same messages and writes the same rows (railyard.ledger_pg, created by `Ledger()`): one round
trip, and the ledger lock is held only while the server runs it. An acquire commits asynchronously,
so the lock goes without waiting for the disk, and the same call flushes the log before it returns:
nothing is reported that is not on disk. A release does not take the ledger lock there (see
`release`). What the functions hand back (a refusal to judge on every lease, unusual host names)
and every other database takes the Python path below, whose statements are built once (server-side
prepared statements on PostgreSQL, a step's lock and read in one round trip).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import (
    Column,
    Engine,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    bindparam,
    cast,
    create_engine,
    event,
    func,
    insert,
    inspect,
    literal_column,
    null,
    select,
    text,
    union_all,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.exc import DBAPIError, DisconnectionError, OperationalError

from railyard import ledger_pg

metadata = MetaData()

operations = Table(
    "operations",
    metadata,
    Column("id", String(255), primary_key=True),
    Column("kind", String(32), nullable=False),  # train_stop | emergency | repair
    Column("train", String(128)),
    Column("domain", String(128)),
    Column("state", String(16), nullable=False),  # active | done | aborted
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
    Column("detail", Text, nullable=False, default="{}"),
    Index("ix_operations_state_kind", "state", "kind"),
)

_REPAIR, _NOT_REPAIR = "kind = 'repair'", "kind <> 'repair'"  # in the SQL text, so partial indexes apply

leases = Table(
    "leases",
    metadata,
    Column("host", String(128), primary_key=True),  # one operation per host
    Column("op_id", String(255), nullable=False, index=True),
    Column("domain", String(128), nullable=False),
    Column("since", Float, nullable=False),
    Column("kind", String(32), nullable=False, default="train_stop"),  # repairs are not domains out
    # Domains out and hosts in repair, counted from an index of their own kind of lease: the leases of
    # maintenance come and go with every stop, and a scan of the table would read their dead rows too.
    Index("ix_leases_out_domain", "domain", postgresql_where=text(_NOT_REPAIR), sqlite_where=text(_NOT_REPAIR)),
    Index("ix_leases_repair_domain", "domain", postgresql_where=text(_REPAIR), sqlite_where=text(_REPAIR)),
)

verifications = Table(
    "verifications",
    metadata,
    Column("op_id", String(255), primary_key=True),
    Column("host", String(128), primary_key=True),
    Column("passed", Integer, nullable=False),
    Column("versions", Text, nullable=False),
    Column("reason", Text),
    Column("at", Float, nullable=False),
)

audit = Table(
    "audit",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("at", Float, nullable=False),
    Column("actor", String(255), nullable=False),
    Column("op_id", String(255)),
    Column("action", String(64), nullable=False),
    Column("hosts", Text, nullable=False, default="[]"),
    Column("reason", Text, nullable=False, default=""),
    Index("ix_audit_op_id", "op_id"),
)

# The fleet's serving capacity as stops saw it (after each drain and each return), on the fleet clock: the
# Railyard page's chart for fleets that keep no history of their own (SSH, Slurm).
capacity_samples = Table(
    "capacity_samples",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("at", Float, nullable=False),
    Column("serving", Integer, nullable=False),
    Column("total", Integer, nullable=False),
    Column("op_id", String(255)),
    Index("ix_capacity_samples_at", "at"),
)

switches = Table(
    "switches",
    metadata,
    Column("name", String(64), primary_key=True),  # e.g. freeze
    Column("value", Integer, nullable=False),
    Column("reason", Text, nullable=False, default=""),
    Column("actor", String(255), nullable=False),
    Column("at", Float, nullable=False),
)

# Operations waiting for capacity, by priority: a waiting emergency is granted before trains.
# A row not refreshed within WAITER_TTL_S is ignored (its sensor is gone); leases never expire.
waiters = Table(
    "waiters",
    metadata,
    Column("op_id", String(255), primary_key=True),
    Column("priority", Integer, nullable=False),
    Column("since", Float, nullable=False),
    Column("seen_at", Float, nullable=False),
    Index("ix_waiters_since", "since"),  # the waiter ahead: the first by `since`, without a sort
)
WAITER_TTL_S = 30.0
PRIORITY = {"train_stop": 10, "emergency": 100}

visits = Table(
    "visits",
    metadata,
    Column("train", String(128), primary_key=True),
    Column("domain", String(128), primary_key=True),
    Column("at", Float, nullable=False),  # fleet clock
    Column("op_id", String(255), nullable=False),
)

# Rollout of each release (railyard.releases): its phase and whether it is halted, and the outcome of
# every host it was applied to (fleet clock), which the phase gates judge.
release_states = Table(
    "release_states",
    metadata,
    Column("release", String(128), primary_key=True),
    Column("phase", String(16), nullable=False),  # canary | staged | fleet
    Column("halted", Integer, nullable=False, default=0),
    Column("reason", Text, nullable=False, default=""),
    Column("actor", String(255), nullable=False),
    Column("promoted_at", Float, nullable=False),  # fleet clock when the phase began
    Column("at", Float, nullable=False),  # wall clock of the last change
)
release_results = Table(
    "release_results",
    metadata,
    Column("release", String(128), primary_key=True),
    Column("host", String(128), primary_key=True),
    Column("op_id", String(255), primary_key=True),
    Column("passed", Integer, nullable=False),
    Column("reason", Text, nullable=False, default=""),
    Column("at", Float, nullable=False),  # fleet clock
)

# One row, taken first in every lease-changing transaction: serialises writers, so the capacity check and
# the lease insert see the same world. SQLite bumps it (a write takes its database lock); PostgreSQL locks
# it FOR UPDATE (a row lock: no new row version to write and log, and it still waits for, and is waited
# for by, a writer that bumps it, as an older Railyard on the same database does).
ledger_lock = Table("ledger_lock", metadata, Column("id", Integer, primary_key=True), Column("n", Integer))


@dataclass(frozen=True)
class Budget:
    """What taking a domain must respect, in hosts."""

    total_hosts: int
    maintenance_hosts: int  # maintenance buffer
    failure_hosts: int  # failure buffer
    max_domains_down: int


@dataclass(frozen=True)
class Decision:
    outcome: str  # granted | wait | stop
    reason: str

    @property
    def granted(self) -> bool:
        return self.outcome == "granted"


def default_url() -> str:
    home = Path(os.environ.get("RAILYARD_HOME", Path.home() / ".railyard"))
    home.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{home / 'ledger.db'}"


def resolve_url(url: str | None = None) -> str:
    """The ledger in force: the config's URL, else RAILYARD_LEDGER_URL, else a SQLite file; checked
    (`check_url`) before anything connects."""
    if url:
        return check_url(url, "ledger.url")
    env = os.environ.get("RAILYARD_LEDGER_URL")
    if env:
        return check_url(env, "RAILYARD_LEDGER_URL")
    return default_url()


class LedgerError(RuntimeError):
    """The ledger's database cannot be used: a URL Railyard does not take, or a server it cannot reach.
    Says where the URL came from (`source`) and shows it without its password."""

    def __init__(self, source: str, detail: str):
        self.source, self.detail = source, detail
        super().__init__(f"{source}: {detail}")


_EXAMPLES = "postgresql+psycopg2://USER:PASSWORD@HOST/DB or sqlite:////PATH/ledger.db"


# query parameters that carry a credential (libpq's `password`, `sslpassword`, a driver's token...)
_SECRET_QUERY = re.compile(r"pass|pwd|secret|token|key|credential", re.IGNORECASE)


def has_credentials(url: str) -> bool:
    """Whether `url` carries a credential: a password, or a query parameter such as `?password=`.
    An unparsable URL counts as one (it is never shown or shipped as it is)."""
    try:
        u = make_url(url)
    except Exception:
        return True
    return bool(u.password) or any(_SECRET_QUERY.search(k) for k in u.query)


def _shown(u: Any) -> str:
    base = str(u.set(query={}).render_as_string(hide_password=True))
    pairs = [(k, v) for k, vs in u.query.items() for v in ((vs,) if isinstance(vs, str) else vs)]
    query = "&".join(f"{k}={'***' if _SECRET_QUERY.search(k) else v}" for k, v in pairs)
    return f"{base}?{query}" if query else base


def safe_url(url: str) -> str:
    """`url` as it may be shown: its password, and every query parameter that carries a credential, as ***."""
    try:
        return _shown(make_url(url))
    except Exception:  # not a URL: hide whatever stands before an "@", and every query value
        return re.sub(r"\?.*$", "?***", re.sub(r"://[^@]*@", "://***@", url))


def check_url(url: str, source: str, *, files: bool = True) -> str:
    """The URL to open, or LedgerError: SQLite (a file in a folder that exists, or memory), or PostgreSQL
    with psycopg2, the driver the lease functions (railyard.ledger_pg) and the tests run on.
    `postgresql://` (or `postgres://`) means `postgresql+psycopg2://` (SQLAlchemy 2.1 would pick psycopg 3,
    a path nobody tested); another driver or database is refused rather than run untested. `files=False`: SQLite's
    folder is not looked for (a config checked on another machine than the one that opens it)."""
    try:
        u = make_url(url)
    except Exception:
        raise LedgerError(source, f"not a database URL: {safe_url(url)!r} (e.g. {_EXAMPLES})") from None
    if "@" in (u.host or ""):  # "user:p@ss@host": the host would be read from the password
        raise LedgerError(source, f"{re.sub(r'://.*@', '://***@', url)}: more than one '@' before the host: "
                          "write an '@' in the user or password as %40")
    backend, _, driver = u.drivername.partition("+")
    shown = _shown(u)
    if backend == "sqlite":
        if driver not in ("", "pysqlite"):
            raise LedgerError(source, f"{shown}: SQLite driver {driver!r} is not supported: use sqlite:///PATH")
        if files and u.database and u.database != ":memory:" and not u.database.startswith("file:"):
            folder = Path(u.database).expanduser().parent
            if not folder.is_dir():
                raise LedgerError(source, f"{shown}: folder {str(folder)!r} does not exist")
        return url
    if backend in ("postgresql", "postgres"):  # "postgres": Heroku's spelling, which SQLAlchemy no longer takes
        if driver not in ("", "psycopg2"):
            raise LedgerError(source, f"{shown}: driver {driver!r} is not supported: use postgresql+psycopg2://")
        if u.drivername == "postgresql+psycopg2":
            return url
        return "postgresql+psycopg2://" + url.split("://", 1)[1]  # the rest as written
    raise LedgerError(source, f"{shown}: database {backend!r} is not supported: use {_EXAMPLES}")


def create_tables(url: str, create: Callable[[], None]) -> None:
    """Run `create` (the CREATEs a database still lacks) on the database at `url`, again when another process
    made the same table at the same moment; a database that cannot be opened is a LedgerError, in one line
    (a server that could not be reached, a SQLite file that could not be opened)."""
    for attempt in range(10):
        try:
            create()
            return
        except DBAPIError as exc:
            if _already_exists(exc) and attempt < 9:
                time.sleep(0.1)
                continue
            if isinstance(exc, OperationalError):
                first = (str(exc.orig).strip().splitlines() or [type(exc.orig).__name__])[0]
                raise LedgerError("ledger", f"cannot open {safe_url(url)}: {first}") from None
            raise


class Ledger:
    def __init__(self, url: str | None = None, *, pg_functions: bool = True):
        """`pg_functions`: on PostgreSQL with psycopg2, lease operations run as server-side functions
        (railyard.ledger_pg); False keeps them in Python, as on SQLite (tests compare the two)."""
        self.url = resolve_url(url)
        self.engine: Engine = _make_engine(self.url)
        def create() -> None:
            metadata.create_all(self.engine, checkfirst=True)
            _create_missing_indexes(self.engine)

        create_tables(self.url, create)
        with self.engine.begin() as c:
            if c.execute(select(ledger_lock.c.id)).first() is None:
                try:
                    with c.begin_nested():
                        c.execute(insert(ledger_lock).values(id=1, n=0))
                except Exception:  # another process created it first
                    pass
        self._pg: ledger_pg.Channel | None = None
        if pg_functions and self.engine.dialect.name == "postgresql" and self.engine.dialect.driver == "psycopg2":
            fns = ledger_pg.install(self.engine)
            self._pg = None if fns is None else ledger_pg.Channel(self.engine, fns)

    def dispose(self) -> None:
        """Close the engine's pooled connections and this thread's lease connection (other threads' close with them)."""
        if self._pg is not None:
            self._pg.close()
        self.engine.dispose()

    # ---- the atomic step ---------------------------------------------------------------------
    def acquire_domain(
        self,
        op_id: str,
        *,
        train: str,
        domain: str,
        hosts: list[str],
        budget: Budget,
        pool_hosts: Iterable[str] | None = None,
        unavailable: Iterable[str] = (),
        actor: str = "railyard",
        kind: str = "train_stop",
        take_over_from: Iterable[str] = (),
        probe: bool = False,
    ) -> Decision:
        """Lease every host of `domain` to `op_id`, or say why not.

        `probe`: decide, but lease nothing: "free" instead of "granted" (the operation keeps its place
        among the waiters). A trigger probes; only the task it resumes takes the lease.

        Waiting operations of a higher priority (emergencies) go first: a lower one waits while
        one of them is waiting. Hosts held by an operation in `take_over_from` (an emergency over a
        train's stop) are handed over in the same transaction instead of being waited for.

        `budget` is the capacity pool's (the hosts of one SKU, `pool_hosts`; None = the whole fleet).
        `unavailable` are hosts the fleet reports out of service for reasons of its own (failed,
        in repair): they count against the failure buffer, as do hosts leased to repairs.
        Idempotent: an operation that already holds the domain is granted again.
        """
        # Everything that needs no database is done before the lock is taken.
        want = sorted(set(hosts))
        pool = _host_set(pool_hosts)
        unavail = set(unavailable)
        u_pool = [h for h in unavail if pool is None or h in pool]
        u_known = len(u_pool) <= _LOOKUP_MAX  # the lease of every unavailable host in the pool is read
        takeover = set(take_over_from)
        prio = PRIORITY.get(kind, 10)
        if self._pg is not None:  # the same steps on the server, in one round trip (railyard.ledger_pg)
            now = time.time()
            got = ledger_pg.acquire(
                self._pg, op_id=op_id, train=train, domain=domain, kind=kind, actor=actor,
                priority=prio, now=now, cutoff=now - WAITER_TTL_S, want=want,
                skip=[h for h in want if h in unavail and (pool is None or h in pool)],
                u_pool=u_pool if u_known else [], n_u_pool=len(u_pool), u_known=u_known,
                exact=pool is None and u_known, takeover=sorted(takeover), budget=budget, probe=probe)
            if got is not None:
                return Decision(*got)
        look = sorted(set(want) | set(u_pool)) if u_known else want
        with self.engine.begin() as c:
            now = time.time()
            v = _lock_and_read_view(c, [op_id, *takeover], op_id, prio, now, look)
            rows = v.rows
            mine = [h for h in want if h in rows and rows[h][0] == op_id]
            if len(mine) == len(want):
                return Decision("granted", f"{op_id} already holds {domain}")
            if v.ahead is not None:
                return self._wait(c, op_id, prio, now, f"yielding to {v.ahead[0]}, waiting since {v.ahead[1]:.0f}",
                                  waiting=v.waiting)
            handed = {h: rows[h][0] for h in want if h in rows and rows[h][0] in takeover}
            if handed and probe:
                return self._free(c, op_id, prio, now, domain, v.waiting)
            if handed:
                moved = sorted(handed)
                c.execute(update(leases).where(leases.c.host.in_(moved)).values(op_id=op_id, kind=kind, since=now))
                c.execute(insert(audit), [
                    _audit_row(actor, o, a, [h], r) for h in moved
                    for o, a, r in ((op_id, "handover", f"taken over from {handed[h]}"),
                                    (handed[h], "handed_over", f"taken over by {op_id}"))
                ])
                v = _read_view(c, op_id, prio, now, look)
                rows = v.rows
                mine = [h for h in want if h in rows and rows[h][0] == op_id]
                if len(mine) == len(want):
                    _write_grant(c, v, op_id=op_id, kind=kind, train=train, domain=domain, now=now, taking=None)
                    return Decision("granted", f"{op_id} took over {len(handed)} host(s) of {domain} from "
                                               f"{', '.join(sorted(set(handed.values())))}")
            others = {h: rows[h][0] for h in want if h in rows and rows[h][0] != op_id}
            blocking = sorted(h for h in others if rows[h][1] != "repair")
            if blocking:
                holders = sorted({others[h] for h in blocking})
                return self._wait(c, op_id, prio, now, f"{len(blocking)} host(s) of {domain} held by {', '.join(holders)}",
                                  waiting=v.waiting)

            domains_out = v.domains_out
            if len(domains_out | {domain}) > budget.max_domains_down:
                return self._wait(c, op_id, prio, now,
                                  f"max_domains_down={budget.max_domains_down} reached: {', '.join(sorted(domains_out))} out",
                                  waiting=v.waiting)
            # Broken hosts inside the domain are not taken again, but still count once.
            taking = [h for h in want if h not in rows and not (h in unavail and (pool is None or h in pool))]
            # Hosts the fleet reports broken and hosts in repair count against the failure buffer. From the
            # counts alone these figures are exact for the whole fleet, and upper bounds for a pool (a lease
            # outside the pool counts too). The checks only refuse more as the figures grow, so a grant on
            # the bounds is the grant the exact figures give; a refusal on the bounds is judged again on
            # the leases themselves, so that its outcome and its message are the exact ones.
            n_broken = sum(1 for h in u_pool if h not in rows) if u_known else len(u_pool)
            verdict = _judge(budget, domain, taking, n_broken + v.n_repair, v.n_maint)
            if verdict is not None and not (pool is None and u_known):
                maint: set[str] = set()
                repairing: set[str] = set()
                for r in c.execute(select(leases.c.host, leases.c.kind)):
                    (repairing if r.kind == "repair" else maint).add(r.host)
                broken = {h for h in (unavail - maint) | repairing if pool is None or h in pool}
                verdict = _judge(budget, domain, taking, len(broken), sum(1 for h in maint if pool is None or h in pool))
            if verdict is not None:
                outcome, reason = verdict
                if outcome == "stop":
                    return Decision("stop", reason)
                return self._wait(c, op_id, prio, now, reason, waiting=v.waiting)

            if probe:
                return self._free(c, op_id, prio, now, domain, v.waiting)
            _write_grant(c, v, op_id=op_id, kind=kind, train=train, domain=domain, now=now, taking=taking,
                         actor=actor)
            return Decision("granted", f"{op_id} took {domain} ({len(taking)} hosts)")

    @classmethod
    def _free(cls, c: Connection, op_id: str, priority: int, now: float, domain: str, waiting: bool) -> Decision:
        """A probe that would be granted: keep the operation's place in line, lease nothing."""
        cls._wait(c, op_id, priority, now, "", waiting=waiting)
        return Decision("free", f"{domain} can be taken now")

    @staticmethod
    def _wait(c: Connection, op_id: str, priority: int, now: float, reason: str, *,
              waiting: bool | None = None) -> Decision:
        """Refuse for now, and queue (or refresh) the operation's place among the waiters."""
        if waiting is None:
            waiting = c.execute(select(waiters.c.op_id).where(waiters.c.op_id == op_id)).first() is not None
        _run(c, ["waiter_seen" if waiting else "waiter_insert"], {"w_op": op_id, "w_prio": priority, "w_now": now})
        return Decision("wait", reason)

    def waiting(self) -> list[dict[str, Any]]:
        """Operations waiting for capacity, highest priority first (what a waiting operator sees)."""
        with self.engine.connect() as c:
            q = select(waiters).where(waiters.c.seen_at > time.time() - WAITER_TTL_S)
            return [dict(r._mapping) for r in c.execute(q.order_by(waiters.c.priority.desc(), waiters.c.since))]

    def release(self, op_id: str, hosts: Iterable[str] | None = None, *, actor: str = "railyard", reason: str = "") -> list[str]:
        """Release the op's leases (all, or only `hosts`); the op is done when it holds none.

        On PostgreSQL a release does not wait for the ledger lock: it only gives capacity back (a
        concurrent decision that still sees the lease errs on the safe side), and the lock on the
        operation's own row serialises it with everything that changes this operation's leases."""
        only = None if hosts is None else set(hosts)
        if self._pg is not None:  # the same steps on the server, in one round trip (railyard.ledger_pg)
            dropped = ledger_pg.release(self._pg, op_id=op_id, only=only, actor=actor, reason=reason,
                                        now=time.time())
            if dropped is not None:
                return dropped
        with self.engine.begin() as c:
            pg = c.dialect.name == "postgresql"
            held = [r[0] for r in _run(c, ["op_row_lock" if pg else "lock", "held"], {"r_op": op_id})]
            drop = sorted(set(held) if only is None else set(held) & only)
            done = set(held) <= set(drop)
            parts = (["drop_all" if len(drop) == len(held) else "drop_some_any", "audit"] if drop else []) + (
                ["op_done"] if done else [])
            params: dict[str, Any] = {"d_op": op_id, "d_hosts": drop, "u_op": op_id, "u_now": time.time()}
            if drop:
                params |= _audit_row(actor, op_id, "release", drop, reason, prefix="a_")
            if parts:
                _run(c, [tuple(parts)], params)
            return drop

    def lease_repair(self, op_id: str, host: str, *, domain: str, reason: str, actor: str = "railyard",
                     detail: dict[str, Any] | None = None) -> bool:
        """A repair takes one broken host that nobody holds; never refused for capacity (it adds none).
        `detail` (the targets its gate brings it to) is recorded with the operation."""
        with self.engine.begin() as c:
            _lock(c)
            r = c.execute(select(leases.c.op_id).where(leases.c.host == host)).first()
            if r is not None:
                return bool(r.op_id == op_id)
            now = time.time()
            if c.execute(select(operations.c.id).where(operations.c.id == op_id)).first() is None:
                c.execute(insert(operations).values(
                    id=op_id, kind="repair", train=None, domain=domain, state="active", created_at=now,
                    updated_at=now, detail=json.dumps({"reason": reason, **(detail or {})})))
            c.execute(insert(leases).values(host=host, op_id=op_id, domain=domain, since=now, kind="repair"))
            _audit(c, actor, op_id, "lease", [host], f"repair: {reason}")
            return True

    def handover(self, hosts: Iterable[str], from_op: str, to_op: str, *, kind: str, reason: str,
                 actor: str = "railyard", detail: dict[str, Any] | None = None, domain: str | None = None) -> list[str]:
        """Pass leases from one operation to another without releasing them in between."""
        want = set(hosts)
        with self.engine.begin() as c:
            _lock(c, ops=[from_op, to_op])
            now = time.time()
            if c.execute(select(operations.c.id).where(operations.c.id == to_op)).first() is None:
                c.execute(
                    insert(operations).values(
                        id=to_op, kind=kind, train=None, domain=domain, state="active", created_at=now,
                        updated_at=now, detail=json.dumps(detail or {}),
                    )
                )
            held = [r.host for r in c.execute(_q("held"), {"r_op": from_op})]
            moved = sorted(h for h in held if h in want)
            if moved:
                c.execute(update(leases).where(leases.c.host.in_(moved), leases.c.op_id == from_op)
                          .values(op_id=to_op, kind=kind, since=now))
                _audit(c, actor, to_op, "handover", moved, f"from {from_op}: {reason}")
                if len(moved) == len(held) and from_op != to_op:  # from_op holds nothing any more
                    c.execute(update(operations).where(operations.c.id == from_op).values(state="done", updated_at=now))
        return moved

    def open_operation(self, op_id: str, *, kind: str, detail: dict[str, Any], actor: str, action: str, reason: str) -> bool:
        """Record an operation once (idempotent: a retried task does not record it twice)."""
        with self.engine.begin() as c:
            _lock(c)
            if c.execute(select(operations.c.id).where(operations.c.id == op_id)).first() is not None:
                return False
            now = time.time()
            c.execute(insert(operations).values(id=op_id, kind=kind, train=None, domain=None, state="active",
                                                created_at=now, updated_at=now, detail=json.dumps(detail)))
            _audit(c, actor, op_id, action, [], reason)
            return True

    def operations_like(self, prefix: str, state: str | None = None) -> list[dict[str, Any]]:
        q = select(operations).where(operations.c.id.startswith(prefix, autoescape=True)).order_by(operations.c.created_at)
        if state is not None:
            q = q.where(operations.c.state == state)
        with self.engine.connect() as c:
            return [dict(r._mapping) | {"detail": json.loads(r.detail or "{}")} for r in c.execute(q)]

    def record_dodge(self, op_id: str, *, train: str, domain: str, until: float, jobs: list[str]) -> bool:
        """Note that a domain's stop is postponed in this run; False if the op already exists."""
        with self.engine.begin() as c:
            _lock(c)
            if c.execute(select(operations.c.id).where(operations.c.id == op_id)).first() is not None:
                return False
            now = time.time()
            c.execute(
                insert(operations).values(
                    id=op_id, kind="train_stop", train=train, domain=domain, state="dodged", created_at=now,
                    updated_at=now, detail=json.dumps({"dodge_until": until, "jobs": jobs}),
                )
            )
            _audit(c, "railyard", op_id, "dodge", [], f"{domain} postponed for {', '.join(jobs)} until {until:.0f}")
            return True

    def mark_for_revisit(self, op_id: str, reason: str, actor: str = "railyard") -> None:
        """A stop that another operation took over comes back in a revisit slot, from scratch:
        a fresh checkpoint request and fresh health verdicts, not the ones of its first attempt."""
        with self.engine.begin() as c:
            _lock(c)
            r = c.execute(select(operations).where(operations.c.id == op_id)).first()
            if r is None:
                return
            detail = json.loads(r.detail or "{}")
            if detail.get("revisit"):
                return
            detail.pop("checkpoint_requested_at", None)
            detail.update(dodge_until=0, revisit=True)
            c.execute(update(operations).where(operations.c.id == op_id).values(
                state="dodged", detail=json.dumps(detail), updated_at=time.time()))
            c.execute(verifications.delete().where(verifications.c.op_id == op_id))
            _audit(c, actor, op_id, "revisit", [], reason)

    def claim_dodged(self, prefix: str, slot: str) -> dict[str, Any] | None:
        """The dodged stop of this run that `slot` revisits (the same one on every retry)."""
        with self.engine.begin() as c:
            _lock(c)
            q = select(operations).where(operations.c.id.startswith(prefix, autoescape=True)).order_by(
                operations.c.created_at
            )
            rows = [r for r in c.execute(q)]
            for r in rows:
                if json.loads(r.detail or "{}").get("slot") == slot:
                    return dict(r._mapping) | {"detail": json.loads(r.detail or "{}")}
            for r in rows:
                d = json.loads(r.detail or "{}")
                if r.state == "dodged" and "slot" not in d:
                    d["slot"] = slot
                    c.execute(update(operations).where(operations.c.id == r.id).values(detail=json.dumps(d)))
                    return dict(r._mapping) | {"detail": d}
        return None

    # ---- switches and visits -------------------------------------------------------------------
    def set_switch(self, name: str, on: bool, *, reason: str, actor: str) -> None:
        with self.engine.begin() as c:
            c.execute(switches.delete().where(switches.c.name == name))
            c.execute(insert(switches).values(name=name, value=int(on), reason=reason, actor=actor, at=time.time()))
            _audit(c, actor, None, f"{name}_{'on' if on else 'off'}", [], reason)

    def switch(self, name: str) -> dict[str, Any] | None:
        """The switch's state when on, else None."""
        with self.engine.connect() as c:
            r = c.execute(select(switches).where(switches.c.name == name)).first()
        return dict(r._mapping) if r is not None and r.value else None

    def record_visit(self, train: str, domain: str, at: float, op_id: str) -> None:
        with self.engine.begin() as c:
            c.execute(visits.delete().where(visits.c.train == train, visits.c.domain == domain))
            c.execute(insert(visits).values(train=train, domain=domain, at=at, op_id=op_id))

    def sample_capacity(self, at: float, serving: int, total: int, op_id: str | None = None) -> None:
        with self.engine.begin() as c:
            c.execute(insert(capacity_samples).values(at=at, serving=serving, total=total, op_id=op_id))

    def capacity_history(self, limit: int = 600) -> list[dict[str, Any]]:
        """The newest `limit` capacity samples, oldest first: {"t", "serving", "total", "op"}."""
        q = select(capacity_samples).order_by(capacity_samples.c.at.desc(), capacity_samples.c.id.desc()).limit(limit)
        with self.engine.connect() as c:
            rows = [{"t": r.at, "serving": r.serving, "total": r.total, "op": r.op_id} for r in c.execute(q)]
        return rows[::-1]

    def last_visits(self, train: str) -> dict[str, float]:
        with self.engine.connect() as c:
            return {r.domain: r.at for r in c.execute(select(visits).where(visits.c.train == train))}

    def run_failures(self, prefix: str) -> tuple[int, int, list[str]]:
        """(hosts leased, hosts offboarded, reasons) over every operation of one run."""
        like = audit.c.op_id.startswith(prefix, autoescape=True)
        with self.engine.connect() as c:
            leased: set[str] = set()
            failed: dict[str, str] = {}
            for r in c.execute(select(audit).where(like, audit.c.action.in_(("lease", "offboard")))):
                hosts = json.loads(r.hosts)
                if r.action == "lease":
                    leased.update(hosts)
                else:
                    failed.update({h: r.reason for h in hosts})
        return len(leased), len(failed), [f"{h}: {why}" for h, why in sorted(failed.items())]

    # ---- releases ----------------------------------------------------------------------------
    def release_state(self, release: str) -> dict[str, Any] | None:
        with self.engine.connect() as c:
            r = c.execute(select(release_states).where(release_states.c.release == release)).first()
        return None if r is None else dict(r._mapping)

    def set_release_state(self, release: str, *, phase: str, halted: bool, reason: str, actor: str,
                          fleet_now: float, action: str, promoted: bool = False, key: str | None = None) -> bool:
        """Phase and halt of a release, with an audit row (`action`: release_promote, _halt, _resume...).
        `key` (an Airflow run id) makes it idempotent: an action already recorded under that key is not
        applied again (a cleared and re-run task); returns whether it was applied."""
        with self.engine.begin() as c:
            _lock(c)
            if key is not None:
                if _action_done(c, release, key):
                    return False
                reason = f"{reason} [{key}]"
            old = c.execute(select(release_states).where(release_states.c.release == release)).first()
            since = fleet_now if promoted or old is None else old.promoted_at
            c.execute(release_states.delete().where(release_states.c.release == release))
            c.execute(insert(release_states).values(release=release, phase=phase, halted=int(halted), reason=reason,
                                                    actor=actor, promoted_at=since, at=time.time()))
            _audit(c, actor, f"release/{release}", action, [], f"{phase}{' HALTED' if halted else ''}: {reason}")
        return True

    def release_action_done(self, release: str, key: str) -> bool:
        """An action on `release` was recorded under `key` (see set_release_state)."""
        with self.engine.connect() as c:
            return _action_done(c, release, key)

    def record_release_result(self, release: str, host: str, op_id: str, passed: bool, reason: str, at: float) -> None:
        with self.engine.begin() as c:
            c.execute(release_results.delete().where(release_results.c.release == release,
                                                     release_results.c.host == host, release_results.c.op_id == op_id))
            c.execute(insert(release_results).values(release=release, host=host, op_id=op_id, passed=int(passed),
                                                     reason=reason, at=at))

    def release_results(self, release: str) -> list[dict[str, Any]]:
        with self.engine.connect() as c:
            q = select(release_results).where(release_results.c.release == release).order_by(release_results.c.at)
            return [dict(r._mapping) for r in c.execute(q)]

    # ---- records -----------------------------------------------------------------------------
    def record_verification(self, op_id: str, host: str, passed: bool, versions: dict[str, str], reason: str | None) -> None:
        with self.engine.begin() as c:
            c.execute(verifications.delete().where(verifications.c.op_id == op_id, verifications.c.host == host))
            c.execute(
                insert(verifications).values(
                    op_id=op_id, host=host, passed=int(passed), versions=json.dumps(versions, sort_keys=True),
                    reason=reason, at=time.time(),
                )
            )
            _audit(c, "railyard", op_id, "verified" if passed else "check_failed", [host], reason or "")

    def verification(self, op_id: str, host: str) -> tuple[bool, dict[str, str], str | None] | None:
        with self.engine.connect() as c:
            r = c.execute(
                select(verifications).where(verifications.c.op_id == op_id, verifications.c.host == host)
            ).first()
        return None if r is None else (bool(r.passed), json.loads(r.versions), r.reason)

    def detail(self, op_id: str) -> dict[str, Any]:
        op = self.operation(op_id)
        return {} if op is None else json.loads(op["detail"] or "{}")

    def set_detail_once(self, op_id: str, key: str, value: object) -> object:
        """Store `key` on the operation unless already there; returns the stored value.

        Lets a retried task reuse what its first attempt decided (e.g. the checkpoint request time).
        """
        def once(detail: dict[str, Any]) -> bool:
            if key in detail:
                return False
            detail[key] = value
            return True

        return self._change_detail(op_id, once)[key]

    def add_detail_entries(self, op_id: str, key: str, entries: Mapping[str, object]) -> dict[str, object]:
        """Add to the mapping `key` of the operation the entries it does not have yet (an entry once stored is
        never changed); returns the mapping as stored."""
        def add(detail: dict[str, Any]) -> bool:
            have = detail.setdefault(key, {})
            new = {k: v for k, v in entries.items() if k not in have}
            have.update(new)
            return bool(new)

        return dict(self._change_detail(op_id, add)[key])

    def _change_detail(self, op_id: str, change: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        """The operation's detail, changed in place by `change` under the ledger lock and written back if it
        says it changed something; returns the detail as stored."""
        with self.engine.begin() as c:
            _lock(c)
            r = c.execute(select(operations.c.detail).where(operations.c.id == op_id)).first()
            if r is None:
                raise KeyError(f"unknown operation {op_id!r}")
            detail: dict[str, Any] = json.loads(r.detail or "{}")
            if change(detail):
                c.execute(
                    update(operations).where(operations.c.id == op_id).values(detail=json.dumps(detail), updated_at=time.time())
                )
            return detail

    def note(self, op_id: str | None, action: str, hosts: Iterable[str], reason: str, actor: str = "railyard") -> None:
        with self.engine.begin() as c:
            _audit(c, actor, op_id, action, list(hosts), reason)

    def holdings(self, op_id: str | None = None) -> dict[str, str]:
        """host -> op id, for one operation or all."""
        q = select(leases.c.host, leases.c.op_id)
        if op_id is not None:
            q = q.where(leases.c.op_id == op_id)
        with self.engine.connect() as c:
            return {r.host: r.op_id for r in c.execute(q)}

    def domains_out(self) -> dict[str, str]:
        """domain -> op id holding it."""
        with self.engine.connect() as c:
            return {r.domain: r.op_id for r in c.execute(select(leases.c.domain, leases.c.op_id).distinct())}

    def operation(self, op_id: str) -> dict[str, Any] | None:
        with self.engine.connect() as c:
            r = c.execute(select(operations).where(operations.c.id == op_id)).first()
        return None if r is None else dict(r._mapping)

    def audit_rows(self, op_id: str | None = None, limit: int = 1000) -> list[dict[str, Any]]:
        q = select(audit).order_by(audit.c.id)
        if op_id is not None:
            q = q.where(audit.c.op_id == op_id)
        with self.engine.connect() as c:
            rows = [dict(r._mapping) for r in c.execute(q.limit(limit))]
        for r in rows:
            r["hosts"] = json.loads(r["hosts"])
        return rows

    def audit_count(self) -> int:
        with self.engine.connect() as c:
            return int(c.execute(select(func.count()).select_from(audit)).scalar_one())

    # ---- what an operator reads and does (railyard ops / host / lease release / reconcile) --------------
    def active_operations(self) -> list[dict[str, Any]]:
        """Active operations, oldest first, each with `hosts` (held now) and `last` (its last audit row)."""
        with self.engine.connect() as c:
            ops = [dict(r._mapping) for r in c.execute(
                select(operations).where(operations.c.state == "active").order_by(operations.c.created_at))]
            ids = [o["id"] for o in ops]
            held: dict[str, list[str]] = {}
            last: dict[str, dict[str, Any]] = {}
            for i in range(0, len(ids), 500):
                chunk = ids[i:i + 500]
                for r in c.execute(select(leases.c.op_id, leases.c.host).where(leases.c.op_id.in_(chunk))):
                    held.setdefault(r.op_id, []).append(r.host)
                newest = (select(func.max(audit.c.id)).where(audit.c.op_id.in_(chunk)).group_by(audit.c.op_id)
                          .scalar_subquery())
                for r in c.execute(select(audit).where(audit.c.id.in_(newest))):
                    last[r.op_id] = dict(r._mapping) | {"hosts": json.loads(r.hosts)}
        for o in ops:
            o["detail"] = json.loads(o["detail"] or "{}")
            o["hosts"] = sorted(held.get(o["id"], []))
            o["last"] = last.get(o["id"])
        return ops

    def finish_operation(self, op_id: str, *, reason: str, actor: str = "railyard") -> bool:
        """Mark an active operation that holds nothing done, with an audit row; False if it holds hosts."""
        with self.engine.begin() as c:
            _lock(c, ops=[op_id])
            if c.execute(select(leases.c.host).where(leases.c.op_id == op_id).limit(1)).first() is not None:
                return False
            r = c.execute(update(operations).where(operations.c.id == op_id, operations.c.state == "active")
                          .values(state="done", updated_at=time.time()))
            if r.rowcount:
                _audit(c, actor, op_id, "finish", [], reason)
            return True

    def host_history(self, host: str, limit: int = 500) -> dict[str, Any]:
        """One host's record: who holds it now, every audit row that names it, and every check of it
        (verdict, versions seen, evidence), oldest first."""
        with self.engine.connect() as c:
            lease = c.execute(select(leases).where(leases.c.host == host)).first()
            rows = [dict(r._mapping) for r in c.execute(
                select(audit).where(audit.c.hosts.contains(json.dumps(host), autoescape=True))
                .order_by(audit.c.id.desc()).limit(limit))]
            checks = [dict(r._mapping) for r in c.execute(
                select(verifications).where(verifications.c.host == host).order_by(verifications.c.at))]
        events = []
        for r in reversed(rows):
            hosts = json.loads(r["hosts"])
            if host in hosts:  # `contains` also matches a name that merely includes this one in quotes
                events.append(r | {"hosts": hosts})
        for ch in checks:
            ch["versions"] = json.loads(ch["versions"])
            ch["passed"] = bool(ch["passed"])
        return {"host": host, "lease": None if lease is None else dict(lease._mapping), "events": events,
                "checks": checks}


def _action_done(c: Connection, release: str, key: str) -> bool:
    q = select(audit.c.id).where(audit.c.op_id == f"release/{release}",
                                 audit.c.reason.endswith(f" [{key}]", autoescape=True)).limit(1)
    return c.execute(q).first() is not None


def _lock(c: Connection, ops: Collection[str] = ()) -> None:
    """Take the ledger lock: every change of leases or waiters is made under it, one at a time.
    On PostgreSQL, then lock the rows of the operations `ops` too (those whose leases the change
    may move): `release` takes only its operation's row, not the ledger lock."""
    _run(c, ["lock", "ops_lock"] if ops else ["lock"], {"l_ops": sorted(set(ops))})


# At most this many unavailable hosts have their leases read by `acquire_domain`; beyond, they are
# counted without looking (an upper bound), and a refusal is judged again on every lease.
_LOOKUP_MAX = 2000


@dataclass
class _View:
    """What `acquire_domain` decides on, read in one query under the lock."""

    rows: dict[str, tuple[str, str]] = field(default_factory=dict)  # host -> (op id, kind), for the hosts asked
    domains_out: set[str] = field(default_factory=set)  # domains with a lease that is not a repair
    n_maint: int = 0  # leases that are not repairs
    n_repair: int = 0  # leases to repairs
    ahead: tuple[str, float] | None = None  # the first live waiter of a higher priority: (op id, since)
    waiting: bool = False  # the operation has a row among the waiters
    op_exists: bool = False  # the operation is recorded


def _lock_and_read_view(c: Connection, ops: Collection[str], op_id: str, priority: int, now: float,
                        hosts: Sequence[str]) -> _View:
    """`_lock(c, ops)` then `_read_view`, in one round trip on PostgreSQL with psycopg2 (`_run`)."""
    params = _view_params(op_id, priority, now, hosts) | {"l_ops": sorted(set(ops))}
    return _view_of(_run(c, ["lock", "ops_lock", "view_any"], params))


def _view_params(op_id: str, priority: int, now: float, hosts: Sequence[str]) -> dict[str, Any]:
    return {"v_op": op_id, "v_prio": priority, "v_cutoff": now - WAITER_TTL_S, "v_hosts": list(hosts)}


def _read_view(c: Connection, op_id: str, priority: int, now: float, hosts: Sequence[str]) -> _View:
    """One round trip: the leases of `hosts`, lease counts per kind and domain, the waiter ahead, and
    whether the operation is recorded and waiting. Rows are tagged; every part is a key lookup or
    an aggregate, so what comes back does not grow with the leases other operations hold."""
    return _view_of(c.execute(_q("view_hosts" if hosts else "view"), _view_params(op_id, priority, now, hosts)))


def _view_of(result: Iterable[Any]) -> _View:
    v = _View()
    for t, a, b, k, n in result:
        if t == "w":
            v.rows[a] = (b, k)
        elif t == "m":
            v.domains_out.add(a)
            v.n_maint += int(n)
        elif t == "r":
            v.n_repair = int(n or 0)
        elif t == "a":
            v.ahead = (a, float(n))
        elif t == "q":
            v.waiting = True
        elif t == "o":
            v.op_exists = True
    return v


def _judge(budget: Budget, domain: str, taking: list[str], n_broken: int, n_held: int) -> tuple[str, str] | None:
    """The buffer checks of `acquire_domain`, in order: None when they pass, else (outcome, reason)."""
    if n_broken > budget.failure_hosts:
        return "stop", f"failure buffer exhausted: {n_broken} hosts broken, in repair or out with no lease > budget {budget.failure_hosts}"
    if n_held + len(taking) > budget.maintenance_hosts:
        return "wait", (f"maintenance buffer: {n_held} hosts out + {len(taking)} of {domain} > budget "
                        f"{budget.maintenance_hosts}")
    floor = budget.total_hosts - budget.maintenance_hosts - budget.failure_hosts
    serving_after = budget.total_hosts - n_held - n_broken - len(taking)
    if serving_after < floor:
        return "wait", f"serving would drop to {serving_after} < floor {floor}"
    return None


def _write_grant(c: Connection, v: _View, *, op_id: str, kind: str, train: str, domain: str, now: float,
                 taking: list[str] | None, actor: str = "railyard") -> None:
    """What a grant writes: the operation (new, or active again), off the waiters, its new leases and
    the audit row (`taking` None: a takeover that left nothing to lease, which writes neither)."""
    parts = ["op_active" if v.op_exists else "op_insert"] + (["waiter_drop"] if v.waiting else [])
    params: dict[str, Any] = {"o_id": op_id, "o_kind": kind, "o_train": train, "o_domain": domain, "o_now": now,
                              "x_op": op_id}
    if taking is not None:
        parts += (["lease_insert"] if taking else []) + ["audit"]
        params |= {"l_hosts": taking, "l_op": op_id, "l_domain": domain, "l_since": now, "l_kind": kind}
        params |= _audit_row(actor, op_id, "lease", taking, f"took {domain} for {train}", prefix="a_")
    _run(c, [tuple(parts)], params)


_Key = str | tuple[str, ...]  # a statement of `_q`, or writes to run together (names of `_q`)


def _run(c: Connection, keys: Sequence[_Key], params: dict[str, Any]) -> Any:
    """Run statements in order and return the last one's result. A tuple of writes (they touch
    different rows) is one statement on PostgreSQL: the others become data-modifying CTEs of the last.

    With psycopg2 every key is a server-side prepared statement (prepared once per connection: no
    parsing or planning per call), and all of them go in one round trip, as one multi-statement
    query. Each statement of such a query takes its own snapshot, so a read after a lock sees what
    was committed before the lock was granted, as with separate round trips. Fewer round trips
    matter most while the ledger lock is held: every other writer waits for them."""
    if c.dialect.name == "postgresql":  # the ledger lock as a row lock: no new row version, less log
        keys = ["lock_row" if k == "lock" else k for k in keys]
    if c.dialect.name == "postgresql" and c.dialect.driver == "psycopg2":
        texts = [_prepared(c, k) for k in keys]
        return c.exec_driver_sql("; ".join(t for t, _ in texts), {k: v for _, d in texts for k, v in d.items()} | params)
    pg = c.dialect.name == "postgresql"
    result = None
    for key in keys:
        if isinstance(key, tuple) and pg and len(key) > 1:
            result = c.execute(_combined(key), params)
            continue
        for name in key if isinstance(key, tuple) else (key,):
            if name == "ops_lock" and not pg:  # SQLite: one writer at a time already
                continue
            if name == "view_any" and not pg:  # SQLite has no arrays: an IN list
                name = "view_hosts" if params["v_hosts"] else "view"
            if name == "drop_some_any" and not pg:
                name = "drop_some"
            if name == "lease_insert" and not pg:
                result = c.execute(_q("lease_row"), [{"l_host": h, **params} for h in params["l_hosts"]])
            else:
                result = c.execute(_q(name), params)
    return result


def _prepared(c: Connection, key: _Key) -> tuple[str, dict[str, Any]]:
    """(EXECUTE text with psycopg2 placeholders, fixed parameters) of `key`, prepared on this connection
    first if it is not yet (the pool keeps `info` per DBAPI connection and clears it on reconnect)."""
    name, prepare, execute, fixed = _pg_text(key)
    done = c.connection.info.setdefault("railyard_prepared", set())
    if name not in done:
        cur = c.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        try:
            cur.execute(prepare)  # no parameters: the text goes as it is
        finally:
            cur.close()
        done.add(name)
    return execute, fixed


@functools.cache
def _pg_text(key: _Key) -> tuple[str, str, str, dict[str, Any]]:
    """(name, PREPARE, EXECUTE, fixed parameters) of a statement, from its SQLAlchemy form."""
    from sqlalchemy.dialects.postgresql.psycopg2 import dialect as psycopg2_dialect

    stmt = _combined(key) if isinstance(key, tuple) and len(key) > 1 else _q(key[0] if isinstance(key, tuple) else key)
    compiled = stmt.compile(dialect=psycopg2_dialect())  # type: ignore[no-untyped-call]
    names = list(dict.fromkeys(re.findall(r"%\((\w+)\)s", compiled.string)))
    body = re.sub(r"%\((\w+)\)s", lambda m: f"${names.index(m.group(1)) + 1}", compiled.string).replace("%%", "%")
    name = "railyard_" + hashlib.sha1(body.encode()).hexdigest()[:16]
    # Values SQLAlchemy fixed (literals such as 'repair') are passed under names of this statement's own,
    # so that two statements of one multi-statement query never mix theirs up.
    fixed = {f"{name}_{k}": v for k, v in compiled.params.items() if v is not None}
    args = [f"%({name}_{n})s" if f"{name}_{n}" in fixed else f"%({n})s" for n in names]
    execute = f"EXECUTE {name}({', '.join(args)})" if names else f"EXECUTE {name}"
    return name, f"PREPARE {name} AS {body}", execute, fixed


@functools.cache
def _combined(parts: tuple[str, ...]) -> Any:
    *first, last = (_q(p) for p in parts)
    return last.add_cte(*(s.cte(f"w{i}") for i, s in enumerate(first)))


@functools.cache
def _q(name: str) -> Any:
    """The hot paths' statements, built once with named parameters (building a statement costs more
    than running it)."""
    p = bindparam
    if name == "lock":
        return update(ledger_lock).where(ledger_lock.c.id == 1).values(n=ledger_lock.c.n + 1)
    if name == "lock_row":
        return select(ledger_lock.c.id).where(ledger_lock.c.id == 1).with_for_update()
    if name == "ops_lock":  # in one order, so two lockers cannot each hold what the other waits for
        return (select(operations.c.id).where(operations.c.id == func.any(p("l_ops", type_=ARRAY(String))))
                .order_by(operations.c.id).with_for_update())
    if name == "op_row_lock":
        return select(operations.c.id).where(operations.c.id == p("r_op")).with_for_update()
    if name == "held":
        return select(leases.c.host).where(leases.c.op_id == p("r_op"))
    if name in ("view", "view_hosts", "view_any"):
        def tag(t: str) -> Any:
            return literal_column(f"'{t}'").label("t")

        none_s, none_k, none_f = null().label("b"), null().label("k"), cast(null(), Float).label("n")
        ahead = (
            select(waiters.c.op_id, waiters.c.since)
            .where(waiters.c.priority > p("v_prio"), waiters.c.seen_at > p("v_cutoff", type_=Float),
                   waiters.c.op_id != p("v_op"))
            .order_by(waiters.c.since)
            .limit(1)
            .subquery()
        )
        parts = [
            select(tag("m"), leases.c.domain.label("a"), none_s, none_k, cast(func.count(), Float).label("n"))
            .select_from(leases).where(text(_NOT_REPAIR)).group_by(leases.c.domain),
            select(tag("r"), null().label("a"), none_s, none_k, cast(func.count(), Float).label("n"))
            .select_from(leases).where(text(_REPAIR)),
            select(tag("a"), ahead.c.op_id.label("a"), none_s, none_k, cast(ahead.c.since, Float).label("n")),
            select(tag("q"), waiters.c.op_id.label("a"), none_s, none_k, none_f).where(waiters.c.op_id == p("v_op")),
            select(tag("o"), operations.c.id.label("a"), none_s, none_k, none_f).where(operations.c.id == p("v_op")),
        ]
        if name != "view":
            host_in = (leases.c.host.in_(p("v_hosts", expanding=True)) if name == "view_hosts"
                       else leases.c.host == func.any(p("v_hosts", type_=ARRAY(String))))
            parts.append(select(tag("w"), leases.c.host.label("a"), leases.c.op_id.label("b"),
                                leases.c.kind.label("k"), none_f).where(host_in))
        return union_all(*parts)
    if name == "waiter_insert":
        return insert(waiters).values(op_id=p("w_op"), priority=p("w_prio"), since=p("w_now", type_=Float),
                                      seen_at=p("w_now", type_=Float))
    if name == "waiter_seen":
        return update(waiters).where(waiters.c.op_id == p("w_op")).values(seen_at=p("w_now", type_=Float))
    if name == "waiter_drop":
        return waiters.delete().where(waiters.c.op_id == p("x_op"))
    if name == "op_insert":
        return insert(operations).values(id=p("o_id"), kind=p("o_kind"), train=p("o_train"), domain=p("o_domain"),
                                         state="active", created_at=p("o_now", type_=Float),
                                         updated_at=p("o_now", type_=Float), detail="{}")
    if name == "op_active":
        return update(operations).where(operations.c.id == p("o_id")).values(state="active",
                                                                             updated_at=p("o_now", type_=Float))
    if name == "op_done":
        return (update(operations).where(operations.c.id == p("u_op"), operations.c.state == "active")
                .values(state="done", updated_at=p("u_now", type_=Float)))
    if name == "lease_insert":  # PostgreSQL: every host in one parameter, so it can go into a combined write
        return insert(leases).from_select(
            ["host", "op_id", "domain", "since", "kind"],
            select(func.unnest(p("l_hosts", type_=ARRAY(String))), p("l_op", type_=String),
                   p("l_domain", type_=String), p("l_since", type_=Float), p("l_kind", type_=String)),
        )
    if name == "lease_row":
        return insert(leases).values(host=p("l_host"), op_id=p("l_op"), domain=p("l_domain"),
                                     since=p("l_since", type_=Float), kind=p("l_kind"))
    if name == "drop_all":
        return leases.delete().where(leases.c.op_id == p("d_op"))
    if name == "drop_some":
        return leases.delete().where(leases.c.op_id == p("d_op"), leases.c.host.in_(p("d_hosts", expanding=True)))
    if name == "drop_some_any":  # PostgreSQL: the hosts as one array parameter (preparable)
        return leases.delete().where(leases.c.op_id == p("d_op"),
                                     leases.c.host == func.any(p("d_hosts", type_=ARRAY(String))))
    if name == "audit":
        return insert(audit).values(at=p("a_at", type_=Float), actor=p("a_actor"), op_id=p("a_op_id"),
                                    action=p("a_action"), hosts=p("a_hosts"), reason=p("a_reason"))
    raise KeyError(name)


def _host_set(hosts: Iterable[str] | None) -> Collection[str] | None:
    if hosts is None or isinstance(hosts, set | frozenset):
        return hosts
    return set(hosts)


def _audit_row(actor: str, op_id: str | None, action: str, hosts: list[str], reason: str,
               prefix: str = "") -> dict[str, Any]:
    return {f"{prefix}at": time.time(), f"{prefix}actor": actor, f"{prefix}op_id": op_id, f"{prefix}action": action,
            f"{prefix}hosts": json.dumps(hosts), f"{prefix}reason": reason}


def _audit(c: Connection, actor: str, op_id: str | None, action: str, hosts: list[str], reason: str) -> None:
    c.execute(_q("audit"), _audit_row(actor, op_id, action, hosts, reason, prefix="a_"))


def _create_missing_indexes(engine: Engine) -> None:
    """`create_all` makes a missing table with its indexes, but adds none to a table that exists:
    a ledger made by an older Railyard gets them here, once."""
    with engine.begin() as c:
        insp = inspect(c)
        for t in metadata.sorted_tables:
            if not t.indexes:
                continue
            have = {ix["name"] for ix in insp.get_indexes(t.name)}
            for ix in sorted(t.indexes, key=lambda i: str(i.name)):
                if ix.name not in have:
                    ix.create(c)


def _already_exists(exc: DBAPIError) -> bool:
    """Another process created the same table or index at the same moment."""
    text = str(exc)
    return "already exists" in text or "duplicate key value" in text


# What bounds a PostgreSQL client that stops mid-transaction (killed, frozen, partitioned): the server ends a
# session idle in a transaction after IDLE_IN_TRANSACTION_S, so the fleet-wide ledger lock it held goes with it
# and the other writers go on (its uncommitted lease rows go too: no domain is out twice). A writer waits for
# a lock at most LOCK_TIMEOUT_S, then fails with an error (its task retries) rather than hang. TCP keepalives
# on both ends drop a silent peer in about a minute, not the kernel's two hours. A URL's own `options`
# (`?options=-c lock_timeout=10s`) and `keepalives*` parameters win over these.
LOCK_TIMEOUT_S = 60
IDLE_IN_TRANSACTION_S = 30
PG_KEEPALIVES = {"keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10, "keepalives_count": 3}


def pg_connect_args(url: str) -> dict[str, Any]:
    """psycopg2's connect arguments for the ledger: the bounds above, under what the URL itself sets."""
    query = make_url(url).query
    ours = (f"-c lock_timeout={LOCK_TIMEOUT_S * 1000} -c idle_in_transaction_session_timeout="
            f"{IDLE_IN_TRANSACTION_S * 1000} -c tcp_keepalives_idle=30 -c tcp_keepalives_interval=10 "
            "-c tcp_keepalives_count=3")
    theirs = query.get("options", "")
    theirs = theirs if isinstance(theirs, str) else " ".join(theirs)
    args: dict[str, Any] = {k: v for k, v in PG_KEEPALIVES.items() if k not in query}
    args["options"] = f"{ours} {theirs}".strip()  # PostgreSQL applies them in order: the URL's last
    return args


def _make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        eng = create_engine(url, connect_args={"timeout": 60})

        @event.listens_for(eng, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA busy_timeout=60000")
            cur.close()

        return eng
    eng = create_engine(url, connect_args=pg_connect_args(url))

    @event.listens_for(eng, "checkin")
    def _returned(_dbapi_conn: Any, record: Any) -> None:
        record.info["railyard_used"] = time.monotonic()

    @event.listens_for(eng, "checkout")
    def _ping_when_idle(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
        """pool_pre_ping, but only for a connection idle for a while: one that was just used is alive,
        and a ping per checkout is a round trip per ledger call."""
        last = record.info.get("railyard_used")
        if last is not None and time.monotonic() - last > _PING_IDLE_S:
            try:
                eng.dialect.do_ping(dbapi_conn)
            except Exception as exc:  # the pool drops it and checks out a fresh one
                raise DisconnectionError(f"ledger connection lost while idle: {exc}") from exc

    return eng


_PING_IDLE_S = ledger_pg.PING_IDLE_S
