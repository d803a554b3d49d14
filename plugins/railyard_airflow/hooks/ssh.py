"""SshFleetHook: credentials for plain SSH hosts from an Airflow SSH connection, and the SshFleet.

Connection (conn_type `ssh`, as providers-ssh reads it): `login`, extra `key_file`, and extra
`known_hosts`, the path of the pinned host keys of every host in `fleet.ssh.hosts`. The hook refuses
`no_host_key_check` and `allow_host_key_change`: a host whose key is unknown or changed is never
reached. The connection's host and port are not used; each host's address and port come from the
config. Without the connection, `fleet.ssh.user`, `key_file` and `known_hosts` are used.

Why not `SSHHook.get_conn()`: it loads `~/.ssh/known_hosts` besides the pinned keys and retries any
failure, a refused host key included, with 3-5 s sleeps. The connection is the same; the client is
`railyard.backends.ssh.runner.paramiko_connector`, which trusts only the pinned file and retries connection
errors only.
"""

from __future__ import annotations

import hashlib
import threading
from typing import Any, cast

from airflow.sdk import BaseHook

from railyard.backends.ssh.fleet import SshFleet
from railyard.backends.ssh.runner import Credentials
from railyard.domain.config import RailyardConfig
from railyard.fleet.registry import build_fleet

_FLEETS: dict[tuple[str, Credentials], SshFleet] = {}
_LOCK = threading.Lock()


class SshFleetHook(BaseHook):
    conn_name_attr = "ssh_conn_id"
    default_conn_name = "railyard_ssh"
    conn_type = "ssh"
    hook_name = "Railyard SSH hosts"

    def __init__(self, ssh_conn_id: str = default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.ssh_conn_id = ssh_conn_id

    def credentials(self, config: RailyardConfig) -> Credentials:
        ssh = config.fleet.ssh
        assert ssh is not None
        user, key_file, known_hosts = ssh.user, ssh.key_file, ssh.known_hosts
        try:
            conn = self.get_connection(self.ssh_conn_id)
        except Exception:  # noqa: BLE001 - no such connection: the config's own values
            conn = None
        if conn is not None:
            extra = conn.extra_dejson
            for flag in ("no_host_key_check", "allow_host_key_change"):
                if str(extra.get(flag, "false")).lower() == "true":
                    raise ValueError(f"connection {self.ssh_conn_id}: extra {flag}=true is refused; "
                                     "pin the host keys in extra known_hosts")
            user = conn.login or user
            key_file = extra.get("key_file") or key_file
            known_hosts = extra.get("known_hosts") or known_hosts
        missing = [n for n, v in (("login", user), ("key_file", key_file), ("known_hosts", known_hosts)) if not v]
        if missing:
            raise ValueError(f"connection {self.ssh_conn_id}: missing {', '.join(missing)} "
                             "(or set fleet.ssh.user / key_file / known_hosts)")
        return Credentials(user=str(user), key_file=str(key_file), known_hosts=str(known_hosts))

    def fleet(self, config: RailyardConfig) -> SshFleet:
        """One SshFleet per process, config and credentials: its SSH connections are reused across tasks."""
        ssh = config.fleet.ssh
        assert ssh is not None
        creds = self.credentials(config)
        key = (hashlib.sha256(config.model_dump_json().encode()).hexdigest(), creds)
        with _LOCK:
            fleet = _FLEETS.get(key)
            if fleet is None:
                fleet = cast(SshFleet, build_fleet(config, ssh=creds))
                _FLEETS[key] = fleet
            return fleet

    def get_conn(self) -> SshFleet:
        from railyard_airflow.context import config

        return self.fleet(config(None))
