"""A real, private PostgreSQL for tests and benches: initdb + postgres from Debian's `postgresql`
package, on a unix socket only (no TCP port to collide on), everything under one dir.

As root, initdb and postgres run as the `postgres` user (created with `useradd -M` if missing): the
server refuses to run as root. Durability settings (fsync, synchronous_commit, full_page_writes...)
are PostgreSQL's defaults, as a user would have them; only initdb itself skips its final flush
(`--no-sync`), which touches nothing the server later promises. `stop()` ends exactly the server it
started: a fast shutdown of the postmaster (which ends its own backends), then SIGKILL to the
process group it was started in if that did not work.

    with contextlib.contextmanager(running_postgres)() as pg:
        url = pg.create_database("t1")  # postgresql+psycopg2://postgres@/t1?host=<socket dir>
"""

from __future__ import annotations

import glob
import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

USER = "postgres"
NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
# A unix socket path may be at most 107 bytes; ".s.PGSQL.5432" takes 14 of them.
MAX_SOCKET_DIR = 90


def binaries() -> tuple[Path, Path]:
    """(initdb, postgres): Debian's newest /usr/lib/postgresql/*/bin, else whatever is on PATH."""
    def version(d: str) -> tuple[int, ...]:
        m = re.search(r"/postgresql/([0-9.]+)/bin$", d)
        return tuple(int(x) for x in m.group(1).split(".")) if m else (0,)

    for d in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=version, reverse=True):
        i, p = Path(d, "initdb"), Path(d, "postgres")
        if i.exists() and p.exists():
            return i, p
    i_path, p_path = shutil.which("initdb"), shutil.which("postgres")
    if i_path and p_path:
        return Path(i_path), Path(p_path)
    raise RuntimeError("PostgreSQL tests need initdb and postgres: install Debian's `postgresql` package "
                       "(apt-get install postgresql; binaries in /usr/lib/postgresql/*/bin)")


def _group_members(pgid: int) -> list[int]:
    """Live processes whose process group is `pgid`."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = Path(f"/proc/{d}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # state, ppid, pgrp, session, ...
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(d))
    return out


class PostgresServer:
    """One postmaster with its data dir under `root`; the socket dir too unless that path is too long."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.base = self.root / "pg"
        self.data = self.base / "data"
        self.log = self.base / "postgres.log"
        self.socket_dir = self.base / "sock"
        self._own_socket_dir = False  # a short dir of our own in /tmp, removed by stop()
        self.proc: subprocess.Popen[bytes] | None = None
        self.pid = 0  # the postmaster
        self._uid: int | None = None
        self._gid: int | None = None

    # ---- who runs it ---------------------------------------------------------------------------------
    def _run_as(self) -> None:
        """As root: the `postgres` user (created if missing). Otherwise: ourselves."""
        if os.geteuid() != 0:
            return
        try:
            pw = pwd.getpwnam(USER)
        except KeyError:
            subprocess.run(["useradd", "-M", "-r", "-s", "/usr/sbin/nologin", USER], check=True,
                           capture_output=True)
            pw = pwd.getpwnam(USER)
        self._uid, self._gid = pw.pw_uid, pw.pw_gid

    def _extra_groups(self) -> list[int] | None:
        """With `user`/`group`, Popen switches uid and gid itself (no `runuser` in between, so the pid we
        hold is the postmaster's); no supplementary groups of root's are kept."""
        return None if self._uid is None else []

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env.update(LC_ALL="C", LANG="C")
        if self._uid is not None:
            env.update(HOME=str(self.base), USER=USER, LOGNAME=USER)
        return env

    def _chown(self, *paths: Path) -> None:
        if self._uid is not None:
            for p in paths:
                os.chown(p, self._uid, self._gid if self._gid is not None else -1)

    def _check_reachable(self) -> None:
        """The server's user must be able to walk down to its dirs (pytest's tmp dirs are 0700)."""
        if self._uid is None:
            return
        r = subprocess.run(["runuser", "-u", USER, "--", "test", "-w", str(self.base), "-a", "-x", str(self.base)],
                           capture_output=True)
        if r.returncode != 0:
            raise RuntimeError(f"{self.base} is not reachable by the {USER!r} user: give PostgresServer a root "
                               "whose every parent is traversable (tempfile.mkdtemp + chmod 0o755, as "
                               "running_postgres() does)")

    # ---- start ---------------------------------------------------------------------------------------
    def start(self, timeout: float = 30) -> PostgresServer:
        initdb, postgres = binaries()
        self._run_as()
        try:
            self._start(initdb, postgres, timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self, initdb: Path, postgres: Path, timeout: float) -> None:
        self.base.mkdir(parents=True, exist_ok=True)
        os.chmod(self.base, 0o755)
        self._chown(self.base)
        self._check_reachable()
        if len(str(self.socket_dir)) > MAX_SOCKET_DIR:
            self.socket_dir = Path(tempfile.mkdtemp(prefix="ry-pg-"))
            self._own_socket_dir = True
        self.socket_dir.mkdir(exist_ok=True)
        os.chmod(self.socket_dir, 0o755)
        self._chown(self.socket_dir)
        if not (self.data / "PG_VERSION").exists():
            r = subprocess.run(
                [str(initdb), "-D", str(self.data), "-U", USER, "--auth=trust", "-E", "UTF8", "--locale=C",
                 "--no-sync"],
                capture_output=True, text=True, env=self._env(), cwd=str(self.base), user=self._uid, group=self._gid,
                extra_groups=self._extra_groups(),
            )
            if r.returncode != 0:
                raise RuntimeError(f"initdb failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [str(postgres), "-D", str(self.data), "-k", str(self.socket_dir), "-h", ""],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self._env(),
                cwd=str(self.base), start_new_session=True, user=self._uid, group=self._gid,
                extra_groups=self._extra_groups(),
            )
        self._chown(self.log)
        self.pid = self.proc.pid
        self._wait_ready(timeout)
        self.create_database("railyard")

    def _connect(self, db: str = "postgres") -> Any:  # a psycopg2 connection
        import psycopg2

        return psycopg2.connect(host=str(self.socket_dir), user=USER, dbname=db, connect_timeout=5)

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"postgres exited ({self.proc.returncode}) before it was ready:\n{self._log_tail()}")
            if (self.socket_dir / ".s.PGSQL.5432").exists():
                try:
                    self._connect().close()
                    return
                except Exception as exc:  # starting up, or not accepting yet
                    last = exc
            time.sleep(0.05)
        raise RuntimeError(f"postgres not ready within {timeout}s ({last}):\n{self._log_tail()}")

    def _log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    # ---- use -----------------------------------------------------------------------------------------
    def url(self, db: str = "railyard") -> str:
        return f"postgresql+psycopg2://{USER}@/{db}?host={self.socket_dir}"

    def create_database(self, name: str) -> str:
        """Create database `name` unless it exists; its URL."""
        if not NAME_RE.match(name):
            raise ValueError(f"bad database name {name!r}: letters, digits and _ only, at most 63")
        import psycopg2
        import psycopg2.errors

        conn = self._connect()
        try:
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
                if cur.fetchone() is None:
                    try:
                        cur.execute(f'CREATE DATABASE "{name}"')
                    except psycopg2.errors.DuplicateDatabase:
                        pass  # created by someone else meanwhile
                    except psycopg2.errors.UniqueViolation:
                        pass  # the same race, seen from pg_database's unique index
        finally:
            conn.close()
        return self.url(name)

    # ---- stop ----------------------------------------------------------------------------------------
    def stop(self) -> None:
        """Fast shutdown of the postmaster this object started (it ends its backends), else SIGKILL
        to the process group it was started in. Leaves the data dir where it is."""
        proc, self.proc = self.proc, None
        if proc is not None:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)  # fast shutdown: roll back sessions, checkpoint, exit
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.send_signal(signal.SIGQUIT)  # immediate shutdown
                    try:
                        proc.wait(timeout=5)
                    except subprocess.TimeoutExpired:
                        pass
            # Backends left behind by a postmaster that died: they stay in the session and process
            # group it was started in (start_new_session), which no other process can take over
            # while they live.
            if _group_members(proc.pid):
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            if proc.poll() is None:
                proc.wait(timeout=5)
        self.pid = 0
        if self._own_socket_dir:
            shutil.rmtree(self.socket_dir, ignore_errors=True)
            self._own_socket_dir = False


def running_postgres(root: Path | None = None) -> Iterator[PostgresServer]:
    """A started server, stopped afterwards. Without `root`, in a fresh dir of its own (chmod 0755, so
    the postgres user can reach it), removed afterwards; a given `root` is left in place."""
    own = root is None
    base = Path(tempfile.mkdtemp(prefix="railyard-pg-")) if root is None else Path(root)
    if own:
        os.chmod(base, 0o755)
    server = PostgresServer(base)
    try:
        server.start()
        yield server
    finally:
        server.stop()
        if own:
            shutil.rmtree(base, ignore_errors=True)
