"""The Railyard config: one YAML file, validated whole before anything is touched.

Path: `include/config/railyard.yaml` unless `RAILYARD_CONFIG` names another file.
Every problem is reported with the field path and the offending value.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from railyard.models import Strict, Token, check_token
from railyard.recipes import CommandTemplate
from railyard.ssh.spec import SshSpec, ssh_problems

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "config" / "railyard.yaml"


class ConfigError(ValueError):
    """The config is invalid; `problems` lists every one as 'field: message'."""

    def __init__(self, source: str, problems: list[str]):
        self.source = source
        self.problems = problems
        super().__init__(f"invalid Railyard config {source}:\n" + "\n".join(f"  - {p}" for p in problems))


_HOSTLIST_RE = re.compile(r"^(?P<prefix>[^\[\]]*)\[(?P<lo>\d+)-(?P<hi>\d+)\](?P<suffix>[^\[\]]*)$")


def expand_hostlist(item: str) -> list[str]:
    """`gpu-a[01-08]` -> gpu-a01 .. gpu-a08 (Slurm-style, one range, zero padding kept)."""
    m = _HOSTLIST_RE.match(item)
    if not m:
        return [item]
    lo, hi = m["lo"], m["hi"]
    if int(hi) < int(lo):
        raise ValueError(f"host range {item!r} runs backwards")
    if int(hi) - int(lo) > 100_000:
        raise ValueError(f"host range {item!r} is too large")
    width = len(lo) if lo.startswith("0") else 0
    return [f"{m['prefix']}{i:0{width}d}{m['suffix']}" for i in range(int(lo), int(hi) + 1)]


class ComponentSpec(Strict):
    name: Token
    reboot: bool = False
    duration_s: float = Field(default=600, gt=0, description="expected install time on the fleet clock")
    install: CommandTemplate | None = Field(default=None, description="install command template (ssh backend)")
    verify: CommandTemplate | None = Field(default=None, description="prints the installed version (ssh backend)")
    timeout_s: float = Field(default=3600, gt=0, description="real seconds one install may run on a host")


class ReleaseSpec(Strict):
    id: Token
    component: Token
    version: Token


class DomainSpec(Strict):
    name: Token
    hosts: list[Token]
    sku: Token = "gpu"

    @field_validator("hosts", mode="before")
    @classmethod
    def _expand(cls, v: Any) -> Any:
        if isinstance(v, str):
            v = [v]
        if isinstance(v, list):
            out: list[Any] = []
            for item in v:
                out.extend(expand_hostlist(item) if isinstance(item, str) else [item])
            return out
        return v

    @field_validator("hosts")
    @classmethod
    def _not_empty(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError("a domain needs at least one host")
        return v


class TrainSpec(Strict):
    id: Token
    schedule: str | None = Field(default=None, description="cron expression or preset; none = manual only")
    releases: list[Token] = Field(min_length=1)
    domains: list[Token] | None = Field(default=None, description="visit order; default: every domain")
    description: str = ""


class BufferSpec(Strict):
    """A share of the fleet: exactly one of `hosts` or `fraction`."""

    hosts: int | None = Field(default=None, ge=0)
    fraction: float | None = Field(default=None, ge=0, le=1)

    @model_validator(mode="after")
    def _one(self) -> BufferSpec:
        if (self.hosts is None) == (self.fraction is None):
            raise ValueError("give exactly one of 'hosts' or 'fraction'")
        return self

    def host_count(self, total_hosts: int) -> int:
        return self.hosts if self.hosts is not None else int(self.fraction * total_hosts)  # type: ignore[operator]


class BuffersSpec(Strict):
    maintenance: BufferSpec
    failure: BufferSpec


class TimeoutsSpec(Strict):
    """Real seconds each wait may last before it ends with a clear outcome."""

    capacity_wait_s: float = Field(default=3600, gt=0)
    checkpoint_wait_s: float = Field(default=900, gt=0)
    drain_s: float = Field(default=900, gt=0)
    upgrade_s: float = Field(default=3600, gt=0)
    check_s: float = Field(default=1800, gt=0)
    return_s: float = Field(default=900, gt=0)
    poll_s: float = Field(default=0.5, gt=0)


class FleetSpec(Strict):
    """`http`: a fleet manager (the simulator) at Airflow connection `connection`; `ssh`: plain hosts."""

    backend: Literal["http", "ssh"] = "http"
    connection: Token = "railyard_fleet"
    ssh: SshSpec | None = None


class LedgerSpec(Strict):
    url: str | None = Field(default=None, description="SQLAlchemy URL; default sqlite file in RAILYARD_HOME")


class JobsSpec(Strict):
    count: int = Field(default=6, ge=0)
    hosts_per_job: int = Field(default=8, ge=1)
    checkpoint_interval_s: float = Field(default=1800, gt=0)
    checkpoint_duration_s: float = Field(default=60, ge=0)


class SimulatorSpec(Strict):
    """The embedded fleet: durations are on the fleet clock, which runs `speed` times real time."""

    port: int = Field(default=8765, ge=1, le=65535)
    speed: float = Field(default=60, gt=0)
    seed: int = 1
    initial_versions: dict[Token, Token] = Field(default_factory=dict)
    gpus_per_host: int = Field(default=8, ge=1)
    jobs: JobsSpec = JobsSpec()
    drain_s: float = Field(default=120, ge=0)
    check_s: float = Field(default=300, ge=0)
    reboot_s: float = Field(default=180, ge=0)
    return_s: float = Field(default=30, ge=0)
    upgrade_fail_rate: float = Field(default=0.0, ge=0, le=1)
    check_fail_rate: float = Field(default=0.0, ge=0, le=1)
    host_failure_per_hour: float = Field(default=0.0, ge=0, description="random failures per serving host per fleet hour")
    repair_s: float = Field(default=3600, ge=0, description="how long a randomly failed host stays failed")


class RailyardConfig(Strict):
    components: list[ComponentSpec]
    releases: list[ReleaseSpec]
    domains: list[DomainSpec] = Field(min_length=1)
    trains: list[TrainSpec] = Field(min_length=1)
    buffers: BuffersSpec
    max_domains_down: int = Field(default=1, ge=1)
    pool: Token = "railyard_disruptive"
    timeouts: TimeoutsSpec = TimeoutsSpec()
    fleet: FleetSpec = FleetSpec()
    ledger: LedgerSpec = LedgerSpec()
    simulator: SimulatorSpec = SimulatorSpec()

    @model_validator(mode="after")
    def _cross_checks(self) -> RailyardConfig:
        problems: list[str] = []

        def dupes(kind: str, ids: list[str]) -> None:
            seen: set[str] = set()
            for i, x in enumerate(ids):
                if x in seen:
                    problems.append(f"{kind}[{i}]: duplicate id {x!r}")
                seen.add(x)

        dupes("components", [c.name for c in self.components])
        dupes("releases", [r.id for r in self.releases])
        dupes("domains", [d.name for d in self.domains])
        dupes("trains", [t.id for t in self.trains])

        owner: dict[str, str] = {}
        for i, d in enumerate(self.domains):
            for j, h in enumerate(d.hosts):
                if h in owner and owner[h] != d.name:
                    problems.append(f"domains[{i}].hosts[{j}]: host {h!r} is already in domain {owner[h]!r}")
                elif h in owner:
                    problems.append(f"domains[{i}].hosts[{j}]: host {h!r} is listed twice")
                owner.setdefault(h, d.name)

        comps = {c.name for c in self.components}
        for i, r in enumerate(self.releases):
            if r.component not in comps:
                problems.append(f"releases[{i}].component: unknown component {r.component!r}")
        for comp in self.simulator.initial_versions:
            if comp not in comps:
                problems.append(f"simulator.initial_versions: unknown component {comp!r}")

        rel_ids = {r.id for r in self.releases}
        dom_ids = {d.name for d in self.domains}
        by_id = {r.id: r for r in self.releases}
        for i, t in enumerate(self.trains):
            seen_comp: dict[str, str] = {}
            for j, rid in enumerate(t.releases):
                if rid not in rel_ids:
                    problems.append(f"trains[{i}].releases[{j}]: unknown release {rid!r}")
                    continue
                c = by_id[rid].component
                if c in seen_comp:
                    problems.append(
                        f"trains[{i}].releases[{j}]: release {rid!r} targets component {c!r} "
                        f"already targeted by {seen_comp[c]!r}"
                    )
                seen_comp[c] = rid
            for j, dn in enumerate(t.domains or []):
                if dn not in dom_ids:
                    problems.append(f"trains[{i}].domains[{j}]: unknown domain {dn!r}")
            if t.domains is not None and len(set(t.domains)) != len(t.domains):
                problems.append(f"trains[{i}].domains: a domain is listed twice ({t.domains!r})")

        total = sum(len(d.hosts) for d in self.domains)
        maint = self.buffers.maintenance.host_count(total)
        largest = max(self.domains, key=lambda d: len(d.hosts))
        if maint < len(largest.hosts):
            problems.append(
                f"buffers.maintenance: {maint} hosts is smaller than domain {largest.name!r} "
                f"({len(largest.hosts)} hosts); one domain must fit in the maintenance buffer"
            )
        if problems:
            raise ValueError("\n".join(problems))
        return self

    @model_validator(mode="after")
    def _ssh_checks(self) -> RailyardConfig:
        problems = ssh_problems(self)
        if problems:
            raise ValueError("\n".join(problems))
        return self

    # ---- derived views -------------------------------------------------------------------
    def domain(self, name: str) -> DomainSpec:
        return next(d for d in self.domains if d.name == name)

    def train(self, train_id: str) -> TrainSpec:
        for t in self.trains:
            if t.id == train_id:
                return t
        raise KeyError(f"unknown train {train_id!r}; known: {', '.join(t.id for t in self.trains)}")

    def train_domains(self, train: TrainSpec) -> list[DomainSpec]:
        names = train.domains or [d.name for d in self.domains]
        return [self.domain(n) for n in names]

    def train_targets(self, train: TrainSpec) -> dict[str, str]:
        """component -> target version, in the order the train applies them."""
        by_id = {r.id: r for r in self.releases}
        return {by_id[r].component: by_id[r].version for r in train.releases}

    def component(self, name: str) -> ComponentSpec:
        return next(c for c in self.components if c.name == name)

    @property
    def total_hosts(self) -> int:
        return sum(len(d.hosts) for d in self.domains)

    def host_domain(self) -> dict[str, str]:
        return {h: d.name for d in self.domains for h in d.hosts}


def config_path(path: str | os.PathLike[str] | None = None) -> Path:
    return Path(path or os.environ.get("RAILYARD_CONFIG") or DEFAULT_CONFIG)


def _format_loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def parse_config(data: Any, source: str = "<config>") -> RailyardConfig:
    try:
        return RailyardConfig.model_validate(data)
    except ValidationError as exc:
        problems: list[str] = []
        for err in exc.errors():
            loc = _format_loc(tuple(err["loc"]))
            msg = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                problems.append(f"{loc}: unknown field (value: {err['input']!r})")
            elif loc == "(top level)" and err["type"] == "value_error":
                problems.extend(msg.splitlines())
            elif err["type"] == "missing":
                problems.append(f"{loc}: required field is missing")
            else:
                problems.append(f"{loc}: {msg} (value: {err['input']!r})")
        raise ConfigError(source, problems) from None


def load_config(path: str | os.PathLike[str] | None = None) -> RailyardConfig:
    p = config_path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(str(p), [f"cannot read file: {exc.strerror}"]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(str(p), [f"not valid YAML: {exc}"]) from None
    if not isinstance(data, dict):
        raise ConfigError(str(p), ["(top level): expected a mapping of sections"])
    return parse_config(data, str(p))


__all__ = ["ConfigError", "RailyardConfig", "check_token", "config_path", "load_config", "parse_config"]
