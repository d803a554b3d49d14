"""One maintenance-train DAG per train in the Railyard config (RAILYARD_CONFIG or include/config)."""

from railyard_airflow.factory import build_train_dags

globals().update(build_train_dags())
