"""Slurm commands per stop: one train stop over a domain of 8 nodes and one over 64, on a real 64-node test
cluster (one slurmctld, 64 slurmd on this machine), with a running batch job on every 8 nodes that checkpoints
when asked and is requeued at the drain. Every Slurm command the fleet runs is counted by program and
subcommand (`tests/support/slurm_count.py`), each wait's repeated poll once; the 8-node stop is the baseline the
64-node one must equal: a command run per node or per job would make it grow.

    .venv/bin/python bench/bench_slurm.py [--sizes 8,64]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "include")]

from tests.support.slurm_cluster import SlurmCluster  # noqa: E402
from tests.support.slurm_count import counted_stop  # noqa: E402


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="8,64", help="domain sizes, the first is the baseline")
    args = ap.parse_args(argv if argv is not None else [])
    sizes = [int(x) for x in args.sizes.split(",")]
    root = Path(tempfile.mkdtemp(prefix="railyard-slurm-bench-"))
    os.chmod(root, 0o755)
    cluster = SlurmCluster(root, nodes=max(sizes))
    t = time.monotonic()
    try:
        cluster.start()
        start_s = time.monotonic() - t
        runs = {n: counted_stop(cluster, root / f"state-{n}", n) for n in sizes}
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    print(f"a {max(sizes)}-node cluster started in {start_s:.1f} s")
    for n, r in runs.items():
        per = r.log.per_stop()
        print(f"  {n:>3} nodes, {r.jobs} jobs: {sum(per.values())} Slurm commands per stop "
              f"({sum(r.log.raw().values())} with every poll), {r.seconds:.1f} s")
        for k, v in sorted(per.items()):
            print(f"      {v:>3}  {k}")
    base, top = runs[sizes[0]], runs[sizes[-1]]
    out = {"bench": "slurm_commands_per_stop", "sizes": sizes, "cluster_start_s": round(start_s, 2),
           "per_stop": {str(n): sum(r.log.per_stop().values()) for n, r in runs.items()},
           "raw": {str(n): sum(r.log.raw().values()) for n, r in runs.items()},
           "jobs": {str(n): r.jobs for n, r in runs.items()},
           "stop_s": {str(n): round(r.seconds, 2) for n, r in runs.items()},
           "by_kind": {str(n): dict(sorted(r.log.per_stop().items())) for n, r in runs.items()},
           "goal_met": all(r.log.per_stop() == base.log.per_stop() for r in runs.values())}
    out["baseline_nodes"], out["nodes"] = sizes[0], sizes[-1]
    out["per_stop_baseline"], out["per_stop_top"] = (sum(base.log.per_stop().values()),
                                                     sum(top.log.per_stop().values()))
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
