"""What the stop's sensors and operators share: their fleet hook and the Stop of the task."""

from __future__ import annotations

from functools import cached_property
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowSkipException

from railyard.config import RailyardConfig, config_path
from railyard.stop import Stop
from railyard_airflow.context import config, make_stop
from railyard_airflow.hooks.fleet import FleetHook


class StopTaskMixin:
    """Needs `train_id`, `domain`, `slot`, `fleet_conn_id`, `config_path` set by the constructor."""

    train_id: str
    domain: str | None
    slot: str | None
    fleet_conn_id: str
    config_path: str | None
    log: Any

    @cached_property
    def hook(self) -> FleetHook:
        return FleetHook(self.fleet_conn_id, config_path=self.config_path)

    def stop_for(self, context: Any) -> Stop:
        stop = make_stop(train_id=self.train_id, domain=self.domain, run_id=context["run_id"],
                         fleet=self.hook.get_conn(), say=self.log.info, path=self.config_path, slot=self.slot)
        if stop is None:
            raise AirflowSkipException(f"{self.slot}: no stop for this slot in this run")
        return stop


class FleetOperator(BaseOperator):
    """Base of the single-task operators (plan, repair gate, release action, cycle report):
    the fleet connection, the config path, the hook built lazily, and the config."""

    def __init__(self, *, fleet_conn_id: str = FleetHook.default_conn_name, config_path: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.fleet_conn_id = fleet_conn_id
        self.config_path = config_path

    @cached_property
    def hook(self) -> FleetHook:
        return FleetHook(self.fleet_conn_id, config_path=self.config_path)

    def cfg(self) -> RailyardConfig:
        return config(self.config_path or str(config_path()))
