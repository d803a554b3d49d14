"""Releases on the Airflow side under `dag.test()`: the plan the first task shows is what the train
then does; a dry run touches nothing; the release form promotes/halts with the user on record."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import yaml

from railyard import cli
from railyard.domain.models import HostState
from railyard.ledger import Ledger
from tests.dags.conftest import load_dag, states
from tests.support.configs import small_config

ROOT = Path(__file__).resolve().parents[2]


def demo_config() -> dict:
    """The demo config itself, with a faster fleet clock and no random failures (so the plan can match)."""
    data = yaml.safe_load((ROOT / "include/config/railyard.yaml").read_text())
    data["simulator"].update(speed=3000, upgrade_fail_rate=0.0, check_fail_rate=0.0)
    data["timeouts"].update(poll_s=0.1)
    return data


def test_railyard_plan_on_the_demo_config_matches_what_the_train_does(train_env, monkeypatch):
    stack, fleet, tmp = train_env(demo_config())
    monkeypatch.setenv("RAILYARD_FLEET_TOKEN", stack.fleet_token)  # how the CLI authenticates to the fleet
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["plan", "demo", "--json", "--fleet-url", stack.fleet_url]) == 0
    plan = json.loads(out.getvalue())
    assert plan["violations"] == [] and plan["hosts_to_upgrade"] == 64 and len(plan["domains"]) == 8
    assert all(h.state == HostState.SERVING for h in fleet.hosts())  # the plan touched nothing
    assert fleet.audit()["stops"] == []

    dr = load_dag("railyard_train_demo").test()
    assert dr.state == "success", states(dr)
    audit = fleet.audit()
    done_order = [s["domain"] for s in sorted(audit["stops"], key=lambda s: s["started_at"])]
    assert done_order == plan["domains"]
    assert {i["host"] for i in audit["installs"]} == {h for s in plan["stops"] for g in s["releases"].values()
                                                     for h in g}
    assert round(audit["min_serving_fraction"], 4) == plan["lowest_serving_fraction"]
    floor = plan["serving_floor_hosts"]["gpu"]
    assert audit["min_serving_fraction"] * 64 >= floor
    # the first task showed the same plan
    ti = next(t for t in dr.get_task_instances() if t.task_id == "cycle_report")
    shown = ti.xcom_pull(task_ids="cycle_report")["plan"]
    assert shown["domains"] == plan["domains"] and shown["hosts_to_upgrade"] == 64


def test_dry_run_shows_the_plan_and_touches_nothing(train_env):
    stack, fleet, tmp = train_env(small_config())
    dr = load_dag("railyard_train_demo").test(run_conf={"dry_run": True})
    assert dr.state == "success", states(dr)
    st = states(dr)
    assert st.pop("cycle_report") == "success" and st.pop("end_run") == "success"
    assert all(s == "skipped" for s in st.values()), st
    assert fleet.audit()["stops"] == [] and all(h.state == HostState.SERVING for h in fleet.hosts())
    led = Ledger(f"sqlite:///{tmp}/ledger.db")
    assert led.holdings() == {} and led.reports() == []  # nor any report written


def test_a_plan_that_breaks_a_rule_fails_the_first_task_and_touches_nothing(train_env):
    data = small_config()
    data["components"].append({"name": "cuda-compat", "duration_s": 30})
    data["releases"].append({"id": "cuda-12-8", "component": "cuda-compat", "version": "12.8"})
    data["compatibility"] = {"rules": ["cuda-compat >= 12.8 requires gpu-driver >= 570"]}
    data["simulator"]["initial_versions"]["cuda-compat"] = "12.4"
    data["trains"] = [{"id": "demo", "releases": ["cuda-12-8", "kernel-6-1-28"]}]
    stack, fleet, tmp = train_env(data)
    dr = load_dag("railyard_train_demo").test()
    st = states(dr)
    assert dr.state == "failed" and st["cycle_report"] == "failed", st
    assert fleet.audit()["stops"] == [] and all(h.state == HostState.SERVING for h in fleet.hosts())


def test_fabric_manager_equal_to_driver_upgraded_together_under_dag_test(train_env):
    data = small_config(upgrade_fail_rate=0.0, check_fail_rate=0.0)
    data["components"].append({"name": "fabric-manager", "duration_s": 60})
    data["releases"].append({"id": "fm-570", "component": "fabric-manager", "version": "570.86.15"})
    data["compatibility"] = {"rules": ["fabric-manager == gpu-driver"], "order": ["gpu-driver", "fabric-manager"]}
    data["simulator"]["initial_versions"]["fabric-manager"] = "550.127.08"
    data["trains"] = [{"id": "demo", "releases": ["fm-570", "driver-570"]}]
    stack, fleet, tmp = train_env(data)
    dr = load_dag("railyard_train_demo").test()
    assert dr.state == "success", states(dr)
    for h in fleet.hosts():
        assert h.state == HostState.SERVING and h.versions["gpu-driver"] == h.versions["fabric-manager"] == "570.86.15"
    assert len(fleet.audit()["stops"]) == 3  # one visit per domain for both


def test_release_form_halts_and_resumes_with_the_user_on_record(train_env):
    data = small_config()
    data["releases"][0]["rollout"] = {"canary_domains": ["pod-a"]}
    stack, fleet, tmp = train_env(data)
    dag = load_dag("railyard_releases")
    bad = dag.test(run_conf={"release": "driver-570", "action": "halt", "reason": "short"})
    assert bad.state == "failed"
    ok = dag.test(run_conf={"release": "driver-570", "action": "halt", "reason": "XID 79 on two canary hosts"})
    assert ok.state == "success"
    led = Ledger(f"sqlite:///{tmp}/ledger.db")
    assert led.release_state("driver-570")["halted"] == 1
    rows = [r for r in led.audit_rows("release/driver-570") if r["action"] == "release_halt"]
    assert len(rows) == 1 and "XID 79" in rows[0]["reason"]
    # a train run now leaves the driver alone and says why
    dr = load_dag("railyard_train_demo").test()
    assert dr.state == "success", states(dr)
    assert all(h.versions["gpu-driver"] == "550.127.08" for h in fleet.hosts())
    assert all(h.versions["kernel"] == "6.1.0-28" for h in fleet.hosts())
