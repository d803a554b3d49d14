"""A domain stop over the in-process simulator, with a fake clock: no sleeps, no Airflow."""

from __future__ import annotations

import pytest

from railyard.config import parse_config
from railyard.ledger import Ledger
from railyard.models import HostState
from railyard.sim.engine import SimEngine
from railyard.stop import Stop, StopError

CONFIG = {
    "components": [
        {"name": "gpu-driver", "reboot": True, "duration_s": 300},
        {"name": "fabric-manager", "duration_s": 60},
    ],
    "releases": [
        {"id": "drv", "component": "gpu-driver", "version": "570.86.15"},
        {"id": "fm", "component": "fabric-manager", "version": "570.86.15"},
    ],
    "domains": [{"name": f"pod-{c}", "hosts": f"h{c}[1-4]"} for c in "abc"],
    "trains": [{"id": "t", "releases": ["drv", "fm"]}],
    "buffers": {"maintenance": {"hosts": 4}, "failure": {"hosts": 2}},
    "timeouts": {"poll_s": 0.25, "drain_s": 60, "upgrade_s": 120, "check_s": 60, "return_s": 60},
    "simulator": {
        "speed": 60, "seed": 3,
        "initial_versions": {"gpu-driver": "550.1", "fabric-manager": "550.1"},
        "jobs": {"count": 2, "hosts_per_job": 4, "checkpoint_interval_s": 1800, "checkpoint_duration_s": 30},
    },
}


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def advance(self, s: float) -> None:
        self.t += s


def world(tmp_path, **sim):
    cfg_data = {**CONFIG, "simulator": {**CONFIG["simulator"], **sim}}
    cfg = parse_config(cfg_data)
    clock = Clock()
    fleet = SimEngine(cfg, None, clock=clock)
    ledger = Ledger(f"sqlite:///{tmp_path}/ledger.db")

    def stop(domain: str = "pod-a", op: str = "t/run1/pod-a") -> Stop:
        return Stop(config=cfg, train=cfg.train("t"), domain=cfg.domain(domain), op_id=op, fleet=fleet,
                    ledger=ledger, sleep=clock.advance, clock=clock)

    return cfg, clock, fleet, ledger, stop


def wait_checkpoints(s: Stop, clock: Clock) -> float:
    _jobs, since = s.request_checkpoints()
    for _ in range(100):
        if not s.stale_jobs(since):
            return since
        clock.advance(0.25)
    raise AssertionError("checkpoints never came")


def full_stop(s: Stop, clock: Clock) -> dict:
    assert s.take().granted
    wait_checkpoints(s, clock)
    s.drain()
    s.upgrade()
    s.check()
    return s.return_hosts()


def test_a_stop_upgrades_verifies_and_returns(tmp_path):
    cfg, clock, fleet, ledger, stop = world(tmp_path)
    s = stop()
    out = full_stop(s, clock)
    assert out == {"returned": 4, "offboarded": []}
    hosts = fleet.hosts(cfg.domain("pod-a").hosts)
    assert all(h.state == HostState.SERVING for h in hosts)
    assert all(h.versions == {"gpu-driver": "570.86.15", "fabric-manager": "570.86.15"} for h in hosts)
    audit = fleet.audit()
    assert audit["unverified_returns"] == []
    assert audit["max_domains_out"] == 1
    # the jobs checkpointed on request just before the drain: they lost seconds, not the cadence
    assert audit["interruptions"] and audit["max_lost_s"] < 120
    assert ledger.holdings() == {} and ledger.operation(s.op_id)["state"] == "done"


def test_every_step_run_twice_changes_nothing(tmp_path):
    cfg, clock, fleet, ledger, stop = world(tmp_path)
    s = stop()
    assert s.take().granted and s.take().granted
    wait_checkpoints(s, clock)
    first = s.request_checkpoints()[1]
    assert s.request_checkpoints()[1] == first  # a retry keeps the first request time
    s.drain()
    assert s.drain() == {"drained": 0}
    s.upgrade()
    installs = fleet.audit()["installs"]
    assert s.upgrade()["upgraded"] == 4
    assert fleet.audit()["installs"] == installs
    assert all(i["count"] == 1 for i in installs)
    s.check()
    s.check()
    s.return_hosts()
    assert s.return_hosts()["returned"] == 0
    actions = [r["action"] for r in ledger.audit_rows(s.op_id)]
    assert actions.count("drain") == 1 and actions.count("upgrade") == 1 and actions.count("return") == 1


def test_no_lease_no_touch(tmp_path):
    _cfg, _clock, fleet, _ledger, stop = world(tmp_path)
    with pytest.raises(StopError, match="holds no lease"):
        stop().drain()
    assert all(h.state == HostState.SERVING for h in fleet.hosts())


def test_second_domain_waits_while_first_is_out(tmp_path):
    _cfg, clock, _fleet, _ledger, stop = world(tmp_path)
    a = stop()
    b = stop("pod-b", "other/run/pod-b")
    assert a.take().granted
    d = b.take()
    assert d.outcome == "wait" and "max_domains_down=1" in d.reason
    full_stop(a, clock)
    assert b.take().granted


def test_failed_upgrade_goes_to_repair_and_train_goes_on(tmp_path):
    cfg, clock, fleet, ledger, stop = world(tmp_path, upgrade_fail_rate=1.0)
    s = stop()
    assert s.take().granted
    wait_checkpoints(s, clock)
    s.drain()
    up = s.upgrade()
    assert sorted(up["offboarded"]) == cfg.domain("pod-a").hosts
    out = s.check()
    assert out["checked"] == 0
    assert s.return_hosts() == {"returned": 0, "offboarded": cfg.domain("pod-a").hosts}
    for h in fleet.hosts(cfg.domain("pod-a").hosts):
        assert h.state == HostState.REPAIR and h.reason.startswith("upgrade failed: install ")
    assert ledger.holdings() == {}


def test_return_gates_hosts_that_were_never_checked(tmp_path):
    """A crash (or a person) skipped the health check: return checks before it returns."""
    _cfg, clock, fleet, _ledger, stop = world(tmp_path)
    s = stop()
    assert s.take().granted
    wait_checkpoints(s, clock)
    s.drain()
    s.upgrade()
    out = s.return_hosts()  # no s.check()
    assert out["returned"] == 4
    assert fleet.audit()["unverified_returns"] == []


def test_failed_check_is_offboarded_with_evidence(tmp_path):
    _cfg, clock, fleet, _ledger, stop = world(tmp_path, check_fail_rate=1.0)
    s = stop()
    assert s.take().granted
    wait_checkpoints(s, clock)
    s.drain()
    s.upgrade()
    out = s.check()
    assert out["passed"] == 0 and len(out["offboarded"]) == 4
    assert all(h.reason.startswith("health check failed: ") for h in fleet.hosts(out["offboarded"]))
    assert s.return_hosts()["returned"] == 0


def test_aborted_before_drain_releases_without_touching(tmp_path):
    _cfg, _clock, fleet, ledger, stop = world(tmp_path)
    s = stop()
    assert s.take().granted
    assert s.return_hosts() == {"returned": 0, "offboarded": []}
    assert ledger.holdings() == {}
    assert all(h.state == HostState.SERVING for h in fleet.hosts())


def test_skip_when_every_host_is_at_target(tmp_path):
    _cfg, clock, _fleet, _ledger, stop = world(tmp_path)
    full_stop(stop(), clock)
    assert stop(op="t/run2/pod-a").take().outcome == "skip"


def test_a_stuck_wait_ends_at_its_deadline(tmp_path):
    _cfg, clock, fleet, _ledger, stop = world(tmp_path, drain_s=10_000_000)
    s = stop()
    assert s.take().granted
    wait_checkpoints(s, clock)
    with pytest.raises(StopError, match=r"pod-a: drain did not finish within 60s \(drained 0/4\)"):
        s.drain()
