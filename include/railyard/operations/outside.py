"""Disruptive work from outside Railyard (a NIC replaced, a pod's network worked on, a vendor's tool) through
the same ledger: requested, queued like any operation, its hosts' jobs checkpointed and the hosts drained,
handed to the requester, and taken back only through the deep health check.

An outside operation is a `Stop` of kind "outside" over its own hosts (one domain at a time): it waits for
the buffers and `max_domains_down` as a train's stop does (its domain counts as out), and for a freeze; it
installs nothing, and its check must find each host at the versions it had when it was handed over.
Hosts that fail go to repair with the evidence. A requester that vanishes leaves an active operation: past
its deadline the reconciler escalates it (never a silent release); `railyard lease release` applies."""

from __future__ import annotations

import difflib
import json
import re
import time
import uuid
from collections.abc import Callable
from typing import Any

from railyard.domain.config import RailyardConfig, TrainSpec
from railyard.domain.models import HostState
from railyard.fleet.port import Fleet
from railyard.ledger import Ledger
from railyard.operations.emergency import MAX_TEXT, shown
from railyard.operations.stop import Stop, StopError

KIND = re.compile(r"^[a-z][a-z0-9-]{1,31}$")  # hw-repair, network, nhc-remediation, ...
MIN_REASON = 10
KIND_OF_OP = "outside"


class OutsideError(ValueError):
    """A request refused before anything is touched; each problem names its field and value."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


def parse_request(config: RailyardConfig, *, hosts: list[str], kind: str, reason: str,
                  deadline_h: float | None = None) -> dict[str, Any]:
    """The request, checked: hosts of the config (a near miss is named with what it resembles), all in one
    domain; a kind token; a reason of 10 to 1,000 characters; a positive deadline."""
    problems: list[str] = []
    owner = config.host_domain()
    if not hosts:
        problems.append("hosts: name at least one host")
    for i, h in enumerate(hosts):
        if h not in owner:
            near = [k for k in owner if _fold(k) == _fold(h)] or difflib.get_close_matches(h, list(owner), n=1,
                                                                                          cutoff=0.8)
            problems.append(f"hosts[{i}]: unknown host {shown(h)}" + (f" (did you mean {near[0]!r}?)" if near else ""))
    if len(set(hosts)) != len(hosts):
        problems.append(f"hosts: named twice: {', '.join(sorted({h for h in hosts if hosts.count(h) > 1}))}")
    domains = sorted({owner[h] for h in hosts if h in owner})
    if len(domains) > 1:
        problems.append(f"hosts: span domains {', '.join(domains)}: request the hosts of one domain at a time")
    if not KIND.match(kind or ""):
        problems.append(f"kind: a token of 2 to 32 lower-case letters, digits and '-' (value: {shown(kind)})")
    text = (reason or "").strip()
    if not MIN_REASON <= len(text) <= MAX_TEXT:
        problems.append(f"reason: say why in {MIN_REASON} to {MAX_TEXT} characters (value: {shown(reason)})")
    if deadline_h is not None and not 0 < deadline_h <= 24 * 30:
        problems.append(f"deadline_h: more than 0 and at most 720 hours (value: {deadline_h})")
    if problems:
        raise OutsideError(problems)
    return {"hosts": sorted(hosts), "domain": domains[0], "kind": kind, "reason": text, "deadline_h": deadline_h}


_CONFUSABLE = str.maketrans({"l": "1", "i": "1", "o": "0", "_": "-"})


def _fold(name: str) -> str:
    """A host name with the characters people confuse made one (l, I and 1; O and 0; _ and -)."""
    return name.lower().translate(_CONFUSABLE)


def _train(req: dict[str, Any]) -> TrainSpec:
    """The train an outside operation behaves as: no release, no dodge, never halted by failures."""
    return TrainSpec.model_construct(id=f"outside-{req['kind']}", releases=[], max_failure_fraction=1.0,
                                     max_dodges=0, description="outside work")


def open_request(config: RailyardConfig, ledger: Ledger, req: dict[str, Any], *, actor: str) -> str:
    """Record the request (audited with the requester); its operation id."""
    return open_request_as(config, ledger, req, op_id=f"outside/{req['kind']}/{uuid.uuid4().hex[:10]}/{req['domain']}",
                           actor=actor)


def open_request_as(config: RailyardConfig, ledger: Ledger, req: dict[str, Any], *, op_id: str, actor: str) -> str:
    """`open_request` under a given id (a DAG's lease task: its run's own); a request already there is kept."""
    deadline = None if req["deadline_h"] is None else time.time() + req["deadline_h"] * 3600
    ledger.open_operation(op_id, kind=KIND_OF_OP, detail={"request": req, "actor": actor, "deadline_at": deadline,
                                                          "phase": "queued"},
                          actor=actor, action="outside_request",
                          reason=f"{req['kind']}: {req['reason']} | hosts {', '.join(req['hosts'])}")
    return op_id


def stop_of(config: RailyardConfig, fleet: Fleet, ledger: Ledger, op_id: str, **kw: Any) -> Stop:
    op = ledger.operation(op_id)
    if op is None or op["kind"] != KIND_OF_OP:
        raise OutsideError([f"op: no outside operation {shown(op_id)} (`railyard ops` lists them)"])
    detail = json.loads(op["detail"] or "{}")
    req = detail["request"]
    kw.setdefault("actor", f"outside:{detail['actor']}")  # or whoever acts on it by hand
    return Stop(config=config, train=_train(req), domain=config.domain(req["domain"]), op_id=op_id, fleet=fleet,
                ledger=ledger, kind=KIND_OF_OP, scope=list(req["hosts"]), **kw)


PHASES = ("queued", "checkpointing", "handed", "returning", "returned")


def phase(ledger: Ledger, op_id: str) -> str:
    return str(ledger.detail(op_id).get("phase", "queued"))


def advance(stop: Stop) -> dict[str, Any]:
    """One step towards handing the hosts over, never blocking: take them (or say why not yet), ask their
    jobs to checkpoint, and once every job has, drain, record each host's versions and hand over.
    {"phase": "queued" | "checkpointing", "why": ...} while it waits; {"phase": "handed", "hosts": [...]} once the
    requester may work; {"phase": "withdrawn"} when the requester gave up before that. Idempotent, and safe to
    run again after a crash between any two of its calls: each step finds what the last one left."""
    led, op_id = stop.ledger, stop.op_id
    detail = led.detail(op_id)
    if detail.get("phase") in ("handed", "returning"):
        return {"phase": "handed", "hosts": stop.held()}
    if (led.operation(op_id) or {}).get("state") == "done":
        return {"phase": "withdrawn"} if detail.get("phase") != "returned" else {"phase": "returned"}
    if detail.get("return_asked"):  # given up over the page before the hosts were drained
        return withdraw(stop, reason=str(detail["return_asked"].get("reason") or "withdrawn"))
    if not stop.held():
        d = stop.take()
        if not d.granted:
            led.set_detail(op_id, "why", d.reason)  # for `op status` and the page (a freeze writes no waiter)
            return {"phase": "queued", "why": d.reason}
    _jobs, since = stop.request_checkpoints()  # asked once; a retry finds the first request's time
    asked = float(led.set_detail_once(op_id, "checkpoint_asked_wall", time.time()))  # type: ignore[arg-type]
    led.set_detail(op_id, "phase", "checkpointing")
    stop.enforce_checkpoint_policy(since)
    stale = stop.stale_jobs(since)
    if stale:
        waited = time.time() - asked
        if waited > stop.timeouts.checkpoint_wait_s:
            raise StopError(f"{op_id}: jobs did not checkpoint within checkpoint_wait_s="
                            f"{stop.timeouts.checkpoint_wait_s:.0f}s: {', '.join(stale)}; the hosts are held, "
                            "not drained: run it again, or `railyard lease release` the request")
        led.set_detail(op_id, "why", f"waiting for checkpoints of {', '.join(stale)}")
        return {"phase": "checkpointing", "why": f"waiting {waited:.0f}s so far for checkpoints of {', '.join(stale)}"}
    stop.drain()
    held = stop.held()
    led.record_versions_before(op_id, {h.name: h.versions for h in stop.fleet.hosts(held)})
    led.set_detail(op_id, "phase", "handed")
    led.note(op_id, "handed_to_requester", held, "drained; the requester works on them now", actor=stop.actor)
    return {"phase": "handed", "hosts": held}


def withdraw(stop: Stop, *, reason: str) -> dict[str, Any]:
    """The requester gives up before the hosts were handed over: a lease granted but not yet drained (its jobs
    were only asked to checkpoint) is released, the hosts untouched, and the operation finished."""
    if phase(stop.ledger, stop.op_id) in ("handed", "returning"):
        raise OutsideError([f"op: {stop.op_id} was handed over already: return its hosts through the check"])
    held = stop.held()
    untouched = [h.name for h in stop.fleet.hosts(held) if h.state == HostState.SERVING] if held else []
    if len(untouched) != len(held):  # a drain began (a crash in it): only the check may bring them back
        raise OutsideError([f"op: {stop.op_id} has hosts out of service already: return them through the check"])
    if held:
        stop.ledger.release(stop.op_id, actor=stop.actor, reason=f"withdrawn before the drain: {reason.strip()}")
    stop.ledger.finish_operation(stop.op_id, reason=f"withdrawn by the requester: {reason.strip()}",
                                 actor=stop.actor)
    stop.ledger.set_detail(stop.op_id, "phase", "withdrawn")
    return {"phase": "withdrawn"}


def wait_handed(stop: Stop, *, say: Callable[[str], None], poll_s: float = 5.0,
                timeout_s: float | None = None) -> dict[str, Any]:
    """`advance` until the hosts are handed over, saying who holds what each time the reason changes."""
    end = None if timeout_s is None else time.monotonic() + timeout_s
    last = None
    while True:
        out = advance(stop)
        if out["phase"] not in ("queued", "checkpointing"):
            return out
        why = out["why"] if out["phase"] == "queued" else "waiting for checkpoints"
        if why != last:
            say(f"{stop.op_id}: {out['why']}" if out["phase"] == "checkpointing" else f"{stop.op_id}: waiting: {why}")
            last = why
        if end is not None and time.monotonic() > end:
            return out
        stop.sleep(poll_s)


def check_return(ledger: Ledger, op_id: str, held: set[str], to_repair: list[str], reason: str) -> list[str]:
    """What is wrong with a return of `to_repair` for `reason` (field and value); [] when it may go ahead."""
    problems = []
    bad = [h for h in to_repair if h not in held]
    if bad:
        problems.append(f"to_repair: not held by {op_id}: {', '.join(shown(h) for h in bad)}")
    if not MIN_REASON <= len((reason or "").strip()) <= MAX_TEXT:
        problems.append(f"reason: say why in {MIN_REASON} to {MAX_TEXT} characters (value: {shown(reason)})")
    return problems


def ask_return(ledger: Ledger, op_id: str, *, to_repair: list[str], reason: str, actor: str) -> dict[str, Any]:
    """The requester is done (or gives up while queued), said where no host can be reached (the page's API):
    recorded, audited with the user, for the operation's driver (the `railyard_outside` DAG) to carry out."""
    st = status(ledger, op_id)
    if st["state"] != "active":
        raise OutsideError([f"op: {op_id} is {st['phase']} already"])
    if ledger.detail(op_id).get("return_asked"):
        raise OutsideError([f"op: {op_id}: its return was asked already"])
    problems = check_return(ledger, op_id, set(st["held"]), to_repair, reason)
    if st["phase"] not in ("handed",) and to_repair:
        problems.append(f"to_repair: {op_id} is {st['phase']}, not handed over: nothing to send to repair")
    if problems:
        raise OutsideError(problems)
    ask = {"to_repair": sorted(to_repair), "reason": reason.strip(), "actor": actor, "at": time.time()}
    ledger.set_detail(op_id, "return_asked", ask)
    ledger.note(op_id, "return_asked", sorted(to_repair) or st["held"],
                f"by {actor}: {reason.strip()}" + (f"; to repair: {', '.join(sorted(to_repair))}" if to_repair else ""),
                actor=actor)
    return status(ledger, op_id)


def give_back(stop: Stop, *, to_repair: list[str], reason: str) -> dict[str, Any]:
    """The requester is done: hosts it names go to repair with its reason; the rest are checked at the
    versions they had when handed over; those that pass go back to service, the others to repair.
    Before the handover, the request is withdrawn instead (nothing was drained)."""
    ph = phase(stop.ledger, stop.op_id)
    state = (stop.ledger.operation(stop.op_id) or {}).get("state")
    if state != "active" and not stop.held():  # returned already (a retry, or another way in did it)
        return {"checked": 0, "passed": 0, "returned": 0, "to_repair": []}
    if ph not in ("handed", "returning") and state == "active":
        if to_repair:
            raise OutsideError([f"to_repair: {stop.op_id} is {ph}, not handed over: nothing to send to repair"])
        withdraw(stop, reason=reason)
        return {"checked": 0, "passed": 0, "returned": 0, "to_repair": []}
    held = set(stop.held())
    problems = check_return(stop.ledger, stop.op_id, held, to_repair, reason)
    if problems:
        raise OutsideError(problems)
    stop.ledger.set_detail(stop.op_id, "phase", "returning")
    seen = set(stop.offboarded())
    for h in to_repair:
        stop.offboard(h, f"returned to repair by the requester: {reason.strip()}", seen)
    checked = stop.check() if set(stop.held()) - set(to_repair) else {"checked": 0, "passed": 0, "offboarded": []}
    out = stop.return_hosts()
    stop.ledger.set_detail(stop.op_id, "phase", "returned")
    return {"checked": checked["checked"], "passed": checked["passed"], "returned": out["returned"],
            "to_repair": sorted(set(out["offboarded"]) | set(to_repair))}


def status(ledger: Ledger, op_id: str) -> dict[str, Any]:
    """What a requester sees of its operation (a read)."""
    op = ledger.operation(op_id)
    if op is None or op["kind"] != KIND_OF_OP:
        raise OutsideError([f"op: no outside operation {shown(op_id)} (`railyard ops` lists them)"])
    detail = json.loads(op["detail"] or "{}")
    line = [w["op_id"] for w in ledger.waiting()]  # emergencies first, then by arrival
    phase_now = detail.get("phase", "queued")
    if op["state"] == "done" and phase_now not in ("withdrawn", "returned"):
        phase_now = "returned"
    last_wait = detail.get("why") or next((r["reason"] for r in reversed(ledger.audit_rows(op_id, limit=None,
                                                                                           action="wait"))), None)
    return {"op": op_id, "state": op["state"], "phase": phase_now, "request": detail["request"],
            "requester": detail.get("actor"), "deadline_at": detail.get("deadline_at"),
            "held": sorted(ledger.holdings(op_id)), "waiting": op_id in line,
            "place": line.index(op_id) + 1 if op_id in line else None,
            "why": last_wait if phase_now in ("queued", "checkpointing") else None,
            "return_asked": detail.get("return_asked"), "escalated": detail.get("escalated") is not None,
            "domains_out": ledger.domains_out()}


def overdue(ledger: Ledger, now: float, *, active: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Active outside operations past their deadline that were not escalated yet (of `active`, when the caller
    has just read them)."""
    out = []
    for op in ledger.active_operations() if active is None else active:
        if op["kind"] != KIND_OF_OP:
            continue
        d = op["detail"]
        if d.get("deadline_at") is not None and now > float(d["deadline_at"]) and not d.get("escalated"):
            out.append(op | {"detail": d})
    return out


def describe_status(st: dict[str, Any]) -> str:
    r = st["request"]
    lines = [f"{st['op']}: {st['phase'].upper()} ({r['kind']}, for {st['requester']}): {r['reason']}",
             f"  hosts: {', '.join(r['hosts'])} in {r['domain']}; held now: {', '.join(st['held']) or 'none'}"]
    if st["phase"] == "queued":
        place = f" (place {st['place']} in line)" if st.get("place") else ""
        lines.append(f"  waiting{place}: {st['why'] or 'not yet asked'}; domains out: "
                     + (", ".join(f"{d} ({o})" for d, o in sorted(st["domains_out"].items())) or "none"))
    if st["deadline_at"]:
        lines.append(f"  deadline: {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(st['deadline_at']))}")
    return "\n".join(lines)
