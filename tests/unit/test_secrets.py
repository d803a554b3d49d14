"""Secrets stay secret in the core: HttpFleet's credentials, the simulator's token, the escalation webhook.

No Airflow here; the Airflow side (connection rules, trigger kwargs, task logs) is in tests/dags/test_secrets.py.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from fastapi.testclient import TestClient

from railyard.domain.config import load_config
from railyard.fleet.http import HttpFleet, env_token
from railyard.fleet.port import FleetError
from railyard.ledger import Ledger
from railyard.operations.escalate import escalate, webhook_host
from railyard.sim.app import OPEN_PATHS, create_app, resolve_token
from railyard.sim.engine import SimEngine
from tests.support.configs import small_config, write_config

TOKEN = "tok-3f9a1c77e2b54d0c9e1f"
PASSWORD = "pw-8d2e6b1a0c4f4e7b"
HOOK_SECRET = "hk-5a7c9e1b3d5f7a9c"


@pytest.fixture
def echo_server() -> Iterator[str]:
    """A server that refuses everything and echoes the Authorization header it got (as a careless one might)."""

    class H(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            status = int(self.path.rsplit("/", 1)[-1]) if self.path.rsplit("/", 1)[-1].isdigit() else 400
            body = json.dumps({"detail": f"refused, you sent {self.headers.get('Authorization')!r}"}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _answer  # noqa: N815

        def log_message(self, *a: object) -> None:
            pass

    srv = HTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_port}"
    srv.shutdown()


# ---- HttpFleet ---------------------------------------------------------------------------------------
def test_credentials_in_the_url_are_refused_without_repeating_them() -> None:
    for url in (f"http://admin:{PASSWORD}@fleet.example:8765", f"https://{TOKEN}@fleet.example"):
        with pytest.raises(ValueError, match="carries credentials") as err:
            HttpFleet(url)
        assert PASSWORD not in str(err.value) and TOKEN not in str(err.value)


def test_one_kind_of_credentials_at_a_time() -> None:
    with pytest.raises(ValueError, match="not both"):
        HttpFleet("http://127.0.0.1:1", token=TOKEN, login="a", password=PASSWORD)
    with pytest.raises(ValueError, match="both a login and a password"):
        HttpFleet("http://127.0.0.1:1", login="a")
    with pytest.raises(ValueError, match="both a login and a password"):
        HttpFleet("http://127.0.0.1:1", password=PASSWORD)


def test_reprs_name_the_scheme_never_the_secret() -> None:
    bearer = HttpFleet("http://127.0.0.1:1", token=TOKEN)
    basic = HttpFleet("http://127.0.0.1:1", login="ops", password=PASSWORD)
    for f in (bearer, basic):
        for text in (repr(f), str(f), repr(f.session.auth), repr(vars(f).get("session"))):
            assert TOKEN not in text and PASSWORD not in text
    assert repr(bearer) == "HttpFleet('http://127.0.0.1:1', auth='bearer')"
    assert repr(basic) == "HttpFleet('http://127.0.0.1:1', auth='basic')"
    assert repr(HttpFleet("http://127.0.0.1:1")) == "HttpFleet('http://127.0.0.1:1', auth=None)"


def test_a_server_echoing_the_header_does_not_leak_it_into_errors(echo_server: str) -> None:
    import base64

    basic_b64 = base64.b64encode(f"ops:{PASSWORD}".encode()).decode()
    for fleet, secrets in ((HttpFleet(echo_server, token=TOKEN, retries=0), [TOKEN]),
                           (HttpFleet(echo_server, login="ops", password=PASSWORD, retries=0), [PASSWORD, basic_b64])):
        for path, kind in (("/400", "refused"), ("/401", "not authorized"), ("/403", "not authorized"),
                           ("/500", "HTTP 500")):
            with pytest.raises(FleetError, match=kind) as err:
                fleet._call("GET", path)
            assert "***" in str(err.value)  # it did echo; we scrubbed it
            assert not any(s in str(err.value) for s in secrets), str(err.value)


def test_no_credentials_sent_is_said_plainly(echo_server: str) -> None:
    with pytest.raises(FleetError, match=r"not authorized \(HTTP 401.*no credentials were sent"):
        HttpFleet(echo_server, retries=0)._call("GET", "/401")
    with pytest.raises(FleetError, match="the bearer credentials were refused") as err:
        HttpFleet(echo_server, token=TOKEN, retries=0)._call("GET", "/401")
    assert TOKEN not in str(err.value)


def test_env_token_for_clients_outside_airflow(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("RAILYARD_FLEET_TOKEN", raising=False)
    monkeypatch.delenv("RAILYARD_FLEET_TOKEN_FILE", raising=False)
    assert env_token() is None
    (tmp_path / "t").write_text(TOKEN + "\n")
    monkeypatch.setenv("RAILYARD_FLEET_TOKEN_FILE", str(tmp_path / "t"))
    assert env_token() == TOKEN
    monkeypatch.setenv("RAILYARD_FLEET_TOKEN", "tok-from-the-env")
    assert env_token() == "tok-from-the-env"
    monkeypatch.delenv("RAILYARD_FLEET_TOKEN")
    (tmp_path / "t").write_text("")
    with pytest.raises(FleetError, match="is empty"):
        env_token()


# ---- the simulator's token -----------------------------------------------------------------------------
def test_resolve_token_sources(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("RAILYARD_FLEET_TOKEN", raising=False)
    monkeypatch.delenv("RAILYARD_FLEET_TOKEN_FILE", raising=False)
    assert resolve_token() is None  # open: the local test bench
    f = tmp_path / "token"
    f.write_text(f"{TOKEN}\n")
    assert resolve_token(token_file=f) == TOKEN
    monkeypatch.setenv("RAILYARD_FLEET_TOKEN_FILE", str(f))
    assert resolve_token() == TOKEN
    monkeypatch.setenv("RAILYARD_FLEET_TOKEN", "from-env-token")
    assert resolve_token() == "from-env-token"  # the variable wins over the file variable
    assert resolve_token(token_file=f) == TOKEN  # an explicit file wins over both
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ValueError, match="is empty"):
        resolve_token(token_file=tmp_path / "empty")
    with pytest.raises(ValueError, match="cannot read"):
        resolve_token(token_file=tmp_path / "missing")
    with pytest.raises(ValueError, match="one word"):
        resolve_token(token="two words")


@pytest.fixture
def sim_client(tmp_path) -> Iterator[TestClient]:
    cfg = load_config(write_config(tmp_path / "railyard.yaml", small_config()))
    engine = SimEngine(cfg, str(tmp_path / "sim.db"))
    with TestClient(create_app(engine, token=TOKEN)) as client:
        yield client
    engine.close()


def test_every_path_but_healthz_needs_the_token(sim_client: TestClient) -> None:
    assert OPEN_PATHS == {"/healthz"}
    assert sim_client.get("/healthz").status_code == 200
    calls = [("GET", "/v1/hosts"), ("GET", "/v1/capacity"), ("GET", "/v1/audit"), ("GET", "/v1/settings"),
             ("PATCH", "/v1/settings"), ("POST", "/v1/hosts/gpu-a01/fail"), ("POST", "/v1/hosts/drain"),
             ("GET", "/openapi.json"), ("GET", "/docs"), ("GET", "/no/such/path")]
    wrong = "tok-wrong-0000000000000"
    for method, path in calls:
        for headers in ({}, {"Authorization": f"Bearer {wrong}"}, {"Authorization": f"Basic {TOKEN}"},
                        {"Authorization": TOKEN}):
            r = sim_client.request(method, path, headers=headers, json={})
            assert r.status_code == 401, (method, path, headers, r.status_code)
            assert r.headers["WWW-Authenticate"].startswith("Bearer")
            assert wrong not in r.text and TOKEN not in r.text
    ok = {"Authorization": f"Bearer {TOKEN}"}
    assert sim_client.get("/v1/capacity", headers=ok).status_code == 200
    assert sim_client.get("/openapi.json", headers=ok).status_code == 200
    assert sim_client.patch("/v1/settings", headers=ok, json={"check_fail_rate": 0.0}).status_code == 200


# ---- the escalation webhook ------------------------------------------------------------------------------
def test_webhook_host_only() -> None:
    assert webhook_host(f"https://hooks.example.com/services/{HOOK_SECRET}?k={HOOK_SECRET}") == "hooks.example.com"
    assert webhook_host(f"http://u:{HOOK_SECRET}@127.0.0.1:9/x") == "127.0.0.1:9"


@pytest.mark.parametrize("reachable", [True, False])
def test_the_webhook_url_is_never_logged_nor_stored(tmp_path, monkeypatch, caplog, reachable: bool) -> None:
    got: list[bytes] = []

    class H(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            got.append(self.rfile.read(int(self.headers["Content-Length"])))
            self.send_response(500)  # a failing receiver is logged too: by host
            self.end_headers()

        def log_message(self, *a: object) -> None:
            pass

    srv = HTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    port = srv.server_port
    if not reachable:
        srv.shutdown()
        srv.server_close()
    url = f"http://127.0.0.1:{port}/services/{HOOK_SECRET}?token={HOOK_SECRET}"
    monkeypatch.setenv("RAILYARD_WEBHOOK_URL", url)
    cfg = load_config(write_config(tmp_path / "railyard.yaml", small_config()))
    led = Ledger(f"sqlite:///{tmp_path}/ledger.db")
    with caplog.at_level(logging.DEBUG):
        event = escalate(cfg, led, kind="train_stopped", summary="train demo stopped at pod-b.drain: x", op_id="op-1")
    if reachable:
        srv.shutdown()
        assert event["webhook_status"] == 500 and len(got) == 1
        assert HOOK_SECRET not in got[0].decode()
    else:
        assert event["webhook_status"] is None
    logged = "\n".join(f"{r.getMessage()} {r.exc_text or ''}" for r in caplog.records)
    assert f"webhook at 127.0.0.1:{port}" in logged
    assert HOOK_SECRET not in logged and "/services/" not in logged
    assert HOOK_SECRET not in json.dumps(event)
    assert HOOK_SECRET not in json.dumps(led.audit_rows(), default=str)
