"""`railyard plan` and `railyard drift` at fleet scale: the demo config with its domains multiplied
(1,200 domains of 64 hosts: 76,800 hosts), served over HTTP by `railyard sim serve`.

Each command runs as a user runs it: a fresh process (interpreter, imports, config load and validation,
the fleet read over HTTP, the work, the printed report). Baselines, measured in the same run against
the same server:
- GET: one plain `GET /v1/hosts` of the whole fleet (the bytes only, no parsing): the data itself;
- fetch-once command: a fresh `python -c "import requests; requests.get(<url>/v1/hosts).content"`,
  the floor of any command that reads the fleet once;
- the same two commands on the demo fleet itself (64 hosts, its own simulator): what a command costs
  before the fleet's size counts (interpreter, imports, the ledger, printing).
Runs alternate baselines / plan / drift; medians of `--repeat`.

    .venv/bin/python bench/bench_plan.py [--domains 1200 --hosts 64 --repeat 3]

Prints a table, then one JSON object of the figures as the last line.
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
import yaml

ROOT = Path(__file__).resolve().parents[1]
DEMO_CONFIG = ROOT / "include" / "config" / "railyard.yaml"
GOAL_PLAN_S = 2.0
GOAL_DRIFT_S = 1.0
RAILYARD = [sys.executable, "-m", "railyard.cli"]


def scale_config(path: Path, domains: int, hosts_per_domain: int) -> Path:
    """The demo config with `domains` domains of `hosts_per_domain` hosts (train, releases, buffers as is)."""
    data = yaml.safe_load(DEMO_CONFIG.read_text())
    data["domains"] = [{"name": f"pod-{d:04d}", "hosts": f"gpu-{d:04d}-[01-{hosts_per_domain:02d}]"}
                       for d in range(domains)]
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def start_sim(config: Path, home: Path, timeout: float = 300) -> tuple[subprocess.Popen[bytes], str]:
    """`railyard sim serve` on a free port; returns the process and its URL once it answers."""
    from railyard.devstack.stack import free_port

    port = free_port()
    log = home / "sim.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAILYARD_FLEET_TOKEN")}
    proc = subprocess.Popen([*RAILYARD, "sim", "serve", "--config", str(config), "--db", str(home / "sim.db"),
                             "--port", str(port)], stdout=log.open("ab"), stderr=subprocess.STDOUT,
                            start_new_session=True, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the simulator exited:\n{log.read_text()[-3000:]}")
        try:
            if requests.get(f"{url}/healthz", timeout=5).ok:
                return proc, url
        except requests.RequestException:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"the simulator did not answer within {timeout:.0f}s")


def timed(cmd: list[str], env: dict[str, str], ok: tuple[int, ...] = (0,)) -> tuple[float, str]:
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    took = time.perf_counter() - t0
    if r.returncode not in ok:
        raise RuntimeError(f"{' '.join(cmd[2:])} exited {r.returncode}:\n{r.stderr[-3000:]}")
    return took, r.stdout


def run(domains: int = 1200, hosts_per_domain: int = 64, repeat: int = 3) -> dict[str, Any]:
    load_before = os.getloadavg()[0]
    home = Path(tempfile.mkdtemp(prefix="railyard-bench-plan-"))
    sim: subprocess.Popen[bytes] | None = None
    demo_sim: subprocess.Popen[bytes] | None = None
    try:
        cfg = scale_config(home / "railyard-scale.yaml", domains, hosts_per_domain)
        (home / "demo").mkdir()
        demo_sim, demo_url = start_sim(DEMO_CONFIG, home / "demo")
        t0 = time.perf_counter()
        sim, url = start_sim(cfg, home)
        sim_start_s = time.perf_counter() - t0
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAILYARD_FLEET_TOKEN")}
        env |= {"RAILYARD_HOME": str(home), "RAILYARD_CONFIG": str(cfg)}
        fleet = ["--config", str(cfg), "--fleet-url", url]
        demo = ["--config", str(DEMO_CONFIG), "--fleet-url", demo_url]
        fetch = [sys.executable, "-c", "import sys, requests; requests.get(sys.argv[1]).content", f"{url}/v1/hosts"]

        # once each before timing: the answers are checked, and the simulator has built its answer once
        _, out = timed([*RAILYARD, "plan", "demo", "--json", *fleet], env, ok=(0, 3))
        plan = json.loads(out)
        _, out = timed([*RAILYARD, "drift", "--json", *fleet], env)
        drift = json.loads(out)
        size = len(requests.get(f"{url}/v1/hosts", timeout=60).content)

        runs: dict[str, list[float]] = {"get": [], "fetch_once": [], "plan": [], "drift": [], "plan_demo": [],
                                        "drift_demo": []}
        for _ in range(repeat):
            runs["plan_demo"].append(timed([*RAILYARD, "plan", "demo", *demo], env, ok=(0, 3))[0])
            runs["drift_demo"].append(timed([*RAILYARD, "drift", *demo], env)[0])
            t = time.perf_counter()
            requests.get(f"{url}/v1/hosts", timeout=60).content  # noqa: B018 - the read is what is timed
            runs["get"].append(time.perf_counter() - t)
            runs["fetch_once"].append(timed(fetch, env)[0])
            runs["plan"].append(timed([*RAILYARD, "plan", "demo", *fleet], env, ok=(0, 3))[0])
            runs["drift"].append(timed([*RAILYARD, "drift", *fleet], env)[0])
    finally:
        from railyard.devstack.stack import stop_session

        for proc in (sim, demo_sim):
            if proc is not None:
                stop_session(proc.pid, grace=10, leader=proc)
        shutil.rmtree(home, ignore_errors=True)

    med = {k: round(statistics.median(v), 3) for k, v in runs.items()}
    return {
        "bench": "plan_drift_scale",
        "domains": domains,
        "hosts": domains * hosts_per_domain,
        "repeat": repeat,
        "sim_start_s": round(sim_start_s, 1),
        "hosts_json_bytes": size,
        "plan_s": med["plan"],
        "drift_s": med["drift"],
        "baseline_get_s": med["get"],
        "baseline_fetch_once_cmd_s": med["fetch_once"],
        "baseline_plan_demo_s": med["plan_demo"],
        "baseline_drift_demo_s": med["drift_demo"],
        "runs_s": {k: [round(x, 3) for x in v] for k, v in runs.items()},
        "plan_hosts_to_upgrade": plan["hosts_to_upgrade"],
        "plan_stops": len(plan["domains"]),
        "drift_hosts": drift["hosts"],
        "goal_plan_s": GOAL_PLAN_S,
        "goal_drift_s": GOAL_DRIFT_S,
        "goal_met": med["plan"] < GOAL_PLAN_S and med["drift"] < GOAL_DRIFT_S,
        "cpus": os.cpu_count(),
        "loadavg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }


def format_table(f: dict[str, Any]) -> str:
    lines = [
        f"{f['hosts']:,} hosts in {f['domains']:,} domains (demo config multiplied), `railyard sim serve` over HTTP "
        f"(started in {f['sim_start_s']} s); fresh process per command, median of {f['repeat']}",
        f"  {'':46}{'seconds':>9}   goal",
        f"  {'baseline: GET /v1/hosts ({:.1f} MB), bytes only'.format(f['hosts_json_bytes'] / 1e6):46}"
        f"{f['baseline_get_s']:>9.3f}",
        f"  {'baseline: a command that fetches them once':46}{f['baseline_fetch_once_cmd_s']:>9.3f}",
        f"  {'baseline: railyard plan demo, 64-host demo fleet':46}{f['baseline_plan_demo_s']:>9.3f}",
        f"  {'baseline: railyard drift, 64-host demo fleet':46}{f['baseline_drift_demo_s']:>9.3f}",
        f"  {'railyard plan demo':46}{f['plan_s']:>9.3f}   < {f['goal_plan_s']:.0f} s: "
        f"{'met' if f['plan_s'] < f['goal_plan_s'] else 'NOT met'}  ({f['plan_stops']} stops, "
        f"{f['plan_hosts_to_upgrade']:,} hosts to upgrade)",
        f"  {'railyard drift':46}{f['drift_s']:>9.3f}   < {f['goal_drift_s']:.0f} s: "
        f"{'met' if f['drift_s'] < f['goal_drift_s'] else 'NOT met'}  ({f['drift_hosts']:,} hosts)",
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
