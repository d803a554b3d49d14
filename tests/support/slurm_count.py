"""Count the Slurm commands a stop runs: every `SlurmCli.run` of one fleet, by program and subcommand, and the
port call (the outermost `SlurmFleet` method) that ran it.

A stop polls (`Stop._wait`) as long as its work takes, so its raw count depends on time, not on its domain.
`per_stop()` counts each wait's repeated read once: a read port call identical to the one before it (same
method, same arguments) is a poll of the same thing. `tend` (every few seconds of a wait) is left out of the
stop and counted per call instead. What is left is the stop's own sequence of calls and their commands: the
same at any domain size unless something runs once per node or per job.
"""

from __future__ import annotations

import functools
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from railyard.backends.slurm.standin import WORK, StandinRunner, _work
from tests.support.slurm_cluster import SlurmCluster, job_log, reset, slurm_config, submit

# what the Stop and its helpers call on the fleet; the reads among them are what a wait repeats
PORT = ("hosts", "jobs", "capacity", "drain", "upgrade_hosts", "upgrade", "start_checks", "start_check",
        "check_results", "return_to_service", "offboard", "handover", "reserve", "unreserve", "request_checkpoint",
        "requeue_silent", "tend", "enforce_gate", "forget", "mark_repaired", "reservations")
READS = {"hosts", "jobs", "capacity", "check_results", "reservations"}
POLL_ONLY = {"tend"}


def kind(argv: tuple[str, ...]) -> str:
    """`scontrol update node state=drain`, `scontrol show reservation`, `sinfo`, `scancel`...: what a command
    does, without the names and values it does it to."""
    prog, words = argv[0], [a for a in argv[1:] if not a.startswith("-")]
    if prog != "scontrol":
        return prog
    if not words:
        return " ".join(argv)  # scontrol --version
    verb, rest = words[0], words[1:]
    if verb == "update" and rest:
        what = rest[0].split("=", 1)[0].lower().removesuffix("name").removesuffix("id")
        keys = sorted(a.split("=", 1)[0].lower() if not a.lower().startswith("state=") else a.lower()
                      for a in rest[1:])
        return " ".join(["scontrol", "update", what, *keys])
    if verb in ("show", "create", "delete") and rest:
        return f"scontrol {verb} {rest[0].split('=', 1)[0].lower().removesuffix('name')}"
    return f"scontrol {verb}"


def _key(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    def norm(v: Any) -> Any:
        if isinstance(v, list | tuple | set):
            return tuple(sorted(map(str, v)))
        if isinstance(v, dict):
            return tuple(sorted((str(k), str(norm(x))) for k, x in v.items()))
        return v
    return repr((tuple(norm(a) for a in args), tuple(sorted((k, norm(v)) for k, v in kwargs.items()))))


@dataclass
class Call:
    method: str
    key: str
    commands: list[tuple[str, ...]] = field(default_factory=list)


@dataclass
class CommandLog:
    """Installed on one fleet (`CommandLog.on(fleet)`): every Slurm command it runs, under the port call that ran
    it (`None` for a command run outside any port call)."""

    calls: list[Call] = field(default_factory=list)
    loose: list[tuple[str, ...]] = field(default_factory=list)
    _depth: int = 0

    @classmethod
    def on(cls, fleet: Any) -> CommandLog:
        log = cls()
        run = fleet.cli.run

        def recorded(*argv: str, **kw: Any) -> str:
            (log.calls[-1].commands if log._depth else log.loose).append(tuple(argv))
            return run(*argv, **kw)

        fleet.cli.run = recorded
        for name in PORT:
            method = getattr(fleet, name, None)
            if method is not None:
                setattr(fleet, name, log._wrap(name, method))
        return log

    def _wrap(self, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def call(*args: Any, **kwargs: Any) -> Any:
            if self._depth == 0:
                self.calls.append(Call(name, _key(args, kwargs)))
            self._depth += 1
            try:
                return method(*args, **kwargs)
            finally:
                self._depth -= 1
        return call

    # ---- what a test or a bench reads --------------------------------------------------------------
    def commands(self) -> list[tuple[str, ...]]:
        return [c for call in self.calls for c in call.commands] + self.loose

    def raw(self) -> Counter[str]:
        """Every command run, polls and all."""
        return Counter(kind(c) for c in self.commands())

    def stop_calls(self) -> list[Call]:
        """The stop's own port calls that ran a Slurm command, each wait's repeated read counted once."""
        out: list[Call] = []
        for call in self.calls:
            if call.method in POLL_ONLY or not call.commands:
                continue
            if out and call.method in READS and (out[-1].method, out[-1].key) == (call.method, call.key):
                continue
            out.append(call)
        return out

    def per_stop(self) -> Counter[str]:
        return Counter(kind(c) for call in self.stop_calls() for c in call.commands)

    def per_call(self) -> dict[str, set[tuple[str, ...]]]:
        """method -> every distinct multiset of command kinds one call of it ran (polls and tends included)."""
        out: dict[str, set[tuple[str, ...]]] = {}
        for call in self.calls:
            out.setdefault(call.method, set()).add(tuple(sorted(kind(c) for c in call.commands)))
        return out


class InlineStandin(StandinRunner):
    """The stand-in, its work done at once in this process: on-host work is the runner's, not Slurm's, and 64
    stand-in workers starting together on 2 cores miss their first heartbeat (the stop then sees them idle, and
    checks some hosts in the return's gate instead: another sequence of calls). Here every wait's first poll
    finds the work done, at any size."""

    def _spawn(self, key: str, state: dict[str, Any]) -> None:
        state.update(initial=self.initial, beat=time.time(), at="inline")
        self.store.put(WORK, key, state)
        _work(self.store.url, key)


@dataclass
class CountedStop:
    nodes: int
    jobs: int
    log: CommandLog
    result: dict[str, Any]
    seconds: float


def counted_stop(cluster: SlurmCluster, state_dir: Path, nodes: int, *, job_nodes: int = 8,
                 steps: int = 3000) -> CountedStop:
    """One train stop over the domain n[1-`nodes`] of `cluster`, with a running batch job on every `job_nodes`
    of its nodes that checkpoints when asked, driven the way the DAG drives it (`run_stop`); every Slurm command
    its fleet ran recorded."""
    from railyard.backends.slurm.fleet import SlurmFleet
    from railyard.domain.config import parse_config
    from railyard.ledger import Ledger
    from railyard.ledger.state import Store
    from railyard.operations.stop import Stop, op_id_for
    from tests.support.slurm_train import run_stop

    assert nodes <= len(cluster.nodes) and nodes % job_nodes == 0, (nodes, len(cluster.nodes), job_nodes)
    reset(cluster)
    raw = slurm_config(cluster, state_dir)
    raw["domains"] = [{"name": "pod-a", "hosts": f"n[1-{nodes}]"}]
    raw["buffers"] = {"maintenance": {"hosts": nodes}, "failure": {"hosts": 1}}
    raw["timeouts"] |= {"upgrade_s": 300, "check_s": 300, "return_s": 120, "drain_s": 60}
    cfg = parse_config(raw)
    store = Store(cfg.ledger.url)
    spec = cfg.fleet.slurm
    assert spec is not None and spec.standin is not None
    runner = InlineStandin(store, durations={c.name: 0.0 for c in cfg.components}, check_s=0.0,
                           initial_versions=spec.standin.initial_versions)
    fleet = SlurmFleet(cfg, spec, runner, store=store)
    ledger = Ledger(cfg.ledger.url)
    jobs = [submit(cluster, nodes=job_nodes, steps=steps, extra=(f"--nodelist=n[{i + 1}-{i + job_nodes}]",))
            for i in range(0, nodes, job_nodes)]
    cluster._wait("jobs running", lambda: all(job_log(cluster, j) for j in jobs), timeout=60)
    log = CommandLog.on(fleet)
    train = cfg.train("slurm")
    stop = Stop(config=cfg, train=train, domain=cfg.domain("pod-a"), op_id=op_id_for("slurm", "count", "pod-a"),
                fleet=fleet, ledger=ledger)
    t = time.monotonic()
    result = run_stop(stop)
    return CountedStop(nodes, len(jobs), log, result, time.monotonic() - t)
