"""Every trigger, clear and state change that a person makes on a Railyard DAG through Airflow's API
(the UI uses the same API) lands in the ledger's audit with the user and Airflow's answer, refused
attempts (403) included. A root middleware of the api-server, installed by `RailyardPlugin`."""

from __future__ import annotations

import base64
import json
import logging
import re
from functools import lru_cache

import anyio
from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("railyard.audit")

ACTIONS = [
    (re.compile(r"^/api/v2/dags/(?P<dag>railyard_[\w-]+)/dagRuns$"), "POST", "api_trigger"),
    (re.compile(r"^/api/v2/dags/(?P<dag>railyard_[\w-]+)/clearTaskInstances$"), "POST", "api_clear"),
    (re.compile(r"^/api/v2/dags/(?P<dag>railyard_[\w-]+)/dagRuns/(?P<run>[^/]+)/clear$"), "POST", "api_clear"),
    (re.compile(r"^/api/v2/dags/(?P<dag>railyard_[\w-]+)/dagRuns/(?P<run>[^/]+)/taskInstances/(?P<task>[^/]+)"),
     "PATCH", "api_set_task_state"),
    (re.compile(r"^/api/v2/dags/(?P<dag>railyard_[\w-]+)/dagRuns/(?P<run>[^/]+)$"), "PATCH", "api_set_run_state"),
]


def classify(method: str, path: str) -> tuple[str, dict[str, str]] | None:
    for rx, m, action in ACTIONS:
        hit = rx.match(path)
        if hit and method == m:
            return action, hit.groupdict()
    return None


def user_of(headers: dict[bytes, bytes]) -> str:
    """The user named in the bearer token or the UI's cookie. For the record only: Airflow checks it."""
    token = ""
    auth = headers.get(b"authorization", b"").decode()
    if auth.lower().startswith("bearer "):
        token = auth[7:]
    else:
        m = re.search(r"(?:^|;\s*)_token=([^;]+)", headers.get(b"cookie", b"").decode())
        token = m.group(1) if m else ""
    try:
        payload = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        return str(claims.get("sub") or claims.get("username") or "unknown")
    except (IndexError, ValueError):
        return "anonymous"


@lru_cache(maxsize=1)
def _ledger():
    from railyard.config import load_config
    from railyard.ledger import Ledger

    return Ledger(load_config().ledger.url)


def record(action: str, user: str, status: int, where: dict[str, str]) -> None:
    try:
        what = " ".join(f"{k}={v}" for k, v in where.items())
        verdict = "refused" if status in (401, 403) else ("done" if status < 400 else "failed")
        _ledger().note(None, action, [], f"{what} -> HTTP {status} ({verdict})", actor=user)
    except Exception as exc:  # auditing must never break the API
        log.warning("could not audit %s by %s: %s", action, user, exc)


class AuditMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        hit = classify(scope.get("method", ""), scope.get("path", "")) if scope["type"] == "http" else None
        if hit is None:
            await self.app(scope, receive, send)
            return
        status = {"code": 500}

        async def send_wrapper(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            user = user_of(dict(scope.get("headers") or []))
            await anyio.to_thread.run_sync(record, hit[0], user, status["code"], hit[1])
