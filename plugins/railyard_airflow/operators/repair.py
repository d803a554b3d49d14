"""RepairGateOperator: hosts whose repair is done come back through the health gate."""

from __future__ import annotations

from typing import Any

from airflow.sdk.exceptions import AirflowFailException

from railyard.operations.repair import gate_repaired
from railyard_airflow.context import ledger
from railyard_airflow.mixins import FleetOperator


class RepairGateOperator(FleetOperator):
    ui_color = "#d7f0dc"

    def execute(self, context: Any) -> dict[str, Any]:
        cfg = self.cfg()
        out = gate_repaired(cfg, self.hook.get_conn(), ledger(cfg.ledger.url), say=self.log.info)
        self.log.info("repair gate: %s", out)
        if out["errors"]:  # every other repair was gated first; the next run tries these again
            raise AirflowFailException(f"{len(out['errors'])} repair(s) could not go through the gate: "
                                       + "; ".join(f"{k}: {v}" for k, v in out["errors"].items()))
        return out
