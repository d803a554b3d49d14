"""What one poll of a trigger costs: the config, the fleet client and the stop are built once per trigger,
and each poll reads the fleet once, at the interval the config sets (`fleet.poll_s`).

The fleet is the in-process simulator behind a counter (the Airflow hook is patched to return it), so
every read a poll makes is seen; test_triggers.py runs the same triggers against a live server."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import railyard.domain.config
from railyard.domain.models import Host, Job
from railyard.ledger import Ledger
from railyard.operations.stop import Stop
from railyard.sim.engine import SimEngine
from railyard_airflow.triggers.stop import BufferCapacityTrigger, CheckpointTrigger
from tests.support.configs import small_config, write_config


class CountingFleet:
    """The simulator, counting each read of the fleet."""

    def __init__(self, engine: SimEngine):
        self.engine = engine
        self.reads: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def hosts(self, names: list[str] | None = None) -> list[Host]:
        self.reads["hosts"] += 1
        return self.engine.hosts(names)

    def jobs(self, hosts: list[str] | None = None) -> list[Job]:
        self.reads["jobs"] += 1
        return self.engine.jobs(hosts)


@pytest.fixture
def polls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    from railyard_airflow import context
    from railyard_airflow.hooks.fleet import FleetHook

    data = small_config(speed=120)
    data["compatibility"] = {"order": ["kernel"]}  # shaped: a stop's targets also read the fleet (rollout gates)
    path = write_config(tmp_path / "railyard.yaml", data)
    context.config.cache_clear()
    built: Counter[str] = Counter()
    real_load, real_make_stop = railyard.domain.config.load_config, context.make_stop

    def load_config(p: Any = None) -> Any:
        built["config"] += 1
        return real_load(p)

    def make_stop(**kw: Any) -> Any:
        built["stop"] += 1
        return real_make_stop(**kw)

    monkeypatch.setattr(context, "load_config", load_config)
    monkeypatch.setattr(context, "make_stop", make_stop)
    cfg = context.config(str(path))
    fleet = CountingFleet(SimEngine(cfg, None))

    def get_conn(self: FleetHook) -> CountingFleet:
        built["fleet"] += 1
        return fleet

    monkeypatch.setattr(FleetHook, "get_conn", get_conn)
    yield {"cfg": cfg, "path": str(path), "fleet": fleet, "built": built, "url": f"sqlite:///{tmp_path}/ledger.db"}
    context.config.cache_clear()


def run_counting(trigger: Any) -> tuple[dict[str, Any], int]:
    """The trigger's own loop until its first event, and how many polls it made."""
    n = 0
    probe = trigger.probe

    def counted() -> Any:
        nonlocal n
        n += 1
        return probe()

    trigger.probe = counted

    async def go() -> dict[str, Any]:
        async for ev in trigger.run():
            return dict(ev.payload)
        raise AssertionError("no event")

    return asyncio.run(asyncio.wait_for(go(), 60)), n


def test_a_capacity_trigger_builds_its_world_once_and_reads_the_fleet_once_per_poll(polls: dict[str, Any]) -> None:
    cfg, fleet, built = polls["cfg"], polls["fleet"], polls["built"]
    holder = Stop(config=cfg, train=cfg.train("demo"), domain=cfg.domain("pod-a"), op_id="other/run/pod-a",
                  fleet=fleet.engine, ledger=Ledger(polls["url"]))
    assert holder.take().granted  # pod-b waits behind it (max_domains_down 1)
    fleet.reads.clear()
    trig = BufferCapacityTrigger(train_id="demo", domain="pod-b", run_id="r1", config_path=polls["path"],
                                 ledger_url=polls["url"], deadline=time.time() + 1.0, poll_interval=0.05)
    ev, n = run_counting(trig)
    assert ev["status"] == "timeout", ev
    assert n >= 5, n
    assert built == {"config": 1, "fleet": 1, "stop": 1}  # not once per poll
    assert fleet.reads["hosts"] <= n and fleet.reads["jobs"] <= n, (fleet.reads, n)


def test_a_checkpoint_trigger_reads_the_jobs_once_per_poll(polls: dict[str, Any]) -> None:
    cfg, fleet, built = polls["cfg"], polls["fleet"], polls["built"]
    s = Stop(config=cfg, train=cfg.train("demo"), domain=cfg.domain("pod-a"), op_id="demo/r2/pod-a",
             fleet=fleet.engine, ledger=Ledger(polls["url"]))
    assert s.take().granted
    jobs, since = s.request_checkpoints()
    assert jobs
    for j in jobs:
        fleet.engine.set_job(j, stuck=True)  # never checkpoints: the trigger polls until its deadline
    fleet.reads.clear()
    trig = CheckpointTrigger(train_id="demo", domain="pod-a", run_id="r2", config_path=polls["path"],
                             ledger_url=polls["url"], deadline=time.time() + 1.0, poll_interval=0.05, since=since)
    ev, n = run_counting(trig)
    assert ev["status"] == "timeout" and "no fresh checkpoint" in ev["message"], ev
    assert n >= 5 and fleet.reads["jobs"] <= n and fleet.reads["hosts"] == 0, (fleet.reads, n)
    assert built == {"config": 1, "fleet": 1, "stop": 1}


def test_the_waits_poll_at_the_configs_interval(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from railyard_airflow import context
    from railyard_airflow.factory import build_train_dag

    data = small_config()
    data["fleet"] = {"poll_s": 7.5}
    path = write_config(tmp_path / "railyard.yaml", data)
    context.config.cache_clear()
    dag = build_train_dag(context.config(str(path)), "demo", str(path))
    waits: list[Any] = [t for t in dag.tasks if t.task_id.endswith(("wait_capacity", "wait_checkpoints"))]
    assert waits and {(t.poll_s, t.poke_interval) for t in waits} == {(7.5, 7.5)}
    data["fleet"] = {}  # the default for http
    write_config(path, data)
    context.config.cache_clear()
    dag = build_train_dag(context.config(str(path)), "demo", str(path))
    takes: list[Any] = [t for t in dag.tasks if t.task_id.endswith("wait_capacity")]
    assert {t.poll_s for t in takes} == {1.0}
    context.config.cache_clear()
