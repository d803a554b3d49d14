"""Nothing stuck forever, on a real `airflow standalone` with the simulator: a run marked failed or
deleted in the middle of a stop, and a capacity wait cleared as capacity frees up. Each ends, once
the `railyard_reconcile` DAG has run, with every host serving or in repair and no lease but repairs'.
"""

from __future__ import annotations

import time
from urllib.parse import quote

import pytest

from railyard.devstack.stack import Stack, free_port
from railyard.domain.models import BROKEN_STATES, HostState
from railyard.ledger import Ledger
from railyard.operations.reconcile import AirflowApi, ReconcileError
from railyard.operations.stop import budget_for
from tests.support.configs import small_config, write_config
from tests.support.waiting import until

pytestmark = pytest.mark.e2e
ALL = ["driver-570", "firmware-96", "kernel-6-1-28"]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("recovery")
    data = small_config(domains=4, speed=60, upgrade_fail_rate=0.0, check_fail_rate=0.0, trains=[
        {"id": "failed", "releases": ALL, "domains": ["pod-a"]},
        {"id": "deleted", "releases": ALL, "domains": ["pod-b"]},
        {"id": "cleared", "releases": ALL, "domains": ["pod-c"]},
    ])
    data["timeouts"]["poll_s"] = 0.25
    cfg = write_config(tmp / "railyard.yaml", data)
    s = Stack(home=tmp / "stack", config_file=cfg, airflow_port=free_port(), sim_port=free_port())
    s.start_sim()
    try:
        s.start_airflow()
        s.ensure_pool()
        for d in ("railyard_train_failed", "railyard_train_deleted", "railyard_train_cleared", "railyard_reconcile"):
            s.wait_dag(d)
        yield s
    finally:
        s.stop()


def ledger(stack: Stack) -> Ledger:
    return Ledger(f"sqlite:///{stack.home}/ledger.db")


def run_reconciler(stack: Stack) -> None:
    run = stack.trigger("railyard_reconcile")
    assert stack.wait_run("railyard_reconcile", run, timeout=600) == "success"


def settled(stack: Stack, domain: str) -> None:
    """Every host serving or in repair, every lease a repair's, and the domain's serving hosts verified."""
    fleet = stack.fleet()
    for h in fleet.hosts():
        assert h.state == HostState.SERVING or h.state in BROKEN_STATES, h
    led = ledger(stack)
    assert all(op.startswith("repair/") for op in led.holdings().values()), led.holdings()
    assert fleet.audit()["unverified_returns"] == []
    assert not [o for o in led.active_operations() if not o["id"].startswith("repair/")]


def test_a_run_marked_failed_mid_upgrade_ends_with_its_hosts_back(stack):
    """Airflow 3.3 keeps a run marked failed running until its pending teardowns have run: the stop's
    return_to_service finishes the hosts (the installs in flight are waited for and checked); the
    reconciler then finds nothing left, or finishes what the teardown could not."""
    fleet = stack.fleet()
    dag = "railyard_train_failed"
    hosts = list(stack.config.domain("pod-a").hosts)
    run = stack.trigger(dag)
    until("pod-a upgrading", lambda: any(h.state == HostState.UPGRADING for h in fleet.hosts(hosts)))
    stack.rest("PATCH", f"/dags/{dag}/dagRuns/{quote(run)}", json={"state": "failed"})
    # the run ends once its teardown has run (Airflow 3.3 then judges it by its leaves: it may say success)
    until("the run ended", lambda: stack.run_state(dag, run) in ("success", "failed"), timeout=600, every=1)
    states = stack.task_states(dag, run)
    assert states["pod-a.upgrade"] == "failed", states  # killed mid-upgrade
    run_reconciler(stack)
    settled(stack, "pod-a")
    targets = stack.config.train_targets(stack.config.train("failed"))
    for h in fleet.hosts(hosts):
        assert h.state == HostState.SERVING and h.versions == targets, h  # the installs in flight finished, checked
    op = f"failed/{run}/pod-a"
    led = ledger(stack)
    assert [a["action"] for a in led.audit_rows(op)].count("release") == 1
    assert led.operation(op)["state"] == "done"
    # the run cut short has its report: pod-a's hosts finished by the teardown, nothing else touched
    report = led.report(f"failed/{run}")
    assert report is not None and report["run"]["outcome"] == "failed", report and report["run"]
    assert "pod-a.upgrade" in report["run"]["failed_tasks"], report["run"]
    assert set(report["hosts"]) == set(hosts), report["hosts"]
    assert all(h["outcome"] == "upgraded" and h["after"] == targets for h in report["hosts"].values()), report


def test_a_run_deleted_mid_stop_is_finished_by_the_reconciler(stack):
    fleet = stack.fleet()
    dag = "railyard_train_deleted"
    hosts = list(stack.config.domain("pod-b").hosts)
    run = stack.trigger(dag)
    until("pod-b upgrading", lambda: any(h.state == HostState.UPGRADING for h in fleet.hosts(hosts)))
    # Airflow deletes no running run: an impatient operator marks it failed, then its teardown failed too,
    # then deletes it, as a restored or wiped metadata DB would. The teardown may still have finished the
    # stop first (it races the operator); either way the run is gone and the reconciler must leave no lease.
    stack.rest("PATCH", f"/dags/{dag}/dagRuns/{quote(run)}", json={"state": "failed"})
    teardown = f"/dags/{dag}/dagRuns/{quote(run)}/taskInstances/pod-b.return_to_service"
    until("the teardown marked failed", lambda: stack.rest("PATCH", teardown, ok=(200, 400, 404, 409),
                                                            json={"new_state": "failed"}).get("task_instances"))
    until("the run ended", lambda: stack.run_state(dag, run) in ("success", "failed"), timeout=300, every=1)
    stack.rest("DELETE", f"/dags/{dag}/dagRuns/{quote(run)}", ok=(200, 204))
    op = f"deleted/{run}/pod-b"
    led = ledger(stack)
    left_behind = bool(led.holdings(op))
    # what `railyard reconcile` asks, over the REST API: the run is gone, the DAG is known
    api = AirflowApi(stack.api, username="admin", password=stack.password)
    assert api.dag_known(dag) and not api.dag_known("railyard_train_nope")
    assert api.run_state(dag, run) is None and api.run_state("railyard_train_failed", "nope") is None
    wrong = "wrong-pass-5d1c9e"
    with pytest.raises(ReconcileError, match="login as 'admin' refused") as err:
        AirflowApi(stack.api, username="admin", password=wrong).dag_known(dag)
    assert wrong not in str(err.value)
    run_reconciler(stack)
    settled(stack, "pod-b")
    assert all(h.state == HostState.SERVING for h in fleet.hosts(hosts))
    if left_behind:  # the reconciler finished it, and says why
        rec = next(a for a in led.audit_rows(op) if a["action"] == "reconcile")
        assert f"its run {dag}/{run} is deleted" in rec["reason"]
    assert [a["action"] for a in led.audit_rows(op)].count("release") == 1
    assert led.operation(op)["state"] == "done"
    # the deleted run has a report (its last task's, or the reconciler's), and no host in it is still out
    report = led.report(f"deleted/{run}")
    assert report is not None and report["summary"]["still_out"] == 0, report and report["summary"]
    assert set(report["hosts"]) == set(hosts)
    assert {h["outcome"] for h in report["hosts"].values()} <= {"upgraded", "unchanged"}, report["hosts"]


def test_a_capacity_wait_cleared_as_capacity_frees_leaves_no_lease(stack):
    """The trigger only probes: capacity freed at the moment the waiting task is cleared cannot leave a
    lease behind for a task that is no longer deferred. The cleared task runs again, takes the domain
    itself and the run finishes."""
    cfg = stack.config
    dag = "railyard_train_cleared"
    led = ledger(stack)
    holder = "holder/by-hand/pod-d"  # an operation of no known run: held until released
    assert led.acquire_domain(holder, train="holder", domain="pod-d", hosts=list(cfg.domain("pod-d").hosts),
                              budget=budget_for(cfg)).granted
    run = stack.trigger(dag)
    task = "pod-c.wait_capacity"
    until("wait_capacity deferred", lambda: stack.task_states(dag, run).get(task) == "deferred", timeout=120)
    op = f"cleared/{run}/pod-c"
    assert led.holdings(op) == {}
    time.sleep(2)  # several polls of the trigger while capacity is held
    assert led.holdings(op) == {} and [w["op_id"] for w in led.waiting()] == [op]
    led.release(holder, reason="test: capacity frees up")
    stack.rest("POST", f"/dags/{dag}/clearTaskInstances",
               json={"dry_run": False, "task_ids": [task], "dag_run_id": run, "only_failed": False,
                     "reset_dag_runs": True, "include_downstream": False})
    assert stack.wait_run(dag, run, timeout=600) == "success"
    run_reconciler(stack)
    settled(stack, "pod-c")
    takes = [a for a in led.audit_rows(op) if a["action"] == "lease"]
    assert len(takes) == 1  # one lease, taken by the task
    assert all(h.state == HostState.SERVING for h in stack.fleet().hosts(list(cfg.domain("pod-c").hosts)))
