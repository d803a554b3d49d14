"""Fleet port and adapters: the core talks to hosts only through `Fleet`."""

from __future__ import annotations

from railyard.fleet.port import Fleet, FleetError, FleetNotFound

__all__ = ["Fleet", "FleetError", "FleetNotFound"]
