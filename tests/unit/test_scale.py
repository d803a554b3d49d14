"""Fleet scale: a plan and a drift report on a fleet multiplied many times say what they said on the small
one, with one read of the fleet; the simulator answers bulk reads from what it already built; a wait's
poll reads the fleet once. Speed itself is measured in bench/bench_plan.py, never asserted here."""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pydantic import TypeAdapter

from railyard.domain.config import ConfigError, RailyardConfig, parse_config
from railyard.domain.models import Host, HostState, Job, Step
from railyard.fleet import FleetNotFound
from railyard.fleet.once import ReadOnce
from railyard.ledger import Ledger
from railyard.operations.releases import drift, plan_train
from railyard.sim.engine import SimEngine
from tests.unit.test_stop import Clock

DRV, FM, KRN = "gpu-driver", "fabric-manager", "kernel"
NEW = "570.86.15"


def fleet_config(copies: int) -> RailyardConfig:
    """Three domains of four hosts (pod-a, pod-b, pod-c), `copies` times over: pod-a00, pod-b00, ... A
    rule and an apply order, so every host's targets go through the compatibility code."""
    domains = [{"name": f"pod-{c}{k:02d}", "hosts": f"h{c}{k:02d}-[1-4]"} for k in range(copies) for c in "abc"]
    return parse_config({
        "components": [{"name": DRV, "reboot": True, "duration_s": 300}, {"name": FM, "duration_s": 60},
                       {"name": KRN, "reboot": True, "duration_s": 180}],
        "releases": [{"id": "drv", "component": DRV, "version": NEW},
                     {"id": "fm", "component": FM, "version": NEW},
                     {"id": "krn", "component": KRN, "version": "6.1.0-28"}],
        "compatibility": {"rules": [f"{FM} == {DRV}"], "order": [DRV, FM]},
        "domains": domains,
        "trains": [{"id": "t", "releases": ["fm", "krn", "drv"]}],
        "buffers": {"maintenance": {"hosts": 4}, "failure": {"hosts": 2 * copies}},
        "simulator": {"speed": 60, "seed": 3, "initial_versions": {DRV: "550.1", FM: "550.1", KRN: "6.1.0-25"},
                      "jobs": {"count": 2 * copies, "hosts_per_job": 4, "checkpoint_interval_s": 1800,
                               "checkpoint_duration_s": 30}},
    })


class Counting:
    """A fleet that counts its reads; hosts 2 and 3 of every pod-b run the new kernel already."""

    def __init__(self, engine: SimEngine):
        self.engine = engine
        self.reads: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def now(self) -> float:
        self.reads["now"] += 1
        return self.engine.now()

    def hosts(self, names: list[str] | None = None) -> list[Host]:
        self.reads["hosts"] += 1
        return [dataclasses.replace(h, versions={**h.versions, KRN: "6.1.0-28"})
                if h.domain.startswith("pod-b") and h.name[-1] in "23" else h for h in self.engine.hosts(names)]

    def jobs(self, hosts: list[str] | None = None) -> list[Job]:
        self.reads["jobs"] += 1
        return self.engine.jobs(hosts)


def world(tmp_path: Path, copies: int) -> tuple[RailyardConfig, Counting, Ledger]:
    cfg = fleet_config(copies)
    engine = SimEngine(cfg, None, clock=Clock())
    for k in range(copies):
        engine.fail(f"hc{k:02d}-4")  # one broken host per pod-c: not visited, counted as unavailable
    return cfg, Counting(engine), Ledger(f"sqlite:///{tmp_path}/ledger-{copies}.db")


def shape(stop: dict[str, Any]) -> dict[str, Any]:
    """A stop without its names: what must be the same for every copy of a domain."""
    out = {k: v for k, v in stop.items() if k not in ("domain", "jobs_to_checkpoint")}
    if "releases" in out:
        out["releases"] = {k: len(v) for k, v in out["releases"].items()}
    return out


def test_a_plan_on_a_multiplied_fleet_is_the_small_plan_repeated_from_one_read(tmp_path: Path) -> None:
    small_cfg, small_fleet, small_led = world(tmp_path, 1)
    small = plan_train(small_cfg, small_cfg.train("t"), small_fleet, small_led)
    assert [shape(s) for s in small["stops"]] == [
        {"skip": False, "sku": "gpu", "hosts": 4, "hosts_to_upgrade": 4, "releases": {"drv+fm+krn": 4},
         "estimate_s": small["stops"][0]["estimate_s"]},
        {"skip": False, "sku": "gpu", "hosts": 4, "hosts_to_upgrade": 4,
         "releases": {"drv+fm+krn": 2, "drv+fm": 2}, "estimate_s": small["stops"][1]["estimate_s"]},
        {"skip": False, "sku": "gpu", "hosts": 4, "hosts_to_upgrade": 3, "releases": {"drv+fm+krn": 3},
         "estimate_s": small["stops"][2]["estimate_s"]},
    ]
    cfg, fleet, led = world(tmp_path, 40)  # 120 domains, 480 hosts
    big = plan_train(cfg, cfg.train("t"), fleet, led)
    assert [shape(s) for s in big["stops"]] == [shape(s) for s in small["stops"]] * 40
    assert big["hosts_to_upgrade"] == 40 * small["hosts_to_upgrade"]
    assert big["estimate_s"] == pytest.approx(40 * small["estimate_s"])
    assert big["violations"] == small["violations"] == []
    assert big["releases"] == [{**r, "hosts_admitted": 480} for r in small["releases"]]
    # every stop checkpoints exactly the running jobs on its hosts
    running = [j for j in fleet.engine.jobs() if j.state == "running"]
    for stop, d in zip(big["stops"], cfg.domains, strict=True):
        assert stop["domain"] == d.name
        assert stop["jobs_to_checkpoint"] == sorted(j.id for j in running if set(j.hosts) & set(d.hosts))
    assert any(s["jobs_to_checkpoint"] for s in big["stops"])
    # one read of the hosts and one of the jobs for the whole plan, not one per domain
    assert fleet.reads["hosts"] == 1 and fleet.reads["jobs"] == 1


def test_a_plan_asks_the_ledger_for_each_release_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg, fleet, led = world(tmp_path, 10)
    asked: Counter[str] = Counter()
    real = Ledger.release_state

    def counting(self: Ledger, rid: str) -> Any:
        asked[rid] += 1
        return real(self, rid)

    monkeypatch.setattr(Ledger, "release_state", counting)
    plan_train(cfg, cfg.train("t"), fleet, led)
    assert set(asked) == {"drv", "fm", "krn"} and max(asked.values()) == 1  # not once per host (120 each)


def reference_drift(cfg: RailyardConfig, hosts: list[Host]) -> dict[str, Any]:
    """Versions per component, domain and SKU, counted host by host."""
    out: dict[str, Any] = {}
    for c in cfg.components:
        seen = [(h.domain, h.sku, h.versions.get(c.name, "none")) for h in hosts]
        out[c.name] = {
            "versions": dict(sorted(Counter(v for _, _, v in seen).items())),
            "by_domain": {d: dict(sorted(Counter(v for dd, _, v in seen if dd == d).items()))
                          for d in sorted({d for d, _, _ in seen})},
            "by_sku": {s: dict(sorted(Counter(v for _, ss, v in seen if ss == s).items()))
                       for s in sorted({s for _, s, _ in seen})},
        }
    return out


def test_drift_counts_every_host_once_per_component_domain_and_sku(tmp_path: Path) -> None:
    cfg, fleet, _led = world(tmp_path, 30)
    hosts = fleet.hosts()
    hosts[5] = dataclasses.replace(hosts[5], versions={DRV: NEW, FM: NEW})  # one with no kernel at all
    d = drift(cfg, hosts, fleet.now())
    want = reference_drift(cfg, hosts)
    for name, c in d["components"].items():
        assert {k: c[k] for k in ("versions", "by_domain", "by_sku")} == want[name], name
    krn = d["components"][KRN]
    assert krn["versions"] == {"6.1.0-25": 299, "6.1.0-28": 60, "none": 1}
    assert krn["converged_fraction"] == round(60 / 360, 4)
    assert krn["converged_by_domain"]["pod-b07"] == 0.5 and krn["oldest_running"] == "6.1.0-25"
    assert d["hosts"] == 360 and d["in_service"] == 330


# ---- one read per poll -----------------------------------------------------------------------------
def test_read_once_answers_every_question_from_one_read_and_forgets_it_on_a_write(tmp_path: Path) -> None:
    _cfg, fleet, _led = world(tmp_path, 2)
    view = ReadOnce(fleet)
    pod = ["ha00-1", "ha00-2", "ha00-3", "ha00-4"]
    assert [h.name for h in view.hosts(pod)] == pod
    assert len(view.hosts()) == 24 and view.now() == view.now()
    assert view.jobs(pod) == fleet.engine.jobs(pod) and view.jobs() == fleet.engine.jobs()
    with pytest.raises(FleetNotFound, match="nope"):
        view.hosts(["nope"])
    assert fleet.reads == {"hosts": 1, "jobs": 1, "now": 1}
    assert view.audit()["total_hosts"] == 24  # what the port does not name is the fleet's own
    view.drain(pod, "op-1")  # a write goes through, and what was read is read again
    assert {h.state for h in view.hosts(pod)} == {HostState.DRAINING}
    assert fleet.reads["hosts"] == 2


# ---- the simulator at scale ------------------------------------------------------------------------
def test_the_simulator_builds_its_bulk_answers_once_per_change_of_the_world(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    cfg = fleet_config(20)
    clock = Clock()
    engine = SimEngine(cfg, str(tmp_path / "sim.db"), clock=clock)
    scans = Counter[str]()
    real_due = engine._host_due

    def due(h: Any) -> float | None:
        scans["host"] += 1
        return real_due(h)

    monkeypatch.setattr(engine, "_host_due", due)
    first = engine.hosts_json()
    assert TypeAdapter(list[Host]).validate_json(first) == engine.hosts()
    for _ in range(5):  # idle: the clock moves, nothing falls due, nothing is rebuilt
        clock.advance(0.1)
        assert engine.hosts_json() is first
        engine.advance()
    assert scans["host"] == 0  # no host looked at again
    pod = list(cfg.domain("pod-a03").hosts)
    engine.drain(pod, "op-1")  # a change: answered at once, from the new world, looking at what it changed
    assert len(pod) <= scans["host"] < len(engine.hosts()) // 4
    after = {h["name"]: h for h in json.loads(engine.hosts_json())}
    assert {after[n]["state"] for n in pod} == {"draining"} and after["hb03-1"]["state"] == "serving"
    assert engine.hosts_json(pod[:1]) == json.dumps([after[pod[0]]], separators=(",", ":")).encode()
    clock.advance(200)  # the drain ends; an upgrade changes versions in place
    engine.upgrade(pod[0], [Step(component=KRN, version="6.1.0-28")], "op-1")
    clock.advance(600)
    assert engine.hosts([pod[0]])[0].versions[KRN] == "6.1.0-28"
    engine.close()
    again = SimEngine(cfg, str(tmp_path / "sim.db"), clock=clock)  # the incremental snapshot kept every change
    restored = {h.name: h for h in again.hosts()}
    assert restored[pod[0]].versions[KRN] == "6.1.0-28" and restored[pod[1]].versions[KRN] == "6.1.0-25"
    assert {restored[n].state for n in pod} == {HostState.DRAINED}
    assert restored["hb03-1"].state == HostState.SERVING
    again.close()


# ---- the poll interval -----------------------------------------------------------------------------
def test_the_poll_interval_is_set_in_the_config_with_a_default_per_backend() -> None:
    data = fleet_config(1).model_dump(mode="json", exclude_none=True)
    assert parse_config(data).fleet.poll_interval_s == 1.0  # http: the fleet manager's API
    data["fleet"] = {"backend": "slurm", "slurm": {"runner": "standin"}}
    assert parse_config(data).fleet.poll_interval_s == 10.0  # a read runs sinfo and squeue
    data["fleet"]["poll_s"] = 30
    assert parse_config(data).fleet.poll_interval_s == 30.0
    for bad, why in ((0, "greater than or equal to 0.1"), (-5, "greater than or equal to 0.1"),
                     (86400, "less than or equal to 3600"), ("often", "valid number")):
        data["fleet"]["poll_s"] = bad
        with pytest.raises(ConfigError) as exc:
            parse_config(data)
        (problem,) = exc.value.problems  # one line that names the field, says why, and shows the value
        assert problem.startswith("fleet.poll_s: ") and why in problem and problem.endswith(f"(value: {bad!r})")


class Calls:
    """`inner` with every public call counted by name (the reads and writes a stop makes)."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.count = inner, Counter[str]()

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self.inner, name)
        if name.startswith("_") or not callable(fn):
            return fn

        def counted(*a: Any, **kw: Any) -> Any:
            self.count[name] += 1
            return fn(*a, **kw)
        return counted


def stop_calls(tmp_path: Path, hosts: int, phased: bool = False) -> tuple[Counter[str], Counter[str], dict[str, Any]]:
    """One full stop of a domain of `hosts` hosts (of three), over the in-process simulator and a fake clock:
    the fleet's and the ledger's calls, by name, and what the stop returned. `phased`: the driver's release
    rolls out in phases, pod-a its canary (each host's verdict is then counted against it)."""
    from railyard.operations.stop import Stop
    from tests.unit.test_stop import full_stop

    cfg = parse_config({
        "components": [{"name": DRV, "reboot": True, "duration_s": 300}, {"name": FM, "duration_s": 60}],
        "releases": [{"id": "drv", "component": DRV, "version": NEW,
                      **({"rollout": {"canary_domains": ["pod-a"], "soak_s": 3600}} if phased else {})},
                     {"id": "fm", "component": FM, "version": NEW}],
        "domains": [{"name": f"pod-{c}", "hosts": f"h{c}[1-{hosts}]"} for c in "abc"],
        "trains": [{"id": "t", "releases": ["drv", "fm"]}],
        "buffers": {"maintenance": {"hosts": hosts}, "failure": {"fraction": 0.05}},
        "timeouts": {"poll_s": 0.25, "drain_s": 60, "upgrade_s": 120, "check_s": 60, "return_s": 60},
        "simulator": {"speed": 60, "seed": 3, "initial_versions": {DRV: "550.1", FM: "550.1"},
                      "upgrade_fail_rate": 0.0, "check_fail_rate": 0.0, "host_failure_per_hour": 0.0,
                      "jobs": {"count": max(1, 3 * hosts // 8), "hosts_per_job": 4, "checkpoint_interval_s": 1800,
                               "checkpoint_duration_s": 30}},
    })
    clock = Clock()
    fleet = Calls(SimEngine(cfg, None, clock=clock))
    ledger = Calls(Ledger(f"sqlite:///{tmp_path}/ledger-{hosts}-{phased}.db"))
    s = Stop(config=cfg, train=cfg.train("t"), domain=cfg.domain("pod-a"), op_id="t/r1/pod-a", fleet=fleet,  # type: ignore[arg-type]
             ledger=ledger, sleep=clock.advance, clock=clock, say=lambda _m: None)  # type: ignore[arg-type]
    out = full_stop(s, clock)
    if phased:
        verdicts = [r for r in ledger.inner.release_results("drv") if r["op_id"] == "t/r1/pod-a"]
        assert len(verdicts) == hosts and all(r["passed"] for r in verdicts), verdicts[:3]
    ledger.inner.dispose()
    return fleet.count, ledger.count, out


@pytest.mark.parametrize("phased", [False, True], ids=["plain", "phased"])
def test_a_stops_calls_to_the_fleet_and_the_ledger_do_not_grow_with_its_domain(tmp_path: Path, phased: bool) -> None:
    """A domain of 512 hosts costs the stop the same calls as one of 8: the domain's upgrades and checks
    start in one call each, reads ask for the domain at once, verdicts are written together (a phased
    release's too: one write of every host's verdict against it)."""
    small_fleet, small_ledger, small = stop_calls(tmp_path, 8, phased)
    large_fleet, large_ledger, large = stop_calls(tmp_path, 512, phased)
    assert (small, large) == ({"returned": 8, "offboarded": []}, {"returned": 512, "offboarded": []})
    assert large_fleet == small_fleet, large_fleet - small_fleet
    assert large_ledger == small_ledger, large_ledger - small_ledger
    assert small_fleet["upgrade_hosts"] == small_fleet["start_checks"] == 1
    assert small_fleet["upgrade"] == small_fleet["start_check"] == 0
    assert small_ledger["record_release_results"] == (1 if phased else 0)


def test_an_offboard_after_a_thousand_audit_rows_of_the_same_operation_is_still_seen(tmp_path: Path) -> None:
    """A domain of 1,024 hosts may write an audit row per host (a failed check each): a host offboarded after
    them is still the stop's offboard (the audit's page of 1,000 rows once hid it, and the stop would have
    returned it)."""
    from tests.unit.test_stop import world

    _cfg, _clock, _fleet, ledger, stop = world(tmp_path)
    s = stop()
    ledger.record_verifications(s.op_id, [(f"h{i}", False, {}, "dcgmi diag failed") for i in range(1100)])
    ledger.note(s.op_id, "offboard", ["ha2"], "health check failed")
    assert len(ledger.audit_rows(s.op_id)) == 1000  # the default page
    assert s.offboarded() == ["ha2"]


def test_a_domains_passing_checks_are_one_audit_row_that_each_hosts_history_finds(tmp_path: Path) -> None:
    """The verdicts of a domain's checks: one audit row names every host that passed, one row each failure
    with its reason; a host's history still shows its own."""
    from tests.unit.test_stop import world

    _cfg, _clock, _fleet, ledger, stop = world(tmp_path)
    s = stop()
    ledger.record_verifications(s.op_id, [(f"h{i}", True, {"kernel": "6.1.0-28"}, None) for i in range(500)]
                                + [("hbad", False, {}, "XID 79 on GPU 3")])
    rows = ledger.audit_rows(s.op_id, limit=None)
    assert [(r["action"], len(r["hosts"]), r["reason"]) for r in rows] == [
        ("verified", 500, ""), ("check_failed", 1, "XID 79 on GPU 3")]
    assert [e["action"] for e in ledger.host_history("h42")["events"]] == ["verified"]
    assert [e["action"] for e in ledger.host_history("hbad")["events"]] == ["check_failed"]
    assert ledger.verifications(s.op_id, ["h42", "hbad"]) == {"h42": (True, {"kernel": "6.1.0-28"}, None),
                                                            "hbad": (False, {}, "XID 79 on GPU 3")}
