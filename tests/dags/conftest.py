"""A migrated Airflow DB and a running simulator for `dag.test()` runs of train DAGs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from railyard.devstack.stack import Stack, free_port
from tests.support.configs import write_config

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def airflow_db():
    subprocess.run([f"{sys.prefix}/bin/airflow", "db", "migrate"], check=True, capture_output=True)


@pytest.fixture
def train_env(tmp_path, monkeypatch, airflow_db):
    """Call with a config dict: writes it, starts the simulator, points Airflow and Railyard at them."""
    stacks: list[Stack] = []

    def start(data: dict):
        cfg = write_config(tmp_path / "railyard.yaml", data)
        stack = Stack(home=tmp_path / "stack", config_file=cfg, sim_port=free_port())
        fleet = stack.start_sim()
        stacks.append(stack)
        monkeypatch.setenv("RAILYARD_CONFIG", str(cfg))
        monkeypatch.setenv("RAILYARD_LEDGER_URL", f"sqlite:///{tmp_path}/ledger.db")
        monkeypatch.setenv("AIRFLOW_CONN_RAILYARD_FLEET", stack.env()["AIRFLOW_CONN_RAILYARD_FLEET"])
        return stack, fleet, tmp_path

    yield start
    for s in stacks:
        s.stop()


def load_dag(dag_id: str):
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(ROOT / "dags"))
    assert bag.import_errors == {}
    return bag.dags[dag_id]


def states(dr) -> dict[str, str]:
    return {ti.task_id: ti.state for ti in dr.get_task_instances()}
