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
    # its last task wrote the run's report: every host upgraded, before and after
    report = led.report(f"demo/{dr.run_id}")
    assert report is not None and report["run"]["outcome"] == "success", report and report["run"]
    assert report["run"]["dag_id"] == "railyard_train_demo" and report["run"]["failed_tasks"] == []
    assert set(report["hosts"]) == {h.name for h in hosts}
    assert all(h["outcome"] == "upgraded" and h["after"] == targets and h["before"] != targets
               for h in report["hosts"].values()), report["hosts"]
    # a second run finds every host at target and skips every stop without draining anything
    dr2 = dag.test()
    assert dr2.state == "success"
    st = states(dr2)
    assert st.pop("cycle_report") == "success"
    assert st.pop("end_run") == "success"  # the report of a run that had nothing to do
    assert all(s == "skipped" for s in st.values()), st
    nothing = led.report(f"demo/{dr2.run_id}")
    assert nothing is not None and nothing["summary"]["hosts"] == 0 and nothing["run"]["outcome"] == "success"
    assert len(fleet.audit()["stops"]) == 3
