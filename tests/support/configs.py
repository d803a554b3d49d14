"""Small, fast configs for tests: written to a file, because DAGs and tasks read the config by path."""

from __future__ import annotations

from pathlib import Path

import yaml


def small_config(*, domains: int = 3, hosts_per_domain: int = 4, trains: list[dict] | None = None,
                 speed: float = 600, **sim) -> dict:
    names = [f"pod-{chr(ord('a') + i)}" for i in range(domains)]
    return {
        "components": [
            {"name": "gpu-driver", "reboot": True, "duration_s": 300},
            {"name": "gpu-firmware", "reboot": True, "duration_s": 240},
            {"name": "kernel", "reboot": True, "duration_s": 180},
        ],
        "releases": [
            {"id": "driver-570", "component": "gpu-driver", "version": "570.86.15"},
            {"id": "firmware-96", "component": "gpu-firmware", "version": "96.00.a5.00.01"},
            {"id": "kernel-6-1-28", "component": "kernel", "version": "6.1.0-28"},
        ],
        "domains": [{"name": n, "hosts": f"gpu-{n[-1]}[01-{hosts_per_domain:02d}]"} for n in names],
        "trains": trains or [{"id": "demo", "releases": ["driver-570", "firmware-96", "kernel-6-1-28"]}],
        "buffers": {"maintenance": {"hosts": hosts_per_domain}, "failure": {"hosts": 2}},
        "timeouts": {"poll_s": 0.1, "capacity_wait_s": 600, "checkpoint_wait_s": 120},
        "simulator": {
            "speed": speed,
            "seed": 11,
            "initial_versions": {"gpu-driver": "550.127.08", "gpu-firmware": "96.00.89.00.01", "kernel": "6.1.0-25"},
            "jobs": {"count": 2, "hosts_per_job": hosts_per_domain, "checkpoint_interval_s": 1800,
                     "checkpoint_duration_s": 60},
            **sim,
        },
    }


def write_config(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def ssh_config(farm_hosts: dict, *, domains: int = 4, hosts_per_domain: int = 4, failure_hosts: int = 8,
               install_timeout_s: float = 3, known_hosts: str | None = None, key_file: str | None = None,
               user: str | None = None, state_db: str | None = None, parallelism: int = 16) -> dict:
    """The SSH backend over test sshd hosts named gpu-<domain letter><nn>, with the stand-in recipes."""
    recipe = {"install": "railyard-install {component} {version}", "verify": "railyard-version {component}",
              "timeout_s": install_timeout_s}
    base = small_config(domains=domains, hosts_per_domain=hosts_per_domain)
    base["components"] = [{**c, **recipe} for c in base["components"]]
    base["domains"] = [{**d, "sku": "h100"} for d in base["domains"]]
    base["buffers"] = {"maintenance": {"hosts": hosts_per_domain}, "failure": {"hosts": failure_hosts}}
    base["timeouts"] = {"poll_s": 0.1, "capacity_wait_s": 120, "checkpoint_wait_s": 60, "upgrade_s": 60,
                        "check_s": 60, "drain_s": 30, "return_s": 30}
    ssh: dict = {"hosts": farm_hosts, "connect_timeout_s": 5, "command_timeout_s": 20, "parallelism": parallelism,
                 "reboot_command": "railyard-reboot {host}", "boot_id_command": "railyard-boot-id",
                 "reboot_timeout_s": 20,
                 "checks": {"dcgm_level": 2, "nccl_min_busbw_gbps": {"h100": 300}, "gpus_per_sku": {"h100": 8}}}
    for k, v in (("known_hosts", known_hosts), ("key_file", key_file), ("user", user)):
        if v is not None:
            ssh[k] = v
    base["fleet"] = {"backend": "ssh", "ssh": ssh}
    if state_db is not None:  # the fleet's state lives in the ledger's database
        base["ledger"] = {"url": f"sqlite:///{state_db}"}
    return base
