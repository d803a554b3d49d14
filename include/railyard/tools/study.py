"""A simulation study: the same fleet, jobs and release under maintenance trains at several domain
counts, one whole-fleet window, and naive rolling (a share of the hosts out at a time, no checkpoint
request), each on the in-process simulator with a fake clock (seeded; a fleet-day in seconds).

What is measured per strategy, over one cycle: lowest and mean serving capacity, job interruptions,
GPU-hours lost to them (work since the last checkpoint + restart + checkpoint time + waiting for hosts),
time to full rollout, whether the cycle and the capacity floor held, and the cycle's whole cost
(GPU-hours not spent on useful work), the quantity the planner predicts (docs/sizing.md).
"""

from __future__ import annotations

import json
import math
from datetime import datetime, timezone
from typing import Any

from pydantic import Field, ValidationError

from railyard.domain.models import HostState, Step, Strict
from railyard.tools.sizing import (
    JobClass,
    JobsModel,
    SizingError,
    SizingInput,
    WorkModel,
    layout,
    parse_input,
    plan,
)

HOUR = 3600.0
COMPONENT, OLD, NEW = "gpu-driver", "1", "2"
# Job sizes after the published figures (docs/sizing.md): 128-GPU, 1k-GPU and 2k-GPU jobs at 8 GPUs a host.
DEFAULT_JOBS = [JobClass(hosts=16, share=0.4), JobClass(hosts=128, share=0.3), JobClass(hosts=256, share=0.3)]
# 419 unexpected interruptions in 54 days on 16,384 GPUs (2,048 hosts), Llama 3 (docs/sizing.md)
PUBLISHED_FAILURES_PER_HOST_HOUR = 419 / (54 * 24 * 2048)


class StudySpec(Strict):
    hosts: int = Field(default=2048, ge=8, le=20_000)
    unit_hosts: int = Field(default=16, ge=1, description="hosts per rack/pod: a domain never splits one")
    gpus_per_host: int = Field(default=8, ge=1)
    jobs: JobsModel = JobsModel(sizes=DEFAULT_JOBS)
    work: WorkModel = WorkModel()
    cycle_days: float = Field(default=2, gt=0, le=60)
    max_domains_down: int = Field(default=1, ge=1)
    failure_buffer_fraction: float = Field(default=0.05, ge=0, lt=1)
    host_failure_per_hour: float = Field(default=PUBLISHED_FAILURES_PER_HOST_HOUR, ge=0)
    repair_s: float = Field(default=4 * 3600, ge=0)
    counts: list[int] | None = Field(default=None, description="domain counts for trains; default: around "
                                     "the planner's optimum (x1/4, x1/2, x1, x2, x4, those that hold the cycle)")
    naive_fraction: float = Field(default=0.1, gt=0, le=1, description="share of hosts out at a time, rolling")
    seed: int = 1
    step_s: float = Field(default=15, gt=0, le=600, description="how often the driver looks (fleet seconds)")

    def sizing(self) -> SizingInput:
        return parse_input({"skus": {"gpu": {"hosts": self.hosts, "unit_hosts": min(self.unit_hosts, self.hosts)}},
                            "gpus_per_host": self.gpus_per_host, "jobs": self.jobs.model_dump(),
                            "work": self.work.model_dump(), "cycle_days": self.cycle_days,
                            "max_domains_down": self.max_domains_down,
                            "failure_buffer_fraction": self.failure_buffer_fraction}, "of the study")


def parse_spec(data: Any, source: str = "study input") -> StudySpec:
    try:
        return StudySpec.model_validate(data or {})
    except ValidationError as exc:
        from railyard.tools.sizing import _problems

        raise SizingError(f"invalid {source}: " + "; ".join(_problems(exc))) from None


def _names(spec: StudySpec) -> list[str]:
    return [f"h{i:05d}" for i in range(spec.hosts)]


def _config(spec: StudySpec, domains: list[list[str]]) -> Any:
    from railyard.domain.config import RailyardConfig

    largest = max(len(d) for d in domains)
    return RailyardConfig.model_validate({
        "components": [{"name": COMPONENT, "reboot": True, "duration_s": max(spec.work.install_s, 1e-3)}],
        "releases": [{"id": "study", "component": COMPONENT, "version": NEW}],
        "domains": [{"name": f"d{i:04d}", "hosts": hosts} for i, hosts in enumerate(domains)],
        "trains": [{"id": "study", "releases": ["study"]}],
        "buffers": {"maintenance": {"hosts": largest}, "failure": {"fraction": spec.failure_buffer_fraction}},
        "max_domains_down": spec.max_domains_down,
        "simulator": {"speed": 1, "seed": spec.seed, "start_at": datetime(2026, 1, 5, tzinfo=timezone.utc),
                      "initial_versions": {COMPONENT: OLD}, "gpus_per_host": spec.gpus_per_host,
                      "jobs": {"count": 0, "checkpoint_interval_s": spec.jobs.checkpoint_interval_s,
                               "checkpoint_duration_s": spec.jobs.checkpoint_s},
                      "drain_s": spec.work.drain_s, "check_s": spec.work.check_s, "reboot_s": spec.work.reboot_s,
                      "return_s": spec.work.return_s, "host_failure_per_hour": spec.host_failure_per_hour,
                      "repair_s": spec.repair_s},
    })


def _job_sizes(spec: StudySpec, busy_hosts: float) -> list[int]:
    """Jobs in the mix's shares filling `busy_hosts`, largest first; the rest topped up with the smallest size."""
    total = sum(c.share for c in spec.jobs.sizes)
    out: list[int] = []
    for c in sorted(spec.jobs.sizes, key=lambda c: -c.hosts):
        out += [c.hosts] * int(busy_hosts * c.share / total / c.hosts)
    small = min(c.hosts for c in spec.jobs.sizes)
    while sum(out) + small <= busy_hosts:
        out.append(small)
    return sorted(out, reverse=True)


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def run_strategy(spec: StudySpec, strategy: str, domains: int | None = None) -> dict[str, Any]:
    """One strategy on a fresh simulated fleet: `train` (at `domains` domains), `window` or `naive`."""
    from railyard.sim.engine import SimEngine

    names = _names(spec)
    inp = spec.sizing()
    m = spec.max_domains_down
    if strategy == "train":
        if domains is None:
            raise SizingError("a train needs a domain count")
        uh = min(spec.unit_hosts, spec.hosts)
        unit_of = {f"gpu-u{k + 1:05d}": names[k * uh:(k + 1) * uh] for k in range(math.ceil(spec.hosts / uh))}
        groups = [[h for u in d["units"] for h in unit_of[u]] for d in layout(inp, domains)]
        buffer_hosts = min(m, len(groups)) * max(len(g) for g in groups)
        checkpoint, slots = True, 0
    elif strategy == "window":
        groups, buffer_hosts, checkpoint, slots = [names], 0, True, 0
    elif strategy == "naive":
        groups, buffer_hosts, checkpoint = [names], 0, False
        slots = max(1, round(spec.naive_fraction * spec.hosts))
    else:
        raise SizingError(f"unknown strategy {strategy!r} (train, window or naive)")

    clock = _Clock()
    eng = SimEngine(_config(spec, groups if strategy == "train" else [names]), clock=clock)
    t0 = eng.now()
    horizon = spec.cycle_days * 86400
    busy = spec.jobs.utilization * (1 - spec.failure_buffer_fraction) * spec.hosts - buffer_hosts
    sizes = _job_sizes(spec, max(0.0, busy))
    gpus = {}
    for i, size in enumerate(sizes):
        job = eng.add_job(f"job-{i + 1:04d}", size)
        gpus[job.id] = job.gpus
    eng.advance()

    step = [Step(component=COMPONENT, version=NEW)]
    expected = {COMPONENT: NEW}
    pending_hosts: dict[str, str] = {}  # host -> op, in flight
    upgraded: set[str] = set()
    checked: set[str] = set()
    done_hosts: set[str] = set()
    checkpoint_gpu_h = 0.0
    host_time = spec.work.drain_s + spec.work.install_s + spec.work.reboot_s + spec.work.check_s + spec.work.return_s
    queue = list(range(len(groups))) if strategy != "naive" else list(range(len(names)))
    next_start = t0
    ckpt: tuple[int, float, list[str]] | None = None  # (group, asked at, jobs) while a train waits for checkpoints
    rollout_end: float | None = None

    def tick(to: float) -> None:
        clock.t += max(0.0, to - eng.now())
        eng.advance()

    while eng.now() < t0 + horizon:
        now = eng.now()
        # start work
        if strategy == "naive":
            while queue and len(pending_hosts) < slots and now >= next_start:
                k = queue.pop(0)
                name = names[k]
                if eng.hosts([name])[0].state != HostState.SERVING:
                    queue.append(k)  # broken now: its turn comes again after the others
                    if len(queue) == 1:
                        break
                    continue
                eng.drain([name], f"naive/{name}")
                pending_hosts[name] = f"naive/{name}"
                next_start = max(next_start, t0) + host_time / slots  # a sliding window, not batches
        elif queue and not pending_hosts:
            g = queue[0]
            if checkpoint and ckpt is None:
                jobs = [j.id for j in eng.jobs(groups[g]) if j.state == "running"]
                asked = eng.request_checkpoint(jobs) if jobs else now
                checkpoint_gpu_h += sum(gpus[j] for j in jobs) * spec.jobs.checkpoint_s / HOUR
                ckpt = (g, asked, jobs)
            ready = ckpt is None or all(
                j.last_checkpoint >= ckpt[1] or j.state != "running" for j in eng.jobs(groups[g]) if j.id in ckpt[2])
            if ready:
                queue.pop(0)
                op = f"{strategy}/{g}"
                serving = [h.name for h in eng.hosts(groups[g]) if h.state == HostState.SERVING]
                broken = [name for name in groups[g] if name not in set(serving)]
                if broken:  # hosts broken at the stop are visited once repaired, in a stop of their own
                    groups.append(broken)
                    queue.append(len(groups) - 1)
                if serving:
                    eng.drain(serving, op)
                for name in serving:
                    pending_hosts[name] = op
                ckpt = None
        # move hosts in flight along: drained -> upgrade -> check -> return
        if pending_hosts:
            for h in eng.hosts(sorted(pending_hosts)):
                op = pending_hosts[h.name]
                if h.state == HostState.DRAINED and h.name not in upgraded:
                    eng.upgrade(h.name, step, op)
                    upgraded.add(h.name)
                elif h.state == HostState.DRAINED and h.name not in checked:
                    eng.start_check(h.name, expected, op)
                    checked.add(h.name)
                elif h.state == HostState.DRAINED:
                    res = eng.check_results([h.name], op)
                    if res and res[0].status == "passed":
                        eng.return_to_service([h.name], op)
                    elif res and res[0].status == "failed":
                        eng.offboard(h.name, f"check failed: {res[0].reason}", op)
                        del pending_hosts[h.name]
                        done_hosts.add(h.name)
                elif h.state in (HostState.SERVING, HostState.REPAIR):
                    del pending_hosts[h.name]
                    done_hosts.add(h.name)
        if not queue and not pending_hosts and rollout_end is None:
            rollout_end = eng.now()
        target = now + spec.step_s
        if not pending_hosts and queue and strategy == "naive":
            target = max(target, next_start)
        if rollout_end is not None:
            target = t0 + horizon
        tick(min(target, t0 + horizon))
    return _measure(spec, eng, strategy, t0, horizon, groups, buffer_hosts, gpus, checkpoint_gpu_h,
                    rollout_end, len(done_hosts), domains)


def _measure(spec: StudySpec, eng: Any, strategy: str, t0: float, horizon: float, groups: list[list[str]],
             buffer_hosts: int, gpus: dict[str, int], checkpoint_gpu_h: float, rollout_end: float | None,
             done: int, domains: int | None) -> dict[str, Any]:
    audit = eng.audit()
    samples = eng.samples()
    end = t0 + horizon
    total = spec.hosts
    # capacity over time, time-weighted
    serving_area, low, floor_held = 0.0, 1.0, True
    largest = max(len(g) for g in groups)
    floor = total - min(spec.max_domains_down, len(groups)) * largest
    for i, s in enumerate(samples):
        a = max(s["t"], t0)
        b = min(samples[i + 1]["t"] if i + 1 < len(samples) else end, end)
        if b < a or s["t"] > end:
            continue
        serving_area += s["serving"] * (b - a)
        low = min(low, s["serving"] / total)
        broken = s["by_state"].get("failed", 0) + s["by_state"].get("repair", 0)
        if strategy == "train" and s["serving"] + broken < floor:
            floor_held = False
    # jobs: running from each placement to the next interruption (or the end)
    events: dict[str, list[tuple[float, int, str]]] = {}
    for p in audit["placements"]:
        events.setdefault(p["job"], []).append((p["at"], 1, "run"))
    maint = fail = 0
    lost = {"work": 0.0, "restart": 0.0, "failures": 0.0}
    for it in audit["interruptions"]:
        if not t0 <= it["at"] <= end:
            continue
        events.setdefault(it["job"], []).append((it["at"], 0, "stop"))  # before a re-placement at that instant
        g = gpus[it["job"]]
        if it["reason"].startswith("host failed"):
            fail += 1
            lost["failures"] += it["lost_gpu_hours"] + spec.jobs.restart_s / HOUR * g
        else:
            maint += 1
            lost["work"] += it["lost_gpu_hours"]
            lost["restart"] += spec.jobs.restart_s / HOUR * g
    running_gpu_h = waiting_gpu_h = 0.0
    for job, evs in events.items():
        evs.sort()
        since: float | None = None
        stopped_at: float | None = None
        for t, _, kind in evs:
            if kind == "run" and since is None:
                since = t
                if stopped_at is not None:
                    waiting_gpu_h += (t - stopped_at) / HOUR * gpus[job]
                    stopped_at = None
            elif kind == "stop" and since is not None:
                running_gpu_h += (t - since) / HOUR * gpus[job]
                since, stopped_at = None, t
        if since is not None:
            running_gpu_h += (end - since) / HOUR * gpus[job]
        elif stopped_at is not None:
            waiting_gpu_h += (end - stopped_at) / HOUR * gpus[job]
    g = spec.gpus_per_host
    maintenance_lost = lost["work"] + lost["restart"] + checkpoint_gpu_h
    useful = running_gpu_h - maintenance_lost - lost["failures"]
    rollout_h = None if rollout_end is None else (rollout_end - t0) / HOUR
    return {
        "strategy": strategy if strategy != "train" else f"train x{domains}",
        "domains": domains if strategy == "train" else (1 if strategy == "window" else None),
        "largest_domain_hosts": largest if strategy != "naive" else round(spec.naive_fraction * spec.hosts),
        "jobs": len(gpus),
        "busy_hosts": sum(gpus.values()) // g,
        "min_serving_fraction": round(low, 4),
        "mean_serving_fraction": round(serving_area / (total * horizon), 4),
        "floor_fraction": round(floor / total, 4) if strategy == "train" else None,
        "floor_held": floor_held if strategy == "train" else None,
        "max_domains_out": max((len(s["domains_out"]) for s in samples if s["t"] <= end), default=0),
        "maintenance_interruptions": maint,
        "failure_interruptions": fail,
        "gpu_h_lost_interruptions": round(maintenance_lost + waiting_gpu_h, 1),
        "gpu_h_lost_work": round(lost["work"], 1),
        "gpu_h_waiting": round(waiting_gpu_h, 1),
        "gpu_h_lost_failures": round(lost["failures"], 1),
        "hosts_upgraded": done,
        "rollout_hours": None if rollout_h is None else round(rollout_h, 2),
        "cycle_held": rollout_end is not None and done == total,
        "cost_gpu_h": round(total * g * horizon / HOUR - useful, 1),
    }


def default_counts(spec: StudySpec, best: int | None) -> list[int]:
    inp = spec.sizing()
    units = math.ceil(spec.hosts / spec.unit_hosts)
    cap = int(spec.max_domains_down * spec.cycle_days * 86400 / (
        spec.work.stop_overhead_s + spec.work.drain_s + spec.work.install_s + spec.work.reboot_s
        + spec.work.check_s + spec.work.return_s + 4 * spec.step_s))
    centre = best or max(2, min(units, cap) // 2)
    counts = {max(2, min(units, cap, round(centre * f))) for f in (0.25, 0.5, 1, 2, 4)}
    del inp
    return sorted(counts)


def study(spec: StudySpec, strategies: tuple[str, ...] = ("train", "window", "naive")) -> dict[str, Any]:
    """Every strategy on the same fleet, jobs and release; the planner's prediction beside the measurement."""
    p = plan(spec.sizing())
    best = p["best"]["domains"] if p["best"] else None
    counts = sorted(set(spec.counts)) if spec.counts else default_counts(spec, best)
    rows: list[dict[str, Any]] = []
    predicted = {r["domains"]: r for r in p["rows"]}
    if "train" in strategies:
        for n in counts:
            row = run_strategy(spec, "train", n)
            row["predicted_cost_gpu_h"] = round(predicted[n]["cost_gpu_h"], 1) if n in predicted else None
            rows.append(row)
    for s in ("window", "naive"):
        if s in strategies:
            rows.append(run_strategy(spec, s))
    trains = [r for r in rows if r["domains"] and r["strategy"].startswith("train") and r["cycle_held"]]
    measured_best = min(trains, key=lambda r: r["cost_gpu_h"])["domains"] if trains else None
    return {
        "spec": spec.model_dump(),
        "fleet_days": round(len(rows) * spec.cycle_days, 1),
        "planner_best": best,
        "counts": counts,
        "measured_best": measured_best,
        "steps_apart": (abs(counts.index(best) - counts.index(measured_best))
                        if best in counts and measured_best in counts else None),
        "rows": rows,
    }


def describe(s: dict[str, Any]) -> str:
    lines = [f"{s['spec']['hosts']} hosts, cycle {s['spec']['cycle_days']:g} days, {s['fleet_days']} fleet-days "
             f"simulated; planner's best {s['planner_best']} domains, study's best {s['measured_best']} "
             f"({s['steps_apart']} step(s) apart in {s['counts']})",
             f"{'strategy':<13}{'min serv':>9}{'mean serv':>10}{'floor':>7}{'held':>6}{'interr':>7}"
             f"{'GPU-h lost':>11}{'rollout h':>10}{'cycle':>6}{'cost GPU-h':>12}{'model':>10}"]
    for r in s["rows"]:
        floor = f"{r['floor_fraction']:.1%}" if r["floor_fraction"] is not None else "-"
        held = {True: "yes", False: "NO", None: "-"}[r["floor_held"]]
        roll = f"{r['rollout_hours']:.1f}" if r["rollout_hours"] is not None else "-"
        model = f"{r['predicted_cost_gpu_h']:,.0f}" if r.get("predicted_cost_gpu_h") is not None else "-"
        lines.append(f"{r['strategy']:<13}{r['min_serving_fraction']:>9.1%}{r['mean_serving_fraction']:>10.1%}"
                     f"{floor:>7}{held:>6}{r['maintenance_interruptions']:>7}{r['gpu_h_lost_interruptions']:>11,.0f}"
                     f"{roll:>10}{'yes' if r['cycle_held'] else 'NO':>6}{r['cost_gpu_h']:>12,.0f}{model:>10}")
    return "\n".join(lines)


def to_json(s: dict[str, Any]) -> str:
    return json.dumps(s, indent=1)


def chart(s: dict[str, Any], path: str) -> str:
    """Cost per cycle measured vs the model for trains; interruption losses for every strategy."""
    trains = [r for r in s["rows"] if r["strategy"].startswith("train")]
    try:
        import matplotlib
    except ImportError:
        from railyard.tools.sizing import _svg

        xs = [r["domains"] for r in trains]
        return _svg(xs, [("measured", [r["cost_gpu_h"] for r in trains], "#222222"),
                         ("model", [r["predicted_cost_gpu_h"] or 0 for r in trains], "#4c72b0")],
                    None, "cost per cycle (GPU-hours)", path.rsplit(".", 1)[0] + ".svg")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    xs = [r["domains"] for r in trains]
    ax1.plot(xs, [r["cost_gpu_h"] for r in trains], "o-", color="#222222", label="measured (simulator)")
    ax1.plot(xs, [r["predicted_cost_gpu_h"] for r in trains], "s--", color="#4c72b0", label="model (railyard size)")
    if s["planner_best"]:
        ax1.axvline(s["planner_best"], color="#2e9d4a", ls=":", label=f"planner's best: {s['planner_best']}")
    ax1.set_xscale("log")
    ax1.set_xlabel("domains")
    ax1.set_ylabel("GPU-hours not spent on useful work, per cycle")
    ax1.legend(fontsize=8)
    names = [r["strategy"] for r in s["rows"]]
    ax2.bar(names, [r["gpu_h_lost_interruptions"] for r in s["rows"]], color="#dd8452")
    ax2.set_ylabel("GPU-hours lost to maintenance interruptions")
    ax2.tick_params(axis="x", rotation=30)
    for i, r in enumerate(s["rows"]):
        ax2.text(i, r["gpu_h_lost_interruptions"], f"min {r['min_serving_fraction']:.0%}", ha="center",
                 va="bottom", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


__all__ = ["StudySpec", "chart", "describe", "parse_spec", "run_strategy", "study", "to_json"]
