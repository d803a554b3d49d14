"""Which database URLs the ledger takes, and how one is shown: a SQLite file or memory, or PostgreSQL with
psycopg2, checked before anything connects; a URL's password and credential parameters are never shown."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from sqlalchemy.engine import make_url


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
    with psycopg2, the driver the lease functions (railyard.ledger.pg) and the tests run on.
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
