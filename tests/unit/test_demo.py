"""`make demo` runs the first train of the config, as written, and its summary counts that train's own hosts."""

from __future__ import annotations

from types import SimpleNamespace

from railyard.devstack.demo import first_train, progress_line, summary
from railyard.domain.config import parse_config
from railyard.domain.models import Step
from railyard.sim.engine import SimEngine
from tests.support.configs import small_config


def two_trains() -> dict:
    """Three domains of 4 hosts; the first train (as written) visits only pod-b, the second every domain."""
    return small_config(trains=[
        {"id": "zeta", "releases": ["kernel-6-1-28"], "domains": ["pod-b"]},
        {"id": "alpha", "releases": ["driver-570"]},
    ])


def test_the_demo_runs_the_first_train_as_written_not_the_alphabetically_first() -> None:
    assert first_train(parse_config(two_trains())) == "zeta"


def test_the_summary_counts_the_trains_own_hosts() -> None:
    cfg = parse_config(two_trains())
    fleet = SimEngine(cfg, None, clock=lambda: 1000.0)
    fleet.offboard("gpu-a01", "broken before the run", "test")  # in pod-a: not the first train's business
    s = summary(SimpleNamespace(config=cfg), fleet, "zeta", "success", 10.0)  # type: ignore[arg-type]
    assert (s["hosts"], s["fleet_hosts"], s["domains"]) == (4, 12, 1)
    assert s["offboarded"] == 0 and s["offboard_reasons"] == {}
    assert s["upgraded"] == 0  # nothing ran: the kernel is not at the target on pod-b's hosts
    every = summary(SimpleNamespace(config=cfg), fleet, "alpha", "success", 10.0)  # type: ignore[arg-type]
    assert (every["hosts"], every["offboarded"]) == (12, 1)


def test_the_progress_line_counts_hosts_at_target_and_the_summary_those_back_in_service() -> None:
    """A host upgraded but not yet returned is at target in the progress line, not upgraded in the summary."""
    cfg = parse_config(two_trains())
    now = [1000.0]
    fleet = SimEngine(cfg, None, clock=lambda: now[0])
    fleet.drain(["gpu-b01"], "op-1")
    now[0] += 1.0  # 600 fleet s: the drain is over
    fleet.upgrade_hosts({"gpu-b01": [Step(component="kernel", version="6.1.0-28")]}, "op-1")
    now[0] += 1.0  # the install (180 s) and its reboot are over: drained, at target
    stack = SimpleNamespace(config=cfg, task_states=lambda _dag, _run: {"pod-b.upgrade": "running"})
    line = progress_line(stack, fleet, "zeta", "r", "zeta", now[0])  # type: ignore[arg-type]
    assert "domain 1/1 pod-b upgrade" in line and "at target 1/4" in line and "serving 11/12" in line, line
    s = summary(SimpleNamespace(config=cfg), fleet, "zeta", "running", 10.0)  # type: ignore[arg-type]
    assert s["upgraded"] == 0  # not back in service
