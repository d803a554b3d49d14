"""Run the fleet simulator: `python -m railyard.sim --config PATH --db PATH [--port N] [--host ADDR]
[--token-file PATH] [--tls-cert PEM --tls-key PEM [--tls-client-ca PEM]]`.

Prints `railyard-sim ready on http://HOST:PORT` once listening (port 0 picks a free port and prints
the real one); stops cleanly on SIGTERM or SIGINT with the world saved. See `railyard.sim.app.serve`.

With a token (`--token-file`, or env RAILYARD_FLEET_TOKEN / RAILYARD_FLEET_TOKEN_FILE) every call but
`GET /healthz` needs `Authorization: Bearer <token>`. The token is never taken on the command line,
where any local user could read it in the process list.
"""

from __future__ import annotations

import argparse
import logging
import sys

from railyard.domain.config import ConfigError, load_config
from railyard.sim.app import resolve_token, serve


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m railyard.sim", description="Run the Railyard fleet simulator.")
    parser.add_argument("--config", help="Railyard config file (default: RAILYARD_CONFIG or the bundled demo)")
    parser.add_argument("--db", required=True, help="SQLite file that keeps the world across restarts")
    parser.add_argument("--port", type=int, default=None,
                        help="port (default: simulator.port from the config; 0 = any)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--token-file", help="file whose first line is the bearer token every call but /healthz "
                                             "needs (default: env RAILYARD_FLEET_TOKEN, RAILYARD_FLEET_TOKEN_FILE)")
    parser.add_argument("--tls-cert", help="serve HTTPS with this certificate (PEM)")
    parser.add_argument("--tls-key", help="the certificate's private key (PEM; default: in --tls-cert)")
    parser.add_argument("--tls-client-ca", help="require client certificates signed by this CA (PEM)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = load_config(args.config)
        token = resolve_token(token_file=args.token_file)
    except (ConfigError, ValueError) as exc:
        print(exc, file=sys.stderr)
        return 2
    try:
        serve(config, args.db, args.host, args.port, token=token, tls_cert=args.tls_cert, tls_key=args.tls_key,
              tls_client_ca=args.tls_client_ca)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
