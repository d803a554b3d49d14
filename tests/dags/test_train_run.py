"""A whole train under `dag.test()` against the simulator server: the Airflow side, end to end."""

from __future__ import annotations

import subprocess
import sys

import pytest

from railyard.ledger import Ledger
from railyard.models import HostState
from railyard.stack import Stack, free_port
from tests.support.configs import small_config, write_config


@pytest.fixture(scope="module")
def airflow_db():
    subprocess.run([f"{sys.prefix}/bin/airflow", "db", "migrate"], check=True, capture_output=True)


@pytest.fixture
def fleet_stack(tmp_path, monkeypatch, airflow_db):
    cfg = write_config(tmp_path / "railyard.yaml", small_config(upgrade_fail_rate=0.0, check_fail_rate=0.0))
    stack = Stack(home=tmp_path / "stack", config_file=cfg, sim_port=free_port())
    fleet = stack.start_sim()
    monkeypatch.setenv("RAILYARD_CONFIG", str(cfg))
    monkeypatch.setenv("RAILYARD_LEDGER_URL", f"sqlite:///{tmp_path}/ledger.db")
    monkeypatch.setenv("AIRFLOW_CONN_RAILYARD_FLEET", stack.env()["AIRFLOW_CONN_RAILYARD_FLEET"])
    yield stack, fleet, tmp_path
    stack.stop()


def load_dag(dag_id: str):
    from airflow.dag_processing.dagbag import DagBag

    from tests.dags.test_dag_integrity import ROOT

    bag = DagBag(dag_folder=str(ROOT / "dags"))
    assert bag.import_errors == {}
    return bag.dags[dag_id]


def test_train_under_dag_test(fleet_stack):
    stack, fleet, tmp = fleet_stack
    dag = load_dag("railyard_train_demo")
    dr = dag.test()
    assert dr.state == "success", {ti.task_id: ti.state for ti in dr.get_task_instances()}
    hosts = fleet.hosts()
    targets = stack.config.train_targets(stack.config.train("demo"))
    assert all(h.state == HostState.SERVING and h.versions == targets for h in hosts)
    audit = fleet.audit()
    assert audit["max_domains_out"] == 1
    assert audit["unverified_returns"] == []
    assert len(audit["stops"]) == 3
    led = Ledger(f"sqlite:///{tmp}/ledger.db")
    assert led.holdings() == {}
    assert {r["action"] for r in led.audit_rows()} >= {"lease", "drain", "upgrade", "verified", "return", "release"}
    # a second run finds every host at target and skips every stop without draining anything
    dr2 = dag.test()
    assert dr2.state == "success"
    states = {ti.task_id: ti.state for ti in dr2.get_task_instances()}
    assert states.pop("cycle_report") == "success"
    assert all(s == "skipped" for s in states.values()), states
    assert len(fleet.audit()["stops"]) == 3
