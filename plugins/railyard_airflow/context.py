"""What every Railyard task needs: the config, the fleet, the ledger, and the Stop for its domain."""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

from railyard.domain.config import RailyardConfig, config_path, load_config
from railyard.fleet.port import Fleet
from railyard.ledger import Ledger, resolve_url
from railyard.operations.emergency import run_op, stop_of_run
from railyard.operations.stop import Stop, op_id_for


@lru_cache(maxsize=4)
def config(path: str | None = None) -> RailyardConfig:
    return load_config(path)


def ledger(url: str | None) -> Ledger:
    """One Ledger (one connection pool) per effective URL in this process."""
    return _ledger(resolve_url(url))


@lru_cache(maxsize=4)
def _ledger(url: str) -> Ledger:
    return Ledger(url)


def make_stop(*, train_id: str, domain: str | None, run_id: str, fleet: Fleet, say: Callable[[str], None],
              ledger_url: str | None = None, path: str | None = None, slot: str | None = None) -> Stop | None:
    """The Stop of one task. A revisit `slot` has no domain of its own: it takes the run's next
    dodged domain (the same one on every retry), or returns None when there is none."""
    cfg = config(path or str(config_path()))
    led = ledger(ledger_url or cfg.ledger.url)
    if slot is not None and slot.startswith("stop_"):
        return emergency_stop(cfg, led, run_id=run_id, slot=slot, fleet=fleet, say=say)
    train = cfg.train(train_id)
    if slot is not None:
        claimed = led.claim_dodged(f"{op_id_for(train_id, run_id, '')}", slot)
        if claimed is None:
            return None
        domain = claimed["domain"]
    assert domain is not None
    return Stop(
        config=cfg,
        train=train,
        domain=cfg.domain(domain),
        op_id=op_id_for(train_id, run_id, domain),
        fleet=fleet,
        ledger=led,
        actor=f"train:{train_id}",
        say=say,
        revisit=slot is not None,
    )


def emergency_run_op(run_id: str) -> str:
    return run_op(run_id)


def emergency_stop(cfg: RailyardConfig, led: Ledger, *, run_id: str, slot: str, fleet: Fleet,
                   say: Callable[[str], None]) -> Stop | None:
    """Slot `stop_N` of an emergency run: the N-th stop of its validated plan, or None."""
    return stop_of_run(cfg, led, run_id=run_id, slot=slot, fleet=fleet, say=say)
