"""Two trains over the same fleet, and another team's DAG doing outside work inside a Railyard lease, triggered
at the same moment through the REST API of a running `airflow standalone` (real scheduler, real triggerer,
real simulator server)."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests

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


def _cli(stack, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = stack.env() | {"RAILYARD_FLEET_TOKEN": stack.fleet_token or ""}
    return subprocess.run([sys.executable, "-m", "railyard.cli", *args, "--fleet-url", stack.fleet_url],
                          capture_output=True, text=True, timeout=timeout, env=env)


def test_a_requester_killed_after_the_handover_is_escalated_and_returned_only_through_the_check(stack):
    """`railyard op request --wait` is killed once its hosts are handed over. The reconcile DAG, run by the real
    scheduler past the request's deadline, escalates it once and releases nothing; a lease release by hand is
    refused while the hosts are out; `railyard op return` by the on-call brings them back through the check."""
    fleet = stack.fleet()
    led = Ledger(f"sqlite:///{stack.home}/ledger.db")
    env = stack.env() | {"RAILYARD_FLEET_TOKEN": stack.fleet_token or ""}
    req = subprocess.Popen([sys.executable, "-m", "railyard.cli", "op", "request", "--hosts", "gpu-d01",
                            "--kind", "hw-repair", "--reason", "reseat the GPU tray of d01", "--deadline-h", "0.004",
                            "--wait", "--poll-s", "0.5", "--actor", "hwteam", "--fleet-url", stack.fleet_url],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        op = req.stdout.readline().strip()
        for line in req.stdout:
            if "handed over" in line:
                break
        req.send_signal(signal.SIGKILL)  # the requester vanishes with the host in its hands
        req.wait(timeout=30)
    finally:
        if req.poll() is None:
            req.kill()
    assert op.startswith("outside/hw-repair/"), op
    assert fleet.hosts(["gpu-d01"])[0].state == HostState.DRAINED and led.holdings(op) == {"gpu-d01": op}
    time.sleep(max(0.0, led.detail(op)["deadline_at"] - time.time() + 1))
    for _ in range(2):  # escalated once, however often the reconciler runs
        run = stack.trigger("railyard_reconcile")
        assert stack.wait_run("railyard_reconcile", run, timeout=300) == "success"
    esc = led.audit_rows(op, action="escalation")
    assert len(esc) == 1 and "outside_overdue" in esc[0]["reason"] and "hwteam" in esc[0]["reason"], esc
    assert led.holdings(op) == {"gpu-d01": op} and fleet.hosts(["gpu-d01"])[0].state == HostState.DRAINED
    refused = _cli(stack, "lease", "release", op, "--reason", "the hw team is gone home")
    assert refused.returncode != 0 and "out of service" in refused.stderr, refused
    back = _cli(stack, "op", "return", op, "--reason", "tray reseated, hwteam confirmed by phone", "--actor", "oncall")
    assert back.returncode == 0 and "1 host(s) back in service" in back.stdout, back
    assert fleet.hosts(["gpu-d01"])[0].state == HostState.SERVING and not led.holdings(op)
    acts = [r["action"] for r in led.audit_rows(op)]
    assert acts.index("escalation") < acts.index("verified") < acts.index("return"), acts


def test_a_request_over_the_page_api_is_driven_by_railyard_outside_in_the_triggerer(stack):
    """POST /railyard/api/ops during a freeze: its railyard_outside run's lease waits deferred in the real
    triggerer; thawed, the hosts are drained and handed over, and the run waits (deferred) for the requester.
    POST .../return sends one host to repair with the requester's reason; the other fails its check and goes
    to repair with the check's evidence. Every control is audited with the Airflow user."""
    fleet = stack.fleet()
    led = Ledger(f"sqlite:///{stack.home}/ledger.db")
    page = f"{stack.api}/railyard/api"
    auth = {"Authorization": f"Bearer {stack.token()}"}
    led.set_switch("freeze", True, reason="network change window closed", actor="netops")
    body = {"hosts": ["gpu-b01", "gpu-b02"], "kind": "network", "reason": "swap the leaf switch of b01, b02"}
    made = requests.post(f"{page}/ops", json=body, headers=auth, timeout=30)
    assert made.status_code == 201, made.text
    op, run = made.json()["op"], made.json()["run_id"]
    assert led.audit_rows(op, action="outside_request")[0]["actor"] == "admin"

    def until(what: str, probe, timeout: float = 180):  # noqa: ANN001
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            got = probe()
            if got:
                return got
            time.sleep(1)
        raise AssertionError(f"{what} within {timeout}s: {stack.task_states('railyard_outside', run)}")

    until("the lease deferred while frozen",
          lambda: stack.task_states("railyard_outside", run).get("lease") == "deferred")
    st = requests.get(f"{page}/ops/{op}", headers=auth, timeout=30).json()
    assert st["phase"] == "queued" and "freeze" in (st["why"] or ""), st
    led.set_switch("freeze", False, reason="window open again", actor="netops")
    until("the hosts handed over", lambda: requests.get(f"{page}/ops/{op}", headers=auth, timeout=30)
          .json()["phase"] == "handed")
    until("the run waiting for the requester",
          lambda: stack.task_states("railyard_outside", run).get("requester_works") == "deferred")
    assert {h.state for h in fleet.hosts(body["hosts"])} == {HostState.DRAINED}
    fleet.settings(check_fail_rate=1.0)
    try:
        back = requests.post(f"{page}/ops/{op}/return", json={"to_repair": ["gpu-b02"],
                             "reason": "b02's uplink port is dead"}, headers=auth, timeout=30)
        assert back.status_code == 202, back.text
        assert stack.wait_run("railyard_outside", run, timeout=300) == "success"
    finally:
        fleet.settings(check_fail_rate=0.0)
    b01, b02 = fleet.hosts(body["hosts"])
    assert b01.state == HostState.REPAIR and "health check failed" in b01.reason, b01
    assert b02.state == HostState.REPAIR and "b02's uplink port is dead" in b02.reason, b02
    assert led.operation(op)["state"] == "done" and not led.holdings(op)
    assert [r["actor"] for r in led.audit_rows(op, action="return_asked")] == ["admin"]
