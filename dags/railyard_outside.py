"""Outside work requested over the Railyard page's API: one run per request, through the same ledger."""

from railyard_airflow import outside_dags

globals().update(outside_dags())
