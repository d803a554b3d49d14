"""ReleaseActionOperator: promote, halt or resume a release from the UI (the `railyard_releases` form).

The form is checked again here (release, action, reason of at least 10 characters); the action and
the user who triggered it go to the ledger's audit, as from `railyard release`."""

from __future__ import annotations

from typing import Any

from airflow.sdk.exceptions import AirflowFailException

from railyard.operations.releases import ReleaseError, Rollout
from railyard_airflow.context import ledger
from railyard_airflow.mixins import FleetOperator


class ReleaseActionOperator(FleetOperator):
    ui_color = "#fff2cc"

    def execute(self, context: Any) -> dict[str, Any]:
        cfg = self.cfg()
        user = getattr(context.get("dag_run"), "triggering_user_name", None) or "unknown"
        params = dict(context.get("params") or {})
        rollout = Rollout(cfg, ledger(cfg.ledger.url))
        try:
            # the run id as the action's key: a cleared and re-run task does not promote twice
            st = rollout.act(str(params.get("action")), str(params.get("release")), reason=params.get("reason") or "",
                             actor=user, now=self.hook.get_conn().now(), key=str(context["run_id"]))
        except ReleaseError as exc:
            raise AirflowFailException(f"release form refused, nothing changed: {exc}") from None
        action = str(params.get("action"))
        if action in ("promote", "halt"):
            from railyard_airflow.notifiers.route import Event, send

            kind = "release_promoted" if action == "promote" else "release_halted"
            what = f"promoted to {st.phase}" if action == "promote" else "halted"
            reason = str(params.get("reason") or "")
            send(cfg, rollout.ledger, Event(kind, f"release {st.release} {what} by {user}: {reason}", reason=reason,
                                            run_id=str(context["run_id"]), actor=user,
                                            extra={"release": st.release, "phase": st.phase}))
        for r in rollout.table():
            self.log.info("%-20s %-8s %s", r["release"], r["phase"], f"HALTED: {r['reason']}" if r["halted"] else "")
        return {"release": st.release, "phase": st.phase, "halted": st.halted, "by": user}
