"""The Slurm + SSH backend under a real `airflow standalone` (scheduler, triggerer, LocalExecutor):
each task in its own process drains with Slurm, installs and reboots over SSH, checks, publishes the
versions read back from the hosts and resumes, one domain at a time, with a job checkpointed first."""

from __future__ import annotations

import json

import pytest

from railyard.backends.slurm.fleet import fleet_from_config
from railyard.devstack.stack import Stack, free_port
from railyard.domain.config import load_config
from railyard.domain.models import HostState
from railyard.ledger import Ledger
from tests.support.configs import write_config
from tests.support.slurm_cluster import job_log, reset, running_cluster, submit
from tests.support.slurm_ssh import node_farm, slurm_ssh_config
from tests.support.slurm_train import Sampler

pytestmark = pytest.mark.e2e

TARGETS = {"gpu-driver": "570.86.15", "kernel": "6.1.0-28"}


@pytest.fixture(scope="module")
def cluster():
    yield from running_cluster()


def test_slurm_train_over_ssh_under_airflow_standalone(cluster, tmp_path):
    reset(cluster)
    farm = node_farm(tmp_path / "nodes", cluster, {"n7": "xid79"})
    stack = None
    try:
        data = slurm_ssh_config(cluster, farm, tmp_path / "state")
        cfg_path = write_config(tmp_path / "railyard.yaml", data)
        boots = {n: farm[n].boot_id() for n in cluster.nodes}
        job = submit(cluster, nodes=2, steps=3000, extra=("--nodelist=n3,n4",))
        cluster._wait("job running", lambda: job_log(cluster, job), timeout=30)
        stack = Stack(home=tmp_path / "stack", config_file=cfg_path, airflow_port=free_port(),
                      sim_port=free_port(), extra_env={"SLURM_CONF": str(cluster.conf)})
        stack.start_airflow()
        stack.ensure_pool()
        stack.wait_dag("railyard_train_slurm")
        stack.rest("PATCH", "/dags/railyard_train_slurm", json={"is_paused": False})
        with Sampler(cluster) as sampler:
            run = stack.trigger("railyard_train_slurm")
            state = stack.wait_run("railyard_train_slurm", run, timeout=900)
        assert state == "success", stack.task_states("railyard_train_slurm", run)

        cfg = load_config(cfg_path)
        fleet = fleet_from_config(cfg)
        hosts = {h.name: h for h in fleet.hosts()}
        nodes = {n["name"]: n for n in json.loads(cluster.cli("sinfo", "--json").stdout)["nodes"]}
        for n in cluster.nodes:
            if n == "n7":
                continue
            assert hosts[n].state == HostState.SERVING and hosts[n].versions == TARGETS, hosts[n]
            assert farm[n].boot_id() != boots[n]  # rebooted for real
            assert {"gpu-driver=570.86.15", "kernel=6.1.0-28"} <= set(nodes[n]["active_features"].split(","))
        # the XID 79 host: in repair with the kernel log's words, drained, no features claiming the target
        assert hosts["n7"].state == HostState.REPAIR and "XID 79" in (hosts["n7"].reason or ""), hosts["n7"]
        assert "DRAIN" in nodes["n7"]["state_flags"] and "gpu-driver=" not in nodes["n7"]["active_features"]
        assert sampler.max_domains_out(cfg.host_domain(), ignore={"n7"}) == 1
        assert fleet.reservations() == {}
        log = job_log(cluster, job)
        first_term = next(i for i, line in enumerate(log) if line[0] == "term")
        assert any(line[0] == "ckpt" for line in log[:first_term]), log  # checkpointed before its nodes went
        assert set(Ledger(f"sqlite:///{tmp_path}/state/ledger.db").holdings()) <= {"n7"}
    finally:
        if stack is not None:
            stack.stop_airflow()
        farm.stop()
