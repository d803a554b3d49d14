"""The reconciler: stops whose run is finished or deleted are finished safely and their leases released."""

from railyard_airflow import reconcile_dags

globals().update(reconcile_dags())
