"""Railyard's stop tasks take their own arguments through Airflow's private hook `_hook_apply_defaults`
(plugins/railyard_airflow/mixins.py: no `__init__` of theirs, so Airflow applies its defaults once per task,
not once per class level). This pins that hook: if an Airflow release stops calling it, these fail."""

from __future__ import annotations

import pytest

from railyard_airflow.operators.stop import DrainDomainOperator
from railyard_airflow.sensors.stop import BufferCapacitySensor


def test_airflow_hands_a_stop_tasks_own_arguments_to_the_hook():
    op = DrainDomainOperator(task_id="drain", train_id="demo", domain="pod-a", config_path="/etc/railyard.yaml")
    assert (op.train_id, op.domain, op.slot, op.fleet_conn_id, op.config_path) == \
        ("demo", "pod-a", None, "railyard_fleet", "/etc/railyard.yaml")
    sensor = BufferCapacitySensor(task_id="wait_capacity", train_id="demo", slot="revisit_1", wait_s=60, poll_s=1)
    assert (sensor.train_id, sensor.domain, sensor.slot) == ("demo", None, "revisit_1")


def test_a_missing_argument_is_refused_by_name():
    with pytest.raises(TypeError, match="DrainDomainOperator: missing keyword argument 'train_id'"):
        DrainDomainOperator(task_id="drain", domain="pod-a")
