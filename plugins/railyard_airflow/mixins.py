"""What the stop's sensors and operators share: their fleet hook and the Stop of the task."""

from __future__ import annotations

from functools import cached_property
from typing import Any, ClassVar

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowSkipException

from railyard.domain.config import RailyardConfig, config_path
from railyard.operations.stop import Stop
from railyard_airflow.context import config, make_stop
from railyard_airflow.hooks.fleet import FleetHook

REQUIRED = object()  # a task argument without a default


class StopTaskMixin:
    """A stop's task: its train, its domain (or revisit slot), its fleet connection and config path.

    These classes define no `__init__` (why: docs/performance.md, Parsing). They declare `task_args` instead
    (name -> default, or REQUIRED), which Airflow's hook for this, `_hook_apply_defaults`, takes out of the
    keyword arguments before `BaseOperator.__init__` sees the rest (pinned by tests/dags/test_task_args.py).
    """

    task_args: ClassVar[dict[str, Any]] = {
        "train_id": REQUIRED, "domain": None, "slot": None,
        "fleet_conn_id": FleetHook.default_conn_name, "config_path": None,
    }
    train_id: str
    domain: str | None
    slot: str | None
    fleet_conn_id: str
    config_path: str | None
    log: Any

    def _hook_apply_defaults(self, *args: Any, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        # called once per `__init__` level: the outermost one takes the arguments, the inner ones find them set
        if "_task_args_taken" in vars(self):
            return args, kwargs
        for name, default in self.task_args.items():
            value = kwargs.pop(name, default)
            if value is REQUIRED:
                raise TypeError(f"{type(self).__name__}: missing keyword argument {name!r}")
            object.__setattr__(self, name, value)  # not Airflow's __setattr__: nothing of its to track here
        object.__setattr__(self, "_task_args_taken", True)
        return args, self._airflow_args(kwargs)

    def _airflow_args(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """Airflow's own keyword arguments, given Railyard's (now set): a subclass derives some here."""
        return kwargs

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
