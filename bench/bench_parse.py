"""DAG-file parse time at scale: 20 trains x 64 domains, side by side with a plain-Airflow baseline.

Railyard: `dags/railyard_trains.py` (config load + validation + Railyard operators/sensors) over a
generated config of TRAINS trains, each visiting all DOMAINS domains of HOSTS hosts.
Baseline: one plain DAG file building the same DAGs, TaskGroups, tasks and edges with
EmptyOperator, no config and no Railyard.

Each measurement runs in a fresh subprocess (own AIRFLOW_HOME, no examples): it imports Airflow
and the DagBag class first, then times only `DagBag(dag_folder=...)` (examples off by env)
— the cold fill, as the dag-processor does it for a file — and then a second, warm fill in the
same process (modules already imported). Runs alternate baseline / Railyard.

    .venv/bin/python bench/bench_parse.py [--trains 20 --domains 64 --hosts 4 --repeat 5]

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
import textwrap
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
DAG_FILE = ROOT / "dags" / "railyard_trains.py"
DEMO_CONFIG = ROOT / "include" / "config" / "railyard.yaml"
STEPS = ("wait_capacity", "wait_checkpoints", "drain", "upgrade", "health_check", "return_to_service")

# The baseline: the same shape as the Railyard factory builds (6 tasks per stop, the return step
# a teardown of the capacity wait, the next stop after the previous check and return), nothing else.
BASELINE_DAG = textwrap.dedent(
    '''\
    """Baseline for bench_parse: TRAINS DAGs x DOMAINS TaskGroups x 6 EmptyOperators, no config."""

    from datetime import datetime

    from airflow.providers.standard.operators.empty import EmptyOperator
    from airflow.sdk import DAG, TaskGroup

    TRAINS = {trains}
    DOMAINS = {domains}

    for t in range(TRAINS):
        with DAG(
            dag_id=f"baseline_train_t{{t:02d}}",
            schedule=None,
            start_date=datetime(2026, 1, 1),
            catchup=False,
            max_active_runs=1,
            tags=["baseline"],
        ) as dag:
            prev = None
            for d in range(DOMAINS):
                with TaskGroup(group_id=f"pod-{{d:02d}}"):
                    take = EmptyOperator(task_id="wait_capacity", trigger_rule="none_failed")
                    ckpt = EmptyOperator(task_id="wait_checkpoints")
                    drain = EmptyOperator(task_id="drain", pool="railyard_disruptive")
                    upgrade = EmptyOperator(task_id="upgrade", pool="railyard_disruptive")
                    check = EmptyOperator(task_id="health_check", pool="railyard_disruptive")
                    ret = EmptyOperator(task_id="return_to_service", pool="railyard_disruptive")
                    take >> ckpt >> drain >> upgrade >> check >> ret.as_teardown(setups=take)
                if prev is not None:
                    [*prev] >> take
                prev = (check, ret)
        globals()[dag.dag_id] = dag
    '''
)

# Runs in a fresh interpreter: argv[1] = dag folder. Prints one JSON line.
PROBE = textwrap.dedent(
    """\
    import gc, inspect, json, sys, time
    import airflow  # noqa: F401  (not timed)
    from airflow.dag_processing.dagbag import DagBag  # also imports airflow.sdk (not timed)

    # Airflow 3.3 dropped DagBag's include_examples; examples are off through the environment.
    kw = {"include_examples": False} if "include_examples" in inspect.signature(DagBag).parameters else {}

    def fill():
        t0 = time.perf_counter()
        bag = DagBag(dag_folder=sys.argv[1], **kw)
        return time.perf_counter() - t0, bag

    cold, bag = fill()
    dags = [bag.dags[d] for d in sorted(bag.dags)]  # get_dag() would query the metadata DB
    out = {
        "cold_s": cold,
        "dags": len(dags),
        "groups": sum(len([g for g in d.task_group_dict if g]) for d in dags),
        "tasks": sum(len(d.tasks) for d in dags),
        "import_errors": {str(k): str(v) for k, v in bag.import_errors.items()},
    }
    del bag, dags
    gc.collect()
    out["warm_s"], _ = fill()
    print(json.dumps(out))
    """
)


def scale_config(trains: int = 20, domains: int = 64, hosts_per_domain: int = 4) -> dict[str, Any]:
    """The demo config, scaled: `domains` domains of `hosts_per_domain` hosts, `trains` trains over all."""
    data = yaml.safe_load(DEMO_CONFIG.read_text())
    demo_train = data["trains"][0]
    data["domains"] = [
        {"name": f"pod-{d:02d}", "hosts": f"gpu-d{d:02d}-[01-{hosts_per_domain:02d}]"} for d in range(domains)
    ]
    data["trains"] = [
        {
            "id": f"t{t:02d}",
            "description": f"scale train {t:02d}: every domain",
            "schedule": None,
            "releases": list(demo_train["releases"]),
        }
        for t in range(trains)
    ]
    # One domain must fit in the maintenance buffer.
    data["buffers"] = {"maintenance": {"hosts": hosts_per_domain}, "failure": {"fraction": 0.05}}
    return data


def write_scale_config(path: Path, trains: int = 20, domains: int = 64, hosts_per_domain: int = 4) -> Path:
    path = Path(path)
    path.write_text(yaml.safe_dump(scale_config(trains, domains, hosts_per_domain), sort_keys=False))
    return path


def write_baseline_dag(folder: Path, trains: int = 20, domains: int = 64) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "baseline_trains.py"
    path.write_text(BASELINE_DAG.format(trains=trains, domains=domains))
    return path


def _env(home: Path, config: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "RAILYARD_"))}
    paths = [str(ROOT / "plugins"), str(ROOT / "include")]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env.update(
        AIRFLOW_HOME=str(home / "airflow"),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__CORE__UNIT_TEST_MODE="False",
        AIRFLOW__CORE__PLUGINS_FOLDER=str(ROOT / "plugins"),
        RAILYARD_HOME=str(home / "railyard"),
        PYTHONPATH=os.pathsep.join(paths),
    )
    if config is not None:
        env["RAILYARD_CONFIG"] = str(config)
    return env


def measure_once(dag_folder: Path, home: Path, config: Path | None = None) -> dict[str, Any]:
    """One fresh-subprocess DagBag fill of `dag_folder`."""
    env = _env(home, config)
    env["AIRFLOW__CORE__DAGS_FOLDER"] = str(dag_folder)
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, str(dag_folder)],
        env=env,
        cwd=str(home),
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(
            f"parse probe failed (rc={proc.returncode}) for {dag_folder}:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
        )
    return json.loads(lines[-1])


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    cold = [r["cold_s"] for r in runs]
    warm = [r["warm_s"] for r in runs]
    last = runs[-1]
    errors: dict[str, str] = {}
    for r in runs:
        errors.update(r["import_errors"])
    return {
        "median_s": round(statistics.median(cold), 4),
        "min_s": round(min(cold), 4),
        "warm_median_s": round(statistics.median(warm), 4),
        "runs_s": [round(x, 4) for x in cold],
        "dags": last["dags"],
        "groups": last["groups"],
        "tasks": last["tasks"],
        "import_errors": errors,
    }


def run(trains: int = 20, domains: int = 64, hosts_per_domain: int = 4, repeat: int = 5) -> dict[str, Any]:
    """Measure both sides, alternating, and return the figures."""
    load_before = os.getloadavg()[0]
    home = Path(tempfile.mkdtemp(prefix="railyard-bench-parse-"))
    try:
        cfg = write_scale_config(home / "railyard-scale.yaml", trains, domains, hosts_per_domain)
        ry_dags = home / "dags-railyard"
        ry_dags.mkdir()
        shutil.copy2(DAG_FILE, ry_dags / DAG_FILE.name)
        base_dags = home / "dags-baseline"
        write_baseline_dag(base_dags, trains, domains)

        base_runs: list[dict[str, Any]] = []
        ry_runs: list[dict[str, Any]] = []
        for _ in range(repeat):
            base_runs.append(measure_once(base_dags, home))
            ry_runs.append(measure_once(ry_dags, home, cfg))
    finally:
        shutil.rmtree(home, ignore_errors=True)

    base, ry = _summary(base_runs), _summary(ry_runs)
    return {
        "bench": "dag_parse",
        "trains": trains,
        "domains": domains,
        "hosts_per_domain": hosts_per_domain,
        "expected_tasks": trains * domains * len(STEPS),
        "repeat": repeat,
        "railyard": ry,
        "baseline": base,
        "ratio_median": round(ry["median_s"] / base["median_s"], 3) if base["median_s"] else None,
        "overhead_median_s": round(ry["median_s"] - base["median_s"], 4),
        "cpus": os.cpu_count(),
        "loadavg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],  # before, after: noise
    }


def format_table(fig: dict[str, Any]) -> str:
    head = (
        f"DAG parse: {fig['trains']} trains x {fig['domains']} domains x {len(STEPS)} steps "
        f"({fig['expected_tasks']} tasks), {fig['repeat']} fresh processes each; DagBag fill only\n"
    )
    row = "{:<10} {:>10} {:>10} {:>12} {:>6} {:>7} {:>7} {:>14}"
    lines = [head, row.format("", "median s", "min s", "warm med s", "dags", "groups", "tasks", "import errors")]
    for name in ("baseline", "railyard"):
        r = fig[name]
        lines.append(
            row.format(
                name, f"{r['median_s']:.3f}", f"{r['min_s']:.3f}", f"{r['warm_median_s']:.3f}",
                r["dags"], r["groups"], r["tasks"], len(r["import_errors"]),
            )
        )
    lines.append(f"railyard / baseline (median): {fig['ratio_median']}x, +{fig['overhead_median_s']:.3f} s")
    lines.append(f"{fig['cpus']} CPUs, 1-min load average before/after: {fig['loadavg_1m']}")
    for name in ("baseline", "railyard"):
        for path, err in fig[name]["import_errors"].items():
            lines.append(f"IMPORT ERROR ({name}) {path}:\n{err}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run with the defaults (or `argv` flags), print the table and the JSON line, return the figures.

    `argv=None` means no flags (not sys.argv), so `bench/run.py` can call `main()` whatever its own
    command line is.
    """
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trains", type=int, default=20)
    p.add_argument("--domains", type=int, default=64)
    p.add_argument("--hosts", type=int, default=4, help="hosts per domain")
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args([] if argv is None else argv)
    fig = run(args.trains, args.domains, args.hosts, args.repeat)
    print(format_table(fig))
    print(json.dumps(fig, sort_keys=True))
    return fig


if __name__ == "__main__":
    figures = main(sys.argv[1:])
    bad = figures["railyard"]["import_errors"] or figures["baseline"]["import_errors"]
    sys.exit(1 if bad else 0)
