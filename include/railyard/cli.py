"""The `railyard` command: validate a config, serve the simulator, run the demo."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from railyard.domain.config import ConfigError, RailyardConfig, config_path, load_config
from railyard.fleet.port import Fleet, FleetError

if TYPE_CHECKING:
    from railyard.ledger import Ledger


def cmd_validate(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    print(
        f"ok: {config_path(args.config)}: {cfg.total_hosts} hosts in {len(cfg.domains)} domains, "
        f"{len(cfg.trains)} train(s), {len(cfg.releases)} release(s)"
    )
    return 0


def config_schema() -> dict[str, object]:
    """The JSON Schema (2020-12) of the config file, as its models validate it (input, not the parsed form)."""
    schema = RailyardConfig.model_json_schema(mode="validation")
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema,
            "title": "Railyard config (railyard.yaml)"}


def cmd_schema(args: argparse.Namespace) -> int:
    import json

    if args.markdown:
        from railyard.domain.config.reference import reference

        print(reference(RailyardConfig), end="")
        return 0
    print(json.dumps(config_schema(), indent=2, sort_keys=True))
    return 0


def cmd_sim_serve(args: argparse.Namespace) -> int:
    from railyard.sim import serve

    cfg = load_config(args.config)
    from pathlib import Path

    Path(args.db).parent.mkdir(parents=True, exist_ok=True)  # the default .railyard/ does not exist on a fresh clone
    serve(cfg, args.db, args.host, args.port or cfg.simulator.port, token_file=args.token_file)
    return 0


def cmd_freeze(args: argparse.Namespace) -> int:
    """A global switch in the ledger: while on, no train starts a new stop (stops in flight finish)."""
    import getpass

    from railyard.ledger import Ledger

    cfg = load_config(args.config)
    led = Ledger(cfg.ledger.url)
    if args.state in ("on", "off"):
        if not args.reason or not args.reason.strip():
            print("freeze: --reason is required (it is recorded in the ledger's audit)", file=sys.stderr)
            return 2
        led.set_switch("freeze", args.state == "on", reason=args.reason.strip(), actor=args.actor or getpass.getuser())
    sw = led.switch("freeze")
    print(f"freeze is ON since {sw['at']:.0f} by {sw['actor']}: {sw['reason']}" if sw else "freeze is off")
    return 0


def _fleet(args: argparse.Namespace, cfg: RailyardConfig, *, read_only: bool = False) -> Fleet:
    """The config's fleet: `http` at --fleet-url, RAILYARD_FLEET_URL or the simulator's port; `ssh` and
    `slurm` from the config, nodes reached with fleet.ssh's user, key_file and known_hosts. `read_only`
    (plan, drift): an SSH fleet reads the database as the workers left it, a Slurm fleet reads Slurm and
    the versions Railyard verified on each node (its features); neither reaches a host."""
    import os

    from railyard.fleet.registry import build_fleet

    backend, ssh = cfg.fleet.backend, cfg.fleet.ssh
    creds = None
    if backend == "ssh" and not read_only and ssh is not None:
        from railyard.backends.ssh.runner import Credentials

        missing = [n for n in ("user", "key_file", "known_hosts") if not getattr(ssh, n)]
        if missing:
            raise FleetError(f"fleet.ssh: {', '.join(missing)} not set; the CLI reaches the hosts with them")
        creds = Credentials(str(ssh.user), str(ssh.key_file), str(ssh.known_hosts))
    http = None
    if backend == "http":
        from railyard.fleet.http import env_token

        url = getattr(args, "fleet_url", None) or os.environ.get("RAILYARD_FLEET_URL") \
            or f"http://127.0.0.1:{cfg.simulator.port}"
        http = {"base_url": url, "token": env_token(), "retries": 1, "connect_timeout": 2}
    return build_fleet(cfg, ssh=creds, http=http, read_only=read_only)


def unreadable_fleet(cmd: str, backend: str, exc: Exception) -> str:
    """One line: which fleet could not be read, why, and what would make it readable."""
    hint = ""
    if backend == "http":
        hint = ("; start the simulator (`railyard sim serve`) or name the fleet API (--fleet-url or "
                "RAILYARD_FLEET_URL)")
    return f"{cmd}: the fleet ({backend}) cannot be read: {exc}{hint}"


def cmd_release(args: argparse.Namespace) -> int:
    """Phases of releases: list them, or promote / halt / resume one with a reason (audited)."""
    import getpass
    import time

    from railyard.ledger import Ledger
    from railyard.operations.releases import ReleaseError, Rollout

    cfg = load_config(args.config)
    rollout = Rollout(cfg, Ledger(cfg.ledger.url))
    if args.action != "list":
        if not args.id:
            print(f"release {args.action}: name the release (value: None)", file=sys.stderr)
            return 2
        try:
            now = _fleet(args, cfg, read_only=True).now()
        except FleetError:
            now = time.time()  # the fleet is not reachable: phase start on the wall clock
        try:
            rollout.act(args.action, args.id, reason=args.reason or "", actor=args.actor or getpass.getuser(), now=now)
        except ReleaseError as exc:
            print(f"release {args.action}: {exc}", file=sys.stderr)
            return 2
    for r in rollout.table():
        print(f"{r['release']:<20} {r['component']:<16} {r['version']:<18} {r['phase']:<7} "
              f"{r['hosts_admitted']:>6} host(s)" + (f"  HALTED: {r['reason']}" if r["halted"] else ""))
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    """What the next run of a train would do; touches nothing. Exit 3 when a rule would be broken."""
    import json

    from railyard.ledger import Ledger
    from railyard.operations.releases import describe_plan, plan_train

    try:
        cfg = load_config(args.config)
        train = cfg.train(args.train)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
    except KeyError as exc:
        print(f"plan: {exc.args[0]}", file=sys.stderr)
        return 2
    p = plan_train(cfg, train, _fleet(args, cfg, read_only=True), Ledger(cfg.ledger.url))
    print(json.dumps(p, indent=1) if args.json else describe_plan(p))
    return 3 if p["violations"] else 0


def cmd_drift(args: argparse.Namespace) -> int:
    """Versions in the fleet per component, domain and SKU; converged fraction; oldest version's age."""
    import json

    from railyard.operations.releases import describe_drift, drift, drift_chart

    cfg = load_config(args.config)
    fleet = _fleet(args, cfg, read_only=True)
    d = drift(cfg, fleet.hosts(), fleet.now())
    print(json.dumps(d, indent=1) if args.json else describe_drift(d))
    if args.png:
        drift_chart(d, args.png)
        print(f"chart written to {args.png}", file=sys.stderr)
    return 0


def cmd_ops(args: argparse.Namespace) -> int:
    """Active operations: their hosts, run, age and last action. A read."""
    import json

    from railyard.ledger import Ledger
    from railyard.operations.ops import describe_ops

    cfg = load_config(args.config)
    ops = Ledger(cfg.ledger.url).active_operations()
    print(json.dumps(ops, indent=1, default=str) if args.json else describe_ops(ops))
    return 0


def cmd_runs(args: argparse.Namespace) -> int:
    """The latest runs of every train and of the emergency train, with their outcome. A read."""
    import json

    from railyard.ledger import Ledger
    from railyard.operations.runreport import describe_runs

    cfg = load_config(args.config)
    if args.limit < 1:
        print(f"runs: --limit must be at least 1 (value: {args.limit})", file=sys.stderr)
        return 2
    rows = Ledger(cfg.ledger.url).reports(limit=args.limit, train=args.train)
    print(json.dumps(rows, indent=1, default=str) if args.json else describe_runs(rows))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """One run's report: by `train/run_id`, or by run id alone when one run has it. A read."""
    import json

    from railyard.ledger import Ledger
    from railyard.operations.runreport import describe

    cfg = load_config(args.config)
    report = Ledger(cfg.ledger.url).report(args.run)
    if report is None:
        print(f"report: no report of the run {args.run!r} (`railyard runs` lists those there are)", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=1, default=str) if args.json else describe(report))
    return 0


def cmd_op(args: argparse.Namespace) -> int:
    """Outside work through the ledger: request hosts (and wait for them), see a request, return the hosts."""
    import getpass
    import json

    from railyard.ledger import Ledger
    from railyard.operations import outside
    from railyard.operations.stop import StopError

    cfg = load_config(args.config)
    actor = args.actor or getpass.getuser()
    try:
        if args.op_cmd == "request":
            hosts = [h for part in (args.hosts or []) for h in part.split(",") if h]
            req = outside.parse_request(cfg, hosts=hosts, kind=args.kind or "", reason=args.reason or "",
                                        deadline_h=args.deadline_h)  # refused here, before anything is touched
            led = Ledger(cfg.ledger.url)
            op_id = outside.open_request(cfg, led, req, actor=actor)
            print(op_id, flush=True)
            return _op_progress(args, cfg, led, op_id)
        led = Ledger(cfg.ledger.url)
        if args.op_cmd == "wait":
            outside.status(led, args.op)  # an unknown operation is refused before anything is touched
            return _op_progress(args, cfg, led, args.op)
        if args.op_cmd == "status":
            st = outside.status(led, args.op)
            print(json.dumps(st, indent=1, default=str) if args.json else outside.describe_status(st))
            return 0
        stop = outside.stop_of(cfg, _fleet(args, cfg), led, args.op)
        out = outside.give_back(stop, to_repair=list(args.to_repair or []), reason=args.reason or "")
        print(f"{args.op}: {out['returned']} host(s) back in service after their check, to repair: "
              f"{', '.join(out['to_repair']) or 'none'}")
        return 0
    except outside.OutsideError as exc:
        print(f"op {args.op_cmd}: " + "; ".join(exc.problems), file=sys.stderr)
        return 2
    except StopError as exc:
        print(f"op {args.op_cmd}: {exc}", file=sys.stderr)
        return 3


def _op_progress(args: argparse.Namespace, cfg: RailyardConfig, led: Ledger, op_id: str) -> int:
    """One attempt to hand the hosts over, or (--wait) attempts until they are: 0 once handed, 5 while queued."""
    from railyard.operations import outside

    stop = outside.stop_of(cfg, _fleet(args, cfg), led, op_id)
    say = lambda m: print(m, flush=True)  # noqa: E731
    out = (outside.wait_handed(stop, say=say, poll_s=args.poll_s) if getattr(args, "wait", False)
           else outside.advance(stop))
    if out["phase"] == "handed":
        print(f"{op_id}: handed over: {', '.join(out['hosts'])} (drained; `railyard op return {op_id}` when done)")
        return 0
    print(f"{op_id}: queued: {out['why']} (`railyard op wait {op_id}` waits for it)")
    return 5


def cmd_host(args: argparse.Namespace) -> int:
    """One host's record: its lease, the operations that touched it, its checks with evidence. A read."""
    import json

    from railyard.ledger import Ledger
    from railyard.operations.ops import describe_host

    cfg = load_config(args.config)
    words = list(args.host)
    if words[0] == "repaired":
        return _host_repaired(args, cfg, words[1:])
    if len(words) != 1:
        print(f"host: name one host, or `host repaired HOST --reason ...` (value: {' '.join(words)!r})",
              file=sys.stderr)
        return 2
    args.host = words[0]
    if args.host not in cfg.host_domain():
        print(f"host: {args.host!r} is not a host of the config", file=sys.stderr)
        return 2
    h = Ledger(cfg.ledger.url).host_history(args.host)
    print(json.dumps(h, indent=1, default=str) if args.json else describe_host(h))
    return 0


def _host_repaired(args: argparse.Namespace, cfg: RailyardConfig, words: list[str]) -> int:
    """`railyard host repaired HOST --reason ...`: hand a failed or in-repair host to the repair gate (audited)."""
    import getpass

    from railyard.ledger import Ledger
    from railyard.operations.ops import ControlError, mark_repaired

    if len(words) != 1:
        print("host repaired: name one host (value: " + repr(" ".join(words)) + ")", file=sys.stderr)
        return 2
    try:
        out = mark_repaired(cfg, _fleet(args, cfg), Ledger(cfg.ledger.url), words[0], reason=args.reason or "",
                            actor=args.actor or getpass.getuser())
    except ControlError as exc:
        print(f"host repaired: {exc}", file=sys.stderr)
        return 2
    print(f"{out['host']}: marked repaired under {out['op']}; the repair gate (railyard_repairs) upgrades, "
          "checks and returns it")
    return 0


def cmd_lease(args: argparse.Namespace) -> int:
    """Release an operation's lease by hand (audited): only when its hosts are serving or in repair."""
    import getpass

    from railyard.ledger import Ledger
    from railyard.operations.ops import ControlError, release_lease
    from railyard.operations.reconcile import AirflowApi

    cfg = load_config(args.config)
    try:
        out = release_lease(cfg, _fleet(args, cfg), Ledger(cfg.ledger.url), args.op, reason=args.reason or "",
                            actor=args.actor or getpass.getuser(), to_repair=args.to_repair,
                            runs=AirflowApi.from_env(args.airflow))
    except ControlError as exc:
        print(f"lease release: {exc}", file=sys.stderr)
        return 2
    print(f"{out['op']}: released {len(out['released'])} host(s)"
          + (f"; sent to repair: {', '.join(out['to_repair'])}" if out["to_repair"] else ""))
    return 0


def cmd_reconcile(args: argparse.Namespace) -> int:
    """Finish the stops whose Airflow run is finished or deleted (as the railyard_reconcile DAG does)."""
    from railyard.ledger import Ledger
    from railyard.operations.reconcile import AirflowApi, ReconcileError, reconcile

    cfg = load_config(args.config)
    try:
        out = reconcile(cfg, _fleet(args, cfg), Ledger(cfg.ledger.url), AirflowApi.from_env(args.airflow),
                        actor=args.actor or "reconciler", only=args.op or None)
    except ReconcileError as exc:
        print(f"reconcile: {exc}", file=sys.stderr)
        return 4
    for r in out:
        extra = (f": returned {r['returned']}, to repair {', '.join(r['to_repair']) or 'none'}"
                 if r["action"] == "closed"
                 else f": {r['error']}" if r["action"] == "failed" else "")
        print(f"{r['op']}: {r['action']} ({r['why']}){extra}")
    if not out:
        print("nothing to reconcile: every active operation's run is alive")
    return 3 if any(r["action"] == "failed" for r in out) else 0


def cmd_size(args: argparse.Namespace) -> int:
    """The domain-size planner: cost per cycle for every domain count, the optimum, a proposed layout."""
    from railyard.tools.sizing import (
        SizingError,
        chart,
        config_with_layout,
        describe,
        input_from_config,
        load_input,
        plan,
    )
    from railyard.tools.sizing import to_json as sizing_json

    try:
        if args.input:
            inp = load_input(args.input)
        else:
            inp = input_from_config(load_config(args.config))
        p = plan(inp)
        n = args.domains or (p["best"] or {}).get("domains")
        if args.write_config:
            if args.input and not args.config:
                print("size: --write-config needs --config (the config file the layout goes into)", file=sys.stderr)
                return 2
            if n is None:
                print("size: no domain count holds the cycle; nothing to write", file=sys.stderr)
                return 3
            from pathlib import Path

            Path(args.write_config).write_text(config_with_layout(config_path(args.config), inp, int(n)))
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
    except SizingError as exc:
        print(f"size: {exc}", file=sys.stderr)
        return 2
    print(sizing_json(p) if args.json else describe(p))
    if args.write_config:
        print(f"config with {n} domains written to {args.write_config}", file=sys.stderr)
    if args.png:
        print(f"chart written to {chart(p, args.png)}", file=sys.stderr)
    return 0 if p["best"] is not None else 3


def cmd_study(args: argparse.Namespace) -> int:
    """Trains at several domain counts, a whole-fleet window and naive rolling on the simulator."""
    import yaml

    from railyard.tools.sizing import SizingError
    from railyard.tools.study import chart, describe, parse_spec, study
    from railyard.tools.study import to_json as study_json

    try:
        data: dict[str, object] = {}
        if args.input:
            from pathlib import Path

            try:
                data = yaml.safe_load(Path(args.input).read_text()) or {}
            except (OSError, yaml.YAMLError) as exc:
                print(f"study: cannot read {args.input}: {exc}", file=sys.stderr)
                return 2
        for key in ("hosts", "cycle_days", "seed"):
            if getattr(args, key) is not None:
                data[key] = getattr(args, key)
        if args.counts:
            try:
                data["counts"] = [int(x) for x in args.counts.split(",")]
            except ValueError:
                print(f"study: --counts must be integers separated by commas (value: {args.counts!r})",
                      file=sys.stderr)
                return 2
        s = study(parse_spec(data, f"study input {args.input}" if args.input else "study input"))
    except SizingError as exc:
        print(f"study: {exc}", file=sys.stderr)
        return 2
    print(study_json(s) if args.json else describe(s))
    if args.png:
        print(f"chart written to {chart(s, args.png)}", file=sys.stderr)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from railyard.devstack.demo import main as demo_main
    from railyard.devstack.demo import stop_demos

    return stop_demos() if args.stop else demo_main(once=args.once)


def build_parser() -> argparse.ArgumentParser:
    """The `railyard` command's parser, every subcommand with its arguments (docs examples are parsed with it)."""
    p = argparse.ArgumentParser(prog="railyard", description="Maintenance trains for GPU fleets.")
    sub = p.add_subparsers(dest="cmd", required=True)

    v = sub.add_parser("validate", help="check a config; every problem is named by field and value")
    v.add_argument("config", nargs="?", help="config file (default: RAILYARD_CONFIG or include/config/railyard.yaml)")
    v.set_defaults(func=cmd_validate)

    sc = sub.add_parser("schema", help="the JSON Schema of the config file (for an editor's YAML language server)")
    sc.add_argument("--markdown", action="store_true", help="the field reference of docs/configuration.md instead")
    sc.set_defaults(func=cmd_schema)

    sim = sub.add_parser("sim", help="the fleet simulator")
    simsub = sim.add_subparsers(dest="sim_cmd", required=True)
    s = simsub.add_parser("serve", help="serve the simulator's fleet API over HTTP")
    s.add_argument("--config", help="config file (default: RAILYARD_CONFIG or include/config/railyard.yaml)")
    s.add_argument("--db", default=".railyard/sim.db", help="SQLite file that keeps the fleet's state")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=0, help="default: simulator.port from the config")
    s.add_argument("--token-file", help="require this bearer token (first line of the file) on every call but "
                   "/healthz; also RAILYARD_FLEET_TOKEN or RAILYARD_FLEET_TOKEN_FILE")
    s.set_defaults(func=cmd_sim_serve)

    f = sub.add_parser("freeze", help="show or switch the global freeze (no new stops while on)")
    f.add_argument("state", choices=["on", "off", "status"])
    f.add_argument("--reason", help="why (required for on/off; recorded in the ledger)")
    f.add_argument("--actor", help="who (default: the current user)")
    f.add_argument("--config", help="config file (default: RAILYARD_CONFIG or include/config/railyard.yaml)")
    f.set_defaults(func=cmd_freeze)

    cfg_help = "config file (default: RAILYARD_CONFIG or include/config/railyard.yaml)"
    url_help = "fleet API (default: RAILYARD_FLEET_URL or the simulator's port on 127.0.0.1)"
    r = sub.add_parser("release", help="rollout phases: list, or promote/halt/resume a release with a reason")
    r.add_argument("action", choices=["list", "promote", "halt", "resume"])
    r.add_argument("id", nargs="?", help="release id")
    r.add_argument("--reason", help="why (required; recorded in the ledger's audit)")
    r.add_argument("--actor", help="who (default: the current user)")
    r.add_argument("--config", help=cfg_help)
    r.add_argument("--fleet-url", help=url_help)
    r.set_defaults(func=cmd_release)

    pl = sub.add_parser("plan", help="what the next run of a train would do, touching nothing")
    pl.add_argument("train")
    pl.add_argument("--json", action="store_true")
    pl.add_argument("--config", help=cfg_help)
    pl.add_argument("--fleet-url", help=url_help)
    pl.set_defaults(func=cmd_plan)

    dr = sub.add_parser("drift", help="version drift per component, domain and SKU (text, --json, --png)")
    dr.add_argument("--json", action="store_true")
    dr.add_argument("--png", help="write a chart to this PNG file")
    dr.add_argument("--config", help=cfg_help)
    dr.add_argument("--fleet-url", help=url_help)
    dr.set_defaults(func=cmd_drift)

    o = sub.add_parser("ops", help="active operations: hosts held, run, age, last action")
    o.add_argument("--json", action="store_true")
    o.add_argument("--config", help=cfg_help)
    o.set_defaults(func=cmd_ops)

    ru = sub.add_parser("runs", help="the latest runs of the trains and the emergency train, with their outcome")
    ru.add_argument("--train", help="only this train's runs (`emergency`: the emergency train's)")
    ru.add_argument("--limit", type=int, default=20, help="how many runs, newest first (default 20)")
    ru.add_argument("--json", action="store_true")
    ru.add_argument("--config", help=cfg_help)
    ru.set_defaults(func=cmd_runs)

    rp = sub.add_parser("report", help="one run's report: its stops, every host it touched, jobs, budgets")
    rp.add_argument("run", help="TRAIN/RUN_ID as `railyard runs` shows it, or the run id alone")
    rp.add_argument("--json", action="store_true")
    rp.add_argument("--config", help=cfg_help)
    rp.set_defaults(func=cmd_report)

    op = sub.add_parser("op", help="outside work through the ledger: request hosts, wait, status, return them")
    opsub = op.add_subparsers(dest="op_cmd", required=True)
    oq = opsub.add_parser("request", help="request hosts of one domain for outside work; prints the op id")
    oq.add_argument("--hosts", action="append", help="host names, comma-separated (repeatable)")
    oq.add_argument("--kind", help="what the work is: a token such as hw-repair or network")
    oq.add_argument("--reason", help="why (10 to 1,000 characters)")
    oq.add_argument("--deadline-h", type=float, help="hours after which a request still holding hosts escalates")
    oq.add_argument("--wait", action="store_true", help="wait until the hosts are handed over, saying why not yet")
    ow = opsub.add_parser("wait", help="wait until a queued request's hosts are handed over")
    ow.add_argument("op")
    ow.add_argument("--wait", action="store_true", default=True, help=argparse.SUPPRESS)
    os_ = opsub.add_parser("status", help="a request: its phase, hosts held, why it waits (a read)")
    os_.add_argument("op")
    os_.add_argument("--json", action="store_true")
    orr = opsub.add_parser("return", help="the work is done: check the hosts, return those that pass")
    orr.add_argument("op")
    orr.add_argument("--to-repair", nargs="+", metavar="HOST", help="hosts the requester sends to repair")
    orr.add_argument("--reason", help="why (10 to 1,000 characters)")
    for x in (oq, ow, os_, orr):
        x.add_argument("--config", help=cfg_help)
        x.add_argument("--fleet-url", help=url_help)
        x.add_argument("--actor", help="who asks (default: the login name)")
        x.add_argument("--poll-s", type=float, default=5.0, help=argparse.SUPPRESS)
    op.set_defaults(func=cmd_op)

    hh = sub.add_parser("host", help="one host's record: lease, operations, checks with evidence, versions; "
                        "`host repaired HOST --reason ...` hands a repaired host to the repair gate")
    hh.add_argument("host", nargs="+", help="HOST, or: repaired HOST")
    hh.add_argument("--json", action="store_true")
    hh.add_argument("--reason", help="host repaired: what was repaired (10+ characters; recorded in the audit)")
    hh.add_argument("--actor", help="host repaired: who (default: the current user)")
    hh.add_argument("--fleet-url", help=url_help)
    hh.add_argument("--config", help=cfg_help)
    hh.set_defaults(func=cmd_host)

    le = sub.add_parser("lease", help="release an operation's lease by hand (its run ended; its hosts serving or "
                        "in repair)")
    le.add_argument("action", choices=["release"])
    le.add_argument("op", help="operation id (`railyard ops`)")
    le.add_argument("--reason", help="why (required, 10+ characters; recorded in the audit)")
    le.add_argument("--to-repair", action="store_true", help="send hosts that are out to repair first")
    le.add_argument("--actor", help="who (default: the current user)")
    le.add_argument("--config", help=cfg_help)
    le.add_argument("--fleet-url", help=url_help)
    le.add_argument("--airflow", help="Airflow's URL, asked whether the operation's run has ended (default: "
                    "RAILYARD_AIRFLOW_API or http://127.0.0.1:8080; credentials: RAILYARD_AIRFLOW_TOKEN, or "
                    "RAILYARD_AIRFLOW_USER and RAILYARD_AIRFLOW_PASSWORD)")
    le.set_defaults(func=cmd_lease)

    rc = sub.add_parser("reconcile", help="finish the stops whose Airflow run is finished or deleted")
    rc.add_argument("op", nargs="*", help="only these operations (default: every active one)")
    rc.add_argument("--airflow", help="Airflow's URL (default: RAILYARD_AIRFLOW_API or http://127.0.0.1:8080); "
                    "credentials: RAILYARD_AIRFLOW_TOKEN, or RAILYARD_AIRFLOW_USER and RAILYARD_AIRFLOW_PASSWORD")
    rc.add_argument("--actor", help="who (default: reconciler)")
    rc.add_argument("--config", help=cfg_help)
    rc.add_argument("--fleet-url", help=url_help)
    rc.set_defaults(func=cmd_reconcile)

    sz = sub.add_parser("size", help="domain-size planner: cost per cycle per domain count, the optimum, a layout")
    sz.add_argument("--input", help="sizing input, YAML or JSON (docs/sizing.md); default: the config's fleet")
    sz.add_argument("--json", action="store_true")
    sz.add_argument("--png", help="write the cost curve to this PNG (SVG when matplotlib is not installed)")
    sz.add_argument("--domains", type=int, help="the count to lay out (default: the optimum)")
    sz.add_argument("--write-config", help="write the config with the proposed domains to this file")
    sz.add_argument("--config", help=cfg_help)
    sz.set_defaults(func=cmd_size)

    st = sub.add_parser("study", help="simulate trains at several domain counts, a whole-fleet window and "
                        "naive rolling (in-process simulator, seeded)")
    st.add_argument("--input", help="study input, YAML or JSON (docs/sizing.md); default: the published figures")
    st.add_argument("--hosts", type=int)
    st.add_argument("--cycle-days", dest="cycle_days", type=float)
    st.add_argument("--counts", help="domain counts for trains, e.g. 8,16,32 (default: around the optimum)")
    st.add_argument("--seed", type=int)
    st.add_argument("--json", action="store_true")
    st.add_argument("--png", help="write the plots to this PNG")
    st.set_defaults(func=cmd_study)

    d = sub.add_parser("demo", help="run the demo train on Airflow against the simulator")
    d.add_argument("--once", action="store_true", help="exit after the train ends (as RAILYARD_DEMO_ONCE=1)")
    d.add_argument("--stop", action="store_true", help="stop every demo on this machine and all it started "
                   "(`make stop`), whatever its RAILYARD_DEMO_HOME")
    d.set_defaults(func=cmd_demo)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except ConfigError as exc:  # a bad config: every problem named by field and value, exit 1
        print(exc, file=sys.stderr)
        return 1
    except FleetError as exc:  # the fleet could not be read (plan, drift, lease release, reconcile...): exit 4
        backend = load_config(getattr(args, "config", None)).fleet.backend  # it loaded before the fleet was read
        print(unreadable_fleet("lease release" if args.cmd == "lease" else args.cmd, backend, exc), file=sys.stderr)
        return 4
    except _ledger_error() as exc:  # a ledger URL Railyard does not take, or a database it cannot open: exit 6
        print(exc, file=sys.stderr)
        return 6


def _ledger_error() -> type[Exception]:
    """railyard.ledger.LedgerError, imported (with SQLAlchemy) only once an exception is being matched."""
    from railyard.ledger import LedgerError

    return LedgerError


if __name__ == "__main__":
    sys.exit(main())
