"""EmergencyPlanOperator: the first task of an emergency train. Validates the trigger form into a
model, checks who triggered it, records the trigger in the ledger, and shows the plan.
Nothing is touched before it passes; with dry_run it is the only thing that runs."""

from __future__ import annotations

from typing import Any

from airflow.sdk.exceptions import AirflowFailException

from railyard.operations.emergency import EmergencyError, broken_rules, describe, parse_request, plan
from railyard_airflow.context import emergency_run_op, ledger
from railyard_airflow.mixins import FleetOperator


class EmergencyPlanOperator(FleetOperator):
    ui_color = "#ffd6d6"

    def execute(self, context: Any) -> dict[str, Any]:
        cfg = self.cfg()
        led = ledger(cfg.ledger.url)
        run_id = context["run_id"]
        user = getattr(context.get("dag_run"), "triggering_user_name", None) or "unknown"
        # the form as given: the params, and every key of the run's conf (a key the form does not have is
        # refused by name in parse_request, never dropped)
        conf = getattr(context.get("dag_run"), "conf", None) or {}
        params = {**dict(context.get("params") or {}), **(conf if isinstance(conf, dict) else {})}
        allowed = cfg.emergency.allowed_users
        if allowed is not None and user not in allowed:
            led.note(emergency_run_op(run_id), "emergency_refused", [], f"{user} may not run emergency trains",
                     actor=user)
            raise AirflowFailException(f"{user!r} is not allowed to run emergency trains (emergency.allowed_users)")
        try:
            req = parse_request(cfg, params)
        except EmergencyError as exc:
            led.note(emergency_run_op(run_id), "emergency_invalid", [], "; ".join(exc.problems), actor=user)
            raise AirflowFailException("emergency form refused, nothing touched:\n" + "\n".join(exc.problems)) from None
        broken = broken_rules(cfg, self.hook.get_conn(), req)
        if broken:  # e.g. a driver without its matching fabric manager under an `equals` rule
            led.note(emergency_run_op(run_id), "emergency_refused", [], "; ".join(broken), actor=user)
            raise AirflowFailException("emergency refused by compatibility.rules, nothing touched:\n"
                                       + "\n".join(broken))
        p = plan(cfg, self.hook.get_conn(), req)
        self.log.info("%s", describe(p))
        led.open_operation(
            emergency_run_op(run_id), kind="emergency_run", actor=user, action="emergency_trigger",
            detail={"request": req.model_dump(), "plan": p, "user": user},
            reason=f"{req.reason} | releases {', '.join(req.releases)}"
            + (" | DRY RUN" if req.dry_run else "")
            + (f" | skip checkpoints: {req.skip_checkpoint_reason}" if req.skip_checkpoint else "")
            + (f" | large scale x{req.domains_at_once}: {req.large_scale_reason}" if req.large_scale else ""),
        )
        if not req.dry_run:
            from railyard_airflow.notifiers.route import Event, send

            domains = [s["domain"] for s in p["stops"]]
            send(cfg, led, Event("emergency_triggered", f"emergency triggered by {user}: {req.reason}: releases "
                                 f"{', '.join(req.releases)} on {', '.join(domains) or 'nothing'}",
                                 reason=req.reason, run_id=run_id, actor=user,
                                 extra={"releases": list(req.releases), "domains": domains}),
                 once_for=emergency_run_op(run_id))
        return {"stops": [s["domain"] for s in p["stops"]], "dry_run": req.dry_run, "estimate_s": p["estimate_s"]}
