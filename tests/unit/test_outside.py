"""Outside work through the ledger (railyard.operations.outside) over the in-process simulator: queued behind
a train's stop, granted when it ends; waiting for the buffers and for a freeze, saying why; jobs checkpointed
before the drain; hosts back only after a passing check, a failing one to repair with the evidence; a bad
request refused before anything is touched; a vanished requester escalated at its deadline, never released."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from railyard.domain.models import HostState
from railyard.operations import outside
from railyard.operations.reconcile import reconcile
from tests.unit.test_stop import CONFIG, full_stop_after_take, world


def quiet() -> dict:
    return {"check_fail_rate": 0.0, "upgrade_fail_rate": 0.0, "host_failure_per_hour": 0.0}


def request(cfg, clock, fleet, ledger, hosts, kind="hw-repair", reason="replace the NIC on these hosts", **kw):
    req = outside.parse_request(cfg, hosts=hosts, kind=kind, reason=reason, **kw)
    op = outside.open_request(cfg, ledger, req, actor="hwteam")
    return op, outside.stop_of(cfg, fleet, ledger, op, sleep=clock.advance, clock=clock)


def handed(s) -> dict:
    """Advance a request, as its driver does, until its hosts are handed over (the simulator's clock moves)."""
    return outside.wait_handed(s, say=lambda _m: None, poll_s=0.25)


def busy(fleet, clock, hosts: list[str]) -> None:
    """Let the simulated world run until a job on `hosts` has worked since its last checkpoint."""
    for _ in range(400):
        clock.advance(1)  # a minute of the simulator's (its checkpoints come every 30 minutes)
        if any(j.state == "running" and j.last_checkpoint < fleet.now() for j in fleet.jobs(hosts)):
            return
    raise AssertionError(f"no job came to {hosts}")


class NoRuns:
    def dag_known(self, dag_id: str) -> bool:
        return True

    def run_state(self, dag_id: str, run_id: str) -> str | None:
        return "running"


def test_queued_behind_a_train_stop_then_handed_over_with_checkpoints_then_back_through_the_check(tmp_path):
    cfg, clock, fleet, ledger, stop = world(tmp_path, **quiet())
    train = stop("pod-a")
    assert train.take().granted
    op, s = request(cfg, clock, fleet, ledger, ["hb1", "hb2"])
    first = outside.advance(s)
    assert first["phase"] == "queued" and "max_domains_down=1" in first["why"] and "pod-a" in first["why"], first
    st = outside.status(ledger, op)
    assert st["phase"] == "queued" and st["waiting"] and st["domains_out"] == {"pod-a": "t/run1/pod-a"}
    assert "max_domains_down=1" in outside.describe_status(st)
    full_stop_after_take(train, clock)  # the train's stop ends: the request is granted
    jobs_b = {j.id for j in fleet.jobs(["hb1", "hb2"]) if j.state == "running"}
    assert jobs_b
    out = outside.advance(s)  # granted: its jobs are asked to checkpoint; nothing drained before they have
    assert out["phase"] == "checkpointing" and "checkpoints of" in out["why"], out
    assert {h.name for h in fleet.hosts() if h.state == HostState.DRAINED} == set()
    out = handed(s)
    assert out == {"phase": "handed", "hosts": ["hb1", "hb2"]}, out
    # only its own hosts, drained after their jobs checkpointed since they were asked
    assert {h.name for h in fleet.hosts() if h.state == HostState.DRAINED} == {"hb1", "hb2"}
    asked = ledger.detail(op)["checkpoint_requested_at"]
    assert all(j.last_checkpoint >= asked for j in fleet.jobs(["hb1", "hb2"]) if j.id in jobs_b)
    assert ledger.domains_out() == {"pod-b": op}
    assert outside.advance(s)["phase"] == "handed"  # again: idempotent
    # the requester is done: hb2 fails its check, hb1 passes
    fleet.settings(check_fail_rate=1.0)
    s2 = outside.stop_of(cfg, fleet, ledger, op, sleep=clock.advance, clock=clock)
    s2.scope = ["hb2"]  # the check of hb2 first, alone, fails
    s2.check(["hb2"])
    fleet.settings(check_fail_rate=0.0)
    back = outside.give_back(outside.stop_of(cfg, fleet, ledger, op, sleep=clock.advance, clock=clock),
                             to_repair=[], reason="the NIC is replaced on both")
    assert back["returned"] == 1 and back["to_repair"] == ["hb2"], back
    hb1, hb2 = fleet.hosts(["hb1", "hb2"])
    assert hb1.state == HostState.SERVING and hb2.state == HostState.REPAIR and "health check failed" in hb2.reason
    assert not ledger.holdings(op) and ledger.operation(op)["state"] == "done"
    assert outside.status(ledger, op)["phase"] == "returned"
    # checked at the versions they had when handed over
    assert ledger.verifications(op)["hb1"][1] == ledger.versions_before(op)["hb1"]


def test_a_request_waits_for_a_freeze_and_for_the_failure_buffer_and_says_why(tmp_path):
    cfg, clock, fleet, ledger, _stop = world(tmp_path, **quiet())
    ledger.set_switch("freeze", True, reason="launch week, nothing moves", actor="ops")
    op, s = request(cfg, clock, fleet, ledger, ["hc1"])
    out = outside.advance(s)
    assert out["phase"] == "queued" and "freeze" in out["why"] and "launch week" in out["why"], out
    ledger.set_switch("freeze", False, reason="launch is over, thaw", actor="ops")
    for h in ("ha1", "ha2", "ha3"):  # 3 broken > the failure buffer of 2: wait, never halt anything
        fleet.fail(h)
    out = outside.advance(s)
    assert out["phase"] == "queued" and "failure buffer" in out["why"], out
    assert ledger.operation(op)["state"] == "active" and not ledger.holdings(op)
    said: list[str] = []
    got = outside.wait_handed(s, say=said.append, poll_s=1, timeout_s=0)
    assert got["phase"] == "queued" and said and "failure buffer" in said[0]
    # withdrawn while queued: finished, nothing held
    assert outside.give_back(s, to_repair=[], reason="not needed any more")["returned"] == 0
    assert ledger.operation(op)["state"] == "done"


def test_hosts_the_requester_names_go_to_repair_with_its_reason(tmp_path):
    cfg, clock, fleet, ledger, _stop = world(tmp_path, **quiet())
    op, s = request(cfg, clock, fleet, ledger, ["hc1", "hc2"], kind="network")
    assert handed(s)["phase"] == "handed"
    back = outside.give_back(s, to_repair=["hc2"], reason="the optic did not come up")
    assert back == {"checked": 1, "passed": 1, "returned": 1, "to_repair": ["hc2"]}, back
    hc2 = fleet.hosts(["hc2"])[0]
    assert hc2.state == HostState.REPAIR and "the optic did not come up" in hc2.reason


@pytest.mark.parametrize(("hosts", "kind", "reason", "needle"), [
    (["ha1", "hz9"], "hw-repair", "replace the NIC here", "hosts[1]: unknown host 'hz9'"),
    (["hal"], "hw-repair", "replace the NIC here", "did you mean 'ha1'?"),  # a look-alike: l for 1
    (["ha1", "hb1"], "hw-repair", "replace the NIC here", "span domains pod-a, pod-b"),
    (["ha1"], "hw-repair", "", "reason: say why in 10 to 1000 characters"),
    (["ha1"], "HW repair!", "replace the NIC here", "kind: a token"),
    ([], "hw-repair", "replace the NIC here", "hosts: name at least one host"),
])
def test_a_bad_request_is_refused_by_field_and_value_before_anything_is_touched(tmp_path, hosts, kind, reason,
                                                                                  needle):
    cfg, _clock, _fleet, ledger, _stop = world(tmp_path, **quiet())
    with pytest.raises(outside.OutsideError) as err:
        outside.parse_request(cfg, hosts=hosts, kind=kind, reason=reason)
    assert needle in str(err.value), err.value
    assert ledger.audit_rows() == [] and ledger.active_operations() == []


def test_a_vanished_requester_is_escalated_at_its_deadline_and_never_released(tmp_path, monkeypatch):
    cfg, clock, fleet, ledger, _stop = world(tmp_path, **quiet())
    op, s = request(cfg, clock, fleet, ledger, ["hc1"], deadline_h=1)
    assert handed(s)["phase"] == "handed"
    assert reconcile(cfg, fleet, ledger, NoRuns(), say=lambda _m: None) == []  # not yet due
    import time as real_time

    later = real_time.time() + 2 * 3600
    monkeypatch.setattr(outside.time, "time", lambda: later)
    import railyard.operations.reconcile as rec

    monkeypatch.setattr(rec.time, "time", lambda: later)
    out = reconcile(cfg, fleet, ledger, NoRuns(), say=lambda _m: None)
    assert out == [{"op": op, "action": "escalated", "why": "past its deadline"}], out
    esc = [r for r in ledger.audit_rows(op) if r["action"] == "escalation"]
    assert len(esc) == 1 and "outside_overdue" in esc[0]["reason"] and "hwteam" in esc[0]["reason"]
    assert reconcile(cfg, fleet, ledger, NoRuns(), say=lambda _m: None) == []  # once
    assert ledger.holdings(op) == {"hc1": op}  # still held: only its return or a lease release by hand ends it
    assert fleet.hosts(["hc1"])[0].state == HostState.DRAINED


def test_the_cli_refuses_a_bad_request_and_an_unknown_operation(tmp_path):
    url = f"sqlite:///{tmp_path}/ledger.db"
    conf = tmp_path / "railyard.yaml"
    conf.write_text(yaml.safe_dump({**CONFIG, "ledger": {"url": url}}))

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "railyard.cli", *args, "--config", str(conf)],
                              capture_output=True, text=True, timeout=60)

    bad = cli("op", "request", "--hosts", "ha1,hz9", "--kind", "hw-repair", "--reason", "short")
    assert bad.returncode == 2, bad
    assert "hosts[1]: unknown host 'hz9'" in bad.stderr and "reason: say why" in bad.stderr
    assert not (tmp_path / "ledger.db").exists() or "outside/" not in (tmp_path / "ledger.db").read_bytes().decode(
        "latin-1")
    missing = cli("op", "status", "outside/hw-repair/nope/pod-a")
    assert missing.returncode == 2 and "no outside operation" in missing.stderr



def test_a_request_given_up_while_its_jobs_checkpoint_is_withdrawn_with_its_hosts_untouched(tmp_path):
    """Granted, its jobs asked to checkpoint, nothing drained yet: the requester gives up (the page's return,
    carried out by the next advance, as its run does). The lease is released, every host still serving."""
    cfg, clock, fleet, ledger, _stop = world(tmp_path, **quiet())
    busy(fleet, clock, ["hb1", "hb2"])
    op, s = request(cfg, clock, fleet, ledger, ["hb1", "hb2"])
    assert outside.advance(s)["phase"] == "checkpointing"
    assert ledger.holdings(op) == {"hb1": op, "hb2": op}
    with pytest.raises(outside.OutsideError, match="to_repair: .* is checkpointing, not handed over"):
        outside.ask_return(ledger, op, to_repair=["hb1"], reason="changed our minds", actor="hwteam")
    outside.ask_return(ledger, op, to_repair=[], reason="the vendor postponed the swap", actor="hwteam")
    # a driver restarted after a crash sees the same thing: a fresh Stop over the same ledger
    again = outside.stop_of(cfg, fleet, ledger, op, sleep=clock.advance, clock=clock)
    assert outside.advance(again) == {"phase": "withdrawn"}
    assert outside.advance(again) == {"phase": "withdrawn"}  # idempotent
    assert {h.state for h in fleet.hosts(["hb1", "hb2"])} == {HostState.SERVING}
    assert ledger.holdings() == {} and ledger.operation(op)["state"] == "done"
    assert outside.status(ledger, op)["phase"] == "withdrawn"
    assert [r["actor"] for r in ledger.audit_rows(op, action="return_asked")] == ["hwteam"]


def test_a_driver_that_died_mid_request_picks_up_where_it_stopped(tmp_path):
    """Each step is found again by a fresh driver: asked to checkpoint once (the first request's time kept),
    drained and handed over once; `give_back` after a crash in the middle of its check finishes it."""
    cfg, clock, fleet, ledger, _stop = world(tmp_path, **quiet())
    busy(fleet, clock, ["hc1", "hc2"])
    op, s = request(cfg, clock, fleet, ledger, ["hc1", "hc2"])
    assert outside.advance(s)["phase"] == "checkpointing"
    asked = ledger.detail(op)["checkpoint_requested_at"]
    fresh = outside.stop_of(cfg, fleet, ledger, op, sleep=clock.advance, clock=clock)
    assert handed(fresh)["phase"] == "handed"
    assert ledger.detail(op)["checkpoint_requested_at"] == asked
    assert len(ledger.audit_rows(op, action="checkpoint_requested")) == 1
    assert len(ledger.audit_rows(op, action="handed_to_requester")) == 1
    ledger.set_detail(op, "phase", "returning")  # a give_back that died before its check
    back = outside.give_back(outside.stop_of(cfg, fleet, ledger, op, sleep=clock.advance, clock=clock),
                             to_repair=[], reason="cables replaced on both")
    assert back["returned"] == 2 and ledger.operation(op)["state"] == "done"
    again = outside.give_back(outside.stop_of(cfg, fleet, ledger, op, sleep=clock.advance, clock=clock),
                              to_repair=[], reason="cables replaced on both")
    assert again == {"checked": 0, "passed": 0, "returned": 0, "to_repair": []}


def test_a_vanished_requester_s_hosts_go_to_repair_by_hand_with_lease_release(tmp_path):
    """`railyard lease release --to-repair` on an outside operation: refused without it while the hosts are out;
    with it, each host goes to a repair operation of its own (back through the repair gate), the lease ends."""
    from railyard.operations.ops import ControlError, release_lease

    cfg, clock, fleet, ledger, _stop = world(tmp_path, **quiet())
    op, s = request(cfg, clock, fleet, ledger, ["hc1", "hc2"], deadline_h=1)
    assert handed(s)["phase"] == "handed"
    with pytest.raises(ControlError, match="out of service"):
        release_lease(cfg, fleet, ledger, op, reason="the hw team never came back", actor="oncall", runs=NoRuns())
    out = release_lease(cfg, fleet, ledger, op, reason="the hw team never came back", actor="oncall",
                        runs=NoRuns(), to_repair=True)
    assert sorted(out["to_repair"]) == ["hc1", "hc2"] and not ledger.holdings(op), out
    assert {h.state for h in fleet.hosts(["hc1", "hc2"])} == {HostState.REPAIR}
    assert all(v.startswith("repair/") for v in ledger.holdings().values())
