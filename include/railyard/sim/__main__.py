"""Run the fleet simulator: `python -m railyard.sim --config PATH --db PATH [--port N] [--host ADDR]`.

Prints `railyard-sim ready on http://HOST:PORT` once listening (port 0 picks a free port and prints
the real one); stops cleanly on SIGTERM or SIGINT with the world saved. See `railyard.sim.app.serve`.
"""

from __future__ import annotations

import argparse
import logging
import sys

from railyard.config import ConfigError, load_config
from railyard.sim.app import serve


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m railyard.sim", description="Run the Railyard fleet simulator.")
    parser.add_argument("--config", help="Railyard config file (default: RAILYARD_CONFIG or the bundled demo)")
    parser.add_argument("--db", required=True, help="SQLite file that keeps the world across restarts")
    parser.add_argument("--port", type=int, default=None, help="port (default: simulator.port from the config; 0 = any)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    serve(config, args.db, args.host, args.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
