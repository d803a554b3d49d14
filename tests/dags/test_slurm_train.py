"""The same train DAG, on the Slurm backend by configuration only: `dag.test()` over a real 8-node
Slurm cluster with running batch jobs that checkpoint when signalled."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from railyard.backends.slurm.fleet import fleet_from_config
from railyard.domain.config import load_config
from railyard.domain.models import HostState
from railyard.ledger import Ledger
from tests.support.configs import write_config
from tests.support.slurm_cluster import SlurmCluster, job_log, reset, running_cluster, slurm_config, submit
from tests.support.slurm_train import Sampler


@pytest.fixture(scope="module")
def cluster() -> Iterator[SlurmCluster]:
    yield from running_cluster()


def test_train_dag_on_slurm(cluster: SlurmCluster, airflow_db, tmp_path, monkeypatch):
    reset(cluster)
    cfg_path = write_config(tmp_path / "railyard.yaml", slurm_config(cluster, tmp_path / "state"))
    monkeypatch.setenv("RAILYARD_CONFIG", str(cfg_path))
    monkeypatch.setenv("RAILYARD_LEDGER_URL", f"sqlite:///{tmp_path}/state/ledger.db")
    jobs = [submit(cluster, nodes=2, steps=600) for _ in range(2)]
    cluster._wait("jobs running", lambda: all(job_log(cluster, j) for j in jobs), timeout=30)
    from tests.dags.test_train_run import load_dag

    dag = load_dag("railyard_train_slurm")
    with Sampler(cluster) as sampler:
        dr = dag.test()
    assert dr.state == "success", {ti.task_id: ti.state for ti in dr.get_task_instances()}
    cfg = load_config(cfg_path)
    fleet = fleet_from_config(cfg)
    targets = cfg.train_targets(cfg.train("slurm"))
    assert all(h.state == HostState.SERVING and h.versions == targets for h in fleet.hosts())
    assert sampler.max_domains_out(cfg.host_domain()) == 1
    assert sampler.ever_drained() == set(cluster.nodes)  # Slurm itself saw every node taken out...
    nodes = json.loads(cluster.cli("sinfo", "--json").stdout)["nodes"]
    assert not [n["name"] for n in nodes if "DRAIN" in n["state_flags"]]  # ...and none left drained
    assert Ledger(f"sqlite:///{tmp_path}/state/ledger.db").holdings() == {}
    for j in jobs:  # every run of a job that was ended by a drain had checkpointed first
        run: list[list[str]] = []
        for line in job_log(cluster, j):
            run = [line] if line[0] == "start" else [*run, line]
            if line[0] == "term":
                assert any(x[0] == "ckpt" for x in run), job_log(cluster, j)
        assert any(line[0] == "term" for line in job_log(cluster, j))
