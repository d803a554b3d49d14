"""The `fleet.slurm` section: how Railyard reaches a Slurm cluster and how it treats its jobs.

Referenced from `railyard.domain.config.FleetSpec`; validated with the rest of the config, so a bad value
is refused with its field path before any node is touched.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from railyard.domain.config.ssh import SshHostSpec
from railyard.domain.models import Strict, Token
from railyard.domain.recipes import CommandTemplate


class SlurmSshSpec(Strict):
    """Run `scontrol`/`squeue`/... on the Slurm controller over SSH instead of locally."""

    host: Token = Field(description="the controller's host name or address")
    port: int = Field(default=22, ge=1, le=65535, description="the controller's SSH port")
    user: Token = Field(default="root", description="login on the controller")
    key_file: str = Field(description="private key file (`ssh -i`)")
    known_hosts: str = Field(description="file with the pinned host key; no trust-on-first-use")
    connect_timeout_s: float = Field(default=10, gt=0, description="ssh ConnectTimeout, real seconds (whole "
                                     "seconds are used)")


class CheckpointPolicySpec(Strict):
    """What a stop does with a job that does not checkpoint when signalled.

    `wait`: keep waiting (the checkpoint sensor's deadline ends the stop, nothing is drained).
    `requeue`: after `grace_s` requeue it anyway and record the work lost since its last checkpoint.
    """

    policy: Literal["wait", "requeue"] = Field(default="wait", description="wait: keep waiting for the "
                                               "checkpoint; requeue: requeue a silent job after grace_s")
    grace_s: float = Field(default=300, gt=0, description="policy requeue: real seconds after the checkpoint "
                           "request before a job that has not checkpointed is requeued")
    signal: Literal["USR1", "USR2"] = Field(default="USR1", description="the signal that asks a job to "
                                            "checkpoint (`scancel --signal`)")
    signal_to: Literal["full", "batch"] = Field(
        default="full", description="full: every process of the job (batch shell and steps, `scancel --full`); "
        "batch: the batch shell only (`--batch`)")
    interval_s: float = Field(default=1800, gt=0, description="the jobs' usual checkpoint cadence, real seconds, "
                              "reported with each job")


class StandinSpec(Strict):
    """The stand-in host runner (tests only: installs nothing): per-node versions in files, realistic durations."""

    speed: float = Field(default=1.0, gt=0, description="component duration_s is divided by this")
    check_s: float = Field(default=2.0, ge=0, description="real seconds a stand-in health check takes")
    initial_versions: dict[Token, Token] = Field(default_factory=dict, description="component -> version every "
                                                 "node has before the stand-in installs anything")


class DomainRuleSpec(Strict):
    """Derive domains from Slurm instead of listing them: exactly one of the three."""

    pattern: str | None = Field(default=None, description="regex over the node name with a group 'domain'")
    partition: bool = Field(default=False, description="true: a node's (first) partition is its domain")
    feature_prefix: Token | None = Field(default=None, description="e.g. 'rack-': feature rack-a1 -> domain a1")

    @field_validator("pattern")
    @classmethod
    def _regex(cls, v: str | None) -> str | None:
        if v is None:
            return v
        try:
            rx = re.compile(v)
        except re.error as exc:
            raise ValueError(f"not a valid regular expression: {exc}") from None
        if "domain" not in rx.groupindex:
            raise ValueError("needs a named group (?P<domain>...)")
        return v

    @model_validator(mode="after")
    def _one(self) -> DomainRuleSpec:
        if sum([self.pattern is not None, self.partition, self.feature_prefix is not None]) != 1:
            raise ValueError("give exactly one of 'pattern', 'partition' or 'feature_prefix'")
        return self


class SlurmSpec(Strict):
    transport: Literal["local", "ssh"] = Field(default="local", description="local: the Slurm commands run "
                                               "where Railyard runs; ssh: on the controller, over `ssh`")
    ssh: SlurmSshSpec | None = Field(default=None, description="the controller reached over SSH; required with "
                                     "transport ssh")
    slurm_conf: str | None = Field(default=None, description="SLURM_CONF for the local CLI")
    reason_prefix: Token = Field(default="railyard", description="starts Railyard's drain reasons and names its "
                                 "MAINT reservations (PREFIX_DOMAIN): how it knows its own")
    reservation_users: list[Token] = Field(default_factory=lambda: ["root"], description="the users "
                                           "who may run jobs in Railyard's MAINT reservations (`users=`)")
    stop_window_s: float = Field(default=3600, ge=60, description="expected length of one stop: the MAINT window")
    reserve_ahead: int | None = Field(default=None, ge=0, description="how many of the train's next domains to "
                                      "reserve at their expected windows; none = all of them")
    checkpoint: CheckpointPolicySpec = Field(default=CheckpointPolicySpec(), description="what a stop does "
                                             "with a job that does not checkpoint when signalled")
    runner: Literal["ssh", "standin"] = Field(
        default="ssh", description="ssh: installs and checks on the nodes over SSH (fleet.ssh: credentials, "
        "recipes' reboot, checks); standin: installs nothing, for tests only, and must be written explicitly")
    ssh_hosts: dict[Token, SshHostSpec] = Field(default_factory=dict, description="node -> SSH address/port; "
                                                "nodes not listed use ssh_address, else their NodeAddr")
    ssh_address: CommandTemplate | None = Field(default=None, description="address pattern of a node, "
                                                "e.g. '{host}.ipmi.example.com'; variables: host")
    standin: StandinSpec | None = Field(default=None, description="runner standin only: its settings; absent "
                                        "= their defaults")
    controller_wait_s: float = Field(default=120, ge=0, description="how long to ride out an unreachable slurmctld")
    command_timeout_s: float = Field(default=30, gt=0, description="real seconds one Slurm command may run; one "
                                     "that times out is retried like an unreachable slurmctld")
    domains_from: DomainRuleSpec | None = Field(default=None, description="how to derive the domains from the "
                                                "live cluster, to write into `domains` or compare with them; "
                                                "none = not derived")

    @model_validator(mode="after")
    def _ssh(self) -> SlurmSpec:
        if self.transport == "ssh" and self.ssh is None:
            raise ValueError("transport 'ssh' needs an 'ssh' section (host, key_file, known_hosts)")
        if self.runner != "standin" and self.standin is not None:
            raise ValueError("standin: only with runner: standin (the stand-in installs nothing; tests only)")
        if self.ssh_address is not None:
            from railyard.domain.recipes import template_fields

            extra = set(template_fields(self.ssh_address)) - {"host"}
            if extra:
                raise ValueError(f"ssh_address: unknown variable(s) {sorted(extra)} (only {{host}})")
        return self
