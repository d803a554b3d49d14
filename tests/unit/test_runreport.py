"""The run report (railyard.operations.runreport), from the ledger a real train wrote over the in-process
simulator: every host with its outcome, versions before and after and evidence; a run cut short; a run the
reconciler finished; the CLI's `runs` and `report`."""

from __future__ import annotations

import json
import subprocess
import sys

import yaml

from railyard.domain.models import HostState
from railyard.operations import runreport
from railyard.operations.reconcile import reconcile
from railyard.operations.stop import Stop
from tests.unit.test_stop import CONFIG, full_stop_after_take, wait_checkpoints, world

BEFORE = {"gpu-driver": "550.1", "fabric-manager": "550.1"}
AFTER = {"gpu-driver": "570.86.15", "fabric-manager": "570.86.15"}


def stop_of(cfg, clock, fleet, ledger, domain: str, run: str = "r1") -> Stop:
    return Stop(config=cfg, train=cfg.train("t"), domain=cfg.domain(domain), op_id=f"t/{run}/{domain}", fleet=fleet,
                ledger=ledger, sleep=clock.advance, clock=clock)


def test_a_train_with_a_failed_check_reports_every_host_with_its_outcome(tmp_path):
    roomy = {"buffers": {"maintenance": {"hosts": 4}, "failure": {"hosts": 5}}}  # pod-b's 4 failures fit
    cfg, clock, fleet, ledger, _stop = world(tmp_path, top=roomy, check_fail_rate=0.0, upgrade_fail_rate=0.0,
                                             host_failure_per_hour=0.0)
    for domain in ("pod-a", "pod-b", "pod-c"):
        s = stop_of(cfg, clock, fleet, ledger, domain)
        assert s.take().granted
        if domain == "pod-b":  # every host of pod-b fails its deep check
            fleet.settings(check_fail_rate=1.0)
        full_stop_after_take(s, clock)
        fleet.settings(check_fail_rate=0.0)
    r = runreport.build(ledger, train="t", run_id="r1", triggered_by="alice", reason="the monthly driver")
    assert r["run"]["outcome"] == "success" and r["run"]["triggered_by"] == "alice"
    assert set(r["hosts"]) == {f"h{c}{i}" for c in "abc" for i in range(1, 5)}
    for name, h in r["hosts"].items():
        if name.startswith("hb"):
            real = fleet.hosts([name])[0]
            assert real.state == HostState.REPAIR
            assert h["outcome"] == "to repair" and h["check"] == "failed", h
            assert h["evidence"] and real.reason and real.reason in h["evidence"], (h, real.reason)
        else:
            assert h["outcome"] == "upgraded" and h["check"] == "passed", h
            assert h["after"] == AFTER
        assert h["before"] == BEFORE, h  # as each stop found it before its upgrade
    s = r["summary"]
    assert (s["stops"], s["stops_done"], s["hosts"], s["upgraded"], s["to_repair"]) == (3, 3, 12, 8, 4)
    # the jobs on the domains were asked to checkpoint, and what the drains cost them is counted
    jobs = {j.id for j in fleet.jobs([f"h{c}{i}" for c in "abc" for i in range(1, 5)])}
    assert set(r["jobs"]["asked_to_checkpoint"]) == jobs and len(jobs) == 2
    assert set(r["jobs"]["gpu_hours_lost"]) == jobs
    # every stop's phases, in order, each from the audit
    for st in r["stops"]:
        assert list(st["phases_s"]) == ["waiting for checkpoints", "drain", "upgrade", "health check", "return"], st
        assert all(v >= 0 for v in st["phases_s"].values())
    assert 0 < s["lowest_serving_fraction"] < 1
    # the copy in the run's XCom: whole for a small run; beyond its cap, only the hosts sent to repair
    assert runreport.for_xcom(r) == r
    small = runreport.for_xcom(r, max_hosts=4)
    assert set(small["hosts"]) == {f"hb{i}" for i in range(1, 5)} and "railyard report t/r1" in small["hosts_left_out"]
    text = runreport.describe(r)
    assert "SUCCESS" in text and "8 upgraded" in text and "4 to repair" in text
    # the same ledger, when no one could read the run's task states: not a success, unknown
    blind = runreport.build(ledger, train="t", run_id="r1", triggered_by="alice", state="unknown")
    assert blind["run"]["outcome"] == "unknown"
    assert all(f"hb{i} to repair: health check failed" in text for i in range(1, 5)), text


def test_a_run_cut_short_says_what_was_done_and_what_is_still_out(tmp_path):
    cfg, clock, fleet, ledger, _stop = world(tmp_path, check_fail_rate=0.0, upgrade_fail_rate=0.0,
                                             host_failure_per_hour=0.0)
    a = stop_of(cfg, clock, fleet, ledger, "pod-a")
    assert a.take().granted
    full_stop_after_take(a, clock)
    b = stop_of(cfg, clock, fleet, ledger, "pod-b")
    assert b.take().granted
    wait_checkpoints(b, clock)
    b.drain()  # then the run dies
    r = runreport.build(ledger, train="t", run_id="r1")
    assert r["run"]["outcome"] == "cut short"
    assert {h["outcome"] for n, h in r["hosts"].items() if n.startswith("ha")} == {"upgraded"}
    assert {h["outcome"] for n, h in r["hosts"].items() if n.startswith("hb")} == {"still out"}
    assert not any(n.startswith("hc") for n in r["hosts"])  # never reached: not touched, not named

    # the run is marked failed: the reconciler finishes its stop and writes the report its last task never did
    class Failed:
        def dag_known(self, dag_id: str) -> bool:
            return True

        def run_state(self, dag_id: str, run_id: str) -> str | None:
            return "failed"

    out = reconcile(cfg, fleet, ledger, Failed(), sleep=clock.advance, clock=clock, say=lambda _m: None)
    assert [o["action"] for o in out] == ["closed", "reported"], out
    stored = ledger.report("t/r1")
    assert stored is not None and stored["run"]["outcome"] == "failed"
    # drained, never upgraded: checked at the versions they had and returned
    hb = [h for n, h in stored["hosts"].items() if n.startswith("hb")]
    assert {h["outcome"] for h in hb} == {"unchanged"} and all(h["after"] == BEFORE and h["check"] == "passed"
                                                              for h in hb), hb
    assert ledger.report("r1") == stored  # the run id alone finds it when one run has it
    # a second reconcile writes nothing more
    assert reconcile(cfg, fleet, ledger, Failed(), sleep=clock.advance, clock=clock, say=lambda _m: None) == []


def test_the_cli_lists_runs_and_prints_a_report(tmp_path):
    url = f"sqlite:///{tmp_path}/ledger.db"
    cfg, clock, fleet, ledger, _stop = world(tmp_path, check_fail_rate=0.0, upgrade_fail_rate=0.0,
                                             host_failure_per_hour=0.0)
    s = stop_of(cfg, clock, fleet, ledger, "pod-a", run="manual__2026-12-01")
    assert s.take().granted
    full_stop_after_take(s, clock)
    ledger.save_report(runreport.build(ledger, train="t", run_id="manual__2026-12-01", triggered_by="bob"))
    conf = tmp_path / "railyard.yaml"
    conf.write_text(yaml.safe_dump({**CONFIG, "ledger": {"url": url}}))

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "railyard.cli", *args, "--config", str(conf)],
                              capture_output=True, text=True, timeout=60)

    runs = cli("runs")
    assert runs.returncode == 0 and "t/manual__2026-12-01" in runs.stdout and "success" in runs.stdout, runs
    rep = cli("report", "t/manual__2026-12-01", "--json")
    assert rep.returncode == 0, rep.stderr
    body = json.loads(rep.stdout)
    assert set(body["hosts"]) == {"ha1", "ha2", "ha3", "ha4"} and body["run"]["triggered_by"] == "bob"
    text = cli("report", "manual__2026-12-01")
    assert text.returncode == 0 and "4 upgraded" in text.stdout
    missing = cli("report", "t/no-such-run")
    assert missing.returncode == 2 and "'t/no-such-run'" in missing.stderr and "railyard runs" in missing.stderr
    bad = cli("runs", "--limit", "0")
    assert bad.returncode == 2 and "--limit" in bad.stderr and "0" in bad.stderr


def test_a_report_written_while_a_teardown_was_finishing_is_written_again_once_it_is_done(tmp_path):
    """The run's last task and a stop's teardown run side by side when a run is marked failed: a report
    that still shows hosts out is rebuilt once no operation of the run is active, keeping Airflow's facts."""
    cfg, clock, fleet, ledger, _stop = world(tmp_path, check_fail_rate=0.0, upgrade_fail_rate=0.0,
                                             host_failure_per_hour=0.0)
    s = stop_of(cfg, clock, fleet, ledger, "pod-a")
    assert s.take().granted
    wait_checkpoints(s, clock)
    s.drain()
    s.upgrade()
    ledger.save_report(runreport.build(ledger, train="t", run_id="r1", triggered_by="carol", state="failed",
                                       failed_tasks=["pod-a.upgrade"]))
    assert not runreport.refresh_if_stale(ledger, "t/r1")  # its stop is still active: not yet
    s.return_hosts()  # the teardown finishes: checked, returned
    assert runreport.refresh_if_stale(ledger, "t/r1")
    r = ledger.report("t/r1")
    assert r["run"]["triggered_by"] == "carol" and r["run"]["failed_tasks"] == ["pod-a.upgrade"]
    assert r["run"]["outcome"] == "failed" and r["summary"]["still_out"] == 0
    assert {h["outcome"] for h in r["hosts"].values()} == {"upgraded"}
    assert not runreport.refresh_if_stale(ledger, "t/r1")  # once fresh, left alone


def test_the_jobs_asked_come_from_the_stops_detail_and_from_the_audit_text_of_an_older_ledger(tmp_path):
    """A stop keeps the ids of the jobs it asked to checkpoint in its detail; a stop an older Railyard recorded
    has them only in its audit row's text, and the report reads them from there."""
    cfg, clock, fleet, ledger, _stop = world(tmp_path, check_fail_rate=0.0, upgrade_fail_rate=0.0,
                                             host_failure_per_hour=0.0)
    a = stop_of(cfg, clock, fleet, ledger, "pod-a")
    assert a.take().granted
    jobs = {j.id for j in fleet.jobs([f"ha{i}" for i in range(1, 5)]) if j.state == "running"}
    full_stop_after_take(a, clock)
    asked = ledger.detail(a.op_id)["checkpoints_asked"]
    assert set(asked) == jobs and jobs  # each with when it was asked
    assert runreport.build(ledger, train="t", run_id="r1")["jobs"]["asked_to_checkpoint"] == sorted(jobs)

    def forget(detail):  # as a stop recorded before the detail kept the ids
        return detail.pop("checkpoints_asked", None) is not None

    ledger._change_detail(a.op_id, forget)
    assert "checkpoints_asked" not in ledger.detail(a.op_id)
    assert runreport.build(ledger, train="t", run_id="r1")["jobs"]["asked_to_checkpoint"] == sorted(jobs)
