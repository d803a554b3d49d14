"""The emergency train: triggered by hand from the Airflow UI with a form."""

from railyard_airflow import emergency_dags

globals().update(emergency_dags())
