"""`SlurmFleet`: the Fleet port over a real Slurm cluster.

Reads come from `sinfo --json` / `squeue --json` (filtered here: 22.05 ignores filters with --json)
and `scontrol show reservation -o`; changes go through `scontrol`/`scancel`, run by `SlurmCli`
locally or on the controller over SSH. On-host work (upgrade, deep check) goes to a `HostRunner`.

Ownership: Railyard drains with the reason `<prefix> op=<op token>` and resumes only nodes whose
reason is exactly that for the operation at hand. A node drained or downed by anyone else (an admin,
NHC, another tool) is reported FAILED with their reason and never touched.

Jobs: a checkpoint request is `scancel --signal=USR1 --batch JOB`; the job proves a checkpoint by
setting its own comment to `railyard_ckpt=<epoch seconds>` (`scontrol update jobid=$SLURM_JOB_ID
comment=railyard_ckpt=$(date +%s.%N)`). At the drain its jobs are requeued (`scontrol requeue`).
With the `requeue` policy a job still without a fresh checkpoint `grace_s` after the request is
requeued anyway, and the work lost since its last checkpoint is recorded (`losses()`).

Health gate: a node Railyard holds stays out until it is returned here. If Slurm resumes it by
itself (it clears DRAIN after a `scontrol reboot` when the reason is unchanged), the next read
drains it again; the domain's MAINT reservation keeps jobs off it in between.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import time
from pathlib import Path
from typing import Any

from railyard.config import RailyardConfig
from railyard.fleet.port import FleetError, FleetNotFound
from railyard.hosts.port import HostRunner
from railyard.models import MAINTENANCE_STATES, Capacity, CheckResult, Host, HostState, Job, Step, check_token
from railyard.slurm.commands import SlurmCli, expand_hostlist
from railyard.slurm.config import SlurmSpec
from railyard.slurm.standin import StandinRunner, op_token

log = logging.getLogger("railyard.slurm")

CKPT_RE = re.compile(r"(?:^|[\s,;])railyard_ckpt=(\d+(?:\.\d+)?)")
_BUSY = {"allocated", "mixed", "completing"}
_DEAD = {"down", "error", "fail", "future", "unknown"}
_RUNNING_JOB = {"RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "STOPPED"}  # all hold their nodes
_PENDING_JOB = {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"}


def _text(value: str, limit: int = 200) -> str:
    """Free text (a check's evidence) made safe for a Slurm reason argument."""
    return re.sub(r"[^A-Za-z0-9 _.,:=/+-]", " ", value)[:limit].strip()


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _write(path: Path, data: dict) -> None:
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def runner_from_config(config: RailyardConfig, spec: SlurmSpec, state_dir: Path) -> HostRunner:
    st = spec.standin
    durations = {c.name: c.duration_s / st.speed for c in config.components}
    return StandinRunner(st.state_dir or state_dir / "standin", durations=durations, check_s=st.check_s,
                         initial_versions=st.initial_versions, fail_checks=st.fail_checks)


def fleet_from_config(config: RailyardConfig) -> SlurmFleet:
    spec = config.fleet.slurm or SlurmSpec()
    home = Path(os.environ.get("RAILYARD_HOME", ".railyard"))
    state_dir = Path(spec.state_dir) if spec.state_dir else home / "slurm"
    return SlurmFleet(config, spec, runner_from_config(config, spec, state_dir), state_dir=state_dir)


class SlurmFleet:
    def __init__(self, config: RailyardConfig, spec: SlurmSpec, runner: HostRunner, *,
                 state_dir: str | os.PathLike[str], cli: SlurmCli | None = None):
        self.config = config
        self.spec = spec
        self.runner = runner
        self.cli = cli or SlurmCli(spec)
        self.dir = Path(state_dir)
        for sub in ("nodes", "ckpt", "resv"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        self.domain_of = config.host_domain()
        self.prefix = spec.reason_prefix

    def __repr__(self) -> str:
        return f"SlurmFleet({self.spec.transport}, {len(self.domain_of)} nodes)"

    # ---- reasons and records ---------------------------------------------------------------------
    def reason_for(self, op: str) -> str:
        return f"{self.prefix} op={op_token(op)}"

    def _is_ours(self, node: dict, op: str | None = None) -> bool:
        reason = node.get("reason") or ""
        if op is not None:
            return reason == self.reason_for(op)
        return re.fullmatch(rf"{re.escape(self.prefix)} op=\S+", reason) is not None

    def _record(self, host: str) -> dict | None:
        return _read(self.dir / "nodes" / f"{host}.json")

    def _set_record(self, host: str, **data: Any) -> None:
        _write(self.dir / "nodes" / f"{host}.json", data)

    def _drop_record(self, host: str) -> None:
        (self.dir / "nodes" / f"{host}.json").unlink(missing_ok=True)

    def _check_hosts(self, hosts: list[str]) -> list[str]:
        for h in hosts:
            check_token(h)
            if h not in self.domain_of:
                raise FleetNotFound(f"host {h!r} is not in any configured domain")
        return list(hosts)

    # ---- reads ---------------------------------------------------------------------------------
    def _nodes(self) -> dict[str, dict]:
        """Node records; while a restarted slurmctld still reports nodes `unknown` (they have not
        registered again yet), wait for them rather than call them broken."""
        deadline = time.monotonic() + self.spec.controller_wait_s
        while True:
            data = json.loads(self.cli.run("sinfo", "--json"))
            nodes = {n["name"]: n for n in data.get("nodes", []) if n.get("name") in self.domain_of}
            if not any(str(n.get("state")).lower() == "unknown" for n in nodes.values()) or time.monotonic() > deadline:
                return nodes
            log.info("slurmctld is recovering: nodes not registered yet; waiting")
            time.sleep(1.0)

    def _squeue(self) -> list[dict]:
        return json.loads(self.cli.run("squeue", "--json")).get("jobs", [])

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

    def _host(self, name: str, node: dict | None) -> Host:
        domain = self.domain_of[name]
        versions = self.runner.versions(name)
        if node is None:
            return Host(name=name, domain=domain, state=HostState.FAILED, versions=versions,
                        reason="not known to Slurm")
        base = str(node.get("state", "")).lower()
        flags = {str(f).upper() for f in node.get("state_flags") or []}
        reason = node.get("reason") or ""
        rec = self._record(name)
        op = rec["op"] if rec else None
        repair = reason.startswith(f"{self.prefix} repair ")
        if repair:
            return Host(name=name, domain=domain, state=HostState.REPAIR, versions=versions, reason=reason, operation=op)
        ours = self._is_ours(node)
        if (base in _DEAD or "FAIL" in flags) and not ours:  # NOT_RESPONDING alone is transient
            return Host(name=name, domain=domain, state=HostState.FAILED, versions=versions,
                        reason=f"slurm {base}{'+' + '+'.join(sorted(flags)) if flags else ''}: {reason or 'no reason'}")
        if "DRAIN" in flags and not ours:
            who = node.get("reason_set_by_user") or "someone else"
            self._report_foreign(name, node)
            return Host(name=name, domain=domain, state=HostState.FAILED, versions=versions,
                        reason=f"drained by {who}, not Railyard: {reason or 'no reason'}")
        if "DRAIN" in flags or (rec and rec.get("phase") == "held"):
            if base in _BUSY or "COMPLETING" in flags:
                return Host(name=name, domain=domain, state=HostState.DRAINING, versions=versions, operation=op)
            state, err = HostState.DRAINED, None
            if rec:
                up = self.runner.upgrade_state(name, op)
                if up.status == "running":
                    state = HostState.UPGRADING
                elif up.status == "failed":
                    err = up.error or "upgrade failed"
                busy = self.runner.busy(name, op) if hasattr(self.runner, "busy") else None
                if busy == "check":
                    state = HostState.CHECKING
            return Host(name=name, domain=domain, state=state, versions=versions, operation=op, last_error=err)
        return Host(name=name, domain=domain, state=HostState.SERVING, versions=versions)

    def _report_foreign(self, name: str, node: dict) -> None:
        """Once per node and reason: a drain that is not Railyard's is reported, and left alone."""
        key = self.dir / "nodes" / f"{name}.foreign"
        reason = node.get("reason") or ""
        if key.exists() and key.read_text() == reason:
            return
        key.write_text(reason)
        self._note("foreign_drain", node=name, reason=reason, by=node.get("reason_set_by_user"))
        log.warning("%s: drained by %s, not Railyard (%r): left alone, reported, never resumed",
                    name, node.get("reason_set_by_user") or "someone else", reason)

    def _gate(self, nodes: dict[str, dict]) -> None:
        """Nodes Railyard holds that Slurm put back by itself are drained again at once; nodes and
        reservations it already gave back that a restarted controller brought back are given back again."""
        self._replay_unreserve()
        for f in sorted((self.dir / "nodes").glob("*.json")):
            rec = _read(f)
            name = f.stem
            node = nodes.get(name)
            if rec and rec.get("phase") == "returned" and node is not None:
                flags = {str(x).upper() for x in node.get("state_flags") or []}
                if "DRAIN" in flags and node.get("reason") == self.reason_for(rec["op"]):
                    log.warning("%s: returned by %s but drained again (a controller restart lost the resume); "
                                "resuming it again", name, rec["op"])
                    self.cli.run("scontrol", "update", f"nodename={name}", "state=resume")
                    self._note("resume_replayed", node=name, op=rec["op"])
                    node["state_flags"] = [x for x in node.get("state_flags", []) if str(x).upper() != "DRAIN"]
                    node["reason"] = ""
                continue
            if not rec or rec.get("phase") != "held" or node is None:
                continue
            flags = {str(x).upper() for x in node.get("state_flags") or []}
            if "DRAIN" in flags or str(node.get("state", "")).lower() in _DEAD:
                continue
            log.warning("health gate: Slurm resumed %s by itself (%s); draining it again", name, rec["op"])
            self.cli.run("scontrol", "update", f"nodename={name}", "state=drain", f"reason={self.reason_for(rec['op'])}")
            self._note("gate_redrain", node=name, op=rec["op"])
            node["state_flags"] = [*node.get("state_flags", []), "DRAIN"]
            node["reason"] = self.reason_for(rec["op"])

    def hosts(self, names: list[str] | None = None) -> list[Host]:
        wanted = self._check_hosts(names) if names is not None else sorted(self.domain_of)
        if not wanted:
            return []
        nodes = self._nodes()
        self._gate(nodes)
        return [self._host(n, nodes.get(n)) for n in wanted]

    def _job(self, j: dict, now: float) -> Job:
        jid = str(j["job_id"])
        state = str(j.get("job_state", "")).upper()
        kind = "running" if state in _RUNNING_JOB else "pending" if state in _PENDING_JOB else "done"
        m = CKPT_RE.search(j.get("comment") or "")
        req = _read(self.dir / "ckpt" / f"{jid}.json")
        hosts = expand_hostlist(j.get("nodes") or "") if kind == "running" else []
        return Job(id=jid, hosts=hosts, gpus=8 * max(1, int(j.get("node_count") or 1)), state=kind,
                   last_checkpoint=float(m.group(1)) if m else 0.0,
                   checkpoint_requested_at=req["requested_at"] if req else None,
                   checkpoint_interval=self.spec.checkpoint.interval_s)

    def jobs(self, hosts: list[str] | None = None) -> list[Job]:
        now = self.now()
        out = [self._job(j, now) for j in self._squeue()]
        if self.spec.checkpoint.policy == "requeue":
            out = [self._enforce_policy(j, now) for j in out]
        if hosts is None:
            return out
        want = set(self._check_hosts(hosts))
        return [j for j in out if want & set(j.hosts)]

    def _enforce_policy(self, job: Job, now: float) -> Job:
        """Policy `requeue`: a job silent for `grace_s` after the request is requeued; the loss is recorded."""
        req = job.checkpoint_requested_at
        if job.state != "running" or req is None or job.last_checkpoint >= req or now - req < self.spec.checkpoint.grace_s:
            return job
        lost = now - job.last_checkpoint if job.last_checkpoint else None
        log.warning("job %s: no checkpoint %.0fs after the request; requeued by policy", job.id, now - req)
        self.cli.run("scontrol", "requeue", job.id)
        self._note("checkpoint_loss", job=job.id, hosts=job.hosts, requested_at=req,
                   last_checkpoint=job.last_checkpoint or None, lost_s=lost,
                   why=f"no checkpoint {self.spec.checkpoint.grace_s:.0f}s after the request; requeued by policy")
        return job.model_copy(update={"state": "pending", "hosts": []})

    def derived_domains(self) -> dict[str, list[str]]:
        """Domains as `fleet.slurm.domains_from` derives them from the live cluster (all its nodes)."""
        from railyard.slurm.domains import derive_domains

        if self.spec.domains_from is None:
            raise FleetError("fleet.slurm.domains_from is not set")
        return derive_domains(json.loads(self.cli.run("sinfo", "--json")).get("nodes", []), self.spec.domains_from)

    # ---- notes (what the run reports beyond the ledger) -----------------------------------------
    def _note(self, kind: str, **data: Any) -> None:
        with (self.dir / "notes.jsonl").open("a") as f:
            f.write(json.dumps({"at": self.now(), "kind": kind, **data}) + "\n")

    def notes(self, kind: str | None = None) -> list[dict]:
        p = self.dir / "notes.jsonl"
        rows = [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []
        return [r for r in rows if kind is None or r["kind"] == kind]

    def losses(self) -> list[dict]:
        return self.notes("checkpoint_loss")

    # ---- checkpoints ---------------------------------------------------------------------------
    def request_checkpoint(self, job_ids: list[str]) -> float:
        at = self.now()
        running = {str(j["job_id"]) for j in self._squeue() if str(j.get("job_state")).upper() in _RUNNING_JOB}
        for jid in job_ids:
            if not re.fullmatch(r"\d{1,12}", str(jid)):
                raise FleetError(f"job id {jid!r} is not a Slurm job id")
            _write(self.dir / "ckpt" / f"{jid}.json", {"requested_at": at})
            if jid in running:
                self.cli.run("scancel", f"--signal={self.spec.checkpoint.signal}", "--batch", jid)
        return at

    # ---- reservations ----------------------------------------------------------------------------
    def _resv_name(self, domain: str) -> str:
        return f"{self.prefix}_{check_token(domain)}"

    def _train_domains(self, op: str) -> list[str]:
        """This domain and the ones the train visits after it, from an op id `train/run/domain`."""
        parts = op.split("/")
        if len(parts) < 3:
            return []
        try:
            order = [d.name for d in self.config.train_domains(self.config.train(parts[0]))]
        except (KeyError, StopIteration):
            return []
        return order[order.index(parts[-1]):] if parts[-1] in order else []

    def reserve(self, op: str, domains: list[str]) -> None:
        """MAINT reservations: `domains[0]` from now for one stop window, each later one at its expected window.

        Backfill then places no job on them whose time limit would run into their stop; running jobs
        are left alone (`ignore_jobs`) until their stop asks them to checkpoint. A reservation made
        ahead is pulled to "now" when its own stop starts.
        """
        window = self.spec.stop_window_s
        minutes = max(1, math.ceil(window / 60))
        existing = self.reservations()
        ahead = domains[1:] if self.spec.reserve_ahead is None else domains[1:1 + self.spec.reserve_ahead]
        for i, name in enumerate(domains[:1] + ahead):
            hosts = [h for h, d in self.domain_of.items() if d == name]
            rname = self._resv_name(name)
            start = "now" if i == 0 else f"now+{i * minutes * 60}seconds"
            if rname not in existing:
                (self.dir / "resv" / f"{rname}.json").unlink(missing_ok=True)
                self.cli.run("scontrol", "create", "reservation", f"reservationname={rname}", f"starttime={start}",
                             f"duration={minutes}", f"nodes={','.join(sorted(hosts))}", "flags=maint,ignore_jobs",
                             f"users={','.join(self.spec.reservation_users)}")
                self._note("reservation", name=rname, op=op, start=start, minutes=minutes, nodes=sorted(hosts))
            elif i == 0 and existing[rname].get("State") != "ACTIVE":
                self.cli.run("scontrol", "update", f"reservationname={rname}", "starttime=now", f"duration={minutes}")
                self._note("reservation", name=rname, op=op, start="now", minutes=minutes, nodes=sorted(hosts))

    def _unreserve(self, domain: str) -> None:
        rname = self._resv_name(domain)
        (self.dir / "resv").mkdir(exist_ok=True)
        _write(self.dir / "resv" / f"{rname}.json", {"until": self.now() + 2 * self.spec.stop_window_s})
        if rname in self.reservations():
            self.cli.run("scontrol", "delete", f"reservationname={rname}")
            self._note("unreserve", name=rname)

    def _replay_unreserve(self) -> None:
        """A reservation deleted on return that a restarted controller brought back is deleted again."""
        gone = {}
        for f in (self.dir / "resv").glob("*.json") if (self.dir / "resv").exists() else []:
            rec = _read(f)
            if rec and rec["until"] > self.now():
                gone[f.stem] = rec
            else:
                f.unlink(missing_ok=True)
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
        nodes = self._nodes()
        take: list[str] = []
        for h in hosts:
            node = nodes.get(h)
            if node is None:
                continue
            flags = {str(x).upper() for x in node.get("state_flags") or []}
            if "DRAIN" in flags and not self._is_ours(node, op):
                self._report_foreign(h, node)
                continue  # someone else's drain: never touched
            self._set_record(h, op=op, phase="held", domain=self.domain_of[h], since=self.now())
            take.append(h)
        domains = self._train_domains(op)
        if domains:
            self.reserve(op, domains)
        if take:
            self.cli.run("scontrol", "update", f"nodename={','.join(take)}", "state=drain",
                         f"reason={self.reason_for(op)}")
        victims = sorted({str(j["job_id"]) for j in self._squeue()
                          if str(j.get("job_state")).upper() in _RUNNING_JOB
                          and set(expand_hostlist(j.get("nodes") or "")) & set(take)})
        for jid in victims:
            log.info("requeueing job %s off %s (%s)", jid, ",".join(take), op)
            try:
                self.cli.run("scontrol", "requeue", jid)
            except FleetError as exc:  # already on its way out (completing, requeued by policy)
                if "pending" not in str(exc).lower() and "completing" not in str(exc).lower():
                    raise
            self._note("requeue", job=jid, op=op, nodes=take)

    def _require_ours(self, host: str, op: str) -> dict:
        node = self._nodes().get(host)
        if node is None or not self._is_ours(node, op):
            raise FleetError(f"{host} is not drained by {op} (reason: {node.get('reason') if node else 'unknown node'!r})")
        return node

    def upgrade(self, host: str, steps: list[Step], op: str) -> None:
        self._check_hosts([host])
        if not steps:
            return
        node = self._require_ours(host, op)
        if str(node.get("state", "")).lower() in _BUSY:
            raise FleetError(f"{host} still runs jobs; refusing to upgrade it")
        self.runner.upgrade(host, steps, op)

    def start_check(self, host: str, expected: dict[str, str], op: str) -> CheckResult | None:
        self._check_hosts([host])
        self._require_ours(host, op)
        self.runner.start_check(host, expected, op)
        return None

    def check_results(self, hosts: list[str], op: str) -> list[CheckResult]:
        return [self.runner.check_result(h, op) for h in self._check_hosts(hosts)]

    def features_for(self, host: str) -> str:
        """`component=version` for every component: jobs ask for them with --constraint."""
        versions = self.runner.versions(host)
        return ",".join(f"{c}={versions[c]}" for c in sorted(versions))

    def publish_features(self, hosts: list[str]) -> None:
        """Write versions as node features, keeping features that are not Railyard's."""
        nodes = self._nodes()
        comps = {c.name for c in self.config.components}
        for h in self._check_hosts(hosts):
            node = nodes.get(h)
            if node is None:
                continue
            keep = [f for f in (node.get("features") or "").split(",") if f and f.split("=", 1)[0] not in comps]
            feats = ",".join([*keep, *(x for x in self.features_for(h).split(",") if x)])
            if feats != (node.get("features") or ""):
                self.cli.run("scontrol", "update", f"nodename={h}", f"availablefeatures={feats}",
                             f"activefeatures={feats}")

    def return_to_service(self, hosts: list[str], op: str) -> None:
        hosts = self._check_hosts(hosts)
        nodes = self._nodes()
        back: list[str] = []
        for h in hosts:
            node = nodes.get(h)
            if node is None:
                continue
            if not self._is_ours(node, op):
                rec = self._record(h)
                flags = {str(x).upper() for x in node.get("state_flags") or []}
                if rec and rec.get("op") == op and "DRAIN" not in flags:
                    pass  # already back (an earlier attempt resumed it)
                elif "DRAIN" in flags:
                    self._note("not_returned", node=h, op=op, reason=node.get("reason"))
                continue
            self._set_record(h, op=op, phase="returning", domain=self.domain_of[h], since=self.now())
            back.append(h)
        if not back:
            return
        self.publish_features(back)
        for domain in sorted({self.domain_of[h] for h in back}):
            self._unreserve(domain)
        self.cli.run("scontrol", "update", f"nodename={','.join(back)}", "state=resume")
        for h in back:  # kept: a controller restarted from older state may bring the drain back
            self._set_record(h, op=op, phase="returned", domain=self.domain_of[h], since=self.now())

    def offboard(self, host: str, reason: str, op: str) -> None:
        self._check_hosts([host])
        node = self._nodes().get(host)
        if node is None:
            raise FleetNotFound(f"{host} is not known to Slurm")
        flags = {str(x).upper() for x in node.get("state_flags") or []}
        if (node.get("reason") or "").startswith(f"{self.prefix} repair "):
            return
        if "DRAIN" in flags and not self._is_ours(node, op):
            self._note("not_offboarded", node=host, op=op, reason=node.get("reason"))
            return  # someone else's drain already keeps it out; their reason stays
        self.cli.run("scontrol", "update", f"nodename={host}", "state=drain",
                     f"reason={self.prefix} repair op={op_token(op)}: {_text(reason)}")
        self._drop_record(host)

    def handover(self, hosts: list[str], from_op: str, to_op: str) -> None:
        """Hosts drained by `from_op` pass to `to_op` without being resumed in between.

        A node `from_op` sent to repair keeps its repair reason (the evidence); only the record moves.
        """
        nodes = self._nodes()
        move = []
        for h in self._check_hosts(hosts):
            node = nodes.get(h)
            reason = (node or {}).get("reason") or ""
            if node is not None and self._is_ours(node, to_op):
                continue
            if reason.startswith(f"{self.prefix} repair op={op_token(from_op)}"):
                self._set_record(h, op=to_op, phase="repair", domain=self.domain_of[h], since=self.now())
                continue
            if node is None or not self._is_ours(node, from_op):
                raise FleetError(f"cannot hand {h} from {from_op} to {to_op}: not drained by {from_op} ({reason!r})")
            move.append(h)
        for h in move:
            self._set_record(h, op=to_op, phase="held", domain=self.domain_of[h], since=self.now())
        if move:
            self.cli.run("scontrol", "update", f"nodename={','.join(move)}", "state=drain",
                         f"reason={self.reason_for(to_op)}")

    def capacity(self) -> Capacity:
        hosts = self.hosts()
        by_state: dict[str, int] = {}
        for h in hosts:
            by_state[h.state.value] = by_state.get(h.state.value, 0) + 1
        out = sorted({h.domain for h in hosts if h.state in MAINTENANCE_STATES})
        return Capacity(now=self.now(), total_hosts=len(hosts),
                        serving_hosts=sum(1 for h in hosts if h.state == HostState.SERVING),
                        by_state=by_state, domains_out=out)


__all__ = ["SlurmFleet", "fleet_from_config"]
