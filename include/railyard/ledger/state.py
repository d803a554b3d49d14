"""Railyard's own records about the fleet, kept in the ledger's database: one state store.

Tasks run on any worker (Celery on several machines), so nothing a later task needs may live in a
local file. The SSH fleet's host states, checks and events, the Slurm backend's node records,
checkpoint requests and notes, and the test stand-in's versions and work all live here, in the same
database as the ledger (SQLite by default, PostgreSQL when `ledger.url` says so).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
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
    delete,
    insert,
    select,
    update,
)
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from railyard.ledger.schema import create_tables
from railyard.ledger.url import _make_engine, resolve_url

metadata = MetaData()

# ---- the SSH backend: Railyard's own host states (plain hosts have no scheduler to ask) -------------
ssh_hosts = Table(
    "ssh_hosts", metadata,
    Column("name", String(128), primary_key=True),
    Column("domain", String(128), nullable=False),
    Column("sku", String(64), nullable=False),
    Column("state", String(16), nullable=False),
    Column("operation", String(255)),
    Column("reason", Text),
    Column("last_error", Text),
    Column("versions", Text, nullable=False, default="{}"),
    Column("versions_at", Float, nullable=False, default=0.0),
    Column("steps", Text),
    Column("expected", Text),
    Column("since", Float, nullable=False),
)
ssh_checks = Table(
    "ssh_checks", metadata,
    Column("op", String(255), primary_key=True),
    Column("host", String(128), primary_key=True),
    Column("status", String(16), nullable=False),
    Column("reason", Text),
    Column("versions", Text, nullable=False),
    Column("verdicts", Text, nullable=False),
    Column("at", Float, nullable=False),
)
fleet_events = Table(  # every state change of a host Railyard keeps the state of: the audit of domains out
    "fleet_events", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("at", Float, nullable=False),
    Column("host", String(128), nullable=False),
    Column("domain", String(128), nullable=False),
    Column("from_state", String(16)),
    Column("to_state", String(16), nullable=False),
    Column("op", String(255)),
    Column("reason", Text),
)

# ---- the Slurm backend: what Slurm does not keep for us -------------------------------------------
records = Table(  # small JSON records by kind and key: slurm node records, checkpoint requests, ...
    "fleet_records", metadata,
    Column("kind", String(32), primary_key=True),
    Column("key", String(255), primary_key=True),
    Column("data", Text, nullable=False),
    Column("at", Float, nullable=False),
)
notes = Table(  # what a run reports beyond the ledger (requeues, losses, replays)
    "fleet_notes", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("at", Float, nullable=False),
    Column("kind", String(64), nullable=False),
    Column("data", Text, nullable=False),
)
Index("ix_fleet_notes_kind", notes.c.kind)

state_lock = Table("state_lock", metadata, Column("id", Integer, primary_key=True), Column("n", Integer))


class Store:
    """The state tables on the ledger's database; `write()` is one serialised transaction."""

    def __init__(self, url: str | None = None):
        self.url = resolve_url(url)
        self.engine: Engine = _engine(self.url)

    @contextmanager
    def read(self) -> Iterator[Connection]:
        with self.engine.connect() as c:
            yield c

    @contextmanager
    def write(self) -> Iterator[Connection]:
        """Takes the store's lock row first: SQLite's write lock at once, a row lock on PostgreSQL."""
        with self.engine.begin() as c:
            c.execute(update(state_lock).where(state_lock.c.id == 1).values(n=state_lock.c.n + 1))
            yield c

    # ---- records -----------------------------------------------------------------------------------
    def get(self, kind: str, key: str) -> dict[str, Any] | None:
        with self.read() as c:
            row = c.execute(select(records.c.data).where(records.c.kind == kind, records.c.key == key)).first()
        return json.loads(row[0]) if row else None

    def all(self, kind: str) -> dict[str, dict[str, Any]]:
        with self.read() as c:
            rows = c.execute(select(records.c.key, records.c.data).where(records.c.kind == kind)).all()
        return {k: json.loads(d) for k, d in rows}

    def put(self, kind: str, key: str, data: dict[str, Any]) -> None:
        with self.write() as c:
            put(c, kind, key, data)

    def drop(self, kind: str, key: str) -> None:
        with self.write() as c:
            c.execute(delete(records).where(records.c.kind == kind, records.c.key == key))

    # ---- notes ---------------------------------------------------------------------------------------
    def note(self, kind: str, **data: Any) -> None:
        with self.write() as c:
            c.execute(insert(notes).values(at=time.time(), kind=kind, data=json.dumps(data)))

    def notes(self, kind: str | None = None) -> list[dict[str, Any]]:
        q = select(notes.c.at, notes.c.kind, notes.c.data).order_by(notes.c.id)
        if kind is not None:
            q = q.where(notes.c.kind == kind)
        with self.read() as c:
            return [{"at": at, "kind": k, **json.loads(d)} for at, k, d in c.execute(q)]


def put(c: Connection, kind: str, key: str, data: dict[str, Any]) -> None:
    """Insert or replace one record, inside the caller's write transaction."""
    body = json.dumps(data)
    n = c.execute(update(records).where(records.c.kind == kind, records.c.key == key)
                  .values(data=body, at=time.time())).rowcount
    if not n:
        c.execute(insert(records).values(kind=kind, key=key, data=body, at=time.time()))


@lru_cache(maxsize=8)
def _engine(url: str) -> Engine:
    """One engine (one pool) per database in a process; the tables made once, by whoever comes first."""
    eng = _make_engine(url)
    create_tables(url, lambda: metadata.create_all(eng, checkfirst=True))
    with eng.begin() as c:
        if c.execute(select(state_lock.c.id)).first() is None:
            try:
                with c.begin_nested():
                    c.execute(insert(state_lock).values(id=1, n=0))
            except IntegrityError:  # another process made it first
                pass
    return eng


__all__ = ["Store", "fleet_events", "metadata", "notes", "put", "records", "ssh_checks", "ssh_hosts"]
