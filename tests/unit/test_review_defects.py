"""Sequences that no other test drives, each a defect that was fixed: each fails without its fix.

- the reconciler reads a run state that Airflow's Task SDK gives as an enum;
- an offboard whose fleet call was applied but whose answer was lost (or whose worker died before the
  ledger's part) never leaves a host in repair with no repair operation holding it;
- hosts out of service with no lease count against capacity;
- a hand release is refused while the operation's run is alive, or when Airflow cannot say;
- one repair that cannot go through the gate does not starve the others.
"""

from __future__ import annotations

import pytest

from railyard.domain.models import HostState
from railyard.fleet.port import FleetError
from railyard.operations.ops import ControlError, release_lease
from railyard.operations.reconcile import ReconcileError, reconcile
from railyard.operations.repair import gate_repaired
from tests.unit.test_reconcile import Runs, settle
from tests.unit.test_stop import wait_checkpoints, world


class Flaky:
    """The simulator behind a client that loses answers: `lose[call]` calls are applied, then fail as a
    timeout would; `drop[call]` calls fail before they reach the fleet (a worker killed just before)."""

    def __init__(self, inner, lose: dict[str, int] | None = None, drop: dict[str, int] | None = None) -> None:  # noqa: ANN001
        self.inner, self.lose, self.drop = inner, dict(lose or {}), dict(drop or {})

    def __getattr__(self, name: str):  # noqa: ANN204
        fn = getattr(self.inner, name)
        if not callable(fn) or name not in (*self.lose, *self.drop):
            return fn

        def call(*a, **kw):  # noqa: ANN002, ANN003, ANN202
            if self.drop.get(name, 0) > 0:
                self.drop[name] -= 1
                raise FleetError(f"{name}: worker killed before the call")
            out = fn(*a, **kw)
            if self.lose.get(name, 0) > 0:
                self.lose[name] -= 1
                raise FleetError(f"{name}: read timed out (the fleet applied it)")
            return out

        return call


def test_the_reconciler_reads_the_task_sdks_run_state_enum_by_name(tmp_path):
    from airflow.sdk.api.datamodels._generated import DagRunState

    assert str(DagRunState.FAILED) != "failed"  # what made every ended run look alive
    cfg, clock, fleet, ledger, stop = world(tmp_path)
    s = stop()
    assert s.take().granted
    wait_checkpoints(s, clock)
    s.drain()
    runs = Runs({"run1": DagRunState.FAILED})  # type: ignore[dict-item]
    r, _reported = reconcile(cfg, fleet, ledger, runs, sleep=clock.advance, clock=clock, say=lambda _m: None)
    assert r["action"] == "closed" and "is failed" in r["why"], r
    assert not ledger.holdings(s.op_id)
    runs2 = Runs({"run2": DagRunState.RUNNING})  # type: ignore[dict-item]
    s2 = stop("pod-b", "t/run2/pod-b")
    assert s2.take().granted
    assert reconcile(cfg, fleet, ledger, runs2, sleep=clock.advance, clock=clock, say=lambda _m: None) == []
    assert ledger.holdings(s2.op_id)  # a running run is its own tasks' business


def test_an_offboard_whose_answer_was_lost_leaves_the_host_with_a_repair_operation(tmp_path):
    cfg, clock, fleet, ledger, stop = world(tmp_path, check_fail_rate=1.0)
    s = stop()
    s.fleet = Flaky(fleet, lose={"offboard": 1})
    assert s.take().granted
    wait_checkpoints(s, clock)
    s.drain()
    s.upgrade()
    with pytest.raises(FleetError, match="timed out"):
        s.check()  # the first host's offboard was applied; its answer was lost; the step fails
    in_repair = [h.name for h in fleet.hosts(s.held()) if h.state == HostState.REPAIR]
    assert len(in_repair) == 1  # in repair in the fleet, still leased to the stop in the ledger
    out = s.return_hosts()  # the teardown
    assert in_repair[0] in out["offboarded"]
    holders = ledger.holdings()
    for h in fleet.hosts(list(cfg.domain("pod-a").hosts)):
        assert h.state == HostState.REPAIR, h
        assert holders[h.name] == f"repair/{h.name}/{s.op_id}", holders  # never released in repair
        assert h.operation == f"repair/{h.name}/{s.op_id}", h
    assert [a["action"] for a in ledger.audit_rows(s.op_id)].count("offboard") == 4  # each recorded once
    settle(ledger, fleet)


def test_an_offboard_cut_before_the_fleets_handover_still_comes_back_through_the_gate(tmp_path):
    cfg, clock, fleet, ledger, stop = world(tmp_path, upgrade_fail_rate=1.0)
    s = stop()
    s.fleet = Flaky(fleet, drop={"handover": 1})
    assert s.take().granted
    wait_checkpoints(s, clock)
    s.drain()
    with pytest.raises(FleetError, match="killed"):
        s.upgrade()  # the ledger handed ha1 to its repair; the worker died before the fleet heard of it
    first = next(h for h, op in ledger.holdings().items() if op.startswith("repair/"))
    (h,) = fleet.hosts([first])
    assert h.operation == s.op_id  # the fleet still names the stop
    s.return_hosts()
    settle(ledger, fleet)
    (h,) = fleet.hosts([first])
    assert h.operation == f"repair/{first}/{s.op_id}", h
    fleet.repaired(first)
    fleet.settings(upgrade_fail_rate=0.0, check_fail_rate=0.0)
    out = gate_repaired(cfg, fleet, ledger, sleep=clock.advance, clock=clock, say=lambda m: None)
    assert first in out["returned"] and out["errors"] == {}, out
    assert fleet.hosts([first])[0].state == HostState.SERVING


def test_the_repair_gate_finds_a_host_whose_fleet_handover_never_happened(tmp_path):
    """The stop op holds nothing once all its hosts went to repair, so no teardown or reconciler comes
    back for it: the gate hands the host over in the fleet itself."""
    cfg, clock, fleet, ledger, stop = world(tmp_path, upgrade_fail_rate=1.0)
    s = stop()
    assert s.take().granted
    wait_checkpoints(s, clock)
    s.drain()
    s.fleet = Flaky(fleet, drop={"handover": 4})  # every fleet handover of the stop is lost
    with pytest.raises(FleetError):
        s.upgrade()
    s.fleet = fleet
    for h in fleet.hosts(s.held()):  # the retried step offboards the rest
        s.offboard(h.name, "upgrade failed: again")
    assert ledger.operation(s.op_id)["state"] == "done"
    stuck = [h.name for h in fleet.hosts(list(cfg.domain("pod-a").hosts)) if h.operation == s.op_id]
    assert stuck  # the fleet still names the stop for these
    for name in stuck:
        fleet.repaired(name)
    fleet.settings(upgrade_fail_rate=0.0)
    out = gate_repaired(cfg, fleet, ledger, sleep=clock.advance, clock=clock, say=lambda m: None)
    assert set(stuck) <= set(out["returned"]) and out["errors"] == {}, out


class ReadWhole:
    """The simulator as a fleet that cannot list its hosts out of service: a stop reads it whole."""

    def __init__(self, inner) -> None:  # noqa: ANN001
        self.inner = inner

    def __getattr__(self, name: str):  # noqa: ANN204
        if name == "hosts_out":
            raise AttributeError(name)
        return getattr(self.inner, name)


@pytest.mark.parametrize("read", ["hosts out", "whole fleet"])
def test_hosts_out_of_service_with_no_lease_count_against_capacity(tmp_path, read):
    def take(stop, fleet):  # noqa: ANN001, ANN202
        s = stop()
        if read == "whole fleet":
            s.fleet = ReadWhole(fleet)
        return s.take()

    cfg, clock, fleet, ledger, stop = world(tmp_path)
    pod_b = list(cfg.domain("pod-b").hosts)
    fleet.drain(pod_b[:3], "dead/run0/pod-b")  # drained by an operation the ledger no longer has
    d = take(stop, fleet)
    assert d.outcome == "stop" and "3 hosts broken, in repair or out with no lease > budget 2" in d.reason, d
    assert not ledger.holdings()
    # a drained, unleased host of the stop's own domain is taken and worked on, not counted twice
    (tmp_path / "2").mkdir()
    cfg, clock, fleet, ledger, stop = world(tmp_path / "2")
    fleet.drain(list(cfg.domain("pod-a").hosts)[:1], "dead/run0/pod-a")
    assert take(stop, fleet).granted


def test_a_hand_release_waits_for_the_run_to_end_and_for_airflow_to_say_so(tmp_path):
    cfg, clock, fleet, ledger, stop = world(tmp_path)
    s = stop()
    assert s.take().granted  # taken, never drained: its hosts serve
    with pytest.raises(ControlError, match=r"its run railyard_train_t/run1 is still running"):
        release_lease(cfg, fleet, ledger, s.op_id, reason="looks stuck to me", actor="alice",
                      runs=Runs({"run1": "running"}))

    class Down:
        def dag_known(self, dag_id: str) -> bool:
            raise ReconcileError("Airflow API http://127.0.0.1:1 unreachable: ConnectionError")

        def run_state(self, dag_id: str, run_id: str) -> str | None:
            raise AssertionError("never asked")

    with pytest.raises(ControlError, match="cannot ask Airflow"):
        release_lease(cfg, fleet, ledger, s.op_id, reason="looks stuck to me", actor="alice", runs=Down())
    with pytest.raises(ControlError, match="does not know the DAG"):
        release_lease(cfg, fleet, ledger, s.op_id, reason="looks stuck to me", actor="alice", runs=Runs({}, dags=()))
    assert sorted(ledger.holdings(s.op_id)) == sorted(cfg.domain("pod-a").hosts)  # nothing touched
    out = release_lease(cfg, fleet, ledger, s.op_id, reason="its run has ended", actor="alice",
                        runs=Runs({"run1": "failed"}))
    assert len(out["released"]) == 4


def test_a_repairs_host_in_repair_is_never_released_by_hand(tmp_path):
    cfg, clock, fleet, ledger, stop = world(tmp_path, upgrade_fail_rate=1.0)
    s = stop()
    assert s.take().granted
    wait_checkpoints(s, clock)
    s.drain()
    s.upgrade()
    s.return_hosts()
    op = ledger.holdings()["ha1"]
    with pytest.raises(ControlError, match="repair gate"):
        release_lease(cfg, fleet, ledger, op, reason="repair team says done", actor="alice", runs=Runs({}))
    assert ledger.holdings()["ha1"] == op


def test_one_repair_that_cannot_go_through_the_gate_does_not_starve_the_others(tmp_path):
    cfg, clock, fleet, ledger, stop = world(tmp_path, upgrade_fail_rate=1.0)
    s = stop()
    assert s.take().granted
    wait_checkpoints(s, clock)
    s.drain()
    s.upgrade()
    s.return_hosts()
    for h in ("ha1", "ha2", "ha3", "ha4"):
        fleet.repaired(h)
    fleet.settings(upgrade_fail_rate=0.0)

    class BrokenFor:
        def __init__(self, inner, host: str) -> None:  # noqa: ANN001
            self.inner, self.host = inner, host

        def __getattr__(self, name: str):  # noqa: ANN204
            return getattr(self.inner, name)

        def upgrade_hosts(self, work: dict, op: str) -> None:
            if self.host in work:
                raise FleetError(f"{self.host}: install agent not answering")
            self.inner.upgrade_hosts(work, op)

    out = gate_repaired(cfg, BrokenFor(fleet, "ha1"), ledger, sleep=clock.advance, clock=clock, say=lambda m: None)
    assert out["returned"] == ["ha2", "ha3", "ha4"], out  # ha1's repair is listed first, and failed
    ((op, error),) = out["errors"].items()
    assert op.startswith("repair/ha1/") and "not answering" in error, out
    assert [a["action"] for a in ledger.audit_rows(op)][-1] == "repair_gate_failed"
    out = gate_repaired(cfg, fleet, ledger, sleep=clock.advance, clock=clock, say=lambda m: None)  # the next run
    assert out["returned"] == ["ha1"] and out["errors"] == {}, out


def test_a_capacity_probe_never_starts_promotes_or_halts_a_rollout(tmp_path):
    """A trigger's poll (`take(probe=True)`) previews the phase gates; the task it wakes writes them."""
    from railyard.domain.config import parse_config
    from railyard.ledger import Ledger
    from railyard.operations.stop import Stop
    from railyard.sim.engine import SimEngine
    from tests.unit.test_releases import phased
    from tests.unit.test_stop import Clock

    cfg = parse_config(phased())
    clock = Clock()
    fleet = SimEngine(cfg, None, clock=clock)
    ledger = Ledger(f"sqlite:///{tmp_path}/ledger.db")

    def stop(domain: str) -> Stop:
        return Stop(config=cfg, train=cfg.train("t"), domain=cfg.domain(domain), op_id=f"t/run1/{domain}",
                    fleet=fleet, ledger=ledger, sleep=clock.advance, clock=clock)

    before = ledger.audit_count()
    s = stop("pod-a")
    assert s.take(probe=True).outcome == "free"
    assert ledger.release_state("krn") is None  # no rollout started by a poll
    assert [a["action"] for a in ledger.audit_rows()][before:] == []
    assert s.take().granted  # the task itself starts the rollout and freezes the targets
    assert ledger.release_state("krn") is not None
    assert "host_targets" in ledger.detail(s.op_id)


def test_a_release_action_cleared_and_run_again_is_applied_once(tmp_path):
    from railyard.domain.config import parse_config
    from railyard.ledger import Ledger
    from railyard.operations.releases import Rollout
    from tests.unit.test_releases import phased

    cfg = parse_config(phased())
    ledger = Ledger(f"sqlite:///{tmp_path}/ledger.db")
    key = "manual__2026-12-01T10:00:00+00:00"
    for _ in range(2):  # the task ran, was cleared, and ran again in the same run
        st = Rollout(cfg, ledger).act("promote", "krn", reason="canary looked good to us", actor="ana", now=10.0,
                                      key=key)
    assert st.phase == "staged"
    assert [r["action"] for r in ledger.audit_rows("release/krn")].count("release_promote") == 1
    st = Rollout(cfg, ledger).act("promote", "krn", reason="staged looked good too", actor="ana", now=20.0,
                                  key="manual__2026-12-01T11:00:00+00:00")
    assert st.phase == "fleet"  # another run is another action


@pytest.mark.parametrize("url", [
    "postgresql+psycopg2://ry@127.0.0.1:1/railyard?password=s3cr3t-in-query",
    "postgresql://ry@127.0.0.1:1/railyard?sslmode=require&sslpassword=s3cr3t-in-query",
    "postgresql+psycopg2://ry:s3cr3t-in-query@127.0.0.1:1/railyard",
])
def test_a_credential_anywhere_in_the_ledger_url_is_never_shown_or_shipped(url):
    from railyard.domain.config import ConfigError, parse_config
    from railyard.ledger import Ledger, LedgerError, safe_url
    from railyard_airflow.sensors.stop import shareable_url
    from tests.unit.test_stop import CONFIG

    assert "s3cr3t" not in safe_url(url) and "***" in safe_url(url)
    with pytest.raises(LedgerError) as err:
        Ledger(url)  # nothing listens on port 1
    assert "s3cr3t" not in str(err.value) and "cannot open" in str(err.value)
    assert shareable_url(url) is None  # never in a trigger's kwargs
    bad = url.replace("postgresql+psycopg2", "mysql").replace("postgresql", "mysql")
    with pytest.raises(ConfigError) as err2:
        parse_config({**CONFIG, "ledger": {"url": bad}})
    assert "s3cr3t" not in str(err2.value) and "mysql" in str(err2.value)
    assert shareable_url("postgresql+psycopg2://ry@db/railyard?sslmode=require") is not None


def test_a_drain_without_the_checkpoint_wait_asks_the_jobs_itself_and_waits(tmp_path):
    """`wait_checkpoints` marked success by hand: the drain asks the domain's jobs and waits for fresh
    checkpoints before it drains, so no job loses work."""
    cfg, clock, fleet, ledger, stop = world(tmp_path)
    s = stop()
    assert s.take().granted
    jobs = [j.id for j in fleet.jobs(list(cfg.domain("pod-a").hosts)) if j.state == "running"]
    assert jobs
    clock.advance(20)  # 20 minutes of fleet time of work since the jobs' last checkpoint
    s.drain()  # no request_checkpoints before it
    assert all(h.state == HostState.DRAINED for h in fleet.hosts(s.held()))
    cut = [i for i in fleet.audit()["interruptions"] if i["job"] in jobs]
    assert cut and all(i["lost_s"] < 60 for i in cut), cut  # each drained within a poll of a fresh checkpoint
    asked = [a for a in ledger.audit_rows(s.op_id) if a["action"] == "checkpoint_requested"]
    assert asked and "at the drain" in asked[0]["reason"]
    assert set(ledger.detail(s.op_id)["checkpoints_asked"]) == set(jobs)  # kept for the run report


def test_a_drain_refuses_while_a_job_has_no_fresh_checkpoint(tmp_path):
    from railyard.operations.stop import StopError

    cfg, clock, fleet, ledger, stop = world(tmp_path)
    s = stop()
    assert s.take().granted
    (job, *_) = [j for j in fleet.jobs(list(cfg.domain("pod-a").hosts)) if j.state == "running"]
    fleet.set_job(job.id, stuck=True)  # it will never checkpoint
    clock.advance(20)
    with pytest.raises(StopError, match=f"not drained, jobs would lose work.*{job.id}"):
        s.drain()
    assert all(h.state == HostState.SERVING for h in fleet.hosts(s.held()))  # nothing drained
    assert fleet.audit()["interruptions"] == []


def test_a_domain_whose_hosts_all_fail_reads_the_audit_once_per_step_not_once_per_host(tmp_path):
    cfg, clock, fleet, ledger, stop = world(tmp_path, check_fail_rate=1.0)
    s = stop()
    assert s.take().granted
    wait_checkpoints(s, clock)
    s.drain()
    s.upgrade()
    reads = []
    audit_rows = ledger.audit_rows
    ledger.audit_rows = lambda *a, **kw: reads.append(a) or audit_rows(*a, **kw)  # type: ignore[method-assign]
    out = s.check()
    assert len(out["offboarded"]) == len(cfg.domain("pod-a").hosts) >= 4
    assert len(reads) <= 1, reads  # was one read of the whole operation's audit per host offboarded
    assert sorted(s.offboarded()) == sorted(out["offboarded"])
    assert s.return_hosts()["offboarded"] == sorted(out["offboarded"])
