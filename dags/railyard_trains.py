"""One maintenance-train DAG per train in the Railyard config (RAILYARD_CONFIG or include/config)."""

from railyard_airflow import train_dags

globals().update(train_dags())
