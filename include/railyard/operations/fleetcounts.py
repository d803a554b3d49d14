"""The fleet's hosts counted for the metrics (railyard.operations.metrics): read by a write path's step and kept
in the ledger, so that a scrape never asks the fleet. The counts are kept per domain: a stop's drain and return
read and replace only their own domain's (what they changed), a reconcile the whole fleet's, so a stop's cost
does not grow with the fleet around it."""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Collection, Iterable
from typing import Any

from railyard.domain.config import DomainSpec, RailyardConfig
from railyard.domain.models import BROKEN_STATES, Host, HostState
from railyard.ledger import Ledger

Row = tuple[str, str, str, float]  # kind, a, b, n: what `Ledger.fleet_counts` gives back, summed over domains
NO_DOMAIN = ""  # the key of hosts the fleet has that no domain of the config names (and of the clock)


def fleet_counts(hosts: Iterable[Host], now: float, held: Collection[str] = ()) -> list[Row]:
    """One read of hosts as the rows `Ledger.record_fleet_counts` keeps: hosts by (sku, state), hosts by
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


def domain_counts(groups: dict[str, list[Host]], now: float, held: Collection[str]) -> list[tuple[str, str, str, str,
                                                                                                   float]]:
    """`fleet_counts` of each domain's hosts, as (domain, kind, a, b, n), and the clock once (NO_DOMAIN)."""
    rows = [(d, *row) for d, hosts in sorted(groups.items()) for row in fleet_counts(hosts, now, held)
            if row[0] != "clock"]
    return [*rows, (NO_DOMAIN, "clock", "fleet", "now", now)]


def record_fleet(fleet: Any, ledger: Ledger, config: RailyardConfig, domain: DomainSpec | None = None, *,
                 read: list[Host] | None = None, now: float | None = None) -> None:
    """Read the fleet once and keep its counts in the ledger, for the metrics (a write path's step only).
    With `domain`, only that domain's hosts are read and only its counts replaced, once the whole fleet has been
    read (until then the metrics would count one domain as the fleet). `read`: the domain's hosts as the caller
    has just read them, taken instead of a read when they are every host of the domain; `now`: the fleet's
    clock as just read."""
    if domain is not None and ledger.fleet_counts()[1] is None:
        domain = None
    if domain is not None:
        if read is None or len(read) != len(domain.hosts) or {h.name for h in read} != set(domain.hosts):
            read = fleet.hosts(list(domain.hosts))
        groups = {domain.name: read}
    else:
        domain_of = config.host_domain()
        groups = defaultdict(list)
        for h in fleet.hosts():
            groups[domain_of.get(h.name, NO_DOMAIN)].append(h)
    held = set(ledger.holdings())  # every lease: at most the domains out and the hosts in repair
    ledger.record_fleet_counts(domain_counts(groups, fleet.now() if now is None else now, held), time.time(),
                               domains=None if domain is None else [domain.name])
