"""Orchestration overhead of the demo train on a real `airflow standalone` against the simulator,
beside Airflow's own cost for a DAG of the same shape in the same standalone.

The floor is the work itself: for each domain stop, the fleet-clock time of drain + upgrade +
check + return as the simulator measured it, divided by its speed. Both figures come from the
same run; the overhead per stop is (wall - work) / stops.

The baseline is Airflow's own share: a DAG of the train's shape (a first task, one group of 6 tasks
per stop with the same teardown and trigger rules, the revisit groups whose first task skips the rest)
whose tasks are no-op PythonOperators, so each one starts a real task process as a Railyard step
does. Its wall time per stop is what Airflow alone costs a stop here, with no work and no Railyard.

A one-task warm-up run goes first, unmeasured: a long-running Airflow's task workers are warm, and the
first task after `airflow standalone` starts costs ~4 s of imports in its worker. Then the train, then
the baseline, one after the other.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from railyard.devstack.demo import run_train
from railyard.devstack.stack import ROOT, Stack, free_port

BASELINE_DAG = textwrap.dedent(
    '''\
    """bench_train's baseline: the demo train's shape, every task a no-op PythonOperator."""

    from datetime import datetime

    from airflow.providers.standard.operators.python import PythonOperator
    from airflow.sdk import DAG, TaskGroup
    from airflow.sdk.exceptions import AirflowSkipException

    STOPS = {stops}
    REVISITS = {revisits}


    def nothing():
        return None


    def skip():
        raise AirflowSkipException("no stop for this slot")


    def task(task_id, fn=nothing, **kw):
        return PythonOperator(task_id=task_id, python_callable=fn, **kw)


    with DAG(dag_id="bench_train_baseline", schedule=None, start_date=datetime(2026, 1, 1), catchup=False,
             max_active_runs=1, tags=["bench"]) as baseline:
        prev = (task("cycle_report"),)
        for i in range(STOPS + REVISITS):
            with TaskGroup(group_id=f"stop_{{i}}" if i < STOPS else f"revisit_{{i - STOPS + 1}}"):
                take = task("wait_capacity", nothing if i < STOPS else skip, trigger_rule="none_failed")
                ckpt = task("wait_checkpoints")
                drain = task("drain")
                upgrade = task("upgrade")
                check = task("health_check")
                ret = task("return_to_service")
                take >> ckpt >> drain >> upgrade >> check >> ret.as_teardown(setups=take)
            [*prev] >> take
            prev = (check, ret)

    with DAG(dag_id="bench_train_warmup", schedule=None, start_date=datetime(2026, 1, 1), catchup=False,
             tags=["bench"]) as warmup:
        task("nothing")
    '''
)


def _wall(stack: Stack, dag_id: str, timeout: float = 900) -> tuple[float, str]:
    stack.wait_dag(dag_id)
    t0 = time.monotonic()
    run_id = stack.trigger(dag_id)
    state = stack.wait_run(dag_id, run_id, timeout)
    return time.monotonic() - t0, state


def main(argv: list[str] | None = None) -> dict:
    config = argv[0] if argv else None
    with tempfile.TemporaryDirectory(prefix="railyard-bench-") as tmp:
        kw = {"config_file": Path(config).resolve()} if config else {}
        dags = Path(tmp) / "dags"  # Railyard's DAG files and the baseline's, side by side
        shutil.copytree(ROOT / "dags", dags, ignore=shutil.ignore_patterns("__pycache__"))
        stack = Stack(home=Path(tmp) / "home", airflow_port=free_port(), sim_port=free_port(),
                      extra_env={"AIRFLOW__CORE__DAGS_FOLDER": str(dags)}, **kw)
        train_id = sorted(t.id for t in stack.config.trains)[0]
        train = stack.config.train(train_id)
        (dags / "bench_train_baseline.py").write_text(BASELINE_DAG.format(
            stops=len(stack.config.train_domains(train)), revisits=train.max_dodges))
        fleet = stack.start_sim()
        try:
            stack.start_airflow()
            stack.ensure_pool()
            _wall(stack, "bench_train_warmup")
            r = run_train(stack, fleet, train_id, quiet=True)
            base_wall, base_state = _wall(stack, "bench_train_baseline")
        finally:
            stack.stop()
    stops = max(1, r["domains"])
    out = {
        "bench": "train_overhead",
        "train": r["train"],
        "state": r["state"],
        "domains": r["domains"],
        "hosts": r["hosts"],
        "wall_seconds": r["wall_seconds"],
        "work_seconds": r["work_seconds"],
        "overhead_per_stop_s": round((r["wall_seconds"] - r["work_seconds"]) / stops, 2),
        "wall_over_work": round(r["wall_seconds"] / max(r["work_seconds"], 1e-9), 3),
        "max_domains_down": r["max_domains_down"],
        "baseline_state": base_state,
        "baseline_wall_seconds": round(base_wall, 1),
        "baseline_per_stop_s": round(base_wall / stops, 2),
    }
    print(f"{'':46}{'seconds':>10}")
    print(f"{'work floor (simulator)':46}{out['work_seconds']:>10.1f}")
    print(f"{'train wall time':46}{out['wall_seconds']:>10.1f}")
    print(f"{'overhead per stop':46}{out['overhead_per_stop_s']:>10.2f}   ({out['domains']} stops; goal <= 2 s)")
    print(f"{'baseline: same shape, no-op tasks, wall':46}{out['baseline_wall_seconds']:>10.1f}   ({base_state})")
    print(f"{'baseline per stop (Airflow alone, no work)':46}{out['baseline_per_stop_s']:>10.2f}")
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
