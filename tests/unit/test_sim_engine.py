"""The fleet simulator in-process: a fake real clock moved by hand, so nothing sleeps."""

from __future__ import annotations

import json
import random
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from railyard.domain.config import RailyardConfig, parse_config
from railyard.domain.models import HostState, Step
from railyard.fleet import FleetNotFound
from railyard.fleet.port import Fleet, FleetError
from railyard.sim.engine import SimEngine

SPEED = 10.0
TARGETS = {"gpu-driver": "570.86.15", "nic-firmware": "28.43.1014"}
STEPS = [Step(component=c, version=v) for c, v in TARGETS.items()]
DRIVER_S, NIC_S, REBOOT_S = 300.0, 120.0, 180.0
UPGRADE_S = DRIVER_S + NIC_S + REBOOT_S  # only the driver reboots, once


def small_config(**sim: object) -> RailyardConfig:
    """4 domains x 4 hosts; 2 jobs of 4 hosts placed from offset 2 (job-01: a3 a4 b1 b2; job-02: b3 b4 c1 c2)."""
    simulator = {
        "speed": SPEED,
        "start_at": "1970-01-01T00:00:00Z",  # fleet time 0: the figures below read as offsets
        "seed": 3,
        "initial_versions": {"gpu-driver": "550.127.08", "nic-firmware": "28.39.2048"},
        "gpus_per_host": 8,
        "jobs": {"count": 2, "hosts_per_job": 4, "checkpoint_interval_s": 1800, "checkpoint_duration_s": 60},
        "drain_s": 120,
        "check_s": 300,
        "reboot_s": REBOOT_S,
        "return_s": 30,
        "upgrade_fail_rate": 0.0,
        "check_fail_rate": 0.0,
        "host_failure_per_hour": 0.0,
        "repair_s": 3600,
    }
    simulator.update(sim)
    return parse_config(
        {
            "components": [
                {"name": "gpu-driver", "reboot": True, "duration_s": DRIVER_S},
                {"name": "nic-firmware", "reboot": False, "duration_s": NIC_S},
            ],
            "releases": [
                {"id": "driver-570", "component": "gpu-driver", "version": "570.86.15"},
                {"id": "nic-28-43", "component": "nic-firmware", "version": "28.43.1014"},
            ],
            "domains": [{"name": f"pod-{x}", "hosts": f"gpu-{x}[1-4]"} for x in "abcd"],
            "trains": [{"id": "t", "releases": ["driver-570", "nic-28-43"]}],
            "buffers": {"maintenance": {"hosts": 4}, "failure": {"hosts": 1}},
            "simulator": simulator,
        }
    )


class FakeClock:
    """Real seconds, moved by hand; `fleet(s)` moves it so the fleet clock advances `s` seconds."""

    def __init__(self) -> None:
        self.t = 5000.0

    def __call__(self) -> float:
        return self.t

    def fleet(self, seconds: float) -> None:
        self.t += seconds / SPEED


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def sim(clock: FakeClock) -> SimEngine:
    return SimEngine(small_config(), None, clock=clock)


POD_A = ["gpu-a1", "gpu-a2", "gpu-a3", "gpu-a4"]


def drained(sim: SimEngine, clock: FakeClock, hosts: list[str], op: str) -> None:
    sim.drain(hosts, op)
    clock.fleet(120)
    assert {h.state for h in sim.hosts(hosts)} == {HostState.DRAINED}


def test_implements_the_fleet_protocol(sim: SimEngine) -> None:
    assert isinstance(sim, Fleet)


def test_jobs_are_placed_across_two_domains(sim: SimEngine) -> None:
    jobs = {j.id: j for j in sim.jobs()}
    assert jobs["job-01"].hosts == ["gpu-a3", "gpu-a4", "gpu-b1", "gpu-b2"]
    assert jobs["job-02"].hosts == ["gpu-b3", "gpu-b4", "gpu-c1", "gpu-c2"]
    assert all(j.state == "running" and j.gpus == 32 for j in jobs.values())
    assert [j.id for j in sim.jobs(["gpu-b4"])] == ["job-02"]


def test_fleet_clock_runs_speed_times_real_time(sim: SimEngine, clock: FakeClock) -> None:
    start = sim.now()
    clock.t += 3.0
    assert sim.now() == pytest.approx(start + 3.0 * SPEED)


def test_drain_interrupts_job_and_records_lost_work(sim: SimEngine, clock: FakeClock) -> None:
    clock.fleet(500)
    sim.drain(POD_A, "op-1")
    audit = sim.audit()
    assert len(audit["interruptions"]) == 1
    hit = audit["interruptions"][0]
    assert hit["job"] == "job-01" and hit["host"] in POD_A and "op-1" in hit["reason"]
    assert hit["lost_s"] == pytest.approx(500)
    assert hit["lost_gpu_hours"] == pytest.approx(500 / 3600 * 32)
    assert audit["lost_gpu_hours"] == pytest.approx(500 / 3600 * 32)
    assert audit["max_lost_s"] == pytest.approx(500)
    # re-placed at once on free serving hosts outside pod-a, resuming from its checkpoint
    job = next(j for j in sim.jobs() if j.id == "job-01")
    assert job.state == "running" and not set(job.hosts) & set(POD_A)
    assert all(h.state == HostState.SERVING for h in sim.hosts(job.hosts))
    assert job.last_checkpoint == pytest.approx(500)
    assert {h.state for h in sim.hosts(POD_A)} == {HostState.DRAINING}
    assert all(h.operation == "op-1" for h in sim.hosts(POD_A))
    clock.fleet(119)
    assert {h.state for h in sim.hosts(POD_A)} == {HostState.DRAINING}
    clock.fleet(1)
    assert {h.state for h in sim.hosts(POD_A)} == {HostState.DRAINED}


def test_job_without_hosts_waits_and_is_placed_when_hosts_return(clock: FakeClock) -> None:
    sim = SimEngine(small_config(jobs={"count": 4, "hosts_per_job": 4}), None, clock=clock)
    assert all(j.state == "running" for j in sim.jobs())  # 16 hosts, 4 jobs of 4: the fleet is full
    assert sim.jobs(["gpu-a1"])[0].hosts == ["gpu-d3", "gpu-d4", "gpu-a1", "gpu-a2"]  # placement wraps around
    drained(sim, clock, POD_A, "op-1")
    assert sorted(i["job"] for i in sim.audit()["interruptions"]) == ["job-01", "job-04"]
    # job-01 takes the 4 hosts the two jobs left outside pod-a; job-04 waits with no hosts
    pending = [j for j in sim.jobs() if j.state == "pending"]
    assert [j.id for j in pending] == ["job-04"] and pending[0].hosts == []
    sim.return_to_service(POD_A, "op-1")
    clock.fleet(30)
    assert all(j.state == "running" for j in sim.jobs())


def test_requested_checkpoint_completes_after_its_duration(sim: SimEngine, clock: FakeClock) -> None:
    clock.fleet(700)
    at = sim.request_checkpoint(["job-01"])
    assert at == pytest.approx(700)
    job = sim.jobs(["gpu-a3"])[0]
    assert job.checkpoint_requested_at == pytest.approx(at) and job.last_checkpoint < at
    clock.fleet(59)
    assert sim.jobs(["gpu-a3"])[0].last_checkpoint < at
    clock.fleet(1)
    assert sim.jobs(["gpu-a3"])[0].last_checkpoint >= at
    sim.drain(POD_A, "op-1")  # a fresh checkpoint: nothing lost
    assert sim.audit()["max_lost_s"] == pytest.approx(0, abs=1e-6)
    with pytest.raises(FleetNotFound, match="job-99"):
        sim.request_checkpoint(["job-99"])


def test_jobs_checkpoint_on_their_own_interval(sim: SimEngine, clock: FakeClock) -> None:
    clock.fleet(1800 * 2 + 10)
    assert all(j.last_checkpoint == pytest.approx(3600) for j in sim.jobs())


def test_upgrade_applies_versions_once_and_is_idempotent(sim: SimEngine, clock: FakeClock) -> None:
    drained(sim, clock, ["gpu-a1"], "op-1")
    sim.upgrade("gpu-a1", STEPS, "op-1")
    assert sim.hosts(["gpu-a1"])[0].state == HostState.UPGRADING
    clock.fleet(100)
    sim.upgrade("gpu-a1", STEPS, "op-1")  # a retried task re-attaches, nothing new starts
    clock.fleet(UPGRADE_S - 101)
    assert sim.hosts(["gpu-a1"])[0].state == HostState.UPGRADING  # driver + nic + one reboot
    clock.fleet(1)
    host = sim.hosts(["gpu-a1"])[0]
    assert host.state == HostState.DRAINED and host.versions == TARGETS and host.last_error is None
    sim.upgrade("gpu-a1", STEPS, "op-1")  # at target: nothing happens
    assert sim.hosts(["gpu-a1"])[0].state == HostState.DRAINED
    installs = {(i["host"], i["component"], i["version"]): i["count"] for i in sim.audit()["installs"]}
    assert installs == {("gpu-a1", c, v): 1 for c, v in TARGETS.items()}
    stop = sim.audit()["stops"][0]
    assert stop["upgrade_s"] == pytest.approx(UPGRADE_S)


def test_upgrade_skips_steps_at_target_and_coalesces_reboots(sim: SimEngine, clock: FakeClock) -> None:
    drained(sim, clock, ["gpu-a1"], "op-1")
    sim.upgrade("gpu-a1", [Step(component="nic-firmware", version="28.43.1014")], "op-1")
    clock.fleet(NIC_S)  # no reboot for the NIC alone
    assert sim.hosts(["gpu-a1"])[0].state == HostState.DRAINED
    sim.upgrade("gpu-a1", STEPS, "op-1")  # only the driver is left
    clock.fleet(DRIVER_S + REBOOT_S)
    assert sim.hosts(["gpu-a1"])[0].versions == TARGETS
    assert all(i["count"] == 1 for i in sim.audit()["installs"])


def test_upgrade_needs_the_host_drained_and_held(sim: SimEngine, clock: FakeClock) -> None:
    with pytest.raises(FleetError, match="gpu-a1.*serving"):
        sim.upgrade("gpu-a1", STEPS, "op-1")
    drained(sim, clock, ["gpu-a1"], "op-1")
    with pytest.raises(FleetError, match="held by operation 'op-1'"):
        sim.upgrade("gpu-a1", STEPS, "op-2")
    with pytest.raises(FleetError, match="unknown component 'bios'"):
        sim.upgrade("gpu-a1", [Step(component="bios", version="1.2")], "op-1")


def test_failed_upgrade_sets_last_error_and_keeps_earlier_steps(sim: SimEngine, clock: FakeClock) -> None:
    sim.settings(upgrade_fail_rate=1.0)
    drained(sim, clock, ["gpu-a1"], "op-1")
    sim.upgrade("gpu-a1", STEPS, "op-1")
    clock.fleet(UPGRADE_S)
    host = sim.hosts(["gpu-a1"])[0]
    assert host.state == HostState.DRAINED
    assert host.last_error is not None and host.last_error.startswith("install ") and " failed: " in host.last_error
    failed_comp = host.last_error.split()[1]
    assert host.versions[failed_comp] != TARGETS[failed_comp]
    order = list(TARGETS)
    for comp in order[: order.index(failed_comp)]:
        assert host.versions[comp] == TARGETS[comp]


def test_check_fails_on_a_wrong_version_and_names_it(sim: SimEngine, clock: FakeClock) -> None:
    drained(sim, clock, ["gpu-a1"], "op-1")
    first = sim.start_check("gpu-a1", TARGETS, "op-1")
    assert first.status == "pending" and sim.hosts(["gpu-a1"])[0].state == HostState.CHECKING
    clock.fleet(300)
    [result] = sim.check_results(["gpu-a1", "gpu-a2"], "op-1")  # a2 never checked: left out
    assert result.status == "failed"
    assert "gpu-driver" in result.reason and "550.127.08" in result.reason and "570.86.15" in result.reason
    assert result.versions["gpu-driver"] == "550.127.08"
    assert sim.hosts(["gpu-a1"])[0].state == HostState.DRAINED
    again = sim.start_check("gpu-a1", TARGETS, "op-1")  # a repeat returns the existing check
    assert again == result and sim.hosts(["gpu-a1"])[0].state == HostState.DRAINED
    assert sim.check_results(["gpu-a1"], "op-2") == []


def test_check_fail_rate_gives_a_deep_check_reason(sim: SimEngine, clock: FakeClock) -> None:
    sim.settings(check_fail_rate=1.0)
    drained(sim, clock, ["gpu-a1"], "op-1")
    sim.start_check("gpu-a1", {"gpu-driver": "550.127.08"}, "op-1")
    clock.fleet(300)
    [result] = sim.check_results(["gpu-a1"], "op-1")
    assert result.status == "failed" and "mismatch" not in result.reason and result.reason


def full_stop(sim: SimEngine, clock: FakeClock, hosts: list[str], op: str) -> None:
    drained(sim, clock, hosts, op)
    for h in hosts:
        sim.upgrade(h, STEPS, op)
    clock.fleet(UPGRADE_S)
    for h in hosts:
        sim.start_check(h, TARGETS, op)
    clock.fleet(300)
    assert {r.status for r in sim.check_results(hosts, op)} == {"passed"}
    sim.return_to_service(hosts, op)
    clock.fleet(30)


def test_return_without_a_passed_check_is_counted_unverified(sim: SimEngine, clock: FakeClock) -> None:
    full_stop(sim, clock, ["gpu-a1"], "op-1")
    drained(sim, clock, ["gpu-a2", "gpu-a3"], "op-2")
    sim.return_to_service(["gpu-a2"], "op-2")  # never checked
    sim.return_to_service(["gpu-a2"], "op-2")  # a repeat: no second return
    sim.start_check("gpu-a3", TARGETS, "op-2")  # fails: not upgraded
    clock.fleet(300)
    assert sim.check_results(["gpu-a3"], "op-2")[0].status == "failed"
    sim.return_to_service(["gpu-a3"], "op-2")
    clock.fleet(30)
    hosts = ["gpu-a1", "gpu-a2", "gpu-a3"]
    assert {h.state for h in sim.hosts(hosts)} == {HostState.SERVING}
    assert all(h.operation is None for h in sim.hosts(hosts))
    audit = sim.audit()
    assert audit["unverified_returns"] == ["gpu-a2", "gpu-a3"]
    assert [(r["host"], r["verified"]) for r in audit["returns"]] == [
        ("gpu-a1", True),
        ("gpu-a2", False),
        ("gpu-a3", False),
    ]
    sim.return_to_service(["gpu-a1"], "op-1")  # serving already: a no-op


def test_a_full_stop_records_its_work_time(sim: SimEngine, clock: FakeClock) -> None:
    full_stop(sim, clock, POD_A, "op-1")
    assert {h.state for h in sim.hosts(POD_A)} == {HostState.SERVING}
    [stop] = sim.audit()["stops"]
    assert (stop["op"], stop["domain"], stop["complete"]) == ("op-1", "pod-a", True)
    expected = {"drain_s": 120, "upgrade_s": UPGRADE_S, "check_s": 300, "return_s": 30}
    assert {k: stop[k] for k in expected} == pytest.approx(expected)
    assert stop["work_s"] == pytest.approx(sum(expected.values()))
    assert sim.audit()["work_seconds"] == pytest.approx(sum(expected.values()) / SPEED)


def test_domains_out_counts_two_domains(sim: SimEngine, clock: FakeClock) -> None:
    sim.drain(POD_A, "op-1")
    assert sim.capacity().domains_out == ["pod-a"]
    sim.drain(["gpu-c1", "gpu-c2"], "op-2")
    cap = sim.capacity()
    assert cap.domains_out == ["pod-a", "pod-c"]
    assert cap.serving_hosts == 10 and cap.by_state["draining"] == 6 and cap.total_hosts == 16
    clock.fleet(120)
    sim.return_to_service(POD_A, "op-1")
    sim.return_to_service(["gpu-c1", "gpu-c2"], "op-2")
    clock.fleet(30)
    assert sim.capacity().domains_out == []
    audit = sim.audit()
    assert audit["max_domains_out"] == 2
    assert audit["min_serving_fraction"] == pytest.approx(10 / 16)
    assert [s["domains_out"] for s in sim.samples()][-1] == []


def test_drain_of_a_host_held_by_another_op_is_refused(sim: SimEngine, clock: FakeClock) -> None:
    sim.drain(["gpu-a1"], "op-1")
    sim.drain(["gpu-a1"], "op-1")  # the same op again: a no-op
    with pytest.raises(FleetError, match=r"gpu-a1 is draining, held by operation 'op-1'"):
        sim.drain(["gpu-a2", "gpu-a1"], "op-2")
    assert sim.hosts(["gpu-a2"])[0].state == HostState.SERVING  # refused whole: nothing touched
    with pytest.raises(FleetNotFound, match="gpu-zz9"):
        sim.drain(["gpu-zz9"], "op-2")
    with pytest.raises(FleetNotFound, match="gpu-zz9"):
        sim.hosts(["gpu-zz9"])


def test_offboard_sends_a_host_to_repair(sim: SimEngine, clock: FakeClock) -> None:
    drained(sim, clock, ["gpu-a1"], "op-1")
    sim.offboard("gpu-a1", "health check failed: XID 79", "op-1")
    sim.offboard("gpu-a1", "health check failed: XID 79", "op-1")
    clock.fleet(10 * 3600)
    host = sim.hosts(["gpu-a1"])[0]
    assert (host.state, host.reason, host.operation) == (HostState.REPAIR, "health check failed: XID 79", "op-1")
    with pytest.raises(FleetError, match="repair"):
        sim.drain(["gpu-a1"], "op-2")


def test_random_failures_interrupt_jobs_and_hosts_come_back(clock: FakeClock) -> None:
    sim = SimEngine(small_config(repair_s=600), None, clock=clock)
    sim.settings(host_failure_per_hour=50.0)
    clock.fleet(60)
    failed = [h for h in sim.hosts() if h.state == HostState.FAILED]
    assert failed and all(h.reason for h in failed)
    assert any(i["reason"].startswith("host failed:") for i in sim.audit()["interruptions"])
    sim.settings(host_failure_per_hour=0.0)
    clock.fleet(600)
    assert all(h.state == HostState.SERVING for h in sim.hosts())


def test_state_survives_a_restart(tmp_path: Path) -> None:
    db = str(tmp_path / "sim.db")
    first_clock = FakeClock()
    first = SimEngine(small_config(), db, clock=first_clock)
    full_stop(first, first_clock, ["gpu-a1"], "op-1")
    drained(first, first_clock, ["gpu-b1"], "op-2")
    first_clock.fleet(1000)
    before_now, before_audit = first.now(), first.audit()
    first.close()

    second_clock = FakeClock()
    second_clock.t = 123_456.0  # real time moved on while it was down: the fleet clock does not jump
    second = SimEngine(small_config(), db, clock=second_clock)
    assert second.now() == pytest.approx(before_now, abs=1e-6)
    assert second.hosts(["gpu-a1"])[0].versions == TARGETS
    b1 = second.hosts(["gpu-b1"])[0]
    assert (b1.state, b1.operation) == (HostState.DRAINED, "op-2")
    after = second.audit()
    for key in ("installs", "returns", "interruptions", "stops", "max_domains_out"):
        assert after[key] == before_audit[key]
    second.return_to_service(["gpu-b1"], "op-2")  # carries on where it stopped
    second_clock.fleet(30)
    assert second.hosts(["gpu-b1"])[0].state == HostState.SERVING


def test_a_reads_catching_up_is_saved_by_the_next_write_and_brought_about_again_after_a_crash(tmp_path: Path) -> None:
    """A read that finds a phase ended answers before it saves that (the next write or tick does); an engine
    opened on the database before then (the first one killed) shows the same world at the same fleet time, each
    event brought about again at its own time, and the clock never behind what a read showed."""
    db = str(tmp_path / "sim.db")
    clock = FakeClock()
    sim = SimEngine(small_config(), db, clock=clock)
    sim.drain(["gpu-a1", "gpu-a2"], "op-1")
    clock.fleet(121)  # the drain (120 s) is over: the next call brings it about

    def stored(host: str) -> str:
        with sqlite3.connect(db) as c:
            (data,) = c.execute("SELECT data FROM items WHERE kind = 'hosts' AND key = ?", (host,)).fetchone()
        return str(json.loads(data)["state"])

    seen = sim.hosts(["gpu-a1", "gpu-a2"])
    assert {h.state for h in seen} == {HostState.DRAINED}
    assert stored("gpu-a1") == "draining"  # not saved before the answer
    shown = sim.now()
    again = SimEngine(small_config(), db, clock=clock)  # the first one "killed": never closed, never saved since
    try:
        assert again.now() == pytest.approx(shown, abs=1e-6)
        assert again.hosts(["gpu-a1", "gpu-a2"]) == seen
        assert again.audit()["stops"] == sim.audit()["stops"]  # the drain ended at the same fleet time
    finally:
        again.close()
    sim.upgrade_hosts({"gpu-a1": STEPS}, "op-1")  # a write saves what the read found, and its own change
    assert stored("gpu-a2") == "drained" and stored("gpu-a1") == "upgrading"
    sim.close()


def test_the_next_transition_is_a_hosts_not_a_jobs_and_looking_changes_nothing(sim: SimEngine,
                                                                                  clock: FakeClock) -> None:
    """`next_transition_in` is the real time to the next end of a host's transition; the jobs' checkpoints,
    due all along, do not count; asking brings nothing about."""
    assert sim.next_transition_in() is None  # jobs checkpoint on their cadence, no host is in transition
    sim.drain(["gpu-a1"], "op-1")
    clock.fleet(30)
    sim.drain(["gpu-a2"], "op-1")
    assert sim.next_transition_in() == pytest.approx(90 / SPEED)  # gpu-a1's drain, 120 s from its start
    clock.fleet(100)
    assert sim.next_transition_in() == 0.0  # a1's end is past and not yet brought about
    assert sim._hosts["gpu-a1"].state == HostState.DRAINING  # looking did not advance the world
    sim.advance()
    assert sim.next_transition_in() == pytest.approx(20 / SPEED)  # now gpu-a2's
    clock.fleet(20)
    sim.advance()
    assert sim.next_transition_in() is None
    assert {h.state for h in sim.hosts(["gpu-a1", "gpu-a2"])} == {HostState.DRAINED}


def test_the_servers_clock_brings_a_phase_end_about_as_it_falls_due_and_saves_it_later(tmp_path: Path) -> None:
    """The server's ticker wakes at the end of each host's transition (not only every `every_s`), so a phase's
    end is brought about then, before any read comes for it; it is saved by the next write or, when none comes,
    by the first tick `save_after_s` after it."""
    from railyard.sim.app import _ticker

    db = str(tmp_path / "sim.db")
    clock = FakeClock()
    sim = SimEngine(small_config(), db, clock=clock)
    sim.drain(["gpu-a1", "gpu-a2"], "op-1")  # ends 120 fleet s = 12 real s from now

    def stored(host: str) -> str:
        with sqlite3.connect(db) as c:
            (data,) = c.execute("SELECT data FROM items WHERE kind = 'hosts' AND key = ?", (host,)).fetchone()
        return str(json.loads(data)["state"])

    class Stop:
        """`threading.Event` for the ticker: each wait moves the fake clock; the state held and saved is seen."""

        def __init__(self) -> None:
            self.waits: list[float] = []
            self.seen: list[tuple[str, str]] = []

        def wait(self, s: float) -> bool:
            self.seen.append((sim._hosts["gpu-a1"].state.value, stored("gpu-a1")))
            self.waits.append(s)
            clock.t += s
            return len(self.waits) > 5

    stop = Stop()
    _ticker(sim, stop, every_s=5.0, soonest_s=0.01, save_after_s=3.0)  # type: ignore[arg-type]
    assert stop.waits == pytest.approx([5.0, 5.0, 2.0, 5.0, 5.0, 5.0])  # the third wait ends with the drain
    assert stop.seen[:5] == [("draining", "draining")] * 3 + [  # held and saved alike until the drain's end
        ("drained", "draining"),  # the tick at its end brought it about, no read came
        ("drained", "drained"),  # the next tick, 5 s (>= 3 s) later, saved it
    ]
    assert stored("gpu-a2") == "drained"
    sim.close()


def test_a_write_saves_what_a_tick_brought_about(tmp_path: Path) -> None:
    """What a tick brought about waits for the next write, which saves it with its own change."""
    db = str(tmp_path / "sim.db")
    clock = FakeClock()
    sim = SimEngine(small_config(), db, clock=clock)
    sim.drain(["gpu-a1", "gpu-a2"], "op-1")
    clock.fleet(121)
    sim.tick(save_after_s=60.0)

    def stored(host: str) -> str:
        with sqlite3.connect(db) as c:
            (data,) = c.execute("SELECT data FROM items WHERE kind = 'hosts' AND key = ?", (host,)).fetchone()
        return str(json.loads(data)["state"])

    assert sim._hosts["gpu-a2"].state == HostState.DRAINED and stored("gpu-a2") == "draining"
    sim.tick(save_after_s=60.0)  # not yet waited long enough
    assert stored("gpu-a2") == "draining"
    again = SimEngine(small_config(), db, clock=clock)  # the first one "killed" before a save: the same world
    try:
        assert again.hosts(["gpu-a1", "gpu-a2"]) == sim.hosts(["gpu-a1", "gpu-a2"])
        assert again.audit()["stops"] == sim.audit()["stops"]
    finally:
        again.close()
    sim.upgrade_hosts({"gpu-a1": STEPS}, "op-1")
    assert stored("gpu-a1") == "upgrading" and stored("gpu-a2") == "drained"
    sim.close()


def test_a_change_saves_only_the_rows_it_changed(tmp_path: Path, clock: FakeClock) -> None:
    """A drain of one host writes that host's row (and the jobs it moved), not every host's."""
    import sqlite3

    db = str(tmp_path / "sim.db")
    sim = SimEngine(small_config(), db, clock=clock)
    written: list[tuple[str, str]] = []
    save = sim._store.save  # type: ignore[union-attr]

    def recorded(world, t, rows):  # noqa: ANN001, ANN202
        if world is not None:
            written.extend((kind, key) for kind, key, _ in world[1])
        return save(world, t, rows)

    sim._store.save = recorded  # type: ignore[union-attr, method-assign]
    idle = {h.name for h in sim.hosts() if sim._hosts[h.name].job is None}
    host = sorted(idle)[0]
    sim.drain([host], "op-1")
    assert [k for k in written if k[0] == "hosts"] == [("hosts", host)]
    sim.close()
    stored = sqlite3.connect(db).execute("SELECT count(*) FROM items WHERE kind = 'hosts'").fetchone()[0]
    assert stored == len(sim.config.host_domain())


def test_a_database_of_snapshot_version_1_is_still_read(tmp_path: Path, clock: FakeClock) -> None:
    """Version 1 kept the hosts, jobs and checks inside the world row: the next start reads it as it was."""
    import json
    import sqlite3

    db = str(tmp_path / "sim.db")
    first = SimEngine(small_config(), db, clock=clock)
    drained(first, clock, ["gpu-a1"], "op-1")
    first.close()
    conn = sqlite3.connect(db)
    world = json.loads(conn.execute("SELECT data FROM world").fetchone()[0])
    for kind in ("hosts", "jobs", "checks"):
        world[kind] = [json.loads(d) for (d,) in conn.execute("SELECT data FROM items WHERE kind = ?", (kind,))]
    world["version"] = 1
    with conn:
        conn.execute("UPDATE world SET data = ?", (json.dumps(world),))
        conn.execute("DELETE FROM items")
    second = SimEngine(small_config(), db, clock=clock)
    a1 = second.hosts(["gpu-a1"])[0]
    assert (a1.state, a1.operation) == (HostState.DRAINED, "op-1")
    drained(second, clock, ["gpu-b1"], "op-2")  # its first change writes the world in rows
    second.close()
    assert sqlite3.connect(db).execute("SELECT count(*) FROM items WHERE kind = 'hosts'").fetchone()[0] == 16
    third = SimEngine(small_config(), db, clock=clock)
    assert [(h.state, h.operation) for h in third.hosts(["gpu-a1", "gpu-b1"])] == [
        (HostState.DRAINED, "op-1"), (HostState.DRAINED, "op-2")]
    third.close()


def test_a_bulk_upgrade_starts_every_host_it_can_and_names_the_one_refused(sim: SimEngine, clock: FakeClock) -> None:
    drained(sim, clock, POD_A[:3], "op-1")
    steps = [Step(component=c, version=v) for c, v in TARGETS.items()]
    with pytest.raises(FleetError, match="gpu-a4"):
        sim.upgrade_hosts({h: steps for h in POD_A}, "op-1")
    assert [h.state for h in sim.hosts(POD_A)] == [HostState.UPGRADING] * 3 + [HostState.SERVING]
    clock.fleet(3600)
    with pytest.raises(FleetError, match="gpu-a4"):
        sim.start_checks({h: TARGETS for h in POD_A}, "op-1")
    assert [h.state for h in sim.hosts(POD_A)] == [HostState.CHECKING] * 3 + [HostState.SERVING]
    with pytest.raises(FleetNotFound, match="gpu-zz"):
        sim.start_checks({"gpu-zz": TARGETS}, "op-1")


def _random_world_steps(sim: SimEngine, clock: FakeClock, rng: random.Random, steps: int,
                        after_each: Callable[[], None]) -> None:
    """`steps` random calls of every kind that changes hosts, jobs or checks (refusals included), the clock
    moved between them; `after_each()` after every one."""
    names = [h.name for h in sim.hosts()]
    domains = [names[i:i + 4] for i in range(0, len(names), 4)]
    for _ in range(steps):
        kind = rng.choice(["drain", "upgrade", "check", "return", "offboard", "fail", "repaired", "handover",
                           "checkpoint", "job", "tick", "tick"])
        hosts = rng.choice(domains)
        op = rng.choice(["op-1", "op-2"])
        try:
            if kind == "drain":
                sim.drain(rng.sample(hosts, rng.randint(1, 4)), op)
            elif kind == "upgrade":
                sim.upgrade_hosts({h: STEPS[:rng.randint(1, 2)] for h in hosts}, op)
            elif kind == "check":
                sim.start_checks({h: dict(TARGETS) for h in hosts}, op)
            elif kind == "return":
                sim.return_to_service(hosts, op)
            elif kind == "offboard":
                sim.offboard(rng.choice(hosts), "broken", op)
            elif kind == "fail":
                sim.fail(rng.choice(hosts))
            elif kind == "repaired":
                sim.repaired(rng.choice(hosts))
            elif kind == "handover":
                sim.handover(hosts, op, "op-3")
            elif kind == "checkpoint":
                sim.request_checkpoint([j.id for j in sim.jobs()][:1])
            elif kind == "job":
                sim.set_job(rng.choice(["job-01", "job-02"]), stuck=rng.random() < 0.5)
            else:
                clock.fleet(rng.choice([10.0, 60.0, 130.0, 400.0, 4000.0]))
        except FleetError:
            pass  # a refusal changes nothing it refused
        after_each()


@pytest.mark.parametrize("seed", range(12))
def test_reads_of_what_changed_since_a_cursor_always_add_up_to_a_full_read(clock: FakeClock, seed: int) -> None:
    """Readers keep their view of the hosts by `host_changes` alone (of a domain and a half, in an order of their
    own, once with a name twice, and of the fleet): after every change of any kind, each view equals a full
    read; an answer holds the hosts that changed, in the order asked, never one that did not, and a cursor of
    another engine gets a full answer, marked as such."""
    import json

    sim = SimEngine(small_config(host_failure_per_hour=2.0, upgrade_fail_rate=0.2, check_fail_rate=0.2), None,
                    clock=clock)
    rng = random.Random(seed)
    some = [h.name for h in sim.hosts()][2:9][::-1]
    views: dict[tuple[str, ...] | None, tuple[str, dict[str, Any]]] = {}
    for key in (tuple(some), (*some, some[2]), None):
        cursor, content, delta = sim.host_changes(None if key is None else list(key), None)
        assert not delta
        views[key] = (cursor, {h["name"]: h for h in json.loads(content)})

    def check_views() -> None:
        full = {h["name"]: h for h in json.loads(sim.hosts_json(None))}
        for key, (cursor, seen) in list(views.items()):
            new_cursor, content, delta = sim.host_changes(None if key is None else list(key), cursor)
            assert delta
            changed = json.loads(content)
            merged = seen | {h["name"]: h for h in changed}
            want = {n: full[n] for n in (key or full)}
            assert merged == want
            names = {h["name"] for h in changed}
            assert [h["name"] for h in changed] == [n for n in (key or sorted(full)) if n in names]
            views[key] = (new_cursor, merged)
            again = sim.host_changes(None if key is None else list(key), new_cursor)
            assert again[1] == b"[]" and again[2]  # nothing changed since: nothing in the answer

    out_cursor, content, _ = sim.host_changes(None, None, out=True)
    out_view = [out_cursor, {h["name"]: h for h in json.loads(content)}]

    def check_all() -> None:
        check_views()
        # the hosts out of service, read as `HttpFleet.hosts_out` does: a delta merged, else the answer whole
        full = {h["name"]: h for h in json.loads(sim.hosts_json(None))}
        new_cursor, content, delta = sim.host_changes(None, out_view[0], out=True)
        got = {h["name"]: h for h in json.loads(content)}
        merged = out_view[1] | got if delta else got
        merged = {n: h for n, h in merged.items() if h["state"] != "serving"}
        assert merged == {n: h for n, h in full.items() if h["state"] != "serving"}
        out_view[:] = [new_cursor, merged]

    _random_world_steps(sim, clock, rng, 60, check_all)
    other = SimEngine(small_config(), None, clock=clock)
    cursor = sim.host_changes(None, None)[0]
    _, content, delta = other.host_changes(None, cursor)
    assert not delta and len(json.loads(content)) == 16
    for bad in ("", "nonsense", cursor + "9", cursor.split(".")[0] + ".x"):
        assert sim.host_changes(None, bad)[2] is False


def test_a_read_of_the_hosts_out_is_whole_when_a_domain_went_out_and_came_back(clock: FakeClock) -> None:
    """A reader of the hosts out of service whose cursor predates a whole stop gets the few hosts out now, not
    every host of the domain that went out and came back since (which a delta would have to hold)."""
    import json

    sim = SimEngine(small_config(host_failure_per_hour=0.0, upgrade_fail_rate=0.0, check_fail_rate=0.0), None,
                    clock=clock)
    pod_a = [h.name for h in sim.hosts() if h.domain == "pod-a"]
    b1 = next(h.name for h in sim.hosts() if h.domain == "pod-b")
    cursor, content, _ = sim.host_changes(None, None, out=True)
    assert json.loads(content) == []
    sim.drain(pod_a + [b1], "op-1")
    clock.fleet(600)  # drained
    sim.return_to_service(pod_a, "op-1")
    clock.fleet(600)  # pod-a serves again; b1 is still drained
    _, content, delta = sim.host_changes(None, cursor, out=True)
    assert not delta and [h["name"] for h in json.loads(content)] == [b1]  # whole: shorter than the 5 changed
    _, content, delta = sim.host_changes(None, cursor)
    assert delta and len(json.loads(content)) >= len(pod_a) + 1  # the fleet's delta: every change (jobs moved too)


@pytest.mark.parametrize("seed", range(8))
def test_reads_of_check_results_by_changes_add_up_to_a_full_read(clock: FakeClock, seed: int) -> None:
    """A reader keeps its view of a domain's check results (of each operation) by `check_changes` alone: after
    every change of any kind, it equals a full read; an answer holds only checks that changed since."""
    import json

    sim = SimEngine(small_config(host_failure_per_hour=2.0, upgrade_fail_rate=0.2, check_fail_rate=0.2), None,
                    clock=clock)
    rng = random.Random(seed)
    names = [h.name for h in sim.hosts()]
    views: dict[str, tuple[str, dict[str, Any]]] = {}
    for op in ("op-1", "op-2", "op-3"):
        cursor, content, delta = sim.check_changes(names, op, None)
        assert not delta and json.loads(content) == []
        views[op] = (cursor, {})
    sim.drain(names[:4], "op-1")  # a domain being checked as the walk begins, its results on their way
    clock.fleet(600)
    sim.start_checks({h: dict(TARGETS) for h in names[:4]}, "op-1")

    def check_views() -> None:
        for op, (cursor, seen) in list(views.items()):
            full = {r["host"]: r for r in json.loads(sim.check_results_json(names, op))}
            new_cursor, content, delta = sim.check_changes(names, op, cursor)
            assert delta
            merged = seen | {r["host"]: r for r in json.loads(content)}
            assert merged == full
            views[op] = (new_cursor, merged)
            assert sim.check_changes(names, op, new_cursor)[1] == b"[]"  # nothing changed since: nothing sent

    _random_world_steps(sim, clock, rng, 60, check_views)
    assert any(seen for _c, seen in views.values())  # some checks were run and seen
    assert sim.check_changes(names, "op-1", "nonsense")[2] is False


@pytest.mark.parametrize("seed", range(6))
def test_what_is_saved_row_by_row_is_the_world_after_any_sequence_of_changes(
        clock: FakeClock, tmp_path: Path, seed: int) -> None:
    """Only the rows that changed are written, found by the objects themselves noting each change: an engine
    opened on the database after any sequence of calls sees the same hosts, jobs and checks as the live one."""
    db = str(tmp_path / "sim.db")
    cfg = small_config(host_failure_per_hour=2.0, upgrade_fail_rate=0.2, check_fail_rate=0.2)
    sim = SimEngine(cfg, db, clock=clock)
    rng = random.Random(seed)
    count = [0]

    def compare() -> None:
        count[0] += 1
        if count[0] % 10:
            return
        live = (sim.hosts(), sim.jobs(), sorted(sim._checks.items()))
        again = SimEngine(cfg, db, clock=clock)
        try:
            assert (again.hosts(), again.jobs(), sorted(again._checks.items())) == live
        finally:
            again.close()

    _random_world_steps(sim, clock, rng, 50, compare)
    sim.close()


def test_a_timeline_gives_the_keys_due_by_a_time_however_their_times_change() -> None:
    """`_Timeline`, what the clock waits for: keys moved to other times, keys sharing one time (a domain's
    hosts), keys no longer due; `first` is the earliest time still held by a key, `pop_until` every key due."""
    from railyard.sim.engine import _Timeline

    tl: _Timeline[str] = _Timeline()
    for k in ("a", "b", "c"):
        tl.set(k, 10.0)
    tl.set("d", 5.0)
    tl.set("e", 20.0)
    assert (tl.first(), len(tl)) == (5.0, 5)
    tl.set("d", None)  # no longer due: its time goes with it
    tl.set("c", 30.0)  # moved later
    tl.set("a", 10.0)  # set again to the same time: no change
    assert tl.first() == 10.0 and tl.get("c") == 30.0 and tl.get("d") is None
    assert sorted(tl.pop_until(15.0)) == ["a", "b"]
    assert tl.get("a") is None and tl.first() == 20.0
    tl.set("e", 25.0)
    tl.set("b", 20.0)  # a time emptied earlier, held again
    assert tl.pop_until(19.0) == [] and tl.first() == 20.0
    assert sorted(tl.pop_until(25.0)) == ["b", "e"]
    assert tl.first() == 30.0 and len(tl) == 1
    assert tl.pop_until(100.0) == ["c"] and tl.first() is None and len(tl) == 0


def test_a_checkpoint_folds_the_log_into_the_database_beside_the_saves(tmp_path: Path, clock: FakeClock) -> None:
    """`checkpoint` copies the write-ahead log into the database file on its own connection; once it runs, a
    save's commit stops doing it every 1,000 pages; after `close` it does nothing."""
    import shutil

    db = tmp_path / "sim.db"
    sim = SimEngine(small_config(), str(db), clock=clock)
    store = sim._store
    assert store is not None

    def in_the_file(host: str) -> str:
        """The host's state in the database file alone, without its log."""
        copy = tmp_path / "copy.db"
        shutil.copyfile(db, copy)
        with sqlite3.connect(copy) as c:
            (data,) = c.execute("SELECT data FROM items WHERE kind = 'hosts' AND key = ?", (host,)).fetchone()
        copy.unlink()
        return str(json.loads(data)["state"])

    sim.checkpoint()
    sim.drain(["gpu-a1"], "op-1")
    assert in_the_file("gpu-a1") == "serving"  # the drain is in the log only
    sim.checkpoint()
    assert in_the_file("gpu-a1") == "draining"
    assert store.conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 16384
    sim.close()
    store.checkpoint()  # closed: nothing, no error


def test_a_tick_makes_the_json_of_the_hosts_it_changed_ready_for_the_read_that_follows(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The tick that brings about a phase's end also makes the JSON of the hosts it changed, so the train's poll
    on its way answers without encoding them; the answer is what a fresh encoding of the hosts gives."""
    from railyard.sim import engine as engine_module

    clock = FakeClock()
    sim = SimEngine(small_config(), None, clock=clock)
    names = ["gpu-a1", "gpu-a2"]
    sim.drain(names, "op-1")
    clock.fleet(121)
    sim.tick()
    encoded: list[object] = []
    real = engine_module._encode

    def counting(obj: object) -> bytes:
        encoded.append(obj)
        return real(obj)

    monkeypatch.setattr(engine_module, "_encode", counting)
    answer = json.loads(sim.hosts_json(names))
    assert [h["state"] for h in answer] == ["drained", "drained"]
    assert encoded == []  # made by the tick
    monkeypatch.setattr(engine_module, "_encode", real)
    sim._host_json.clear()  # what a fresh encoding of the same hosts gives
    assert answer == json.loads(sim.hosts_json(names))
    sim.close()


def test_the_servers_clock_keeps_what_the_world_gained_out_of_the_collector_but_not_before_a_transition(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Between ticks, once `keep_every_s` has passed, the ticker collects and freezes what the world and its
    audit gained (`gcpause.keep_long_lived`), so that later passes of the collector walk only what came since;
    never when a transition ends within 50 ms, which would wait for it."""
    from railyard.sim import app

    clock = FakeClock()
    sim = SimEngine(small_config(), None, clock=clock)
    kept: list[float | None] = []
    monkeypatch.setattr(app.gcpause, "keep_long_lived", lambda: kept.append(sim.next_transition_in()))

    class Stop:
        def __init__(self, waits: int) -> None:
            self.left = waits

        def wait(self, s: float) -> bool:
            clock.t += s
            self.left -= 1
            return self.left < 0

    app._ticker(sim, Stop(3), every_s=0.1, keep_every_s=0.0)  # type: ignore[arg-type]
    assert kept == [None, None, None]  # nothing in flight: kept at every tick it was due
    sim.drain(["gpu-a1"], "op-1")  # its end: 120 fleet s = 12 real s away
    kept.clear()
    app._ticker(sim, Stop(2), every_s=0.1, keep_every_s=0.0)  # type: ignore[arg-type]
    assert len(kept) == 2 and all(k is not None and k >= 0.05 for k in kept)
    left = sim.next_transition_in()
    assert left is not None
    clock.t += left - 0.1 - 0.02  # the tick after the next 0.1 s wait: 20 ms before the drain ends
    kept.clear()
    app._ticker(sim, Stop(1), every_s=0.1, keep_every_s=0.0)  # type: ignore[arg-type]
    assert kept == [] and sim._hosts["gpu-a1"].state == HostState.DRAINING
    app._ticker(sim, Stop(1), every_s=0.1, keep_every_s=0.0)  # type: ignore[arg-type]
    assert kept == [None] and sim._hosts["gpu-a1"].state == HostState.DRAINED  # once it has ended
    sim.close()


def test_no_pass_of_the_collector_starts_while_a_call_holds_the_lock(sim: SimEngine, clock: FakeClock) -> None:
    """A domain's call or phase end makes thousands of objects; with the collector on, a pass would start every
    few hundred of them, each re-walking what the train made since the last freeze, with the lock held and the
    train's next poll waiting. The collector is paused inside each call; passes run after it, and nothing is lost."""
    import gc

    passes: list[bool] = []  # for each pass: whether it started with the engine's lock held by this thread

    def seen(phase: str, _info: dict[str, int]) -> None:
        if phase == "start":
            passes.append(sim._lock._is_owned())  # type: ignore[attr-defined]

    threshold = gc.get_threshold()
    gc.callbacks.append(seen)
    gc.set_threshold(5)  # a pass every 5 allocations: a call of 4 hosts would set off dozens
    try:
        assert gc.isenabled()
        drained(sim, clock, POD_A, "op-1")
        sim.upgrade_hosts({h: STEPS for h in POD_A}, "op-1")
        clock.fleet(UPGRADE_S)
        sim.start_checks({h: TARGETS for h in POD_A}, "op-1")
        clock.fleet(300)
        assert {r.status for r in sim.check_results(POD_A, "op-1")} == {"passed"}
        sim.return_to_service(POD_A, "op-1")
        for h in POD_A:  # changes noted and not yet taken in: whoever holds the lock next takes them in
            sim._hosts[h].changed()
        assert sim.next_transition_in() is not None  # the server's clock asks too, between calls
        clock.fleet(30)
        assert {h.state for h in sim.hosts(POD_A)} == {HostState.SERVING}
        assert gc.isenabled()  # given back on after every call
    finally:
        gc.callbacks.remove(seen)
        gc.set_threshold(*threshold)
    assert passes and not any(passes)  # passes ran between the calls, none inside one
