"""Run every benchmark; each prints its figures beside its baseline, then one JSON line; at the end, one
table of every figure beside its baseline and its goal (a bench that failed says so in its row)."""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_grid  # noqa: E402
import bench_ledger  # noqa: E402
import bench_page  # noqa: E402
import bench_parse  # noqa: E402
import bench_plan  # noqa: E402
import bench_size  # noqa: E402
import bench_slurm  # noqa: E402
import bench_ssh  # noqa: E402
import bench_ssh_scale  # noqa: E402
import bench_stop  # noqa: E402
import bench_train  # noqa: E402

Row = tuple[str, str, str, str, bool]  # figure, Railyard, baseline, goal, met


def rows_parse(f: dict[str, Any]) -> list[Row]:
    r, b = f["railyard"]["median_s"], f["baseline"]["median_s"]
    return [("DAG parse, 20 trains x 64 domains", f"{r:.2f} s ({f['ratio_median']}x)", f"EmptyOperator DAGs {b:.2f} s",
             "<= 1.2x baseline", f["ratio_median"] <= 1.2)]


def rows_plan(f: dict[str, Any]) -> list[Row]:
    base = (f"one GET of the fleet {f['baseline_get_s']:.2f} s; "
            f"fetch-once command {f['baseline_fetch_once_cmd_s']:.2f} s")
    return [(f"railyard plan, {f['hosts']:,} hosts", f"{f['plan_s']:.2f} s", base, "< 2 s", f["plan_s"] < 2.0),
            (f"railyard drift, {f['hosts']:,} hosts", f"{f['drift_s']:.2f} s", base, "< 1 s", f["drift_s"] < 1.0)]


def rows_size(f: dict[str, Any]) -> list[Row]:
    return [(f"railyard size, {f['hosts']:,} hosts", f"{f['seconds']:.2f} s",
             f"validating the input {f['baseline_parse_seconds']:.2f} s", "< 1 s", f["goal_met"])]


def rows_train(f: dict[str, Any]) -> list[Row]:
    return [("orchestration overhead per stop, demo train", f"{f['overhead_per_stop_s']:.2f} s",
             f"work floor {f['work_seconds']:.1f} s; Airflow alone, same shape {f['baseline_per_stop_s']:.2f} s/stop",
             "<= 2 s", f["overhead_per_stop_s"] <= 2.0)]


def rows_ssh(f: dict[str, Any]) -> list[Row]:
    ansible = f.get("ansible_adhoc_s")
    return [
        ("SSH fan-out, 64 hosts / one host's floor", f"{f['railyard_s']:.2f} s ({f['railyard_over_floor']}x)",
         f"one host {f['floor_one_host_s']:.2f} s; CPU bound here {f['cpu_bound_s']:.2f} s", "<= 1.5x floor",
         f["railyard_over_floor"] <= 1.5),
        ("SSH fan-out, 64 hosts / Ansible", f"{f['railyard_s']:.2f} s",
         f"Ansible ad-hoc {ansible:.2f} s" if ansible else "Ansible not installed", "<= Ansible",
         bool(ansible) and f["railyard_s"] <= ansible),
    ]


def rows_stop(f: dict[str, Any]) -> list[Row]:
    base = f["baseline_overhead_s"]
    out: list[Row] = []
    for r in f["runs"][1:]:
        n, ratio = r["hosts_per_domain"], f["ratios"][r["hosts_per_domain"]]
        goal = f["goals"].get(n)
        what = (f"overhead per stop, a {len(r['stops'])}-stop train over {r['hosts']:,} hosts, {n:,} a domain"
                if r["hosts"] > 10_000 else f"overhead per stop, {n:,} hosts a domain")
        own, own_base = r.get("own_per_stop_s"), f.get("baseline_own_s")
        split = (f", of it {own:.2f} s ({f['own_ratios'][n]}x) own work beyond the wait for the next poll"
                 if own is not None and own_base else "")
        out.append((what, f"{r['overhead_per_stop_s']:.2f} s ({ratio}x){split}, {r['calls_per_stop']:.0f} calls",
                    f"64 hosts a domain {base:.2f} s" + (f" ({own_base:.2f} s own)" if split else ""),
                    f"<= {goal}x" if goal else "-", goal is not None and ratio <= goal))
    return out


def rows_slurm(f: dict[str, Any]) -> list[Row]:
    n, base = f["nodes"], f["baseline_nodes"]
    return [(f"Slurm commands per stop, {n}-node domain", f"{f['per_stop_top']} ({f['raw'][str(n)]} with polls)",
             f"{base}-node domain {f['per_stop_baseline']} ({f['raw'][str(base)]} with polls)",
             f"= the {base}-node count, by command", f["goal_met"])]


def rows_ssh_scale(f: dict[str, Any]) -> list[Row]:
    n, par, ry, ok = f["hosts"], f["parallelism"], f["railyard_s"], f["all_ok"]
    ansible, clush = f.get("ansible_best_s"), f.get("clush_s")
    rows: list[Row] = [
        (f"SSH fan-out, {n:,} hosts on one sshd / Ansible", f"{ry:.2f} s",
         f"Ansible ad-hoc -m {f['ansible_best'].split()[-1]} {ansible:.2f} s" if ansible else "Ansible not installed",
         "<= Ansible", ok and ansible is not None and ry <= ansible),
        (f"SSH fan-out, {n:,} hosts on one sshd / ClusterShell",
         f"{ry:.2f} s ({f['railyard_over_clush']}x)" if clush else f"{ry:.2f} s",
         f"clush {clush:.2f} s" if clush else "clush not installed", "<= 1.5x clush",
         ok and clush is not None and ry <= 1.5 * clush),
    ]
    st = f.get("stop")
    if st:
        peak = max(st["peak_open_kernel"], st["peak_open_runner"])
        rows += [
            (f"SSH stop, one {n:,}-host domain", f"{st['wall_s']:.0f} s; client CPU {st['client_cpu_ms_per_host']:.0f} "
             "ms a host", f"one command on every host {ry:.1f} s", "completes, every host back at target",
             st["completed"]),
            (f"SSH stop, {n:,} hosts: peak open connections", f"{peak} ({st['peak_threads']} threads, "
             f"{st['peak_rss_mib']:.0f} MiB RSS)", f"parallelism {par}", f"<= {par}, none left open",
             peak <= par and st["open_after"] == 0),
        ]
    return rows


def rows_ledger(f: dict[str, Any]) -> list[Row]:
    return [("ledger lease ops/s, PostgreSQL, 8 writers", f"{f['lease_ops_per_s']:,}/s ({f['lease_over_floor']:.2f}x)",
             f"1-row UPDATE floor {f['floor_txn_per_s']:,}/s", ">= 1,000/s and >= 0.5x floor", f["goal_met"])]


def rows_grid(f: dict[str, Any]) -> list[Row]:
    return [("Airflow grid, 64-domain train, 25 runs", f"{f['railyard']['page_settled_s']:.2f} s",
             f"EmptyOperator DAG, same shape {f['baseline']['page_settled_s']:.2f} s",
             f"<= {bench_grid.GOAL_OVER_BASELINE}x baseline", f["goal_met"])]


def rows_page(f: dict[str, Any]) -> list[Row]:
    big, demo = f["scale"], f["demo"]
    slowest = max(big["json_s"], key=big["json_s"].get)
    return [
        (f"Railyard page JSON, {f['hosts']:,} hosts (slowest: {slowest})", f"{f['json_max_s']:.2f} s",
         f"GET /v1/hosts {f['baseline_get_s']:.2f} s; 64-host demo {max(demo['json_s'].values()):.2f} s",
         f"< {f['goal_json_s']:.0f} s", f["json_max_s"] < f["goal_json_s"]),
        (f"Railyard page load to usable, {f['hosts']:,} hosts, Chromium", f"{f['load_s']:.2f} s",
         f"64-host demo {demo['load_s']:.2f} s", f"< {f['goal_load_s']:.0f} s", f["load_s"] < f["goal_load_s"]),
        ("Railyard page reads: audit rows written", str(sum(f["audit_rows_added_by_reads"].values())), "",
         "0", not any(f["audit_rows_added_by_reads"].values())),
    ]


BENCHES: list[tuple[str, Callable[[], dict[str, Any]], Callable[[dict[str, Any]], list[Row]]]] = [
    ("DAG parse: 20 trains x 64 domains, Railyard vs plain EmptyOperator DAGs", bench_parse.main, rows_parse),
    ("railyard plan / drift on 76,800 hosts in 1,200 domains, vs one fetch of the fleet", bench_plan.main, rows_plan),
    ("railyard size on 75,000 hosts (600,000 GPUs), vs validating the same input", bench_size.main, rows_size),
    ("Demo train: wall time vs the work floor, and Airflow alone on the same shape", bench_train.main, rows_train),
    ("SSH fan-out: one upgrade command on 64 sshd hosts, Railyard vs Ansible", bench_ssh.main, rows_ssh),
    (f"SSH at scale: {bench_ssh_scale.HOSTS} hosts on one sshd, Railyard vs Ansible vs ClusterShell, and a full stop",
     bench_ssh_scale.main, rows_ssh_scale),
    ("A stop as its domain grows: 64 vs 1,024 hosts a domain, and a train over 76,800 hosts, on the simulator",
     lambda: bench_stop.main(["--fleet"]), rows_stop),
    ("Slurm: commands per stop at 8 and at 64 nodes, a real 64-node test cluster", bench_slurm.main, rows_slurm),
    ("Ledger on PostgreSQL: 8 processes of lease operations vs the database's 1-row commit floor",
     lambda: bench_ledger.main([]), rows_ledger),
    ("Railyard page: JSON and Chromium load at 76,800 hosts in 1,200 domains, vs the 64-host demo fleet",
     bench_page.main, rows_page),
    ("Airflow's grid: a 64-domain train over 25 runs in headless Chromium, vs an EmptyOperator DAG",
     bench_grid.main, rows_grid),
]


def table(rows: list[Row]) -> str:
    head: Row = ("figure", "Railyard", "baseline", "goal", True)
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(4)]
    lines = []
    for r in [head, *rows]:
        met = "met" if r is head or r[4] else "NOT met"
        lines.append("  ".join(c.ljust(w) for c, w in zip(r[:4], widths, strict=True)) + "  "
                     + ("met?" if r is head else met))
    return "\n".join(lines)


def main() -> int:
    rows: list[Row] = []
    for title, run, to_rows in BENCHES:
        print(f"== {title} ==", flush=True)
        try:
            rows += to_rows(run())
        except Exception:  # one bench that breaks does not lose the others' figures
            traceback.print_exc()
            rows.append((title.split(":")[0], "FAILED (see above)", "", "", False))
        print(flush=True)
    print("== Every figure, beside its baseline and its goal ==")
    print(table(rows))
    return 1 if any(r[1].startswith("FAILED") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
