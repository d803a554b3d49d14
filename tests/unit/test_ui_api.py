"""The Railyard page's JSON endpoints and controls, on an in-process simulator and a real ledger.

Authentication is Airflow's own: the requests carry JWTs made by Airflow's SimpleAuthManager (an admin,
a user and a viewer), the app resolves them with Airflow's `get_user` and asks the auth manager whether
the user may trigger Railyard DAGs. Nothing of the auth is overridden."""

from __future__ import annotations

import dataclasses
import sqlite3
from collections import Counter

import pytest
from fastapi.testclient import TestClient

from railyard.domain.config import parse_config
from railyard.domain.models import HostState
from railyard.domain.planning import budget_for
from railyard.ledger import Ledger
from railyard.sim.engine import SimEngine
from railyard_airflow.ui import app as ui_app
from tests.support.configs import small_config


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class GoneRuns:
    """Airflow knows the DAGs; every run asked of it has ended (`states` says otherwise per run id)."""

    def __init__(self) -> None:
        self.states: dict[str, str] = {}

    def dag_known(self, dag_id: str) -> bool:
        return True

    def run_state(self, dag_id: str, run_id: str) -> str | None:
        return self.states.get(run_id)


class FixedSources:
    def __init__(self, config, fleet, ledger) -> None:  # noqa: ANN001
        self.config, self.fleet, self.ledger = config, fleet, ledger
        self.runs = GoneRuns()

    outside_refusal: str | None = None  # why railyard_outside cannot take a request (paused, absent)
    trigger_error: Exception | None = None

    def outside_dag(self) -> str | None:
        return self.outside_refusal

    def drive_outside(self, op_id: str, user: str) -> str:
        """What triggering railyard_outside answers (tests/e2e/test_two_trains.py triggers a real one)."""
        if self.trigger_error is not None:
            raise self.trigger_error
        self.driven = [*getattr(self, "driven", []), (op_id, user)]
        return "outside__" + op_id.split("/")[2]

    def schedule(self) -> dict:
        """What Airflow's metadata DB says of the train DAGs (tests/e2e/test_ui_page.py reads a real one)."""
        return {"railyard_train_demo": {"paused": False, "next_run": "2026-01-02T03:00:00+00:00"}}


@pytest.fixture(scope="module")
def auth(tmp_path_factory):
    """Airflow's SimpleAuthManager, as the api-server builds it; JWTs for three roles. The token check
    reads Airflow's metadata DB: this module gets one of its own, so that what other tests did to the
    session's SQLite file (migrations, standalone servers, in-process runs) cannot reach it."""
    from airflow import settings
    from airflow.api_fastapi.app import create_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
    from airflow.configuration import conf
    from airflow.models.revoked_token import RevokedToken

    before = conf.get("database", "sql_alchemy_conn")
    db = tmp_path_factory.mktemp("ui-airflow-db") / "airflow.db"
    conf.set("database", "sql_alchemy_conn", f"sqlite:///{db}")
    settings.configure_vars()  # configure_orm reads settings.SQL_ALCHEMY_CONN, set from conf here
    settings.configure_orm()
    assert str(settings.engine.url).endswith(str(db)), settings.engine.url
    try:
        RevokedToken.__table__.create(settings.engine, checkfirst=True)  # what a token check reads
        am = create_auth_manager()
        yield {role: am.generate_jwt(SimpleAuthManagerUser(username=f"{role}-1", role=role))
               for role in ("admin", "user", "viewer")}
    finally:
        settings.dispose_orm()
        conf.set("database", "sql_alchemy_conn", before)
        settings.configure_vars()
        settings.configure_orm()


@pytest.fixture
def world(tmp_path, auth):
    data = small_config(domains=3, hosts_per_domain=4)
    data["releases"][0]["rollout"] = {"staged_fraction": 0.5, "soak_s": 0}
    cfg = parse_config(data)
    fleet = SimEngine(cfg, None, clock=Clock())
    ledger = Ledger(f"sqlite:///{tmp_path}/ledger.db")
    client = TestClient(ui_app.create_app(FixedSources(cfg, fleet, ledger)))
    return cfg, fleet, ledger, client


def as_(auth, role: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {auth[role]}"}


def test_every_route_refuses_a_caller_not_logged_in(world) -> None:
    *_, client = world
    for path in ("/", "/api/overview", "/api/map", "/api/capacity", "/api/buffers", "/api/trains",
                 "/api/releases", "/api/operations", "/api/hosts/gpu-a01", "/api/domains/pod-a/hosts", "/api/me",
                 "/api/ops", "/api/ops/outside/x/y/pod-a"):
        assert client.get(path).status_code == 401, path
    assert client.post("/api/freeze", json={"on": True, "reason": "a reason long enough"}).status_code == 401
    assert client.get("/api/overview", headers={"Authorization": "Bearer not-a-jwt"}).status_code in (401, 403)
    assert client.get("/api/overview", cookies={"_token": "forged"}).status_code in (401, 403)


def test_a_leased_domain_shows_out_with_its_operation_and_run(world, auth) -> None:
    cfg, fleet, ledger, client = world
    hosts = list(cfg.domain("pod-b").hosts)
    op = "demo/manual__2026-01-01T00:00:00+00:00/pod-b"
    assert ledger.acquire_domain(op, train="demo", domain="pod-b", hosts=hosts, budget=budget_for(cfg)).granted
    fleet.drain(hosts, op)
    fleet.offboard("gpu-c02", "DCGM diag level 2 failed: XID 79", "repair/gpu-c02")
    r = client.get("/api/overview", headers=as_(auth, "viewer"))
    assert r.status_code == 200, r.text
    body = r.json()
    doms = {d["name"]: d for d in body["map"]["domains"]}
    run = "/dags/railyard_train_demo/runs/manual__2026-01-01T00%3A00%3A00%2B00%3A00"
    assert doms["pod-b"]["out"] and doms["pod-b"]["held_by"] == op and not doms["pod-a"]["out"]
    assert doms["pod-b"]["run"] == run and doms["pod-b"]["held"] == 4 and doms["pod-b"]["serving"] == 0
    assert body["map"]["offboarded"] == [{"name": "gpu-c02", "domain": "pod-c", "state": "repair",
                                          "reason": "DCGM diag level 2 failed: XID 79"}]
    pod_b = client.get("/api/domains/pod-b/hosts", headers=as_(auth, "viewer")).json()
    b1 = pod_b["hosts"][0]
    assert b1["state"] in (HostState.DRAINING, HostState.DRAINED) and b1["op"] == op and b1["run"] == run
    assert pod_b["out"] and pod_b["held_by"] == op
    c2 = next(h for h in client.get("/api/domains/pod-c/hosts", headers=as_(auth, "viewer")).json()["hosts"]
              if h["name"] == "gpu-c02")
    assert c2["state"] == "repair" and "XID 79" in c2["reason"]
    cap = body["capacity"]
    assert cap["total"] == 12 and cap["serving"] == 7 and cap["fraction"] == pytest.approx(7 / 12)
    assert cap["domains_line"] == pytest.approx(2 / 3)
    assert cap["floor"] == pytest.approx((12 - 4 - 2) / 12)
    assert cap["history"][0]["serving"] == 1.0 and cap["history"][-1]["serving"] == pytest.approx(7 / 12)
    [buf] = body["buffers"]
    assert buf["maintenance"] == {"budget": 4, "used": 4, "left": 0}
    assert buf["failure"] == {"budget": 2, "used": 1, "left": 1}
    assert [o["id"] for o in body["operations"]] == [op]
    assert body["operations"][0]["run"].startswith("/dags/railyard_train_demo/runs/")
    rel = {r["release"]: r for r in body["releases"]["releases"]}
    assert rel["driver-570"]["phased"] and rel["driver-570"]["phase"] == "canary" and not rel["driver-570"]["halted"]
    assert body["releases"]["drift"]["gpu-driver"]["versions"] == {"550.127.08": 12}
    assert body["trains"][0]["id"] == "demo" and len(body["trains"][0]["domains"]) == 3
    assert body["trains"][0]["next_run"] == "2026-01-02T03:00:00+00:00" and body["trains"][0]["paused"] is False
    assert body["freeze"]["on"] is False and body["user"] == "viewer-1"


class NoLedger(FixedSources):
    """Sources whose ledger URL points at a server that is not there."""

    def __init__(self, config, fleet, url: str) -> None:  # noqa: ANN001
        self.config, self.fleet, self._url = config, fleet, url

    @property
    def ledger(self):  # noqa: ANN201
        from railyard_airflow.context import ledger

        return ledger(self._url)


def test_a_ledger_that_cannot_be_opened_is_a_503_that_says_why(world, auth) -> None:
    cfg, fleet, _ledger, _client = world
    src = NoLedger(cfg, fleet, "postgresql://ry:pw-0b9c2e7d41@127.0.0.1:1/railyard")
    client = TestClient(ui_app.create_app(src))
    r = client.get("/api/overview", headers=as_(auth, "viewer"))
    assert r.status_code == 503, r.text
    assert r.json()["detail"].startswith("ledger: cannot open postgresql+psycopg2://ry:***@127.0.0.1:1/railyard: ")
    assert "pw-0b9c2e7d41" not in r.text


def test_a_viewer_reads_but_every_control_is_refused_and_audited(world, auth) -> None:
    _cfg, _fleet, ledger, client = world
    assert client.get("/api/me", headers=as_(auth, "viewer")).json() == {"user": "viewer-1", "may_act": False}
    for path, body in (("/api/freeze", {"on": True, "reason": "viewer tries to freeze"}),
                       ("/api/releases/driver-570/halt", {"reason": "viewer tries to halt"}),
                       ("/api/lease/release", {"op": "x/y/z", "reason": "viewer tries to release"})):
        r = client.post(path, json=body, headers=as_(auth, "viewer"))
        assert r.status_code == 403, (path, r.text)
    refused = [a for a in ledger.audit_rows() if a["action"] == "ui_refused"]
    assert len(refused) == 3 and {a["actor"] for a in refused} == {"viewer-1"}
    assert "viewer tries to freeze" in refused[0]["reason"]
    assert ledger.switch("freeze") is None


def test_controls_need_a_reason_and_are_audited_with_the_user(world, auth) -> None:
    cfg, fleet, ledger, client = world
    assert client.get("/api/me", headers=as_(auth, "user")).json()["may_act"] is True
    r = client.post("/api/freeze", json={"on": True, "reason": "short"}, headers=as_(auth, "user"))
    assert r.status_code == 422 and "10 characters" in r.text
    assert ledger.switch("freeze") is None
    r = client.post("/api/freeze", json={"on": True, "reason": "change freeze for the launch"},
                    headers=as_(auth, "user"))
    assert r.status_code == 200 and r.json()["on"] is True
    sw = ledger.switch("freeze")
    assert sw["actor"] == "user-1" and "change freeze for the launch" in sw["reason"]
    r = client.post("/api/freeze", json={"on": False, "reason": "launch is over, thaw"}, headers=as_(auth, "admin"))
    assert r.status_code == 200 and ledger.switch("freeze") is None
    assert ([a["actor"] for a in ledger.audit_rows() if a["action"] in ("freeze_on", "freeze_off")]
            == ["user-1", "admin-1"])

    r = client.post("/api/releases/driver-570/halt", json={"reason": "bad XIDs on the canary"},
                    headers=as_(auth, "admin"))
    assert r.status_code == 200 and r.json()["halted"] is True
    r = client.post("/api/releases/driver-570/promote", json={"reason": "try to promote it"},
                    headers=as_(auth, "admin"))
    assert r.status_code == 409 and "halted" in r.text
    r = client.post("/api/releases/driver-570/resume", json={"reason": "fixed by a new image"},
                    headers=as_(auth, "admin"))
    assert r.status_code == 200 and r.json()["halted"] is False
    assert client.post("/api/releases/nope/halt", json={"reason": "no such release"},
                       headers=as_(auth, "admin")).status_code == 404
    acts = [(a["action"], a["actor"]) for a in ledger.audit_rows() if a["action"].startswith("release_")]
    assert ("release_halt", "admin-1") in acts and ("release_resume", "admin-1") in acts

    # a lease whose hosts are out is released only to repair (ops.release_lease's rules)
    hosts = list(cfg.domain("pod-a").hosts)
    op = "demo/run-9/pod-a"
    assert ledger.acquire_domain(op, train="demo", domain="pod-a", hosts=hosts, budget=budget_for(cfg)).granted
    ledger.open_operation(op, kind="train_stop", detail={}, actor="train:demo", action="open", reason="test")
    fleet.drain(hosts, op)
    r = client.post("/api/lease/release", json={"op": op, "reason": "run is gone, free it"}, headers=as_(auth, "admin"))
    assert r.status_code == 409 and "out of service" in r.text
    assert ledger.holdings(op)


def test_host_history_and_the_page(world, auth) -> None:
    _cfg, _fleet, ledger, client = world
    ledger.note(None, "probe", ["gpu-a01"], "looked at it", actor="admin-1")
    r = client.get("/api/hosts/gpu-a01", headers=as_(auth, "viewer"))
    assert r.status_code == 200 and r.json()["events"][-1]["reason"] == "looked at it"
    assert client.get("/api/hosts/nope", headers=as_(auth, "viewer")).status_code == 404
    page = client.get("/", headers=as_(auth, "viewer"))
    assert page.status_code == 200 and "<svg" in page.text and "Railyard" in page.text


class NoHistoryFleet:
    """A fleet that keeps no capacity history of its own (as the SSH and Slurm backends): no `samples`."""

    def __init__(self, engine: SimEngine) -> None:
        self._engine = engine

    def __getattr__(self, name: str):  # noqa: ANN204
        if name == "samples":
            raise AttributeError(name)
        return getattr(self._engine, name)


def test_capacity_over_time_comes_from_the_ledger_when_the_fleet_keeps_none(world, auth) -> None:
    cfg, fleet, ledger, _client = world
    client = client_of(cfg, NoHistoryFleet(fleet), ledger)
    ledger.sample_capacity(900.0, 12, 12, "demo/r1/pod-a")
    ledger.sample_capacity(950.0, 8, 12, "demo/r1/pod-a")  # after pod-a's drain
    ledger.sample_capacity(990.0, 12, 12, "demo/r1/pod-a")  # after its return
    cap = client.get("/api/capacity", headers=as_(auth, "viewer")).json()
    assert [(p["t"], p["serving"]) for p in cap["history"]] == [(900.0, 1.0), (950.0, 8 / 12), (990.0, 1.0),
                                                                 (fleet.now(), 1.0)]  # the last: the fleet now
    # a fleet that keeps its own history (the simulator) is charted from it, not from the ledger
    own = client_of(cfg, fleet, ledger).get("/api/capacity", headers=as_(auth, "viewer")).json()["history"]
    assert 900.0 not in [p["t"] for p in own]


def client_of(cfg, fleet, ledger) -> TestClient:  # noqa: ANN001
    return TestClient(ui_app.create_app(FixedSources(cfg, fleet, ledger)))


def test_controls_keep_to_allowed_users_cap_the_reason_and_audit_a_refusal_once(tmp_path, auth) -> None:
    data = small_config(domains=3, hosts_per_domain=4)
    data["emergency"] = {"allowed_users": ["admin-1"]}
    cfg = parse_config(data)
    ledger = Ledger(f"sqlite:///{tmp_path}/ledger.db")
    client = TestClient(ui_app.create_app(FixedSources(cfg, SimEngine(cfg, None, clock=Clock()), ledger)))
    # "user-1" may trigger DAGs in Airflow, but is not in emergency.allowed_users: refused as by the emergency DAG
    client.app.state.may_act = lambda user: True
    r = client.post("/api/freeze", json={"on": True, "reason": "user tries to freeze"}, headers=as_(auth, "user"))
    assert r.status_code == 403 and "emergency.allowed_users" in r.text, r.text
    assert ledger.switch("freeze") is None
    # a reason of a megabyte: refused by length, said in a short message, never stored
    huge = "x" * 1_000_000
    r = client.post("/api/freeze", json={"on": True, "reason": huge}, headers=as_(auth, "admin"))
    assert r.status_code == 422 and "at most 1000 characters" in r.text and len(r.text) < 1000, r.text[:300]
    assert ledger.switch("freeze") is None
    assert all(len(a["reason"]) < 1000 for a in ledger.audit_rows())
    # a script retrying a refused call: audited once, not once a call
    for _ in range(50):
        assert client.post("/api/freeze", json={"on": True, "reason": "user tries again"},
                           headers=as_(auth, "user")).status_code == 403
    refused = [a for a in ledger.audit_rows() if a["action"] == "ui_refused" and a["actor"] == "user-1"]
    assert len(refused) == 1, refused
    r = client.post("/api/freeze", json={"on": True, "reason": "admin freezes for the upgrade"},
                    headers=as_(auth, "admin"))
    assert r.status_code == 200 and ledger.switch("freeze") is not None


class PartFleet:
    """The simulator with some hosts missing from its answers (a fleet that lost track of them), and a
    record of the names each host read asked for."""

    def __init__(self, engine: SimEngine, missing: set[str]) -> None:
        self._engine, self.missing, self.reads = engine, missing, []

    def hosts(self, names=None):  # noqa: ANN001, ANN201
        self.reads.append(None if names is None else list(names))
        return [h for h in self._engine.hosts(names) if h.name not in self.missing]

    def __getattr__(self, name: str):  # noqa: ANN204
        return getattr(self._engine, name)


def test_the_map_counts_each_domain_s_hosts_per_state(world, auth) -> None:
    """The map is one row per domain: its hosts counted per state (those the fleet does not report as
    `unknown`), serving, held, out, and by whom; the counts agree with the fleet host by host."""
    cfg, fleet, ledger, _client = world
    op = "demo/manual__2026-01-01T00:00:00+00:00/pod-a"
    pod_a = list(cfg.domain("pod-a").hosts)
    assert ledger.acquire_domain(op, train="demo", domain="pod-a", hosts=pod_a, budget=budget_for(cfg)).granted
    fleet.drain(pod_a, op)
    fleet.fail("gpu-b03")
    fleet.offboard("gpu-c01", "nccl all_reduce busbw 120 GB/s below 300", "repair/gpu-c01")
    part = PartFleet(fleet, {"gpu-c04"})
    client = client_of(cfg, part, ledger)
    m = client.get("/api/map", headers=as_(auth, "viewer")).json()
    owner = cfg.host_domain()
    want: dict[str, Counter] = {d.name: Counter() for d in cfg.domains}
    for h in fleet.hosts():
        want[owner[h.name]][str(h.state) if h.name != "gpu-c04" else "unknown"] += 1
    rows = {d["name"]: d for d in m["domains"]}
    assert list(rows) == ["pod-a", "pod-b", "pod-c"]
    for name, counts in want.items():
        row = rows[name]
        assert row["states"] == dict(counts), name
        assert row["size"] == 4 and sum(row["states"].values()) == 4
        assert row["serving"] == counts["serving"]
    assert rows["pod-a"]["serving"] == 0 and rows["pod-a"]["out"] and rows["pod-a"]["held_by"] == op
    assert rows["pod-a"]["held"] == 4 and rows["pod-a"]["run"].startswith("/dags/railyard_train_demo/runs/")
    assert rows["pod-b"]["states"] == {"failed": 1, "serving": 3} and not rows["pod-b"]["out"]
    assert rows["pod-c"]["states"] == {"repair": 1, "serving": 2, "unknown": 1}
    assert rows["pod-c"]["held_by"] is None and not rows["pod-c"]["out"]
    assert m["total"] == 11 and sum(m["by_state"].values()) == 11 and m["by_state"]["serving"] == 5
    assert [h["name"] for h in m["offboarded"]] == ["gpu-b03", "gpu-c01"] and m["offboarded_total"] == 2
    assert "busbw 120" in m["offboarded"][1]["reason"]
    assert "hosts" not in rows["pod-a"]  # no host rows in the map: they come on demand
    # the overview's map is the same summary, from the same one read of the fleet
    part.reads.clear()
    body = client.get("/api/overview", headers=as_(auth, "viewer")).json()
    assert body["map"] == m and part.reads == [None]


def test_a_domain_s_hosts_come_on_demand_and_an_unknown_name_is_a_404(world, auth, monkeypatch) -> None:
    cfg, fleet, ledger, _client = world
    from railyard_airflow.ui import views

    monkeypatch.setattr(views, "HOSTS_PER_READ", 3)
    part = PartFleet(fleet, {"gpu-b02"})
    client = client_of(cfg, part, ledger)
    r = client.get("/api/domains/pod-b/hosts", headers=as_(auth, "viewer"))
    assert r.status_code == 200, r.text
    body = r.json()
    assert [h["name"] for h in body["hosts"]] == list(cfg.domain("pod-b").hosts)
    assert {h["name"]: h["state"] for h in body["hosts"]}["gpu-b02"] == "unknown"
    assert body["hosts"][0]["versions"] == {"gpu-driver": "550.127.08", "gpu-firmware": "96.00.89.00.01",
                                            "kernel": "6.1.0-25"}
    assert body["domain"] == "pod-b" and body["sku"] == "gpu" and body["out"] is False and body["held_by"] is None
    # only the domain's own hosts are read, at most HOSTS_PER_READ names a read
    assert part.reads == [["gpu-b01", "gpu-b02", "gpu-b03"], ["gpu-b04"]]
    for bad in ("pod-z", "gpu-a01", "pod-a;reboot", "x" * 5000):
        r = client.get(f"/api/domains/{bad}/hosts", headers=as_(auth, "viewer"))
        assert r.status_code == 404, bad
        detail = r.json()["detail"]
        assert detail.startswith("domain: unknown domain ") and bad[:20] in detail and len(detail) < 200, detail
    assert part.reads == [["gpu-b01", "gpu-b02", "gpu-b03"], ["gpu-b04"]]  # a refused name reads nothing


def _dump(path) -> list[str]:  # noqa: ANN001
    with sqlite3.connect(path) as db:
        return list(db.iterdump())


def test_reading_the_page_writes_nothing(world, auth, tmp_path) -> None:
    """Every read of the page, twice over: the ledger's database and the fleet are as they were."""
    cfg, fleet, ledger, client = world
    op = "demo/run-1/pod-a"
    assert ledger.acquire_domain(op, train="demo", domain="pod-a", hosts=list(cfg.domain("pod-a").hosts),
                                 budget=budget_for(cfg)).granted
    fleet.drain(list(cfg.domain("pod-a").hosts), op)
    ledger.sample_capacity(900.0, 8, 12, op)
    from railyard.operations import outside

    outside_op = outside.open_request(cfg, ledger, outside.parse_request(
        cfg, hosts=["gpu-c01"], kind="network", reason="replace the optics of c01"), actor="bob")
    before = _dump(tmp_path / "ledger.db"), [dataclasses.asdict(h) for h in fleet.hosts()], fleet.audit()
    for _ in range(2):
        for path in ("/", "/api/me", "/api/overview", "/api/map", "/api/capacity", "/api/buffers", "/api/trains",
                     "/api/releases", "/api/operations", "/api/hosts/gpu-a01", "/api/domains/pod-a/hosts",
                     "/api/domains/nope/hosts", "/api/hosts/nope", "/api/ops", f"/api/ops/{outside_op}"):
            assert client.get(path, headers=as_(auth, "viewer")).status_code in (200, 404), path
    after = _dump(tmp_path / "ledger.db"), [dataclasses.asdict(h) for h in fleet.hosts()], fleet.audit()
    assert after == before


def test_outside_work_and_run_reports_are_on_the_page(world, auth) -> None:
    """An outside operation shows among the active ones with its requester and phase; a run's report is listed
    with the path of its run in Airflow and served whole; one that is not there is a 404 naming it."""
    from railyard.operations import outside, runreport

    cfg, fleet, ledger, client = world
    req = outside.parse_request(cfg, hosts=["gpu-c01"], kind="hw-repair", reason="replace the NIC on c01")
    op = outside.open_request(cfg, ledger, req, actor="hwteam")
    assert ledger.acquire_domain("demo/run-1/pod-a", train="demo", domain="pod-a",
                                 hosts=list(cfg.domain("pod-a").hosts), budget=budget_for(cfg)).granted
    assert outside.advance(outside.stop_of(cfg, fleet, ledger, op))["phase"] == "queued"  # behind pod-a's stop
    ops = client.get("/api/operations", headers=as_(auth, "viewer")).json()["operations"]
    [mine] = [o for o in ops if o["id"] == op]
    assert mine["kind"] == "outside" and mine["requester"] == "hwteam" and mine["phase"] == "queued", mine
    assert mine["place"] == 1, mine
    assert client.get("/api/runs", headers=as_(auth, "viewer")).json() == []
    ledger.save_report(runreport.build(ledger, train="demo", run_id="manual__1", dag_id="railyard_train_demo",
                                       triggered_by="admin"))
    [row] = client.get("/api/runs", headers=as_(auth, "viewer")).json()
    assert row["run"] == "demo/manual__1" and row["grid"] == "/dags/railyard_train_demo/runs/manual__1", row
    whole = client.get("/api/runs/demo/manual__1", headers=as_(auth, "viewer")).json()
    assert whole["run"]["triggered_by"] == "admin" and whole["hosts"] == {}
    gone = client.get("/api/runs/demo/nope", headers=as_(auth, "viewer"))
    assert gone.status_code == 404 and "demo/nope" in gone.text
    assert client.get("/api/runs").status_code == 401


def test_outside_work_over_the_api_is_a_control_audited_with_the_user(world, auth) -> None:
    """POST /api/ops: refused to a viewer and for bad fields (by field and value, audited) before anything is
    requested; granted, it opens the request and triggers its run. GET lists it with its place; POST .../return
    records the return for that run, audited with the user; a second return is refused."""
    from railyard.operations import outside

    cfg, fleet, ledger, client = world
    sources = client.app.state.sources
    body = {"hosts": ["gpu-b01", "gpu-b02"], "kind": "network", "reason": "replace the optics of pod b"}
    assert client.post("/api/ops", json=body).status_code == 401
    r = client.post("/api/ops", json=body, headers=as_(auth, "viewer"))
    assert r.status_code == 403 and ledger.active_operations() == []
    bad = client.post("/api/ops", json=body | {"hosts": ["gpu-b01", "gpu-bO2"]}, headers=as_(auth, "admin"))
    assert bad.status_code == 422 and "hosts[1]: unknown host 'gpu-bO2' (did you mean 'gpu-b02'?)" in bad.text, bad.text
    assert [r["actor"] for r in ledger.audit_rows(action="ui_refused")] == ["viewer-1", "admin-1"]
    sources.outside_refusal = "the railyard_outside DAG is paused: unpause it to take requests"
    paused = client.post("/api/ops", json=body, headers=as_(auth, "admin"))
    assert paused.status_code == 409 and "paused" in paused.text and ledger.active_operations() == []
    sources.outside_refusal = None
    made = client.post("/api/ops", json=body, headers=as_(auth, "admin"))
    assert made.status_code == 201, made.text
    op = made.json()["op"]
    assert made.json()["run_id"] == "outside__" + op.split("/")[2] and sources.driven == [(op, "admin-1")]
    assert ledger.audit_rows(op, action="outside_request")[0]["actor"] == "admin-1"
    [listed] = client.get("/api/ops", headers=as_(auth, "viewer")).json()
    assert listed["op"] == op and listed["phase"] == "queued" and listed["requester"] == "admin-1", listed
    assert client.get(f"/api/ops/{op}", headers=as_(auth, "viewer")).json()["request"]["hosts"] == body["hosts"]
    assert client.get("/api/ops/outside/nope", headers=as_(auth, "viewer")).status_code == 404
    # the run (simulated here by its core calls) hands the hosts over; the requester returns them
    clock = fleet._clock

    def tick(s: float) -> None:
        clock.t += s

    stop = outside.stop_of(cfg, fleet, ledger, op, sleep=tick, clock=clock)
    assert outside.wait_handed(stop, say=lambda _m: None, poll_s=1)["phase"] == "handed"
    wrong = client.post(f"/api/ops/{op}/return", json={"to_repair": ["gpu-a01"], "reason": "done with the optics"},
                        headers=as_(auth, "admin"))
    assert wrong.status_code == 409 and "to_repair: not held by" in wrong.text and "'gpu-a01'" in wrong.text
    back = client.post(f"/api/ops/{op}/return", json={"to_repair": ["gpu-b02"], "reason": "b02's port is dead"},
                       headers=as_(auth, "user"))
    assert back.status_code == 202 and back.json()["return_asked"]["to_repair"] == ["gpu-b02"], back.text
    assert [r["actor"] for r in ledger.audit_rows(op, action="return_asked")] == ["user-1"]
    again = client.post(f"/api/ops/{op}/return", json={"reason": "done with the optics"}, headers=as_(auth, "admin"))
    assert again.status_code == 409 and "asked already" in again.text
    assert {h.name: h.state for h in fleet.hosts(body["hosts"])} == {"gpu-b01": HostState.DRAINED,
                                                                    "gpu-b02": HostState.DRAINED}  # the run returns


def test_a_request_whose_run_cannot_be_triggered_is_withdrawn(world, auth) -> None:
    cfg, fleet, ledger, client = world
    client.app.state.sources.trigger_error = RuntimeError("database is locked")
    r = client.post("/api/ops", json={"hosts": ["gpu-c01"], "kind": "hw-repair", "reason": "reseat c01's GPUs"},
                    headers=as_(auth, "admin"))
    assert r.status_code == 503 and "withdrawn" in r.text and "database is locked" not in r.text
    [op] = ledger.operations_like("outside/")
    assert op["state"] == "done" and ledger.holdings() == {}
