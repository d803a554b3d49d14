"""The emergency train: triggered by hand from the Airflow UI with a form."""

from railyard_airflow.factory import build_emergency_dag

dag = build_emergency_dag()
