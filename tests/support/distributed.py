"""The multi-machine shape of Railyard on one machine, from Debian packages: what `docker-compose.yaml`
runs, minus Docker.

    PostgreSQL  - Airflow's metadata DB (`airflow`), Celery's result backend (the same DB) and
                  Railyard's ledger (`railyard`, RAILYARD_LEDGER_URL), one server on a unix socket
    Redis       - the Celery broker
    Airflow     - `airflow db migrate` once, then api-server, scheduler, dag-processor, triggerer and two
                  `airflow celery worker`s, each a process (group) of its own, CeleryExecutor
    simulator   - `railyard sim serve`, with a bearer token (RAILYARD_FLEET_TOKEN)

Every Airflow component reads the same AIRFLOW_HOME (config, SimpleAuthManager's password file) and
writes task logs into the same log folder, as the compose file's shared `./config` and `./logs` mounts
do. Each worker stands for a machine of its own: its own working directory, its own RAILYARD_HOME, and
its own host name in the task instances (`[core] hostname_callable` = `worker_hostname` below, since
both run on this one host). Nothing of Railyard's is shared between workers except through the
ledger's database.

`airflow_settings()` is what this stack sets that a deployment must set the same way; the compose test
compares docker-compose.yaml's Airflow environment with it through `settings_that_matter()`.
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
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from railyard.devstack.stack import AirflowRest, StackError, free_port

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
MARKER = "RAILYARD_DISTRIBUTED_STACK"  # in the environment of every process the stack starts
WORKER_NAME = "RAILYARD_WORKER_NAME"  # a worker's name, read by `worker_hostname`
FLEET_TOKEN = "RAILYARD_FLEET_TOKEN"  # the simulator's bearer token (the compose file reads it from .env)
SIMPLE_AUTH = "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"
METADATA_DB = "airflow"
LEDGER_DB = "railyard"


def worker_hostname() -> str:
    """`[core] hostname_callable` of the stack: a worker's own name, so the task instances say which
    worker ran them (two workers on one host would both report its FQDN); other components: the FQDN."""
    return os.environ.get(WORKER_NAME) or socket.getfqdn()


# ---- the settings: what every Airflow component gets ----------------------------------------------------
def airflow_settings(*, metadata_url: str, ledger_url: str, broker_url: str, api_url: str, fleet_conn_id: str,
                     fleet_host: str, fleet_port: int, fleet_token: str, config_file: str,
                     pythonpath: str) -> dict[str, str]:
    """The environment every Airflow component of the stack shares: executor, databases, broker,
    recovery and scheduling speed, the fleet connection. docker-compose.yaml must say the same."""
    conn = {"conn_type": "http", "host": fleet_host, "port": fleet_port, "schema": "http",
            "password": fleet_token, "extra": {"auth": "bearer"}}
    return {
        "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": metadata_url,
        # Celery's result backend: the metadata database, through Celery's own SQLAlchemy backend
        "AIRFLOW__CELERY__RESULT_BACKEND": "db+" + metadata_url.replace("postgresql+psycopg2://", "postgresql://", 1),
        "AIRFLOW__CELERY__BROKER_URL": broker_url,
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{api_url}/execution/",
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        # trains have schedules: none may start by itself when a DAG first appears
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
        # fast scheduling (LAB.md: ~0.1-0.2 s between tasks instead of ~0.8 s)
        "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": "0.05",
        "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": "1",
        # a worker that dies (machine lost, OOM, SIGKILL) takes its tasks' heartbeats with it: the
        # scheduler fails them after this long and Airflow retries them on another worker
        "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "20",
        "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "5",
        f"AIRFLOW_CONN_{fleet_conn_id.upper()}": json.dumps(conn),
        "RAILYARD_CONFIG": config_file,
        "RAILYARD_LEDGER_URL": ledger_url,
        "PYTHONPATH": pythonpath,
    }


# Keys whose values are per run or per machine (hosts, ports, paths, secrets): left out of the comparison.
PER_RUN = frozenset({
    "PATH", "PYTHONPATH", "AIRFLOW_HOME", "AIRFLOW__CORE__DAGS_FOLDER", "AIRFLOW__CORE__PLUGINS_FOLDER",
    "AIRFLOW__API__HOST", "AIRFLOW__API__PORT", "AIRFLOW__API__BASE_URL", "AIRFLOW__API_AUTH__JWT_SECRET",
    "AIRFLOW__API__SECRET_KEY", "AIRFLOW__CORE__FERNET_KEY", "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT",
    "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT", "RAILYARD_CONFIG", "RAILYARD_HOME", WORKER_NAME, MARKER,
})
# Keys only this one-machine stack needs, each for a reason that a real deployment does not have.
TEST_ONLY = {
    "AIRFLOW__CORE__HOSTNAME_CALLABLE": "two workers on one host: each names itself (containers have own hostnames)",
    "AIRFLOW__CORE__AUTH_MANAGER": ("SimpleAuthManager (as `airflow standalone`); "
                                    "the compose file runs FAB with a user DB"),
    "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "SimpleAuthManager's users (the compose file's FAB creates its admin)",
}
_URLS = ("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "AIRFLOW__CELERY__RESULT_BACKEND", "AIRFLOW__CELERY__BROKER_URL",
         "RAILYARD_LEDGER_URL")
_BOOLS = ("AIRFLOW__CORE__LOAD_EXAMPLES", "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION")


def _server(url: str) -> tuple[str, ...]:
    """Where a database URL points: host, port, socket dir; scheme and database left out."""
    u = urlsplit(url)
    return (u.hostname or "", str(u.port or ""), *parse_qs(u.query).get("host", []))


def settings_that_matter(env: Mapping[str, str], fleet_token: str, fleet_conn_id: str = "railyard_fleet") -> dict:
    """`env` reduced to what must be equal between this stack and any deployment of it: the values of
    every setting, with hosts, ports, paths and credentials taken out of URLs and the fleet connection,
    the per-run keys (`PER_RUN`) and this stack's test-only keys (`TEST_ONLY`) dropped. Every other key
    is kept as it is, so a setting that one side has and the other has not is a difference."""
    out: dict = {}
    conn_key = f"AIRFLOW_CONN_{fleet_conn_id.upper()}"
    meta = env.get("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "")
    for key, value in env.items():
        if key in PER_RUN or key in TEST_ONLY:
            continue
        if key in _URLS:
            u = urlsplit(value)
            shape: dict = {"scheme": u.scheme, "database": u.path.lstrip("/")}
            if key != "AIRFLOW__CELERY__BROKER_URL":
                shape["same_server_as_metadata"] = _server(value) == _server(meta)
            out[key] = shape
        elif key == "AIRFLOW__CORE__EXECUTION_API_SERVER_URL":
            out[key] = {"scheme": urlsplit(value).scheme, "path": urlsplit(value).path}
        elif key == conn_key:
            conn = json.loads(value)
            conn.pop("host", None)
            conn.pop("port", None)
            if "password" in conn:
                conn["password"] = "<fleet token>" if conn["password"] == fleet_token else "<another password>"
            out[key] = conn
        elif key in _BOOLS:
            out[key] = str(value).strip().lower() == "true"
        else:
            out[key] = value
    return out


def reference_settings() -> dict:
    """`settings_that_matter` of everything a DistributedStack sets for its Airflow components (the
    control ones and the workers alike: they must agree), from placeholder servers; nothing is started."""

    class _Placeholder:
        def url(self, db: object = 0) -> str:
            return f"postgresql+psycopg2://postgres@/{db}?host=/run/pg" if isinstance(db, str) else \
                f"redis://127.0.0.1:6379/{db}"

    from railyard.domain.config import config_path

    stack = DistributedStack(home=Path(tempfile.gettempdir()) / "unused", config_file=config_path())
    stack.pg = stack.redis = _Placeholder()
    seen = {c: settings_that_matter(stack.own_env(c), stack.fleet_token, stack.config.fleet.connection)
            for c in ("api-server", "scheduler", "dag-processor", "triggerer", *stack.workers)}
    first = next(iter(seen.values()))
    differ = [c for c, v in seen.items() if v != first]
    if differ:
        raise AssertionError(f"components of the stack disagree on settings that matter: {differ}")
    return first


# ---- processes --------------------------------------------------------------------------------------------
def _tree(pid: int) -> list:
    """The process and every descendant it has now (psutil.Process objects; identity-safe for kill)."""
    import psutil

    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def _kill_all(procs: list, sig: int = signal.SIGKILL) -> None:
    """Freeze every process (so none forks meanwhile), take in the children they had, then kill them all,
    and the process groups they lead (a task's process group holds what the task started)."""
    import psutil

    seen = {p.pid: p for p in procs}
    for p in list(seen.values()):
        try:
            p.suspend()
        except psutil.Error:
            pass
    for p in list(seen.values()):
        try:
            for c in p.children(recursive=True):
                seen.setdefault(c.pid, c)
                try:
                    c.suspend()
                except psutil.Error:
                    pass
        except psutil.Error:
            pass
    for p in seen.values():
        try:
            if os.getpgid(p.pid) == p.pid and p.is_running():
                os.killpg(p.pid, sig)
        except (OSError, psutil.Error):
            pass
        try:
            p.send_signal(sig)
            p.resume()  # a stopped process acts on SIGTERM only once it runs again (SIGKILL needs nothing)
        except psutil.Error:
            pass
    psutil.wait_procs(list(seen.values()), timeout=10)


@dataclass
class Component:
    name: str
    proc: subprocess.Popen
    log: Path
    killed: bool = False


@dataclass
class DistributedStack(AirflowRest):
    """PostgreSQL + Redis + the simulator + Airflow's components as separate processes (CeleryExecutor,
    two workers). Everything lives under `home`; `stop()` ends every process that `start()` began."""

    home: Path
    config_file: Path
    workers: tuple[str, ...] = ("worker-a", "worker-b")
    concurrency: int = 4
    with_sim: bool = True
    extra_env: dict[str, str] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    run_poll_s = 0.5  # a class attribute (AirflowRest.wait_run), not a field

    def __post_init__(self) -> None:
        from railyard.domain.config import load_config

        self.home = Path(self.home).resolve()
        self.config_file = Path(self.config_file).resolve()
        self.config = load_config(self.config_file)
        self.id = secrets.token_hex(6)
        self.api_port = free_port()
        self.sim_port = free_port()
        self.fleet_token = secrets.token_urlsafe(24)
        self.admin_password = secrets.token_urlsafe(12)
        self._jwt_secret = secrets.token_urlsafe(32)
        self._secret_key = secrets.token_urlsafe(32)
        self.components: dict[str, Component] = {}
        self.pg = None  # tests.support.postgres.PostgresServer
        self.redis = None  # tests.support.redis.RedisServer
        self._pg_root: Path | None = None
        self._token: str | None = None
        self.leftovers: list[str] = []  # processes that outlived their component's graceful stop
        self._trigger_log_port = free_port()
        self._worker_log_port = free_port()  # the scheduler's log server, if it starts one: not Airflow's 8793
        self._service_pids: dict[str, int] = {}  # postgres, redis

    # ---- paths and URLs ---------------------------------------------------------------------------------
    @property
    def airflow_home(self) -> Path:
        return self.home / "airflow"

    @property
    def api(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    @property
    def fleet_url(self) -> str:
        return f"http://127.0.0.1:{self.sim_port}"

    @property
    def metadata_url(self) -> str:
        return self.pg.url(METADATA_DB)

    @property
    def ledger_url(self) -> str:
        return self.pg.url(LEDGER_DB)

    def worker_dir(self, name: str) -> Path:
        return self.home / "workers" / name

    def railyard_home(self, component: str) -> Path:
        """A worker's RAILYARD_HOME is its own; the scheduler's, triggerer's... are the control host's."""
        if component in self.workers:
            return self.worker_dir(component) / "railyard"
        return self.home / "control" / "railyard"

    # ---- environment --------------------------------------------------------------------------------------
    def settings(self) -> dict[str, str]:
        return airflow_settings(
            metadata_url=self.metadata_url, ledger_url=self.ledger_url, broker_url=self.redis.url(0),
            api_url=self.api, fleet_conn_id=self.config.fleet.connection, fleet_host="127.0.0.1",
            fleet_port=self.sim_port, fleet_token=self.fleet_token, config_file=str(self.config_file),
            pythonpath=os.pathsep.join([str(ROOT / "include"), str(ROOT / "plugins"), str(ROOT)]))

    def env(self, component: str = "control") -> dict[str, str]:
        """The process environment of `component`: this machine's, minus any Airflow or Railyard setting
        the caller has, plus `own_env(component)`."""
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("AIRFLOW__", "AIRFLOW_CONN_", "RAILYARD_", "_AIRFLOW")) and k != "SLURM_JWT"}
        env.update(self.own_env(component))
        env["PATH"] = f"{BIN}:{os.environ.get('PATH', '')}"
        return env

    def own_env(self, component: str) -> dict[str, str]:
        """Everything the stack sets for `component` (what `reference_settings` compares)."""
        env = self.settings()
        env.update({
            "AIRFLOW_HOME": str(self.airflow_home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
            "AIRFLOW__CORE__AUTH_MANAGER": SIMPLE_AUTH,
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
            "AIRFLOW__CORE__HOSTNAME_CALLABLE": f"{__name__}.worker_hostname",
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(self.api_port),
            "AIRFLOW__API__BASE_URL": self.api,
            "AIRFLOW__API_AUTH__JWT_SECRET": self._jwt_secret,
            "AIRFLOW__API__SECRET_KEY": self._secret_key,
            "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(self._trigger_log_port),
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(self._worker_log_port),
            "RAILYARD_HOME": str(self.railyard_home(component)),
            MARKER: self.id,
        })
        if component in self.workers:
            env[WORKER_NAME] = component
        env.update(self.extra_env)
        return env

    # ---- start ---------------------------------------------------------------------------------------------
    def start(self, timeout: float = 180) -> DistributedStack:
        from tests.support.postgres import PostgresServer
        from tests.support.redis import RedisServer

        t0 = time.monotonic()
        try:
            self.home.mkdir(parents=True, exist_ok=True)
            for own in (self.airflow_home, self.home / "workers", self.home / "control"):  # fresh each start
                shutil.rmtree(own, ignore_errors=True)
            # the postgres user must reach the data dir: a dir of its own, outside pytest's 0700 tmp
            self._pg_root = Path(tempfile.mkdtemp(prefix="ry-dist-pg-"))
            os.chmod(self._pg_root, 0o755)
            self.pg = PostgresServer(self._pg_root)
            self.pg.start()
            self._service_pids["postgres"] = self.pg.pid
            self.pg.create_database(METADATA_DB)
            self.pg.create_database(LEDGER_DB)
            shutil.rmtree(self.home / "redis", ignore_errors=True)
            self.redis = RedisServer(self.home / "redis")
            self.redis.start()
            self._service_pids["redis"] = self.redis.pid
            self.timings["postgres+redis"] = time.monotonic() - t0
            if self.with_sim:
                self.start_sim()
            self.airflow_home.mkdir(parents=True)
            self.railyard_home("control").mkdir(parents=True)
            # SimpleAuthManager generates a password only for users missing from this file
            (self.airflow_home / "simple_auth_manager_passwords.json.generated").write_text(
                json.dumps({"admin": self.admin_password}) + "\n")
            t = time.monotonic()
            log = self.home / "logs" / "db-migrate.log"
            log.parent.mkdir(parents=True, exist_ok=True)
            with log.open("wb") as out:
                r = subprocess.run([str(BIN / "airflow"), "db", "migrate"], stdout=out, stderr=subprocess.STDOUT,
                                   env=self.env(), cwd=str(self.home), timeout=300)
            if r.returncode != 0:
                raise StackError(f"airflow db migrate failed ({r.returncode}):\n{log.read_text()[-3000:]}")
            self.timings["db migrate"] = time.monotonic() - t
            t = time.monotonic()
            for name in ("api-server", "scheduler", "dag-processor", "triggerer"):
                self._spawn(name, [name])
            for w in self.workers:
                d = self.worker_dir(w)
                (d / "railyard").mkdir(parents=True)
                self._spawn(w, ["celery", "worker", "--celery-hostname", w, "--concurrency", str(self.concurrency),
                                "--pid", str(d / "worker.pid"), "--skip-serve-logs"], cwd=d)
            self.wait_healthy(timeout)
            self.timings["components healthy"] = time.monotonic() - t
            t = time.monotonic()
            self.wait_workers(self.workers, timeout=60)
            self.timings["workers registered"] = time.monotonic() - t
        except BaseException:
            self.stop()
            raise
        self.timings["start"] = time.monotonic() - t0
        return self

    def _spawn(self, name: str, args: list[str], cwd: Path | None = None) -> Component:
        log = self.home / "logs" / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
            proc = subprocess.Popen([str(BIN / "airflow"), *args], stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True, env=self.env(name),
                                    cwd=str(cwd or self.home))
        self.components[name] = Component(name, proc, log)
        return self.components[name]

    def start_sim(self) -> None:
        """`railyard sim serve`, as Stack.start_sim runs it, with the fleet token required."""
        from railyard.devstack.stack import _wait

        log = self.home / "logs" / "sim.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        env = self.env("sim")
        env[FLEET_TOKEN] = self.fleet_token
        (self.home / "sim.db").unlink(missing_ok=True)  # a fresh world each start
        with log.open("ab") as out:
            proc = subprocess.Popen(
                [str(BIN / "railyard"), "sim", "serve", "--config", str(self.config_file), "--db",
                 str(self.home / "sim.db"), "--host", "127.0.0.1", "--port", str(self.sim_port)],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, env=env,
                cwd=str(self.home))
        self.components["sim"] = Component("sim", proc, log)
        fleet = self.fleet(retries=0, connect_timeout=1)
        _wait("fleet simulator", 30, fleet.capacity, proc, log)

    def fleet(self, **kw):
        """An HttpFleet on the simulator that sends the stack's bearer token."""
        import inspect

        from railyard.fleet.http import HttpFleet

        if "token" in inspect.signature(HttpFleet).parameters:
            return HttpFleet(self.fleet_url, token=self.fleet_token, **kw)
        fleet = HttpFleet(self.fleet_url, **kw)
        fleet.session.headers["Authorization"] = f"Bearer {self.fleet_token}"
        return fleet

    # ---- health ---------------------------------------------------------------------------------------------
    def _check_alive(self) -> None:
        for c in self.components.values():
            if not c.killed and c.proc.poll() is not None:
                tail = c.log.read_text(errors="replace")[-3000:] if c.log.exists() else ""
                raise StackError(f"{c.name} exited with {c.proc.returncode}\n{tail}")

    def health(self) -> dict:
        import requests

        return requests.get(f"{self.api}/api/v2/monitor/health", timeout=3).json()

    def wait_healthy(self, timeout: float) -> None:
        parts = ("metadatabase", "scheduler", "triggerer", "dag_processor")
        self._until("airflow components healthy", timeout, lambda: all(
            (self.health().get(p) or {}).get("status") == "healthy" for p in parts))

    def registered_workers(self) -> set[str]:
        """Celery workers that answer a ping through the broker (`celery@<name>` -> name)."""
        from celery import Celery

        app = Celery(broker=self.redis.url(0))
        try:
            replies = app.control.ping(timeout=1.0) or []
        finally:
            app.close()
        return {node.split("@", 1)[1] for r in replies for node in r}

    def wait_workers(self, names, timeout: float = 60) -> None:
        self._until(f"celery workers {sorted(names)} registered", timeout,
                    lambda: set(names) <= self.registered_workers())

    def _until(self, what: str, timeout: float, probe) -> None:
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                if probe():
                    return
            except Exception as exc:  # not up yet
                last = exc
            time.sleep(0.5)
        raise StackError(f"{what}: not within {timeout:.0f}s (last error: {last})")

    # ---- faults -------------------------------------------------------------------------------------------
    def processes_of(self, name: str) -> list:
        """The component's process and all its descendants now (task processes lead groups of their own)."""
        c = self.components[name]
        return _tree(c.proc.pid) if c.proc.poll() is None else []

    def kill_worker(self, name: str) -> list[dict]:
        """SIGKILL a worker as a lost machine would go: its process group, and every process it had started
        in groups of their own (Airflow puts each task process in a new process group), which SIGKILL of
        the worker's group alone would leave running as orphans. Returns what was killed, each as
        {pid, pgid, cmd}; all of it is dead on return."""
        import psutil

        if name not in self.workers:
            raise ValueError(f"{name!r} is not a worker of this stack: {self.workers}")
        c = self.components[name]
        procs = self.processes_of(name)
        info = []
        for p in procs:
            try:
                info.append({"pid": p.pid, "pgid": os.getpgid(p.pid), "cmd": " ".join(p.cmdline()[:6])})
            except (OSError, psutil.Error):
                pass
        c.killed = True
        _kill_all(procs, signal.SIGKILL)
        try:
            os.killpg(c.proc.pid, signal.SIGKILL)
        except OSError:
            pass
        c.proc.wait(10)
        alive = []
        for p in procs:
            try:
                if p.is_running() and p.status() != "zombie":
                    alive.append(p.pid)
            except psutil.Error:
                pass
        if alive:
            raise StackError(f"{name}: still running after SIGKILL: {alive}")
        return info

    # ---- stop -------------------------------------------------------------------------------------------------
    def ours(self) -> list:
        """Every live process on this machine that carries this stack's marker in its environment."""
        import psutil

        out = []
        for p in psutil.process_iter():
            try:
                if p.pid != os.getpid() and p.environ().get(MARKER) == self.id and p.status() != "zombie":
                    out.append(p)
            except psutil.Error:
                continue
        return out

    def survivors(self) -> list[str]:
        """What this stack started and is still running: nothing, after stop()."""
        import psutil

        out = [f"{p.pid} {' '.join(p.cmdline()[:4])}" for p in self.ours()]
        for what, pid in self._service_pids.items():
            try:
                if psutil.Process(pid).status() != "zombie":
                    out.append(f"{pid} {what}")
            except psutil.Error:
                pass
        return out

    def stop(self, grace: float = 20) -> None:
        """Every component: SIGTERM to its process group at once, wait up to `grace`, then SIGKILL whatever
        of it is left (its descendants in other process groups included); then the simulator, Redis and
        PostgreSQL; last, any process still carrying the stack's marker is killed and recorded."""
        import psutil

        airflow = [c for c in self.components.values() if c.name != "sim" and not c.killed]
        trees = {c.name: self.processes_of(c.name) for c in airflow}
        for c in airflow:
            try:
                os.killpg(c.proc.pid, signal.SIGTERM)
            except OSError:
                pass
        deadline = time.monotonic() + grace
        for c in airflow:
            try:
                c.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for c in airflow:
            left = [p for p in trees[c.name] if p.is_running() and p.status() != "zombie"]
            if left:
                self.leftovers += [f"{c.name}: {p.pid} {' '.join(p.cmdline()[:4])}" for p in left
                                   if p.is_running()]
                _kill_all(left)
            try:
                os.killpg(c.proc.pid, signal.SIGKILL)
            except OSError:
                pass
            if c.proc.poll() is None:
                c.proc.wait(10)
        sim = self.components.get("sim")
        if sim is not None and sim.proc.poll() is None:
            from railyard.devstack.stack import _stop_group

            _stop_group(sim.proc, grace=10)
        stray = self.ours()
        if stray:
            self.leftovers += [f"stray: {p.pid} {' '.join(p.cmdline()[:4])}" for p in stray]
            _kill_all(stray)
        if self.redis is not None:
            self.redis.stop()
        if self.pg is not None:
            self.pg.stop()
        if self._pg_root is not None:
            shutil.rmtree(self._pg_root, ignore_errors=True)
            self._pg_root = None
        psutil.wait_procs(self.ours(), timeout=5)

    # ---- REST (railyard.devstack.stack.AirflowRest, as Stack) ------------------------------------------------------
    def _admin_password(self) -> str:
        return self.admin_password

    def wait_dag(self, dag_id: str, timeout: float = 120) -> None:
        self._until(f"DAG {dag_id} parsed", timeout, lambda: self.dag_present(dag_id))

    def failure_report(self, dag_id: str, run_id: str) -> str:
        """The run's task states, and the errors in the logs of its failed tries."""
        lines = [f"task states: {self.task_states(dag_id, run_id)}"]
        for ti in self.task_instances(dag_id, run_id):
            if ti["state"] not in ("failed", "up_for_retry"):
                continue
            for t in range(1, int(ti["try_number"] or 1) + 1):
                for ln in self.task_log(dag_id, run_id, ti["task_id"], t).splitlines():
                    if '"level":"error"' in ln or "Traceback" in ln:
                        lines.append(f"{ti['task_id']} try {t}: {ln[:1500]}")
        return "\n".join(lines)

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int) -> str:
        """A try's log file, from the shared log folder (empty when there is none)."""
        base = self.airflow_home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}" / f"task_id={task_id}"
        return "\n".join(f.read_text(errors="replace") for f in sorted(base.glob(f"**/attempt={try_number}.log")))

