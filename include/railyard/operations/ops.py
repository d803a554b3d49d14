"""An operator's view and controls: what is held (`railyard ops`), one host's record (`railyard host`),
and releasing a lease by hand (`railyard lease release`). Every control is audited with the user.

A lease is released by hand only once the operation's Airflow run has ended or is gone (while it runs,
its own tasks finish the stop), and only when every host it holds is serving or in repair: hosts out of
service come back through the gate first (`railyard reconcile` once their run is gone), or go to
repair with `to_repair` (each handed to a repair operation, which brings it back through the gate).
A host in repair is never released with no repair operation holding it.
"""

from __future__ import annotations

import json
import time
from typing import Any

from railyard.domain.config import RailyardConfig
from railyard.domain.models import BROKEN_STATES, HostState
from railyard.fleet.port import Fleet
from railyard.ledger import Ledger
from railyard.operations.reconcile import (
    FINISHED,
    ReconcileError,
    RunOracle,
    owner_of,
    run_state_name,
    stop_for,
)

MIN_REASON = 10
MAX_REASON = 1000


class ControlError(RuntimeError):
    """A control refused, before anything was touched; the message says why and what to do."""


def release_lease(config: RailyardConfig, fleet: Fleet, ledger: Ledger, op_id: str, *, reason: str, actor: str,
                  runs: RunOracle, to_repair: bool = False) -> dict[str, Any]:
    """Release every lease of `op_id` by hand (see the module's rules). `runs` answers whether the
    operation's run still lives (the REST API from the CLI, the metadata DB from the page). Returns what was done."""
    reason = (reason or "").strip()
    if len(reason) < MIN_REASON:
        raise ControlError(f"reason: say why in at least {MIN_REASON} characters (value: {reason!r})")
    op = ledger.operation(op_id)
    if op is None:
        raise ControlError(f"operation {op_id!r}: no such operation in the ledger (`railyard ops` lists them)")
    held = sorted(ledger.holdings(op_id))
    if not held:
        raise ControlError(f"operation {op_id!r} holds no host (state {op['state']}): nothing to release")
    _refuse_if_run_alive(ledger, op, held, reason, actor, runs)
    hosts = fleet.hosts(held)
    out = [h for h in hosts if h.state not in (HostState.SERVING, *BROKEN_STATES)]
    stuck_in_repair = [h for h in hosts if h.state == HostState.REPAIR and op["kind"] != "repair"]
    if out and not to_repair:
        ledger.note(op_id, "lease_release_refused", [h.name for h in out], f"{len(out)} host(s) out: {reason}",
                    actor=actor)
        listed = ", ".join(f"{h.name} ({h.state})" for h in out[:8]) + (" ..." if len(out) > 8 else "")
        raise ControlError(
            f"{op_id}: {len(out)} host(s) out of service: {listed}. A lease is released only when its hosts are "
            "serving or in repair: return them through the gate first (`railyard reconcile` once its run is "
            "gone), or send them to repair with --to-repair")
    in_repair = [h for h in hosts if h.state == HostState.REPAIR]
    if op["kind"] == "repair" and (out or in_repair):
        raise ControlError(f"{op_id}: a repair's hosts come back through the repair gate, not by hand "
                           f"({', '.join(h.name for h in out + in_repair)} "
                           f"{'in repair or ' if in_repair else ''}waiting for it)")
    sent: list[str] = []
    if out or stuck_in_repair:  # each to a repair operation of its own, with the targets it was out for
        full = op | {"detail": json.loads(op["detail"] or "{}")}
        stop = stop_for(config, fleet, ledger, full, actor=actor, say=lambda _m: None)
        for h in out + stuck_in_repair:
            stop.offboard(h.name, f"sent to repair by {actor}: {reason}")
            sent.append(h.name)
    left = sorted(ledger.holdings(op_id))
    # the fleet's own record of the hold ends with it (Slurm's gate), and before it: a crash between leaves the
    # lease, and the same release run again finishes (forget is idempotent); the other order would leave a hold
    # with no lease behind it, which the gate would keep draining for ever
    forget = getattr(fleet, "forget", None)
    if forget is not None and left:
        forget(left, op_id)
    ledger.release(op_id, actor=actor, reason=f"released by hand: {reason}")
    return {"op": op_id, "released": left, "to_repair": sent}


def mark_repaired(config: RailyardConfig, fleet: Fleet, ledger: Ledger, host: str, *, reason: str,
                  actor: str) -> dict[str, Any]:
    """`railyard host repaired`: a failed, unknown or in-repair host is handed to the repair gate (its repair
    operation, or a new one at the targets of the first train that visits its domain). Audited. The host
    comes back only through the gate's upgrade and deep check."""
    reason = (reason or "").strip()
    if not MIN_REASON <= len(reason) <= MAX_REASON:
        raise ControlError(f"reason: say why in {MIN_REASON} to {MAX_REASON} characters "
                           f"(value: {reason[:80]!r}{'...' if len(reason) > 80 else ''})")
    domain = config.host_domain().get(host)
    if domain is None:
        raise ControlError(f"host: unknown host {host[:80]!r} (not in the config's domains)")
    mark = getattr(fleet, "mark_repaired", None)
    if mark is None:
        raise ControlError(f"host repaired: the {config.fleet.backend} fleet reports repairs itself (the "
                           "simulator: POST /hosts/HOST/repaired); the repair gate then picks the host up")
    (h,) = fleet.hosts([host])
    if h.state not in BROKEN_STATES:
        raise ControlError(f"{host} is {h.state.value}: only a failed, unknown or in-repair host is marked repaired")
    lease = ledger.host_history(host, limit=1)["lease"]
    if lease is not None and lease["kind"] != "repair":
        raise ControlError(f"{host} is held by {lease['op_id']} ({lease['kind']}): its stop finishes it first "
                           "(`railyard lease release --to-repair` once its run has ended)")
    if lease is not None:
        op = str(lease["op_id"])
    else:
        trains = [t for t in sorted(config.trains, key=lambda t: t.id)
                  if domain in {d.name for d in config.train_domains(t)}]
        if not trains:
            raise ControlError(f"{host}: no train visits {domain}, so no targets to bring it to")
        op = f"repair/{host}/by-hand/{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
        ledger.lease_repair(op, host, domain=domain, reason=f"marked repaired by {actor}: {reason}", actor=actor,
                            detail={"targets": config.train_targets(trains[0])})
    mark(host, op, reason)
    ledger.note(op, "repaired", [host], f"marked repaired by {actor}: {reason}", actor=actor)
    return {"host": host, "op": op}


def _refuse_if_run_alive(ledger: Ledger, op: dict[str, Any], held: list[str], reason: str, actor: str,
                         runs: RunOracle) -> None:
    """Refuse while the operation's run is alive, or when Airflow cannot say (closed: never released on a guess)."""
    own = owner_of(op)
    if own is None:
        return
    dag_id, run_id = own
    try:
        known = runs.dag_known(dag_id)
        state = runs.run_state(dag_id, run_id) if known else None
    except ReconcileError as exc:
        raise ControlError(f"{op['id']}: cannot ask Airflow whether its run {dag_id}/{run_id} has ended ({exc}); "
                           "a lease is released by hand only once its run has ended") from None
    if not known:
        raise ControlError(f"{op['id']}: the Airflow asked does not know the DAG {dag_id}, so it cannot say whether "
                           "its run has ended (is RAILYARD_AIRFLOW_API the Airflow that runs Railyard?)")
    if state is not None and run_state_name(state) not in FINISHED:
        ledger.note(op["id"], "lease_release_refused", held, f"its run is {run_state_name(state)}: {reason}",
                    actor=actor)
        raise ControlError(f"{op['id']}: its run {dag_id}/{run_id} is still {run_state_name(state)}: its own tasks "
                           "finish the stop. Mark the run failed first (its teardown then returns the hosts), and "
                           "release what is left once it has ended")


def describe_ops(ops: list[dict[str, Any]], now: float | None = None) -> str:
    now = time.time() if now is None else now
    if not ops:
        return "no active operation"
    lines = [f"{'OPERATION':<52} {'KIND':<10} {'HOSTS':>5}  {'AGE':>7}  RUN / LAST ACTION"]
    for o in ops:
        own = owner_of(o)
        run = f"{own[0]}/{own[1]}" if own else "-"
        last = o["last"]
        did = (f"{last['action']} by {last['actor']} {_ago(now - last['at'])} ago: {last['reason'][:80]}"
               if last else "-")
        hosts = ", ".join(o["hosts"][:4]) + (f" +{len(o['hosts']) - 4}" if len(o["hosts"]) > 4 else "")
        lines.append(f"{o['id']:<52} {o['kind']:<10} {len(o['hosts']):>5}  {_ago(now - o['created_at']):>7}  {run}")
        lines.append(f"{'':<52} {'':<10} {'':>5}  {'':>7}  {did}" + (f"\n{'':<80}{hosts}" if hosts else ""))
    return "\n".join(lines)


def describe_host(h: dict[str, Any]) -> str:
    lease = h["lease"]
    lines = [f"{h['host']}: " + (f"held by {lease['op_id']} ({lease['kind']}) since "
                                  f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(lease['since']))}Z"
                                  if lease else "no lease")]
    lines.append("operations:")
    for e in h["events"]:
        lines.append(f"  {_ts(e['at'])}  {e['action']:<14} {e['op_id'] or '-'}  by {e['actor']}: {e['reason']}")
    lines.append("checks (versions seen; evidence):")
    for c in h["checks"]:
        seen = ", ".join(f"{k}={v}" for k, v in sorted(c["versions"].items()))
        lines.append(f"  {_ts(c['at'])}  {'passed' if c['passed'] else 'FAILED':<7} {c['op_id']}  [{seen}]"
                     + (f"  {c['reason']}" if c["reason"] else ""))
    return "\n".join(lines)


def _ts(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t)) + "Z"


def _ago(s: float) -> str:
    s = max(0.0, s)
    if s < 120:
        return f"{s:.0f}s"
    if s < 7200:
        return f"{s / 60:.0f}m"
    if s < 172800:
        return f"{s / 3600:.0f}h"
    return f"{s / 86400:.0f}d"
