"""The SSH backend against real sshd servers on loopback: 16 hosts, each with its own key and state.

Host keys pinned, bad input refused before any connection, fan-out, and a worker killed in the
middle of an install: the retry re-attaches and the install runs exactly once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import paramiko
import pytest
from pydantic import ValidationError

from railyard.backends.hosts.port import RunnerError, UpgradeState
from railyard.backends.ssh.fleet import SshFleet
from railyard.backends.ssh.runner import Credentials, HostKeyRefused, SshRunner, op_dir, paramiko_connector
from railyard.domain.config import parse_config
from railyard.domain.models import HostState, Step
from railyard.fleet.port import FleetError
from railyard.ledger import Ledger
from tests.support.configs import ssh_config, write_config
from tests.support.ssh_stop_worker import make as make_stop
from tests.support.sshd import SshdFarm
from tests.support.waiting import until

ROOT = Path(__file__).resolve().parents[2]
NAMES = [f"gpu-{d}{i:02d}" for d in "abcd" for i in range(1, 5)]


@pytest.fixture(scope="module")
def farm(tmp_path_factory):
    f = SshdFarm(tmp_path_factory.mktemp("sshd"), NAMES).start()
    yield f
    f.stop()


@pytest.fixture
def fresh(farm):
    for n in NAMES:
        farm.reset(n, "healthy")
    farm.write_known_hosts()
    return farm


def creds(farm: SshdFarm, known_hosts: Path | None = None) -> Credentials:
    return Credentials(farm.user, str(farm.client_key), str(known_hosts or farm.known_hosts))


def runner(farm: SshdFarm, known_hosts: Path | None = None, **cfg_kw) -> SshRunner:
    cfg = parse_config(ssh_config(farm.ssh_hosts_config(), **cfg_kw))
    return SshRunner.from_config(cfg, paramiko_connector(creds(farm, known_hosts), connect_timeout=5))


def test_fan_out_reads_every_host(fresh):
    with runner(fresh, parallelism=4) as r:
        got = r.fan_out(NAMES, r.versions)
        assert r.connects == 16
        assert r.open_now == 0 and 1 <= r.peak_open <= 4  # each host's connection closed when its read was done
        assert all(v == {"gpu-driver": "550.127.08", "gpu-firmware": "96.00.89.00.01", "kernel": "6.1.0-25"}
                   for v in got.values()), got
        r.fan_out(NAMES, lambda h: (r.versions(h), r.versions(h)))
        assert r.connects == 32  # one connection a host for both its calls
        with r.session("gpu-a01"):
            r.run("gpu-a01", "true")
            r.run("gpu-a01", "true")
            assert r.open_now == 1
        assert r.connects == 33 and r.open_now == 0
    assert all(fresh[n].commands() == (5 if n == "gpu-a01" else 3) for n in NAMES)


def test_changed_host_key_is_refused_before_any_command(fresh):
    pinned = fresh.known_hosts.read_text()
    fresh.rekey("gpu-c03")
    assert fresh.known_hosts.read_text() == pinned  # the farm does not re-pin: the old key stays pinned
    with runner(fresh) as r:
        with pytest.raises(HostKeyRefused, match=r"gpu-c03 .*host key changed"):
            r.versions("gpu-c03")
        with pytest.raises(HostKeyRefused):
            r.upgrade("gpu-c03", [Step(component="gpu-driver", version="570.86.15")], "op-key")
        assert r.versions("gpu-c04")["kernel"] == "6.1.0-25"  # the others are fine
    assert fresh["gpu-c03"].commands() == 0
    assert fresh["gpu-c03"].installs() == []
    # a host that is not pinned at all is refused the same way, and never added
    only_others = fresh.root / "known_hosts.partial"
    only_others.write_text("".join(ln + "\n" for ln in pinned.splitlines() if f":{fresh['gpu-d01'].port} " not in ln))
    with runner(fresh, known_hosts=only_others) as r:
        with pytest.raises(HostKeyRefused, match="not pinned"):
            r.versions("gpu-d01")
    assert f":{fresh['gpu-d01'].port} " not in only_others.read_text()
    assert fresh["gpu-d01"].commands() == 0


BAD_HOSTS = ["n1;reboot", "$(id)", "a`touch x`", "gpu-a01\nreboot", "-oProxyCommand=touch", "x" * 300, "../x", ""]
BAD_VERSIONS = ["1.2;rm -rf /", "../x", "$(touch SENTINEL)", "`id`", "1 2", "-o", "v\n1", "9" * 300]


def test_bad_input_is_refused_before_any_connection(fresh, tmp_path):
    sentinel = tmp_path / "SENTINEL"
    with runner(fresh) as r:
        for bad in BAD_HOSTS:
            for call in (lambda h: r.versions(h), lambda h: r.upgrade_state(h, "op"),
                         lambda h: r.upgrade(h, [Step(component="kernel", version="6.1.0-28")], "op"),
                         lambda h: r.start_check(h, {"kernel": "6.1.0-28"}, "op")):
                with pytest.raises(ValueError):
                    call(bad)
        for bad in BAD_VERSIONS:
            with pytest.raises(ValidationError):
                Step(component="kernel", version=bad.replace("SENTINEL", str(sentinel)))
            with pytest.raises(ValueError):
                r.upgrade("gpu-a01", [{"component": "kernel", "version": bad}], "op")
            with pytest.raises(ValueError):
                r.start_check("gpu-a01", {"kernel": bad}, "op")
        with pytest.raises(ValueError, match="no install/verify recipe"):
            r.upgrade("gpu-a01", [Step(component="bios", version="2.1")], "op")
        with pytest.raises(ValueError, match="operation id"):
            r.upgrade("gpu-a01", [Step(component="kernel", version="6.1.0-28")], "op\nrm -rf /")
        assert r.connects == 0
    cfg = parse_config(ssh_config(fresh.ssh_hosts_config(), state_db=str(tmp_path / "fleet.db")))
    fleet = SshFleet.from_config(cfg, paramiko_connector(creds(fresh)))
    for bad in BAD_HOSTS:
        with pytest.raises((ValueError, FleetError)):
            fleet.drain([bad], "op")
        with pytest.raises((ValueError, FleetError)):
            fleet.offboard(bad, "why", "op")
    assert fleet.runner.connects == 0
    assert not sentinel.exists()
    assert all(fresh[n].commands() == 0 for n in NAMES)


def test_upgrade_runs_detached_under_flock_and_reattaches(fresh):
    op = "demo/manual__2026-11-29T09:38:19+00:00/pod-a"
    steps = [Step(component="gpu-driver", version="570.86.15"), Step(component="kernel", version="6.1.0-28")]
    (fresh["gpu-a01"].state / "install_seconds").write_text("1\n")
    with runner(fresh) as r:
        r.upgrade("gpu-a01", steps, op)
        r.upgrade("gpu-a01", steps, op)  # a retry while it runs: the lock turns it away

        def state() -> UpgradeState | None:
            try:
                return r.upgrade_state("gpu-a01", op)
            except RunnerError:  # the host rebooting, its driver's last step: asked again, as a fleet's poll does
                return None

        while (st := state()) is None or st.status == "running":
            time.sleep(0.1)
        assert st.status == "done", st
        r.upgrade("gpu-a01", steps, op)  # and after it: every step has a status, nothing runs again
        d = Path(op_dir(str(fresh["gpu-a01"].work_dir), op))
        # the third launch has ended (a fixed sleep here raced the launcher on a loaded machine)
        until("the third launch logged", lambda: (d / "launch.log").read_text().count("launch exit 0") >= 2,
              timeout=30, every=0.1)
        assert r.upgrade_state("gpu-a01", op).status == "done"
        assert r.versions("gpu-a01")["gpu-driver"] == "570.86.15"
    assert ([ln.split()[:2] for ln in fresh["gpu-a01"].installs()]
            == [["gpu-driver", "570.86.15"], ["kernel", "6.1.0-28"]])
    assert (d / "gpu-driver.status").read_text().strip() == "0" and (d / "kernel.status").read_text().strip() == "0"
    assert "Setting up gpu-driver (570.86.15) ... done" in (d / "gpu-driver.log").read_text()
    launches = (d / "launch.log").read_text()
    assert "launch exit 75" in launches and launches.count("launch exit 0") == 2, launches
    assert fresh["gpu-a01"].read("reboots.log") == "reboot gpu-a01\n"  # gpu-driver needs a reboot: once


def test_worker_killed_mid_install_then_retry_installs_once(fresh, tmp_path):
    """SIGKILL the worker while the install runs on the host; a fresh process re-attaches."""
    data = ssh_config(fresh.ssh_hosts_config(), install_timeout_s=60, state_db=str(tmp_path / "fleet.db"))
    data["domains"] = [{"name": "pod-a", "hosts": ["gpu-a01", "gpu-a02"], "sku": "h100"}]
    data["fleet"]["ssh"]["hosts"] = {k: v for k, v in data["fleet"]["ssh"]["hosts"].items()
                                     if k in ("gpu-a01", "gpu-a02")}
    data["buffers"] = {"maintenance": {"hosts": 2}, "failure": {"hosts": 1}}
    cfg_path = write_config(tmp_path / "railyard.yaml", data)
    ledger_url = f"sqlite:///{tmp_path}/ledger.db"
    (fresh["gpu-a01"].state / "install_seconds").write_text("3\n")
    args = [str(cfg_path), ledger_url, "run-1", "pod-a", fresh.user, str(fresh.client_key), str(fresh.known_hosts)]
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'include'}", "PYTHONUNBUFFERED": "1"}
    log = (tmp_path / "worker.log").open("w")
    worker = subprocess.Popen([sys.executable, "-m", "tests.support.ssh_stop_worker", *args], cwd=ROOT, env=env,
                              stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while not fresh["gpu-a01"].installs():  # the first install has started on the host
        assert worker.poll() is None, (tmp_path / "worker.log").read_text()
        assert time.monotonic() < deadline, (tmp_path / "worker.log").read_text()
        time.sleep(0.05)
    worker.send_signal(signal.SIGKILL)
    assert worker.wait(timeout=10) == -signal.SIGKILL
    assert len(fresh["gpu-a01"].installs()) == 1  # killed in the middle of the first component

    stop = make_stop(*args)  # the retry: a fresh process's view, same operation
    try:
        assert stop.take().outcome == "granted"
        assert stop.drain() == {"drained": 0}
        up = stop.upgrade()
        assert up == {"upgraded": 2, "offboarded": []}, up
        chk = stop.check()
        assert chk["passed"] == 2, chk
        ret = stop.return_hosts()
        assert ret == {"returned": 2, "offboarded": []}, ret
    finally:
        stop.fleet.close()
    installs = [ln.split()[:2] for ln in fresh["gpu-a01"].installs()]
    assert installs == [["gpu-driver", "570.86.15"], ["gpu-firmware", "96.00.a5.00.01"], ["kernel", "6.1.0-28"]]
    d = Path(op_dir(str(fresh["gpu-a01"].work_dir), stop.op_id))
    assert all((d / f"{c}.status").read_text().strip() == "0" for c in ("gpu-driver", "gpu-firmware", "kernel"))
    # one driver, launched once by the killed worker; the retry found it running (lock held) and waited
    assert (d / "launch.log").read_text().count("launch exit") == 1
    assert (d / "driver.log").read_text().count("driver start") == 1
    hosts = {h.name: h for h in stop.fleet.hosts(["gpu-a01", "gpu-a02"])}
    assert all(h.state == HostState.SERVING and h.versions == stop.targets for h in hosts.values())
    led = Ledger(ledger_url)
    assert led.verification(stop.op_id, "gpu-a01")[0] is True
    assert led.holdings() == {}
    evidence = stop.fleet.check_evidence("gpu-a01", stop.op_id)
    assert {v["check"] for v in evidence} == {"gpu_inventory", "dcgm", "nccl", "xid", "versions"}
    assert all(v["passed"] for v in evidence)
    # nccl/01, the healthy host's recorded run
    assert json.loads(json.dumps(evidence))[2]["evidence"]["busbw_gbps"] == 476.53


def test_paramiko_never_auto_adds(fresh):
    """The connector refuses unknown keys even if ~/.ssh/known_hosts would list them."""
    conn = paramiko_connector(creds(fresh, fresh.root / "empty_known_hosts"))
    (fresh.root / "empty_known_hosts").write_text("")
    from railyard.backends.ssh.runner import Target
    with pytest.raises(HostKeyRefused):
        conn(Target("gpu-a01", "127.0.0.1", fresh["gpu-a01"].port, str(fresh["gpu-a01"].work_dir)))
    assert (fresh.root / "empty_known_hosts").read_text() == ""
    assert isinstance(paramiko.RejectPolicy(), paramiko.MissingHostKeyPolicy)


def test_a_connection_that_drops_mid_command_is_an_error_not_an_answer(fresh):
    """A host going down mid-command closes the channel with no exit status: that is `RunnerError`, never
    exit -1 with no output (which an upgrade poll would read as "nothing launched"). A command killed by a
    signal has no exit status either, but its connection stays up: that is an answer (-1)."""
    with runner(fresh) as r:
        # $PPID of the command's shell is the host's sshd session for this connection
        with pytest.raises(RunnerError, match="connection lost during a command"):
            r.run("gpu-a01", "echo partial; kill -KILL $PPID; sleep 5")
        assert r.run("gpu-a01", "kill -KILL $$") == (-1, "")
        assert r.run("gpu-a01", "echo back")[1].strip() == "back"


def test_a_key_the_host_refuses_is_not_tried_again(fresh, tmp_path):
    """A refused key is an answer: one attempt, AuthenticationException (unlike a connection that closes during
    authentication, which is connection trouble and tried again)."""
    stranger = tmp_path / "stranger_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
    cfg = parse_config(ssh_config(fresh.ssh_hosts_config()))
    r = SshRunner.from_config(cfg, paramiko_connector(Credentials(fresh.user, str(stranger), str(fresh.known_hosts)),
                                                      connect_timeout=5))
    with pytest.raises(RunnerError, match="AuthenticationException"):
        r.run("gpu-a01", "true")
    assert r.connects == 1


def test_airflow_side_builds_the_ssh_fleet_from_config_and_connection(fresh, tmp_path, monkeypatch):
    """FleetHook picks the backend from the config, one fleet per process and connection."""
    from railyard_airflow.hooks.fleet import FleetHook
    from railyard_airflow.hooks.ssh import SshFleetHook

    cfg_path = write_config(tmp_path / "railyard.yaml",
                            ssh_config(fresh.ssh_hosts_config(), state_db=str(tmp_path / "fleet.db")))
    conn = {"conn_type": "ssh", "login": fresh.user,
            "extra": {"key_file": str(fresh.client_key), "known_hosts": str(fresh.known_hosts)}}
    monkeypatch.setenv("AIRFLOW_CONN_RAILYARD_SSH", json.dumps(conn))
    hook = FleetHook(config_path=str(cfg_path))
    fleet = hook.get_conn()
    assert isinstance(fleet, SshFleet) and FleetHook(config_path=str(cfg_path)).get_conn() is fleet
    assert {h.state for h in fleet.hosts()} == {HostState.SERVING}
    cfg = hook.config
    for flag in ("no_host_key_check", "allow_host_key_change"):
        bad = {**conn, "extra": {**conn["extra"], flag: "true"}}
        monkeypatch.setenv("AIRFLOW_CONN_RAILYARD_SSH_BAD", json.dumps(bad))
        with pytest.raises(ValueError, match=f"{flag}=true is refused"):
            SshFleetHook("railyard_ssh_bad").credentials(cfg)
    monkeypatch.setenv("AIRFLOW_CONN_RAILYARD_SSH_BARE", json.dumps({"conn_type": "ssh", "login": "x"}))
    with pytest.raises(ValueError, match="missing key_file, known_hosts"):
        SshFleetHook("railyard_ssh_bare").credentials(cfg)


def _crash(d: Path) -> None:
    """Kill every process of the sessions working in `d`, as a host crash would: the driver runs in its
    own session (`setsid`), its installs under `timeout` in their own process groups, so a pass over the
    processes found in `d` alone can miss a child forked after it (a `sleep` still holding the lock)."""
    deadline = time.monotonic() + 10
    sids: set[int] = set()
    while True:
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                if os.readlink(f"/proc/{pid}/cwd") == str(d):
                    sids.add(os.getsid(int(pid)))
                dead = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] in "ZX"
                if os.getsid(int(pid)) in sids and not dead:
                    found.append(int(pid))
            except OSError:
                pass
        if not found:
            return
        assert time.monotonic() < deadline, f"processes of {d} still alive: {found}"
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.05)


def test_a_dead_driver_is_relaunched_by_the_stops_write_step_never_by_a_read(fresh, tmp_path):
    """The host-side driver dies mid-install (a host crash): reads (plan, drift, polls) see it and start
    nothing; `tend`, which the stop's waiting steps call, launches it again and it finishes once."""
    cfg = parse_config(ssh_config(fresh.ssh_hosts_config(), state_db=str(tmp_path / "fleet.db")))
    fleet = SshFleet.from_config(cfg, paramiko_connector(creds(fresh)))
    op = "demo/run-crash/pod-a"
    h = fresh["gpu-a01"]
    (h.state / "install_seconds").write_text("2\n")
    try:
        fleet.drain(["gpu-a01"], op)
        fleet.upgrade("gpu-a01", [Step(component="kernel", version="6.1.0-28")], op)
        deadline = time.monotonic() + 20
        while not h.installs():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        d = Path(op_dir(str(h.work_dir), op))
        _crash(d)  # the host crashes: its driver and everything the driver started die
        time.sleep(0.5)
        for _ in range(3):  # reads: the host is still upgrading, nothing is launched
            assert fleet.hosts(["gpu-a01"])[0].state == HostState.UPGRADING
        assert (d / "driver.log").read_text().count("driver start") == 1 and len(h.installs()) == 1
        assert fleet.tend(["gpu-a01"], op) == ["gpu-a01"]  # the write step launches it again
        assert fleet.tend(["gpu-a01"], op) == []  # running now: nothing more
        deadline = time.monotonic() + 30
        while fleet.hosts(["gpu-a01"])[0].state == HostState.UPGRADING:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert h.version("kernel") == "6.1.0-28" and (d / "kernel.status").read_text().strip() == "0"
        assert [ln.split()[0] for ln in h.installs()] == ["kernel", "kernel"]  # the killed one, then the rerun
        assert (d / "driver.log").read_text().count("driver start") == 2
    finally:
        fleet.close()


def _sessions(farm: SshdFarm, name: str) -> list:
    import psutil

    return psutil.Process(farm[name].proc.pid).children(recursive=True)


def test_a_host_frozen_mid_command_is_given_up_on_at_the_command_timeout(tmp_path):
    """The host's sshd session is SIGSTOPped between the channel's open and the exec request's answer
    (paramiko waits for that answer with no bound), and again in the middle of a command: each call ends
    with CommandTimeout within the command timeout, and the next call reconnects to the thawed host.
    A farm of its own: no other test's sessions or drivers on it."""
    import socket
    import threading

    from railyard.backends.ssh.runner import CommandTimeout, Target
    from railyard.domain.config.ssh import HealthChecksSpec

    host = "gpu-z01"
    farm = SshdFarm(tmp_path / "sshd", [host]).start()
    t = farm.hosts[host]

    def make() -> SshRunner:
        return SshRunner({host: Target(host, "127.0.0.1", t.port, str(t.work_dir), "h100")}, {}, HealthChecksSpec(),
                         paramiko_connector(creds(farm), connect_timeout=5), command_timeout=3.0)

    r = make()
    held = r.session(host)
    held.__enter__()
    try:
        assert r.run(host, "echo up")[1].strip() == "up"  # the session's connection, held open
        chan = r._clients[host].get_transport().open_session(timeout=5)
        frozen = _sessions(farm, host)
        assert frozen
        for p in frozen:
            p.suspend()
        t0 = time.monotonic()
        with pytest.raises(CommandTimeout, match="no answer within 3s"):
            r._exec(host, chan, "echo never", 3.0)
        assert time.monotonic() - t0 < 6
        for p in frozen:
            p.resume()
        assert r.run(host, "echo back")[1].strip() == "back"  # a fresh connection
        # frozen while the command runs: the read loop's deadline
        t0 = time.monotonic()
        threading.Timer(0.5, lambda: [p.suspend() for p in _sessions(farm, host)]).start()
        with pytest.raises(CommandTimeout):
            r.run(host, "sleep 1; echo late")
        assert time.monotonic() - t0 < 6
    finally:
        for p in _sessions(farm, host):
            try:
                p.resume()
            except Exception:  # noqa: BLE001 - gone already
                pass
        held.__exit__(None, None, None)
        r.close()
    r2 = make()
    try:
        with r2.session(host):
            r2.run(host, "true")
            tr = r2._clients[host].get_transport()
            sock = tr.sock
            assert tr.packetizer._Packetizer__keepalive_interval == 15
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 30
        assert host not in r2._clients and not tr.is_active()  # closed with its session
    finally:
        r2.close()
        farm.stop()


def test_reads_never_reach_a_host_and_an_unreached_host_is_unknown_not_failed(fresh, tmp_path, monkeypatch):
    """The page and `plan`/`drift` read the database only (a host no worker has seen is `unknown`); a worker
    that cannot reach a host at first sight keeps it `unknown` and tries again, never failed for good."""
    import railyard.backends.ssh.fleet as ssh_fleet
    from railyard.ledger.state import ssh_hosts

    hosts = fresh.ssh_hosts_config()
    hosts["gpu-a02"] = {**hosts["gpu-a02"], "port": 1}  # this worker has no route to it (yet)
    cfg = parse_config(ssh_config(hosts, state_db=str(tmp_path / "fleet.db")))
    reader = SshFleet.reader(cfg)
    seen = reader.hosts()
    assert {h.state for h in seen} == {HostState.UNKNOWN} and seen[0].reason == "not seen yet by a Railyard worker"
    with reader.store.read() as c:
        assert c.execute(ssh_hosts.select()).first() is None  # a read wrote nothing
    with pytest.raises(FleetError, match="only reads the database"):
        reader.drain(["gpu-a01"], "t/r/pod-a")
    monkeypatch.setattr(ssh_fleet, "UNKNOWN_RETRY_S", 0.0)
    worker = SshFleet.from_config(cfg, paramiko_connector(creds(fresh), connect_timeout=2))
    try:
        by = {h.name: h for h in worker.hosts(["gpu-a01", "gpu-a02"])}
        assert by["gpu-a01"].state == HostState.SERVING and by["gpu-a01"].seen_at
        assert by["gpu-a02"].state == HostState.UNKNOWN and "not reached yet" in by["gpu-a02"].reason
        # what the reader shows now: the worker's read-back, with its time
        r = {h.name: h for h in reader.hosts(["gpu-a01", "gpu-a02"])}
        assert r["gpu-a01"].state == HostState.SERVING and r["gpu-a01"].versions == by["gpu-a01"].versions
        assert r["gpu-a02"].state == HostState.UNKNOWN
        # the route comes back: the next worker read sees it serving
        cfg2 = parse_config(ssh_config(fresh.ssh_hosts_config(), state_db=str(tmp_path / "fleet.db")))
        worker2 = SshFleet.from_config(cfg2, paramiko_connector(creds(fresh), connect_timeout=2))
        try:
            assert worker2.hosts(["gpu-a02"])[0].state == HostState.SERVING
        finally:
            worker2.close()
    finally:
        worker.close()


def test_a_repaired_ssh_host_comes_back_through_the_gate(fresh, tmp_path):
    """`railyard host repaired`: a host offboarded to repair (or failed with no repair holding it) waits,
    drained, for the repair gate, which checks and returns it; never straight back to service."""
    from railyard.operations.ops import ControlError, mark_repaired
    from railyard.operations.repair import gate_repaired
    from railyard.operations.stop import Stop

    cfg = parse_config(ssh_config(fresh.ssh_hosts_config(), state_db=str(tmp_path / "fleet.db")))
    fleet = SshFleet.from_config(cfg, paramiko_connector(creds(fresh)))
    led = Ledger(cfg.ledger.url)
    try:
        s = Stop(config=cfg, train=cfg.trains[0], domain=cfg.domain("pod-a"), op_id="demo/run1/pod-a", fleet=fleet,
                 ledger=led, say=lambda m: None)
        assert s.take().granted
        s.drain()
        s.upgrade()
        s.offboard("gpu-a01", "health check failed: XID 79 (a test)")
        s.check()
        s.return_hosts()
        assert fleet.hosts(["gpu-a01"])[0].state == HostState.REPAIR
        with pytest.raises(ControlError, match="reason"):
            mark_repaired(cfg, fleet, led, "gpu-a01", reason="ok", actor="tech")
        with pytest.raises(ControlError, match="is serving"):
            mark_repaired(cfg, fleet, led, "gpu-a02", reason="swapped the GPU tray", actor="tech")
        out = mark_repaired(cfg, fleet, led, "gpu-a01", reason="swapped the GPU tray", actor="tech")
        assert out["op"] == f"repair/gpu-a01/{s.op_id}"
        assert fleet.hosts(["gpu-a01"])[0].state == HostState.DRAINED  # not serving: the gate decides
        got = gate_repaired(cfg, fleet, led, say=lambda m: None)
        assert got["returned"] == ["gpu-a01"], got
        h = fleet.hosts(["gpu-a01"])[0]
        assert h.state == HostState.SERVING and h.versions == cfg.train_targets(cfg.trains[0])
        assert any(a["action"] == "repaired" and a["actor"] == "tech" for a in led.audit_rows(out["op"]))
    finally:
        fleet.close()
