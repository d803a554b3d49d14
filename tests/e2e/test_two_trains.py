"""Two trains over the same fleet, and another team's DAG doing outside work inside a Railyard lease, triggered
at the same moment through the REST API of a running `airflow standalone` (real scheduler, real triggerer,
real simulator server)."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pytest

from railyard.devstack.stack import Stack, free_port
from railyard.domain.models import HostState
from railyard.ledger import Ledger
from tests.support.configs import small_config, write_config

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
TEAM_HOSTS = ["gpu-c01", "gpu-c02"]
TEAM_DAG = f'''
from datetime import datetime

from airflow.sdk import DAG, task

from railyard_airflow.operators.outside import RailyardLeaseOperator, RailyardReturnOperator

with DAG(dag_id="network_team_optics", start_date=datetime(2026, 1, 1), schedule=None, catchup=False):
    lease = RailyardLeaseOperator(task_id="lease", hosts={TEAM_HOSTS!r}, kind="network",
                                  reason="replace the optics of c01 and c02", poll_s=2)

    @task
    def replace_optics() -> dict:
        from railyard_airflow.hooks.fleet import FleetHook

        seen = {{h.name: h.state.value for h in FleetHook().get_conn().hosts({TEAM_HOSTS!r})}}
        assert set(seen.values()) == {{"drained"}}, seen
        return seen

    back = RailyardReturnOperator(task_id="return", lease_task_id="lease")
    lease >> replace_optics() >> back.as_teardown(setups=lease)
'''


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("two-trains")
    data = small_config(
        domains=4,
        trains=[
            {"id": "drivers", "releases": ["driver-570"]},
            {"id": "kernels", "releases": ["kernel-6-1-28", "firmware-96"]},
        ],
        upgrade_fail_rate=0.0,
        check_fail_rate=0.0,
    )
    cfg = write_config(tmp / "railyard.yaml", data)
    dags = tmp / "dags"  # Railyard's DAG files, and a DAG of another team's
    shutil.copytree(ROOT / "dags", dags, ignore=shutil.ignore_patterns("__pycache__"))
    (dags / "network_team.py").write_text(TEAM_DAG)
    s = Stack(home=tmp / "stack", config_file=cfg, airflow_port=free_port(), sim_port=free_port(), dags_folder=dags)
    s.start_sim()
    try:
        s.start_airflow()
        s.ensure_pool()
        yield s
    finally:
        s.stop()


def test_two_trains_at_once_never_take_two_domains(stack):
    fleet = stack.fleet()
    dags = ["railyard_train_drivers", "railyard_train_kernels", "network_team_optics"]
    for d in dags:
        stack.wait_dag(d)
        stack.rest("PATCH", f"/dags/{d}", json={"is_paused": False})
    runs: dict[str, str] = {}
    barrier = threading.Barrier(len(dags))

    def fire(dag_id: str) -> None:
        barrier.wait()
        runs[dag_id] = stack.trigger(dag_id)

    threads = [threading.Thread(target=fire, args=(d,)) for d in dags]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    seen_deferred: set[str] = set()
    ledger_out: list[int] = []
    led = Ledger(f"sqlite:///{stack.home}/ledger.db")

    def watch() -> None:
        for d in dags:
            for tid, st in stack.task_states(d, runs[d]).items():
                if st == "deferred":
                    seen_deferred.add(tid.split(".")[-1])
        ledger_out.append(len(led.domains_out()))

    states = {d: stack.wait_run(d, runs[d], timeout=900, on_poll=watch) for d in dags}
    assert states == {d: "success" for d in dags}

    audit = fleet.audit()
    assert audit["max_domains_out"] == 1, audit["max_domains_out"]
    assert max(ledger_out) <= 1
    assert audit["unverified_returns"] == []
    assert len([s for s in audit["stops"] if not s["op"].startswith("outside/")]) == 8, audit["stops"]  # 4 x 2
    cfg = stack.config
    want = cfg.train_targets(cfg.train("drivers")) | cfg.train_targets(cfg.train("kernels"))
    for h in fleet.hosts():
        assert h.state == HostState.SERVING and h.versions == want, h
    # the second train waited for the lease in a real triggerer, and got it from there
    assert "wait_capacity" in seen_deferred
    assert led.holdings() == {}
    # the team's work: its jobs asked to checkpoint before the drain, its hosts back only after a passing check
    [op] = [o["id"] for o in led.operations_like("outside/network/")]
    acts = [r["action"] for r in led.audit_rows(op)]
    assert acts.index("lease") < acts.index("checkpoint_requested") < acts.index("drain"), acts
    assert acts.index("handed_to_requester") < acts.index("verified") < acts.index("return") < acts.index("release")
    assert {h for r in led.audit_rows(op, action="verified") for h in r["hosts"]} == set(TEAM_HOSTS)
