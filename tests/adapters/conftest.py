"""A real fleet simulator server: `python -m railyard.sim` in a subprocess, on a free port, temp db."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

READY_RE = re.compile(r"railyard-sim ready on (http://\S+)")

# Fast: the fleet clock runs 600x real time and every step is short, so a whole stop takes ~1 s.
SIM_CONFIG: dict[str, Any] = {
    "components": [
        {"name": "gpu-driver", "reboot": True, "duration_s": 60},
        {"name": "gpu-firmware", "reboot": True, "duration_s": 60},
        {"name": "kernel", "reboot": False, "duration_s": 30},
    ],
    "releases": [
        {"id": "driver-570", "component": "gpu-driver", "version": "570.86.15"},
        {"id": "firmware-96", "component": "gpu-firmware", "version": "96.00.a5.00.01"},
        {"id": "kernel-28", "component": "kernel", "version": "6.1.0-28"},
    ],
    "domains": [{"name": f"pod-{x}", "hosts": f"gpu-{x}[01-04]"} for x in "abc"],
    "trains": [{"id": "demo", "releases": ["driver-570", "firmware-96", "kernel-28"]}],
    "buffers": {"maintenance": {"hosts": 4}, "failure": {"hosts": 1}},
    "simulator": {
        "speed": 600,
        "seed": 11,
        "initial_versions": {"gpu-driver": "550.127.08", "gpu-firmware": "96.00.89.00.01", "kernel": "6.1.0-25"},
        "jobs": {"count": 2, "hosts_per_job": 4, "checkpoint_interval_s": 1800, "checkpoint_duration_s": 30},
        "drain_s": 30,
        "check_s": 60,
        "reboot_s": 60,
        "return_s": 30,
        "upgrade_fail_rate": 0.0,
        "check_fail_rate": 0.0,
        "host_failure_per_hour": 0.0,
    },
}


class SimServer:
    """One simulator process at a time on the same config and db; restartable, killable."""

    def __init__(self, workdir: Path, config: dict[str, Any]):
        self.config_path = workdir / "railyard.yaml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.db_path = workdir / "sim.db"
        self.log_path = workdir / "sim.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""

    def start(self, timeout: float = 20.0) -> str:
        assert self.proc is None, "already running"
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        cmd = [sys.executable, "-m", "railyard.sim", "--config", str(self.config_path), "--db", str(self.db_path),
               "--port", "0"]
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                         env={**os.environ, "PYTHONUNBUFFERED": "1"})
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.log_path.read_bytes()[offset:].decode(errors="replace")
            m = READY_RE.search(text)
            if m:
                self.url = m.group(1)
                return self.url
            if self.proc.poll() is not None:
                self.proc = None
                raise RuntimeError(f"simulator exited before it was ready:\n{text}")
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"simulator not ready within {timeout}s:\n{self.log_path.read_text(errors='replace')}")

    def kill(self) -> None:
        """SIGKILL: no chance to save anything on the way out."""
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)
            self.proc = None

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM and wait; returns the exit code (SIGKILL after `timeout`)."""
        if self.proc is None:
            return 0
        proc, self.proc = self.proc, None
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
            raise


def _serve(workdir: Path) -> Iterator[SimServer]:
    server = SimServer(workdir, SIM_CONFIG)
    server.start()
    try:
        yield server
    finally:
        try:
            server.stop()
        except subprocess.TimeoutExpired:
            pass


@pytest.fixture
def sim_server(tmp_path: Path) -> Iterator[SimServer]:
    """A fresh server of its own: for tests that kill it or look at the whole fleet."""
    yield from _serve(tmp_path)


@pytest.fixture(scope="module")
def shared_sim_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimServer]:
    """One server for the tests that only poke at it (each uses its own hosts); starting one takes ~1.5 s."""
    yield from _serve(tmp_path_factory.mktemp("shared-sim"))
