"""The repair gate: hosts back from repair return to service only through the health check."""

from railyard_airflow import repair_dags

globals().update(repair_dags())
