"""One domain stop of a train, as plain steps over a Fleet and the Ledger.

take -> checkpoints -> drain -> upgrade -> check -> return. Each step is idempotent: it reads
the world first and only does what is not done yet, so Airflow may run it again after a crash.
Every wait has its own deadline and ends with a `StopError` that says what did not happen.
The Airflow operators in `plugins/` are thin wrappers around these functions.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from railyard.domain import windows
from railyard.domain.config import DomainSpec, RailyardConfig, TimeoutsSpec, TrainSpec
from railyard.domain.models import BROKEN_STATES, CheckResult, Host, HostState, Job
from railyard.domain.planning import budget_for, pending, pending_steps, pool_hosts, stop_estimate_s
from railyard.fleet.port import (
    Fleet,
    FleetError,
    HealthGate,
    ReadsHostsOut,
    RequeuesSilentJobs,
    Reservations,
    TendsDetachedWork,
)
from railyard.ledger import Decision, Ledger
from railyard.operations import releases

log = logging.getLogger("railyard.stop")
TEND_EVERY_S = 5.0  # how often a waiting step relaunches its own detached work that is not running


class StopError(RuntimeError):
    """A stop cannot go on; the message is the one-line reason shown in the run."""


def op_id_for(train_id: str, run_id: str, domain: str) -> str:
    return f"{train_id}/{run_id}/{domain}"


def run_prefix(op_id: str) -> str:
    """`train/run_id/` of an operation id: what all stops of one run share."""
    return op_id.rsplit("/", 1)[0] + "/"


# ---- a stop's targets and the release outcomes it records (the rollout itself is in releases.py) ----
def stop_host_targets(stop: Stop) -> dict[str, dict[str, str]]:
    """host -> targets for a train stop, frozen in the operation once it holds the domain, so every
    step and retry of the stop sees the same targets. {} = the train's targets for every host."""
    cfg = stop.config
    led = stop.ledger
    if not releases.shaped(cfg):
        return {}
    detail = led.detail(stop.op_id) if led.operation(stop.op_id) is not None else None
    if detail is not None and "host_targets" in detail:
        return dict(detail["host_targets"])
    if stop.op_id.startswith("repair/"):
        t = (detail or {}).get("targets")
        return {h: t for h in stop.domain.hosts} if isinstance(t, dict) else {}
    rollout = releases.Rollout(cfg, led)
    # a probe (a trigger's poll) previews the gates: it never starts, promotes or halts a rollout
    for msg in rollout.refresh(stop.fleet.hosts(), stop.fleet.now(), write=not stop.probing):
        if not stop.probing:
            stop.say(msg)
    for rid in stop.train.releases:
        st = rollout.state(rid)
        if st.halted:
            stop.say(f"{stop.domain.name}: release {rid} is halted, not applied ({st.reason})")
    targets: dict[str, dict[str, str]] = {}
    rels: dict[str, list[str]] = {}
    for h in stop.domain.hosts:
        targets[h], rels[h] = releases.visit_targets(cfg, stop.train.releases, h, rollout.admits)
    if detail is not None and not stop.probing and led.holdings(stop.op_id):
        targets = led.set_detail_once(stop.op_id, "host_targets", targets)  # type: ignore[assignment]
        led.set_detail_once(stop.op_id, "host_releases", rels)
    return targets


def record_outcome(stop: Stop, host: str, passed: bool, reason: str) -> None:
    """Count a host's verdict for each release its visit applied (a failed install: the named one)."""
    record_outcomes(stop, [(host, passed, reason)])


def record_outcomes(stop: Stop, verdicts: list[tuple[str, bool, str]]) -> None:
    """`record_outcome` for many (host, passed, reason): a domain's in one read and one write."""
    if not verdicts or not releases.phased(stop.config) or stop.op_id.startswith("repair/"):
        return
    applied = stop.ledger.detail(stop.op_id).get("host_releases") or {}
    by_id = {r.id: r for r in stop.config.releases}
    rows: list[tuple[str, str, bool, str]] = []
    for host, passed, reason in verdicts:
        rels = applied.get(host) or []
        blamed = rels
        if not passed:
            named = [r for r in rels if f"{by_id[r].component} {by_id[r].version}" in reason]
            blamed = named or rels
        rows.extend((rid, host, passed, reason) for rid in blamed)
    if rows:
        stop.ledger.record_release_results(stop.op_id, rows, stop.fleet.now())


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
    revisit: bool = False  # a slot that comes back for a domain postponed by a dodge
    kind: str = "train_stop"  # or "emergency": first in line, takes over a train's hosts, no windows
    scope: list[str] | None = None  # only these hosts of the domain (an emergency's host scope)
    skip_checkpoint_reason: str | None = None  # drain without waiting for checkpoints (cost recorded)
    domains_at_once: int = 1  # an emergency with large_scale may take more domains together
    closing: bool = False  # its run is gone (railyard.operations.reconcile): finish safely, start no new install
    fixed_targets: dict[str, str] | None = None  # a repair's gate: the targets frozen when the host went out
    _host_targets: dict[str, Any] | None = field(default=None, init=False, repr=False)
    _train_targets: dict[str, str] | None = field(default=None, init=False, repr=False)
    probing: bool = field(default=False, init=False, repr=False)  # inside take(probe=True): read only

    @property
    def hosts(self) -> list[str]:
        return sorted(self.scope) if self.scope else list(self.domain.hosts)

    @property
    def targets(self) -> dict[str, str]:
        return dict(self._targets())

    def _targets(self) -> dict[str, str]:
        """`targets` itself, not a copy (asked for each of a domain's hosts, several times a step): never changed."""
        if self.fixed_targets is not None:
            return self.fixed_targets
        if self._train_targets is None:
            self._train_targets = self.config.train_targets(self.train)
        return self._train_targets

    def targets_for(self, host: str) -> dict[str, str]:
        """What this stop brings `host` to: the train's releases that the host's rollout phase admits,
        in apply order (railyard.operations.releases); exactly `targets` when no rollout or rule is configured.
        Outside work (railyard.operations.outside) installs nothing: a host's targets are the versions it had
        when it was handed over, which its check must find again. A train stop's answer is shared: read it,
        never change it."""
        if self.kind == "outside":
            if self._host_targets is None or host not in self._host_targets:
                self._host_targets = self.ledger.versions_before(self.op_id)
            return dict(self._host_targets.get(host, {}))
        if self.kind != "train_stop":
            return self.targets
        if self._host_targets is None:  # computed once per Stop; frozen in the ledger once the domain is held
            self._host_targets = stop_host_targets(self)
        found = self._host_targets.get(host)
        return self._targets() if found is None else found

    @property
    def timeouts(self) -> TimeoutsSpec:
        return self.config.timeouts

    def held(self) -> list[str]:
        return sorted(self.ledger.holdings(self.op_id))

    def _require_lease(self) -> list[str]:
        """The hosts this operation holds; refuses when it never got the domain.

        An operation whose every host went to repair holds nothing, legitimately: [].
        """
        held = self.held()
        op = self.ledger.operation(self.op_id)
        if not held and not (op is not None and op["state"] in ("active", "done")):
            raise StopError(
                f"{self.op_id} holds no lease on {self.domain.name}: refusing to touch its hosts "
                "(the capacity wait must grant the domain first)"
            )
        return held

    def _wait(self, what: str, timeout: float, probe: Callable[[], tuple[bool, str]]) -> None:
        deadline = self.clock() + timeout
        last = ""
        tend = self.fleet.tend if isinstance(self.fleet, TendsDetachedWork) else None  # a write step's job
        tended = self.clock()  # the step itself just launched what it needs; relaunch only what then stops
        while True:
            if tend is not None and self.clock() - tended >= TEND_EVERY_S:
                tend(self.held(), self.op_id)
                tended = self.clock()
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
    def take(self, probe: bool = False) -> Decision:
        """Lease the domain when freezes, windows, dodges and the buffers all allow it.

        Outcomes: granted; skip (nothing to do); dodge (postponed to a revisit at the end of the run);
        wait (with the reason and, for windows, when the next one opens); stop (the train must halt).
        `probe` (a trigger's poll): lease nothing, record nothing but the operation's place among the
        waiters; "free" when the lease would be granted now.
        """
        if probe:
            self.probing = True
            try:
                return self._take(probe=True)
            finally:  # what it previewed is forgotten: the step that takes the lease works it out for real
                self.probing = False
                self._host_targets = None
        return self._take(probe=False)

    def _take(self, probe: bool) -> Decision:
        if self.held():
            return Decision("granted", f"{self.op_id} already holds {self.domain.name}")
        now = self.fleet.now()
        if self.kind == "emergency":
            return self._take_emergency(probe)
        switch = self.ledger.switch("freeze")
        if switch is not None:
            return Decision("wait", f"freeze switched on by {switch['actor']}: {switch['reason']}")
        if windows.frozen(self.config.freeze, now):
            return Decision("wait", f"freeze date {windows.iso(now)[:10]} in force")
        if self.kind == "outside":
            return self._take_outside(probe)
        read, unavailable = self._fleet_around(list(self.domain.hosts))
        mine = [h for h in read.values() if h.domain == self.domain.name]
        workable = [h for h in mine if h.state not in BROKEN_STATES]
        if not any(pending(self.targets_for(h.name), h) for h in workable):
            if not probe:
                self.ledger.record_visit(self.train.id, self.domain.name, now, self.op_id)
            return Decision("skip", f"every host of {self.domain.name} is already at target")
        dodge = self._dodge(now, probe)
        if dodge is not None:
            return dodge
        if self.config.compatibility.rules:
            broken = releases.check_visit(self.config, workable, self.targets_for)
            if broken:
                return Decision("stop", f"{self.domain.name} refused before any host is touched: {'; '.join(broken)}")
        need = stop_estimate_s(self.config, lambda h: self.targets_for(h.name), workable)
        ok, next_open = windows.fits(self.train.window, now, need)
        if not ok:
            when = f"; next window that fits opens {windows.iso(next_open)}" if next_open else ""
            return Decision(
                "wait",
                f"a stop of ~{need / 60:.0f} min does not fit in the window "
                f"({windows.describe(self.train.window)}) at {windows.iso(now)}{when}",  # type: ignore[arg-type]
            )
        d = self.ledger.acquire_domain(
            self.op_id, train=self.train.id, domain=self.domain.name, hosts=list(self.domain.hosts),
            budget=budget_for(self.config, self.domain.sku), pool_hosts=pool_hosts(self.config, self.domain.sku),
            unavailable=unavailable, actor=self.actor, probe=probe,
        )
        if d.granted and releases.shaped(self.config):
            self._host_targets = None
            self.targets_for(self.domain.hosts[0])  # freeze what each host gets, before it is touched
        return d

    def _take_outside(self, probe: bool) -> Decision:
        """Outside work takes only its own hosts, under the same buffers and `max_domains_down` (its domain
        counts as out), and waits, never halts, when the failure buffer is spent: it only waits for room."""
        d = self.ledger.acquire_domain(
            self.op_id, train=self.train.id, domain=self.domain.name, hosts=self.hosts,
            budget=budget_for(self.config, self.domain.sku), pool_hosts=pool_hosts(self.config, self.domain.sku),
            unavailable=self._fleet_around([])[1], actor=self.actor, kind="outside", probe=probe,
        )
        return Decision("wait", d.reason) if d.outcome == "stop" else d

    def _fleet_around(self, names: list[str]) -> tuple[dict[str, Host], list[str]]:
        """The hosts `names` as the fleet has them (by name), and the fleet's hosts that count against capacity
        (`_unavailable`): from its hosts out of service when it can list them (two reads that do not grow
        with the fleet around the domain), else from one read of the whole fleet."""
        if isinstance(self.fleet, ReadsHostsOut):
            out = self.fleet.hosts_out()
            return {h.name: h for h in self.fleet.hosts(names)} if names else {}, self._unavailable(out)
        every = self.fleet.hosts()
        wanted = set(names)
        return {h.name: h for h in every if h.name in wanted}, self._unavailable(every)

    def _unavailable(self, fleet_hosts: Iterable[Host]) -> list[str]:
        """Every host that does not serve, whatever put it there, but the ones this stop would take: broken
        hosts, and hosts out of service that no operation may hold (drained by a dead run, back from repair
        drained, released by hand while out). The ledger counts a leased one once, as its operation's; an
        unleased one against the failure buffer. Broken hosts of the stop's own scope are not taken again."""
        mine = set(self.hosts)
        return [h.name for h in fleet_hosts
                if h.state in BROKEN_STATES or (h.state != HostState.SERVING and h.name not in mine)]

    def _take_emergency(self, probe: bool = False) -> Decision:
        """An emergency ignores windows, freezes and dodges (its reason is on record), waits ahead of
        every train, and takes over hosts a train's stop already has out instead of waiting for them."""
        fleet_hosts, unavailable = self._fleet_around(self.hosts)
        workable = [fleet_hosts[n] for n in self.hosts if fleet_hosts[n].state not in BROKEN_STATES]
        if not any(pending(self.targets, h) for h in workable):
            return Decision("skip", f"every host in scope on {self.domain.name} is already at target")
        holders = self.ledger.holdings()
        trains = sorted({holders[h] for h in self.hosts if h in holders
                         and (self.ledger.operation(holders[h]) or {}).get("kind") == "train_stop"})
        budget = budget_for(self.config, self.domain.sku)
        if self.domains_at_once > budget.max_domains_down:  # large scale, with a stated reason
            largest = max(len(d.hosts) for d in self.config.domains if d.sku == self.domain.sku)
            budget = replace(budget, max_domains_down=self.domains_at_once,
                             maintenance_hosts=max(budget.maintenance_hosts, largest * self.domains_at_once))
        d = self.ledger.acquire_domain(
            self.op_id, train=self.train.id, domain=self.domain.name, hosts=self.hosts, kind="emergency",
            budget=budget, pool_hosts=pool_hosts(self.config, self.domain.sku),
            unavailable=unavailable, actor=self.actor, take_over_from=trains, probe=probe,
        )
        if d.granted and trains:
            try:
                for src in trains:
                    # in the fleet, only what it holds under `src`: a host that failed by itself (or that `src`
                    # never took out) is no operation's there, and passes with the lease alone
                    moved = [h for h in self.hosts if holders.get(h) == src and fleet_hosts[h].operation == src]
                    self.fleet.handover(moved, src, self.op_id)
                    stray = [h for h in self.hosts if holders.get(h) == src and h not in moved
                             and fleet_hosts[h].state in BROKEN_STATES]
                    forget = getattr(self.fleet, "forget", None)  # and `src`'s own record of them ends (Slurm)
                    if forget is not None and stray:
                        forget(stray, src)
            except Exception as exc:  # put everything back as it was: nothing half-handed over
                now = {h.name: h for h in self.fleet.hosts(self.hosts)}
                for src in trains:
                    back = [h for h in self.hosts if holders.get(h) == src and now[h].operation == self.op_id]
                    if back:
                        self.fleet.handover(back, self.op_id, src)
                for src in trains:
                    self.ledger.handover([h for h in self.hosts if holders.get(h) == src], self.op_id, src,
                                         kind="train_stop", reason=f"takeover undone: {exc}", actor=self.actor)
                raise StopError(f"{self.domain.name}: could not take over from {', '.join(trains)}: {exc}") from exc
            self.say(f"{self.domain.name}: {d.reason}")
        return d

    def _dodge(self, now: float, probe: bool = False) -> Decision | None:
        """A job on the domain asked to be left alone until a deadline: postpone, within bounds.
        A `probe` says so and records nothing (the task it wakes records the dodge or its refusal)."""
        if self.revisit:
            op = self.ledger.operation(self.op_id)
            until = float(self.ledger.detail(self.op_id).get("dodge_until", 0)) if op else 0.0
            if now < until:
                return Decision("wait", f"{self.domain.name} dodged until {windows.iso(until)}")
            return None
        dodgers = [j for j in self.fleet.jobs(list(self.domain.hosts)) if j.dodge_until and j.dodge_until > now]
        if not dodgers:
            return None
        until = max(j.dodge_until or 0.0 for j in dodgers)
        names = [j.id for j in dodgers]
        dodged = self.ledger.operations_like(run_prefix(self.op_id), state="dodged")
        if until - now > self.train.max_dodge_s:
            why = f"beyond max_dodge_s={self.train.max_dodge_s:.0f}s"
        elif len(dodged) >= self.train.max_dodges:
            why = f"this run already postponed max_dodges={self.train.max_dodges} domain(s)"
        else:
            if probe:
                return Decision("dodge", f"{', '.join(names)} ask to dodge {self.domain.name}")
            self.ledger.record_dodge(self.op_id, train=self.train.id, domain=self.domain.name, until=until, jobs=names)
            return Decision("dodge", f"{', '.join(names)} dodge {self.domain.name} until {windows.iso(until)}: "
                                     "visited again at the end of the run")
        if probe:
            return None
        self.ledger.note(self.op_id, "dodge_refused", [], f"{', '.join(names)} asked until {windows.iso(until)}: {why}")
        self.say(f"{self.domain.name}: dodge by {', '.join(names)} refused ({why})")
        return None

    # ---- 2. checkpoints ------------------------------------------------------------------------
    def request_checkpoints(self) -> tuple[list[str], float]:
        """Ask every job on the domain to checkpoint; the request time is kept for retries."""
        held = self._require_lease()
        jobs = [j for j in self.fleet.jobs(held) if j.state == "running"]
        if self.skip_checkpoint_reason:
            return [j.id for j in jobs], self._skip_checkpoints(jobs)
        self._reserve()
        recorded = self.ledger.detail(self.op_id).get("checkpoint_requested_at")
        if recorded is None:
            at = self.fleet.request_checkpoint([j.id for j in jobs]) if jobs else self.fleet.now()
            # the ids before the time: a retry after a crash between the two asks again and keeps both
            self.ledger.add_detail_entries(self.op_id, "checkpoints_asked", {j.id: at for j in jobs})
            recorded = self.ledger.set_detail_once(self.op_id, "checkpoint_requested_at", at)
            self.ledger.note(self.op_id, "checkpoint_requested", held,
                             f"jobs: {', '.join(j.id for j in jobs) or 'none'}")
        return [j.id for j in jobs], float(recorded)  # type: ignore[arg-type]

    def _skip_checkpoints(self, jobs: list[Job]) -> float:
        """Someone chose to drain without fresh checkpoints: record who pays, and how much."""
        if "checkpoint_skipped" not in self.ledger.detail(self.op_id):
            now = self.fleet.now()
            cost = {j.id: round((now - j.last_checkpoint) / 3600 * j.gpus, 3) for j in jobs}
            self.ledger.set_detail_once(self.op_id, "checkpoint_skipped", {"reason": self.skip_checkpoint_reason,
                                                                           "gpu_hours_at_risk": cost})
            self.ledger.note(self.op_id, "checkpoint_skipped", self.held(),
                             f"{self.skip_checkpoint_reason}; GPU-hours at risk: {sum(cost.values()):.2f} "
                             f"({', '.join(f'{k}={v}' for k, v in cost.items()) or 'no jobs'})", actor=self.actor)
        return float("-inf")

    def _cost_of_skipping(self, hosts: list[str]) -> None:
        """At the drain of a stop that skips checkpoints: a job on `hosts` that came after the skip was recorded
        (placed on the domain since) has its cost recorded too, before it is drained; and if the checkpoint step
        never ran (marked success by hand), the skip and its cost are recorded here as that step would have."""
        if "checkpoint_skipped" not in self.ledger.detail(self.op_id):
            self._skip_checkpoints([j for j in self.fleet.jobs(self.held()) if j.state == "running"])
        skipped = self.ledger.detail(self.op_id).get("checkpoint_skipped") or {}
        known = set(skipped.get("gpu_hours_at_risk") or {})
        late = [j for j in self.fleet.jobs(hosts) if j.state == "running" and j.id not in known]
        if not late:
            return
        now = self.fleet.now()
        cost = {j.id: round((now - j.last_checkpoint) / 3600 * j.gpus, 3) for j in late}
        self.ledger.add_detail_entries(self.op_id, "gpu_hours_at_risk_late", cost)
        self.ledger.note(self.op_id, "checkpoint_skipped", hosts,
                         f"{self.skip_checkpoint_reason}; placed since: GPU-hours at risk: {sum(cost.values()):.2f} "
                         f"({', '.join(f'{k}={v}' for k, v in cost.items())})", actor=self.actor)

    def _reserve(self) -> None:
        """Fleets with reservations (Slurm) reserve the domain as soon as its lease is granted, and a
        train's first visit reserves its later domains at their expected windows (a revisit or an
        emergency only its own). The stop's return deletes its own; the run's end the rest."""
        if not isinstance(self.fleet, Reservations):
            return
        later: list[str] = []
        if self.kind == "train_stop" and not self.revisit:
            order = [d.name for d in self.config.train_domains(self.train)]
            later = order[order.index(self.domain.name) + 1:] if self.domain.name in order else []
        self.fleet.reserve(self.op_id, [self.domain.name, *later])

    def stale_jobs(self, since: float) -> list[str]:
        """Running jobs on the domain whose last checkpoint is older than `since`. A read: changes nothing."""
        if self.skip_checkpoint_reason:
            return []
        return sorted(j.id for j in self.fleet.jobs(self.held()) if j.state == "running" and j.last_checkpoint < since)

    def _requeue_policy(self) -> float | None:
        """`grace_s` when the fleet requeues jobs that stay silent (Slurm's `checkpoint.policy: requeue`)."""
        return self.fleet.requeue_grace_s() if isinstance(self.fleet, RequeuesSilentJobs) else None

    def policy_due(self, since: float) -> list[str]:
        """Silent jobs whose grace has run out under the requeue policy. A read (triggers call it)."""
        grace = self._requeue_policy()
        if grace is None or self.fleet.now() - since < grace:
            return []
        return self.stale_jobs(since)

    def enforce_checkpoint_policy(self, since: float) -> list[str]:
        """In the stop's checkpoint step only: requeue this domain's silent jobs once their grace has run
        out, recording the work each loses. Returns the jobs requeued."""
        due = self.policy_due(since)
        if not due or not isinstance(self.fleet, RequeuesSilentJobs):  # (never due without the capability)
            return []
        grace = self._requeue_policy()
        why = f"no checkpoint {grace:.0f}s after the request"
        done = self.fleet.requeue_silent(due, self.op_id, why)
        if done:
            self.ledger.note(self.op_id, "checkpoint_policy_requeue", self.held(),
                             f"{why}: requeued {', '.join(done)} (work since their last checkpoint lost)",
                             actor=self.actor)
        return list(done)

    # ---- 3. drain ------------------------------------------------------------------------------
    def drain(self) -> dict[str, Any]:
        held = self._require_lease()
        serving = [h for h in self.fleet.hosts(held) if h.state == HostState.SERVING]
        to_drain = [h.name for h in serving]
        jobs = None
        if to_drain and not self.skip_checkpoint_reason:
            jobs = self._fresh_before_drain(to_drain)
        elif to_drain:
            self._cost_of_skipping(to_drain)
        if to_drain:
            self._record_loss(to_drain, jobs)
            self.fleet.drain(to_drain, self.op_id)
            # while the hosts drain: the note, their versions before any install (for the run's report; the
            # upgrade records any host it finds unrecorded), and the capacity with the domain out
            self.ledger.note(self.op_id, "drain", to_drain, f"{self.kind} {self.train.id}", actor=self.actor)
            self.ledger.record_versions_before(self.op_id, {h.name: h.versions for h in serving})
        self._sample_capacity()
        self._wait_drained(held)
        return {"drained": len(to_drain)}

    def _record_loss(self, hosts: list[str], jobs: list[Job] | None = None) -> None:
        """The GPU-hours each running job on `hosts` loses to the drain (its work since its last checkpoint),
        for the run's report: a job's first figure stays (a retried drain finds it requeued). `jobs`: the
        running jobs on `hosts` as just read (None: read them)."""
        if jobs is None:
            jobs = [j for j in self.fleet.jobs(hosts) if j.state == "running"]
        if jobs:
            now = self.fleet.now()
            self.ledger.add_detail_entries(self.op_id, "gpu_hours_lost", {
                j.id: round(max(0.0, now - j.last_checkpoint) / 3600 * j.gpus, 4) for j in jobs})

    def _fresh_before_drain(self, hosts: list[str]) -> list[Job]:
        """Invariant 5 at the drain itself, whatever happened to the checkpoint wait (marked success by hand,
        a job placed on the domain after it passed): every running job on `hosts` has checkpointed since it
        was asked to. A job never asked (the request was never made, or the job came later) is asked now;
        then the drain waits, within `checkpoint_wait_s`, or refuses to drain. An emergency's stated skip
        (`skip_checkpoint_reason`) is the only way past it. Returns the running jobs on `hosts` as last read."""
        jobs = [j for j in self.fleet.jobs(hosts) if j.state == "running"]
        if not jobs:
            return jobs
        recorded = self.ledger.detail(self.op_id).get("checkpoint_requested_at")
        since = float(recorded) if recorded is not None else None
        asked_at = {j.id: max(since or float("-inf"), j.checkpoint_requested_at or float("-inf")) for j in jobs}
        late = [j.id for j in jobs if since is None or j.checkpoint_requested_at is None
                or j.checkpoint_requested_at < since]
        if late:
            at = self.fleet.request_checkpoint(late)
            self.ledger.add_detail_entries(self.op_id, "checkpoints_asked", {jid: at for jid in late})
            if since is None:
                self.ledger.set_detail_once(self.op_id, "checkpoint_requested_at", at)
            self.ledger.note(self.op_id, "checkpoint_requested", hosts,
                             f"at the drain, jobs not yet asked: {', '.join(late)}", actor=self.actor)
            asked_at.update({jid: at for jid in late})
            self.say(f"{self.domain.name}: asked {', '.join(late)} to checkpoint before the drain")

        if not late and all(j.last_checkpoint >= asked_at[j.id] for j in jobs):
            return jobs  # every one checkpointed since it was asked, as just read
        running = jobs

        def probe() -> tuple[bool, str]:
            nonlocal running
            running = [j for j in self.fleet.jobs(hosts) if j.state == "running"]
            now = [j for j in running if j.id in asked_at]
            stale = sorted(j.id for j in now if j.last_checkpoint < asked_at[j.id])
            return not stale, (f"waiting before the drain for checkpoints of {', '.join(stale)}" if stale
                               else "every job on the domain has a fresh checkpoint")

        try:
            self._wait("checkpoints before the drain", self.timeouts.checkpoint_wait_s, probe)
        except StopError as exc:
            raise StopError(f"{self.domain.name}: not drained, jobs would lose work since their last checkpoint: "
                            f"{exc}") from None
        return running

    def _drained_again(self, names: list[str], read: dict[str, Host] | None = None) -> list[Host]:
        """The held hosts `names` as the fleet has them, once any it put back in service (a Slurm controller
        restart loses drains) is drained again: nothing is installed on or checked on a serving host. One
        read of the fleet when no drain was lost; none when `read` (the step's own read of them, nothing
        written since) is given."""
        now = self._adopt([read[n] for n in names] if read is not None else self.fleet.hosts(names))
        lost = [h.name for h in now if h.state == HostState.SERVING]
        if not lost:
            return now
        self.say(f"{self.domain.name}: {', '.join(lost)} back in service though held (a drain the fleet lost, or "
                 "a drain step marked success); draining again")
        if not self.skip_checkpoint_reason:  # a drain is a drain: its jobs checkpoint first (invariant 5)
            self._fresh_before_drain(lost)
        else:
            self._cost_of_skipping(lost)
        self.fleet.drain(lost, self.op_id)
        self.ledger.note(self.op_id, "drain_again", lost, f"{self.kind} {self.train.id}", actor=self.actor)
        self._wait_drained(names)
        return self.fleet.hosts(names)

    def _adopt(self, hosts: list[Host]) -> list[Host]:
        """`hosts` as the fleet has them, once those this operation holds in the ledger but the fleet still
        names another operation for are handed over in the fleet too: a takeover that raced the other
        operation's drain (the emergency took the lease while the train's drain was on its way, so the fleet
        had nothing to hand over then). The ledger's lease is the truth; the other operation holds none of them."""
        strays: dict[str, list[str]] = {}
        for h in hosts:
            if h.operation is not None and h.operation != self.op_id:
                strays.setdefault(h.operation, []).append(h.name)
        if not strays:
            return hosts
        holders = self.ledger.holdings()
        moved = False
        for src, names in sorted(strays.items()):
            mine = [n for n in names if holders.get(n) == self.op_id]
            if mine:
                self.fleet.handover(mine, src, self.op_id)
                self.ledger.note(self.op_id, "adopted", mine, f"the fleet still named {src}, which holds no lease "
                                 "on them any more (its drain raced the takeover)", actor=self.actor)
                self.say(f"{self.domain.name}: {', '.join(mine)} handed over from {src} in the fleet too")
                moved = True
        return self.fleet.hosts([h.name for h in hosts]) if moved else hosts

    def _wait_idle(self, names: list[str], what: str, timeout: float, status: str) -> dict[str, Host]:
        """Until none of `names` installs or checks (for another operation, before a takeover); the hosts as
        the last poll read them."""
        last: dict[str, Host] = {}

        def probe() -> tuple[bool, str]:
            last.clear()
            last.update((h.name, h) for h in self.fleet.hosts(names))
            return not any(h.state in (HostState.UPGRADING, HostState.CHECKING) for h in last.values()), status

        self._wait(what, timeout, probe)
        return last

    def _wait_drained(self, names: list[str]) -> None:
        """Until none of `names` serves or drains."""
        def probe() -> tuple[bool, str]:
            now = self.fleet.hosts(names)
            left = [h.name for h in now if h.state in (HostState.SERVING, HostState.DRAINING)]
            return not left, f"drained {len(now) - len(left)}/{len(now)}"

        self._wait("drain", self.timeouts.drain_s, probe)

    def _sample_capacity(self, read: list[Host] | None = None) -> None:
        """A point of the fleet's serving capacity in the ledger, for the Railyard page's chart, and the fleet's
        counts for the metrics. Not worth failing a stop for: a fleet that cannot say leaves them a point older.
        `read`: hosts of the domain as the step has just read them (the domain's counts are taken from them when
        they are all of its hosts)."""
        try:
            cap = self.fleet.capacity()
        except FleetError as exc:
            self.say(f"{self.domain.name}: capacity not sampled: {exc}")
            return
        self.ledger.sample_capacity(cap.now, cap.serving_hosts, cap.total_hosts, self.op_id)
        from railyard.operations.fleetcounts import record_fleet

        try:
            record_fleet(self.fleet, self.ledger, self.config, self.domain, read=read, now=cap.now)
        except FleetError as exc:
            self.say(f"{self.domain.name}: fleet counts not recorded: {exc}")

    # ---- 4. upgrade ----------------------------------------------------------------------------
    def upgrade(self) -> dict[str, Any]:
        held = self._require_lease()
        # hosts taken over from another operation may still be installing or checking for it
        seen = self._wait_idle(held, "in-flight work", self.timeouts.upgrade_s, "waiting for work in flight")
        # a host this stop offboarded is never upgraded by it again
        settled = self._settle_repairs(seen.values())
        mine = self.ledger.holdings(self.op_id)  # hosts taken over meanwhile (an emergency) are not ours any more
        ours = [n for n in held if n in mine]
        drained = [h for h in self._drained_again(ours, None if settled else seen)
                   if h.state == HostState.DRAINED and h.last_error is None]
        self.ledger.record_versions_before(self.op_id, {h.name: h.versions for h in drained})  # first attempt's
        work = {h.name: pending_steps(self.targets_for(h.name), h) for h in drained}
        started = [n for n, steps in work.items() if steps]
        if started:  # one call for the domain: the fleet fans out by its own means
            self.fleet.upgrade_hosts({n: work[n] for n in started}, self.op_id)
        if started:
            self.ledger.note(self.op_id, "upgrade", started, _fmt_targets(self.targets), actor=self.actor)

        last: list[Host] = []

        def probe() -> tuple[bool, str]:
            last[:] = now = self.fleet.hosts(held)
            busy = [h for h in now if h.state == HostState.UPGRADING]
            done = sum(1 for h in now
                       if h.state != HostState.UPGRADING and not pending(self.targets_for(h.name), h))
            return not busy, f"upgraded {done}/{len(now)} ({len(busy)} installing)"

        self._wait("upgrade", self.timeouts.upgrade_s, probe)
        holding = set(self.held())  # an emergency may have taken some over meanwhile
        # the poll that saw the last install end (read again should the lease hold a host it did not read)
        after = [h for h in last if h.name in holding] if holding <= {h.name for h in last} else \
            self.fleet.hosts(sorted(holding))
        offboarded = []
        known = set(self.offboarded())
        for h in after:
            if h.state == HostState.DRAINED and h.last_error:
                self.offboard(h.name, f"upgrade failed: {h.last_error}", known)
                offboarded.append(h.name)
        upgraded = [h.name for h in after if h.state == HostState.DRAINED and h.name not in offboarded]
        return {"upgraded": len(upgraded), "offboarded": offboarded}

    # ---- 5. health check -----------------------------------------------------------------------
    def check(self, hosts: list[str] | None = None) -> dict[str, Any]:
        """Deep health check of the drained hosts; failures go to repair with the evidence."""
        held = self._require_lease()
        names = hosts if hosts is not None else held
        # nor checked by it; `known`: what it offboarded, read once
        first = {h.name: h for h in self.fleet.hosts(held)} if hosts is None else None
        known = self._settle_repairs(first.values()) if first is not None else set(self.offboarded())
        mine = self.ledger.holdings(self.op_id)  # not the hosts taken over meanwhile
        ours = [n for n in names if n in mine]
        others = [n for n in names if n not in mine]
        read = first if first is not None and not known else None  # nothing handed over since that read
        now = (self._drained_again(ours, read) if ours else []) + (self.fleet.hosts(others) if others else [])
        todo_hosts = {h.name: h for h in now if h.state in (HostState.DRAINED, HostState.CHECKING)}
        todo = list(todo_hosts)
        expect = {n: self.expected(h) for n, h in todo_hosts.items()}
        checked = self.ledger.verifications(self.op_id, todo)
        start = [n for n in todo if n in mine and n not in checked]
        if start:
            self.fleet.start_checks({n: expect[n] for n in start}, self.op_id)
            self.ledger.note(self.op_id, "check", start, "deep health check at " + _fmt_targets(self.targets),
                             actor=self.actor)

        results: list[CheckResult] = []

        def probe() -> tuple[bool, str]:
            results[:] = res = self.fleet.check_results(todo, self.op_id) if todo else []
            pending = [r for r in res if r.status == "pending"] + [None] * (len(todo) - len(res))
            passed = sum(1 for r in res if r.status == "passed")
            return not pending, f"health checks passed {passed}/{len(todo)} ({len(pending)} running)"

        self._wait("health check", self.timeouts.check_s, probe)
        still = set(self.held())  # an emergency may have taken some over meanwhile
        verdicts: list[tuple[str, bool, str | None]] = []  # host, passed, reason
        versions: dict[str, dict[str, str]] = {}
        for r in results:  # as the poll that saw the last check end read them
            if r.host not in still:
                continue
            want = expect[r.host] if r.host in expect else self.targets_for(r.host)
            ok = r.status == "passed" and all(r.versions.get(c) == v for c, v in want.items())
            broken = releases.broken_rules(self.config.rules(), dict(r.versions)) if ok and self.closing else []
            reason = r.reason or ("" if ok else "versions not at target")
            if broken:  # a half-done install of a crashed run: never back in service in that mix
                seen = ", ".join(f"{c}={r.versions.get(c, '-')}" for c in broken[0].components)
                ok, reason = False, f"versions break the rule {broken[0].text!r}: {seen}"
            verdicts.append((r.host, ok, r.reason if ok else reason))
            versions[r.host] = dict(r.versions)
        # the domain's verdicts in one write; then each failure goes to repair (a crash between the two: the
        # next run of this step, or the return, finds the failed verdict and offboards the host)
        self.ledger.record_verifications(self.op_id, [(h, ok, versions[h], why) for h, ok, why in verdicts])
        # a check at versions no release brought is no outcome
        record_outcomes(self, [(host, ok, why or "") for host, ok, why in verdicts
                               if host not in expect or expect[host] == self.targets_for(host)])
        failed: list[str] = []
        for host, ok, why in verdicts:
            reason = why or ""
            if not ok:
                self.offboard(host, f"health check failed: {reason}", known)
                failed.append(host)
        self.halt_if_failing()
        return {"checked": len(todo), "passed": len(todo) - len(failed), "offboarded": failed}

    def halt_if_failing(self) -> None:
        """Stop the train when too many of this run's hosts failed: the release is not safe."""
        leased, failed, reasons = self.ledger.run_failures(run_prefix(self.op_id))
        if leased and failed / leased > self.train.max_failure_fraction:
            raise StopError(
                f"train halted: {failed} of {leased} hosts failed in this run "
                f"({failed / leased:.0%} > max_failure_fraction {self.train.max_failure_fraction:.0%}); "
                f"first: {reasons[0]}"
            )

    def expected(self, host: Host) -> dict[str, str]:
        """The versions a check must find on `host`: its targets, or, when the stop is closing for a run
        that is gone and the host never reached them, the versions it has (no new install is started)."""
        targets = self.targets_for(host.name)
        if not self.closing or not pending(targets, host):
            return targets
        # a component the host does not report is expected at its target: the check then fails (closed)
        return {c: host.versions.get(c, v) for c, v in targets.items()}

    def verified(self, host: Host, known: dict[str, tuple[bool, dict[str, str], str | None]] | None = None) -> bool:
        """A passing check recorded for this op, and the host still at the versions it saw. `known`: the op's
        verifications, read once for a domain (`ledger.verifications`)."""
        v = known.get(host.name) if known is not None else self.ledger.verification(self.op_id, host.name)
        if v is None or not v[0]:
            return False
        seen = v[1]
        return all(host.versions.get(c) == ver == seen.get(c) for c, ver in self.expected(host).items())

    # ---- 6. return ----------------------------------------------------------------------------
    def return_hosts(self) -> dict[str, Any]:
        """Return verified hosts, gate the rest, then release the lease. Runs whatever failed before.

        No host goes back without a passing check at the target versions: one that was never
        checked (a crash, a cleared task) is checked here first; one that cannot pass goes to repair.
        """
        held = self.held()
        if not held:  # never taken, already returned, taken over, or every host went to repair
            self._settle_repairs([])
            if self.ledger.operation(self.op_id) is not None and self.kind == "train_stop" and not self.closing:
                self._revisit_if_taken_over()
                self.ledger.record_visit(self.train.id, self.domain.name, self.fleet.now(), self.op_id)
            return {"returned": 0, "offboarded": self.offboarded()}

        last: list[Host] = []

        def settled() -> tuple[bool, str]:
            last[:] = self.fleet.hosts(held)
            busy = [h.name for h in last if h.state in (HostState.UPGRADING, HostState.CHECKING)]
            return not busy, f"waiting for {len(busy)} host(s) still busy before return"

        self._wait("in-flight work", self.timeouts.upgrade_s, settled)
        hosts = list(last)
        repaired_before = self._settle_repairs(hosts)
        held = self.held()
        holding = set(held)
        hosts = [h for h in hosts if h.name in holding]
        known = self.ledger.verifications(self.op_id)
        unverified = [h for h in hosts if h.state == HostState.DRAINED and not self.verified(h, known)]
        seen = set(self.offboarded())
        for h in unverified:
            if h.last_error:
                self.offboard(h.name, f"upgrade failed: {h.last_error}", seen)
        unverified_names = [h.name for h in unverified]
        gate = [h.name for h in self.fleet.hosts(unverified_names) if h.state == HostState.DRAINED]
        if gate:
            self.say(f"{self.domain.name}: {len(gate)} host(s) not yet verified; checking before return")
            self.check(gate)
        reread = bool(unverified or repaired_before)
        if reread:  # the fleet was written since that read: read the hosts again
            hosts = self.fleet.hosts(held)
            known = self.ledger.verifications(self.op_id)
        if any(h.state == HostState.DRAINING for h in hosts):
            def drained() -> tuple[bool, str]:
                last[:] = self.fleet.hosts(held)
                return all(h.state != HostState.DRAINING for h in last), "draining"

            self._wait("drain before return", self.timeouts.drain_s, drained)
            hosts, reread = list(last), True
        # not read again: the hosts and verdicts just judged, where every drained host passed
        back = [h.name for h in hosts if h.state == HostState.DRAINED and (not reread or self.verified(h, known))]
        returning = set(back)
        stray = [h.name for h in hosts if h.state == HostState.DRAINED and h.name not in returning]
        seen = set(self.offboarded())
        for name in stray:  # drained, not verified and not checkable: never returned unverified
            self.offboard(name, "could not be verified at target versions", seen)
        if back:
            self.fleet.return_to_service(back, self.op_id)
            self.ledger.note(self.op_id, "return", back, "verified at " + _fmt_targets(self.targets), actor=self.actor)

        def probe() -> tuple[bool, str]:
            last[:] = now = self.fleet.hosts(held)  # the whole lease's: what the wait below looks at too
            ok = sum(1 for h in now if h.name in returning and h.state == HostState.SERVING)
            return ok == len(back), f"returned {ok}/{len(back)}"

        self._wait("return", self.timeouts.return_s, probe)

        # hosts that another run of this teardown returned meanwhile (two reconcilers) are on their way too
        def returned() -> tuple[bool, str]:
            names = self.held()
            if names != held or any(h.state == HostState.RETURNING for h in last):  # else as the probe read them
                last[:] = self.fleet.hosts(names)
            return not [h for h in last if h.state == HostState.RETURNING], "returning"

        self._wait("return", self.timeouts.return_s, returned)
        final = list(last)
        # offboarded meanwhile (a stray, a failed gate): never released in repair
        self._settle_repairs(final, handovers=False)
        still = self.ledger.holdings(self.op_id)
        final = [h for h in final if h.name in still]
        out = [h.name for h in final if h.state not in (HostState.SERVING, *BROKEN_STATES)]
        if out:
            raise StopError(f"{self.domain.name}: hosts neither serving nor in repair: {', '.join(out)}")
        self._let_go([h.name for h in final if h.state == HostState.FAILED])
        self._sample_capacity(final)
        repaired = self.offboarded()
        why = (f"returned {len(back)}, to repair {len(repaired)}"
               + (" (closing: its run is gone)" if self.closing else ""))
        if self.op_id.startswith("repair/"):
            # a repair keeps what is in repair now (a failed gate), whatever its history says
            kept = [h.name for h in final if h.state in BROKEN_STATES]
            self.ledger.release(self.op_id, [h.name for h in final if h.name not in kept], actor=self.actor, reason=why)
            return {"returned": len(back), "offboarded": kept}
        self.ledger.release(self.op_id, actor=self.actor, reason=why)
        if self.kind == "train_stop" and not self.closing:
            self._revisit_if_taken_over()
            self.ledger.record_visit(self.train.id, self.domain.name, self.fleet.now(), self.op_id)
        return {"returned": len(back), "offboarded": repaired}

    def _let_go(self, hosts: list[str]) -> None:
        """Hosts released while failed (someone else's drain, a host that broke): fleets that keep a record
        of what an operation holds (Slurm's health gate) end it with the lease."""
        forget = getattr(self.fleet, "forget", None)
        if forget is not None and hosts:
            forget(hosts, self.op_id)

    def _revisit_if_taken_over(self) -> None:
        """An emergency took (some of) this stop's hosts: the train comes back for the domain in a
        revisit slot at the end of the run, so its own releases are not silently skipped."""
        handed = self.ledger.audit_rows(self.op_id, limit=None, action="handed_over")
        taken = {h for r in handed for h in r["hosts"]}
        if taken and not self.revisit:
            by = sorted({r["reason"].removeprefix("taken over by ") for r in handed})
            self.ledger.mark_for_revisit(self.op_id, f"{len(taken)} host(s) taken over by {', '.join(by)}")
            self.say(f"{self.domain.name}: taken over by {', '.join(by)}; coming back at the end of the run")

    def offboarded(self) -> list[str]:
        # every one, however long the operation's audit (a domain's verdicts alone are a row per host)
        rows = self.ledger.audit_rows(self.op_id, limit=None, action="offboard")
        return sorted({h for r in rows for h in r["hosts"]})

    def offboard(self, host: str, reason: str, seen: set[str] | None = None) -> None:
        """Hand the host to a repair operation: it stays out, counts against the failure buffer,
        carries its evidence, and comes back only through the health gate. Idempotent across every gap:
        a host the fleet already has in repair (an answer lost, a worker killed after the fleet call) is
        found by the next step's `_settle_repairs`, which finishes the ledger's part. A loop over many hosts
        passes `seen` (`set(self.offboarded())`, read once) so that a domain's offboards read the audit once.
        The ledger records the offboard before the fleet is asked: an answer lost after the fleet applied it
        (and a repair team done with the host before the next step) still leaves the host to its repair."""
        if seen is None:
            seen = set(self.offboarded())
        self._note_offboard(host, reason, seen)
        self.fleet.offboard(host, reason, self.op_id)
        self._record_offboard(host, reason, seen)

    def _note_offboard(self, host: str, reason: str, seen: set[str]) -> None:
        if host not in seen:
            self.ledger.note(self.op_id, "offboard", [host], reason, actor=self.actor)
            record_outcome(self, host, False, reason)
            self.say(f"{self.domain.name}: {host} offboarded to repair: {reason}")
            seen.add(host)

    def _record_offboard(self, host: str, reason: str, seen: set[str] | None = None) -> None:
        """The ledger's part of an offboard (note, release outcome, lease handed to the repair), each once."""
        if seen is None:
            seen = set(self.offboarded())
        self._note_offboard(host, reason, seen)
        if self.op_id.startswith("repair/"):
            return  # a repair whose gate failed keeps the host
        repair_op = f"repair/{host}/{self.op_id}"
        self.ledger.handover([host], self.op_id, repair_op, kind="repair", reason=reason, actor=self.actor,
                             domain=self.domain.name, detail={"reason": reason, "targets": self.targets_for(host),
                                                              "from": self.op_id})
        self.fleet.handover([host], self.op_id, repair_op)

    def _settle_repairs(self, hosts: Iterable[Host], *, handovers: bool = True) -> set[str]:
        """Finish every offboard a crash or a lost answer left half-done, before any lease is released:
        a held host the fleet has in repair goes to its repair operation (never released with no repair
        holding it), and a host whose lease a repair took while the fleet still names this operation is
        handed over in the fleet too."""
        seen = set(self.offboarded())
        if self.op_id.startswith("repair/"):
            return seen
        for h in hosts:
            if h.state == HostState.REPAIR:
                self._record_offboard(h.name, h.reason or f"found in repair while held by {self.op_id}", seen)
        if not seen:  # nothing offboarded: nothing half handed over
            return seen
        # offboarded, but still leased here (the step died before the lease went to its repair): the repair gets
        # it now, whatever the fleet did with it meanwhile (a repair team done with it), never this stop's work
        for name in sorted(seen & set(self.ledger.holdings(self.op_id))):
            self._record_offboard(name, f"offboarded by {self.op_id} before its lease went to the repair", seen)
        for name in sorted(seen) if handovers else []:
            repair_op = f"repair/{name}/{self.op_id}"
            if name in self.ledger.holdings(repair_op):
                self.fleet.handover([name], self.op_id, repair_op)
        return seen


def end_run(config: RailyardConfig, train: TrainSpec, fleet: Fleet, ledger: Ledger) -> list[str]:
    """A run has ended (done, failed or halted): the health gate runs once more, and the reservations
    its stops made ahead for domains that no operation now holds are deleted (fleets with
    reservations: Slurm). Idempotent."""
    if isinstance(fleet, HealthGate):  # the last word of the run: drains and resumes a restarted controller lost
        fleet.enforce_gate()
    if not isinstance(fleet, Reservations):
        return []
    domain_of = config.host_domain()
    held = {domain_of[h] for h in ledger.holdings() if h in domain_of}
    return list(fleet.unreserve([d.name for d in config.train_domains(train) if d.name not in held]))


def _fmt_targets(targets: dict[str, str]) -> str:
    return ", ".join(f"{c}={v}" for c, v in targets.items())
