"""The triggers' own loop against a live simulator: what the real triggerer runs.

The simulator requires its token (the Stack makes one); the triggers get only the connection id and
find the token through the Airflow connection, as the triggerer does.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

import pytest

from railyard.devstack.stack import Stack, free_port
from railyard.ledger import Ledger
from railyard.operations.stop import Stop
from railyard_airflow.triggers.stop import BufferCapacityTrigger, CheckpointTrigger
from tests.support.configs import small_config, write_config


@pytest.fixture
def live(tmp_path, monkeypatch):
    cfg = write_config(tmp_path / "railyard.yaml", small_config(speed=120))
    stack = Stack(home=tmp_path / "stack", config_file=cfg, sim_port=free_port())
    fleet = stack.start_sim()
    monkeypatch.setenv("AIRFLOW_CONN_RAILYARD_FLEET", json.dumps(stack.fleet_connection()))
    yield stack, fleet, cfg, f"sqlite:///{tmp_path}/ledger.db"
    stack.stop()


def first_event(trigger) -> dict:
    async def go():
        async for ev in trigger.run():
            return ev.payload

    return asyncio.run(asyncio.wait_for(go(), 60))


def kwargs(stack, cfg, ledger_url, domain, run_id, **kw):
    return dict(train_id="demo", domain=domain, run_id=run_id, fleet_conn_id="railyard_fleet",
                ledger_url=ledger_url, config_path=str(cfg), poll_interval=0.1, **kw)


def test_capacity_trigger_waits_then_wakes_the_task_without_leasing(live):
    stack, fleet, cfg, url = live
    led = Ledger(url)
    conf = stack.config
    holder = Stop(config=conf, train=conf.train("demo"), domain=conf.domain("pod-a"), op_id="other/run/pod-a",
                  fleet=fleet, ledger=led)
    assert holder.take().granted
    trig = BufferCapacityTrigger(**kwargs(stack, cfg, url, "pod-b", "r1", deadline=time.time() + 1.0))
    assert first_event(trig)["status"] == "timeout"  # held elsewhere: it waits, then says so at its deadline
    holder.return_hosts()  # releases the lease
    trig = BufferCapacityTrigger(**kwargs(stack, cfg, url, "pod-b", "r1", deadline=time.time() + 30))
    ev = first_event(trig)
    assert ev["status"] == "free" and ev["deadline"] == trig.kw["deadline"], ev
    assert led.domains_out() == {}  # only the task it wakes takes the lease: a cleared task leaves none
    assert [w["op_id"] for w in led.waiting()] == ["demo/r1/pod-b"]  # it kept its place in line
    # it serialises to primitives only and round-trips
    path, kw = trig.serialize()
    assert path == "railyard_airflow.triggers.stop.BufferCapacityTrigger"
    assert all(isinstance(v, (str, int, float, type(None))) for v in kw.values())
    assert kw["fleet_conn_id"] == "railyard_fleet" and "fleet_url" not in kw
    assert stack.fleet_token not in json.dumps(kw) and stack.fleet_token not in repr(trig)
    again = BufferCapacityTrigger(**kw)  # a triggerer restart: the same kwargs make the same trigger
    assert again.serialize() == (path, kw)


def test_checkpoint_trigger_fires_when_jobs_checkpointed(live):
    stack, fleet, cfg, url = live
    conf = stack.config
    s = Stop(config=conf, train=conf.train("demo"), domain=conf.domain("pod-a"), op_id="demo/r2/pod-a",
             fleet=fleet, ledger=Ledger(url))
    assert s.take().granted
    jobs, since = s.request_checkpoints()
    assert jobs, "the small fleet runs jobs on pod-a"
    ev = first_event(CheckpointTrigger(**kwargs(stack, cfg, url, "pod-a", "r2", deadline=time.time() + 30,
                                                since=since)))
    assert ev["status"] == "fresh"
    assert s.stale_jobs(since) == []


def test_the_trigger_builds_its_fleet_once_per_instance(live, monkeypatch):
    from railyard_airflow.hooks.fleet import FleetHook

    stack, fleet, cfg, url = live
    built: list[str] = []
    real = FleetHook.get_conn

    def counting(self):
        built.append(self.fleet_conn_id)
        return real(self)

    monkeypatch.setattr(FleetHook, "get_conn", counting)
    conf = stack.config
    holder = Stop(config=conf, train=conf.train("demo"), domain=conf.domain("pod-a"), op_id="other/run/pod-a",
                  fleet=fleet, ledger=Ledger(url))
    assert holder.take().granted
    trig = BufferCapacityTrigger(**kwargs(stack, cfg, url, "pod-b", "r3", deadline=time.time() + 1.5))
    assert first_event(trig)["status"] == "timeout"
    assert built == ["railyard_fleet"]  # ~15 polls, one fleet


def test_a_refused_token_keeps_the_trigger_waiting_and_is_never_logged(live, monkeypatch, caplog, capsys):
    stack, fleet, cfg, url = live
    wrong = "tok-wrong-7c1e9a3b5d7f9e1a"
    monkeypatch.setenv("AIRFLOW_CONN_RAILYARD_FLEET", json.dumps(stack.fleet_connection() | {"password": wrong}))
    trig = BufferCapacityTrigger(**kwargs(stack, cfg, url, "pod-a", "r5", deadline=time.time() + 1.0))
    with caplog.at_level(logging.DEBUG):
        ev = first_event(trig)
    assert ev["status"] == "timeout"
    out = capsys.readouterr()  # the trigger logs through structlog to the console, the rest to logging
    logged = "\n".join([out.out, out.err, *(f"{r.getMessage()} {r.exc_text or ''}" for r in caplog.records)])
    assert "not authorized (HTTP 401" in logged and "the bearer credentials were refused" in logged
    assert wrong not in logged and stack.fleet_token not in logged
    assert wrong not in ev["message"]
