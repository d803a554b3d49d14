"""The domain-size planner against its closed form, the unit constraint, validation and the config layout."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from railyard.domain.config import DEFAULT_CONFIG, RailyardConfig, load_config
from railyard.tools.sizing import (
    SizingError,
    config_with_layout,
    evaluate,
    input_from_config,
    layout,
    load_input,
    parse_input,
    partition,
    plan,
)

H, J, U, FB = 4096, 64, 0.8, 0.05


def one_pool(checkpoint: bool = True, **jobs: object) -> dict[str, object]:
    return {"skus": {"h100": {"hosts": H, "unit_hosts": 1}},
            "jobs": {"sizes": [{"hosts": J, "share": 1}], "utilization": U, "restart_s": 600, "checkpoint_s": 60,
                     "checkpoint_interval_s": 1800, **jobs},
            "cycle_days": 7, "failure_buffer_fraction": FB, "checkpoint_before_drain": checkpoint}


def closed_form(n: int, k_s: float) -> float:
    """cost(N) written out by hand from docs/sizing.md: m*D*T*g + (u*(1 - fb) - m*D/H)*g*K*(H + N*(J-1))."""
    d, t, g, k = math.ceil(H / n), 7 * 24.0, 8, k_s / 3600
    return d * t * g + (U * (1 - FB) - d / H) * g * k * (H + n * (J - 1))


@pytest.mark.parametrize(("checkpoint", "k_s"), [(True, 600 + 60), (False, 600 + 1800 / 2)])
def test_the_planner_finds_the_closed_form_optimum(checkpoint: bool, k_s: float) -> None:
    p = plan(parse_input(one_pool(checkpoint)))
    feasible = [n for n in range(1, H + 1) if n * 1590 <= 7 * 86400]  # a stop: 60+120+900+180+300+30 s
    want = min(feasible, key=lambda n: (closed_form(n, k_s), n))
    assert p["best"]["domains"] == want
    # N* = sqrt(a/b): a = m*H*g*(T - K), b = u*g*K*(1-fb)*(J-1); the integer optimum sits next to it
    t, k = 7 * 24.0, k_s / 3600
    n_star = math.sqrt(H * 8 * (t - k) / (U * 8 * k * (1 - FB) * (J - 1)))
    assert p["analytic_optimum"] == pytest.approx(n_star)
    assert abs(want - n_star) / n_star < 0.05
    for n in (16, 64, 256, want):
        row = evaluate(parse_input(one_pool(checkpoint)), n)
        assert row is not None
        assert row["cost_gpu_h"] == pytest.approx(closed_form(n, k_s), rel=1e-9)
        assert row["capacity_gpu_h"] == pytest.approx(row["buffer_gpu_h"] + row["stops_gpu_h"])


def test_checkpoint_requests_move_the_optimum_to_smaller_domains() -> None:
    with_ckpt = plan(parse_input(one_pool(True)))["best"]["domains"]
    naive = plan(parse_input(one_pool(False)))["best"]["domains"]
    assert naive < with_ckpt  # costlier interruptions: fewer, larger domains


def test_larger_jobs_want_fewer_domains() -> None:
    small = plan(parse_input(one_pool(sizes=[{"hosts": 4, "share": 1}])))["best"]["domains"]
    large = plan(parse_input(one_pool(sizes=[{"hosts": 512, "share": 1}])))["best"]["domains"]
    assert large < small


def test_the_cycle_limits_the_domain_count() -> None:
    inp = parse_input({**one_pool(sizes=[{"hosts": 2, "share": 1}]), "cycle_days": 1})
    p = plan(inp)
    assert p["best"]["domains"] == 86400 // 1590  # tiny jobs want many domains; the cycle allows 54 stops
    assert all(not r["feasible"] for r in p["rows"] if r["domains"] > 54)


def uneven_units() -> dict[str, object]:
    sizes = [18, 18, 16, 18, 9, 18, 18, 32, 18, 18, 4, 18, 18, 18, 16, 18, 18, 18, 27, 18]
    units = [{"name": f"rack-{i:02d}", "sku": "gb200" if i % 7 else "h100", "hosts": n,
              "host_names": [f"r{i:02d}-n{j:02d}" for j in range(n)]} for i, n in enumerate(sizes)]
    return {"units": units, "jobs": {"sizes": [{"hosts": 36, "share": 0.7}, {"hosts": 4, "share": 0.3}]},
            "cycle_days": 3}


def test_a_domain_never_splits_a_unit() -> None:
    inp = parse_input(uneven_units())
    units = {u.name: u for u in inp.units}
    for n in range(2, len(units) + 1):
        lay = layout(inp, n)
        assert len(lay) == n
        placed = [u for d in lay for u in d["units"]]
        assert sorted(placed) == sorted(units)  # every unit in exactly one domain, whole
        for d in lay:
            assert {units[u].sku for u in d["units"]} == {d["sku"]}  # a domain holds one SKU
            assert d["hosts"] == sum(units[u].hosts for u in d["units"])
    # contiguous runs, as even as the units allow
    pool = [u for u in inp.units if u.sku == "gb200"]
    runs = partition(pool, 4)
    assert [u for r in runs for u in r] == pool
    sizes = [sum(u.hosts for u in r) for r in runs]
    assert max(sizes) - min(sizes) <= max(u.hosts for u in pool)
    best = plan(inp)["best"]
    assert best["largest_domain_hosts"] >= 32  # the 32-host rack is never split, whatever the count


def test_bad_input_is_refused_naming_field_and_value(tmp_path: Path) -> None:
    with pytest.raises(SizingError, match=r"jobs\.utilization.*1\.5"):
        parse_input(one_pool(utilization=1.5))
    with pytest.raises(SizingError, match=r"skus\.h100\.unit_hosts.*0"):
        parse_input({**one_pool(), "skus": {"h100": {"hosts": 10, "unit_hosts": 0}}})
    with pytest.raises(SizingError, match="exactly one of 'skus'"):
        parse_input({**uneven_units(), "skus": {"h100": {"hosts": 10}}})
    with pytest.raises(SizingError, match=r"jobs\.sizes\.0\.hosst.*Extra inputs"):
        parse_input(one_pool(sizes=[{"hosst": 4, "share": 1}]))
    f = tmp_path / "in.yaml"
    f.write_text("skus: {h100: {hosts: 64}}\njobs: {sizes: [{hosts: 8, share: 1}]}\ncycle_days: -1\n")
    with pytest.raises(SizingError, match=r"in\.yaml.*cycle_days.*-1"):
        load_input(f)
    f.write_text(yaml.safe_dump(one_pool()))
    assert load_input(f).jobs.utilization == U


def test_the_proposed_layout_is_written_into_the_config(tmp_path: Path) -> None:
    cfg = load_config(DEFAULT_CONFIG)
    inp = input_from_config(cfg)
    assert sum(u.hosts for u in inp.units) == cfg.total_hosts
    p = plan(inp)
    assert p["best"] is not None
    text = config_with_layout(DEFAULT_CONFIG, inp, 4)
    new = RailyardConfig.model_validate(yaml.safe_load(text))
    assert len(new.domains) == 4
    old_domain = {h: d.name for d in cfg.domains for h in d.hosts}
    for d in new.domains:  # whole pods only
        pods = {old_domain[h] for h in d.hosts}
        assert sum(len(cfg.domain(pod).hosts) for pod in pods) == len(d.hosts)
    assert new.total_hosts == cfg.total_hosts
    no_names = parse_input(one_pool())
    with pytest.raises(SizingError, match="host_names"):
        config_with_layout(DEFAULT_CONFIG, no_names, 4)
