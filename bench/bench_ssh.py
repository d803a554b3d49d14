"""SSH fan-out: one upgrade command on 64 real sshd hosts, Railyard's SshRunner vs Ansible, same run.

Same hosts, ports, key, pinned known_hosts and command; parallelism = forks = 64. Each tool opens
fresh connections for every repetition (Ansible gets a fresh ControlPath dir per run, and
pipelining on, its fastest documented setting). Reports the median of REPS runs of each,
interleaved, and checks that every host answered with exit 0 in every run.

All 64 hosts share this machine's cores, so Railyard's run also reports the CPU it took: the sshd
side (every listener with its reaped connection processes and the commands they ran) and the client's
own. Their sum over the cores is the least wall time any client could take here for the same work.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "include")]

from railyard.backends.ssh.runner import Credentials, SshRunner, paramiko_connector  # noqa: E402
from railyard.domain.config import parse_config  # noqa: E402
from railyard.domain.recipes import render  # noqa: E402
from tests.support.configs import ssh_config  # noqa: E402
from tests.support.sshd import SshdFarm  # noqa: E402

HOSTS = int(os.environ.get("RAILYARD_BENCH_SSH_HOSTS", "64"))
REPS = int(os.environ.get("RAILYARD_BENCH_SSH_REPS", "3"))
ANSIBLE = Path(sys.executable).parent / "ansible"
ANSIBLE_PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"


def names(n: int) -> list[str]:
    return [f"gpu-{chr(ord('a') + i // 8)}{i % 8 + 1:02d}" for i in range(n)]


def sshd_cpu_s(farm: SshdFarm) -> float:
    """CPU seconds of every sshd listener and of the connection processes (and commands) it has reaped."""
    import psutil

    total = 0.0
    for proc in farm.listeners():
        t = psutil.Process(proc.pid).cpu_times()
        total += t.user + t.system + t.children_user + t.children_system
    return total


def client_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def railyard_once(farm: SshdFarm, cfg, command: str) -> tuple[float, int, float, float]:
    """Wall time, hosts ok, and the CPU seconds of the sshd side and of this client for the run."""
    creds = Credentials(farm.user, str(farm.client_key), str(farm.known_hosts))
    runner = SshRunner.from_config(cfg, paramiko_connector(creds, connect_timeout=30))
    s0, c0 = sshd_cpu_s(farm), client_cpu_s()
    t0 = time.perf_counter()
    res = runner.fan_out(list(farm.hosts), lambda h: runner.run(h, command, timeout=60))
    dt = time.perf_counter() - t0
    c1 = client_cpu_s()
    runner.close()
    time.sleep(0.5)  # the connection processes exit and are reaped by their listener
    ok = sum(1 for r in res.values() if isinstance(r, tuple) and r[0] == 0)
    return dt, ok, sshd_cpu_s(farm) - s0, c1 - c0


def floor_once(farm: SshdFarm, cfg, command: str) -> tuple[float, int]:  # noqa: ANN001
    """The floor: the same command on one host over one fresh connection (what the fan-out's
    slowest host would cost if the hosts did not share the machine)."""
    creds = Credentials(farm.user, str(farm.client_key), str(farm.known_hosts))
    runner = SshRunner.from_config(cfg, paramiko_connector(creds, connect_timeout=30))
    host = next(iter(farm.hosts))
    t0 = time.perf_counter()
    rc, _out = runner.run(host, command, timeout=60)
    dt = time.perf_counter() - t0
    runner.close()
    return dt, int(rc == 0)


def inventory(farm: SshdFarm, path: Path) -> None:
    lines = ["[gpu]"]
    for n, h in farm.hosts.items():
        lines.append(f"{n} ansible_host={h.address} ansible_port={h.port}")
    lines += ["", "[gpu:vars]", f"ansible_user={farm.user}", f"ansible_ssh_private_key_file={farm.client_key}",
              "ansible_python_interpreter=/usr/bin/python3",
              f"ansible_ssh_common_args='-o UserKnownHostsFile={farm.known_hosts} -o StrictHostKeyChecking=yes'"]
    path.write_text("\n".join(lines) + "\n")


def ansible_once(farm: SshdFarm, inv: Path, command: str, forks: int, playbook: Path | None, *,
                 module: str = "command", env_extra: dict[str, str] | None = None) -> tuple[float, int]:
    cp = Path(tempfile.mkdtemp(prefix="ry-ansible-cp-"))
    env = {**os.environ, "ANSIBLE_HOST_KEY_CHECKING": "True", "ANSIBLE_PIPELINING": "True",
           "ANSIBLE_SSH_CONTROL_PATH_DIR": str(cp), "ANSIBLE_LOCAL_TEMP": str(cp / "tmp"),
           "ANSIBLE_STDOUT_CALLBACK": "default" if playbook else "minimal",
           "ANSIBLE_DEPRECATION_WARNINGS": "False", "ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORKS": str(forks),
           **(env_extra or {})}
    if playbook:
        cmd = [str(ANSIBLE_PLAYBOOK), "-i", str(inv), "-f", str(forks), str(playbook)]
    else:
        cmd = [str(ANSIBLE), "all", "-i", str(inv), "-f", str(forks), "-m", module, "-a", command]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    dt = time.perf_counter() - t0
    shutil.rmtree(cp, ignore_errors=True)
    if playbook:  # PLAY RECAP: "gpu-a01 : ok=1 changed=1 unreachable=0 failed=0 ..."
        ok = sum(1 for ln in r.stdout.splitlines()
                 if " : ok=1 " in ln and "changed=1 " in ln and "unreachable=0 " in ln and "failed=0 " in ln)
    else:
        ok = sum(1 for ln in r.stdout.splitlines() if " | CHANGED | rc=0" in ln)
    if ok != len(farm.hosts):
        sys.stderr.write(f"ansible: {ok}/{len(farm.hosts)} ok (exit {r.returncode})\n"
                         f"{r.stdout[-1500:]}\n{r.stderr[-1500:]}\n")
    return dt, ok


def main() -> dict:
    root = Path(tempfile.mkdtemp(prefix="railyard-bench-ssh-"))
    farm = SshdFarm(root, names(HOSTS)).start()
    try:
        data = ssh_config(farm.ssh_hosts_config(), domains=HOSTS // 8, hosts_per_domain=8, parallelism=HOSTS)
        data["domains"] = [{"name": f"pod-{chr(ord('a') + i)}", "hosts": names(HOSTS)[i * 8:(i + 1) * 8], "sku": "h100"}
                           for i in range(HOSTS // 8)]
        cfg = parse_config(data)
        command = render(cfg.component("gpu-driver").install or "", component="gpu-driver", version="570.86.15")
        inv = root / "inventory.ini"
        inventory(farm, inv)
        play = root / "upgrade.yml"
        play.write_text(f"- hosts: all\n  gather_facts: false\n  tasks:\n    - command: {command}\n")
        have_ansible = ANSIBLE.exists()
        rows: dict[str, list[float]] = {"floor (1 host)": [], "railyard": [], "ansible": [], "ansible-playbook": []}
        oks: dict[str, list[int]] = {k: [] for k in rows}
        cpu: dict[str, list[float]] = {"sshd": [], "client": []}
        for _ in range(REPS):
            dt, ok = floor_once(farm, cfg, command)
            rows["floor (1 host)"].append(dt)
            oks["floor (1 host)"].append(ok * HOSTS)
            dt, ok, sshd_s, client_s = railyard_once(farm, cfg, command)
            rows["railyard"].append(dt)
            oks["railyard"].append(ok)
            cpu["sshd"].append(sshd_s)
            cpu["client"].append(client_s)
            if have_ansible:
                for key, pb in (("ansible", None), ("ansible-playbook", play)):
                    dt, ok = ansible_once(farm, inv, command, HOSTS, pb)
                    rows[key].append(dt)
                    oks[key].append(ok)
        med = {k: statistics.median(v) for k, v in rows.items() if v}
        print(f"command: {command!r} on {HOSTS} sshd hosts, parallelism/forks {HOSTS}, median of {REPS}")
        for k, v in rows.items():
            if v:
                print(f"  {k:<17} {med[k]:6.2f} s  (runs: {', '.join(f'{x:.2f}' for x in v)}; "
                      f"hosts ok per run: {', '.join(map(str, oks[k]))})")
        if not have_ansible:
            print("  ansible: not installed (requirements.txt has ansible-core); no baseline measured")
        out = {"bench": "ssh_fanout", "hosts": HOSTS, "parallelism": HOSTS, "reps": REPS,
               "railyard_s": round(med["railyard"], 3),
               "ansible_adhoc_s": round(med["ansible"], 3) if "ansible" in med else None,
               "ansible_playbook_s": round(med["ansible-playbook"], 3) if "ansible-playbook" in med else None,
               "floor_one_host_s": round(med["floor (1 host)"], 3),
               "railyard_over_floor": round(med["railyard"] / med["floor (1 host)"], 2),
               "all_hosts_ok": all(o == HOSTS for v in oks.values() for o in v)}
        cores = os.cpu_count() or 1
        out |= {"sshd_cpu_s": round(statistics.median(cpu["sshd"]), 3),
                "client_cpu_s": round(statistics.median(cpu["client"]), 3), "cores": cores}
        out["cpu_bound_s"] = round((out["sshd_cpu_s"] + out["client_cpu_s"]) / cores, 3)
        out["railyard_over_cpu_bound"] = round(med["railyard"] / out["cpu_bound_s"], 2)
        print(f"  Railyard's {HOSTS}-host fan-out / one host over one fresh connection = "
              f"{out['railyard_over_floor']}x (goal: <= 1.5x)")
        print(f"  CPU of Railyard's run: sshd side {out['sshd_cpu_s']:.2f} s + client {out['client_cpu_s']:.2f} s "
              f"over {cores} cores = {out['cpu_bound_s']:.2f} s, the least wall time for this work on this machine; "
              f"Railyard's run / that bound = {out['railyard_over_cpu_bound']}x")
        if "ansible" in med:
            out["ansible_adhoc_over_railyard"] = round(med["ansible"] / med["railyard"], 2)
            out["ansible_playbook_over_railyard"] = round(med["ansible-playbook"] / med["railyard"], 2)
            print(f"  Ansible ad-hoc / Railyard = {out['ansible_adhoc_over_railyard']}x, "
                  f"ansible-playbook / Railyard = {out['ansible_playbook_over_railyard']}x (goal: >= 1)")
        print(json.dumps(out))
        return out
    finally:
        farm.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
