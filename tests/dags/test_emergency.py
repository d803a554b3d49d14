"""The emergency train under `dag.test()`: the form is validated before anything is touched,
a dry run only plans, and a host-scoped emergency touches exactly its hosts."""

from __future__ import annotations

from railyard.domain.models import HostState
from railyard.ledger import Ledger
from tests.dags.conftest import load_dag, states
from tests.support.configs import small_config


def config_with_hotfix() -> dict:
    data = small_config(upgrade_fail_rate=0.0, check_fail_rate=0.0)
    data["releases"].append({"id": "driver-575-hotfix", "component": "gpu-driver", "version": "575.51.02"})
    return data


def test_a_bad_form_is_refused_before_anything_is_touched(train_env):
    _stack, fleet, tmp = train_env(config_with_hotfix())
    before = {h.name: (h.state, h.versions) for h in fleet.hosts()}
    conf = {"releases": ["driver-575-hotfix", "driver-570"], "hosts": ["gpu-a01", "gpu-zz9"], "reason": "short",
            "skip_checkpoint": True, "domains_at_once": 2}
    dr = load_dag("railyard_emergency").test(run_conf=conf)
    st = states(dr)
    assert dr.state == "failed" and st["plan"] == "failed"
    assert all(v in ("upstream_failed", None) for k, v in st.items() if k not in ("plan", "end_run")), st
    assert {h.name: (h.state, h.versions) for h in fleet.hosts()} == before
    # the refused run has its report all the same: failed at its plan, no host touched
    report = Ledger(f"sqlite:///{tmp}/ledger.db").report(f"emergency/{dr.run_id}")
    assert st["end_run"] == "success" and report is not None, st
    assert report["run"]["outcome"] == "failed" and report["run"]["failed_tasks"] == ["plan"], report["run"]
    assert report["hosts"] == {} and report["run"]["reason"] == "short"
    (row,) = [r for r in Ledger(f"sqlite:///{tmp}/ledger.db").audit_rows() if r["action"] == "emergency_invalid"]
    for needle in ("releases[1]: 'driver-570' and 'driver-575-hotfix' both target 'gpu-driver'",
                   "hosts[1]: unknown host 'gpu-zz9'",
                   "reason: say why in at least 10 characters (value: 'short')",
                   "skip_checkpoint_reason: required when skip_checkpoint is true",
                   "domains_at_once: more than 1 needs large_scale: true (value: 2)"):
        assert needle in row["reason"], (needle, row["reason"])


def test_a_misspelt_key_or_an_oversized_reason_is_refused_by_name_before_anything_is_touched(train_env):
    """Through the run's conf, as the REST API gives it: `dryrun` would otherwise run a real emergency."""
    _stack, fleet, tmp = train_env(config_with_hotfix())
    before = {h.name: (h.state, h.versions) for h in fleet.hosts()}
    conf = {"releases": ["driver-575-hotfix"], "domains": ["pod-b"], "reason": "CVE-2026-4242 " + "x" * 1_000_000,
            "dryrun": True, "skip_checkpont": False}
    dr = load_dag("railyard_emergency").test(run_conf=conf)
    assert dr.state == "failed" and states(dr)["plan"] == "failed"
    assert {h.name: (h.state, h.versions) for h in fleet.hosts()} == before
    (row,) = [r for r in Ledger(f"sqlite:///{tmp}/ledger.db").audit_rows() if r["action"] == "emergency_invalid"]
    for needle in ("'dryrun': not a field of the emergency form (did you mean 'dry_run'?)",
                   "'skip_checkpont': not a field of the emergency form (did you mean 'skip_checkpoint'?)",
                   "reason: String should have at most 1000 characters", "(1000014 characters)"):
        assert needle in row["reason"], (needle, row["reason"][:2000])
    assert len(row["reason"]) < 2000  # the megabyte is not stored


def test_a_dry_run_plans_and_touches_nothing(train_env):
    _stack, fleet, tmp = train_env(config_with_hotfix())
    before = {h.name: (h.state, h.versions) for h in fleet.hosts()}
    conf = {"releases": ["driver-575-hotfix"], "domains": ["pod-b"], "reason": "CVE-2026-4242 in the driver",
            "dry_run": True}
    dr = load_dag("railyard_emergency").test(run_conf=conf)
    st = states(dr)
    assert dr.state == "success" and st.pop("plan") == "success" and st.pop("end_run") == "success"
    assert all(v == "skipped" for v in st.values()), st
    assert {h.name: (h.state, h.versions) for h in fleet.hosts()} == before
    led = Ledger(f"sqlite:///{tmp}/ledger.db")
    assert led.reports() == []  # a dry run writes no report
    (trig,) = [r for r in led.audit_rows() if r["action"] == "emergency_trigger"]
    assert trig["actor"] == "dag_test" and "DRY RUN" in trig["reason"]  # who triggered, and why
    plan = led.operations_like("emergency/")[0]["detail"]["plan"]
    assert [s["domain"] for s in plan["stops"]] == ["pod-b"] and len(plan["stops"][0]["steps"]) == 4


def test_a_host_scoped_emergency_touches_only_its_hosts(train_env):
    stack, fleet, tmp = train_env(config_with_hotfix())
    conf = {"releases": ["driver-575-hotfix"], "hosts": ["gpu-b01", "gpu-b02"],
            "reason": "CVE-2026-4242 in the driver", "skip_checkpoint": True,
            "skip_checkpoint_reason": "exploited in the wild; jobs restart from their last checkpoint"}
    dr = load_dag("railyard_emergency").test(run_conf=conf)
    assert dr.state == "success", states(dr)
    for h in fleet.hosts():
        assert h.state == HostState.SERVING
        want = "575.51.02" if h.name in ("gpu-b01", "gpu-b02") else "550.127.08"
        assert h.versions["gpu-driver"] == want, h
    audit = fleet.audit()
    assert audit["unverified_returns"] == [] and audit["max_domains_out"] == 1
    led = Ledger(f"sqlite:///{tmp}/ledger.db")
    assert led.holdings() == {}
    assert any(r["action"] == "checkpoint_skipped" and "GPU-hours at risk" in r["reason"] for r in led.audit_rows())


def test_an_emergency_that_would_break_an_equals_rule_is_refused_before_anything_is_touched(train_env):
    """The hotfix driver without its fabric manager, under `fabric-manager == gpu-driver`: the plan
    task refuses it, names the rule and the hosts, and no stop runs."""
    data = config_with_hotfix()
    data["components"].append({"name": "fabric-manager", "duration_s": 60})
    data["simulator"]["initial_versions"]["fabric-manager"] = data["simulator"]["initial_versions"]["gpu-driver"]
    data["releases"].append({"id": "fm-570", "component": "fabric-manager", "version": "570.86.15"})
    data["trains"][0]["releases"].append("fm-570")  # the train moves both together
    data["compatibility"] = {"rules": ["fabric-manager == gpu-driver"]}
    _stack, fleet, tmp = train_env(data)
    before = {h.name: (h.state, h.versions) for h in fleet.hosts()}
    conf = {"releases": ["driver-575-hotfix"], "domains": ["pod-b"], "reason": "CVE-2026-4242 in the driver"}
    dr = load_dag("railyard_emergency").test(run_conf=conf)
    st = states(dr)
    assert dr.state == "failed" and st["plan"] == "failed"
    assert all(v in ("upstream_failed", None) for k, v in st.items() if k not in ("plan", "end_run")), st
    assert {h.name: (h.state, h.versions) for h in fleet.hosts()} == before
    led = Ledger(f"sqlite:///{tmp}/ledger.db")
    (row,) = [r for r in led.audit_rows() if r["action"] == "emergency_refused"]
    assert "fabric-manager == gpu-driver" in row["reason"] and "gpu-b01" in row["reason"]
    assert led.holdings() == {} and led.operations_like("emergency/") == []
