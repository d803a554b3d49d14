"""Secrets never appear in logs, trigger arguments, the audit or error messages.

A train runs under `dag.test()` against a simulator that requires a bearer token, with an escalation
webhook whose URL carries a secret. The run defers (a capacity wait) and escalates (the failure buffer
runs out mid-train). Then every place a secret could leak is searched for the token and the webhook
secret: the trigger rows in Airflow's DB (raw and decrypted), every byte of Airflow's DB and of the
ledger, the task log files, everything printed or logged, the ledger's audit rows, the escalation
events, the simulator's own files. The connection rules (`fleet_auth`, `fleet_tls`) are tested here too.
The same search over a real `airflow standalone` (task and triggerer log files): tests/e2e/test_secrets_standalone.py.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path

import pytest
import requests

from railyard.fleet.http import HttpFleet
from railyard.fleet.port import FleetError
from railyard.ledger import Ledger
from railyard.operations.stop import Stop
from tests.dags.conftest import load_dag, states
from tests.support.configs import small_config
from tests.support.webhook import webhook_server

HOOK_SECRET = "hk-0e4c8a2f6b1d3e5a7c9b"


# ---- the connection rules --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("login", "password", "extra", "expected"),
    [
        (None, None, {}, {}),
        (None, None, {"token": "t0k3n-abcdef"}, {"token": "t0k3n-abcdef"}),
        (None, "t0k3n-abcdef", {}, {"token": "t0k3n-abcdef"}),
        (None, "t0k3n-abcdef", {"auth": "bearer"}, {"token": "t0k3n-abcdef"}),
        ("ops", "pw-abcdef", {}, {"login": "ops", "password": "pw-abcdef"}),
        ("ops", "pw-abcdef", {"auth": "Basic"}, {"login": "ops", "password": "pw-abcdef"}),
        (None, None, {"auth": "none"}, {}),
    ],
)
def test_fleet_auth_rule(login, password, extra, expected) -> None:
    from railyard_airflow.hooks.fleet import fleet_auth

    assert fleet_auth(login, password, extra) == expected


@pytest.mark.parametrize(
    ("login", "password", "extra", "refusal"),
    [
        (None, "t0k3n-abcdef", {"token": "t0k3n-other1"}, "both in extra.token and in the password"),
        ("ops", None, {}, "basic auth needs both login and password"),
        ("ops", "pw-abcdef", {"auth": "bearer"}, "clear the login"),
        ("ops", None, {"token": "t0k3n-abcdef"}, "clear the login"),
        ("ops", "pw-abcdef", {"auth": "basic", "token": "t0k3n-abcdef"}, "both in extra.token|extra.token is set"),
        (None, None, {"auth": "bearer"}, "no token is set"),
        (None, "t0k3n-abcdef", {"auth": "none"}, "credentials are set"),
        (None, None, {"auth": "digest"}, "must be bearer, basic or none"),
    ],
)
def test_fleet_auth_refuses_ambiguity_without_echoing_values(login, password, extra, refusal) -> None:
    from railyard_airflow.hooks.fleet import fleet_auth

    with pytest.raises(ValueError, match=refusal) as err:
        fleet_auth(login, password, extra, conn_id="railyard_fleet")
    assert "railyard_fleet" in str(err.value)
    assert "t0k3n" not in str(err.value) and "pw-abcdef" not in str(err.value)


def test_fleet_tls_rule() -> None:
    from railyard_airflow.hooks.fleet import fleet_tls

    assert fleet_tls({}) == {"verify": True}
    assert fleet_tls({"verify": "false"}) == {"verify": False}
    assert fleet_tls({"verify": False, "cert": "/c.pem"}) == {"verify": False, "cert": "/c.pem"}
    assert fleet_tls({"ca_bundle": "/ca.pem", "cert": "/c.pem", "key": "/k.pem"}) == {
        "verify": "/ca.pem", "cert": ("/c.pem", "/k.pem")}
    with pytest.raises(ValueError, match="verify is false"):
        fleet_tls({"ca_bundle": "/ca.pem", "verify": "false"})
    with pytest.raises(ValueError, match="key is set without extra.cert"):
        fleet_tls({"key": "/k.pem"})


def test_the_hook_builds_an_authenticated_fleet_from_the_connection(tmp_path, monkeypatch) -> None:
    from railyard_airflow.hooks.fleet import FleetHook
    from tests.support.configs import write_config

    cfg = write_config(tmp_path / "railyard.yaml", small_config())

    def fleet_of(conn: dict) -> HttpFleet:
        monkeypatch.setenv("AIRFLOW_CONN_SECRET_FLEET", json.dumps({"conn_type": "http", **conn}))
        fleet = FleetHook("secret_fleet", config_path=str(cfg)).get_conn()
        assert isinstance(fleet, HttpFleet)
        return fleet

    f = fleet_of({"host": "fleet.example", "schema": "https", "port": 8443, "login": "ops", "password": "pw-abcdef",
                  "extra": {"ca_bundle": "/etc/ca.pem", "cert": "/c.pem", "key": "/k.pem", "read_timeout": 30}})
    assert (f.base_url, f.auth_scheme, f.verify, f.cert) == ("https://fleet.example:8443", "basic", "/etc/ca.pem",
                                                              ("/c.pem", "/k.pem"))
    assert f.timeout == (3.0, 30.0) and "pw-abcdef" not in repr(f)
    f = fleet_of({"host": "127.0.0.1", "port": 8765, "extra": {"token": "t0k3n-abcdef", "verify": "false"}})
    assert (f.base_url, f.auth_scheme, f.verify) == ("http://127.0.0.1:8765", "bearer", False)
    with pytest.raises(ValueError, match="carries credentials") as err:
        fleet_of({"host": "https://ops:pw-abcdef@fleet.example"})
    assert "pw-abcdef" not in str(err.value)


# ---- the whole train -------------------------------------------------------------------------------------
@pytest.fixture
def secret_webhook():
    with webhook_server(f"/services/{HOOK_SECRET}?key={HOOK_SECRET}", must_hold=HOOK_SECRET) as (url, got):
        yield url, got


def _trigger_rows() -> list[tuple[int, str, str, dict]]:
    from airflow.models.trigger import Trigger
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        return [(t.id, t.classpath, t.encrypted_kwargs, t.kwargs) for t in session.scalars(select(Trigger))]


def _airflow_files() -> list[Path]:
    import os

    home = Path(os.environ["AIRFLOW_HOME"])
    return [p for p in home.rglob("*") if p.is_file()]


def test_no_secret_in_trigger_kwargs_logs_audit_or_escalations(train_env, secret_webhook, monkeypatch, caplog,
                                                               capfd):
    hook_url, events = secret_webhook
    monkeypatch.setenv("RAILYARD_WEBHOOK_URL", hook_url)
    data = small_config(upgrade_fail_rate=0.0, check_fail_rate=0.0, repair_s=10_000_000)
    data["buffers"]["failure"] = {"hosts": 1}
    stack, fleet, tmp = train_env(data)
    token = stack.fleet_token
    assert token and len(token) >= 32
    secrets = [token, HOOK_SECRET]

    # the simulator refuses calls without the token, or with a wrong one, and says nothing of either
    assert requests.get(f"{stack.fleet_url}/v1/hosts", timeout=5).status_code == 401
    assert requests.post(f"{stack.fleet_url}/v1/hosts/gpu-a01/fail", timeout=5).status_code == 401
    assert requests.get(f"{stack.fleet_url}/healthz", timeout=5).status_code == 200
    wrong = "tok-wrong-" + token[::-1][:20]
    with pytest.raises(FleetError, match="not authorized") as err:
        HttpFleet(stack.fleet_url, token=wrong, retries=0).capacity()
    assert wrong not in str(err.value) and token not in str(err.value)
    # Airflow gets the token as the connection's password, with extra auth: bearer
    conn = json.loads(stack.env()["AIRFLOW_CONN_RAILYARD_FLEET"])
    assert conn["password"] == token and conn["extra"] == {"auth": "bearer"} and token not in conn["host"]

    # another operation holds pod-c: the train's first capacity wait must defer to its trigger
    led = Ledger(f"sqlite:///{tmp}/ledger.db")
    conf = stack.config
    holder = Stop(config=conf, train=conf.train("demo"), domain=conf.domain("pod-c"), op_id="other/run/pod-c",
                  fleet=fleet, ledger=led)
    assert holder.take().granted
    triggers_before = {row[0] for row in _trigger_rows()}

    def release_after_deferral_then_break_two_hosts():
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not ({row[0] for row in _trigger_rows()} - triggers_before):
            time.sleep(0.2)
        time.sleep(0.5)  # a few polls of the trigger while it waits
        holder.return_hosts()
        while time.monotonic() < deadline:  # then the failure buffer runs out during the first stop
            if "pod-a" in fleet.capacity().domains_out:
                fleet.fail("gpu-c01")
                fleet.fail("gpu-c02")
                return
            time.sleep(0.05)

    t = threading.Thread(target=release_after_deferral_then_break_two_hosts)
    t.start()
    with caplog.at_level(logging.DEBUG):
        dr = load_dag("railyard_train_demo").test()
    t.join()
    st = states(dr)
    assert dr.state == "failed", st
    assert st["pod-a.wait_capacity"] == "success" and st["pod-a.return_to_service"] == "success", st
    assert st["pod-b.wait_capacity"] == "failed", st

    # a deferral happened, and its trigger row holds the connection id, not the token or a URL
    rows = [r for r in _trigger_rows() if r[0] not in triggers_before]
    assert rows, "the capacity wait did not defer"
    for _id, classpath, raw, kwargs in rows:
        assert classpath.startswith("railyard_airflow.triggers.stop.")
        assert kwargs["fleet_conn_id"] == "railyard_fleet" and "fleet_url" not in kwargs
        for s in secrets:
            assert s not in raw and s not in json.dumps(kwargs, default=str)

    # escalation: the ledger's audit, the webhook's events
    (esc,) = [r for r in led.audit_rows() if r["action"] == "escalation"]
    assert "train demo stopped at pod-b.wait_capacity" in esc["reason"]
    assert [e["kind"] for e in events] == ["train_stopped"]
    for s in secrets:
        assert s not in json.dumps(led.audit_rows(), default=str)
        assert s not in json.dumps(events)

    # everything printed or logged while the train ran (the tasks and the inline trigger run in this process)
    out = capfd.readouterr()
    logged = "\n".join([out.out, out.err, *(f"{r.getMessage()} {r.exc_text or ''}" for r in caplog.records)])
    assert "waiting: " in logged, "the trigger's polls were not captured"
    assert "escalation sent to the webhook at 127.0.0.1" in logged
    for s in secrets:
        assert s not in logged, f"a secret was printed or logged: ...{logged[max(0, logged.find(s) - 200):][:400]}"

    # every file under AIRFLOW_HOME (the metadata DB and its journal; under dag.test() the task logs go to
    # the console, captured above: tests/e2e/test_secrets_standalone.py reads the log files of a real
    # scheduler and triggerer), the ledger, the simulator's files
    files = _airflow_files()
    assert any(p.name == "airflow.db" for p in files), files
    files += [tmp / "ledger.db", stack.home / "sim.db", stack.home / "sim.log"]
    for p in files:
        blob = p.read_bytes()
        for s in secrets:
            assert s.encode() not in blob, f"{s[:6]}... found in {p}"
    assert (stack.home / "sim.token").stat().st_mode & 0o077 == 0  # the token's own file: owner-only
