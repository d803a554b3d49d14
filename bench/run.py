"""Run every benchmark; each prints its figures beside its baseline, then one JSON line."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_grid  # noqa: E402
import bench_ledger  # noqa: E402
import bench_parse  # noqa: E402
import bench_plan  # noqa: E402
import bench_size  # noqa: E402
import bench_ssh  # noqa: E402
import bench_train  # noqa: E402

if __name__ == "__main__":
    print("== DAG parse: 20 trains x 64 domains, Railyard vs plain EmptyOperator DAGs ==", flush=True)
    bench_parse.main()
    print("\n== railyard plan / drift on 76,800 hosts in 1,200 domains, vs one fetch of the fleet ==", flush=True)
    bench_plan.main()
    print("\n== railyard size on 75,000 hosts (600,000 GPUs), vs validating the same input ==", flush=True)
    bench_size.main()
    print("\n== Demo train: wall time vs the work floor, on airflow standalone ==", flush=True)
    bench_train.main()
    print("\n== SSH fan-out: one upgrade command on 64 sshd hosts, Railyard vs Ansible ==", flush=True)
    bench_ssh.main()
    print("\n== Ledger on PostgreSQL: 8 processes of lease operations vs the database's 1-row commit floor ==",
          flush=True)
    bench_ledger.main([])
    print("\n== Airflow's grid: a 64-domain train over 25 runs in headless Chromium, vs an EmptyOperator DAG ==",
          flush=True)
    bench_grid.main()
