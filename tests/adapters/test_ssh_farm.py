"""The SSH backend on a one-sshd farm: 64 test hosts at 127.1.0.1-64 on one port of one sshd, each found by the
address it was reached at. A full stop over a 48-host domain at parallelism 6: every host's work lands in its own
state, faulty hosts go to repair with their own tool's reason, and never more than 6 connections are open at once,
seen from the runner and from the kernel's socket table; none is left open after a step.
"""

from __future__ import annotations

import subprocess
import threading
import time

import psutil
import pytest

from railyard.backends.ssh.fleet import SshFleet
from railyard.backends.ssh.runner import Credentials, HostKeyRefused, SshRunner, Target, paramiko_connector
from railyard.domain.config import parse_config
from railyard.domain.config.ssh import HealthChecksSpec
from railyard.domain.models import HostState
from railyard.ledger import Ledger
from tests.support.configs import ssh_config
from tests.support.sshd import SshdFarm

DOMAINS = {"pod-a": [f"gpu-a{i:02d}" for i in range(1, 49)], "pod-b": [f"gpu-b{i:02d}" for i in range(1, 17)]}
NAMES = DOMAINS["pod-a"] + DOMAINS["pod-b"]
FAULTS = {"gpu-a07": ("ecc", "health check failed: nvidia-smi: GPU 3 has 12 uncorrected ECC errors"),
          "gpu-a31": ("install_fail", "upgrade failed: gpu-driver: install exit 1")}
PARALLELISM = 6


@pytest.fixture(scope="module")
def farm(tmp_path_factory):
    f = SshdFarm(tmp_path_factory.mktemp("farm"), NAMES, {h: p for h, (p, _) in FAULTS.items()}, one_sshd=True).start()
    yield f
    f.stop()


def creds(farm: SshdFarm) -> Credentials:
    return Credentials(farm.user, str(farm.client_key), str(farm.known_hosts))


class SocketPeak:
    """The most TCP connections this process had established to `port` at once, sampled every 2 ms: the kernel's
    count, not the runner's own."""

    def __init__(self, port: int):
        self.port = port
        self.peak = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def now(self) -> int:
        return sum(1 for c in psutil.Process().net_connections(kind="tcp4")
                   if c.raddr and c.raddr.port == self.port and c.status == psutil.CONN_ESTABLISHED)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.now())
            self.samples += 1
            time.sleep(0.002)

    def __enter__(self) -> SocketPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def test_one_sshd_tells_its_hosts_apart_by_address_and_pins_the_key_per_address(farm):
    assert len(farm.listeners()) == 1 and {h.port for h in farm.hosts.values()} == {farm.port}
    assert farm["gpu-a01"].address == "127.1.0.1" and farm["gpu-b16"].address == "127.1.0.64"
    pinned = {"gpu-a01": farm["gpu-a01"], "gpu-b16": farm["gpu-b16"]}
    targets = {n: Target(n, h.address, h.port, str(h.work_dir)) for n, h in pinned.items()}
    targets["stranger"] = Target("stranger", "127.1.0.200", farm.port, "/tmp/none")  # answered, never pinned
    r = SshRunner(targets, {}, HealthChecksSpec(), paramiko_connector(creds(farm), connect_timeout=5))
    with r:
        before = farm["gpu-a07"].commands()
        assert r.run("gpu-a01", "cat $RAILYARD_HOST_STATE/profile")[1].strip() == "healthy"
        assert r.run("gpu-b16", "railyard-version kernel")[1].strip() == "6.1.0-25"
        assert farm["gpu-a07"].commands() == before  # another host's log: untouched
        with pytest.raises(HostKeyRefused, match="not pinned"):
            r.run("stranger", "true")
    assert r.open_now == 0
    # hashed known_hosts (ssh-keygen -H) pins the same keys
    hashed = farm.root / "known_hosts.hashed"
    hashed.write_text(farm.known_hosts.read_text())
    subprocess.run(["ssh-keygen", "-q", "-H", "-f", str(hashed)], check=True, capture_output=True)
    assert "127.1.0.1" not in hashed.read_text()
    r2 = SshRunner(targets, {}, HealthChecksSpec(), paramiko_connector(
        Credentials(farm.user, str(farm.client_key), str(hashed)), connect_timeout=5))
    assert r2.run("gpu-b16", "cat $RAILYARD_HOST_STATE/profile")[1].strip() == "healthy"
    with pytest.raises(HostKeyRefused):
        r2.run("stranger", "true")


def test_a_full_stop_on_one_sshd_keeps_connections_within_parallelism(farm, tmp_path):
    from railyard.operations.stop import Stop

    data = ssh_config(farm.ssh_hosts_config(), domains=2, hosts_per_domain=48, state_db=str(tmp_path / "fleet.db"),
                      parallelism=PARALLELISM)
    data["domains"] = [{"name": d, "hosts": hosts, "sku": "h100"} for d, hosts in DOMAINS.items()]
    cfg = parse_config(data)
    fleet = SshFleet.from_config(cfg, paramiko_connector(creds(farm), connect_timeout=10))
    runner = fleet.runner
    assert runner is not None
    led = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    boot = {n: farm[n].boot_id() for n in NAMES}
    try:
        with SocketPeak(farm.port) as seen:
            stop = Stop(config=cfg, train=cfg.trains[0], domain=cfg.domain("pod-a"), op_id="demo/run1/pod-a",
                        fleet=fleet, ledger=led, say=lambda m: None)
            assert stop.take().granted
            stop.drain()
            stop.upgrade()
            assert runner.open_now == 0  # each host's connection closed with its step
            stop.check()
            stop.return_hosts()
        assert seen.now() == 0 and runner.open_now == 0
        hosts = {h.name: h for h in fleet.hosts()}
    finally:
        fleet.close()
        led.dispose()
    assert 0 < seen.peak <= PARALLELISM, (seen.peak, seen.samples)
    assert runner.peak_open == PARALLELISM  # the bound was reached, and held
    assert runner.connects > len(NAMES)  # a connection per host per step, not one held for the whole stop

    targets = cfg.train_targets(cfg.trains[0])
    for name in DOMAINS["pod-a"]:
        h = hosts[name]
        if name in FAULTS:
            assert h.state == HostState.REPAIR and h.reason.startswith(FAULTS[name][1]), (name, h.reason)
            continue
        assert h.state == HostState.SERVING and h.versions == targets, (name, h)
        assert {farm[name].version(c) for c in targets} == set(targets.values())
        assert sorted(ln.split()[0] for ln in farm[name].installs()) == sorted(targets), name
        assert farm[name].reboots() == 1 and farm[name].boot_id() != boot[name], name
    assert farm["gpu-a07"].reboots() == 1 and farm["gpu-a31"].reboots() == 0
    for name in DOMAINS["pod-b"]:  # read at first sight, never touched
        assert hosts[name].state == HostState.SERVING and hosts[name].versions["kernel"] == "6.1.0-25"
        assert farm[name].installs() == [] and farm[name].reboots() == 0 and farm[name].boot_id() == boot[name]
