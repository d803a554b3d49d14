"""The Railyard page at fleet scale: its JSON and its load in headless Chromium, at 76,800 hosts
(the demo config with 1,200 domains of 64 hosts, `bench_plan.scale_config`) beside the 64-host demo fleet.

Each fleet gets its own simulator (`railyard sim serve`) and its own Airflow api-server (`airflow
api-server`, one worker, on a freshly migrated SQLite DB; no scheduler: nothing runs), which serves the
Railyard plugin's page exactly as in `airflow standalone`, with Airflow's own login. In each fleet, before
timing, one domain is leased in the ledger and drained, and three hosts are failed, so the map has
something to show. Then, alternating between the two fleets, `--repeat` times:
- JSON: each endpoint the page can load, timed with `requests` (a bearer token from Airflow's `/auth/token`):
  `/api/overview` (what the page loads at open), the others the page's API offers, and one domain's hosts
  (`/api/domains/{domain}/hosts`, what a click on a domain loads);
- page: Chromium (Selenium, logged in through Airflow's login form) opens `/railyard/`; the time is from
  navigation start to usable: the page's first refresh drawn (`body[data-updated]`) and the browser's main
  thread free again after it (two animation frames).
Baselines, in the same run: one plain `GET /v1/hosts` of the big simulator (bytes only), and every figure at
the demo's size. A last check: the ledger's audit has no row more after the page views than before.

    .venv/bin/python bench/bench_page.py [--domains 1200 --hosts 64 --repeat 3]

Prints a table, then one JSON object of the figures as the last line. Needs chromium and chromium-driver
(`make deps`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "include"), str(Path(__file__).resolve().parent)]

import bench_plan  # noqa: E402

from railyard.devstack.stack import BIN, Stack, StackError, _wait, free_port  # noqa: E402
from tests.support.browser import chromium, login  # noqa: E402

GOAL_JSON_S = 1.0
GOAL_LOAD_S = 3.0
PASSWORD = "bench-page-admin"  # both api-servers: one login serves both (same JWT secret too)
JWT_SECRET = "bench-page-jwt-secret-not-for-production"
ENDPOINTS = ["/api/overview", "/api/map", "/api/capacity", "/api/buffers", "/api/trains", "/api/releases",
             "/api/operations", "/api/me"]
OPENED_AT_LOAD = ["/api/overview"]  # what index.html fetches when it opens

USABLE_JS = """
const done = arguments[arguments.length - 1];
const wait = () => {
  if (document.body.dataset.updated) {
    requestAnimationFrame(() => requestAnimationFrame(() => done({usable_ms: performance.now(),
      hosts_drawn: document.querySelectorAll('.host').length, domains_drawn: document.querySelectorAll('.dom').length,
      error: document.getElementById('msg').className === 'err' ? document.getElementById('msg').textContent : null})));
  } else { setTimeout(wait, 5); }
};
wait();
"""


class PageServer(Stack):
    """The simulator and an Airflow api-server alone: the Railyard page, its plugin and Airflow's login."""

    def start_sim(self, fresh: bool = True, timeout: float = 300) -> Any:
        """Stack's, with time for a big fleet to build before it answers."""
        self.home.mkdir(parents=True, exist_ok=True)
        db = self.home / "sim.db"
        if fresh and db.exists():
            db.unlink()
        self._write_token()
        log = self.home / "sim.log"
        self.sim = subprocess.Popen([sys.executable, "-m", "railyard.sim", "--config", str(self.config_file),
                                     "--db", str(db), "--port", str(self.sim_port), "--token-file",
                                     str(self.token_file)], stdout=log.open("ab"), stderr=subprocess.STDOUT,
                                    start_new_session=True, env=self.env())
        _wait("fleet simulator", timeout, self.fleet(retries=0, connect_timeout=1, read_timeout=60).capacity, self.sim,
              log)
        return self.fleet()

    def start_api_server(self, timeout: float = 180) -> None:
        if self.airflow_home.exists():
            shutil.rmtree(self.airflow_home)
        self.airflow_home.mkdir(parents=True)
        pw = self.airflow_home / "passwords.json"
        pw.write_text(json.dumps({"admin": PASSWORD}))
        self.extra_env |= {"AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
                           "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(pw),
                           "AIRFLOW__API_AUTH__JWT_SECRET": JWT_SECRET, "AIRFLOW__API__WORKERS": "1"}
        log = self.home / "airflow.log"
        r = subprocess.run([str(BIN / "airflow"), "db", "migrate"], env=self.env(), cwd=str(self.home),
                           capture_output=True, text=True, timeout=300)
        if r.returncode:
            raise StackError(f"airflow db migrate exited {r.returncode}:\n{r.stderr[-3000:]}")
        self.airflow = subprocess.Popen([str(BIN / "airflow"), "api-server", "--port", str(self.airflow_port)],
                                        stdout=log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True,
                                        env=self.env(), cwd=str(self.home))
        _wait("airflow api-server", timeout,
              lambda: requests.get(f"{self.api}/api/v2/monitor/health", timeout=3).ok, self.airflow, log)

    def password_of(self, user: str) -> str | None:
        return PASSWORD


def stage(s: PageServer) -> dict[str, Any]:
    """Something to show: one domain leased and drained (as a stop would), three hosts failed."""
    from railyard.domain.planning import budget_for
    from railyard.ledger import Ledger

    fleet = s.fleet(read_timeout=60)
    d = s.config.domains[len(s.config.domains) // 2]
    op = f"demo/manual__bench/{d.name}"
    led = Ledger(f"sqlite:///{s.home}/ledger.db")
    assert led.acquire_domain(op, train="demo", domain=d.name, hosts=list(d.hosts), budget=budget_for(s.config)).granted
    fleet.drain(list(d.hosts), op)
    failed = [s.config.domains[i].hosts[1] for i in (0, 1, len(s.config.domains) - 1)]
    for h in failed:
        fleet.fail(h)
    return {"domain_out": d.name, "failed": failed, "audit_rows": len(led.audit_rows(limit=1_000_000))}


def time_json(s: PageServer, token: str, domain: str) -> dict[str, float]:
    h = {"Authorization": f"Bearer {token}"}
    out = {}
    for path in [*ENDPOINTS, f"/api/domains/{domain}/hosts"]:
        t0 = time.perf_counter()
        r = requests.get(f"{s.api}/railyard{path}", headers=h, timeout=120)
        took = time.perf_counter() - t0
        if r.status_code == 404 and path.startswith("/api/domains/"):
            continue  # a page without hosts on demand (the figures before it)
        if not r.ok:
            raise RuntimeError(f"{path}: HTTP {r.status_code} {r.text[:300]}")
        key = "/api/domains/{domain}/hosts" if path.startswith("/api/domains/") else path
        out[key] = took
        out[f"bytes {key}"] = len(r.content)
    return out


def page_load(driver: Any, s: PageServer) -> dict[str, Any]:
    driver.get("about:blank")
    driver.get(f"{s.api}/railyard/")
    got = driver.execute_async_script(USABLE_JS)
    if got["error"]:
        raise RuntimeError(f"the page says: {got['error']}")
    return {"usable_s": got["usable_ms"] / 1000, "hosts_drawn": got["hosts_drawn"],
            "domains_drawn": got["domains_drawn"]}


def raw_get(s: PageServer) -> tuple[float, int]:
    h = {"Authorization": f"Bearer {s.fleet_token}"}
    t0 = time.perf_counter()
    n = len(requests.get(f"{s.fleet_url}/v1/hosts", headers=h, timeout=120).content)
    return time.perf_counter() - t0, n


def run(domains: int = 1200, hosts_per_domain: int = 64, repeat: int = 3) -> dict[str, Any]:
    load_before = os.getloadavg()[0]
    home = Path(tempfile.mkdtemp(prefix="railyard-bench-page-"))
    servers: dict[str, PageServer] = {}
    driver = None
    try:
        cfg = bench_plan.scale_config(home / "railyard-scale.yaml", domains, hosts_per_domain)
        t0 = time.perf_counter()
        for name, config in (("demo", bench_plan.DEMO_CONFIG), ("scale", cfg)):
            s = PageServer(home=home / name, config_file=config, airflow_port=free_port(), sim_port=free_port())
            servers[name] = s
            s.start_sim()
        sim_start_s = time.perf_counter() - t0
        for s in servers.values():
            s.start_api_server()
        staged = {name: stage(s) for name, s in servers.items()}
        tokens = {name: s.token("admin", PASSWORD) for name, s in servers.items()}
        driver = chromium(home / "chromium", script_timeout=120)
        login(driver, servers["demo"].api, "admin", PASSWORD)
        # once each before timing: the api-server has built its config, fleet client and ledger once
        for name, s in servers.items():
            time_json(s, tokens[name], staged[name]["domain_out"])
            page_load(driver, s)
        runs: dict[str, dict[str, list[float]]] = {n: {} for n in servers}
        pages: dict[str, list[dict[str, Any]]] = {n: [] for n in servers}
        raw: list[float] = []
        size = 0
        for _ in range(repeat):
            for name, s in servers.items():
                for k, v in time_json(s, tokens[name], staged[name]["domain_out"]).items():
                    runs[name].setdefault(k, []).append(v)
                pages[name].append(page_load(driver, s))
            took, size = raw_get(servers["scale"])
            raw.append(took)
        from railyard.ledger import Ledger

        writes = {n: len(Ledger(f"sqlite:///{s.home}/ledger.db").audit_rows(limit=1_000_000))
                  - staged[n]["audit_rows"] for n, s in servers.items()}
    finally:
        if driver is not None:
            driver.quit()
        for s in servers.values():
            s.stop()
        shutil.rmtree(home, ignore_errors=True)

    def med(xs: list[float]) -> float:
        return round(statistics.median(xs), 3)

    fig: dict[str, Any] = {"bench": "page_scale", "domains": domains, "hosts": domains * hosts_per_domain,
                           "repeat": repeat, "sim_start_s": round(sim_start_s, 1), "baseline_get_s": med(raw),
                           "hosts_json_bytes": size, "audit_rows_added_by_reads": writes}
    for name in servers:
        fig[name] = {
            "json_s": {k: med(v) for k, v in runs[name].items() if not k.startswith("bytes ")},
            "json_bytes": {k.removeprefix("bytes "): int(v[-1]) for k, v in runs[name].items()
                           if k.startswith("bytes ")},
            "load_s": med([p["usable_s"] for p in pages[name]]),
            "load_runs_s": [round(p["usable_s"], 3) for p in pages[name]],
            "hosts_drawn": pages[name][-1]["hosts_drawn"], "domains_drawn": pages[name][-1]["domains_drawn"],
        }
    big = fig["scale"]
    fig["json_max_s"] = max(big["json_s"].values())
    fig["json_open_s"] = sum(big["json_s"][p] for p in OPENED_AT_LOAD)
    fig["load_s"] = big["load_s"]
    fig["goal_json_s"], fig["goal_load_s"] = GOAL_JSON_S, GOAL_LOAD_S
    fig["goal_met"] = fig["json_max_s"] < GOAL_JSON_S and fig["load_s"] < GOAL_LOAD_S and not any(writes.values())
    fig["cpus"] = os.cpu_count()
    fig["loadavg_1m"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    return fig


def format_table(f: dict[str, Any]) -> str:
    big, demo = f["scale"], f["demo"]
    lines = [
        f"Railyard page: {f['hosts']:,} hosts in {f['domains']:,} domains vs the 64-host demo fleet; an Airflow "
        f"api-server each; median of {f['repeat']}",
        f"  {'':36}{'demo s':>9}{'scale s':>9}{'scale KB':>10}   goal",
        f"  {'baseline: GET /v1/hosts, bytes only':36}{'':>9}{f['baseline_get_s']:>9.3f}"
        f"{f['hosts_json_bytes'] / 1e3:>10,.0f}",
    ]
    for path, s in big["json_s"].items():
        goal = "met" if s < f["goal_json_s"] else "NOT met"
        lines.append(f"  {'GET ' + path:36}{demo['json_s'].get(path, float('nan')):>9.3f}{s:>9.3f}"
                     f"{big['json_bytes'][path] / 1e3:>10,.0f}   < {f['goal_json_s']:.0f} s: {goal}")
    goal = "met" if f["load_s"] < f["goal_load_s"] else "NOT met"
    lines += [
        f"  {'page: navigation to usable':36}{demo['load_s']:>9.3f}{big['load_s']:>9.3f}{'':>10}   "
        f"< {f['goal_load_s']:.0f} s: {goal}  ({big['domains_drawn']:,} domains, {big['hosts_drawn']:,} host cells "
        "drawn)",
        f"  audit rows written by the page's reads: {f['audit_rows_added_by_reads']}",
        f"  {f['cpus']} CPUs, 1-minute load average before/after: {f['loadavg_1m']}",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """`argv=None` means no flags (not sys.argv), so `bench/run.py` can call `main()`."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--domains", type=int, default=1200)
    p.add_argument("--hosts", type=int, default=64, help="hosts per domain")
    p.add_argument("--repeat", type=int, default=3)
    a = p.parse_args([] if argv is None else argv)
    fig = run(a.domains, a.hosts, a.repeat)
    print(format_table(fig))
    print(json.dumps(fig, sort_keys=True))
    return fig


if __name__ == "__main__":
    main(sys.argv[1:])
