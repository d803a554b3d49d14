"""Hosts come back from repair only through the same gate as a train stop.

A failing host is handed to a repair operation (`repair/<host>/<op>`) that keeps its lease,
its evidence and the target versions of the stop that sent it. When the fleet reports the repair
done (the host is drained again, no longer in repair), `gate_repaired` brings it to those versions,
runs the deep health check, and returns it; a host that fails the gate stays in repair.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from railyard.config import RailyardConfig
from railyard.fleet.port import Fleet
from railyard.ledger import Ledger
from railyard.models import HostState
from railyard.stop import Stop


def gate_repaired(config: RailyardConfig, fleet: Fleet, ledger: Ledger, *, say: Callable[[str], None] = print,
                  sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic) -> dict:
    returned: list[str] = []
    failed: list[str] = []
    waiting: list[str] = []
    by_domain = config.host_domain()
    for op in ledger.operations_like("repair/", state="active"):
        hosts = sorted(ledger.holdings(op["id"]))
        if not hosts:
            continue
        detail = op["detail"]
        train_id = str(detail.get("from", "")).split("/")[0]
        try:
            train = config.train(train_id)
        except KeyError:
            say(f"{op['id']}: the train {train_id!r} that sent it is no longer configured; left in repair")
            waiting += hosts
            continue
        ready = [h.name for h in fleet.hosts(hosts) if h.state == HostState.DRAINED]
        if not ready:
            waiting += hosts
            continue
        stop = Stop(config=config, train=train, domain=config.domain(by_domain[hosts[0]]), op_id=op["id"],
                    fleet=fleet, ledger=ledger, actor="repair-gate", say=say, sleep=sleep, clock=clock)
        stop.upgrade()
        stop.check()
        out = stop.return_hosts()
        returned += [h for h in hosts if h not in out["offboarded"]] if out["returned"] else []
        failed += out["offboarded"]
    return {"returned": returned, "failed_gate": failed, "still_in_repair": waiting}
