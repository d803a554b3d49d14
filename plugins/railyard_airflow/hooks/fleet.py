"""FleetHook: the fleet adapter, built from the config's `fleet.backend` and an Airflow Connection."""

from __future__ import annotations

from functools import cached_property
from typing import Any

from airflow.sdk import BaseHook

from railyard.domain.config import RailyardConfig, config_path
from railyard.fleet.port import Fleet


class FleetHook(BaseHook):
    """The fleet of the config: `http` (default) talks to a fleet manager that speaks Railyard's fleet
    API (the simulator is one); `ssh` drives plain hosts over SSH (`SshFleetHook`); `slurm` drives a
    Slurm cluster (`railyard.backends.slurm.fleet.SlurmFleet`, configured by `fleet.slurm`).

    Connection for `http`: conn_type `http`, host, port, schema `http`/`https`; never credentials in the
    host (a `user:pass@` URL is refused). Authentication, in this order (`fleet_auth`):

    - extra `auth`: `bearer`, `basic` or `none` says which, explicitly; without it:
    - extra `token` set → bearer with that token;
    - login and password set → HTTP basic auth;
    - password alone (no login) → bearer with the password as the token (the password field is
      masked in Airflow's UI and logs, so it is the natural place for a token);
    - nothing set → no authentication.
    A token in two places (extra `token` and password), a token beside login/password, or a login
    without a password is refused as ambiguous, naming the fields, never the values.

    TLS: extra `verify` (true/false, default true), `ca_bundle` (path of a CA bundle to verify the
    server with), `cert` (client certificate PEM) and `key` (its private key, if not in `cert`).
    Timeouts: extra `read_timeout`, `connect_timeout` (seconds).
    """

    conn_name_attr = "fleet_conn_id"
    default_conn_name = "railyard_fleet"
    conn_type = "http"
    hook_name = "Railyard fleet"

    def __init__(self, fleet_conn_id: str = default_conn_name, config_path: str | None = None, **kwargs: Any) -> None:
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
        """The fleet API's URL (backend `http`), from the connection."""
        conn = self.get_connection(self.fleet_conn_id)
        host = conn.host or "127.0.0.1"
        if "://" in host:
            return host.rstrip("/")
        scheme = conn.schema or "http"
        port = f":{conn.port}" if conn.port else ""
        return f"{scheme}://{host}{port}"

    def get_conn(self, *, read_only: bool = False) -> Fleet:
        """The fleet (`railyard.fleet.registry.build_fleet`), with the credentials of Airflow's Connections.
        `read_only` (the Railyard page): an SSH fleet reads the database as the workers left it, a Slurm fleet
        reads Slurm and the versions Railyard verified (node features); neither reaches a host (the api-server
        may have no route or key to them)."""
        from railyard.fleet.registry import build_fleet

        if read_only and self.backend in ("ssh", "slurm"):
            return build_fleet(self.config, read_only=True)
        if self.backend == "ssh":
            from railyard_airflow.hooks.ssh import SshFleetHook

            ssh = self.config.fleet.ssh
            assert ssh is not None
            return SshFleetHook(ssh.connection).fleet(self.config)
        if self.backend == "slurm":
            return _slurm_fleet(self.config)
        conn = self.get_connection(self.fleet_conn_id)
        extra = conn.extra_dejson
        auth = fleet_auth(conn.login, conn.password, extra, conn_id=self.fleet_conn_id)
        for secret in (auth.get("token"), auth.get("password")):
            _mask(secret)
        return build_fleet(self.config, http={
            "base_url": self.base_url, **auth, **fleet_tls(extra, conn_id=self.fleet_conn_id),
            "read_timeout": float(extra.get("read_timeout", 15.0)),
            "connect_timeout": float(extra.get("connect_timeout", 3.0))})

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        return {
            "hidden_fields": [],
            "relabeling": {"password": "Password, or the bearer token when Login is empty"},
            "placeholders": {
                "host": "fleet-manager.example.com",
                "schema": "https",
                "extra": '{"auth": "bearer", "verify": true, "ca_bundle": "/path/ca.pem", '
                         '"cert": "/path/client.pem", "key": "/path/client.key", "read_timeout": 15}',
            },
        }


def fleet_auth(login: str | None, password: str | None, extra: dict[str, Any], *,
               conn_id: str = "fleet") -> dict[str, str]:
    """The HttpFleet auth arguments of an http fleet connection (see FleetHook): `{"token": ...}`,
    `{"login": ..., "password": ...}` or `{}`. Refusals name fields, never values."""
    login, password = login or None, password or None
    token = extra.get("token") or None
    mode = str(extra.get("auth") or "").strip().lower() or None
    where = f"fleet connection {conn_id!r}"
    if mode not in (None, "bearer", "basic", "none"):
        raise ValueError(f"{where}: extra.auth must be bearer, basic or none, got {mode!r}")
    if token is not None and not isinstance(token, str):
        raise ValueError(f"{where}: extra.token must be a string")
    if token and password:
        raise ValueError(f"{where}: a token is set both in extra.token and in the password; keep one")
    if mode == "none":
        if token or login or password:
            raise ValueError(f"{where}: extra.auth is none but credentials are set")
        return {}
    if mode == "basic" or (mode is None and login and not token):
        if token:
            raise ValueError(f"{where}: extra.auth is basic but extra.token is set; drop one")
        if not (login and password):
            raise ValueError(f"{where}: basic auth needs both login and password")
        return {"login": login, "password": password}
    # bearer: explicit, or a token / a lone password
    if login:
        raise ValueError(f"{where}: a bearer token is used with no login; clear the login "
                         "(or set extra.auth to basic for login/password)")
    if token or password:
        return {"token": str(token or password)}
    if mode == "bearer":
        raise ValueError(f"{where}: extra.auth is bearer but no token is set (password or extra.token)")
    return {}


def fleet_tls(extra: dict[str, Any], *, conn_id: str = "fleet") -> dict[str, Any]:
    """HttpFleet's `verify` and `cert` from the connection's extra (`verify`, `ca_bundle`, `cert`, `key`)."""
    where = f"fleet connection {conn_id!r}"
    raw = extra.get("verify", True)
    if isinstance(raw, str):
        if raw.strip().lower() in ("true", "1", "yes"):
            raw = True
        elif raw.strip().lower() in ("false", "0", "no"):
            raw = False
        else:  # a path given as verify, as requests itself allows
            raw = raw.strip()
    ca_bundle = extra.get("ca_bundle") or None
    if ca_bundle is not None:
        if raw is False:
            raise ValueError(f"{where}: extra.ca_bundle is set but extra.verify is false; drop one")
        raw = str(ca_bundle)
    out: dict[str, Any] = {"verify": raw}
    cert, key = extra.get("cert") or None, extra.get("key") or None
    if key and not cert:
        raise ValueError(f"{where}: extra.key is set without extra.cert")
    if cert:
        out["cert"] = (str(cert), str(key)) if key else str(cert)
    return out


def _mask(secret: str | None) -> None:
    """Tell Airflow's secrets masker about a secret read from the extra (the password is masked already,
    but the extra is masked only as a whole JSON string)."""
    if not secret:
        return
    try:
        from airflow.sdk.log import mask_secret

        mask_secret(secret)
    except Exception:  # pragma: no cover - masking is best effort; the value is never logged by us
        pass


_SLURM: dict[str, Fleet] = {}


def _slurm_fleet(config: RailyardConfig) -> Fleet:
    """One SlurmFleet per process and config (its SSH connections and version cache are reused).
    Nodes are reached with the credentials of the Airflow SSH connection `fleet.ssh.connection`."""
    import hashlib

    from railyard.fleet.registry import build_fleet

    key = hashlib.sha256(config.model_dump_json().encode()).hexdigest()
    if key not in _SLURM:
        creds = None
        slurm, ssh = config.fleet.slurm, config.fleet.ssh
        if ssh is not None and (slurm is None or slurm.runner == "ssh"):
            from railyard_airflow.hooks.ssh import SshFleetHook

            creds = SshFleetHook(ssh.connection).credentials(config)
        _SLURM[key] = build_fleet(config, ssh=creds)
    return _SLURM[key]
