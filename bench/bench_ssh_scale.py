"""SSH at a thousand hosts: one sshd serving N test hosts at 127.1.x.y (tests/support/sshd.py, `one_sshd`).

(a) Fan-out: the same command on the same N hosts by Railyard's `SshRunner`, by Ansible ad hoc (`-m raw`, which
    runs the command over ssh as it is, and `-m command`, its usual module, run by Python on the host) and by
    ClusterShell's `clush`, at the same parallelism (forks, fanout). Same key, pinned known_hosts, port and
    command; fresh connections every run (Ansible: pipelining on, no ControlPersist: a one-shot fan-out reuses
    no connection, and a persisting master per host would keep N ssh and 2N sshd processes for a minute). The
    same key exchange for all: paramiko's (curve25519-sha256) is given to OpenSSH's client too, whose default
    here (sntrup761x25519, post-quantum) costs ~90 ms of client CPU a connection against ~12 ms; clush with that
    default runs once more as its own row. REPS runs of each, interleaved, the order turned each time; the
    median; every host must answer exit 0 in every run. CPU of each run: the tool's (this process for Railyard,
    the tool and its ssh children otherwise) and the sshd side's (the listener and the connection processes it
    reaped).
(b) A full stop over one N-host SSH domain (`Stop` in this process, `SshFleet` with its state in SQLite, the
    stand-in tools; a reboot per host): it completes with every host back at the train's targets; its wall
    time by step; Railyard's client CPU per host (this process, less the sampler's own thread); and, sampled
    every 20 ms, the peak of threads, RSS and connections open to the farm (the kernel's count, beside the
    runner's own), with the connections and commands each host took.

    RAILYARD_BENCH_SSH_SCALE_HOSTS (256; the figures in docs/performance.md are at 1024)
    RAILYARD_BENCH_SSH_SCALE_PARALLELISM (64), RAILYARD_BENCH_SSH_SCALE_REPS (3),
    RAILYARD_BENCH_SSH_SCALE_ANSIBLE (raw,command: the Ansible modules to run), RAILYARD_BENCH_SSH_SCALE_STOP (1),
    RAILYARD_BENCH_SSH_SCALE_CLUSH_DEFAULT_KEX (1: also clush with OpenSSH's default key exchange)

Prints its figures, then one JSON object as the last line.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "include"), str(Path(__file__).resolve().parent)]

from bench_ssh import ANSIBLE, ansible_once, client_cpu_s, inventory, sshd_cpu_s  # noqa: E402

from railyard.backends.ssh.runner import Credentials, SshRunner, paramiko_connector  # noqa: E402
from railyard.domain.config import parse_config  # noqa: E402
from railyard.domain.recipes import render  # noqa: E402
from tests.support.configs import ssh_config  # noqa: E402
from tests.support.sshd import SshdFarm  # noqa: E402

HOSTS = int(os.environ.get("RAILYARD_BENCH_SSH_SCALE_HOSTS", "256"))
PARALLELISM = int(os.environ.get("RAILYARD_BENCH_SSH_SCALE_PARALLELISM", "64"))
REPS = int(os.environ.get("RAILYARD_BENCH_SSH_SCALE_REPS", "3"))
ANSIBLE_MODULES = [m for m in os.environ.get("RAILYARD_BENCH_SSH_SCALE_ANSIBLE", "raw,command").split(",") if m]
RUN_STOP = os.environ.get("RAILYARD_BENCH_SSH_SCALE_STOP", "1") != "0"
CLUSH_DEFAULT_KEX = os.environ.get("RAILYARD_BENCH_SSH_SCALE_CLUSH_DEFAULT_KEX", "1") != "0"
KEX = "-oKexAlgorithms=curve25519-sha256@libssh.org,curve25519-sha256"  # what paramiko negotiates with this sshd
CLUSH = Path(sys.executable).parent / "clush"
CONNECT_TIMEOUT = 30  # every tool: 2 cores serve the whole fan-out, a handshake may wait its turn


def names(n: int) -> list[str]:
    return [f"gpu-{i:04d}" for i in range(1, n + 1)]


def config(farm: SshdFarm, hosts: list[str], db: Path | None = None) -> Any:
    # installs get 120 s, not the tests' 3 s: on 2 cores, a stand-in install waits its turn behind 1,023 others
    data = ssh_config(farm.ssh_hosts_config(), domains=1, hosts_per_domain=len(hosts), parallelism=PARALLELISM,
                      state_db=str(db) if db else None, install_timeout_s=120)
    data["domains"] = [{"name": "pod-a", "hosts": hosts, "sku": "h100"}]
    data["fleet"]["ssh"].update(connect_timeout_s=CONNECT_TIMEOUT, command_timeout_s=120, reboot_timeout_s=1800)
    data["timeouts"].update(upgrade_s=3600, check_s=3600, drain_s=600, return_s=600, poll_s=0.5)
    return parse_config(data)


def children_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


# ---- (a) fan-out ------------------------------------------------------------------------------------------------
def railyard_once(farm: SshdFarm, cfg: Any, command: str) -> dict[str, float]:
    creds = Credentials(farm.user, str(farm.client_key), str(farm.known_hosts))
    runner = SshRunner.from_config(cfg, paramiko_connector(creds, connect_timeout=CONNECT_TIMEOUT))
    s0, c0 = sshd_cpu_s(farm), client_cpu_s()
    t0 = time.perf_counter()
    res = runner.fan_out(list(farm.hosts), lambda h: runner.run(h, command, timeout=120))
    dt = time.perf_counter() - t0
    c1 = client_cpu_s()
    runner.close()
    time.sleep(0.5)  # the connection processes exit and are reaped by the listener
    ok = sum(1 for r in res.values() if isinstance(r, tuple) and r[0] == 0)
    if ok != len(farm.hosts):
        bad = next(r for r in res.values() if not (isinstance(r, tuple) and r[0] == 0))
        sys.stderr.write(f"railyard: {ok}/{len(farm.hosts)} ok; one: {bad!r}\n")
    return {"s": dt, "ok": ok, "client_cpu_s": c1 - c0, "sshd_cpu_s": sshd_cpu_s(farm) - s0,
            "peak_open": runner.peak_open}


def ansible_run(farm: SshdFarm, inv: Path, command: str, module: str) -> dict[str, float]:
    s0, c0 = sshd_cpu_s(farm), children_cpu_s()
    env = {"ANSIBLE_SSH_ARGS": f"-C -o ControlMaster=auto -o ControlPersist=no {KEX}",
           "ANSIBLE_TIMEOUT": str(CONNECT_TIMEOUT)}
    dt, ok = ansible_once(farm, inv, command, PARALLELISM, None, module=module, env_extra=env)
    c1 = children_cpu_s()
    time.sleep(0.5)
    return {"s": dt, "ok": ok, "client_cpu_s": c1 - c0, "sshd_cpu_s": sshd_cpu_s(farm) - s0}


def clush_run(farm: SshdFarm, command: str, cfgdir: Path, kex: str = KEX) -> dict[str, float]:
    """clush over the farm's addresses (node names are the addresses: the farm's hosts are told apart by them)."""
    port = next(iter(farm.hosts.values())).port
    nodes = ",".join(h.address for h in farm.hosts.values())
    ssh_opts = (f"-p {port} -i {farm.client_key} -oUserKnownHostsFile={farm.known_hosts} "
                f"-oStrictHostKeyChecking=yes -oIdentitiesOnly=yes {kex}")
    cmd = [str(CLUSH), "--nostdin", "-w", nodes, "-f", str(PARALLELISM), "-l", farm.user, "-o", ssh_opts,
           "-t", str(CONNECT_TIMEOUT), "-u", "120", command]
    s0, c0 = sshd_cpu_s(farm), children_cpu_s()
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "CLUSTERSHELL_CFGDIR": str(cfgdir)})
    dt = time.perf_counter() - t0
    c1 = children_cpu_s()
    time.sleep(0.5)
    # each host prints "<address>: Setting up gpu-driver (...) ... done"; a failing one is named on stderr
    done = {ln.split(":", 1)[0] for ln in r.stdout.splitlines() if ln.endswith("... done")}
    ok = len(done & {h.address for h in farm.hosts.values()}) if r.returncode == 0 else 0
    if ok != len(farm.hosts):
        sys.stderr.write(f"clush: {ok}/{len(farm.hosts)} ok (exit {r.returncode})\n{r.stderr[-1500:]}\n")
    return {"s": dt, "ok": ok, "client_cpu_s": c1 - c0, "sshd_cpu_s": sshd_cpu_s(farm) - s0}


def fan_out(farm: SshdFarm, root: Path) -> dict[str, Any]:
    cfg = config(farm, list(farm.hosts))
    command = render(cfg.component("gpu-driver").install or "", component="gpu-driver", version="570.86.15")
    inv = root / "inventory.ini"
    inventory(farm, inv)
    cfgdir = root / "clustershell"
    cfgdir.mkdir()
    tools: dict[str, Any] = {"railyard": lambda: railyard_once(farm, cfg, command)}
    if ANSIBLE.exists():
        for m in ANSIBLE_MODULES:
            tools[f"ansible -m {m}"] = lambda m=m: ansible_run(farm, inv, command, m)
    if CLUSH.exists():
        tools["clush"] = lambda: clush_run(farm, command, cfgdir)
        if CLUSH_DEFAULT_KEX:
            tools["clush, default kex"] = lambda: clush_run(farm, command, cfgdir, kex="")
    runs: dict[str, list[dict[str, float]]] = {k: [] for k in tools}
    order = list(tools)
    for rep in range(REPS):
        for k in order[rep % len(order):] + order[:rep % len(order)]:
            runs[k].append(tools[k]())
            print(f"  rep {rep + 1} {k:<20} {runs[k][-1]['s']:7.2f} s  ok {runs[k][-1]['ok']}", flush=True)
    n = len(farm.hosts)
    out: dict[str, Any] = {"command": command, "tools": {}}
    for k, rs in runs.items():
        def per_host_ms(key: str, rs: list[dict[str, float]] = rs) -> float:
            return round(1000 * statistics.median(r[key] for r in rs) / n, 2)

        out["tools"][k] = {"median_s": round(statistics.median(r["s"] for r in rs), 3),
                           "runs_s": [round(r["s"], 2) for r in rs], "all_ok": all(r["ok"] == n for r in rs),
                           "client_cpu_ms_per_host": per_host_ms("client_cpu_s"),
                           "sshd_cpu_ms_per_host": per_host_ms("sshd_cpu_s")}
    out["railyard_peak_open"] = max(r["peak_open"] for r in runs["railyard"])
    return out


# ---- (b) a full stop ------------------------------------------------------------------------------------------
class Sampler:
    """Peaks of this process's threads, RSS and established connections to `port`, every `every` seconds; the
    CPU this sampler's own thread took is kept apart, to be taken off the client's."""

    def __init__(self, port: int, every: float = 0.02):
        import psutil

        self.proc = psutil.Process()
        self.port, self.every = port, every
        self.peak = {"threads": 0, "rss_mib": 0.0, "connections": 0}
        self.cpu_s = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def connections(self) -> int:
        import psutil

        return sum(1 for c in self.proc.net_connections(kind="tcp4")
                   if c.raddr and c.raddr.port == self.port and c.status == psutil.CONN_ESTABLISHED)

    def _run(self) -> None:
        t0 = time.thread_time()
        while not self._stop.is_set():
            self.peak["threads"] = max(self.peak["threads"], self.proc.num_threads())
            self.peak["rss_mib"] = max(self.peak["rss_mib"], self.proc.memory_info().rss / 2**20)
            self.peak["connections"] = max(self.peak["connections"], self.connections())
            self.cpu_s = time.thread_time() - t0
            time.sleep(self.every)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def stop_once(farm: SshdFarm, root: Path) -> dict[str, Any]:
    import psutil

    from railyard.backends.ssh.fleet import SshFleet
    from railyard.domain.models import HostState
    from railyard.ledger import Ledger
    from railyard.operations.stop import Stop

    for n in farm.hosts:
        farm.reset(n)
    # every host's poll during its reboot logs a warning ("poll failed: connection lost"): N lines a poll
    logging.getLogger("railyard.ssh").setLevel(logging.ERROR)
    hosts = list(farm.hosts)
    cfg = config(farm, hosts, root / "fleet.db")
    creds = Credentials(farm.user, str(farm.client_key), str(farm.known_hosts))
    fleet = SshFleet.from_config(cfg, paramiko_connector(creds, connect_timeout=CONNECT_TIMEOUT))
    runner = fleet.runner
    assert runner is not None
    ledger = Ledger(f"sqlite:///{root / 'ledger.db'}")
    stop = Stop(config=cfg, train=cfg.trains[0], domain=cfg.domain("pod-a"), op_id="demo/bench/pod-a", fleet=fleet,
                ledger=ledger, say=lambda _m: None)
    rss0 = psutil.Process().memory_info().rss / 2**20
    threads0 = threading.active_count()
    steps: dict[str, float] = {}
    s0 = sshd_cpu_s(farm)
    with Sampler(farm.port) as sampler:
        cpu0, t0 = time.process_time(), time.perf_counter()
        for name, step in (("take", stop.take), ("drain", stop.drain), ("upgrade", stop.upgrade),
                           ("check", stop.check), ("return", stop.return_hosts)):
            ts = time.perf_counter()
            got = step()
            steps[name] = round(time.perf_counter() - ts, 2)
            print(f"  stop: {name:<8} {steps[name]:7.2f} s  open connections now {runner.open_now}", flush=True)
            if name == "take":
                assert got.granted, got
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    time.sleep(0.5)
    sshd_s = sshd_cpu_s(farm) - s0
    targets = cfg.train_targets(cfg.trains[0])
    final = fleet.hosts()
    fleet.close()
    ledger.dispose()
    back = sum(1 for h in final if h.state == HostState.SERVING and h.versions == targets)
    n = len(hosts)
    client_cpu = cpu - sampler.cpu_s
    commands = [farm[h].commands() for h in hosts]
    out = {"hosts": n, "parallelism": PARALLELISM, "completed": back == n, "hosts_back_at_target": back,
           "wall_s": round(wall, 2), "steps_s": steps,
           "client_cpu_s": round(client_cpu, 2), "client_cpu_ms_per_host": round(1000 * client_cpu / n, 1),
           "sshd_cpu_ms_per_host": round(1000 * sshd_s / n, 1),
           "connections": runner.connects, "connections_per_host": round(runner.connects / n, 2),
           "commands_per_host": round(statistics.mean(commands), 2),
           "peak_open_runner": runner.peak_open, "peak_open_kernel": sampler.peak["connections"],
           "peak_threads": sampler.peak["threads"], "threads_before": threads0,
           "peak_rss_mib": round(sampler.peak["rss_mib"], 1), "rss_before_mib": round(rss0, 1),
           "open_after": runner.open_now}
    return out


def main() -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="railyard-bench-ssh-scale-"))
    farm = SshdFarm(root, names(HOSTS), one_sshd=True).start()
    try:
        print(f"{HOSTS} hosts on one sshd (127.1.x.y, port {farm.port}), parallelism/forks/fanout {PARALLELISM}, "
              f"{os.cpu_count()} cores", flush=True)
        fo = fan_out(farm, root)
        tools = fo["tools"]
        ry = tools["railyard"]["median_s"]
        print(f"fan-out of {fo['command']!r}, median of {REPS}:")
        for k, v in tools.items():
            print(f"  {k:<20} {v['median_s']:7.2f} s  (runs {', '.join(map(str, v['runs_s']))}; every host ok: "
                  f"{v['all_ok']}; CPU per host: client {v['client_cpu_ms_per_host']:.1f} ms, "
                  f"sshd side {v['sshd_cpu_ms_per_host']:.1f} ms)")
        ans = {k: v["median_s"] for k, v in tools.items() if k.startswith("ansible")}
        out: dict[str, Any] = {"bench": "ssh_scale", "hosts": HOSTS, "parallelism": PARALLELISM, "reps": REPS,
                               "cores": os.cpu_count(), "fan_out": fo, "railyard_s": ry,
                               "all_ok": all(v["all_ok"] for v in tools.values())}
        if ans:
            best = min(ans, key=lambda k: ans[k])
            out |= {"ansible_best": best, "ansible_best_s": ans[best],
                    "ansible_best_over_railyard": round(ans[best] / ry, 2)}
            print(f"  fastest Ansible ({best}) / Railyard = {out['ansible_best_over_railyard']}x (goal: >= 1)")
        if "clush" in tools:
            out |= {"clush_s": tools["clush"]["median_s"],
                    "railyard_over_clush": round(ry / tools["clush"]["median_s"], 2)}
            print(f"  Railyard / clush = {out['railyard_over_clush']}x (goal: <= 1.5)")
        if RUN_STOP:
            st = stop_once(farm, root)
            out["stop"] = st
            print(f"a full stop over one {HOSTS}-host domain: completed {st['completed']} "
                  f"({st['hosts_back_at_target']}/{HOSTS} back at target), {st['wall_s']:.1f} s {st['steps_s']}")
            print(f"  client CPU {st['client_cpu_s']:.1f} s = {st['client_cpu_ms_per_host']:.1f} ms a host "
                  f"(sshd side {st['sshd_cpu_ms_per_host']:.1f} ms a host); {st['connections_per_host']} connections "
                  f"and {st['commands_per_host']} commands a host")
            print(f"  peak: {st['peak_open_kernel']} connections open (runner's count {st['peak_open_runner']}; "
                  f"parallelism {PARALLELISM}), {st['peak_threads']} threads (before: {st['threads_before']}), "
                  f"RSS {st['peak_rss_mib']:.0f} MiB (before: {st['rss_before_mib']:.0f} MiB); open after: "
                  f"{st['open_after']}")
        print(json.dumps(out))
        return out
    finally:
        farm.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
