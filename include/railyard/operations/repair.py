"""Hosts come back from repair only through the same gate as a train stop.

A failing host is handed to a repair operation (`repair/<host>/<op>`) that keeps its lease, its
evidence and the target versions frozen when it was offboarded (by a train, an emergency, or a
repair's own gate). When the fleet reports the repair done (the host is drained again, no longer in
repair), `gate_repaired` hands it to a fresh attempt (`repair/<host>/<op>/attempt-N`: checks and
verdicts of an earlier attempt are never re-read), brings it to those versions, runs the deep
health check and returns it; a host that fails the gate stays in repair under its attempt, and
comes back through the next attempt once repaired again.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

from railyard.domain.config import RailyardConfig, TrainSpec
from railyard.domain.models import HostState
from railyard.fleet.port import Fleet
from railyard.ledger import Ledger
from railyard.operations.stop import Stop

_ATTEMPT = re.compile(r"/attempt-\d+$")


def frozen_targets(config: RailyardConfig, op: dict[str, Any]) -> dict[str, str] | None:
    """What a repaired host is brought to: the targets recorded when it was offboarded, else (a repair
    recorded by an older Railyard) the targets of the train that sent it, if it is still configured."""
    detail = op["detail"]
    if detail.get("targets"):
        return {str(c): str(v) for c, v in detail["targets"].items()}
    train_id = str(detail.get("from", "")).split("/")[0]
    try:
        return config.train_targets(config.train(train_id))
    except KeyError:
        return None


def gate_repaired(config: RailyardConfig, fleet: Fleet, ledger: Ledger, *, say: Callable[[str], None] = print,
                  sleep: Callable[[float], None] = time.sleep,
                  clock: Callable[[], float] = time.monotonic) -> dict[str, Any]:
    returned: list[str] = []
    failed: list[str] = []
    waiting: list[str] = []
    by_domain = config.host_domain()
    errors: dict[str, str] = {}
    for op in ledger.operations_like("repair/", state="active"):
        try:
            _gate_one(config, fleet, ledger, op, by_domain, returned, failed, waiting, say=say, sleep=sleep,
                      clock=clock)
        except Exception as exc:  # noqa: BLE001 - one repair that cannot go on never starves the others
            errors[op["id"]] = f"{type(exc).__name__}: {exc}"
            say(f"{op['id']}: repair gate not finished: {errors[op['id']]}")
            ledger.note(op["id"], "repair_gate_failed", sorted(ledger.holdings(op["id"])), errors[op["id"]][:1000],
                        actor="repair-gate")
    return {"returned": sorted(returned), "failed_gate": sorted(failed), "still_in_repair": sorted(waiting),
            "errors": errors}


def _gate_one(config: RailyardConfig, fleet: Fleet, ledger: Ledger, op: dict[str, Any], by_domain: dict[str, str],
              returned: list[str], failed: list[str], waiting: list[str], *, say: Callable[[str], None],
              sleep: Callable[[float], None], clock: Callable[[], float]) -> None:
    hosts = sorted(ledger.holdings(op["id"]))
    if not hosts:
        return
    targets = frozen_targets(config, op)
    if targets is None:
        say(f"{op['id']}: no target versions on record and its train is no longer configured; left in repair")
        waiting += hosts
        return
    now = fleet.hosts(hosts)
    detail = op["detail"]
    origin = detail.get("from")
    # an offboard cut short after the ledger's handover: the fleet still names the operation that sent it
    late = [h.name for h in now if origin and h.operation == origin]
    if late:
        fleet.handover(late, str(origin), op["id"])
    ready = [h.name for h in now if h.state == HostState.DRAINED]
    waiting += [h for h in hosts if h not in ready]
    if not ready:
        return
    attempt = int(detail.get("attempt", 0)) + 1
    base = _ATTEMPT.sub("", op["id"])
    new_op = f"{base}/attempt-{attempt}"
    # the fleet first: a crash in between leaves the ledger on the old op, and the retry hands over again
    fleet.handover(ready, op["id"], new_op)
    ledger.handover(ready, op["id"], new_op, kind="repair", actor="repair-gate", domain=op["domain"],
                    reason=f"repair done: health gate attempt {attempt}",
                    detail={**detail, "targets": targets, "attempt": attempt})
    say(f"{new_op}: {', '.join(ready)} back from repair; health gate attempt {attempt} at "
        + ", ".join(f"{c}={v}" for c, v in targets.items()))
    train = TrainSpec(id="repair", releases=["repair"], max_failure_fraction=1.0, max_dodges=0)
    stop = Stop(config=config, train=train, domain=config.domain(by_domain[ready[0]]), op_id=new_op,
                fleet=fleet, ledger=ledger, actor="repair-gate", say=say, sleep=sleep, clock=clock,
                kind="repair", fixed_targets=targets)
    stop.upgrade()
    stop.check()
    out = stop.return_hosts()
    failed += out["offboarded"]
    returned += [h for h in ready if h not in out["offboarded"]]
