"""One domain stop of a train, as plain steps over a Fleet and the Ledger.

take -> checkpoints -> drain -> upgrade -> check -> return. Each step is idempotent: it reads
the world first and only does what is not done yet, so Airflow may run it again after a crash.
Every wait has its own deadline and ends with a `StopError` that says what did not happen.
The Airflow operators in `plugins/` are thin wrappers around these functions.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from railyard.config import DomainSpec, RailyardConfig, TrainSpec
from railyard.fleet.port import Fleet
from railyard.ledger import Budget, Decision, Ledger
from railyard.models import BROKEN_STATES, Host, HostState, Step

log = logging.getLogger("railyard.stop")


class StopError(RuntimeError):
    """A stop cannot go on; the message is the one-line reason shown in the run."""


def op_id_for(train_id: str, run_id: str, domain: str) -> str:
    return f"{train_id}/{run_id}/{domain}"


def budget_for(config: RailyardConfig) -> Budget:
    total = config.total_hosts
    return Budget(
        total_hosts=total,
        maintenance_hosts=config.buffers.maintenance.host_count(total),
        failure_hosts=config.buffers.failure.host_count(total),
        max_domains_down=config.max_domains_down,
    )


def pending_steps(targets: dict[str, str], host: Host) -> list[Step]:
    """What this host still needs, in the train's order."""
    return [Step(component=c, version=v) for c, v in targets.items() if host.versions.get(c) != v]


@dataclass
class Stop:
    config: RailyardConfig
    train: TrainSpec
    domain: DomainSpec
    op_id: str
    fleet: Fleet
    ledger: Ledger
    actor: str = "railyard"
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic
    say: Callable[[str], None] = field(default=log.info)

    @property
    def targets(self) -> dict[str, str]:
        return self.config.train_targets(self.train)

    @property
    def timeouts(self):  # noqa: ANN201
        return self.config.timeouts

    def held(self) -> list[str]:
        return sorted(self.ledger.holdings(self.op_id))

    def _require_lease(self) -> list[str]:
        held = self.held()
        if not held:
            raise StopError(
                f"{self.op_id} holds no lease on {self.domain.name}: refusing to touch its hosts "
                "(the capacity wait must grant the domain first)"
            )
        return held

    def _wait(self, what: str, timeout: float, probe: Callable[[], tuple[bool, str]]) -> None:
        deadline = self.clock() + timeout
        last = ""
        while True:
            done, status = probe()
            if status != last:
                self.say(f"{self.domain.name}: {status}")
                last = status
            if done:
                return
            if self.clock() >= deadline:
                raise StopError(f"{self.domain.name}: {what} did not finish within {timeout:.0f}s ({status})")
            self.sleep(self.timeouts.poll_s)

    # ---- 1. capacity ---------------------------------------------------------------------------
    def take(self) -> Decision:
        """Lease the domain if the buffers allow; `skip` when no host in it needs anything."""
        if self.held():
            return Decision("granted", f"{self.op_id} already holds {self.domain.name}")
        fleet_hosts = self.fleet.hosts()
        mine = [h for h in fleet_hosts if h.domain == self.domain.name]
        if not any(pending_steps(self.targets, h) for h in mine if h.state not in BROKEN_STATES):
            return Decision("skip", f"every host of {self.domain.name} is already at target")
        unavailable = [h.name for h in fleet_hosts if h.state in BROKEN_STATES]
        return self.ledger.acquire_domain(
            self.op_id, train=self.train.id, domain=self.domain.name, hosts=list(self.domain.hosts),
            budget=budget_for(self.config), unavailable=unavailable, actor=self.actor,
        )

    # ---- 2. checkpoints ------------------------------------------------------------------------
    def request_checkpoints(self) -> tuple[list[str], float]:
        """Ask every job on the domain to checkpoint; the request time is kept for retries."""
        held = self._require_lease()
        jobs = [j for j in self.fleet.jobs(held) if j.state == "running"]
        recorded = self.ledger.detail(self.op_id).get("checkpoint_requested_at")
        if recorded is None:
            at = self.fleet.request_checkpoint([j.id for j in jobs]) if jobs else self.fleet.now()
            recorded = self.ledger.set_detail_once(self.op_id, "checkpoint_requested_at", at)
            self.ledger.note(self.op_id, "checkpoint_requested", held, f"jobs: {', '.join(j.id for j in jobs) or 'none'}")
        return [j.id for j in jobs], float(recorded)  # type: ignore[arg-type]

    def stale_jobs(self, since: float) -> list[str]:
        """Running jobs on the domain whose last checkpoint is older than `since`."""
        return sorted(j.id for j in self.fleet.jobs(self.held()) if j.state == "running" and j.last_checkpoint < since)

    # ---- 3. drain ------------------------------------------------------------------------------
    def drain(self) -> dict:
        held = self._require_lease()
        hosts = {h.name: h for h in self.fleet.hosts(held)}
        to_drain = [n for n, h in hosts.items() if h.state == HostState.SERVING]
        if to_drain:
            self.fleet.drain(to_drain, self.op_id)
            self.ledger.note(self.op_id, "drain", to_drain, f"train {self.train.id}", actor=self.actor)

        def probe() -> tuple[bool, str]:
            now = self.fleet.hosts(held)
            left = [h.name for h in now if h.state in (HostState.SERVING, HostState.DRAINING)]
            return not left, f"drained {len(now) - len(left)}/{len(now)}"

        self._wait("drain", self.timeouts.drain_s, probe)
        return {"drained": len(to_drain)}

    # ---- 4. upgrade ----------------------------------------------------------------------------
    def upgrade(self) -> dict:
        held = self._require_lease()
        started: list[str] = []
        for h in self.fleet.hosts(held):
            if h.state == HostState.DRAINED and h.last_error is None and pending_steps(self.targets, h):
                self.fleet.upgrade(h.name, pending_steps(self.targets, h), self.op_id)
                started.append(h.name)
        if started:
            self.ledger.note(self.op_id, "upgrade", started, _fmt_targets(self.targets), actor=self.actor)

        def probe() -> tuple[bool, str]:
            now = self.fleet.hosts(held)
            busy = [h for h in now if h.state == HostState.UPGRADING]
            done = sum(1 for h in now if h.state != HostState.UPGRADING and not pending_steps(self.targets, h))
            return not busy, f"upgraded {done}/{len(now)} ({len(busy)} installing)"

        self._wait("upgrade", self.timeouts.upgrade_s, probe)
        offboarded = []
        for h in self.fleet.hosts(held):
            if h.state == HostState.DRAINED and h.last_error:
                self.offboard(h.name, f"upgrade failed: {h.last_error}")
                offboarded.append(h.name)
        upgraded = [h.name for h in self.fleet.hosts(held) if h.state == HostState.DRAINED]
        return {"upgraded": len(upgraded), "offboarded": offboarded}

    # ---- 5. health check -----------------------------------------------------------------------
    def check(self, hosts: list[str] | None = None) -> dict:
        """Deep health check of the drained hosts; failures go to repair with the evidence."""
        held = self._require_lease()
        names = hosts if hosts is not None else held
        todo = [h.name for h in self.fleet.hosts(names) if h.state in (HostState.DRAINED, HostState.CHECKING)]
        for name in todo:
            if self.ledger.verification(self.op_id, name) is None:
                self.fleet.start_check(name, self.targets, self.op_id)

        def probe() -> tuple[bool, str]:
            res = self.fleet.check_results(todo, self.op_id) if todo else []
            pending = [r for r in res if r.status == "pending"] + [None] * (len(todo) - len(res))
            passed = sum(1 for r in res if r.status == "passed")
            return not pending, f"health checks passed {passed}/{len(todo)} ({len(pending)} running)"

        self._wait("health check", self.timeouts.check_s, probe)
        failed: list[str] = []
        for r in self.fleet.check_results(todo, self.op_id) if todo else []:
            ok = r.status == "passed" and all(r.versions.get(c) == v for c, v in self.targets.items())
            self.ledger.record_verification(self.op_id, r.host, ok, r.versions, r.reason)
            if not ok:
                self.offboard(r.host, f"health check failed: {r.reason or 'versions not at target'}")
                failed.append(r.host)
        return {"checked": len(todo), "passed": len(todo) - len(failed), "offboarded": failed}

    def verified(self, host: Host) -> bool:
        """A passing check recorded for this op, and the host still at the versions it saw."""
        v = self.ledger.verification(self.op_id, host.name)
        if v is None or not v[0]:
            return False
        seen = v[1]
        return all(host.versions.get(c) == ver == seen.get(c) for c, ver in self.targets.items())

    # ---- 6. return ----------------------------------------------------------------------------
    def return_hosts(self) -> dict:
        """Return verified hosts, gate the rest, then release the lease. Runs whatever failed before.

        No host goes back without a passing check at the target versions: one that was never
        checked (a crash, a cleared task) is checked here first; one that cannot pass goes to repair.
        """
        held = self.held()
        if not held:
            return {"returned": 0, "offboarded": [], "note": "nothing held"}

        def settled() -> tuple[bool, str]:
            busy = [h.name for h in self.fleet.hosts(held) if h.state in (HostState.UPGRADING, HostState.CHECKING)]
            return not busy, f"waiting for {len(busy)} host(s) still busy before return"

        self._wait("in-flight work", self.timeouts.upgrade_s, settled)
        hosts = self.fleet.hosts(held)
        unverified = [h.name for h in hosts if h.state == HostState.DRAINED and not self.verified(h)]
        for name in unverified:
            h = next(x for x in hosts if x.name == name)
            if h.last_error:
                self.offboard(name, f"upgrade failed: {h.last_error}")
        gate = [h.name for h in self.fleet.hosts(unverified) if h.state == HostState.DRAINED]
        if gate:
            self.say(f"{self.domain.name}: {len(gate)} host(s) not yet verified; checking before return")
            self.check(gate)
        if any(h.state == HostState.DRAINING for h in self.fleet.hosts(held)):
            self._wait("drain before return", self.timeouts.drain_s,
                       lambda: (all(h.state != HostState.DRAINING for h in self.fleet.hosts(held)), "draining"))
        hosts = self.fleet.hosts(held)
        back = [h.name for h in hosts if h.state == HostState.DRAINED and self.verified(h)]
        stray = [h.name for h in hosts if h.state == HostState.DRAINED and h.name not in back]
        for name in stray:  # drained, not verified and not checkable: never returned unverified
            self.offboard(name, "could not be verified at target versions")
        if back:
            self.fleet.return_to_service(back, self.op_id)
            self.ledger.note(self.op_id, "return", back, "verified at " + _fmt_targets(self.targets), actor=self.actor)

        def probe() -> tuple[bool, str]:
            now = self.fleet.hosts(back)
            ok = sum(1 for h in now if h.state == HostState.SERVING)
            return ok == len(back), f"returned {ok}/{len(back)}"

        self._wait("return", self.timeouts.return_s, probe)
        final = self.fleet.hosts(held)
        out = [h.name for h in final if h.state not in (HostState.SERVING, *BROKEN_STATES)]
        if out:
            raise StopError(f"{self.domain.name}: hosts neither serving nor in repair: {', '.join(out)}")
        repaired = sorted(h.name for h in final if h.state in BROKEN_STATES)
        self.ledger.release(self.op_id, actor=self.actor, reason=f"returned {len(back)}, to repair {len(repaired)}")
        return {"returned": len(back), "offboarded": repaired}

    def offboard(self, host: str, reason: str) -> None:
        self.fleet.offboard(host, reason, self.op_id)
        self.ledger.note(self.op_id, "offboard", [host], reason, actor=self.actor)
        self.say(f"{self.domain.name}: {host} offboarded to repair: {reason}")


def _fmt_targets(targets: dict[str, str]) -> str:
    return ", ".join(f"{c}={v}" for c, v in targets.items())
