"""Emergency trains: the trigger form, validated into a model, and the plan it would carry out.

Nothing is touched before `parse_request` passes: every problem is named by field and value,
all at once. The plan is what the run then does, stop by stop.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable
from typing import Any

from pydantic import Field, ValidationError

from railyard.domain.config import ConfigError, RailyardConfig, TrainSpec
from railyard.domain.models import BROKEN_STATES, Strict, Token
from railyard.domain.planning import pending_steps, stop_estimate_s
from railyard.fleet.port import Fleet
from railyard.ledger import Ledger
from railyard.operations import releases
from railyard.operations.stop import Stop


class EmergencyError(ConfigError):
    """The trigger form is invalid; `problems` names every field and value."""


MAX_TEXT = 1000  # characters of a free-text field (a reason): it is stored, audited and shown


class EmergencyRequest(Strict):
    releases: list[Token] = Field(min_length=1)
    domains: list[Token] = Field(default_factory=list)
    hosts: list[Token] = Field(default_factory=list)
    reason: str = Field(max_length=MAX_TEXT)
    skip_checkpoint: bool = False
    skip_checkpoint_reason: str | None = Field(default=None, max_length=MAX_TEXT)
    large_scale: bool = False
    domains_at_once: int = Field(default=1, ge=1)
    large_scale_reason: str | None = Field(default=None, max_length=MAX_TEXT)
    dry_run: bool = False


def shown(value: object, limit: int = 80) -> str:
    """A value as a message may quote it: its repr, cut at `limit` characters with its length said."""
    text = repr(value)
    if len(text) <= limit:
        return text
    size = f"{len(value)} characters" if isinstance(value, str) else f"{len(text)} characters as text"
    return f"{text[:limit]}... ({size})"


def parse_request(config: RailyardConfig, params: dict[str, Any]) -> EmergencyRequest:
    """The form, checked against the config; raises EmergencyError listing every problem. A key that is
    not a field of the form is refused by name (a misspelt `dryrun` must never run a real emergency)."""
    fields = list(EmergencyRequest.model_fields)
    problems = []
    for k in sorted((k for k in params if k not in fields), key=str):
        near = difflib.get_close_matches(str(k), fields, n=1, cutoff=0.6)
        problems.append(f"{shown(k, 64)}: not a field of the emergency form"
                        + (f" (did you mean {near[0]!r}?)" if near else f" (fields: {', '.join(fields)})"))
    data = {k: v for k, v in params.items() if k in fields}
    for k in ("domains", "hosts"):
        if data.get(k) is None:
            data[k] = []
    try:
        req = EmergencyRequest.model_validate(data)
    except ValidationError as exc:
        for e in exc.errors():
            loc = ".".join(str(p) for p in e["loc"])
            problems.append(f"{loc}: {e['msg'].removeprefix('Value error, ')} (value: {shown(e.get('input'))})")
        raise EmergencyError("emergency form", problems) from None
    if problems:
        raise EmergencyError("emergency form", problems)
    by_id = {r.id: r for r in config.releases}
    comps: dict[str, str] = {}
    for i, rid in enumerate(req.releases):
        if rid not in by_id:
            problems.append(f"releases[{i}]: unknown release {rid!r}")
        elif by_id[rid].component in comps:
            problems.append(f"releases[{i}]: {rid!r} and {comps[by_id[rid].component]!r} both target "
                            f"{by_id[rid].component!r}")
        else:
            comps[by_id[rid].component] = rid
    domains = {d.name for d in config.domains}
    for i, d in enumerate(req.domains):
        if d not in domains:
            problems.append(f"domains[{i}]: unknown domain {d!r}")
    owner = config.host_domain()
    for i, h in enumerate(req.hosts):
        if h not in owner:
            problems.append(f"hosts[{i}]: unknown host {h!r}")
    if not req.domains and not req.hosts:
        problems.append("domains/hosts: name at least one domain or host (value: [])")
    if len(req.reason.strip()) < 10:
        problems.append(f"reason: say why in at least 10 characters (value: {shown(req.reason)})")
    if req.skip_checkpoint and not (req.skip_checkpoint_reason or "").strip():
        problems.append("skip_checkpoint_reason: required when skip_checkpoint is true (value: None)")
    if req.domains_at_once > 1 and not req.large_scale:
        problems.append(f"domains_at_once: more than 1 needs large_scale: true (value: {req.domains_at_once})")
    if req.large_scale and not (req.large_scale_reason or "").strip():
        problems.append("large_scale_reason: required when large_scale is true (value: None)")
    if problems:
        raise EmergencyError("emergency form", problems)
    return req


def emergency_train(req: EmergencyRequest) -> TrainSpec:
    """The train an emergency behaves as: its releases, no windows, no dodges, never halted by rate."""
    return TrainSpec(id="emergency", releases=req.releases, max_failure_fraction=1.0, max_dodges=0,
                     description="emergency")


def plan(config: RailyardConfig, fleet: Fleet, req: EmergencyRequest) -> dict[str, Any]:
    """Stops in order (whole domains first, then the domains of single hosts), with what each does."""
    train = emergency_train(req)
    targets = config.train_targets(train)
    owner = config.host_domain()
    scopes: dict[str, list[str]] = {d: list(config.domain(d).hosts) for d in req.domains}
    for h in req.hosts:
        if owner[h] not in req.domains:
            scopes.setdefault(owner[h], []).append(h)
    live = {h.name: h for h in fleet.hosts()}
    stops: list[dict[str, Any]] = []
    for domain, hosts in scopes.items():
        work = {h: [s.model_dump() for s in pending_steps(targets, live[h])] for h in sorted(hosts)
                if live[h].state not in BROKEN_STATES}
        jobs = sorted({j.id for j in fleet.jobs(sorted(hosts)) if j.state == "running"})
        stops.append({
            "domain": domain,
            "hosts": sorted(hosts),
            "whole_domain": domain in req.domains,
            "steps": {h: s for h, s in work.items() if s},
            "jobs_to_checkpoint": [] if req.skip_checkpoint else jobs,
            "jobs_at_risk": jobs if req.skip_checkpoint else [],
            "estimate_s": round(stop_estimate_s(config, targets, [live[h] for h in work]), 1),
        })
    return {
        "releases": req.releases,
        "targets": targets,
        "stops": stops,
        "domains_at_once": req.domains_at_once,
        "estimate_s": round(sum(s["estimate_s"] for s in stops) / req.domains_at_once, 1),
        "dry_run": req.dry_run,
    }


def describe(p: dict[str, Any]) -> str:
    lines = [f"emergency: {', '.join(f'{c}={v}' for c, v in p['targets'].items())}; "
             f"{len(p['stops'])} stop(s), {p['domains_at_once']} at a time, ~{p['estimate_s'] / 60:.0f} min"
             + (" (DRY RUN: nothing will be touched)" if p["dry_run"] else "")]
    for i, s in enumerate(p["stops"], 1):
        lines.append(f"  {i}. {s['domain']}: {len(s['hosts'])} host(s)"
                     f"{' (whole domain)' if s['whole_domain'] else ''}, "
                     f"{len(s['steps'])} need work; checkpoint {', '.join(s['jobs_to_checkpoint']) or '-'}"
                     + (f"; AT RISK without checkpoint: {', '.join(s['jobs_at_risk'])}" if s["jobs_at_risk"] else ""))
    return "\n".join(lines)


def broken_rules(config: RailyardConfig, fleet: Fleet, req: EmergencyRequest) -> list[str]:
    """The compatibility rules (`compatibility.rules`) that the hosts in scope would break once the
    emergency's releases are applied: one message per rule, naming the hosts; [] when safe."""
    if not config.rules():
        return []
    targets = config.train_targets(emergency_train(req))
    owner = config.host_domain()
    scope = {h for d in req.domains for h in config.domain(d).hosts} | {h for h in req.hosts if h in owner}
    hosts = [h for h in fleet.hosts(sorted(scope)) if h.state not in BROKEN_STATES]
    return releases.check_visit(config, hosts, lambda _h: targets, step="after the emergency")


def run_op(run_id: str) -> str:
    """The operation that records an emergency run's form and plan."""
    return f"emergency/{run_id}"


def stop_of_run(cfg: RailyardConfig, led: Ledger, *, run_id: str, fleet: Fleet, say: Callable[[str], None],
                slot: str | None = None, domain: str | None = None, **kw: Any) -> Stop | None:
    """The Stop of an emergency run: slot `stop_N` (the N-th stop of its validated plan) or the stop on
    `domain`; None when the run recorded no plan, is a dry run, or has no such stop."""
    op = led.operation(run_op(run_id))
    if op is None:
        return None
    detail = json.loads(op["detail"] or "{}")
    stops = detail["plan"]["stops"]
    if detail["plan"]["dry_run"]:
        return None
    if slot is not None:
        n = int(slot.removeprefix("stop_"))
        s = stops[n - 1] if 1 <= n <= len(stops) else None
    else:
        s = next((x for x in stops if x["domain"] == domain), None)
    if s is None:
        return None
    req = EmergencyRequest.model_validate(detail["request"])
    fields: dict[str, Any] = {"actor": f"emergency:{detail.get('user') or 'unknown'}"} | kw
    return Stop(
        config=cfg,
        train=emergency_train(req),
        domain=cfg.domain(s["domain"]),
        op_id=f"emergency/{run_id}/{s['domain']}",
        fleet=fleet,
        ledger=led,
        say=say,
        kind="emergency",
        scope=None if s["whole_domain"] else s["hosts"],
        skip_checkpoint_reason=req.skip_checkpoint_reason if req.skip_checkpoint else None,
        domains_at_once=req.domains_at_once,
        **fields,
    )
