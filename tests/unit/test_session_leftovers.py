"""tests/conftest.py fails a session that leaves a process running, names it, and kills it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]


def test_a_session_that_leaves_a_process_running_fails_and_kills_it(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        str(ROOT / "tests" / "support" / "leaky_session.py")],
                       cwd=ROOT, env={**os.environ, "LEAKY_PID_FILE": str(pid_file)}, capture_output=True,
                       text=True, timeout=300)
    pid = int(pid_file.read_text())
    assert r.returncode == 1, r.stdout + r.stderr
    assert "1 passed" in r.stdout  # the test itself passed: the session failed for what it left behind
    assert "1 process(es) started by this test session outlived it" in r.stdout, r.stdout
    assert f"{pid} 'sleep 600', started during tests/support/leaky_session.py::" in r.stdout, r.stdout
    deadline = time.monotonic() + 10  # killed by the inner session (and reaped as it exited)
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, f"{pid} still runs"
        time.sleep(0.1)
