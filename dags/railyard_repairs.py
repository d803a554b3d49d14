"""The repair gate: hosts back from repair return to service only through the health check."""

from railyard_airflow.factory import build_repair_dag

dag = build_repair_dag()
