"""The operations ledger: which operation holds which hosts, and every record a later task needs.

`Ledger` (`core`) is one object over its parts: `leasing` (taking a domain, releasing, handing over, the
waiters), `records` (operations and their details, switches, visits, release phases, verifications),
`reports` (the run reports and what they are made of), `history` (the audit). `schema` holds the tables and
their statements, `url` which database is opened and how, `pg` the PostgreSQL functions the lease path runs
as, `state` Railyard's own records about the fleet (SSH host states, Slurm node records) in the same database.
"""

from __future__ import annotations

from railyard.domain.models import Budget, Decision
from railyard.domain.urls import LedgerError, check_url, has_credentials, safe_url
from railyard.ledger.core import Ledger
from railyard.ledger.schema import PRIORITY, WAITER_TTL_S, audit, create_tables, leases, metadata, operations
from railyard.ledger.url import default_url, pg_connect_args, resolve_url

__all__ = ["PRIORITY", "WAITER_TTL_S", "Budget", "Decision", "Ledger", "LedgerError", "audit", "check_url",
           "create_tables", "default_url", "has_credentials", "leases", "metadata", "operations",
           "pg_connect_args", "resolve_url", "safe_url"]
