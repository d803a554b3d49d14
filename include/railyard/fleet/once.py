"""`ReadOnce`: a Fleet that reads the fleet behind it at most once, for one poll of a wait.

A capacity or checkpoint wait asks the fleet several questions per poll (the clock, the domain's
hosts, the whole fleet's broken hosts, the jobs on the domain, a release gate's view of every host).
Against the simulator each is one cheap HTTP call; against Slurm each is `sinfo`/`squeue` on the
controller and against SSH a look at the hosts. Wrapped in a `ReadOnce` for the length of one poll,
every question is answered from one `hosts()` of the whole fleet, one `jobs()` and one `now()`.
Writes go through to the fleet and forget what was read, so nothing is ever answered from before a
change made through this wrapper. Anything else (`tend`, `reserve`, `requeue_silent`...) is the
wrapped fleet's own.
"""

from __future__ import annotations

from typing import Any

from railyard.domain.models import Capacity, CheckResult, Host, Job, Step
from railyard.fleet.port import Fleet, FleetNotFound


class ReadOnce:
    """One read of `fleet` (hosts, jobs, clock), however many times it is asked; see the module docs."""

    def __init__(self, fleet: Fleet):
        self.fleet = fleet
        self._now: float | None = None
        self._hosts: dict[str, Host] | None = None
        self._jobs: list[Job] | None = None

    def __repr__(self) -> str:
        return f"ReadOnce({self.fleet!r})"

    def __getattr__(self, name: str) -> Any:  # what the Fleet protocol does not name: the fleet's own
        if name == "fleet":  # not set yet (a copy being made): no recursion
            raise AttributeError(name)
        return getattr(self.fleet, name)

    def forget(self) -> None:
        self._now, self._hosts, self._jobs = None, None, None

    # ---- reads: once each --------------------------------------------------------------------
    def now(self) -> float:
        if self._now is None:
            self._now = self.fleet.now()
        return self._now

    def hosts(self, names: list[str] | None = None) -> list[Host]:
        if self._hosts is None:
            self._hosts = {h.name: h for h in self.fleet.hosts()}
        if names is None:
            return list(self._hosts.values())
        missing = [n for n in names if n not in self._hosts]
        if missing:
            raise FleetNotFound(f"unknown host {missing[0]!r}")
        return [self._hosts[n] for n in names]

    def jobs(self, hosts: list[str] | None = None) -> list[Job]:
        if self._jobs is None:
            self._jobs = list(self.fleet.jobs())
        if hosts is None:
            return list(self._jobs)
        wanted = set(hosts)
        return [j for j in self._jobs if wanted.intersection(j.hosts)]

    def capacity(self) -> Capacity:
        return self.fleet.capacity()

    def check_results(self, hosts: list[str], op: str) -> list[CheckResult]:
        return self.fleet.check_results(hosts, op)

    # ---- writes: through, and what was read is forgotten -----------------------------------------
    def request_checkpoint(self, job_ids: list[str]) -> float:
        self.forget()
        return self.fleet.request_checkpoint(job_ids)

    def drain(self, hosts: list[str], op: str) -> None:
        self.forget()
        self.fleet.drain(hosts, op)

    def upgrade(self, host: str, steps: list[Step], op: str) -> None:
        self.forget()
        self.fleet.upgrade(host, steps, op)

    def start_check(self, host: str, expected: dict[str, str], op: str) -> CheckResult | None:
        self.forget()
        return self.fleet.start_check(host, expected, op)

    def upgrade_hosts(self, work: dict[str, list[Step]], op: str) -> None:
        self.forget()
        self.fleet.upgrade_hosts(work, op)

    def start_checks(self, expected: dict[str, dict[str, str]], op: str) -> None:
        self.forget()
        self.fleet.start_checks(expected, op)

    def return_to_service(self, hosts: list[str], op: str) -> None:
        self.forget()
        self.fleet.return_to_service(hosts, op)

    def offboard(self, host: str, reason: str, op: str) -> None:
        self.forget()
        self.fleet.offboard(host, reason, op)

    def handover(self, hosts: list[str], from_op: str, to_op: str) -> None:
        self.forget()
        self.fleet.handover(hosts, from_op, to_op)


__all__ = ["ReadOnce"]
