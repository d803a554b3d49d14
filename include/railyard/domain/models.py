"""Plain data of the fleet as the core sees it: hosts, jobs, steps and verdicts.

These are what every fleet adapter (simulator, HTTP fleet API, later Slurm and SSH) returns,
so the rest of the core never depends on where the fleet lives.
"""

from __future__ import annotations

import dataclasses
import re
from enum import StrEnum
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints
from pydantic.dataclasses import dataclass

TOKEN_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


def check_token(value: str) -> str:
    """A plain token: safe as a host name, version or id anywhere, shell included."""
    if not isinstance(value, str) or not TOKEN_RE.match(value):
        raise ValueError(
            f"{value!r} is not a plain token (letters, digits, '.', '_', '-'; starts with a letter "
            "or digit; at most 63 characters)"
        )
    return value


Token = Annotated[str, AfterValidator(check_token)]
# The same rule checked inside pydantic-core, with no Python call per value: for what a fleet reports
# in bulk (76,800 hosts are 230,400 names), where pydantic's own message will do.
FleetToken = Annotated[str, StringConstraints(pattern=r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,62}\z")]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class HostState(StrEnum):
    SERVING = "serving"  # in service, may run jobs
    DRAINING = "draining"  # no new jobs; running jobs are being moved off
    DRAINED = "drained"  # out of service for maintenance, empty
    UPGRADING = "upgrading"  # an upgrade is running on it
    CHECKING = "checking"  # a health check is running on it
    RETURNING = "returning"  # on its way back to service
    FAILED = "failed"  # broken by itself (counts against the failure buffer)
    REPAIR = "repair"  # offboarded to repair with a reason
    UNKNOWN = "unknown"  # never seen answering (SSH: not reached yet): not serving, so it counts, like a broken one


MAINTENANCE_STATES = frozenset(
    {HostState.DRAINING, HostState.DRAINED, HostState.UPGRADING, HostState.CHECKING, HostState.RETURNING}
)
# out of service, not by maintenance: never taken by a stop, counted against the failure buffer
BROKEN_STATES = frozenset({HostState.FAILED, HostState.REPAIR, HostState.UNKNOWN})


@dataclass(frozen=True, slots=True, kw_only=True, config=ConfigDict(extra="forbid"))
class Host:
    """A pydantic dataclass rather than a model: the whole fleet is read at every plan, drift and task that
    looks at it, and 76,800 hosts validate from JSON in half the time (bench/bench_plan.py)."""

    name: FleetToken
    domain: FleetToken
    sku: FleetToken = "gpu"
    gpus: int = 8
    state: HostState
    versions: dict[str, str] = Field(default_factory=dict)
    operation: str | None = None  # operation that took it out, if any
    reason: str | None = None  # why it is failed / in repair
    last_error: str | None = None  # last failed upgrade step, if any
    seen_at: float | None = None  # when its state and versions were last read back from the host (SSH), if known


class Job(Strict):
    id: Token
    hosts: list[str]
    gpus: int
    state: str  # running | pending | done
    last_checkpoint: float  # fleet clock, seconds
    checkpoint_requested_at: float | None = None
    checkpoint_interval: float
    dodge_until: float | None = None  # asks that its hosts not be taken before this fleet time


class Step(Strict):
    """One component to bring to one version on one host (a domain's upgrade is thousands of them: the rule is
    checked inside pydantic-core; every recipe that puts one in a command checks it again, `check_token`)."""

    component: FleetToken
    version: FleetToken


class CheckResult(Strict):
    host: str
    status: str  # pending | passed | failed
    reason: str | None = None
    versions: dict[str, str] = Field(default_factory=dict)


class Capacity(Strict):
    now: float
    total_hosts: int
    serving_hosts: int
    by_state: dict[str, int]
    domains_out: list[str]


@dataclasses.dataclass(frozen=True)
class Budget:
    """What taking a domain must respect, in hosts."""

    total_hosts: int
    maintenance_hosts: int  # maintenance buffer
    failure_hosts: int  # failure buffer
    max_domains_down: int


@dataclasses.dataclass(frozen=True)
class Decision:
    outcome: str  # granted | wait | stop
    reason: str

    @property
    def granted(self) -> bool:
        return self.outcome == "granted"
