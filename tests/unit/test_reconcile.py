"""Nothing stuck forever, over the in-process simulator: the reconciler finishes stops whose run is
gone, the operator's lease release keeps the invariants, and an emergency that breaks a rule is
refused. (The same paths on a real Airflow: tests/e2e/test_recovery.py.)"""

from __future__ import annotations

import pytest

from railyard.domain.config import parse_config
from railyard.domain.models import BROKEN_STATES, HostState
from railyard.ledger import Ledger
from railyard.operations.emergency import broken_rules, parse_request
from railyard.operations.ops import ControlError, describe_host, describe_ops, release_lease
from railyard.operations.reconcile import dag_id_for, owner_of, reconcile
from railyard.operations.stop import Stop, pending_steps
from railyard.sim.engine import SimEngine
from tests.unit.test_stop import CONFIG, Clock, wait_checkpoints, world


class Runs:
    """A RunOracle with the answers of the test: run id -> state (missing: deleted)."""

    def __init__(self, states: dict[str, str], dags: tuple[str, ...] = (dag_id_for("t"),)) -> None:
        self.states, self.dags, self.asked = states, dags, []

    def dag_known(self, dag_id: str) -> bool:
        return dag_id in self.dags

    def run_state(self, dag_id: str, run_id: str) -> str | None:
        self.asked.append((dag_id, run_id))
        return self.states.get(run_id)


def settle(ledger: Ledger, fleet) -> None:  # noqa: ANN001
    """The invariant every test ends on: every host serving or in repair, and every lease a repair's."""
    for h in fleet.hosts():
        assert h.state == HostState.SERVING or h.state in BROKEN_STATES, h
    assert all(op.startswith("repair/") for op in ledger.holdings().values()), ledger.holdings()


def go(cfg, fleet, ledger, clock, runs: Runs, **kw) -> list[dict]:  # noqa: ANN001
    """What the reconciler did to operations (the reports it wrote for the runs: tests/unit/test_runreport.py)."""
    out = reconcile(cfg, fleet, ledger, runs, sleep=clock.advance, clock=clock, say=lambda _m: None, **kw)
    return [r for r in out if r["action"] != "reported"]


def test_a_stop_whose_run_was_deleted_after_its_drain_is_checked_and_returned_as_it_is(tmp_path):
    cfg, clock, fleet, ledger, stop = world(tmp_path)
    s = stop()
    assert s.take().granted
    wait_checkpoints(s, clock)
    s.drain()  # ... and every process dies: nothing was installed
    assert {h.state for h in fleet.hosts(s.held())} == {HostState.DRAINED}
    runs = Runs({"run1": "running"})
    assert go(cfg, fleet, ledger, clock, runs) == []  # a run that runs is its own tasks' business
    assert ledger.holdings(s.op_id)
    del runs.states["run1"]  # the run is deleted
    (r,) = go(cfg, fleet, ledger, clock, runs)
    assert r["action"] == "closed" and r["returned"] == 4 and r["released"], r
    assert "deleted" in r["why"]
    settle(ledger, fleet)
    for h in fleet.hosts(list(cfg.domain("pod-a").hosts)):
        assert h.state == HostState.SERVING and h.versions["gpu-driver"] == "550.1"  # checked, not upgraded
    assert fleet.audit()["unverified_returns"] == []
    actions = [(a["action"], a["actor"]) for a in ledger.audit_rows(s.op_id)]
    assert ("reconcile", "reconciler") in actions and ("release", "reconciler") in actions
    assert ledger.operation(s.op_id)["state"] == "done"
    assert ledger.last_visits("t") == {}  # an unfinished stop is no visit: the next run comes back
    assert go(cfg, fleet, ledger, clock, runs) == []  # idempotent


def test_a_stop_whose_run_failed_mid_upgrade_is_waited_for_checked_and_returned(tmp_path):
    cfg, clock, fleet, ledger, stop = world(tmp_path)
    s = stop()
    assert s.take().granted
    wait_checkpoints(s, clock)
    s.drain()
    for h in fleet.hosts(s.held()):  # the upgrade step started the installs, then the run was marked failed
        fleet.upgrade(h.name, pending_steps(s.targets_for(h.name), h), s.op_id)
    assert {h.state for h in fleet.hosts(s.held())} == {HostState.UPGRADING}
    (r,) = go(cfg, fleet, ledger, clock, Runs({"run1": "failed"}))
    assert r["action"] == "closed" and r["returned"] == 4 and "failed" in r["why"], r
    settle(ledger, fleet)
    for h in fleet.hosts(list(cfg.domain("pod-a").hosts)):
        assert h.state == HostState.SERVING and h.versions == cfg.train_targets(cfg.train("t"))


def test_a_half_installed_host_is_never_returned_in_a_mix_that_breaks_a_rule(tmp_path):
    top = {"compatibility": {"rules": ["fabric-manager == gpu-driver"]}}
    cfg, clock, fleet, ledger, stop = world(tmp_path, top=top)
    s = stop()
    assert s.take().granted
    wait_checkpoints(s, clock)
    s.drain()
    from railyard.domain.models import Step

    fleet.upgrade("ha1", [Step(component="gpu-driver", version="570.86.15")], s.op_id)  # crash after one of two
    (r,) = go(cfg, fleet, ledger, clock, Runs({}))
    assert r["to_repair"] == ["ha1"] and r["returned"] == 3, r
    (ha1,) = fleet.hosts(["ha1"])
    assert ha1.state == HostState.REPAIR and "fabric-manager == gpu-driver" in ha1.reason
    settle(ledger, fleet)


def test_the_reconciler_never_judges_a_dag_that_airflow_does_not_know(tmp_path):
    cfg, clock, fleet, ledger, stop = world(tmp_path)
    s = stop()
    assert s.take().granted
    runs = Runs({}, dags=())  # the wrong Airflow: no run of ours exists there
    (r,) = go(cfg, fleet, ledger, clock, runs)
    assert r["action"] == "skipped" and runs.asked == []
    assert ledger.holdings(s.op_id)


def test_owner_of_maps_operations_to_their_runs():
    assert owner_of({"id": "t/manual__2026-11-30T10:00:00+00:00/pod-a", "kind": "train_stop"}) == (
        "railyard_train_t", "manual__2026-11-30T10:00:00+00:00")
    assert owner_of({"id": "emergency/r9/pod-b", "kind": "emergency"}) == ("railyard_emergency", "r9")
    assert owner_of({"id": "emergency/r9", "kind": "emergency_run"}) == ("railyard_emergency", "r9")
    assert owner_of({"id": "repair/ha1/t/r/pod-a", "kind": "repair"}) is None


def test_lease_release_refuses_while_hosts_are_out_and_sends_them_to_repair_when_asked(tmp_path):
    cfg, clock, fleet, ledger, stop = world(tmp_path)
    s = stop()
    assert s.take().granted
    wait_checkpoints(s, clock)
    s.drain()
    with pytest.raises(ControlError, match="reason"):
        release_lease(cfg, fleet, ledger, s.op_id, reason="", actor="alice", runs=Runs({}))
    with pytest.raises(ControlError, match=r"4 host\(s\) out of service: ha1 \(drained\).*--to-repair"):
        release_lease(cfg, fleet, ledger, s.op_id, reason="the run is gone, pod-a is ours", actor="alice",
                      runs=Runs({}))
    assert sorted(ledger.holdings(s.op_id)) == ["ha1", "ha2", "ha3", "ha4"]  # nothing touched
    refused = [a for a in ledger.audit_rows(s.op_id) if a["action"] == "lease_release_refused"]
    assert refused and refused[0]["actor"] == "alice"
    out = release_lease(cfg, fleet, ledger, s.op_id, reason="the run is gone, pod-a is ours", actor="alice",
                        runs=Runs({}), to_repair=True)
    assert out["to_repair"] == ["ha1", "ha2", "ha3", "ha4"]
    assert not ledger.holdings(s.op_id) and ledger.operation(s.op_id)["state"] == "done"
    for h in fleet.hosts(list(cfg.domain("pod-a").hosts)):
        assert h.state == HostState.REPAIR and "sent to repair by alice" in h.reason
        assert ledger.holdings()[h.name] == f"repair/{h.name}/{s.op_id}"
    settle(ledger, fleet)
    with pytest.raises(ControlError, match="holds no host"):
        release_lease(cfg, fleet, ledger, s.op_id, reason="once more with feeling", actor="alice", runs=Runs({}))
    with pytest.raises(ControlError, match="no such operation"):
        release_lease(cfg, fleet, ledger, "t/nope/pod-z", reason="once more with feeling", actor="alice", runs=Runs({}))


def test_lease_release_of_serving_hosts_releases_and_is_audited_with_the_user(tmp_path):
    cfg, clock, fleet, ledger, stop = world(tmp_path)
    s = stop()
    assert s.take().granted  # taken, never drained: every host still serving
    out = release_lease(cfg, fleet, ledger, s.op_id, reason="train retired before it started", actor="bob",
                        runs=Runs({}))
    assert out["released"] == ["ha1", "ha2", "ha3", "ha4"] and out["to_repair"] == []
    (rel,) = [a for a in ledger.audit_rows(s.op_id) if a["action"] == "release"]
    assert rel["actor"] == "bob" and "train retired" in rel["reason"]
    assert stop("pod-b", "t/run2/pod-b").take().granted  # the capacity is free again


def test_ops_and_host_history_show_what_is_held_and_what_happened(tmp_path):
    cfg, clock, fleet, ledger, stop = world(tmp_path, check_fail_rate=1.0)
    s = stop()
    assert s.take().granted
    ops = ledger.active_operations()
    assert ([(o["id"], o["hosts"], o["last"]["action"]) for o in ops]
            == [(s.op_id, ["ha1", "ha2", "ha3", "ha4"], "lease")])
    text = describe_ops(ops)
    assert s.op_id in text and "railyard_train_t/run1" in text
    wait_checkpoints(s, clock)
    s.drain()
    s.upgrade()
    s.check()
    s.return_hosts()
    h = ledger.host_history("ha2")
    assert h["lease"]["op_id"] == f"repair/ha2/{s.op_id}"
    assert [e["action"] for e in h["events"]][:3] == ["lease", "checkpoint_requested", "drain"]
    assert "offboard" in [e["action"] for e in h["events"]]
    assert all("ha2" in e["hosts"] for e in h["events"])
    (check,) = h["checks"]
    assert check["passed"] is False and check["reason"] and check["versions"]["gpu-driver"] == "570.86.15"
    assert check["reason"] in describe_host(h)
    assert ledger.host_history("ha")["events"] == []  # a prefix of names is no match


def test_an_emergency_that_would_break_an_equals_rule_is_refused_before_anything_is_touched():
    data = {**CONFIG,
            "releases": CONFIG["releases"] + [{"id": "drv-575", "component": "gpu-driver", "version": "575.1"}],
            "compatibility": {"rules": ["fabric-manager == gpu-driver"]}}
    cfg = parse_config(data)
    fleet = SimEngine(cfg, None, clock=Clock())
    before = {h.name: (h.state, dict(h.versions)) for h in fleet.hosts()}
    req = parse_request(cfg, {"releases": ["drv-575"], "domains": ["pod-b"], "reason": "CVE-2026-1 in the driver"})
    broken = broken_rules(cfg, fleet, req)
    assert len(broken) == 1 and "fabric-manager == gpu-driver" in broken[0] and "hb1" in broken[0]
    ok = parse_request(cfg, {"releases": ["drv", "fm"], "hosts": ["hb1"], "reason": "matching pair, both at once"})
    assert broken_rules(cfg, fleet, ok) == []
    assert {h.name: (h.state, dict(h.versions)) for h in fleet.hosts()} == before


def test_an_emergency_stop_whose_run_is_gone_is_finished_too(tmp_path):
    from tests.unit.test_stop import emergency_world

    cfg, clock, fleet, ledger, _stop, emergency = emergency_world(tmp_path)
    req = {"releases": ["drv-575"], "domains": ["pod-b"], "reason": "CVE-2026-1 in the driver"}
    from railyard.operations.emergency import plan

    p = plan(cfg, fleet, parse_request(cfg, req))
    ledger.open_operation("emergency/e1", kind="emergency_run", detail={"request": {**req}, "plan": p, "user": "u"},
                          actor="u", action="emergency_trigger", reason="test")
    e: Stop = emergency("pod-b")
    assert e.take().granted
    wait_checkpoints(e, clock)
    e.drain()
    e.upgrade()
    runs = Runs({}, dags=("railyard_emergency",))
    out = {r["op"]: r for r in go(cfg, fleet, ledger, clock, runs)}
    assert out["emergency/e1/pod-b"]["action"] == "closed" and out["emergency/e1/pod-b"]["returned"] == 4
    assert out["emergency/e1"]["action"] == "finished"
    settle(ledger, fleet)
    assert all(h.versions["gpu-driver"] == "575.1" for h in fleet.hosts(list(cfg.domain("pod-b").hosts)))
    assert ledger.active_operations() == []


def test_the_demo_progress_line_says_what_a_stop_waits_for_and_who_holds_it(tmp_path):
    from railyard.devstack.demo import waiting_for

    cfg, clock, fleet, ledger, stop = world(tmp_path)
    assert waiting_for(ledger, "pod-b", "wait_capacity") == ""
    assert stop("pod-c", "t/crashed/pod-c").take().granted
    assert waiting_for(ledger, "pod-a", "wait_capacity") == " (capacity: pod-c held by t/crashed/pod-c)"
    assert waiting_for(ledger, "pod-a", "wait_checkpoints") == " (jobs checkpointing)"
    assert waiting_for(ledger, "pod-c", "drain") == ""


def test_a_closing_check_never_passes_on_a_host_that_reports_no_version(tmp_path):
    """Fail closed: a host whose versions say nothing of a component is checked against its target."""
    from railyard.domain.models import Host

    cfg, clock, fleet, ledger, stop = world(tmp_path)
    s = stop()
    s.closing = True
    bare = Host(name="ha1", domain="pod-a", state=HostState.DRAINED, versions={})
    assert s.expected(bare) == cfg.train_targets(cfg.train("t"))
    half = Host(name="ha1", domain="pod-a", state=HostState.DRAINED, versions={"gpu-driver": "550.1"})
    assert s.expected(half) == {"gpu-driver": "550.1", "fabric-manager": "570.86.15"}
