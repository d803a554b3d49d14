"""Every generated DAG imports, ids are stable and sorted, and bad config becomes an import error."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from railyard.domain.config import DEFAULT_CONFIG, load_config

ROOT = Path(__file__).resolve().parents[2]
STEPS = ["wait_capacity", "wait_checkpoints", "drain", "upgrade", "health_check", "return_to_service"]


def dagbag(monkeypatch, config: Path | None = None):
    from airflow.dag_processing.dagbag import DagBag

    if config is not None:
        monkeypatch.setenv("RAILYARD_CONFIG", str(config))
    return DagBag(dag_folder=str(ROOT / "dags"))


def test_demo_dags_import(monkeypatch):
    bag = dagbag(monkeypatch)
    assert bag.import_errors == {}
    assert sorted(bag.dag_ids) == ["railyard_emergency", "railyard_outside", "railyard_reconcile", "railyard_releases",
                                   "railyard_repairs", "railyard_train_demo"]
    dag = bag.dags["railyard_train_demo"]
    groups = [tid.split(".")[0] for tid in dag.task_ids if tid.endswith(".wait_capacity")]
    assert groups == [f"pod-{c}" for c in "abcdefgh"] + ["revisit_1"]
    assert dag.task_ids[0] == "cycle_report"
    assert [t.split(".")[1] for t in dag.task_ids[1:7]] == STEPS
    assert dag.max_active_runs == 1


def test_stop_shape_and_pool(monkeypatch):
    dag = dagbag(monkeypatch).dags["railyard_train_demo"]
    ret = dag.get_task("pod-a.return_to_service")
    assert ret.is_teardown and ret.on_failure_fail_dagrun
    assert {t.task_id for t in ret.upstream_list} >= {"pod-a.health_check", "pod-a.wait_capacity"}
    for step in ("drain", "upgrade", "health_check", "return_to_service"):
        assert dag.get_task(f"pod-a.{step}").pool == "railyard_disruptive"
    assert [t.task_id for t in dag.get_task("pod-a.wait_capacity").upstream_list] == ["cycle_report"]
    last = dag.get_task("revisit_1.wait_capacity")
    assert {t.task_id for t in last.upstream_list} == {"pod-h.health_check", "pod-h.return_to_service"}
    assert last.slot == "revisit_1" and last.domain is None
    assert dag.get_task("pod-a.drain").execution_timeout.total_seconds() == 900 + 300
    assert dag.get_task("pod-a.drain").on_failure_callback
    nxt = dag.get_task("pod-b.wait_capacity")
    assert {t.task_id for t in nxt.upstream_list} == {"pod-a.health_check", "pod-a.return_to_service"}
    assert nxt.trigger_rule == "none_failed"
    assert dag.get_task("pod-a.wait_checkpoints").timeout == 300


def test_many_trains_sorted_and_stable(monkeypatch, tmp_path):
    data = yaml.safe_load(DEFAULT_CONFIG.read_text())
    data["trains"] = [dict(data["trains"][0], id=f"t{i:02d}") for i in (3, 1, 2)]
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(data))
    bag = dagbag(monkeypatch, cfg)
    assert bag.import_errors == {}
    want = ["railyard_train_t01", "railyard_train_t02", "railyard_train_t03"]
    assert sorted(d for d in bag.dag_ids if d.startswith("railyard_train_")) == want
    from railyard_airflow.factory import build_train_dags

    assert list(build_train_dags(str(cfg))) == want  # built in sorted order, ids from train ids


@pytest.mark.parametrize(
    "mutate, needle",
    [
        (lambda d: d["trains"][0].update(colour="red"), "trains[0].colour: unknown field (value: 'red')"),
        (lambda d: d["domains"][1].update(hosts=["gpu-a01"]), "host 'gpu-a01' is already in domain 'pod-a'"),
        (lambda d: d["domains"][0].update(hosts=["gpu;reboot"]), "'gpu;reboot' is not a plain token"),
        (lambda d: d["buffers"].update(maintenance={"hosts": 2}), "buffers.maintenance: 2 hosts is smaller"),
    ],
)
def test_bad_config_is_an_import_error(monkeypatch, tmp_path, mutate, needle):
    data = copy.deepcopy(yaml.safe_load(DEFAULT_CONFIG.read_text()))
    mutate(data)
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(yaml.safe_dump(data))
    bag = dagbag(monkeypatch, cfg)
    assert list(bag.dag_ids) == []
    assert len(bag.import_errors) == 6  # the trains, emergency, releases, repairs, reconcile, outside files refuse it
    assert all(needle in err for err in bag.import_errors.values())


def test_emergency_dag_has_a_form_and_a_slot_per_domain(monkeypatch):
    dag = dagbag(monkeypatch).dags["railyard_emergency"]
    assert dag.schedule is None or str(dag.timetable.summary) in ("None", "")
    assert set(dag.params) >= {"releases", "domains", "hosts", "reason", "skip_checkpoint", "dry_run",
                               "large_scale", "domains_at_once"}
    assert dag.task_ids[0] == "plan"
    slots = sorted({t.split(".")[0] for t in dag.task_ids if t.startswith("stop_")})
    assert len(slots) == 8
    take = dag.get_task("stop_1.wait_capacity")
    assert [t.task_id for t in take.upstream_list] == ["plan"] and take.priority_weight == 100


def _init_levels(cls: type) -> int:
    """How many times Airflow applies its defaults when `cls` is built: once per wrapped `__init__` in its MRO."""
    return sum(1 for c in cls.__mro__ if hasattr(vars(c).get("__init__"), "__wrapped__"))


def test_stop_tasks_take_their_arguments_at_one_init_level(monkeypatch):
    """Railyard's stop tasks add no `__init__` level to Airflow's (each costs a pass of its defaults per task)
    and still take, check and refuse their arguments."""
    from airflow.providers.standard.operators.empty import EmptyOperator
    from airflow.sdk.bases.sensor import BaseSensorOperator

    from railyard_airflow.operators.stop import DrainDomainOperator, ReturnDomainOperator
    from railyard_airflow.sensors.stop import BufferCapacitySensor, CheckpointSensor

    assert _init_levels(DrainDomainOperator) == _init_levels(ReturnDomainOperator) == _init_levels(EmptyOperator) == 1
    assert _init_levels(BufferCapacitySensor) == _init_levels(CheckpointSensor) == _init_levels(BaseSensorOperator)

    dag = dagbag(monkeypatch).dags["railyard_train_demo"]
    take, ckpt = dag.get_task("pod-b.wait_capacity"), dag.get_task("pod-b.wait_checkpoints")
    drain = dag.get_task("pod-b.drain")
    assert (drain.train_id, drain.domain, drain.slot, drain.fleet_conn_id) == ("demo", "pod-b", None, "railyard_fleet")
    t = load_config(DEFAULT_CONFIG).timeouts
    assert take.timeout == take.wait_s == t.capacity_wait_s and ckpt.timeout == ckpt.wait_s == t.checkpoint_wait_s
    assert take.poke_interval == take.poll_s  # BaseSensorOperator's own arguments, from ours
    assert ckpt.inline_s == 15.0 and ckpt.deferrable is True
    assert dag.get_task("revisit_1.drain").slot == "revisit_1"

    with pytest.raises(TypeError, match="missing keyword argument 'train_id'"):
        DrainDomainOperator(task_id="x", domain="pod-a")
    with pytest.raises(TypeError, match="domian"):  # a misspelt argument is still Airflow's invalid argument
        DrainDomainOperator(task_id="x", train_id="demo", domian="pod-a")
    s = CheckpointSensor(task_id="x", train_id="demo", domain="pod-a", wait_s=90, poll_s=2, inline_s=1)
    assert (s.timeout, s.poke_interval, s.wait_s, s.inline_s) == (90, 2, 90, 1)


def test_the_emergency_form_picks_releases_and_domains_from_the_config(tmp_path):
    """Airflow's form draws an array param as a multi-select when the param has `examples`: releases and
    domains are pickers of the config's own, labelled; a value not among them is refused at trigger, naming
    the param and the value; a picker emptied after a pick (null) is no scope rather than an error."""
    from airflow.sdk.definitions.param import ParamValidationError

    from railyard_airflow.factory import build_emergency_dag
    from tests.support.configs import small_config, write_config

    data = small_config(domains=3, hosts_per_domain=2)
    data["releases"].append({"id": "driver-575-hotfix", "component": "gpu-driver", "version": "575.51.02"})
    data["domains"][2]["sku"] = "b200"
    dag = build_emergency_dag(str(write_config(tmp_path / "c.yaml", data)))
    rel, dom, hosts = (dag.params.get_param(k).schema for k in ("releases", "domains", "hosts"))
    ids = ["driver-570", "firmware-96", "kernel-6-1-28", "driver-575-hotfix"]
    assert rel["examples"] == rel["items"]["enum"] == ids and rel["type"] == "array"
    assert rel["values_display"]["driver-575-hotfix"] == "driver-575-hotfix: gpu-driver 575.51.02"
    assert dom["examples"] == dom["items"]["enum"] == ["pod-a", "pod-b", "pod-c"]
    assert dom["values_display"] == {"pod-a": "pod-a (2 hosts, gpu)", "pod-b": "pod-b (2 hosts, gpu)",
                                     "pod-c": "pod-c (2 hosts, b200)"}
    assert hosts["examples"] == ["gpu-a01", "gpu-a02", "gpu-b01", "gpu-b02", "gpu-c01", "gpu-c02"]
    params = dag.params
    params["releases"] = ["driver-575-hotfix"]
    params["domains"] = ["pod-c"]
    params["domains"] = None
    params["hosts"] = None
    for key, bad in (("releases", ["driver-999"]), ("domains", ["pod-a", "pod-zz"]), ("releases", None)):
        with pytest.raises(ParamValidationError) as err:
            params[key] = bad
        assert str(err.value).startswith(f"Invalid input for param {key}: "), err.value
        assert repr(bad[-1]) in str(err.value) if bad else "None is not of type 'array'" in str(err.value)
