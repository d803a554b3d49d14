"""The demo train under `dag.test()` over 16 real sshd hosts in 4 domains, selected by config alone.

Mixed host states: healthy hosts end at target and verified; every faulty host is offboarded with
the reason its tool gave; never more than one domain out (replayed from the SshFleet's events).
"""

from __future__ import annotations

import json

import pytest

from railyard.backends.ssh.fleet import SshFleet
from railyard.backends.ssh.runner import Credentials, paramiko_connector
from railyard.domain.config import load_config
from railyard.domain.models import HostState
from railyard.ledger import Ledger
from railyard.operations.stop import op_id_for
from tests.support.configs import ssh_config, write_config
from tests.support.sshd import SshdFarm

NAMES = [f"gpu-{d}{i:02d}" for d in "abcd" for i in range(1, 5)]
FAULTS = {
    "gpu-a02": ("ecc", "health check failed: nvidia-smi: GPU 3 has 12 uncorrected ECC errors"),
    "gpu-b01": ("missing_gpu", "health check failed: nvidia-smi: 7 of 8 GPUs visible"),
    "gpu-b03": ("slow_nvlink", "health check failed: all_reduce_perf: bus bandwidth 235.3 GB/s below floor 300.0 GB/s"),
    "gpu-c02": ("xid79", "health check failed: XID 79 on PCI:0000:a1:00: pid='<unknown>', name=<unknown>, "
                        "GPU has fallen off the bus."),
    "gpu-c04": ("install_fail", "upgrade failed: gpu-driver: install exit 1: Unpacking gpu-driver (570.86.15) ... "
                                "dpkg: error processing package gpu-driver-570.86.15 (--configure)"),
    "gpu-d01": ("install_hang", "upgrade failed: gpu-driver: install timed out after 3s"),
    "gpu-d03": ("dcgm_fail", "health check failed: dcgmi diag -r 2: sm_stress on GPU 0: Max stress level of 2128.7 "
                             "did not exceed desired stress level of 3000.0 for GPU 0"),
}


@pytest.fixture
def ssh_train(tmp_path, monkeypatch, airflow_db):
    farm = SshdFarm(tmp_path / "sshd", NAMES, {h: p for h, (p, _) in FAULTS.items()}).start()
    cfg = write_config(tmp_path / "railyard.yaml",
                       ssh_config(farm.ssh_hosts_config()))
    monkeypatch.setenv("RAILYARD_CONFIG", str(cfg))
    monkeypatch.setenv("RAILYARD_LEDGER_URL", f"sqlite:///{tmp_path}/ledger.db")
    monkeypatch.setenv("AIRFLOW_CONN_RAILYARD_SSH", json.dumps({
        "conn_type": "ssh", "host": "127.0.0.1", "login": farm.user,
        "extra": {"key_file": str(farm.client_key), "known_hosts": str(farm.known_hosts)}}))
    monkeypatch.delenv("AIRFLOW_CONN_RAILYARD_FLEET", raising=False)  # no simulator: ssh hosts only
    yield farm, cfg, tmp_path
    farm.stop()


def test_train_over_ssh_hosts(ssh_train):
    from tests.dags.test_train_run import load_dag

    farm, cfg_path, tmp = ssh_train
    dag = load_dag("railyard_train_demo")
    dr = dag.test()
    states = {ti.task_id: ti.state for ti in dr.get_task_instances()}
    assert dr.state == "success", states

    config = load_config(cfg_path)
    targets = config.train_targets(config.train("demo"))
    fleet = SshFleet.from_config(config, paramiko_connector(Credentials(farm.user, str(farm.client_key),
                                                                        str(farm.known_hosts))))
    hosts = {h.name: h for h in fleet.hosts()}
    led = Ledger(f"sqlite:///{tmp}/ledger.db")
    for name in NAMES:
        h = hosts[name]
        op = op_id_for("demo", dr.run_id, h.domain)
        if name in FAULTS:
            assert h.state == HostState.REPAIR, (name, h)
            assert h.reason is not None and h.reason.startswith(FAULTS[name][1]), (name, h.reason)
        else:
            assert h.state == HostState.SERVING and h.versions == targets, (name, h)
            assert {farm[name].version(c) for c in targets} == set(targets.values())
            v = led.verification(op, name)
            assert v is not None and v[0] is True and v[1] == {**v[1], **targets}, (name, v)
            assert all(x["passed"] for x in fleet.check_evidence(name, op))
    # installs ran once per component on every host that got that far
    for name in NAMES:
        installs = [ln.split()[0] for ln in farm[name].installs()]
        assert len(installs) == len(set(installs)), (name, installs)
    assert [ln.split()[0] for ln in farm["gpu-c04"].installs()] == ["gpu-driver"]  # stopped at the first failure
    assert fleet.max_domains_out() == 1
    # every stop released its domain; only the offboarded hosts stay held, by their repair operations
    assert all(led.operation(op_id_for("demo", dr.run_id, d))["state"] == "done"
               for d in ("pod-a", "pod-b", "pod-c", "pod-d"))
    held = led.holdings()
    assert set(held) == set(FAULTS) and all(op.startswith("repair/") for op in held.values()), held
    fleet.close()
