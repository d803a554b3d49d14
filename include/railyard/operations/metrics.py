"""Railyard's Prometheus metrics, from the ledger's database only: every api-server replica that reads the same
database answers the same, and a scrape never asks the fleet. The hosts' states and versions are those a task
last read (`record_fleet_counts`: a domain's after each drain and return of its stop, the whole fleet's at each
reconcile); `railyard_fleet_counts_age_seconds` says how old the oldest of them is.

No metric has a host label: a fleet of 75,000 hosts costs the same series as one of 64.
"""

from __future__ import annotations

import re
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from railyard.domain.config import RailyardConfig
from railyard.domain.models import BROKEN_STATES, HostState
from railyard.domain.planning import budget_for
from railyard.ledger import Ledger
from railyard.operations.fleetcounts import fleet_counts, record_fleet
from railyard.operations.reconcile import dag_id_for
from railyard.operations.releases import Rollout

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# An offboard's reason → the check that sent the host to repair: a handful of label values, whatever the text.
_HEALTH_CHECKS = (("dcgm", re.compile(r"\bdcgmi?\b", re.I)), ("nccl", re.compile(r"all_reduce_perf|\bnccl", re.I)),
                  ("xid", re.compile(r"\bxid\b", re.I)), ("nvidia-smi", re.compile(r"nvidia-smi", re.I)),
                  ("infiniband", re.compile(r"\bib_\w+|infiniband", re.I)), ("kernel-log", re.compile(r"kernel log")))


def check_of(reason: str) -> str:
    """The check an offboard's reason names: upgrade, versions, operator, a health check (dcgm, nccl, xid,
    nvidia-smi, infiniband, kernel-log, or health for another), else other."""
    text = reason or ""
    if text.startswith("upgrade failed"):
        return "upgrade"
    if text.startswith("sent to repair by"):
        return "operator"
    if any(words in text for words in ("versions not at target", "versions break the rule",
                                       "could not be verified at target versions")):
        return "versions"
    if text.startswith("health check failed"):
        body = text.split(":", 1)[1] if ":" in text else ""
        for name, pattern in _HEALTH_CHECKS:
            if pattern.search(body):
                return name
        return "health"
    return "other"


class RailyardCollector(Collector):
    """Every metric, computed at collect time from the config and the ledger."""

    def __init__(self, config: RailyardConfig, ledger: Ledger, *, wall: float | None = None):
        self.config, self.ledger, self.wall = config, ledger, wall

    def collect(self) -> Iterator[Metric]:
        wall = self.wall if self.wall is not None else time.time()
        rows, at = self.ledger.fleet_counts()
        yield from self._fleet(rows, at, wall)
        yield from self._ledger(wall)
        fleet_now = next((n for k, a, _b, n in rows if k == "clock" and a == "fleet"), None)
        if fleet_now is not None and at is not None:
            fleet_now += wall - at  # the fleet's clock now, as a real fleet's (a simulator's may run faster)
        yield from self._trains(fleet_now)
        yield from self._releases({(a, b): n for k, a, b, n in rows if k == "version"})
        yield from self._tallies()

    # ---- the fleet's hosts, as a task last read them -------------------------------------------------
    def _fleet(self, rows: list[tuple[str, str, str, float]], at: float | None, wall: float) -> Iterator[Metric]:
        """Before any task has read the fleet there is nothing to say: no host series at all, rather than zeros
        that would read as a fleet that serves nothing."""
        if at is None:
            return
        by_state = GaugeMetricFamily("railyard_hosts", "Hosts by SKU and state, as a task last read the fleet",
                                     labels=["sku", "state"])
        at_version = GaugeMetricFamily("railyard_hosts_at_version", "Hosts running each version of a component",
                                       labels=["component", "version"])
        per_sku: dict[str, Counter[str]] = defaultdict(Counter)
        unheld: dict[str, float] = {}
        for kind, a, b, n in rows:
            if kind == "state":
                per_sku[a][b] += int(n)
            elif kind == "unheld_out":
                unheld[a] = n
            elif kind == "version":
                at_version.add_metric([a, b], n)
        skus = sorted({d.sku for d in self.config.domains} | set(per_sku))
        for sku in skus:
            for state in HostState:
                by_state.add_metric([sku, state.value], per_sku[sku].get(state.value, 0))
        yield by_state
        yield at_version
        age = GaugeMetricFamily("railyard_fleet_counts_age_seconds",
                                "Seconds since the oldest read of the hosts the host metrics count (a domain's "
                                "at its stop, the whole fleet's at a reconcile); absent before the first read")
        if at is not None:
            age.add_metric([], max(wall - at, 0.0))
        yield age
        serving = GaugeMetricFamily("railyard_serving_fraction", "Fraction of a SKU's hosts serving", labels=["sku"])
        floor = GaugeMetricFamily("railyard_serving_floor_fraction",
                                  "The lowest serving fraction a SKU's buffers allow", labels=["sku"])
        for sku in skus:
            total = sum(per_sku[sku].values())
            serving.add_metric([sku], per_sku[sku].get(HostState.SERVING.value, 0) / total if total else 0.0)
            pool = budget_for(self.config, sku)
            floor.add_metric([sku], (pool.total_hosts - pool.maintenance_hosts - pool.failure_hosts)
                             / max(pool.total_hosts, 1))
        yield serving
        yield floor
        yield from self._buffers(skus, per_sku, unheld)

    def _buffers(self, skus: list[str], per_sku: dict[str, Counter[str]],
                 unheld: dict[str, float]) -> Iterator[Metric]:
        """Maintenance used: hosts an operation other than a repair holds now, and hosts out of service that
        none held at the last read; failure used: broken hosts (failed, in repair), as the ledger counts them."""
        used = GaugeMetricFamily("railyard_buffer_used_hosts", "Hosts a SKU's buffer has in use",
                                 labels=["sku", "buffer"])
        budget = GaugeMetricFamily("railyard_buffer_budget_hosts", "Hosts a SKU's buffer may have in use",
                                   labels=["sku", "buffer"])
        broken_names = {s.value for s in BROKEN_STATES}
        held_per_sku: Counter[str] = Counter()
        sku_of = {h: d.sku for d in self.config.domains for h in d.hosts}
        for host, op in self.ledger.holdings().items():
            if not op.startswith("repair/"):
                held_per_sku[sku_of.get(host, "")] += 1
        for sku in skus:
            b = budget_for(self.config, sku)
            broken = sum(n for s, n in per_sku[sku].items() if s in broken_names)
            used.add_metric([sku, "maintenance"], held_per_sku[sku] + unheld.get(sku, 0))
            used.add_metric([sku, "failure"], broken)
            budget.add_metric([sku, "maintenance"], b.maintenance_hosts)
            budget.add_metric([sku, "failure"], b.failure_hosts)
        yield used
        yield budget

    # ---- the ledger now ------------------------------------------------------------------------------
    def _ledger(self, wall: float) -> Iterator[Metric]:
        out = self.ledger.domains_out()
        domains = GaugeMetricFamily("railyard_domains_out", "Domains out of service for maintenance (repairs aside)")
        domains.add_metric([], sum(1 for op in out.values() if not op.startswith("repair/")))
        yield domains
        visiting = GaugeMetricFamily("railyard_domain_out", "1 while a domain is out of service for maintenance",
                                     labels=["domain", "op_kind"])
        ops = self.ledger.active_operations()
        kind_of = {o["id"]: o["kind"] for o in ops}
        for dom in self.config.domains:
            op = out.get(dom.name)
            if op is not None and not op.startswith("repair/"):
                visiting.add_metric([dom.name, kind_of.get(op, "unknown")], 1)
        yield visiting
        held = GaugeMetricFamily("railyard_hosts_leased", "Hosts held by an operation, by the operation's kind",
                                 labels=["op_kind"])
        active = GaugeMetricFamily("railyard_operations_active", "Active operations by kind", labels=["op_kind"])
        per_kind: Counter[str] = Counter(o["kind"] for o in ops)
        hosts_kind: Counter[str] = Counter()
        for o in ops:
            hosts_kind[o["kind"]] += len(o["hosts"])
        for kind in sorted(set(per_kind) | {"train_stop", "emergency", "repair"}):
            active.add_metric([kind], per_kind.get(kind, 0))
            held.add_metric([kind], hosts_kind.get(kind, 0))
        yield active
        yield held
        oldest_lease = GaugeMetricFamily("railyard_lease_oldest_age_seconds",
                                         "Seconds the oldest lease of a kind of operation has been held",
                                         labels=["op_kind"])
        for kind, since in sorted(self.ledger.oldest_leases().items()):
            oldest_lease.add_metric([kind], max(wall - since, 0.0))
        yield oldest_lease
        t = self.config.timeouts
        deadline = GaugeMetricFamily("railyard_stop_deadline_seconds",
                                     "The longest a stop may hold its domain: its steps' timeouts together")
        deadline.add_metric([], t.checkpoint_wait_s + t.drain_s + t.upgrade_s + t.check_s + t.return_s)
        yield deadline
        waiters = self.ledger.waiting()
        waiting = GaugeMetricFamily("railyard_lease_waiters", "Operations waiting for capacity")
        waiting.add_metric([], len(waiters))
        yield waiting
        oldest = GaugeMetricFamily("railyard_lease_oldest_waiter_age_seconds",
                                   "Seconds the longest-waiting operation has waited (0 when none waits)")
        oldest.add_metric([], max((wall - w["since"] for w in waiters), default=0.0))
        yield oldest
        freeze = GaugeMetricFamily("railyard_freeze", "1 while the freeze switch is on")
        freeze.add_metric([], 1 if self.ledger.switch("freeze") else 0)
        yield freeze

    def _trains(self, fleet_now: float | None) -> Iterator[Metric]:
        last = GaugeMetricFamily("railyard_train_last_visit_timestamp_seconds",
                                 "When a train last finished a stop in a domain (fleet clock, Unix seconds)",
                                 labels=["train", "domain"])
        overdue = GaugeMetricFamily("railyard_train_domain_overdue",
                                    "1 when a train's domain was not visited within its cycle_days",
                                    labels=["train", "domain"])
        for t in self.config.trains:
            visits = self.ledger.last_visits(t.id)
            for d in t.domains or [x.name for x in self.config.domains]:
                at = visits.get(d)
                if at is not None:
                    last.add_metric([t.id, d], at)
                if t.cycle_days is not None and fleet_now is not None:
                    late = at is None or (fleet_now - at) / 86400 > t.cycle_days
                    overdue.add_metric([t.id, d], 1 if late else 0)
        yield last
        yield overdue

    def _releases(self, versions: dict[tuple[str, str], float]) -> Iterator[Metric]:
        phase = GaugeMetricFamily("railyard_release_phase", "1 for a release's current phase",
                                  labels=["release", "component", "phase"])
        halted = GaugeMetricFamily("railyard_release_halted", "1 while a release is halted", labels=["release"])
        failures = GaugeMetricFamily("railyard_release_phase_failures",
                                     "Hosts that failed in the release's current phase", labels=["release"])
        results = GaugeMetricFamily("railyard_release_phase_results",
                                    "Hosts judged in the release's current phase", labels=["release"])
        at = GaugeMetricFamily("railyard_release_hosts_at_version",
                               "Hosts running the release's version of its component", labels=["release"])
        gate = GaugeMetricFamily("railyard_release_max_failure_rate",
                                 "The failure rate at which a phased release halts", labels=["release"])
        ro = Rollout(self.config, self.ledger)
        for spec in self.config.releases:
            st = ro.state(spec.id)
            phase.add_metric([spec.id, spec.component, st.phase], 1)
            halted.add_metric([spec.id], 1 if st.halted else 0)
            judged: dict[str, bool] = {}
            for x in self.ledger.release_results(spec.id):
                if x["at"] >= st.promoted_at:
                    judged[x["host"]] = bool(x["passed"])
            failures.add_metric([spec.id], sum(1 for ok in judged.values() if not ok))
            results.add_metric([spec.id], len(judged))
            at.add_metric([spec.id], versions.get((spec.component, spec.version), 0))
            if spec.rollout is not None:
                gate.add_metric([spec.id], spec.rollout.max_failure_rate)
        yield from (phase, halted, failures, results, at, gate)

    # ---- counters over the ledger's history ----------------------------------------------------------
    def _tallies(self) -> Iterator[Metric]:
        t: dict[str, Any] = self.ledger.tallies()
        stops = CounterMetricFamily("railyard_stops", "Stops finished, by train and outcome (done, aborted)",
                                    labels=["train", "dag_id", "outcome"])
        for train, state, n in sorted(t["stops"]):
            stops.add_metric([train, dag_id_for(train) if train else "", state], n)
        yield stops
        off = CounterMetricFamily("railyard_hosts_offboarded", "Hosts sent to repair, by the check that failed",
                                  labels=["check"])
        by_check: Counter[str] = Counter()
        for reason, n in t["offboards"]:
            by_check[check_of(reason)] += n
        for check in sorted(by_check):
            off.add_metric([check], by_check[check])
        yield off
        emergencies = CounterMetricFamily("railyard_emergency_trains", "Emergency trains triggered")
        emergencies.add_metric([], t["kinds"].get("emergency_run", 0))
        yield emergencies
        escalations = CounterMetricFamily("railyard_escalations", "Escalations sent (stuck work, overdue domains)")
        escalations.add_metric([], t["actions"].get("escalation", 0))
        yield escalations
        failed = CounterMetricFamily("railyard_notifications_failed", "Notifications a notifier failed to send")
        failed.add_metric([], t["actions"].get("notify_failed", 0))
        yield failed


def render(config: RailyardConfig, ledger: Ledger, *, wall: float | None = None) -> bytes:
    """The metrics in Prometheus' text format."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RailyardCollector(config, ledger, wall=wall))
    return generate_latest(registry)


__all__ = ["CONTENT_TYPE", "RailyardCollector", "check_of", "fleet_counts", "record_fleet", "render"]
