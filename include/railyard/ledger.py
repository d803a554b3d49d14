"""The operations ledger: the durable record of which operation holds which hosts.

One operation per host at a time (the `leases` primary key), and taking a domain is one
serialised transaction that checks the buffers and `max_domains_down` before it leases anything.
Leases never expire by time: they are released only after the hosts are back or offboarded.
Every change writes an audit row (who, what, when, why).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import (
    Column,
    Engine,
    Float,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    create_engine,
    event,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

metadata = MetaData()

operations = Table(
    "operations",
    metadata,
    Column("id", String(255), primary_key=True),
    Column("kind", String(32), nullable=False),  # train_stop | emergency | repair
    Column("train", String(128)),
    Column("domain", String(128)),
    Column("state", String(16), nullable=False),  # active | done | aborted
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
    Column("detail", Text, nullable=False, default="{}"),
)

leases = Table(
    "leases",
    metadata,
    Column("host", String(128), primary_key=True),  # one operation per host
    Column("op_id", String(255), nullable=False, index=True),
    Column("domain", String(128), nullable=False),
    Column("since", Float, nullable=False),
    Column("kind", String(32), nullable=False, default="train_stop"),  # repairs are not domains out
)

verifications = Table(
    "verifications",
    metadata,
    Column("op_id", String(255), primary_key=True),
    Column("host", String(128), primary_key=True),
    Column("passed", Integer, nullable=False),
    Column("versions", Text, nullable=False),
    Column("reason", Text),
    Column("at", Float, nullable=False),
)

audit = Table(
    "audit",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("at", Float, nullable=False),
    Column("actor", String(255), nullable=False),
    Column("op_id", String(255)),
    Column("action", String(64), nullable=False),
    Column("hosts", Text, nullable=False, default="[]"),
    Column("reason", Text, nullable=False, default=""),
)

switches = Table(
    "switches",
    metadata,
    Column("name", String(64), primary_key=True),  # e.g. freeze
    Column("value", Integer, nullable=False),
    Column("reason", Text, nullable=False, default=""),
    Column("actor", String(255), nullable=False),
    Column("at", Float, nullable=False),
)

# Operations waiting for capacity, by priority: a waiting emergency is granted before trains.
# A row not refreshed within WAITER_TTL_S is ignored (its sensor is gone); leases never expire.
waiters = Table(
    "waiters",
    metadata,
    Column("op_id", String(255), primary_key=True),
    Column("priority", Integer, nullable=False),
    Column("since", Float, nullable=False),
    Column("seen_at", Float, nullable=False),
)
WAITER_TTL_S = 30.0
PRIORITY = {"train_stop": 10, "emergency": 100}

visits = Table(
    "visits",
    metadata,
    Column("train", String(128), primary_key=True),
    Column("domain", String(128), primary_key=True),
    Column("at", Float, nullable=False),  # fleet clock
    Column("op_id", String(255), nullable=False),
)

# Rollout of each release (railyard.releases): its phase and whether it is halted, and the outcome of
# every host it was applied to (fleet clock), which the phase gates judge.
release_states = Table(
    "release_states",
    metadata,
    Column("release", String(128), primary_key=True),
    Column("phase", String(16), nullable=False),  # canary | staged | fleet
    Column("halted", Integer, nullable=False, default=0),
    Column("reason", Text, nullable=False, default=""),
    Column("actor", String(255), nullable=False),
    Column("promoted_at", Float, nullable=False),  # fleet clock when the phase began
    Column("at", Float, nullable=False),  # wall clock of the last change
)
release_results = Table(
    "release_results",
    metadata,
    Column("release", String(128), primary_key=True),
    Column("host", String(128), primary_key=True),
    Column("op_id", String(255), primary_key=True),
    Column("passed", Integer, nullable=False),
    Column("reason", Text, nullable=False, default=""),
    Column("at", Float, nullable=False),  # fleet clock
)

# One row, bumped first in every lease-changing transaction: serialises writers on SQLite and
# PostgreSQL alike, so the capacity check and the lease insert see the same world.
ledger_lock = Table("ledger_lock", metadata, Column("id", Integer, primary_key=True), Column("n", Integer))


@dataclass(frozen=True)
class Budget:
    """What taking a domain must respect, in hosts."""

    total_hosts: int
    maintenance_hosts: int  # maintenance buffer
    failure_hosts: int  # failure buffer
    max_domains_down: int


@dataclass(frozen=True)
class Decision:
    outcome: str  # granted | wait | stop
    reason: str

    @property
    def granted(self) -> bool:
        return self.outcome == "granted"


def default_url() -> str:
    home = Path(os.environ.get("RAILYARD_HOME", Path.home() / ".railyard"))
    home.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{home / 'ledger.db'}"


def resolve_url(url: str | None = None) -> str:
    """The ledger in force: the config's URL, else RAILYARD_LEDGER_URL, else a SQLite file."""
    return url or os.environ.get("RAILYARD_LEDGER_URL") or default_url()


class Ledger:
    def __init__(self, url: str | None = None):
        self.url = resolve_url(url)
        self.engine: Engine = _make_engine(self.url)
        for attempt in range(10):  # several processes may create the tables at the same moment
            try:
                metadata.create_all(self.engine, checkfirst=True)
                break
            except DBAPIError as exc:
                if "already exists" not in str(exc) or attempt == 9:
                    raise
                time.sleep(0.1)
        with self.engine.begin() as c:
            if c.execute(select(ledger_lock.c.id)).first() is None:
                try:
                    with c.begin_nested():
                        c.execute(insert(ledger_lock).values(id=1, n=0))
                except Exception:  # another process created it first
                    pass

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
    ) -> Decision:
        """Lease every host of `domain` to `op_id`, or say why not.

        Waiting operations of a higher priority (emergencies) go first: a lower one waits while
        one of them is waiting. Hosts held by an operation in `take_over_from` (an emergency over a
        train's stop) are handed over in the same transaction instead of being waited for.

        `budget` is the capacity pool's (the hosts of one SKU, `pool_hosts`; None = the whole fleet).
        `unavailable` are hosts the fleet reports out of service for reasons of its own (failed,
        in repair): they count against the failure buffer, as do hosts leased to repairs.
        Idempotent: an operation that already holds the domain is granted again.
        """
        want = sorted(set(hosts))
        pool = set(pool_hosts) if pool_hosts is not None else None
        in_pool = (lambda h: True) if pool is None else (lambda h: h in pool)  # noqa: E731
        with self.engine.begin() as c:
            _lock(c)
            held = {r.host: r for r in c.execute(select(leases))}
            mine = [h for h in want if h in held and held[h].op_id == op_id]
            if len(mine) == len(want):
                return Decision("granted", f"{op_id} already holds {domain}")
            now = time.time()
            prio = PRIORITY.get(kind, 10)
            ahead = c.execute(
                select(waiters).where(
                    waiters.c.priority > prio, waiters.c.seen_at > now - WAITER_TTL_S, waiters.c.op_id != op_id
                ).order_by(waiters.c.since)
            ).first()
            if ahead is not None:
                return self._wait(c, op_id, prio, now, f"yielding to {ahead.op_id}, waiting since {ahead.since:.0f}")
            takeover = set(take_over_from)
            handed = {h: held[h].op_id for h in want if h in held and held[h].op_id in takeover}
            if handed:
                for h, src in sorted(handed.items()):
                    c.execute(update(leases).where(leases.c.host == h).values(op_id=op_id, kind=kind, since=now))
                    _audit(c, actor, op_id, "handover", [h], f"taken over from {src}")
                    _audit(c, actor, src, "handed_over", [h], f"taken over by {op_id}")
                held = {r.host: r for r in c.execute(select(leases))}
                mine = [h for h in want if h in held and held[h].op_id == op_id]
                if len(mine) == len(want):
                    self._ensure_op(c, op_id, kind, train, domain, now)
                    c.execute(waiters.delete().where(waiters.c.op_id == op_id))
                    return Decision("granted", f"{op_id} took over {len(handed)} host(s) of {domain} from "
                                               f"{', '.join(sorted(set(handed.values())))}")
            others = {h: held[h].op_id for h in want if h in held and held[h].op_id != op_id}
            repairing = {h for h, r in held.items() if r.kind == "repair"}
            if set(others) - repairing:
                holders = sorted({others[h] for h in set(others) - repairing})
                return self._wait(c, op_id, prio, now,
                                  f"{len(set(others) - repairing)} host(s) of {domain} held by {', '.join(holders)}")

            maint = {h: r for h, r in held.items() if r.kind != "repair"}
            domains_out = {r.domain for r in maint.values()}
            if len(domains_out | {domain}) > budget.max_domains_down:
                return self._wait(c, op_id, prio, now,
                                  f"max_domains_down={budget.max_domains_down} reached: {', '.join(sorted(domains_out))} out")
            # Hosts the fleet reports broken and hosts in repair count against the failure buffer.
            broken = {h for h in (set(unavailable) - set(maint)) | repairing if in_pool(h)}
            pool_held = [h for h in maint if in_pool(h)]
            if len(broken) > budget.failure_hosts:
                return Decision(
                    "stop",
                    f"failure buffer exhausted: {len(broken)} hosts broken or in repair > budget {budget.failure_hosts}",
                )
            # Broken hosts inside the domain are not taken again, but still count once.
            taking = [h for h in want if h not in broken and h not in held]
            if len(pool_held) + len(taking) > budget.maintenance_hosts:
                return self._wait(c, op_id, prio, now, f"maintenance buffer: {len(pool_held)} hosts out + "
                                  f"{len(taking)} of {domain} > budget {budget.maintenance_hosts}")
            floor = budget.total_hosts - budget.maintenance_hosts - budget.failure_hosts
            serving_after = budget.total_hosts - len(pool_held) - len(broken) - len(taking)
            if serving_after < floor:
                return self._wait(c, op_id, prio, now, f"serving would drop to {serving_after} < floor {floor}")

            self._ensure_op(c, op_id, kind, train, domain, now)
            c.execute(waiters.delete().where(waiters.c.op_id == op_id))
            if taking:
                c.execute(
                    insert(leases),
                    [{"host": h, "op_id": op_id, "domain": domain, "since": now, "kind": kind} for h in taking],
                )
            _audit(c, actor, op_id, "lease", taking, f"took {domain} for {train}")
            return Decision("granted", f"{op_id} took {domain} ({len(taking)} hosts)")

    @staticmethod
    def _wait(c: Connection, op_id: str, priority: int, now: float, reason: str) -> Decision:
        """Refuse for now, and queue (or refresh) the operation's place among the waiters."""
        row = c.execute(select(waiters.c.op_id).where(waiters.c.op_id == op_id)).first()
        if row is None:
            c.execute(insert(waiters).values(op_id=op_id, priority=priority, since=now, seen_at=now))
        else:
            c.execute(update(waiters).where(waiters.c.op_id == op_id).values(seen_at=now))
        return Decision("wait", reason)

    @staticmethod
    def _ensure_op(c: Connection, op_id: str, kind: str, train: str, domain: str, now: float) -> None:
        if c.execute(select(operations.c.id).where(operations.c.id == op_id)).first() is None:
            c.execute(
                insert(operations).values(
                    id=op_id, kind=kind, train=train, domain=domain, state="active",
                    created_at=now, updated_at=now, detail="{}",
                )
            )
        else:
            c.execute(update(operations).where(operations.c.id == op_id).values(state="active", updated_at=now))

    def waiting(self) -> list[dict]:
        """Operations waiting for capacity, highest priority first (what a waiting operator sees)."""
        with self.engine.connect() as c:
            q = select(waiters).where(waiters.c.seen_at > time.time() - WAITER_TTL_S)
            return [dict(r._mapping) for r in c.execute(q.order_by(waiters.c.priority.desc(), waiters.c.since))]

    def release(self, op_id: str, hosts: Iterable[str] | None = None, *, actor: str = "railyard", reason: str = "") -> list[str]:
        """Release the op's leases (all, or only `hosts`); the op is done when it holds none."""
        with self.engine.begin() as c:
            _lock(c)
            q = select(leases.c.host).where(leases.c.op_id == op_id)
            held = [r.host for r in c.execute(q)]
            drop = sorted(set(held) if hosts is None else set(held) & set(hosts))
            if drop:
                c.execute(leases.delete().where(leases.c.op_id == op_id, leases.c.host.in_(drop)))
                _audit(c, actor, op_id, "release", drop, reason)
            if set(held) <= set(drop):
                c.execute(
                    update(operations)
                    .where(operations.c.id == op_id, operations.c.state == "active")
                    .values(state="done", updated_at=time.time())
                )
            return drop

    def lease_repair(self, op_id: str, host: str, *, domain: str, reason: str, actor: str = "railyard") -> bool:
        """A repair takes one broken host that nobody holds; never refused for capacity (it adds none)."""
        with self.engine.begin() as c:
            _lock(c)
            r = c.execute(select(leases).where(leases.c.host == host)).first()
            if r is not None:
                return r.op_id == op_id
            now = time.time()
            if c.execute(select(operations.c.id).where(operations.c.id == op_id)).first() is None:
                c.execute(insert(operations).values(id=op_id, kind="repair", train=None, domain=domain, state="active",
                                                    created_at=now, updated_at=now, detail=json.dumps({"reason": reason})))
            c.execute(insert(leases).values(host=host, op_id=op_id, domain=domain, since=now, kind="repair"))
            _audit(c, actor, op_id, "lease", [host], f"repair: {reason}")
            return True

    def handover(self, hosts: Iterable[str], from_op: str, to_op: str, *, kind: str, reason: str,
                 actor: str = "railyard", detail: dict | None = None, domain: str | None = None) -> list[str]:
        """Pass leases from one operation to another without releasing them in between."""
        moved: list[str] = []
        with self.engine.begin() as c:
            _lock(c)
            now = time.time()
            if c.execute(select(operations.c.id).where(operations.c.id == to_op)).first() is None:
                c.execute(
                    insert(operations).values(
                        id=to_op, kind=kind, train=None, domain=domain, state="active", created_at=now,
                        updated_at=now, detail=json.dumps(detail or {}),
                    )
                )
            for h in sorted(set(hosts)):
                r = c.execute(select(leases).where(leases.c.host == h)).first()
                if r is not None and r.op_id == from_op:
                    c.execute(update(leases).where(leases.c.host == h).values(op_id=to_op, kind=kind, since=now))
                    moved.append(h)
            if moved:
                _audit(c, actor, to_op, "handover", moved, f"from {from_op}: {reason}")
            left = c.execute(select(func.count()).select_from(leases).where(leases.c.op_id == from_op)).scalar_one()
            if moved and left == 0:
                c.execute(update(operations).where(operations.c.id == from_op).values(state="done", updated_at=now))
        return moved

    def open_operation(self, op_id: str, *, kind: str, detail: dict, actor: str, action: str, reason: str) -> bool:
        """Record an operation once (idempotent: a retried task does not record it twice)."""
        with self.engine.begin() as c:
            _lock(c)
            if c.execute(select(operations.c.id).where(operations.c.id == op_id)).first() is not None:
                return False
            now = time.time()
            c.execute(insert(operations).values(id=op_id, kind=kind, train=None, domain=None, state="active",
                                                created_at=now, updated_at=now, detail=json.dumps(detail)))
            _audit(c, actor, op_id, action, [], reason)
            return True

    def operations_like(self, prefix: str, state: str | None = None) -> list[dict]:
        q = select(operations).where(operations.c.id.startswith(prefix, autoescape=True)).order_by(operations.c.created_at)
        if state is not None:
            q = q.where(operations.c.state == state)
        with self.engine.connect() as c:
            return [dict(r._mapping) | {"detail": json.loads(r.detail or "{}")} for r in c.execute(q)]

    def record_dodge(self, op_id: str, *, train: str, domain: str, until: float, jobs: list[str]) -> bool:
        """Note that a domain's stop is postponed in this run; False if the op already exists."""
        with self.engine.begin() as c:
            _lock(c)
            if c.execute(select(operations.c.id).where(operations.c.id == op_id)).first() is not None:
                return False
            now = time.time()
            c.execute(
                insert(operations).values(
                    id=op_id, kind="train_stop", train=train, domain=domain, state="dodged", created_at=now,
                    updated_at=now, detail=json.dumps({"dodge_until": until, "jobs": jobs}),
                )
            )
            _audit(c, "railyard", op_id, "dodge", [], f"{domain} postponed for {', '.join(jobs)} until {until:.0f}")
            return True

    def mark_for_revisit(self, op_id: str, reason: str, actor: str = "railyard") -> None:
        """A stop that another operation took over comes back in a revisit slot, from scratch:
        a fresh checkpoint request and fresh health verdicts, not the ones of its first attempt."""
        with self.engine.begin() as c:
            _lock(c)
            r = c.execute(select(operations).where(operations.c.id == op_id)).first()
            if r is None:
                return
            detail = json.loads(r.detail or "{}")
            if detail.get("revisit"):
                return
            detail.pop("checkpoint_requested_at", None)
            detail.update(dodge_until=0, revisit=True)
            c.execute(update(operations).where(operations.c.id == op_id).values(
                state="dodged", detail=json.dumps(detail), updated_at=time.time()))
            c.execute(verifications.delete().where(verifications.c.op_id == op_id))
            _audit(c, actor, op_id, "revisit", [], reason)

    def claim_dodged(self, prefix: str, slot: str) -> dict | None:
        """The dodged stop of this run that `slot` revisits (the same one on every retry)."""
        with self.engine.begin() as c:
            _lock(c)
            q = select(operations).where(operations.c.id.startswith(prefix, autoescape=True)).order_by(
                operations.c.created_at
            )
            rows = [r for r in c.execute(q)]
            for r in rows:
                if json.loads(r.detail or "{}").get("slot") == slot:
                    return dict(r._mapping) | {"detail": json.loads(r.detail or "{}")}
            for r in rows:
                d = json.loads(r.detail or "{}")
                if r.state == "dodged" and "slot" not in d:
                    d["slot"] = slot
                    c.execute(update(operations).where(operations.c.id == r.id).values(detail=json.dumps(d)))
                    return dict(r._mapping) | {"detail": d}
        return None

    # ---- switches and visits -------------------------------------------------------------------
    def set_switch(self, name: str, on: bool, *, reason: str, actor: str) -> None:
        with self.engine.begin() as c:
            c.execute(switches.delete().where(switches.c.name == name))
            c.execute(insert(switches).values(name=name, value=int(on), reason=reason, actor=actor, at=time.time()))
            _audit(c, actor, None, f"{name}_{'on' if on else 'off'}", [], reason)

    def switch(self, name: str) -> dict | None:
        """The switch's state when on, else None."""
        with self.engine.connect() as c:
            r = c.execute(select(switches).where(switches.c.name == name)).first()
        return dict(r._mapping) if r is not None and r.value else None

    def record_visit(self, train: str, domain: str, at: float, op_id: str) -> None:
        with self.engine.begin() as c:
            c.execute(visits.delete().where(visits.c.train == train, visits.c.domain == domain))
            c.execute(insert(visits).values(train=train, domain=domain, at=at, op_id=op_id))

    def last_visits(self, train: str) -> dict[str, float]:
        with self.engine.connect() as c:
            return {r.domain: r.at for r in c.execute(select(visits).where(visits.c.train == train))}

    def run_failures(self, prefix: str) -> tuple[int, int, list[str]]:
        """(hosts leased, hosts offboarded, reasons) over every operation of one run."""
        like = audit.c.op_id.startswith(prefix, autoescape=True)
        with self.engine.connect() as c:
            leased: set[str] = set()
            failed: dict[str, str] = {}
            for r in c.execute(select(audit).where(like, audit.c.action.in_(("lease", "offboard")))):
                hosts = json.loads(r.hosts)
                if r.action == "lease":
                    leased.update(hosts)
                else:
                    failed.update({h: r.reason for h in hosts})
        return len(leased), len(failed), [f"{h}: {why}" for h, why in sorted(failed.items())]

    # ---- releases ----------------------------------------------------------------------------
    def release_state(self, release: str) -> dict | None:
        with self.engine.connect() as c:
            r = c.execute(select(release_states).where(release_states.c.release == release)).first()
        return None if r is None else dict(r._mapping)

    def set_release_state(self, release: str, *, phase: str, halted: bool, reason: str, actor: str,
                          fleet_now: float, action: str, promoted: bool = False) -> None:
        """Phase and halt of a release, with an audit row (`action`: release_promote, _halt, _resume...)."""
        with self.engine.begin() as c:
            _lock(c)
            old = c.execute(select(release_states).where(release_states.c.release == release)).first()
            since = fleet_now if promoted or old is None else old.promoted_at
            c.execute(release_states.delete().where(release_states.c.release == release))
            c.execute(insert(release_states).values(release=release, phase=phase, halted=int(halted), reason=reason,
                                                    actor=actor, promoted_at=since, at=time.time()))
            _audit(c, actor, f"release/{release}", action, [], f"{phase}{' HALTED' if halted else ''}: {reason}")

    def record_release_result(self, release: str, host: str, op_id: str, passed: bool, reason: str, at: float) -> None:
        with self.engine.begin() as c:
            c.execute(release_results.delete().where(release_results.c.release == release,
                                                     release_results.c.host == host, release_results.c.op_id == op_id))
            c.execute(insert(release_results).values(release=release, host=host, op_id=op_id, passed=int(passed),
                                                     reason=reason, at=at))

    def release_results(self, release: str) -> list[dict]:
        with self.engine.connect() as c:
            q = select(release_results).where(release_results.c.release == release).order_by(release_results.c.at)
            return [dict(r._mapping) for r in c.execute(q)]

    # ---- records -----------------------------------------------------------------------------
    def record_verification(self, op_id: str, host: str, passed: bool, versions: dict[str, str], reason: str | None) -> None:
        with self.engine.begin() as c:
            c.execute(verifications.delete().where(verifications.c.op_id == op_id, verifications.c.host == host))
            c.execute(
                insert(verifications).values(
                    op_id=op_id, host=host, passed=int(passed), versions=json.dumps(versions, sort_keys=True),
                    reason=reason, at=time.time(),
                )
            )
            _audit(c, "railyard", op_id, "verified" if passed else "check_failed", [host], reason or "")

    def verification(self, op_id: str, host: str) -> tuple[bool, dict[str, str], str | None] | None:
        with self.engine.connect() as c:
            r = c.execute(
                select(verifications).where(verifications.c.op_id == op_id, verifications.c.host == host)
            ).first()
        return None if r is None else (bool(r.passed), json.loads(r.versions), r.reason)

    def detail(self, op_id: str) -> dict:
        op = self.operation(op_id)
        return {} if op is None else json.loads(op["detail"] or "{}")

    def set_detail_once(self, op_id: str, key: str, value: object) -> object:
        """Store `key` on the operation unless already there; returns the stored value.

        Lets a retried task reuse what its first attempt decided (e.g. the checkpoint request time).
        """
        with self.engine.begin() as c:
            _lock(c)
            r = c.execute(select(operations.c.detail).where(operations.c.id == op_id)).first()
            if r is None:
                raise KeyError(f"unknown operation {op_id!r}")
            detail = json.loads(r.detail or "{}")
            if key not in detail:
                detail[key] = value
                c.execute(
                    update(operations).where(operations.c.id == op_id).values(detail=json.dumps(detail), updated_at=time.time())
                )
            return detail[key]

    def note(self, op_id: str | None, action: str, hosts: Iterable[str], reason: str, actor: str = "railyard") -> None:
        with self.engine.begin() as c:
            _audit(c, actor, op_id, action, list(hosts), reason)

    def holdings(self, op_id: str | None = None) -> dict[str, str]:
        """host -> op id, for one operation or all."""
        q = select(leases.c.host, leases.c.op_id)
        if op_id is not None:
            q = q.where(leases.c.op_id == op_id)
        with self.engine.connect() as c:
            return {r.host: r.op_id for r in c.execute(q)}

    def domains_out(self) -> dict[str, str]:
        """domain -> op id holding it."""
        with self.engine.connect() as c:
            return {r.domain: r.op_id for r in c.execute(select(leases.c.domain, leases.c.op_id).distinct())}

    def operation(self, op_id: str) -> dict | None:
        with self.engine.connect() as c:
            r = c.execute(select(operations).where(operations.c.id == op_id)).first()
        return None if r is None else dict(r._mapping)

    def audit_rows(self, op_id: str | None = None, limit: int = 1000) -> list[dict]:
        q = select(audit).order_by(audit.c.id)
        if op_id is not None:
            q = q.where(audit.c.op_id == op_id)
        with self.engine.connect() as c:
            rows = [dict(r._mapping) for r in c.execute(q.limit(limit))]
        for r in rows:
            r["hosts"] = json.loads(r["hosts"])
        return rows

    def audit_count(self) -> int:
        with self.engine.connect() as c:
            return int(c.execute(select(func.count()).select_from(audit)).scalar_one())


def _lock(c: Connection) -> None:
    c.execute(update(ledger_lock).where(ledger_lock.c.id == 1).values(n=ledger_lock.c.n + 1))


def _audit(c: Connection, actor: str, op_id: str | None, action: str, hosts: list[str], reason: str) -> None:
    c.execute(
        insert(audit).values(at=time.time(), actor=actor, op_id=op_id, action=action, hosts=json.dumps(hosts), reason=reason)
    )


def _make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        eng = create_engine(url, connect_args={"timeout": 60})

        @event.listens_for(eng, "connect")
        def _pragmas(dbapi_conn, _record):  # noqa: ANN001
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA busy_timeout=60000")
            cur.close()

        return eng
    return create_engine(url, pool_pre_ping=True)
