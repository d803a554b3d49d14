"""Capacity safety under `dag.test()`: trains stop by themselves, waits end at their deadlines,
dodged domains are visited last. The simulator is the fleet; faults are injected through its API."""

from __future__ import annotations

import threading
import time

import pytest

from railyard.domain.models import MAINTENANCE_STATES, HostState
from railyard.ledger import Ledger
from tests.dags.conftest import load_dag, states
from tests.support.configs import small_config
from tests.support.webhook import webhook_server


@pytest.fixture
def webhook():
    with webhook_server() as (url, got):
        yield url, got


def no_host_left_out(fleet) -> None:
    for h in fleet.hosts():
        assert h.state not in MAINTENANCE_STATES or (h.operation or "").startswith("repair/"), h
        if h.state in (HostState.FAILED, HostState.REPAIR):
            assert h.reason, h


def test_failure_buffer_running_out_mid_train_stops_it(train_env, webhook, monkeypatch):
    url, events = webhook
    monkeypatch.setenv("RAILYARD_WEBHOOK_URL", url)
    data = small_config(upgrade_fail_rate=0.0, check_fail_rate=0.0, repair_s=10_000_000)
    data["buffers"]["failure"] = {"hosts": 1}
    _stack, fleet, tmp = train_env(data)

    def break_two_hosts_during_the_first_stop():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if "pod-a" in fleet.capacity().domains_out:
                fleet.fail("gpu-c01")
                fleet.fail("gpu-c02")
                return
            time.sleep(0.05)

    t = threading.Thread(target=break_two_hosts_during_the_first_stop)
    t.start()
    dr = load_dag("railyard_train_demo").test()
    t.join()
    st = states(dr)
    assert dr.state == "failed"
    assert st["pod-a.return_to_service"] == "success"
    assert st["pod-b.wait_capacity"] == "failed"
    assert all(st[f"pod-c.{x}"] in ("upstream_failed", None) for x in ("wait_capacity", "drain")), st
    assert [s["domain"] for s in fleet.audit()["stops"]] == ["pod-a"]  # no further domain taken
    no_host_left_out(fleet)
    led = Ledger(f"sqlite:///{tmp}/ledger.db")
    assert led.holdings() == {}
    (esc,) = [r for r in led.audit_rows() if r["action"] == "escalation"]
    assert ("train demo stopped at pod-b.wait_capacity: train stopped: failure buffer exhausted: 2 hosts"
            in esc["reason"])
    assert [e["kind"] for e in events] == ["train_stopped"]
    assert "failure buffer exhausted" in events[0]["summary"] and events[0]["train"] == "demo"


def test_a_checkpoint_that_never_comes_ends_at_its_deadline(train_env):
    data = small_config(upgrade_fail_rate=0.0, check_fail_rate=0.0)
    data["timeouts"]["checkpoint_wait_s"] = 3
    stack, fleet, tmp = train_env(data)
    (job,) = [j for j in fleet.jobs(stack.config.domain("pod-a").hosts)][:1]
    fleet.set_job(job.id, stuck=True)
    before = {h.name: h.versions for h in fleet.hosts()}
    t0 = time.monotonic()
    dr = load_dag("railyard_train_demo").test()
    st = states(dr)
    assert dr.state == "failed"
    assert st["pod-a.wait_checkpoints"] == "failed"
    assert st["pod-a.drain"] == "upstream_failed" and st["pod-a.return_to_service"] == "success"
    assert time.monotonic() - t0 < 120  # ended at its own deadline, not Airflow's seven days
    assert fleet.audit()["stops"] == []  # nothing was drained
    assert {h.name: h.versions for h in fleet.hosts()} == before
    assert all(h.state == HostState.SERVING for h in fleet.hosts())
    led = Ledger(f"sqlite:///{tmp}/ledger.db")
    assert led.holdings() == {}
    (esc,) = [r for r in led.audit_rows() if r["action"] == "escalation"]
    assert "jobs on pod-a did not checkpoint within 3s" in esc["reason"]


def test_a_dodging_job_has_its_domain_visited_last(train_env):
    data = small_config(upgrade_fail_rate=0.0, check_fail_rate=0.0)
    data["trains"][0].update(max_dodges=1, max_dodge_s=36000, cycle_days=7)
    stack, fleet, tmp = train_env(data)
    job = fleet.jobs(stack.config.domain("pod-a").hosts)[0]
    # the job's hosts span pod-a (and pod-b): it asks that they not be taken for 200 fleet minutes
    # (20 s at the 600x clock: longer than the first stop takes to start on a loaded machine)
    on_a = set(job.hosts) & set(stack.config.domain("pod-a").hosts)
    assert on_a
    fleet.set_job(job.id, dodge_until=fleet.now() + 12000)
    dr = load_dag("railyard_train_demo").test()
    st = states(dr)
    assert dr.state == "success", st
    assert st["pod-a.wait_capacity"] == "skipped" and st["revisit_1.return_to_service"] == "success"
    order = [s["domain"] for s in sorted(fleet.audit()["stops"], key=lambda s: s["started_at"])]
    assert order[-1] == "pod-a" and sorted(order) == ["pod-a", "pod-b", "pod-c"]
    targets = stack.config.train_targets(stack.config.train("demo"))
    assert all(h.versions == targets and h.state == HostState.SERVING for h in fleet.hosts())
    led = Ledger(f"sqlite:///{tmp}/ledger.db")
    # one dodge granted (pod-a); the job also spans pod-b, which max_dodges=1 cannot postpone too
    actions = [r["action"] for r in led.audit_rows() if r["action"].startswith("dodge")]
    assert actions[0] == "dodge" and actions.count("dodge") == 1 and set(actions) <= {"dodge", "dodge_refused"}
    assert set(led.last_visits("demo")) == {"pod-a", "pod-b", "pod-c"}
    # the run's report: pod-a dodged and revisited, every host upgraded
    report = led.report(f"demo/{dr.run_id}")
    assert report is not None and report["summary"]["revisits"] == 1 and report["summary"]["dodges"] == 1
    [a] = [s for s in report["stops"] if s["domain"] == "pod-a"]
    assert a["dodged"] and a["revisit"] and a["state"] == "done", a
    assert {h["outcome"] for h in report["hosts"].values()} == {"upgraded"} and len(report["hosts"]) == 12
