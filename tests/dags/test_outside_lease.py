"""Another team's DAG with Railyard's lease pair, under `dag.test()` against the simulator server: its own
task runs on drained hosts whose jobs checkpointed first; the teardown returns them through the check, also
when that task failed; a failing check sends a host to repair; a bad request fails before anything is touched."""

from __future__ import annotations

from datetime import datetime

from railyard.domain.models import HostState
from railyard.ledger import Ledger
from tests.dags.conftest import states
from tests.support.configs import small_config


def team_dag(hosts: list[str], *, fail: bool = False, reason: str = "replace the optics on this pod"):
    from airflow.sdk import DAG, task

    from railyard_airflow.operators.outside import RailyardLeaseOperator, RailyardReturnOperator

    with DAG(dag_id="network_team_optics", start_date=datetime(2026, 1, 1), schedule=None, catchup=False) as dag:
        lease = RailyardLeaseOperator(task_id="lease", hosts=hosts, kind="network", reason=reason, poll_s=1)

        @task
        def work() -> list[str]:
            from railyard_airflow.hooks.fleet import FleetHook

            fleet = FleetHook().get_conn()
            seen = {h.name: h.state.value for h in fleet.hosts(hosts)}
            assert set(seen.values()) == {"drained"}, seen  # the team works on drained hosts only
            if fail:
                raise RuntimeError("the optics vendor's tool crashed")
            return sorted(seen)

        back = RailyardReturnOperator(task_id="return", lease_task_id="lease")
        lease >> work() >> back.as_teardown(setups=lease)
    _serialize(dag)
    return dag


def _serialize(dag) -> None:  # noqa: ANN001
    """`dag.test()` runs only a DAG Airflow has serialized: this one lives in no DAG file, so it is written to
    the metadata DB as the dags folder's bundle would (the dags folder's own DAGs stay as they are)."""
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import DagBag, sync_bag_to_db

    DagBundlesManager().sync_bundles_to_db()
    bag = DagBag(dag_folder="/nonexistent")
    bag.bag_dag(dag)
    sync_bag_to_db(bag, "dags-folder", None)


def test_a_team_dag_works_inside_a_lease_and_its_hosts_come_back_through_the_check(train_env):
    stack, fleet, tmp = train_env(small_config(upgrade_fail_rate=0.0, check_fail_rate=0.0))
    hosts = ["gpu-b01", "gpu-b02"]
    job_ids = {j.id for j in fleet.jobs(hosts) if j.state == "running"}
    assert job_ids
    dr = team_dag(hosts).test()
    st = states(dr)
    assert dr.state == "success" and st == {"lease": "success", "work": "success", "return": "success"}, st
    assert all(h.state == HostState.SERVING for h in fleet.hosts())
    led = Ledger(f"sqlite:///{tmp}/ledger.db")
    [op] = [o["id"] for o in led.operations_like("outside/network/")]
    actions = [r["action"] for r in led.audit_rows(op)]
    assert actions.index("checkpoint_requested") < actions.index("drain") < actions.index("handed_to_requester")
    assert actions.index("handed_to_requester") < actions.index("verified") < actions.index("return")
    assert led.operation(op)["state"] == "done" and not led.holdings(op)
    assert led.audit_rows(op, action="outside_request")[0]["actor"].startswith("dag:network_team_optics")


def test_the_teardown_returns_the_hosts_when_the_team_task_fails_and_a_failing_check_goes_to_repair(train_env):
    stack, fleet, tmp = train_env(small_config(upgrade_fail_rate=0.0, check_fail_rate=0.0))
    fleet.settings(check_fail_rate=1.0)  # every host checked fails
    dr = team_dag(["gpu-c01"], fail=True).test()
    st = states(dr)
    assert dr.state == "failed" and st["work"] == "failed" and st["return"] == "success", st
    c01 = fleet.hosts(["gpu-c01"])[0]
    assert c01.state == HostState.REPAIR and "health check failed" in c01.reason, c01
    led = Ledger(f"sqlite:///{tmp}/ledger.db")
    [op] = [o["id"] for o in led.operations_like("outside/network/")]
    assert led.holdings(op) == {} and led.operation(op)["state"] == "done"  # the repair holds gpu-c01 now
    assert set(led.holdings()) == {"gpu-c01"} and next(iter(led.holdings().values())).startswith("repair/")


def test_a_bad_lease_request_fails_before_anything_is_touched(train_env):
    stack, fleet, tmp = train_env(small_config())
    before = {h.name: h.state for h in fleet.hosts()}
    dr = team_dag(["gpu-b01", "gpu-bO2"], reason="too short"[:5]).test()
    st = states(dr)
    assert dr.state == "failed" and st["lease"] == "failed", st
    assert {h.name: h.state for h in fleet.hosts()} == before
    assert Ledger(f"sqlite:///{tmp}/ledger.db").operations_like("outside/") == []


def test_railyard_outside_drives_a_request_made_elsewhere_until_its_requester_returns_it(train_env):
    """The `railyard_outside` DAG (what the page's POST /api/ops triggers) with a request opened in the ledger:
    the lease defers until the hosts are drained, the next task until the requester asks for them back (here
    from another thread, as the page's API would), and the teardown sends the named host to repair with the
    requester's reason and checks the other."""
    import threading
    import time

    from railyard.domain.config import load_config
    from railyard.operations import outside
    from tests.dags.conftest import load_dag

    stack, fleet, tmp = train_env(small_config(upgrade_fail_rate=0.0, check_fail_rate=0.0))
    cfg = load_config(stack.config_file)
    led = Ledger(f"sqlite:///{tmp}/ledger.db")
    req = outside.parse_request(cfg, hosts=["gpu-b01", "gpu-b02"], kind="hw-repair", reason="reseat the GPUs of b")
    op = outside.open_request(cfg, led, req, actor="alice")
    seen: dict[str, object] = {}

    def requester() -> None:
        end = time.monotonic() + 120
        while time.monotonic() < end and outside.status(led, op)["phase"] != "handed":
            time.sleep(0.2)
        seen["states"] = {h.name: h.state for h in fleet.hosts(req["hosts"])}
        outside.ask_return(led, op, to_repair=["gpu-b02"], reason="gpu-b02 kept its bad riser", actor="alice")

    t = threading.Thread(target=requester, daemon=True)
    t.start()
    dr = load_dag("railyard_outside").test(run_conf={"op": op})
    t.join(timeout=5)
    st = states(dr)
    assert dr.state == "success" and set(st.values()) == {"success"}, st
    assert seen["states"] == {"gpu-b01": HostState.DRAINED, "gpu-b02": HostState.DRAINED}, seen
    d01, d02 = fleet.hosts(["gpu-b01", "gpu-b02"])
    assert d01.state == HostState.SERVING, d01
    assert d02.state == HostState.REPAIR and "gpu-b02 kept its bad riser" in d02.reason, d02
    acts = [r["action"] for r in led.audit_rows(op)]
    assert acts.index("handed_to_requester") < acts.index("return_asked") < acts.index("verified"), acts
    assert [r["actor"] for r in led.audit_rows(op, action="return_asked")] == ["alice"]
    assert outside.status(led, op)["phase"] == "returned" and led.operation(op)["state"] == "done"


def test_the_lease_trigger_only_reads_and_wakes_when_the_request_could_go_on(train_env):
    """OutsideTrigger's poll of a queued request leases, drains and audits nothing; it wakes the task once the
    freeze is lifted, and, while the jobs checkpoint, once they all have; the return wait wakes on the ask."""
    from railyard.domain.config import load_config
    from railyard.operations import outside
    from railyard_airflow.triggers.outside import OutsideTrigger

    stack, fleet, tmp = train_env(small_config(upgrade_fail_rate=0.0, check_fail_rate=0.0))
    cfg = load_config(stack.config_file)
    led = Ledger(f"sqlite:///{tmp}/ledger.db")
    led.set_switch("freeze", True, reason="nothing moves this week", actor="ops")
    req = outside.parse_request(cfg, hosts=["gpu-c01"], kind="network", reason="re-cable c01's uplinks")
    op = outside.open_request(cfg, led, req, actor="netteam")

    def trigger(wait_for: str) -> OutsideTrigger:
        return OutsideTrigger(op_id=op, config_path=str(stack.config_file), wait_for=wait_for,
                              deadline=9e9)

    audit = len(led.audit_rows())
    assert trigger("grant").probe() is None
    assert len(led.audit_rows()) == audit and led.holdings() == {}
    assert {h.state for h in fleet.hosts()} == {HostState.SERVING}
    led.set_switch("freeze", False, reason="thawed for the re-cabling", actor="ops")
    assert trigger("grant").probe() == {"status": "ready", "phase": "queued"}
    assert led.holdings() == {}  # the task takes the lease, never the trigger
    stop = outside.stop_of(cfg, fleet, led, op)
    first = outside.advance(stop)
    if first["phase"] == "checkpointing":  # the simulator's jobs checkpoint within seconds of the ask
        import time

        end = time.monotonic() + 60
        while trigger("grant").probe() is None and time.monotonic() < end:
            time.sleep(0.5)
        assert not stop.stale_jobs(float(led.detail(op)["checkpoint_requested_at"]))
    assert outside.wait_handed(stop, say=lambda _m: None, poll_s=0.5)["phase"] == "handed"
    assert trigger("return").probe() is None
    outside.ask_return(led, op, to_repair=[], reason="re-cabled, all links up", actor="netteam")
    assert trigger("return").probe() == {"status": "asked"}
