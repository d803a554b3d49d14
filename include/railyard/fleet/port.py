"""The fleet port: the few things Railyard needs from whatever runs the hosts.

Every call is idempotent and returns at once; long work (drain, upgrade, check, return) is started
by one call and observed through `hosts()` / `check_results()`, so a retried task re-attaches to
work in flight instead of starting it twice. `op` is the operation id that owns the change.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from railyard.models import Capacity, CheckResult, Host, Job, Step


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

    def check_results(self, hosts: list[str], op: str) -> list[CheckResult]: ...

    def return_to_service(self, hosts: list[str], op: str) -> None: ...

    def offboard(self, host: str, reason: str, op: str) -> None:
        """Hand a host to repair with a reason; it stays out of service."""

    def capacity(self) -> Capacity: ...

    def handover(self, hosts: list[str], from_op: str, to_op: str) -> None:
        """Hosts held by `from_op` pass to `to_op` (a repair, an emergency) without coming back."""
