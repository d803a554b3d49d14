"""Builds one Airflow DAG per train in the config: one TaskGroup per domain stop, in visit order.

    wait_capacity >> wait_checkpoints >> drain >> upgrade >> health_check >> return_to_service

`return_to_service` is the stop's teardown: it runs whatever failed before it, so no host is
left drained, and it is the only step that releases the domain lease. The next stop starts after
the previous one's check and return; it also starts when the previous stop was skipped.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta

from airflow.sdk import DAG, TaskGroup, TriggerRule, get_parsing_context

from railyard.config import RailyardConfig, config_path, load_config
from railyard_airflow.operators.stop import (
    DrainDomainOperator,
    HealthCheckOperator,
    ReturnDomainOperator,
    UpgradeDomainOperator,
)
from railyard_airflow.sensors.stop import BufferCapacitySensor, CheckpointSensor

START = datetime(2026, 1, 1)


def dag_id_for(train_id: str) -> str:
    return f"railyard_train_{_safe(train_id)}"


def _safe(name: str) -> str:
    return re.sub(r"[^\w-]", "_", name)


def build_train_dag(config: RailyardConfig, train_id: str, path: str | None = None) -> DAG:
    train = config.train(train_id)
    t = config.timeouts
    common = dict(train_id=train.id, fleet_conn_id=config.fleet.connection, config_path=path)
    disruptive = dict(pool=config.pool, retries=2, retry_delay=timedelta(seconds=5))
    with DAG(
        dag_id=dag_id_for(train.id),
        description=train.description or f"Maintenance train {train.id}",
        schedule=train.schedule,
        start_date=START,
        catchup=False,
        max_active_runs=1,
        tags=["railyard", "train"],
        default_args={"retries": 0},
        doc_md=f"Releases: {', '.join(train.releases)}. Domains: "
        + ", ".join(d.name for d in config.train_domains(train)),
    ) as dag:
        prev: tuple | None = None
        seen: dict[str, str] = {}
        for domain in config.train_domains(train):
            gid = _safe(domain.name)
            if gid in seen:
                raise ValueError(f"domains: {domain.name!r} and {seen[gid]!r} map to the same task group {gid!r}")
            seen[gid] = domain.name
            with TaskGroup(group_id=gid, tooltip=f"{len(domain.hosts)} hosts"):
                take = BufferCapacitySensor(
                    task_id="wait_capacity", domain=domain.name, wait_s=t.capacity_wait_s, poll_s=1.0,
                    trigger_rule=TriggerRule.NONE_FAILED, **common,
                )
                ckpt = CheckpointSensor(
                    task_id="wait_checkpoints", domain=domain.name, wait_s=t.checkpoint_wait_s, poll_s=1.0, **common
                )
                drain = DrainDomainOperator(task_id="drain", domain=domain.name, **common, **disruptive)
                upgrade = UpgradeDomainOperator(task_id="upgrade", domain=domain.name, **common, **disruptive)
                check = HealthCheckOperator(task_id="health_check", domain=domain.name, **common, **disruptive)
                ret = ReturnDomainOperator(task_id="return_to_service", domain=domain.name, **common, **disruptive)
                take >> ckpt >> drain >> upgrade >> check >> ret.as_teardown(setups=take, on_failure_fail_dagrun=True)
            if prev is not None:
                [*prev] >> take
            prev = (check, ret)
    return dag


def build_train_dags(path: str | None = None) -> dict[str, DAG]:
    """All train DAGs, sorted by id; only the running one when a task's process parses the file."""
    p = str(config_path(path))
    config = load_config(p)
    wanted = get_parsing_context().dag_id
    dags: dict[str, DAG] = {}
    for train in sorted(config.trains, key=lambda t: t.id):
        dag_id = dag_id_for(train.id)
        if wanted and wanted != dag_id:
            continue
        dags[dag_id] = build_train_dag(config, train.id, p)
    return dags
