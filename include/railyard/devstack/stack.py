"""Start and stop the real parts on one machine: the fleet simulator and `airflow standalone`.

Used by the demo, the end-to-end tests and the benchmarks, so all three run the same stack.
Talks to Airflow only through processes and its REST API (no Airflow imports in the core).

The simulator's API is authenticated as in production: each Stack makes a random bearer token
(`fleet_token`; None turns authentication off), hands it to the simulator in a 0600 file
(`--token-file`, never on a command line or in Airflow's environment as a variable of its own) and to
Airflow as the password of the fleet connection (`AIRFLOW_CONN_<fleet.connection>`, extra
`auth: bearer`). `fleet()` is an HttpFleet that carries it.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import requests

from railyard.domain.config import RailyardConfig, config_path, load_config
from railyard.fleet.http import HttpFleet

ROOT = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
T = TypeVar("T")


class StackError(RuntimeError):
    pass


def free_port() -> int:
    """A port free on every address, chosen below the kernel's ephemeral range. A port the kernel hands
    out (bind to 0) is one it may give again to any outgoing connection before the server that was meant
    to get it binds, or to a client's retries towards that very port, which then connect to themselves."""
    low = _ephemeral_low()
    rng = secrets.SystemRandom()
    for _ in range(200):
        port = rng.randrange(10000, low)
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # every try was taken: what the kernel gives
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ephemeral_low() -> int:
    """The lowest port of the kernel's ephemeral range (Linux's default where it cannot be read)."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    return low if low > 11000 else 32768


def ensure_port_free(port: int, what: str) -> None:
    """Refuse, naming the port and what sets it, when something already listens on 127.0.0.1:`port`.
    (SO_REUSEADDR: connections of an earlier server lingering in TIME_WAIT do not count; a listener does.)"""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            raise StackError(f"port {port} on 127.0.0.1 is in use ({what}): another demo (`make stop` stops every "
                             "demo) or another server; choose a free port there") from None


def _wait(what: str, timeout: float, probe: Callable[[], T | None], proc: subprocess.Popen[bytes] | None = None,
          log: Path | None = None) -> T:
    deadline = time.monotonic() + timeout
    last_exc: Exception | None = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = log.read_text()[-3000:] if log and log.exists() else ""
            raise StackError(f"{what}: process exited with {proc.returncode}\n{tail}")
        try:
            out = probe()
            if out:
                return out
        except Exception as exc:  # not up yet
            last_exc = exc
        time.sleep(0.3)
    raise StackError(f"{what} not ready within {timeout:.0f}s (last error: {last_exc})")


# ---- processes: what a session started, found through /proc ----------------------------------------------
def _stat(pid: int) -> tuple[str, int, int, int, int] | None:
    """(state, ppid, process group, session, start time in clock ticks) of a process, None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    f = raw[raw.rindex(")") + 2:].split()
    return f[0], int(f[1]), int(f[2]), int(f[3]), int(f[19])


def start_ticks(pid: int) -> int | None:
    """When a process started (clock ticks since boot): with its pid, a name no later process can take."""
    st = _stat(pid)
    return None if st is None else st[4]


def running(pid: int, ticks: int | None = None) -> bool:
    """The process runs (a zombie does not), and is the one that started at `ticks` when given."""
    st = _stat(pid)
    return st is not None and st[0] != "Z" and (ticks is None or st[4] == ticks)


def session_of(pid: int) -> int | None:
    """The session of a running process."""
    st = _stat(pid)
    return None if st is None or st[0] == "Z" else st[3]


def session_members(sid: int) -> list[int]:
    """Live processes (zombies left out) of session `sid`: whatever its leader started, in any process group
    (Airflow puts each task process in a group of its own), orphans included; never this process."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit() and int(d) != os.getpid():
            st = _stat(int(d))
            if st is not None and st[3] == sid and st[0] != "Z":
                out.append(int(d))
    return out


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def stop_session(sid: int, grace: float = 30, leader: subprocess.Popen[bytes] | None = None) -> list[int]:
    """Stop everything in session `sid` (a process started with `start_new_session`, and all it started):
    SIGTERM to all of it, up to `grace` seconds to exit, then SIGKILL to what is left (Airflow's orphaned
    LocalExecutor workers ignore SIGTERM). Works when the leader is already gone. Returns the pids that
    needed SIGKILL."""
    members = session_members(sid)
    _signal_all(members, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while members and time.monotonic() < deadline:
        if leader is not None:
            leader.poll()  # reap it, or it stays a member (a zombie) of the session
        time.sleep(0.2)
        members = session_members(sid)
    killed = list(members)
    while members and time.monotonic() < deadline + 10:
        _signal_all(members, signal.SIGKILL)
        if leader is not None:
            leader.poll()
        time.sleep(0.1)
        members = session_members(sid)
    if leader is not None and leader.poll() is None:
        leader.wait(5)
    if members:
        raise StackError(f"session {sid}: still running after SIGKILL: {members}")
    return killed


def _stop_group(proc: subprocess.Popen[bytes] | None, grace: float = 30) -> None:
    """Stop a process started with `start_new_session` and everything it started (see `stop_session`)."""
    if proc is not None:
        stop_session(proc.pid, grace, leader=proc)


class AirflowRest:
    """Airflow's REST API, as the admin: one client for `Stack` (airflow standalone) and the tests'
    distributed stack. A subclass gives `api` (the base URL), `config`, `_admin_password()` and
    `_check_alive()` (raise when its Airflow is gone), and sets `_token = None` when it starts."""

    config: RailyardConfig
    _token: str | None
    run_poll_s: float = 1.0

    @property
    def api(self) -> str:
        raise NotImplementedError

    def _admin_password(self) -> str | None:
        raise NotImplementedError

    def _check_alive(self) -> None:
        pass

    def token(self, username: str = "admin", password: str | None = None) -> str:
        r = requests.post(f"{self.api}/auth/token",
                          json={"username": username, "password": password or self._admin_password()}, timeout=10)
        if r.status_code not in (200, 201):
            raise StackError(f"login as {username} failed: {r.status_code} {r.text[:200]}")
        return str(r.json()["access_token"])

    def rest(self, method: str, path: str, ok: tuple[int, ...] = (200, 201), _tries: int = 0, *,
             retry: bool = False, **kw: Any) -> dict[str, Any]:
        """One call of Airflow's REST API. A 5xx (SQLite under standalone is sometimes briefly locked) is
        retried for GET and PATCH, and for a POST the caller made idempotent (`retry`: its own id, 409 in `ok`)."""
        if self._token is None:
            self._token = self.token()
        r = requests.request(method, f"{self.api}/api/v2{path}", headers={"Authorization": f"Bearer {self._token}"},
                             timeout=30, **kw)
        if r.status_code == 401 and _tries < 3:
            self._token = self.token()
            return self.rest(method, path, ok, _tries + 1, retry=retry, **kw)
        if r.status_code >= 500 and (retry or method in ("GET", "PATCH")) and _tries < 3:
            time.sleep(1)
            return self.rest(method, path, ok, _tries + 1, retry=retry, **kw)
        if r.status_code not in ok:
            raise StackError(f"{method} {path}: {r.status_code} {r.text[:300]}")
        return r.json() if r.content else {}

    def ensure_pool(self) -> None:
        body = {"name": self.config.pool, "slots": self.config.max_domains_down,
                "description": "Railyard: every disruptive task; sized by max_domains_down", "include_deferred": False}
        r = self.rest("PATCH", f"/pools/{self.config.pool}", ok=(200, 404), json=body)
        if r.get("name") != self.config.pool:  # 409: a retried POST that had gone through
            self.rest("POST", "/pools", ok=(200, 201, 409), retry=True, json=body)

    def dag_present(self, dag_id: str) -> bool:
        return self.rest("GET", f"/dags/{dag_id}", ok=(200, 404)).get("dag_id") == dag_id

    def trigger(self, dag_id: str, conf: dict[str, Any] | None = None) -> str:
        """Trigger a run with an id of our own, so that a retry after a transient 5xx (SQLite busy)
        cannot start a second run: the retry either creates it or finds it (409)."""
        self.rest("PATCH", f"/dags/{dag_id}", json={"is_paused": False})
        run_id = f"manual__{time.strftime('%Y%m%dT%H%M%S')}_{os.urandom(3).hex()}"
        body = {"dag_run_id": run_id, "logical_date": None, "conf": conf or {}}
        self.rest("POST", f"/dags/{dag_id}/dagRuns", ok=(200, 201, 409), retry=True, json=body)
        return run_id

    def run_state(self, dag_id: str, run_id: str) -> str:
        return str(self.rest("GET", f"/dags/{dag_id}/dagRuns/{run_id}")["state"])

    def task_instances(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        """Every task instance of the run: the API answers at most 100 per page (a 64-domain train has 390+)."""
        tis: list[dict[str, Any]] = []
        while True:
            page = self.rest("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances",
                             params={"limit": 100, "offset": len(tis), "order_by": "id"})
            tis += page["task_instances"]
            if not page["task_instances"] or len(tis) >= int(page["total_entries"]):
                return tis

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str | None]:
        return {ti["task_id"]: ti["state"] for ti in self.task_instances(dag_id, run_id)}

    def tries(self, dag_id: str, run_id: str, task_id: str) -> list[dict[str, Any]]:
        """Every try of a task instance (its history and the current one): try_number, state, hostname."""
        path = f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/tries"
        return sorted(self.rest("GET", path)["task_instances"], key=lambda t: int(t["try_number"]))

    def wait_run(self, dag_id: str, run_id: str, timeout: float, on_poll: Callable[[], None] | None = None) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._check_alive()
            state = self.run_state(dag_id, run_id)
            if on_poll is not None:
                on_poll()
            if state in ("success", "failed"):
                return state
            time.sleep(self.run_poll_s)
        raise StackError(f"{dag_id} {run_id} did not finish within {timeout:.0f}s")


@dataclass
class Stack(AirflowRest):
    """One simulator and one Airflow, in `home` (a fresh directory each start)."""

    home: Path
    config_file: Path = field(default_factory=lambda: config_path().resolve())
    airflow_port: int = 8080
    sim_port: int | None = None
    fast_scheduler: bool = True
    extra_env: dict[str, str] = field(default_factory=dict)
    sim: subprocess.Popen[bytes] | None = None
    airflow: subprocess.Popen[bytes] | None = None
    extra: list[subprocess.Popen[bytes]] = field(default_factory=list)  # components restarted by hand
    orphans: list[tuple[int, int | None]] = field(default_factory=list)  # (pid, start) of a killed scheduler's children
    fleet_token: str | None = field(default_factory=lambda: secrets.token_urlsafe(32), repr=False)
    # where Airflow and Railyard come from: this checkout by default; an installed package's own virtualenv,
    # folders and no checkout on the path for a test of the wheel as a user installs it
    bin_dir: Path = BIN
    dags_folder: Path = ROOT / "dags"
    plugins_folder: Path = ROOT / "plugins"
    checkout_on_path: bool = True

    def __post_init__(self) -> None:
        self.home = Path(self.home).resolve()
        self.config_file = Path(self.config_file).resolve()
        self.config: RailyardConfig = load_config(self.config_file)
        self.sim_port = self.sim_port or self.config.simulator.port
        self._token: str | None = None
        # the scheduler's and the triggerer's log servers (Airflow's 8793 and 8794): ports of this stack's own,
        # so that two stacks on one machine do not fight for them (kept across restarts of a component)
        self._log_ports = (free_port(), free_port())

    # ---- paths and environment -----------------------------------------------------------------
    @property
    def airflow_home(self) -> Path:
        return self.home / "airflow"

    @property
    def fleet_url(self) -> str:
        return f"http://127.0.0.1:{self.sim_port}"

    @property
    def token_file(self) -> Path:
        return self.home / "sim.token"

    def fleet(self, **kw: Any) -> HttpFleet:
        """An HttpFleet on this stack's simulator, with its token."""
        return HttpFleet(self.fleet_url, token=self.fleet_token, **kw)

    def fleet_connection(self) -> dict[str, Any]:
        """The Airflow connection of the fleet (as AIRFLOW_CONN_<id> JSON): the token is its password."""
        conn: dict[str, Any] = {"conn_type": "http", "host": "127.0.0.1", "port": self.sim_port, "schema": "http"}
        if self.fleet_token:
            conn |= {"password": self.fleet_token, "extra": {"auth": "bearer"}}
        return conn

    @property
    def api(self) -> str:
        return f"http://127.0.0.1:{self.airflow_port}"

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("SLURM_JWT", None)
        env.pop("RAILYARD_FLEET_TOKEN", None)  # the simulator reads its token from the file this Stack writes
        env.pop("RAILYARD_FLEET_TOKEN_FILE", None)
        env.update(
            {
                "PATH": f"{self.bin_dir}:{env.get('PATH', '')}",
                "AIRFLOW_HOME": str(self.airflow_home),
                "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags_folder),
                "AIRFLOW__CORE__PLUGINS_FOLDER": str(self.plugins_folder),
                "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
                "AIRFLOW__API__PORT": str(self.airflow_port),
                "AIRFLOW__API__BASE_URL": self.api,
                "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.api}/execution/",
                "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
                "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(self._log_ports[0]),
                "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(self._log_ports[1]),
                f"AIRFLOW_CONN_{self.config.fleet.connection.upper()}": json.dumps(self.fleet_connection()),
                "RAILYARD_CONFIG": str(self.config_file),
                "RAILYARD_HOME": str(self.home),
                "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "plugins"), env.get("PYTHONPATH")])),
            }
        )
        if not self.checkout_on_path:
            env.pop("PYTHONPATH")
            env.pop("VIRTUAL_ENV", None)
        if self.fast_scheduler:
            env["AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME"] = "0.05"
            env["AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC"] = "1"
        env.update(self.extra_env)
        return env

    # ---- the simulator --------------------------------------------------------------------------
    def check_ports(self) -> None:
        """Refuse before anything is touched when the simulator's or Airflow's port is taken."""
        self._check_sim_port()
        self._check_airflow_port()

    def _check_sim_port(self) -> None:
        ensure_port_free(int(self.sim_port or 0), f"simulator.port in {self.config_file}")

    def _check_airflow_port(self) -> None:
        ensure_port_free(self.airflow_port, "Airflow's port, RAILYARD_AIRFLOW_PORT")

    def start_sim(self, fresh: bool = True) -> HttpFleet:
        self._check_sim_port()
        self.home.mkdir(parents=True, exist_ok=True)
        db = self.home / "sim.db"
        if fresh and db.exists():
            db.unlink()
        log = self.home / "sim.log"
        cmd = [str(self.bin_dir / "railyard"), "sim", "serve", "--config", str(self.config_file), "--db", str(db),
               "--port", str(self.sim_port)]
        if self.fleet_token:
            self._write_token()
            cmd += ["--token-file", str(self.token_file)]
        self.sim = subprocess.Popen(cmd, stdout=log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True,
                                    env=self.env(), cwd=str(self.home))
        fleet = self.fleet(retries=0, connect_timeout=1)
        _wait("fleet simulator", 30, fleet.capacity, self.sim, log)
        return self.fleet()

    def _write_token(self) -> None:
        assert self.fleet_token
        self.token_file.unlink(missing_ok=True)
        fd = os.open(self.token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self.fleet_token + "\n")

    def stop_sim(self) -> None:
        _stop_group(self.sim, grace=10)
        self.sim = None

    # ---- Airflow ----------------------------------------------------------------------------------
    def start_airflow(self, timeout: float = 180) -> None:
        self._check_airflow_port()
        if self.airflow_home.exists():
            shutil.rmtree(self.airflow_home)
        self.airflow_home.mkdir(parents=True)
        log = self.home / "airflow.log"
        self.airflow = subprocess.Popen(
            [str(self.bin_dir / "airflow"), "standalone"], stdout=log.open("ab"), stderr=subprocess.STDOUT,
            start_new_session=True, env=self.env(), cwd=str(self.home),
        )

        def healthy() -> bool:
            h = requests.get(f"{self.api}/api/v2/monitor/health", timeout=3).json()
            parts = ("metadatabase", "scheduler", "triggerer", "dag_processor")
            return all((h.get(p) or {}).get("status") == "healthy" for p in parts)

        _wait("airflow standalone", timeout, healthy, self.airflow, log)
        _wait("airflow admin password", 30, lambda: self.password)

    def kill_scheduler(self) -> int:
        """SIGKILL the running scheduler (standalone's child, or one started by `restart_scheduler`).
        Its LocalExecutor workers live on as orphans (they ignore SIGTERM), as they would on a real machine;
        they are remembered, and `end_orphans` (or `stop`) ends them."""
        import psutil

        roots = [p for p in [self.airflow, *self.extra] if p is not None and p.poll() is None]
        for root in roots:
            for proc in [psutil.Process(root.pid), *psutil.Process(root.pid).children(recursive=True)]:
                try:
                    cmd = proc.cmdline()
                except psutil.Error:
                    continue
                if len(cmd) >= 2 and cmd[-1] == "scheduler" and "airflow" in " ".join(cmd[:-1]):
                    children = proc.children(recursive=True)
                    proc.kill()
                    self.orphans += [(c.pid, start_ticks(c.pid)) for c in children]
                    return int(proc.pid)
        raise StackError("no running scheduler found")

    def end_orphans(self, grace: float = 5) -> list[int]:
        """End what killed schedulers left behind: SIGTERM, then SIGKILL after `grace`. Returns the pids ended.
        Their running tasks are done by the time a test calls this (its run has ended)."""
        live = [pid for pid, start in self.orphans if start is not None and start_ticks(pid) == start
                and (_stat(pid) or ("Z",))[0] != "Z"]
        self.orphans.clear()
        _signal_all(live, signal.SIGTERM)
        deadline = time.monotonic() + grace
        left = live
        while left and time.monotonic() < deadline + 10:
            if time.monotonic() >= deadline:
                _signal_all(left, signal.SIGKILL)
            time.sleep(0.1)
            left = [pid for pid in left if (_stat(pid) or ("Z",))[0] != "Z"]
        if left:
            raise StackError(f"orphaned scheduler children still running after SIGKILL: {left}")
        return live

    def restart_scheduler(self) -> None:
        """Start a new `airflow scheduler` beside standalone's other components (same environment)."""
        log = self.home / "scheduler-restarted.log"
        self.extra.append(subprocess.Popen([str(self.bin_dir / "airflow"), "scheduler"], stdout=log.open("ab"),
                                           stderr=subprocess.STDOUT, start_new_session=True, env=self.env(),
                                           cwd=str(self.home)))

    def stop_airflow(self) -> None:
        """Every Airflow process this stack started, and all they started (orphans of a killed scheduler too)."""
        for p in self.extra:
            _stop_group(p, grace=10)
        self.extra.clear()
        _stop_group(self.airflow)
        self.airflow = None
        self.end_orphans(grace=0)

    def stop(self) -> None:
        self.stop_airflow()
        self.stop_sim()

    @property
    def password(self) -> str | None:
        return self.password_of("admin")

    def password_of(self, user: str) -> str | None:
        """Airflow's SimpleAuthManager generates each user's password once, into this file."""
        f = self.airflow_home / "simple_auth_manager_passwords.json.generated"
        return json.loads(f.read_text()).get(user) if f.exists() else None

    # ---- REST (AirflowRest) -----------------------------------------------------------------------
    def _admin_password(self) -> str | None:
        return self.password

    def _check_alive(self) -> None:
        if self.airflow is not None and self.airflow.poll() is not None:
            raise StackError("airflow standalone exited while the run was going")

    def wait_dag(self, dag_id: str, timeout: float = 120) -> None:
        _wait(f"DAG {dag_id} parsed", timeout, lambda: self.dag_present(dag_id) or None, self.airflow,
              self.home / "airflow.log")

