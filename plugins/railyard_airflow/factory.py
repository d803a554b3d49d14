"""Builds one Airflow DAG per train in the config: one TaskGroup per domain stop, in visit order.

    cycle_report >> [stop per domain] >> [revisit_1 .. revisit_K]

and inside every stop:

    wait_capacity >> wait_checkpoints >> drain >> upgrade >> health_check >> return_to_service

`return_to_service` is the stop's teardown: it runs whatever failed before it, so no host is
left drained, and it is the only step that releases the domain lease. The next stop starts after
the previous one's check and return, or when the previous one was skipped or dodged. The revisit
groups take, at run time, the domains that a job's dodge postponed (`max_dodges` of them).
"""

from __future__ import annotations

import math
import re
from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import DAG, Param, TaskGroup, TriggerRule, get_parsing_context

from railyard.domain.config import RailyardConfig, config_path, load_config
from railyard.fleet import gcpause
from railyard.operations.reconcile import dag_id_for
from railyard_airflow.notifiers.escalation import EscalationNotifier
from railyard_airflow.operators.emergency import EmergencyPlanOperator
from railyard_airflow.operators.outside import (
    RailyardAwaitReturnOperator,
    RailyardLeaseOperator,
    RailyardReturnOperator,
)
from railyard_airflow.operators.reconcile import ReconcileOperator
from railyard_airflow.operators.release import ReleaseActionOperator
from railyard_airflow.operators.repair import RepairGateOperator
from railyard_airflow.operators.report import CycleReportOperator, EndRunOperator
from railyard_airflow.operators.stop import (
    DrainDomainOperator,
    HealthCheckOperator,
    ReturnDomainOperator,
    UpgradeDomainOperator,
)
from railyard_airflow.sensors.stop import BufferCapacitySensor, CheckpointSensor

START = datetime(2026, 1, 1)
MARGIN = timedelta(minutes=5)  # execution_timeout = the step's own deadline + this


def _safe(name: str) -> str:
    return re.sub(r"[^\w-]", "_", name)


def _stop_group(group_id: str, tooltip: str, config: RailyardConfig, common: dict[str, Any],
                where: dict[str, Any], priority_weight: int = 1) -> tuple[Any, Any, Any]:
    """The six tasks of one stop; `where` is {"domain": name} or {"slot": "revisit_N" | "stop_N"}."""
    t = config.timeouts

    # Retries outlive a fleet outage of `fleet_outage_s`: every step is idempotent, so a retry after
    # the fleet is back re-attaches, and the teardown return still brings every host back.
    delay = min(30.0, max(5.0, t.fleet_outage_s / 10))
    retries = 2 + math.ceil(t.fleet_outage_s / delay)

    def step(cls: type[Any], task_id: str, limit: float) -> Any:
        return cls(task_id=task_id, pool=config.pool, retries=retries, retry_delay=timedelta(seconds=delay),
                   execution_timeout=timedelta(seconds=limit) + MARGIN, priority_weight=priority_weight,
                   **common, **where)

    with TaskGroup(group_id=group_id, tooltip=tooltip):
        # the waits retry too: a transient error (fleet or ledger briefly busy) must not stop a train
        waits: dict[str, Any] = dict(priority_weight=priority_weight, retries=2, retry_delay=timedelta(seconds=5))
        poll = config.fleet.poll_interval_s  # one read of the fleet per poke or trigger poll, this often
        take = BufferCapacitySensor(task_id="wait_capacity", wait_s=t.capacity_wait_s, poll_s=poll,
                                    trigger_rule=TriggerRule.NONE_FAILED, **waits, **common, **where)
        ckpt = CheckpointSensor(task_id="wait_checkpoints", wait_s=t.checkpoint_wait_s, poll_s=poll,
                                **waits, **common, **where)
        drain = step(DrainDomainOperator, "drain", t.drain_s)
        upgrade = step(UpgradeDomainOperator, "upgrade", t.upgrade_s)
        check = step(HealthCheckOperator, "health_check", t.check_s)
        ret = step(ReturnDomainOperator, "return_to_service", t.upgrade_s + t.check_s + t.return_s)
        take >> ckpt >> drain >> upgrade >> check >> ret.as_teardown(setups=take, on_failure_fail_dagrun=True)
    return take, check, ret


def build_train_dag(config: RailyardConfig, train_id: str, path: str | None = None) -> DAG:
    train = config.train(train_id)
    common: dict[str, Any] = dict(train_id=train.id, fleet_conn_id=config.fleet.connection, config_path=path)
    notifier = EscalationNotifier(train_id=train.id, config_path=path)
    with DAG(
        dag_id=dag_id_for(train.id),
        description=train.description or f"Maintenance train {train.id}",
        schedule=train.schedule,
        start_date=START,
        catchup=False,
        max_active_runs=1,
        tags=["railyard", "train"],
        default_args={"retries": 0, "on_failure_callback": notifier},
        doc_md=f"Releases: {', '.join(train.releases)}. Domains: "
        + ", ".join(d.name for d in config.train_domains(train)),
    ) as dag:
        prev: tuple[Any, ...] = (CycleReportOperator(task_id="cycle_report", **common),)
        seen: dict[str, str] = {}
        for domain in config.train_domains(train):
            gid = _safe(domain.name)
            if gid in seen:
                raise ValueError(f"domains: {domain.name!r} and {seen[gid]!r} map to the same task group {gid!r}")
            seen[gid] = domain.name
            take, check, ret = _stop_group(gid, f"{len(domain.hosts)} hosts", config, common, {"domain": domain.name})
            [*prev] >> take
            prev = (check, ret)
        for i in range(1, train.max_dodges + 1):
            slot = f"revisit_{i}"
            take, check, ret = _stop_group(slot, "a domain postponed by a dodge", config, common, {"slot": slot})
            [*prev] >> take
            prev = (check, ret)
        # the run's report, reservations made ahead and a gate (Slurm), the train_finished event: a teardown, it
        # runs whatever failed, and the run's state stays that of its stops
        end = EndRunOperator(task_id="end_run", retries=2, retry_delay=timedelta(seconds=10), **common)
        [*prev] >> end.as_teardown()
    _set_params(dag, {"dry_run": Param(False, type="boolean",
                                       description="show the plan in the first task; touch nothing")})
    return dag


def _set_params(dag: DAG, params: dict[str, Param]) -> None:
    """The DAG's params (its trigger form), set once its tasks are built. Airflow merges a DAG's params into
    each task's at run time; given to DAG(...) they are also deep-copied into every task at every level of its
    `__init__` (thousands of copies for a train of 64 domains: a third of the parse time)."""
    for name, param in params.items():
        param.source = "dag"
        dag.params[name] = param


HOST_PICK_MAX = 4096  # beyond, the form takes typed host names only (a list of 75,000 is no picker)


def _host_pick(config: RailyardConfig) -> dict[str, Any]:
    """The emergency form's host picker: `examples` render as a multi-select of every host in Airflow's
    form; free text stays possible, and `plan` refuses an unknown host with its name, before any host is touched."""
    names = sorted(config.host_domain())
    return {"examples": names} if len(names) <= HOST_PICK_MAX else {}


def _release_pick(config: RailyardConfig) -> dict[str, Any]:
    """The releases picker. Airflow's form draws an array as a multi-select only when the array itself has
    `examples` (or `enum`): `items.enum` alone draws a free-text box. `items.enum` still refuses, at trigger,
    a value the picker does not offer (the REST API's conf), naming the param and the value."""
    ids = [r.id for r in config.releases]
    return {"items": {"type": "string", "enum": ids}, "examples": ids,
            "values_display": {r.id: f"{r.id}: {r.component} {r.version}" for r in config.releases}}


def _domain_pick(config: RailyardConfig) -> dict[str, Any]:
    """The domains picker, as the releases one: every domain of the config, shown with its size and SKU."""
    names = [d.name for d in config.domains]
    return {"items": {"type": "string", "enum": names}, "examples": names,
            "values_display": {d.name: f"{d.name} ({len(d.hosts)} hosts, {d.sku})" for d in config.domains}}


def build_emergency_dag(path: str | None = None, config: RailyardConfig | None = None) -> DAG:
    """Triggered by hand from the UI with a form. `plan` validates the form and records who asked;
    then one slot per possible stop takes the plan's stops. Slots run side by side: the ledger lets
    `domains_at_once` of them (1 unless large_scale) hold a domain, ahead of every waiting train."""
    p = str(config_path(path))
    config = config or load_config(p)
    common: dict[str, Any] = dict(train_id="emergency", fleet_conn_id=config.fleet.connection, config_path=p)
    domains = [d.name for d in config.domains]
    params = {
        "releases": Param([], type="array", **_release_pick(config), description="the release(s) to apply now"),
        # a picker emptied after a pick sends null: `plan` reads null domains or hosts as none
        "domains": Param([], type=["array", "null"], **_domain_pick(config), description="whole domains in scope"),
        "hosts": Param([], type=["array", "null"], items={"type": "string"}, **_host_pick(config),
                       description="single hosts in scope (picked from the fleet's hosts); domains or hosts, "
                                   "or both"),
        "reason": Param(None, type=["null", "string"], description="why (required; at least 10 characters)"),
        "skip_checkpoint": Param(False, type="boolean",
                                 description="drain without waiting for job checkpoints (the cost is recorded)"),
        "skip_checkpoint_reason": Param(None, type=["null", "string"], description="required with skip_checkpoint"),
        "large_scale": Param(False, type="boolean", description="allow more than one domain at once"),
        "domains_at_once": Param(1, type="integer", minimum=1, maximum=len(domains)),
        "large_scale_reason": Param(None, type=["null", "string"], description="required with large_scale"),
        "dry_run": Param(False, type="boolean", description="show the plan only; touch nothing"),
    }
    with DAG(
        dag_id="railyard_emergency",
        description="Emergency train: apply a release now, ahead of the scheduled trains",
        schedule=None,
        start_date=START,
        catchup=False,
        max_active_runs=4,
        tags=["railyard", "emergency"],
        default_args={"retries": 0, "on_failure_callback": EscalationNotifier(train_id="emergency", config_path=p)},
        doc_md="Fill in the form: releases, scope (domains and/or hosts), a reason. Nothing is touched "
        "before `plan` has validated it; `dry_run` stops there.",
    ) as dag:
        first = EmergencyPlanOperator(task_id="plan", fleet_conn_id=config.fleet.connection, config_path=p,
                                      priority_weight=100)
        rets = []
        for i in range(1, len(domains) + 1):
            take, _check, ret = _stop_group(f"stop_{i}", "a stop of the plan", config, common,
                                            {"slot": f"stop_{i}"}, priority_weight=100)
            first >> take
            rets.append(ret)
        # the run's report, whatever failed: a teardown, so the run's state stays that of its stops
        end = EndRunOperator(task_id="end_run", retries=2, retry_delay=timedelta(seconds=10), priority_weight=100,
                             **common)
        [first, *rets] >> end.as_teardown()
    _set_params(dag, params)
    return dag


def _single_task_dag(config: RailyardConfig, path: str, *, dag_id: str, description: str, schedule: str | None,
                     tag: str, operator: type, task_id: str, timeout: timedelta, doc_md: str,
                     params: dict[str, Param] | None = None) -> DAG:
    """A DAG of one Railyard task (release action, repair gate, reconciler), one run at a time."""
    with DAG(dag_id=dag_id, description=description, schedule=schedule, start_date=START, catchup=False,
             max_active_runs=1, tags=["railyard", tag], params=params or {}, doc_md=doc_md) as dag:
        operator(task_id=task_id, fleet_conn_id=config.fleet.connection, config_path=path, execution_timeout=timeout)
    return dag


def build_release_dag(path: str | None = None, config: RailyardConfig | None = None) -> DAG:
    """Triggered by hand: promote, halt or resume a release, with a reason; audited with the user."""
    p = str(config_path(path))
    config = config or load_config(p)
    params = {
        "release": Param(config.releases[0].id, type="string", enum=[r.id for r in config.releases],
                         description="the release"),
        "action": Param("halt", type="string", enum=["promote", "halt", "resume"],
                        description="promote to the next phase, halt (trains stop applying it) or resume"),
        "reason": Param(None, type=["null", "string"], description="why (required; at least 10 characters)"),
    }
    return _single_task_dag(
        config, p, dag_id="railyard_releases", description="Promote, halt or resume a release's rollout",
        schedule=None, tag="release", operator=ReleaseActionOperator, task_id="apply",
        timeout=timedelta(minutes=2), params=params,
        doc_md="Phases: canary -> staged -> fleet. `railyard release list` shows where each release is.")


def build_repair_dag(path: str | None = None, config: RailyardConfig | None = None) -> DAG:
    """On `schedules.repairs` (every 15 minutes): hosts whose repair is done are upgraded, checked and
    returned, or kept."""
    p = str(config_path(path))
    config = config or load_config(p)
    t = config.timeouts
    return _single_task_dag(
        config, p, dag_id="railyard_repairs", description="Return repaired hosts through the health gate",
        schedule=config.schedules.repairs, tag="repair", operator=RepairGateOperator, task_id="gate_repaired_hosts",
        timeout=timedelta(seconds=t.upgrade_s + t.check_s) + MARGIN,
        doc_md="Hosts whose repair is done are upgraded to the targets frozen when they were offboarded, "
        "checked, and returned; a host that fails stays in repair, and its next attempt is a fresh operation.")


def build_reconcile_dag(path: str | None = None, config: RailyardConfig | None = None) -> DAG:
    """On `schedules.reconcile` (every 10 minutes): operations whose run is finished or deleted are
    finished safely (their hosts checked and returned, or sent to repair) and their leases released."""
    p = str(config_path(path))
    config = config or load_config(p)
    t = config.timeouts
    return _single_task_dag(
        config, p, dag_id="railyard_reconcile",
        description="Finish the stops of runs that are gone; release their leases safely",
        schedule=config.schedules.reconcile, tag="recovery", operator=ReconcileOperator, task_id="reconcile",
        timeout=timedelta(seconds=t.drain_s + t.upgrade_s + t.check_s + t.return_s) + MARGIN,
        doc_md="Leases never expire. A run marked failed or deleted mid-stop leaves its hosts out and its "
        "lease held: this DAG finds such operations (asking Airflow about each one's run) and finishes "
        "their stop through its teardown. `railyard ops` lists what is held; `railyard reconcile` does "
        "the same from a shell.")


OUTSIDE_DAG = "railyard_outside"


def build_outside_dag(path: str | None = None, config: RailyardConfig | None = None) -> DAG:
    """Drives one request for outside work made over the page's API (`POST /railyard/api/ops`, which triggers it
    with the request's id): waits for the grant and the drain, then for the requester to ask for its hosts back,
    and returns them through the deep health check. Requests run side by side, each in its own run."""
    p = str(config_path(path))
    config = config or load_config(p)
    common: dict[str, Any] = dict(fleet_conn_id=config.fleet.connection, config_path=p)
    params = {"op": Param("", type="string", minLength=1,
                          description="the outside operation's id, as `POST /railyard/api/ops` answered it")}
    with DAG(dag_id=OUTSIDE_DAG, description="Outside work requested over the Railyard page's API", schedule=None,
             start_date=START, catchup=False, max_active_runs=64, tags=["railyard", "outside"], params=params,
             doc_md="One run per request: `lease` waits (deferred) until the hosts are granted and drained, "
             "`requester_works` until the requester returns them (`POST /railyard/api/ops/OP/return` or "
             "`railyard op return OP`), and `return` checks them; a host that fails goes to repair. A run "
             "whose requester never returns its hosts keeps them held: the reconciler escalates it at its "
             "deadline.") as dag:
        lease = RailyardLeaseOperator(task_id="lease", op="{{ params.op }}", **common)
        work = RailyardAwaitReturnOperator(task_id="requester_works", lease_task_id="lease", **common)
        back = RailyardReturnOperator(task_id="return", lease_task_id="lease", asked_only=True, **common)
        lease >> work >> back.as_teardown(setups=lease)
    return dag


def build_train_dags(path: str | None = None, config: RailyardConfig | None = None) -> dict[str, DAG]:
    """All train DAGs, sorted by id; only the running one when a task's process parses the file.
    The garbage collector is paused while they are built: its passes only re-walk the tasks being built
    and kept (a third of the build for 20 trains of 64 domains)."""
    p = str(config_path(path))
    config = config or load_config(p)
    wanted = get_parsing_context().dag_id
    dags: dict[str, DAG] = {}
    with gcpause.paused():
        for train in sorted(config.trains, key=lambda t: t.id):
            dag_id = dag_id_for(train.id)
            if wanted and wanted != dag_id:
                continue
            dags[dag_id] = build_train_dag(config, train.id, p)
    return dags


SINGLE_DAGS = {"railyard_emergency": build_emergency_dag, "railyard_releases": build_release_dag,
               "railyard_repairs": build_repair_dag, "railyard_reconcile": build_reconcile_dag,
               OUTSIDE_DAG: build_outside_dag}


def build_all_dags(path: str | None = None) -> dict[str, DAG]:
    """Every Railyard DAG of one config, read once: a train DAG per train, then the emergency train, the
    releases, repairs, reconcile and outside-work DAGs; only the running one when a task's process parses the file."""
    p = str(config_path(path))
    config = load_config(p)
    wanted = get_parsing_context().dag_id
    dags = build_train_dags(p, config)
    for dag_id, build in SINGLE_DAGS.items():
        if not wanted or wanted == dag_id:
            dags[dag_id] = build(p, config)
    return dags
