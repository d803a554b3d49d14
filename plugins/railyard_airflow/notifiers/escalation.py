"""EscalationNotifier: when a train task fails, say why in one line, in the ledger and the webhook.

The webhook URL is a secret: it is registered with Airflow's secrets masker (whole, and its path and
query, which is what HTTP client logs quote) before anything is sent, and `escalate` logs its host only.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlsplit

from airflow.sdk import BaseNotifier

from railyard.domain.config import RailyardConfig, config_path
from railyard.operations.escalate import escalate
from railyard_airflow.context import config, ledger


class EscalationNotifier(BaseNotifier):
    """Task-level `on_failure_callback` of every train task (it runs in the task's own process)."""

    def __init__(self, *, train_id: str, config_path: str | None = None) -> None:
        super().__init__()
        self.train_id = train_id
        self.config_path = config_path

    def notify(self, context: Any) -> None:
        ti = context.get("ti") or context.get("task_instance")
        exc = context.get("exception")
        reason = str(exc).splitlines()[0] if exc else "failed"
        task = getattr(ti, "task_id", "?")
        run_id = context.get("run_id", "?")
        cfg = config(self.config_path or str(config_path()))
        mask_webhook(cfg)
        summary = f"train {self.train_id} stopped at {task}: {reason}"
        self.log.error(summary)
        led = ledger(cfg.ledger.url)
        escalate(cfg, led, kind="train_stopped", summary=summary, train=self.train_id, run_id=run_id, task=task)
        from railyard_airflow.notifiers.route import Event, send

        send(cfg, led, Event("train_stopped", summary, train=self.train_id, reason=reason, run_id=run_id,
                             extra={"task": task}))


def mask_webhook(cfg: RailyardConfig) -> None:
    """Tell Airflow's secrets masker about the webhook URL in force (RAILYARD_WEBHOOK_URL or the config)."""
    url = os.environ.get("RAILYARD_WEBHOOK_URL") or cfg.escalation.webhook_url
    if not url:
        return
    try:
        from airflow.sdk.log import mask_secret

        parts = urlsplit(url)
        for piece in (url, parts.path + (f"?{parts.query}" if parts.query else ""), parts.query, parts.password):
            if piece and len(piece) > 1:
                mask_secret(piece)
    except Exception:  # masking is best effort; escalate() never logs the URL itself
        pass
