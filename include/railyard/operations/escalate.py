"""Escalation: a train that stopped by itself, or a domain overdue for its cycle, must reach a person.

Every escalation is an audit row in the ledger and, when a webhook is configured
(`escalation.webhook_url` or RAILYARD_WEBHOOK_URL), one JSON POST. A webhook that fails is logged,
never raised: escalating must not itself break the run it reports on.

The webhook URL is a secret (chat webhooks carry their key in the path or query): it is never logged,
stored or put in the event. Logs name its host only (`webhook_host`), and urllib3's own DEBUG line
(which quotes the path and query of every request) is redacted for it (`redact_in_http_logs`).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any
from urllib.parse import urlsplit

from railyard.domain.config import RailyardConfig
from railyard.ledger import Ledger

log = logging.getLogger("railyard.escalate")


class _Redact(logging.Filter):
    """Replaces registered secret strings in the records of the logger it is attached to."""

    def __init__(self) -> None:
        super().__init__()
        self.secrets: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if self.secrets:
            text = record.getMessage()
            if any(s in text for s in self.secrets):
                for s in sorted(self.secrets, key=len, reverse=True):
                    text = text.replace(s, "***")
                record.msg, record.args = text, ()
        return True


_REDACT = _Redact()


def redact_in_http_logs(url: str) -> None:
    """urllib3 logs `"POST /path?query HTTP/1.1" 200` at DEBUG: keep a secret URL's path and query out."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return
    for piece in (parts.path + (f"?{parts.query}" if parts.query else ""), parts.path, parts.query, parts.password):
        if piece and len(piece) > 1:
            _REDACT.secrets.add(piece)
    pool = logging.getLogger("urllib3.connectionpool")
    if _REDACT not in pool.filters:
        pool.addFilter(_REDACT)


def escalate(config: RailyardConfig, ledger: Ledger, *, kind: str, summary: str, op_id: str | None = None,
             **fields: Any) -> dict[str, Any]:
    event = {"kind": kind, "summary": summary, "op_id": op_id, "at": time.time(), **fields}
    log.error("ESCALATION %s: %s", kind, summary)
    ledger.note(op_id, "escalation", [], f"{kind}: {summary}")
    url = os.environ.get("RAILYARD_WEBHOOK_URL") or config.escalation.webhook_url
    if url:
        import requests  # here, not at the top: the DAG files import this module, and requests costs 40 ms

        host = webhook_host(url)
        redact_in_http_logs(url)
        try:
            r = requests.post(url, json=event, timeout=5)
            event["webhook_status"] = r.status_code
            if r.status_code >= 400:
                log.warning("escalation webhook at %s answered HTTP %s", host, r.status_code)
            else:
                log.info("escalation sent to the webhook at %s (HTTP %s)", host, r.status_code)
        except requests.RequestException as exc:
            # str(exc) quotes the URL (path and query too): name the failure's type and the host only
            log.warning("escalation webhook at %s failed: %s", host, type(exc).__name__)
            event["webhook_status"] = None
    return event


def webhook_host(url: str) -> str:
    """What may be said about a webhook: its host (and port), never its path, query or credentials."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or "?"
        return f"{host}:{parts.port}" if parts.port else host
    except ValueError:
        return "(unparsable URL)"


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
