"""Triggers for the two waits of a stop. They carry only primitive kwargs and are safe to run twice.

Their kwargs are readable by anyone who may view the task (REST API, UI), so they hold no secret:
the fleet is named by its Airflow connection id and the config path, and rebuilt in the trigger with
`FleetHook(fleet_conn_id, config_path=...).get_conn()` (whichever backend the config names: http,
ssh or slurm), once per trigger instance. A ledger URL travels only when it has no password; otherwise
the trigger resolves the ledger from the config and RAILYARD_LEDGER_URL, as the task did.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from railyard.fleet.port import Fleet
from railyard.operations.stop import Stop
from railyard_airflow.hooks.fleet import FleetHook


async def poll_until_event(trigger: Any, extra: dict[str, Any] | None = None) -> AsyncIterator[TriggerEvent]:
    """A trigger's loop: `trigger.probe()` (in a thread) every `kw["poll_interval"]` seconds until it answers
    an event, or `kw["deadline"]` passes (a "timeout" event saying what it last saw, `trigger.last`); a probe
    that raises (the fleet or ledger briefly unreachable) is retried. The event carries `extra`."""
    while True:
        try:
            event = await asyncio.to_thread(trigger.probe)
        except Exception as exc:  # the fleet or ledger is briefly unreachable: keep waiting
            trigger.log.warning("probe failed, will retry: %s", exc)
            event = None
        if event is None and time.time() >= trigger.kw["deadline"]:
            last = getattr(trigger, "last", None) or "no answer yet"
            event = {"status": "timeout", "message": f"deadline passed while waiting ({last})"}
        if event is not None:
            yield TriggerEvent(event | (extra or {}))  # type: ignore[no-untyped-call]
            return
        await asyncio.sleep(trigger.kw["poll_interval"])


class _PollingTrigger(BaseTrigger):
    def __init__(self, *, train_id: str, domain: str, run_id: str, config_path: str, deadline: float,
                 fleet_conn_id: str = FleetHook.default_conn_name, ledger_url: str | None = None,
                 poll_interval: float = 1.0, since: float | None = None, slot: str | None = None):
        super().__init__()  # type: ignore[no-untyped-call]
        self.kw: dict[str, Any] = dict(
            train_id=train_id, domain=domain, slot=slot, run_id=run_id, fleet_conn_id=fleet_conn_id,
            ledger_url=ledger_url, config_path=config_path, deadline=deadline, poll_interval=poll_interval,
            since=since)
        self._fleet: Fleet | None = None
        self._stop: Stop | None = None

    def fleet(self) -> Fleet:
        """The fleet, built once per trigger instance (config, connection and HTTP session reused by
        every poll; a new instance after a triggerer restart reads the connection afresh)."""
        if self._fleet is None:
            self._fleet = FleetHook(self.kw["fleet_conn_id"], config_path=self.kw["config_path"]).get_conn()
        return self._fleet

    def stop(self) -> Stop:
        """The stop for one poll. Its config, ledger and fleet client are built once per trigger
        instance; each poll gets a fresh Stop over a `ReadOnce` view of the fleet, so a poll reads the
        fleet once (one `hosts()`, one `jobs()`, one clock) however many questions the stop asks:
        on Slurm one sinfo and one squeue per poll, at the config's `fleet.poll_s`."""
        from dataclasses import replace

        from railyard.fleet.once import ReadOnce
        from railyard_airflow.context import make_stop

        if self._stop is None:
            kw = self.kw
            stop = make_stop(train_id=kw["train_id"], domain=kw["domain"], run_id=kw["run_id"], fleet=self.fleet(),
                             say=lambda _m: None, ledger_url=kw["ledger_url"], path=kw["config_path"],
                             slot=kw.get("slot"))
            assert stop is not None  # a slot defers only after it has claimed its domain
            self._stop = stop
        return replace(self._stop, fleet=ReadOnce(self.fleet()))  # nothing read by an earlier poll is reused

    async def cleanup(self) -> None:
        from railyard.fleet.http import HttpFleet

        if isinstance(self._fleet, HttpFleet):  # ssh/slurm fleets are per-process and shared: left open
            self._fleet.close()
        await super().cleanup()

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return f"{type(self).__module__}.{type(self).__qualname__}", dict(self.kw)

    def probe(self) -> dict[str, Any] | None:  # pragma: no cover - abstract
        raise NotImplementedError

    async def run(self) -> AsyncIterator[TriggerEvent]:
        async for event in poll_until_event(self):
            yield event


class BufferCapacityTrigger(_PollingTrigger):
    """Waits until the buffers would allow the domain, or the deadline passes. It leases nothing:
    it probes (keeping the operation's place among the waiters) and wakes the task, which takes the
    lease itself, so a lease is only ever taken by a live task (a task cleared or failed while
    deferred leaves none behind)."""

    def probe(self) -> dict[str, Any] | None:
        d = self.stop().take(probe=True)
        self.last = d.reason
        if d.outcome == "wait":
            self.log.info("waiting: %s", d.reason)
            return None
        return {"status": "free" if d.outcome == "free" else "decide", "outcome": d.outcome, "message": d.reason,
                "deadline": self.kw["deadline"]}


class CheckpointTrigger(_PollingTrigger):
    """Waits until every running job on the domain has checkpointed since the request."""

    def probe(self) -> dict[str, Any] | None:
        stop = self.stop()
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
