"""`railyard op` against the simulator server over HTTP, as a hardware team runs it: a request queued behind
a train's stop waits, says why, and is granted when the stop ends (`--wait`); the hosts come back through the
check with `railyard op return`."""

from __future__ import annotations

import subprocess
import sys
import time

import yaml

from railyard.domain.config import parse_config
from railyard.domain.models import HostState
from railyard.fleet.http import HttpFleet
from railyard.ledger import Ledger
from railyard.operations.stop import Stop
from tests.adapters.conftest import SIM_CONFIG


def test_op_request_waits_behind_a_train_stop_and_returns_through_the_check(sim_server, tmp_path):
    url = f"sqlite:///{tmp_path}/ledger.db"
    data = {**SIM_CONFIG, "ledger": {"url": url}, "timeouts": {"poll_s": 0.1}}
    conf = tmp_path / "railyard.yaml"
    conf.write_text(yaml.safe_dump(data))
    cfg = parse_config(data)
    fleet, led = HttpFleet(sim_server.url), Ledger(url)
    train = Stop(config=cfg, train=cfg.train("demo"), domain=cfg.domain("pod-a"), op_id="demo/r1/pod-a",
                 fleet=fleet, ledger=led, say=lambda _m: None)
    assert train.take().granted
    base = [sys.executable, "-m", "railyard.cli", "op"]
    tail = ["--config", str(conf), "--fleet-url", sim_server.url, "--actor", "hwteam", "--poll-s", "0.2"]
    req = subprocess.Popen([*base, "request", "--hosts", "gpu-b01,gpu-b02", "--kind", "hw-repair",
                            "--reason", "replace the NIC on b01 and b02", "--wait", *tail],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not led.audit_rows(action="wait") and time.monotonic() < deadline:
            time.sleep(0.2)
        [wait] = led.audit_rows(action="wait")
        op = wait["op_id"]
        assert op.startswith("outside/hw-repair/") and "max_domains_down=1" in wait["reason"], wait
        status = subprocess.run([*base, "status", op, *tail], capture_output=True, text=True, timeout=60)
        assert status.returncode == 0 and "QUEUED" in status.stdout and "pod-a (demo/r1/pod-a)" in status.stdout
        assert req.poll() is None  # still waiting
        train.request_checkpoints()
        train.drain()
        train.upgrade()
        train.check()
        train.return_hosts()  # the train's stop ends: the request is granted
        out, err = req.communicate(timeout=120)
    finally:
        if req.poll() is None:
            req.kill()
    assert req.returncode == 0, err
    assert out.splitlines()[0] == op and "waiting: max_domains_down=1" in out and "handed over: gpu-b01, gpu-b02" in out
    assert {h.name for h in fleet.hosts() if h.state == HostState.DRAINED} == {"gpu-b01", "gpu-b02"}
    back = subprocess.run([*base, "return", op, "--to-repair", "gpu-b02", "--reason", "the new NIC is dead too",
                           *tail], capture_output=True, text=True, timeout=120)
    assert back.returncode == 0, back.stderr
    assert "1 host(s) back in service" in back.stdout and "to repair: gpu-b02" in back.stdout
    b01, b02 = fleet.hosts(["gpu-b01", "gpu-b02"])
    assert b01.state == HostState.SERVING and b02.state == HostState.REPAIR
    assert "the new NIC is dead too" in b02.reason and not led.holdings(op)
    assert [r["actor"] for r in led.audit_rows(op, action="outside_request")] == ["hwteam"]
