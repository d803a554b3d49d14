"""RailyardPlugin: what Railyard adds to Airflow's own processes (the api-server's audit middleware)."""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from railyard_airflow.audit import AuditMiddleware


class RailyardPlugin(AirflowPlugin):
    name = "railyard"
    fastapi_root_middlewares = [
        {"middleware": AuditMiddleware, "args": [], "kwargs": {}, "name": "railyard-audit"},
    ]
