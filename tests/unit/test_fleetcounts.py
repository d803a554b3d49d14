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


class Reads:
    """A fleet that records which hosts each read asked for (None: the whole fleet)."""

    def __init__(self, fleet):
        self.fleet, self.asked = fleet, []

    def hosts(self, names=None):
        self.asked.append(None if names is None else sorted(names))
        return self.fleet.hosts(names)

    def now(self):
        return self.fleet.now()


def test_a_stop_replaces_only_its_domains_counts_and_they_add_up_to_a_whole_read(tmp_path) -> None:
    from railyard.domain.config import parse_config
    from railyard.domain.planning import budget_for
    from railyard.ledger import Ledger
    from railyard.operations.fleetcounts import record_fleet
    from railyard.sim.engine import SimEngine
    from tests.support.configs import small_config
    from tests.unit.test_ui_api import Clock

    cfg = parse_config(small_config(domains=3, hosts_per_domain=4))
    sim = SimEngine(cfg, None, clock=Clock())
    fleet, ledger = Reads(sim), Ledger(f"sqlite:///{tmp_path}/ledger.db")
    pod = cfg.domains[1]
    record_fleet(fleet, ledger, cfg, pod)  # nothing read yet: the first read is of the whole fleet
    assert fleet.asked == [None]
    whole, _at = ledger.fleet_counts()
    assert ("state", pod.sku, "serving", 12.0) in whole
    op = "demo/r/" + pod.name
    assert ledger.acquire_domain(op, train="demo", domain=pod.name, hosts=list(pod.hosts),
                                 budget=budget_for(cfg)).granted
    sim.drain(list(pod.hosts), op)
    sim.offboard(cfg.domains[2].hosts[0], "PSU 1 failed", "repair/x")  # elsewhere: seen at the next whole read
    record_fleet(fleet, ledger, cfg, pod)
    assert fleet.asked[-1] == sorted(pod.hosts)  # the domain's hosts only
    rows, _at = ledger.fleet_counts()
    states = {b: n for k, _a, b, n in rows if k == "state"}
    assert states.get("serving") == 8 and sum(states.values()) == 12 and "repair" not in states
    record_fleet(fleet, ledger, cfg)
    assert fleet.asked[-1] is None
    rows, _at = ledger.fleet_counts()
    states = {b: n for k, _a, b, n in rows if k == "state"}
    assert states.get("serving") == 7 and states.get("repair") == 1 and sum(states.values()) == 12
    # what a domain's read replaced adds up with the rest to what one read of the whole fleet counts
    sim.return_to_service(list(pod.hosts), op)
    record_fleet(fleet, ledger, cfg, pod)
    by_domain, _at = ledger.fleet_counts()
    record_fleet(fleet, ledger, cfg)
    assert by_domain == ledger.fleet_counts()[0]


def test_a_read_of_the_whole_domain_given_is_counted_without_reading_again(tmp_path) -> None:
    """A step that has just read every host of its domain hands the read over: the counts are taken from it and
    the fleet is not asked again; a read that lacks one of the domain's hosts is not taken for the domain's."""
    from railyard.domain.config import parse_config
    from railyard.ledger import Ledger
    from railyard.operations.fleetcounts import record_fleet
    from railyard.sim.engine import SimEngine
    from tests.support.configs import small_config
    from tests.unit.test_ui_api import Clock

    cfg = parse_config(small_config(domains=2, hosts_per_domain=4))
    sim = SimEngine(cfg, None, clock=Clock())
    fleet, ledger = Reads(sim), Ledger(f"sqlite:///{tmp_path}/ledger.db")
    pod = cfg.domains[0]
    record_fleet(fleet, ledger, cfg)  # the whole fleet once: from then on a domain's counts are replaced alone
    sim.drain(list(pod.hosts[:2]), "demo/r/" + pod.name)
    read = sim.hosts(list(pod.hosts))
    asked = len(fleet.asked)
    record_fleet(fleet, ledger, cfg, pod, read=read, now=sim.now())
    assert len(fleet.asked) == asked  # nothing read: the step's own read was every host of the domain
    rows, _at = ledger.fleet_counts()
    states = {b: n for k, _a, b, n in rows if k == "state"}
    assert states.get("draining") == 2 and states.get("serving") == 6
    record_fleet(fleet, ledger, cfg, pod, read=read[1:])  # one host short: the domain is read
    assert fleet.asked[-1] == sorted(pod.hosts)
    assert ledger.fleet_counts()[0] == rows
