"""A real Slurm cluster whose nodes are also real sshd hosts: the production path of the Slurm backend
(`fleet.slurm.runner: ssh`), with the stand-in GPU tools on the host side (`tests/support/standins/`):
installs, verify recipes, nvidia-smi/dcgmi/all_reduce_perf/dmesg output, and a reboot that drops the
host's connections and comes back with a new boot id."""

from __future__ import annotations

from pathlib import Path

from tests.support.slurm_cluster import SlurmCluster, slurm_config
from tests.support.sshd import SshdFarm

RECIPE = {"install": "railyard-install {component} {version}", "verify": "railyard-version {component}",
          "timeout_s": 20}


def slurm_ssh_config(cluster: SlurmCluster, farm: SshdFarm, state_dir: Path, *, reboot_timeout_s: float = 8,
                     trains: list[dict] | None = None, **slurm: object) -> dict:
    """The cluster's 8 nodes in 4 racks of 2, driven over SSH; no stand-in runner anywhere."""
    data = slurm_config(cluster, state_dir, trains=trains, **slurm)
    data["components"] = [{**c, **RECIPE} for c in data["components"]]
    data["domains"] = [{**d, "sku": "h100"} for d in data["domains"]]
    data["timeouts"] = {**data["timeouts"], "upgrade_s": 90, "check_s": 60}
    s = data["fleet"]["slurm"]
    s.pop("runner")
    s.pop("standin")
    s["ssh_hosts"] = {n: {"address": "127.0.0.1", "port": h.port, "work_dir": str(h.work_dir)}
                      for n, h in farm.hosts.items()}
    data["fleet"]["ssh"] = {
        "user": farm.user, "key_file": str(farm.client_key), "known_hosts": str(farm.known_hosts),
        "connect_timeout_s": 5, "command_timeout_s": 20, "connect_retries": 1,
        "reboot_command": "railyard-reboot {host}", "boot_id_command": "railyard-boot-id",
        "reboot_timeout_s": reboot_timeout_s,
        "checks": {"dcgm_level": 2, "nccl_min_busbw_gbps": {"h100": 300}, "gpus_per_sku": {"h100": 8}},
    }
    return data


def node_farm(root: Path, cluster: SlurmCluster, profiles: dict[str, str] | None = None) -> SshdFarm:
    return SshdFarm(root, list(cluster.nodes), profiles).start()
