"""Nothing stuck forever: an operation whose Airflow run is gone is brought to a safe end.

Leases never expire by time. A lease outlives its run when the run is marked failed or deleted
(its teardown never runs), or when every process died at once. `reconcile` lists the active
operations, asks Airflow about the run behind each (`RunOracle`: the REST API from the CLI, the
Task SDK from the `railyard_reconcile` DAG) and, for a run that is finished or deleted, finishes the
stop through its own teardown (`Stop.return_hosts`) under the same operation id: hosts in flight are
waited for, hosts without a passing check at the versions they have are checked (failures go to
repair), verified hosts are returned, and only then is the lease released. A host half-way through
an install is never returned in a mix that breaks a compatibility rule. A run that still runs is
left alone: its own tasks finish it. A DAG the Airflow asked does not know is never judged (the CLI
may be pointed at the wrong Airflow). Every action is audited with the reason.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Collection
from typing import Any, Protocol
from urllib.parse import quote

from railyard.domain.config import RailyardConfig
from railyard.fleet.port import Fleet, FleetError
from railyard.ledger import Ledger
from railyard.operations.emergency import stop_of_run
from railyard.operations.stop import Stop, StopError

FINISHED = frozenset({"success", "failed"})
EMERGENCY_DAG = "railyard_emergency"


class ReconcileError(RuntimeError):
    """Airflow could not be asked, or an operation cannot be finished here; the message says why."""


class RunOracle(Protocol):
    def dag_known(self, dag_id: str) -> bool: ...

    def run_state(self, dag_id: str, run_id: str) -> str | None:
        """The run's state (queued, running, success, failed), or None when no such run exists."""
        ...


def run_state_name(state: object) -> str:
    """A run state as its plain name ("failed"), whatever carries it: a string, or an enum such as the
    Task SDK's `DagRunState`, whose `str()` is "DagRunState.FAILED" (never a finished state by name)."""
    value = getattr(state, "value", state)
    return str(value).lower()


def dag_id_for(train_id: str) -> str:
    """The DAG of a train (one per train in the config)."""
    return "railyard_train_" + re.sub(r"[^\w-]", "_", train_id)


def owner_of(op: dict[str, Any]) -> tuple[str, str] | None:
    """(dag id, run id) of the Airflow run an operation belongs to; None for operations of no run
    (repairs: the repair gate's)."""
    parts = str(op["id"]).split("/")
    if op["kind"] == "train_stop" and len(parts) >= 3:
        return dag_id_for(parts[0]), parts[1]
    if op["kind"] in ("emergency", "emergency_run") and parts[0] == "emergency" and len(parts) >= 2:
        return EMERGENCY_DAG, parts[1]
    return None


def stop_for(config: RailyardConfig, fleet: Fleet, ledger: Ledger, op: dict[str, Any], **kw: Any) -> Stop:
    """The Stop that an operation is, rebuilt from the ledger (for its teardown, outside its run)."""
    parts = str(op["id"]).split("/")
    if op["kind"] == "emergency":
        stop = stop_of_run(config, ledger, run_id=parts[1], fleet=fleet, domain=op["domain"], **kw)
        if stop is None:
            raise ReconcileError(f"{op['id']}: its emergency run recorded no plan for {op['domain']}")
        return stop
    if op["kind"] == "outside":  # another team's work (railyard.operations.outside): its own hosts, no release
        from railyard.operations import outside

        return outside.stop_of(config, fleet, ledger, op["id"], **kw)
    if op["kind"] != "train_stop":
        raise ReconcileError(f"{op['id']}: a {op['kind']} operation is not a stop")
    try:
        train, domain = config.train(parts[0]), config.domain(op["domain"])
    except KeyError as exc:
        raise ReconcileError(f"{op['id']}: {exc.args[0] if exc.args else exc} is no longer in the config") from None
    return Stop(config=config, train=train, domain=domain, op_id=op["id"], fleet=fleet, ledger=ledger,
                revisit=bool(op["detail"].get("revisit")), **kw)


def reconcile(config: RailyardConfig, fleet: Fleet, ledger: Ledger, runs: RunOracle, *, actor: str = "reconciler",
              say: Callable[[str], None] = print, sleep: Callable[[float], None] = time.sleep,
              clock: Callable[[], float] = time.monotonic, only: Collection[str] | None = None) -> list[dict[str, Any]]:
    """Finish every active operation whose run is finished or deleted; one result per operation judged."""
    results: list[dict[str, Any]] = []
    known: dict[str, bool] = {}
    ended: dict[tuple[str, str], tuple[str, str]] = {}  # (train, run id) -> (dag id, state) of runs judged ended
    active = ledger.active_operations()
    for op in active:
        if only is not None and op["id"] not in only:
            continue
        own = owner_of(op)
        if own is None:
            continue
        dag_id, run_id = own
        if dag_id not in known:
            known[dag_id] = runs.dag_known(dag_id)
        if not known[dag_id]:
            results.append({"op": op["id"], "action": "skipped", "why": f"Airflow does not know the DAG {dag_id}"})
            continue
        raw = runs.run_state(dag_id, run_id)
        state = None if raw is None else run_state_name(raw)
        if state is not None and state not in FINISHED:
            continue  # alive: its own tasks finish it
        why = f"its run {dag_id}/{run_id} is {'deleted' if state is None else state}"
        ended[(str(op["id"]).split("/")[0], run_id)] = (dag_id, state or "deleted")
        if not op["hosts"]:
            ledger.finish_operation(op["id"], reason=f"{why}; it holds no host", actor=actor)
            results.append({"op": op["id"], "action": "finished", "why": why})
            continue
        say(f"{op['id']}: {why}; finishing its stop safely ({len(op['hosts'])} host(s))")
        ledger.note(op["id"], "reconcile", op["hosts"], f"{why}: finishing its stop safely", actor=actor)
        try:
            stop = stop_for(config, fleet, ledger, op, actor=actor, say=say, sleep=sleep, clock=clock, closing=True)
            out = stop.return_hosts()
        except (StopError, ReconcileError, FleetError) as exc:
            ledger.note(op["id"], "reconcile_failed", op["hosts"], str(exc), actor=actor)
            say(f"{op['id']}: not finished: {exc}")
            results.append({"op": op["id"], "action": "failed", "why": why, "error": str(exc)})
            continue
        results.append({"op": op["id"], "action": "closed", "why": why, "returned": out["returned"],
                        "to_repair": out["offboarded"], "released": not ledger.holdings(op["id"])})
    return results + escalate_overdue(config, ledger, only, active=active) + report_ended(ledger, ended)


def escalate_overdue(config: RailyardConfig, ledger: Ledger, only: Collection[str] | None = None, *,
                     active: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Outside operations past their deadline (a requester that vanished): escalated once each, never
    released: their hosts come back only through `railyard op return` or `railyard lease release`."""
    from railyard.operations import outside
    from railyard.operations.escalate import escalate

    out = []
    for op in outside.overdue(ledger, time.time(), active=active):
        if only is not None and op["id"] not in only:
            continue
        who = op["detail"].get("actor") or "unknown"
        summary = (f"{op['id']}: past its deadline; {len(op['hosts'])} host(s) still held for {who} "
                   f"({op['detail']['request']['kind']}: {op['detail']['request']['reason']})")
        escalate(config, ledger, kind="outside_overdue", summary=summary, op_id=op["id"], requester=who)
        ledger.set_detail(op["id"], "escalated", time.time())
        out.append({"op": op["id"], "action": "escalated", "why": "past its deadline"})
    return out


def report_ended(ledger: Ledger, ended: dict[tuple[str, str], tuple[str, str]]) -> list[dict[str, Any]]:
    """A report for each run that ended without its last task writing one (deleted, or its teardowns never
    ran), or whose report still shows hosts out (its last task ran before a teardown finished them), once
    none of its operations is active any more: what was done before it stopped."""
    from railyard.operations import runreport

    out = []
    for (train, run_id), (dag_id, state) in sorted(ended.items()):
        key = runreport.run_key(train, run_id)
        if ledger.operations_like(f"{key}/", state="active"):
            continue
        if ledger.report(key) is None:
            ledger.save_report(runreport.build(ledger, train=train, run_id=run_id, dag_id=dag_id, state=state))
            out.append({"op": key, "action": "reported", "why": f"its run ended {state} without a report"})
        elif runreport.refresh_if_stale(ledger, key):
            out.append({"op": key, "action": "reported", "why": f"its run ended {state}; its report showed hosts out"})
    return out


class AirflowApi:
    """Airflow's REST API (v2), for the CLI: a run's state, and whether a DAG exists.

    Credentials come from the environment: RAILYARD_AIRFLOW_TOKEN, or RAILYARD_AIRFLOW_USER and
    RAILYARD_AIRFLOW_PASSWORD (exchanged for a token at /auth/token). They never appear in an error."""

    def __init__(self, url: str, *, token: str | None = None, username: str | None = None,
                 password: str | None = None, timeout: float = 10.0) -> None:
        import requests

        self.url = url.rstrip("/")
        self._token = token
        self._login = (username, password) if username else None
        self.timeout = timeout
        self.http = requests.Session()

    @classmethod
    def from_env(cls, url: str | None = None) -> AirflowApi:
        env = os.environ
        return cls(url or env.get("RAILYARD_AIRFLOW_API") or "http://127.0.0.1:8080",
                   token=env.get("RAILYARD_AIRFLOW_TOKEN") or None, username=env.get("RAILYARD_AIRFLOW_USER") or None,
                   password=env.get("RAILYARD_AIRFLOW_PASSWORD"))

    def _auth(self) -> dict[str, str]:
        if self._token is None and self._login is not None:
            user, password = self._login
            try:
                r = self.http.post(f"{self.url}/auth/token", json={"username": user, "password": password},
                                   timeout=self.timeout)
            except OSError as exc:
                raise ReconcileError(f"Airflow API {self.url} unreachable: {type(exc).__name__}") from None
            if r.status_code not in (200, 201):
                raise ReconcileError(f"Airflow API {self.url}: login as {user!r} refused ({r.status_code})")
            self._token = str(r.json()["access_token"])
        return {"Authorization": f"Bearer {self._token}"} if self._token else {}

    def _get(self, path: str) -> tuple[int, dict[str, Any]]:
        try:
            r = self.http.get(f"{self.url}/api/v2{path}", headers=self._auth(), timeout=self.timeout)
        except OSError as exc:
            raise ReconcileError(f"Airflow API {self.url} unreachable: {type(exc).__name__}") from None
        if r.status_code in (401, 403):
            raise ReconcileError(f"Airflow API {self.url}: GET {path} refused ({r.status_code}); set "
                                 "RAILYARD_AIRFLOW_TOKEN, or RAILYARD_AIRFLOW_USER and RAILYARD_AIRFLOW_PASSWORD")
        if r.status_code not in (200, 404):
            raise ReconcileError(f"Airflow API {self.url}: GET {path} answered {r.status_code}")
        return r.status_code, (r.json() if r.status_code == 200 else {})

    def dag_known(self, dag_id: str) -> bool:
        return self._get(f"/dags/{quote(dag_id, safe='')}")[0] == 200

    def run_state(self, dag_id: str, run_id: str) -> str | None:
        code, body = self._get(f"/dags/{quote(dag_id, safe='')}/dagRuns/{quote(run_id, safe='')}")
        return None if code == 404 else str(body["state"])
