"""The distributed tier: Railyard on PostgreSQL + Redis + the CeleryExecutor with two workers, each
Airflow component a process of its own (`tests.support.distributed.DistributedStack`, the stack of
docker-compose.yaml), over the simulator and over real sshd hosts; a worker is SIGKILLed mid-install.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from datetime import datetime

import pytest

from railyard.domain.models import HostState
from railyard.fleet.http import HttpFleet
from railyard.fleet.port import FleetError
from railyard.ledger import Ledger
from railyard.operations.stop import op_id_for
from tests.support.configs import small_config, ssh_config, write_config
from tests.support.distributed import DistributedStack
from tests.support.sshd import SshdFarm

pytestmark = [pytest.mark.distributed, pytest.mark.e2e]

DAG = "railyard_train_demo"


@pytest.fixture
def start_stack(tmp_path):
    """Starts a DistributedStack; afterwards stops it and proves that nothing it started still runs."""
    stacks: list[DistributedStack] = []

    def start(config_file, **kw) -> DistributedStack:
        s = DistributedStack(home=tmp_path / "stack", config_file=config_file, **kw)
        stacks.append(s)
        s.start()
        print(f"\nstack up: {', '.join(f'{k} {v:.1f}s' for k, v in s.timings.items())}")
        s.ensure_pool()
        return s

    yield start
    for s in stacks:
        t = time.monotonic()
        s.stop()
        print(f"stack stopped in {time.monotonic() - t:.1f}s; killed at the end: {s.leftovers or 'nothing'}")
        assert s.survivors() == [], f"processes the stack started outlived stop(): {s.survivors()}"


def _ts(value: str | None) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() if value else 0.0


def _who_ran(stack: DistributedStack, run_id: str) -> dict[str, str]:
    return {ti["task_id"]: ti["hostname"] for ti in stack.task_instances(DAG, run_id) if ti["hostname"]}


# ---- (a) the simulator ----------------------------------------------------------------------------------
def test_train_over_the_simulator_runs_on_both_workers(start_stack, tmp_path):
    data = small_config(domains=3, hosts_per_domain=4, upgrade_fail_rate=0.0, check_fail_rate=0.0)
    stack = start_stack(write_config(tmp_path / "railyard.yaml", data))
    ledger = Ledger(stack.ledger_url)
    assert ledger.url.startswith("postgresql+psycopg2://")
    stack.wait_dag(DAG)

    out: list[int] = []
    t0 = time.monotonic()
    run = stack.trigger(DAG)
    state = stack.wait_run(DAG, run, timeout=600, on_poll=lambda: out.append(len(ledger.domains_out())))
    took = time.monotonic() - t0
    ran = _who_ran(stack, run)
    assert state == "success", stack.failure_report(DAG, run)
    print(f"run took {took:.1f}s; tasks per worker: {dict(Counter(ran.values()))}")
    for task, host in sorted(ran.items()):
        print(f"  {task:32} {host}")

    # the work was spread over both workers (each names itself in the task instances)
    assert set(ran.values()) == set(stack.workers), ran
    fleet = stack.fleet()
    audit = fleet.audit()
    with pytest.raises(FleetError, match="401"):  # the fleet API, audit included, only with the token
        HttpFleet(stack.fleet_url, retries=0).audit()
    assert audit["max_domains_out"] == 1, audit["max_domains_out"]
    assert audit["unverified_returns"] == []
    assert max(out) <= 1
    cfg = stack.config
    want = cfg.train_targets(cfg.train("demo"))
    for h in fleet.hosts():
        assert h.state == HostState.SERVING and h.versions == want, h
    # the ledger is PostgreSQL's, shared by every worker: every stop is recorded there, nothing held
    for d in ("pod-a", "pod-b", "pod-c"):
        assert ledger.operation(op_id_for("demo", run, d))["state"] == "done", d
    assert ledger.holdings() == {}
    for w in stack.workers:  # and no worker kept a ledger of its own
        assert not (stack.railyard_home(w) / "ledger.db").exists(), w


# ---- (b) SSH hosts, a worker SIGKILLed in the middle of an install --------------------------------------
SSH_NAMES = [f"gpu-{d}{i:02d}" for d in "abc" for i in (1, 2)]
SLOW = {"gpu-a01": 45, "gpu-a02": 45}  # pod-a's install lasts long enough to outlive the failover


def test_worker_killed_mid_install_the_retry_reattaches_on_the_other_worker(start_stack, tmp_path, monkeypatch):
    farm = SshdFarm(tmp_path / "sshd", SSH_NAMES).start()
    try:
        for n in SSH_NAMES:
            (farm[n].state / "install_seconds").write_text(f"{SLOW.get(n, 3)}\n")
        data = ssh_config(farm.ssh_hosts_config(), domains=3, hosts_per_domain=2, failure_hosts=2,
                          install_timeout_s=180, known_hosts=str(farm.known_hosts), key_file=str(farm.client_key),
                          user=farm.user)
        data["trains"] = [{"id": "demo", "releases": ["driver-570"]}]
        # retries every 5 s (the factory derives the delay from fleet_outage_s); installs may take minutes
        data["timeouts"].update({"fleet_outage_s": 50, "upgrade_s": 300})
        stack = start_stack(write_config(tmp_path / "railyard.yaml", data), with_sim=False)
        _kill_mid_install_and_check(stack, farm, monkeypatch)
    finally:
        farm.stop()


def _kill_mid_install_and_check(stack: DistributedStack, farm: SshdFarm, monkeypatch) -> None:
    from railyard.backends.ssh.fleet import SshFleet
    from railyard.backends.ssh.runner import Credentials, paramiko_connector

    ledger = Ledger(stack.ledger_url)
    stack.wait_dag(DAG)
    run = stack.trigger(DAG)
    t0 = time.monotonic()
    task = "pod-a.upgrade"

    # wait for pod-a's upgrade to be running with both installs started on the hosts, then SIGKILL its worker
    victim = None
    deadline = time.monotonic() + 300
    while victim is None:
        assert time.monotonic() < deadline, f"pod-a's install never started: {stack.task_states(DAG, run)}"
        ti = stack.rest("GET", f"/dags/{DAG}/dagRuns/{run}/taskInstances/{task}")
        if ti["state"] == "running" and ti["hostname"] and all(farm[h].installs() for h in SLOW):
            victim = ti["hostname"]
        else:
            assert ti["state"] in (None, "scheduled", "queued", "running"), (
                f"{task} ended {ti['state']} on {ti['hostname']} before any kill, with installs started on "
                f"{[h for h in SLOW if farm[h].installs()]} of {list(SLOW)} (did the worker that ran it see "
                f"the hosts that another worker drained?)\n{stack.failure_report(DAG, run)}")
            time.sleep(0.2)
    assert all(farm[h].version("gpu-driver") == "550.127.08" for h in SLOW)  # not installed yet
    killed = stack.kill_worker(victim)
    t_kill = time.monotonic()
    kill_wall = time.time()
    survivor = next(w for w in stack.workers if w != victim)
    worker_pgid = stack.components[victim].proc.pid
    print(f"\nkilled {victim} {t_kill - t0:.1f}s after the trigger, mid-install: {len(killed)} processes")
    for k in killed:
        print(f"  {k['pid']} group {k['pgid']}: {k['cmd']}")
    # the task process leads a process group of its own: killing the worker's group alone would orphan it
    assert any(k["pgid"] != worker_pgid for k in killed), killed
    assert stack.registered_workers() <= {survivor}

    out: list[int] = []
    seen: list[tuple[float, str | None]] = []
    stop_sampling = threading.Event()

    def sample() -> None:  # the ledger's domains out, every 0.2 s, for the whole run
        while not stop_sampling.wait(0.2):
            try:
                out.append(len(ledger.domains_out()))
            except Exception:  # noqa: BLE001 - a sample lost is not a failure
                pass

    def watch() -> None:
        st = stack.task_states(DAG, run).get(task)
        if not seen or seen[-1][1] != st:
            seen.append((time.monotonic() - t_kill, st))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        state = stack.wait_run(DAG, run, timeout=600, on_poll=watch)
    finally:
        stop_sampling.set()
        sampler.join()
    print(f"run ended {state} {time.monotonic() - t0:.1f}s after the trigger; {task} after the kill: "
          + ", ".join(f"{s} at +{t:.0f}s" for t, s in seen))
    tries = stack.tries(DAG, run, task)
    for t in tries:
        print(f"  try {t['try_number']}: {t['state']} on {t['hostname']} {t['start_date']} .. {t['end_date']}")
    ran = _who_ran(stack, run)
    print(f"tasks per worker: {dict(Counter(ran.values()))}")
    for name, host in sorted(ran.items()):
        print(f"  {name:32} {host}")
    assert state == "success", stack.failure_report(DAG, run)

    # the killed try was failed by the scheduler (no heartbeat) and retried on the surviving worker
    assert tries[0]["hostname"] == victim and tries[0]["state"] in ("failed", "up_for_retry"), tries
    assert tries[-1]["hostname"] == survivor and tries[-1]["state"] == "success", tries
    # ... while the install was still in flight: it finished after the retry had started
    retry_start = _ts(tries[-1]["start_date"])
    install_end = max((farm[h].state / "versions" / "gpu-driver").stat().st_mtime for h in SLOW)
    print(f"retry started {retry_start - kill_wall:.1f}s after the kill; installs ended "
          f"{install_end - kill_wall:.1f}s after it")
    assert retry_start < install_end, "the install ended before the retry began: nothing to re-attach to"

    # every host: the install ran once, and the host serves at the target (or is in repair)
    config = stack.config
    want = config.train_targets(config.train("demo"))
    for n in SSH_NAMES:
        components = [ln.split()[0] for ln in farm[n].installs()]
        assert components == ["gpu-driver"], (n, farm[n].installs())
    monkeypatch.setenv("RAILYARD_LEDGER_URL", stack.ledger_url)
    monkeypatch.setenv("RAILYARD_HOME", str(stack.home / "checker"))
    fleet = SshFleet.from_config(config, paramiko_connector(Credentials(farm.user, str(farm.client_key),
                                                                        str(farm.known_hosts))))
    try:
        hosts = {h.name: h for h in fleet.hosts()}
        for n in SSH_NAMES:
            h = hosts[n]
            at_target = all(h.versions.get(c) == v for c, v in want.items())
            assert h.state == HostState.SERVING and at_target or h.state == HostState.REPAIR, (n, h)
            assert farm[n].version("gpu-driver") == want["gpu-driver"], n
            if h.state == HostState.SERVING:  # returned only after a passing check at the target
                op = op_id_for("demo", run, config.host_domain()[n])
                v = ledger.verification(op, n)
                assert v is not None and v[0] is True and v[1] == {**v[1], **want}, (n, v)
        assert fleet.max_domains_out() == 1, fleet.events()
    finally:
        fleet.close()
    assert out and max(out) <= 1
    assert ledger.holdings() == {}
    for d in ("pod-a", "pod-b", "pod-c"):
        assert ledger.operation(op_id_for("demo", run, d))["state"] == "done", d
