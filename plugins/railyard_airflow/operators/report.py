"""CycleReportOperator: the first task of every train run — when each domain was last visited, the
plan of this run (releases per host, order, estimate, lowest capacity) and the fleet's version drift.
A plan that would break a compatibility rule fails here, before any stop starts."""

from __future__ import annotations

import logging
from functools import cached_property
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException

from railyard.domain.config import config_path
from railyard.operations.escalate import escalate, overdue_domains
from railyard.operations.releases import describe_drift, describe_plan, drift, plan_train
from railyard_airflow.context import config, ledger
from railyard_airflow.hooks.fleet import FleetHook
from railyard_airflow.mixins import FleetOperator
from railyard_airflow.notifiers.route import Event, send


class CycleReportOperator(BaseOperator):
    """Reports domains overdue for the train's cycle time and escalates them; never fails the run."""

    ui_color = "#eeeeee"

    def __init__(self, *, train_id: str, fleet_conn_id: str = FleetHook.default_conn_name,
                 config_path: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.train_id = train_id
        self.fleet_conn_id = fleet_conn_id
        self.config_path = config_path

    @cached_property
    def hook(self) -> FleetHook:
        return FleetHook(self.fleet_conn_id, config_path=self.config_path)

    def execute(self, context: Any) -> dict[str, Any]:
        cfg = config(self.config_path or str(config_path()))
        led = ledger(cfg.ledger.url)
        now = self.hook.get_conn().now()
        visits = led.last_visits(self.train_id)
        for d in cfg.train_domains(cfg.train(self.train_id)):
            at = visits.get(d.name)
            self.log.info("%-24s last visited %s", d.name, f"{(now - at) / 86400:.2f} days ago" if at else "never")
        overdue = overdue_domains(cfg, led, self.train_id, now)
        if overdue:
            names = ", ".join(o["domain"] for o in overdue)
            summary = f"train {self.train_id}: overdue for its cycle: {names}"
            escalate(cfg, led, kind="cycle_overdue", summary=summary,
                     train=self.train_id, run_id=context.get("run_id"), overdue=overdue)
            send(cfg, led, Event("escalation", summary, train=self.train_id, reason="cycle_overdue",
                                 run_id=context.get("run_id")))
        fleet = self.hook.get_conn()
        p = plan_train(cfg, cfg.train(self.train_id), fleet, led)
        self.log.info("plan%s:\n%s", " (DRY RUN: nothing will be touched)" if (context.get("params") or {})
                      .get("dry_run") else "", describe_plan(p))
        self.log.info("%s", describe_drift(drift(cfg, fleet.hosts(), now)))
        if p["violations"]:
            raise AirflowFailException("plan refused before any host is touched: " + "; ".join(p["violations"]))
        if not (context.get("params") or {}).get("dry_run"):
            send(cfg, led, Event("train_started", f"train {self.train_id} started (run {context.get('run_id')}): "
                                 f"{len(p['domains'])} domain(s), {p['hosts_to_upgrade']} host(s) to upgrade",
                                 train=self.train_id, run_id=context.get("run_id")),
                 once_for_run=f"{self.train_id}/{context.get('run_id')}")
        return {"overdue": [o["domain"] for o in overdue], "plan": {k: p[k] for k in (
            "domains", "hosts_to_upgrade", "hosts_visited", "estimate_s", "lowest_serving_fraction")}}


class EndRunOperator(FleetOperator):
    """The run's teardown: whatever happened, reservations made ahead for domains no operation holds
    are deleted (`railyard.operations.stop.end_run`), so a halted or failed train leaves none behind; then the
    run's report (`railyard.operations.runreport`) goes to the ledger and is this task's XCom (Airflow shows it
    beside the run), and the train_finished event is sent. `train_id="emergency"`: the emergency train's."""

    ui_color = "#eeeeee"

    def __init__(self, *, train_id: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.train_id = train_id

    def execute(self, context: Any) -> dict[str, Any]:
        from railyard.operations import runreport
        from railyard.operations.stop import end_run

        cfg = self.cfg()
        led = ledger(cfg.ledger.url)
        run_id = str(context.get("run_id"))
        dry_run = bool((context.get("params") or {}).get("dry_run"))
        if dry_run:  # a dry run touched nothing, ends nothing and writes nothing
            self.log.info("dry run: no gate enforced, no reservation deleted, no report written")
            return {"report": None, "dry_run": True}
        gone: list[str] = []
        if self.train_id != "emergency":
            gone = end_run(cfg, cfg.train(self.train_id), self.hook.get_conn(), led)
            self.log.info("reservations deleted at the end of the run: %s", ", ".join(gone) or "none")
        report = runreport.build(led, train=self.train_id, run_id=run_id, **_airflow_facts(context))
        led.save_report(report)
        # a stop's teardown that finished its hosts between the build and the save: built again now
        if runreport.refresh_if_stale(led, report["run"]["key"]):
            report = led.report(report["run"]["key"]) or report
        self.log.info("run report (also `railyard report %s`):\n%s", report["run"]["key"], runreport.describe(report))
        if self.train_id != "emergency":
            leased, failed, _why = led.run_failures(f"{self.train_id}/{run_id}/")
            send(cfg, led, Event("train_finished", f"train {self.train_id} run {run_id} ended "
                                 f"{report['run']['outcome']}: {leased} host(s) visited, {failed} offboarded to "
                                 "repair", train=self.train_id, run_id=run_id,
                                 extra={"hosts": leased, "offboarded": failed}),
                 once_for_run=report["run"]["key"])
        return {"report": runreport.for_xcom(report), "reservations_deleted": gone}


def _airflow_facts(context: Any) -> dict[str, Any]:
    """What Airflow knows of the run this task belongs to: who or what triggered it, its conf's reason, when it
    started, and which of its tasks failed (asked through the Task SDK; none when it cannot say)."""
    dr = context.get("dag_run")
    ti = context.get("ti")
    conf = getattr(dr, "conf", None) or {}
    run_type = getattr(getattr(dr, "run_type", None), "value", getattr(dr, "run_type", None))
    start = getattr(dr, "start_date", None)
    facts: dict[str, Any] = {
        "dag_id": getattr(dr, "dag_id", None) or getattr(ti, "dag_id", None),
        "triggered_by": getattr(dr, "triggering_user_name", None) or (None if run_type is None else str(run_type)),
        "run_type": None if run_type is None else str(run_type),
        "reason": conf.get("reason") if isinstance(conf, dict) else None,
        "started_at": start.timestamp() if start is not None else None,
    }
    try:
        from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

        states = RuntimeTaskInstance.get_task_states(dag_id=facts["dag_id"], run_ids=[str(context.get("run_id"))])
        mine: dict[str, Any] = next(iter(states.values()), {}) if states else {}
        own = getattr(ti, "task_id", None)
        facts["failed_tasks"] = sorted(t for t, st in mine.items() if t != own
                                       and str(getattr(st, "value", st)) == "failed")
        facts["state"] = "failed" if facts["failed_tasks"] else "success"
    except Exception as exc:  # noqa: BLE001 - the report is written all the same, from the ledger alone
        logging.getLogger(__name__).warning("the run's task states could not be read (%s): the report is the "
                                            "ledger's alone, its outcome unknown", type(exc).__name__)
        facts["state"] = "unknown"  # fail closed: a run whose tasks no one could see is not called a success
    return facts
