"""A whole train under `dag.test()` against the simulator server: the Airflow side, end to end."""

from __future__ import annotations

from railyard.domain.models import HostState
from railyard.ledger import Ledger
from tests.dags.conftest import load_dag, states
from tests.support.configs import small_config


def test_train_under_dag_test(train_env):
    stack, fleet, tmp = train_env(small_config(upgrade_fail_rate=0.0, check_fail_rate=0.0))
    dag = load_dag("railyard_train_demo")
    dr = dag.test()
    assert dr.state == "success", states(dr)
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
    assert set(led.last_visits("demo")) == {"pod-a", "pod-b", "pod-c"}
    # a second run finds every host at target and skips every stop without draining anything
    dr2 = dag.test()
    assert dr2.state == "success"
    st = states(dr2)
    assert st.pop("cycle_report") == "success"
    assert all(s == "skipped" for s in st.values()), st
    assert len(fleet.audit()["stops"]) == 3
