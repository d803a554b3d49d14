"""Drive a train over a SlurmFleet the way the DAG does (steps in order, retries, the return as a
teardown) and watch Slurm's own view of the nodes while it runs."""

from __future__ import annotations

import json
import logging
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from railyard.backends.slurm.commands import expand_hostlist
from railyard.domain.config import RailyardConfig
from railyard.ledger import Ledger
from railyard.operations.stop import Stop, StopError, end_run, op_id_for
from tests.support.slurm_cluster import SlurmCluster

log = logging.getLogger("tests.slurm_train")


def _retry(fn, tries: int = 3, delay: float = 2.0):
    """Airflow's task retries: the same idempotent step, again."""
    for i in range(tries):
        try:
            return fn()
        except StopError:
            raise
        except Exception as exc:
            if i == tries - 1:
                raise
            log.warning("step failed, retrying like Airflow would: %s", exc)
            time.sleep(delay)


def run_stop(s: Stop) -> dict:
    deadline = time.monotonic() + s.timeouts.capacity_wait_s
    while True:
        d = _retry(s.take)
        if d.outcome in ("granted", "skip"):
            break
        assert d.outcome == "wait", d
        assert time.monotonic() < deadline, f"no capacity: {d.reason}"
        time.sleep(s.timeouts.poll_s)
    if d.outcome == "skip":
        return {"skipped": True}
    out: dict = {}
    try:
        _jobs, since = _retry(s.request_checkpoints)
        deadline = time.monotonic() + s.timeouts.checkpoint_wait_s
        def stale() -> list[str]:  # the checkpoint sensor's poke: the policy first, then the read
            s.enforce_checkpoint_policy(since)
            return s.stale_jobs(since)

        while _retry(stale):
            if time.monotonic() > deadline:
                raise StopError("checkpoints did not come")
            time.sleep(s.timeouts.poll_s)
        out["drain"] = _retry(s.drain)
        out["upgrade"] = _retry(s.upgrade)
        out["check"] = _retry(s.check)
    finally:
        out["return"] = _retry(s.return_hosts)
    return out


def run_train(config: RailyardConfig, fleet, ledger: Ledger, train_id: str, run_id: str = "run1") -> dict:
    train = config.train(train_id)
    results = {}
    for domain in config.train_domains(train):
        s = Stop(config=config, train=train, domain=domain, op_id=op_id_for(train_id, run_id, domain.name),
                 fleet=fleet, ledger=ledger)
        results[domain.name] = run_stop(s)
    end_run(config, train, fleet, ledger)  # the DAG's end_run teardown
    return results


@dataclass
class Sampler:
    """Samples `sinfo --json`, `squeue --json` and reservations every `every` seconds in a thread."""

    cluster: SlurmCluster
    every: float = 0.2
    nodes: list[tuple[float, dict[str, tuple[str, tuple[str, ...], str]]]] = field(default_factory=list)
    jobs: dict[str, dict] = field(default_factory=dict)  # job id -> last seen, with every start seen
    reservations: dict[str, dict[str, str]] = field(default_factory=dict)
    errors: int = 0

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _cli(self, *argv: str) -> str:
        return subprocess.run(list(argv), env=self.cluster.env(), capture_output=True, text=True, check=True,
                              timeout=10).stdout

    def sample(self) -> None:
        t = time.time()
        data = json.loads(self._cli("sinfo", "--json"))["nodes"]
        self.nodes.append((t, {n["name"]: (n["state"], tuple(n["state_flags"]), n["reason"]) for n in data}))
        for j in json.loads(self._cli("squeue", "--json"))["jobs"]:
            rec = self.jobs.setdefault(str(j["job_id"]), {"starts": set()})
            rec.update(state=j["job_state"], restart_cnt=j["restart_cnt"])
            if j["job_state"] == "RUNNING":
                rec["starts"].add((j["start_time"], j["nodes"], j["time_limit"]))
        for line in self._cli("scontrol", "show", "reservation", "-o").splitlines():
            if line.startswith("ReservationName="):
                kv = dict(part.split("=", 1) for part in line.split() if "=" in part)
                seen = self.reservations.get(f"{kv['ReservationName']}@{kv['StartTime']}", {}).get("seen", t)
                self.reservations[f"{kv['ReservationName']}@{kv['StartTime']}"] = kv | {"seen": seen, "last": t}

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.sample()
            except (subprocess.SubprocessError, ValueError, KeyError):
                self.errors += 1  # the controller is down (the kill test): keep sampling
            self._stop.wait(self.every)

    # ---- what the tests assert on ----------------------------------------------------------------
    def max_domains_out(self, domain_of: dict[str, str], ignore: set[str] = frozenset()) -> int:
        worst = 0
        for _t, snap in self.nodes:
            out = {domain_of[n] for n, (state, flags, _r) in snap.items()
                   if n in domain_of and n not in ignore and ("DRAIN" in flags or state in ("down", "maint"))}
            worst = max(worst, len(out))
        return worst

    def first_drained(self) -> dict[str, float]:
        seen: dict[str, float] = {}
        for t, snap in self.nodes:
            for n, (_s, flags, _r) in snap.items():
                if "DRAIN" in flags:
                    seen.setdefault(n, t)
        return seen

    def ever_drained(self) -> set[str]:
        return set(self.first_drained())

    def job_nodes(self, job_id: str) -> list[tuple[int, list[str], int]]:
        return [(st, expand_hostlist(nodes), limit) for st, nodes, limit in self.jobs.get(job_id, {}).get("starts", ())]


def parse_slurm_time(value: str) -> float:
    return time.mktime(time.strptime(value, "%Y-%m-%dT%H:%M:%S"))


def jobs_dir(cluster: SlurmCluster) -> Path:
    return cluster.root / "jobs"
