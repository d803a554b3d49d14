"""What the Railyard page shows, as JSON: built from the config, the fleet and the ledger only
(no Airflow imports), so the same functions serve the page and the unit tests on an in-process fleet."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any
from urllib.parse import quote

from railyard.domain.config import RailyardConfig
from railyard.domain.models import BROKEN_STATES, Host, HostState
from railyard.domain.planning import budget_for
from railyard.fleet.port import Fleet
from railyard.ledger import Ledger
from railyard.operations.reconcile import dag_id_for, owner_of
from railyard.operations.releases import Rollout, drift

HISTORY_POINTS = 600  # capacity samples sent to the page (the newest)
OFFBOARDED_SHOWN = 200  # offboarded hosts listed by name under the map (all are counted)
HOSTS_PER_READ = 256  # host names per fleet read of one domain's hosts


def run_link(op: dict[str, Any] | None) -> str | None:
    """The Airflow UI path of the run behind an operation (None for repairs and operations of no run)."""
    if not op:
        return None
    owner = owner_of(op)
    if owner is None:
        return None
    dag, run = owner
    return f"/dags/{dag}/runs/{quote(run, safe='')}"


def fleet_map(config: RailyardConfig, hosts: list[Host], ledger: Ledger) -> dict[str, Any]:
    """Per domain: its hosts counted per state, whether it is out and which operation holds it (with a link to
    its Airflow run). The hosts themselves come one domain at a time (`domain_hosts`): at 76,800 hosts a row
    per host made the page's JSON 13 MB and its map 76,800 elements. A host of the config that the fleet does
    not report counts as `unknown`; the offboarded hosts (failed, in repair) are listed with their reasons,
    the first OFFBOARDED_SHOWN of them."""
    held = ledger.holdings()
    ops = {o["id"]: o for o in ledger.active_operations()}
    out_domains = ledger.domains_out()
    owner = config.host_domain()
    # counted in C, not host by host in Python: this is most of the page's own time at 76,800 hosts
    kinds = Counter(zip(map(owner.get, [h.name for h in hosts]), [h.state.value for h in hosts], strict=True))
    per: dict[str, Counter[str]] = {d.name: Counter() for d in config.domains}
    counts: Counter[str] = Counter()
    for (d, state), n in kinds.items():
        counts[state] += n
        if d is not None:
            per[d][state] += n
    offboarded = [{"name": h.name, "domain": owner.get(h.name), "state": h.state.value, "reason": h.reason}
                  for h in hosts if h.state in (HostState.FAILED, HostState.REPAIR)]
    held_in = Counter(map(owner.get, held))
    domains = []
    for dom in config.domains:
        states = per[dom.name]
        missing = len(dom.hosts) - sum(states.values())
        if missing > 0:
            states[HostState.UNKNOWN.value] += missing
        holder = out_domains.get(dom.name)  # a repair holds its host's domain too, but takes no maintenance slot
        domains.append({"name": dom.name, "sku": dom.sku, "size": len(dom.hosts),
                        "states": dict(sorted(states.items())), "serving": states.get(HostState.SERVING.value, 0),
                        "held": held_in.get(dom.name, 0),
                        "out": holder is not None and not holder.startswith("repair/"), "held_by": holder,
                        "run": run_link(ops.get(holder)) if holder else None})
    offboarded.sort(key=lambda x: str(x["name"]))
    return {"domains": domains, "by_state": dict(sorted(counts.items())), "total": len(hosts),
            "offboarded": offboarded[:OFFBOARDED_SHOWN], "offboarded_total": len(offboarded)}


def domain_hosts(config: RailyardConfig, fleet: Fleet, ledger: Ledger, name: str) -> dict[str, Any]:
    """One domain's hosts, each with its state, the operation holding it and a link to that operation's run:
    what the map shows of a domain once it is opened. Only the domain's own hosts are read from the fleet,
    HOSTS_PER_READ names a call (the names travel in the query string)."""
    dom = config.domain(name)
    names = list(dom.hosts)
    by_name: dict[str, Host] = {}
    for i in range(0, len(names), HOSTS_PER_READ):
        by_name |= {h.name: h for h in fleet.hosts(names[i:i + HOSTS_PER_READ])}
    held = ledger.holdings()
    ops = {o["id"]: o for o in ledger.active_operations()}
    holder = ledger.domains_out().get(name)
    rows = []
    for host in names:
        h = by_name.get(host)
        op_id = held.get(host)
        rows.append({"name": host, "state": str(h.state) if h else HostState.UNKNOWN.value, "op": op_id,
                     "run": run_link(ops.get(op_id)) if op_id else None, "reason": h.reason if h else None,
                     "versions": h.versions if h else {}})
    return {"domain": name, "sku": dom.sku, "out": holder is not None and not holder.startswith("repair/"),
            "held_by": holder, "hosts": rows}


def capacity(config: RailyardConfig, fleet: Fleet, hosts: list[Host], ledger: Ledger) -> dict[str, Any]:
    """Serving fraction now, its history (the fleet's own capacity samples when it keeps them, as the
    simulator does; else those the stops recorded in the ledger after each drain and return), the floor the
    buffers define and the `1 - max_domains_down/N` line."""
    total = len(hosts) or 1
    serving = sum(1 for h in hosts if h.state == HostState.SERVING)
    floors = {}
    for sku in sorted({d.sku for d in config.domains}):
        b = budget_for(config, sku)
        floors[sku] = (b.total_hosts - b.maintenance_hosts - b.failure_hosts) / max(b.total_hosts, 1)
    history: list[dict[str, float]] = []
    samples = getattr(fleet, "samples", None)
    if callable(samples):
        try:
            for s in samples()[-HISTORY_POINTS:]:
                history.append({"t": float(s["t"]), "serving": s["serving"] / total})
        except Exception:  # a fleet without a capacity history of its own: the ledger's below
            history = []
    if not history:
        history = [{"t": r["t"], "serving": r["serving"] / max(r["total"], 1)}
                   for r in ledger.capacity_history(HISTORY_POINTS)]
    now = fleet.now()
    history.append({"t": now, "serving": serving / total})
    n = len(config.domains)
    return {"now": now, "serving": serving, "total": len(hosts), "fraction": serving / total,
            "floor": min(floors.values()) if floors else 0.0, "floor_by_sku": floors,
            "domains_line": 1 - config.max_domains_down / n if n else 1.0, "history": history}


def buffers(config: RailyardConfig, hosts: list[Host], ledger: Ledger) -> list[dict[str, Any]]:
    """Per SKU: the maintenance and failure budget (hosts), used and left. Hosts held by an operation
    but not broken use the maintenance buffer; broken hosts use the failure buffer."""
    held = ledger.holdings()
    kinds = Counter((h.sku, h.state, h.name in held) for h in hosts)  # one pass, few kinds
    out = []
    for sku in sorted({d.sku for d in config.domains}):
        b = budget_for(config, sku)
        mine = [(state, is_held, n) for (s, state, is_held), n in kinds.items() if s == sku]
        broken = sum(n for state, _held, n in mine if state in BROKEN_STATES)
        maint = sum(n for state, is_held, n in mine if state not in BROKEN_STATES
                    and (is_held or state != HostState.SERVING))
        out.append({"sku": sku, "total": b.total_hosts,
                    "maintenance": {"budget": b.maintenance_hosts, "used": maint, "left": b.maintenance_hosts - maint},
                    "failure": {"budget": b.failure_hosts, "used": broken, "left": b.failure_hosts - broken}})
    return out


def trains(config: RailyardConfig, ledger: Ledger, now: float,
           schedule: dict[str, dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Per train: the last visit of each domain (fleet clock), overdue ones by cycle_days, the schedule, and
    from Airflow (`schedule`, by DAG id) whether its DAG is paused and when its next scheduled run is due."""
    schedule = schedule or {}
    out = []
    for t in config.trains:
        visits = ledger.last_visits(t.id)
        order = t.domains or [d.name for d in config.domains]
        rows = []
        for d in order:
            last = visits.get(d)
            age_days = (now - last) / 86400 if last is not None else None
            overdue = t.cycle_days is not None and (age_days is None or age_days > t.cycle_days)
            rows.append({"domain": d, "last_visit": last, "age_days": age_days, "overdue": overdue})
        dag_id = dag_id_for(t.id)
        airflow = schedule.get(dag_id, {})
        out.append({"id": t.id, "dag_id": dag_id, "schedule": t.schedule,
                    "next_run": airflow.get("next_run"), "paused": airflow.get("paused"),
                    "cycle_days": t.cycle_days, "domains": rows,
                    "overdue": [r["domain"] for r in rows if r["overdue"]]})
    return out


def releases(config: RailyardConfig, ledger: Ledger, hosts: list[Host], now: float) -> dict[str, Any]:
    """Each release's phase, halted or not, failures in its phase against the gate; drift per component."""
    ro = Rollout(config, ledger)
    d = drift(config, hosts, now)  # its versions per component also give each release's hosts at its version
    versions = {name: c["versions"] for name, c in d["components"].items()}
    rows = []
    for r in ro.table():
        spec = config.releases[[x.id for x in config.releases].index(r["release"])]
        st = ro.state(spec.id)
        results: dict[str, bool] = {}
        for x in ledger.release_results(spec.id):
            if x["at"] >= st.promoted_at:
                results[x["host"]] = bool(x["passed"])
        failed = sum(1 for ok in results.values() if not ok)
        rows.append(r | {"failures": failed, "results": len(results),
                         "max_failure_rate": spec.rollout.max_failure_rate if spec.rollout else None,
                         "phased": spec.rollout is not None,
                         "at_version": versions.get(spec.component, {}).get(spec.version, 0)})
    comps = {name: {"newest_released": c["newest_released"], "converged_fraction": c["converged_fraction"],
                    "versions": c["versions"], "oldest_running": c["oldest_running"]}
             for name, c in d["components"].items()}
    return {"releases": rows, "drift": comps}


def operations(ledger: Ledger) -> dict[str, Any]:
    ops = []
    waiting = [dict(w) for w in ledger.waiting()]  # in line: emergencies first, then by arrival
    place = {w["op_id"]: i + 1 for i, w in enumerate(waiting)}
    for o in ledger.active_operations():
        last = o.get("last") or {}
        detail = o.get("detail") or {}
        ops.append({"id": o["id"], "kind": o["kind"], "hosts": o["hosts"], "created_at": o["created_at"],
                    "run": run_link(o), "last": {k: last.get(k) for k in ("action", "reason", "actor", "at")},
                    # outside work: who asked, what for, and where it stands (queued, handed)
                    "requester": detail.get("actor") if o["kind"] == "outside" else None,
                    "phase": detail.get("phase") if o["kind"] == "outside" else None,
                    "place": place.get(o["id"])})
    sw = ledger.switch("freeze")
    return {"operations": ops, "waiting": waiting,
            "freeze": {"on": sw is not None, **{k: (sw or {}).get(k) for k in ("reason", "actor", "at")}}}


RUNS_SHOWN = 30  # the latest run reports listed in the page's Runs panel


def runs(ledger: Ledger, limit: int = RUNS_SHOWN) -> list[dict[str, Any]]:
    """The latest runs with a report, newest first, each with the path of its run in Airflow's UI."""
    out = []
    for r in ledger.reports(limit=limit):
        dag = r.get("dag_id") or ("railyard_emergency" if r["train"] == "emergency" else dag_id_for(r["train"]))
        out.append(r | {"grid": f"/dags/{dag}/runs/{quote(r['run_id'], safe='')}"})
    return out


def host_history(ledger: Ledger, host: str) -> dict[str, Any]:
    return ledger.host_history(host)


def overview(config: RailyardConfig, fleet: Fleet, ledger: Ledger,
             schedule: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """Everything the page shows, from one read of the fleet."""
    t0 = time.monotonic()
    hosts = fleet.hosts()
    now = fleet.now()
    out = {
        "map": fleet_map(config, hosts, ledger),
        "capacity": capacity(config, fleet, hosts, ledger),
        "buffers": buffers(config, hosts, ledger),
        "trains": trains(config, ledger, now, schedule),
        "releases": releases(config, ledger, hosts, now),
        **operations(ledger),
        "emergency_dag": "railyard_emergency",
    }
    out["elapsed_s"] = round(time.monotonic() - t0, 4)
    return out
