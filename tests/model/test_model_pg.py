"""The model's random schedules with the ledger on a real PostgreSQL (its lease path as PL/pgSQL functions),
a shorter run than SQLite's: every example on a fresh database of one server started for this module."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from tests.model.test_model import STEPS_PER, Railyard
from tests.support.postgres import PostgresServer, running_postgres

EXAMPLES = int(os.environ.get("RAILYARD_MODEL_PG_EXAMPLES", "60"))


@pytest.fixture(scope="module")
def pg() -> Iterator[PostgresServer]:
    yield from running_postgres()


@pytest.mark.timeout(1800)
def test_random_schedules_with_the_ledger_on_postgresql(pg: PostgresServer) -> None:
    n = itertools.count()
    urls: list[str] = []

    class OnPostgres(Railyard):
        def ledger_url(self) -> str:
            self.db = f"model_{next(n)}"
            urls.append(pg.create_database(self.db))
            return urls[-1]

        def teardown(self) -> None:
            try:
                super().teardown()
            finally:  # each example's database goes with it (a server of many left to checkpoint is slow)
                conn = pg._connect()
                conn.autocommit = True
                with conn.cursor() as cur:
                    cur.execute(f'DROP DATABASE "{self.db}"')
                conn.close()

    run_state_machine_as_test(OnPostgres, settings=settings(
        max_examples=EXAMPLES, stateful_step_count=STEPS_PER, deadline=None, derandomize=True, database=None,
        suppress_health_check=list(HealthCheck), print_blob=True))
    assert len(urls) >= EXAMPLES and all(u.startswith("postgresql+psycopg2://") for u in urls)
