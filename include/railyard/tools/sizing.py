"""The domain-size planner: for every feasible domain count, the expected cost of one maintenance cycle.

A cycle costs GPU-hours two ways (docs/sizing.md has the formulas and the assumptions):
- capacity held out of service: the maintenance buffer reserved for the largest domain, idle between
  stops, plus the hosts out while the train stops at a domain;
- job interruptions: every stop touches the jobs that run on its hosts; each pays its restart, the
  work since its last checkpoint (none when the train asks for a checkpoint first) and the checkpoint.
More domains shrink the buffer (~1/N) but cut more jobs at the domains' edges (~N). Units that cannot
be split (racks, network pods) are never split: a domain is a run of whole, contiguous units.
"""

from __future__ import annotations

import bisect
import itertools
import json
import math
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, model_validator

from railyard.domain.models import Strict, Token

HOUR = 3600.0


class SizingError(ValueError):
    """Bad sizing input; the message names the field and the value."""


class UnitSpec(Strict):
    """A set of hosts that is never split across domains (a rack, a network pod)."""

    name: Token
    sku: Token = "gpu"
    hosts: int = Field(ge=1, description="hosts in the unit")
    host_names: list[str] | None = Field(default=None, description="the hosts, to write a layout into the config")


class SkuFleetSpec(Strict):
    hosts: int = Field(ge=1, description="hosts of this SKU")
    unit_hosts: int = Field(default=1, ge=1, description="hosts per rack/pod (a unit never split)")


class JobClass(Strict):
    hosts: int = Field(ge=1, description="hosts per job")
    share: float = Field(gt=0, description="share of the busy hosts that run jobs of this size")


class JobsModel(Strict):
    sizes: list[JobClass] = Field(min_length=1)
    utilization: float = Field(default=0.9, gt=0, le=1, description="share of the hosts outside the failure "
                               "buffer that jobs use with no maintenance buffer; the buffer comes out of it")
    checkpoint_interval_s: float = Field(default=1800, gt=0)
    checkpoint_s: float = Field(default=60, ge=0, description="time a job spends writing a checkpoint")
    restart_s: float = Field(default=600, ge=0, description="time a job takes to restart elsewhere")


class WorkModel(Strict):
    drain_s: float = Field(default=120, ge=0)
    install_s: float = Field(default=900, ge=0, description="all installs of one visit, per host")
    reboot_s: float = Field(default=180, ge=0)
    check_s: float = Field(default=300, ge=0)
    return_s: float = Field(default=30, ge=0)
    stop_overhead_s: float = Field(default=60, ge=0, description="per stop: lease, checkpoint wait, bookkeeping")
    parallel_hosts: int | None = Field(default=None, ge=1, description="hosts worked at once in a stop; None: all")


class SizingInput(Strict):
    skus: dict[Token, SkuFleetSpec] = Field(default_factory=dict)
    units: list[UnitSpec] = Field(default_factory=list)
    gpus_per_host: int = Field(default=8, ge=1)
    jobs: JobsModel
    work: WorkModel = WorkModel()
    cycle_days: float = Field(default=7, gt=0, description="every domain visited at least this often")
    max_domains_down: int = Field(default=1, ge=1)
    failure_buffer_fraction: float = Field(default=0.05, ge=0, lt=1)
    checkpoint_before_drain: bool = Field(default=True, description="the train asks jobs to checkpoint first")

    @model_validator(mode="after")
    def _fleet(self) -> SizingInput:
        if bool(self.skus) == bool(self.units):
            raise ValueError("give the fleet as exactly one of 'skus' (hosts and unit_hosts per SKU) or 'units'")
        names = [u.name for u in self.units]
        if len(set(names)) != len(names):
            dup = sorted({n for n in names if names.count(n) > 1})[0]
            raise ValueError(f"units: duplicate unit name {dup!r}")
        for i, u in enumerate(self.units):
            if u.host_names is not None and len(u.host_names) != u.hosts:
                raise ValueError(f"units[{i}].host_names: {len(u.host_names)} names for hosts={u.hosts}")
        return self

    def pools(self) -> dict[str, list[UnitSpec]]:
        """Units per SKU, in order (a SKU's units are its capacity pool)."""
        out: dict[str, list[UnitSpec]] = {}
        if self.units:
            for u in self.units:
                out.setdefault(u.sku, []).append(u)
            return out
        for sku, spec in sorted(self.skus.items()):
            full, rest = divmod(spec.hosts, spec.unit_hosts)
            sizes = [spec.unit_hosts] * full + ([rest] if rest else [])
            out[sku] = [UnitSpec(name=f"{sku}-u{i + 1:05d}", sku=sku, hosts=n) for i, n in enumerate(sizes)]
        return out


def _problems(exc: ValidationError) -> list[str]:
    out = []
    for e in exc.errors():
        where = ".".join(str(p) for p in e["loc"]) or "(top)"
        value = e.get("input")
        shown = "" if isinstance(value, dict | list) else f" (value: {value!r})"
        out.append(f"{where}: {e['msg']}{shown}")
    return out


def parse_input(data: Any, source: str = "input") -> SizingInput:
    """Validate sizing input; every problem is named by field and value."""
    try:
        return SizingInput.model_validate(data)
    except ValidationError as exc:
        raise SizingError(f"invalid sizing input {source}: " + "; ".join(_problems(exc))) from None


def load_input(path: str | Path) -> SizingInput:
    """A YAML or JSON file (JSON is YAML)."""
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text())
    except OSError as exc:
        raise SizingError(f"cannot read sizing input {p}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise SizingError(f"sizing input {p} is not YAML/JSON: {exc}") from None
    return parse_input(data, str(p))


def input_from_config(cfg: Any, restart_s: float = 600, utilization: float | None = None) -> SizingInput:
    """The config's fleet as units (each configured domain is a unit: it is never split, domains may be
    merged), its simulator jobs, its stop estimates and its trains' installs and cycle."""
    units = [UnitSpec(name=d.name, sku=d.sku, hosts=len(d.hosts), host_names=list(d.hosts)) for d in cfg.domains]
    sim = cfg.simulator
    total = max(1, cfg.total_hosts)
    busy = sim.jobs.count * sim.jobs.hosts_per_job
    util = utilization if utilization is not None else min(1.0, max(0.05, busy / total))
    comps = {c.name: c for c in cfg.components}
    rels = {r.id: r for r in cfg.releases}
    install = max((sum(comps[rels[r].component].duration_s for r in t.releases) for t in cfg.trains), default=0.0)
    cycles = [t.cycle_days for t in cfg.trains if t.cycle_days]
    est = cfg.estimates
    fail = cfg.buffers.failure
    fb = fail.fraction if fail.fraction is not None else (fail.hosts or 0) / total
    return parse_input({
        "units": [u.model_dump() for u in units],
        "gpus_per_host": sim.gpus_per_host,
        "jobs": {"sizes": [{"hosts": sim.jobs.hosts_per_job, "share": 1.0}], "utilization": util,
                 "checkpoint_interval_s": sim.jobs.checkpoint_interval_s, "checkpoint_s": est.checkpoint_s,
                 "restart_s": restart_s},
        "work": {"drain_s": est.drain_s, "install_s": install, "reboot_s": est.reboot_s, "check_s": est.check_s,
                 "return_s": est.return_s},
        "cycle_days": min(cycles) if cycles else 7,
        "max_domains_down": cfg.max_domains_down,
        "failure_buffer_fraction": min(fb, 0.99),
    }, "from the config")


# ---- the model --------------------------------------------------------------------------------
def stop_seconds(work: WorkModel, hosts: int) -> float:
    """One stop of `hosts` hosts: overhead, drain, then installs+reboot+check in waves, then return."""
    waves = 1 if work.parallel_hosts is None else math.ceil(hosts / work.parallel_hosts)
    return work.stop_overhead_s + work.drain_s + waves * (work.install_s + work.reboot_s + work.check_s) + work.return_s


def interruption_seconds(inp: SizingInput) -> float:
    """What one touched job loses, per GPU: restart + work since its last checkpoint + the checkpoint."""
    j = inp.jobs
    if inp.checkpoint_before_drain:
        return j.restart_s + j.checkpoint_s  # a fresh checkpoint: nothing since it is lost
    return j.restart_s + j.checkpoint_interval_s / 2  # the drain lands on average half an interval after one


def _cuts(prefix: list[int], n: int) -> list[int]:
    """Indices that cut units into `n` contiguous runs: each cut at the unit boundary nearest to an even
    share of the hosts, every run keeping at least one unit. `prefix[i]` is the hosts of the first i units."""
    units, total = len(prefix) - 1, prefix[-1]
    cuts = [0]
    last = 0
    left = bisect.bisect_left
    for k in range(1, n):
        target = total * k / n
        i = left(prefix, target, last)
        if i > 0 and (i > units or target - prefix[i - 1] <= prefix[i] - target):
            i -= 1
        if i <= last:
            i = last + 1
        if i > units - n + k:
            i = units - n + k
        cuts.append(i)
        last = i
    cuts.append(units)
    return cuts


def _prefix(units: list[UnitSpec]) -> list[int]:
    out = [0]
    for u in units:
        out.append(out[-1] + u.hosts)
    return out


def partition(units: list[UnitSpec], n: int) -> list[list[UnitSpec]]:
    """`n` runs of whole, contiguous units with host counts as even as the units allow."""
    if not 1 <= n <= len(units):
        raise SizingError(f"cannot make {n} domains from {len(units)} units")
    cuts = _cuts(_prefix(units), n)
    return [units[a:b] for a, b in itertools.pairwise(cuts)]


def _domain_sizes(prefix: list[int], n: int, equal: bool) -> dict[int, int]:
    """Host count -> how many domains of `partition(units, n)` have it; O(1) when the units are equal."""
    if equal:
        first = prefix[1]
        q, r = divmod(len(prefix) - 1, n)
        return {k: v for k, v in (((q + 1) * first, r), (q * first, n - r)) if v}
    out: dict[int, int] = {}
    for a, b in itertools.pairwise(_cuts(prefix, n)):
        size = prefix[b] - prefix[a]
        out[size] = out.get(size, 0) + 1
    return out


def _allocate(pools: dict[str, list[UnitSpec]], n: int, hosts: dict[str, int] | None = None) -> dict[str, int] | None:
    """Domains per pool for `n` in all, in proportion to hosts (largest remainder), each 1..its units."""
    if n < len(pools) or n > sum(len(u) for u in pools.values()):
        return None
    hosts = hosts if hosts is not None else {s: sum(u.hosts for u in us) for s, us in pools.items()}
    total = sum(hosts.values())
    alloc = {s: max(1, min(len(pools[s]), int(n * hosts[s] / total))) for s in pools}
    order = sorted(pools, key=lambda s: (-(n * hosts[s] / total - int(n * hosts[s] / total)), s))
    while sum(alloc.values()) != n:
        step = 1 if sum(alloc.values()) < n else -1
        moved = False
        for s in order:
            if (step > 0 and alloc[s] < len(pools[s])) or (step < 0 and alloc[s] > 1):
                alloc[s] += step
                moved = True
                break
        if not moved:
            return None
    return alloc


def _shapes(pools: dict[str, list[UnitSpec]]) -> dict[str, tuple[list[int], bool]]:
    return {s: (_prefix(us), all(u.hosts == us[0].hosts for u in us)) for s, us in pools.items()}


def evaluate(inp: SizingInput, n: int, pools: dict[str, list[UnitSpec]] | None = None,
             shape: dict[str, tuple[list[int], bool]] | None = None) -> dict[str, Any] | None:
    """The expected cost of one cycle with `n` domains (None: `n` domains cannot be made)."""
    pools = pools if pools is not None else inp.pools()
    shape = shape if shape is not None else _shapes(pools)
    hosts = {s: prefix[-1] for s, (prefix, _) in shape.items()}
    alloc = _allocate(pools, n, hosts)
    if alloc is None:
        return None
    g, m, cycle = inp.gpus_per_host, inp.max_domains_down, inp.cycle_days * 86400
    per_touch_h = interruption_seconds(inp) / HOUR
    held = stops_gpu_h = touched = interrupt_gpu_h = train_s = 0.0
    largest = 0
    for sku in pools:
        prefix, equal = shape[sku]
        sizes = _domain_sizes(prefix, alloc[sku], equal)
        h = sum(size * k for size, k in sizes.items())
        dmax = max(sizes)
        largest = max(largest, dmax)
        down = min(m, alloc[sku])
        held += down * dmax * cycle / HOUR * g
        for size, k in sizes.items():
            t_stop = stop_seconds(inp.work, size)
            stops_gpu_h += k * size * t_stop / HOUR * g
            train_s += k * t_stop
        # jobs fill `utilization` of the hosts outside the failure buffer, less the maintenance buffer; a stop of
        # D hosts touches the jobs of size J that overlap it: share x busy x (D + J - 1) / J of them, summed over
        # the pool's domains
        busy = max(0.0, inp.jobs.utilization * (1 - inp.failure_buffer_fraction) - down * dmax / h)
        for c in inp.jobs.sizes:
            j = min(c.hosts, h)
            w = c.share / sum(x.share for x in inp.jobs.sizes)
            jobs_touched = busy * w * (h + alloc[sku] * (j - 1)) / j
            touched += jobs_touched
            interrupt_gpu_h += jobs_touched * j * g * per_touch_h
    cycle_s = train_s / m
    capacity = max(held, stops_gpu_h)
    return {
        "domains": n,
        "largest_domain_hosts": largest,
        "stop_s": round(train_s / n, 1),
        "cycle_needed_days": round(cycle_s / 86400, 3),
        "feasible": cycle_s <= cycle + 1e-9,
        "guaranteed_serving_fraction": round(1 - sum(min(m, a) for a in alloc.values()) * largest
                                             / sum(hosts.values()), 4),
        "capacity_gpu_h": capacity,
        "buffer_gpu_h": capacity - stops_gpu_h,
        "stops_gpu_h": stops_gpu_h,
        "jobs_touched": touched,
        "interruption_gpu_h": interrupt_gpu_h,
        "cost_gpu_h": capacity + interrupt_gpu_h,
    }


def plan(inp: SizingInput) -> dict[str, Any]:
    """Domain counts from 1 to the number of units (every one that could hold the cycle, a sample of the
    rest): cost and feasibility of each; the feasible optimum and its layout."""
    pools = inp.pools()
    shape = _shapes(pools)
    n_units = sum(len(u) for u in pools.values())
    # no count above m*T / (the shortest possible stop) holds the cycle: those are sampled, not all computed
    cap = int(inp.max_domains_down * inp.cycle_days * 86400 / max(stop_seconds(inp.work, 1), 1e-9)) + 1
    counts = set(range(1, min(n_units, max(cap, 200)) + 1))
    x = float(max(cap, 200))
    while x < n_units:
        counts.add(int(x))
        x *= 1.2
    counts.add(n_units)
    rows = [r for n in sorted(counts) if (r := evaluate(inp, n, pools, shape)) is not None]
    feasible = [r for r in rows if r["feasible"]]
    best = min(feasible, key=lambda r: (r["cost_gpu_h"], r["domains"])) if feasible else None
    hosts = sum(u.hosts for us in pools.values() for u in us)
    out: dict[str, Any] = {
        "hosts": hosts,
        "gpus": hosts * inp.gpus_per_host,
        "units": n_units,
        "skus": {s: sum(u.hosts for u in us) for s, us in pools.items()},
        "cycle_days": inp.cycle_days,
        "max_domains_down": inp.max_domains_down,
        "interruption_s_per_job": interruption_seconds(inp),
        "rows": rows,
        "best": best,
        "analytic_optimum": analytic_optimum(inp),
    }
    if best is not None:
        out["layout"] = layout(inp, best["domains"], pools)
    return out


def analytic_optimum(inp: SizingInput) -> float | None:
    """N* = sqrt(a / b) for one pool of single-host units, where cost(N) = a/N + b*N + const (docs/sizing.md)."""
    pools = inp.pools()
    if len(pools) != 1:
        return None
    h = sum(u.hosts for u in next(iter(pools.values())))
    g, m, t = inp.gpus_per_host, inp.max_domains_down, inp.cycle_days * 86400 / HOUR
    k = interruption_seconds(inp) / HOUR
    u, fb = inp.jobs.utilization, inp.failure_buffer_fraction
    total = sum(c.share for c in inp.jobs.sizes)
    jbar = sum(c.share / total * min(c.hosts, h) for c in inp.jobs.sizes)
    a = m * h * g * (t - k)
    b = u * g * k * (1 - fb) * (jbar - 1)
    if a <= 0 or b <= 0:
        return None
    return math.sqrt(a / b)


def layout(inp: SizingInput, n: int, pools: dict[str, list[UnitSpec]] | None = None) -> list[dict[str, Any]]:
    """The proposed domains: which units go into which, per SKU, in unit order."""
    pools = pools if pools is not None else inp.pools()
    alloc = _allocate(pools, n)
    if alloc is None:
        raise SizingError(f"cannot make {n} domains from this fleet")
    out: list[dict[str, Any]] = []
    for sku, units in pools.items():
        for i, dom in enumerate(partition(units, alloc[sku])):
            out.append({"name": f"{sku}-d{i + 1:03d}", "sku": sku, "hosts": sum(u.hosts for u in dom),
                        "units": [u.name for u in dom]})
    return out


def config_with_layout(config_path: str | Path, inp: SizingInput, n: int) -> str:
    """The config file's YAML with `domains` replaced by the proposed layout (and the maintenance buffer
    raised to hold the largest domain if it did not); validated before it is returned."""
    from railyard.domain.config import ConfigError, RailyardConfig

    missing = [u.name for u in inp.units if u.host_names is None]
    if not inp.units or missing:
        raise SizingError("a layout can be written into the config only when every unit lists its hosts "
                          f"(units without host_names: {', '.join(missing[:5]) or 'all'})")
    raw = yaml.safe_load(Path(config_path).read_text())
    by_name = {u.name: u for u in inp.units}
    domains = []
    for d in layout(inp, n):
        hosts = [h for un in d["units"] for h in (by_name[un].host_names or [])]
        domains.append({"name": d["name"], "sku": d["sku"], "hosts": hosts})
    raw["domains"] = domains
    largest = max(len(d["hosts"]) for d in domains)
    maint = (raw.get("buffers") or {}).get("maintenance") or {}
    total = sum(len(d["hosts"]) for d in domains)
    have = maint.get("hosts") if maint.get("hosts") is not None else int(float(maint.get("fraction", 0)) * total)
    if have < largest * raw.get("max_domains_down", 1):
        raw.setdefault("buffers", {})["maintenance"] = {"hosts": largest * raw.get("max_domains_down", 1)}
    for t in raw.get("trains") or []:
        if t.get("domains"):
            t.pop("domains")  # the old names are gone; visit every domain
    for r in raw.get("releases") or []:
        ro = r.get("rollout") or {}
        if ro.get("canary_domains"):
            ro["canary_domains"] = [domains[0]["name"]]
    try:
        RailyardConfig.model_validate(raw)
    except (ValidationError, ConfigError) as exc:
        raise SizingError(f"the config with the proposed layout does not validate: {exc}") from None
    return str(yaml.safe_dump(raw, sort_keys=False, width=120))


# ---- output -----------------------------------------------------------------------------------
def describe(p: dict[str, Any], rows: int = 12) -> str:
    """A table around the optimum, then the proposed layout in short."""
    lines = [f"{p['hosts']:,} hosts ({p['gpus']:,} GPUs) in {p['units']:,} units; cycle {p['cycle_days']:g} days, "
             f"max_domains_down {p['max_domains_down']}; a touched job loses {p['interruption_s_per_job']:.0f} s",
             f"{'domains':>8} {'largest':>8} {'serving>=':>9} {'cycle d':>8} {'buffer':>12} {'stops':>12} "
             f"{'jobs hit':>9} {'interrupt':>12} {'total GPU-h':>13}"]
    best = p["best"]
    all_rows = p["rows"]
    if best is not None and len(all_rows) > rows:
        i = next(k for k, r in enumerate(all_rows) if r["domains"] == best["domains"])
        lo = max(0, min(i - rows // 2, len(all_rows) - rows))
        shown = all_rows[lo:lo + rows]
    else:
        shown = all_rows[:rows]
    for r in shown:
        mark = " <- best" if best is not None and r["domains"] == best["domains"] else ""
        mark = mark or ("" if r["feasible"] else " (cycle not held)")
        lines.append(f"{r['domains']:>8} {r['largest_domain_hosts']:>8} {r['guaranteed_serving_fraction']:>9.1%} "
                     f"{r['cycle_needed_days']:>8.2f} {r['buffer_gpu_h']:>12,.0f} {r['stops_gpu_h']:>12,.0f} "
                     f"{r['jobs_touched']:>9.1f} {r['interruption_gpu_h']:>12,.0f} {r['cost_gpu_h']:>13,.0f}{mark}")
    if best is None:
        lines.append("no domain count holds the cycle: lengthen cycle_days, raise max_domains_down or shorten stops")
        return "\n".join(lines)
    if p.get("analytic_optimum"):
        lines.append(f"analytic optimum (single-host units): N* = {p['analytic_optimum']:.1f}")
    lay = p["layout"]
    lines.append(f"proposed: {best['domains']} domains, largest {best['largest_domain_hosts']} hosts; "
                 f"{len(lay)} domains, e.g. {lay[0]['name']} = {', '.join(lay[0]['units'][:4])}"
                 f"{' ...' if len(lay[0]['units']) > 4 else ''}")
    return "\n".join(lines)


def to_json(p: dict[str, Any]) -> str:
    return json.dumps(p, indent=1)


def chart(p: dict[str, Any], path: str) -> str:
    """The cost curve with its parts: PNG through matplotlib when installed, else SVG (path's suffix swapped)."""
    rows = p["rows"]
    xs = [r["domains"] for r in rows]
    series = [("capacity held out (buffer + stops)", [r["capacity_gpu_h"] for r in rows], "#4c72b0"),
              ("job interruptions", [r["interruption_gpu_h"] for r in rows], "#dd8452"),
              ("total", [r["cost_gpu_h"] for r in rows], "#222222")]
    best = p["best"]
    title = "expected cost per cycle (GPU-hours)"
    try:
        import matplotlib
    except ImportError:
        return _svg(xs, series, best, title, str(Path(path).with_suffix(".svg")))
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for label, ys, color in series:
        ax.plot(xs, ys, label=label, color=color, lw=2 if label == "total" else 1.4)
    infeasible = [r["domains"] for r in rows if not r["feasible"]]
    if infeasible:
        ax.axvspan(min(infeasible), max(infeasible), color="#f2d0d0", alpha=0.5, label="cycle not held")
    if best is not None:
        ax.axvline(best["domains"], color="#2e9d4a", ls="--", label=f"optimum: {best['domains']} domains")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("domains")
    ax.set_ylabel("GPU-hours per cycle")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _svg(xs: list[int], series: list[tuple[str, list[float], str]], best: dict[str, Any] | None, title: str,
         path: str) -> str:
    w, h, pad = 640, 360, 50
    ymax = max(max(ys) for _, ys, _ in series) or 1.0
    lx = [math.log(max(x, 1)) for x in xs]
    x0, x1 = min(lx), max(lx) if max(lx) > min(lx) else min(lx) + 1

    def pt(x: float, y: float) -> str:
        return f"{pad + (x - x0) / (x1 - x0) * (w - 2 * pad):.1f},{h - pad - y / ymax * (h - 2 * pad):.1f}"

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}">',
             f'<text x="{pad}" y="20" font-size="13">{title}</text>']
    for i, (label, ys, color) in enumerate(series):
        pts = " ".join(pt(x, y) for x, y in zip(lx, ys, strict=True))
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{pts}"/>')
        parts.append(f'<text x="{w - 230}" y="{40 + 15 * i}" font-size="11" fill="{color}">{label}</text>')
    if best is not None:
        bx = pt(math.log(best["domains"]), 0).split(",")[0]
        parts.append(f'<line x1="{bx}" x2="{bx}" y1="{pad}" y2="{h - pad}" stroke="#2e9d4a" stroke-dasharray="4"/>')
        parts.append(f'<text x="{bx}" y="{h - pad + 15}" font-size="11">{best["domains"]} domains</text>')
    parts.append("</svg>")
    Path(path).write_text("\n".join(parts))
    return path


__all__ = ["SizingError", "SizingInput", "chart", "config_with_layout", "describe", "evaluate", "input_from_config",
           "layout", "load_input", "parse_input", "partition", "plan"]
