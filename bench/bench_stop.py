"""Railyard's cost of a stop as a domain grows: the same stops at 64 and at 1,024 hosts a domain (and, with
`--fleet`, a whole train over 76,800 hosts in 20 domains of 3,840), on the simulator served over HTTP.

A stop here is the train's steps in order (take, checkpoints, drain, upgrade, check, return), run in this
process through `HttpFleet`, the production client, against `railyard sim serve` at the demo's settings
(speed 120: a stop's work is about 12 s of real time at any size, hosts are worked on side by side), with the
demo's releases and jobs scaled with the fleet (6 jobs of 8 hosts per 64 hosts). The figures per stop:
- wall: from the first step to the end of the return;
- work: the floor no orchestrator can beat, from the simulator's settings: drain + the installs and their
  reboot + the check + the return, fleet seconds / speed, as if every host started each phase at once;
- span: the simulator's own account of the stop's phases (first start to last end, summed): above the
  floor by however long the hosts' starts were spread out;
- overhead: wall - work - the checkpoint wait (jobs checkpointing is the jobs' time, not Railyard's);
- poll wait: the part of the overhead each phase, once over, waited for the train's next poll to begin (up to
  `poll_s` a phase at any size, and as much at 64 hosts as at 3,840: where a stop's phases fall against the
  0.1 s grid of its polls swings the 64-host figure, and so the ratios, from run to run);
- own: the overhead less that wait: Railyard's own steps and the fleet's answers to them, split (`own_split`)
  into what began between the phases: the fleet's requests (the answer and the client's HTTP plumbing; every
  request but the four phase writes, whose phase runs while they are answered), the validation of bulk
  answers, the ledger's calls, and the rest (the client's own work over the domain's hosts, its collector);
- calls: requests this process made to the fleet, by endpoint, and the client's CPU seconds;
- the fleet's latency per endpoint as this client saw it (p50 / p99), the simulator under the train.
Airflow's own cost per task is the same at any size (bench_train.py measures it); it is not in these figures.

    .venv/bin/python bench/bench_stop.py [--sizes 64,1024 --domains 4 --stops 4] [--fleet [--fleet-stops N]]

Prints a table, then one JSON object of the figures as the last line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_plan import DEMO_CONFIG, start_sim  # noqa: E402

GOAL_RATIO_1024 = 1.5  # overhead per stop at 1,024 hosts a domain / at 64
GOAL_RATIO_FLEET = 2.0  # overhead per stop at 76,800 hosts in domains of 3,840 / at 64


def scaled(path: Path, domains: int, hosts: int) -> Path:
    """The demo config with `domains` domains of `hosts` hosts, jobs and the maintenance buffer scaled with it."""
    data = yaml.safe_load(DEMO_CONFIG.read_text())
    width = max(2, len(str(hosts)))
    data["domains"] = [{"name": f"pod-{d:03d}", "hosts": f"gpu-{d:03d}-[{1:0{width}d}-{hosts:0{width}d}]"}
                       for d in range(domains)]
    data["buffers"]["maintenance"] = {"fraction": round(1.0 / domains + 1e-6, 6)}
    data["simulator"]["jobs"]["count"] = max(1, domains * hosts * 6 // 64)
    data["simulator"]["upgrade_fail_rate"] = 0.0  # no host to repair: the same work at every size
    data["simulator"]["check_fail_rate"] = 0.0
    data["simulator"]["host_failure_per_hour"] = 0.0
    data["timeouts"].update(upgrade_s=1800, check_s=1800, drain_s=1800, return_s=1800)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


class Counted:
    """Wraps the HTTP session and the validation of an `HttpFleet` (and, with `ledger`, a ledger's calls): each
    request, validation and ledger call is a span (start, seconds, what), what a request's endpoint."""

    def __init__(self, fleet: Any):
        self.spans: list[tuple[float, float, str]] = []
        self._request = fleet.session.request
        fleet.session.request = self.request
        self._parse = fleet._parse
        fleet._parse = self.parse

    def parse(self, *a: Any, **kw: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return self._parse(*a, **kw)
        finally:
            self.spans.append((t0, time.perf_counter() - t0, "validation"))

    def ledger(self, ledger: Any) -> None:
        """Time each of the ledger's public calls (the outermost only, where one calls another)."""
        depth = [0]

        def timed(name: str, f: Any) -> Any:
            def call(*a: Any, **kw: Any) -> Any:
                depth[0] += 1
                t0 = time.perf_counter()
                try:
                    return f(*a, **kw)
                finally:
                    depth[0] -= 1
                    if not depth[0]:
                        self.spans.append((t0, time.perf_counter() - t0, f"ledger.{name}"))
            return call

        for name in dir(type(ledger)):
            if not name.startswith("_") and callable(getattr(type(ledger), name, None)):
                setattr(ledger, name, timed(name, getattr(ledger, name)))

    def request(self, method: str, url: str, **kw: Any) -> Any:
        path = "/" + url.split("/", 3)[3].split("?")[0]
        parts = path.split("/")
        if len(parts) > 4 and parts[2] in ("hosts", "jobs"):  # /v1/hosts/<name>/upgrade -> one endpoint
            parts[3] = "{name}"
        t0 = time.perf_counter()
        endpoint = f"{method} {'/'.join(parts)}"
        try:
            return self._request(method, url, **kw)
        finally:
            self.spans.append((t0, time.perf_counter() - t0, endpoint))

    def reset(self) -> list[tuple[float, float, str]]:
        """The spans since the last reset, in the order they began; none kept."""
        out, self.spans = sorted(self.spans), []
        return out


def requests_by_endpoint(spans: list[tuple[float, float, str]]) -> dict[str, list[float]]:
    """Each request's seconds, by endpoint (the spans that are requests: neither validation nor the ledger)."""
    out: dict[str, list[float]] = defaultdict(list)
    for _t, d, what in spans:
        if what != "validation" and not what.startswith("ledger."):
            out[what].append(d)
    return dict(out)


PHASE_WRITES = {"drain": "POST /v1/hosts/drain", "upgrade": "POST /v1/hosts/upgrade",
                "check": "POST /v1/hosts/check", "return": "POST /v1/hosts/return"}
POLLS = frozenset({"POST /v1/hosts/query", "POST /v1/checks/query", "GET /v1/hosts"})


def poll_wait_s(started: list[tuple[float, str]], phases: dict[str, float]) -> float:
    """How long the stop's phases, once over, waited for the next poll to begin: for each phase, from its end
    (its write's start + the phase's work; every host starts together) to the first read of hosts or checks that
    began after it. A poll every `poll_s` (0.1 s in the demo) makes this up to that much a phase at any size: the
    rest of the overhead is the time Railyard's own steps, and the fleet's answers to them, take."""
    waited = 0.0
    for phase, write in PHASE_WRITES.items():
        starts = [t for t, e in started if e == write]
        if not starts:
            continue
        end = starts[-1] + phases[phase]
        after = [t for t, e in started if e in POLLS and t >= end]
        waited += after[0] - end if after else 0.0
    return waited


def own_split(spans: list[tuple[float, float, str]], phases: dict[str, float],
              checkpoint_wait: tuple[float, float]) -> dict[str, float]:
    """What of a stop's own time went where: the spans (start, seconds, what) that began while no phase ran
    (outside each phase write's start + the phase's work, and outside the checkpoint wait), summed by kind:
    `fleet` (requests, the phase writes left out: their phase runs while they are answered), `validation`,
    `ledger` (each named `ledger.<method>`). The rest of the own time is the client's own work (and the tail of
    a poll begun before its phase ended)."""
    busy = [checkpoint_wait]
    for phase, write in PHASE_WRITES.items():
        busy += [(t, t + phases[phase]) for t, _d, what in spans if what == write]
    writes = set(PHASE_WRITES.values())
    out = {"fleet": 0.0, "validation": 0.0, "ledger": 0.0}
    for t, d, what in spans:
        if what in writes or any(a <= t < b for a, b in busy):
            continue
        kind = what.partition(".")[0]
        out[kind if kind in ("validation", "ledger") else "fleet"] += d
    return out


def one_stop(stop: Any) -> tuple[float, float]:
    """The stop's steps as the DAG runs them; returns when the wait for checkpoints began and ended."""
    d = stop.take()
    assert d.granted, d
    _jobs, since = stop.request_checkpoints()
    t0 = time.perf_counter()
    while stop.stale_jobs(since):
        time.sleep(stop.timeouts.poll_s)
    t1 = time.perf_counter()
    stop.drain()
    stop.upgrade()
    stop.check()
    stop.return_hosts()
    return t0, t1


def phases_s(cfg: Any, train: Any) -> dict[str, float]:
    """Each phase's work at the simulator's settings, every host in step (real seconds)."""
    sim = cfg.simulator
    comps = [cfg.component(r.component) for r in cfg.releases if r.id in train.releases]
    upgrade = sum(c.duration_s for c in comps) + (sim.reboot_s if any(c.reboot for c in comps) else 0.0)
    return {p: float(s / sim.speed) for p, s in
            (("drain", sim.drain_s), ("upgrade", upgrade), ("check", sim.check_s), ("return", sim.return_s))}


def floor_s(cfg: Any, train: Any) -> float:
    """A stop's work at the simulator's settings, every host in step (real seconds)."""
    return sum(phases_s(cfg, train).values())


def run_size(domains: int, hosts: int, stops: int, home: Path) -> dict[str, Any]:
    from railyard.domain.config import load_config
    from railyard.fleet.http import HttpFleet
    from railyard.ledger import Ledger
    from railyard.operations.stop import Stop, op_id_for

    cfg_path = scaled(home / "railyard.yaml", domains, hosts)
    cfg = load_config(cfg_path)
    proc, url = start_sim(cfg_path, home)
    try:
        fleet = HttpFleet(url, read_timeout=60)
        counted = Counted(fleet)
        ledger = Ledger(f"sqlite:///{home / 'ledger.db'}")
        counted.ledger(ledger)
        train = cfg.train("demo")
        per_stop = []
        for domain in cfg.train_domains(train)[:stops]:
            op = op_id_for("demo", "bench", domain.name)
            stop = Stop(config=cfg, train=train, domain=domain, op_id=op, fleet=fleet, ledger=ledger,
                        say=lambda _m: None)
            cpu0, t0 = time.process_time(), time.perf_counter()
            wait = one_stop(stop)
            wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
            waited = wait[1] - wait[0]
            spans = counted.reset()
            waited_for_polls = poll_wait_s([(t, what) for t, _d, what in spans], phases_s(cfg, train))
            split = own_split(spans, phases_s(cfg, train), wait)
            calls = requests_by_endpoint(spans)
            audit = fleet.audit()
            counted.reset()  # the bench's own read: not the next stop's
            rec, speed = next(s for s in audit["stops"] if s["op"] == op), audit["speed"]
            del audit  # every stop's installs and returns: not kept alive (and walked by the collector) in the next
            work = floor_s(cfg, train)
            per_stop.append({"domain": domain.name, "wall_s": wall, "work_s": work, "checkpoint_wait_s": waited,
                             "span_s": rec["work_s"] / speed,
                             "overhead_s": wall - work - waited, "poll_wait_s": waited_for_polls,
                             "own_s": wall - work - waited - waited_for_polls, "client_cpu_s": cpu,
                             "own_split_s": split | {"rest": wall - work - waited - waited_for_polls
                                                     - sum(split.values())},
                             "calls": sum(len(v) for v in calls.values()),
                             "by_endpoint": {k: len(v) for k, v in sorted(calls.items())},
                             "latency": {k: _pcts(v) for k, v in sorted(calls.items())}})
        fleet.close()
        ledger.dispose()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return {"domains": domains, "hosts_per_domain": hosts, "hosts": domains * hosts, "stops": per_stop,
            "overhead_per_stop_s": statistics.median(s["overhead_s"] for s in per_stop),
            "own_per_stop_s": statistics.median(s["own_s"] for s in per_stop),
            "own_split_per_stop_s": {k: statistics.median(s["own_split_s"][k] for s in per_stop)
                                     for k in ("fleet", "validation", "ledger", "rest")},
            "calls_per_stop": statistics.median(s["calls"] for s in per_stop),
            "client_cpu_per_stop_s": statistics.median(s["client_cpu_s"] for s in per_stop)}


def _pcts(xs: list[float]) -> dict[str, float]:
    s = sorted(xs)
    return {"n": len(s), "p50_ms": round(1000 * s[len(s) // 2], 1),
            "p99_ms": round(1000 * s[min(len(s) - 1, int(len(s) * 0.99))], 1)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="64,1024", help="hosts a domain, comma-separated (the first is the baseline)")
    ap.add_argument("--domains", type=int, default=4)
    ap.add_argument("--stops", type=int, default=4,
                    help="stops at each size (4: every domain once; the wait for the next poll, most of the 64-host "
                         "overhead, moves from stop to stop, and a median of more stops moves less)")
    ap.add_argument("--fleet", action="store_true", help="also a train over 76,800 hosts in 20 domains of 3,840")
    ap.add_argument("--fleet-stops", type=int, default=20, help="stops of that train (20: all of it)")
    args = ap.parse_args(argv)
    runs = []
    for size in [int(s) for s in args.sizes.split(",")]:
        with tempfile.TemporaryDirectory(prefix="railyard-bench-stop-") as d:
            runs.append(run_size(args.domains, size, args.stops, Path(d)))
    if args.fleet:
        with tempfile.TemporaryDirectory(prefix="railyard-bench-stop-") as d:
            runs.append(run_size(20, 3840, args.fleet_stops, Path(d)))
    base, own_base = runs[0]["overhead_per_stop_s"], runs[0]["own_per_stop_s"]
    print(f"{'hosts/domain':>12} {'fleet':>7} {'wall s':>7} {'work s':>7} {'span s':>7} {'ckpt s':>7} "
          f"{'overhead s':>10} {'x base':>6} {'poll wait s':>11} {'own s':>6} {'x base':>6} {'calls':>6} "
          f"{'client CPU s':>12}")
    for r in runs:
        for s in r["stops"]:
            print(f"{r['hosts_per_domain']:>12} {r['hosts']:>7} {s['wall_s']:>7.2f} {s['work_s']:>7.2f} "
                  f"{s['span_s']:>7.2f} {s['checkpoint_wait_s']:>7.2f} {s['overhead_s']:>10.2f} "
                  f"{s['overhead_s'] / base:>6.2f} {s['poll_wait_s']:>11.2f} {s['own_s']:>6.2f} "
                  f"{s['own_s'] / own_base:>6.2f} {s['calls']:>6} {s['client_cpu_s']:>12.2f}")
    print("own time a stop (medians), by what began while no phase ran:")
    for r in runs:
        sp = r["own_split_per_stop_s"]
        print(f"  {r['hosts_per_domain']:>5} hosts a domain: own {r['own_per_stop_s']:.3f} s = fleet requests "
              f"{sp['fleet']:.3f} + validation {sp['validation']:.3f} + ledger {sp['ledger']:.3f} + "
              f"the rest {sp['rest']:.3f}")
    for r in runs:
        print(f"fleet latency as seen by the client, {r['hosts_per_domain']} hosts a domain (last stop):")
        for k, v in r["stops"][-1]["latency"].items():
            print(f"  {k:<28} n={v['n']:<5} p50 {v['p50_ms']:>7.1f} ms  p99 {v['p99_ms']:>7.1f} ms")
    figures = {"runs": runs, "baseline_overhead_s": base, "baseline_own_s": own_base,
               "ratios": {r["hosts_per_domain"]: round(r["overhead_per_stop_s"] / base, 2) for r in runs},
               "own_ratios": {r["hosts_per_domain"]: round(r["own_per_stop_s"] / own_base, 2) for r in runs},
               "goals": {1024: GOAL_RATIO_1024, 3840: GOAL_RATIO_FLEET}}
    print(json.dumps(figures))
    return figures


if __name__ == "__main__":
    main()
