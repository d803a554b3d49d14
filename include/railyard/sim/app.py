"""The fleet simulator as an HTTP service: a thin FastAPI layer over `SimEngine`.

Every input is validated before the engine sees it (host names, components and versions are plain
tokens); the engine's refusals come back as 409, unknown hosts or jobs as 404, bad bodies as 422.

With a token (`serve(token=...)`, `--token-file`, or env RAILYARD_FLEET_TOKEN / RAILYARD_FLEET_TOKEN_FILE)
every path except `GET /healthz` (liveness: `ok` and the fleet clock, nothing else) needs
`Authorization: Bearer <token>`, or gets 401: the fleet API, the admin and fault-injection endpoints
(`/v1/settings`, `/v1/hosts/{host}/fail`, ...), the audit and the OpenAPI docs alike. Without a token the
simulator is open, as a local test bench is. With `tls_cert`/`tls_key` it serves HTTPS, and with
`tls_client_ca` it also requires a client certificate signed by that CA.
"""

from __future__ import annotations

import gc
import logging
import os
import secrets
import signal
import ssl
import threading
import time
from pathlib import Path as FilePath
from types import FrameType
from typing import Annotated, Any

import uvicorn
from fastapi import APIRouter, FastAPI, HTTPException, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, with_config
from starlette.concurrency import run_in_threadpool
from typing_extensions import TypedDict

from railyard.domain.config import RailyardConfig
from railyard.domain.models import TOKEN_RE, Capacity, CheckResult, FleetToken, Host, Job, Step, check_token
from railyard.fleet import FleetNotFound, gcpause
from railyard.fleet.http import CHANGES_HEADER, CURSOR_HEADER
from railyard.fleet.port import FleetError
from railyard.sim.engine import SimEngine

log = logging.getLogger("railyard.sim")

OpId = Annotated[
    str,
    StringConstraints(min_length=1, max_length=250, pattern=r"^[^\x00-\x1f\x7f]+$"),
    Field(description="id of the operation that owns the change (a train stop, an emergency, a repair)"),
]
OPEN_PATHS = frozenset({"/healthz"})  # what a load balancer or compose healthcheck may call without the token
TOKEN_ENV = "RAILYARD_FLEET_TOKEN"
TOKEN_FILE_ENV = "RAILYARD_FLEET_TOKEN_FILE"

HostName = Annotated[str, Path(pattern=TOKEN_RE.pattern, description="host name (a plain token)")]
Cursor = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._-]+$")]


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Now(Body):
    now: float = Field(description="fleet clock, seconds")


class Count(Body):
    hosts: int = Field(description="hosts the call started (or found already started)")


class Health(Body):
    ok: bool
    now: float


class CheckpointRequest(Body):
    jobs: list[FleetToken] = Field(description="job ids to checkpoint now")


class CheckpointAck(Body):
    requested_at: float = Field(description="fleet time of the request; a job is fresh once last_checkpoint >= it")


class HostsRequest(Body):
    hosts: list[FleetToken] = Field(min_length=1, description="host names")
    op: OpId


class UpgradeRequest(Body):
    steps: list[Step] = Field(min_length=1, description="components to bring to versions, in order")
    op: OpId


class CheckRequest(Body):
    expected: dict[FleetToken, FleetToken] = Field(description="component -> version the host must run")
    op: OpId


@with_config(ConfigDict(extra="forbid", title="Step"))
class StepBody(TypedDict):
    """`Step` as a bulk body carries it: a domain's upgrade is thousands of steps, checked inside pydantic-core
    without a model built for each (the engine makes one `Step` per distinct pair)."""

    component: FleetToken
    version: FleetToken


class UpgradesRequest(Body):
    hosts: dict[FleetToken, list[StepBody]] = Field(
        min_length=1, description="host -> components to bring to versions, in order (a domain's hosts in one call)")
    op: OpId


class ChecksRequest(Body):
    hosts: dict[FleetToken, dict[FleetToken, FleetToken]] = Field(
        min_length=1, description="host -> component -> version it must run (a domain's hosts in one call)")
    op: OpId


class NamesQuery(Body):
    names: list[FleetToken] = Field(description="host names (a domain's may be thousands: too many for a URL)")


class HostsQuery(NamesQuery):
    since: Cursor | None = Field(default=None, description="a cursor an earlier read answered "
                                 f"(header {CURSOR_HEADER}): only the hosts changed since then")


class ChecksQuery(Body):
    hosts: list[FleetToken] = Field(description="host names")
    op: OpId
    since: Cursor | None = Field(default=None, description="a cursor an earlier read answered "
                                 f"(header {CURSOR_HEADER}): only the checks changed since then")


class JobPatch(Body):
    dodge_until: float | None = None
    clear_dodge: bool = False
    stuck: bool | None = None


class HandoverRequest(Body):
    hosts: list[str]
    from_op: str
    to_op: str


class OffboardRequest(Body):
    reason: str = Field(min_length=1, max_length=1000, description="why the host goes to repair")
    op: OpId


class SettingsPatch(Body):
    host_failure_per_hour: float | None = Field(default=None, ge=0,
                                                description="random failures per serving host per fleet hour")
    upgrade_fail_rate: float | None = Field(default=None, ge=0, le=1, description="probability an upgrade fails")
    check_fail_rate: float | None = Field(default=None, ge=0, le=1, description="probability a deep check fails")


class Rates(Body):
    host_failure_per_hour: float
    upgrade_fail_rate: float
    check_fail_rate: float


class Interruption(Body):
    job: str
    at: float
    host: str
    reason: str
    lost_s: float = Field(description="fleet seconds of work lost (since the job's last checkpoint)")
    lost_gpu_hours: float


class ReturnRecord(Body):
    host: str
    op: str
    at: float
    verified: bool = Field(description="a passed check for (host, op) at the host's versions existed")
    versions: dict[str, str]


class InstallCount(Body):
    host: str
    component: str
    version: str
    count: int = Field(description="installs started; more than 1 means the same install ran twice")


class StopRecord(Body):
    op: str
    domain: str
    drain_s: float
    upgrade_s: float
    check_s: float
    return_s: float
    work_s: float = Field(description="sum of the phases: the floor set by the work itself (fleet seconds)")
    started_at: float | None
    ended_at: float | None
    complete: bool


class Sample(Body):
    t: float
    serving: int
    by_state: dict[str, int]
    domains_out: list[str]


class AuditReport(Body):
    now: float
    speed: float
    total_hosts: int
    max_domains_out: int
    min_serving_fraction: float
    interruptions: list[Interruption]
    lost_gpu_hours: float
    max_lost_s: float
    returns: list[ReturnRecord]
    unverified_returns: list[str]
    refusals: list[dict[str, Any]] = Field(
        default_factory=list, description="calls refused because the host was in another state or held by another op"
    )
    installs: list[InstallCount]
    stops: list[StopRecord]
    work_seconds: float = Field(description="sum of the stops' work_s in real seconds (divided by speed)")
    placements: list[dict[str, Any]] = Field(
        default_factory=list, description="when each job was placed on hosts (since this process started)"
    )


def _names(raw: str | None, what: str) -> list[str] | None:
    """`a,b` -> ["a", "b"], each checked as a token; absent -> None (all)."""
    if raw is None:
        return None
    names = [n for n in raw.split(",") if n]
    for n in names:
        try:
            check_token(n)
        except ValueError as exc:
            raise HTTPException(status_code=422, detail=f"{what}: {exc}") from None
    return names


def resolve_token(token: str | None = None, token_file: str | os.PathLike[str] | None = None) -> str | None:
    """The simulator's API token: `token`, else the first line of `token_file`, else env
    RAILYARD_FLEET_TOKEN, else the file named by RAILYARD_FLEET_TOKEN_FILE; None = no authentication.
    An empty token file is an error, never a silently open API."""
    if token is None and token_file is None:
        token = os.environ.get(TOKEN_ENV) or None
        token_file = None if token else (os.environ.get(TOKEN_FILE_ENV) or None)
    if token is None and token_file is not None:
        try:
            lines = FilePath(token_file).read_text().strip().splitlines()
        except OSError as exc:
            raise ValueError(f"token file {token_file}: cannot read it "
                             f"({exc.strerror or type(exc).__name__})") from None
        token = lines[0].strip() if lines else ""
        if not token:
            raise ValueError(f"token file {token_file} is empty")
    if token is not None and (not token.strip() or any(c.isspace() for c in token)):
        raise ValueError("the fleet token must be one word with no spaces")
    return token


def _host_changes(engine: SimEngine, names: list[str] | None, since: str | None, out: bool = False) -> Response:
    """The hosts asked for, with this read's cursor; with `since` (an earlier cursor of this simulator), only
    those that changed since, which the CHANGES_HEADER says. `out`: see `SimEngine.host_changes`."""
    cursor, content, delta = engine.host_changes(names, since, out)
    headers = {CURSOR_HEADER: cursor} | ({CHANGES_HEADER: since} if delta and since else {})
    return Response(content=content, media_type="application/json", headers=headers)


class _BulkRoute(APIRoute):
    """A route whose one argument is its JSON body, validated from the bytes in one pass by pydantic-core, where
    FastAPI decodes the body to Python objects first and validates those after: a domain's upgrades, 3,840 hosts'
    steps in 622 KB, take 7-8 ms that way and 5 ms this way (in isolation; FastAPI's two passes took 9-21 ms
    inside a running simulator). The schema, the 422 answer (each error at ("body", ...)) and the OpenAPI
    document stay FastAPI's own."""

    def get_route_handler(self) -> Any:
        assert self.body_field is not None, f"{self.path}: a bulk route takes its JSON body"
        model = self.body_field.field_info.annotation
        assert isinstance(model, type) and issubclass(model, BaseModel), f"{self.path}: a bulk body is a model"
        endpoint = self.endpoint

        async def handler(request: Request) -> Response:
            raw = await request.body()
            try:
                body = model.model_validate_json(raw)
            except ValidationError as exc:
                # as FastAPI words them; a body that is not JSON is not echoed back (a domain's is 600 KB)
                errors = [{**e, "loc": ("body", *e["loc"])} | ({"input": {}} if e["type"] == "json_invalid" else {})
                          for e in exc.errors(include_url=False)]
                raise RequestValidationError(errors, body=raw) from None
            return await run_in_threadpool(endpoint, body)

        return handler


def _bulk(engine: SimEngine) -> APIRouter:
    """A domain's work in one request: reads by names in the body (a URL holds far fewer than a domain's
    thousands), the drain and the return of many hosts, and their upgrades and checks. Each answers a `Response`
    (`_BulkRoute`)."""
    v1 = APIRouter(route_class=_BulkRoute)

    @v1.post("/hosts/query", response_model=list[Host], summary="Hosts by name, the names in the body")
    def hosts_query(body: HostsQuery) -> Response:
        return _host_changes(engine, body.names, body.since)

    @v1.post("/jobs/query", response_model=list[Job], summary="Jobs running on any of the hosts in the body")
    def jobs_query(body: NamesQuery) -> Response:
        return Response(content=engine.jobs_json(body.names), media_type="application/json")

    @v1.post("/checks/query", response_model=list[CheckResult], summary="Latest check per host for an operation")
    def checks_query(body: ChecksQuery) -> Response:
        cursor, content, delta = engine.check_changes(body.hosts, body.op, body.since)
        headers = {CURSOR_HEADER: cursor} | ({CHANGES_HEADER: body.since} if delta and body.since else {})
        return Response(content=content, media_type="application/json", headers=headers)

    @v1.post("/hosts/drain", response_model=list[Host], summary="Drain hosts (jobs on them are interrupted)")
    def drain(body: HostsRequest) -> Response:
        engine.drain(body.hosts, body.op)
        # the engine's JSON, not a model per host: a domain of thousands answers in milliseconds
        return Response(content=engine.hosts_json(body.hosts), media_type="application/json")

    @v1.post("/hosts/upgrade", response_model=Count, summary="Start the upgrades of many drained hosts")
    def upgrade_hosts(body: UpgradesRequest) -> Response:
        engine.upgrade_hosts(body.hosts, body.op)
        return JSONResponse({"hosts": len(body.hosts)})

    @v1.post("/hosts/check", response_model=Count, summary="Start the deep health checks of many drained hosts")
    def check_hosts(body: ChecksRequest) -> Response:
        engine.start_checks(body.hosts, body.op)
        return JSONResponse({"hosts": len(body.hosts)})

    @v1.post("/hosts/return", response_model=list[Host], summary="Return drained hosts to service")
    def return_(body: HostsRequest) -> Response:
        engine.return_to_service(body.hosts, body.op)
        return Response(content=engine.hosts_json(body.hosts), media_type="application/json")

    return v1


def create_app(engine: SimEngine, token: str | None = None) -> FastAPI:
    """The simulator's API over `engine`; with `token`, every path but /healthz needs it (bearer)."""
    app = FastAPI(
        title="Railyard fleet simulator",
        version="1",
        description=(
            "A simulated GPU fleet on an accelerated clock: hosts in maintenance domains, training jobs "
            "that checkpoint, drains, upgrades, deep health checks, returns, random failures, and an audit "
            "of capacity over time. Every call is idempotent and returns at once; long work is observed by "
            "polling `/v1/hosts` and `/v1/checks`."
        ),
    )

    if token:
        expected = f"Bearer {token}".encode()

        @app.middleware("http")
        async def _authenticate(request: Request, call_next: Any) -> Any:
            if request.url.path not in OPEN_PATHS:
                given = request.headers.get("authorization", "").encode()
                if not secrets.compare_digest(given, expected):
                    # never echo what was sent: a wrong token is often a real one for something else
                    why = "a bearer token is required" if not given else "the credentials were refused"
                    return JSONResponse(status_code=401, content={"detail": f"unauthorized: {why}"},
                                        headers={"WWW-Authenticate": 'Bearer realm="railyard-fleet"'})
            return await call_next(request)

    @app.exception_handler(FleetNotFound)
    def _not_found(_: Request, exc: FleetNotFound) -> JSONResponse:
        return JSONResponse(status_code=404, content={"detail": str(exc)})

    @app.exception_handler(FleetError)
    def _refused(_: Request, exc: FleetError) -> JSONResponse:
        return JSONResponse(status_code=409, content={"detail": str(exc)})

    @app.get("/healthz", response_model=Health, summary="Liveness")
    def healthz() -> Any:
        return {"ok": True, "now": engine.now()}

    v1 = APIRouter(prefix="/v1")

    @v1.get("/now", response_model=Now, summary="The fleet clock")
    def now() -> Any:
        return {"now": engine.now()}

    @v1.get("/hosts", response_model=list[Host], summary="Hosts, all or by name")
    def hosts(
        names: Annotated[str | None, Query(description="comma-separated host names; all when absent")] = None,
        since: Annotated[Cursor | None, Query(description=f"a cursor an earlier read answered (header "
                                                          f"{CURSOR_HEADER}): only the hosts changed since")] = None,
        out: Annotated[bool, Query(description="without `names`: only the hosts not serving, the ones that count "
                                               "against capacity; with `since`, still every host changed since, "
                                               "whatever its state")] = False,
    ) -> Any:
        # the engine's own JSON (each host's built once per change of it), not a model per host per call:
        # a fleet of 76,800 hosts answers in milliseconds instead of seconds
        if out and names is not None:
            raise HTTPException(status_code=422, detail="out= reads the whole fleet's hosts out of service; "
                                                        "it takes no names")
        return _host_changes(engine, _names(names, "names"), since, out)

    v1.include_router(_bulk(engine))

    @v1.get("/jobs", response_model=list[Job], summary="Jobs running on any of the hosts (all when absent)")
    def jobs(hosts: Annotated[str | None, Query(description="comma-separated host names")] = None) -> Any:
        return Response(content=engine.jobs_json(_names(hosts, "hosts")), media_type="application/json")

    @v1.post("/jobs/checkpoint", response_model=CheckpointAck, summary="Ask jobs to checkpoint now")
    def checkpoint(body: CheckpointRequest) -> Any:
        return {"requested_at": engine.request_checkpoint(body.jobs)}

    @v1.post("/hosts/{host}/upgrade", response_model=Host, summary="Start the upgrade of a drained host")
    def upgrade(host: HostName, body: UpgradeRequest) -> Any:
        engine.upgrade(host, body.steps, body.op)
        return engine.hosts([host])[0]

    @v1.post("/hosts/{host}/check", response_model=CheckResult, summary="Start the deep health check of a drained host")
    def check(host: HostName, body: CheckRequest) -> Any:
        return engine.start_check(host, body.expected, body.op)

    @v1.get("/checks", response_model=list[CheckResult], summary="Latest check per host for an operation")
    def checks(
        hosts: Annotated[str, Query(description="comma-separated host names")],
        op: Annotated[str, Query(min_length=1, max_length=250, description="operation id")],
    ) -> Any:
        return engine.check_results(_names(hosts, "hosts") or [], op)

    @v1.post("/hosts/{host}/offboard", response_model=Host, summary="Hand a host to repair with a reason")
    def offboard(host: HostName, body: OffboardRequest) -> Any:
        engine.offboard(host, body.reason, body.op)
        return engine.hosts([host])[0]

    @v1.get("/capacity", response_model=Capacity, summary="Serving hosts and domains out right now")
    def capacity() -> Any:
        return engine.capacity()

    @v1.get("/audit", response_model=AuditReport,
            summary="What happened: capacity, lost work, returns, installs, stops")
    def audit() -> Any:
        return engine.audit()

    @v1.get("/audit/samples", response_model=list[Sample], summary="Capacity time series")
    def samples() -> Any:
        return engine.samples()

    @v1.patch("/jobs/{job_id}", response_model=Job,
              summary="A job's own requests: a dodge deadline; hang (fault tests)")
    def patch_job(job_id: HostName, body: JobPatch) -> Any:
        return engine.set_job(job_id, **body.model_dump())

    @v1.post("/hosts/{host}/fail", response_model=Host, summary="Fault injection: a serving host breaks now")
    def fail(host: HostName) -> Any:
        return engine.fail(host)

    @v1.post("/hosts/{host}/repaired", response_model=Host,
             summary="Repair is done: the host waits, drained, for the health gate")
    def repaired(host: HostName) -> Any:
        return engine.repaired(host)

    @v1.post("/hosts/handover", summary="Hand hosts from one operation to another without returning them")
    def handover(body: HandoverRequest) -> Any:
        engine.handover(body.hosts, body.from_op, body.to_op)
        return {"ok": True}

    @v1.get("/settings", response_model=Rates, summary="Fault rates in force")
    def get_settings() -> Any:
        return engine.settings()

    @v1.patch("/settings", response_model=Rates, summary="Change fault rates at run time")
    def patch_settings(body: SettingsPatch) -> Any:
        return engine.settings(**body.model_dump())

    app.include_router(v1)
    return app


def _ticker(engine: SimEngine, stop: threading.Event, every_s: float = 0.1, soonest_s: float = 0.005,
            save_after_s: float = 1.0, keep_every_s: float = 5.0) -> None:
    """Advance the world regularly, so the audit is sampled even when nobody calls, and as each host's
    transition ends: a domain's phase end is brought about when it falls due, while the train's next poll is
    still on its way, rather than inside that poll, and saved by the next write or, failing one, by a tick
    `save_after_s` later (`SimEngine.tick`). Between ticks, the database's log is folded into it
    (`SimEngine.checkpoint`), so that no save does it; and every `keep_every_s`, when no transition ends in the
    next 50 ms, what the world and its audit have gained since is collected and frozen (`gcpause.keep_long_lived`):
    each stop adds its installs, returns and the hosts' new versions for good (16,000 objects at 3,840 hosts a
    domain), and each full pass of the collector walked all of it again, at a moment no one chooses (11 ms
    after two such stops, 86 ms after twelve, mostly in a phase's end or a request); now a pass walks only what
    came since."""
    wait = every_s
    kept_at = time.monotonic()
    while not stop.wait(wait):
        try:
            engine.tick(save_after_s)  # first: what fell due now (a domain's phase end) waits for nothing else
        except Exception:  # keep ticking; a bad tick must not stop the simulator
            log.exception("advance failed")
        try:
            engine.checkpoint()  # beside the calls, never inside one: the engine's lock is not held
        except Exception:
            log.exception("checkpoint of the simulator's database failed")
        try:
            due = engine.next_transition_in()
        except Exception:
            log.exception("the next transition could not be read")
            due = None
        wait = every_s if due is None else min(every_s, max(due, soonest_s))
        if time.monotonic() - kept_at >= keep_every_s and (due is None or due >= 0.05):
            gcpause.keep_long_lived()
            kept_at = time.monotonic()


def serve(config: RailyardConfig, db_path: str | None, host: str = "127.0.0.1", port: int | None = None, *,
          token: str | None = None, token_file: str | None = None, tls_cert: str | None = None,
          tls_key: str | None = None, tls_client_ca: str | None = None) -> None:
    """Serve the simulator until SIGTERM/SIGINT; blocks. The token comes from `resolve_token`."""
    token = resolve_token(token, token_file)
    if tls_client_ca and not tls_cert:
        raise ValueError("tls_client_ca needs tls_cert (client certificates are checked over TLS only)")
    engine = SimEngine(config, db_path)
    # The world's objects live as long as the process: kept out of the cyclic collector's full passes, which
    # at 76,800 hosts took a quarter of a second each, now and then in the middle of a request.
    gc.freeze()
    app = create_app(engine, token=token)
    stop = threading.Event()
    ticker = threading.Thread(target=_ticker, args=(engine, stop), name="railyard-sim-advance", daemon=True)
    scheme = "https" if tls_cert else "http"
    note = " (bearer token required)" if token else ""
    if not token and host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("the fleet API on %s is open to anyone who reaches it: set %s or --token-file", host, TOKEN_ENV)

    class _Server(uvicorn.Server):
        async def startup(self, sockets=None) -> None:  # type: ignore[no-untyped-def]
            await super().startup(sockets=sockets)
            if self.started:
                bound = self.servers[0].sockets[0].getsockname()[1] if self.servers else port
                print(f"railyard-sim ready on {scheme}://{host}:{bound}{note}", flush=True)

    tls: dict[str, Any] = {}
    if tls_cert:
        tls = {"ssl_certfile": tls_cert, "ssl_keyfile": tls_key}
        if tls_client_ca:
            tls |= {"ssl_ca_certs": tls_client_ca, "ssl_cert_reqs": ssl.CERT_REQUIRED}
    server = _Server(
        uvicorn.Config(
            app,
            host=host,
            port=config.simulator.port if port is None else port,
            log_level="warning",
            access_log=False,
            lifespan="off",
            # an idle keep-alive TLS connection waits for the client's close_notify (30 s by default)
            timeout_graceful_shutdown=3,
            **tls,
        )
    )
    # uvicorn handles SIGTERM/SIGINT itself, then re-raises the signal to the handler that was there
    # before; a quiet one here makes that a clean exit instead of a kill or a KeyboardInterrupt.
    previous: dict[int, object] = {}
    if threading.current_thread() is threading.main_thread():
        previous = {sig: signal.signal(sig, _quiet) for sig in (signal.SIGTERM, signal.SIGINT)}
    ticker.start()
    try:
        server.run()
    finally:
        stop.set()
        ticker.join(timeout=2)
        engine.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]


def _quiet(signum: int, frame: FrameType | None) -> None:
    return None


__all__ = ["OPEN_PATHS", "TOKEN_ENV", "TOKEN_FILE_ENV", "create_app", "resolve_token", "serve"]
