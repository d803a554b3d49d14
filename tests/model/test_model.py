"""Random schedules of trains, operators, Airflow's at-least-once behaviour and fleet faults, against the
invariants (a Hypothesis state machine over the in-process simulator and the ledger, no Airflow).

Rules interleave: stops of two trains over the same domains, each step run any number of times; a step
killed between any two fleet or ledger calls (the call before it applied, or applied with its answer lost);
a run abandoned (deleted, or marked failed with its teardown failed); the reconciler; the repair gate; a
hand release with and without --to-repair; hosts that fail, are repaired, jobs that hang; time passing.
After every rule the oracle checks the fleet's and the ledger's own state; at the end of every example,
with the faults stopped, the teardowns, the reconciler and the repair gate must bring every host back to
serving or to repair with a reason, with no lease left but repairs'.

Faults are injected by wrapping the fleet and the ledger in the test (`Faulty`): no fault point exists
in the code a production config runs. `RAILYARD_MODEL_EXAMPLES` and `RAILYARD_MODEL_STEPS` size the search
(`make model` runs a long random one; `make test` the same derandomized schedules every time); a failure
prints its shrunk schedule and a blob that replays it.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import sys
import tempfile
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from railyard.domain.config import parse_config
from railyard.domain.models import MAINTENANCE_STATES, HostState
from railyard.fleet.port import FleetError
from railyard.ledger import Ledger
from railyard.operations.emergency import parse_request, plan, run_op, stop_of_run
from railyard.operations.ops import ControlError, release_lease
from railyard.operations.reconcile import reconcile
from railyard.operations.releases import ReleaseError, Rollout
from railyard.operations.repair import gate_repaired
from railyard.operations.stop import Stop, StopError
from railyard.sim.engine import SimEngine
from tests.unit.test_stop import Clock

DOMAINS = ["pod-a", "pod-b", "pod-c"]
CONFIG = {
    "components": [{"name": "gpu-driver", "reboot": True, "duration_s": 300},
                   {"name": "fabric-manager", "duration_s": 60}],
    "releases": [{"id": "drv", "component": "gpu-driver", "version": "570.86.15"},
                 {"id": "fm", "component": "fabric-manager", "version": "570.86.15",
                  "rollout": {"canary_domains": ["pod-a"], "staged_fraction": 0.5, "soak_s": 600,
                              "max_failure_rate": 0.5}}],
    "domains": [{"name": d, "hosts": f"h{d[-1]}[1-3]"} for d in DOMAINS],
    "trains": [{"id": "a", "releases": ["drv", "fm"], "max_failure_fraction": 1.0},
               {"id": "b", "releases": ["drv"], "max_failure_fraction": 1.0, "domains": ["pod-c", "pod-b"]}],
    "buffers": {"maintenance": {"hosts": 3}, "failure": {"hosts": 2}},
    "timeouts": {"poll_s": 0.5, "drain_s": 30, "upgrade_s": 60, "check_s": 30, "return_s": 30,
                 "checkpoint_wait_s": 30},
    "simulator": {"speed": 60, "seed": 5, "start_at": "2026-06-01T00:00:00Z",
                  "initial_versions": {"gpu-driver": "550.1", "fabric-manager": "550.1"},
                  "jobs": {"count": 2, "hosts_per_job": 2, "checkpoint_interval_s": 1800, "checkpoint_duration_s": 30},
                  "upgrade_fail_rate": 0.3, "check_fail_rate": 0.2},
}
CFG = parse_config(CONFIG)
HOSTS = sorted(CFG.host_domain())
STEPS = ["take", "checkpoints", "drain", "upgrade", "check", "return"]
FLEET_WRITES = {"drain", "upgrade_hosts", "start_checks", "return_to_service", "offboard", "handover",
                "request_checkpoint"}
LEDGER_WRITES = {"acquire_domain", "release", "handover", "note", "record_verifications", "set_detail_once",
                 "add_detail_entries", "lease_repair", "record_visit", "record_release_results", "finish_operation"}


# the gaps between two calls where a crash or a lost answer leaves the most behind, drawn more often
GAPS = [("lost", "offboard"), ("kill", "handover"), ("lost", "handover"), ("kill", "note"), ("lost", "drain"),
        ("kill", "release"), ("lost", "return_to_service"), ("kill", "acquire_domain"), ("lost", "upgrade_hosts"),
        ("kill", "record_verifications"), ("lost", "start_checks")]


TALLY = {"examples": 0, "checks": 0}


class Killed(BaseException):
    """The task's process died here (not an Exception: nothing in the step may catch it)."""


class Plan:
    """The fault armed for the next step: at the (`skip`+1)-th write call named `target` (fleet or ledger),
    `kind` happens, once; `down`: from that call on, every fleet call fails unapplied, reads too (the fleet
    unreachable), until the plan is disarmed."""

    def __init__(self) -> None:
        self.kind: str | None = None
        self.target = ""
        self.skip = 0
        self.down = False

    def arm(self, kind: str | None, target: str = "", skip: int = 0) -> None:
        self.kind, self.target, self.skip, self.down = kind, target, skip, False

    def hit(self, name: str) -> str | None:
        if self.kind is None or name != self.target:
            return None
        if self.skip > 0:
            self.skip -= 1
            return None
        kind, self.kind = self.kind, None
        return kind


class Faulty:
    """`inner` whose write calls obey the plan: `kill` before the call (the process died before it), `lost`
    after it (the fleet applied it; the answer never came). Reads pass through."""

    def __init__(self, inner: Any, writes: set[str], plan: Plan, lost_error: type[BaseException]) -> None:
        self._inner, self._writes, self._plan, self._lost = inner, writes, plan, lost_error

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self._inner, name)
        if not callable(fn) or name.startswith("_"):
            return fn
        fleet = self._lost is FleetError

        def call(*a: Any, **kw: Any) -> Any:
            if fleet and self._plan.down:
                raise FleetError(f"{name}: the fleet is unreachable")
            kind = self._plan.hit(name) if name in self._writes else None
            if kind == "kill":
                raise Killed(name)
            if kind == "down":
                self._plan.down = True
                raise FleetError(f"{name}: the fleet is unreachable")
            out = fn(*a, **kw)
            if kind == "lost":
                raise self._lost(f"{name}: answer lost")
            return out

        return call


class Runs:
    """Airflow as the reconciler and the hand release see it: a run is running until abandoned, then gone."""

    def __init__(self) -> None:
        self.dead: set[str] = set()

    def dag_known(self, dag_id: str) -> bool:
        return True

    def run_state(self, dag_id: str, run_id: str) -> str | None:
        return None if run_id in self.dead else "running"


# each example's ledger is a SQLite file: in RAM-backed /dev/shm where there is one, its commits cost no fsync
# (80 schedules: 12.6 s instead of 18.7 s on disk, 2 cores, 24 GiB)
RAM = "/dev/shm" if os.access("/dev/shm", os.W_OK | os.X_OK) else None
TRACE = os.environ.get("RAILYARD_MODEL_TRACE")  # a file: the schedule of a failing example, as `replay` takes it


def traced(f: Any) -> Any:
    """A rule that logs itself (a rule another calls does not), so that a failing schedule can be replayed as it
    ran: Hypothesis shrinks a failure only if every replay of it fails the same way."""

    @functools.wraps(f)
    def step(self: Railyard, *a: Any, **kw: Any) -> Any:
        if not self.depth:
            self.log.append((f.__name__, kw))
        self.depth += 1
        try:
            return f(self, *a, **kw)
        finally:
            self.depth -= 1

    return step


def oracle(f: Any) -> Any:
    """An invariant that, failing, writes the schedule that broke it to RAILYARD_MODEL_TRACE."""

    @functools.wraps(f)
    def check(self: Railyard) -> None:
        try:
            f(self)
        except AssertionError:
            self.dump()
            raise

    return check


class Railyard(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.mkdtemp(prefix="railyard-model-", dir=RAM)
        self.clock = Clock()
        self.sim = SimEngine(CFG, None, clock=self.clock)
        # the ledger's wall clock (a waiter's place in line lasts WAITER_TTL_S of it) is the model's, so that a
        # schedule decides the same however long its steps take to run (Hypothesis replays a schedule to shrink
        # it, and a replay must decide as the first run did)
        self.ledger = Ledger(self.ledger_url(), clock=lambda: 1.7e9 + self.clock())
        self.plan = Plan()
        self.fleet = Faulty(self.sim, FLEET_WRITES, self.plan, FleetError)
        self.led = Faulty(self.ledger, LEDGER_WRITES, self.plan, RuntimeError)
        self.runs = Runs()
        self.stops: list[Stop] = []
        self.cursor: dict[str, int] = {}  # op -> index in STEPS of its next task
        self.n = 0
        self.log: list[tuple[str, dict[str, Any]]] = []  # the rules run, in order (`traced`)
        self.depth = 0
        self.installs: dict[tuple[str, str, str, str], int] = {}  # (op, host, component, version) -> installs
        upgrade_hosts = self.sim.upgrade_hosts

        def counted(work: dict[str, Any], op: str) -> Any:  # what each upgrade call installed, host by host
            before = dict(self.sim._installs)
            try:
                return upgrade_hosts(work, op)
            finally:
                for (h, c, v), n in self.sim._installs.items():
                    if h in work and n > before.get((h, c, v), 0):
                        key = (op, h, c, v)
                        self.installs[key] = self.installs.get(key, 0) + n - before.get((h, c, v), 0)

        self.sim.upgrade_hosts = counted  # type: ignore[method-assign]

    def dump(self) -> None:
        if TRACE:
            with open(TRACE, "w") as f:
                f.write("[\n" + "".join(f"    {step!r},\n" for step in self.log) + "]\n")

    def ledger_url(self) -> str:
        return f"sqlite:///{self.tmp}/ledger.db"

    def _stop(self, i: int) -> Stop | None:
        live = [s for s in self.stops if s.op_id.split("/")[1] not in self.runs.dead]
        return live[i % len(live)] if live else None

    # ---- what Airflow runs ----------------------------------------------------------------------
    @precondition(lambda self: len([s for s in self.stops if s.op_id.split("/")[1] not in self.runs.dead]) < 3)
    @rule(train=st.sampled_from(["a", "b"]), domain=st.sampled_from(DOMAINS))
    @traced
    def new_stop(self, train: str, domain: str) -> None:
        t = CFG.train(train)
        if domain not in {d.name for d in CFG.train_domains(t)}:
            return
        self.n += 1
        self.stops.append(Stop(config=CFG, train=t, domain=CFG.domain(domain), op_id=f"{train}/r{self.n}/{domain}",
                               fleet=self.fleet, ledger=self.led, sleep=self.clock.advance, clock=self.clock,
                               say=lambda _m: None))

    @precondition(lambda self: bool(self.stops))
    @rule(i=st.integers(0, 50), how=st.sampled_from(["next"] * 6 + ["again", "marked_success", "teardown"]),
          fault=st.one_of(st.none(), st.sampled_from(GAPS),
                          st.tuples(st.sampled_from(["kill", "lost"]),
                                    st.sampled_from(sorted(FLEET_WRITES | LEDGER_WRITES))),
                          st.tuples(st.just("down"), st.sampled_from(sorted(FLEET_WRITES)))),
          at=st.integers(0, 2))
    @traced
    def run_step(self, i: int, how: str, fault: tuple[str, str] | None, at: int) -> None:
        """The stop's next task as Airflow runs it: in order, retried after a failure, run again after it
        succeeded (a cleared task), marked success by hand without running, or its teardown."""
        s = self._stop(i)
        if s is None:
            return
        k = self.cursor.get(s.op_id, 0)
        if how == "marked_success":
            self.cursor[s.op_id] = min(k + 1, len(STEPS) - 1)
            return
        step = "return" if how == "teardown" else STEPS[max(k - 1, 0)] if how == "again" else STEPS[k]
        self.plan.arm(*(fault or (None, "")), at)
        try:
            self._run(s, step)
        except (Killed, StopError, FleetError, RuntimeError):
            return  # the task failed: Airflow retries it, or not (another rule may run it again)
        finally:
            self.plan.arm(None)
        if how == "next":
            self.cursor[s.op_id] = min(k + 1, len(STEPS) - 1)

    def _run(self, s: Stop, step: str) -> None:
        if step == "take":
            s.take()
        elif step == "checkpoints":
            _jobs, since = s.request_checkpoints()
            for _ in range(200):
                if not s.stale_jobs(since):
                    break
                self.clock.advance(0.5)
        elif step == "drain":
            s.drain()
        elif step == "upgrade":
            s.upgrade()
        elif step == "check":
            s.check()
        else:
            s.return_hosts()

    @rule(train=st.sampled_from(["a", "b"]), domain=st.sampled_from(DOMAINS),
          fault=st.one_of(st.sampled_from(GAPS), st.tuples(st.sampled_from(["kill", "lost"]),
                                                           st.sampled_from(sorted(FLEET_WRITES | LEDGER_WRITES)))),
          at=st.integers(0, 3), retry=st.booleans(),
          ending=st.sampled_from(["teardown", "abandoned", "teardown_killed"]))
    @traced
    def whole_run(self, train: str, domain: str, fault: tuple[str, str], at: int, retry: bool, ending: str) -> None:
        """A run of one stop as Airflow runs it: its tasks in order, a fault armed over the whole run (a
        process killed at a call, or an answer lost), the failed task retried once or not, then its teardown
        (run, killed too, or never: the run abandoned, left to the reconciler)."""
        self.new_stop(train, domain)
        if not self.stops or self.stops[-1].op_id.split("/")[2] != domain:
            return
        s = self.stops[-1]
        self.plan.arm(fault[0], fault[1], at)
        try:
            for step in STEPS[:-1]:
                for attempt in (0, 1):
                    try:
                        self._run(s, step)
                        break
                    except (Killed, StopError, FleetError, RuntimeError):
                        if attempt or not retry:
                            raise
            self.plan.arm(None)
        except (Killed, StopError, FleetError, RuntimeError):
            pass
        if ending == "abandoned":
            self.runs.dead.add(s.op_id.split("/")[1])
            self.plan.arm(None)
            return
        if ending != "teardown_killed":
            self.plan.arm(None)
        try:
            self._run(s, "return")
        except (Killed, StopError, FleetError, RuntimeError):
            pass
        finally:
            self.plan.arm(None)
        self.runs.dead.add(s.op_id.split("/")[1])  # ended: what it left is the reconciler's

    @precondition(lambda self: bool(self.stops))
    @rule(i=st.integers(0, 50))
    @traced
    def abandon_run(self, i: int) -> None:
        """Deleted, or marked failed with its teardown failed: none of its tasks runs again."""
        s = self._stop(i)
        if s is not None:
            self.runs.dead.add(s.op_id.split("/")[1])

    @precondition(lambda self: len([s for s in self.stops if s.op_id.split("/")[1] not in self.runs.dead]) < 3)
    @rule(domain=st.sampled_from(DOMAINS), hosts=st.one_of(st.none(), st.lists(st.sampled_from(HOSTS), min_size=1,
                                                                            max_size=2, unique=True)),
          skip=st.booleans())
    @traced
    def emergency(self, domain: str, hosts: list[str] | None, skip: bool) -> None:
        """An emergency from the form: whole domains or single hosts, with or without skip_checkpoint; its
        stops are built as its run builds them, from the plan it records."""
        self.n += 1
        run = f"e{self.n}"
        req = parse_request(CFG, {"releases": ["drv"], "reason": "model: a CVE in the driver",
                                  "domains": [domain] if hosts is None else [], "hosts": hosts or [],
                                  "skip_checkpoint": skip,
                                  "skip_checkpoint_reason": "model: the CVE is exploited now" if skip else None})
        p = plan(CFG, self.sim, req)
        self.ledger.open_operation(run_op(run), kind="emergency_run", actor="model", action="emergency_trigger",
                                   detail={"request": req.model_dump(), "plan": p, "user": "model"},
                                   reason=req.reason)
        for n in range(1, len(p["stops"]) + 1):
            s = stop_of_run(CFG, self.led, run_id=run, fleet=self.fleet, say=lambda _m: None, slot=f"stop_{n}",
                            sleep=self.clock.advance, clock=self.clock)
            assert s is not None
            self.stops.append(s)

    @rule(on=st.booleans())
    @traced
    def freeze(self, on: bool) -> None:
        self.ledger.set_switch("freeze", on, reason="model: an operator's freeze", actor="operator")

    @rule(action=st.sampled_from(["halt", "resume", "promote"]), rid=st.sampled_from(["drv", "fm"]))
    @traced
    def release_action(self, action: str, rid: str) -> None:
        try:
            Rollout(CFG, self.ledger).act(action, rid, reason="model: an operator's call", actor="operator",
                                          now=self.sim.now())
        except ReleaseError:
            pass

    @rule(size=st.integers(1, 2))
    @traced
    def job_arrives(self, size: int) -> None:
        """A job placed on whatever serves free, a domain whose checkpoint request has passed included."""
        self.n += 1
        self.sim.add_job(f"late{self.n}", size)

    @rule(i=st.integers(0, 50), stuck=st.booleans(), dodge_s=st.sampled_from([None, 60, 3600]))
    @traced
    def job_behaves(self, i: int, stuck: bool, dodge_s: int | None) -> None:
        """A job that never checkpoints (or recovers), or asks a train to come back later (a dodge)."""
        jobs = sorted(j.id for j in self.sim.jobs())
        if jobs:
            self.sim.set_job(jobs[i % len(jobs)], stuck=stuck,
                             **({"dodge_until": self.sim.now() + dodge_s} if dodge_s else {"clear_dodge": True}))

    @rule()
    @traced
    def reconciler(self) -> None:
        reconcile(CFG, self.sim, self.ledger, self.runs, sleep=self.clock.advance, clock=self.clock,
                  say=lambda _m: None)

    @rule()
    @traced
    def repair_gate(self) -> None:
        gate_repaired(CFG, self.sim, self.ledger, say=lambda _m: None, sleep=self.clock.advance, clock=self.clock)

    @precondition(lambda self: bool(self.stops))
    @rule(i=st.integers(0, 50), to_repair=st.booleans())
    @traced
    def hand_release(self, i: int, to_repair: bool) -> None:
        s = self.stops[i % len(self.stops)]
        try:
            release_lease(CFG, self.sim, self.ledger, s.op_id, reason="model: an operator releases it",
                          actor="operator", runs=self.runs, to_repair=to_repair)
        except ControlError:
            pass

    # ---- the fleet ----------------------------------------------------------------------------
    @rule(host=st.sampled_from(HOSTS))
    @traced
    def host_fails(self, host: str) -> None:
        if self.sim.hosts([host])[0].state == HostState.SERVING:
            self.sim.fail(host)

    @rule(host=st.sampled_from(HOSTS))
    @traced
    def host_repaired(self, host: str) -> None:
        if self.sim.hosts([host])[0].state == HostState.REPAIR:
            self.sim.repaired(host)

    @rule(seconds=st.sampled_from([1, 10, 60, 600]))
    @traced
    def time_passes(self, seconds: int) -> None:
        self.clock.advance(seconds)

    # ---- the oracle -----------------------------------------------------------------------------
    @invariant()
    @oracle
    def at_most_one_domain_out(self) -> None:
        TALLY["checks"] += 1  # the invariants run once at the start and after every step
        by_domain = CFG.host_domain()
        holders = self.ledger.holdings()
        leased = {by_domain[h] for h, op in holders.items() if not op.startswith("repair/")}
        assert len(leased) <= CFG.max_domains_down, holders
        # out for maintenance: a repaired host waiting, drained, for its gate is a repair's (the failure buffer)
        out = {h.domain for h in self.sim.hosts() if h.state in MAINTENANCE_STATES
               and not holders.get(h.name, "").startswith("repair/")}
        assert len(out) <= CFG.max_domains_down, sorted((h.name, h.state, h.operation) for h in self.sim.hosts()
                                                        if h.domain in out)
        assert out <= leased, (out, holders)  # every host out for maintenance is leased

    @invariant()
    @oracle
    def every_host_out_is_counted(self) -> None:
        """A host out of service that no lease accounts for falls out of every count (but one the fleet
        reports failed by itself). (A host in repair may still be leased to the stop that sent it, until its
        next step or its teardown hands it to the repair: `settled` checks that at the end.)"""
        self.settled(final=False)

    def settled(self, final: bool) -> None:
        holders = self.ledger.holdings()
        for h in self.sim.hosts():
            if h.state == HostState.REPAIR and final:  # nothing but a repair operation gates its way back
                assert holders.get(h.name, "").startswith("repair/"), (h, holders.get(h.name))
            elif h.state not in (HostState.SERVING, HostState.FAILED):
                assert h.name in holders, (h, "out of service with no lease")

    @invariant()
    @oracle
    def no_unverified_return_and_no_collision(self) -> None:
        audit = self.sim.audit()
        assert audit["unverified_returns"] == [], audit["unverified_returns"]
        assert audit["refusals"] == [], audit["refusals"][:3]

    @invariant()
    @oracle
    def nothing_installed_twice_for_one_operation(self) -> None:
        twice = {k: n for k, n in self.installs.items() if n > 1}
        assert not twice, (twice, [(r["action"], r["hosts"], r["reason"][:80]) for op in {k[0] for k in twice}
                                   for r in self.ledger.audit_rows(op)])

    @invariant()
    @oracle
    def maintenance_within_its_buffer(self) -> None:
        """Hosts out for maintenance (leased, not to a repair) never exceed the maintenance buffer."""
        holders = self.ledger.holdings()
        out = [h.name for h in self.sim.hosts() if h.state in MAINTENANCE_STATES
               and h.name in holders and not holders[h.name].startswith("repair/")]
        assert len(out) <= CFG.buffers.maintenance.host_count(len(HOSTS)), out

    @invariant()
    @oracle
    def no_drain_without_a_fresh_checkpoint(self) -> None:
        for it in self.sim.audit()["interruptions"]:
            reason = it["reason"]
            if not reason.startswith("drained by "):
                continue
            op = reason.removeprefix("drained by ")
            detail = self.ledger.detail(op) if self.ledger.operation(op) else {}
            skipped = detail.get("checkpoint_skipped")
            if skipped is not None:  # an emergency said why; the cost of each job it drained is on record
                late = detail.get("gpu_hours_at_risk_late") or {}
                assert skipped["reason"] and it["job"] in {**skipped["gpu_hours_at_risk"], **late}, (it, detail)
                continue
            asked = detail.get("checkpoint_requested_at")
            assert asked is not None, (it, detail)
            assert it["at"] - it["lost_s"] >= float(asked) - 1e-6, (it, asked)  # checkpointed since it was asked

    def teardown(self) -> None:
        """Liveness: faults stop; every run ends; teardowns, the reconciler and the gate settle everything."""
        TALLY["examples"] += 1
        try:
            self.plan.arm(None)
            self.sim.settings(upgrade_fail_rate=0.0, check_fail_rate=0.0)
            self.runs.dead |= {s.op_id.split("/")[1] for s in self.stops}
            for _ in range(4):
                reconcile(CFG, self.sim, self.ledger, self.runs, sleep=self.clock.advance, clock=self.clock,
                          say=lambda _m: None)
                for h in self.sim.hosts():
                    if h.state == HostState.REPAIR:
                        self.sim.repaired(h.name)
                gate_repaired(CFG, self.sim, self.ledger, say=lambda _m: None, sleep=self.clock.advance,
                              clock=self.clock)
                self.clock.advance(CFG.simulator.repair_s / CFG.simulator.speed + 1)  # failed hosts recover
            self.settled(final=True)
            for h in self.sim.hosts():
                assert h.state == HostState.SERVING or (h.state in (HostState.REPAIR, HostState.FAILED) and h.reason), h
            left = {h: op for h, op in self.ledger.holdings().items() if not op.startswith("repair/")}
            assert not left, left
            active = [o["id"] for o in self.ledger.active_operations() if not o["id"].startswith("repair/")]
            assert not active, active
        except AssertionError:
            self.dump()
            raise
        finally:
            self.ledger.dispose()
            self.sim.close()
            shutil.rmtree(self.tmp, ignore_errors=True)


EXAMPLES = int(os.environ.get("RAILYARD_MODEL_EXAMPLES", "400"))
STEPS_PER = int(os.environ.get("RAILYARD_MODEL_STEPS", "20"))
# `make test`: derandomized (the same schedules every run, seeded from the test's name); `make model`
# (RAILYARD_MODEL_RANDOM=1): a fresh random search. A failure prints the shrunk schedule and a
# @reproduce_failure blob that replays it exactly.
RANDOM = os.environ.get("RAILYARD_MODEL_RANDOM") == "1"
if RANDOM:  # what the long search ran, for its report
    atexit.register(lambda: print(f"\nmodel search: {TALLY['examples']} schedules, "
                                  f"{TALLY['checks'] - TALLY['examples']} steps, each followed by the invariants",
                                  file=sys.stderr))
Railyard.TestCase.settings = settings(max_examples=EXAMPLES, stateful_step_count=STEPS_PER, deadline=None,
                                      suppress_health_check=list(HealthCheck), print_blob=True,
                                      derandomize=not RANDOM, database=None)
# a long search (`make model`) runs as long as it is asked to: the marker would outrank --timeout=0
TestRailyard = pytest.mark.timeout(0 if RANDOM else 1800)(Railyard.TestCase)


def replay(*steps: tuple[str, dict[str, Any]]) -> None:
    """A schedule the search found (shrunk), run as it was, with every invariant after each step."""
    m = Railyard()
    checks = [m.at_most_one_domain_out, m.every_host_out_is_counted, m.no_drain_without_a_fresh_checkpoint,
              m.no_unverified_return_and_no_collision]
    for check in checks:
        check()
    for name, kw in steps:
        getattr(m, name)(**kw)
        for check in checks:
            check()
    m.teardown()


# Defects the search found, each shrunk by Hypothesis and kept as a replayed regression:
def test_found_an_offboard_whose_answer_was_lost_orphans_the_host():
    """The fleet applied an offboard whose answer was lost; the teardown released the lease over the host in
    repair: no repair operation held it, and once repaired it stayed drained with no lease, out of every count."""
    run = dict(at=0, ending="teardown", retry=False, train="a")
    replay(("whole_run", run | {"domain": "pod-a", "fault": ("lost", "offboard")}),
           ("whole_run", run | {"domain": "pod-b", "fault": ("lost", "offboard")}))


def test_found_a_lost_fleet_handover_stalls_the_repair_gate():
    """The ledger handed the host to its repair; the fleet's handover was lost, and the repair gate then
    failed on it for ever ("held by operation a/r2/pod-b")."""
    run = dict(at=0, ending="teardown", retry=False, train="a")
    replay(("whole_run", run | {"domain": "pod-a", "fault": ("lost", "offboard")}),
           ("whole_run", run | {"domain": "pod-b", "fault": ("lost", "handover")}))


def test_found_the_upgrade_drains_again_without_a_checkpoint_after_a_drain_marked_success():
    """Found by the long search on the fixed code: the checkpoint wait and the drain both marked success, the
    upgrade step drained the hosts it found serving ("a drain the fleet lost") without asking their jobs."""
    step = {"at": 0, "fault": None, "i": 0}
    replay(("new_stop", {"domain": "pod-a", "train": "a"}), ("run_step", step | {"how": "next"}),
           ("run_step", step | {"how": "marked_success"}), ("run_step", step | {"how": "marked_success"}),
           ("run_step", step | {"how": "next"}))


def test_found_a_drain_after_a_checkpoint_wait_marked_success():
    """`wait_checkpoints` marked success by hand: the drain took the domain's jobs with no checkpoint asked."""
    replay(("new_stop", {"domain": "pod-a", "train": "a"}),
           ("run_step", {"at": 0, "fault": None, "how": "next", "i": 0}),
           ("run_step", {"at": 0, "fault": None, "how": "marked_success", "i": 0}),
           ("run_step", {"at": 0, "fault": None, "how": "next", "i": 0}))


# Found by the search once emergencies, jobs arriving and jobs that hang or dodge were rules:
def test_found_a_job_placed_after_an_emergency_skipped_checkpoints_is_drained_with_no_cost_recorded():
    """The emergency recorded the GPU-hours at risk of the jobs on the domain when it skipped their checkpoints;
    a job placed there afterwards was drained with no cost on record."""
    step = {"at": 0, "fault": None, "how": "next", "i": 0}
    replay(("emergency", {"domain": "pod-a", "hosts": None, "skip": True}), ("run_step", step), ("run_step", step),
           ("job_arrives", {"size": 1}), ("run_step", step))


def test_found_an_emergency_takeover_of_a_host_that_failed_by_itself_half_hands_the_domain_over():
    """A train's stop held pod-b in the ledger; one of its hosts failed by itself (no operation's in the fleet).
    The emergency's takeover asked the fleet to hand that host over too; the fleet refused after moving the
    others, the undo missed them, and a host was left drained under the emergency with the train's lease."""
    replay(("repair_gate", {}), ("job_arrives", {"size": 2}), ("time_passes", {"seconds": 600}),
           ("job_arrives", {"size": 2}), ("host_fails", {"host": "hc2"}), ("host_repaired", {"host": "hc1"}),
           ("new_stop", {"domain": "pod-b", "train": "b"}),
           ("job_behaves", {"dodge_s": 3600, "i": 21, "stuck": False}), ("time_passes", {"seconds": 60}),
           ("run_step", {"at": 2, "fault": None, "how": "next", "i": 20}),
           ("run_step", {"at": 2, "fault": ("lost", "handover"), "how": "marked_success", "i": 15}),
           ("job_behaves", {"dodge_s": 60, "i": 50, "stuck": True}), ("host_repaired", {"host": "hc3"}),
           ("job_arrives", {"size": 1}), ("new_stop", {"domain": "pod-b", "train": "b"}),
           ("emergency", {"domain": "pod-b", "hosts": None, "skip": True}),
           ("hand_release", {"i": 37, "to_repair": False}), ("host_fails", {"host": "hb2"}),
           ("run_step", {"at": 1, "fault": ("lost", "return_to_service"), "how": "next", "i": 0}),
           ("run_step", {"at": 0, "fault": ("kill", "drain"), "how": "next", "i": 2}))


def _failed_install_repaired_then_retried(fault: tuple[str, str], still_leased: bool) -> None:
    """Every install fails; `fault` hits the first offboard of the upgrade step; the repair team finishes that
    host; the step is retried: the host goes to its repair, never installed again by the same operation."""
    m = Railyard()
    try:
        m.sim.settings(upgrade_fail_rate=1.0)
        m.new_stop(train="a", domain="pod-a")
        for _ in range(3):
            m.run_step(at=0, fault=None, how="next", i=0)
        m.run_step(at=0, fault=fault, how="next", i=0)
        (first,) = [h.name for h in m.sim.hosts() if h.state == HostState.REPAIR]
        if still_leased:
            assert m.ledger.holdings()[first] == "a/r1/pod-a"  # offboarded in the fleet, still the stop's lease
        m.sim.settings(upgrade_fail_rate=0.0)
        m.host_repaired(first)
        m.run_step(at=0, fault=None, how="next", i=0)
        m.nothing_installed_twice_for_one_operation()
        assert m.ledger.holdings()[first] == f"repair/{first}/a/r1/pod-a"
    finally:
        m.teardown()


def test_found_a_stop_installs_again_on_a_host_it_offboarded_whose_lease_never_reached_the_repair():
    """The upgrade step dies at the ledger's handover of the first host it offboards; the retried upgrade
    installed that host a second time under the same operation instead of handing it to its repair."""
    _failed_install_repaired_then_retried(("kill", "handover"), still_leased=True)


def test_found_a_stop_installs_again_on_a_host_whose_offboard_answer_was_lost_and_was_repaired():
    """The first offboard's answer is lost (the fleet has the host in repair, the ledger nothing yet); the
    retried upgrade installed it again. The ledger now records the offboard before the fleet is asked."""
    _failed_install_repaired_then_retried(("lost", "offboard"), still_leased=False)


def test_found_an_emergency_drain_after_its_checkpoint_step_was_marked_success_records_no_skip():
    """The emergency skips checkpoints; its checkpoint step was marked success by hand, so the skip (its reason,
    the GPU-hours at risk) was never recorded before the drain took the jobs."""
    step = {"at": 0, "fault": None, "i": 0}
    replay(("emergency", {"domain": "pod-a", "hosts": None, "skip": True}), ("run_step", step | {"how": "next"}),
           ("run_step", step | {"how": "marked_success"}), ("run_step", step | {"how": "next"}))
