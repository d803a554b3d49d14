"""The fleet's hosts counted for the metrics (railyard.operations.metrics): read once by a write path's step
(a stop's drain and return, a reconcile) and kept in the ledger, so that a scrape never asks the fleet."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Collection, Iterable
from typing import Any

from railyard.domain.models import BROKEN_STATES, Host, HostState
from railyard.ledger import Ledger


def fleet_counts(hosts: Iterable[Host], now: float, held: Collection[str] = ()) -> list[tuple[str, str, str, float]]:
    """One read of the fleet as the rows `Ledger.record_fleet_counts` keeps: hosts by (sku, state), hosts by
    (component, version), hosts out of service that no operation holds by SKU (an admin's drain, a host down
    by itself: they count against the maintenance buffer too), and the fleet's clock at the read."""
    states: Counter[tuple[str, str]] = Counter()
    versions: Counter[tuple[str, str]] = Counter()
    unheld: Counter[str] = Counter()
    for h in hosts:
        states[(h.sku, h.state.value)] += 1
        versions.update(h.versions.items())
        if h.state != HostState.SERVING and h.state not in BROKEN_STATES and h.name not in held:
            unheld[h.sku] += 1
    return ([("state", sku, st, float(n)) for (sku, st), n in sorted(states.items())]
            + [("version", c, v, float(n)) for (c, v), n in sorted(versions.items())]
            + [("unheld_out", sku, "", float(n)) for sku, n in sorted(unheld.items())]
            + [("clock", "fleet", "now", now)])


def record_fleet(fleet: Any, ledger: Ledger) -> None:
    """Read the fleet once and keep its counts in the ledger, for the metrics (a write path's step only)."""
    hosts = fleet.hosts()
    ledger.record_fleet_counts(fleet_counts(hosts, fleet.now(), set(ledger.holdings())), time.time())
