"""`railyard size` for 75,000 hosts (600,000 GPUs) in racks of 16: the planner's time beside a baseline
measured in the same run (validating the same input, which every command does first). Goal: < 1 s."""

from __future__ import annotations

import json
import time
from typing import Any

from railyard.tools.sizing import describe, parse_input, plan

INPUT: dict[str, Any] = {
    "skus": {"h100": {"hosts": 75_000, "unit_hosts": 16}},
    "jobs": {"sizes": [{"hosts": 16, "share": 0.2}, {"hosts": 256, "share": 0.4}, {"hosts": 512, "share": 0.4}]},
    "cycle_days": 7,
}


def best_of(fn: Any, n: int = 3) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> dict[str, Any]:
    baseline = best_of(lambda: parse_input(INPUT).pools())
    sized = best_of(lambda: describe(plan(parse_input(INPUT))))
    p = plan(parse_input(INPUT))
    out = {"bench": "size_75k_hosts", "hosts": p["hosts"], "units": p["units"], "counts_evaluated": len(p["rows"]),
           "best_domains": p["best"]["domains"], "seconds": round(sized, 3),
           "baseline_parse_seconds": round(baseline, 3), "goal_seconds": 1.0, "goal_met": sized < 1.0}
    print(f"{'':34}{'seconds':>9}")
    print(f"{'baseline: validate input + units':34}{baseline:>9.3f}")
    print(f"{'railyard size (plan + table)':34}{sized:>9.3f}   ({out['counts_evaluated']} counts; goal < 1 s)")
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
