"""FleetHook: the fleet adapter, built from an Airflow Connection."""

from __future__ import annotations

from functools import cached_property

from airflow.sdk import BaseHook

from railyard.fleet.http import HttpFleet


class FleetHook(BaseHook):
    """Talks to a fleet manager that speaks Railyard's fleet API (the simulator is one).

    Connection: conn_type `http`, host, port, schema `http`/`https`; extra `read_timeout`.
    """

    conn_name_attr = "fleet_conn_id"
    default_conn_name = "railyard_fleet"
    conn_type = "http"
    hook_name = "Railyard fleet"

    def __init__(self, fleet_conn_id: str = default_conn_name, **kwargs) -> None:
        super().__init__(**kwargs)
        self.fleet_conn_id = fleet_conn_id

    @cached_property
    def base_url(self) -> str:
        conn = self.get_connection(self.fleet_conn_id)
        host = conn.host or "127.0.0.1"
        if "://" in host:
            return host.rstrip("/")
        scheme = conn.schema or "http"
        port = f":{conn.port}" if conn.port else ""
        return f"{scheme}://{host}{port}"

    def get_conn(self) -> HttpFleet:
        extra = self.get_connection(self.fleet_conn_id).extra_dejson
        return HttpFleet(self.base_url, read_timeout=float(extra.get("read_timeout", 15.0)))
