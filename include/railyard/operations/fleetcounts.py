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
    hosts = list(hosts)
    # counted by what hosts share (a SKU and a state; a whole set of versions, the same on most of a fleet),
    # then spread: a 76,800-host read costs one tuple per host, not a counter update per version
    by_state = Counter((h.sku, h.state) for h in hosts)
    states: Counter[tuple[str, str]] = Counter()
    for (sku, state), n in by_state.items():
        states[(sku, state.value)] += n
    versions: Counter[tuple[str, str]] = Counter()
    for items, n in Counter(tuple(h.versions.items()) for h in hosts).items():
        for cv in items:
            versions[cv] += n
    unheld: Counter[str] = Counter(h.sku for h in hosts if h.state != HostState.SERVING
                                   and h.state not in BROKEN_STATES and h.name not in held)
    return ([("state", sku, st, float(n)) for (sku, st), n in sorted(states.items())]
            + [("version", c, v, float(n)) for (c, v), n in sorted(versions.items())]
            + [("unheld_out", sku, "", float(n)) for sku, n in sorted(unheld.items())]
            + [("clock", "fleet", "now", now)])


def record_fleet(fleet: Any, ledger: Ledger) -> None:
    """Read the fleet once and keep its counts in the ledger, for the metrics (a write path's step only)."""
    hosts = fleet.hosts()
    ledger.record_fleet_counts(fleet_counts(hosts, fleet.now(), set(ledger.holdings())), time.time())
