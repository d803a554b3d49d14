"""A ledger client that stops in the middle of a transaction, on a real PostgreSQL: frozen (SIGSTOP) or
killed while it holds the fleet-wide ledger lock with a domain's leases written but not committed. The
server ends its session within the configured idle-in-transaction time, the lock goes with it, another
writer takes its domain, and no second domain is ever out (the stuck client's rows never land)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from railyard.ledger import Budget, Ledger, pg_connect_args
from tests.support.postgres import PostgresServer, running_postgres

ROOT = Path(__file__).resolve().parents[2]
DOMAINS = {"d0": ["d0h0", "d0h1"], "d1": ["d1h0", "d1h1"]}
BUDGET = Budget(total_hosts=4, maintenance_hosts=2, failure_hosts=0, max_domains_down=1)
IDLE_S = 2  # railyard.ledger.IDLE_IN_TRANSACTION_S in the stuck client (30 s in production)

# Takes the ledger lock the way every lease-changing transaction does, writes d0's leases, says so, and
# stops before it commits (it is then frozen or killed by the test).
CLIENT = """
import sys, time
from sqlalchemy import insert
import railyard.ledger.url
from railyard.ledger import Ledger
from railyard.ledger.schema import _lock, leases
railyard.ledger.url.IDLE_IN_TRANSACTION_S = int(sys.argv[2])  # Railyard's own bound, shortened for the test
led = Ledger(sys.argv[1], pg_functions=False)
with led.engine.begin() as c:
    _lock(c)
    c.execute(insert(leases), [{"host": h, "op_id": "stuck/op/d0", "domain": "d0", "since": time.time(),
                                "kind": "train_stop"} for h in ("d0h0", "d0h1")])
    print("locked", flush=True)
    time.sleep(8)  # then commits: after its session was ended, that fails
"""


@pytest.fixture(scope="module")
def pg() -> Iterator[PostgresServer]:
    yield from running_postgres()


def test_connect_args_bound_lock_waits_and_idle_transactions_under_the_urls_own():
    args = pg_connect_args("postgresql+psycopg2://ry@db/railyard?options=-c%20lock_timeout%3D5s&keepalives_idle=7")
    assert "idle_in_transaction_session_timeout=30000" in args["options"]
    assert args["options"].endswith("-c lock_timeout=5s")  # the URL's, applied last
    assert "keepalives_idle" not in args and args["keepalives"] == 1  # the URL's own is left to it


@pytest.mark.parametrize("how", ["frozen", "killed"])
def test_a_client_stuck_mid_transaction_frees_the_ledger_lock(pg: PostgresServer, how: str):
    url = pg.create_database(f"stuck_{how}")
    led = Ledger(url)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "include"), os.environ.get("PYTHONPATH", "")])}
    client = subprocess.Popen([sys.executable, "-c", CLIENT, url, str(IDLE_S)], stdout=subprocess.PIPE, text=True,
                              env=env)
    try:
        assert client.stdout is not None and client.stdout.readline().strip() == "locked"
        if how == "frozen":
            client.send_signal(signal.SIGSTOP)
        else:
            client.kill()
        t0 = time.monotonic()
        got: list = []
        other = threading.Thread(target=lambda: got.append(led.acquire_domain(
            "live/op/d1", train="live", domain="d1", hosts=DOMAINS["d1"], budget=BUDGET,
            pool_hosts=[h for hs in DOMAINS.values() for h in hs])), daemon=True)
        other.start()
        other.join(timeout=IDLE_S + 10)
        waited = time.monotonic() - t0
        assert got, f"the other writer still waits for the stuck client's lock after {waited:.0f}s"
        assert got[0].granted, got
        assert waited < IDLE_S + 5, waited  # the server ended the stuck session; nobody waited for ever
        assert set(led.domains_out()) == {"d1"}
        assert set(led.holdings()) == set(DOMAINS["d1"])  # the stuck client's d0 rows never landed
        if how == "frozen":
            client.send_signal(signal.SIGCONT)  # it wakes to a closed session: its commit fails
            assert client.wait(timeout=30) != 0
        assert set(led.holdings()) == set(DOMAINS["d1"])
        assert led.release("live/op/d1", reason="test") == sorted(DOMAINS["d1"])
    finally:
        if client.poll() is None:
            client.send_signal(signal.SIGCONT)
            client.kill()
        client.wait(timeout=10)
        led.dispose()
