"""Railyard's events, sent through Airflow's notifiers: the config's `notify:` routes each event to Airflow
connections, and a connection's type picks the notifier — `slackwebhook` (the Slack provider's
`SlackWebhookNotifier`), `apprise` (the Apprise provider's `AppriseNotifier`), `http` (Railyard's own JSON POST).

Sending never fails the task that sends: a notifier that raises is logged (the connection id and the error's
type, never its URL) and counted in the ledger's audit (`notify_failed`, the metric
`railyard_notifications_failed_total`). A stop's events are marked on its operation in the ledger once sent, and
a retried task does not send them again (a task killed between sending and marking sends that one twice).
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from typing import Any

from airflow.sdk import BaseNotifier

from railyard.domain.config import RailyardConfig
from railyard.ledger import Ledger

log = logging.getLogger("railyard.notify")


@dataclass(frozen=True)
class Event:
    kind: str
    text: str  # one line, naming the train, the domain or host, and the reason
    train: str | None = None
    domain: str | None = None
    host: str | None = None
    reason: str | None = None
    run_id: str | None = None
    actor: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class JsonWebhookNotifier(BaseNotifier):
    """An `http` connection: the event as JSON, POSTed to the connection's URL (schema, host, port, extra path)."""

    def __init__(self, *, conn_id: str, event: Event) -> None:
        super().__init__()
        self.conn_id, self.event = conn_id, event

    def notify(self, context: Any) -> None:
        import requests
        from airflow.sdk.bases.hook import BaseHook

        conn = BaseHook.get_connection(self.conn_id)
        host = conn.host or ""
        url = host if "://" in host else f"{conn.schema or 'https'}://{host}{f':{conn.port}' if conn.port else ''}"
        url += str(conn.extra_dejson.get("path", ""))
        r = requests.post(url, json={"source": "railyard", **asdict(self.event)}, timeout=10)
        r.raise_for_status()


def notifier_for(conn_id: str, conn_type: str, event: Event) -> BaseNotifier:
    if conn_type == "slackwebhook":
        from airflow.providers.slack.notifications.slack_webhook import SlackWebhookNotifier

        return SlackWebhookNotifier(slack_webhook_conn_id=conn_id, text=event.text)
    if conn_type == "apprise":
        from airflow.providers.apprise.notifications.apprise import AppriseNotifier  # type: ignore[import-not-found]

        return AppriseNotifier(apprise_conn_id=conn_id, body=event.text,  # type: ignore[no-any-return]
                               title=f"Railyard: {event.kind}")
    if conn_type in ("http", "https"):
        return JsonWebhookNotifier(conn_id=conn_id, event=event)
    raise ValueError(f"connection {conn_id}: type {conn_type!r} has no notifier Railyard knows "
                     f"(slackwebhook, apprise, http)")


def send(cfg: RailyardConfig, ledger: Ledger | None, event: Event, *, once_for: str | None = None,
         once_for_run: str | None = None) -> int:
    """Send `event` to every route that takes its kind; the number sent. With `once_for` (an operation id), an
    event already sent for that operation (same kind, host and domain) is not sent again; with `once_for_run`
    (`train/run_id`: a run's own events, which no operation carries), one already sent for that run."""
    routes = [r for r in cfg.notify if event.kind in r.events]
    if not routes:
        return 0
    key = f"notified:{event.kind}:{event.domain or ''}:{event.host or ''}:{event.extra.get('release', '')}"
    store = None
    if once_for_run is not None and ledger is not None:
        from railyard.ledger.state import Store

        store = Store(ledger.url)
        if store.get("notified", f"{once_for_run}:{event.kind}") is not None:
            return 0  # a retried task: sent by its first attempt
    if once_for is not None and ledger is not None:
        try:
            if key in ledger.detail(once_for):
                return 0  # a retried task: sent by its first attempt
        except Exception as exc:  # an operation not in the ledger: sent, unmarked
            log.info("event %s not checked on %s: %s", event.kind, once_for, type(exc).__name__)
            once_for = None
    from airflow.sdk.bases.hook import BaseHook

    sent = 0
    for route in routes:
        try:
            conn = BaseHook.get_connection(route.connection)
            notifier_for(route.connection, conn.conn_type or "", event).notify({})
            sent += 1
        except Exception as exc:  # never fail the stop; str(exc) may quote a webhook URL: its type only
            why = str(exc) if isinstance(exc, ValueError) else type(exc).__name__
            log.warning("notification %s via connection %s failed: %s", event.kind, route.connection, why)
            if ledger is not None:
                try:
                    ledger.note(None, "notify_failed", [], f"{event.kind} via {route.connection}: {why}")
                except Exception:
                    pass
    if once_for is not None and ledger is not None:  # marked after sending: at least once, never lost
        ledger.set_detail_once(once_for, key, True)
    if store is not None and once_for_run is not None:
        store.put("notified", f"{once_for_run}:{event.kind}", {"sent": sent})
    return sent


def stop_events(stop: Any, step: str, result: Any, run_id: str | None) -> int:
    """After a stop's step: every host it has offboarded so far (each once, with the check's reason) and, after
    its return, the stop done."""
    cfg: RailyardConfig = stop.config
    if not cfg.notify:
        return 0
    who = "emergency" if stop.kind == "emergency" else f"train {stop.train.id}"
    base = {"train": stop.train.id, "domain": stop.domain.name, "run_id": run_id}
    sent = 0
    reasons: dict[str, str] = {}
    for row in stop.ledger.audit_rows(stop.op_id, limit=None, action="offboard"):
        for h in row["hosts"]:
            reasons.setdefault(h, row["reason"])
    for host, reason in sorted(reasons.items()):
        sent += send(cfg, stop.ledger, Event(
            "host_offboarded", f"{who}: {host} in {stop.domain.name} offboarded to repair: {reason}",
            host=host, reason=reason, **base), once_for=stop.op_id)
    if step in ("check", "return"):  # a phased release its gate halted during this stop
        from railyard.operations.releases import Rollout

        rollout = Rollout(cfg, stop.ledger)
        for rid in stop.train.releases:
            st = rollout.state(rid)
            if st.halted:
                sent += send(cfg, stop.ledger, Event(
                    "release_halted", f"release {rid} halted in its {st.phase} phase: {st.reason}", reason=st.reason,
                    extra={"release": rid, "phase": st.phase}, **base), once_for=stop.op_id)
    if step == "return" and isinstance(result, dict):
        n_off = len(result.get("offboarded") or [])
        sent += send(cfg, stop.ledger, Event(
            "stop_done", f"{who}: stop of {stop.domain.name} done: {result.get('returned', 0)} host(s) back in "
            f"service, {n_off} in repair", reason=None, extra={"returned": result.get("returned", 0),
                                                             "offboarded": result.get("offboarded") or []},
            **base), once_for=stop.op_id)
    return sent


__all__ = ["Event", "JsonWebhookNotifier", "notifier_for", "send", "stop_events"]
