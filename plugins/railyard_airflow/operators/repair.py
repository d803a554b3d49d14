"""RepairGateOperator: hosts whose repair is done come back through the health gate."""

from __future__ import annotations

from functools import cached_property
from typing import Any

from airflow.sdk import BaseOperator

from railyard.config import config_path
from railyard.repair import gate_repaired
from railyard_airflow.context import config, ledger
from railyard_airflow.hooks.fleet import FleetHook


class RepairGateOperator(BaseOperator):
    ui_color = "#d7f0dc"

    def __init__(self, *, fleet_conn_id: str = FleetHook.default_conn_name, config_path: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.fleet_conn_id = fleet_conn_id
        self.config_path = config_path

    @cached_property
    def hook(self) -> FleetHook:
        return FleetHook(self.fleet_conn_id, config_path=self.config_path)

    def execute(self, context: Any) -> dict:
        cfg = config(self.config_path or str(config_path()))
        out = gate_repaired(cfg, self.hook.get_conn(), ledger(cfg.ledger.url), say=self.log.info)
        self.log.info("repair gate: %s", out)
        return out
