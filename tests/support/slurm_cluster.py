"""A real, private Slurm cluster on this machine for the Slurm tier: munged with its own key and
socket, slurmctld, N slurmd ("multiple slurmd": `slurmd -N nX`, one port each) and slurmrestd (JWT
on loopback), everything under one temp dir. `stop()` ends exactly the processes it started.

Ports: the controller and the node block are searched for in 16000-17999 (bind-checked), so two
test sessions or the sim demo (8765/8080) never collide. SLURM_JWT is never put in the environment
of the daemons or the CLI (slurmctld dies on it); only slurmrestd gets it, as Slurm requires.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from tests.support.waiting import alive

PLUGIN_DIR = Path("/usr/lib/x86_64-linux-gnu/slurm-wlm")
NEEDED = ("munged", "mungekey", "slurmctld", "slurmd", "slurmrestd", "sinfo", "scontrol")


def missing_packages() -> list[str]:
    """What `.ci/run` installs: tests fail (not skip) with this list when something is absent."""
    gone = [c for c in NEEDED if not shutil.which(c) and not Path("/usr/sbin", c).exists()]
    if not (PLUGIN_DIR / "auth_jwt.so").exists():
        gone.append("auth_jwt.so (slurm-wlm-jwt-plugin)")
    return gone


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def find_port_block(count: int, lo: int = 16000, hi: int = 18000, seed: int | None = None) -> int:
    """First port of `count` consecutive free ports in [lo, hi). Under pytest-xdist each worker searches its own
    part of the range: two clusters starting at once in two lanes never pick the same free block."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if worker.startswith("gw") and worker[2:].isdigit() and workers > 1:
        width = (hi - lo) // workers
        lo, hi = lo + int(worker[2:]) * width, lo + (int(worker[2:]) + 1) * width
    start = lo + ((seed if seed is not None else os.getpid()) * 37) % (hi - lo - count)
    for base in list(range(start, hi - count, count + 1)) + list(range(lo, start, count + 1)):
        if all(_port_free(p) for p in range(base, base + count)):
            return base
    raise RuntimeError(f"no block of {count} free ports in {lo}-{hi}")


class SlurmCluster:
    def __init__(self, root: Path, nodes: int = 8, cpus: int = 4):
        self.root = Path(root)
        self.nodes = [f"n{i}" for i in range(1, nodes + 1)]
        self.cpus = cpus
        self.conf = self.root / "etc" / "slurm.conf"
        self.run = self.root / "run"
        self.log = self.root / "log"
        self.munge_socket = self.root / "munge-run" / "munge.socket"
        self.pids: dict[str, int] = {}
        base = find_port_block(nodes + 2)
        self.ctld_port = base
        self.rest_port = base + 1
        self.node_port0 = base + 2
        self.token = ""

    # ---- environment -----------------------------------------------------------------------------
    def env(self) -> dict[str, str]:
        """What the Slurm CLI needs; never SLURM_JWT."""
        env = {k: v for k, v in os.environ.items() if k != "SLURM_JWT"}
        env["SLURM_CONF"] = str(self.conf)
        return env

    def cli(self, *argv: str, check: bool = True, timeout: float = 15) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(argv), env=self.env(), capture_output=True, text=True, check=check,
                              timeout=timeout)

    # ---- start -------------------------------------------------------------------------------------
    def _write_files(self) -> None:
        for d in ("etc", "run", "log", "state/ctld", "munge", "munge-run", "rest", "jobs", "bin"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        for n in self.nodes:
            (self.root / "state" / "spool" / n).mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o755)
        os.chmod(self.root / "munge", 0o700)
        os.chmod(self.root / "munge-run", 0o755)
        os.chmod(self.root / "etc", 0o755)
        shutil.chown(self.root / "rest", "slurm", "slurm")
        key = self.root / "munge" / "munge.key"
        subprocess.run(["mungekey", "--create", f"--keyfile={key}", "--bits=1024", "--force"], check=True,
                       capture_output=True)
        os.chmod(key, 0o600)
        jwt = self.root / "etc" / "jwt_hs256.key"
        jwt.write_bytes(os.urandom(32))
        os.chmod(jwt, 0o600)
        (self.root / "etc" / "plugstack.conf").write_text("")
        n = len(self.nodes)
        host = socket.gethostname()
        node = (f"NodeName=n[1-{n}] NodeHostname={host} NodeAddr=127.0.0.1 "
                f"Port=[{self.node_port0}-{self.node_port0 + n - 1}] CPUs={self.cpus} Sockets=1 "
                f"CoresPerSocket={self.cpus} ThreadsPerCore=1 RealMemory=1000 State=UNKNOWN")
        self.conf.write_text(f"""# written by tests/support/slurm_cluster.py
ClusterName=railyard
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={self.ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={self.munge_socket}
AuthAltTypes=auth/jwt
AuthAltParameters=jwt_key={jwt}
CredType=cred/munge
StateSaveLocation={self.root}/state/ctld
SlurmdSpoolDir={self.root}/state/spool/%n
SlurmctldPidFile={self.run}/slurmctld.pid
SlurmdPidFile={self.run}/slurmd-%n.pid
SlurmctldLogFile={self.log}/slurmctld.log
SlurmdLogFile={self.log}/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1,batch_sched_delay=0,sched_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
JobRequeue=1
SlurmctldTimeout=30
SlurmdTimeout=60
InactiveLimit=0
KillWait=2
MinJobAge=600
Waittime=0
MailProg=/bin/true
{node}
PartitionName=gpu Nodes=ALL Default=YES DefaultTime=30 MaxTime=INFINITE State=UP
""")
        os.chmod(self.conf, 0o644)

    def _wait(self, what: str, probe, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if probe():
                    return
            except (OSError, subprocess.SubprocessError):
                pass
            time.sleep(0.1)
        raise RuntimeError(f"slurm cluster: {what} not ready within {timeout}s; logs in {self.log}")

    def _pidfile(self, name: str) -> int:
        """The daemon's pid once it has written its pid file (daemons write it after forking)."""
        f = self.run / f"{name}.pid"
        self._wait(f"{name} pid file", lambda: f.exists() and f.read_text().strip().isdigit(), timeout=15)
        return int(f.read_text().strip())

    def start(self) -> SlurmCluster:
        gone = missing_packages()
        if gone:
            raise RuntimeError(f"Slurm tier needs: {', '.join(gone)} (installed by .ci/run)")
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        self._write_files()
        subprocess.run(["munged", f"--socket={self.munge_socket}", f"--key-file={self.root}/munge/munge.key",
                        f"--log-file={self.log}/munged.log", f"--pid-file={self.run}/munged.pid",
                        f"--seed-file={self.root}/munge/seed"], check=True, capture_output=True, env=self.env())
        self.pids["munged"] = self._pidfile("munged")
        self.start_ctld(clear=True)
        for n in self.nodes:
            subprocess.run(["slurmd", "-f", str(self.conf), "-N", n], check=True, capture_output=True,
                           env=self.env())
            self.pids[f"slurmd-{n}"] = self._pidfile(f"slurmd-{n}")
        self._wait("all nodes idle", lambda: self.cli("sinfo", "-h", "-o", "%T %D").stdout.strip()
                   == f"idle {len(self.nodes)}", timeout=60)
        self.token = self.cli("scontrol", "token", "username=root", "lifespan=7200").stdout.strip().split("=", 1)[1]
        self._start_rest()

    def start_ctld(self, clear: bool = False) -> None:
        """Start slurmctld; without `clear` it recovers the saved state (as after a crash)."""
        argv = ["slurmctld", "-f", str(self.conf)] + (["-c"] if clear else [])
        subprocess.run(argv, check=True, capture_output=True, env=self.env())
        self._wait("slurmctld pid file", lambda: alive(self._pidfile("slurmctld")))
        self.pids["slurmctld"] = self._pidfile("slurmctld")
        self._wait("slurmctld answering", lambda: "UP" in self.cli("scontrol", "ping", check=False).stdout)

    def kill_ctld(self) -> None:
        """SIGKILL the controller: no chance to save anything on the way out."""
        pid = self.pids.pop("slurmctld")
        os.kill(pid, signal.SIGKILL)
        self._wait("slurmctld gone", lambda: not alive(pid), timeout=10)

    def _start_rest(self) -> None:
        env = self.env() | {"SLURM_JWT": "daemon"}  # slurmrestd only; never the controller or the CLI
        log = open(self.log / "slurmrestd.log", "ab")  # noqa: SIM115 - owned by the process
        proc = subprocess.Popen(
            ["slurmrestd", "-f", str(self.conf), "-u", "slurm", "-g", "slurm",
             "-s", "openapi/v0.0.38,openapi/v0.0.37,openapi/v0.0.36", "-a", "rest_auth/jwt",
             f"127.0.0.1:{self.rest_port}"],
            env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        self.pids["slurmrestd"] = proc.pid
        self._rest_proc = proc
        import requests

        def ok() -> bool:
            r = requests.get(f"{self.rest_url}/slurm/v0.0.38/ping", headers=self.rest_headers, timeout=2)
            return r.ok and json.loads(r.text)["pings"][0]["ping"] == "UP"

        self._wait("slurmrestd", ok)

    @property
    def rest_url(self) -> str:
        return f"http://127.0.0.1:{self.rest_port}"

    @property
    def rest_headers(self) -> dict[str, str]:
        return {"X-SLURM-USER-NAME": "root", "X-SLURM-USER-TOKEN": self.token}

    # ---- stop --------------------------------------------------------------------------------------
    def _descendants(self, pid: int) -> list[int]:
        out = []
        for child in subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split():
            out.append(int(child))
            out.extend(self._descendants(int(child)))
        return out

    def stop(self) -> None:
        """Cancel every job, then end the processes this cluster started (and their job steps)."""
        if "slurmctld" in self.pids and alive(self.pids["slurmctld"]):
            ids = self.cli("squeue", "-h", "-o", "%i", check=False).stdout.split()
            if ids:
                self.cli("scancel", *ids, check=False)
        steps = []
        for p in subprocess.run(["pgrep", "-x", "slurmstepd"], capture_output=True, text=True).stdout.split():
            try:
                if str(self.root) in " ".join(os.readlink(f"/proc/{p}/fd/{fd}") for fd in os.listdir(f"/proc/{p}/fd")):
                    steps.append(int(p))
            except OSError:
                continue
        victims = [p for s in steps for p in self._descendants(s)] + steps
        order = ["slurmrestd"] + [k for k in self.pids if k.startswith("slurmd-")] + ["slurmctld"]
        victims += [self.pids[k] for k in order if k in self.pids]
        for pid in victims:
            if alive(pid):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(alive(p) for p in victims):
            time.sleep(0.1)
        for pid in victims:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        if "munged" in self.pids and alive(self.pids["munged"]):
            os.kill(self.pids["munged"], signal.SIGTERM)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and alive(self.pids["munged"]):
                time.sleep(0.1)
            if alive(self.pids["munged"]):
                os.kill(self.pids["munged"], signal.SIGKILL)
        if getattr(self, "_rest_proc", None) is not None:
            self._rest_proc.wait(timeout=5)
        self.pids.clear()


# ---- what the Slurm tests share: the job script, a config, a train driver, a state sampler -----------

JOB_SCRIPT = r"""#!/bin/bash
# A training job that follows Railyard's checkpoint convention: on SIGUSR1 it saves its progress and
# sets its own comment to railyard_ckpt=<epoch>; on requeue it starts again from that checkpoint.
LOG="$JOBS_DIR/$SLURM_JOB_ID.log"; CKPT="$JOBS_DIR/$SLURM_JOB_ID.ckpt"
step=0; [ -f "$CKPT" ] && step=$(cat "$CKPT")
echo "start $(date +%s.%N) $SLURM_JOB_NODELIST restart=${SLURM_RESTART_COUNT:-0} step=$step" >> "$LOG"
checkpoint() {
  echo "$step" > "$CKPT"
  now=$(date +%s.%N)
  scontrol update jobid="$SLURM_JOB_ID" comment="railyard_ckpt=$now"
  echo "ckpt $now step=$step" >> "$LOG"
}
trap checkpoint USR1
trap 'echo "term $(date +%s.%N) step=$step" >> "$LOG"; exit 143' TERM
while [ "$step" -lt "$STEPS" ]; do sleep 0.2 & wait $!; step=$((step + 1)); done
echo "end $(date +%s.%N) step=$step" >> "$LOG"
"""


def running_cluster(nodes: int = 8) -> Iterator[SlurmCluster]:
    """A cluster of `nodes` in a fresh dir of its own (munge and slurmrestd need every parent dir traversable:
    pytest's tmp dirs are 0700), stopped and removed afterwards."""
    root = Path(tempfile.mkdtemp(prefix="railyard-slurm-"))
    os.chmod(root, 0o755)
    c = SlurmCluster(root, nodes=nodes)
    c.start()
    try:
        yield c
    finally:
        c.stop()
        shutil.rmtree(root, ignore_errors=True)


def write_job_script(cluster: SlurmCluster) -> Path:
    p = cluster.root / "jobs" / "train.sh"
    p.write_text(JOB_SCRIPT)
    p.chmod(0o755)
    return p


def submit(cluster: SlurmCluster, *, nodes: int = 2, steps: int = 150, minutes: int = 20,
           extra: tuple[str, ...] = ()) -> str:
    script = write_job_script(cluster)
    env = cluster.env() | {"JOBS_DIR": str(cluster.root / "jobs"), "STEPS": str(steps)}
    p = subprocess.run(["sbatch", "--parsable", "--requeue", f"--nodes={nodes}", f"--time={minutes}",
                        "--output=/dev/null", *extra, str(script)], env=env, capture_output=True, text=True,
                       check=True)
    return p.stdout.strip().split(";")[0]


def job_log(cluster: SlurmCluster, job_id: str) -> list[list[str]]:
    p = cluster.root / "jobs" / f"{job_id}.log"
    return [line.split() for line in p.read_text().splitlines()] if p.exists() else []


def slurm_config(cluster: SlurmCluster, state_dir: Path, *, trains: list[dict] | None = None,
                 **slurm: object) -> dict:
    """8 nodes in 4 racks of 2; two components; the stand-in runner takes a few real seconds."""
    state_dir.mkdir(parents=True, exist_ok=True)
    return {
        "ledger": {"url": f"sqlite:///{state_dir}/ledger.db"},  # the ledger, and the fleet's state with it
        "components": [
            {"name": "gpu-driver", "reboot": True, "duration_s": 2},
            {"name": "kernel", "reboot": True, "duration_s": 1},
        ],
        "releases": [
            {"id": "driver-570", "component": "gpu-driver", "version": "570.86.15"},
            {"id": "kernel-28", "component": "kernel", "version": "6.1.0-28"},
        ],
        "domains": [{"name": f"rack-{x}", "hosts": f"n[{2 * i + 1}-{2 * i + 2}]"} for i, x in enumerate("abcd")],
        "trains": trains or [{"id": "slurm", "releases": ["driver-570", "kernel-28"]}],
        "buffers": {"maintenance": {"hosts": 2}, "failure": {"hosts": 2}},
        "timeouts": {"poll_s": 0.3, "capacity_wait_s": 120, "checkpoint_wait_s": 60, "drain_s": 30,
                     "upgrade_s": 120, "check_s": 60, "return_s": 60},
        "fleet": {
            "backend": "slurm",
            "slurm": {
                "slurm_conf": str(cluster.conf),
                "stop_window_s": 60,
                "runner": "standin",
                "standin": {"check_s": 1.0,
                            "initial_versions": {"gpu-driver": "550.127.08", "kernel": "6.1.0-25"}},
                **slurm,
            },
        },
    }


def reset(cluster: SlurmCluster) -> None:
    """Between tests on one cluster: no jobs, no reservations, every node idle without features."""
    ids = cluster.cli("squeue", "-h", "-o", "%i").stdout.split()
    if ids:
        cluster.cli("scancel", *ids)
    for line in cluster.cli("scontrol", "show", "reservation", "-o").stdout.splitlines():
        if line.startswith("ReservationName="):
            cluster.cli("scontrol", "delete", f"reservationname={line.split()[0].split('=', 1)[1]}")
    nodes = ",".join(cluster.nodes)
    cluster.cli("scontrol", "update", f"nodename={nodes}", "availablefeatures=", "activefeatures=", check=False)
    cluster.cli("scontrol", "update", f"nodename={nodes}", "state=resume", check=False)

    def idle() -> bool:
        data = json.loads(cluster.cli("sinfo", "--json").stdout)["nodes"]
        return all(n["state"] == "idle" and not n["state_flags"] for n in data) and not \
            cluster.cli("squeue", "-h", "-o", "%i").stdout.strip()

    cluster._wait("cluster idle after reset", idle, timeout=30)
