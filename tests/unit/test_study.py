"""The simulation study on the in-process simulator (fake clock): the planner's best count agrees with the
measured one, and trains, a whole-fleet window and naive rolling behave as the issue claims. Short
studies (256 hosts, half-day cycles) keep each test to seconds."""

from __future__ import annotations

from typing import Any

import pytest

from railyard.tools.sizing import SizingError
from railyard.tools.study import parse_spec, run_strategy, study

SHORT: dict[str, Any] = {"hosts": 256, "unit_hosts": 8, "cycle_days": 0.5, "step_s": 30}
CASES = {
    "default": {**SHORT, "jobs": {"sizes": [{"hosts": 4, "share": 0.4}, {"hosts": 32, "share": 0.3},
                                            {"hosts": 48, "share": 0.3}]}},
    "large-jobs": {**SHORT, "jobs": {"restart_s": 1800, "sizes": [{"hosts": 64, "share": 1}]}},
    "small-jobs": {**SHORT, "jobs": {"sizes": [{"hosts": 2, "share": 1}]}},
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_planners_best_count_is_within_one_step_of_the_studys(case: str) -> None:
    s = study(parse_spec(CASES[case]), strategies=("train",))
    assert s["planner_best"] in s["counts"]
    assert s["measured_best"] is not None
    assert s["steps_apart"] is not None and s["steps_apart"] <= 1, s["rows"]
    for r in s["rows"]:
        assert r["floor_held"], r
        assert r["max_domains_out"] <= 1
        assert r["hosts_upgraded"] == 256


def test_large_jobs_want_fewer_domains_than_small_ones() -> None:
    from railyard.tools.sizing import plan

    best = {c: plan(parse_spec(CASES[c]).sizing())["best"]["domains"] for c in ("large-jobs", "small-jobs")}
    assert best["large-jobs"] < best["small-jobs"]


def test_trains_hold_the_floor_a_window_drops_to_zero_naive_rolling_loses_more() -> None:
    spec = parse_spec(CASES["default"])
    from railyard.tools.sizing import plan

    n = plan(spec.sizing())["best"]["domains"]
    train = run_strategy(spec, "train", n)
    window = run_strategy(spec, "window")
    naive = run_strategy(spec, "naive")
    # trains: never below 1 - max_domains_down/N of the fleet (the largest domain), less broken hosts
    assert train["floor_held"] is True
    assert train["floor_fraction"] <= 1 - 1 / n + 1e-9
    assert train["min_serving_fraction"] >= train["floor_fraction"] - 0.05  # failures at most a few hosts here
    assert train["cycle_held"] and train["rollout_hours"] <= 12
    assert train["gpu_h_lost_work"] == 0  # every drained job had a fresh checkpoint
    # a whole-fleet window: nothing serves while it is open
    assert window["min_serving_fraction"] == 0
    assert train["min_serving_fraction"] > 0.85
    # naive rolling: no checkpoint requests, jobs re-placed onto hosts not yet upgraded and hit again
    assert naive["gpu_h_lost_work"] > 0
    assert naive["gpu_h_lost_interruptions"] > train["gpu_h_lost_interruptions"]
    assert naive["maintenance_interruptions"] > train["maintenance_interruptions"]


def test_the_study_input_is_validated_naming_field_and_value() -> None:
    with pytest.raises(SizingError, match=r"naive_fraction.*1\.5"):
        parse_spec({"naive_fraction": 1.5})
    with pytest.raises(SizingError, match=r"hosts.*3"):
        parse_spec({"hosts": 3})
    with pytest.raises(SizingError, match="unknown strategy"):
        run_strategy(parse_spec(SHORT), "yolo")
