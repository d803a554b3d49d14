"""20 trains x 64 domains import cleanly: every DAG, every stop, every step. No timing here
(the figure is `bench/bench_parse.py`'s)."""

from __future__ import annotations

import importlib.util
import sys
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TRAINS, DOMAINS, HOSTS = 20, 64, 4
STEPS = ["wait_capacity", "wait_checkpoints", "drain", "upgrade", "health_check", "return_to_service"]


def _bench_parse():
    """bench/ is not a package: load the config generator from its file."""
    name = "railyard_bench_parse"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / "bench_parse.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


@pytest.fixture(scope="module")
def scale_bag(tmp_path_factory):
    from airflow.dag_processing.dagbag import DagBag

    cfg = _bench_parse().write_scale_config(tmp_path_factory.mktemp("scale") / "railyard.yaml", TRAINS, DOMAINS, HOSTS)
    mp = pytest.MonkeyPatch()
    mp.setenv("RAILYARD_CONFIG", str(cfg))
    try:
        yield DagBag(dag_folder=str(ROOT / "dags"))
    finally:
        mp.undo()


def test_generated_config_is_valid(tmp_path):
    from railyard.domain.config import load_config

    cfg = load_config(_bench_parse().write_scale_config(tmp_path / "c.yaml", TRAINS, DOMAINS, HOSTS))
    assert len(cfg.trains) == TRAINS
    assert len(cfg.domains) == DOMAINS
    assert {len(d.hosts) for d in cfg.domains} == {HOSTS}
    assert cfg.domains[7].hosts == ["gpu-d07-01", "gpu-d07-02", "gpu-d07-03", "gpu-d07-04"]
    assert cfg.total_hosts == DOMAINS * HOSTS
    assert all(len(cfg.train_domains(t)) == DOMAINS for t in cfg.trains)


def test_scale_config_imports(scale_bag):
    assert scale_bag.import_errors == {}
    trains = sorted(d for d in scale_bag.dags if d.startswith("railyard_train_"))
    assert trains == [f"railyard_train_t{i:02d}" for i in range(TRAINS)]


def test_every_train_has_every_stop(scale_bag):
    for dag_id in (f"railyard_train_t{i:02d}" for i in range(TRAINS)):
        dag = scale_bag.dags[dag_id]
        # the cycle report, one stop per domain, one revisit slot (max_dodges defaults to 1), the run's end
        assert len(dag.tasks) == 2 + (DOMAINS + 1) * len(STEPS), dag_id
        groups = Counter(tid.split(".")[0] for tid in dag.task_ids)
        want = {f"pod-{d:02d}": len(STEPS) for d in range(DOMAINS)} | {"revisit_1": len(STEPS), "cycle_report": 1,
                                                                        "end_run": 1}
        assert groups == want, dag_id
        assert [t.split(".")[1] for t in dag.task_ids[1 : 1 + len(STEPS)]] == STEPS
    last = scale_bag.dags["railyard_train_t19"]
    first_of_last_stop = last.get_task(f"pod-{DOMAINS - 1:02d}.wait_capacity")
    assert {t.task_id for t in first_of_last_stop.upstream_list} == {
        f"pod-{DOMAINS - 2:02d}.health_check",
        f"pod-{DOMAINS - 2:02d}.return_to_service",
    }
