"""The two waits before a domain is touched: buffer capacity (takes the lease) and job checkpoints.

Both poke once and, when the condition is not yet true, defer to a trigger with an absolute
deadline from the config: nothing waits for Airflow's default sensor timeout of seven days.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

from airflow.sdk import BaseSensorOperator
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from railyard.domain.config import config_path
from railyard.operations.stop import Stop, StopError
from railyard_airflow.mixins import StopTaskMixin
from railyard_airflow.triggers.stop import BufferCapacityTrigger, CheckpointTrigger


class _StopSensor(BaseSensorOperator, StopTaskMixin):
    template_fields = ("train_id", "domain")

    task_args = StopTaskMixin.task_args | {"wait_s": 3600.0, "poll_s": 1.0, "deferrable": True}
    wait_s: float
    poll_s: float
    deferrable: bool

    def _airflow_args(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        kwargs.setdefault("timeout", self.wait_s)  # BaseSensorOperator's own arguments, from ours
        kwargs.setdefault("poke_interval", self.poll_s)
        return kwargs

    def trigger_kwargs(self, context: Any, stop: Stop, started: float) -> dict[str, Any]:
        """What the trigger needs, and no secret: any viewer of the task can read these (REST API, UI).
        The fleet is named by its connection id; the trigger builds it with the same hook."""
        return dict(train_id=self.train_id, domain=stop.domain.name, slot=self.slot, run_id=context["run_id"],
                    fleet_conn_id=self.fleet_conn_id, ledger_url=shareable_url(stop.ledger.url),
                    config_path=str(config_path(self.config_path)),
                    deadline=started + self.wait_s, poll_interval=self.poll_s)


def shareable_url(url: str) -> str | None:
    """A ledger URL fit for trigger kwargs: as is without a credential; None (the trigger then resolves the
    ledger from the config and RAILYARD_LEDGER_URL, as the task did) when it holds one (a password, a
    `?password=`), or cannot be parsed."""
    from railyard.ledger import has_credentials

    return None if has_credentials(url) else url


class BufferCapacitySensor(_StopSensor):
    """Waits until the buffers and `max_domains_down` allow this domain, and takes its lease.

    Skips the stop (and only it) when every host of the domain is already at target.
    """

    ui_color = "#e8f0ff"

    def _outcome(self, status: str, message: str) -> bool:
        if status == "granted":
            self.log.info("lease granted: %s", message)
            return True
        if status in ("skip", "dodge"):
            raise AirflowSkipException(message)
        if status == "stop":
            raise AirflowFailException(f"train stopped: {message}")
        if status == "timeout":
            raise AirflowFailException(
                f"no capacity for {self.domain or self.slot} within {self.wait_s:.0f}s: {message}"
            )
        if status == "wait":
            return False
        raise AirflowFailException(f"unexpected outcome {status}: {message}")

    def poke(self, context: Any) -> bool:
        d = self.stop_for(context).take()
        self.log.info("%s: %s", d.outcome, d.reason)
        return self._outcome(d.outcome, d.reason)

    def execute(self, context: Any) -> Any:
        if (context.get("params") or {}).get("dry_run"):
            raise AirflowSkipException("dry run: the plan is in the first task; nothing touched")
        if not self.deferrable:
            return super().execute(context)
        started = time.time()
        stop = self.stop_for(context)
        d = stop.take()
        self.log.info("%s: %s", d.outcome, d.reason)
        if self._outcome(d.outcome, d.reason):
            return None
        self.defer(trigger=BufferCapacityTrigger(**self.trigger_kwargs(context, stop, started)),
                   method_name="execute_complete", timeout=timedelta(seconds=self.wait_s + 60))

    def execute_complete(self, context: Any, event: dict[str, Any] | None = None) -> None:
        event = event or {"status": "error", "message": "no event"}
        if event["status"] in ("free", "decide"):  # the trigger leased nothing: this task decides, and takes
            stop = self.stop_for(context)
            d = stop.take()
            self.log.info("%s: %s", d.outcome, d.reason)
            if self._outcome(d.outcome, d.reason):
                return None
            deadline = float(event["deadline"])  # taken meanwhile by another: wait on, to the same deadline
            if time.time() >= deadline:
                raise AirflowFailException(f"no capacity for {self.domain or self.slot} within {self.wait_s:.0f}s: "
                                           f"{d.reason}")
            kw = self.trigger_kwargs(context, stop, deadline - self.wait_s)
            self.defer(trigger=BufferCapacityTrigger(**kw), method_name="execute_complete",
                       timeout=timedelta(seconds=max(60.0, deadline - time.time() + 60)))
        if not self._outcome(event["status"], event.get("message", "")):
            raise AirflowFailException(f"capacity wait ended without a lease: {event}")


class CheckpointSensor(_StopSensor):
    """Asks the jobs on the domain to checkpoint and waits until each has a fresh checkpoint.

    Waits up to `inline_s` in the task itself before deferring to the triggerer.
    """

    ui_color = "#fff4d6"

    task_args = _StopSensor.task_args | {"inline_s": 15.0}
    inline_s: float

    def poke(self, context: Any) -> bool:
        stop = self.stop_for(context)
        try:
            _jobs, since = stop.request_checkpoints()
        except StopError as exc:
            raise AirflowFailException(str(exc)) from None
        self._enforce(stop, since)
        stale = stop.stale_jobs(since)
        self.log.info("jobs without a fresh checkpoint: %s", ", ".join(stale) or "none")
        return not stale

    def _enforce(self, stop: Stop, since: float) -> None:
        """The requeue policy runs here, in the task, never in a read or a trigger's poll."""
        requeued = stop.enforce_checkpoint_policy(since)
        if requeued:
            self.log.warning("requeued by policy, without a fresh checkpoint: %s", ", ".join(requeued))

    def execute(self, context: Any) -> Any:
        if not self.deferrable:
            return super().execute(context)
        started = time.time()
        stop = self.stop_for(context)
        try:
            jobs, since = stop.request_checkpoints()
        except StopError as exc:
            raise AirflowFailException(str(exc)) from None
        stale = stop.stale_jobs(since)
        self.log.info("asked %d job(s) to checkpoint; waiting for %s", len(jobs), ", ".join(stale) or "none")
        # A checkpoint usually lands within seconds: wait for it here briefly, because a deferral
        # round trip through the triggerer costs seconds of every job's progress at each stop.
        inline_until = time.monotonic() + min(self.inline_s, self.wait_s)
        while stale and time.monotonic() < inline_until:
            time.sleep(stop.timeouts.poll_s)
            self._enforce(stop, since)
            stale = stop.stale_jobs(since)
        if not stale:
            self.log.info("every job on %s has a fresh checkpoint", self.domain)
            return None
        kw = self.trigger_kwargs(context, stop, started) | {"since": since}
        self.defer(trigger=CheckpointTrigger(**kw), method_name="execute_complete",
                   timeout=timedelta(seconds=self.wait_s + 60))

    def execute_complete(self, context: Any, event: dict[str, Any] | None = None) -> None:
        event = event or {}
        if event.get("status") == "policy_due":  # the trigger only reports it; the task requeues
            stop = self.stop_for(context)
            since = float(event["since"])
            self._enforce(stop, since)
            stale = stop.stale_jobs(since)
            if stale:
                kw = self.trigger_kwargs(context, stop, float(event["deadline"]) - self.wait_s) | {"since": since}
                self.defer(trigger=CheckpointTrigger(**kw), method_name="execute_complete",
                           timeout=timedelta(seconds=max(60.0, kw["deadline"] - time.time() + 60)))
            event = {"status": "fresh", "message": "silent jobs requeued by policy; the rest checkpointed"}
        if event.get("status") != "fresh":
            raise AirflowFailException(
                f"jobs on {self.domain} did not checkpoint within {self.wait_s:.0f}s: {event.get('message')}"
            )
        self.log.info(event["message"])
