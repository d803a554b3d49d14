"""The ledger's tables, and the statements its parts run on them (built once, prepared on PostgreSQL)."""

from __future__ import annotations

import functools
import hashlib
import json
import re
import time
from collections.abc import Callable, Collection, Iterable, Sequence
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
    and_,
    bindparam,
    cast,
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
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError, OperationalError

from railyard.domain.urls import LedgerError, safe_url

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
    Column("op_id", String(255), nullable=False),
    Column("domain", String(128), nullable=False),
    Column("since", Float, nullable=False),
    Column("kind", String(32), nullable=False, default="train_stop"),  # repairs are not domains out
    # Domains out and hosts in repair, counted from an index of their own kind of lease: the leases of
    # maintenance come and go with every stop, and a scan of the table would read their dead rows too.
    # An operation's hosts from the index alone (a domain's thousands of leases without a lookup each).
    Index("ix_leases_op_host", "op_id", "host"),
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


# Each host's versions as its stop found them before the upgrade (the check's `verifications` are the after):
# the run report's before and after.
versions_before = Table(
    "versions_before",
    metadata,
    Column("op_id", String(255), primary_key=True),
    Column("host", String(128), primary_key=True),
    Column("versions", Text, nullable=False),
    Column("at", Float, nullable=False),
)


# The report of every run of a train or of the emergency train (railyard.operations.runreport), written by its
# last task, or by the reconciler for a run that ended without one.
run_reports = Table(
    "run_reports",
    metadata,
    Column("run", String(255), primary_key=True),  # train/run_id, emergency/run_id
    Column("train", String(128), nullable=False),
    Column("run_id", String(255), nullable=False),
    Column("outcome", String(32), nullable=False),
    Column("at", Float, nullable=False),  # wall clock of the write
    Column("summary", Text, nullable=False),  # what a list of runs shows, without reading each whole report
    Column("body", Text, nullable=False),
    Index("ix_run_reports_at", "at"),
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
    Index("ix_audit_action", "action"),  # the metrics' counters: offboards, escalations
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


# The fleet's hosts counted by (sku, state) and by (component, version), per domain, as a task last read them (a
# stop's drain and return its own domain's, each reconcile the whole fleet's): what `/railyard/metrics` serves
# without asking the fleet at each scrape. (Ledgers made before counts were kept per domain also hold an unused
# table `fleet_counts`.)
fleet_counts = Table(
    "fleet_domain_counts",
    metadata,
    Column("domain", String(128), primary_key=True),  # "" for hosts no domain names, and the clock
    Column("kind", String(16), primary_key=True),  # state | version | unheld_out | clock
    Column("a", String(128), primary_key=True),  # sku | component
    Column("b", String(128), primary_key=True),  # state | version
    Column("n", Float, nullable=False),
    Column("at", Float, nullable=False),  # wall clock of the read
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


visits = Table(
    "visits",
    metadata,
    Column("train", String(128), primary_key=True),
    Column("domain", String(128), primary_key=True),
    Column("at", Float, nullable=False),  # fleet clock
    Column("op_id", String(255), nullable=False),
)


# Rollout of each release (railyard.operations.releases): its phase and whether it is halted, and the outcome of
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


# Indexes an older Railyard made that a newer one covers: each costs a write on every lease taken.
_REPLACED_INDEXES = {"leases": ("ix_leases_op_id",)}  # by ix_leases_op_host


def _create_missing_indexes(engine: Engine) -> None:
    """`create_all` makes a missing table with its indexes, but adds none to a table that exists:
    a ledger made by an older Railyard gets them here, once, and loses those they replace."""
    with engine.begin() as c:
        insp = inspect(c)
        for t in metadata.sorted_tables:
            if not t.indexes:
                continue
            have = {ix["name"] for ix in insp.get_indexes(t.name)}
            for ix in sorted(t.indexes, key=lambda i: str(i.name)):
                if ix.name not in have:
                    ix.create(c)
            for name in _REPLACED_INDEXES.get(t.name, ()):
                if name in have:  # IF EXISTS: another process starting at the same moment may drop it first
                    c.execute(text(f"DROP INDEX IF EXISTS {c.dialect.identifier_preparer.quote(name)}"))


def _already_exists(exc: DBAPIError) -> bool:
    """Another process created the same table or index at the same moment."""
    text = str(exc)
    return "already exists" in text or "duplicate key value" in text


def _lock(c: Connection, ops: Collection[str] = ()) -> None:
    """Take the ledger lock: every change of leases or waiters is made under it, one at a time.
    On PostgreSQL, then lock the rows of the operations `ops` too (those whose leases the change
    may move): `release` takes only its operation's row, not the ledger lock."""
    _run(c, ["lock", "ops_lock"] if ops else ["lock"], {"l_ops": sorted(set(ops))})


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
        return c.exec_driver_sql("; ".join(t for t, _ in texts),
                                 {k: v for _, d in texts for k, v in d.items()} | params)
    pg = c.dialect.name == "postgresql"
    result = None
    for key in keys:
        if isinstance(key, tuple) and pg and len(key) > 1:
            result = c.execute(_combined(key), params)
            continue
        for name in key if isinstance(key, tuple) else (key,):
            if name == "ops_lock" and not pg:  # SQLite: one writer at a time already
                continue
            if name == "view_any" and not pg:  # SQLite has no arrays: the hosts as one JSON array
                name = "view_hosts" if params["v_hosts"] else "view"
                params = params | {"v_hosts_json": json.dumps(params["v_hosts"])}
            if name == "drop_some_any" and not pg:
                name = "drop_some"
                params = params | {"d_hosts_json": json.dumps(params["d_hosts"])}
            if name == "lease_insert" and not pg:  # every host in one JSON array parameter, as on PostgreSQL
                result = c.execute(_q("lease_insert_json"), params | {"l_hosts_json": json.dumps(params["l_hosts"])})
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
            host_in = (leases.c.host.in_(_json_values(p("v_hosts_json", type_=Text))) if name == "view_hosts"
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
    if name == "lease_insert_json":  # SQLite: the same, the hosts as a JSON array
        return insert(leases).from_select(
            ["host", "op_id", "domain", "since", "kind"],
            select(literal_column("value"), p("l_op", type_=String), p("l_domain", type_=String),
                   p("l_since", type_=Float), p("l_kind", type_=String)).select_from(
                func.json_each(p("l_hosts_json", type_=Text))),
        )
    if name == "drop_all":
        return leases.delete().where(leases.c.op_id == p("d_op"))
    if name == "drop_some":  # SQLite: the hosts as a JSON array
        return leases.delete().where(leases.c.op_id == p("d_op"),
                                     leases.c.host.in_(_json_values(p("d_hosts_json", type_=Text))))
    if name == "drop_some_any":  # PostgreSQL: the hosts as one array parameter (preparable)
        return leases.delete().where(leases.c.op_id == p("d_op"),
                                     leases.c.host == func.any(p("d_hosts", type_=ARRAY(String))))
    if name == "audit":
        return insert(audit).values(at=p("a_at", type_=Float), actor=p("a_actor"), op_id=p("a_op_id"),
                                    action=p("a_action"), hosts=p("a_hosts"), reason=p("a_reason"))
    raise KeyError(name)


def among(c: Connection, column: Any, values: Iterable[str]) -> Any:
    """`column IN values` with the values in one parameter, however many: a JSON array SQLite opens with
    json_each, an array on PostgreSQL. SQLAlchemy's IN list binds each value as a parameter of its own, and
    naming them costs ~12 µs a value: 45 ms for a domain of 3,840 hosts, in every statement that names them."""
    vals = list(values)
    if c.dialect.name == "postgresql":
        return column == func.any(bindparam(None, vals, type_=ARRAY(String)))
    return column.in_(_json_values(bindparam(None, json.dumps(vals), type_=Text)))


def with_prefix(c: Connection, column: Any, prefix: str) -> Any:
    """`column` starts with `prefix`. SQLite's LIKE ignores the case of ASCII letters and no index serves it,
    so there the condition is also the range of strings that start with `prefix` (its BINARY order), which
    the column's index reads alone. (On PostgreSQL the same range is not safe: a linguistic collation need
    not keep the strings that share a prefix together.)"""
    like = column.startswith(prefix, autoescape=True)
    if c.dialect.name != "sqlite" or not prefix:
        return like
    return and_(like, column >= prefix, column < prefix[:-1] + chr(ord(prefix[-1]) + 1))


def insert_for_hosts(c: Connection, table: Any, hosts: Sequence[str], **same: Any) -> None:
    """One row of `table` per host of `hosts`, every other column the same (`same`), in one statement with the
    hosts in one parameter (`among`'s way): a row per host bound by SQLAlchemy costs ~4 µs, 15 ms for a
    domain of 3,840 hosts."""
    if not hosts:
        return
    cols = list(same)
    consts = [bindparam(None, same[k], type_=table.c[k].type) for k in cols]
    if c.dialect.name == "postgresql":
        rows = select(func.unnest(bindparam(None, list(hosts), type_=ARRAY(String))), *consts)
    else:
        rows = _json_values(bindparam(None, json.dumps(list(hosts)), type_=Text)).add_columns(*consts)
    c.execute(insert(table).from_select(["host", *cols], rows))


def _json_values(param: Any) -> Any:
    """The strings of a JSON array parameter, as a one-column subquery (SQLite)."""
    return select(literal_column("value")).select_from(func.json_each(param))


def _host_set(hosts: Iterable[str] | None) -> Collection[str] | None:
    if hosts is None or isinstance(hosts, set | frozenset):
        return hosts
    return set(hosts)


def _audit_row(at: float, actor: str, op_id: str | None, action: str, hosts: list[str], reason: str,
               prefix: str = "") -> dict[str, Any]:
    return {f"{prefix}at": at, f"{prefix}actor": actor, f"{prefix}op_id": op_id, f"{prefix}action": action,
            f"{prefix}hosts": json.dumps(hosts), f"{prefix}reason": reason}


def _audit(c: Connection, at: float, actor: str, op_id: str | None, action: str, hosts: list[str], reason: str) -> None:
    c.execute(_q("audit"), _audit_row(at, actor, op_id, action, hosts, reason, prefix="a_"))


def _action_done(c: Connection, release: str, key: str) -> bool:
    q = select(audit.c.id).where(audit.c.op_id == f"release/{release}",
                                 audit.c.reason.endswith(f" [{key}]", autoescape=True)).limit(1)
    return c.execute(q).first() is not None


WAITER_TTL_S = 30.0


PRIORITY = {"train_stop": 10, "emergency": 100}
