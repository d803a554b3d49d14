"""ReconcileOperator: finishes the stops of runs that are gone (railyard.operations.reconcile), from inside Airflow.

It asks Airflow about each run through the Task SDK (the task's own API, no credentials)."""

from __future__ import annotations

from typing import Any

from airflow.sdk.exceptions import AirflowFailException

from railyard.fleet.port import FleetError
from railyard.operations.fleetcounts import record_fleet
from railyard.operations.reconcile import reconcile, run_state_name
from railyard_airflow.context import ledger
from railyard_airflow.mixins import FleetOperator


class TaskSdkRuns:
    """RunOracle over the Task SDK: what the running task may ask the API server."""

    def dag_known(self, dag_id: str) -> bool:
        from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

        try:
            RuntimeTaskInstance.get_dag(dag_id)
        except Exception:  # unknown (or not answerable now): never judged
            return False
        return True

    def run_state(self, dag_id: str, run_id: str) -> str | None:
        from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

        if RuntimeTaskInstance.get_dr_count(dag_id=dag_id, run_ids=[run_id]) == 0:
            return None
        return run_state_name(RuntimeTaskInstance.get_dagrun_state(dag_id=dag_id, run_id=run_id))


class ReconcileOperator(FleetOperator):
    ui_color = "#e0e0f8"

    def execute(self, context: Any) -> list[dict[str, Any]]:
        cfg = self.cfg()
        fleet, book = self.hook.get_conn(), ledger(cfg.ledger.url)
        out = reconcile(cfg, fleet, book, TaskSdkRuns(), say=self.log.info)
        try:  # the metrics' hosts, fresh every reconcile even when no train runs
            record_fleet(fleet, book, cfg)
        except FleetError as exc:
            self.log.warning("fleet counts not recorded: %s", exc)
        for r in out:
            self.log.info("%s: %s (%s)", r["op"], r["action"], r.get("error") or r["why"])
        failed = [r for r in out if r["action"] == "failed"]
        if failed:  # visible in the grid; the next run tries again
            raise AirflowFailException(f"{len(failed)} operation(s) could not be finished: "
                                       + "; ".join(f"{r['op']}: {r['error']}" for r in failed))
        return out
