"""Triggers for the two waits of a stop. They carry only primitive kwargs and are safe to run twice."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from railyard.stop import Stop
from railyard_airflow.hooks.fleet import fleet_for_url


def _stop(kw: dict[str, Any]) -> Stop:
    from railyard_airflow.context import make_stop

    stop = make_stop(train_id=kw["train_id"], domain=kw["domain"], run_id=kw["run_id"],
                     fleet=fleet_for_url(kw["fleet_url"]), say=lambda _m: None,
                     ledger_url=kw["ledger_url"], path=kw["config_path"], slot=kw.get("slot"))
    assert stop is not None  # a slot defers only after it has claimed its domain
    return stop


class _PollingTrigger(BaseTrigger):
    def __init__(self, *, train_id: str, domain: str, run_id: str, fleet_url: str, ledger_url: str,
                 config_path: str, deadline: float, poll_interval: float = 1.0, since: float | None = None,
                 slot: str | None = None):
        super().__init__()
        self.kw = dict(train_id=train_id, domain=domain, slot=slot, run_id=run_id, fleet_url=fleet_url,
                       ledger_url=ledger_url, config_path=config_path, deadline=deadline,
                       poll_interval=poll_interval, since=since)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return f"{type(self).__module__}.{type(self).__qualname__}", dict(self.kw)

    def probe(self) -> dict[str, Any] | None:  # pragma: no cover - abstract
        raise NotImplementedError

    async def run(self) -> AsyncIterator[TriggerEvent]:
        while True:
            try:
                event = await asyncio.to_thread(self.probe)
            except Exception as exc:  # the fleet or ledger is briefly unreachable: keep waiting
                self.log.warning("probe failed, will retry: %s", exc)
                event = None
            if event is not None:
                yield TriggerEvent(event)
                return
            if time.time() >= self.kw["deadline"]:
                last = getattr(self, "last", None) or "no answer yet"
                yield TriggerEvent({"status": "timeout", "message": f"deadline passed while waiting ({last})"})
                return
            await asyncio.sleep(self.kw["poll_interval"])


class BufferCapacityTrigger(_PollingTrigger):
    """Tries to take the domain lease until the buffers allow it, or the deadline passes."""

    def probe(self) -> dict[str, Any] | None:
        d = _stop(self.kw).take()
        self.last = d.reason
        if d.outcome == "wait":
            self.log.info("waiting: %s", d.reason)
            return None
        return {"status": d.outcome, "message": d.reason}


class CheckpointTrigger(_PollingTrigger):
    """Waits until every running job on the domain has checkpointed since the request."""

    def probe(self) -> dict[str, Any] | None:
        stop = _stop(self.kw)
        since = float(self.kw["since"])
        stale = stop.stale_jobs(since)
        self.last = f"no fresh checkpoint from {', '.join(stale)}" if stale else ""
        if stale and stop.policy_due(since):  # a read; the task enforces the policy
            return {"status": "policy_due", "since": since, "deadline": self.kw["deadline"],
                    "message": f"silent past the policy's grace: {', '.join(stale)}"}
        if stale:
            self.log.info("waiting for checkpoints of %s", ", ".join(stale))
            return None
        return {"status": "fresh", "message": "every job on the domain has a fresh checkpoint"}
