"""Releases over the in-process simulator with a fake clock: compatibility, phases, gates, drift."""

from __future__ import annotations

import json

import pytest

from railyard import cli
from railyard.domain.compat import compare, parse_rule
from railyard.domain.config import ConfigError, parse_config
from railyard.domain.models import HostState
from railyard.ledger import Ledger
from railyard.operations.releases import Rollout, check_plan, describe_drift, drift, drift_chart, plan_train
from railyard.operations.stop import Stop
from railyard.sim.engine import SimEngine
from tests.unit.test_stop import Clock, wait_checkpoints

DRV, FM, KRN = "gpu-driver", "fabric-manager", "kernel"
NEW = "570.86.15"


def base(**over) -> dict:
    data = {
        "components": [{"name": DRV, "reboot": True, "duration_s": 300}, {"name": FM, "duration_s": 60},
                       {"name": KRN, "reboot": True, "duration_s": 180,
                        "versions": {"6.1.0-25": "2024-11-01", "6.1.0-28": "2025-06-01"}}],
        "releases": [{"id": "drv", "component": DRV, "version": NEW},
                     {"id": "fm", "component": FM, "version": NEW},
                     {"id": "krn", "component": KRN, "version": "6.1.0-28"}],
        "compatibility": {"rules": [f"{FM} == {DRV}"], "order": [DRV, FM]},
        "domains": [{"name": f"pod-{c}", "hosts": f"h{c}[1-4]"} for c in "abc"],
        # listed fabric manager first: the apply order must still put the driver before it
        "trains": [{"id": "t", "releases": ["fm", "krn", "drv"], "max_failure_fraction": 1.0}],
        "buffers": {"maintenance": {"hosts": 4}, "failure": {"hosts": 12}},
        "timeouts": {"poll_s": 0.25, "drain_s": 60, "upgrade_s": 120, "check_s": 60, "return_s": 60},
        "simulator": {"speed": 60, "seed": 3, "initial_versions": {DRV: "550.1", FM: "550.1", KRN: "6.1.0-25"},
                      "jobs": {"count": 2, "hosts_per_job": 4, "checkpoint_interval_s": 1800,
                               "checkpoint_duration_s": 30}},
    }
    data.update(over)
    return data


class Recorder:
    """The simulator, recording the steps of every upgrade call (and failing installs of `bad`)."""

    def __init__(self, engine: SimEngine, bad: tuple[str, str] | None = None):
        self.engine = engine
        self.bad = bad
        self.calls: list[tuple[str, list[tuple[str, str]]]] = []

    def __getattr__(self, name):  # noqa: ANN001, ANN204
        return getattr(self.engine, name)

    def upgrade_hosts(self, work, op):  # noqa: ANN001, ANN201
        for host, steps in work.items():  # one host at a time, each at its own failure rate
            self.calls.append((host, [(s.component, s.version) for s in steps]))
            hit = self.bad is not None and any((s.component, s.version) == self.bad for s in steps)
            self.engine.settings(upgrade_fail_rate=1.0 if hit else 0.0)
            self.engine.upgrade_hosts({host: steps}, op)


def world(tmp_path, data: dict, bad: tuple[str, str] | None = None):
    cfg = parse_config(data)
    clock = Clock()
    fleet = Recorder(SimEngine(cfg, None, clock=clock), bad)
    ledger = Ledger(f"sqlite:///{tmp_path}/ledger.db")

    def run(domain: str, run_id: str = "r1") -> dict | str:
        s = Stop(config=cfg, train=cfg.train("t"), domain=cfg.domain(domain), op_id=f"t/{run_id}/{domain}",
                 fleet=fleet, ledger=ledger, sleep=clock.advance, clock=clock)
        d = s.take()
        if not d.granted:
            return f"{d.outcome}: {d.reason}"
        wait_checkpoints(s, clock)
        s.drain()
        s.upgrade()
        s.check()
        return s.return_hosts()

    return cfg, clock, fleet, ledger, run


# ---- versions and rules ---------------------------------------------------------------------------
def test_versions_compare_as_dotted_numbers_with_a_text_fallback():
    assert compare("570.86.15", "570.124.6") < 0
    assert compare("550.127.08", "550.127.8") == 0
    assert compare("96.00.89.00.01", "96.00.a5.00.01") < 0
    assert compare("6.1.0-28", "6.1.0-25") > 0


def test_rules_parse_and_judge_versions():
    comps = {DRV, FM, "cuda-compat"}
    req = parse_rule("cuda-compat >= 12.8 requires gpu-driver >= 570", comps)
    assert req.broken({"cuda-compat": "12.8", DRV: "550.1"})
    assert not req.broken({"cuda-compat": "12.4", DRV: "550.1"})
    assert not req.broken({"cuda-compat": "12.8", DRV: "570.86.15"})
    eq = parse_rule(f"{FM} == {DRV}", comps)
    assert eq.broken({FM: "550.1", DRV: NEW}) and not eq.broken({FM: NEW, DRV: NEW})
    con = parse_rule("cuda-compat >= 13 conflicts gpu-driver < 580", comps)
    assert con.broken({"cuda-compat": "13.0", DRV: NEW})


def test_bad_rules_and_rollouts_are_refused_with_field_and_value():
    data = base(compatibility={"rules": ["nccl == gpu-driver", "gpu-driver ~ 570 requires kernel"],
                               "order": ["bios"]})
    data["releases"][0]["rollout"] = {"canary_domains": ["pod-z"]}
    data["job_stacks"] = [{"name": "cuda-12-8", "needs": ["gpu-driver >= 570 && rm"]}]
    with pytest.raises(ConfigError) as e:
        parse_config(data)
    text = str(e.value)
    assert "compatibility.rules[0]: unknown component 'nccl' in 'nccl == gpu-driver'" in text
    assert "compatibility.rules[1]:" in text and "'gpu-driver ~ 570'" in text
    assert "compatibility.order[0]: unknown component 'bios'" in text
    assert "releases[0].rollout.canary_domains[0]: unknown domain 'pod-z'" in text
    assert "job_stacks[0].needs[0]:" in text


def test_a_catalog_that_splits_driver_and_fabric_manager_is_refused():
    data = base(trains=[{"id": "t", "releases": ["drv", "krn"]}])
    with pytest.raises(ConfigError, match=r"trains\[0\]\.releases: rule 'fabric-manager == gpu-driver' would be "
                                          r"broken: 'drv' moves gpu-driver to 570.86.15 without a release of "
                                          r"'fabric-manager'"):
        parse_config(data)
    data = base()
    data["releases"][1]["version"] = "570.86.16"
    with pytest.raises(ConfigError, match="'fm' sets fabric-manager=570.86.16 but 'drv' sets gpu-driver=570.86.15"):
        parse_config(data)
    data = base()
    data["releases"][0]["rollout"] = {"canary_domains": ["pod-a"]}
    with pytest.raises(ConfigError, match="roll out differently"):
        parse_config(data)


# ---- one visit, right order ------------------------------------------------------------------------
def test_driver_and_fabric_manager_in_one_visit_in_order(tmp_path):
    cfg, _clock, fleet, ledger, run = world(tmp_path, base())
    out = run("pod-a")
    assert out == {"returned": 4, "offboarded": []}
    assert len(fleet.calls) == 4
    for _host, steps in fleet.calls:  # one call per host: everything in one visit, driver before fabric manager
        assert steps == [(DRV, NEW), (FM, NEW), (KRN, "6.1.0-28")]
    for h in fleet.hosts(cfg.domain("pod-a").hosts):
        assert h.state == HostState.SERVING and h.versions[DRV] == h.versions[FM] == NEW
    assert fleet.audit()["unverified_returns"] == []


def test_a_plan_that_breaks_a_rule_on_some_hosts_is_refused_before_any_host_is_touched(tmp_path):
    data = base(trains=[{"id": "t", "releases": ["cuda"]}])
    data["components"].append({"name": "cuda-compat", "duration_s": 30})
    data["releases"].append({"id": "cuda", "component": "cuda-compat", "version": "12.8"})
    data["compatibility"] = {"rules": ["cuda-compat >= 12.8 requires gpu-driver >= 570"]}
    data["simulator"]["initial_versions"]["cuda-compat"] = "12.4"
    cfg, _clock, fleet, ledger, run = world(tmp_path, data)
    fleet.engine.settings()  # the driver is still 550 everywhere
    msgs = check_plan(cfg, cfg.train("t"), fleet.hosts(), Rollout(cfg, ledger))
    assert len(msgs) == 1
    assert msgs[0].startswith("rule 'cuda-compat >= 12.8 requires gpu-driver >= 570' broken in the next run "
                              "on 12 host(s): ha1, ha2")
    assert "cuda-compat=12.8, gpu-driver=550.1" in msgs[0]
    out = run("pod-a")
    assert out.startswith("stop: pod-a refused before any host is touched: rule 'cuda-compat >= 12.8 requires")
    assert all(h.state == HostState.SERVING for h in fleet.hosts())
    assert fleet.calls == [] and ledger.holdings() == {} and fleet.audit()["stops"] == []
    p = plan_train(cfg, cfg.train("t"), fleet, ledger)
    assert p["violations"] == msgs


# ---- phases -----------------------------------------------------------------------------------------
def phased(release: str = "krn", **rollout) -> dict:
    data = base(trains=[{"id": "t", "releases": [release], "max_failure_fraction": 1.0}], compatibility={})
    idx = {"drv": 0, "krn": 2}[release]
    data["releases"][idx]["rollout"] = {"canary_domains": ["pod-a"], "staged_fraction": 0.5, "soak_s": 3600,
                                        "max_failure_rate": 0.2, **rollout}
    return data


def test_a_failing_release_halts_after_the_canary_and_the_fleet_never_gets_it(tmp_path):
    cfg, clock, fleet, ledger, run = world(tmp_path, phased(), bad=(KRN, "6.1.0-28"))
    out = run("pod-a")
    assert out["returned"] == 0 and len(out["offboarded"]) == 4  # every canary install failed
    clock.advance(120)  # past any soak
    for d in ("pod-b", "pod-c"):
        assert run(d) == f"skip: every host of {d} is already at target"  # nothing the phases allow
    st = Rollout(cfg, ledger).state("krn")
    assert st.halted and st.phase == "canary"
    assert st.reason.startswith("auto-halt: 4 of 4 canary hosts failed (100% > max_failure_rate 20%); first: ha1:")
    assert {h for h, _ in fleet.calls} == set(cfg.domain("pod-a").hosts)
    assert all(h.versions[KRN] == "6.1.0-25" for h in fleet.hosts() if h.domain != "pod-a")
    halts = [r for r in ledger.audit_rows("release/krn") if r["action"] == "release_halt"]
    assert len(halts) == 1 and halts[0]["actor"] == "railyard"
    # a resume is explicit, with a reason, and recorded
    with pytest.raises(ValueError, match="reason: say why"):
        Rollout(cfg, ledger).act("resume", "krn", reason="ok", actor="ana", now=fleet.now())
    Rollout(cfg, ledger).act("resume", "krn", reason="bad mirror fixed, retrying canary", actor="ana", now=fleet.now())
    assert [r["actor"] for r in ledger.audit_rows("release/krn")][-1] == "ana"
    assert not Rollout(cfg, ledger).state("krn").halted


def test_a_healthy_release_reaches_the_fleet_through_its_phases_with_soak_respected(tmp_path):
    cfg, clock, fleet, ledger, run = world(tmp_path, phased("drv", staged_fraction=0.5, soak_s=3600))
    # the config's rule set is empty here: a driver without the fabric manager is allowed
    assert run("pod-a")["returned"] == 4  # canary
    assert run("pod-b") == "skip: every host of pod-b is already at target"  # canary still soaking
    clock.advance(3600 / 60)  # one fleet hour at speed 60
    assert run("pod-b", "r2")["returned"] == 4  # staged: 50% of 12 = pod-a + hb1, hb2; the stop returns all 4
    assert {h for h, _ in fleet.calls} == {"ha1", "ha2", "ha3", "ha4", "hb1", "hb2"}
    staged_at = ledger.release_state("drv")["promoted_at"]
    assert run("pod-c", "r2") == "skip: every host of pod-c is already at target"
    clock.advance(3600 / 60)
    assert run("pod-c", "r3")["returned"] == 4  # fleet
    assert run("pod-b", "r3")["returned"] == 4  # hb3, hb4: what one cycle did not finish, the next one does
    assert all(h.versions[DRV] == NEW and h.state == HostState.SERVING for h in fleet.hosts())
    promos = [r for r in ledger.audit_rows("release/drv") if r["action"] == "release_promote"]
    assert [r["reason"].split(":")[0] for r in promos] == ["staged", "fleet"]
    st = ledger.release_state("drv")
    assert st["phase"] == "fleet"
    # soak: each promotion came at least soak_s (fleet clock) after the last host of the phase passed
    results = ledger.release_results("drv")
    canary_done = max(r["at"] for r in results if r["host"].startswith("ha"))
    staged_done = max(r["at"] for r in results if r["op_id"] == "t/r2/pod-b")
    assert staged_at - canary_done >= 3600
    assert st["promoted_at"] - staged_done >= 3600


def test_promote_and_halt_from_the_cli_are_recorded(tmp_path, monkeypatch, capsys):
    import yaml

    path = tmp_path / "r.yaml"
    data = phased("drv")
    data["ledger"] = {"url": f"sqlite:///{tmp_path}/ledger.db"}
    path.write_text(yaml.safe_dump(data))
    assert cli.main(["release", "promote", "drv", "--reason", "x", "--config", str(path)]) == 2
    assert "reason: say why" in capsys.readouterr().err
    assert cli.main(["release", "promote", "drv", "--reason", "canary looked fine", "--actor", "ana",
                     "--config", str(path)]) == 0
    assert cli.main(["release", "halt", "drv", "--reason", "XID 79 reports in staged", "--actor", "bo",
                     "--config", str(path)]) == 0
    assert cli.main(["release", "promote", "nope", "--reason", "because I can", "--config", str(path)]) == 2
    assert "unknown release 'nope'" in capsys.readouterr().err
    assert cli.main(["release", "list", "--config", str(path)]) == 0
    out = capsys.readouterr().out
    assert "drv" in out and "staged" in out and "HALTED: XID 79 reports in staged" in out
    rows = Ledger(f"sqlite:///{tmp_path}/ledger.db").audit_rows("release/drv")
    assert [(r["action"], r["actor"]) for r in rows][-2:] == [("release_promote", "ana"), ("release_halt", "bo")]


# ---- drift and job stacks ----------------------------------------------------------------------------
def test_drift_on_a_half_upgraded_fleet(tmp_path):
    data = base()
    data["job_stacks"] = [{"name": "cuda-12-8", "needs": [f"{DRV} >= 570"], "target": 0.5}]
    cfg, _clock, fleet, ledger, run = world(tmp_path, data)
    run("pod-a")
    run("pod-b")
    hosts = fleet.engine.hosts()
    d = drift(cfg, hosts, fleet.now())
    truth = sum(1 for h in hosts if h.versions[DRV] == NEW) / len(hosts)
    assert truth == pytest.approx(8 / 12)
    assert d["components"][DRV]["converged_fraction"] == pytest.approx(truth, abs=1e-4)
    assert d["components"][DRV]["converged_by_domain"] == {"pod-a": 1.0, "pod-b": 1.0, "pod-c": 0.0}
    assert d["components"][DRV]["versions"] == {"550.1": 4, NEW: 8}
    assert d["components"][KRN]["oldest_running"] == "6.1.0-25"
    assert d["components"][KRN]["oldest_age_days"] > 365
    js = d["job_stacks"][0]
    assert js["usable_hosts"] == sorted(h.name for h in hosts if h.versions[DRV] == NEW)
    assert js["fleet_ready"] and js["coverage"] == pytest.approx(8 / 12, abs=1e-4)
    text = describe_drift(d)
    assert "gpu-driver: 66.7% at newest 570.86.15; oldest running 550.1" in text
    png = drift_chart(d, str(tmp_path / "drift.png"))
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    json.dumps(d)  # the JSON form is plain data
