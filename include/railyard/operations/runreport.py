"""The report of one run of a train or of the emergency train: who started it and why, what each stop did
and how long each part took, every host it touched with its versions before and after and its outcome, the
evidence of each host sent to repair, the jobs asked to checkpoint and the GPU-hours lost, handovers, dodges
and revisits, and the fleet's serving fraction at its lowest.

Built from the ledger alone (the audit, the operations, the checks), so a run that failed or was cut short
has one too: what was done before it stopped. `build` reads; the run's last task (`end_run`) or the
reconciler, for a run that ended without one, stores it (`Ledger.save_report`); `railyard report`, the page
and the Airflow run's XCom show it."""

from __future__ import annotations

import json
import re
import time
from collections import defaultdict
from typing import Any

from railyard.ledger import Ledger

# the milestones of a stop, in order, by the audit action that marks each; a phase runs from its milestone to
# the next one present
MILESTONES = (("wait", "waiting for capacity"), ("lease", "waiting for checkpoints"), ("drain", "drain"),
              ("upgrade", "upgrade"), ("check", "health check"), ("verdict", "return"), ("release", ""))
OUTCOMES = ("upgraded", "unchanged", "to repair", "taken over", "still out", "not reached")


def run_key(train: str, run_id: str) -> str:
    return f"{train}/{run_id}"


def build(led: Ledger, *, train: str, run_id: str, dag_id: str | None = None, triggered_by: str | None = None,
          run_type: str | None = None, reason: str | None = None, state: str | None = None,
          failed_tasks: list[str] | None = None, started_at: float | None = None,
          ended_at: float | None = None, dry_run: bool = False) -> dict[str, Any]:
    """The report of run `run_id` of `train` ("emergency" for the emergency train). The other fields are what
    Airflow knows of the run (who triggered it, its state, its failed tasks), when the caller has them."""
    prefix = f"{run_key(train, run_id)}/"
    ops = led.operations_like(prefix)
    rows = led.audit_rows(prefix=prefix, limit=None)
    by_op: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_op[r["op_id"]].append(r)
    if train == "emergency":
        run_op = led.operation(f"emergency/{run_id}")
        if run_op is not None:
            d = json.loads(run_op["detail"] or "{}")
            triggered_by = triggered_by or d.get("user")
            reason = reason or (d.get("request") or {}).get("reason")
            dry_run = dry_run or bool((d.get("plan") or {}).get("dry_run"))
    stops = [_stop(led, op, by_op.get(op["id"], [])) for op in ops]
    hosts: dict[str, dict[str, Any]] = {}
    for s in stops:
        for name, h in s.pop("_hosts").items():
            # a host a later stop of the run (a revisit) reached again: the later outcome, the earlier before
            before = hosts.get(name, {}).get("before")
            hosts[name] = h | ({"before": before} if before else {})
    lowest = min((x for s in stops if (x := s.get("serving_fraction_low")) is not None), default=None)
    lost = {j: h for s in stops for j, h in s["gpu_hours_lost"].items()}
    failed = sorted(failed_tasks or [])
    outcome = _outcome(stops, state, failed, dry_run)
    summary = {
        "stops": len(stops), "stops_done": sum(1 for s in stops if s["state"] == "done"),
        "hosts": len(hosts), **{o.replace(" ", "_"): sum(1 for h in hosts.values() if h["outcome"] == o)
                                for o in OUTCOMES},
        "jobs_checkpointed": len({j for s in stops for j in s["jobs_asked"]}),
        "gpu_hours_lost": round(sum(lost.values()), 3),
        "handovers": sum(len(s["handed_over"]) + len(s["taken_from"]) for s in stops),
        "dodges": sum(1 for s in stops if s["dodged"]), "revisits": sum(1 for s in stops if s["revisit"]),
        "lowest_serving_fraction": lowest,
    }
    times = [r["at"] for r in rows]
    return {
        "run": {"key": run_key(train, run_id), "train": train, "run_id": run_id, "dag_id": dag_id,
                "kind": "emergency" if train == "emergency" else "train", "triggered_by": triggered_by,
                "run_type": run_type, "reason": reason, "dry_run": dry_run, "state": state,
                "failed_tasks": failed, "outcome": outcome,
                "started_at": started_at if started_at is not None else min(times, default=None),
                "ended_at": ended_at if ended_at is not None else max(times, default=None)},
        "summary": summary,
        "stops": stops,
        "hosts": dict(sorted(hosts.items())),
        "jobs": {"asked_to_checkpoint": sorted({j for s in stops for j in s["jobs_asked"]}),
                 "gpu_hours_lost": dict(sorted(lost.items()))},
    }


def rebuild(led: Ledger, old: dict[str, Any]) -> dict[str, Any]:
    """`old` built again from the ledger as it is now, with what Airflow had told its writer (who triggered
    the run, its state and failed tasks) kept."""
    r = old["run"]
    return build(led, train=r["train"], run_id=r["run_id"], dag_id=r.get("dag_id"),
                 triggered_by=r.get("triggered_by"), run_type=r.get("run_type"), reason=r.get("reason"),
                 state=r.get("state"), failed_tasks=r.get("failed_tasks"), started_at=r.get("started_at"))


def refresh_if_stale(led: Ledger, key: str) -> bool:
    """A run's stored report that still shows hosts out (its last task ran while a teardown was finishing
    them) is written again once no operation of the run is active; True if it was."""
    old = led.report(key)
    if old is None or not old["summary"].get("still_out") or led.operations_like(f"{key}/", state="active"):
        return False
    led.save_report(rebuild(led, old))
    return True


XCOM_HOSTS = 2000  # beyond, the run's XCom names only the hosts sent to repair; `railyard report` has them all


def for_xcom(report: dict[str, Any], max_hosts: int = XCOM_HOSTS) -> dict[str, Any]:
    """The report as the run's last task returns it (Airflow keeps it in its own database, beside the run):
    whole up to `max_hosts` hosts; beyond, every host but those sent to repair is left to the ledger's copy."""
    if len(report["hosts"]) <= max_hosts:
        return report
    kept = {h: x for h, x in report["hosts"].items() if x["outcome"] == "to repair"}
    return report | {"hosts": kept, "hosts_left_out": f"{len(report['hosts']) - len(kept)} host(s): "
                                                      f"railyard report {report['run']['key']}"}


def _outcome(stops: list[dict[str, Any]], state: str | None, failed: list[str], dry_run: bool) -> str:
    if dry_run:
        return "dry run"
    if state == "failed" or failed:
        return "failed"
    if any(s["state"] == "active" for s in stops):
        return "cut short"
    if state in (None, "success") and all(s["state"] in ("done", "dodged") for s in stops):
        return "success"
    return state or "unknown"


def _stop(led: Ledger, op: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    detail = op.get("detail") or {}
    # a stop revisited from scratch (its hosts were taken over): its times and outcomes are the revisit's
    last = max((i for i, r in enumerate(rows) if r["action"] == "revisit"), default=-1)
    cur = rows[last + 1:]
    at: dict[str, float] = {}
    first = {"wait", "lease", "drain", "upgrade", "check"}
    for r in cur:
        a = r["action"]
        key = "verdict" if a in ("verified", "check_failed") else a
        if key in first and key not in at:
            at[key] = r["at"]
        elif key in ("verdict", "release"):
            at[key] = r["at"]  # the last verdict, the last release
    if "release" not in at and op.get("state") == "done" and at:  # every host went to repair: nothing released
        at["release"] = max(float(op["updated_at"]), max(at.values()))
    present = [(m, label) for m, label in MILESTONES if m in at]
    phases = {label: round(at[present[i + 1][0]] - at[m], 3) for i, (m, label) in enumerate(present[:-1])}
    leased = [h for r in rows if r["action"] == "lease" for h in r["hosts"]]
    taken_from = [{"hosts": r["hosts"], "from": r["reason"]} for r in rows if r["action"] == "handover"]
    handed = [{"hosts": r["hosts"], "to": r["reason"]} for r in rows if r["action"] == "handed_over"]
    gone = {h for r in cur if r["action"] == "handed_over" for h in r["hosts"]}
    offboarded = {r["hosts"][0]: r["reason"] for r in rows if r["action"] == "offboard" and r["hosts"]}
    upgraded = {h for r in cur if r["action"] == "upgrade" for h in r["hosts"]}
    returned = {h for r in cur if r["action"] == "return" for h in r["hosts"]}
    before = led.versions_before(op["id"])
    after = led.verifications(op["id"])
    asked = detail.get("checkpoints_asked")  # job id -> when; a stop recorded before it was kept: the audit's text
    jobs = sorted(asked) if asked is not None else \
        sorted({j for r in rows if r["action"] == "checkpoint_requested" for j in _jobs(r["reason"])})
    held = set(led.holdings(op["id"]))  # a run cut short: hosts its stop still holds, out of service
    hosts: dict[str, dict[str, Any]] = {}
    for h in dict.fromkeys(leased + [h for x in taken_from for h in x["hosts"]]):
        ok = after.get(h)
        if h in offboarded:
            outcome = "to repair"
        elif h in gone:
            outcome = "taken over"
        elif h in upgraded and h in returned:
            outcome = "upgraded"
        elif h in returned:
            outcome = "unchanged"
        elif h in held:
            outcome = "still out"
        else:
            outcome = "not reached"
        hosts[h] = {"domain": op.get("domain"), "stop": op["id"], "outcome": outcome,
                    "before": before.get(h), "after": ok[1] if ok else None,
                    "check": None if ok is None else ("passed" if ok[0] else "failed"),
                    "evidence": offboarded.get(h) or (ok[2] if ok and not ok[0] else None)}
    low = led.capacity_low(op["id"])
    return {
        "op_id": op["id"], "domain": op.get("domain"), "kind": op.get("kind"), "state": op.get("state"),
        "revisit": bool(detail.get("slot") or detail.get("revisit")),
        "dodged": op.get("state") == "dodged" or any(r["action"] == "dodge" for r in rows),
        "times": dict(sorted(at.items(), key=lambda kv: kv[1])), "phases_s": phases,
        "waited_because": next((r["reason"] for r in cur if r["action"] == "wait"), None),
        "hosts": len(hosts), "upgraded": sorted(upgraded & returned - set(offboarded)),
        "offboarded": [{"host": h, "reason": why} for h, why in sorted(offboarded.items())],
        "handed_over": handed, "taken_from": taken_from, "jobs_asked": jobs,
        "checkpoint_skipped": (detail.get("checkpoint_skipped") or {}).get("reason"),
        "gpu_hours_lost": dict(detail.get("gpu_hours_lost") or {}),
        "serving_fraction_low": low,
        "_hosts": hosts,
    }


_JOBS = re.compile(r"jobs(?: not yet asked)?: (.*)$")


def _jobs(reason: str) -> list[str]:
    """The job ids of a `checkpoint_requested` audit row ("jobs: a, b"; "at the drain, jobs not yet asked: a"), for
    a stop recorded before its detail kept them (`checkpoints_asked`)."""
    m = _JOBS.search(reason or "")
    return [] if m is None or m.group(1) == "none" else [j.strip() for j in m.group(1).split(",") if j.strip()]


def describe(report: dict[str, Any]) -> str:
    """The report as text, as `railyard report` prints it and the run's last task logs it."""
    run, s = report["run"], report["summary"]
    low = s["lowest_serving_fraction"]
    lines = [f"run {run['key']} ({run['kind']}): {run['outcome'].upper()}",
             f"  triggered by {run['triggered_by'] or run['run_type'] or 'unknown'}"
             + (f": {run['reason']}" if run["reason"] else "")
             + (f"; failed tasks: {', '.join(run['failed_tasks'])}" if run["failed_tasks"] else ""),
             f"  {s['stops_done']}/{s['stops']} stop(s) done; {s['hosts']} host(s): {s['upgraded']} upgraded, "
             f"{s['unchanged']} unchanged, {s['to_repair']} to repair, {s['taken_over']} taken over, "
             f"{s['still_out']} still out, {s['not_reached']} not reached",
             f"  jobs asked to checkpoint: {s['jobs_checkpointed']}; GPU-hours lost: {s['gpu_hours_lost']:.2f}; "
             f"handovers {s['handovers']}, dodges {s['dodges']}, revisits {s['revisits']}; lowest serving "
             + ("-" if low is None else f"{low:.1%}")]
    for st in report["stops"]:
        phases = ", ".join(f"{k} {v:.0f}s" for k, v in st["phases_s"].items()) or "no step recorded"
        lines.append(f"  {st['domain']} [{st['state']}{', revisit' if st['revisit'] else ''}"
                     f"{', dodged' if st['dodged'] else ''}]: {phases}")
        for o in st["offboarded"]:
            lines.append(f"    {o['host']} to repair: {o['reason']}")
        for x in st["handed_over"]:
            lines.append(f"    {', '.join(x['hosts'])} {x['to']}")
    return "\n".join(lines)


def describe_runs(rows: list[dict[str, Any]]) -> str:
    """`railyard runs`: one line per run, newest first."""
    if not rows:
        return "no run reports yet (each run of a train or of the emergency train writes one at its end)"
    lines = [f"{'written (UTC)':<20} {'run':<56} {'outcome':<10} {'hosts':>5} {'repair':>6}  triggered by"]
    for r in rows:
        s = r.get("summary") or {}
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(r["at"]))
        lines.append(f"{when:<20} {r['run']:<56} {r['outcome']:<10} {s.get('hosts', 0):>5} "
                     f"{s.get('to_repair', 0):>6}  {r.get('triggered_by') or '-'}")
    return "\n".join(lines)
