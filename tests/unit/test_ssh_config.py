"""The SSH backend's config: recipes, hosts and checks refused at load with field and value."""

from __future__ import annotations

import copy

import pytest

from railyard.domain.config import ConfigError, parse_config
from tests.support.configs import small_config, ssh_config

HOSTS = {f"gpu-{d}{i:02d}": {"address": "127.0.0.1", "port": 22000 + n * 4 + i, "work_dir": f"/var/tmp/ry/{d}{i}"}
         for n, d in enumerate("abcd") for i in range(1, 5)}


def problems(data: dict) -> list[str]:
    with pytest.raises(ConfigError) as exc:
        parse_config(data)
    return exc.value.problems


def test_ssh_config_loads():
    cfg = parse_config(ssh_config(HOSTS))
    assert cfg.fleet.backend == "ssh" and cfg.fleet.ssh is not None
    assert cfg.component("gpu-driver").install == "railyard-install {component} {version}"
    assert cfg.fleet.ssh.host_work_dir("gpu-a01") == "/var/tmp/ry/a1"
    assert parse_config(small_config()).fleet.backend == "http"  # the simulator stays the default


def test_recipe_with_unknown_variable_is_refused():
    data = ssh_config(HOSTS)
    data["components"][0]["install"] = "curl http://x/{url} | sh"
    assert problems(data) == ["components[0].install: unknown template variable {url}; known: component, gpus, "
                              "host, sku, version (value: 'curl http://x/{url} | sh')"]


@pytest.mark.parametrize("field,value,expect", [
    ("address", "n1;reboot", "is not a host name or IP address"),
    ("address", "-oProxyCommand=id", "is not a host name or IP address"),
    ("address", "$(id)", "is not a host name or IP address"),
    ("work_dir", "/tmp/../etc", "is not a plain absolute path"),
    ("work_dir", "/tmp/a b", "is not a plain absolute path"),
    ("port", 0, "greater than or equal to 1"),
])
def test_bad_host_entries_are_refused(field, value, expect):
    data = ssh_config(copy.deepcopy(HOSTS))
    data["fleet"]["ssh"]["hosts"]["gpu-a01"][field] = value
    found = problems(data)
    assert any(p.startswith(f"fleet.ssh.hosts.gpu-a01.{field}:") and expect in p and repr(value) in p
               for p in found), found


@pytest.mark.parametrize("name", ["n1;reboot", "$(id)", "a`id`", "a\nb", "-oProxyCommand=x", "x" * 300])
def test_bad_host_names_are_refused(name):
    data = ssh_config(copy.deepcopy(HOSTS))
    data["fleet"]["ssh"]["hosts"][name] = {"address": "127.0.0.1"}
    found = problems(data)
    assert any("not a plain token" in p and repr(name) in p for p in found), found


def test_cross_checks_name_the_field():
    data = ssh_config({k: v for k, v in HOSTS.items() if k != "gpu-b02"})
    data["fleet"]["ssh"]["hosts"]["gpu-z09"] = {"address": "10.0.0.9"}
    data["fleet"]["ssh"]["checks"]["nccl_min_busbw_gbps"] = {}
    del data["components"][1]["verify"]
    found = problems(data)
    assert "domains[1].hosts[1]: host 'gpu-b02' has no entry in fleet.ssh.hosts" in found
    assert "fleet.ssh.hosts.gpu-z09: host 'gpu-z09' is in no domain" in found
    assert "fleet.ssh.checks.nccl_min_busbw_gbps: no floor for SKU 'h100'" in found
    assert "components[1].verify: required for the ssh backend (component 'gpu-firmware')" in found
    data = ssh_config(HOSTS)
    del data["fleet"]["ssh"]
    assert problems(data) == ["fleet.ssh: required when fleet.backend is 'ssh'"]
