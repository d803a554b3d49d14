"""What every part of the `Ledger` shares: its engine, its PostgreSQL channel and its clock."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import Engine

from railyard.ledger import pg as ledger_pg


class LedgerBase:
    url: str
    engine: Engine
    _pg: ledger_pg.Channel | None
    clock: Callable[[], float]  # the wall clock (time.time): waiters' places in line, every record's time
