"""What a stop needs and what it may take: the steps a host still needs, a stop's estimate, the
buffers of a capacity pool. Shared by the stop itself (`stop.py`) and the plan preview
(`releases.py`), so neither has to import the other."""

from __future__ import annotations

import functools
from collections.abc import Callable

from railyard.domain.config import RailyardConfig
from railyard.domain.models import Budget, Host, Step


def pool_hosts(config: RailyardConfig, sku: str) -> list[str]:
    """The capacity pool: every host of one SKU."""
    return [h for d in config.domains if d.sku == sku for h in d.hosts]


def budget_for(config: RailyardConfig, sku: str | None = None) -> Budget:
    """The buffers of one SKU's pool, in hosts (the whole fleet when it has one SKU)."""
    skus = {d.sku for d in config.domains}
    sku = sku if sku is not None else next(iter(skus)) if len(skus) == 1 else None
    if sku is None:
        raise ValueError("a fleet with several SKUs has one budget per SKU: name the SKU")
    total = len(pool_hosts(config, sku))
    spec = config.buffers.for_sku(sku)
    return Budget(
        total_hosts=total,
        maintenance_hosts=spec.maintenance.host_count(total),
        failure_hosts=spec.failure.host_count(total),
        max_domains_down=config.max_domains_down,
    )


def stop_estimate_s(config: RailyardConfig, targets: dict[str, str] | Callable[[Host], dict[str, str]],
                    hosts: list[Host]) -> float:
    """Fleet seconds a stop should take: checkpoint, drain, the installs it needs, reboot, check, return.
    `targets` is one mapping for every host, or a function of the host (per-host rollout phases)."""
    e = config.estimates
    needed = {c for h in hosts for c in pending(targets(h) if callable(targets) else targets, h)}
    comps = [config.component(c) for c in needed]
    installs = sum(c.duration_s for c in comps)
    reboot = e.reboot_s if any(c.reboot for c in comps) else 0.0
    return e.checkpoint_s + e.drain_s + installs + reboot + e.check_s + e.return_s


def pending(targets: dict[str, str], host: Host) -> list[str]:
    """The components this host still needs, in the train's order (`pending_steps` without building the steps:
    what a count or a test over a domain's thousands of hosts asks)."""
    versions = host.versions
    return [c for c, v in targets.items() if versions.get(c) != v]


def pending_steps(targets: dict[str, str], host: Host) -> list[Step]:
    """What this host still needs, in the train's order."""
    return [_step(c, targets[c]) for c in pending(targets, host)]


@functools.lru_cache(maxsize=4096)
def _step(component: str, version: str) -> Step:
    """One `Step` per (component, version): they are frozen, and a domain's thousands of hosts share a few."""
    return Step(component=component, version=version)
