"""The `railyard_reconcile` DAG's own scheduled runs finish operations whose run still exists but has ended,
on a real `airflow standalone`: a run that ends `failed` with its lease held (its teardown marked failed
before it could run), and one marked `success` by hand mid-stop (its teardown marked success unrun). Airflow 3.3's
Task SDK answers a run's state as an enum whose `str()` is "DagRunState.FAILED": read by name, such runs
looked alive for ever, and every train waited behind their leases.
"""

from __future__ import annotations

from urllib.parse import quote

import pytest
import requests

from railyard.devstack.stack import Stack, free_port
from railyard.domain.models import BROKEN_STATES, HostState
from railyard.ledger import Ledger
from tests.support.configs import small_config, write_config
from tests.support.waiting import until

pytestmark = pytest.mark.e2e
ALL = ["driver-570", "firmware-96", "kernel-6-1-28"]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("reconcile-scheduled")
    data = small_config(domains=3, speed=60, upgrade_fail_rate=0.0, check_fail_rate=0.0, trains=[
        {"id": "ends-failed", "releases": ALL, "domains": ["pod-a"]},
        {"id": "ends-success", "releases": ALL, "domains": ["pod-b"]},
    ])
    data["max_domains_down"] = 2
    data["buffers"]["maintenance"]["hosts"] = 8
    data["timeouts"]["poll_s"] = 0.25
    data["schedules"] = {"reconcile": "* * * * *"}
    cfg = write_config(tmp / "railyard.yaml", data)
    s = Stack(home=tmp / "stack", config_file=cfg, airflow_port=free_port(), sim_port=free_port())
    s.start_sim()
    try:
        s.start_airflow()
        s.ensure_pool()
        for d in ("railyard_train_ends-failed", "railyard_train_ends-success", "railyard_reconcile"):
            s.wait_dag(d)
        s.rest("PATCH", "/dags/railyard_reconcile", json={"is_paused": True})  # until the runs have ended
        yield s
    finally:
        s.stop()


def test_ended_runs_with_leases_are_finished_by_the_scheduled_reconciler(stack):
    fleet = stack.fleet()
    led = Ledger(f"sqlite:///{stack.home}/ledger.db")
    runs = {}
    for train, domain in (("ends-failed", "pod-a"), ("ends-success", "pod-b")):
        dag = f"railyard_train_{train}"
        hosts = list(stack.config.domain(domain).hosts)
        runs[train] = (dag, stack.trigger(dag), domain, hosts)
    for _dag, _run, domain, hosts in runs.values():
        until(f"{domain} upgrading", lambda h=hosts: any(x.state == HostState.UPGRADING for x in fleet.hosts(h)),
              timeout=300)

    # Each teardown is marked by hand before it can run, then its run: (1) failed and failed, as an operator
    # stopping a stop would; (2) success and success, as one who marks a stuck stop done. Either way the
    # lease stays held by a run that has ended, and only the reconciler can finish the stop.
    for train, state in (("ends-failed", "failed"), ("ends-success", "success")):
        d, r, dom, _hosts = runs[train]
        teardown = f"/dags/{d}/dagRuns/{quote(r)}/taskInstances/{dom}.return_to_service"
        until(f"the teardown marked {state}", lambda t=teardown, st=state: stack.rest(
            "PATCH", t, ok=(200, 400, 404, 409), json={"new_state": st}).get("task_instances"))
        stack.rest("PATCH", f"/dags/{d}/dagRuns/{quote(r)}", json={"state": state})
    dag, run, domain, hosts = runs["ends-failed"]
    dag2, run2, domain2, hosts2 = runs["ends-success"]
    ended = ("success", "failed")
    until("both runs ended", lambda: stack.run_state(dag, run) in ended and stack.run_state(dag2, run2) in ended,
          timeout=300, every=1)
    # Airflow 3.3 judges a run by its leaves once its teardowns are done, and may call the first one a
    # success: the operator marks it failed again, as it meant
    if stack.run_state(dag, run) != "failed":
        stack.rest("PATCH", f"/dags/{dag}/dagRuns/{quote(run)}", json={"state": "failed"})
    assert stack.run_state(dag, run) == "failed" and stack.run_state(dag2, run2) == "success"
    assert stack.task_states(dag, run)[f"{domain}.return_to_service"] == "failed"
    assert stack.task_states(dag2, run2)[f"{domain2}.return_to_service"] == "success"
    ops = {f"ends-failed/{run}/pod-a": hosts, f"ends-success/{run2}/pod-b": hosts2}
    for op, held in ops.items():
        assert sorted(led.holdings(op)) == sorted(held), (op, led.holdings(op))  # left held by its ended run
    assert not [h for h in fleet.hosts(hosts + hosts2) if h.state == HostState.SERVING]

    # the reconciler is never triggered by hand here: its schedule (every minute) runs it
    stack.rest("PATCH", "/dags/railyard_reconcile", json={"is_paused": False})

    def finished() -> bool:
        return all(not led.holdings(op) and (led.operation(op) or {}).get("state") == "done" for op in ops)

    until("the scheduled reconciler finished both operations", finished, timeout=420, every=2)
    reconciles = stack.rest("GET", "/dags/railyard_reconcile/dagRuns", params={"limit": 100})["dag_runs"]
    assert reconciles and all(r["run_type"] == "scheduled" for r in reconciles), reconciles
    for op in ops:
        rec = [a for a in led.audit_rows(op) if a["action"] == "reconcile"]
        assert rec and rec[0]["actor"] == "reconciler", led.audit_rows(op)
        state = "failed" if op.startswith("ends-failed/") else "success"
        assert f"is {state}" in rec[0]["reason"], rec
        assert [a["action"] for a in led.audit_rows(op)].count("release") == 1
    for h in fleet.hosts(hosts + hosts2):
        assert h.state == HostState.SERVING or h.state in BROKEN_STATES, h
    assert all(op.startswith("repair/") for op in led.holdings().values()), led.holdings()
    assert fleet.audit()["unverified_returns"] == []


def test_every_api_call_that_changes_a_railyard_run_is_audited_by_the_real_api_server(stack):
    """Through the api-server's own routes: a task group's state, a bulk change of task instances, a clear of
    runs, a backfill, a pause, a `~` wildcard call and a run's deletion each leave a row with the user."""
    dag = "railyard_train_ends-failed"
    run = stack.trigger(dag, {"dry_run": True})  # touches nothing
    stack.wait_run(dag, run, timeout=300)
    led = Ledger(f"sqlite:///{stack.home}/ledger.db")
    before = led.audit_count()
    r = quote(run)
    calls = [
        ("PATCH", f"/dags/{dag}/dagRuns/{r}/taskGroupInstances/pod-a", {"new_state": "success"}, "api_set_group_state"),
        ("PATCH", f"/dags/{dag}/dagRuns/{r}/taskInstances",
         {"actions": [{"action": "update", "entities": [{"task_id": "pod-a.upgrade", "new_state": "success"}]}]},
         "api_set_task_state"),
        ("POST", f"/dags/{dag}/clearDagRuns", {"dry_run": False, "dag_run_ids": [run]}, "api_clear"),
        ("POST", "/backfills", {"dag_id": dag, "from_date": "2026-01-01T00:00:00Z", "to_date": "2026-01-02T00:00:00Z",
                                "max_active_runs": 1, "reprocess_behavior": "none", "run_backwards": False,
                                "dag_run_conf": {}}, "api_backfill"),
        ("PATCH", f"/dags/{dag}", {"is_paused": True}, "api_patch_dag"),
        ("PATCH", "/dags/~/dagRuns/~/taskInstances",
         {"actions": [{"action": "update", "entities": [{"task_id": "pod-a.upgrade", "new_state": "failed"}]}]},
         "api_set_task_state"),
        ("DELETE", f"/dags/{dag}/dagRuns/{r}", None, "api_delete_run"),
    ]
    statuses = {}
    for method, path, body, _action in calls:
        url = f"{stack.api}/api/v2{path}"
        resp = requests.request(method, url, json=body, timeout=30,
                                headers={"Authorization": f"Bearer {stack.token()}"})
        statuses[(method, path)] = resp.status_code

    def api_rows() -> list[dict]:
        return [a for a in led.audit_rows(limit=100000) if a["action"].startswith("api_")]

    def missing() -> list[tuple[str, str, str]]:
        got = api_rows()
        return [(m, p, a) for m, p, _b, a in calls if not any(
            r["action"] == a and r["actor"] == "admin" and f"HTTP {statuses[(m, p)]}" in r["reason"] for r in got)]

    # the middleware writes its row once the response is sent: the last call's row may land a moment later
    until("every call's audit row", lambda: not missing(), timeout=30)
    assert led.audit_count() > before
    rows = api_rows()
    assert statuses[("DELETE", f"/dags/{dag}/dagRuns/{r}")] in (200, 204), statuses
    assert any(a["action"] == "api_delete_run" and f"run={run}" in a["reason"] for a in rows)
    assert any(a["action"] == "api_backfill" and f"dag={dag}" in a["reason"] for a in rows)
    stack.rest("PATCH", f"/dags/{dag}", json={"is_paused": False})
