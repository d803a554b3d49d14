from __future__ import annotations

import base64
import json

from railyard_airflow.audit import classify, user_of


def token(sub: str) -> bytes:
    body = base64.urlsafe_b64encode(json.dumps({"sub": sub}).encode()).rstrip(b"=").decode()
    return f"Bearer xx.{body}.yy".encode()


def test_classify_railyard_actions_only():
    assert classify("POST", "/api/v2/dags/railyard_emergency/dagRuns") == ("api_trigger", {"dag": "railyard_emergency"})
    assert classify("PATCH", "/api/v2/dags/railyard_train_demo/dagRuns/r1/taskInstances/pod-a.health_check")[0] == \
        "api_set_task_state"
    assert classify("POST", "/api/v2/dags/railyard_train_demo/clearTaskInstances")[0] == "api_clear"
    assert classify("POST", "/api/v2/dags/other_dag/dagRuns") is None
    assert classify("GET", "/api/v2/dags/railyard_emergency/dagRuns") is None


def test_user_from_bearer_or_cookie():
    assert user_of({b"authorization": token("viewer")}) == "viewer"
    cookie = b"a=b; _token=" + token("alice")[7:]
    assert user_of({b"cookie": cookie}) == "alice"
    assert user_of({}) == "anonymous"


def test_every_call_that_changes_a_railyard_dag_is_classified():
    d = "/api/v2/dags/railyard_train_demo"
    cases = {
        ("PATCH", f"{d}/dagRuns/r1/taskGroupInstances/pod-a"): ("api_set_group_state", {"run": "r1", "group": "pod-a"}),
        ("PATCH", f"{d}/dagRuns/r1/taskInstances"): ("api_set_task_state", {"run": "r1"}),  # bulk
        ("PATCH", f"{d}/dagRuns/r1/taskInstances/pod-a.upgrade/-1"): (
            "api_set_task_state", {"run": "r1", "task": "pod-a.upgrade", "map_index": "-1"}),
        ("DELETE", f"{d}/dagRuns/r1"): ("api_delete_run", {"run": "r1"}),
        ("DELETE", f"{d}/dagRuns/r1/taskInstances/pod-a.upgrade"): ("api_delete_task_instance",
                                                                   {"run": "r1", "task": "pod-a.upgrade"}),
        ("POST", f"{d}/clearDagRuns"): ("api_clear", {}),
        ("POST", f"{d}/dagRuns/r1/clear"): ("api_clear", {"run": "r1"}),
        ("PATCH", d): ("api_patch_dag", {}),
        ("DELETE", d): ("api_delete_dag", {}),
        ("PATCH", "/api/v2/dags"): ("api_patch_dags", {}),
        ("POST", "/api/v2/backfills"): ("api_backfill", {}),
        ("PUT", "/api/v2/backfills/7/cancel"): ("api_backfill", {"backfill": "7/cancel"}),
        ("POST", f"{d}/dagRuns/r1/newThing"): ("api_change", {"call": "POST /dagRuns/r1/newThing"}),
    }
    for (method, path), (action, where) in cases.items():
        got = classify(method, path)
        assert got is not None and got[0] == action, (method, path, got)
        assert got[1] == ({"dag": "railyard_train_demo"} | where if action not in (
            "api_patch_dags", "api_backfill") else where), (method, path, got)
    # the `~` wildcard reaches Railyard's runs too; a base_url prefix changes nothing
    assert classify("PATCH", "/api/v2/dags/~/dagRuns/~/taskInstances")[1]["dag"] == "~"
    assert classify("POST", "/airflow/api/v2/dags/railyard_emergency/dagRuns")[0] == "api_trigger"
    # reads, read-only POSTs and other DAGs are not recorded
    assert classify("POST", f"{d}/dagRuns/list") is None
    assert classify("POST", "/api/v2/dags/~/dagRuns/list") is None
    assert classify("PATCH", f"{d}/dagRuns/r1/taskGroupInstances/pod-a/dry_run") is None
    assert classify("DELETE", "/api/v2/dags/other/dagRuns/r1") is None
    assert classify("GET", f"{d}/dagRuns/r1") is None


def test_a_token_whose_payload_is_not_an_object_names_no_user_and_raises_nothing():
    for payload in (b"[1, 2]", b"42", b'"alice"', b"null"):
        body = base64.urlsafe_b64encode(payload).rstrip(b"=").decode()
        assert user_of({b"authorization": f"Bearer xx.{body}.yy".encode()}) == "unknown"
    assert user_of({b"authorization": b"Bearer not-a-jwt"}) == "anonymous"


def test_the_middleware_passes_the_body_through_and_records_backfills_of_railyard_dags(monkeypatch):
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route
    from starlette.testclient import TestClient

    import railyard_airflow.audit as audit

    rows: list[tuple] = []
    monkeypatch.setattr(audit, "record", lambda *a: rows.append(a))

    async def echo(request: Request) -> JSONResponse:
        return JSONResponse(await request.json(), status_code=201)

    app = Starlette(routes=[Route("/api/v2/backfills", echo, methods=["POST"])])
    client = TestClient(audit.AuditMiddleware(app))
    body = {"dag_id": "railyard_train_demo", "from_date": "2026-01-01T00:00:00Z", "to_date": "2026-01-02T00:00:00Z"}
    r = client.post("/api/v2/backfills", json=body, headers={"Authorization": token("alice").decode()})
    assert r.status_code == 201 and r.json() == body  # the body reached the app unchanged
    assert rows == [("api_backfill", "alice", 201, {"dag": "railyard_train_demo"})]
    client.post("/api/v2/backfills", json={**body, "dag_id": "other"})
    assert len(rows) == 1  # another DAG's backfill is not Railyard's business
