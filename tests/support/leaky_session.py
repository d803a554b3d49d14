"""Run only by tests/unit/test_session_leftovers.py, as a pytest session of its own: a test that leaves a
process running, detached the way daemons detach (a new session, its parent gone). The session must fail."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def test_leaves_a_detached_sleep_behind() -> None:
    out = subprocess.run(["setsid", "sh", "-c", "sleep 600 >/dev/null 2>&1 & echo $!"], capture_output=True,
                         text=True, check=True, timeout=30)
    Path(os.environ["LEAKY_PID_FILE"]).write_text(out.stdout.strip())
