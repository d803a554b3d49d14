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
