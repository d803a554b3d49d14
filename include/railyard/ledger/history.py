"""The audit: every change's who, what, when and why, and what an operator reads of it."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from sqlalchemy import (
    func,
    select,
)

from railyard.ledger.base import LedgerBase
from railyard.ledger.schema import _audit, audit, leases, verifications, with_prefix


class AuditLog(LedgerBase):
    def note(self, op_id: str | None, action: str, hosts: Iterable[str], reason: str, actor: str = "railyard") -> None:
        with self.engine.begin() as c:
            _audit(c, self.clock(), actor, op_id, action, list(hosts), reason)

    def audit_rows(self, op_id: str | None = None, limit: int | None = 1000,
                   action: str | None = None, prefix: str | None = None) -> list[dict[str, Any]]:
        """The audit, oldest first: of one operation, of the operations whose id starts with `prefix` (a run's
        stops), of one action, the first `limit` rows (None: all)."""
        q = select(audit).order_by(audit.c.id)
        if op_id is not None:
            q = q.where(audit.c.op_id == op_id)
        if action is not None:
            q = q.where(audit.c.action == action)
        with self.engine.connect() as c:
            if prefix is not None:
                q = q.where(with_prefix(c, audit.c.op_id, prefix))
            rows = [dict(r._mapping) for r in c.execute(q if limit is None else q.limit(limit))]
        for r in rows:
            r["hosts"] = json.loads(r["hosts"])
        return rows

    def audit_count(self) -> int:
        with self.engine.connect() as c:
            return int(c.execute(select(func.count()).select_from(audit)).scalar_one())

    def host_history(self, host: str, limit: int = 500) -> dict[str, Any]:
        """One host's record: who holds it now, every audit row that names it, and every check of it
        (verdict, versions seen, evidence), oldest first."""
        with self.engine.connect() as c:
            lease = c.execute(select(leases).where(leases.c.host == host)).first()
            rows = [dict(r._mapping) for r in c.execute(
                select(audit).where(audit.c.hosts.contains(json.dumps(host), autoescape=True))
                .order_by(audit.c.id.desc()).limit(limit))]
            checks = [dict(r._mapping) for r in c.execute(
                select(verifications).where(verifications.c.host == host).order_by(verifications.c.at))]
        events = []
        for r in reversed(rows):
            hosts = json.loads(r["hosts"])
            if host in hosts:  # `contains` also matches a name that merely includes this one in quotes
                events.append(r | {"hosts": hosts})
        for ch in checks:
            ch["versions"] = json.loads(ch["versions"])
            ch["passed"] = bool(ch["passed"])
        return {"host": host, "lease": None if lease is None else dict(lease._mapping), "events": events,
                "checks": checks}
