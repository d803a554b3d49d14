"""The operations ledger: the durable record of which operation holds which hosts.

One operation per host at a time (the `leases` primary key), and taking a domain is one
serialised transaction that checks the buffers and `max_domains_down` before it leases anything.
Leases never expire by time: they are released only after the hosts are back or offboarded.
Every change writes an audit row (who, what, when, why).

How its hot paths stay cheap at fleet scale: docs/performance.md (The ledger).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from sqlalchemy import (
    Engine,
    insert,
    select,
)

from railyard.ledger import pg as ledger_pg
from railyard.ledger.history import AuditLog
from railyard.ledger.leasing import Leases
from railyard.ledger.records import Records
from railyard.ledger.reports import Reports
from railyard.ledger.schema import _create_missing_indexes, create_tables, ledger_lock, metadata
from railyard.ledger.url import _make_engine, resolve_url


class Ledger(Leases, Records, Reports, AuditLog):
    def __init__(self, url: str | None = None, *, pg_functions: bool = True,
                 clock: Callable[[], float] = time.time):
        """`pg_functions`: on PostgreSQL with psycopg2, lease operations run as server-side functions
        (railyard.ledger.pg); False keeps them in Python, as on SQLite (tests compare the two). `clock`: the
        wall clock every record's time and a waiter's place in line (WAITER_TTL_S) are read from."""
        self.clock = clock
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
