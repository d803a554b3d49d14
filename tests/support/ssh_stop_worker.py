"""A worker process for the crash test: takes a domain over SSH and runs its upgrade step.

    python -m tests.support.ssh_stop_worker CONFIG LEDGER_URL RUN_ID DOMAIN USER KEY KNOWN_HOSTS

The test SIGKILLs it in the middle of an install, then runs the same step again in a fresh process.
"""

from __future__ import annotations

import sys

from railyard.backends.ssh.fleet import SshFleet
from railyard.backends.ssh.runner import Credentials, paramiko_connector
from railyard.domain.config import load_config
from railyard.ledger import Ledger
from railyard.operations.stop import Stop, op_id_for


def make(config_path: str, ledger_url: str, run_id: str, domain: str, user: str, key: str, known: str) -> Stop:
    cfg = load_config(config_path)
    fleet = SshFleet.from_config(cfg, paramiko_connector(Credentials(user, key, known)))
    train = cfg.trains[0]
    return Stop(config=cfg, train=train, domain=cfg.domain(domain), op_id=op_id_for(train.id, run_id, domain),
                fleet=fleet, ledger=Ledger(ledger_url), say=lambda m: print(m, flush=True))


if __name__ == "__main__":
    stop = make(*sys.argv[1:8])
    print("take:", stop.take(), flush=True)
    print("drain:", stop.drain(), flush=True)
    print("upgrade:", stop.upgrade(), flush=True)
