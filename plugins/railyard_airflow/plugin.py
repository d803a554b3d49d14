"""RailyardPlugin: what Railyard adds to Airflow's own processes: the api-server's audit middleware, and
the Railyard page (a FastAPI app under /railyard, shown in the navigation as an external view)."""

from __future__ import annotations

from importlib.metadata import entry_points

from airflow.plugins_manager import AirflowPlugin

# railyard.fleet.http is loaded here, once per Airflow process: a LocalExecutor (or Celery) worker loads the
# plugins before it forks a process for each task, so every task finds the fleet client and `requests`
# already imported (importing them in each task cost it 30-50 ms before its first fleet call, six times a stop).
import railyard.fleet.http  # noqa: F401
from railyard_airflow.audit import AuditMiddleware
from railyard_airflow.ui.app import create_app


class RailyardPlugin(AirflowPlugin):
    name = "railyard"
    fastapi_root_middlewares = [
        {"middleware": AuditMiddleware, "args": [], "kwargs": {}, "name": "railyard-audit"},
    ]
    fastapi_apps = [{"app": create_app(), "url_prefix": "/railyard", "name": "Railyard"}]
    external_views = [
        {"name": "Railyard", "href": "/railyard/", "destination": "nav", "url_route": "railyard",
         "nav_top_level": True},
    ]


def folder_plugin() -> type[RailyardPlugin] | None:
    """The plugin class for the plugins folder to register, or None where an installed distribution's entry
    point registers it already (Airflow would load both and report the second as an import error)."""
    if any(ep.value.partition(":")[0] == __name__ for ep in entry_points(group="airflow.plugins")):
        return None
    return RailyardPlugin
