"""The host-runner port: run upgrades and deep health checks on one host.

A fleet adapter whose scheduler is something else (Slurm, Kubernetes, a plain list of hosts)
delegates the on-host work to a runner. Every call is idempotent and returns at once: long work
runs detached on the host and is observed through `upgrade_state` / `check_result`, so a retried
task re-attaches to an install in flight instead of starting a second one.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from railyard.domain.models import CheckResult, Step, Strict


class RunnerError(RuntimeError):
    """The host could not be reached or refused us (host key, auth, timeout)."""


class UpgradeState(Strict):
    host: str
    status: str  # idle | running | done | failed
    error: str | None = None
    versions: dict[str, str] = {}


@runtime_checkable
class HostRunner(Protocol):
    def versions(self, host: str) -> dict[str, str]:
        """Installed version of every configured component, read by its verify command."""

    def upgrade(self, host: str, steps: list[Step], op: str) -> None:
        """Start the steps not yet at target (in order), or re-attach to the install in flight."""

    def upgrade_state(self, host: str, op: str) -> UpgradeState: ...

    def start_check(self, host: str, expected: dict[str, str], op: str) -> None:
        """Start the configured deep health checks against the expected versions."""

    def check_result(self, host: str, op: str) -> CheckResult:
        """status pending | passed | failed, with the evidence in `reason`."""


@runtime_checkable
class ReportsBusy(Protocol):
    """A runner that can tell whether its worker for an operation still runs on a host."""

    def busy(self, host: str, op: str) -> str | None:
        """'upgrade' or 'check' while a worker for `op` runs on `host`, else None."""
