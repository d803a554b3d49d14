"""A power loss in the middle of the demo: every process of a running `railyard demo` is SIGKILLed
while a domain is being upgraded, then the demo is run again. The crashed run's stop is finished
safely (its hosts checked and returned, or sent to repair), and the new train completes; the fleet
and the ledger were kept together."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from railyard.devstack.stack import free_port
from railyard.domain.models import HostState
from railyard.fleet.http import HttpFleet
from railyard.ledger import Ledger
from tests.support.configs import small_config, write_config

pytestmark = pytest.mark.e2e
BIN = Path(sys.executable).parent


def tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def test_a_demo_killed_mid_stop_is_finished_by_the_next_demo(tmp_path):
    data = small_config(domains=3, speed=150, upgrade_fail_rate=0.0, check_fail_rate=0.0)
    data["simulator"]["port"] = free_port()
    cfg = write_config(tmp_path / "railyard.yaml", data)
    home = tmp_path / "demo"
    env = dict(os.environ, RAILYARD_CONFIG=str(cfg), RAILYARD_DEMO_HOME=str(home),
               RAILYARD_AIRFLOW_PORT=str(free_port()))
    env.pop("RAILYARD_DEMO_ONCE", None)
    first_log = (tmp_path / "first.log").open("w")
    first = subprocess.Popen([str(BIN / "railyard"), "demo"], stdout=first_log, stderr=subprocess.STDOUT, env=env,
                             start_new_session=True)
    hosts_b = [f"gpu-b{i:02d}" for i in range(1, 5)]
    try:
        deadline = time.monotonic() + 400
        fleet = None
        while time.monotonic() < deadline:
            assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
            token = home / "sim.token"
            if fleet is None and token.exists():
                fleet = HttpFleet(f"http://127.0.0.1:{data['simulator']['port']}", token=token.read_text().strip(),
                                  retries=0, connect_timeout=1)
            try:
                if fleet is not None and any(h.state == HostState.UPGRADING for h in fleet.hosts(hosts_b)):
                    break
            except Exception:  # the simulator is still starting
                pass
            time.sleep(0.2)
        else:
            raise AssertionError("pod-b never upgraded: " + (tmp_path / "first.log").read_text()[-3000:])
    finally:
        procs = tree(first.pid)  # the demo, the simulator, airflow standalone and all of theirs: at once
        for p in procs:
            try:
                p.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(procs, timeout=30)
        first_log.close()
    led = Ledger(f"sqlite:///{home}/ledger.db")
    crashed = {op for op in led.holdings().values() if not op.startswith("repair/")}
    assert len(crashed) == 1 and next(iter(crashed)).endswith("/pod-b"), crashed
    (old_op,) = crashed
    led.dispose()

    second = subprocess.run([str(BIN / "railyard"), "demo", "--once"], capture_output=True, text=True, env=env,
                            timeout=900, start_new_session=True)
    out = second.stdout + second.stderr
    assert second.returncode == 0, out[-4000:]
    assert "kept: 1 operation(s) of an earlier demo" in out, out[-4000:]
    assert f"{old_op}: closed (done; reconciler run success)" in out, out[-4000:]
    summary = json.loads(second.stdout.strip().splitlines()[-1])
    assert summary["state"] == "success" and summary["unverified_returns"] == 0, summary
    assert summary["upgraded"] + summary["offboarded"] == summary["hosts"] == 12, summary
    assert summary["max_domains_down"] == 1
    led = Ledger(f"sqlite:///{home}/ledger.db")
    assert all(op.startswith("repair/") for op in led.holdings().values()), led.holdings()
    acts = [a["action"] for a in led.audit_rows(old_op)]
    assert "reconcile" in acts and acts[-1] in ("release", "offboard"), acts
    rec = next(a for a in led.audit_rows(old_op) if a["action"] == "reconcile")
    assert "is deleted" in rec["reason"] and rec["actor"] == "reconciler"  # its run died with the old Airflow
    assert "reconcile_failed" not in acts
    left = [p for p in psutil.process_iter(["environ"])
            if (p.info.get("environ") or {}).get("RAILYARD_DEMO_HOME") == str(home)]
    assert not left, [p.pid for p in left]  # the second demo stopped everything it started
