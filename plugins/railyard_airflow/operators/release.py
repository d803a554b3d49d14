"""ReleaseActionOperator: promote, halt or resume a release from the UI (the `railyard_releases` form).

The form is checked again here (release, action, reason of at least 10 characters); the action and
the user who triggered it go to the ledger's audit, as from `railyard release`."""

from __future__ import annotations

from functools import cached_property
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException

from railyard.config import config_path
from railyard.releases import ReleaseError, Rollout
from railyard_airflow.context import config, ledger
from railyard_airflow.hooks.fleet import FleetHook


class ReleaseActionOperator(BaseOperator):
    ui_color = "#fff2cc"

    def __init__(self, *, fleet_conn_id: str = FleetHook.default_conn_name, config_path: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.fleet_conn_id = fleet_conn_id
        self.config_path = config_path

    @cached_property
    def hook(self) -> FleetHook:
        return FleetHook(self.fleet_conn_id, config_path=self.config_path)

    def execute(self, context: Any) -> dict[str, Any]:
        cfg = config(self.config_path or str(config_path()))
        user = getattr(context.get("dag_run"), "triggering_user_name", None) or "unknown"
        params = dict(context.get("params") or {})
        rollout = Rollout(cfg, ledger(cfg.ledger.url))
        try:
            st = rollout.act(str(params.get("action")), str(params.get("release")), reason=params.get("reason") or "",
                             actor=user, now=self.hook.get_conn().now())
        except ReleaseError as exc:
            raise AirflowFailException(f"release form refused, nothing changed: {exc}") from None
        for r in rollout.table():
            self.log.info("%-20s %-8s %s", r["release"], r["phase"], f"HALTED: {r['reason']}" if r["halted"] else "")
        return {"release": st.release, "phase": st.phase, "halted": st.halted, "by": user}
