"""Release phases from the UI: promote, halt or resume a release with a reason (a form)."""

from railyard_airflow.factory import build_release_dag

dag = build_release_dag()
