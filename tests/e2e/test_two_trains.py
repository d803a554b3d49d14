"""Two trains over the same fleet, triggered at the same moment through the REST API of a running
`airflow standalone` (real scheduler, real triggerer, real simulator server)."""

from __future__ import annotations

import threading

import pytest

from railyard.devstack.stack import Stack, free_port
from railyard.domain.models import HostState
from railyard.ledger import Ledger
from tests.support.configs import small_config, write_config

pytestmark = pytest.mark.e2e


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
    s = Stack(home=tmp / "stack", config_file=cfg, airflow_port=free_port(), sim_port=free_port())
    s.start_sim()
    try:
        s.start_airflow()
        s.ensure_pool()
        yield s
    finally:
        s.stop()


def test_two_trains_at_once_never_take_two_domains(stack):
    fleet = stack.fleet()
    dags = ["railyard_train_drivers", "railyard_train_kernels"]
    for d in dags:
        stack.wait_dag(d)
        stack.rest("PATCH", f"/dags/{d}", json={"is_paused": False})
    runs: dict[str, str] = {}
    barrier = threading.Barrier(2)

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
    assert len(audit["stops"]) == 8  # 4 domains x 2 trains, one at a time
    cfg = stack.config
    want = cfg.train_targets(cfg.train("drivers")) | cfg.train_targets(cfg.train("kernels"))
    for h in fleet.hosts():
        assert h.state == HostState.SERVING and h.versions == want, h
    # the second train waited for the lease in a real triggerer, and got it from there
    assert "wait_capacity" in seen_deferred
    assert led.holdings() == {}
