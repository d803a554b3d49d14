"""`make bench`'s closing table: each figure beside its baseline and goal, met or not, and a bench that
breaks neither hides the others' figures nor passes for a result."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import run as bench_run  # noqa: E402

TRAIN = {"overhead_per_stop_s": 3.36, "work_seconds": 90.7, "baseline_per_stop_s": 2.43}
SLURM = {"nodes": 64, "baseline_nodes": 8, "per_stop_top": 28, "per_stop_baseline": 28,
         "raw": {"8": 43, "64": 42}, "goal_met": True}
LEDGER = {"lease_ops_per_s": 1879, "lease_over_floor": 0.48, "floor_txn_per_s": 3913, "goal_met": False}


def test_every_row_says_met_or_not_from_its_own_figures():
    rows = bench_run.rows_train(TRAIN) + bench_run.rows_train(TRAIN | {"overhead_per_stop_s": 1.9})
    rows += bench_run.rows_ledger(LEDGER)
    assert [r[4] for r in rows] == [False, True, False]
    text = bench_run.table(rows)
    lines = text.splitlines()
    assert lines[0].split()[:2] == ["figure", "Railyard"] and lines[0].endswith("met?")
    assert lines[1].endswith("NOT met") and "3.36 s" in lines[1] and "2.43 s/stop" in lines[1]
    assert lines[2].endswith("  met") and "1.90 s" in lines[2]
    assert "1,879/s (0.48x)" in lines[3] and "3,913/s" in lines[3]


def test_the_slurm_row_shows_both_sizes_and_is_met_only_when_they_match():
    ok, grown = bench_run.rows_slurm(SLURM) + bench_run.rows_slurm(SLURM | {"per_stop_top": 105, "goal_met": False})
    assert ok[0] == "Slurm commands per stop, 64-node domain" and ok[4]
    assert ok[1] == "28 (42 with polls)" and ok[2] == "8-node domain 28 (43 with polls)"
    assert grown[1].startswith("105 ") and not grown[4]


def test_a_bench_that_breaks_is_a_failed_row_and_a_failed_run(monkeypatch, capsys):
    def broken() -> dict:
        raise RuntimeError("sshd missing")

    monkeypatch.setattr(bench_run, "BENCHES", [("Demo train: x", lambda: TRAIN, bench_run.rows_train),
                                               ("SSH fan-out: y", broken, bench_run.rows_ssh)])
    assert bench_run.main() == 1
    out = capsys.readouterr()
    assert "sshd missing" in out.err
    table = out.out.split("== Every figure, beside its baseline and its goal ==")[1]
    assert "orchestration overhead per stop" in table and "3.36 s" in table
    assert "SSH fan-out  " in table and "FAILED" in table


def test_the_stop_rows_judge_each_size_against_its_own_goal():
    def run(hosts_per_domain: int, domains: int, overhead: float, stops: int = 2) -> dict:
        return {"hosts_per_domain": hosts_per_domain, "hosts": hosts_per_domain * domains,
                "overhead_per_stop_s": overhead, "calls_per_stop": 140, "stops": [{}] * stops}

    figures = {"runs": [run(64, 4, 0.4), run(1024, 4, 0.7), run(3840, 20, 0.9, stops=20)],
               "baseline_overhead_s": 0.4, "ratios": {64: 1.0, 1024: 1.75, 3840: 2.25},
               "goals": {1024: 1.5, 3840: 2.0}}
    rows = bench_run.rows_stop(figures)
    assert [(r[0], r[3], r[4]) for r in rows] == [
        ("overhead per stop, 1,024 hosts a domain", "<= 1.5x", False),
        ("overhead per stop, a 20-stop train over 76,800 hosts, 3,840 a domain", "<= 2.0x", False)]
    figures["ratios"] = {64: 1.0, 1024: 1.4, 3840: 1.9}
    assert [r[4] for r in bench_run.rows_stop(figures)] == [True, True]
    assert "0.70 s (1.4x)" in bench_run.rows_stop(figures)[0][1]
    # with the split of the overhead: what the wait for the next poll leaves, beside the judged figure
    figures |= {"baseline_own_s": 0.1, "own_ratios": {64: 1.0, 1024: 3.0, 3840: 6.0}}
    figures["runs"][1]["own_per_stop_s"] = 0.3
    row = bench_run.rows_stop(figures)[0]
    assert "0.70 s (1.4x), of it 0.30 s (3.0x) own work" in row[1] and "(0.10 s own)" in row[2] and row[4]


def test_the_wait_for_the_next_poll_runs_from_each_phases_end_to_the_first_read_after_it():
    import bench_stop

    phases = {"drain": 1.0, "upgrade": 6.0, "check": 2.5, "return": 0.25}
    started = [(0.0, "POST /v1/hosts/drain"), (0.5, "POST /v1/hosts/query"), (1.04, "POST /v1/hosts/query"),
               (1.2, "POST /v1/hosts/upgrade"), (7.1, "POST /v1/hosts/query"), (7.25, "POST /v1/hosts/query"),
               (7.3, "POST /v1/hosts/check"), (9.0, "POST /v1/checks/query"), (9.81, "POST /v1/checks/query"),
               (9.9, "POST /v1/hosts/return"), (10.2, "GET /v1/capacity"), (10.21, "POST /v1/hosts/query")]
    # 0.04 after the drain, 0.05 after the upgrade, 0.01 after the check, 0.06 after the return (a capacity read
    # is no poll)
    assert abs(bench_stop.poll_wait_s(started, phases) - 0.16) < 1e-9
    assert abs(bench_stop.poll_wait_s(started[:3], phases) - 0.04) < 1e-9  # phases never written: no wait



def test_own_time_is_split_by_what_began_while_no_phase_ran():
    import bench_stop

    phases = {"drain": 1.0, "upgrade": 6.0, "check": 2.5, "return": 0.25}
    spans = [(0.0, 0.02, "POST /v1/hosts/query"), (0.02, 0.01, "validation"), (0.03, 0.004, "ledger.acquire_domain"),
             (0.1, 0.5, "POST /v1/jobs/query"),  # inside the checkpoint wait: not counted
             (1.0, 0.1, "POST /v1/hosts/drain"),  # a phase write: its phase runs while it is answered
             (1.5, 0.003, "POST /v1/hosts/query"),  # while the hosts drain: not counted
             (2.05, 0.03, "POST /v1/hosts/query"), (2.08, 0.012, "validation"), (2.1, 0.005, "ledger.holdings"),
             (2.11, 0.2, "POST /v1/hosts/upgrade"), (8.2, 0.006, "ledger.record_verifications")]
    split = bench_stop.own_split(spans, phases, (0.1, 1.0))
    assert {k: round(v, 6) for k, v in split.items()} == {"fleet": 0.05, "validation": 0.022, "ledger": 0.015}
    # nothing written: every span but the wait's is Railyard's own
    assert round(bench_stop.own_split(spans[:4], phases, (0.1, 1.0))["fleet"], 6) == 0.02

SSH_SCALE = {"hosts": 1024, "parallelism": 64, "railyard_s": 21.7, "all_ok": True, "ansible_best": "ansible -m raw",
             "ansible_best_s": 80.2, "clush_s": 29.4, "railyard_over_clush": 0.74,
             "stop": {"wall_s": 210.8, "client_cpu_ms_per_host": 45.4, "completed": True, "peak_open_kernel": 64,
                      "peak_open_runner": 61, "peak_threads": 184, "peak_rss_mib": 121.2, "open_after": 0}}


def test_ssh_scale_rows_hold_railyard_to_ansible_clush_and_its_parallelism():
    rows = bench_run.rows_ssh_scale(SSH_SCALE)
    assert [r[4] for r in rows] == [True, True, True, True]
    assert "Ansible ad-hoc -m raw 80.20 s" in rows[0][2] and "clush 29.40 s" in rows[1][2]
    assert rows[2][1] == "211 s; client CPU 45 ms a host" and rows[3][1].startswith("64 (184 threads")
    slow = bench_run.rows_ssh_scale(SSH_SCALE | {"railyard_s": 45.0, "all_ok": True})
    assert [r[4] for r in slow[:2]] == [True, False]  # 45 s > 1.5 x 29.4 s
    one_failed = bench_run.rows_ssh_scale(SSH_SCALE | {"all_ok": False})
    assert [r[4] for r in one_failed[:2]] == [False, False]  # a host that did not answer voids the comparison
    over = bench_run.rows_ssh_scale(SSH_SCALE | {"stop": SSH_SCALE["stop"] | {"peak_open_kernel": 65}})
    left = bench_run.rows_ssh_scale(SSH_SCALE | {"stop": SSH_SCALE["stop"] | {"open_after": 2, "completed": False}})
    assert over[3][4] is False and left[2][4] is False and left[3][4] is False
    bare = bench_run.rows_ssh_scale({k: v for k, v in SSH_SCALE.items() if k not in ("ansible_best_s", "stop")})
    assert len(bare) == 2 and bare[0][4] is False and "not installed" in bare[0][2]
