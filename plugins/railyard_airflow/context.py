"""What every Railyard task needs: the config, the fleet, the ledger, and the Stop for its domain."""

from __future__ import annotations

from functools import lru_cache

from railyard.config import RailyardConfig, config_path, load_config
from railyard.fleet.port import Fleet
from railyard.ledger import Ledger
from railyard.stop import Stop, op_id_for


@lru_cache(maxsize=4)
def config(path: str | None = None) -> RailyardConfig:
    return load_config(path)


@lru_cache(maxsize=4)
def ledger(url: str | None) -> Ledger:
    return Ledger(url)


def make_stop(*, train_id: str, domain: str, run_id: str, fleet: Fleet, say, ledger_url: str | None = None,
              path: str | None = None) -> Stop:
    cfg = config(path or str(config_path()))
    train = cfg.train(train_id)
    return Stop(
        config=cfg,
        train=train,
        domain=cfg.domain(domain),
        op_id=op_id_for(train_id, run_id, domain),
        fleet=fleet,
        ledger=ledger(ledger_url or cfg.ledger.url),
        actor=f"train:{train_id}",
        say=say,
    )
