"""The triggers' own loop against a live simulator: what the real triggerer runs."""

from __future__ import annotations

import asyncio
import time

import pytest

from railyard.ledger import Ledger
from railyard.stack import Stack, free_port
from railyard.stop import Stop
from railyard_airflow.triggers.stop import BufferCapacityTrigger, CheckpointTrigger
from tests.support.configs import small_config, write_config


@pytest.fixture
def live(tmp_path):
    cfg = write_config(tmp_path / "railyard.yaml", small_config(speed=120))
    stack = Stack(home=tmp_path / "stack", config_file=cfg, sim_port=free_port())
    fleet = stack.start_sim()
    yield stack, fleet, cfg, f"sqlite:///{tmp_path}/ledger.db"
    stack.stop()


def first_event(trigger) -> dict:
    async def go():
        async for ev in trigger.run():
            return ev.payload

    return asyncio.run(asyncio.wait_for(go(), 60))


def kwargs(stack, cfg, ledger_url, domain, run_id, **kw):
    return dict(train_id="demo", domain=domain, run_id=run_id, fleet_url=stack.fleet_url, ledger_url=ledger_url,
                config_path=str(cfg), poll_interval=0.1, **kw)


def test_capacity_trigger_waits_then_grants(live):
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
    assert ev["status"] == "granted", ev
    assert set(led.domains_out()) == {"pod-b"}
    # it serialises to primitives only and round-trips
    path, kw = trig.serialize()
    assert path == "railyard_airflow.triggers.stop.BufferCapacityTrigger"
    assert all(isinstance(v, (str, int, float, type(None))) for v in kw.values())


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
