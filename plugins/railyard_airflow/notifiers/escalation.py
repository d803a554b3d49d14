"""EscalationNotifier: when a train task fails, say why in one line, in the ledger and the webhook."""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseNotifier

from railyard.config import config_path
from railyard.escalate import escalate
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
        summary = f"train {self.train_id} stopped at {task}: {reason}"
        self.log.error(summary)
        escalate(cfg, ledger(cfg.ledger.url), kind="train_stopped", summary=summary,
                 train=self.train_id, run_id=run_id, task=task)
