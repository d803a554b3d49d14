"""`/railyard/metrics`: Prometheus' text format from the ledger's database, behind a scrape token or Airflow's
auth, never asking the fleet; checked with the real `promtool` (Debian's prometheus package)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from railyard.domain.config import parse_config
from railyard.domain.planning import budget_for
from railyard.ledger import Ledger
from railyard.operations.metrics import check_of, record_fleet, render
from railyard.sim.engine import SimEngine
from railyard_airflow.ui import app as ui_app
from railyard_airflow.ui import views
from tests.support.configs import small_config
from tests.unit.test_ui_api import Clock, FixedSources, as_, auth  # noqa: F401  (auth: the module's fixture)

TOKEN = "s3cret-scrape-token-0123456789"


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(text: str, name: str, **labels: str) -> float:
    return samples(text)[(name, tuple(sorted(labels.items())))]


class NoFleet:
    """A fleet that may not be asked anything: a scrape reads the ledger only."""

    def __getattr__(self, name: str) -> object:
        raise AssertionError(f"the scrape asked the fleet for {name}")


@pytest.fixture
def world(tmp_path, auth, monkeypatch):  # noqa: F811
    monkeypatch.setenv("RAILYARD_METRICS_TOKEN", TOKEN)
    data = small_config(domains=3, hosts_per_domain=4)
    data["trains"][0]["cycle_days"] = 30
    cfg = parse_config(data)
    fleet = SimEngine(cfg, None, clock=Clock())
    ledger = Ledger(f"sqlite:///{tmp_path}/ledger.db")
    client = TestClient(ui_app.create_app(FixedSources(cfg, NoFleet(), ledger)))
    return cfg, fleet, ledger, client


def test_a_scrape_needs_the_token_or_an_airflow_login(world, auth) -> None:  # noqa: F811
    *_, client = world
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers={"Authorization": "Bearer wrong-token"}).status_code in (401, 403)
    assert client.get("/metrics", headers={"Authorization": f"Basic {TOKEN}"}).status_code == 401
    r = client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert client.get("/metrics", headers=as_(auth, "viewer")).status_code == 200
    assert TOKEN not in r.text


def test_the_token_may_come_from_a_file(world, tmp_path, monkeypatch) -> None:
    *_, client = world
    monkeypatch.delenv("RAILYARD_METRICS_TOKEN")
    (tmp_path / "token").write_text("from-a-file-token\n")
    monkeypatch.setenv("RAILYARD_METRICS_TOKEN_FILE", str(tmp_path / "token"))
    assert client.get("/metrics", headers={"Authorization": "Bearer from-a-file-token"}).status_code == 200
    assert client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).status_code in (401, 403)


def test_the_values_are_the_ledgers_and_the_last_read_of_the_fleet(world) -> None:
    cfg, fleet, ledger, client = world
    hosts = list(cfg.domain("pod-b").hosts)
    op = "demo/manual__2026-01-01T00:00:00+00:00/pod-b"
    assert ledger.acquire_domain(op, train="demo", domain="pod-b", hosts=hosts, budget=budget_for(cfg)).granted
    fleet.drain(hosts, op)
    fleet.offboard("gpu-c02", "health check failed: dcgmi diag -r 3: PCIe replay count 667 on GPU 5", "repair/c02")
    ledger.note(op, "offboard", ["gpu-c02"], "health check failed: dcgmi diag -r 3: PCIe replay count 667 on GPU 5")
    before = client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).text
    # before any read of the fleet: the ledger's own values, no host counts and no age
    assert value(before, "railyard_domains_out") == 1
    assert value(before, "railyard_domain_out", domain="pod-b", op_kind="train_stop") == 1
    assert value(before, "railyard_hosts_leased", op_kind="train_stop") == 4
    assert "railyard_fleet_counts_age_seconds" not in {k[0] for k in samples(before)}
    record_fleet(fleet, ledger, cfg)
    text = client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).text
    sku = cfg.domains[0].sku
    assert value(text, "railyard_hosts", sku=sku, state="serving") == 7
    assert value(text, "railyard_hosts", sku=sku, state="repair") == 1
    assert value(text, "railyard_serving_fraction", sku=sku) == pytest.approx(7 / 12)
    [buf] = views.buffers(cfg, fleet.hosts(), ledger)  # the page's own count, from a read of every host
    assert value(text, "railyard_buffer_used_hosts", sku=sku, buffer="maintenance") == buf["maintenance"]["used"]
    assert value(text, "railyard_buffer_used_hosts", sku=sku, buffer="failure") == buf["failure"]["used"] == 1
    assert value(text, "railyard_buffer_budget_hosts", sku=sku, buffer="maintenance") == 4
    assert value(text, "railyard_hosts_offboarded_total", check="dcgm") == 1
    assert 0 <= value(text, "railyard_fleet_counts_age_seconds") < 60
    component = cfg.components[0].name
    at = {k[1]: v for k, v in samples(text).items() if k[0] == "railyard_hosts_at_version"}
    assert sum(v for labels, v in at.items() if dict(labels)["component"] == component) == 12
    assert value(text, "railyard_train_domain_overdue", train="demo", domain="pod-a") == 1  # never visited
    ledger.record_visit("demo", "pod-a", fleet.now(), op)
    ledger.release(op)
    after = client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).text
    assert value(after, "railyard_train_domain_overdue", train="demo", domain="pod-a") == 0
    assert value(after, "railyard_train_domain_overdue", train="demo", domain="pod-c") == 1
    assert value(after, "railyard_train_last_visit_timestamp_seconds", train="demo", domain="pod-a") == fleet.now()
    assert value(after, "railyard_domains_out") == 0
    assert ("railyard_domain_out", (("domain", "pod-b"), ("op_kind", "train_stop"))) not in samples(after)


def test_no_series_grows_with_the_number_of_hosts(tmp_path) -> None:
    counts = []
    for n in (4, 64):
        cfg = parse_config(small_config(domains=3, hosts_per_domain=n))
        fleet = SimEngine(cfg, None, clock=Clock())
        ledger = Ledger(f"sqlite:///{tmp_path}/ledger-{n}.db")
        d = cfg.domains[1]
        assert ledger.acquire_domain("demo/r/x", train="demo", domain=d.name, hosts=list(d.hosts),
                                     budget=budget_for(cfg)).granted
        record_fleet(fleet, ledger, cfg)
        counts.append(len(samples(render(cfg, ledger).decode())))
    assert counts[0] == counts[1] > 30


@pytest.mark.parametrize(("reason", "check"), [
    ("health check failed: dcgmi diag -r 3: PCIe replay count 667 on GPU 5 above threshold", "dcgm"),
    ("health check failed: all_reduce_perf: bus bandwidth 212.0 GB/s below 360 GB/s", "nccl"),
    ("health check failed: XID 79 on 0000:3B:00.0: GPU has fallen off the bus", "xid"),
    ("health check failed: nvidia-smi: GPU 3 has 2 retired pages pending", "nvidia-smi"),
    ("health check failed: ib_write_bw mlx5_2: 120.0 Gb/s below floor 390 Gb/s", "infiniband"),
    ("health check failed: versions not at target", "versions"),
    ("health check failed: something new", "health"),
    ("upgrade failed: exit 1: dpkg: error processing package", "upgrade"),
    ("sent to repair by alice: fans loud", "operator"),
    ("could not be verified at target versions", "versions"),
    ("found in repair while held by x", "other"),
])
def test_an_offboards_reason_names_one_of_a_few_checks(reason: str, check: str) -> None:
    assert check_of(reason) == check


def test_promtool_accepts_a_scrape(world) -> None:
    assert shutil.which("promtool"), "promtool: scripts/setup-deps installs Debian's prometheus package"
    cfg, fleet, ledger, client = world
    record_fleet(fleet, ledger, cfg)
    text = client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).text
    out = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


MONITORING = Path(__file__).resolve().parents[2] / "docs" / "monitoring"
METRIC = re.compile(r"\brailyard_[a-z_]+\b")


def test_the_shipped_rules_pass_promtool_and_fire_when_they_should() -> None:
    rules = MONITORING / "railyard-rules.yml"
    check = subprocess.run(["promtool", "check", "rules", str(rules)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0 and "6 rules found" in check.stdout, check.stdout + check.stderr
    test = subprocess.run(["promtool", "test", "rules", "railyard-rules.test.yml"], cwd=MONITORING,
                          capture_output=True, text=True, timeout=60)
    assert test.returncode == 0 and "SUCCESS" in test.stdout, test.stdout + test.stderr


def test_the_rules_and_the_dashboard_name_only_metrics_a_scrape_has(world) -> None:
    cfg, fleet, ledger, client = world
    for d in ("pod-a", "pod-b"):  # one stop done, one in flight, one offboard: every series has a sample
        assert ledger.acquire_domain(f"demo/r/{d}", train="demo", domain=d, hosts=list(cfg.domain(d).hosts),
                                     budget=budget_for(cfg)).granted
        if d == "pod-a":
            ledger.release("demo/r/pod-a")
            assert ledger.finish_operation("demo/r/pod-a", reason="its stop is done")
    ledger.note("demo/r/pod-b", "offboard", ["gpu-b01"], "health check failed: XID 79 on GPU 3")
    record_fleet(fleet, ledger, cfg)
    names = {k[0] for k in samples(client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).text)}
    rules = yaml.safe_load((MONITORING / "railyard-rules.yml").read_text())
    exprs = [r["expr"] for g in rules["groups"] for r in g["rules"]]
    dash = json.loads((MONITORING / "railyard-dashboard.json").read_text())
    exprs += [t["expr"] for p in dash["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in METRIC.findall(e)}
    assert used and used <= names, sorted(used - names)
