"""What a run's report is made of and where it is kept: the versions each host had before its stop upgraded
it, and the reports themselves (one per run of a train or of the emergency train)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from sqlalchemy import delete, func, insert, select

from railyard.ledger.base import LedgerBase
from railyard.ledger.schema import capacity_samples, insert_for_hosts, run_reports, versions_before


class Reports(LedgerBase):
    def record_versions_before(self, op_id: str, versions: Mapping[str, Mapping[str, str]]) -> None:
        """Each host's versions before `op_id` upgraded it, once: a retried upgrade finds the hosts half done
        and must not record that as their before, so a host already recorded keeps its first row."""
        if not versions:
            return
        now = self.clock()
        with self.engine.begin() as c:
            # every host recorded for the operation (a domain's at most): no list of thousands of names to bind
            have = set(c.execute(select(versions_before.c.host).where(versions_before.c.op_id == op_id)).scalars())
            # a domain's hosts mostly share their versions: one statement for each set of versions, its hosts in
            # one parameter, instead of a row per host bound one at a time
            alike: dict[tuple[tuple[str, str], ...], list[str]] = {}
            for h, v in versions.items():
                if h not in have:
                    alike.setdefault(tuple(sorted(v.items())), []).append(h)
            for key, hosts in alike.items():
                insert_for_hosts(c, versions_before, hosts, op_id=op_id, versions=json.dumps(dict(key)), at=now)

    def versions_before(self, op_id: str) -> dict[str, dict[str, str]]:
        with self.engine.connect() as c:
            rows = c.execute(select(versions_before.c.host, versions_before.c.versions)
                             .where(versions_before.c.op_id == op_id)).tuples().all()
        return {h: json.loads(v) for h, v in rows}

    def capacity_low(self, op_id: str) -> float | None:
        """The lowest serving fraction of the fleet that `op_id`'s samples saw (after its drain, its return)."""
        cs = capacity_samples.c
        with self.engine.connect() as c:
            low = c.execute(select(func.min(cs.serving * 1.0 / cs.total))
                            .where(cs.op_id == op_id, cs.total > 0)).scalar()
        return None if low is None else round(float(low), 6)

    def save_report(self, report: dict[str, Any]) -> None:
        """Store a run's report (`railyard.operations.runreport.build`), replacing an earlier one of the run."""
        run = report["run"]
        summary = {"summary": report["summary"], "dag_id": run.get("dag_id"), "triggered_by": run.get("triggered_by")}
        row = {"run": run["key"], "train": run["train"], "run_id": run["run_id"], "outcome": run["outcome"],
               "at": self.clock(), "summary": json.dumps(summary), "body": json.dumps(report, sort_keys=True)}
        with self.engine.begin() as c:
            c.execute(delete(run_reports).where(run_reports.c.run == row["run"]))
            c.execute(insert(run_reports).values(**row))

    def report(self, key: str) -> dict[str, Any] | None:
        """The report of run `key` (`train/run_id`), or of the one run whose run id is `key`; None if none."""
        with self.engine.connect() as c:
            body = c.execute(select(run_reports.c.body).where(run_reports.c.run == key)).scalar()
            if body is None:
                q = select(run_reports.c.body).where(run_reports.c.run_id == key).limit(2)
                found = c.execute(q).scalars().all()
                body = found[0] if len(found) == 1 else None
        return None if body is None else dict(json.loads(body))

    def reports(self, limit: int = 50, train: str | None = None) -> list[dict[str, Any]]:
        """The latest reports, newest first: each its summary (run, train, run id, outcome, when written)."""
        r = run_reports.c
        q = select(r.run, r.train, r.run_id, r.outcome, r.at, r.summary).order_by(r.at.desc()).limit(limit)
        if train is not None:
            q = q.where(r.train == train)
        with self.engine.connect() as c:
            rows = c.execute(q).all()
        return [{"run": run, "train": tr, "run_id": run_id, "outcome": outcome, "at": at, **json.loads(summary)}
                for run, tr, run_id, outcome, at, summary in rows]
