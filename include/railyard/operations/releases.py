"""Releases: rollout phases, what each host gets in a visit, the compatibility check of a plan,
the plan preview, version drift and job-stack coverage. No Airflow, no I/O beyond fleet + ledger.

Phases are canary -> staged -> fleet (`releases[].rollout`). A release without a rollout admits
every host, so a config without rollouts behaves exactly as before. The state of each phased
release (phase, when it began on the fleet clock, halted + reason) is in the ledger; every change
has an audit row. `Rollout.refresh` applies the gates: a release whose failure rate in its current
phase exceeds `max_failure_rate` halts by itself; one whose phase hosts are all done and have soaked
`soak_s` is promoted (when `auto_promote`).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from railyard.domain.compat import Rule, apply_order, newest, parse_rule, version_key
from railyard.domain.config import RailyardConfig, ReleaseSpec, TrainSpec
from railyard.domain.models import BROKEN_STATES, Host, HostState
from railyard.fleet.port import Fleet

if TYPE_CHECKING:  # drift needs no ledger: `railyard drift` does not import SQLAlchemy
    from railyard.ledger import Ledger

PHASES = ("canary", "staged", "fleet")


class ReleaseError(ValueError):
    """An action on a release that cannot be done (unknown id, nothing to promote, no reason)."""


def phased(config: RailyardConfig) -> bool:
    return any(r.rollout is not None for r in config.releases)


def shaped(config: RailyardConfig) -> bool:
    """Whether releases change what a stop does at all (phases, rules or an order)."""
    return phased(config) or bool(config.compatibility.rules or config.compatibility.order)


@dataclass(frozen=True)
class ReleaseState:
    release: str
    phase: str
    halted: bool = False
    reason: str = ""
    promoted_at: float = 0.0  # fleet clock when the phase began


class Rollout:
    """The rollout of every release, as the ledger has it. An instance reads each release's state
    once and keeps it (its own writes update it): a plan asks `admits` for every host of the fleet,
    and that must not be a query each time. Make a new instance to see what others changed since."""

    def __init__(self, config: RailyardConfig, ledger: Ledger):
        self.config = config
        self.ledger = ledger
        self.by_id = {r.id: r for r in config.releases}
        self._override: dict[str, ReleaseState] = {}
        self._states: dict[str, ReleaseState] = {}
        self._admitted: dict[tuple[str, str], frozenset[str] | None] = {}

    def release(self, rid: str) -> ReleaseSpec:
        if rid not in self.by_id:
            raise ReleaseError(f"release: unknown release {rid!r} (known: {', '.join(sorted(self.by_id))})")
        return self.by_id[rid]

    def state(self, rid: str) -> ReleaseState:
        if rid in self._override:
            return self._override[rid]
        if rid not in self._states:
            r = self.release(rid)
            row = self.ledger.release_state(rid)
            self._states[rid] = ReleaseState(rid, "canary" if r.rollout is not None else "fleet") if row is None \
                else ReleaseState(rid, row["phase"], bool(row["halted"]), row["reason"], row["promoted_at"])
        return self._states[rid]

    def _write_state(self, rid: str, **kw: Any) -> None:
        self.ledger.set_release_state(rid, **kw)
        self._states.pop(rid, None)  # read back from the ledger next time

    # ---- which hosts a phase admits -------------------------------------------------------------
    def canary(self, rid: str) -> list[str]:
        ro = self.release(rid).rollout
        if ro is None:
            return []
        if not ro.canary_domains and not ro.canary_hosts:
            return list(self.config.domains[0].hosts)
        hosts = [h for d in ro.canary_domains for h in self.config.domain(d).hosts] + list(ro.canary_hosts)
        return list(dict.fromkeys(hosts))

    def ranking(self, rid: str) -> list[str]:
        """Canary hosts first, then the fleet in config domain order: staged takes whole domains early."""
        first = self.canary(rid)
        seen = set(first)
        return first + [h for d in self.config.domains for h in d.hosts if h not in seen]

    def admitted(self, rid: str, phase: str | None = None) -> frozenset[str] | None:
        """Hosts the phase admits; None = every host. Computed once per release and phase (it
        depends on the config alone)."""
        phase = phase or self.state(rid).phase
        key = (rid, phase)
        if key not in self._admitted:
            self._admitted[key] = self._admitted_hosts(rid, phase)
        return self._admitted[key]

    def _admitted_hosts(self, rid: str, phase: str) -> frozenset[str] | None:
        r = self.release(rid)
        if r.rollout is None or phase == "fleet":
            return None
        if phase == "canary":
            return frozenset(self.canary(rid))
        rank = self.ranking(rid)
        n = max(len(self.canary(rid)), math.ceil(r.rollout.staged_fraction * len(rank)))
        return frozenset(rank[:n])

    def admits(self, rid: str, host: str) -> bool:
        st = self.state(rid)
        if st.halted:
            return False
        adm = self.admitted(rid, st.phase)
        return adm is None or host in adm

    # ---- gates ----------------------------------------------------------------------------------
    def gate(self, rid: str, hosts: list[Host], now: float) -> tuple[str, str]:
        """('halt' | 'promote' | 'hold', why) for a phased, running release."""
        r = self.release(rid)
        ro = r.rollout
        st = self.state(rid)
        assert ro is not None
        adm = self.admitted(rid, st.phase)
        in_phase = [h for h in hosts if adm is None or h.name in adm]
        results: dict[str, dict[str, Any]] = {}
        for row in self.ledger.release_results(rid):
            if row["at"] >= st.promoted_at and (adm is None or row["host"] in adm):
                results[row["host"]] = row  # the last outcome per host
        failed = [x for x in results.values() if not x["passed"]]
        if results and len(failed) / len(results) > ro.max_failure_rate:
            return "halt", (f"{len(failed)} of {len(results)} {st.phase} hosts failed "
                            f"({len(failed) / len(results):.0%} > max_failure_rate {ro.max_failure_rate:.0%}); "
                            f"first: {failed[0]['host']}: {failed[0]['reason']}")
        if st.phase == "fleet":
            return "hold", "at fleet"
        todo = [h.name for h in in_phase if h.state not in BROKEN_STATES and h.versions.get(r.component) != r.version]
        if todo:
            return "hold", f"{len(in_phase) - len(todo)}/{len(in_phase)} {st.phase} hosts at {r.version}"
        done_at = max([st.promoted_at] + [x["at"] for x in results.values() if x["passed"]])
        if now - done_at < ro.soak_s:
            return "hold", f"soaking: {now - done_at:.0f}s of {ro.soak_s:.0f}s since the last {st.phase} host"
        if not ro.auto_promote:
            return "hold", f"{st.phase} done and soaked; waiting for a manual promote"
        return "promote", (f"{st.phase} done on {len(in_phase)} host(s), soaked {now - done_at:.0f}s "
                           f">= {ro.soak_s:.0f}s, {len(failed)} failure(s) of {len(results)}")

    def refresh(self, hosts: list[Host], now: float, *, write: bool = True) -> list[str]:
        """Apply the gates to every phased release; `write=False` only previews (for plans)."""
        said: list[str] = []
        for r in self.config.releases:
            if r.rollout is None:
                continue
            if write and self.ledger.release_state(r.id) is None:
                self._write_state(r.id, phase="canary", halted=False, reason="rollout started",
                                  actor="railyard", fleet_now=now, action="release_start", promoted=True)
            st = self.state(r.id)
            if st.halted:
                continue
            verdict, why = self.gate(r.id, hosts, now)
            if verdict == "halt":
                self._set(r.id, st.phase, True, f"auto-halt: {why}", now, "release_halt", write, promoted=False)
                said.append(f"release {r.id} halted in {st.phase}: {why}")
            elif verdict == "promote":
                nxt = PHASES[PHASES.index(st.phase) + 1]
                self._set(r.id, nxt, False, f"auto-promote: {why}", now, "release_promote", write, promoted=True)
                said.append(f"release {r.id} promoted {st.phase} -> {nxt}: {why}")
        return said

    def _set(self, rid: str, phase: str, halted: bool, reason: str, now: float, action: str, write: bool,
             *, promoted: bool, actor: str = "railyard", key: str | None = None) -> None:
        if write:
            self._write_state(rid, phase=phase, halted=halted, reason=reason, actor=actor,
                              fleet_now=now, action=action, promoted=promoted, key=key)
        else:
            old = self.state(rid)
            self._override[rid] = ReleaseState(rid, phase, halted, reason, now if promoted else old.promoted_at)

    # ---- explicit actions -----------------------------------------------------------------------
    def act(self, action: str, rid: str, *, reason: str, actor: str, now: float,
            key: str | None = None) -> ReleaseState:
        """promote | halt | resume, with a reason (at least 10 characters), recorded in the audit. `key` (the
        Airflow run that asks): an action already recorded under it is not applied twice; its state is returned."""
        r = self.release(rid)
        if key is not None and self.ledger.release_action_done(rid, key):
            return self.state(rid)
        if action not in ("promote", "halt", "resume"):
            raise ReleaseError(f"action: must be promote, halt or resume (value: {action!r})")
        if not reason or len(reason.strip()) < 10:
            raise ReleaseError(f"reason: say why in at least 10 characters (value: {reason!r})")
        if r.rollout is None and action != "halt":
            raise ReleaseError(f"release: {rid!r} has no rollout phases (releases[].rollout); only halt applies")
        st = self.state(rid)
        if self.ledger.release_state(rid) is None:
            self._write_state(rid, phase=st.phase, halted=False, reason="rollout started",
                              actor="railyard", fleet_now=now, action="release_start", promoted=True)
        if action == "promote":
            if st.halted:
                raise ReleaseError(f"release: {rid!r} is halted ({st.reason}); resume it first")
            if st.phase == "fleet":
                raise ReleaseError(f"release: {rid!r} is already at fleet")
            self._set(rid, PHASES[PHASES.index(st.phase) + 1], False, reason, now, "release_promote", True,
                      promoted=True, actor=actor, key=key)
        elif action == "halt":
            if st.halted:
                raise ReleaseError(f"release: {rid!r} is already halted ({st.reason})")
            self._set(rid, st.phase, True, reason, now, "release_halt", True, promoted=False, actor=actor, key=key)
        else:
            if not st.halted:
                raise ReleaseError(f"release: {rid!r} is not halted")
            # a fresh window: failures before the resume no longer count against the phase
            self._set(rid, st.phase, False, reason, now, "release_resume", True, promoted=True, actor=actor, key=key)
        return self.state(rid)

    def table(self) -> list[dict[str, Any]]:
        out = []
        for r in self.config.releases:
            st = self.state(r.id)
            adm = self.admitted(r.id, st.phase)
            out.append({"release": r.id, "component": r.component, "version": r.version, "phase": st.phase,
                        "halted": st.halted, "reason": st.reason,
                        "hosts_admitted": self.config.total_hosts if adm is None else len(adm)})
        return out


# ---- what one visit brings a host to ---------------------------------------------------------------
def visit_targets(config: RailyardConfig, release_ids: list[str], host: str,
                  admits: Callable[[str, str], bool] | None = None) -> tuple[dict[str, str], list[str]]:
    """(component -> version in apply order, release ids) for `host`: the admitted releases."""
    return Visits(config, release_ids)(host, admits)


class Visits:
    """`visit_targets` for many hosts: the apply order is worked out once per set of admitted
    releases (a fleet has a handful of such sets, not one per host)."""

    def __init__(self, config: RailyardConfig, release_ids: list[str]):
        self.by_id = {r.id: r for r in config.releases}
        self.release_ids = list(release_ids)
        self.rules = config.rules()
        self.order = config.compatibility.order
        self._memo: dict[tuple[str, ...], tuple[tuple[str, str, str], ...]] = {}

    def __call__(self, host: str, admits: Callable[[str, str], bool] | None = None
                 ) -> tuple[dict[str, str], list[str]]:
        steps = self.steps(tuple(r for r in self.release_ids if admits is None or admits(r, host)))
        return {c: v for _, c, v in steps}, [rid for rid, _, _ in steps]

    def admitted_by(self, rollout: Rollout) -> Callable[[str], tuple[str, ...]]:
        """host -> the releases `rollout` admits on it (what `rollout.admits` says), with each release's
        state and admitted hosts looked up once rather than once per host."""
        gates: list[tuple[str, frozenset[str] | None]] = []
        for rid in self.release_ids:
            st = rollout.state(rid)
            if not st.halted:  # a halted release admits no host
                gates.append((rid, rollout.admitted(rid, st.phase)))
        if all(adm is None for _, adm in gates):  # every host gets the same: no per-host look at all
            every = tuple(rid for rid, _ in gates)
            return lambda host: every
        return lambda host: tuple(rid for rid, adm in gates if adm is None or host in adm)

    def steps(self, admitted: tuple[str, ...]) -> tuple[tuple[str, str, str], ...]:
        """(release id, component, version) in apply order for a set of admitted releases; shared."""
        if admitted not in self._memo:
            rels = [self.by_id[r] for r in admitted]
            order = apply_order([r.component for r in rels], self.rules, self.order)
            comp = {r.component: r for r in rels}
            self._memo[admitted] = tuple((comp[c].id, c, comp[c].version) for c in order)
        return self._memo[admitted]


def broken_rules(rules: list[Rule], versions: dict[str, str]) -> list[Rule]:
    return [r for r in rules if r.broken(versions)]


def _fmt(versions: dict[str, str], comps: tuple[str, ...]) -> str:
    return ", ".join(f"{c}={versions.get(c, '-')}" for c in comps)


def violation_messages(found: dict[tuple[str, str], list[tuple[str, dict[str, str]]]]) -> list[str]:
    """One message per rule and step, naming each host only at the first step that breaks it."""
    out = []
    seen: set[tuple[str, str]] = set()
    for (rule_text, step), all_hosts in found.items():
        hosts = [(h, v) for h, v in all_hosts if (rule_text, h) not in seen]
        seen.update((rule_text, h) for h, _ in hosts)
        if not hosts:
            continue
        names = [h for h, _ in hosts]
        comps = tuple(dict.fromkeys(w for w in rule_text.split() if w in hosts[0][1]))
        out.append(f"rule {rule_text!r} broken {step} on {len(names)} host(s): {', '.join(names[:8])}"
                   + (" ..." if len(names) > 8 else "") + f" (e.g. {names[0]}: {_fmt(hosts[0][1], comps)})")
    return out


def check_visit(config: RailyardConfig, hosts: list[Host], targets_for: Callable[[str], dict[str, str]],
                step: str = "after this visit") -> list[str]:
    """Rules broken by any host at the end of its visit (a host is only back in service then)."""
    rules = config.rules()
    found: dict[tuple[str, str], list[tuple[str, dict[str, str]]]] = {}
    for h in hosts:
        after = {**h.versions, **targets_for(h.name)}
        for r in broken_rules(rules, after):
            found.setdefault((r.text, step), []).append((h.name, after))
    return violation_messages(found)


def check_plan(config: RailyardConfig, train: TrainSpec, hosts: list[Host], rollout: Rollout) -> list[str]:
    """Simulate every host's versions through the rollout: the next run (phases as they are), then
    every phased release one phase further, in lockstep, until all are at fleet (halted ones stay).
    Returns one message per rule and step broken, naming the hosts; [] when the plan is safe."""
    rules = config.rules()
    if not rules:
        return []
    found: dict[tuple[str, str], list[tuple[str, dict[str, str]]]] = {}
    current = {r: rollout.state(r) for r in train.releases}
    steps: list[tuple[str, dict[str, str]]] = [("in the next run", {r: s.phase for r, s in current.items()})]
    for k in (1, 2):
        steps.append((f"once every release is at {PHASES[k]}",
                      {r: s.phase if s.halted else max(s.phase, PHASES[k], key=PHASES.index)
                       for r, s in current.items()}))
    versions = {h.name: dict(h.versions) for h in hosts}
    visit = Visits(config, train.releases)
    for h in hosts:
        for r in broken_rules(rules, versions[h.name]):
            found.setdefault((r.text, "now"), []).append((h.name, dict(versions[h.name])))
    for label, phases in steps:
        def admits(rid: str, host: str, phases: dict[str, str] = phases) -> bool:
            if current[rid].halted:
                return False
            adm = rollout.admitted(rid, phases[rid])
            return adm is None or host in adm

        for h in hosts:
            t, _ids = visit(h.name, admits)
            versions[h.name].update(t)
            for r in broken_rules(rules, versions[h.name]):
                found.setdefault((r.text, label), []).append((h.name, dict(versions[h.name])))
    return violation_messages(found)


# ---- plan preview ----------------------------------------------------------------------------------
def plan_train(config: RailyardConfig, train: TrainSpec, fleet: Fleet, ledger: Ledger) -> dict[str, Any]:
    """What the next run of `train` would do, read-only: stops in order, hosts and releases per host,
    estimate, jobs asked to checkpoint, the lowest serving capacity and the floor, and any rule a step
    of the rollout would break (then the run is refused before it touches a host)."""
    from railyard.domain.planning import (  # the ledger's Budget: only a plan needs it
        budget_for,
        stop_estimate_s,
    )

    rollout = Rollout(config, ledger)
    hosts = fleet.hosts()
    now = fleet.now()
    if phased(config):
        rollout.refresh(hosts, now, write=False)
    live = {h.name: h for h in hosts}
    broken = {h.name for h in hosts if h.state in BROKEN_STATES}
    running: dict[str, set[str]] = {}  # host -> its running jobs: one read of the jobs, not one per domain
    for j in fleet.jobs():
        if j.state == "running":
            for n in j.hosts:
                running.setdefault(n, set()).add(j.id)
    visits = Visits(config, train.releases)
    admitted = visits.admitted_by(rollout)
    estimates: dict[frozenset[str], float] = {}
    stops: list[dict[str, Any]] = []
    for d in config.train_domains(train):
        work: dict[str, list[str]] = {}
        for name in d.hosts:
            h = live[name]
            if h.state not in BROKEN_STATES:
                have = h.versions
                todo = [rid for rid, c, v in visits.steps(admitted(name)) if have.get(c) != v]
                if todo:
                    work[name] = todo
        if not work:
            stops.append({"domain": d.name, "skip": True, "hosts": len(d.hosts), "hosts_to_upgrade": 0})
            continue
        jobs = sorted({j for n in d.hosts for j in running.get(n, ())})
        groups: dict[str, list[str]] = {}
        for n, ids in work.items():
            groups.setdefault("+".join(ids), []).append(n)
        # the estimate depends only on which releases are pending: one host per distinct set of them gives
        # the same figure as every workable host, and domains with the same sets share it
        pending = frozenset(groups)
        if pending not in estimates:
            workable = [live[v[0]] for v in groups.values()]
            estimates[pending] = stop_estimate_s(
                config, lambda h: {c: v for _, c, v in visits.steps(admitted(h.name))}, workable)
        stops.append({
            "domain": d.name, "skip": False, "sku": d.sku, "hosts": len(d.hosts), "hosts_to_upgrade": len(work),
            "releases": {k: sorted(v) for k, v in groups.items()},
            "jobs_to_checkpoint": jobs,
            "estimate_s": round(estimates[pending], 1),
        })
    lowest = 1.0
    floor = {}
    for sku in sorted({d.sku for d in config.domains}):
        b = budget_for(config, sku)
        floor[sku] = b.total_hosts - b.maintenance_hosts - b.failure_hosts
    total = len(hosts)
    for s in stops:
        if not s["skip"]:
            lowest = min(lowest, (total - len(broken) - s["hosts"]) / total)
    return {
        "train": train.id,
        "fleet_now": now,
        "domains": [s["domain"] for s in stops if not s["skip"]],
        "stops": stops,
        "hosts_to_upgrade": sum(s["hosts_to_upgrade"] for s in stops),
        "hosts_visited": sum(s["hosts"] for s in stops if not s["skip"]),
        "estimate_s": round(sum(s.get("estimate_s", 0) for s in stops), 1),
        "lowest_serving_fraction": round(lowest, 4),
        "serving_floor_hosts": floor,
        "releases": rollout.table(),
        "violations": check_plan(config, train, hosts, rollout),
    }


def describe_plan(p: dict[str, Any]) -> str:
    lines = [f"train {p['train']}: {len(p['domains'])} stop(s), {p['hosts_to_upgrade']} host(s) to upgrade, "
             f"~{p['estimate_s'] / 60:.0f} min of fleet time, lowest serving {p['lowest_serving_fraction']:.1%} "
             f"(floor {', '.join(f'{k}: {v} hosts' for k, v in p['serving_floor_hosts'].items())})"]
    for r in p["releases"]:
        lines.append(f"  release {r['release']} ({r['component']} {r['version']}): {r['phase']}"
                     + (f", HALTED: {r['reason']}" if r["halted"] else "")
                     + f", {r['hosts_admitted']} host(s) admitted")
    n = 0
    for s in p["stops"]:
        if s["skip"]:
            lines.append(f"  -  {s['domain']}: nothing to do")
            continue
        n += 1
        rel = "; ".join(f"{k or 'nothing'} on {len(v)}" for k, v in s["releases"].items())
        lines.append(f"  {n}. {s['domain']}: {s['hosts_to_upgrade']}/{s['hosts']} host(s): {rel}; "
                     f"~{s['estimate_s'] / 60:.0f} min; checkpoint {', '.join(s['jobs_to_checkpoint']) or '-'}")
    for v in p["violations"]:
        lines.append(f"  REFUSED: {v}")
    return "\n".join(lines)


# ---- drift and job stacks -----------------------------------------------------------------------------
def _age_days(config: RailyardConfig, comp: str, version: str, now: float) -> float | None:
    known = dict(config.component(comp).versions)
    for r in config.releases:
        if r.component == comp and r.released is not None:
            known.setdefault(r.version, r.released)
    d = known.get(version)
    if d is None:
        return None
    return round((datetime.fromtimestamp(now, UTC).date() - d).days, 1)


def job_stacks(config: RailyardConfig, hosts: list[Host]) -> list[dict[str, Any]]:
    comps = {c.name for c in config.components}
    out = []
    for js in config.job_stacks:
        conds = [parse_rule(f"{n} requires {n}", comps).left for n in js.needs]
        serving = [h for h in hosts if h.state not in BROKEN_STATES]
        usable = sorted(h.name for h in serving if all(c.holds(h.versions) for c in conds))
        cov = len(usable) / len(hosts) if hosts else 0.0
        out.append({"name": js.name, "needs": js.needs, "usable_hosts": usable, "coverage": round(cov, 4),
                    "target": js.target, "fleet_ready": cov >= js.target})
    return out


def drift(config: RailyardConfig, hosts: list[Host], now: float) -> dict[str, Any]:
    """Per component: versions per domain and SKU, the fraction at the newest released version,
    and the oldest version still running with its age (when the catalog dates it)."""
    names = [c.name for c in config.components]
    # one pass over the fleet: hosts counted per (domain, SKU, versions); a fleet has few such kinds
    kinds = Counter((h.domain, h.sku, tuple(h.versions.get(n, "none") for n in names)) for h in hosts)
    comps: dict[str, Any] = {}
    for i, c in enumerate(config.components):
        released = [r.version for r in config.releases if r.component == c.name]
        top = newest(released)
        by_domain: dict[str, dict[str, int]] = {}
        by_sku: dict[str, dict[str, int]] = {}
        versions: dict[str, int] = {}
        for (domain, sku, vs), k in kinds.items():
            v = vs[i]
            versions[v] = versions.get(v, 0) + k
            dv = by_domain.setdefault(domain, {})
            dv[v] = dv.get(v, 0) + k
            sv = by_sku.setdefault(sku, {})
            sv[v] = sv.get(v, 0) + k
        running = [v for v in versions if v != "none"]
        oldest = min(running, key=version_key) if running else None
        at_top = versions.get(top, 0) if top else 0
        comps[c.name] = {
            "newest_released": top,
            "converged_fraction": round(at_top / len(hosts), 4) if hosts and top else None,
            "converged_by_domain": {d: round(v.get(top, 0) / sum(v.values()), 4) for d, v in sorted(by_domain.items())}
            if top else {},
            "versions": dict(sorted(versions.items())),
            "by_domain": {d: dict(sorted(v.items())) for d, v in sorted(by_domain.items())},
            "by_sku": {s: dict(sorted(v.items())) for s, v in sorted(by_sku.items())},
            "oldest_running": oldest,
            "oldest_age_days": _age_days(config, c.name, oldest, now) if oldest else None,
        }
    return {"fleet_now": now, "hosts": len(hosts),
            "in_service": sum(1 for h in hosts if h.state == HostState.SERVING),
            "components": comps, "job_stacks": job_stacks(config, hosts)}


def describe_drift(d: dict[str, Any]) -> str:
    lines = [f"version drift over {d['hosts']} hosts ({d['in_service']} serving)"]
    for name, c in d["components"].items():
        conv = "n/a" if c["converged_fraction"] is None else f"{c['converged_fraction']:.1%}"
        age = "" if c["oldest_age_days"] is None else f", {c['oldest_age_days']:.0f} days old"
        lines.append(f"{name}: {conv} at newest {c['newest_released'] or '-'}; oldest running "
                     f"{c['oldest_running'] or '-'}{age}")
        lines.append("    versions: " + ", ".join(f"{v} x{n}" for v, n in c["versions"].items()))
        for dom, vs in c["by_domain"].items():
            lines.append(f"    {dom:<16} " + ", ".join(f"{v} x{n}" for v, n in vs.items()))
        if len(c["by_sku"]) > 1:
            for sku, vs in c["by_sku"].items():
                lines.append(f"    sku {sku:<12} " + ", ".join(f"{v} x{n}" for v, n in vs.items()))
    for js in d["job_stacks"]:
        lines.append(f"job stack {js['name']} ({'; '.join(js['needs'])}): usable on {len(js['usable_hosts'])} "
                     f"hosts, {js['coverage']:.1%} of target {js['target']:.0%} -> "
                     f"{'FLEET-READY' if js['fleet_ready'] else 'not ready'}")
    return "\n".join(lines)


def drift_chart(d: dict[str, Any], path: str) -> str:
    """A PNG: per component, the share of hosts on each version (newest in green); per domain, the
    fraction converged to the newest release."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    comps = list(d["components"].items())
    domains = sorted({dom for _, c in comps for dom in c["by_domain"]})
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 1.2 + 0.7 * max(len(comps), len(domains) / 3)),
                                   gridspec_kw={"width_ratios": [3, 2]})
    greys = ["#b0b0b0", "#8c8c8c", "#d0d0d0", "#6e6e6e", "#c4c4c4"]
    for i, (_name, c) in enumerate(comps):
        left = 0.0
        total = sum(c["versions"].values()) or 1
        for j, (v, n) in enumerate(sorted(c["versions"].items(), key=lambda kv: kv[0] != c["newest_released"])):
            w = n / total
            color = "#2e9d4a" if v == c["newest_released"] else greys[j % len(greys)]
            ax1.barh(i, w, left=left, color=color, edgecolor="white")
            if w > 0.08:
                ax1.text(left + w / 2, i, f"{v}\n{n}", ha="center", va="center", fontsize=7)
            left += w
    ax1.set_yticks(range(len(comps)), [f"{n}\n{(c['converged_fraction'] or 0):.0%} at newest" for n, c in comps],
                   fontsize=8)
    ax1.set_xlim(0, 1)
    ax1.invert_yaxis()
    ax1.set_xlabel("share of hosts (green: newest released version)")
    grid = [[c["converged_by_domain"].get(dom, 0.0) for dom in domains] for _, c in comps]
    im = ax2.imshow(grid, cmap="RdYlGn", vmin=0, vmax=1, aspect="auto")
    ax2.set_xticks(range(len(domains)), domains, rotation=45, ha="right", fontsize=8)
    ax2.set_yticks(range(len(comps)), [n for n, _ in comps], fontsize=8)
    for i, row in enumerate(grid):
        for j, val in enumerate(row):
            ax2.text(j, i, f"{val:.0%}", ha="center", va="center", fontsize=7)
    ax2.set_title("converged to newest, per domain", fontsize=9)
    fig.colorbar(im, ax=ax2, fraction=0.04)
    fig.suptitle(f"Railyard version drift: {d['hosts']} hosts", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
