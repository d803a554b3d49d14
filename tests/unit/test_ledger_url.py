"""The ledger's URL, as a new user writes it: what Railyard takes, what it refuses before it connects, and
what it says when the database cannot be opened: one line, naming where the URL came from, never the
password. (`postgresql://` on a real server: tests/adapters/test_ledger_pg_functions.py.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from railyard.domain.config import ConfigError, parse_config
from railyard.ledger import Ledger, LedgerError, check_url, resolve_url
from railyard.ledger.state import Store
from tests.support.configs import small_config

SECRET = "pw-71c4e0a9d2b35f86"
RAILYARD = Path(sys.executable).parent / "railyard"


@pytest.mark.parametrize("url, names", [
    ("notaurl", ["not a database URL", "'notaurl'", "postgresql+psycopg2://"]),
    (f"mysql://ry:{SECRET}@db.example/railyard", ["mysql://ry:***@db.example/railyard", "'mysql' is not supported"]),
    (f"postgresql+psycopg://ry:{SECRET}@db.example/railyard", ["driver 'psycopg' is not supported",
                                                               "postgresql+psycopg2://"]),
    (f"postgresql+asyncpg://ry:{SECRET}@db.example/railyard", ["driver 'asyncpg' is not supported"]),
    (f"postgresql+psycopg2://ry:{SECRET}@x@db.example/railyard", ["more than one '@'", "%40"]),
    ("sqlite+pysqlcipher:///x.db", ["SQLite driver 'pysqlcipher' is not supported"]),
    ("sqlite:////no/such/folder/ledger.db", ["folder '/no/such/folder' does not exist"]),
])
def test_a_url_railyard_does_not_take_is_refused_by_name(url, names):
    with pytest.raises(LedgerError) as e:
        check_url(url, "RAILYARD_LEDGER_URL")
    msg = str(e.value)
    assert msg.startswith("RAILYARD_LEDGER_URL: ")
    for n in names:
        assert n in msg, msg
    assert SECRET not in msg and "@x@" not in msg


def test_postgresql_means_psycopg2_and_the_rest_of_the_url_is_kept():
    url = f"postgresql://ry:{SECRET}@db.example:5433/railyard?sslmode=verify-full&connect_timeout=5"
    got = check_url(url, "ledger.url")
    assert got == f"postgresql+psycopg2://ry:{SECRET}@db.example:5433/railyard?sslmode=verify-full&connect_timeout=5"
    # "postgres://" (Heroku's and others' spelling, which SQLAlchemy no longer takes) means the same
    assert check_url("postgres://ry@db/railyard", "ledger.url") == "postgresql+psycopg2://ry@db/railyard"
    assert check_url("postgres+psycopg2://ry@db/railyard", "ledger.url") == "postgresql+psycopg2://ry@db/railyard"
    socket = "postgresql://postgres@/railyard?host=/run/postgresql"
    assert check_url(socket, "ledger.url") == "postgresql+psycopg2://postgres@/railyard?host=/run/postgresql"
    for ok in ("postgresql+psycopg2://ry@db/railyard", "sqlite://", "sqlite:///:memory:"):
        assert check_url(ok, "ledger.url") == ok


def test_the_environment_is_named_when_the_url_comes_from_it(monkeypatch, tmp_path):
    monkeypatch.setenv("RAILYARD_LEDGER_URL", "oracle://scott:tiger@db/orcl")
    with pytest.raises(LedgerError, match=r"^RAILYARD_LEDGER_URL: oracle://scott:\*\*\*@db/orcl: database 'oracle'"):
        resolve_url(None)
    with pytest.raises(LedgerError, match=r"^ledger\.url: "):  # the config's comes first
        resolve_url("oracle://scott:tiger@db/orcl")
    monkeypatch.setenv("RAILYARD_LEDGER_URL", f"sqlite:///{tmp_path}/ledger.db")
    assert resolve_url(None) == f"sqlite:///{tmp_path}/ledger.db"


def test_a_database_that_cannot_be_opened_is_one_line_without_the_password(tmp_path):
    # nothing listens on port 1: refused at once
    for open_it in (Ledger, Store):
        with pytest.raises(LedgerError) as e:
            open_it(f"postgresql+psycopg2://ry:{SECRET}@127.0.0.1:1/railyard")
        msg = str(e.value)
        assert msg.startswith("ledger: cannot open postgresql+psycopg2://ry:***@127.0.0.1:1/railyard: ")
        assert "port 1 failed" in msg and SECRET not in msg and "\n" not in msg
    target = tmp_path / "ledger.db"
    target.mkdir()  # a folder where the file should be: SQLite cannot open it, whoever runs the test
    with pytest.raises(LedgerError, match=r"^ledger: cannot open sqlite:///.*ledger\.db: unable to open database"):
        Ledger(f"sqlite:///{target}")


def test_the_config_names_the_field_and_never_shows_a_secret_value():
    cfg = small_config()
    cfg["ledger"] = {"url": f"mysql://ry:{SECRET}@db.example/railyard"}
    cfg["escalation"] = {"webhook_url": f"ftp://hooks.example/{SECRET}"}
    with pytest.raises(ConfigError) as e:
        parse_config(cfg)
    problems = e.value.problems
    assert any(p.startswith("ledger.url: mysql://ry:***@db.example/railyard: database 'mysql'") for p in problems)
    assert any(p.startswith("escalation.webhook_url: not an http(s) URL") for p in problems)
    assert SECRET not in str(e.value)
    cfg.pop("escalation")
    cfg["ledger"] = {"url": "sqlite:////no/such/folder/ledger.db"}  # checked where it is opened, not here
    assert parse_config(cfg).ledger.url == "sqlite:////no/such/folder/ledger.db"


def test_the_cli_says_it_in_one_line_and_exits_6(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
           "RAILYARD_LEDGER_URL": f"postgresql+psycopg2://ry:{SECRET}@127.0.0.1:1/railyard"}
    r = subprocess.run([str(RAILYARD), "ops"], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 6, r.stderr
    assert r.stderr.strip().splitlines() == [
        'ledger: cannot open postgresql+psycopg2://ry:***@127.0.0.1:1/railyard: connection to server at '
        '"127.0.0.1", port 1 failed: Connection refused']
    env["RAILYARD_LEDGER_URL"] = "postgres+pg8000://ry@db/railyard"
    r = subprocess.run([str(RAILYARD), "host", "gpu-a01"], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 6 and r.stdout == ""
    assert r.stderr.strip().splitlines() == [
        "RAILYARD_LEDGER_URL: postgres+pg8000://ry@db/railyard: driver 'pg8000' is not supported: use "
        "postgresql+psycopg2://"]
