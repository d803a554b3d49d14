"""No secret leaks under a real `airflow standalone`: real scheduler, real triggerer, real log files.

The Stack's simulator requires a random bearer token, which Airflow gets only as the fleet connection's
password (AIRFLOW_CONN_RAILYARD_FLEET). The escalation webhook URL carries a secret. A train defers
to the real triggerer (another operation holds a domain), which must rebuild the fleet from the
connection id alone; then the failure buffer runs out and the train escalates. The token and the
webhook secret must appear nowhere: not in the trigger's kwargs (read from Airflow's DB while the task
is deferred, decrypted with the stack's Fernet key), not in what the REST API shows of the run, not in
any file of the stack (task and triggerer logs, Airflow's DB, the ledger, the simulator's log and world).
"""

from __future__ import annotations

import configparser
import json
import sqlite3
import threading
import time

import pytest

from railyard.devstack.stack import Stack, free_port
from railyard.ledger import Ledger
from railyard.operations.stop import Stop
from tests.support.configs import small_config, write_config
from tests.support.webhook import webhook_server

pytestmark = pytest.mark.e2e

DAG = "railyard_train_demo"
HOOK_SECRET = "hk-e2e-3b5d7f9a1c2e4f6a8b"


@pytest.fixture
def webhook():
    with webhook_server(f"/services/{HOOK_SECRET}?key={HOOK_SECRET}") as (url, got):
        yield url, got


def trigger_kwargs(stack: Stack) -> list[tuple[str, str, str]]:
    """(classpath, stored kwargs, decrypted kwargs) of every trigger row in the stack's Airflow DB."""
    from cryptography.fernet import Fernet

    cfg = configparser.ConfigParser(interpolation=None)
    cfg.read(stack.airflow_home / "airflow.cfg")
    key = cfg.get("core", "fernet_key", fallback="").strip()
    db = sqlite3.connect(f"file:{stack.airflow_home / 'airflow.db'}?mode=ro", uri=True, timeout=30)
    try:
        rows = db.execute("SELECT classpath, kwargs FROM trigger").fetchall()
    finally:
        db.close()
    out = []
    for classpath, stored in rows:
        plain = stored if stored.startswith("{") or not key else Fernet(key.encode()).decrypt(stored.encode()).decode()
        out.append((classpath, stored, plain))
    return out


def test_no_secret_anywhere_under_standalone(tmp_path, webhook):
    hook_url, events = webhook
    data = small_config(upgrade_fail_rate=0.0, check_fail_rate=0.0, repair_s=10_000_000)
    data["buffers"]["failure"] = {"hosts": 1}
    cfg = write_config(tmp_path / "railyard.yaml", data)
    stack = Stack(home=tmp_path / "stack", config_file=cfg, airflow_port=free_port(), sim_port=free_port(),
                  extra_env={"RAILYARD_WEBHOOK_URL": hook_url})
    secrets = [stack.fleet_token, HOOK_SECRET]
    assert stack.fleet_token and stack.fleet_token not in repr(stack)
    fleet = stack.start_sim()
    try:
        stack.start_airflow()
        stack.ensure_pool()
        stack.wait_dag(DAG)
        led = Ledger(f"sqlite:///{stack.home}/ledger.db")
        conf = stack.config
        holder = Stop(config=conf, train=conf.train("demo"), domain=conf.domain("pod-c"), op_id="other/run/pod-c",
                      fleet=fleet, ledger=led)
        assert holder.take().granted
        run_id = stack.trigger(DAG)
        seen: list[dict] = []  # what any viewer of the task sees while it is deferred
        rows: list[tuple[str, str, str]] = []  # its trigger row, read from the DB meanwhile

        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            ti = stack.rest("GET", f"/dags/{DAG}/dagRuns/{run_id}/taskInstances/pod-a.wait_capacity", ok=(200, 404))
            if ti.get("state") == "deferred" and ti.get("trigger"):
                seen.append(ti)
                rows = trigger_kwargs(stack)
                break
            assert ti.get("state") not in ("success", "failed", "skipped"), ti
            time.sleep(0.5)
        assert seen, "pod-a.wait_capacity never deferred"
        time.sleep(3)  # the real triggerer polls a few times with the connection it looked up itself
        holder.return_hosts()

        def break_two_hosts_during_the_first_stop():
            end = time.monotonic() + 240
            while time.monotonic() < end:
                if "pod-a" in fleet.capacity().domains_out:
                    fleet.fail("gpu-c01")
                    fleet.fail("gpu-c02")
                    return
                time.sleep(0.05)

        breaker = threading.Thread(target=break_two_hosts_during_the_first_stop)
        breaker.start()
        state = stack.wait_run(DAG, run_id, timeout=300)
        breaker.join()
        states = stack.task_states(DAG, run_id)
        assert state == "failed", states
        assert states["pod-a.wait_capacity"] == "success" and states["pod-b.wait_capacity"] == "failed", states
        tis = stack.rest("GET", f"/dags/{DAG}/dagRuns/{run_id}/taskInstances", params={"limit": 1000})
    finally:
        stack.stop()

    (row,) = [r for r in rows if r[0] == "railyard_airflow.triggers.stop.BufferCapacityTrigger"]
    kwargs = row[2]
    assert "railyard_fleet" in kwargs and "fleet_url" not in kwargs and "127.0.0.1" not in kwargs, kwargs
    assert [e["kind"] for e in events] == ["train_stopped"]
    (esc,) = [r for r in led.audit_rows() if r["action"] == "escalation"]
    assert "stopped at pod-b.wait_capacity" in esc["reason"]
    shown = json.dumps([seen, rows, tis, events, led.audit_rows()], default=str)
    files = [p for p in stack.home.rglob("*") if p.is_file()]
    task_logs = [p for p in files if "dag_id=railyard_train_demo" in str(p)]
    assert any("wait_capacity" in str(p) for p in task_logs), "no task log files"
    triggerer_said = "\n".join(p.read_text(errors="replace") for p in files if p.suffix == ".log")
    assert "waiting: " in triggerer_said  # the triggerer's polls are in the files searched
    assert "escalation sent to the webhook at 127.0.0.1" in triggerer_said
    for s in secrets:
        assert s not in shown
        for p in files:
            if p.name == "sim.token":
                continue  # the token's own file (mode 0600): the one place it belongs
            assert s.encode() not in p.read_bytes(), f"{s[:6]}... found in {p}"
