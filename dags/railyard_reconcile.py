"""The reconciler: stops whose run is finished or deleted are finished safely and their leases released."""

from railyard_airflow.factory import build_reconcile_dag

dag = build_reconcile_dag()
