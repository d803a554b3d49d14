"""Release phases from the UI: promote, halt or resume a release with a reason (a form)."""

from railyard_airflow import release_dags

globals().update(release_dags())
