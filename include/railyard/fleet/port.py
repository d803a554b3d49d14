"""The fleet port: the few things Railyard needs from whatever runs the hosts.

Every call is idempotent and returns at once; long work (drain, upgrade, check, return) is started
by one call and observed through `hosts()` / `check_results()`, so a retried task re-attaches to
work in flight instead of starting it twice. `op` is the operation id that owns the change.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from railyard.domain.models import Capacity, CheckResult, Host, Job, Step


class FleetError(RuntimeError):
    """The fleet refused a request or could not be reached."""


class FleetNotFound(FleetError):
    """The request named a host or job the fleet does not know (HTTP 404)."""


@runtime_checkable
class Fleet(Protocol):
    def now(self) -> float:
        """The fleet's clock (seconds); checkpoint freshness is judged on it."""

    def hosts(self, names: list[str] | None = None) -> list[Host]: ...

    def jobs(self, hosts: list[str] | None = None) -> list[Job]:
        """Jobs that run on any of `hosts` (all jobs when None)."""

    def request_checkpoint(self, job_ids: list[str]) -> float:
        """Ask the jobs to checkpoint now; returns the fleet time of the request."""

    def drain(self, hosts: list[str], op: str) -> None:
        """Stop placing jobs on the hosts and move running jobs off them."""

    def upgrade(self, host: str, steps: list[Step], op: str) -> None:
        """Apply the steps in order on a drained host; steps already at target are no-ops."""

    def start_check(self, host: str, expected: dict[str, str], op: str) -> CheckResult | None:
        """Start the deep health check of a drained host against the expected versions."""

    def upgrade_hosts(self, work: dict[str, list[Step]], op: str) -> None:
        """`upgrade` for many hosts (a domain's) in one call: host -> steps. Every host is started, each by
        the fleet's own fan-out (one request, a bounded pool of connections, hostlists); a host refused does
        not stop the others, and the first refusal is raised once every host was tried."""

    def start_checks(self, expected: dict[str, dict[str, str]], op: str) -> None:
        """`start_check` for many hosts in one call (host -> expected versions), as `upgrade_hosts` does;
        the checks are then read with `check_results`."""

    def check_results(self, hosts: list[str], op: str) -> list[CheckResult]: ...

    def return_to_service(self, hosts: list[str], op: str) -> None: ...

    def offboard(self, host: str, reason: str, op: str) -> None:
        """Hand a host to repair with a reason; it stays out of service."""

    def capacity(self) -> Capacity: ...

    def handover(self, hosts: list[str], from_op: str, to_op: str) -> None:
        """Hosts held by `from_op` pass to `to_op` (a repair, an emergency) without coming back."""


# ---- optional capabilities: what some fleets do beyond the port. The core asks `isinstance(fleet, X)`,
# never a backend's name. (Wrappers such as `ReadOnce` pass them through: tests/unit/test_fleet_capabilities.py.)

@runtime_checkable
class Reservations(Protocol):
    """Domains reserved ahead of their stops, so the scheduler places no job that would run into them (Slurm)."""

    def reserve(self, op: str, domains: list[str]) -> None:
        """Reserve `domains[0]` now for one stop window and each later one at its expected window."""

    def unreserve(self, domains: list[str]) -> list[str]:
        """Delete Railyard's reservations of these domains; returns the ones deleted."""


@runtime_checkable
class HealthGate(Protocol):
    """A fleet whose scheduler can undo Railyard's drains and resumes by itself (a restarted controller):
    the gate puts them back, at the end of a run included."""

    def enforce_gate(self) -> Any:
        """Drain again what Railyard holds and the scheduler returned; give back again what it gave back."""


@runtime_checkable
class ReadsHostsOut(Protocol):
    """A fleet that can list its hosts out of service without sending every host: what a stop's capacity
    check needs of the fleet beyond its own domain (a 76,800-host fleet's read is 17 MB; its hosts out, a
    domain's or so). Fleets without it are read whole."""

    def hosts_out(self) -> list[Host]:
        """Every host whose state is not serving (draining, drained, upgrading, failed, in repair...)."""


@runtime_checkable
class TendsDetachedWork(Protocol):
    """A fleet whose long work runs detached on the hosts (SSH, Slurm's runner): a waiting write step tends
    it every few seconds, relaunching what stopped. Never called by a read."""

    def tend(self, hosts: list[str], op: str) -> list[str]:
        """Launch again `op`'s work that is not running on `hosts`; returns the hosts relaunched."""


@runtime_checkable
class RequeuesSilentJobs(Protocol):
    """A fleet that can requeue a job that stays silent after a checkpoint request (Slurm's `requeue`
    checkpoint policy); the policy is the fleet's own."""

    def requeue_grace_s(self) -> float | None:
        """How long a silent job is waited for before it is requeued; None: never requeued (policy `wait`)."""

    def requeue_silent(self, job_ids: list[str], op: str, why: str) -> list[str]:
        """Requeue the jobs, recording the work each loses since its last checkpoint; returns those requeued."""
