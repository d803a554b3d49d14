"""Real `sshd` test hosts on loopback, each with its own state directory and stand-in GPU tools
(`tests/support/standins/`) on the PATH its sshd sets. Two layouts:

- one sshd per host (the default): its own host key and port on 127.0.0.1; a reboot stops the host's
  sshd, so its connections drop and new ones are refused.
- one sshd for every host (`one_sshd=True`), for farms of a thousand hosts: Linux routes all of
  127.0.0.0/8 to `lo`, so host i is reached at its own address 127.1.(i // 250).(i % 250 + 1), all on one
  port of one sshd bound to 0.0.0.0 (and letting in clients from 127.* only). The ForceCommand
  (`railyard-farm-session`) finds the host by the address the client reached (SSH_CONNECTION's third
  field) through `<root>/by-addr/<address>`. One host key serves every address, pinned in known_hosts
  per address. A reboot marks only its host down: that host's new sessions have their connection
  dropped until it is back, and the other hosts carry on.

Used by the SSH adapter tests, the SSH train under `dag.test()` and the SSH benches.
Every command a host receives is appended to `<state>/commands.log` (the sshd's ForceCommand),
so a test can prove that nothing ran.
"""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from railyard.devstack.stack import free_port

STANDINS = Path(__file__).resolve().parent / "standins"
SSHD = "/usr/sbin/sshd"
INITIAL_VERSIONS = {"gpu-driver": "550.127.08", "gpu-firmware": "96.00.89.00.01", "kernel": "6.1.0-25"}
PROFILES = ("healthy", "ecc", "ecc_off", "missing_gpu", "slow_nvlink", "xid79", "dcgm_fail", "install_fail",
            "install_hang", "no_reboot")


def free_ports(n: int) -> list[int]:
    """`n` distinct ports, each as `free_port` picks it (below the kernel's ephemeral range)."""
    ports: list[int] = []
    while len(ports) < n:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports


def free_port_any() -> int:
    """A port free on every address (the one-sshd farm listens on 0.0.0.0): `free_port` checks 0.0.0.0."""
    return free_port()


def farm_address(i: int) -> str:
    """Host i's loopback address in a one-sshd farm: 127.1.0.1 .. 127.1.0.250, 127.1.1.1, ..."""
    if not 0 <= i < 250 * 256:
        raise ValueError(f"host index {i} out of range for 127.1.x.y")
    return f"127.1.{i // 250}.{i % 250 + 1}"


def _keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", str(path)], check=True)


@dataclass
class SshdHost:
    name: str
    port: int
    dir: Path
    profile: str = "healthy"
    proc: subprocess.Popen | None = field(default=None, repr=False)
    address: str = "127.0.0.1"

    @property
    def state(self) -> Path:
        return self.dir / "state"

    @property
    def work_dir(self) -> Path:
        return self.dir / "work"

    def read(self, name: str) -> str:
        p = self.state / name
        return p.read_text() if p.exists() else ""

    def installs(self) -> list[str]:
        return [ln for ln in self.read("installs.log").splitlines() if ln.strip()]

    def commands(self) -> int:
        return self.read("commands.log").count("\n----\n")

    def version(self, component: str) -> str:
        return self.read(f"versions/{component}").strip()

    def boot_id(self) -> str:
        return self.read("boot_id").strip()

    def reboots(self) -> int:
        return len(self.read("reboots.log").splitlines())


class SshdFarm:
    """N test hosts: N sshd servers on 127.0.0.1, one per host, or one sshd for all at 127.1.x.y
    (`one_sshd`, see the module's notes); `start()` returns once every host answers."""

    def __init__(self, root: Path, names: list[str], profiles: dict[str, str] | None = None, *,
                 one_sshd: bool = False, log_level: str = "ERROR"):
        self.root = root
        self.user = getpass.getuser()
        self.client_key = root / "client_key"
        self.known_hosts = root / "known_hosts"
        self.one_sshd = one_sshd
        self.log_level = log_level  # VERBOSE: sshd logs every connection's accept and close
        self.proc: subprocess.Popen | None = None  # the one sshd, in that layout
        if one_sshd:
            port = free_port_any()
            self.port = port
            self.hosts = {n: SshdHost(n, port, root / "hosts" / n, (profiles or {}).get(n, "healthy"),
                                      address=farm_address(i)) for i, n in enumerate(names)}
        else:
            ports = free_ports(len(names))
            self.hosts = {n: SshdHost(n, p, root / "hosts" / n, (profiles or {}).get(n, "healthy"))
                          for n, p in zip(names, ports, strict=True)}

    @property
    def sshd_log(self) -> Path:
        """The one sshd's log (one-sshd layout)."""
        return self.root / "sshd.log"

    def listeners(self) -> list[subprocess.Popen]:
        """Every sshd listener this farm started and still runs."""
        if self.one_sshd:
            return [self.proc] if self.proc is not None else []
        return [h.proc for h in self.hosts.values() if h.proc is not None]

    def __getitem__(self, name: str) -> SshdHost:
        return self.hosts[name]

    def start(self, timeout: float = 30.0) -> SshdFarm:
        if not os.access(SSHD, os.X_OK):
            raise RuntimeError(f"{SSHD} is missing: apt-get install openssh-server (.ci/run does)")
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)
        self.root.mkdir(parents=True, exist_ok=True)
        if not self.client_key.exists():
            _keygen(self.client_key)
        (self.root / "authorized_keys").write_text((self.root / "client_key.pub").read_text())
        for h in self.hosts.values():
            self._prepare(h)
        if self.one_sshd:
            self._prepare_one()
            self._spawn_one()
        else:
            for h in self.hosts.values():
                self._spawn(h)
        self.write_known_hosts()
        self.wait_ready(timeout)
        return self

    def _prepare_one(self) -> None:
        key = self.root / "host_key"
        if not key.exists():
            _keygen(key)
        by_addr = self.root / "by-addr"
        shutil.rmtree(by_addr, ignore_errors=True)
        by_addr.mkdir()
        for h in self.hosts.values():
            (by_addr / h.address).symlink_to(h.dir)
        path = f"{STANDINS}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
        (self.root / "sshd_config").write_text("\n".join([
            f"Port {self.port}",
            # every 127.x address is lo's; sshd takes no address range, so it listens everywhere and lets in
            # clients from loopback only (AllowUsers below)
            "ListenAddress 0.0.0.0",
            f"HostKey {key}",
            f"PidFile {self.root}/sshd.pid",
            f"AuthorizedKeysFile {self.root}/authorized_keys",
            f"AllowUsers {self.user}@127.*",
            "UsePAM no",
            "StrictModes no",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PermitRootLogin prohibit-password",
            # the default 10:30:100 drops unauthenticated connections beyond 10 at once: a fan-out of 64+ needs more
            "MaxStartups 2048:30:4096",
            "MaxSessions 64",
            f"LogLevel {self.log_level}",
            f"SetEnv RAILYARD_FARM={self.root} PATH={path} SHLVL=1",
            f"ForceCommand {STANDINS}/railyard-farm-session",
            "",
        ]))

    def _spawn_one(self) -> None:
        self.proc = subprocess.Popen([SSHD, "-D", "-f", str(self.root / "sshd_config"), "-E", str(self.sshd_log)],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for h in self.hosts.values():
            h.proc = self.proc

    def _prepare(self, h: SshdHost) -> None:
        (h.state / "versions").mkdir(parents=True, exist_ok=True)
        h.work_dir.mkdir(parents=True, exist_ok=True)
        (h.state / "profile").write_text(h.profile + "\n")
        for comp, ver in INITIAL_VERSIONS.items():
            (h.state / "versions" / comp).write_text(ver + "\n")
        if not (h.state / "boot_id").exists():
            (h.state / "boot_id").write_text(Path("/proc/sys/kernel/random/uuid").read_text())
        if self.one_sshd:
            return
        key = h.dir / "host_key"
        if not key.exists():
            _keygen(key)
        path = f"{STANDINS}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
        (h.dir / "sshd_config").write_text("\n".join([
            f"Port {h.port}",
            "ListenAddress 127.0.0.1",
            f"HostKey {key}",
            f"PidFile {h.dir}/sshd.pid",
            f"AuthorizedKeysFile {self.root}/authorized_keys",
            "UsePAM no",
            "StrictModes no",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PermitRootLogin prohibit-password",
            "MaxStartups 256:30:512",
            "MaxSessions 64",
            "LogLevel ERROR",
            # SHLVL=1: bash then skips ~/.bashrc for ssh commands (root's here runs `pyenv init`, ~0.2 s each)
            f"SetEnv RAILYARD_HOST_STATE={h.state} PATH={path} SHLVL=1",
            f"ForceCommand {STANDINS}/railyard-session",
            "",
        ]))

    def _spawn(self, h: SshdHost) -> None:
        h.proc = subprocess.Popen([SSHD, "-D", "-f", str(h.dir / "sshd_config"), "-E", str(h.dir / "sshd.log")],
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def write_known_hosts(self) -> None:
        """Every host's key pinned at its own address and port (in the one-sshd layout, the shared key at
        each address: a client that reaches an address not in the farm finds no pinned key)."""
        lines = []
        for h in self.hosts.values():
            pub = (self.root if self.one_sshd else h.dir) / "host_key.pub"
            kind, blob = pub.read_text().split()[:2]
            lines.append(f"[{h.address}]:{h.port} {kind} {blob}")
        self.known_hosts.write_text("\n".join(lines) + "\n")

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for h in self.hosts.values() if not self.one_sshd else list(self.hosts.values())[:1]:
            log = self.sshd_log if self.one_sshd else h.dir / "sshd.log"
            while True:
                if h.proc is not None and h.proc.poll() is not None:
                    raise RuntimeError(f"sshd for {h.name} exited: {log.read_text(errors='replace')}")
                try:
                    with socket.create_connection((h.address, h.port), timeout=1) as s:
                        if s.recv(4).startswith(b"SSH-"):
                            break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"sshd for {h.name} not answering on port {h.port}")
                time.sleep(0.02)

    def rekey(self, name: str) -> None:
        """The host comes back with a new host key (reinstalled, or someone in the middle)."""
        if self.one_sshd:
            raise NotImplementedError("one sshd serves every host with one key: rekey needs one sshd per host")
        h = self.hosts[name]
        self._kill(h)
        for f in ("host_key", "host_key.pub"):
            (h.dir / f).unlink(missing_ok=True)
        _keygen(h.dir / "host_key")
        self._spawn(h)
        self.wait_ready(10)

    def _kill(self, h: SshdHost) -> None:
        self._kill_listener(h.proc, h.dir / "sshd.pid")
        h.proc = None

    def _kill_listener(self, proc: subprocess.Popen | None, pid_file: Path) -> None:
        import psutil

        # Each listener is stopped (SIGSTOP) before its children are listed, so none can fork a new connection
        # between the listing and the kill; then the per-connection sshd processes of clients still connected
        # (pooled connections) go, then the listeners.
        leaders = [p for p in (proc.pid if proc is not None else None, self._restarted_pid(proc, pid_file)) if p]
        procs: list[psutil.Process] = []
        for pid in leaders:
            try:
                leader = psutil.Process(pid)
                if pid != (proc.pid if proc is not None else None) and "sshd" not in " ".join(leader.cmdline()):
                    continue  # a stale pid file
                leader.suspend()
                procs.append(leader)
            except psutil.Error:
                pass
        # A connection's monitor forks its post-auth child (`sshd: user@notty`) on its own: every process found
        # is stopped before its children are listed, until a listing finds none new; else a child forked
        # after the listing outlives the kill (adopted by the test session, held open by its client).
        sessions: list[psutil.Process] = []
        seen = {p.pid for p in procs}
        frontier = list(procs)
        while frontier:
            found: list[psutil.Process] = []
            for p in frontier:
                try:
                    found += [c for c in p.children(recursive=True) if c.pid not in seen]
                except psutil.Error:
                    pass
            frontier = []
            for c in found:
                if c.pid in seen:
                    continue
                seen.add(c.pid)
                try:
                    c.suspend()
                except psutil.Error:
                    continue
                frontier.append(c)
                sessions.append(c)
        for p in sessions + procs:
            try:
                p.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(sessions, timeout=5)
        if proc is not None:
            proc.wait(timeout=5)
        else:
            psutil.wait_procs(procs, timeout=5)

    @staticmethod
    def _restarted_pid(proc: subprocess.Popen | None, pid_file: Path) -> int | None:
        try:
            pid = int(pid_file.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        return None if proc is not None and pid == proc.pid else pid

    def stop(self) -> None:
        time.sleep(0.1)
        if self.one_sshd:
            self._kill_listener(self.proc, self.root / "sshd.pid")
            self.proc = None
            for h in self.hosts.values():
                h.proc = None
        else:
            for h in self.hosts.values():
                self._kill(h)
        self._end_orphaned_sessions()

    @staticmethod
    def _end_orphaned_sessions() -> None:
        """A connection whose monitor already exited leaves its `sshd: user@notty` child orphaned: adopted by
        this process (the test session is a child subreaper), outside every listener's tree: the direct children
        named `sshd: user@...` or `sshd: user [priv]`, never a listener."""
        import psutil

        orphans = []
        for p in psutil.Process().children():
            try:
                cmd = " ".join(p.cmdline())
                # a listener calls itself `sshd: /usr/sbin/sshd -D ... [listener] ...`: never one of them
                if cmd.startswith("sshd: ") and not cmd.startswith("sshd: /") and "[listener]" not in cmd:
                    p.kill()
                    orphans.append(p)
            except psutil.Error:
                pass
        psutil.wait_procs(orphans, timeout=5)

    def reset(self, name: str, profile: str | None = None) -> None:
        """Fresh state for a host: initial versions, no logs, empty work dir."""
        h = self.hosts[name]
        if profile is not None:
            h.profile = profile
        shutil.rmtree(h.state, ignore_errors=True)
        shutil.rmtree(h.work_dir, ignore_errors=True)
        self._prepare(h)

    def ssh_hosts_config(self) -> dict:
        """`fleet.ssh.hosts` for these servers: each host on its port, with its own work dir."""
        return {n: {"address": h.address, "port": h.port, "work_dir": str(h.work_dir)} for n, h in self.hosts.items()}
