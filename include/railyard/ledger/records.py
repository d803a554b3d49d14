"""What a later task needs besides leases: operations and their details, dodges and revisits, switches,
visits, capacity samples, release phases and results, verifications."""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Mapping
from typing import Any

from sqlalchemy import (
    delete,
    func,
    insert,
    select,
    update,
)

from railyard.ledger.base import LedgerBase
from railyard.ledger.schema import (
    _action_done,
    _audit,
    _audit_row,
    _lock,
    _q,
    among,
    audit,
    capacity_samples,
    fleet_counts,
    insert_for_hosts,
    leases,
    operations,
    release_results,
    release_states,
    switches,
    verifications,
    visits,
    with_prefix,
)


class Records(LedgerBase):
    def open_operation(self, op_id: str, *, kind: str, detail: dict[str, Any], actor: str, action: str,
                       reason: str) -> bool:
        """Record an operation once (idempotent: a retried task does not record it twice)."""
        with self.engine.begin() as c:
            _lock(c)
            if c.execute(select(operations.c.id).where(operations.c.id == op_id)).first() is not None:
                return False
            now = self.clock()
            c.execute(insert(operations).values(id=op_id, kind=kind, train=None, domain=None, state="active",
                                                created_at=now, updated_at=now, detail=json.dumps(detail)))
            _audit(c, self.clock(), actor, op_id, action, [], reason)
            return True

    def operations_like(self, prefix: str, state: str | None = None) -> list[dict[str, Any]]:
        with self.engine.connect() as c:
            q = select(operations).where(with_prefix(c, operations.c.id, prefix)).order_by(operations.c.created_at)
            if state is not None:
                q = q.where(operations.c.state == state)
            return [dict(r._mapping) | {"detail": json.loads(r.detail or "{}")} for r in c.execute(q)]

    def record_dodge(self, op_id: str, *, train: str, domain: str, until: float, jobs: list[str]) -> bool:
        """Note that a domain's stop is postponed in this run; False if the op already exists."""
        with self.engine.begin() as c:
            _lock(c)
            if c.execute(select(operations.c.id).where(operations.c.id == op_id)).first() is not None:
                return False
            now = self.clock()
            c.execute(
                insert(operations).values(
                    id=op_id, kind="train_stop", train=train, domain=domain, state="dodged", created_at=now,
                    updated_at=now, detail=json.dumps({"dodge_until": until, "jobs": jobs}),
                )
            )
            _audit(c, self.clock(), "railyard", op_id, "dodge", [],
                   f"{domain} postponed for {', '.join(jobs)} until {until:.0f}")
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
                state="dodged", detail=json.dumps(detail), updated_at=self.clock()))
            c.execute(verifications.delete().where(verifications.c.op_id == op_id))
            _audit(c, self.clock(), actor, op_id, "revisit", [], reason)

    def claim_dodged(self, prefix: str, slot: str) -> dict[str, Any] | None:
        """The dodged stop of this run that `slot` revisits (the same one on every retry)."""
        with self.engine.begin() as c:
            _lock(c)
            q = select(operations).where(with_prefix(c, operations.c.id, prefix)).order_by(operations.c.created_at)
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
            c.execute(insert(switches).values(name=name, value=int(on), reason=reason, actor=actor, at=self.clock()))
            _audit(c, self.clock(), actor, None, f"{name}_{'on' if on else 'off'}", [], reason)

    def switch(self, name: str) -> dict[str, Any] | None:
        """The switch's state when on, else None."""
        with self.engine.connect() as c:
            r = c.execute(select(switches).where(switches.c.name == name)).first()
        return dict(r._mapping) if r is not None and r.value else None

    def record_visit(self, train: str, domain: str, at: float, op_id: str) -> None:
        with self.engine.begin() as c:
            c.execute(visits.delete().where(visits.c.train == train, visits.c.domain == domain))
            c.execute(insert(visits).values(train=train, domain=domain, at=at, op_id=op_id))

    def sample_capacity(self, at: float, serving: int, total: int, op_id: str | None = None) -> None:
        with self.engine.begin() as c:
            c.execute(insert(capacity_samples).values(at=at, serving=serving, total=total, op_id=op_id))

    def record_fleet_counts(self, rows: list[tuple[str, str, str, str, float]], at: float,
                            domains: Collection[str] | None = None) -> None:
        """Replace the counts (domain, kind, a, b, n) with those of one read, in one transaction: every domain's
        (`domains` None: a read of the whole fleet), or only those of `domains` and the clock."""
        with self.engine.begin() as c:
            if domains is None:
                c.execute(delete(fleet_counts))
            else:
                c.execute(delete(fleet_counts).where(fleet_counts.c.domain.in_(sorted(domains))
                                                     | (fleet_counts.c.kind == "clock")))
            if rows:
                c.execute(insert(fleet_counts), [{"domain": d, "kind": k, "a": a, "b": b, "n": n, "at": at}
                                                 for d, k, a, b, n in rows])

    def fleet_counts(self) -> tuple[list[tuple[str, str, str, float]], float | None]:
        """The counts (kind, a, b, n), summed over the domains (the clock: its latest reading), and when the
        oldest of them was read (None: never)."""
        with self.engine.connect() as c:
            rows = c.execute(select(fleet_counts.c.kind, fleet_counts.c.a, fleet_counts.c.b, fleet_counts.c.n,
                                    fleet_counts.c.at)).tuples().all()
        summed: dict[tuple[str, str, str], float] = {}
        for k, a, b, n, _at in rows:
            key = (k, a, b)
            summed[key] = n if k == "clock" else summed.get(key, 0.0) + n
        return [(*key, n) for key, n in sorted(summed.items())], (min(r[4] for r in rows) if rows else None)

    def oldest_leases(self) -> dict[str, float]:
        """Per kind of lease (train_stop, emergency, repair, ...): when the oldest one held now was taken."""
        with self.engine.connect() as c:
            return {k: at for k, at in c.execute(select(leases.c.kind, func.min(leases.c.since))
                                                 .group_by(leases.c.kind))}

    def tallies(self) -> dict[str, Any]:
        """What the metrics count over the ledger's whole history: finished stops by train and outcome,
        audit rows by action (offboards with their reasons), operations by kind."""
        with self.engine.connect() as c:
            stops = c.execute(select(operations.c.train, operations.c.state, func.count())
                              .where(operations.c.kind == "train_stop", operations.c.state != "active")
                              .group_by(operations.c.train, operations.c.state)).all()
            kinds = c.execute(select(operations.c.kind, func.count()).group_by(operations.c.kind)).all()
            actions = c.execute(select(audit.c.action, func.count())
                                .where(audit.c.action.in_(("escalation", "emergency_trigger", "notify_failed")))
                                .group_by(audit.c.action)).all()
            offboards = c.execute(select(audit.c.reason, audit.c.hosts).where(audit.c.action == "offboard")).all()
        return {"stops": [(t or "", st, n) for t, st, n in stops], "kinds": {k: n for k, n in kinds},
                "actions": {a: n for a, n in actions},
                "offboards": [(reason, len(json.loads(hosts))) for reason, hosts in offboards]}

    def capacity_history(self, limit: int = 600) -> list[dict[str, Any]]:
        """The newest `limit` capacity samples, oldest first: {"t", "serving", "total", "op"}."""
        q = select(capacity_samples).order_by(capacity_samples.c.at.desc(), capacity_samples.c.id.desc()).limit(limit)
        with self.engine.connect() as c:
            rows = [{"t": r.at, "serving": r.serving, "total": r.total, "op": r.op_id} for r in c.execute(q)]
        return rows[::-1]

    def last_visits(self, train: str) -> dict[str, float]:
        with self.engine.connect() as c:
            return {r.domain: r.at for r in c.execute(select(visits).where(visits.c.train == train))}

    def run_failures(self, prefix: str) -> tuple[int, int, list[str]]:
        """(hosts leased, hosts offboarded, reasons) over every operation of one run. The run's operations are
        found by the prefix of their ids, and then their lease and offboard rows by operation, through the
        audit's index on it. Read by the prefix, the audit would be read through its index on actions: every
        lease and offboard row the ledger ever wrote (one for each host ever offboarded), at every health check."""
        leased: set[str] = set()
        failed: dict[str, str] = {}
        with self.engine.connect() as c:
            ops = list(c.execute(select(operations.c.id).where(with_prefix(c, operations.c.id, prefix))).scalars())
            # the action is compared as an expression (`action || ''`), which no index serves: SQLite's planner
            # cannot tell how few operations the JSON list holds, and would read the index on actions instead,
            # every lease and offboard of the ledger's history
            action = audit.c.action.concat("")
            q = (select(audit.c.action, audit.c.hosts, audit.c.reason)
                 .where(among(c, audit.c.op_id, ops), action.in_(("lease", "offboard"))).order_by(audit.c.id))
            for r in c.execute(q) if ops else ():
                hosts = json.loads(r.hosts)
                if r.action == "lease":
                    leased.update(hosts)
                else:
                    failed.update({h: r.reason for h in hosts})
        return len(leased), len(failed), [f"{h}: {why}" for h, why in sorted(failed.items())]

    # ---- releases ----------------------------------------------------------------------------
    def release_state(self, release: str) -> dict[str, Any] | None:
        with self.engine.connect() as c:
            r = c.execute(select(release_states).where(release_states.c.release == release)).first()
        return None if r is None else dict(r._mapping)

    def set_release_state(self, release: str, *, phase: str, halted: bool, reason: str, actor: str,
                          fleet_now: float, action: str, promoted: bool = False, key: str | None = None) -> bool:
        """Phase and halt of a release, with an audit row (`action`: release_promote, _halt, _resume...).
        `key` (an Airflow run id) makes it idempotent: an action already recorded under that key is not
        applied again (a cleared and re-run task); returns whether it was applied."""
        with self.engine.begin() as c:
            _lock(c)
            if key is not None:
                if _action_done(c, release, key):
                    return False
                reason = f"{reason} [{key}]"
            old = c.execute(select(release_states).where(release_states.c.release == release)).first()
            since = fleet_now if promoted or old is None else old.promoted_at
            c.execute(release_states.delete().where(release_states.c.release == release))
            c.execute(insert(release_states).values(release=release, phase=phase, halted=int(halted), reason=reason,
                                                    actor=actor, promoted_at=since, at=self.clock()))
            _audit(c, self.clock(), actor, f"release/{release}", action, [],
                   f"{phase}{' HALTED' if halted else ''}: {reason}")
        return True

    def release_action_done(self, release: str, key: str) -> bool:
        """An action on `release` was recorded under `key` (see set_release_state)."""
        with self.engine.connect() as c:
            return _action_done(c, release, key)

    def record_release_result(self, release: str, host: str, op_id: str, passed: bool, reason: str, at: float) -> None:
        self.record_release_results(op_id, [(release, host, passed, reason)], at)

    def record_release_results(self, op_id: str, rows: list[tuple[str, str, bool, str]], at: float) -> None:
        """Each (release, host, passed, reason) of `op_id`, replacing the host's earlier one for that release
        and operation; a domain's in one transaction."""
        if not rows:
            return
        with self.engine.begin() as c:
            for release in sorted({r[0] for r in rows}):
                c.execute(release_results.delete().where(
                    release_results.c.release == release, release_results.c.op_id == op_id,
                    among(c, release_results.c.host, [h for rel, h, _p, _r in rows if rel == release])))
            c.execute(insert(release_results), [
                {"release": rel, "host": host, "op_id": op_id, "passed": int(passed), "reason": reason, "at": at}
                for rel, host, passed, reason in rows])

    def release_results(self, release: str) -> list[dict[str, Any]]:
        with self.engine.connect() as c:
            q = select(release_results).where(release_results.c.release == release).order_by(release_results.c.at)
            return [dict(r._mapping) for r in c.execute(q)]

    # ---- records -----------------------------------------------------------------------------
    def record_verification(self, op_id: str, host: str, passed: bool, versions: dict[str, str],
                            reason: str | None) -> None:
        self.record_verifications(op_id, [(host, passed, versions, reason)])

    def record_verifications(self, op_id: str, verdicts: list[tuple[str, bool, dict[str, str], str | None]]) -> None:
        """Each (host, passed, versions, reason) of a check, replacing the host's earlier one for `op_id`; a
        domain's in one transaction, with its audit rows."""
        if not verdicts:
            return
        now = self.clock()
        encoded: dict[tuple[tuple[str, str], ...], str] = {}  # a domain's hosts found at one set of versions

        def dumps(versions: dict[str, str]) -> str:
            key = tuple(sorted(versions.items()))
            found = encoded.get(key)
            if found is None:
                found = encoded[key] = json.dumps(dict(key))
            return found

        # a domain's hosts share a verdict (passed, at one set of versions): one statement for each verdict
        alike: dict[tuple[int, str, str | None], list[str]] = {}
        for host, passed, versions, reason in verdicts:
            alike.setdefault((int(passed), dumps(versions), reason), []).append(host)
        with self.engine.begin() as c:
            c.execute(verifications.delete().where(verifications.c.op_id == op_id,
                                                   among(c, verifications.c.host, [v[0] for v in verdicts])))
            for (passed_, versions_, reason_), hosts in alike.items():
                insert_for_hosts(c, verifications, hosts, op_id=op_id, passed=passed_, versions=versions_,
                                 reason=reason_, at=now)
            # the audit: one row for the hosts that passed (a domain's thousands), one per failure with its reason
            passed_hosts = [host for host, passed, _versions, _reason in verdicts if passed]
            rows = []
            if passed_hosts:
                rows.append(_audit_row(now, "railyard", op_id, "verified", passed_hosts, "", prefix="a_"))
            rows += [_audit_row(now, "railyard", op_id, "check_failed", [host], reason or "", prefix="a_")
                     for host, passed, _versions, reason in verdicts if not passed]
            c.execute(_q("audit"), rows)

    def verification(self, op_id: str, host: str) -> tuple[bool, dict[str, str], str | None] | None:
        return self.verifications(op_id, [host]).get(host)

    def verifications(self, op_id: str, hosts: list[str] | None = None
                      ) -> dict[str, tuple[bool, dict[str, str], str | None]]:
        """host -> (passed, versions, reason) of `op_id`'s latest check (of `hosts` only, when given); one query."""
        v = verifications.c
        q = select(v.host, v.passed, v.versions, v.reason).where(v.op_id == op_id)
        with self.engine.connect() as c:
            rows = c.execute(q if hosts is None else q.where(among(c, v.host, hosts))).tuples().all()
        parsed: dict[str, dict[str, str]] = {}  # a domain's hosts checked at one set of versions: parsed once
        return {host: (bool(passed), dict(parsed.get(versions) or parsed.setdefault(versions, json.loads(versions))),
                       reason) for host, passed, versions, reason in rows}

    def detail(self, op_id: str) -> dict[str, Any]:
        op = self.operation(op_id)
        return {} if op is None else json.loads(op["detail"] or "{}")

    def set_detail_once(self, op_id: str, key: str, value: object) -> object:
        """Store `key` on the operation unless already there; returns the stored value.

        Lets a retried task reuse what its first attempt decided (e.g. the checkpoint request time).
        """
        def once(detail: dict[str, Any]) -> bool:
            if key in detail:
                return False
            detail[key] = value
            return True

        return self._change_detail(op_id, once)[key]

    def set_detail(self, op_id: str, key: str, value: object) -> None:
        """Store `key` on the operation, replacing what was there (a phase that moves on)."""
        def put(detail: dict[str, Any]) -> bool:
            if key in detail and detail[key] == value:
                return False
            detail[key] = value
            return True

        self._change_detail(op_id, put)

    def add_detail_entries(self, op_id: str, key: str, entries: Mapping[str, object]) -> dict[str, object]:
        """Add to the mapping `key` of the operation the entries it does not have yet (an entry once stored is
        never changed); returns the mapping as stored."""
        def add(detail: dict[str, Any]) -> bool:
            have = detail.setdefault(key, {})
            new = {k: v for k, v in entries.items() if k not in have}
            have.update(new)
            return bool(new)

        return dict(self._change_detail(op_id, add)[key])

    def _change_detail(self, op_id: str, change: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        """The operation's detail, changed in place by `change` under the ledger lock and written back if it
        says it changed something; returns the detail as stored."""
        with self.engine.begin() as c:
            _lock(c)
            r = c.execute(select(operations.c.detail).where(operations.c.id == op_id)).first()
            if r is None:
                raise KeyError(f"unknown operation {op_id!r}")
            detail: dict[str, Any] = json.loads(r.detail or "{}")
            if change(detail):
                c.execute(
                    update(operations).where(operations.c.id == op_id)
                    .values(detail=json.dumps(detail), updated_at=self.clock())
                )
            return detail

    def holdings(self, op_id: str | None = None) -> dict[str, str]:
        """host -> op id, for one operation or all."""
        with self.engine.connect() as c:
            # the driver's own tuples (plain strings): a domain's thousands of rows without a Row each
            if op_id is None:
                return dict(c.execute(select(leases.c.host, leases.c.op_id)).cursor.fetchall())
            # one operation's: its hosts alone (the index holds them in order), each named with `op_id`
            rows = c.execute(select(leases.c.host).where(leases.c.op_id == op_id)).cursor.fetchall()
            return dict.fromkeys([h for (h,) in rows], op_id)

    def domains_out(self) -> dict[str, str]:
        """domain -> op id holding it."""
        with self.engine.connect() as c:
            return {r.domain: r.op_id for r in c.execute(select(leases.c.domain, leases.c.op_id).distinct())}

    def operation(self, op_id: str) -> dict[str, Any] | None:
        with self.engine.connect() as c:
            r = c.execute(select(operations).where(operations.c.id == op_id)).first()
        return None if r is None else dict(r._mapping)

    # ---- what an operator reads and does (railyard ops / host / lease release / reconcile) --------------
    def active_operations(self) -> list[dict[str, Any]]:
        """Active operations, oldest first, each with `hosts` (held now) and `last` (its last audit row)."""
        with self.engine.connect() as c:
            ops = [dict(r._mapping) for r in c.execute(
                select(operations).where(operations.c.state == "active").order_by(operations.c.created_at))]
            ids = [o["id"] for o in ops]
            held: dict[str, list[str]] = {}
            last: dict[str, dict[str, Any]] = {}
            for i in range(0, len(ids), 500):
                chunk = ids[i:i + 500]
                for r in c.execute(select(leases.c.op_id, leases.c.host).where(leases.c.op_id.in_(chunk))):
                    held.setdefault(r.op_id, []).append(r.host)
                newest = (select(func.max(audit.c.id)).where(audit.c.op_id.in_(chunk)).group_by(audit.c.op_id)
                          .scalar_subquery())
                for r in c.execute(select(audit).where(audit.c.id.in_(newest))):
                    last[r.op_id] = dict(r._mapping) | {"hosts": json.loads(r.hosts)}
        for o in ops:
            o["detail"] = json.loads(o["detail"] or "{}")
            o["hosts"] = sorted(held.get(o["id"], []))
            o["last"] = last.get(o["id"])
        return ops

    def finish_operation(self, op_id: str, *, reason: str, actor: str = "railyard") -> bool:
        """Mark an active operation that holds nothing done, with an audit row; False if it holds hosts."""
        with self.engine.begin() as c:
            _lock(c, ops=[op_id])
            if c.execute(select(leases.c.host).where(leases.c.op_id == op_id).limit(1)).first() is not None:
                return False
            r = c.execute(update(operations).where(operations.c.id == op_id, operations.c.state == "active")
                          .values(state="done", updated_at=self.clock()))
            if r.rowcount:
                _audit(c, self.clock(), actor, op_id, "finish", [], reason)
            return True
