"""`SshFleet`: the Fleet port for plain hosts reached over SSH, with no job scheduler.

Host states (serving, drained, upgrading, checking, repair...) are Railyard's own record, kept in the
ledger's database (`railyard.ledger.state`: one state store for every worker), with every transition in
`fleet_events`: the audit of which domains were out and when. Drain, return and offboard are state
changes here; upgrades and deep checks run on the hosts through an `SshRunner`, detached, and are
observed by polling when `hosts()` is read. There are no jobs: `jobs()` is empty and a checkpoint
request is answered at once.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from sqlalchemy import insert, select, update
from sqlalchemy.engine import Connection, RowMapping

from railyard.backends.hosts.port import RunnerError
from railyard.backends.ssh.runner import Connector, SshRunner, result_of
from railyard.domain.config import RailyardConfig
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
from railyard.fleet.port import FleetError
from railyard.ledger.state import Store, fleet_events, ssh_checks, ssh_hosts

log = logging.getLogger("railyard.ssh")

Row = RowMapping


UNKNOWN_RETRY_S = 30.0  # a host not reached at first sight is tried again by a worker's read at most this often


class SshFleet:
    """A `Fleet` over the hosts of `config.fleet.ssh`, driven through `runner`; state in `store`.

    `runner=None` is a reader (the Railyard page, `railyard plan`, `drift`, `ops`, `host`): it reads host
    states and versions from the database only, as the workers last read them back, and never reaches a
    host; a host no worker has seen yet is `unknown`. Only a fleet with a runner (the workers') reaches
    hosts: at first sight, to poll work in flight, and for every write."""

    def __init__(self, config: RailyardConfig, runner: SshRunner | None, store: Store | None = None,
                 *, grace_s: float = 300.0):
        ssh = config.fleet.ssh
        if ssh is None:
            raise ValueError("fleet.ssh: the ssh backend needs this section")
        self.config = config
        self.ssh = ssh
        self.runner = runner
        self.store = store or Store(config.ledger.url)
        self.grace_s = grace_s
        self.domain_of = config.host_domain()
        self.sku_of = {h: d.sku for d in config.domains for h in d.hosts}

    @classmethod
    def from_config(cls, config: RailyardConfig, connect: Connector, store: Store | None = None) -> SshFleet:
        return cls(config, SshRunner.from_config(config, connect), store)

    def __repr__(self) -> str:
        return f"SshFleet({len(self.domain_of)} hosts, state in the ledger's database)"

    @classmethod
    def reader(cls, config: RailyardConfig, store: Store | None = None) -> SshFleet:
        """A fleet that only reads the database (see the class); every write refuses."""
        return cls(config, None, store)

    @property
    def run(self) -> SshRunner:
        if self.runner is None:
            raise FleetError("this SSH fleet only reads the database (the Railyard page, plan, drift): "
                             "it never reaches a host")
        return self.runner

    def close(self) -> None:
        if self.runner is not None:
            self.runner.close()

    # ---- storage ------------------------------------------------------------------------------
    def _rows(self, names: list[str] | None) -> dict[str, Row]:
        q = select(ssh_hosts)
        if names is not None:
            q = q.where(ssh_hosts.c.name.in_(list(names)))
        with self.store.read() as c:
            return {r["name"]: r for r in c.execute(q).mappings().all()}

    @staticmethod
    def _row(c: Connection, name: str) -> Row | None:
        return c.execute(select(ssh_hosts).where(ssh_hosts.c.name == name)).mappings().first()

    def _event(self, c: Connection, name: str, from_state: str | None, to_state: str, op: str | None,
               reason: str | None) -> None:
        c.execute(insert(fleet_events).values(at=time.time(), host=name, domain=self.domain_of[name],
                                              from_state=from_state, to_state=to_state, op=op, reason=reason))

    def _set(self, c: Connection, name: str, reason_for_event: str | None = None, **fields: Any) -> None:
        row = self._row(c, name)
        if "state" in fields and (row is None or row["state"] != str(fields["state"])):
            fields.setdefault("since", time.time())
            self._event(c, name, row["state"] if row else None, str(fields["state"]),
                        fields.get("operation", row["operation"] if row else None), reason_for_event)
        c.execute(update(ssh_hosts).where(ssh_hosts.c.name == name).values(**{k: _enc(v) for k, v in fields.items()}))

    def _known(self, names: list[str]) -> list[str]:
        for n in names:
            check_token(n)
            if n not in self.domain_of:
                raise FleetError(f"unknown host {n!r}")
        return names

    # ---- observing: first sight, version refresh, polling work in flight ------------------------
    def _first_sight(self, names: list[str]) -> None:
        """Hosts never seen, and hosts not reached yet (`unknown`, tried again every UNKNOWN_RETRY_S): a host
        that answers is serving at the versions it reports; one that does not stays `unknown`, never failed
        for good (it may be this worker's route or key, not the host)."""
        known = self._rows(None)
        now = time.time()
        new = [n for n in names if n not in known or (known[n]["state"] == HostState.UNKNOWN
                                                     and now - known[n]["since"] >= UNKNOWN_RETRY_S)]
        if not new:
            return
        found = self.run.fan_out(new, self.run.versions)
        now = time.time()
        with self.store.write() as c:
            for n in new:
                row = self._row(c, n)
                if row is not None and row["state"] != HostState.UNKNOWN:
                    continue  # another worker saw it first
                v = found[n]
                if isinstance(v, dict):
                    state, reason = HostState.SERVING, None
                else:
                    state, reason = HostState.UNKNOWN, f"not reached yet: {v}"[:1000]
                values = dict(state=str(state), reason=reason, versions=json.dumps(v if isinstance(v, dict) else {}),
                              versions_at=now if isinstance(v, dict) else 0, since=now)
                if row is None:
                    c.execute(insert(ssh_hosts).values(name=n, domain=self.domain_of[n], sku=self.sku_of[n], **values))
                    self._event(c, n, None, str(state), None, reason or "first sight")
                else:
                    c.execute(update(ssh_hosts).where(ssh_hosts.c.name == n).values(**values))
                    if state != HostState.UNKNOWN:
                        self._event(c, n, str(row["state"]), str(state), None, "first answer")

    def _poll(self, rows: dict[str, Row]) -> None:
        now = time.time()
        ttl = self.ssh.versions_ttl_s
        stale = [n for n, r in rows.items() if r["state"] == HostState.SERVING and now - r["versions_at"] > ttl]
        upgrading = [n for n, r in rows.items() if r["state"] == HostState.UPGRADING]
        checking = [n for n, r in rows.items() if r["state"] == HostState.CHECKING]
        if not (stale or upgrading or checking):
            return

        def work(n: str) -> tuple[str, Any]:
            st = rows[n]["state"]
            if st == HostState.SERVING:
                return "versions", self.run.versions(n)
            if st == HostState.UPGRADING:
                return "upgrade", self._poll_upgrade(rows[n])
            return "check", self._poll_check(rows[n])

        results = self.run.fan_out(stale + upgrading + checking, work)
        with self.store.write() as c:
            for n, res in results.items():
                r = self._row(c, n)
                if r is None or r["state"] != rows[n]["state"] or r["operation"] != rows[n]["operation"]:
                    continue  # someone else moved it on meanwhile
                if isinstance(res, BaseException):
                    self._on_poll_error(c, r, res, now)
                    continue
                kind, val = res
                if kind == "versions":
                    self._set(c, n, versions=val, versions_at=now)
                elif kind == "upgrade" and val is not None:
                    self._set(c, n, "upgrade " + val["status"], state=HostState.DRAINED, versions=val["versions"],
                              versions_at=now, last_error=val.get("error"))
                elif kind == "check" and val is not None:
                    self._put_check(c, r["operation"], n, val["result"], val["verdicts"])
                    self._set(c, n, "check " + val["result"].status, state=HostState.DRAINED,
                              versions=val["result"].versions, versions_at=now)

    def _on_poll_error(self, c: Connection, r: Row, exc: BaseException, now: float) -> None:
        """A host that stops answering mid-work (a reboot) is waited for, up to its time budget."""
        log.warning("%s: poll failed: %s", r["name"], exc)
        if r["state"] == HostState.UPGRADING:
            steps = [Step.model_validate(s) for s in json.loads(r["steps"] or "[]")]
            budget = sum(self.run.components[s.component].timeout_s for s in steps) + self.grace_s
            if now - r["since"] > budget:
                self._set(c, r["name"], "upgrade lost", state=HostState.DRAINED,
                          last_error=f"no answer from the host for {budget:.0f}s during the upgrade: {exc}")
        elif r["state"] == HostState.CHECKING and now - r["since"] > self.ssh.checks.timeout_s + self.grace_s:
            self._record_check(c, r["name"], r["operation"], CheckResult(
                host=r["name"], status="failed", reason=f"health check lost: host not answering ({exc})"), [])

    def _poll_upgrade(self, r: Row) -> dict[str, Any] | None:
        name, op = r["name"], r["operation"]
        st = self.run.upgrade_state(name, op)
        if st.status == "running":
            return None
        if st.status == "idle":  # never launched, or the driver died: `tend` (a write step) launches again
            return None
        return {"status": st.status, "error": st.error, "versions": self.run.versions(name)}

    def _poll_check(self, r: Row) -> dict[str, Any] | None:
        name, op = r["name"], r["operation"]
        expected = json.loads(r["expected"] or "{}")
        v = self.run.verdicts(name, expected, op)
        if isinstance(v, str):
            return None  # running, or not started (then `tend` starts it): a read starts nothing
        verdicts, versions = v
        return {"result": result_of(name, verdicts, versions), "verdicts": [x.model_dump() for x in verdicts]}

    @staticmethod
    def _put_check(c: Connection, op: str, host: str, res: CheckResult, verdicts: list[Any]) -> None:
        vals = dict(status=res.status, reason=res.reason, versions=json.dumps(res.versions),
                    verdicts=json.dumps(verdicts), at=time.time())
        n = c.execute(update(ssh_checks).where(ssh_checks.c.op == op,
                                               ssh_checks.c.host == host).values(**vals)).rowcount
        if not n:
            c.execute(insert(ssh_checks).values(op=op, host=host, **vals))

    def _record_check(self, c: Connection, host: str, op: str, res: CheckResult, verdicts: list[Any]) -> None:
        self._put_check(c, op, host, res, verdicts)
        self._set(c, host, "check " + res.status, state=HostState.DRAINED)

    def tend(self, hosts: list[str], op: str) -> list[str]:
        """Launch again the work of `op` whose detached driver or check is not running on the host
        (never launched: a lost connection; or died: a host crash). Called by the stop's own write
        steps while they wait (`Stop._wait`), never by a read: plan, drift and polls start nothing.
        Relaunching is safe: the driver runs under `flock` and skips every step already done."""
        rows = {n: r for n, r in self._rows(self._known(list(hosts))).items() if r["operation"] == op
                and r["state"] in (HostState.UPGRADING, HostState.CHECKING)}

        def one(n: str) -> bool:
            r = rows[n]
            if r["state"] == HostState.UPGRADING:
                if self.run.upgrade_state(n, op).status != "idle":
                    return False
                self.run.upgrade(n, [Step.model_validate(x) for x in json.loads(r["steps"] or "[]")], op)
                return True
            expected = json.loads(r["expected"] or "{}")
            if self.run.verdicts(n, expected, op) not in ("idle", "none"):
                return False
            self.run.start_check(n, expected, op)
            return True

        done = self.run.fan_out(list(rows), one)
        again = sorted(n for n, v in done.items() if v is True)
        if again:
            log.warning("%s: relaunched the work of %s on %s", op, op, ", ".join(again))
        return again

    # ---- the Fleet protocol ---------------------------------------------------------------------
    def now(self) -> float:
        return time.time()

    def hosts(self, names: list[str] | None = None) -> list[Host]:
        wanted = sorted(self.domain_of) if names is None else self._known(list(names))
        if not wanted:
            return []
        if self.runner is not None:  # a worker: sees new hosts and polls work in flight; a reader only reads
            self._first_sight(wanted)
            self._poll(self._rows(wanted))
        rows = self._rows(wanted)
        out = []
        for n in wanted:
            r = rows.get(n)
            if r is None:
                sku = self.sku_of[n]
                out.append(Host(name=n, domain=self.domain_of[n], sku=sku, gpus=self.ssh.checks.gpus(sku),
                                state=HostState.UNKNOWN, reason="not seen yet by a Railyard worker"))
                continue
            out.append(Host(name=n, domain=r["domain"], sku=r["sku"], gpus=self.ssh.checks.gpus(r["sku"]),
                            state=HostState(r["state"]), versions=json.loads(r["versions"]), operation=r["operation"],
                            reason=r["reason"], last_error=r["last_error"], seen_at=r["versions_at"] or None))
        return out

    def jobs(self, hosts: list[str] | None = None) -> list[Job]:
        return []  # plain hosts: no scheduler, no jobs to checkpoint

    def request_checkpoint(self, job_ids: list[str]) -> float:
        return self.now()

    def drain(self, hosts: list[str], op: str) -> None:
        self._first_sight(self._known(list(hosts)))
        with self.store.write() as c:
            for n in hosts:
                r = self._row(c, n)
                assert r is not None  # first sight above
                if r["state"] == HostState.SERVING:
                    self._set(c, n, "drain", state=HostState.DRAINED, operation=op, last_error=None)
                elif r["operation"] != op and r["state"] in MAINTENANCE_STATES:
                    raise FleetError(f"{n} is held by operation {r['operation']!r}")

    def upgrade(self, host: str, steps: list[Step], op: str) -> None:
        self.upgrade_hosts({host: steps}, op)

    def upgrade_hosts(self, work: dict[str, list[Step]], op: str) -> None:
        """Every host's install launched at once through the runner's pool (at most `parallelism` connections
        open, each closed when its launch is done); the hosts' state is written in one transaction first."""
        self._known(list(work))
        checked = {h: self.run._check_steps(steps) for h, steps in work.items()}
        rows = self._rows(list(work))
        refused: list[FleetError] = []
        start: dict[str, list[Step]] = {}
        for host, steps in checked.items():
            r = rows.get(host)
            if r is None or r["operation"] != op or r["state"] not in (HostState.DRAINED, HostState.UPGRADING):
                state = r["state"] if r else "unknown"
                refused.append(FleetError(f"{host} is {state} (operation {r['operation'] if r else None!r}); "
                                          f"drain it under {op!r} first"))
            elif steps:
                start[host] = steps
        if start:
            with self.store.write() as c:
                for host, steps in start.items():
                    self._set(c, host, "upgrade", state=HostState.UPGRADING, steps=[s.model_dump() for s in steps],
                              last_error=None)
            self._launch(self.run.fan_out(start, lambda h: self.run.upgrade(h, start[h], op)), "upgrade", refused)
        if refused:
            raise refused[0]

    def start_check(self, host: str, expected: dict[str, str], op: str) -> CheckResult | None:
        self.start_checks({host: expected}, op)
        return self._check_row(op, host) or CheckResult(host=host, status="pending")

    def start_checks(self, expected: dict[str, dict[str, str]], op: str) -> None:
        self._known(list(expected))
        for want in expected.values():
            for c_, v in want.items():
                check_token(c_)
                check_token(v)
        rows = self._rows(list(expected))
        done = self._check_rows(op, list(expected))
        refused: list[FleetError] = []
        start: dict[str, dict[str, str]] = {}
        for host, want in expected.items():
            r = rows[host]
            if host in done or (r["state"] == HostState.CHECKING and r["operation"] == op):
                continue  # done, or running
            if r["state"] != HostState.DRAINED or r["operation"] != op:
                refused.append(FleetError(f"{host} is {r['state']} (operation {r['operation']!r}); "
                                          "only a drained host is checked"))
            else:
                start[host] = dict(want)
        if start:
            with self.store.write() as c:
                for host, want in start.items():
                    self._set(c, host, "check", state=HostState.CHECKING, expected=want)
            self._launch(self.run.fan_out(start, lambda h: self.run.start_check(h, start[h], op)), "check", refused)
        if refused:
            raise refused[0]

    @staticmethod
    def _launch(results: dict[str, Any], what: str, refused: list[FleetError]) -> None:
        """A launch that could not reach its host is tried again on the next poll (`tend`; a host that never
        answers fails by its budget); anything else is an error, raised after every host was tried."""
        for host, r in results.items():
            if isinstance(r, RunnerError):
                log.warning("%s: %s launch failed, will retry on the next poll: %s", host, what, r)
            elif isinstance(r, BaseException):
                raise r

    def _check_row(self, op: str, host: str) -> CheckResult | None:
        return self._check_rows(op, [host]).get(host)

    def _check_rows(self, op: str, hosts: list[str]) -> dict[str, CheckResult]:
        """The finished checks of `op` on `hosts`, in one query."""
        with self.store.read() as c:
            rows = c.execute(select(ssh_checks).where(ssh_checks.c.op == op, ssh_checks.c.host.in_(list(hosts)))
                             ).mappings().all()
        return {r["host"]: CheckResult(host=r["host"], status=r["status"], reason=r["reason"],
                                       versions=json.loads(r["versions"])) for r in rows}

    def check_results(self, hosts: list[str], op: str) -> list[CheckResult]:
        self.hosts(list(hosts))  # polls the checks in flight
        done = self._check_rows(op, list(hosts))
        return [done.get(h) or CheckResult(host=h, status="pending") for h in hosts]

    def check_evidence(self, host: str, op: str) -> list[dict[str, Any]]:
        """The structured verdicts of the deep check (each with its evidence)."""
        with self.store.read() as c:
            row = c.execute(select(ssh_checks.c.verdicts).where(ssh_checks.c.op == op, ssh_checks.c.host == host)
                            ).mappings().first()
        return json.loads(row["verdicts"]) if row else []

    def return_to_service(self, hosts: list[str], op: str) -> None:
        self._known(list(hosts))
        with self.store.write() as c:
            for n in hosts:
                r = self._row(c, n)
                if r is None or r["state"] == HostState.SERVING:
                    continue
                chk = c.execute(select(ssh_checks.c.status).where(ssh_checks.c.op == op, ssh_checks.c.host == n)
                                ).mappings().first()
                if r["state"] != HostState.DRAINED or r["operation"] != op or chk is None or chk["status"] != "passed":
                    raise FleetError(f"{n} cannot return: it is {r['state']} and has no passing check under {op!r}")
                self._set(c, n, "return", state=HostState.SERVING, operation=None, last_error=None)

    def offboard(self, host: str, reason: str, op: str) -> None:
        self._known([host])
        with self.store.write() as c:
            self._set(c, host, reason[:1000], state=HostState.REPAIR, operation=op, reason=reason[:1000])

    def mark_repaired(self, host: str, op: str, reason: str) -> None:
        """Someone repaired a failed, unknown or in-repair host: it waits, drained under the repair `op`, for
        the repair gate (upgrade to its targets, deep check, return). Never back in service from here."""
        self._known([host])
        self._first_sight([host])
        with self.store.write() as c:
            r = self._row(c, host)
            if r is None or r["state"] not in (HostState.REPAIR, HostState.FAILED, HostState.UNKNOWN):
                raise FleetError(f"{host} is {r['state'] if r else 'unknown'}: only a failed, unknown or in-repair "
                                 "host is marked repaired")
            if r["operation"] not in (None, op):
                raise FleetError(f"{host} is held by operation {r['operation']!r}, not {op!r}")
            self._set(c, host, f"repaired: {reason}"[:1000], state=HostState.DRAINED, operation=op, reason=None,
                      last_error=None)

    def handover(self, hosts: list[str], from_op: str, to_op: str) -> None:
        self._known(list(hosts))
        with self.store.write() as c:
            for n in hosts:
                r = self._row(c, n)
                if r is not None and r["operation"] == from_op:
                    self._set(c, n, operation=to_op)

    def capacity(self) -> Capacity:
        self._first_sight(sorted(self.domain_of))
        rows = self._rows(None)
        by_state: dict[str, int] = {}
        out: set[str] = set()
        for r in rows.values():
            by_state[r["state"]] = by_state.get(r["state"], 0) + 1
            if r["state"] in MAINTENANCE_STATES:
                out.add(r["domain"])
        return Capacity(now=self.now(), total_hosts=len(rows), serving_hosts=by_state.get(HostState.SERVING, 0),
                        by_state=by_state, domains_out=sorted(out))

    # ---- audit -----------------------------------------------------------------------------------
    def events(self) -> list[dict[str, Any]]:
        with self.store.read() as c:
            return [dict(r) for r in c.execute(select(fleet_events).where(fleet_events.c.host.in_(list(self.domain_of)))
                                               .order_by(fleet_events.c.id)).mappings()]

    def max_domains_out(self) -> int:
        """The most domains with a host out for maintenance at any instant, replayed from the events."""
        state: dict[str, str] = {}
        worst = 0
        for e in self.events():
            state[e["host"]] = e["to_state"]
            out = {self.domain_of[h] for h, s in state.items() if s in MAINTENANCE_STATES}
            worst = max(worst, len(out))
        return worst


def _enc(v: Any) -> Any:
    if isinstance(v, dict | list):
        return json.dumps(v)
    if isinstance(v, HostState):
        return str(v)
    return v


__all__ = ["SshFleet"]
