"""A private redis-server for tests: Debian's `redis-server` on a free loopback port, in a dir of its own,
with no persistence (`--save '' --appendonly no`). `stop()` ends exactly the server it started.

    with contextlib.contextmanager(running_redis)() as r:
        r.url()   # redis://127.0.0.1:<port>/0
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from railyard.devstack.stack import free_port

REDIS_SERVER = "redis-server"


class RedisServer:
    """One redis-server listening on 127.0.0.1:`port` (a free one unless given), its files under `root`."""

    def __init__(self, root: Path, port: int | None = None):
        self.root = Path(root)
        self.port = port or free_port()
        self.log = self.root / "redis.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def ping(self) -> bool:
        """PING over a raw socket (no client library needed): True on +PONG."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def start(self, timeout: float = 15) -> RedisServer:
        exe = shutil.which(REDIS_SERVER)
        if exe is None:
            raise RuntimeError("redis-server is missing: apt-get install redis-server (make deps does)")
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.root),
                 "--save", "", "--appendonly", "no", "--daemonize", "no", "--protected-mode", "yes",
                 "--logfile", ""],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=str(self.root),
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while not self.ping():
            if self.proc.poll() is not None:
                tail = self.log.read_text(errors="replace")[-2000:]
                self.proc = None
                raise RuntimeError(f"redis-server exited before it was ready:\n{tail}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"redis-server not answering on port {self.port} within {timeout}s")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        """SIGTERM the server this object started (no save: persistence is off), SIGKILL if it lingers."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def running_redis(root: Path | None = None) -> Iterator[RedisServer]:
    """A started server, stopped afterwards; without `root`, in a temp dir removed afterwards."""
    own = root is None
    base = Path(tempfile.mkdtemp(prefix="railyard-redis-")) if root is None else Path(root)
    server = RedisServer(base)
    try:
        server.start()
        yield server
    finally:
        server.stop()
        if own:
            shutil.rmtree(base, ignore_errors=True)
