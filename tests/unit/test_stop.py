"""A domain stop over the in-process simulator, with a fake clock: no sleeps, no Airflow."""

from __future__ import annotations

import pytest

from railyard.domain.config import parse_config
from railyard.domain.models import HostState
from railyard.ledger import Ledger
from railyard.operations.stop import Stop, StopError
from railyard.sim.engine import SimEngine

CONFIG = {
    "components": [
        {"name": "gpu-driver", "reboot": True, "duration_s": 300},
        {"name": "fabric-manager", "duration_s": 60},
    ],
    "releases": [
        {"id": "drv", "component": "gpu-driver", "version": "570.86.15"},
        {"id": "fm", "component": "fabric-manager", "version": "570.86.15"},
    ],
    "domains": [{"name": f"pod-{c}", "hosts": f"h{c}[1-4]"} for c in "abc"],
    "trains": [{"id": "t", "releases": ["drv", "fm"], "max_failure_fraction": 1.0}],
    "buffers": {"maintenance": {"hosts": 4}, "failure": {"hosts": 2}},
    "timeouts": {"poll_s": 0.25, "drain_s": 60, "upgrade_s": 120, "check_s": 60, "return_s": 60},
    "simulator": {
        "speed": 60, "seed": 3,
        "initial_versions": {"gpu-driver": "550.1", "fabric-manager": "550.1"},
        "jobs": {"count": 2, "hosts_per_job": 4, "checkpoint_interval_s": 1800, "checkpoint_duration_s": 30},
    },
}


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def advance(self, s: float) -> None:
        self.t += s


def world(tmp_path, train: dict | None = None, top: dict | None = None, **sim):
    cfg_data = {**CONFIG, "simulator": {**CONFIG["simulator"], **sim}, **(top or {})}
    if train:
        cfg_data["trains"] = [{**CONFIG["trains"][0], **train}]
    cfg = parse_config(cfg_data)
    clock = Clock()
    fleet = SimEngine(cfg, None, clock=clock)
    ledger = Ledger(f"sqlite:///{tmp_path}/ledger.db")

    def stop(domain: str = "pod-a", op: str = "t/run1/pod-a") -> Stop:
        return Stop(config=cfg, train=cfg.train("t"), domain=cfg.domain(domain), op_id=op, fleet=fleet,
                    ledger=ledger, sleep=clock.advance, clock=clock)

    return cfg, clock, fleet, ledger, stop


def wait_checkpoints(s: Stop, clock: Clock) -> float:
    _jobs, since = s.request_checkpoints()
    for _ in range(100):
        if not s.stale_jobs(since):
            return since
        clock.advance(0.25)
    raise AssertionError("checkpoints never came")


def full_stop(s: Stop, clock: Clock) -> dict:
    assert s.take().granted
    wait_checkpoints(s, clock)
    s.drain()
    s.upgrade()
    s.check()
    return s.return_hosts()


def test_a_stop_upgrades_verifies_and_returns(tmp_path):
    cfg, clock, fleet, ledger, stop = world(tmp_path)
    s = stop()
    out = full_stop(s, clock)
    assert out == {"returned": 4, "offboarded": []}
    hosts = fleet.hosts(cfg.domain("pod-a").hosts)
    assert all(h.state == HostState.SERVING for h in hosts)
    assert all(h.versions == {"gpu-driver": "570.86.15", "fabric-manager": "570.86.15"} for h in hosts)
    audit = fleet.audit()
    assert audit["unverified_returns"] == []
    assert audit["max_domains_out"] == 1
    # the jobs checkpointed on request just before the drain: they lost seconds, not the cadence
    assert audit["interruptions"] and audit["max_lost_s"] < 120
    assert ledger.holdings() == {} and ledger.operation(s.op_id)["state"] == "done"
    # the fleet's capacity, as the stop saw it after its drain and after its return (the page's chart)
    total = len(fleet.hosts())
    drained, back = ledger.capacity_history()
    assert (drained["serving"], drained["total"], drained["op"]) == (total - 4, total, s.op_id)
    assert (back["serving"], back["total"]) == (total, total) and back["t"] > drained["t"]


def test_the_return_reads_nothing_more_once_the_fleet_says_every_host_serves(tmp_path):
    """The return's last poll reads the whole lease: the hosts returned, the wait for others' returns and the
    fleet's counts all come from that read, so nothing is read again after it once every host serves."""
    _cfg, clock, fleet, ledger, stop = world(tmp_path)
    s = stop()
    assert s.take().granted
    wait_checkpoints(s, clock)
    for step in (s.drain, s.upgrade, s.check):  # up to the return
        step()
    reads: list[list[str]] = []
    read = fleet.hosts

    def logged(names=None):
        got = read(names)
        reads.append([h.state.value for h in got])
        return got

    fleet.hosts = logged  # type: ignore[method-assign]
    assert s.return_hosts() == {"returned": 4, "offboarded": []}
    back = [i for i, states in enumerate(reads) if states == ["serving"] * 4]
    assert back and back[0] == len(reads) - 1, reads  # the first read that saw every host back was the last
    rows, _at = ledger.fleet_counts()
    assert {b: n for k, _a, b, n in rows if k == "state"}.get("serving") == len(read())  # counted from it


def test_every_step_run_twice_changes_nothing(tmp_path):
    cfg, clock, fleet, ledger, stop = world(tmp_path)
    s = stop()
    assert s.take().granted and s.take().granted
    wait_checkpoints(s, clock)
    first = s.request_checkpoints()[1]
    assert s.request_checkpoints()[1] == first  # a retry keeps the first request time
    s.drain()
    assert s.drain() == {"drained": 0}
    s.upgrade()
    installs = fleet.audit()["installs"]
    assert s.upgrade()["upgraded"] == 4
    assert fleet.audit()["installs"] == installs
    assert all(i["count"] == 1 for i in installs)
    s.check()
    s.check()
    s.return_hosts()
    assert s.return_hosts()["returned"] == 0
    actions = [r["action"] for r in ledger.audit_rows(s.op_id)]
    assert actions.count("drain") == 1 and actions.count("upgrade") == 1 and actions.count("return") == 1


def test_no_lease_no_touch(tmp_path):
    _cfg, _clock, fleet, _ledger, stop = world(tmp_path)
    with pytest.raises(StopError, match="holds no lease"):
        stop().drain()
    assert all(h.state == HostState.SERVING for h in fleet.hosts())


def test_second_domain_waits_while_first_is_out(tmp_path):
    _cfg, clock, _fleet, _ledger, stop = world(tmp_path)
    a = stop()
    b = stop("pod-b", "other/run/pod-b")
    assert a.take().granted
    d = b.take()
    assert d.outcome == "wait" and "max_domains_down=1" in d.reason
    full_stop(a, clock)
    assert b.take().granted


def test_failed_upgrade_goes_to_repair_and_train_goes_on(tmp_path):
    cfg, clock, fleet, ledger, stop = world(tmp_path, upgrade_fail_rate=1.0)
    s = stop()
    assert s.take().granted
    wait_checkpoints(s, clock)
    s.drain()
    up = s.upgrade()
    assert sorted(up["offboarded"]) == cfg.domain("pod-a").hosts
    out = s.check()
    assert out["checked"] == 0
    assert s.return_hosts() == {"returned": 0, "offboarded": cfg.domain("pod-a").hosts}
    for h in fleet.hosts(cfg.domain("pod-a").hosts):
        assert h.state == HostState.REPAIR and h.reason.startswith("upgrade failed: install ")
    assert ledger.holdings(s.op_id) == {}
    assert set(ledger.holdings().values()) == {f"repair/{h}/{s.op_id}" for h in cfg.domain("pod-a").hosts}


def test_return_gates_hosts_that_were_never_checked(tmp_path):
    """A crash (or a person) skipped the health check: return checks before it returns."""
    _cfg, clock, fleet, _ledger, stop = world(tmp_path)
    s = stop()
    assert s.take().granted
    wait_checkpoints(s, clock)
    s.drain()
    s.upgrade()
    out = s.return_hosts()  # no s.check()
    assert out["returned"] == 4
    assert fleet.audit()["unverified_returns"] == []


def test_failed_check_is_offboarded_with_evidence(tmp_path):
    _cfg, clock, fleet, _ledger, stop = world(tmp_path, check_fail_rate=1.0)
    s = stop()
    assert s.take().granted
    wait_checkpoints(s, clock)
    s.drain()
    s.upgrade()
    out = s.check()
    assert out["passed"] == 0 and len(out["offboarded"]) == 4
    assert all(h.reason.startswith("health check failed: ") for h in fleet.hosts(out["offboarded"]))
    assert s.return_hosts()["returned"] == 0


def test_aborted_before_drain_releases_without_touching(tmp_path):
    _cfg, _clock, fleet, ledger, stop = world(tmp_path)
    s = stop()
    assert s.take().granted
    assert s.return_hosts() == {"returned": 0, "offboarded": []}
    assert ledger.holdings() == {}
    assert all(h.state == HostState.SERVING for h in fleet.hosts())


def test_skip_when_every_host_is_at_target(tmp_path):
    _cfg, clock, _fleet, _ledger, stop = world(tmp_path)
    full_stop(stop(), clock)
    assert stop(op="t/run2/pod-a").take().outcome == "skip"


def test_a_stuck_wait_ends_at_its_deadline(tmp_path):
    _cfg, clock, fleet, _ledger, stop = world(tmp_path, drain_s=10_000_000)
    s = stop()
    assert s.take().granted
    wait_checkpoints(s, clock)
    with pytest.raises(StopError, match=r"pod-a: drain did not finish within 60s \(drained 0/4\)"):
        s.drain()


def test_failed_hosts_go_to_a_repair_operation(tmp_path):
    cfg, clock, fleet, ledger, stop = world(tmp_path, check_fail_rate=1.0)
    s = stop()
    assert s.take().granted
    wait_checkpoints(s, clock)
    s.drain()
    s.upgrade()
    s.check()
    held = ledger.holdings()
    assert sorted(held) == cfg.domain("pod-a").hosts
    assert all(op == f"repair/{h}/{s.op_id}" for h, op in held.items())
    assert all(h.operation == f"repair/{h.name}/{s.op_id}" for h in fleet.hosts(list(held)))
    s.return_hosts()
    # the train's lease is gone; the repairs still hold their hosts, and count against the
    # failure buffer (2 hosts): the next domain is refused and the train must stop
    assert ledger.holdings(s.op_id) == {}
    d = stop("pod-b", "t/run1/pod-b").take()
    assert d.outcome == "stop" and "4 hosts broken, in repair or out with no lease > budget 2" in d.reason
    # repairs are single hosts, not a domain out: the simulator does not count them either
    assert fleet.capacity().domains_out == []


def test_train_halts_when_too_many_hosts_fail(tmp_path):
    _cfg, clock, fleet, ledger, stop = world(tmp_path, train={"max_failure_fraction": 0.5}, check_fail_rate=1.0)
    s = stop()
    assert s.take().granted
    wait_checkpoints(s, clock)
    s.drain()
    s.upgrade()
    with pytest.raises(StopError, match=r"train halted: 4 of 4 hosts failed in this run "
                                        r"\(100% > max_failure_fraction 50%\); first: ha1: health check failed"):
        s.check()
    assert s.return_hosts()["offboarded"] == ["ha1", "ha2", "ha3", "ha4"]
    assert all(h.state == HostState.REPAIR for h in fleet.hosts(["ha1", "ha2", "ha3", "ha4"]))


# Monday 2026-06-01 00:00 UTC on the fleet clock
MONDAY = "2026-06-01T00:00:00Z"


def test_a_stop_that_does_not_fit_the_window_waits(tmp_path):
    window = {"days": ["mon"], "start": "00:30", "end": "01:00", "timezone": "UTC"}
    _cfg, clock, _fleet, _ledger, stop = world(tmp_path, train={"window": window}, start_at=MONDAY)
    d = stop().take()
    # 00:00 is outside; the stop needs ~23 min (60+120+300+60+180+300+30 s) and 30 min fits
    assert d.outcome == "wait" and "next window that fits opens 2026-06-01 00:30 UTC" in d.reason, d.reason
    clock.advance(30 * 60 / 60 + 1)  # speed 60: 30 fleet minutes
    assert stop().take().granted


def test_a_window_too_short_for_the_stop_is_never_used(tmp_path):
    window = {"days": ["mon", "tue"], "start": "00:00", "end": "00:10"}
    _cfg, _clock, _fleet, _ledger, stop = world(tmp_path, train={"window": window}, start_at=MONDAY)
    d = stop().take()
    assert d.outcome == "wait" and "does not fit in the window (mon,tue 00:00-00:10 UTC)" in d.reason
    assert "next window" not in d.reason


def test_freezes_stop_new_stops(tmp_path):
    _cfg, _clock, _fleet, ledger, stop = world(tmp_path, top={"freeze": {"dates": ["2026-06-01"]}},
                                               start_at=MONDAY)
    d = stop().take()
    assert d.outcome == "wait" and "freeze date 2026-06-01 in force" in d.reason
    (tmp_path / "b").mkdir()
    _cfg, _clock, _fleet, ledger, stop = world(tmp_path / "b", start_at=MONDAY)
    ledger.set_switch("freeze", True, reason="year-end change freeze", actor="alice")
    d = stop().take()
    assert d.outcome == "wait" and "freeze switched on by alice: year-end change freeze" in d.reason
    ledger.set_switch("freeze", False, reason="over", actor="alice")
    assert stop().take().granted


def test_a_dodge_postpones_the_domain_within_bounds(tmp_path):
    cfg, clock, fleet, ledger, stop = world(tmp_path, train={"max_dodges": 1, "max_dodge_s": 3600})
    job = fleet.jobs(["ha1", "ha2", "ha3", "ha4"])[0]
    fleet.set_job(job.id, dodge_until=fleet.now() + 1800)
    d = stop().take()
    assert d.outcome == "dodge" and job.id in d.reason
    assert ledger.operation("t/run1/pod-a")["state"] == "dodged"
    # the revisit slot finds it, waits for the deadline, then takes it
    claimed = ledger.claim_dodged("t/run1/", "revisit_1")
    assert claimed["domain"] == "pod-a"
    assert ledger.claim_dodged("t/run1/", "revisit_1")["id"] == claimed["id"]  # same on a retry
    again = stop()
    again.revisit = True
    assert again.take().outcome == "wait"
    clock.advance(1800 / 60 + 1)
    assert again.take().granted


def test_a_dodge_beyond_the_bound_is_refused(tmp_path):
    _cfg, _clock, fleet, ledger, stop = world(tmp_path, train={"max_dodges": 1, "max_dodge_s": 600})
    job = fleet.jobs(["ha1", "ha2", "ha3", "ha4"])[0]
    fleet.set_job(job.id, dodge_until=fleet.now() + 7200)
    assert stop().take().granted
    assert any(r["action"] == "dodge_refused" and "beyond max_dodge_s=600s" in r["reason"] for r in ledger.audit_rows())


def run_train(cfg, clock, fleet, ledger, run: str) -> list[str]:
    """Every domain in order, as the DAG does; returns the domains it visited, stops at a 'stop'."""
    visited = []
    for d in cfg.train_domains(cfg.train("t")):
        s = Stop(config=cfg, train=cfg.train("t"), domain=d, op_id=f"t/{run}/{d.name}", fleet=fleet,
                 ledger=ledger, sleep=clock.advance, clock=clock)
        decision = s.take()
        if decision.outcome == "stop":
            return visited
        if decision.outcome == "skip":
            continue
        assert decision.granted, decision
        full_stop_after_take(s, clock)
        visited.append(d.name)
    return visited


def full_stop_after_take(s: Stop, clock: Clock) -> None:
    wait_checkpoints(s, clock)
    s.drain()
    s.upgrade()
    s.check()
    s.return_hosts()


def test_capacity_never_below_the_floor_with_failures_and_a_second_operation(tmp_path):
    """12 hosts, maintenance 4 + failure 2: the floor is 6 serving hosts. A repair holds one host
    and one more fails during the first stop: the train must stop rather than cross the floor."""
    cfg, clock, fleet, ledger, _stop = world(tmp_path, repair_s=10_000_000)
    # a second operation holds hb4 (a repair); it is out of service
    fleet.offboard("hb4", "fan failure", "repair/hb4/manual")
    assert ledger.lease_repair("repair/hb4/manual", "hb4", domain="pod-b", reason="fan failure")
    a = Stop(config=cfg, train=cfg.train("t"), domain=cfg.domain("pod-a"), op_id="t/r/pod-a", fleet=fleet,
             ledger=ledger, sleep=clock.advance, clock=clock)
    assert a.take().granted  # 1 broken <= 2; serving 12 - 1 - 4 = 7 >= 6
    fleet.fail("hc1")  # during the stop, another host breaks: 2 broken
    full_stop_after_take(a, clock)
    fleet.fail("hc2")
    fleet.fail("hc3")  # 4 broken > failure buffer 2; taking pod-b would leave 12 - 4 - 3 = 5 serving
    visited = run_train(cfg, clock, fleet, ledger, "r")
    assert visited == []  # pod-a is at target (skipped); pod-b refused: the train stopped
    floor = 12 - 4 - 2
    assert min(s["serving"] for s in fleet.samples()) >= floor
    assert fleet.audit()["max_domains_out"] == 1


def test_a_repaired_host_comes_back_only_through_the_gate(tmp_path):
    from railyard.operations.repair import gate_repaired

    cfg, clock, fleet, ledger, stop = world(tmp_path, upgrade_fail_rate=1.0)
    s = stop()
    assert s.take().granted
    wait_checkpoints(s, clock)
    s.drain()
    s.upgrade()  # every install fails: all four to repair, at the old versions
    s.check()
    s.return_hosts()
    gate = lambda: gate_repaired(cfg, fleet, ledger, sleep=clock.advance, clock=clock, say=lambda m: None)  # noqa: E731
    assert gate() == {"returned": [], "failed_gate": [], "still_in_repair": ["ha1", "ha2", "ha3", "ha4"], "errors": {}}
    fleet.repaired("ha1")  # the repair team is done with one host
    fleet.settings(upgrade_fail_rate=0.0, check_fail_rate=0.0)
    out = gate()
    assert out["returned"] == ["ha1"] and out["still_in_repair"] == ["ha2", "ha3", "ha4"]
    (ha1,) = fleet.hosts(["ha1"])
    assert ha1.state == HostState.SERVING and ha1.versions == cfg.train_targets(cfg.train("t"))
    assert "ha1" not in ledger.holdings() and fleet.audit()["unverified_returns"] == []
    # a host whose gate check fails goes back to repair, under the attempt that failed it
    fleet.repaired("ha2")
    fleet.settings(check_fail_rate=1.0)
    out = gate()
    assert out["failed_gate"] == ["ha2"]
    (ha2,) = fleet.hosts(["ha2"])
    assert ha2.state == HostState.REPAIR and ledger.holdings()["ha2"] == f"repair/ha2/{s.op_id}/attempt-1"


def test_a_host_that_fails_the_gate_twice_comes_back_on_the_third_attempt(tmp_path):
    """Each gate attempt is a fresh operation: the failures of the first two are never re-applied, and
    the lease is released from the host's state now, not from the history of offboards in the audit."""
    from railyard.operations.repair import gate_repaired

    cfg, clock, fleet, ledger, stop = world(tmp_path)
    s = stop()
    assert s.take().granted
    wait_checkpoints(s, clock)
    s.drain()
    s.upgrade()
    fleet.settings(check_fail_rate=1.0)
    s.check()
    s.return_hosts()
    assert sorted(h for h, op in ledger.holdings().items() if op.startswith("repair/")) == ["ha1", "ha2", "ha3", "ha4"]
    gate = lambda: gate_repaired(cfg, fleet, ledger, sleep=clock.advance, clock=clock, say=lambda m: None)  # noqa: E731
    for attempt in (1, 2):
        fleet.repaired("ha3")
        out = gate()
        assert out["failed_gate"] == ["ha3"] and out["returned"] == []
        assert ledger.holdings()["ha3"] == f"repair/ha3/{s.op_id}/attempt-{attempt}"
        assert fleet.hosts(["ha3"])[0].state == HostState.REPAIR
    fleet.repaired("ha3")
    fleet.settings(check_fail_rate=0.0)
    out = gate()
    assert out["returned"] == ["ha3"] and out["failed_gate"] == []
    (ha3,) = fleet.hosts(["ha3"])
    assert ha3.state == HostState.SERVING and ha3.versions == cfg.train_targets(cfg.train("t"))
    assert "ha3" not in ledger.holdings()
    attempt3 = f"repair/ha3/{s.op_id}/attempt-3"
    assert ledger.verification(attempt3, "ha3")[0] is True  # its own verdict, not an earlier attempt's
    assert ledger.verification(f"repair/ha3/{s.op_id}/attempt-2", "ha3")[0] is False
    assert fleet.audit()["unverified_returns"] == []
    assert ledger.operation(attempt3)["state"] == "done"


def test_a_host_offboarded_by_an_emergency_comes_back_through_the_gate(tmp_path):
    """The gate brings it to the emergency's targets, frozen when it was offboarded (there is no train
    called `emergency` to look them up from)."""
    from railyard.operations.repair import gate_repaired

    cfg, clock, fleet, ledger, _stop, emergency = emergency_world(tmp_path)
    e = emergency("pod-b")
    assert e.take().granted
    wait_checkpoints(e, clock)
    e.drain()
    e.upgrade()
    fleet.settings(check_fail_rate=1.0)
    e.check()
    e.return_hosts()
    assert ledger.holdings()["hb2"].startswith("repair/hb2/emergency/e1/pod-b")
    fleet.settings(check_fail_rate=0.0)
    fleet.repaired("hb2")
    out = gate_repaired(cfg, fleet, ledger, sleep=clock.advance, clock=clock, say=lambda m: None)
    assert out["returned"] == ["hb2"]
    (hb2,) = fleet.hosts(["hb2"])
    assert hb2.state == HostState.SERVING and hb2.versions["gpu-driver"] == "575.1"
    assert hb2.versions["fabric-manager"] == "550.1"  # the emergency's release only


def emergency_world(tmp_path, **kw):
    top = {"releases": CONFIG["releases"] + [{"id": "drv-575", "component": "gpu-driver", "version": "575.1"}]}
    cfg, clock, fleet, ledger, stop = world(tmp_path, top=top, **kw)
    from railyard.domain.config import TrainSpec

    spec = TrainSpec(id="emergency", releases=["drv-575"], max_failure_fraction=1.0, max_dodges=0)

    def emergency(domain: str, run: str = "e1", **fields) -> Stop:
        return Stop(config=cfg, train=spec, domain=cfg.domain(domain), op_id=f"emergency/{run}/{domain}",
                    fleet=fleet, ledger=ledger, sleep=clock.advance, clock=clock, kind="emergency", **fields)

    return cfg, clock, fleet, ledger, stop, emergency


def test_a_waiting_emergency_goes_before_the_train(tmp_path):
    _cfg, clock, fleet, ledger, stop, emergency = emergency_world(tmp_path)
    a = stop()
    assert a.take().granted
    e = emergency("pod-b")
    d = e.take()
    assert d.outcome == "wait" and "max_domains_down=1 reached: pod-a out" in d.reason
    assert [w["op_id"] for w in ledger.waiting()] == ["emergency/e1/pod-b"]  # who waits, in order
    full_stop_after_take(a, clock)
    b = stop("pod-b", "t/run1/pod-b")
    d = b.take()
    assert d.outcome == "wait" and "yielding to emergency/e1/pod-b" in d.reason  # the train yields
    assert e.take().granted
    full_stop_after_take(e, clock)
    assert b.take().granted  # and resumes after
    assert fleet.audit()["max_domains_out"] == 1


def test_an_emergency_takes_over_a_train_stop_without_returning_hosts(tmp_path):
    cfg, clock, fleet, ledger, stop, emergency = emergency_world(tmp_path)
    a = stop()
    assert a.take().granted
    wait_checkpoints(a, clock)
    a.drain()
    a.upgrade()  # the train's driver 570 is on; it is about to check
    e = emergency("pod-a", skip_checkpoint_reason="CVE-2026-1234 actively exploited")
    d = e.take()
    assert d.granted and "took over 4 host(s) of pod-a from t/run1/pod-a" in d.reason
    assert ledger.holdings() == {h: e.op_id for h in cfg.domain("pod-a").hosts}
    assert all(h.operation == e.op_id for h in fleet.hosts(cfg.domain("pod-a").hosts))
    # the train's remaining steps find nothing of theirs and touch nothing
    assert a.check()["checked"] == 0 and a.return_hosts()["returned"] == 0
    full_stop_after_take(e, clock)
    hosts = fleet.hosts(cfg.domain("pod-a").hosts)
    assert all(h.state == HostState.SERVING and h.versions["gpu-driver"] == "575.1" for h in hosts)
    # never back in service between the two operations: one return per host, verified
    returns = [r for r in fleet.audit()["returns"] if r["host"] in cfg.domain("pod-a").hosts]
    assert len(returns) == 4 and all(r["verified"] and r["op"] == e.op_id for r in returns)
    train_record = [r["action"] for r in ledger.audit_rows(a.op_id)]
    assert train_record.count("handed_over") == 4
    assert ledger.holdings() == {}


def test_skipping_checkpoints_records_the_cost(tmp_path):
    cfg, clock, fleet, ledger, _stop, emergency = emergency_world(tmp_path)
    clock.advance(10)  # 600 fleet seconds since the jobs' last checkpoint
    e = emergency("pod-a", skip_checkpoint_reason="CVE-2026-1234 actively exploited")
    assert e.take().granted
    jobs, _since = e.request_checkpoints()
    assert jobs and e.stale_jobs(0) == []
    (row,) = [r for r in ledger.audit_rows(e.op_id) if r["action"] == "checkpoint_skipped"]
    assert row["reason"].startswith("CVE-2026-1234 actively exploited; GPU-hours at risk: ")
    cost = ledger.detail(e.op_id)["checkpoint_skipped"]["gpu_hours_at_risk"]
    assert set(cost) == set(jobs) and all(v > 0 for v in cost.values())


def test_an_emergency_takes_over_a_stop_that_has_not_drained_yet(tmp_path):
    cfg, clock, fleet, ledger, stop, emergency = emergency_world(tmp_path)
    a = stop()
    assert a.take().granted  # leased, still serving: the train waits for checkpoints
    e = emergency("pod-a")
    assert e.take().granted
    assert ledger.holdings() == {h: e.op_id for h in cfg.domain("pod-a").hosts}
    assert a.drain() == {"drained": 0}  # the train touches nothing of the emergency's
    full_stop_after_take(e, clock)
    assert fleet.audit()["refusals"] == [] and ledger.holdings() == {}


def test_a_takeover_that_races_the_train_s_drain_is_adopted_in_the_fleet(tmp_path):
    """The emergency takes the lease while the train's drain is on its way: the fleet had nothing to hand over
    then, and the train's drain lands under the train's operation. The emergency's upgrade finds the hosts held
    by it in the ledger and by the train in the fleet, hands the fleet's record over, and finishes its stop;
    before, its upgrade was refused until it gave up."""
    cfg, clock, fleet, ledger, stop, emergency = emergency_world(tmp_path)
    a = stop()
    assert a.take().granted
    wait_checkpoints(a, clock)
    hosts = list(cfg.domain("pod-a").hosts)
    e = emergency("pod-a")
    assert e.take().granted and ledger.holdings() == {h: e.op_id for h in hosts}
    fleet.drain(hosts, a.op_id)  # the train's drain, begun before the takeover, lands after it
    full_stop_after_take(e, clock)
    after = fleet.hosts(hosts)
    assert all(h.state == HostState.SERVING and h.versions["gpu-driver"] == "575.1" for h in after), after
    returns = [r for r in fleet.audit()["returns"] if r["host"] in hosts]
    assert len(returns) == 4 and all(r["verified"] and r["op"] == e.op_id for r in returns)
    assert {h for r in ledger.audit_rows(e.op_id, action="adopted") for h in r["hosts"]} == set(hosts)
    assert ledger.holdings() == {}


def test_a_train_comes_back_for_a_domain_an_emergency_took_over(tmp_path):
    cfg, clock, fleet, ledger, stop, emergency = emergency_world(tmp_path)
    a = stop()
    assert a.take().granted
    wait_checkpoints(a, clock)
    e = emergency("pod-a")
    assert e.take().granted
    a.drain(), a.upgrade(), a.check()
    assert a.return_hosts()["returned"] == 0
    assert ledger.operation(a.op_id)["state"] == "dodged"
    full_stop_after_take(e, clock)
    claimed = ledger.claim_dodged("t/run1/", "revisit_1")
    assert claimed["id"] == a.op_id
    again = stop()
    again.revisit = True
    assert again.take().granted
    _jobs, since = again.request_checkpoints()
    assert since > 1000  # a fresh request, not the first attempt's
    full_stop_after_take(again, clock)
    for h in fleet.hosts(cfg.domain("pod-a").hosts):
        assert h.state == HostState.SERVING and h.versions["fabric-manager"] == "570.86.15"
    assert fleet.audit()["unverified_returns"] == [] and fleet.audit()["refusals"] == []


def test_a_domains_installs_and_checks_start_in_one_call_each(tmp_path):
    """The stop hands the fleet the whole domain at once (the fleet fans out by its own means: one request,
    a pool of SSH connections, a hostlist); it never calls the fleet once per host."""
    cfg, clock, fleet, ledger, _stop = world(tmp_path)
    calls: list[tuple[str, list[str]]] = []

    class Recorded:
        def __init__(self, inner):  # noqa: ANN001
            self.inner = inner

        def __getattr__(self, name):  # noqa: ANN001, ANN204
            fn = getattr(self.inner, name)
            if name not in ("upgrade", "start_check", "upgrade_hosts", "start_checks"):
                return fn

            def recorded(first, *a):  # noqa: ANN001, ANN202
                calls.append((name, sorted(first) if isinstance(first, dict) else [first]))
                return fn(first, *a)
            return recorded

    s = Stop(config=cfg, train=cfg.train("t"), domain=cfg.domain("pod-a"), op_id="t/run1/pod-a",
             fleet=Recorded(fleet), ledger=ledger, sleep=clock.advance, clock=clock)
    assert s.take().granted
    wait_checkpoints(s, clock)
    s.drain()
    s.upgrade()
    out = s.check()
    assert calls == [("upgrade_hosts", ["ha1", "ha2", "ha3", "ha4"]), ("start_checks", ["ha1", "ha2", "ha3", "ha4"])]
    assert out["passed"] == 4
    assert s.return_hosts()["returned"] == 4


def _lose_drain(fleet: SimEngine, name: str) -> None:
    """What a restarted Slurm controller does to a drained node: it is back in service, the drain forgotten."""
    h = fleet._hosts[name]
    h.state, h.operation = HostState.SERVING, None
    fleet._dirty = True


@pytest.mark.parametrize("lost_before", ["upgrade", "check"])
def test_a_drain_the_fleet_lost_is_redone_before_installing_or_checking(tmp_path, lost_before):
    """A held host the fleet put back in service between two steps is drained again, then upgraded and checked
    like the others: never skipped by the upgrade (and then sent to repair for versions it never got), never
    checked or returned without its drain."""
    cfg, clock, fleet, ledger, stop = world(tmp_path)
    s = stop()
    assert s.take().granted
    wait_checkpoints(s, clock)
    s.drain()
    if lost_before == "upgrade":
        _lose_drain(fleet, "ha2")
        assert fleet.hosts(["ha2"])[0].state == HostState.SERVING
    assert s.upgrade()["upgraded"] == 4
    if lost_before == "check":
        _lose_drain(fleet, "ha2")
    assert s.check() == {"checked": 4, "passed": 4, "offboarded": []}
    assert s.return_hosts() == {"returned": 4, "offboarded": []}
    hosts = fleet.hosts(cfg.domain("pod-a").hosts)
    assert all(h.state == HostState.SERVING for h in hosts)
    assert all(h.versions == {"gpu-driver": "570.86.15", "fabric-manager": "570.86.15"} for h in hosts)
    assert fleet.audit()["unverified_returns"] == []
    again = [r for r in ledger.audit_rows(s.op_id) if r["action"] == "drain_again"]
    assert len(again) == 1 and again[0]["hosts"] == ["ha2"], again
