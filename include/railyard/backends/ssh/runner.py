"""`SshRunner`: the host-runner port over SSH (paramiko), for plain hosts.

- Host keys are pinned: only keys in the given known_hosts are accepted; an unknown or changed key
  is refused before authentication, so no command ever reaches a host we cannot identify. The file is
  read once and again only when it changes (`PinnedKeys`): paramiko's own reader compares every line
  with every line before it, 0.3 s a connection at 1,024 hosts.
- A connection lives as long as its host's step: `session(host)` holds one for every call inside it,
  `fan_out` holds one per host while that host's call runs, and a call outside any session opens its
  own. Each is closed when its holder is done, so at most `parallelism` connections are open at once
  in a fan-out, whatever the number of hosts (and as many sshd sessions on the hosts' side).
- Explicit connect and command timeouts; retries on connection errors only (a command that
  started is never re-sent by the transport layer: every step is idempotent one level up). A command's
  deadline covers the whole exchange, the exec request's answer included (paramiko waits for that one
  for ever): a host that stops answering mid-command has its connection closed at the deadline, and
  the call ends with `CommandTimeout`. Connections send SSH keepalives and use TCP keepalives, so a
  partitioned host's connection dies in about a minute, not at the kernel's two-hour default.
- Installs run detached on the host under `flock`, one driver per operation, with an exit status
  and a log per component in `<work_dir>/<op-hash>/`. Launching again is always safe: a second
  driver finds the lock held and exits 75, and a finished step is never repeated, so a retried task
  re-attaches instead of installing twice.
- Every command is built from fixed text and values that passed `check_token` and `shlex.quote`.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shlex
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import paramiko

from railyard.backends.hosts.port import RunnerError, UpgradeState
from railyard.backends.ssh.checks import Verdict, check_command, check_versions, judge
from railyard.domain.config.ssh import HealthChecksSpec, check_abs_path, check_address
from railyard.domain.models import CheckResult, Step, check_token
from railyard.domain.recipes import render

if TYPE_CHECKING:
    from railyard.domain.config import ComponentSpec, RailyardConfig

log = logging.getLogger("railyard.ssh")

T = TypeVar("T")
MAX_OUTPUT = 1 << 20
LOCK_BUSY = 75
KEEPALIVE_S = 15  # an SSH keepalive this often on an idle connection
TCP_KEEPALIVE = (30, 10, 3)  # idle seconds, probe interval, probes: a silent peer is dropped after ~60 s


def keep_alive(client: paramiko.SSHClient) -> None:
    """SSH and TCP keepalives on a connected client (see the module's notes)."""
    import socket

    tr = client.get_transport()
    if tr is None:
        return
    tr.set_keepalive(KEEPALIVE_S)
    sock: Any = tr.sock  # a socket, or a proxy command's channel (no TCP options)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        idle, interval, count = TCP_KEEPALIVE
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, idle)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, interval)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, count)
    except (OSError, AttributeError):  # not a TCP socket (a proxy command): the SSH keepalive only
        pass


class HostKeyRefused(RunnerError):
    """The host offered a key that is not pinned (unknown) or differs from the pinned one."""


class CommandTimeout(RunnerError):
    """A command ran longer than its timeout; it is not retried."""


class _RejectUnknown(paramiko.MissingHostKeyPolicy):
    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        raise HostKeyRefused(f"{hostname}: host key {key.get_name()} {key.fingerprint} "
                             "is not pinned in known_hosts; refused")


@dataclass(frozen=True)
class Target:
    """Where one host is reached, and its SKU (for recipe variables and check thresholds)."""

    name: str
    address: str
    port: int
    work_dir: str
    sku: str = "gpu"

    def __post_init__(self) -> None:
        check_token(self.name)
        check_address(self.address)
        check_abs_path(self.work_dir)
        check_token(self.sku)
        if not 1 <= int(self.port) <= 65535:
            raise ValueError(f"port {self.port!r} out of range")


@dataclass(frozen=True)
class Credentials:
    user: str
    key_file: str
    known_hosts: str

    def __post_init__(self) -> None:
        check_token(self.user)


Connector = Callable[[Target], paramiko.SSHClient]


class PinnedKeys:
    """The keys a known_hosts file pins, by host name as paramiko asks for it (`addr`, or `[addr]:port` off
    port 22; hashed names too). Read at first use and again whenever the file's size, time or inode change."""

    def __init__(self, path: str):
        self.path = path
        self._stamp: tuple[int, int, int] | None = None
        self._plain: dict[str, list[paramiko.PKey]] = {}
        self._hashed: list[tuple[str, paramiko.PKey]] = []
        self._lock = threading.Lock()

    def _refresh(self) -> None:
        st = os.stat(self.path)
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        if stamp == self._stamp:
            return
        plain: dict[str, list[paramiko.PKey]] = {}
        hashed: list[tuple[str, paramiko.PKey]] = []
        with open(self.path) as f:
            for lineno, raw in enumerate(f, 1):
                line = raw.strip()
                if not line or line[0] in "#@":  # markers (@cert-authority, @revoked): paramiko reads none
                    continue
                try:
                    entry = paramiko.hostkeys.HostKeyEntry.from_line(line, lineno)
                except (paramiko.SSHException, paramiko.hostkeys.InvalidHostKey):
                    continue
                if entry is None or entry.key is None:
                    continue
                for h in entry.hostnames:
                    if h.startswith("|1|"):
                        hashed.append((h, entry.key))
                    else:
                        plain.setdefault(h, []).append(entry.key)
        self._plain, self._hashed, self._stamp = plain, hashed, stamp

    def keys_for(self, name: str) -> list[paramiko.PKey]:
        with self._lock:
            self._refresh()
            keys = list(self._plain.get(name, []))
            keys += [k for h, k in self._hashed if paramiko.HostKeys.hash_host(name, h) == h]
        return keys

    def pin(self, client: paramiko.SSHClient, address: str, port: int) -> None:
        """Only this host's pinned keys into `client` (the name paramiko looks up for address:port)."""
        name = address if port == 22 else f"[{address}]:{port}"
        store = client.get_host_keys()
        for k in self.keys_for(name):
            store.add(name, k.get_name(), k)


def paramiko_connector(creds: Credentials, *, connect_timeout: float = 10.0) -> Connector:
    """Opens a client that trusts only the pinned keys in `creds.known_hosts` (never ~/.ssh)."""
    pinned = PinnedKeys(creds.known_hosts)

    def connect(t: Target) -> paramiko.SSHClient:
        client = paramiko.SSHClient()
        client.set_missing_host_key_policy(_RejectUnknown())
        try:
            pinned.pin(client, t.address, t.port)
            client.connect(t.address, port=t.port, username=creds.user, key_filename=creds.key_file,
                           timeout=connect_timeout, banner_timeout=connect_timeout, auth_timeout=connect_timeout,
                           look_for_keys=False, allow_agent=False)
        except paramiko.BadHostKeyException as exc:
            client.close()
            raise HostKeyRefused(
                f"{t.name} ({t.address}:{t.port}): host key changed: got {exc.key.get_name()} "
                f"{exc.key.fingerprint}, pinned {exc.expected_key.fingerprint}; refused") from None
        except paramiko.AuthenticationException as exc:
            tr = client.get_transport()
            gone = tr is None or not tr.is_active()
            client.close()
            if gone:
                # paramiko reports a connection that went mid-authentication (the host going down) as an
                # authentication failure: it is connection trouble, tried again like any other
                raise EOFError(f"connection closed during authentication ({exc})") from None
            raise
        except BaseException:
            client.close()
            raise
        return client

    return connect


def _retryable(exc: BaseException) -> bool:
    """Connection trouble worth another try: refused, reset, timed out, banner lost. Never keys or auth."""
    if isinstance(exc, HostKeyRefused | paramiko.AuthenticationException | paramiko.BadHostKeyException):
        return False
    return isinstance(exc, OSError | EOFError | paramiko.SSHException)


def op_dir(work_dir: str, op: str) -> str:
    """The op's folder on the host: the op id hashed (run ids hold ':' and '+')."""
    return f"{work_dir.rstrip('/')}/{hashlib.sha256(op.encode()).hexdigest()[:16]}"


class SshRunner:
    """`HostRunner` over SSH for the hosts in `targets`; `fan_out` runs one call over many in parallel."""

    def __init__(self, targets: dict[str, Target], components: dict[str, ComponentSpec], checks: HealthChecksSpec,
                 connect: Connector, *, command_timeout: float = 60.0, connect_retries: int = 2,
                 retry_backoff_s: float = 0.5, parallelism: int = 32, reboot_command: str | None = None,
                 reboot_timeout_s: float = 900.0, boot_id_command: str = "cat /proc/sys/kernel/random/boot_id",
                 resolve: Callable[[str], Target] | None = None):
        self.targets = targets
        self.components = components
        self.checks = checks
        self._connect = connect
        self.command_timeout = command_timeout
        self.connect_retries = connect_retries
        self.retry_backoff_s = retry_backoff_s
        self.parallelism = parallelism
        self.reboot_command = reboot_command
        self.reboot_timeout_s = reboot_timeout_s
        self.boot_id_command = boot_id_command
        self.resolve = resolve  # hosts not in `targets` (Slurm nodes: ssh_hosts, a pattern or NodeAddr)
        self._clients: dict[str, paramiko.SSHClient] = {}
        self._holds: dict[str, int] = {}  # host -> sessions holding its connection
        self._locks: dict[str, threading.Lock] = {h: threading.Lock() for h in targets}
        self._locks_lock = threading.Lock()
        self._gauge = threading.Lock()
        self.connects = 0  # connections opened: tests prove bad input never gets this far
        self.open_now = 0  # connections open at this moment
        self.peak_open = 0  # the most open at once since this runner was made

    @classmethod
    def from_config(cls, cfg: RailyardConfig, connect: Connector) -> SshRunner:
        ssh = cfg.fleet.ssh
        if ssh is None:
            raise ValueError("fleet.ssh: the ssh backend needs this section")
        sku = {h: d.sku for d in cfg.domains for h in d.hosts}
        targets = {n: Target(n, h.address, h.port, ssh.host_work_dir(n), sku.get(n, "gpu"))
                   for n, h in ssh.hosts.items()}
        return cls(targets, {c.name: c for c in cfg.components}, ssh.checks, connect,
                   command_timeout=ssh.command_timeout_s, connect_retries=ssh.connect_retries,
                   parallelism=ssh.parallelism, reboot_command=ssh.reboot_command,
                   reboot_timeout_s=ssh.reboot_timeout_s, boot_id_command=ssh.boot_id_command)

    def close(self) -> None:
        with self._locks_lock:
            clients, self._clients = self._clients, {}
        for c in clients.values():
            self._drop(c)

    def __enter__(self) -> SshRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- input checks: before any connection ----------------------------------------------------
    def target(self, host: str) -> Target:
        check_token(host)
        if host not in self.targets:
            if self.resolve is None:
                raise ValueError(f"host {host!r} is not configured in fleet.ssh.hosts")
            self.targets[host] = self.resolve(host)
        return self.targets[host]

    def _lock(self, host: str) -> threading.Lock:
        with self._locks_lock:
            return self._locks.setdefault(host, threading.Lock())

    def _check_steps(self, steps: Iterable[Step | dict[str, Any]]) -> list[Step]:
        out = []
        for s in steps:
            step = s if isinstance(s, Step) else Step.model_validate(s)
            comp = self.components.get(step.component)
            if comp is None or comp.install is None or comp.verify is None:
                raise ValueError(f"component {step.component!r} has no install/verify recipe")
            out.append(step)
        return out

    def _check_op(self, op: str) -> str:
        if not isinstance(op, str) or not op or len(op) > 512 or any(ord(c) < 32 for c in op):
            raise ValueError(f"operation id {op!r} is not acceptable")
        return op

    # ---- transport ----------------------------------------------------------------------------
    @contextmanager
    def session(self, host: str) -> Iterator[None]:
        """One connection to `host` for every call made inside (opened by the first), closed at the end
        unless another session holds it too. Sessions nest; `fan_out` holds one per host."""
        name = self.target(host).name
        with self._lock(name):
            self._holds[name] = self._holds.get(name, 0) + 1
        try:
            yield
        finally:
            gone = None
            with self._lock(name):
                left = self._holds[name] - 1
                if left:
                    self._holds[name] = left
                else:
                    del self._holds[name]
                    with self._locks_lock:
                        gone = self._clients.pop(name, None)
            if gone is not None:
                self._drop(gone)

    def _client(self, t: Target, fresh: bool = False) -> paramiko.SSHClient:
        with self._lock(t.name):
            c = self._clients.get(t.name)
            if c is not None and not fresh:
                tr = c.get_transport()
                if tr is not None and tr.is_active():
                    return c
            if c is not None:
                with self._locks_lock:
                    self._clients.pop(t.name, None)
                self._drop(c)
            self.connects += 1
            with self._gauge:  # counted from the connect on: a handshake in progress holds a connection too
                self.open_now += 1
                self.peak_open = max(self.peak_open, self.open_now)
            try:
                c = self._connect(t)
            except BaseException:
                with self._gauge:
                    self.open_now -= 1
                raise
            keep_alive(c)
            with self._locks_lock:
                self._clients[t.name] = c
            return c

    def _drop(self, c: paramiko.SSHClient) -> None:
        try:
            c.close()
        finally:
            with self._gauge:
                self.open_now -= 1

    def run(self, host: str, command: str, *, timeout: float | None = None) -> tuple[int, str]:
        """Run one command; (exit status, stdout+stderr). Retries only if the connection fails."""
        with self.session(host):
            return self._run(host, command, timeout)

    def _run(self, host: str, command: str, timeout: float | None) -> tuple[int, str]:
        t = self.target(host)
        timeout = timeout or self.command_timeout
        last: BaseException | None = None
        for attempt in range(self.connect_retries + 1):
            if attempt:
                time.sleep(self.retry_backoff_s * 2 ** (attempt - 1))
            try:
                client = self._client(t, fresh=attempt > 0)
                tr = client.get_transport()
                if tr is None:
                    raise EOFError("no transport")
                chan = tr.open_session(timeout=timeout)
            except BaseException as exc:  # noqa: BLE001 - classified below
                if not _retryable(exc):
                    if isinstance(exc, RunnerError):
                        raise
                    raise RunnerError(f"{host}: {type(exc).__name__}: {exc}") from None
                last = exc
                continue
            return self._exec(host, chan, command, timeout)
        raise RunnerError(f"{host} ({t.address}:{t.port}) unreachable after {self.connect_retries + 1} "
                          f"attempt(s): {type(last).__name__}: {last}")

    def _exec(self, host: str, chan: paramiko.Channel, command: str, timeout: float) -> tuple[int, str]:
        deadline = time.monotonic() + timeout
        chan.set_combine_stderr(True)
        chan.settimeout(min(timeout, 5.0))
        buf = bytearray()
        tr = chan.get_transport()
        expired = threading.Event()

        def give_up() -> None:  # the only way out of a wait paramiko does not bound (the exec request's answer)
            expired.set()
            log.warning("%s: no answer within %.0fs; closing its connection", host, timeout)
            if tr is not None:
                tr.close()

        watchdog = threading.Timer(timeout + 1.0, give_up)
        watchdog.daemon = True
        watchdog.start()
        try:
            chan.exec_command(command)
            while True:
                try:
                    data = chan.recv(65536)
                except TimeoutError:
                    data = None
                if data:
                    if len(buf) < MAX_OUTPUT:
                        buf.extend(data[: MAX_OUTPUT - len(buf)])
                elif data == b"" and chan.exit_status_ready():
                    break
                elif data == b"":
                    chan.status_event.wait(0.05)
                if time.monotonic() > deadline:
                    raise CommandTimeout(f"{host}: command did not finish within {timeout:.0f}s")
            rc = chan.recv_exit_status()
            if rc == -1 and (tr is None or not tr.is_active()):
                # closed without an exit status because the connection went (the host went down): not an answer.
                # A command killed by a signal also has none, but its connection stays up.
                raise EOFError("the connection closed before the command's exit status came")
        except (OSError, EOFError, paramiko.SSHException) as exc:
            if expired.is_set():
                raise CommandTimeout(f"{host}: no answer within {timeout:.0f}s (connection closed)") from None
            raise RunnerError(f"{host}: connection lost during a command: {type(exc).__name__}: {exc}") from None
        finally:
            watchdog.cancel()
            chan.close()
        return rc, buf.decode(errors="replace")

    def fan_out(self, hosts: Iterable[str], fn: Callable[[str], T]) -> dict[str, T | BaseException]:
        """`fn(host)` for every host, at most `parallelism` at a time, each in a session of its own (so at most
        `parallelism` connections open); each host's error is its result."""
        names = list(hosts)
        out: dict[str, T | BaseException] = {}
        if not names:
            return out

        def one(h: str) -> tuple[str, T | BaseException]:
            try:
                with self.session(h):  # the host's connection closes as soon as its call is done
                    return h, fn(h)
            except Exception as exc:  # noqa: BLE001 - reported per host
                return h, exc

        with ThreadPoolExecutor(max_workers=min(self.parallelism, len(names))) as pool:
            for h, r in pool.map(one, names):
                out[h] = r
        return out

    # ---- HostRunner: versions -----------------------------------------------------------------
    def _verify_script(self, t: Target) -> str:
        lines = []
        for name, comp in sorted(self.components.items()):
            if comp.verify is None:
                continue
            cmd = render(comp.verify, host=t.name, component=name, sku=t.sku, gpus=self.checks.gpus(t.sku))
            lines.append(f"printf '%s\\t' {shlex.quote(name)}; "
                         f"(timeout 30 sh -c {shlex.quote(cmd)} </dev/null 2>/dev/null | head -n 1); echo")
        return "\n".join(lines) or "true"

    @staticmethod
    def _parse_versions(text: str) -> dict[str, str]:
        out: dict[str, str] = {}
        for line in text.splitlines():
            comp, _, ver = line.partition("\t")
            ver = ver.strip()
            try:
                out[check_token(comp)] = check_token(ver)
            except ValueError:
                continue  # an unreadable version is an unknown version
        return out

    def versions(self, host: str) -> dict[str, str]:
        t = self.target(host)
        rc, out = self.run(host, self._verify_script(t))
        return self._parse_versions(out)

    # ---- HostRunner: upgrade ------------------------------------------------------------------
    def _driver(self, t: Target, steps: list[Step]) -> str:
        """The on-host driver: each step reads the installed version first, installs only if needed."""
        q = shlex.quote
        body = ["#!/bin/sh", "# railyard upgrade driver: one per operation, run under flock",
                'echo "$(date -u +%FT%TZ) driver start pid $$" >> driver.log']
        for s in steps:
            comp = self.components[s.component]
            vars_ = dict(host=t.name, component=s.component, version=s.version, sku=t.sku, gpus=self.checks.gpus(t.sku))
            install, verify = render(comp.install, **vars_), render(comp.verify, **vars_)  # type: ignore[arg-type]
            c, v = q(s.component), q(s.version)
            body += [
                f"if [ ! -e {c}.status ]; then",
                f"  cur=$(timeout 30 sh -c {q(verify)} </dev/null 2>/dev/null | head -n 1)",
                f"  if [ \"$cur\" = {v} ]; then",
                f"    echo \"already at {s.version}\" > {c}.log; echo 0 > {c}.status.tmp; mv {c}.status.tmp {c}.status",
                "  else",
                f"    date -u +%FT%TZ > {c}.started",
                f"    timeout -k 10 {int(comp.timeout_s)} sh -c {q(install)} > {c}.log 2>&1 </dev/null; rc=$?",
                f"    echo $rc > {c}.status.tmp; mv {c}.status.tmp {c}.status",
                f"    [ $rc -eq 0 ] && [ {1 if comp.reboot else 0} -eq 1 ] && echo {c} >> reboot.needed",
                "  fi",
                "fi",
                f"[ \"$(cat {c}.status)\" = 0 ] || exit 1",
            ]
        body += ["touch done"]
        if self.reboot_command:
            # Once per operation, also when a re-launched driver finds every install already done.
            # The step is done only when the host answers with a new boot id (`upgrade_state`).
            cmd = render(self.reboot_command, host=t.name, sku=t.sku, gpus=self.checks.gpus(t.sku))
            body += ["if [ -e reboot.needed ] && [ ! -e reboot.requested ]; then date +%s > reboot.requested.tmp; "
                     "mv reboot.requested.tmp reboot.requested; "
                     f"sh -c {q(cmd)} > reboot.log 2>&1 </dev/null; fi"]
        return "\n".join(body) + "\n"

    def upgrade(self, host: str, steps: list[Step], op: str) -> None:
        t = self.target(host)
        steps = self._check_steps(steps)
        d = op_dir(t.work_dir, self._check_op(op))
        if not steps:
            return
        plan = " ".join(f"{s.component}={s.version}" for s in steps)
        script = self._driver(t, steps)
        # The driver is written once per op (a retry keeps the first plan); every launch goes through
        # `flock -n`, so while one driver runs another exits 75 at once, and it is logged.
        cmd = "\n".join([
            "set -e",
            f"D={shlex.quote(d)}",
            'mkdir -p "$D"',
            'cd "$D"',
            f"[ -e driver.sh ] || {{ printf '%s' {shlex.quote(script)} > driver.sh.tmp; "
            f"printf '%s\\n' {shlex.quote(plan)} > plan; mv driver.sh.tmp driver.sh; }}",
            # the boot id before anything is installed: a reboot is proven only by a new one
            f"[ -s boot_id.before ] || {{ {self._boot_id_sh(t)}; [ -n \"$B\" ] || {{ echo 'no boot id'; exit 3; }}; "
            "printf '%s\\n' \"$B\" > boot_id.tmp; mv boot_id.tmp boot_id.before; }",
            "nohup setsid sh -c 'flock -n -E 75 upgrade.lock sh driver.sh; "
            "echo \"$(date -u +%FT%TZ) launch exit $?\" >> launch.log' >/dev/null 2>&1 </dev/null &",
            "echo launched",
        ])
        rc, out = self.run(host, cmd)
        if rc != 0 or "launched" not in out:
            raise RunnerError(f"{host}: could not launch the upgrade (exit {rc}): {out.strip()[-300:]}")

    def upgrade_state(self, host: str, op: str) -> UpgradeState:
        t = self.target(host)
        d = op_dir(t.work_dir, self._check_op(op))
        cmd = "\n".join([
            f"D={shlex.quote(d)}",
            'cd "$D" 2>/dev/null || { echo none; exit 0; }',
            "if flock -n upgrade.lock true; then echo 'lock free'; else echo 'lock held'; fi",
            "[ -e plan ] && printf 'plan %s\\n' \"$(cat plan)\"",
            "[ -e reboot.needed ] && echo 'reboot needed'",
            "[ -e reboot.requested ] && printf 'reboot requested %s now %s\\n' \"$(head -c 20 reboot.requested)\" "
            "\"$(date +%s)\"",
            f"{self._boot_id_sh(t)}; printf 'boot %s %s\\n' \"$(head -c 64 boot_id.before 2>/dev/null)\" \"$B\"",
            "for f in *.status; do [ -e \"$f\" ] || continue; c=${f%.status}; s=$(head -c 16 \"$f\");",
            "  printf 'status %s %s\\n' \"$c\" \"$s\";",
            "  [ \"$s\" = 0 ] || { printf 'log %s ' \"$c\"; tail -c 300 \"$c.log\" 2>/dev/null"
            " | tr '\\n\\r' '  '; echo; }",
            "done",
        ])
        rc, out = self.run(host, cmd)
        return self._parse_state(host, out)

    def _parse_state(self, host: str, out: str) -> UpgradeState:
        lines = out.splitlines()
        if not lines or lines[0].strip() == "none":
            return UpgradeState(host=host, status="idle")
        held = any(ln.strip() == "lock held" for ln in lines)
        plan: list[str] = []
        status: dict[str, str] = {}
        logs: dict[str, str] = {}
        for ln in lines:
            if ln.startswith("plan "):
                plan = [p.split("=", 1)[0] for p in ln[5:].split()]
            elif ln.startswith("status "):
                parts = ln.split()
                if len(parts) == 3:
                    status[parts[1]] = parts[2]
            elif ln.startswith("log "):
                _, comp, *rest = ln.split(" ", 2)
                logs[comp] = " ".join(rest).strip()
        if held:
            return UpgradeState(host=host, status="running")
        for comp in plan:
            s = status.get(comp)
            if s is not None and s != "0":
                spec = self.components.get(comp)
                why = (f"timed out after {int(spec.timeout_s)}s" if s == "124" and spec else f"exit {s}")
                tail = logs.get(comp, "")
                return UpgradeState(host=host, status="failed",
                                    error=f"{comp}: install {why}" + (f": {tail}" if tail else ""))
        if plan and all(status.get(c) == "0" for c in plan):
            return self._reboot_state(host, lines)
        return UpgradeState(host=host, status="idle")

    def _reboot_state(self, host: str, lines: list[str]) -> UpgradeState:
        """Every install is done; when one needs a reboot, done only once the host has a new boot id."""
        if not any(ln.strip() == "reboot needed" for ln in lines):
            return UpgradeState(host=host, status="done")
        if not self.reboot_command:
            return UpgradeState(host=host, status="failed", error="a component needs a reboot and no reboot_command "
                                "is configured")
        req = next((ln.split() for ln in lines if ln.startswith("reboot requested ")), None)
        if req is None:
            return UpgradeState(host=host, status="idle")  # the driver ended before the reboot: launch again
        boot = next((ln.split()[1:] for ln in lines if ln.startswith("boot ")), [])
        before, now_id = (boot + ["", ""])[:2]
        if before and now_id and before != now_id:
            return UpgradeState(host=host, status="done")
        try:
            waited = float(req[4]) - float(req[2])
        except (IndexError, ValueError):
            waited = float("inf")
        if waited > self.reboot_timeout_s:
            return UpgradeState(host=host, status="failed", error=(
                f"reboot not proven: boot id {now_id or 'unreadable'} unchanged {waited:.0f}s after the reboot "
                f"command (reboot_timeout_s {self.reboot_timeout_s:.0f})"))
        return UpgradeState(host=host, status="running")  # rebooting

    def _boot_id_sh(self, t: Target) -> str:
        """Shell that sets B to the host's boot id, reduced to plain characters (host output is untrusted)."""
        cmd = render(self.boot_id_command, host=t.name, sku=t.sku, gpus=self.checks.gpus(t.sku))
        return f"B=$(sh -c {shlex.quote(cmd)} 2>/dev/null </dev/null | head -n 1 | tr -cd 'A-Za-z0-9-' | head -c 64)"

    # ---- HostRunner: deep health check --------------------------------------------------------
    def _check_names(self) -> list[str]:
        return [n for n in self.checks.run if n != "versions"]

    def start_check(self, host: str, expected: dict[str, str], op: str) -> None:
        t = self.target(host)
        for c, v in expected.items():
            check_token(c)
            check_token(v)
        d = op_dir(t.work_dir, self._check_op(op))
        q = shlex.quote
        expect = " ".join(f"{c}={v}" for c, v in sorted(expected.items()))
        body = ["#!/bin/sh", "# railyard health checks: one run per operation, under flock"]
        for name in self._check_names():
            cmd = check_command(name, self.checks, self.checks.gpus(t.sku))
            body.append(f"[ -e {name}.rc ] || {{ timeout -k 10 {int(self.checks.timeout_s)} sh -c {q(cmd)} "
                        f"> {name}.out 2>&1 </dev/null; echo $? > {name}.rc.tmp; mv {name}.rc.tmp {name}.rc; }}")
        body.append("touch done")
        script = "\n".join(body) + "\n"
        cmd = "\n".join([
            f"{self._boot_id_sh(t)}",
            "[ -n \"$B\" ] || { echo 'no boot id'; exit 3; }",
            "set -e",
            # one check per boot: results from before a reboot are never read after it
            f"D={q(d)}/check-$B",
            'mkdir -p "$D"',
            'cd "$D"',
            f"[ -e check.sh ] || {{ printf '%s\\n' {q(expect)} > expected; "
            f"printf '%s' {q(script)} > check.sh.tmp; mv check.sh.tmp check.sh; }}",
            "nohup setsid sh -c 'flock -n -E 75 check.lock sh check.sh; "
            "echo \"$(date -u +%FT%TZ) launch exit $?\" >> launch.log' >/dev/null 2>&1 </dev/null &",
            "echo launched",
        ])
        rc, out = self.run(host, cmd)
        if rc != 0 or "launched" not in out:
            raise RunnerError(f"{host}: could not start the health check (exit {rc}): {out.strip()[-300:]}")

    def check_outputs(self, host: str, op: str) -> dict[str, Any] | None:
        """Raw outputs of a finished check run, or None while it runs or before it started."""
        t = self.target(host)
        d = op_dir(t.work_dir, self._check_op(op))
        mark = "==railyard-" + hashlib.sha256(d.encode()).hexdigest()[:12]
        cmd = "\n".join([
            self._boot_id_sh(t),
            "[ -n \"$B\" ] || { echo none; exit 0; }",
            f"D={shlex.quote(d)}/check-$B",
            'cd "$D" 2>/dev/null || { echo none; exit 0; }',
            "if flock -n check.lock true; then :; else echo running; exit 0; fi",
            "[ -e done ] || { echo idle; exit 0; }",
            "echo finished",
            "printf 'expected %s\\n' \"$(cat expected 2>/dev/null)\"",
            *[f"printf '%s {n} %s\\n' {mark} \"$(cat {n}.rc 2>/dev/null)\"; head -c 200000 {n}.out 2>/dev/null; echo"
              for n in self._check_names()],
        ])
        rc, out = self.run(host, cmd)
        first = out.split("\n", 1)[0].strip()
        if first != "finished":
            return {"state": first or "none"}
        results: dict[str, tuple[str, int]] = {}
        cur: str | None = None
        buf: list[str] = []
        code = 0
        lines = out.split("\n")[1:]
        expected: dict[str, str] = {}
        if lines and lines[0].startswith("expected "):
            for pair in lines.pop(0)[9:].split():
                c, _, v = pair.partition("=")
                expected[c] = v
        for ln in lines:
            if ln.startswith(mark + " "):
                if cur:
                    results[cur] = ("\n".join(buf), code)
                _, cur, rc_s = (ln.split(" ") + ["", ""])[:3]
                code = int(rc_s) if rc_s.strip().lstrip("-").isdigit() else 255
                buf = []
            else:
                buf.append(ln)
        if cur:
            results[cur] = ("\n".join(buf), code)
        return {"state": "finished", "results": results, "expected": expected}

    def verdicts(self, host: str, expected: dict[str, str] | None,
                 op: str) -> tuple[list[Verdict], dict[str, str]] | str:
        """Every configured check's verdict and the versions found, or the state if not finished.

        `expected` defaults to what `start_check` recorded on the host for this op.
        """
        t = self.target(host)
        raw = self.check_outputs(host, op)
        if raw is None or raw["state"] != "finished":
            return str((raw or {}).get("state", "none"))
        expected = dict(expected) if expected else raw["expected"]
        versions = self.versions(host)
        out: list[Verdict] = []
        for name in self.checks.run:
            if name == "versions":
                out.append(check_versions(versions, expected))
                continue
            text, rc = raw["results"].get(name, ("", 255))
            out.append(judge(name, text, rc, spec=self.checks, sku=t.sku, expected=expected))
        return out, versions

    def check_result(self, host: str, op: str) -> CheckResult:
        v = self.verdicts(host, None, op)
        if isinstance(v, str):
            return CheckResult(host=host, status="pending", reason=v)
        return result_of(host, *v)


def result_of(host: str, verdicts: list[Verdict], versions: dict[str, str]) -> CheckResult:
    failed = [v for v in verdicts if not v.passed]
    if failed:
        return CheckResult(host=host, status="failed", reason="; ".join(v.summary for v in failed)[:1000],
                           versions=versions)
    return CheckResult(host=host, status="passed", reason=None, versions=versions)


__all__ = ["Credentials", "HostKeyRefused", "SshRunner", "Target", "op_dir", "paramiko_connector", "result_of"]
