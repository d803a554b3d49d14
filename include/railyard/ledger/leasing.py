"""Leases: taking a domain (`acquire_domain`, one serialised decision over the buffers and `max_domains_down`),
releasing and handing hosts over, and the line of operations waiting for capacity."""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import (
    insert,
    select,
    update,
)
from sqlalchemy.engine import Connection

from railyard.domain.models import Budget, Decision
from railyard.ledger import pg as ledger_pg
from railyard.ledger.base import LedgerBase
from railyard.ledger.schema import (
    PRIORITY,
    WAITER_TTL_S,
    _audit,
    _audit_row,
    _host_set,
    _lock,
    _q,
    _run,
    among,
    audit,
    leases,
    operations,
    waiters,
)

# At most this many unavailable hosts have their leases read by `acquire_domain`; beyond, they are
# counted without looking (an upper bound), and a refusal is judged again on every lease.
_LOOKUP_MAX = 2000


@dataclass
class _View:
    """What `acquire_domain` decides on, read in one query under the lock."""

    rows: dict[str, tuple[str, str]] = field(default_factory=dict)  # host -> (op id, kind), for the hosts asked
    domains_out: set[str] = field(default_factory=set)  # domains with a lease that is not a repair
    n_maint: int = 0  # leases that are not repairs
    n_repair: int = 0  # leases to repairs
    ahead: tuple[str, float] | None = None  # the first live waiter of a higher priority: (op id, since)
    waiting: bool = False  # the operation has a row among the waiters
    op_exists: bool = False  # the operation is recorded


def _lock_and_read_view(c: Connection, ops: Collection[str], op_id: str, priority: int, now: float,
                        hosts: Sequence[str]) -> _View:
    """`_lock(c, ops)` then `_read_view`, in one round trip on PostgreSQL with psycopg2 (`_run`)."""
    params = _view_params(op_id, priority, now, hosts) | {"l_ops": sorted(set(ops))}
    return _view_of(_run(c, ["lock", "ops_lock", "view_any"], params))


def _view_params(op_id: str, priority: int, now: float, hosts: Sequence[str]) -> dict[str, Any]:
    return {"v_op": op_id, "v_prio": priority, "v_cutoff": now - WAITER_TTL_S, "v_hosts": list(hosts)}


def _read_view(c: Connection, op_id: str, priority: int, now: float, hosts: Sequence[str]) -> _View:
    """One round trip: the leases of `hosts`, lease counts per kind and domain, the waiter ahead, and
    whether the operation is recorded and waiting. Rows are tagged; every part is a key lookup or
    an aggregate, so what comes back does not grow with the leases other operations hold."""
    return _view_of(_run(c, ["view_any"], _view_params(op_id, priority, now, hosts)))


def _view_of(result: Iterable[Any]) -> _View:
    v = _View()
    for t, a, b, k, n in result:
        if t == "w":
            v.rows[a] = (b, k)
        elif t == "m":
            v.domains_out.add(a)
            v.n_maint += int(n)
        elif t == "r":
            v.n_repair = int(n or 0)
        elif t == "a":
            v.ahead = (a, float(n))
        elif t == "q":
            v.waiting = True
        elif t == "o":
            v.op_exists = True
    return v


def _judge(budget: Budget, domain: str, taking: list[str], n_broken: int, n_held: int) -> tuple[str, str] | None:
    """The buffer checks of `acquire_domain`, in order: None when they pass, else (outcome, reason)."""
    if n_broken > budget.failure_hosts:
        return "stop", (f"failure buffer exhausted: {n_broken} hosts broken, in repair or out with no lease > budget "
                        f"{budget.failure_hosts}")
    if n_held + len(taking) > budget.maintenance_hosts:
        return "wait", (f"maintenance buffer: {n_held} hosts out + {len(taking)} of {domain} > budget "
                        f"{budget.maintenance_hosts}")
    floor = budget.total_hosts - budget.maintenance_hosts - budget.failure_hosts
    serving_after = budget.total_hosts - n_held - n_broken - len(taking)
    if serving_after < floor:
        return "wait", f"serving would drop to {serving_after} < floor {floor}"
    return None


@dataclass(frozen=True)
class Ask:
    """What `acquire_domain` is asked, with everything that needs no database worked out."""

    op_id: str
    domain: str
    want: list[str]  # the domain's hosts, sorted
    budget: Budget
    pool: Collection[str] | None  # the capacity pool's hosts (None: the whole fleet)
    unavail: set[str]  # hosts the fleet reports out of service by itself
    u_pool: list[str]  # of those, the ones in the pool
    u_known: bool  # the lease of every one of `u_pool` is in the view (not too many to look up)
    takeover: set[str]  # operations whose hosts this one takes over (an emergency over a train's stop)
    probe: bool


@dataclass(frozen=True)
class Verdict:
    """What to do: `held` (granted already), `wait`, `stop`, `free` (a probe that would be granted), `grant`
    (lease `taking`; None: a takeover left nothing to lease), or, before deciding, `take_over` (move
    `handed`'s hosts from their operations, then decide again) or `judge_again` (count every lease exactly)."""

    act: str
    reason: str = ""
    taking: list[str] | None = None
    handed: dict[str, str] = field(default_factory=dict)


def decide(ask: Ask, v: _View, *, taken_over: dict[str, str] | None = None,
           exact: tuple[int, int] | None = None) -> Verdict:
    """The acquire decision, with no database: the steps, in order, that the PL/pgSQL function
    `railyard_acquire` (railyard.ledger.pg) follows too, with the same messages. `taken_over`: the hosts this
    operation just took over (the view read again since); `exact`: (broken, held) counted on every lease, for
    a refusal the view's bounds gave."""
    rows, op_id, domain, budget = v.rows, ask.op_id, ask.domain, ask.budget
    # 1. the domain is this operation's already (or is now, after a takeover)
    if all(h in rows and rows[h][0] == op_id for h in ask.want):
        if taken_over:
            return Verdict("grant", f"{op_id} took over {len(taken_over)} host(s) of {domain} from "
                                    f"{', '.join(sorted(set(taken_over.values())))}", taking=None)
        return Verdict("held", f"{op_id} already holds {domain}")
    if taken_over is None:
        # 2. an operation of a higher priority waits first
        if v.ahead is not None:
            return Verdict("wait", f"yielding to {v.ahead[0]}, waiting since {v.ahead[1]:.0f}")
        # 3. hosts of an operation this one takes over are handed over, not waited for
        handed = {h: rows[h][0] for h in ask.want if h in rows and rows[h][0] in ask.takeover}
        if handed:
            return Verdict("free", f"{domain} can be taken now") if ask.probe else Verdict("take_over", handed=handed)
    # 4. hosts held by another operation (but a repair's) are waited for
    others = {h: rows[h][0] for h in ask.want if h in rows and rows[h][0] != op_id}
    blocking = sorted(h for h in others if rows[h][1] != "repair")
    if blocking:
        holders = sorted({others[h] for h in blocking})
        return Verdict("wait", f"{len(blocking)} host(s) of {domain} held by {', '.join(holders)}")
    # 5. at most max_domains_down domains out
    if len(v.domains_out | {domain}) > budget.max_domains_down:
        return Verdict("wait", f"max_domains_down={budget.max_domains_down} reached: "
                               f"{', '.join(sorted(v.domains_out))} out")
    # 6. the buffers. Broken hosts inside the domain are not taken again, but still count once. Hosts the fleet
    # reports broken and hosts in repair count against the failure buffer. From the counts alone these figures
    # are exact for the whole fleet, and upper bounds for a pool (a lease outside the pool counts too). The
    # checks only refuse more as the figures grow, so a grant on the bounds is the grant the exact figures
    # give; a refusal on the bounds is judged again on the leases themselves, so that its outcome and its
    # message are the exact ones.
    pool, unavail = ask.pool, ask.unavail
    taking = [h for h in ask.want if h not in rows and not (h in unavail and (pool is None or h in pool))]
    if exact is not None:
        verdict = _judge(budget, domain, taking, *exact)
    else:
        n_broken = sum(1 for h in ask.u_pool if h not in rows) if ask.u_known else len(ask.u_pool)
        verdict = _judge(budget, domain, taking, n_broken + v.n_repair, v.n_maint)
        if verdict is not None and not (pool is None and ask.u_known):
            return Verdict("judge_again")
    if verdict is not None:
        return Verdict(verdict[0], verdict[1])
    # 7. granted (a probe leases nothing)
    if ask.probe:
        return Verdict("free", f"{domain} can be taken now")
    return Verdict("grant", f"{op_id} took {domain} ({len(taking)} hosts)", taking=taking)


def _write_grant(c: Connection, v: _View, *, op_id: str, kind: str, train: str, domain: str, now: float,
                 taking: list[str] | None, actor: str = "railyard") -> None:
    """What a grant writes: the operation (new, or active again), off the waiters, its new leases and
    the audit row (`taking` None: a takeover that left nothing to lease, which writes neither)."""
    parts = ["op_active" if v.op_exists else "op_insert"] + (["waiter_drop"] if v.waiting else [])
    params: dict[str, Any] = {"o_id": op_id, "o_kind": kind, "o_train": train, "o_domain": domain, "o_now": now,
                              "x_op": op_id}
    if taking is not None:
        parts += (["lease_insert"] if taking else []) + ["audit"]
        params |= {"l_hosts": taking, "l_op": op_id, "l_domain": domain, "l_since": now, "l_kind": kind}
        params |= _audit_row(now, actor, op_id, "lease", taking, f"took {domain} for {train}", prefix="a_")
    _run(c, [tuple(parts)], params)


class Leases(LedgerBase):
    # ---- the atomic step ---------------------------------------------------------------------
    def acquire_domain(
        self,
        op_id: str,
        *,
        train: str,
        domain: str,
        hosts: list[str],
        budget: Budget,
        pool_hosts: Iterable[str] | None = None,
        unavailable: Iterable[str] = (),
        actor: str = "railyard",
        kind: str = "train_stop",
        take_over_from: Iterable[str] = (),
        probe: bool = False,
    ) -> Decision:
        """Lease every host of `domain` to `op_id`, or say why not.

        `probe`: decide, but lease nothing: "free" instead of "granted" (the operation keeps its place
        among the waiters). A trigger probes; only the task it resumes takes the lease.

        Waiting operations of a higher priority (emergencies) go first: a lower one waits while
        one of them is waiting. Hosts held by an operation in `take_over_from` (an emergency over a
        train's stop) are handed over in the same transaction instead of being waited for.

        `budget` is the capacity pool's (the hosts of one SKU, `pool_hosts`; None = the whole fleet).
        `unavailable` are hosts the fleet reports out of service for reasons of its own (failed,
        in repair): they count against the failure buffer, as do hosts leased to repairs.
        Idempotent: an operation that already holds the domain is granted again.
        """
        # Everything that needs no database is done before the lock is taken.
        want = sorted(set(hosts))
        pool = _host_set(pool_hosts)
        unavail = set(unavailable)
        u_pool = [h for h in unavail if pool is None or h in pool]
        u_known = len(u_pool) <= _LOOKUP_MAX  # the lease of every unavailable host in the pool is read
        takeover = set(take_over_from)
        prio = PRIORITY.get(kind, 10)
        if self._pg is not None:  # the same steps on the server, in one round trip (railyard.ledger.pg)
            now = self.clock()
            got = ledger_pg.acquire(
                self._pg, op_id=op_id, train=train, domain=domain, kind=kind, actor=actor,
                priority=prio, now=now, cutoff=now - WAITER_TTL_S, want=want,
                skip=[h for h in want if h in unavail and (pool is None or h in pool)],
                u_pool=u_pool if u_known else [], n_u_pool=len(u_pool), u_known=u_known,
                exact=pool is None and u_known, takeover=sorted(takeover), budget=budget, probe=probe)
            if got is not None:
                return Decision(*got)
        look = sorted(set(want) | set(u_pool)) if u_known else want
        ask = Ask(op_id=op_id, domain=domain, want=want, budget=budget, pool=pool, unavail=unavail, u_pool=u_pool,
                  u_known=u_known, takeover=takeover, probe=probe)
        with self.engine.begin() as c:
            now = self.clock()
            v = _lock_and_read_view(c, [op_id, *takeover], op_id, prio, now, look)
            taken_over: dict[str, str] | None = None
            exact: tuple[int, int] | None = None
            while True:
                d = decide(ask, v, taken_over=taken_over, exact=exact)
                if d.act == "take_over":
                    moved = sorted(d.handed)
                    c.execute(update(leases).where(among(c, leases.c.host, moved)).values(op_id=op_id, kind=kind,
                                                                                          since=now))
                    c.execute(insert(audit), [
                        _audit_row(now, actor, o, a, [h], r) for h in moved
                        for o, a, r in ((op_id, "handover", f"taken over from {d.handed[h]}"),
                                        (d.handed[h], "handed_over", f"taken over by {op_id}"))
                    ])
                    v, taken_over = _read_view(c, op_id, prio, now, look), d.handed
                elif d.act == "judge_again":
                    maint: set[str] = set()
                    repairing: set[str] = set()
                    for r in c.execute(select(leases.c.host, leases.c.kind)):
                        (repairing if r.kind == "repair" else maint).add(r.host)
                    broken = {h for h in (unavail - maint) | repairing if pool is None or h in pool}
                    exact = (len(broken), sum(1 for h in maint if pool is None or h in pool))
                else:
                    break
            if d.act == "held":
                return Decision("granted", d.reason)
            if d.act == "stop":
                return Decision("stop", d.reason)
            if d.act == "wait":
                return self._wait(c, op_id, prio, now, d.reason, waiting=v.waiting)
            if d.act == "free":
                return self._free(c, op_id, prio, now, domain, v.waiting)
            _write_grant(c, v, op_id=op_id, kind=kind, train=train, domain=domain, now=now, taking=d.taking,
                         actor=actor)
            return Decision("granted", d.reason)

    @classmethod
    def _free(cls, c: Connection, op_id: str, priority: int, now: float, domain: str, waiting: bool) -> Decision:
        """A probe that would be granted: keep the operation's place in line, lease nothing."""
        cls._wait(c, op_id, priority, now, "", waiting=waiting)
        return Decision("free", f"{domain} can be taken now")

    @staticmethod
    def _wait(c: Connection, op_id: str, priority: int, now: float, reason: str, *,
              waiting: bool | None = None) -> Decision:
        """Refuse for now, and queue (or refresh) the operation's place among the waiters."""
        if waiting is None:
            waiting = c.execute(select(waiters.c.op_id).where(waiters.c.op_id == op_id)).first() is not None
        _run(c, ["waiter_seen" if waiting else "waiter_insert"], {"w_op": op_id, "w_prio": priority, "w_now": now})
        if not waiting and reason:  # when the wait began, and why: the run report's wait for capacity
            _audit(c, now, "railyard", op_id, "wait", [], reason)
        return Decision("wait", reason)

    def waiting(self) -> list[dict[str, Any]]:
        """Operations waiting for capacity, highest priority first (what a waiting operator sees)."""
        with self.engine.connect() as c:
            q = select(waiters).where(waiters.c.seen_at > self.clock() - WAITER_TTL_S)
            return [dict(r._mapping) for r in c.execute(q.order_by(waiters.c.priority.desc(), waiters.c.since))]

    def release(self, op_id: str, hosts: Iterable[str] | None = None, *, actor: str = "railyard",
                reason: str = "") -> list[str]:
        """Release the op's leases (all, or only `hosts`); the op is done when it holds none.

        On PostgreSQL a release does not wait for the ledger lock: it only gives capacity back (a
        concurrent decision that still sees the lease errs on the safe side), and the lock on the
        operation's own row serialises it with everything that changes this operation's leases."""
        only = None if hosts is None else set(hosts)
        if self._pg is not None:  # the same steps on the server, in one round trip (railyard.ledger.pg)
            dropped = ledger_pg.release(self._pg, op_id=op_id, only=only, actor=actor, reason=reason,
                                        now=self.clock())
            if dropped is not None:
                return dropped
        with self.engine.begin() as c:
            pg = c.dialect.name == "postgresql"
            held = [r[0] for r in _run(c, ["op_row_lock" if pg else "lock", "held"], {"r_op": op_id})]
            drop = sorted(set(held) if only is None else set(held) & only)
            done = set(held) <= set(drop)
            parts = (["drop_all" if len(drop) == len(held) else "drop_some_any", "audit"] if drop else []) + (
                ["op_done"] if done else [])
            params: dict[str, Any] = {"d_op": op_id, "d_hosts": drop, "u_op": op_id, "u_now": self.clock()}
            if drop:
                params |= _audit_row(self.clock(), actor, op_id, "release", drop, reason, prefix="a_")
            if parts:
                _run(c, [tuple(parts)], params)
            return drop

    def lease_repair(self, op_id: str, host: str, *, domain: str, reason: str, actor: str = "railyard",
                     detail: dict[str, Any] | None = None) -> bool:
        """A repair takes one broken host that nobody holds; never refused for capacity (it adds none).
        `detail` (the targets its gate brings it to) is recorded with the operation."""
        with self.engine.begin() as c:
            _lock(c)
            r = c.execute(select(leases.c.op_id).where(leases.c.host == host)).first()
            if r is not None:
                return bool(r.op_id == op_id)
            now = self.clock()
            if c.execute(select(operations.c.id).where(operations.c.id == op_id)).first() is None:
                c.execute(insert(operations).values(
                    id=op_id, kind="repair", train=None, domain=domain, state="active", created_at=now,
                    updated_at=now, detail=json.dumps({"reason": reason, **(detail or {})})))
            c.execute(insert(leases).values(host=host, op_id=op_id, domain=domain, since=now, kind="repair"))
            _audit(c, self.clock(), actor, op_id, "lease", [host], f"repair: {reason}")
            return True

    def handover(self, hosts: Iterable[str], from_op: str, to_op: str, *, kind: str, reason: str,
                 actor: str = "railyard", detail: dict[str, Any] | None = None, domain: str | None = None) -> list[str]:
        """Pass leases from one operation to another without releasing them in between."""
        want = set(hosts)
        with self.engine.begin() as c:
            _lock(c, ops=[from_op, to_op])
            now = self.clock()
            if c.execute(select(operations.c.id).where(operations.c.id == to_op)).first() is None:
                c.execute(
                    insert(operations).values(
                        id=to_op, kind=kind, train=None, domain=domain, state="active", created_at=now,
                        updated_at=now, detail=json.dumps(detail or {}),
                    )
                )
            held = [r.host for r in c.execute(_q("held"), {"r_op": from_op})]
            moved = sorted(h for h in held if h in want)
            if moved:
                c.execute(update(leases).where(among(c, leases.c.host, moved), leases.c.op_id == from_op)
                          .values(op_id=to_op, kind=kind, since=now))
                _audit(c, self.clock(), actor, to_op, "handover", moved, f"from {from_op}: {reason}")
                if len(moved) == len(held) and from_op != to_op:  # from_op holds nothing any more
                    c.execute(update(operations).where(operations.c.id == from_op).values(state="done", updated_at=now))
        return moved
