"""The Slurm backend's production path: a real 8-node Slurm cluster whose nodes are also real sshd
hosts. The train DAG under `dag.test()` drains with Slurm, installs over SSH, reboots (the host drops
its connections and comes back with a new boot id), checks with the real tools' output formats,
publishes node features read back from the hosts, and resumes — one domain at a time, with jobs
checkpointed before their nodes are taken. Failing hosts stay drained in repair with the tool's
reason and get no new features; a reboot that never happens ends in repair; reads never write."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from railyard.backends.slurm.fleet import fleet_from_config
from railyard.domain.config import load_config, parse_config
from railyard.domain.models import HostState
from railyard.ledger import Ledger
from railyard.operations.emergency import EmergencyRequest, plan
from railyard.operations.releases import drift, plan_train
from railyard.operations.stop import Stop, op_id_for
from tests.dags.conftest import load_dag, states
from tests.support.configs import write_config
from tests.support.slurm_cluster import SlurmCluster, job_log, reset, running_cluster, submit
from tests.support.slurm_ssh import node_farm, slurm_ssh_config
from tests.support.slurm_train import Sampler, run_stop
from tests.support.sshd import SshdFarm

TARGETS = {"gpu-driver": "570.86.15", "kernel": "6.1.0-28"}
BEFORE = {"gpu-driver": "550.127.08", "kernel": "6.1.0-25"}
PROFILES = {"n1": "install_fail", "n3": "dcgm_fail", "n5": "no_reboot"}


@pytest.fixture(scope="module")
def cluster() -> Iterator[SlurmCluster]:
    yield from running_cluster()


@pytest.fixture(scope="module")
def farm(cluster: SlurmCluster, tmp_path_factory) -> Iterator[SshdFarm]:
    f = node_farm(tmp_path_factory.mktemp("nodes"), cluster)
    try:
        yield f
    finally:
        f.stop()


@pytest.fixture
def fresh(cluster: SlurmCluster, farm: SshdFarm):
    def make(profiles: dict[str, str]) -> None:
        reset(cluster)
        for n in cluster.nodes:
            farm.reset(n, profiles.get(n, "healthy"))

    return make


def features(cluster: SlurmCluster) -> dict[str, set[str]]:
    nodes = json.loads(cluster.cli("sinfo", "--json").stdout)["nodes"]
    return {n["name"]: {f for f in n["active_features"].split(",") if f} for n in nodes}


def test_train_dag_installs_reboots_and_checks_over_ssh(cluster, farm, fresh, airflow_db, tmp_path, monkeypatch):
    fresh(PROFILES)
    data = slurm_ssh_config(cluster, farm, tmp_path / "state")
    data["buffers"]["failure"] = {"hosts": 3}  # the three failing hosts fit in the failure buffer
    cfg_path = write_config(tmp_path / "railyard.yaml", data)
    monkeypatch.setenv("RAILYARD_CONFIG", str(cfg_path))
    monkeypatch.setenv("RAILYARD_LEDGER_URL", f"sqlite:///{tmp_path}/state/ledger.db")
    boots = {n: farm[n].boot_id() for n in cluster.nodes}
    jobs = [submit(cluster, nodes=2, steps=900) for _ in range(2)]
    cluster._wait("jobs running", lambda: all(job_log(cluster, j) for j in jobs), timeout=30)

    with Sampler(cluster) as sampler:
        dr = load_dag("railyard_train_slurm").test()
    assert dr.state == "success", states(dr)
    cfg = load_config(cfg_path)
    fleet = fleet_from_config(cfg)
    hosts = {h.name: h for h in fleet.hosts()}
    feats = features(cluster)
    healthy = [n for n in cluster.nodes if n not in PROFILES]
    for n in healthy:  # installed over SSH, rebooted (a new boot id), verified, back with the truth as features
        h = farm[n]
        assert hosts[n].state == HostState.SERVING and hosts[n].versions == TARGETS, hosts[n]
        assert h.version("gpu-driver") == "570.86.15" and h.version("kernel") == "6.1.0-28"
        assert sorted(x.split()[0] for x in h.installs()) == ["gpu-driver", "kernel"]  # each once
        assert h.boot_id() != boots[n] and h.reboots() == 1
        assert {"gpu-driver=570.86.15", "kernel=6.1.0-28"} <= feats[n]
    # failing hosts stay drained in repair with the tool's own words, and get no new features
    assert hosts["n1"].state == HostState.REPAIR and "dpkg: error processing package" in (hosts["n1"].reason or "")
    assert hosts["n3"].state == HostState.REPAIR and "sm_stress on GPU 0" in (hosts["n3"].reason or "")
    assert hosts["n5"].state == HostState.REPAIR and "reboot not proven" in (hosts["n5"].reason or "")
    assert farm["n5"].reboots() == 1 and farm["n5"].boot_id() == boots["n5"]
    for n in PROFILES:
        assert not any(f.startswith(("gpu-driver=", "kernel=")) for f in feats[n]), (n, feats[n])
    # n3 was installed (its versions are new) but failed its check: no feature claims them
    assert farm["n3"].version("gpu-driver") == "570.86.15"
    nodes = {n["name"]: n for n in json.loads(cluster.cli("sinfo", "--json").stdout)["nodes"]}
    assert all("DRAIN" in nodes[n]["state_flags"] for n in PROFILES)
    assert not [n for n in healthy if "DRAIN" in nodes[n]["state_flags"]]
    assert sampler.max_domains_out(cfg.host_domain(), ignore=set(PROFILES)) == 1
    assert fleet.reservations() == {}
    for j in jobs:  # every run of a job that a drain ended had checkpointed first
        run: list[list[str]] = []
        for line in job_log(cluster, j):
            run = [line] if line[0] == "start" else [*run, line]
            if line[0] == "term":
                assert any(x[0] == "ckpt" for x in run), job_log(cluster, j)
    assert Ledger(f"sqlite:///{tmp_path}/state/ledger.db").holdings().keys() <= set(PROFILES)


def _shim(tmp_path: Path) -> tuple[Path, Path]:
    """`scontrol` and `scancel` wrappers that log every call, then run the real command."""
    d = tmp_path / "shim"
    d.mkdir()
    log = tmp_path / "slurm-calls.log"
    for tool in ("scontrol", "scancel", "sinfo", "squeue"):
        real = subprocess.run(["which", tool], capture_output=True, text=True, check=True).stdout.strip()
        (d / tool).write_text(f'#!/bin/sh\necho "{tool} $*" >> {log}\nexec {real} "$@"\n')
        (d / tool).chmod(0o755)
    return d, log


def _writes(log: Path) -> list[str]:
    calls = log.read_text().splitlines() if log.exists() else []
    reads = ("sinfo", "squeue", "scontrol show", "scontrol --json show")
    return [c for c in calls if not c.startswith(reads) and c.strip() != "scontrol --version"]


def test_plan_drift_dry_run_and_emergency_plan_never_write(cluster, farm, fresh, airflow_db, tmp_path, monkeypatch):
    """With a pending checkpoint request and a silent job past the requeue policy's grace, every read
    path runs: nothing is requeued, drained, reserved or resumed."""
    fresh({})
    data = slurm_ssh_config(cluster, farm, tmp_path / "state", checkpoint={"policy": "requeue", "grace_s": 1})
    cfg_path = write_config(tmp_path / "railyard.yaml", data)
    cfg = parse_config(data)
    jid = submit(cluster, nodes=2, steps=900, extra=("--nodelist=n1,n2",))
    cluster._wait("job running", lambda: job_log(cluster, jid), timeout=30)
    cluster.cli("scontrol", "update", f"jobid={jid}", "comment=deaf")
    cluster.cli("scancel", "--signal=STOP", "--batch", jid)  # a hung job: no checkpoint will come
    fleet = fleet_from_config(cfg)
    fleet.request_checkpoint([jid])  # a request made by a stop that then crashed
    import time

    time.sleep(1.5)  # past the policy's grace
    writes_before = len(fleet.cli.writes)
    shim, log = _shim(tmp_path)
    env = {**os.environ, "PATH": f"{shim}:{os.environ['PATH']}", "RAILYARD_CONFIG": str(cfg_path),
           "RAILYARD_LEDGER_URL": f"sqlite:///{tmp_path}/state/ledger.db", "RAILYARD_HOME": str(tmp_path / "home")}
    exe = Path(sys.executable).parent / "railyard"
    p = subprocess.run([str(exe), "plan", "slurm"], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "rack-a" in p.stdout
    d = subprocess.run([str(exe), "drift", "--json"], env=env, capture_output=True, text=True, timeout=120)
    assert d.returncode == 0, d.stderr
    assert json.loads(d.stdout)  # it read the fleet
    calls = log.read_text().splitlines()
    assert any(c.startswith("sinfo") for c in calls) and _writes(log) == [], calls

    # in-process: the plan, the drift, the emergency plan, a stop's dodge check and the trigger's
    # checkpoint poll, all through the one place every Slurm command passes
    led = Ledger(f"sqlite:///{tmp_path}/state/ledger.db")
    p1 = plan_train(cfg, cfg.train("slurm"), fleet, led)
    assert p1["hosts_to_upgrade"] == 8
    drift(cfg, fleet.hosts(), fleet.now())
    ep = plan(cfg, fleet, EmergencyRequest(releases=["driver-570"], domains=["rack-a"], reason="CVE-2026-0001 fix now",
                                           dry_run=True))
    assert ep["stops"][0]["jobs_to_checkpoint"] == [jid]
    s = Stop(config=cfg, train=cfg.train("slurm"), domain=cfg.domain("rack-a"), op_id="slurm/read/rack-a",
             fleet=fleet, ledger=led)
    assert s._dodge(fleet.now()) is None
    assert s.policy_due(fleet.now() - 5) == []  # holds no lease: no jobs of its own
    assert fleet.cli.writes[writes_before:] == []

    # the dry run of the train DAG: the first task logs the plan, every stop skips, and the run's end
    # deletes no reservation that another run made ahead, and enforces no gate
    fleet.reserve("other/run9/rack-a", ["rack-a", "rack-b"])
    made = set(fleet.reservations())
    assert made == {fleet._resv_name("rack-a"), fleet._resv_name("rack-b")}, made
    monkeypatch.setenv("RAILYARD_CONFIG", str(cfg_path))
    monkeypatch.setenv("RAILYARD_LEDGER_URL", f"sqlite:///{tmp_path}/state/ledger.db")
    monkeypatch.setenv("PATH", env["PATH"])
    dr = load_dag("railyard_train_slurm").test(run_conf={"dry_run": True})
    assert states(dr)["cycle_report"] == "success"
    assert _writes(log) == [], log.read_text()
    job = next(j for j in json.loads(cluster.cli("squeue", "--json").stdout)["jobs"] if str(j["job_id"]) == jid)
    # still on its nodes (SIGSTOPped: Slurm says STOPPED), never requeued by a read
    assert job["job_state"] in ("RUNNING", "STOPPED") and job["restart_cnt"] == 0, job
    assert set(fleet.reservations()) == made
    fleet.unreserve(["rack-a", "rack-b"])
    assert fleet.reservations() == {}
    assert not [n for n in json.loads(cluster.cli("sinfo", "--json").stdout)["nodes"] if n["state_flags"]]


def test_a_halted_train_and_a_revisit_leave_no_reservation(cluster, farm, fresh, airflow_db, tmp_path, monkeypatch):
    fresh({"n3": "dcgm_fail"})
    data = slurm_ssh_config(cluster, farm, tmp_path / "state",
                            trains=[{"id": "slurm", "releases": ["driver-570", "kernel-28"],
                                     "max_failure_fraction": 0.1}])
    cfg_path = write_config(tmp_path / "railyard.yaml", data)
    monkeypatch.setenv("RAILYARD_CONFIG", str(cfg_path))
    monkeypatch.setenv("RAILYARD_LEDGER_URL", f"sqlite:///{tmp_path}/state/ledger.db")
    seen: set[str] = set()
    with Sampler(cluster) as sampler:
        dr = load_dag("railyard_train_slurm").test()
    seen = {r["ReservationName"] for r in sampler.reservations.values()}
    st = states(dr)
    assert dr.state == "failed" and st["rack-b.health_check"] == "failed", st  # halted at rack-b (n3 failed)
    assert st["end_run"] == "success"
    assert {"railyard_rack-c", "railyard_rack-d"} <= seen  # made ahead of their stops...
    cfg = load_config(cfg_path)
    fleet = fleet_from_config(cfg)
    assert fleet.reservations() == {}  # ...and gone with the halted run

    # a revisit reserves its own domain only, and deletes it on return
    led = Ledger(f"sqlite:///{tmp_path}/state/ledger.db")
    s = Stop(config=cfg, train=cfg.train("slurm"), domain=cfg.domain("rack-a"),
             op_id=op_id_for("slurm", "again", "rack-a"), fleet=fleet, ledger=led, revisit=True)
    with Sampler(cluster) as sampler:
        run_stop(s)
    assert {r["ReservationName"] for r in sampler.reservations.values()} <= {"railyard_rack-a"}
    assert fleet.reservations() == {}
