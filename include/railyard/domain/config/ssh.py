"""Config models of the SSH backend: where the hosts are, how to reach them, which checks to run.

They live here (not in `config.py`) so the SSH adapter can be read on its own; `config.py` embeds
`SshSpec` as `fleet.ssh` and checks what needs the whole config itself (`ssh_problems`): this module
never imports the config.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, Field

from railyard.domain.models import Strict, Token
from railyard.domain.recipes import CommandTemplate

_ADDRESS_RE = re.compile(r"^(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)"
                         r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$")
_IPV6_RE = re.compile(r"^[0-9A-Fa-f:]{2,39}$")
_PATH_RE = re.compile(r"^/[A-Za-z0-9._/-]{0,250}$")


def check_address(value: str) -> str:
    """A DNS name or an IP address, nothing a shell or ssh could read as an option."""
    if not isinstance(value, str) or len(value) > 253 or not (_ADDRESS_RE.match(value) or _IPV6_RE.match(value)):
        raise ValueError(f"{value!r} is not a host name or IP address")
    return value


def check_abs_path(value: str) -> str:
    """An absolute path of plain characters, no `..`: safe inside a remote shell command."""
    if not isinstance(value, str) or not _PATH_RE.match(value) or ".." in value.split("/"):
        raise ValueError(f"{value!r} is not a plain absolute path (letters, digits, '.', '_', '-', '/'; no '..')")
    return value


Address = Annotated[str, AfterValidator(check_address)]
AbsPath = Annotated[str, AfterValidator(check_abs_path)]

CheckName = Literal["gpu_inventory", "dcgm", "nccl", "xid", "versions"]
CHECKS: tuple[CheckName, ...] = ("gpu_inventory", "dcgm", "nccl", "xid", "versions")

# XIDs that mean the GPU or its link is broken until a reset or a repair (NVIDIA's XID catalog).
FATAL_XIDS = (48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120)


class SshHostSpec(Strict):
    address: Address = Field(description="DNS name or IP address that ssh connects to")
    port: int = Field(default=22, ge=1, le=65535, description="the host's SSH port")
    work_dir: AbsPath | None = Field(default=None, description="overrides fleet.ssh.work_dir for this host")


class HealthChecksSpec(Strict):
    """The deep health check: which checks of the catalog run, and their thresholds."""

    run: list[CheckName] = Field(
        default_factory=lambda: list(CHECKS), min_length=1,
        description="the checks a host must pass: gpu_inventory (nvidia-smi), dcgm (dcgmi diag), nccl "
                    "(all_reduce_perf), xid (fatal XIDs in the kernel log), versions (installed versions at target)")
    driver_component: Token | None = Field(default="gpu-driver",
                                           description="component whose target version gpu_inventory expects "
                                                       "as nvidia-smi's driver version; none = not compared")
    gpus_per_sku: dict[Token, int] = Field(default_factory=dict, description="GPUs a host of each SKU must show; "
                                           "8 for a SKU not listed")
    dcgm_level: int = Field(default=2, ge=1, le=4, description="run level of `dcgmi diag -r` (1..4; higher runs "
                            "longer and deeper)")
    dcgm_may_skip: dict[str, str] = Field(
        default_factory=dict, description="DCGM tests allowed to be Skip (test name -> why, shown in the verdict); "
                                          "any other test Skip or missing on a GPU fails the host")
    nccl_min_busbw_gbps: dict[Token, float] = Field(
        default_factory=dict, description="bus bandwidth floor of all_reduce_perf per SKU, GB/s")
    fatal_xids: list[int] = Field(default_factory=lambda: list(FATAL_XIDS),
                                  description="XID codes that fail the host when found in its kernel log")
    ecc_required: dict[Token, bool] = Field(
        default_factory=dict, description="per SKU: whether every GPU must have ECC on (default true); a GPU "
                                          "with ECC off, or whose ECC count is not reported, then fails")
    timeout_s: float = Field(default=1800, gt=0, description="real seconds each check command may run on a host "
                             "before it is killed")

    def gpus(self, sku: str) -> int:
        return self.gpus_per_sku.get(sku, 8)

    def ecc_on(self, sku: str) -> bool:
        return self.ecc_required.get(sku, True)


class SshSpec(Strict):
    """Plain hosts reached over SSH; credentials from the Airflow SSH connection `connection`."""

    connection: Token = Field(default="railyard_ssh",
                              description="Airflow SSH connection: login, key_file, known_hosts")
    user: Token | None = Field(default=None, description="login on the hosts when the Airflow connection gives "
                               "none; the CLI always uses this one")
    key_file: AbsPath | None = Field(default=None, description="private key file when the connection's extra "
                                     "key_file is unset; the CLI always uses this one")
    known_hosts: AbsPath | None = Field(default=None,
                                        description="pinned host keys; unknown or changed keys are refused")
    hosts: dict[Token, SshHostSpec] = Field(default_factory=dict, description="backend ssh: every host; "
                                            "backend slurm: fleet.slurm.ssh_hosts instead")
    work_dir: AbsPath = Field(default="/var/tmp/railyard", description="on the host: locks, status files and logs")
    connect_timeout_s: float = Field(default=10, gt=0, description="real seconds to connect to a host and "
                                     "authenticate")
    command_timeout_s: float = Field(default=60, gt=0, description="real seconds one SSH command may run (read "
                                     "versions, launch or read an install or check); installs and checks run "
                                     "detached under their own timeouts")
    connect_retries: int = Field(default=2, ge=0, le=10, description="further attempts after a failed connection, "
                                 "with backoff; a command that started is never sent again")
    parallelism: int = Field(default=32, ge=1, le=512, description="hosts worked on at once, one SSH connection "
                             "each")
    versions_ttl_s: float = Field(default=300, ge=0, description="real seconds a serving host's versions, once "
                                  "read, are reused before the host is asked again")
    reboot_command: CommandTemplate | None = Field(
        default=None, description="run detached after the installs when a component needs a reboot")
    reboot_timeout_s: float = Field(default=900, gt=0, description="how long a host may take to come back with "
                                    "a new boot id after the reboot command; then the upgrade failed")
    boot_id_command: CommandTemplate = Field(
        default="cat /proc/sys/kernel/random/boot_id",
        description="prints the host's boot id; a reboot is proven only by a new one")
    checks: HealthChecksSpec = Field(default=HealthChecksSpec(), description="the deep health check a host "
                                     "must pass after its upgrade, before it serves again")

    def host_work_dir(self, host: str) -> str:
        h = self.hosts[host]
        return h.work_dir or self.work_dir
