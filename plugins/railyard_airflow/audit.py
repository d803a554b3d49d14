"""Every call that changes a Railyard DAG, its runs or its task instances through Airflow's API (the UI
uses the same API) lands in the ledger's audit with the user and Airflow's answer, refused attempts
(403) included: triggers, clears, task, task group and run state changes, deletions, pauses,
backfills, wildcard (`~`) calls, under any `base_url` prefix. A root middleware of the api-server,
installed by `RailyardPlugin`."""

from __future__ import annotations

import base64
import json
import logging
import re
from functools import lru_cache
from typing import TYPE_CHECKING

import anyio
from starlette.types import ASGIApp, Message, Receive, Scope, Send

if TYPE_CHECKING:
    from railyard.ledger import Ledger

log = logging.getLogger("railyard.audit")

# Every call that changes a Railyard DAG, its runs or its task instances: any POST, PATCH, PUT or DELETE under
# /api/v2/dags/<a railyard_ DAG, or the `~` wildcard>, but the API's read-only POSTs (lists, dry runs); a bulk
# PATCH of DAGs (pause by pattern); and backfills (their body names the DAG, or their id does not).
_WRITE = frozenset({"POST", "PATCH", "PUT", "DELETE"})
_READ_ONLY = re.compile(r"/(list|dry_run)$")
_UNDER_DAG = re.compile(r"^/dags/(?P<dag>railyard_[\w-]+|~)(?P<rest>/.*)?$")
_NAMED = [  # (method, the path below /dags/<dag>, action); the first that matches names the action
    ("POST", re.compile(r"^/dagRuns$"), "api_trigger"),
    ("POST", re.compile(r"^/(clearTaskInstances|clearDagRuns|clearPartitions|dagRuns/(?P<run>[^/]+)/clear)$"),
     "api_clear"),
    ("PATCH", re.compile(r"^/dagRuns/(?P<run>[^/]+)/taskGroupInstances/(?P<group>[^/]+)$"), "api_set_group_state"),
    ("PATCH", re.compile(r"^/dagRuns/(?P<run>[^/]+)/taskInstances(/(?P<task>[^/]+))?(/(?P<map_index>[^/]+))?$"),
     "api_set_task_state"),
    ("DELETE", re.compile(r"^/dagRuns/(?P<run>[^/]+)/taskInstances/(?P<task>[^/]+)$"), "api_delete_task_instance"),
    ("PATCH", re.compile(r"^/dagRuns/(?P<run>[^/]+)$"), "api_set_run_state"),
    ("DELETE", re.compile(r"^/dagRuns/(?P<run>[^/]+)$"), "api_delete_run"),
    ("PATCH", re.compile(r"^$"), "api_patch_dag"),
    ("DELETE", re.compile(r"^$"), "api_delete_dag"),
]


def api_path(path: str) -> str | None:
    """The path below /api/v2 (whatever prefix a `base_url` puts in front of it), or None."""
    at = path.find("/api/v2/")
    return path[at + len("/api/v2"):] if at >= 0 else None


def classify(method: str, path: str) -> tuple[str, dict[str, str]] | None:
    """(action, what it names) for a call that changes Railyard's DAGs, runs or tasks; None for any other."""
    sub = api_path(path)
    if sub is None or method not in _WRITE or _READ_ONLY.search(sub):
        return None
    if sub.startswith("/backfills"):  # its DAG is in the body (POST) or behind its id (PUT)
        rest = sub[len("/backfills"):].strip("/")
        return "api_backfill", ({"backfill": rest} if rest else {})
    if sub == "/dags" and method == "PATCH":  # a bulk pause or unpause, by pattern
        return "api_patch_dags", {}
    hit = _UNDER_DAG.match(sub)
    if hit is None:
        return None
    where = {"dag": hit["dag"]}
    rest = hit["rest"] or ""
    for m, rx, action in _NAMED:
        got = rx.match(rest)
        if got and method == m:
            return action, where | {k: v for k, v in got.groupdict().items() if v is not None}
    return "api_change", where | {"call": f"{method} {rest}"}


def wanted(action: str, body: bytes) -> bool:
    """Whether a call is Railyard's: a backfill or bulk pause is, when its body or query can reach a
    railyard_ DAG; everything `classify` found under a Railyard DAG is."""
    if action != "api_backfill":
        return True
    try:
        doc = json.loads(body or b"{}")
    except ValueError:
        return True  # unreadable: recorded rather than missed
    dag = doc.get("dag_id") if isinstance(doc, dict) else None
    return dag is None or str(dag).startswith("railyard_")


def user_of(headers: dict[bytes, bytes]) -> str:
    """The user named in the bearer token or the UI's cookie. For the record only: Airflow checks it."""
    token = ""
    auth = headers.get(b"authorization", b"").decode(errors="replace")
    if auth.lower().startswith("bearer "):
        token = auth[7:]
    else:
        m = re.search(r"(?:^|;\s*)_token=([^;]+)", headers.get(b"cookie", b"").decode(errors="replace"))
        token = m.group(1) if m else ""
    try:
        payload = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (IndexError, ValueError):
        return "anonymous"
    if not isinstance(claims, dict):  # a token whose payload is a list, a number...: not a user we can name
        return "unknown"
    return str(claims.get("sub") or claims.get("username") or "unknown")[:255]


@lru_cache(maxsize=1)
def _ledger() -> Ledger:
    from railyard.domain.config import load_config
    from railyard.ledger import Ledger

    return Ledger(load_config().ledger.url)


def record(action: str, user: str, status: int, where: dict[str, str]) -> None:
    try:
        what = " ".join(f"{k}={v}" for k, v in where.items())[:500]
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
        body = bytearray()

        async def receive_wrapper() -> Message:  # the body passes through as it is; a copy is kept (64 KiB)
            message = await receive()
            if message["type"] == "http.request" and len(body) < 65536:
                body.extend(message.get("body", b"")[: 65536 - len(body)])
            return message

        async def send_wrapper(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive_wrapper, send_wrapper)
        finally:
            try:
                user = user_of(dict(scope.get("headers") or []))
                action, where = hit
                if wanted(action, bytes(body)):
                    if action == "api_backfill" and "dag" not in where:
                        where = where | _dag_of(bytes(body))
                    await anyio.to_thread.run_sync(record, action, user, status["code"], where)
            except Exception as exc:  # auditing must never break the API
                log.warning("could not audit %s: %s", hit[0], exc)


def _dag_of(body: bytes) -> dict[str, str]:
    try:
        doc = json.loads(body or b"{}")
    except ValueError:
        return {}
    return {"dag": str(doc["dag_id"])[:255]} if isinstance(doc, dict) and doc.get("dag_id") else {}
