"""Operators for the disruptive steps of a domain stop: drain, upgrade, health check, return.

Each is a thin wrapper over `railyard.operations.stop.Stop`; the work is idempotent, so Airflow's retries
re-attach to what is in flight instead of starting it again.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException

from railyard.operations.stop import Stop, StopError
from railyard_airflow.mixins import StopTaskMixin
from railyard_airflow.notifiers.route import stop_events


class DomainStopOperator(BaseOperator, StopTaskMixin):
    """Base: knows its train, its domain (or revisit slot) and its fleet; subclasses implement `run`."""

    template_fields = ("train_id", "domain")
    ui_color = "#f0e4d7"

    def execute(self, context: Any) -> Any:
        stop = self.stop_for(context)
        try:
            result = self.run(stop)
        except StopError as exc:
            raise AirflowFailException(str(exc)) from None
        self.log.info("%s %s: %s", self.task_id, stop.domain.name, result)
        stop_events(stop, self.step, result, context.get("run_id"))
        return result

    step = "step"

    def run(self, stop: Stop) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError


class DrainDomainOperator(DomainStopOperator):
    """Drain the leased hosts of the domain and wait until they are empty."""

    step = "drain"

    def run(self, stop: Stop) -> Any:
        return stop.drain()


class UpgradeDomainOperator(DomainStopOperator):
    """Apply every pending release to every drained host; failed hosts go to repair."""

    step = "upgrade"

    def run(self, stop: Stop) -> Any:
        return stop.upgrade()


class HealthCheckOperator(DomainStopOperator):
    """Deep health check at the target versions; failed hosts go to repair with the evidence.

    Fails (and so halts the train at this stop) when too many of the run's hosts have failed.
    """

    step = "check"

    def run(self, stop: Stop) -> Any:
        return stop.check()


class ReturnDomainOperator(DomainStopOperator):
    """Return verified hosts and release the lease. Runs as the stop's teardown, whatever failed."""

    step = "return"

    ui_color = "#d7f0dc"

    def run(self, stop: Stop) -> Any:
        out = stop.return_hosts()
        from railyard.operations.runreport import refresh_if_stale
        from railyard.operations.stop import run_prefix

        try:  # the run's report, if its last task wrote it while this teardown was still finishing the hosts
            if refresh_if_stale(stop.ledger, run_prefix(stop.op_id).rstrip("/")):
                self.log.info("the run's report written again: its hosts are back")
        except Exception as exc:  # noqa: BLE001 - a report never fails the return
            self.log.warning("the run's report could not be refreshed: %s", type(exc).__name__)
        return out
