"""Which optional capabilities each fleet has (`railyard.fleet.port`): the core asks `isinstance`, so a
capability a backend gains or loses by a renamed method shows here, and a wrapper keeps its fleet's."""

from __future__ import annotations

import pytest

from railyard.backends.slurm.fleet import SlurmFleet
from railyard.backends.ssh.fleet import SshFleet
from railyard.fleet.http import HttpFleet
from railyard.fleet.once import ReadOnce
from railyard.fleet.port import (
    Fleet,
    HealthGate,
    ReadsHostsOut,
    RequeuesSilentJobs,
    Reservations,
    TendsDetachedWork,
)
from railyard.sim.engine import SimEngine

CAPS = (Reservations, HealthGate, TendsDetachedWork, RequeuesSilentJobs, ReadsHostsOut)


@pytest.mark.parametrize(("cls", "expected"), [
    (SlurmFleet, {Reservations, HealthGate, TendsDetachedWork, RequeuesSilentJobs}),
    (SshFleet, {TendsDetachedWork}),
    (HttpFleet, {ReadsHostsOut}),
    (SimEngine, {ReadsHostsOut}),
], ids=lambda v: getattr(v, "__name__", ""))
def test_each_backend_has_the_capabilities_it_implements(cls, expected):
    assert issubclass(cls, Fleet)
    assert {c for c in CAPS if issubclass(cls, c)} == expected


class Reserving:
    """Only the two methods of Reservations (the port's own methods are not what is asked here)."""

    def reserve(self, op, domains):
        self.reserved = (op, domains)

    def unreserve(self, domains):
        return domains


def test_a_read_once_wrapper_keeps_the_capabilities_of_its_fleet():
    inner = Reserving()
    wrapped = ReadOnce(inner)  # type: ignore[arg-type]
    assert isinstance(wrapped, Reservations) and not isinstance(wrapped, TendsDetachedWork)
    wrapped.reserve("t/r1/pod-a", ["pod-a"])
    assert inner.reserved == ("t/r1/pod-a", ["pod-a"])
    assert not isinstance(ReadOnce(object()), Reservations)  # type: ignore[arg-type]
