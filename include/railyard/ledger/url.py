"""Which database the ledger opens (`resolve_url`), and its engine: SQLite in WAL mode, or PostgreSQL with the
bounds that keep a stuck client from holding the ledger lock."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from sqlalchemy import (
    Engine,
    create_engine,
    event,
)
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DisconnectionError

from railyard.domain.urls import check_url
from railyard.ledger import pg as ledger_pg


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
