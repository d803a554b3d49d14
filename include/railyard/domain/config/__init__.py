"""The Railyard config: one YAML file, validated whole before anything is touched.

Path: `include/config/railyard.yaml` unless `RAILYARD_CONFIG` names another file.
Every problem is reported with the field path and the offending value.
"""

from __future__ import annotations

import os
import re
from datetime import date, datetime
from pathlib import Path
from typing import Annotated, Any, Literal, get_args
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import yaml
from pydantic import Field, ValidationError, WithJsonSchema, field_validator, model_validator

from railyard.domain.compat import Rule, parse_rule
from railyard.domain.config.slurm import SlurmSpec
from railyard.domain.config.ssh import SshSpec
from railyard.domain.models import Strict, Token, check_token
from railyard.domain.recipes import CommandTemplate

DEFAULT_CONFIG = Path(__file__).resolve().parents[3] / "config" / "railyard.yaml"  # include/config/


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
    name: Token = Field(description="the component's id, as releases, rules and host versions name it")
    reboot: bool = Field(default=False, description="its install needs a host reboot (ssh, slurm: "
                         "fleet.ssh.reboot_command after the installs); plans add estimates.reboot_s")
    duration_s: float = Field(default=600, gt=0, description="expected install time on the fleet clock")
    install: CommandTemplate | None = Field(default=None, description="install command template (ssh backend)")
    verify: CommandTemplate | None = Field(default=None, description="prints the installed version (ssh backend)")
    timeout_s: float = Field(default=3600, gt=0, description="real seconds one install may run on a host")
    versions: dict[Token, date] = Field(default_factory=dict, description="known versions and their release "
                                        "dates (the catalog; drift reports the age of old ones)")


class RolloutSpec(Strict):
    """canary -> staged -> fleet. A phase is promoted when its hosts are done, have soaked `soak_s`
    (fleet clock) and failed at most `max_failure_rate`; above that rate the release halts."""

    canary_domains: list[Token] = Field(default_factory=list, description="domains whose hosts make the canary "
                                        "phase; with no canary_hosts either: the first domain")
    canary_hosts: list[Token] = Field(default_factory=list, description="single hosts added to the canary phase")
    staged_fraction: float = Field(default=0.25, gt=0, lt=1, description="fraction 0..1 of the fleet the staged "
                                   "phase admits: the canary hosts, then hosts in domain order")
    soak_s: float = Field(default=3600, ge=0, description="fleet seconds a phase soaks after its last host "
                          "passed before it is promoted")
    max_failure_rate: float = Field(default=0.2, ge=0, le=1, description="fraction 0..1 of a phase's checked "
                                    "hosts that may fail; above it the release halts")
    auto_promote: bool = Field(default=True, description="promote a phase once done and soaked; false: wait for "
                               "`railyard release promote`")


class ReleaseSpec(Strict):
    id: Token = Field(description="the release's id, as trains name it")
    component: Token = Field(description="the component it changes")
    version: Token = Field(description="the version it installs")
    released: date | None = Field(default=None, description="the version's release date, for drift's ages "
                                  "(the component's versions catalog wins)")
    rollout: RolloutSpec | None = Field(default=None, description="phases; none = the whole fleet at once")


class CompatibilitySpec(Strict):
    """Rules between components (railyard.domain.compat) and the install order of coupled ones in a visit."""

    rules: list[str] = Field(default_factory=list, description="one rule a line: 'A == B', 'COND requires COND' "
                             "or 'COND conflicts COND'; a train whose plan breaks one is refused before any "
                             "host is touched")
    order: list[Token] = Field(default_factory=list, description="install order in a visit: what a `requires` "
                               "needs first, then these components in this order, then the train's order")


class JobStackSpec(Strict):
    """What jobs ship in their images (e.g. a CUDA version) and the host stack it needs."""

    name: Token = Field(description="the stack's name in drift's coverage report (e.g. cuda-12-8)")
    needs: list[str] = Field(min_length=1, description="conditions 'COMPONENT OP VERSION'")
    target: float = Field(default=0.9, gt=0, le=1, description="fleet-ready when this fraction 0..1 of "
                          "the hosts can run it")


HOSTLIST_SCHEMA = {"description": "host names, or Slurm-style ranges (gpu-a[01-08]): one, or a list",
                   "anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "minItems": 1}]}


class DomainSpec(Strict):
    name: Token = Field(description="the domain's id, as trains and canary_domains name it")
    hosts: Annotated[list[Token], WithJsonSchema(HOSTLIST_SCHEMA, mode="validation")] = Field(
        description="its hosts, or Slurm-style ranges (gpu-a[01-08]): one, or a list; a host is in one domain")
    sku: Token = Field(default="gpu", description="the capacity pool of its hosts: buffers, GPU counts and NCCL "
                       "floors are per SKU")

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


Day = Literal["mon", "tue", "wed", "thu", "fri", "sat", "sun"]
DAYS: tuple[Day, ...] = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_HHMM_RE = re.compile(r"^([01]\d|2[0-3]):[0-5]\d$|^24:00$")


def _check_tz(v: str) -> str:
    try:
        ZoneInfo(v)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown time zone {v!r} (an IANA name such as 'UTC' or 'Europe/Paris')") from None
    return v


class WindowSpec(Strict):
    """When a train may start a stop: the days a window opens, from `start` to `end` local time.

    An `end` at or before `start` closes the next day (a night window, e.g. 22:00-04:00).
    """

    days: list[Day] = Field(default_factory=lambda: list(DAYS), description="the days the window opens")
    start: str = Field(default="00:00", description="local time HH:MM the window opens")
    end: str = Field(default="24:00", description="local time HH:MM it closes; at or before start: the next day")
    timezone: str = Field(default="UTC", description="IANA time zone of start and end (e.g. Europe/Paris)")

    @field_validator("start", "end")
    @classmethod
    def _hhmm(cls, v: str) -> str:
        if not _HHMM_RE.match(v):
            raise ValueError(f"{v!r} is not a time of day HH:MM")
        return v

    @field_validator("timezone")
    @classmethod
    def _tz(cls, v: str) -> str:
        return _check_tz(v)

    @field_validator("days")
    @classmethod
    def _some_days(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError("a window needs at least one day")
        return v


class FreezeSpec(Strict):
    """Dates on which no train starts a stop (change freezes); `railyard freeze on` adds a switch."""

    dates: list[date] = Field(default_factory=list, description="days (YYYY-MM-DD) on which no train starts a "
                              "stop; emergencies still run")
    timezone: str = Field(default="UTC", description="IANA time zone the dates are days of")

    @field_validator("timezone")
    @classmethod
    def _tz(cls, v: str) -> str:
        return _check_tz(v)


class EstimatesSpec(Strict):
    """Expected fleet seconds of each part of a stop, for windows and plans (installs: per component)."""

    checkpoint_s: float = Field(default=60, ge=0, description="fleet seconds for the jobs to checkpoint")
    drain_s: float = Field(default=120, ge=0, description="fleet seconds to drain the hosts")
    reboot_s: float = Field(default=180, ge=0, description="fleet seconds of a reboot, counted when a component "
                            "installed needs one")
    check_s: float = Field(default=300, ge=0, description="fleet seconds of the deep health check")
    return_s: float = Field(default=30, ge=0, description="fleet seconds to return the hosts to service")


class EscalationSpec(Strict):
    """Where a train that stops by itself, or a domain overdue for its cycle, is escalated."""

    webhook_url: str | None = Field(default=None, description="POSTed a JSON event; also RAILYARD_WEBHOOK_URL")

    @field_validator("webhook_url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^https?://[^\s]+$", v):
            raise ValueError("not an http(s) URL (the value is not shown: it may hold a secret)")
        return v


class EmergencySpec(Strict):
    """Who may run emergency trains, beyond Airflow's own permission to trigger the DAG."""

    allowed_users: list[str] | None = Field(default=None, description="Airflow user names; None = anyone "
                                            "Airflow lets trigger railyard_emergency")


class TrainSpec(Strict):
    id: Token = Field(description="the train's id; its DAG is railyard_train_ID (a '.' becomes '_')")
    schedule: str | None = Field(default=None, description="cron expression or preset; none = manual only")
    releases: list[Token] = Field(min_length=1, description="ids of the releases it applies, at most one per "
                                  "component")
    domains: list[Token] | None = Field(default=None, description="visit order; default: every domain")
    description: str = Field(default="", description="the DAG's description; empty: 'Maintenance train ID'")
    window: WindowSpec | None = Field(default=None, description="when stops may start; default: any time")
    cycle_days: float | None = Field(default=None, gt=0, description="every domain visited at least this often")
    max_failure_fraction: float = Field(
        default=0.5, ge=0, le=1, description="the train halts when more of a run's hosts than this fail"
    )
    max_dodges: int = Field(default=1, ge=0, description="domains a run may postpone for dodging jobs")
    max_dodge_s: float = Field(default=6 * 3600, ge=0, description="how long (fleet s) a job may postpone a stop")


class BufferSpec(Strict):
    """A share of the fleet: exactly one of `hosts` or `fraction`."""

    hosts: int | None = Field(default=None, ge=0, description="a number of hosts")
    fraction: float | None = Field(default=None, ge=0, le=1, description="a fraction 0..1 of the pool's hosts, "
                                   "rounded down")

    @model_validator(mode="after")
    def _one(self) -> BufferSpec:
        if (self.hosts is None) == (self.fraction is None):
            raise ValueError("give exactly one of 'hosts' or 'fraction'")
        return self

    def host_count(self, total_hosts: int) -> int:
        return self.hosts if self.hosts is not None else int(self.fraction * total_hosts)  # type: ignore[operator]


class PoolBuffersSpec(Strict):
    maintenance: BufferSpec = Field(description="hosts the pool may have out for maintenance at once; at least "
                                    "its largest domain")
    failure: BufferSpec = Field(description="broken hosts (failed, in repair, out with no lease) the pool "
                                "tolerates; beyond it trains stop")


class BuffersSpec(PoolBuffersSpec):
    """Applied to each capacity pool (the hosts of one SKU); `by_sku` overrides a pool's buffers."""

    by_sku: dict[Token, PoolBuffersSpec] = Field(default_factory=dict, description="SKU -> buffers that replace "
                                                 "these for that pool")

    def for_sku(self, sku: str) -> PoolBuffersSpec:
        return self.by_sku.get(sku, self)


class TimeoutsSpec(Strict):
    """Real seconds each wait may last before it ends with a clear outcome."""

    capacity_wait_s: float = Field(default=3600, gt=0, description="real seconds a stop may wait for its lease "
                                   "(buffers, windows, freezes, max_domains_down); then it fails")
    checkpoint_wait_s: float = Field(default=900, gt=0, description="real seconds the jobs on a domain may take "
                                     "to checkpoint; then the stop fails, nothing drained")
    drain_s: float = Field(default=900, gt=0, description="real seconds the hosts may take to drain")
    upgrade_s: float = Field(default=3600, gt=0, description="real seconds the installs on a domain may take")
    check_s: float = Field(default=1800, gt=0, description="real seconds the deep health check may take")
    return_s: float = Field(default=900, gt=0, description="real seconds the hosts may take to serve again")
    poll_s: float = Field(default=0.5, gt=0, description="real seconds between two reads of the fleet while a "
                          "step waits in its own task; sensors and triggers use fleet.poll_s")
    fleet_outage_s: float = Field(default=600, ge=0, description="how long disruptive steps keep retrying "
                                  "while the fleet API is unreachable")


class FleetSpec(Strict):
    """`http`: a fleet manager (the simulator) at Airflow connection `connection`; `ssh`: plain hosts."""

    backend: Literal["http", "ssh", "slurm"] = Field(default="http", description="http: a fleet API (the "
                                                     "simulator is one); ssh: plain hosts; slurm: a Slurm cluster")
    connection: Token = Field(default="railyard_fleet", description="the Airflow connection of the fleet API "
                              "(backend http)")
    ssh: SshSpec | None = Field(default=None, description="hosts, credentials and checks over SSH; required "
                                "for backend ssh, and for slurm with runner ssh")
    slurm: SlurmSpec | None = Field(default=None, description="backend slurm: the cluster; absent = its "
                                    "defaults")
    poll_s: float | None = Field(
        default=None, ge=0.1, le=3600,
        description="seconds between two reads of the fleet by a waiting step (a trigger's poll, a sensor's "
                    "poke); each poll reads it once. Default: 1 for http, 10 for ssh and slurm (a read runs "
                    "sinfo/squeue on the controller or reaches the hosts)")

    @property
    def poll_interval_s(self) -> float:
        """`poll_s`, or the backend's default."""
        if self.poll_s is not None:
            return self.poll_s
        return 1.0 if self.backend == "http" else 10.0


class LedgerSpec(Strict):
    url: str | None = Field(default=None, description="SQLAlchemy URL: postgresql+psycopg2://... (postgresql:// "
                            "means the same) or sqlite:///PATH; default a SQLite file in RAILYARD_HOME; else "
                            "RAILYARD_LEDGER_URL")

    @field_validator("url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v is not None:  # (railyard.domain.urls imports SQLAlchemy: only for a config that sets a URL)
            from railyard.domain.urls import LedgerError, check_url

            try:
                check_url(v, "ledger.url", files=False)  # its folder: where it is opened
            except LedgerError as exc:
                raise ValueError(exc.detail) from None
        return v


class JobsSpec(Strict):
    count: int = Field(default=6, ge=0, description="jobs placed on the fleet at first start")
    hosts_per_job: int = Field(default=8, ge=1, description="hosts each job runs on")
    checkpoint_interval_s: float = Field(default=1800, gt=0, description="fleet seconds between a job's own "
                                         "checkpoints")
    checkpoint_duration_s: float = Field(default=60, ge=0, description="fleet seconds a requested checkpoint "
                                         "takes")


class SimulatorSpec(Strict):
    """The embedded fleet: durations are on the fleet clock, which runs `speed` times real time."""

    port: int = Field(default=8765, ge=1, le=65535, description="port of `railyard sim serve`'s fleet API, and "
                      "the CLI's fleet URL when none is given")
    speed: float = Field(default=60, gt=0, description="fleet seconds per real second")
    start_at: datetime | None = Field(default=None, description="fleet clock at first start; default: now")
    seed: int = Field(default=1, description="seed of its random draws (failures and their reasons)")
    initial_versions: dict[Token, Token] = Field(default_factory=dict, description="component -> version every "
                                                 "host has at first start")
    gpus_per_host: int = Field(default=8, ge=1, description="GPUs of each host")
    jobs: JobsSpec = Field(default=JobsSpec(), description="the training jobs it runs on the fleet")
    drain_s: float = Field(default=120, ge=0, description="fleet seconds a host takes to drain")
    check_s: float = Field(default=300, ge=0, description="fleet seconds a health check takes")
    reboot_s: float = Field(default=180, ge=0, description="fleet seconds added to an upgrade with a reboot "
                            "component (one reboot for all)")
    return_s: float = Field(default=30, ge=0, description="fleet seconds a host takes to serve again")
    upgrade_fail_rate: float = Field(default=0.0, ge=0, le=1, description="chance 0..1 that a host's upgrade "
                                     "fails at one of its installs")
    check_fail_rate: float = Field(default=0.0, ge=0, le=1, description="chance 0..1 that a health check of a "
                                   "host at its target versions fails anyway")
    host_failure_per_hour: float = Field(default=0.0, ge=0,
                                         description="random failures per serving host per fleet hour")
    repair_s: float = Field(default=3600, ge=0, description="how long a randomly failed host stays failed")


_CRON_FIELD = re.compile(r"^[0-9*/,-]+$")


def check_cron(value: str) -> str:
    """Five cron fields of digits, `*`, `/`, `,` and `-` (Airflow reads it; a typo is refused here, by name)."""
    fields = str(value).split()
    if len(fields) != 5 or not all(_CRON_FIELD.match(f) for f in fields):
        raise ValueError(f"{value!r} is not a cron schedule of five fields (e.g. '*/10 * * * *')")
    return " ".join(fields)


class SchedulesSpec(Strict):
    """How often the recovery DAGs run (cron, in UTC)."""

    reconcile: str = Field(default="*/10 * * * *", description="railyard_reconcile: finish the stops of runs "
                           "that are finished or deleted")
    repairs: str = Field(default="*/15 * * * *", description="railyard_repairs: repaired hosts through the gate")

    @field_validator("reconcile", "repairs")
    @classmethod
    def _cron(cls, v: str) -> str:
        return check_cron(v)


NotifyEvent = Literal["train_started", "train_finished", "train_stopped", "stop_done", "host_offboarded",
                      "release_promoted", "release_halted", "emergency_triggered", "escalation"]
NOTIFY_EVENTS: tuple[NotifyEvent, ...] = get_args(NotifyEvent)


class NotifyRoute(Strict):
    """Events sent to one Airflow connection, through the notifier of its type (Slack webhook, Apprise, HTTP)."""

    connection: Token = Field(description="the Airflow connection id; its type picks the notifier: slackwebhook "
                              "(apache-airflow-providers-slack), apprise (apache-airflow-providers-apprise) or "
                              "http (a JSON POST)")
    events: list[NotifyEvent] = Field(default_factory=lambda: list(NOTIFY_EVENTS), min_length=1,
                                      description="which events go there (default: every one)")


class RailyardConfig(Strict):
    components: list[ComponentSpec] = Field(description="what a host runs that a release may change (driver, "
                                            "firmware, kernel), with install and verify commands")
    releases: list[ReleaseSpec] = Field(description="a component at a version, optionally rolled out in phases")
    domains: list[DomainSpec] = Field(min_length=1, description="the maintenance domains: hosts taken out "
                                      "together, one stop each")
    trains: list[TrainSpec] = Field(min_length=1, description="one DAG each: the releases it applies and the "
                                    "domains it visits, in order")
    buffers: BuffersSpec = Field(description="the maintenance and failure budgets of each capacity pool (SKU)")
    max_domains_down: int = Field(default=1, ge=1, description="domains out at once across every train and "
                                  "emergency (the ledger never grants more)")
    pool: Token = Field(default="railyard_disruptive", description="the Airflow pool every disruptive task runs "
                        "in; create it with max_domains_down slots")
    timeouts: TimeoutsSpec = Field(default=TimeoutsSpec(), description="deadlines of each step of a stop, "
                                   "and the poll interval")
    fleet: FleetSpec = Field(default=FleetSpec(), description="the backend: an HTTP fleet API, SSH hosts or Slurm")
    ledger: LedgerSpec = Field(default=LedgerSpec(), description="the operations ledger's database")
    simulator: SimulatorSpec = Field(default=SimulatorSpec(), description="the fleet simulator's settings "
                                     "(the demo and the tests only)")
    freeze: FreezeSpec = Field(default=FreezeSpec(), description="dates on which no train starts a stop")
    estimates: EstimatesSpec = Field(default=EstimatesSpec(), description="expected durations of a stop's "
                                     "parts, for windows and plans")
    escalation: EscalationSpec = Field(default=EscalationSpec(), description="where a train that stops by "
                                       "itself, or an overdue domain, is escalated")
    emergency: EmergencySpec = Field(default=EmergencySpec(), description="who may run emergency trains")
    compatibility: CompatibilitySpec = Field(default=CompatibilitySpec(), description="rules between "
                                             "components and the install order of coupled ones")
    job_stacks: list[JobStackSpec] = Field(default_factory=list, description="what jobs ship in their images "
                                           "and the host stack it needs")
    schedules: SchedulesSpec = Field(default=SchedulesSpec(), description="how often the repair and "
                                     "reconcile DAGs run")
    notify: list[NotifyRoute] = Field(default_factory=list, description="where each event is sent (train started, "
                                      "finished, stopped; stop done; host offboarded; release promoted, halted; "
                                      "emergency triggered; escalation)")

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

        skus = {d.sku for d in self.domains}
        for sku in sorted(self.buffers.by_sku):
            if sku not in skus:
                problems.append(f"buffers.by_sku: unknown SKU {sku!r} (domains have {', '.join(sorted(skus))})")
        for sku in sorted(skus):
            pool = [d for d in self.domains if d.sku == sku]
            total = sum(len(d.hosts) for d in pool)
            maint = self.buffers.for_sku(sku).maintenance.host_count(total)
            largest = max(pool, key=lambda d: len(d.hosts))
            where = f"buffers.by_sku.{sku}.maintenance" if sku in self.buffers.by_sku else "buffers.maintenance"
            if maint < len(largest.hosts):
                problems.append(
                    f"{where}: {maint} hosts is smaller than domain {largest.name!r} "
                    f"({len(largest.hosts)} hosts); one domain must fit in the maintenance buffer"
                    + (f" of pool {sku!r}" if len(skus) > 1 else "")
                )
        problems += self._release_problems()
        if problems:
            raise ValueError("\n".join(problems))
        return self

    def _release_problems(self) -> list[str]:
        """Rules, rollouts and job stacks; a catalog that splits an `equals` pair is refused here."""
        problems: list[str] = []
        comps = {c.name for c in self.components}
        dom_ids = {d.name for d in self.domains}
        owner = self.host_domain()
        for i, text in enumerate(self.compatibility.rules):
            try:
                parse_rule(text, comps)
            except ValueError as exc:
                problems.append(f"compatibility.rules[{i}]: {exc} (value: {text!r})")
        for i, c in enumerate(self.compatibility.order):
            if c not in comps:
                problems.append(f"compatibility.order[{i}]: unknown component {c!r}")
        for i, js in enumerate(self.job_stacks):
            for j, need in enumerate(js.needs):
                try:
                    parse_rule(f"{need} requires {need}", comps)
                except ValueError as exc:
                    problems.append(f"job_stacks[{i}].needs[{j}]: {exc} (value: {need!r})")
        for i, r in enumerate(self.releases):
            if r.rollout is None:
                continue
            for j, d in enumerate(r.rollout.canary_domains):
                if d not in dom_ids:
                    problems.append(f"releases[{i}].rollout.canary_domains[{j}]: unknown domain {d!r}")
            for j, h in enumerate(r.rollout.canary_hosts):
                if h not in owner:
                    problems.append(f"releases[{i}].rollout.canary_hosts[{j}]: unknown host {h!r}")
        by_id = {r.id: r for r in self.releases}
        for rule in self.rules():
            if rule.kind != "equals":
                continue
            a, b = rule.components
            for i, t in enumerate(self.trains):
                carried = {by_id[x].component: by_id[x] for x in t.releases if x in by_id}
                ra, rb = carried.get(a), carried.get(b)
                if (ra is None) == (rb is None):
                    if ra is not None and rb is not None and ra.version != rb.version:
                        problems.append(f"trains[{i}].releases: rule {rule.text!r} would be broken: "
                                        f"{ra.id!r} sets {a}={ra.version} but {rb.id!r} sets {b}={rb.version}")
                    elif ra is not None and rb is not None and ra.rollout != rb.rollout:
                        problems.append(f"trains[{i}].releases: rule {rule.text!r} would be broken between "
                                        f"phases: {ra.id!r} and {rb.id!r} roll out differently (give both the "
                                        "same rollout)")
                    continue
                one = ra or rb
                other = b if ra is not None else a
                problems.append(f"trains[{i}].releases: rule {rule.text!r} would be broken: {one.id!r} "  # type: ignore[union-attr]
                                f"moves {one.component} to {one.version} without a release of {other!r} "  # type: ignore[union-attr]
                                "in the same train")
        return problems

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
        if not train.domains:
            return list(self.domains)
        by_name = {d.name: d for d in self.domains}  # not `domain()` per name: 1,200 domains are 720,000 looks
        return [by_name[n] for n in train.domains]

    def train_targets(self, train: TrainSpec) -> dict[str, str]:
        """component -> target version, in the order the train applies them."""
        by_id = {r.id: r for r in self.releases}
        return {by_id[r].component: by_id[r].version for r in train.releases}

    def component(self, name: str) -> ComponentSpec:
        return next(c for c in self.components if c.name == name)

    def rules(self) -> list[Rule]:
        comps = {c.name for c in self.components}
        out = []
        for text in self.compatibility.rules:
            try:
                out.append(parse_rule(text, comps))
            except ValueError:
                continue  # reported by validation
        return out

    @property
    def total_hosts(self) -> int:
        return sum(len(d.hosts) for d in self.domains)

    def host_domain(self) -> dict[str, str]:
        return {h: d.name for d in self.domains for h in d.hosts}


def config_path(path: str | os.PathLike[str] | None = None) -> Path:
    """`path`, else RAILYARD_CONFIG, else the checkout's demo config; an installed package has no config of its
    own, and refuses here rather than run on one it does not have."""
    given = path or os.environ.get("RAILYARD_CONFIG")
    if given:
        return Path(given)
    if not DEFAULT_CONFIG.is_file():
        raise ConfigError("(no config file)", [
            "no config was named: pass its path (railyard_dags('/opt/railyard/railyard.yaml'), --config FILE) "
            "or set RAILYARD_CONFIG in the environment of every Airflow component"])
    return DEFAULT_CONFIG


def _format_loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


# ---- the SSH section's checks that need the whole config (ssh/spec.py never imports this module) ----
def uses_ssh_runner(cfg: RailyardConfig) -> bool:
    """Hosts are upgraded and checked over SSH: backend ssh, or backend slurm with `runner: ssh` (its default)."""
    backend = getattr(cfg.fleet, "backend", "http")
    if backend == "ssh":
        return True
    slurm = getattr(cfg.fleet, "slurm", None)
    return backend == "slurm" and (slurm is None or slurm.runner == "ssh")


def ssh_problems(cfg: RailyardConfig) -> list[str]:
    """Checks of the SSH section that need the whole config (domains, components, SKUs)."""
    fleet = cfg.fleet
    if not uses_ssh_runner(cfg):
        return []
    backend = fleet.backend
    ssh = fleet.ssh
    if ssh is None:
        if backend == "slurm":
            return ["fleet.ssh: required when fleet.backend is 'slurm' with fleet.slurm.runner 'ssh' (the default): "
                    "credentials, checks and reboot_command for the nodes (or write runner: standin, for tests only)"]
        return ["fleet.ssh: required when fleet.backend is 'ssh'"]
    problems: list[str] = []
    owner = cfg.host_domain()
    if backend == "ssh":
        for i, d in enumerate(cfg.domains):
            for j, h in enumerate(d.hosts):
                if h not in ssh.hosts:
                    problems.append(f"domains[{i}].hosts[{j}]: host {h!r} has no entry in fleet.ssh.hosts")
    elif ssh.hosts:
        problems.append("fleet.ssh.hosts: with backend slurm, node addresses are in fleet.slurm.ssh_hosts "
                        "(or fleet.slurm.ssh_address, or each node's NodeAddr)")
    for h in ssh.hosts:
        if h not in owner:
            problems.append(f"fleet.ssh.hosts.{h}: host {h!r} is in no domain")
    released = {r.component for r in cfg.releases}
    for i, c in enumerate(cfg.components):
        if c.name in released and getattr(c, "install", None) is None:
            problems.append(f"components[{i}].install: required for the {backend} backend (component {c.name!r})")
        if c.name in released and getattr(c, "verify", None) is None:
            problems.append(f"components[{i}].verify: required for the {backend} backend (component {c.name!r})")
        if c.reboot and ssh.reboot_command is None:
            problems.append(f"components[{i}].reboot: component {c.name!r} needs a reboot, but "
                            "fleet.ssh.reboot_command is not set (a reboot is never assumed)")
    comps = {c.name for c in cfg.components}
    dc = ssh.checks.driver_component
    if "gpu_inventory" in ssh.checks.run and dc is not None and dc not in comps:
        problems.append(f"fleet.ssh.checks.driver_component: unknown component {dc!r}")
    if "nccl" in ssh.checks.run:
        for sku in sorted({d.sku for d in cfg.domains}):
            if sku not in ssh.checks.nccl_min_busbw_gbps:
                problems.append(f"fleet.ssh.checks.nccl_min_busbw_gbps: no floor for SKU {sku!r}")
    return problems


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
            elif loc in _SECRET_FIELDS:  # the message shows what it can without the secret
                problems.append(f"{loc}: {msg}")
            else:
                problems.append(f"{loc}: {msg} (value: {err['input']!r})")
        raise ConfigError(source, problems) from None


# Fields whose value may hold a password or a token: never shown in an error.
_SECRET_FIELDS = frozenset({"escalation.webhook_url", "ledger.url"})


# libyaml's safe loader: the same documents and types as yaml.safe_load, ten times faster on a fleet's
# config (1,200 domains: 0.45 s in pure Python)
_YAML_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_config(path: str | os.PathLike[str] | None = None) -> RailyardConfig:
    p = config_path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(str(p), [f"cannot read file: {exc.strerror}"]) from None
    try:
        data = yaml.load(text, Loader=_YAML_LOADER)  # a safe loader (libyaml's when present)
    except yaml.YAMLError as exc:
        raise ConfigError(str(p), [f"not valid YAML: {exc}"]) from None
    if not isinstance(data, dict):
        raise ConfigError(str(p), ["(top level): expected a mapping of sections"])
    return parse_config(data, str(p))


__all__ = ["ConfigError", "RailyardConfig", "check_token", "config_path", "load_config", "parse_config"]
