"""`SlurmFleet`: the Fleet port over a real Slurm cluster.

Reads come from `sinfo --json` / `squeue --json` (filtered here: 22.05 ignores filters with --json;
every JSON shape from 22.05 to 25.x is read by `railyard.backends.slurm.parse`) and `scontrol show
reservation -o`. Reads never change anything: `hosts()`, `jobs()`, `capacity()` and
`reservations()` run no Slurm write command, so a plan, a drift report, a dry run or a trigger's
poll is safe. Changes go through `scontrol`/`scancel` in the write methods only, each recorded by
`SlurmCli` (`cli.writes`). On-host work (upgrade, deep check) goes to a `HostRunner`: `SshRunner`
by default (the same recipes, detached installs, reboot proof and check parsers as the ssh
backend), the stand-in only when the config says `runner: standin` (tests).

Ownership: Railyard drains with the reason `<prefix> op=<op token>` and resumes only nodes whose
reason is exactly that for the operation at hand. A node drained or downed by anyone else (an admin,
NHC, another tool) is reported FAILED with their reason and never touched.

Jobs: a checkpoint request is `scancel --signal=USR1 --full JOB` (every process of the job; or
`--batch`, by config); the job proves a checkpoint by setting its own comment to
`railyard_ckpt=<epoch seconds>`. At the drain its jobs are requeued (`scontrol requeue`). With the
`requeue` policy, the stop's checkpoint step (never a read) requeues a job still without a fresh
checkpoint `grace_s` after the request, and records the work lost (`losses()`).

Health gate: a node Railyard holds stays out until it is returned here. If Slurm resumes it by itself
(it clears DRAIN after a `scontrol reboot` when the reason is unchanged), the stop's next write step
drains it again (`enforce_gate`); the domain's MAINT reservation, made when the stop starts and
deleted on return, keeps jobs off it in between.

Node features `component=version` are written on return from the versions the passing health check
read back on the host, never from a target.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
from typing import Any

from sqlalchemy import select

from railyard.backends.hosts.port import HostRunner, ReportsBusy, RunnerError
from railyard.backends.slurm import parse
from railyard.backends.slurm.commands import SlurmCli, chunks, compress_hostlist, expand_hostlist, joined
from railyard.backends.slurm.standin import StandinRunner, op_token
from railyard.domain.config import RailyardConfig
from railyard.domain.config.slurm import SlurmSpec
from railyard.domain.models import (
    MAINTENANCE_STATES,
    Capacity,
    CheckResult,
    Host,
    HostState,
    Job,
    Step,
    check_token,
)
from railyard.fleet.port import FleetError, FleetNotFound
from railyard.ledger.state import Store, put, records

log = logging.getLogger("railyard.slurm")

CKPT_RE = re.compile(r"(?:^|[\s,;])railyard_ckpt=(\d+(?:\.\d+)?)")
_BUSY = {"allocated", "mixed", "completing"}
_DEAD = {"down", "error", "fail", "future", "unknown"}
_RUNNING_JOB = {"RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "STOPPED"}  # all hold their nodes
SCANCEL_IDS = 256  # job ids per scancel
_JOB_GONE = re.compile(r"already completing or completed|Invalid job id specified")  # scancel, a job that ended
_PENDING_JOB = {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"}
STANDIN_WARNING = ("fleet.slurm.runner is 'standin': NOTHING is installed or checked on the nodes "
                   "(test stand-in); never use it on a real cluster")


def _text(value: str, limit: int = 200) -> str:
    """Free text (a check's evidence) made safe for a Slurm reason argument."""
    return re.sub(r"[^A-Za-z0-9 _.,:=/+-]", " ", value)[:limit].strip()


NODE, CKPT, RESV_GONE = "slurm_node", "slurm_ckpt", "slurm_resv_gone"  # kinds of records in the state store


def standin_runner(config: RailyardConfig, spec: SlurmSpec, store: Store) -> HostRunner:
    from railyard.domain.config.slurm import StandinSpec

    st = spec.standin or StandinSpec()
    log.warning(STANDIN_WARNING)
    durations = {c.name: c.duration_s / st.speed for c in config.components}
    return StandinRunner(store, durations=durations, check_s=st.check_s,
                         initial_versions=st.initial_versions)


def fleet_from_config(config: RailyardConfig, connect: Any = None) -> SlurmFleet:
    """The configured runner: SSH (credentials from `connect`, or fleet.ssh's user/key_file/known_hosts)
    or, only when written explicitly, the stand-in."""
    spec = config.fleet.slurm or SlurmSpec()
    store = Store(config.ledger.url)
    if spec.runner == "standin":
        return SlurmFleet(config, spec, standin_runner(config, spec, store), store=store)
    from railyard.backends.ssh.runner import Credentials, SshRunner, paramiko_connector

    ssh = config.fleet.ssh
    if ssh is None:
        raise FleetError("fleet.ssh: the slurm backend's ssh runner needs it (credentials, checks, reboot_command)")
    if connect is None:
        missing = [n for n, v in (("user", ssh.user), ("key_file", ssh.key_file), ("known_hosts", ssh.known_hosts))
                   if not v]
        if missing:
            raise FleetError(f"fleet.ssh: {', '.join(missing)} not set (or reach the nodes through the Airflow "
                             f"SSH connection {ssh.connection!r})")
        connect = paramiko_connector(Credentials(str(ssh.user), str(ssh.key_file), str(ssh.known_hosts)),
                                     connect_timeout=ssh.connect_timeout_s)
    runner = SshRunner.from_config(config, connect)
    fleet = SlurmFleet(config, spec, runner, store=store)
    runner.resolve = fleet.ssh_target
    return fleet


class SlurmFleet:
    """`runner=None` is a reader (the Railyard page, `railyard plan`, `drift`): node states from Slurm, versions
    from each node's `component=version` features (what Railyard last verified on it), and no host reached."""

    def __init__(self, config: RailyardConfig, spec: SlurmSpec, runner: HostRunner | None, *,
                 store: Store | None = None, cli: SlurmCli | None = None):
        self.config = config
        self.spec = spec
        self.runner = runner
        self.cli = cli or SlurmCli(spec)
        self.store = store or Store(config.ledger.url)  # node records, checkpoint requests, notes
        self.domain_of = config.host_domain()
        self.sku_of = {h: d.sku for d in config.domains for h in d.hosts}
        self.prefix = spec.reason_prefix
        self._addr: dict[str, str] = {}  # NodeAddr seen in the last read
        self._gpus_of: dict[str, int] = {}  # GPUs per node seen in the last sinfo (hardware: stable)
        self._versions_cache: dict[str, tuple[float, dict[str, str]]] = {}
        self._reported: set[tuple[str, str]] = set()
        self._version: tuple[int, int, int] | None = None

    @classmethod
    def reader(cls, config: RailyardConfig) -> SlurmFleet:
        """A fleet for read paths: see the class."""
        spec = config.fleet.slurm or SlurmSpec()
        return cls(config, spec, None, store=Store(config.ledger.url), cli=SlurmCli(spec, read_only=True))

    @property
    def run(self) -> HostRunner:
        if self.runner is None:
            raise FleetError("this Slurm fleet only reads (the Railyard page, plan, drift): it reaches no host")
        return self.runner

    def __repr__(self) -> str:
        return f"SlurmFleet({self.spec.transport}, {len(self.domain_of)} nodes, runner {self.spec.runner})"

    # ---- where a node is reached over SSH --------------------------------------------------------
    def ssh_target(self, host: str) -> Any:
        """`fleet.slurm.ssh_hosts`, else `ssh_address` rendered for the node, else its NodeAddr."""
        from railyard.backends.ssh.runner import Target
        from railyard.domain.recipes import render

        ssh = self.config.fleet.ssh
        assert ssh is not None
        work_dir = ssh.work_dir
        sku = self.sku_of.get(host, "gpu")
        spec = self.spec.ssh_hosts.get(host)
        if spec is not None:
            return Target(host, spec.address, spec.port, spec.work_dir or work_dir, sku)
        if self.spec.ssh_address is not None:
            return Target(host, render(self.spec.ssh_address, host=host), 22, work_dir, sku)
        if host not in self._addr:
            self._nodes()
        addr = self._addr.get(host)
        if not addr:
            raise RunnerError(f"{host}: Slurm reports no NodeAddr; set fleet.slurm.ssh_hosts or ssh_address")
        return Target(host, addr, 22, work_dir, sku)

    # ---- reasons and records ---------------------------------------------------------------------
    def reason_for(self, op: str) -> str:
        return f"{self.prefix} op={op_token(op)}"

    def _is_ours(self, node: dict[str, Any], op: str | None = None) -> bool:
        reason = parse.node_reason(node)
        if op is not None:
            return reason == self.reason_for(op)
        return re.fullmatch(rf"{re.escape(self.prefix)} op=\S+", reason) is not None

    def _record(self, host: str) -> dict[str, Any] | None:
        return self.store.get(NODE, host)

    def _set_record(self, host: str, **data: Any) -> None:
        self.store.put(NODE, host, data)

    def _set_records(self, hosts: list[str], **data: Any) -> None:
        """The same record for every host (its domain its own), in one transaction."""
        with self.store.write() as c:
            for h in hosts:
                put(c, NODE, h, {**data, "domain": self.domain_of[h]})

    def _update_records(self, hosts: dict[str, dict[str, Any]] | list[str], **data: Any) -> None:
        """Merge `data` (and, for a dict, each host's own) into each host's record, in one transaction."""
        each = hosts if isinstance(hosts, dict) else {h: {} for h in hosts}
        with self.store.write() as c:
            for h, own in each.items():
                cur = c.execute(select(records.c.data).where(records.c.kind == NODE, records.c.key == h)).first()
                put(c, NODE, h, {**(json.loads(cur[0]) if cur else {}), **data, **own})

    def _update_nodes(self, names: list[str], *args: str) -> None:
        """One `scontrol update nodename=HOSTLIST ...` for all of `names`: more only when their hostlist does not
        fit one argument (thousands of names with gaps)."""
        for nodes in chunks(names, "nodename="):
            self.cli.run("scontrol", "update", nodes, *args)

    def _drop_record(self, host: str) -> None:
        self.store.drop(NODE, host)

    def _check_hosts(self, hosts: list[str]) -> list[str]:
        for h in hosts:
            check_token(h)
            if h not in self.domain_of:
                raise FleetNotFound(f"host {h!r} is not in any configured domain")
        return list(hosts)

    # ---- reads (no Slurm write command below, until "writes") ------------------------------------
    def _nodes(self, names: list[str] | None = None) -> dict[str, dict[str, Any]]:
        """Node records (of `names` only, where the version can say so); while a restarted slurmctld still
        reports nodes `unknown` (they have not registered again yet), wait for them rather than call them
        broken."""
        deadline = time.monotonic() + self.spec.controller_wait_s
        while True:
            nodes = {name: n for n in self._sinfo(names) if (name := parse.node_name(n)) in self.domain_of}
            for name, n in nodes.items():
                addr = parse.node_address(n)
                if addr:
                    self._addr[name] = addr
            if not any(parse.node_state(n)[0] == "unknown" for n in nodes.values()) or time.monotonic() > deadline:
                return nodes
            log.info("slurmctld is recovering: nodes not registered yet; waiting")
            time.sleep(1.0)

    def slurm_version(self) -> tuple[int, int]:
        """(major, minor) of the Slurm the CLI talks to (`scontrol --version`: "slurm 23.11.4"), once."""
        major, minor, _micro = self.slurm_release()
        return major, minor

    def slurm_release(self) -> tuple[int, int, int]:
        """(major, minor, micro): "slurm 24.05.1" -> (24, 5, 1); a version without a micro reads 0."""
        if self._version is None:
            m = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", self.cli.run("scontrol", "--version"))
            if m is None:
                raise FleetError("scontrol --version: no version in its answer")
            self._version = (int(m[1]), int(m[2]), int(m[3] or 0))
        return self._version

    def _sinfo(self, names: list[str] | None = None) -> list[dict[str, Any]]:
        """One record per node, each with its own state, reason, features, GPUs and address. From 23.02 on
        `sinfo --json` groups nodes into rows that carry one node's reason and features for all of them, so
        nodes are read with `scontrol --json show nodes [HOSTLIST]` (one object per node; only the nodes
        asked for, named as one hostlist); 22.05 has no `scontrol --json`, and its `sinfo --json` prints one
        object per node, of every node: it ignores `-n` (filtered here)."""
        if self.slurm_version() >= (23, 2):
            records = []
            for hostlist in chunks(names) if names else [None]:
                argv = ["scontrol", "--json", "show", "nodes", *([hostlist] if hostlist else [])]
                records += parse.node_records(json.loads(self.cli.run(*argv)))
        else:
            records = parse.node_records(json.loads(self.cli.run("sinfo", "--json")))
        seen = {parse.node_name(n): parse.gpus_per_node(n) for n in records}
        self._gpus_of = {**self._gpus_of, **seen} if names else seen
        return records

    def _squeue(self, nodes: list[str] | None = None, ids: list[str] | None = None) -> list[dict[str, Any]]:
        """Jobs; with `nodes` (or `ids`), those Slurm says run on them (or have them as ids), asked for by hostlist
        (`--nodelist`, or `--jobs`) where `squeue --json` honours filters (24.05.1 on: SchedMD's "Fix squeue
        --json not using filtering options"). Before that it prints every job whatever it is asked: callers
        filter by the job's nodes or id themselves either way."""
        if (nodes is not None and not nodes) or (ids is not None and not ids):
            return []
        if (nodes is None and ids is None) or self.slurm_release() < (24, 5, 1):
            return list(json.loads(self.cli.run("squeue", "--json")).get("jobs", []))
        seen: dict[str, dict[str, Any]] = {}
        for arg in chunks(nodes, "--nodelist=") if nodes is not None else joined(ids or [], "--jobs="):
            for j in json.loads(self.cli.run("squeue", "--json", arg)).get("jobs", []):
                seen.setdefault(parse.job_id(j), j)
        return list(seen.values())

    def reservations(self) -> dict[str, dict[str, str]]:
        out = self.cli.run("scontrol", "show", "reservation", "-o")
        res: dict[str, dict[str, str]] = {}
        for line in out.splitlines():
            kv = dict(re.findall(r"(\w+)=(\S*)", line))
            if "ReservationName" in kv:
                res[kv["ReservationName"]] = kv
        return res

    def now(self) -> float:
        return time.time()

    def _fan(self, names: list[str], fn: Any) -> dict[str, Any]:
        fan = getattr(self.runner, "fan_out", None)
        if fan is not None:
            return dict(fan(names, fn))
        out: dict[str, Any] = {}
        for n in names:
            try:
                out[n] = fn(n)
            except Exception as exc:  # noqa: BLE001 - reported per host
                out[n] = exc
        return out

    def _features_versions(self, node: dict[str, Any] | None) -> dict[str, str]:
        """What Railyard last verified on the node: its `component=version` features."""
        comps = {c.name for c in self.config.components}
        out: dict[str, str] = {}
        for f in parse.node_active_features(node or {}) or parse.node_features(node or {}):
            c, _, v = f.partition("=")
            if c in comps and v:
                out[c] = v
        return out

    def _held_view(self, name: str, node: dict[str, Any] | None) -> dict[str, Any]:
        """Versions and upgrade state of a node this run holds (live from the host)."""
        rec = self._record(name) or {}
        op = rec.get("op")
        view: dict[str, Any] = {"versions": self.run.versions(name)}
        if op and rec.get("phase") == "held":
            view["upgrade"] = self.run.upgrade_state(name, op)
            view["busy"] = self.runner.busy(name, op) if isinstance(self.runner, ReportsBusy) else None
        return view

    def _views(self, names: list[str], nodes: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """Per node: its versions (and, when held, its upgrade state), read on the hosts side by side; a reader
        takes the versions Railyard last verified (the node's features) and reaches no host."""
        if self.runner is None:
            return {n: {"versions": self._features_versions(nodes.get(n))} for n in names}
        now = time.monotonic()
        ttl = self.config.fleet.ssh.versions_ttl_s if self.config.fleet.ssh else 0.0
        recs = self.store.all(NODE)
        held = [n for n in names if (recs.get(n) or {}).get("phase") == "held"]
        cached = {n: v for n in names if n not in held and (v := self._versions_cache.get(n)) and now - v[0] < ttl}
        ask = [n for n in names if n not in cached]
        got = self._fan(ask, lambda n: self._held_view(n, nodes.get(n)))
        out: dict[str, dict[str, Any]] = {n: {"versions": v[1]} for n, v in cached.items()}
        for n in ask:
            r: Any = got.get(n)
            if isinstance(r, BaseException):
                out[n] = {"versions": self._features_versions(nodes.get(n)), "error": r}
            else:
                out[n] = r
                if n not in held:
                    self._versions_cache[n] = (now, r["versions"])
        return out

    def _host(self, name: str, node: dict[str, Any] | None, view: dict[str, Any]) -> Host:
        domain = self.domain_of[name]
        versions = view.get("versions") or {}
        if node is None:
            return Host(name=name, domain=domain, state=HostState.FAILED, versions=versions,
                        reason="not known to Slurm")
        base, flags = parse.node_state(node)
        reason = parse.node_reason(node)
        gpus = parse.gpus_per_node(node)
        extra: dict[str, Any] = {"gpus": gpus} if gpus else {}
        rec = self._record(name)
        op = rec["op"] if rec else None
        if reason.startswith(f"{self.prefix} repair "):
            return Host(name=name, domain=domain, state=HostState.REPAIR, versions=versions, reason=reason,
                        operation=op, **extra)
        ours = self._is_ours(node)
        if (base in _DEAD or "FAIL" in flags) and not ours:  # NOT_RESPONDING alone is transient
            return Host(name=name, domain=domain, state=HostState.FAILED, versions=versions,
                        reason=f"slurm {base}{'+' + '+'.join(sorted(flags)) if flags else ''}: {reason or 'no reason'}",
                        **extra)
        if "DRAIN" in flags and not ours:
            who = parse.node_reason_user(node) or "someone else"
            self._report_foreign(name, node)
            return Host(name=name, domain=domain, state=HostState.FAILED, versions=versions,
                        reason=f"drained by {who}, not Railyard: {reason or 'no reason'}", **extra)
        if "DRAIN" in flags or (rec and rec.get("phase") == "held"):
            if base in _BUSY or "COMPLETING" in flags:
                return Host(name=name, domain=domain, state=HostState.DRAINING, versions=versions, operation=op,
                            **extra)
            state, err = HostState.DRAINED, None
            up = view.get("upgrade")
            if "error" in view and rec and rec.get("upgrade_at"):
                # the host does not answer (a reboot in progress): within its budget it is upgrading
                if time.time() - float(rec["upgrade_at"]) <= float(rec.get("budget_s", 0)):
                    state = HostState.UPGRADING
                else:
                    err = (f"no answer from the host for {rec.get('budget_s', 0):.0f}s after the upgrade: "
                           f"{view['error']}")
            elif up is not None and up.status == "running":
                state = HostState.UPGRADING
            elif up is not None and up.status == "failed":
                err = up.error or "upgrade failed"
            if view.get("busy") == "check":
                state = HostState.CHECKING
            return Host(name=name, domain=domain, state=state, versions=versions, operation=op, last_error=err,
                        **extra)
        return Host(name=name, domain=domain, state=HostState.SERVING, versions=versions, **extra)

    def _report_foreign(self, name: str, node: dict[str, Any]) -> None:
        """Once per node and reason in this process: a drain that is not Railyard's is logged, left alone."""
        reason = parse.node_reason(node)
        if (name, reason) in self._reported:
            return
        self._reported.add((name, reason))
        log.warning("%s: drained by %s, not Railyard (%r): left alone, reported, never resumed",
                    name, parse.node_reason_user(node) or "someone else", reason)

    def hosts(self, names: list[str] | None = None) -> list[Host]:
        wanted = self._check_hosts(names) if names is not None else sorted(self.domain_of)
        if not wanted:
            return []
        nodes = self._nodes(wanted if names is not None else None)
        views = self._views(wanted, nodes)
        return [self._host(n, nodes.get(n), views[n]) for n in wanted]

    def _job(self, j: dict[str, Any], gpus_of: dict[str, int]) -> Job:
        jid = parse.job_id(j)
        state = parse.job_state(j)
        kind = "running" if state in _RUNNING_JOB else "pending" if state in _PENDING_JOB else "done"
        m = CKPT_RE.search(parse.job_comment(j))
        req = self.store.get(CKPT, jid)
        hosts = expand_hostlist(parse.job_nodes(j)) if kind == "running" else []
        return Job(id=jid, hosts=hosts, gpus=parse.job_gpus(j, gpus_of) if kind == "running" else 0, state=kind,
                   last_checkpoint=float(m.group(1)) if m else 0.0,
                   checkpoint_requested_at=req["requested_at"] if req else None,
                   checkpoint_interval=self.spec.checkpoint.interval_s)

    def jobs(self, hosts: list[str] | None = None) -> list[Job]:
        """Jobs as Slurm reports them; a read: nothing is requeued here (see `requeue_silent`)."""
        want = set(self._check_hosts(hosts)) if hosts is not None else None
        queue = self._squeue(sorted(want) if want is not None else None)
        # GPUs per node (for jobs that state none) from the last node read: a poll that read the hosts
        # runs no second one; one more only for the nodes not seen yet
        nodes = {h for j in queue if parse.job_nodes(j) for h in expand_hostlist(parse.job_nodes(j))}
        if not nodes <= self._gpus_of.keys():
            self._sinfo(sorted(nodes - self._gpus_of.keys()))
        out = [self._job(j, self._gpus_of) for j in queue]
        return out if want is None else [j for j in out if want & set(j.hosts)]

    def derived_domains(self) -> dict[str, list[str]]:
        """Domains as `fleet.slurm.domains_from` derives them from the live cluster (all its nodes)."""
        from railyard.backends.slurm.domains import derive_domains

        if self.spec.domains_from is None:
            raise FleetError("fleet.slurm.domains_from is not set")
        return derive_domains(self._sinfo(), self.spec.domains_from)

    # ---- notes (what the run reports beyond the ledger) -----------------------------------------
    def _note(self, kind: str, **data: Any) -> None:
        self.store.note(kind, **data)

    def notes(self, kind: str | None = None) -> list[dict[str, Any]]:
        return self.store.notes(kind)

    def losses(self) -> list[dict[str, Any]]:
        return self.notes("checkpoint_loss")

    def capacity(self) -> Capacity:
        hosts = self.hosts()
        by_state: dict[str, int] = {}
        for h in hosts:
            by_state[h.state.value] = by_state.get(h.state.value, 0) + 1
        out = sorted({h.domain for h in hosts if h.state in MAINTENANCE_STATES})
        return Capacity(now=self.now(), total_hosts=len(hosts),
                        serving_hosts=sum(1 for h in hosts if h.state == HostState.SERVING),
                        by_state=by_state, domains_out=out)

    # ---- writes: every Slurm change below goes through self.cli.run and is recorded there --------
    def enforce_gate(self) -> dict[str, dict[str, Any]]:
        """Nodes Railyard holds that Slurm put back by itself are drained again; nodes and reservations
        it already gave back that a restarted controller brought back are given back again. Returns the
        nodes as they are afterwards."""
        nodes = self._nodes()
        self._replay_unreserve()
        resume: dict[str, str] = {}  # node -> the op that returned it
        redrain: dict[str, list[str]] = {}  # op -> its nodes
        for name, rec in sorted(self.store.all(NODE).items()):
            node = nodes.get(name)
            if not rec or node is None:
                continue
            base, flags = parse.node_state(node)
            if rec.get("phase") == "returned":
                if "DRAIN" in flags and parse.node_reason(node) == self.reason_for(rec["op"]):
                    log.warning("%s: returned by %s but drained again (a controller restart lost the resume); "
                                "resuming it again", name, rec["op"])
                    resume[name] = rec["op"]
                continue
            if rec.get("phase") != "held" or "DRAIN" in flags or base in _DEAD:
                continue
            log.warning("health gate: Slurm resumed %s by itself (%s); draining it again", name, rec["op"])
            redrain.setdefault(rec["op"], []).append(name)
        if resume:  # one command for them all, and one per operation below: never one per node
            self._update_nodes(list(resume), "state=resume")
            for name, op in resume.items():
                self._note("resume_replayed", node=name, op=op)
        for op, names in sorted(redrain.items()):
            self._update_nodes(names, "state=drain", f"reason={self.reason_for(op)}")
            for name in names:
                self._note("gate_redrain", node=name, op=op)
        return self._nodes() if resume or redrain else nodes

    def forget(self, hosts: list[str], op: str) -> list[str]:
        """`op` lets go of these nodes without returning them (someone else drained them mid-stop, or they
        failed): their record ends with the lease, so the gate never drains them again under `op` once
        their owner resumes them. Returns the nodes forgotten."""
        gone = []
        for h in self._check_hosts(hosts):
            rec = self._record(h)
            if rec and rec.get("op") == op and rec.get("phase") == "held":
                self._drop_record(h)
                self._note("forgotten", node=h, op=op)
                gone.append(h)
        return gone

    def tend(self, hosts: list[str], op: str) -> list[str]:
        """What the stop's waiting steps call every few seconds (`Stop._wait`): the health gate, so a
        drain or a resume that a restarted controller lost is put back while the stop waits."""
        self.enforce_gate()
        return []

    def requeue_grace_s(self) -> float | None:
        """`checkpoint.grace_s` under the `requeue` policy; None under `wait` (silent jobs are waited for)."""
        return self.spec.checkpoint.grace_s if self.spec.checkpoint.policy == "requeue" else None

    def requeue_silent(self, job_ids: list[str], op: str, why: str) -> list[str]:
        """The `requeue` policy, from the stop's checkpoint step: requeue jobs that stayed silent after the
        request, recording the work lost since their last checkpoint. Never called by a read."""
        now = self.now()
        silent = [job for job in self.jobs() if job.id in job_ids and job.state == "running"]
        for job in silent:
            log.warning("job %s: %s; requeued by policy (%s)", job.id, why, op)
        self._requeue([job.id for job in silent])
        for job in silent:
            lost = now - job.last_checkpoint if job.last_checkpoint else None
            self._note("checkpoint_loss", job=job.id, hosts=job.hosts, requested_at=job.checkpoint_requested_at,
                       last_checkpoint=job.last_checkpoint or None, lost_s=lost, gpus=job.gpus, op=op, why=why)
        return [job.id for job in silent]

    def _requeue(self, job_ids: list[str]) -> None:
        """`scontrol requeue J1,J2,...`: one command for the lot. Slurm tries every job and names each one it did
        not requeue; one already on its way out (pending again, completing) is no error."""
        for ids in joined(job_ids):
            try:
                self.cli.run("scontrol", "requeue", ids)
            except FleetError as exc:
                said = str(exc).removeprefix(f"scontrol requeue {ids}: ").splitlines()
                if not said or any("pending" not in line.lower() and "completing" not in line.lower()
                                   for line in said if line.strip()):
                    raise

    def request_checkpoint(self, job_ids: list[str]) -> float:
        at = self.now()
        for jid in job_ids:
            if not re.fullmatch(r"\d{1,12}", str(jid)):
                raise FleetError(f"job id {jid!r} is not a Slurm job id")
        running = {parse.job_id(j): expand_hostlist(parse.job_nodes(j))
                   for j in self._squeue(ids=[str(jid) for jid in job_ids]) if parse.job_state(j) in _RUNNING_JOB}
        scope = "--full" if self.spec.checkpoint.signal_to == "full" else "--batch"
        with self.store.write() as c:
            for jid in job_ids:
                put(c, CKPT, jid, {"requested_at": at, "nodes": running.get(jid, [])})
        signal = [jid for jid in job_ids if jid in running]
        for start in range(0, len(signal), SCANCEL_IDS):  # one scancel for every job (a few hundred at most each)
            some = signal[start:start + SCANCEL_IDS]
            try:
                self.cli.run("scancel", f"--signal={self.spec.checkpoint.signal}", scope, *some)
            except FleetError as exc:  # scancel signals every job it can and names the others
                gone = [line for line in str(exc).splitlines() if line.strip()]
                if not gone or any(not _JOB_GONE.search(line) for line in gone):
                    raise
                log.info("checkpoint request: some jobs ended meanwhile: %s", exc)
        return at

    def _clear_checkpoint_requests(self, *, jobs: frozenset[str] | set[str] = frozenset(),
                                   nodes: frozenset[str] | set[str] = frozenset()) -> None:
        """A stop's requests end with its drain or its return: a later read never acts on them again."""
        for jid, rec in self.store.all(CKPT).items():
            if jid in jobs or set(rec.get("nodes") or []) & nodes:
                self.store.drop(CKPT, jid)

    # ---- reservations ----------------------------------------------------------------------------
    def _resv_name(self, domain: str) -> str:
        return f"{self.prefix}_{check_token(domain)}"

    def reserve(self, op: str, domains: list[str]) -> None:
        """MAINT reservations: `domains[0]` from now for one stop window, each later one at its expected window.

        Backfill then places no job on them whose time limit would run into their stop; running jobs
        are left alone (`ignore_jobs`) until their stop asks them to checkpoint. A reservation made
        ahead is pulled to "now" when its own stop starts. Made by the stop once its lease is granted;
        deleted on its return, and the run's later ones by the run's end (`unreserve`).
        """
        window = self.spec.stop_window_s
        minutes = max(1, math.ceil(window / 60))
        existing = self.reservations()
        ahead = domains[1:] if self.spec.reserve_ahead is None else domains[1:1 + self.spec.reserve_ahead]
        for i, name in enumerate(domains[:1] + ahead):
            hosts = sorted(h for h, d in self.domain_of.items() if d == name)
            rname = self._resv_name(name)
            start = "now" if i == 0 else f"now+{i * minutes * 60}seconds"
            if rname not in existing:
                self.store.drop(RESV_GONE, rname)
                try:
                    self.cli.run("scontrol", "create", "reservation", f"reservationname={rname}", f"starttime={start}",
                                 f"duration={minutes}", f"nodes={compress_hostlist(hosts)}", "flags=maint,ignore_jobs",
                                 f"users={','.join(self.spec.reservation_users)}")
                except FleetError as exc:
                    others = sorted(r for r, kv in existing.items()
                                    if set(expand_hostlist(kv.get("Nodes", ""))) & set(hosts))
                    if not others:
                        raise
                    raise FleetError(f"cannot reserve {name} for maintenance: its nodes are in reservation(s) "
                                     f"{', '.join(others)} ({exc})") from None
                self._note("reservation", name=rname, op=op, start=start, minutes=minutes, nodes=hosts)
            elif i == 0 and existing[rname].get("State") != "ACTIVE":
                self.cli.run("scontrol", "update", f"reservationname={rname}", "starttime=now", f"duration={minutes}")
                self._note("reservation", name=rname, op=op, start="now", minutes=minutes, nodes=hosts)

    def unreserve(self, domains: list[str]) -> list[str]:
        """Delete Railyard's MAINT reservations of these domains (a stop's return, a run's end)."""
        existing = self.reservations()
        gone = []
        for domain in domains:
            rname = self._resv_name(domain)
            self.store.put(RESV_GONE, rname, {"until": self.now() + 2 * self.spec.stop_window_s})
            if rname in existing:
                self.cli.run("scontrol", "delete", f"reservationname={rname}")
                self._note("unreserve", name=rname)
                gone.append(rname)
        return gone

    def _replay_unreserve(self) -> None:
        """A reservation deleted on return that a restarted controller brought back is deleted again."""
        gone = {}
        for rname, rec in self.store.all(RESV_GONE).items():
            if rec["until"] > self.now():
                gone[rname] = rec
            else:
                self.store.drop(RESV_GONE, rname)
        if not gone:
            return
        for rname in set(gone) & set(self.reservations()):
            log.warning("reservation %s came back after a controller restart; deleting it again", rname)
            self.cli.run("scontrol", "delete", f"reservationname={rname}")
            self._note("unreserve_replayed", name=rname)

    # ---- drain / upgrade / check / return -------------------------------------------------------
    def drain(self, hosts: list[str], op: str) -> None:
        hosts = self._check_hosts(hosts)
        if not hosts:
            return
        nodes = self.enforce_gate()
        take: list[str] = []
        for h in hosts:
            node = nodes.get(h)
            if node is None:
                continue
            if "DRAIN" in parse.node_state(node)[1] and not self._is_ours(node, op):
                self._report_foreign(h, node)
                continue  # someone else's drain: never touched
            take.append(h)
        if take:
            self._set_records(take, op=op, phase="held", since=self.now())
            self._update_nodes(take, "state=drain", f"reason={self.reason_for(op)}")
        victims = sorted({parse.job_id(j) for j in self._squeue(take)
                          if parse.job_state(j) in _RUNNING_JOB
                          and set(expand_hostlist(parse.job_nodes(j))) & set(take)}, key=int)
        if victims:
            log.info("requeueing jobs %s off %s (%s)", ",".join(victims), ",".join(take), op)
        self._requeue(victims)  # already on its way out (completing, requeued by policy): no error
        for jid in victims:
            self._note("requeue", job=jid, op=op, nodes=take)
        self._clear_checkpoint_requests(jobs=set(victims), nodes=set(take))

    def _refusal(self, node: dict[str, Any] | None, host: str, op: str) -> FleetError | None:
        if node is None or not self._is_ours(node, op):
            return FleetError(f"{host} is not drained by {op} "
                              f"(reason: {parse.node_reason(node) if node else 'unknown node'!r})")
        return None

    def upgrade(self, host: str, steps: list[Step], op: str) -> None:
        self.upgrade_hosts({host: steps}, op)

    def upgrade_hosts(self, work: dict[str, list[Step]], op: str) -> None:
        """One read of the nodes (the health gate's) for the whole domain, then every install launched
        through the runner's pool; the first refusal is raised once every host was tried."""
        work = {h: steps for h, steps in work.items() if steps}
        self._check_hosts(list(work))
        if not work:
            return
        nodes = self.enforce_gate()
        refused: list[FleetError] = []
        ssh = self.config.fleet.ssh
        start: dict[str, list[Step]] = {}
        marks: dict[str, dict[str, Any]] = {}
        for host, steps in work.items():
            node = nodes.get(host)
            bad = self._refusal(node, host, op)
            if bad is None and node is not None and parse.node_state(node)[0] in _BUSY:
                bad = FleetError(f"{host} still runs jobs; refusing to upgrade it")
            if bad is not None:
                refused.append(bad)
                continue
            budget = sum(self.config.component(s.component).timeout_s for s in steps) + 300.0
            if ssh is not None and any(self.config.component(s.component).reboot for s in steps):
                budget += ssh.reboot_timeout_s
            marks[host] = {"upgrade_at": self.now(), "budget_s": budget}
            start[host] = steps
        if marks:
            self._update_records(marks)
        if start and isinstance(self.runner, StandinRunner):
            log.warning("%s: %s", ",".join(start), STANDIN_WARNING)
        self._launch(self._fan(list(start), lambda h: self.run.upgrade(h, start[h], op)), refused)

    def start_check(self, host: str, expected: dict[str, str], op: str) -> CheckResult | None:
        self.start_checks({host: expected}, op)
        return None

    def start_checks(self, expected: dict[str, dict[str, str]], op: str) -> None:
        self._check_hosts(list(expected))
        if not expected:
            return
        nodes = self.enforce_gate()
        verdict = {h: self._refusal(nodes.get(h), h, op) for h in expected}
        refused = [bad for bad in verdict.values() if bad is not None]
        start = [h for h, bad in verdict.items() if bad is None]
        if start and isinstance(self.runner, StandinRunner):
            log.warning("%s: %s", ",".join(start), STANDIN_WARNING)
        self._launch(self._fan(start, lambda h: self.run.start_check(h, expected[h], op)), refused)

    @staticmethod
    def _launch(results: dict[str, Any], refused: list[FleetError]) -> None:
        """The first error of a fan-out of launches (a refusal before it, first of all), once all were tried."""
        errors = [*refused, *(r for r in results.values() if isinstance(r, BaseException))]
        if errors:
            raise errors[0]

    def check_results(self, hosts: list[str], op: str) -> list[CheckResult]:
        got = self._fan(self._check_hosts(hosts), lambda h: self.run.check_result(h, op))
        return [r if isinstance(r, CheckResult) else CheckResult(host=h, status="pending", reason=f"unreachable: {r}")
                for h, r in got.items()]

    def publish_features(self, versions: dict[str, dict[str, str]], nodes: dict[str, dict[str, Any]]) -> None:
        """Write the verified versions as node features, keeping features that are not Railyard's."""
        comps = {c.name for c in self.config.components}
        same: dict[str, list[str]] = {}  # features -> the nodes that get them: one command each
        for h, found in versions.items():
            node = nodes.get(h)
            if node is None:
                continue
            current = parse.node_features(node)
            keep = [f for f in current if f and f.split("=", 1)[0] not in comps]
            feats = ",".join([*keep, *(f"{c}={found[c]}" for c in sorted(found) if c in comps)])
            if feats != ",".join(current):
                same.setdefault(feats, []).append(h)
        for feats, names in sorted(same.items()):
            self._update_nodes(names, f"availablefeatures={feats}", f"activefeatures={feats}")

    def return_to_service(self, hosts: list[str], op: str) -> None:
        """Resume the nodes this op holds, each only with a passing check; features from what it read."""
        hosts = self._check_hosts(hosts)
        nodes = self.enforce_gate()
        back: list[str] = []
        for h in hosts:
            node = nodes.get(h)
            if node is None:
                continue
            if not self._is_ours(node, op):
                rec = self._record(h)
                flags = parse.node_state(node)[1]
                if rec and rec.get("op") == op and "DRAIN" not in flags:
                    pass  # already back (an earlier attempt resumed it)
                elif "DRAIN" in flags:
                    self._note("not_returned", node=h, op=op, reason=parse.node_reason(node))
                continue
            back.append(h)
        if not back:
            return
        results = {r.host: r for r in self.check_results(back, op)}
        unproven = {h: results[h] for h in back if results[h].status != "passed"}
        if unproven:
            raise FleetError("refusing to resume without a passing health check: " + "; ".join(
                f"{h} {r.status}: {r.reason or ''}".strip() for h, r in sorted(unproven.items())))
        self._update_records(back, op=op, phase="returning", since=self.now())
        self.publish_features({h: results[h].versions for h in back}, nodes)
        self.unreserve(sorted({self.domain_of[h] for h in back}))
        self._update_nodes(back, "state=resume")
        self._clear_checkpoint_requests(nodes=set(back))
        self._set_records(back, op=op, phase="returned", since=self.now())  # kept: a controller restarted from
        for h in back:  # older state may bring the drain back
            self._versions_cache.pop(h, None)

    def offboard(self, host: str, reason: str, op: str) -> None:
        self._check_hosts([host])
        node = self.enforce_gate().get(host)
        if node is None:
            raise FleetNotFound(f"{host} is not known to Slurm")
        flags = parse.node_state(node)[1]
        if parse.node_reason(node).startswith(f"{self.prefix} repair "):
            return
        if "DRAIN" in flags and not self._is_ours(node, op):
            self._note("not_offboarded", node=host, op=op, reason=parse.node_reason(node))
            return  # someone else's drain already keeps it out; their reason stays
        self.cli.run("scontrol", "update", f"nodename={host}", "state=drain",
                     f"reason={self.prefix} repair op={op_token(op)}: {_text(reason)}")
        self._drop_record(host)

    def mark_repaired(self, host: str, op: str, reason: str) -> None:
        """Someone repaired a node Railyard sent to repair, or one that failed or was drained by someone else:
        it stays drained, now under the repair `op` (its reason Railyard's), and waits for the repair gate.
        Never resumed from here."""
        self._check_hosts([host])
        node = self.enforce_gate().get(host)
        if node is None:
            raise FleetNotFound(f"{host} is not known to Slurm")
        self.cli.run("scontrol", "update", f"nodename={host}", "state=drain", f"reason={self.reason_for(op)}")
        self._set_record(host, op=op, phase="held", domain=self.domain_of[host], since=self.now())
        self._note("repaired", node=host, op=op, reason=_text(reason))

    def handover(self, hosts: list[str], from_op: str, to_op: str) -> None:
        """Hosts drained by `from_op` pass to `to_op` without being resumed in between.

        A node `from_op` sent to repair keeps its repair reason (the evidence); only the record moves.
        """
        nodes = self.enforce_gate()
        move = []
        for h in self._check_hosts(hosts):
            node = nodes.get(h)
            reason = parse.node_reason(node) if node else ""
            if node is not None and self._is_ours(node, to_op):
                continue
            if reason.startswith(f"{self.prefix} repair op={op_token(from_op)}"):
                self._set_record(h, op=to_op, phase="repair", domain=self.domain_of[h], since=self.now())
                continue
            if node is None or not self._is_ours(node, from_op):
                raise FleetError(f"cannot hand {h} from {from_op} to {to_op}: not drained by {from_op} ({reason!r})")
            move.append(h)
        if move:
            self._set_records(move, op=to_op, phase="held", since=self.now())
            self._update_nodes(move, "state=drain", f"reason={self.reason_for(to_op)}")


__all__ = ["STANDIN_WARNING", "SlurmFleet", "fleet_from_config"]
