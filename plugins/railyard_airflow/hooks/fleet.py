"""FleetHook: the fleet adapter, built from the config's `fleet.backend` and an Airflow Connection."""

from __future__ import annotations

from functools import cached_property

from airflow.sdk import BaseHook

from railyard.config import RailyardConfig, config_path
from railyard.fleet.http import HttpFleet
from railyard.fleet.port import Fleet

SSH_URL = "ssh-fleet:"  # what `base_url` says for the ssh backend; triggers turn it back into a fleet
SLURM_URL = "slurm-fleet:"  # the same for the slurm backend (railyard.slurm.fleet.SlurmFleet)


class FleetHook(BaseHook):
    """The fleet of the config: `http` (default) talks to a fleet manager that speaks Railyard's fleet
    API (the simulator is one); `ssh` drives plain hosts over SSH (`SshFleetHook`); `slurm` drives a
    Slurm cluster (`railyard.slurm.fleet.SlurmFleet`, configured by `fleet.slurm`).

    Connection for `http`: conn_type `http`, host, port, schema `http`/`https`; extra `read_timeout`.
    """

    conn_name_attr = "fleet_conn_id"
    default_conn_name = "railyard_fleet"
    conn_type = "http"
    hook_name = "Railyard fleet"

    def __init__(self, fleet_conn_id: str = default_conn_name, config_path: str | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.fleet_conn_id = fleet_conn_id
        self.config_path = config_path

    @cached_property
    def config(self) -> RailyardConfig:
        from railyard_airflow.context import config

        return config(str(config_path(self.config_path)))

    @property
    def backend(self) -> str:
        return self.config.fleet.backend

    @cached_property
    def base_url(self) -> str:
        if self.backend == "ssh":
            return SSH_URL + str(config_path(self.config_path))
        if self.backend == "slurm":
            return SLURM_URL + str(config_path(self.config_path))
        conn = self.get_connection(self.fleet_conn_id)
        host = conn.host or "127.0.0.1"
        if "://" in host:
            return host.rstrip("/")
        scheme = conn.schema or "http"
        port = f":{conn.port}" if conn.port else ""
        return f"{scheme}://{host}{port}"

    def get_conn(self) -> Fleet:
        if self.backend == "ssh":
            from railyard_airflow.hooks.ssh import SshFleetHook

            ssh = self.config.fleet.ssh
            assert ssh is not None
            return SshFleetHook(ssh.connection).fleet(self.config)
        if self.backend == "slurm":
            return _slurm_fleet(self.config)
        extra = self.get_connection(self.fleet_conn_id).extra_dejson
        return HttpFleet(self.base_url, read_timeout=float(extra.get("read_timeout", 15.0)))


_SLURM: dict[str, Fleet] = {}


def _slurm_fleet(config: RailyardConfig) -> Fleet:
    """One SlurmFleet per process and config (its SSH connections and version cache are reused).
    Nodes are reached with the credentials of the Airflow SSH connection `fleet.ssh.connection`."""
    import hashlib

    from railyard.slurm.fleet import fleet_from_config

    key = hashlib.sha256(config.model_dump_json().encode()).hexdigest()
    if key not in _SLURM:
        connect = None
        slurm, ssh = config.fleet.slurm, config.fleet.ssh
        if ssh is not None and (slurm is None or slurm.runner == "ssh"):
            from railyard.ssh.runner import paramiko_connector
            from railyard_airflow.hooks.ssh import SshFleetHook

            creds = SshFleetHook(ssh.connection).credentials(config)
            connect = paramiko_connector(creds, connect_timeout=ssh.connect_timeout_s)
        _SLURM[key] = fleet_from_config(config, connect)
    return _SLURM[key]


def fleet_for_url(url: str) -> Fleet:
    """The fleet a trigger was given: an HTTP fleet's URL, or the ssh backend's marker with its config."""
    if url.startswith(SSH_URL):
        return FleetHook(config_path=url[len(SSH_URL):]).get_conn()
    if url.startswith(SLURM_URL):
        return FleetHook(config_path=url[len(SLURM_URL):]).get_conn()
    return HttpFleet(url)
