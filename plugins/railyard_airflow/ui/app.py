"""The Railyard page's FastAPI app, mounted by `RailyardPlugin` under /railyard in Airflow's api-server.

Airflow serves a plugin's app without authentication, so every route here asks Airflow's auth manager
itself: `get_user` (the UI's `_token` cookie or a bearer token) for every read — anyone logged in may
read — and, for every control, the permission to create runs of the Railyard DAGs (what triggering
`railyard_emergency` takes). Controls need a reason of at least 10 characters; every control and every
refusal lands in the ledger's audit with the Airflow user.
"""

from __future__ import annotations

import hmac
import logging
import os
import threading
import time
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal

from airflow.api_fastapi.core_api.security import get_user
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse, JSONResponse, Response
from pydantic import BaseModel, Field

from railyard_airflow.ui import views

log = logging.getLogger("railyard.ui")
STATIC = Path(__file__).parent / "static"
OUTSIDE_DAG = "railyard_outside"  # drives requests made here (railyard_airflow.factory.build_outside_dag)
CONTROL_DAG = "railyard_emergency"  # acting on the fleet takes the right to trigger Railyard's DAGs
MIN_REASON = 10
MAX_REASON = 1000  # as the emergency form's free text (railyard.operations.emergency.MAX_TEXT)
REFUSAL_EVERY_S = 60.0


class Refusals:
    """Refused controls are audited at most once a minute per user and kind (a script retrying a refused
    call must not grow the audit without bound); the rest are counted in the next row."""

    def __init__(self) -> None:
        self._last: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()

    def first(self, user: str, kind: str) -> bool:
        now = time.monotonic()
        with self._lock:
            if now - self._last.get((user, kind), float("-inf")) < REFUSAL_EVERY_S:
                return False
            if len(self._last) > 10_000:  # never a leak either
                self._last.clear()
            self._last[(user, kind)] = now
            return True


class Sources:
    """Config, fleet and ledger of this process, built on first use (the api-server imports plugins early)."""

    @property
    def config(self) -> Any:
        from railyard_airflow.context import config

        return config()

    @property
    def ledger(self) -> Any:
        from railyard_airflow.context import ledger

        return ledger(self.config.ledger.url)

    @property
    def fleet(self) -> Any:
        return _fleet(self.config.fleet.connection)

    @property
    def runs(self) -> MetadataRuns:
        return MetadataRuns()

    def schedule(self) -> dict[str, dict[str, Any]]:
        """Per train DAG, from Airflow's metadata DB: paused or not, and when its next scheduled run is due
        (None for a DAG without a schedule, or not parsed yet)."""
        from airflow.models.dag import DagModel
        from airflow.utils.session import create_session
        from sqlalchemy import select

        from railyard.operations.reconcile import dag_id_for

        ids = [dag_id_for(t.id) for t in self.config.trains]
        with create_session() as session:
            rows = session.execute(select(DagModel.dag_id, DagModel.is_paused, DagModel.next_dagrun_create_after)
                                   .where(DagModel.dag_id.in_(ids))).all()
        return {d: {"paused": bool(paused), "next_run": at.isoformat() if at is not None else None}
                for d, paused, at in rows}


    def outside_dag(self) -> str | None:
        """Why the `railyard_outside` DAG cannot take a request now (not parsed, paused), or None."""
        from airflow.models.dag import DagModel
        from airflow.utils.session import create_session
        from sqlalchemy import select

        with create_session() as session:
            paused = session.scalar(select(DagModel.is_paused).where(DagModel.dag_id == OUTSIDE_DAG))
        if paused is None:
            return f"the {OUTSIDE_DAG} DAG is not in Airflow (a DAG file with railyard_dags() or outside_dags())"
        return f"the {OUTSIDE_DAG} DAG is paused: unpause it to take requests" if paused else None

    def drive_outside(self, op_id: str, user: str) -> str:
        """Trigger the run of `railyard_outside` that drives the request `op_id`; its run id."""
        from airflow.api.common.trigger_dag import trigger_dag
        from airflow.utils.types import DagRunTriggeredByType

        run_id = "outside__" + op_id.split("/")[2]
        trigger_dag(OUTSIDE_DAG, triggered_by=DagRunTriggeredByType.REST_API, triggering_user_name=user,
                    run_id=run_id, conf={"op": op_id})
        return run_id


class MetadataRuns:
    """RunOracle over Airflow's metadata DB, from inside the api-server: does a DAG exist, and a run's state."""

    def dag_known(self, dag_id: str) -> bool:
        from airflow.models.dag import DagModel
        from airflow.utils.session import create_session
        from sqlalchemy import select

        with create_session() as session:
            return session.scalar(select(DagModel.dag_id).where(DagModel.dag_id == dag_id)) is not None

    def run_state(self, dag_id: str, run_id: str) -> str | None:
        from airflow.models.dagrun import DagRun
        from airflow.utils.session import create_session
        from sqlalchemy import select

        from railyard.operations.reconcile import run_state_name

        with create_session() as session:
            state = session.scalar(select(DagRun.state).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id))
        return None if state is None else run_state_name(state)


@lru_cache(maxsize=2)
def _fleet(conn_id: str) -> Any:
    from railyard_airflow.hooks.fleet import FleetHook

    return FleetHook(conn_id).get_conn(read_only=True)  # a page view reaches no host


def scrape_token() -> str | None:
    """The metrics' scrape token: RAILYARD_METRICS_TOKEN, else the first line of RAILYARD_METRICS_TOKEN_FILE."""
    token = os.environ.get("RAILYARD_METRICS_TOKEN", "").strip()
    path = os.environ.get("RAILYARD_METRICS_TOKEN_FILE", "").strip()
    if not token and path:
        try:
            token = Path(path).read_text().strip().splitlines()[0].strip()
        except (OSError, IndexError):
            log.error("RAILYARD_METRICS_TOKEN_FILE: cannot read a token from %s", path)
            token = ""
    return token or None


async def scrape_allowed(request: Request) -> None:
    """The scrape token, else Airflow's own auth (a bearer JWT or the UI's cookie); else 401."""
    header = request.headers.get("authorization", "")
    scheme, _, credentials = header.partition(" ")
    token = scrape_token()
    if token and scheme.lower() == "bearer" and hmac.compare_digest(credentials.strip().encode(), token.encode()):
        return
    from airflow.api_fastapi.auth.managers.base_auth_manager import COOKIE_NAME_JWT_TOKEN
    from airflow.api_fastapi.core_api.security import resolve_user_from_token

    jwt = credentials.strip() if scheme.lower() == "bearer" else request.cookies.get(COOKIE_NAME_JWT_TOKEN)
    if not jwt:
        raise HTTPException(401, "metrics: a scrape token or an Airflow login is needed",
                            headers={"WWW-Authenticate": "Bearer"})
    await resolve_user_from_token(jwt)  # raises 401/403 for a token Airflow does not accept


def may_act(user: Any) -> bool:
    """Airflow's auth manager: may this user create runs of the Railyard DAGs?"""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails

    return bool(get_auth_manager().is_authorized_dag(method="POST", access_entity=DagAccessEntity.RUN,
                                                     details=DagDetails(id=CONTROL_DAG), user=user))


def user_name(user: Any) -> str:
    try:
        return str(user.get_name())
    except Exception:
        return str(getattr(user, "username", "unknown"))


User = Annotated[Any, Depends(get_user)]


def as_json(body: Any) -> JSONResponse:
    """A read's answer sent as it is: returned as a dict, FastAPI would first validate it and walk it through
    `jsonable_encoder` (the encoder alone: 45 ms for the overview at 76,800 hosts; `json.dumps`: 4 ms)."""
    return JSONResponse(body)


class Reason(BaseModel):
    reason: str = Field(default="", description=f"why (at least {MIN_REASON} characters)")


class FreezeBody(Reason):
    on: bool


class OutsideBody(Reason):
    hosts: list[str] = Field(default_factory=list, description="hosts of one domain")
    kind: str = Field(default="", description="hw-repair, network, or any token of lower-case letters")
    deadline_h: float | None = Field(default=None, description="escalated when not returned within this")


class ReturnBody(Reason):
    to_repair: list[str] = Field(default_factory=list, description="hosts that go to repair, not to the check")


class LeaseBody(Reason):
    op: str
    to_repair: bool = False


def _run_routes(app: FastAPI) -> None:
    """The runs' reports: the latest runs, and one run's report."""

    @app.get("/api/runs")
    def runs(request: Request, user: User) -> JSONResponse:
        """The latest runs of every train and of the emergency train, with their outcome (their reports)."""
        return as_json(views.runs(request.app.state.sources.ledger))

    @app.get("/api/runs/{key:path}")
    def run_report(request: Request, key: str, user: User) -> JSONResponse:
        """One run's report, by `train/run_id`; a run without one is a 404."""
        from railyard.operations.emergency import shown

        report = request.app.state.sources.ledger.report(key)
        if report is None:
            raise HTTPException(404, f"run: no report of the run {shown(key)}")
        return as_json(report)


def _outside_routes(app: FastAPI, control: Any) -> None:
    """Outside work over HTTP (railyard.operations.outside): list and read the requests; make one (the
    `railyard_outside` DAG drives it: grant, checkpoints, drain, handover); return its hosts. Making and returning
    are controls: authorised as the others, audited with the Airflow user, refusals included."""
    from railyard.operations import outside

    def refused(request: Request, name: str, what: str, code: int, message: str) -> HTTPException:
        """A request or return refused after the gate (bad fields, a paused DAG): audited as the gate's are."""
        if request.app.state.refusals.first(name, f"{what}:{code}"):
            request.app.state.sources.ledger.note(None, "ui_refused", [], f"{what}: {message[:400]} (HTTP {code})",
                                                  actor=name)
        return HTTPException(code, message)

    def status_or_404(ledger: Any, op: str) -> dict[str, Any]:
        try:
            return outside.status(ledger, op)
        except outside.OutsideError as exc:
            raise HTTPException(404, "; ".join(exc.problems)) from None

    @app.get("/api/ops")
    def ops(request: Request, user: User) -> JSONResponse:
        """Outside operations still active, each with its requester, phase, hosts, age and place in line."""
        led = request.app.state.sources.ledger
        return as_json([outside.status(led, o["id"]) | {"created_at": o["created_at"]}
                        for o in led.active_operations() if o["kind"] == outside.KIND_OF_OP])

    @app.get("/api/ops/{op:path}")
    def op_status(request: Request, op: str, user: User) -> JSONResponse:
        return as_json(status_or_404(request.app.state.sources.ledger, op))

    @app.post("/api/ops", status_code=201)
    def op_request(request: Request, body: OutsideBody, user: User) -> dict[str, Any]:
        s, name = control(request, user, f"op request {','.join(body.hosts)[:200]}", body.reason)
        try:
            req = outside.parse_request(s.config, hosts=body.hosts, kind=body.kind, reason=body.reason,
                                        deadline_h=body.deadline_h)
        except outside.OutsideError as exc:
            raise refused(request, name, "op request", 422, "; ".join(exc.problems)) from None
        why = s.outside_dag()
        if why is not None:
            raise refused(request, name, "op request", 409, f"op request: {why}; nothing was requested")
        op_id = outside.open_request(s.config, s.ledger, req, actor=name)
        try:
            run_id = s.drive_outside(op_id, name)
        except Exception as exc:  # no run drives it: it must not wait in the ledger for ever
            s.ledger.finish_operation(op_id, reason=f"withdrawn: {OUTSIDE_DAG} could not be triggered "
                                      f"({type(exc).__name__})", actor=name)
            log.exception("%s: could not trigger %s", op_id, OUTSIDE_DAG)
            raise HTTPException(503, f"op request: {OUTSIDE_DAG} could not be triggered ({type(exc).__name__}); "
                                     "the request was withdrawn") from None
        return outside.status(s.ledger, op_id) | {"dag_id": OUTSIDE_DAG, "run_id": run_id}

    @app.post("/api/ops/{op:path}/return", status_code=202)
    def op_return(request: Request, op: str, body: ReturnBody, user: User) -> dict[str, Any]:
        """The requester is done (or gives up while queued): its run checks the hosts and returns them."""
        s, name = control(request, user, f"op return {op[:200]}", body.reason)
        status_or_404(s.ledger, op)
        try:
            return outside.ask_return(s.ledger, op, to_repair=body.to_repair, reason=body.reason, actor=name)
        except outside.OutsideError as exc:
            raise refused(request, name, "op return", 409, "; ".join(exc.problems)) from None


def create_app(sources: Sources | None = None) -> FastAPI:
    app = FastAPI(title="Railyard", description="The fleet at a glance, and Railyard's controls",
                  docs_url=None, redoc_url=None, openapi_url=None)
    app.state.sources = sources or Sources()
    app.state.may_act = may_act

    from railyard.ledger import LedgerError

    @app.exception_handler(LedgerError)
    def _no_ledger(_request: Request, exc: LedgerError) -> JSONResponse:
        """A ledger URL Railyard refuses, or a database it cannot open: said in one line (no password), 503."""
        return JSONResponse(status_code=503, content={"detail": str(exc)})

    def src(request: Request) -> Sources:
        return request.app.state.sources  # type: ignore[no-any-return]

    refusals = app.state.refusals = Refusals()

    def control(request: Request, user: Any, what: str, reason: str) -> tuple[Sources, str]:
        """A control's gate: the user's right to act (Airflow's, and `emergency.allowed_users` as for the
        emergency DAG), then the reason. Refusals are audited, once a minute per user and kind at most."""
        s = src(request)
        name = user_name(user)

        def refuse(code: int, kind: str, note: str, message: str) -> HTTPException:
            if refusals.first(name, f"{kind}:{what.split()[0]}"):
                s.ledger.note(None, "ui_refused", [], f"{what}: {note} (HTTP {code})", actor=name)
            return HTTPException(code, message)

        if not request.app.state.may_act(user):
            raise refuse(403, "permission", f"{name} may not trigger Railyard DAGs: {reason.strip()[:200]}",
                         f"{name} may not act on Railyard: it takes the permission to trigger Railyard DAGs "
                         f"({CONTROL_DAG})")
        allowed = s.config.emergency.allowed_users
        if allowed is not None and name not in allowed:
            raise refuse(403, "allowed_users", f"{name} is not in emergency.allowed_users: {reason.strip()[:200]}",
                         f"{name} may not act on Railyard: not in emergency.allowed_users")
        from railyard.operations.emergency import shown

        text = reason.strip()
        if len(text) < MIN_REASON:
            raise refuse(422, "reason", "no reason",
                         f"reason: say why in at least {MIN_REASON} characters (value: {shown(reason)})")
        if len(text) > MAX_REASON:
            raise refuse(422, "reason", f"a reason of {len(text)} characters",
                         f"reason: at most {MAX_REASON} characters (value: {shown(reason)})")
        return s, name

    @app.get("/", include_in_schema=False)
    def page(user: User) -> FileResponse:
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-store"})

    @app.get("/metrics", include_in_schema=False)
    async def metrics(request: Request) -> Response:
        """Prometheus' scrape: the scrape token (RAILYARD_METRICS_TOKEN, or the file RAILYARD_METRICS_TOKEN_FILE
        names) as a bearer token, or any caller Airflow's auth manager knows; anyone else gets a 401."""
        await scrape_allowed(request)
        from railyard.operations.metrics import CONTENT_TYPE, render

        s = src(request)
        body = await run_in_threadpool(render, s.config, s.ledger)
        return Response(body, media_type=CONTENT_TYPE)

    @app.get("/api/me")
    def me(request: Request, user: User) -> dict[str, Any]:
        return {"user": user_name(user), "may_act": bool(request.app.state.may_act(user))}

    @app.get("/api/overview")
    def overview(request: Request, user: User) -> JSONResponse:
        s = src(request)
        return as_json(views.overview(s.config, s.fleet, s.ledger, s.schedule()) | {"user": user_name(user)})

    @app.get("/api/map")
    def fleet_map(request: Request, user: User) -> JSONResponse:
        s = src(request)
        return as_json(views.fleet_map(s.config, s.fleet.hosts(), s.ledger))

    @app.get("/api/capacity")
    def capacity(request: Request, user: User) -> JSONResponse:
        s = src(request)
        return as_json(views.capacity(s.config, s.fleet, s.fleet.hosts(), s.ledger))

    @app.get("/api/buffers")
    def buffers(request: Request, user: User) -> JSONResponse:
        s = src(request)
        return as_json(views.buffers(s.config, s.fleet.hosts(), s.ledger))

    @app.get("/api/trains")
    def trains(request: Request, user: User) -> JSONResponse:
        s = src(request)
        return as_json(views.trains(s.config, s.ledger, s.fleet.now(), s.schedule()))

    @app.get("/api/releases")
    def releases(request: Request, user: User) -> JSONResponse:
        s = src(request)
        return as_json(views.releases(s.config, s.ledger, s.fleet.hosts(), s.fleet.now()))

    @app.get("/api/operations")
    def operations(request: Request, user: User) -> dict[str, Any]:
        return views.operations(src(request).ledger)

    _run_routes(app)
    _outside_routes(app, control)

    @app.get("/api/domains/{domain}/hosts")
    def domain_hosts(request: Request, domain: str, user: User) -> JSONResponse:
        """One domain's hosts, for the map's domain opened on demand; a name not in the config is a 404."""
        from railyard.operations.emergency import shown

        s = src(request)
        if domain not in {d.name for d in s.config.domains}:
            raise HTTPException(404, f"domain: unknown domain {shown(domain)}")
        return as_json(views.domain_hosts(s.config, s.fleet, s.ledger, domain))

    @app.get("/api/hosts/{host}")
    def host(request: Request, host: str, user: User) -> dict[str, Any]:
        s = src(request)
        if host not in s.config.host_domain():
            raise HTTPException(404, f"host: unknown host {host!r}")
        return views.host_history(s.ledger, host)

    @app.post("/api/freeze")
    def freeze(request: Request, body: FreezeBody, user: User) -> dict[str, Any]:
        s, name = control(request, user, f"freeze {'on' if body.on else 'off'}", body.reason)
        s.ledger.set_switch("freeze", body.on, reason=f"{body.reason.strip()} (from the Railyard page)", actor=name)
        out: dict[str, Any] = views.operations(s.ledger)["freeze"]
        return out

    @app.post("/api/releases/{rid}/{action}")
    def release_action(request: Request, rid: str, action: Literal["promote", "halt", "resume"], body: Reason,
                       user: User) -> dict[str, Any]:
        from railyard.operations.releases import ReleaseError, Rollout

        s, name = control(request, user, f"release {action} {rid}", body.reason)
        if rid not in {r.id for r in s.config.releases}:
            raise HTTPException(404, f"release: unknown release {rid!r}")
        try:
            st = Rollout(s.config, s.ledger).act(action, rid, reason=body.reason.strip(), actor=name,
                                                 now=s.fleet.now())
        except ReleaseError as exc:
            raise HTTPException(409, str(exc)) from None
        return {"release": rid, "phase": st.phase, "halted": st.halted, "reason": st.reason}

    @app.post("/api/lease/release")
    def lease_release(request: Request, body: LeaseBody, user: User) -> dict[str, Any]:
        from railyard.operations.ops import ControlError, release_lease

        s, name = control(request, user, f"lease release {body.op}", body.reason)
        try:
            return release_lease(s.config, s.fleet, s.ledger, body.op, reason=body.reason.strip(), actor=name,
                                 to_repair=body.to_repair, runs=s.runs)
        except ControlError as exc:
            raise HTTPException(409, str(exc)) from None

    return app
