"""The waits of outside work (railyard.operations.outside), in the triggerer: for the hosts to be granted and
drained (the lease), and for the requester to say it is done (the page's API). Reads only: a poll leases,
drains and returns nothing; it wakes the task, which does. Like the stop's triggers, its kwargs hold no
secret (an operation id, a connection id, the config path): the ledger comes from the config and
RAILYARD_LEDGER_URL, as the task's did."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from railyard_airflow.hooks.fleet import FleetHook
from railyard_airflow.triggers.stop import poll_until_event


class OutsideTrigger(BaseTrigger):
    """`wait_for="grant"`: until the request would be granted now, its jobs have all checkpointed (or the
    checkpoint wait ran out), or the requester gave up. `wait_for="return"`: until the requester asks for its
    hosts back, or the operation ended. Each poll of a queued request keeps its place in line (the ledger's
    waiters expire after 30 s unseen), so `poll_interval` stays under that."""

    def __init__(self, *, op_id: str, config_path: str, wait_for: str, deadline: float,
                 fleet_conn_id: str = FleetHook.default_conn_name, poll_interval: float = 5.0) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.kw: dict[str, Any] = dict(op_id=op_id, config_path=config_path, wait_for=wait_for, deadline=deadline,
                                       fleet_conn_id=fleet_conn_id, poll_interval=poll_interval)
        self._fleet: Any = None
        self.last = ""

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return f"{type(self).__module__}.{type(self).__qualname__}", dict(self.kw)

    def _ledger(self) -> Any:
        from railyard_airflow.context import config, ledger

        return ledger(config(self.kw["config_path"]).ledger.url)

    def probe(self) -> dict[str, Any] | None:
        led = self._ledger()
        op = led.operation(self.kw["op_id"])
        if op is None or op["state"] != "active":
            return {"status": "ended"}
        detail = led.detail(self.kw["op_id"])
        phase = detail.get("phase", "queued")
        if self.kw["wait_for"] == "return":
            self.last = f"the requester works on the hosts ({phase})"
            return {"status": "asked"} if detail.get("return_asked") else None
        if detail.get("return_asked") or phase not in ("queued", "checkpointing"):
            return {"status": "ready", "phase": phase}
        return self._probe_grant(led, detail)

    def _probe_grant(self, led: Any, detail: dict[str, Any]) -> dict[str, Any] | None:
        from railyard.fleet.once import ReadOnce
        from railyard.operations import outside
        from railyard_airflow.context import config

        if self._fleet is None:
            self._fleet = FleetHook(self.kw["fleet_conn_id"], config_path=self.kw["config_path"]).get_conn()
        stop = outside.stop_of(config(self.kw["config_path"]), ReadOnce(self._fleet), led, self.kw["op_id"],
                               say=lambda _m: None)
        if detail.get("phase") != "checkpointing":
            d = stop.take(probe=True)  # reads, and keeps the request's place among the waiters
            self.last = d.reason
            return None if d.outcome == "wait" else {"status": "ready", "phase": "queued"}
        since = float(detail["checkpoint_requested_at"])
        stale = stop.stale_jobs(since)
        waited = time.time() - float(detail.get("checkpoint_asked_wall") or time.time())
        self.last = f"checkpoints of {', '.join(stale)}" if stale else ""
        if not stale or stop.policy_due(since) or waited > stop.timeouts.checkpoint_wait_s:
            return {"status": "ready", "phase": "checkpointing"}
        return None

    async def cleanup(self) -> None:
        from railyard.fleet.http import HttpFleet

        if isinstance(self._fleet, HttpFleet):
            self._fleet.close()
        await super().cleanup()

    async def run(self) -> AsyncIterator[TriggerEvent]:
        # the task resumes from the event alone: it says which request, and its deadline
        async for event in poll_until_event(self, {"op_id": self.kw["op_id"], "deadline": self.kw["deadline"]}):
            yield event
