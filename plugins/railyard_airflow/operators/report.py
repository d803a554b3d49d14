"""CycleReportOperator: the first task of every train run — when each domain was last visited, the
plan of this run (releases per host, order, estimate, lowest capacity) and the fleet's version drift.
A plan that would break a compatibility rule fails here, before any stop starts."""

from __future__ import annotations

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
                                 train=self.train_id, run_id=context.get("run_id")))
        return {"overdue": [o["domain"] for o in overdue], "plan": {k: p[k] for k in (
            "domains", "hosts_to_upgrade", "hosts_visited", "estimate_s", "lowest_serving_fraction")}}


class EndRunOperator(FleetOperator):
    """The run's teardown: whatever happened, reservations made ahead for domains no operation holds
    are deleted (`railyard.operations.stop.end_run`), so a halted or failed train leaves none behind; then the
    train_finished event, with the hosts the run visited and offboarded."""

    ui_color = "#eeeeee"

    def __init__(self, *, train_id: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.train_id = train_id

    def execute(self, context: Any) -> list[str]:
        from railyard.operations.stop import end_run

        if (context.get("params") or {}).get("dry_run"):  # a dry run touched nothing, and ends nothing
            self.log.info("dry run: no gate enforced, no reservation deleted")
            return []
        cfg = self.cfg()
        led = ledger(cfg.ledger.url)
        gone = end_run(cfg, cfg.train(self.train_id), self.hook.get_conn(), led)
        self.log.info("reservations deleted at the end of the run: %s", ", ".join(gone) or "none")
        run_id = str(context.get("run_id"))
        leased, failed, _why = led.run_failures(f"{self.train_id}/{run_id}/")
        send(cfg, led, Event("train_finished", f"train {self.train_id} run {run_id} ended: {leased} host(s) visited, "
                             f"{failed} offboarded to repair", train=self.train_id, run_id=run_id,
                             extra={"hosts": leased, "offboarded": failed}))
        return gone
