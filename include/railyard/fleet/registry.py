"""`build_fleet`: the one place a config's `fleet.backend` becomes a `Fleet`.

The CLI, Airflow's `FleetHook` (tasks, triggers, the Railyard page) and the dev stack all call it; each
brings the credentials it has (the CLI the config's `fleet.ssh` key files, Airflow its Connections).
`fleet_class` names a backend's class without reaching any fleet, for what is decided when DAGs are
parsed (which optional capabilities the backend has: `railyard.fleet.port`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from railyard.domain.config import RailyardConfig
from railyard.fleet.port import Fleet, FleetError

if TYPE_CHECKING:
    from railyard.backends.ssh.runner import Credentials


def fleet_class(config: RailyardConfig) -> type:
    """The class `build_fleet` builds for this config (its module is imported; nothing is reached)."""
    backend = config.fleet.backend
    if backend == "slurm":
        from railyard.backends.slurm.fleet import SlurmFleet

        return SlurmFleet
    if backend == "ssh":
        from railyard.backends.ssh.fleet import SshFleet

        return SshFleet
    from railyard.fleet.http import HttpFleet

    return HttpFleet


def build_fleet(config: RailyardConfig, *, ssh: Credentials | None = None, http: Mapping[str, Any] | None = None,
                read_only: bool = False) -> Fleet:
    """The config's fleet.

    - `http`: the fleet API at `http["base_url"]`, with the rest of `http` as `HttpFleet`'s arguments
      (token or login/password, TLS, timeouts).
    - `ssh`: the config's hosts, reached with `ssh` (required unless `read_only`).
    - `slurm`: the config's cluster; its nodes reached with `ssh` when given, else with `fleet.ssh`'s
      user, key_file and known_hosts.
    `read_only` (plan, drift, the page): an SSH fleet reads the database as the workers left it, a Slurm
    fleet reads Slurm and the versions Railyard verified on each node; neither reaches a host.
    """
    backend = config.fleet.backend
    if backend == "slurm":
        from railyard.backends.slurm.fleet import SlurmFleet, fleet_from_config

        if read_only:
            return SlurmFleet.reader(config)
        connect = None
        if ssh is not None and config.fleet.ssh is not None:
            from railyard.backends.ssh.runner import paramiko_connector

            connect = paramiko_connector(ssh, connect_timeout=config.fleet.ssh.connect_timeout_s)
        return fleet_from_config(config, connect)
    if backend == "ssh":
        from railyard.backends.ssh.fleet import SshFleet

        if read_only:
            return SshFleet.reader(config)
        spec = config.fleet.ssh
        if spec is None:  # refused by the config's validation; kept for the type checker
            raise FleetError("fleet.ssh: required when fleet.backend is 'ssh'")
        if ssh is None:
            raise FleetError("fleet.ssh: no credentials to reach the hosts with (user, key_file, known_hosts)")
        from railyard.backends.ssh.runner import paramiko_connector

        return SshFleet.from_config(config, paramiko_connector(ssh, connect_timeout=spec.connect_timeout_s))
    if not http or not http.get("base_url"):
        raise FleetError("fleet.backend http: no fleet API URL to reach")
    from railyard.fleet.http import HttpFleet

    return HttpFleet(**http)
