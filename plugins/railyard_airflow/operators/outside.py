"""Outside work from Airflow (railyard.operations.outside): a setup that leases hosts through the ledger, a wait
for a requester outside Airflow to finish, and a teardown that returns the hosts through the deep health check.

Another team's DAG runs its own disruptive tasks inside a lease:

    lease = RailyardLeaseOperator(task_id="lease", hosts=["gpu-b01"], kind="network", reason="...")
    work = ...  # the DAG's own disruptive tasks, on drained hosts
    back = RailyardReturnOperator(task_id="return", lease_task_id="lease")
    lease >> work >> back.as_teardown(setups=lease)

While the request is queued, and while its jobs checkpoint, the lease defers to the triggerer (no worker slot
held; each poll keeps its place in line). Its operation id is its run's own, so a retried lease finds its
request. `railyard_outside` drives requests made over the page's API the same way, and its teardown returns the
hosts only once the requester asked (`asked_only`)."""

from __future__ import annotations

import hashlib
import time
from datetime import timedelta
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from railyard.domain.config import config_path
from railyard.operations import outside
from railyard.operations.stop import StopError
from railyard_airflow.context import config, ledger
from railyard_airflow.hooks.fleet import FleetHook
from railyard_airflow.triggers.outside import OutsideTrigger

REDEFER_S = 24 * 3600.0  # a wait for the requester never times out: it defers again, a day at a time


def _op_id(dag_id: str, run_id: str, task_id: str, req: dict[str, Any]) -> str:
    token = hashlib.sha1(f"{dag_id}/{run_id}/{task_id}".encode()).hexdigest()[:10]
    return f"outside/{req['kind']}/{token}/{req['domain']}"


class _Outside(BaseOperator):
    def __init__(self, *, fleet_conn_id: str = FleetHook.default_conn_name, config_path: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.fleet_conn_id, self.config_path = fleet_conn_id, config_path

    def _path(self) -> str:
        return self.config_path or str(config_path())

    def _stop(self, op_id: str) -> Any:
        cfg = config(self._path())
        fleet = FleetHook(self.fleet_conn_id, config_path=self.config_path).get_conn()
        return outside.stop_of(cfg, fleet, ledger(cfg.ledger.url), op_id, say=self.log.info)

    def _op_of(self, context: Any, lease_task_id: str) -> str | None:
        op_id = context["ti"].xcom_pull(task_ids=lease_task_id, key="op_id")
        return str(op_id) if op_id else None


class RailyardLeaseOperator(_Outside):
    """Request `hosts` (one domain) for outside work of `kind`, or drive the request `op` already made (the page's
    API), and wait until the hosts are drained and handed over; returns the operation id (XCom). A bad request
    fails at once, naming the field and the value; one not granted within `wait_s` fails (its teardown
    withdraws it, nothing drained)."""

    template_fields = ("hosts", "reason", "op")
    ui_color = "#f8e0e0"

    def __init__(self, *, hosts: list[str] | None = None, kind: str | None = None, reason: str | None = None,
                 op: str | None = None, deadline_h: float | None = None, poll_s: float = 5.0,
                 wait_s: float = 24 * 3600, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if (op is None) == (hosts is None):
            raise ValueError(f"{kwargs.get('task_id')}: name either hosts (with kind and reason) or op, not both")
        if not 0 < poll_s <= 20:
            raise ValueError(f"poll_s: between 0 and 20 s, to keep the request's place in line (value: {poll_s})")
        self.hosts, self.kind, self.reason, self.op = (list(hosts) if hosts else None), kind, reason, op
        self.deadline_h, self.poll_s, self.wait_s = deadline_h, poll_s, wait_s

    def _request(self, context: Any) -> str:
        cfg = config(self._path())
        led = ledger(cfg.ledger.url)
        if self.op is not None:
            try:
                outside.status(led, self.op)
            except outside.OutsideError as exc:
                raise AirflowFailException("; ".join(exc.problems)) from None
            return str(self.op)
        try:
            req = outside.parse_request(cfg, hosts=self.hosts or [], kind=self.kind or "", reason=self.reason or "",
                                        deadline_h=self.deadline_h)
        except outside.OutsideError as exc:
            raise AirflowFailException("outside work refused, nothing touched: " + "; ".join(exc.problems)) from None
        op_id = _op_id(context["dag_run"].dag_id, context["run_id"], self.task_id, req)
        if led.operation(op_id) is None:
            user = getattr(context.get("dag_run"), "triggering_user_name", None)
            outside.open_request_as(cfg, led, req, op_id=op_id,
                                    actor=f"dag:{context['dag_run'].dag_id}" + (f" ({user})" if user else ""))
        return op_id

    def execute(self, context: Any) -> Any:
        op_id = self._request(context)
        context["ti"].xcom_push(key="op_id", value=op_id)  # the teardown returns it, granted or still queued
        return self._advance(op_id, time.time() + self.wait_s)

    def resume(self, context: Any, event: dict[str, Any] | None = None, **_kw: Any) -> Any:
        event = event or {}
        op_id = str(event.get("op_id") or self._op_of(context, self.task_id) or "")
        return self._advance(op_id, float(event.get("deadline") or time.time() + self.wait_s))

    def _advance(self, op_id: str, deadline: float) -> Any:
        try:
            out = outside.advance(self._stop(op_id))
        except (StopError, outside.OutsideError) as exc:
            raise AirflowFailException(f"{op_id}: {exc}") from None
        if out["phase"] == "handed":
            self.log.info("%s: handed over: %s", op_id, ", ".join(out["hosts"]))
            return op_id
        if out["phase"] in ("withdrawn", "returned"):
            raise AirflowSkipException(f"{op_id}: withdrawn by the requester before its hosts were handed over")
        if time.time() >= deadline:
            raise AirflowFailException(f"{op_id}: not handed over within wait_s={self.wait_s:.0f}s: {out['why']}")
        self.log.info("%s: %s: %s", op_id, out["phase"], out["why"])
        trigger = OutsideTrigger(op_id=op_id, config_path=self._path(), wait_for="grant", deadline=deadline,
                                 fleet_conn_id=self.fleet_conn_id, poll_interval=self.poll_s)
        self.defer(trigger=trigger, method_name="resume",
                   timeout=timedelta(seconds=max(60.0, deadline - time.time() + 60)))


class RailyardAwaitReturnOperator(_Outside):
    """Waits, in the triggerer, until the requester asks for its hosts back (`railyard op return`, or the page's
    API). It never times out: a requester that vanished is escalated at its deadline by the reconciler."""

    ui_color = "#fdf0d5"

    def __init__(self, *, lease_task_id: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.lease_task_id = lease_task_id

    def execute(self, context: Any) -> Any:
        return self._look(self._op_of(context, self.lease_task_id) or "")

    def resume(self, context: Any, event: dict[str, Any] | None = None, **_kw: Any) -> Any:
        return self._look(str((event or {}).get("op_id") or self._op_of(context, self.lease_task_id) or ""))

    def _look(self, op_id: str) -> Any:
        if not op_id:
            raise AirflowFailException(f"the lease {self.lease_task_id} made no request")
        led = ledger(config(self._path()).ledger.url)
        op = led.operation(op_id)
        ask = led.detail(op_id).get("return_asked")
        if ask or op is None or op["state"] != "active":
            self.log.info("%s: %s", op_id, f"return asked by {ask['actor']}: {ask['reason']}" if ask else "ended")
            return ask
        self.log.info("%s: the requester works on its hosts; waiting for it to return them", op_id)
        self.defer(trigger=OutsideTrigger(op_id=op_id, config_path=self._path(), wait_for="return",
                                          deadline=time.time() + REDEFER_S, fleet_conn_id=self.fleet_conn_id,
                                          poll_interval=10.0),
                   method_name="resume", timeout=timedelta(seconds=REDEFER_S + 60))


class RailyardReturnOperator(_Outside):
    """The lease's teardown: the hosts go back through the deep health check (those that pass to service, the
    rest to repair with the evidence), whatever the DAG's own tasks did; `to_repair` hosts go to repair. A request
    still queued is withdrawn. With `asked_only`, hosts handed over are returned only once the requester asked
    (its `to_repair` and reason are used); otherwise they stay held and this task fails, saying so."""

    template_fields = ("to_repair",)
    ui_color = "#d7f0dc"

    def __init__(self, *, lease_task_id: str, to_repair: list[str] | None = None, asked_only: bool = False,
                 **kwargs: Any) -> None:
        kwargs.setdefault("retries", 2)
        kwargs.setdefault("retry_delay", timedelta(seconds=10))
        super().__init__(**kwargs)
        self.lease_task_id, self.to_repair, self.asked_only = lease_task_id, list(to_repair or []), asked_only

    def execute(self, context: Any) -> dict[str, Any]:
        op_id = self._op_of(context, self.lease_task_id)
        if not op_id:
            self.log.info("the lease %s never made its request: nothing to return", self.lease_task_id)
            return {"returned": 0, "to_repair": []}
        stop = self._stop(op_id)
        to_repair = self.to_repair
        reason = f"returned by {context['dag_run'].dag_id} run {context['run_id']}"
        ask = stop.ledger.detail(op_id).get("return_asked")
        if ask:
            to_repair, reason = list(ask["to_repair"]), f"{ask['reason']} (asked by {ask['actor']})"
        elif self.asked_only and outside.phase(stop.ledger, op_id) in ("handed", "returning"):
            raise AirflowFailException(
                f"{op_id}: its requester has not asked for its hosts back: they stay held and drained "
                f"({', '.join(stop.held())}). `railyard op return {op_id}` returns them through the check; past "
                "its deadline the reconciler escalates it")
        try:
            out = outside.give_back(stop, to_repair=to_repair, reason=reason)
        except (outside.OutsideError, StopError) as exc:
            raise AirflowFailException(f"{op_id}: {exc}") from None
        self.log.info("%s: %s back in service after their check; to repair: %s", op_id, out["returned"],
                      ", ".join(out["to_repair"]) or "none")
        return out
