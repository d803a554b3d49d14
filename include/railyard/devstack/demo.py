"""`make demo`: the demo train on Airflow against the embedded fleet simulator, with progress.

Starts the simulator and `airflow standalone` in `.railyard/demo`, triggers the first train of
the config, prints progress while it runs and a summary at the end. With RAILYARD_DEMO_ONCE=1 it
then stops everything and prints one JSON object as its last line; otherwise it leaves the UI up
until Ctrl-C or `make stop`.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from railyard.devstack.stack import ROOT, Stack, StackError, running, session_of, start_ticks, stop_session
from railyard.domain.config import RailyardConfig, TrainSpec
from railyard.domain.models import BROKEN_STATES, Host, HostState
from railyard.domain.planning import pending_steps
from railyard.fleet.http import HttpFleet
from railyard.ledger import Ledger
from railyard.operations.reconcile import dag_id_for, owner_of

TERMINAL = {"success", "skipped", "failed", "upstream_failed", "removed"}


def demo_ledger(stack: Stack) -> Ledger:
    """The ledger the demo's tasks use (RAILYARD_HOME is the demo's home)."""
    return Ledger(stack.config.ledger.url or f"sqlite:///{stack.home / 'ledger.db'}")


def waiting_for(ledger: Ledger, domain: str, step: str) -> str:
    """What a stop's wait is waiting for, and who holds it: the part of the progress line after the step."""
    if step == "wait_capacity":
        out = {d: op for d, op in ledger.domains_out().items() if d != domain}
        return f" (capacity: {', '.join(f'{d} held by {op}' for d, op in sorted(out.items()))})" if out else ""
    if step == "wait_checkpoints":
        return " (jobs checkpointing)"
    return ""


def progress_line(stack: Stack, fleet: HttpFleet, dag_id: str, run_id: str, train_id: str, t0: float,
                  memo: dict[str, Any] | None = None, ledger: Ledger | None = None) -> str:
    cfg = stack.config
    train = cfg.train(train_id)
    domains = cfg.train_domains(train)
    states = stack.task_states(dag_id, run_id)
    done = sum(
        1 for d in domains
        if states.get(f"{d.name}.return_to_service") in TERMINAL or states.get(f"{d.name}.wait_capacity") == "skipped"
    )
    current, step = "", ""
    for d in domains:
        for task in ("wait_capacity", "wait_checkpoints", "drain", "upgrade", "health_check", "return_to_service"):
            if states.get(f"{d.name}.{task}") in ("running", "deferred", "queued", "scheduled", "up_for_retry"):
                current, step = d.name, task
    memo = {} if memo is None else memo
    if current:  # between two tasks nothing runs: keep showing where the train is
        memo["at"] = (current, step)
    elif memo.get("at") and done < len(domains):
        current, step = memo["at"]
    everyone = fleet.hosts()
    # at target: of the train's own hosts, in service or not yet back (the summary's "upgraded" counts only
    # those back in service); serving: of the whole fleet
    hosts = train_hosts(cfg, train, everyone)
    targets = cfg.train_targets(train)
    at_target = sum(1 for h in hosts if not pending_steps(targets, h))
    serving = sum(1 for h in everyone if h.state == HostState.SERVING)
    where = (f"domain {min(done + 1, len(domains))}/{len(domains)} {current} {step}" if current
             else f"{done}/{len(domains)} domains done")
    wait = waiting_for(ledger, current, step) if ledger is not None and current else ""
    return (f"[{time.monotonic() - t0:5.0f}s] {where:<40} at target {at_target}/{len(hosts)}  "
            f"serving {serving}/{len(everyone)} ({serving / max(1, len(everyone)):.0%}){wait}")


def train_hosts(cfg: RailyardConfig, train: TrainSpec, hosts: list[Host]) -> list[Host]:
    """The hosts of the train's own domains: what its summary counts (a fleet may hold more)."""
    mine = {h for d in cfg.train_domains(train) for h in d.hosts}
    return [h for h in hosts if h.name in mine]


def summary(stack: Stack, fleet: HttpFleet, train_id: str, state: str, wall: float) -> dict[str, Any]:
    cfg = stack.config
    train = cfg.train(train_id)
    audit = fleet.audit()
    everyone = fleet.hosts()
    hosts = train_hosts(cfg, train, everyone)
    targets = cfg.train_targets(train)
    return {
        "train": train_id,
        "state": state,
        "hosts": len(hosts),
        "fleet_hosts": len(everyone),
        "domains": len(cfg.train_domains(train)),
        "upgraded": sum(1 for h in hosts if not pending_steps(targets, h) and h.state == HostState.SERVING),
        "offboarded": sum(1 for h in hosts if h.state in BROKEN_STATES),
        "offboard_reasons": {h.name: h.reason for h in hosts if h.state in BROKEN_STATES},
        "max_domains_down": audit["max_domains_out"],
        "min_serving_fraction": round(audit["min_serving_fraction"], 4),
        "wall_seconds": round(wall, 1),
        "work_seconds": round(audit["work_seconds"], 1),
        "overhead_per_stop_s": round((wall - audit["work_seconds"]) / max(1, len(audit["stops"])), 2),
        "lost_gpu_hours": round(audit["lost_gpu_hours"], 3),
        "max_job_loss_s": round(audit.get("max_lost_s", 0.0), 1),
        "checkpoint_interval_s": cfg.simulator.jobs.checkpoint_interval_s,
        "unverified_returns": len(audit["unverified_returns"]),
    }


def run_train(stack: Stack, fleet: HttpFleet, train_id: str, *, quiet: bool = False, timeout: float = 3600,
              ledger: Ledger | None = None) -> dict[str, Any]:
    """Trigger one train, follow it to the end, and return the summary."""
    dag_id = dag_id_for(train_id)
    stack.wait_dag(dag_id)
    t0 = time.monotonic()
    run_id = stack.trigger(dag_id)
    last = ""
    memo: dict[str, Any] = {}

    def poll() -> None:
        nonlocal last
        if quiet:
            return
        line = progress_line(stack, fleet, dag_id, run_id, train_id, t0, memo, ledger)
        if line.split("]", 1)[1] != last:
            print(line, flush=True)
            last = line.split("]", 1)[1]

    state = stack.wait_run(dag_id, run_id, timeout, on_poll=poll)
    return summary(stack, fleet, train_id, state, time.monotonic() - t0) | {"run_id": run_id}


def main(once: bool = False) -> int:
    once = once or os.environ.get("RAILYARD_DEMO_ONCE") == "1"
    home = Path(os.environ.get("RAILYARD_DEMO_HOME", ROOT / ".railyard" / "demo"))
    port = int(os.environ.get("RAILYARD_AIRFLOW_PORT", "8080"))
    stack = Stack(home=home, airflow_port=port)
    backend = stack.config.fleet.backend
    if backend != "http":
        # the demo drives (and reports on) the simulator it starts; it never starts one the train would not use
        print(f"railyard demo: {stack.config_file} uses fleet.backend {backend!r}; the demo runs only the fleet "
              "simulator (fleet.backend http). Run this config's train from Airflow: its DAG is "
              f"railyard_train_<id>; `railyard plan TRAIN` and `railyard drift` read that fleet.", file=sys.stderr)
        return 2
    train_id = first_train(stack.config)
    try:
        stack.check_ports()  # before anything of an earlier demo in this home is touched
    except StackError as exc:
        print(f"railyard demo: {exc}", file=sys.stderr)
        return 5
    home.mkdir(parents=True, exist_ok=True)
    # every process this demo starts inherits the marker: `railyard demo --stop` finds them by it
    os.environ[DEMO_MARKER] = f"{os.getpid()}:{start_ticks(os.getpid())}"
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _on_signal)
    try:
        print(f"railyard demo: config {stack.config_file}", flush=True)
        # The fleet and the ledger go together: both kept when a demo before this one was cut short with
        # work in flight (it is finished first, below), else both fresh.
        before = demo_ledger(stack)
        left = [o for o in before.active_operations() if o["hosts"] and owner_of(o) is not None]
        before.dispose()
        if not (home / "sim.db").exists():
            left = []
        if not left:
            for f in ("ledger.db", "ledger.db-wal", "ledger.db-shm"):
                (home / f).unlink(missing_ok=True)
        print(f"starting the fleet simulator on {stack.fleet_url}"
              + (f" (kept: {len(left)} operation(s) of an earlier demo still hold hosts)" if left else "") + " ...",
              flush=True)
        fleet = stack.start_sim(fresh=not left)
        print(f"starting airflow standalone on {stack.api} (about 30 s) ...", flush=True)
        stack.start_airflow()
        stack.ensure_pool()
        print(f"UI: {stack.api}  login: admin / {stack.password}", flush=True)
        led = demo_ledger(stack)
        if left:  # their runs died with the Airflow before this one: the reconciler finishes their stops first
            print("finishing the stops of the earlier demo (railyard_reconcile) ...", flush=True)
            stack.wait_dag("railyard_reconcile")
            rec = stack.trigger("railyard_reconcile")
            state = stack.wait_run("railyard_reconcile", rec, 1800)
            for o in left:
                now = led.operation(o["id"]) or {}
                held = led.holdings(o["id"])
                print(f"  {o['id']}: {'closed' if not held else 'still holds ' + str(len(held)) + ' host(s)'} "
                      f"({now.get('state')}; reconciler run {state})", flush=True)
        print(f"triggering train {train_id!r} ...", flush=True)
        result = run_train(stack, fleet, train_id, ledger=led)
        print(
            f"train {train_id} {result['state']}: {result['upgraded']}/{result['hosts']} hosts upgraded, "
            f"{result['offboarded']} offboarded, max {result['max_domains_down']} domain(s) down, lowest serving "
            f"{result['min_serving_fraction']:.1%}, {result['wall_seconds']:.0f}s wall for "
            f"{result['work_seconds']:.0f}s of work, {result['lost_gpu_hours']:.2f} GPU-hours lost",
            flush=True,
        )
        for host, reason in result["offboard_reasons"].items():
            print(f"  offboarded {host}: {reason}", flush=True)
        if not once:
            print(f"UI: {stack.api}  login: admin / {stack.password}   (Ctrl-C or `make stop` to stop)", flush=True)
            while True:
                time.sleep(3600)
    except KeyboardInterrupt:
        print("stopping ...", file=sys.stderr, flush=True)
        shutdown(stack)
        return 128 + _SIGNALLED[0]
    except BaseException:
        shutdown(stack)
        raise
    shutdown(stack)
    print(json.dumps(result), flush=True)
    return 0 if result["state"] == "success" else 1


def first_train(cfg: RailyardConfig) -> str:
    """The train the demo runs: the config's first, as written."""
    return cfg.trains[0].id


# ---- stopping: everything, once, whatever signals arrive ----------------------------------------------------
DEMO_MARKER = "RAILYARD_DEMO_RUN"  # `<pid>:<start ticks>` of the demo, in the environment of all it starts
_SIGNALLED: list[int] = [int(signal.SIGINT)]


def _on_signal(signum: int, _frame: object) -> None:
    """The first SIGTERM or SIGINT ends the demo. `timeout make demo` signals make and the demo both, and make
    passes its own on: later signals must not cut the shutdown short, so from now on they are only noted."""
    _SIGNALLED[0] = signum
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _while_stopping)
    raise KeyboardInterrupt


def _while_stopping(_signum: int, _frame: object) -> None:
    os.write(2, b"railyard demo: still stopping what it started (Airflow takes ~15 s)\n")


def shutdown(stack: Stack) -> None:
    """Stop the simulator and Airflow, then anything else that carries this demo's marker."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _while_stopping)
    try:
        stack.stop()
    finally:
        mark = os.environ.get(DEMO_MARKER)
        if mark:
            for sid in marked_sessions().get(mark, set()):
                stop_session(sid, grace=10)


def marked_sessions() -> dict[str, set[int]]:
    """marker -> the sessions of the live processes that carry it: what each demo on this machine started."""
    key = f"{DEMO_MARKER}=".encode()
    own = os.getsid(0)
    found: dict[str, set[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            env = Path(f"/proc/{d}/environ").read_bytes()
        except OSError:
            continue
        for item in env.split(b"\0"):
            if item.startswith(key):
                st = session_of(int(d))
                if st is not None and st != own:
                    found.setdefault(item[len(key):].decode(errors="replace"), set()).add(st)
    return found


def stop_demos(grace: float = 60) -> int:
    """`railyard demo --stop` (`make stop`): every demo on this machine, whatever its RAILYARD_DEMO_HOME.
    A demo that still runs is asked first (SIGTERM: it stops what it started); what is left after `grace`,
    or what a demo that died left behind, is stopped by session (SIGTERM, then SIGKILL)."""
    demos = marked_sessions()
    if not demos:
        print("nothing to stop")
        return 0
    for mark, sessions in sorted(demos.items()):
        pid_s, _, ticks = mark.partition(":")
        pid = int(pid_s) if pid_s.isdigit() else 0
        if pid and ticks.isdigit() and running(pid, int(ticks)):
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + grace
            while running(pid, int(ticks)) and time.monotonic() < deadline:
                time.sleep(0.5)
        killed = [p for sid in sorted(sessions) for p in stop_session(sid, grace=15)]
        print(f"stopped demo {pid_s}" + (f" (SIGKILL to {len(killed)} process(es) that outlived SIGTERM)"
                                         if killed else ""))
    return 0
