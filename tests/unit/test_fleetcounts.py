"""The fleet's counts for the metrics (railyard.operations.fleetcounts): what a host-by-host count of the same
read gives, on a fleet of mixed SKUs, states and versions."""

from __future__ import annotations

import random
from collections import Counter

from railyard.domain.models import BROKEN_STATES, Host, HostState
from railyard.operations.fleetcounts import fleet_counts


def by_hand(hosts: list[Host], now: float, held: set[str]) -> list[tuple[str, str, str, float]]:
    states = Counter((h.sku, h.state.value) for h in hosts)
    versions = Counter(cv for h in hosts for cv in h.versions.items())
    unheld = Counter(h.sku for h in hosts
                     if h.state not in (HostState.SERVING, *BROKEN_STATES) and h.name not in held)
    return ([("state", s, st, float(n)) for (s, st), n in sorted(states.items())]
            + [("version", c, v, float(n)) for (c, v), n in sorted(versions.items())]
            + [("unheld_out", s, "", float(n)) for s, n in sorted(unheld.items())] + [("clock", "fleet", "now", now)])


def test_counts_are_a_host_by_host_count_of_the_same_read() -> None:
    rng = random.Random(7)
    versions = [{"gpu-driver": "550.1", "kernel": "6.1.0-25"}, {"gpu-driver": "570.86.15", "kernel": "6.1.0-28"},
                {"kernel": "6.1.0-28", "gpu-driver": "570.86.15"},  # the same set in another order
                {"gpu-driver": "570.86.15"}, {}]
    hosts = [Host(name=f"gpu-{i:05d}", domain=f"pod-{i // 64}", sku=rng.choice(["h100", "h200"]),
                  state=rng.choice(list(HostState)), versions=dict(rng.choice(versions))) for i in range(3000)]
    held = {h.name for h in hosts if rng.random() < 0.3}
    assert fleet_counts(hosts, 123.0, held) == by_hand(hosts, 123.0, held)
    assert fleet_counts(iter(hosts), 1.0) == by_hand(hosts, 1.0, set())  # any iterable, read once
    assert fleet_counts([], 5.0) == [("clock", "fleet", "now", 5.0)]
