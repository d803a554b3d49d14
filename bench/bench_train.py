"""Orchestration overhead of the demo train on a real `airflow standalone` against the simulator.

The floor is the work itself: for each domain stop, the fleet-clock time of drain + upgrade +
check + return as the simulator measured it, divided by its speed. Both figures come from the
same run; the overhead per stop is (wall - work) / stops.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from railyard.demo import run_train
from railyard.stack import Stack, free_port


def main(argv: list[str] | None = None) -> dict:
    config = argv[0] if argv else None
    with tempfile.TemporaryDirectory(prefix="railyard-bench-") as tmp:
        kw = {"config_file": Path(config).resolve()} if config else {}
        stack = Stack(home=Path(tmp), airflow_port=free_port(), sim_port=free_port(), **kw)
        fleet = stack.start_sim()
        try:
            stack.start_airflow()
            stack.ensure_pool()
            train_id = sorted(t.id for t in stack.config.trains)[0]
            r = run_train(stack, fleet, train_id, quiet=True)
        finally:
            stack.stop()
    stops = max(1, r["domains"])
    out = {
        "bench": "train_overhead",
        "train": r["train"],
        "state": r["state"],
        "domains": r["domains"],
        "hosts": r["hosts"],
        "wall_seconds": r["wall_seconds"],
        "work_seconds": r["work_seconds"],
        "overhead_per_stop_s": round((r["wall_seconds"] - r["work_seconds"]) / stops, 2),
        "wall_over_work": round(r["wall_seconds"] / max(r["work_seconds"], 1e-9), 3),
        "max_domains_down": r["max_domains_down"],
    }
    print(f"{'':24}{'seconds':>10}")
    print(f"{'work floor (simulator)':24}{out['work_seconds']:>10.1f}")
    print(f"{'train wall time':24}{out['wall_seconds']:>10.1f}")
    print(f"{'overhead per stop':24}{out['overhead_per_stop_s']:>10.2f}   ({out['domains']} stops; goal <= 2 s)")
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
