"""The `railyard` command: validate a config, serve the simulator, run the demo."""

from __future__ import annotations

import argparse
import sys

from railyard.config import ConfigError, config_path, load_config


def cmd_validate(args: argparse.Namespace) -> int:
    try:
        cfg = load_config(args.config)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
    print(
        f"ok: {config_path(args.config)}: {cfg.total_hosts} hosts in {len(cfg.domains)} domains, "
        f"{len(cfg.trains)} train(s), {len(cfg.releases)} release(s)"
    )
    return 0


def cmd_sim_serve(args: argparse.Namespace) -> int:
    from railyard.sim import serve

    try:
        cfg = load_config(args.config)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
    serve(cfg, args.db, args.host, args.port or cfg.simulator.port)
    return 0


def cmd_freeze(args: argparse.Namespace) -> int:
    """A global switch in the ledger: while on, no train starts a new stop (stops in flight finish)."""
    import getpass

    from railyard.ledger import Ledger

    try:
        cfg = load_config(args.config)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
    led = Ledger(cfg.ledger.url)
    if args.state in ("on", "off"):
        if not args.reason or not args.reason.strip():
            print("freeze: --reason is required (it is recorded in the ledger's audit)", file=sys.stderr)
            return 2
        led.set_switch("freeze", args.state == "on", reason=args.reason.strip(), actor=args.actor or getpass.getuser())
    sw = led.switch("freeze")
    print(f"freeze is ON since {sw['at']:.0f} by {sw['actor']}: {sw['reason']}" if sw else "freeze is off")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from railyard.demo import main as demo_main

    return demo_main(once=args.once)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="railyard", description="Maintenance trains for GPU fleets.")
    sub = p.add_subparsers(dest="cmd", required=True)

    v = sub.add_parser("validate", help="check a config; every problem is named by field and value")
    v.add_argument("config", nargs="?", help="config file (default: RAILYARD_CONFIG or include/config/railyard.yaml)")
    v.set_defaults(func=cmd_validate)

    sim = sub.add_parser("sim", help="the fleet simulator")
    simsub = sim.add_subparsers(dest="sim_cmd", required=True)
    s = simsub.add_parser("serve", help="serve the simulator's fleet API over HTTP")
    s.add_argument("--config", help="config file (default: RAILYARD_CONFIG or include/config/railyard.yaml)")
    s.add_argument("--db", default=".railyard/sim.db", help="SQLite file that keeps the fleet's state")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=0, help="default: simulator.port from the config")
    s.set_defaults(func=cmd_sim_serve)

    f = sub.add_parser("freeze", help="show or switch the global freeze (no new stops while on)")
    f.add_argument("state", choices=["on", "off", "status"])
    f.add_argument("--reason", help="why (required for on/off; recorded in the ledger)")
    f.add_argument("--actor", help="who (default: the current user)")
    f.add_argument("--config", help="config file (default: RAILYARD_CONFIG or include/config/railyard.yaml)")
    f.set_defaults(func=cmd_freeze)

    d = sub.add_parser("demo", help="run the demo train on Airflow against the simulator")
    d.add_argument("--once", action="store_true", help="exit after the train ends (as RAILYARD_DEMO_ONCE=1)")
    d.set_defaults(func=cmd_demo)

    args = p.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
