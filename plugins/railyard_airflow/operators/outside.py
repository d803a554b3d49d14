"""Outside work from other teams' DAGs (railyard.operations.outside): a setup that leases hosts through the
ledger and a teardown that returns them through the deep health check, whatever failed between them.

    lease = RailyardLeaseOperator(task_id="lease", hosts=["gpu-b01"], kind="network", reason="...")
    work = ...  # the DAG's own disruptive tasks, on drained hosts
    back = RailyardReturnOperator(task_id="return", lease_task_id="lease")
    lease >> work >> back.as_teardown(setups=lease)

The lease waits as a sensor in reschedule mode (no worker slot held while it is queued); each poke keeps its
place in line. Its operation id is the run's own, so a retried or rescheduled lease finds its request."""

from __future__ import annotations

import hashlib
from datetime import timedelta
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.bases.sensor import BaseSensorOperator
from airflow.sdk.exceptions import AirflowFailException

from railyard.domain.config import config_path
from railyard.operations import outside
from railyard.operations.stop import StopError
from railyard_airflow.context import config, ledger
from railyard_airflow.hooks.fleet import FleetHook


def _op_id(dag_id: str, run_id: str, task_id: str, req: dict[str, Any]) -> str:
    token = hashlib.sha1(f"{dag_id}/{run_id}/{task_id}".encode()).hexdigest()[:10]
    return f"outside/{req['kind']}/{token}/{req['domain']}"


class RailyardLeaseOperator(BaseSensorOperator):
    """Request `hosts` (one domain) for outside work of `kind`, and wait until they are drained and handed
    over; returns the operation id (XCom). A bad request fails at once, naming the field and the value."""

    template_fields = ("hosts", "reason")
    ui_color = "#f8e0e0"

    def __init__(self, *, hosts: list[str], kind: str, reason: str, deadline_h: float | None = None,
                 fleet_conn_id: str = FleetHook.default_conn_name, config_path: str | None = None,
                 poke_interval: float = 30.0, timeout: float = 24 * 3600, **kwargs: Any) -> None:
        super().__init__(mode="reschedule", poke_interval=poke_interval, timeout=timeout, **kwargs)
        self.hosts, self.kind, self.reason, self.deadline_h = list(hosts), kind, reason, deadline_h
        self.fleet_conn_id, self.config_path = fleet_conn_id, config_path

    def poke(self, context: Any) -> Any:
        cfg = config(self.config_path or str(config_path()))
        try:
            req = outside.parse_request(cfg, hosts=self.hosts, kind=self.kind, reason=self.reason,
                                        deadline_h=self.deadline_h)
        except outside.OutsideError as exc:
            raise AirflowFailException("outside work refused, nothing touched: " + "; ".join(exc.problems)) from None
        led = ledger(cfg.ledger.url)
        op_id = _op_id(context["dag_run"].dag_id, context["run_id"], self.task_id, req)
        if led.operation(op_id) is None:
            user = getattr(context.get("dag_run"), "triggering_user_name", None)
            outside.open_request_as(cfg, led, req, op_id=op_id,
                                    actor=f"dag:{context['dag_run'].dag_id}" + (f" ({user})" if user else ""))
        context["ti"].xcom_push(key="op_id", value=op_id)  # the teardown returns it, granted or still queued
        stop = outside.stop_of(cfg, FleetHook(self.fleet_conn_id, config_path=self.config_path).get_conn(), led,
                               op_id, say=self.log.info)
        try:
            out = outside.advance(stop)
        except StopError as exc:
            raise AirflowFailException(str(exc)) from None
        if out["phase"] != "handed":
            self.log.info("%s: waiting: %s", op_id, out["why"])
            return False
        self.log.info("%s: handed over: %s", op_id, ", ".join(out["hosts"]))
        from airflow.sdk.bases.sensor import PokeReturnValue

        return PokeReturnValue(is_done=True, xcom_value=op_id)


class RailyardReturnOperator(BaseOperator):
    """The lease's teardown: the hosts go back through the deep health check (those that pass to service, the
    rest to repair with the evidence), whatever the DAG's own tasks did; `to_repair` hosts go to repair."""

    template_fields = ("to_repair",)
    ui_color = "#d7f0dc"

    def __init__(self, *, lease_task_id: str, to_repair: list[str] | None = None,
                 fleet_conn_id: str = FleetHook.default_conn_name, config_path: str | None = None,
                 **kwargs: Any) -> None:
        kwargs.setdefault("retries", 2)
        kwargs.setdefault("retry_delay", timedelta(seconds=10))
        super().__init__(**kwargs)
        self.lease_task_id, self.to_repair = lease_task_id, list(to_repair or [])
        self.fleet_conn_id, self.config_path = fleet_conn_id, config_path

    def execute(self, context: Any) -> dict[str, Any]:
        op_id = context["ti"].xcom_pull(task_ids=self.lease_task_id, key="op_id")
        if not op_id:
            self.log.info("the lease %s never made its request: nothing to return", self.lease_task_id)
            return {"returned": 0, "to_repair": []}
        cfg = config(self.config_path or str(config_path()))
        stop = outside.stop_of(cfg, FleetHook(self.fleet_conn_id, config_path=self.config_path).get_conn(),
                               ledger(cfg.ledger.url), str(op_id), say=self.log.info)
        reason = f"returned by {context['dag_run'].dag_id} run {context['run_id']}"
        try:
            out = outside.give_back(stop, to_repair=self.to_repair, reason=reason)
        except (outside.OutsideError, StopError) as exc:
            raise AirflowFailException(f"{op_id}: {exc}") from None
        self.log.info("%s: %s back in service after their check; to repair: %s", op_id, out["returned"],
                      ", ".join(out["to_repair"]) or "none")
        return out
