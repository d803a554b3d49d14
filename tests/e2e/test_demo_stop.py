"""Stopping the demo stops everything it started: `airflow standalone` (~40 processes), the simulator, and all
they started. The demo runs as `make demo` runs it (`railyard demo`), on a small config with free ports and a
custom RAILYARD_DEMO_HOME. tests/conftest.py makes this process a subreaper, so whatever the demo started
that still runs is one of this process's descendants: a test asserts none is left.

`make stop` stops every demo on the machine: do not run these tests beside a demo you want to keep."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from railyard.devstack.demo import marked_sessions
from railyard.devstack.stack import free_port, stop_session
from tests.support.configs import small_config, write_config

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
RAILYARD = Path(sys.executable).parent / "railyard"


class Demo:
    """`railyard demo` in a process group of its own (as under `timeout`), its output collected line by line."""

    def __init__(self, tmp: Path) -> None:
        data = small_config(domains=2, hosts_per_domain=2, speed=60)  # slow fleet clock: the train is mid-way
        data["simulator"]["port"] = free_port()
        cfg = write_config(tmp / "railyard.yaml", data)
        self.home = tmp / "somewhere-else"  # not .railyard/demo: `make stop` must find it all the same
        env = {**os.environ, "RAILYARD_CONFIG": str(cfg), "RAILYARD_DEMO_HOME": str(self.home),
               "RAILYARD_AIRFLOW_PORT": str(free_port())}
        self.t0 = time.time()
        self.proc = subprocess.Popen([str(RAILYARD), "demo"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env=env, cwd=tmp, start_new_session=True)
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not any(text in ln for ln in self.lines):
            assert self.proc.poll() is None, f"the demo exited ({self.proc.returncode}):\n{self.output}"
            assert time.monotonic() < deadline, f"no {text!r} within {timeout:.0f}s:\n{self.output}"
            time.sleep(0.1)

    def started(self) -> list[psutil.Process]:
        """What the demo runs now: the simulator, standalone and all theirs."""
        return psutil.Process(self.proc.pid).children(recursive=True)

    def end(self, timeout: float = 120) -> int:
        code = self.proc.wait(timeout)
        self.reader.join(10)
        return code

    def cleanup(self) -> None:
        """After a failed test: whatever this demo still runs, gone (the assertions have been made)."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        for mark, sessions in marked_sessions().items():
            if mark.startswith(f"{self.proc.pid}:"):
                for sid in sessions:
                    stop_session(sid, grace=5)


def left_running(since: float) -> list[str]:
    """This process's live descendants started since `since`: with the subreaper, all that the test started."""
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.create_time() >= since - 1 and p.status() != psutil.STATUS_ZOMBIE:
                out.append(f"{p.pid} {' '.join(p.cmdline())[:100]}")
        except psutil.Error:
            pass
    return out


def assert_all_stopped(demo: Demo, seen: list[psutil.Process]) -> None:
    assert len(seen) > 10, [p.pid for p in seen]  # the simulator, standalone and its components were up
    alive = [p.pid for p in seen if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert alive == [], alive
    assert left_running(demo.t0) == []
    assert not [m for m in marked_sessions() if m.startswith(f"{demo.proc.pid}:")]
    assert "Traceback" not in demo.output, demo.output


def test_sigterm_then_a_second_one_during_shutdown_stops_everything(tmp_path: Path) -> None:
    """`timeout make demo`: SIGTERM to the group, then (make passing its own on) another one while the demo is
    stopping what it started. The second must not cut the shutdown short."""
    demo = Demo(tmp_path)
    try:
        demo.wait_for("triggering train", timeout=300)
        time.sleep(2)
        seen = demo.started()
        os.killpg(demo.proc.pid, signal.SIGTERM)
        demo.wait_for("stopping ...", timeout=30)
        os.killpg(demo.proc.pid, signal.SIGTERM)
        code = demo.end()
    finally:
        demo.cleanup()
    assert code == 128 + signal.SIGTERM, demo.output
    assert "still stopping what it started" in demo.output, demo.output
    assert_all_stopped(demo, seen)


def test_make_stop_finds_a_demo_that_was_sigkilled(tmp_path: Path) -> None:
    """The demo itself is gone (SIGKILL: no chance to stop anything); `make stop`, run from the checkout without
    the demo's RAILYARD_DEMO_HOME, still finds the simulator and Airflow it started, by their marker."""
    demo = Demo(tmp_path)
    try:
        demo.wait_for("triggering train", timeout=300)
        seen = demo.started()
        os.kill(demo.proc.pid, signal.SIGKILL)
        assert demo.end(30) == -signal.SIGKILL
        assert [p for p in seen if p.is_running()], "the demo's children outlive a SIGKILLed demo"
        env = {k: v for k, v in os.environ.items() if k not in ("RAILYARD_DEMO_HOME", "RAILYARD_CONFIG")}
        r = subprocess.run(["make", "-s", "stop"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    finally:
        demo.cleanup()
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"stopped demo {demo.proc.pid}" in r.stdout, r.stdout
    assert_all_stopped(demo, seen)


def test_make_stop_while_the_demo_starts_airflow(tmp_path: Path) -> None:
    """`make stop` asks a running demo first (it stops what it started), even in the middle of its start-up."""
    demo = Demo(tmp_path)
    try:
        demo.wait_for("starting airflow standalone", timeout=120)
        time.sleep(3)
        seen = demo.started()
        r = subprocess.run(["make", "-s", "stop"], cwd=ROOT, capture_output=True, text=True, timeout=180)
        code = demo.end(60)
    finally:
        demo.cleanup()
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"stopped demo {demo.proc.pid}" in r.stdout, r.stdout
    assert code == 128 + signal.SIGTERM, demo.output
    assert "stopping ..." in demo.output
    assert len(seen) >= 2  # the simulator and standalone, at least
    alive = [p.pid for p in seen if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert alive == [], alive
    assert left_running(demo.t0) == []
    assert "Traceback" not in demo.output, demo.output
