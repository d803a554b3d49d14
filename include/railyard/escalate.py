"""Escalation: a train that stopped by itself, or a domain overdue for its cycle, must reach a person.

Every escalation is an audit row in the ledger and, when a webhook is configured
(`escalation.webhook_url` or RAILYARD_WEBHOOK_URL), one JSON POST. A webhook that fails is logged,
never raised: escalating must not itself break the run it reports on.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import requests

from railyard.config import RailyardConfig
from railyard.ledger import Ledger

log = logging.getLogger("railyard.escalate")


def escalate(config: RailyardConfig, ledger: Ledger, *, kind: str, summary: str, op_id: str | None = None,
             **fields: Any) -> dict[str, Any]:
    event = {"kind": kind, "summary": summary, "op_id": op_id, "at": time.time(), **fields}
    log.error("ESCALATION %s: %s", kind, summary)
    ledger.note(op_id, "escalation", [], f"{kind}: {summary}")
    url = os.environ.get("RAILYARD_WEBHOOK_URL") or config.escalation.webhook_url
    if url:
        try:
            r = requests.post(url, json=event, timeout=5)
            event["webhook_status"] = r.status_code
        except requests.RequestException as exc:
            log.warning("escalation webhook %s failed: %s", url, exc)
            event["webhook_status"] = None
    return event


def overdue_domains(config: RailyardConfig, ledger: Ledger, train_id: str, now: float) -> list[dict[str, Any]]:
    """Domains of the train not visited within its cycle time (fleet clock).

    A domain never visited is measured from the train's first visit anywhere; a train that never
    ran has nothing overdue yet.
    """
    train = config.train(train_id)
    if train.cycle_days is None:
        return []
    visits = ledger.last_visits(train_id)
    if not visits:
        return []
    first = min(visits.values())
    cycle = train.cycle_days * 86400
    out = []
    for d in config.train_domains(train):
        last = visits.get(d.name)
        since = now - (last if last is not None else first)
        if since > cycle:
            out.append({"domain": d.name, "last_visit": last, "overdue_s": round(since - cycle, 1)})
    return out
