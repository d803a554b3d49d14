"""Airflow's grid for a 64-domain train over 25 runs, in headless Chromium, beside a plain DAG of the same shape.

One `airflow standalone` (railyard.devstack.stack.Stack, the simulator beside it) serves two DAGs from one folder:
the Railyard train of a config with 64 domains (`bench_parse.scale_config`: 6 tasks per stop, the
cycle report and the revisit slots) and the baseline, the same task groups and edges of EmptyOperators
(`bench_parse.BASELINE_DAG`). Both are paused, so nothing runs: each gets RUNS runs triggered through the
REST API and marked success (every task instance success), the same for both.

Then, for each DAG, alternating, REPEAT times:
- page: Debian's Chromium (Selenium, a fresh browser logged in once) opens the DAG's page, whose left
  panel is the grid; the time is from navigation start to the page settled: the grid's last API answer
  (`/ui/grid/...`) received and the browser's main thread free again after it (two animation frames);
- api: the grid's three calls as the page makes them (structure, runs, task-instance summaries of the
  runs), timed with `requests`: the server's share.

    .venv/bin/python bench/bench_grid.py [--domains 64 --runs 25 --repeat 5]

Prints a table, then one JSON object of the figures as the last line. Needs chromium and chromium-driver
(`make deps`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import requests
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "include"), str(Path(__file__).resolve().parent)]

import bench_parse  # noqa: E402

from railyard.devstack.stack import Stack, free_port  # noqa: E402
from tests.support.browser import chromium, login  # noqa: E402

TRAIN = "railyard_train_t00"
BASELINE = "baseline_train_t00"
ONE = "baseline_one_task"  # the page's own floor: the same page and runs, a grid of one row
ONE_TASK_DAG = '''"""bench_grid's floor: one EmptyOperator."""
from datetime import datetime

from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG

with DAG(dag_id="baseline_one_task", schedule=None, start_date=datetime(2026, 1, 1), catchup=False,
         tags=["baseline"]) as dag:
    EmptyOperator(task_id="only")
'''
GOAL_OVER_BASELINE = 1.2  # the train's grid no slower than 1.2x a plain DAG of the same shape

SETTLED_JS = """
const done = arguments[arguments.length - 1];
const grid = performance.getEntriesByType('resource').filter(e => e.name.includes('/ui/grid/'));
if (!grid.length || grid.some(e => !e.responseEnd)) { done(null); return; }
const last = Math.max(...grid.map(e => e.responseEnd));
if (performance.now() - last < 1500) { done(null); return; }  // more may follow
requestAnimationFrame(() => requestAnimationFrame(() => done({
  last_api_ms: last, settled_ms: performance.now(), calls: grid.length})));
"""


def page_load(driver: Any, stack: Stack, dag_id: str, shot: Path | None = None) -> dict[str, Any]:
    """Open the DAG's page (the grid on its left) and wait until it has settled; times in seconds."""
    driver.get("about:blank")
    driver.get(f"{stack.api}/dags/{dag_id}")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        got = driver.execute_async_script(SETTLED_JS)
        if got:
            if shot is not None:
                driver.save_screenshot(str(shot))
            return {"settled_s": got["settled_ms"] / 1000, "last_api_s": got["last_api_ms"] / 1000,
                    "calls": got["calls"]}
        time.sleep(0.2)
    raise RuntimeError(f"the grid of {dag_id} did not settle within 120 s")


def api_load(stack: Stack, dag_id: str, runs: int) -> float:
    """The grid's three calls, as the page makes them: structure, runs, then the runs' TI summaries."""
    h = {"Authorization": f"Bearer {stack.token()}"}
    t0 = time.perf_counter()
    params = {"limit": runs, "order_by": "-run_after"}
    r = requests.get(f"{stack.api}/ui/grid/structure/{dag_id}", params=params, headers=h, timeout=120)
    r.raise_for_status()
    r = requests.get(f"{stack.api}/ui/grid/runs/{dag_id}", params=params, headers=h, timeout=120)
    r.raise_for_status()
    run_ids = [x["run_id"] for x in r.json()]
    assert len(run_ids) == runs, (dag_id, len(run_ids))
    r = requests.get(f"{stack.api}/ui/grid/ti_summaries/{dag_id}", params=[("run_ids", i) for i in run_ids],
                     headers=h, timeout=120)
    r.raise_for_status()
    lines = [ln for ln in r.text.splitlines() if ln.strip()]
    assert len(lines) == runs, (dag_id, len(lines))
    return time.perf_counter() - t0


def make_runs(stack: Stack, dag_id: str, runs: int) -> int:
    """RUNS runs of a paused DAG, every task instance marked success (the DAG's last tasks, with all
    upstream of them), then the run; the task-instance count of one run."""
    stack.wait_dag(dag_id, timeout=300)
    stack.rest("PATCH", f"/dags/{dag_id}", json={"is_paused": True})
    tasks = stack.rest("GET", f"/dags/{dag_id}/tasks")["tasks"]
    leaves = [t["task_id"] for t in tasks if not t["downstream_task_ids"]]
    for i in range(runs):
        run_id = f"bench_{i:02d}"
        stack.rest("POST", f"/dags/{dag_id}/dagRuns", ok=(200, 201, 409), retry=True,
                   json={"dag_run_id": run_id, "logical_date": None, "conf": {}})
        for task_id in leaves:
            stack.rest("PATCH", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}",
                       json={"new_state": "success", "include_upstream": True})
        stack.rest("PATCH", f"/dags/{dag_id}/dagRuns/{run_id}", json={"state": "success"})
    for run_id in ("bench_00", f"bench_{runs - 1:02d}"):
        states = {t["state"] for t in stack.task_instances(dag_id, run_id)}
        assert states == {"success"}, (dag_id, run_id, states)
    return len(stack.task_instances(dag_id, "bench_00"))  # every page of them


def run(domains: int = 64, runs: int = 25, repeat: int = 5, shots: Path | None = None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="railyard-bench-grid-") as tmp_s:
        tmp = Path(tmp_s)
        dags = tmp / "dags"
        dags.mkdir()
        shutil.copy(ROOT / "dags" / "railyard_trains.py", dags / "railyard_trains.py")
        bench_parse.write_baseline_dag(dags, trains=1, domains=domains)
        (dags / "baseline_one_task.py").write_text(ONE_TASK_DAG)
        cfg = tmp / "railyard.yaml"
        cfg.write_text(yaml.safe_dump(bench_parse.scale_config(trains=1, domains=domains), sort_keys=False))
        stack = Stack(home=tmp / "stack", config_file=cfg, airflow_port=free_port(), sim_port=free_port(),
                      extra_env={"AIRFLOW__CORE__DAGS_FOLDER": str(dags),
                                 "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True"})
        stack.start_sim()
        driver = None
        try:
            stack.start_airflow()
            stack.ensure_pool()
            tasks = {d: make_runs(stack, d, runs) for d in (TRAIN, BASELINE, ONE)}
            driver = chromium(tmp / "chromium", size="1600,1200")
            login(driver, stack.api, "admin", stack.password, timeout=90)
            for d in (TRAIN, BASELINE, ONE):  # warm: the UI's assets cached, the api-server's code paths taken
                page_load(driver, stack, d)
                api_load(stack, d, runs)
            pages: dict[str, list[dict[str, Any]]] = {TRAIN: [], BASELINE: [], ONE: []}
            apis: dict[str, list[float]] = {TRAIN: [], BASELINE: [], ONE: []}
            for i in range(repeat):
                for d in (BASELINE, TRAIN, ONE):
                    shot = shots / f"grid-{d}.png" if shots is not None and i == 0 else None
                    pages[d].append(page_load(driver, stack, d, shot))
                    apis[d].append(api_load(stack, d, runs))
        finally:
            if driver is not None:
                driver.quit()
            stack.stop()
    fig: dict[str, Any] = {"bench": "grid", "domains": domains, "runs": runs, "repeat": repeat,
                           "loadavg": round(os.getloadavg()[0], 2)}
    for d, key in ((TRAIN, "railyard"), (BASELINE, "baseline"), (ONE, "one_task")):
        fig[key] = {"dag_id": d, "task_instances_per_run": tasks[d],
                    "page_settled_s": round(statistics.median(p["settled_s"] for p in pages[d]), 2),
                    "page_last_api_s": round(statistics.median(p["last_api_s"] for p in pages[d]), 2),
                    "page_runs_s": [round(p["settled_s"], 2) for p in pages[d]],
                    "api_s": round(statistics.median(apis[d]), 3), "grid_calls": pages[d][-1]["calls"]}
    fig["ratio"] = round(fig["railyard"]["page_settled_s"] / fig["baseline"]["page_settled_s"], 2)
    floor = fig["one_task"]["page_settled_s"]
    fig["railyard_over_floor_s"] = round(fig["railyard"]["page_settled_s"] - floor, 2)
    fig["baseline_over_floor_s"] = round(fig["baseline"]["page_settled_s"] - floor, 2)
    fig["goal_met"] = fig["ratio"] <= GOAL_OVER_BASELINE
    return fig


def format_table(fig: dict[str, Any]) -> str:
    rows = [f"Airflow grid, {fig['domains']} domains, {fig['runs']} runs, median of {fig['repeat']} "
            f"(1-minute load average {fig['loadavg']})",
            f"  {'':34}{'TIs/run':>8}{'page settled':>14}{'last grid API':>15}{'3 grid API calls':>18}"]
    for key, label in (("railyard", "Railyard train"), ("baseline", "EmptyOperator DAG, same shape"),
                       ("one_task", "one EmptyOperator (the page's floor)")):
        f = fig[key]
        rows.append(f"  {label:34}{f['task_instances_per_run']:>8}{f['page_settled_s']:>13.2f}s"
                    f"{f['page_last_api_s']:>14.2f}s{f['api_s']:>17.3f}s")
    rows.append(f"  the shape's cost over the page's floor: Railyard {fig['railyard_over_floor_s']:+.2f} s, the same "
                f"shape of EmptyOperators {fig['baseline_over_floor_s']:+.2f} s (one page load varies by a second "
                "or more here: see page_runs_s)")
    rows.append(f"  Railyard / baseline (page settled): {fig['ratio']:.2f}; goal <= {GOAL_OVER_BASELINE}: "
                f"{'met' if fig['goal_met'] else 'NOT met'}")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--domains", type=int, default=64)
    p.add_argument("--runs", type=int, default=25)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--shots", type=Path, help="save a screenshot of each grid in this folder")
    a = p.parse_args([] if argv is None else argv)
    fig = run(a.domains, a.runs, a.repeat, a.shots)
    print(format_table(fig))
    print(json.dumps(fig))
    return fig


if __name__ == "__main__":
    main(sys.argv[1:])
