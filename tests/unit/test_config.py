from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from railyard.domain.config import DEFAULT_CONFIG, ConfigError, expand_hostlist, load_config, parse_config

BASE = yaml.safe_load(DEFAULT_CONFIG.read_text())


def problems_of(mutate) -> list[str]:
    data = copy.deepcopy(BASE)
    mutate(data)
    with pytest.raises(ConfigError) as exc:
        parse_config(data)
    return exc.value.problems


def test_demo_config_is_valid():
    cfg = load_config()
    assert cfg.total_hosts == 64
    assert [d.name for d in cfg.domains][:2] == ["pod-a", "pod-b"]
    assert cfg.domains[0].hosts == [f"gpu-a{i:02d}" for i in range(1, 9)]
    assert list(cfg.train_targets(cfg.train("demo"))) == ["gpu-driver", "gpu-firmware", "kernel"]


def test_hostlist_expansion_keeps_padding():
    assert expand_hostlist("n[8-10]") == ["n8", "n9", "n10"]
    assert expand_hostlist("gpu[098-100]x") == ["gpu098x", "gpu099x", "gpu100x"]
    assert expand_hostlist("plain") == ["plain"]


def test_unknown_field_is_named():
    p = problems_of(lambda d: d["trains"][0].update(colour="red"))
    assert p == ["trains[0].colour: unknown field (value: 'red')"]


def test_host_in_two_domains():
    p = problems_of(lambda d: d["domains"][1].update(hosts=["gpu-a03", "gpu-b02"]))
    assert any("domains[1].hosts[0]" in x and "'gpu-a03'" in x and "'pod-a'" in x for x in p), p


def test_empty_domain():
    p = problems_of(lambda d: d["domains"][2].update(hosts=[]))
    assert any(x.startswith("domains[2].hosts:") and "at least one host" in x for x in p), p


def test_duplicate_ids():
    p = problems_of(lambda d: d["domains"].append(copy.deepcopy(d["domains"][0]) | {"hosts": ["z1"]}))
    assert any("domains[8]: duplicate id 'pod-a'" in x for x in p), p


@pytest.mark.parametrize("bad", ["gpu a01", "gpu;rm -rf /", "$(reboot)", "-x", ""])
def test_host_name_not_a_plain_token(bad):
    p = problems_of(lambda d: d["domains"][0].update(hosts=[bad]))
    assert any(x.startswith("domains[0].hosts[0]:") and repr(bad) in x and "plain token" in x for x in p), p


def test_version_not_a_plain_token():
    p = problems_of(lambda d: d["releases"][0].update(version="570 && curl evil"))
    assert any(x.startswith("releases[0].version:") and "'570 && curl evil'" in x for x in p), p


def test_buffer_smaller_than_a_domain():
    p = problems_of(lambda d: d["buffers"].update(maintenance={"hosts": 4}))
    assert any(x.startswith("buffers.maintenance:") and "4 hosts" in x and "'pod-a'" in x for x in p), p


def test_unknown_references_are_named():
    def mutate(d):
        d["trains"][0]["releases"] = ["driver-570", "nope"]
        d["trains"][0]["domains"] = ["pod-a", "pod-zz"]

    p = problems_of(mutate)
    assert "trains[0].releases[1]: unknown release 'nope'" in p
    assert "trains[0].domains[1]: unknown domain 'pod-zz'" in p


def test_every_problem_is_reported_at_once():
    def mutate(d):
        d["domains"][0]["hosts"] = ["ok1", "bad host"]
        d["trains"][0]["colour"] = "red"

    assert len(problems_of(mutate)) >= 2


def _validate(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "railyard.cli", "validate", *args], capture_output=True, text=True)


def test_cli_validate_ok_and_bad(tmp_path: Path):
    ok = _validate(str(DEFAULT_CONFIG))
    assert ok.returncode == 0 and "64 hosts in 8 domains" in ok.stdout
    data = copy.deepcopy(BASE)
    data["domains"][0]["hosts"] = ["gpu-a01", "gpu-b01"]
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(data))
    res = _validate(str(bad))
    assert res.returncode == 1
    assert "domains[1].hosts[0]: host 'gpu-b01' is already in domain 'pod-a'" in res.stderr


def test_cli_validate_missing_file(tmp_path: Path):
    res = _validate(str(tmp_path / "none.yaml"))
    assert res.returncode == 1 and "cannot read file" in res.stderr


def test_cli_freeze_switch(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("RAILYARD_LEDGER_URL", f"sqlite:///{tmp_path}/l.db")
    run = lambda *a: subprocess.run([sys.executable, "-m", "railyard.cli", "freeze", *a],  # noqa: E731
                                    capture_output=True, text=True)
    assert run("status").stdout.strip() == "freeze is off"
    bad = run("on")
    assert bad.returncode == 2 and "--reason is required" in bad.stderr
    on = run("on", "--reason", "year-end change freeze", "--actor", "alice")
    assert on.returncode == 0 and "freeze is ON" in on.stdout and "alice: year-end change freeze" in on.stdout
    from railyard.ledger import Ledger

    assert Ledger(f"sqlite:///{tmp_path}/l.db").switch("freeze")["actor"] == "alice"
    assert run("off", "--reason", "done").stdout.strip() == "freeze is off"
