"""The fleet simulator: hosts, jobs, checkpoints, drains, upgrades, checks and failures on a fast clock.

`SimEngine` implements the `Fleet` protocol directly, so unit tests use it in-process with a fake
clock (no sleeps) and the HTTP service (`railyard.sim.app`) is a thin layer over it.

Time: the fleet clock is `stored fleet time + (real - real at start) * speed`. Every public method
first calls `advance()`, which processes everything due up to fleet-now in time order, so the
result does not depend on how often anyone looks. The world is in SQLite: a row per host, job and
check, a small row for the rest, and append-only audit rows; a restarted engine continues from the stored
fleet time, it does not jump by the downtime. A write is saved before it answers; what a read's catching up
with the clock brought about is saved by the next write or tick (`_read`).

Changes: every host, job and check notes each assignment to one of its fields in the engine's change set
(`_Tracked`), so a save writes only the rows that changed and `host_changes` answers "which of these hosts
changed since cursor C" without looking at the others: at 76,800 hosts a change costs what it touches,
not a walk of the fleet.
"""

from __future__ import annotations

import bisect
import functools
import heapq
import json
import math
import random
import secrets
import sqlite3
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timezone
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar

import msgspec

from railyard.domain.config import RailyardConfig
from railyard.domain.models import (
    MAINTENANCE_STATES,
    Capacity,
    CheckResult,
    Host,
    HostState,
    Job,
    Step,
    check_token,
)
from railyard.fleet import FleetNotFound, gcpause
from railyard.fleet.port import FleetError

# Each host, job and check changed is written as JSON twice (its row, its view in the API's answers): msgspec's
# encoder does it ten times faster than json.dumps, which at a thousand hosts a change is most of a change's cost.
_encode = msgspec.json.Encoder().encode

SNAPSHOT_VERSION = 2  # 1: hosts, jobs and checks inside the world row (still read)

# What a deep health check finds when it fails for a reason other than a wrong version.
_CHECK_FAILURES: tuple[Callable[[random.Random], str], ...] = (
    lambda r: f"dcgmi diag -r 3: Memory test failed: ECC DBE on GPU {r.randrange(8)}",
    lambda r: f"all_reduce_perf busbw {r.uniform(150, 340):.1f} GB/s below floor 360 GB/s",
    lambda r: f"XID 79 (GPU fell off the bus) on GPU {r.randrange(8)}",
    lambda r: f"dcgmi diag -r 3: PCIe replay count {r.randrange(120, 900)} on GPU {r.randrange(8)} above threshold",
    lambda r: f"ib_write_bw mlx5_{r.randrange(8)}: {r.uniform(40, 300):.1f} Gb/s below floor 390 Gb/s",
    lambda r: f"nvidia-smi: GPU {r.randrange(8)} has {r.randrange(1, 9)} retired pages pending",
)

# Why a serving host breaks by itself.
_HOST_FAILURES: tuple[Callable[[random.Random], str], ...] = (
    lambda r: f"XID 48 double-bit ECC error on GPU {r.randrange(8)}",
    lambda r: f"XID 79 (GPU fell off the bus) on GPU {r.randrange(8)}",
    lambda r: f"XID 74 NVLink error on GPU {r.randrange(8)}",
    lambda r: "node unreachable: kernel panic",
    lambda r: f"PSU {r.randrange(1, 3)} failed",
)

_INSTALL_ERRORS = ("exit status 1", "exit status 2", "timed out after 900 s")

_PHASES = ("drain", "upgrade", "check", "return")
LISTS_KEPT = 16  # lists of hosts asked for by name whose check is kept (`SimEngine._list`)

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")
TrackedT = TypeVar("TrackedT", bound="_Tracked")


K = TypeVar("K")


class _Timeline(Generic[K]):
    """Keys each due at a time: the earliest time, and the keys due by a time, at a cost per key moved, not
    per comparison among all of them. Keys at one time share its bucket: a bulk call starts a domain's
    thousands of hosts at one instant, so their transitions end at one instant, and a heap of (time, key)
    would order thousands of equal times by name at each push and pop."""

    def __init__(self) -> None:
        self._of: dict[K, float] = {}  # key -> its time
        self._at: dict[float, set[K]] = {}  # time -> its keys (a bucket emptied stays until its time comes up)
        self._times: list[float] = []  # a heap of the times of `_at`, each once

    def __len__(self) -> int:
        return len(self._of)

    def get(self, key: K) -> float | None:
        return self._of.get(key)

    def set(self, key: K, t: float | None) -> None:
        """`key` due at `t` from now on (None: not due)."""
        old = self._of.get(key)
        if old == t:
            return
        if old is not None:
            self._at[old].discard(key)
        if t is None:
            del self._of[key]
            return
        self._of[key] = t
        bucket = self._at.get(t)
        if bucket is None:
            self._at[t] = {key}
            heapq.heappush(self._times, t)
        else:
            bucket.add(key)

    def first(self) -> float | None:
        """The earliest time any key is due at."""
        times, at = self._times, self._at
        while times and not at[times[0]]:
            del at[heapq.heappop(times)]
        return times[0] if times else None

    def pop_until(self, t: float) -> list[K]:
        """The keys due at or before `t`, no longer due."""
        out: list[K] = []
        times, at, of = self._times, self._at, self._of
        while times and times[0] <= t:
            bucket = at.pop(heapq.heappop(times))
            for key in bucket:
                del of[key]
            out.extend(bucket)
        return out


class _Tracked:
    """A world object whose every field assignment adds its key to its engine's change set (once the engine
    tracks it: `SimEngine._track`). A change inside a field's container (`h.versions[c] = v`) is no
    assignment: such code calls `changed()` itself."""

    def __setattr__(self, name: str, value: Any) -> None:
        d = self.__dict__  # (plain fields, no descriptors: the dict is the attribute, and faster to set)
        d[name] = value
        sink = d.get("_sink")
        if sink is not None:
            sink.add(d["_key"])

    def changed(self) -> None:
        sink = self.__dict__.get("_sink")
        if sink is not None:
            sink.add(self.__dict__["_key"])


@dataclass
class _Host(_Tracked):
    name: str
    domain: str
    sku: str
    gpus: int
    state: HostState
    versions: dict[str, str]
    operation: str | None = None
    reason: str | None = None
    last_error: str | None = None
    until: float | None = None  # when the current transition (drain, upgrade, check, return, repair) ends
    upgrade: dict[str, Any] | None = None  # {"steps": [[component, version], ...], "fail_index": int | None}
    fail_at: float | None = None  # next random failure, while serving
    job: str | None = None

    def row(self) -> dict[str, Any]:
        """`public()` as plain JSON data, without building the model (the API's bulk reads)."""
        return {"name": self.name, "domain": self.domain, "sku": self.sku, "gpus": self.gpus,
                "state": self.state.value, "versions": dict(self.versions), "operation": self.operation,
                "reason": self.reason, "last_error": self.last_error, "seen_at": None}

    def public(self) -> Host:
        return Host(
            name=self.name,
            domain=self.domain,
            sku=self.sku,
            gpus=self.gpus,
            state=self.state,
            versions=dict(self.versions),
            operation=self.operation,
            reason=self.reason,
            last_error=self.last_error,
        )


@dataclass
class _Job(_Tracked):
    id: str
    hosts: list[str]
    gpus: int
    state: str  # running | pending
    last_checkpoint: float
    checkpoint_interval: float
    checkpoint_requested_at: float | None = None
    checkpoint_due: float | None = None  # when a requested checkpoint completes
    dodge_until: float | None = None  # the job asks that its hosts not be taken before this time
    stuck: bool = False  # a hung job: it never checkpoints again
    size: int | None = None  # hosts it runs on; None: simulator.jobs.hosts_per_job (jobs added by `add_job` differ)

    def row(self) -> dict[str, Any]:
        """`public()` as plain JSON data, without building the model (the API's bulk reads)."""
        return {"id": self.id, "hosts": list(self.hosts), "gpus": self.gpus, "state": self.state,
                "last_checkpoint": self.last_checkpoint, "checkpoint_requested_at": self.checkpoint_requested_at,
                "checkpoint_interval": self.checkpoint_interval, "dodge_until": self.dodge_until}

    def public(self) -> Job:
        return Job(**self.row())


@dataclass
class _Check(_Tracked):
    host: str
    op: str
    expected: dict[str, str]
    started_at: float
    versions_at_start: dict[str, str]
    status: str = "pending"
    reason: str | None = None
    versions: dict[str, str] = field(default_factory=dict)
    done_at: float | None = None

    def public(self) -> CheckResult:
        return CheckResult(host=self.host, status=self.status, reason=self.reason, versions=dict(self.versions))


class _Store:
    """SQLite persistence: the world's hosts, jobs and checks one row each (a save writes only the rows that
    changed), the rest of the world as one small JSON row, the clock, and append-only audit rows."""

    def __init__(self, path: str):
        self.path = path
        self.conn = sqlite3.connect(path, check_same_thread=False)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=NORMAL")
        self._checkpointer: sqlite3.Connection | None = None  # `checkpoint`'s own connection, once it runs
        self._checkpointing = threading.Lock()
        self._closed = False
        with self.conn:
            self.conn.execute(
                "CREATE TABLE IF NOT EXISTS world (id INTEGER PRIMARY KEY CHECK (id = 1), data TEXT NOT NULL)"
            )
            self.conn.execute(
                "CREATE TABLE IF NOT EXISTS items (kind TEXT NOT NULL, key TEXT NOT NULL, data TEXT NOT NULL, "
                "PRIMARY KEY (kind, key))"
            )
            self.conn.execute(
                "CREATE TABLE IF NOT EXISTS clock (id INTEGER PRIMARY KEY CHECK (id = 1), t REAL NOT NULL)"
            )
            self.conn.execute(
                "CREATE TABLE IF NOT EXISTS audit (seq INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT NOT NULL, "
                "t REAL NOT NULL, data TEXT NOT NULL)"
            )

    def load(self) -> tuple[dict[str, Any] | None, float | None, list[tuple[str, float, dict[str, Any]]]]:
        """The world as one dict (its hosts, jobs and checks gathered from their rows), the clock, the audit."""
        row = self.conn.execute("SELECT data FROM world WHERE id = 1").fetchone()
        clock = self.conn.execute("SELECT t FROM clock WHERE id = 1").fetchone()
        rows = self.conn.execute("SELECT kind, t, data FROM audit ORDER BY seq").fetchall()
        world: dict[str, Any] | None = json.loads(row[0]) if row else None
        if world is not None:
            for kind in _ITEM_KINDS:
                if kind not in world:  # (a database of snapshot version 1 holds them in the world row)
                    world[kind] = [json.loads(d) for (d,) in self.conn.execute(
                        "SELECT data FROM items WHERE kind = ? ORDER BY key", (kind,))]
        audit: list[tuple[str, float, dict[str, Any]]] = []
        for k, t, d in rows:
            data = json.loads(d)  # a list: several of one kind at one instant
            audit.extend((k, t, x) for x in (data if isinstance(data, list) else [data]))
        return world, clock[0] if clock else None, audit

    def save(self, world: tuple[str, list[tuple[str, str, str]]] | None, t: float,
             rows: list[tuple[str, float, dict[str, Any]]]) -> None:
        """`world`: (the rest's JSON text, the (kind, key, JSON) rows that changed); None: unchanged."""
        with self.conn:
            if world is not None:
                rest, items = world
                self.conn.execute("INSERT OR REPLACE INTO world (id, data) VALUES (1, ?)", (rest,))
                # an upsert updates the row in place; a REPLACE deletes it and inserts it anew (twice the work)
                self.conn.executemany("INSERT INTO items (kind, key, data) VALUES (?, ?, ?) "
                                      "ON CONFLICT (kind, key) DO UPDATE SET data = excluded.data", items)
            self.conn.execute("INSERT OR REPLACE INTO clock (id, t) VALUES (1, ?)", (t,))
            # rows of one kind at one instant in one row, as a list (a domain's installs: one row, not 11,520)
            batches: dict[tuple[str, float], list[dict[str, Any]]] = {}
            for k, tt, d in rows:
                batches.setdefault((k, tt), []).append(d)
            self.conn.executemany("INSERT INTO audit (kind, t, data) VALUES (?, ?, ?)",
                                  [(k, tt, _encode(ds).decode()) for (k, tt), ds in batches.items()])

    def checkpoint(self) -> None:
        """Copy what the write-ahead log holds into the database, on a connection of its own, beside the saves
        (a passive checkpoint waits for no writer, and none waits for it). Once called, a save's commit no longer
        checkpoints by itself every 1,000 pages (4 MB: a save or two of a 3,840-host domain's phase end, each
        time twice as long as a save without it); past 64 MB of log it still does, should these calls stop."""
        with self._checkpointing:
            if self._closed:
                return
            if self._checkpointer is None:
                self._checkpointer = sqlite3.connect(self.path, check_same_thread=False)
                self.conn.execute("PRAGMA wal_autocheckpoint=16384")
            self._checkpointer.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()

    def close(self) -> None:
        with self._checkpointing:
            self._closed = True
            if self._checkpointer is not None:
                self._checkpointer.close()
                self._checkpointer = None
        self.conn.close()


_ITEM_KINDS = ("hosts", "jobs", "checks")


def _locked(method: Callable[Concatenate[SimEngine, P], R]) -> Callable[Concatenate[SimEngine, P], R]:
    """Run a public method under the lock, on an up-to-date world, and persist what it changed."""
    return _under_lock(method, world=True)


def _read(method: Callable[Concatenate[SimEngine, P], R]) -> Callable[Concatenate[SimEngine, P], R]:
    """`_locked` for a read: what the clock brought about while it caught up (a phase's end) is saved, with its
    audit rows, by the next write or the ticker's next advance (within a tenth of a second), not before the
    answer; the clock is saved at once. Such changes follow from what was saved and the time alone (the random
    draws come from the saved generator), so a crash in between loses none of them: the restarted simulator
    brings them about again."""
    return _under_lock(method, world=False)


def _under_lock(method: Callable[Concatenate[SimEngine, P], R], *,
                world: bool) -> Callable[Concatenate[SimEngine, P], R]:
    @functools.wraps(method)
    def wrapper(self: SimEngine, *args: P.args, **kwargs: P.kwargs) -> R:
        # The collector is paused while the lock is held (`gcpause.paused`), and on again once it is let go: a
        # domain's call or phase end makes tens of thousands of objects (installs, returns, checks, their rows),
        # which set off a pass each few hundred, and each pass re-walks what the train made since the last
        # freeze (`gcpause.keep_long_lived`): 9 ms of a 3,840-host upgrade call at a train's first stop, 70 ms at
        # its thirteenth. One pass after the call does what they did, with no one waiting for the lock.
        with gcpause.paused(), self._lock:
            self._advance_locked()
            self._flush()
            try:
                return method(self, *args, **kwargs)
            finally:
                self._settle(world=world)

    return wrapper  # type: ignore[return-value]  # functools.wraps types it as _Wrapped, a callable of this shape


class SimEngine:
    """The simulated fleet. Thread-safe; implements `railyard.fleet.port.Fleet`."""

    def __init__(self, config: RailyardConfig, db_path: str | None = None, clock: Callable[[], float] | None = None):
        self.config = config
        self.sim = config.simulator
        self.speed = float(config.simulator.speed)
        self._clock = clock or time.monotonic
        self._lock = threading.RLock()
        self._components = {c.name: c for c in config.components}
        self._store = _Store(db_path) if db_path else None

        self._hosts: dict[str, _Host] = {}
        self._jobs: dict[str, _Job] = {}
        self._checks: dict[tuple[str, str], _Check] = {}  # latest check per (host, op)
        self._stops: dict[tuple[str, str], dict[str, list[float | None]]] = {}  # (op, domain) -> phase -> [start, end]
        self._rates = {
            "host_failure_per_hour": self.sim.host_failure_per_hour,
            "upgrade_fail_rate": self.sim.upgrade_fail_rate,
            "check_fail_rate": self.sim.check_fail_rate,
        }
        self._rng = random.Random(self.sim.seed)
        self._t = 0.0
        # audit, in memory (persisted as append-only rows)
        self._samples: list[dict[str, Any]] = []
        self._interruptions: list[dict[str, Any]] = []
        self._returns: list[dict[str, Any]] = []
        self._refusals: list[dict[str, Any]] = []  # in memory only: since this process started
        self._placements: list[dict[str, Any]] = []  # in memory only: when each job (re)started, for studies
        self._installs: dict[tuple[str, str, str], int] = {}
        self._rows: list[tuple[str, float, dict[str, Any]]] = []  # audit rows not yet written
        # Every change of the world sets `_dirty`, which also bumps `_gen`: what is derived from the
        # whole fleet (next event, capacity picture, the hosts' JSON) is kept until the next change,
        # so an idle tick or a read of a large fleet does not walk every host again.
        self._gen = 0
        self._changed = False
        self._derived: dict[str, tuple[int, Any]] = {}
        self._names: list[str] = []  # host names, sorted (hosts are fixed by the config)
        # Changes (see the module's docs): `_touched` is filled by the objects themselves; `_flush` moves it
        # to `_unsaved` (the rows the next save writes) and gives each host changed the next `_seq` in
        # `_host_rev`, with a (seq, name) entry in `_host_log` (in seq order) for "what changed since".
        self._touched: set[tuple[str, str]] = set()
        self._unsaved: set[tuple[str, str]] = set()
        self._seq = 0
        self._host_rev: dict[str, int] = {}
        self._host_log: list[tuple[int, str]] = []
        self._free: set[str] = set()  # the hosts serving with no job, kept as hosts change (for placing jobs)
        self._not_serving: set[str] = set()  # kept as hosts change (for reads of the hosts out of service)
        self._check_rev: dict[str, dict[str, int]] = {}  # op -> host -> the `_seq` of its check's last change
        self._epoch = secrets.token_hex(6)  # a cursor of another engine (a restart) is never taken for ours
        self._host_json: dict[str, bytes] = {}  # name -> its API JSON, until it changes
        # The lists of hosts last asked for by name, each checked once (a train polls its domain's thousands of
        # names ten times a second), with each name's place in the list
        self._lists: OrderedDict[tuple[str, ...], dict[str, int]] = OrderedDict()
        self._json_seq = 0  # `tick` made the JSON of the hosts changed up to this `_seq`
        # What the clock waits for, kept as objects change: each host's and job's next event time.
        self._due: _Timeline[tuple[str, str]] = _Timeline()
        # When hosts' transitions end, for the server's clock to wake at (`next_transition_in`).
        self._until: _Timeline[str] = _Timeline()
        # The capacity picture, kept as hosts change: hosts per state, and per domain its hosts out for
        # maintenance (not a repair's); `_counted` is what each host was counted as.
        self._states: Counter[HostState] = Counter()
        self._out: Counter[str] = Counter()
        self._counted: dict[str, tuple[HostState, str | None]] = {}
        self._pending: set[str] = set()  # the jobs waiting for hosts
        self._saved_t: float | None = None
        self._unsaved_since: float | None = None  # real time since when a read's or a tick's changes wait for a save

        world, clock_t, rows = self._store.load() if self._store else (None, None, [])
        if world is None:
            self._seed_world()
        else:
            self._restore(world, rows)
            self._flush()  # counted and timed as read
            if world.get("version") == SNAPSHOT_VERSION:
                self._unsaved.clear()  # what was read is what is stored (a version-1 world is written anew)
        # The clock resumes where it was last shown (a read saves it); the world, saved at its last change, catches
        # up to it at the first call below, each event at its own time, as it did before the restart (`_read`)
        self._base_fleet = max(self._t, clock_t or 0.0)
        self._base_real = self._clock()
        with self._lock:
            self._settle()

    # ---- the Fleet protocol ------------------------------------------------------------------
    @_read
    def now(self) -> float:
        return self._t

    @_read
    def hosts(self, names: list[str] | None = None) -> list[Host]:
        if names is None:
            return [self._hosts[n].public() for n in self._names]
        return [self._host(n).public() for n in names]

    @_read
    def hosts_out(self) -> list[Host]:
        """The hosts not serving, in name order (`railyard.fleet.port.ReadsHostsOut`)."""
        return [self._hosts[n].public() for n in sorted(self._not_serving)]

    @_read
    def hosts_json(self, names: list[str] | None = None) -> bytes:
        """`hosts(names)` as a JSON array of `Host` objects, for the API. The whole fleet's is built
        once per change of the world, so repeated reads of a large fleet cost nothing."""
        if names is not None:
            # each host's JSON kept as the whole fleet's is: redone only for the hosts that changed
            self._known(names)
            return b"[" + b",".join(self._host_part(n) for n in names) + b"]"
        payload: bytes = self._cached("hosts_json", lambda: (
            b"[" + b",".join(self._host_part(n) for n in self._names) + b"]"))
        return payload

    @_read
    def host_changes(self, names: list[str] | None, since: str | None,
                     out: bool = False) -> tuple[str, bytes, bool]:
        """(cursor, JSON array of hosts, delta): the hosts among `names` (None: the fleet) that changed
        after `since`, a cursor an earlier call returned. delta is False when `since` is not a cursor of this
        engine (another process's, a malformed one): then every host asked for is in the answer. Pass the
        returned cursor next time; a host is in an answer whenever anything of its public view may differ.
        `out` (the fleet only): a whole answer holds only the hosts not serving; a delta, as ever, every host
        that changed, whatever its state (so that a reader drops the ones back in service). With `out`, the
        answer is whole (delta False) whenever that is shorter than the delta."""
        cursor = f"{self._epoch}.{self._seq}"
        after = self._cursor_seq(since)
        if after is None and out and names is None:
            # in name order, as a read of the whole fleet is (`_names` is sorted)
            return cursor, b"[" + b",".join(self._host_part(n) for n in sorted(self._not_serving)) + b"]", False
        if after is None:
            return cursor, self.hosts_json(names), False
        if names is None:
            changed = sorted({n for _, n in self._log_since(after)})
            if out and len(changed) > len(self._not_serving):
                # more hosts changed than are out now (a domain gone out and back since the cursor): the
                # whole answer is the smaller one, and a reader takes an answer without the echo as whole
                return cursor, b"[" + b",".join(self._host_part(n) for n in sorted(self._not_serving)) + b"]", False
        else:
            place = self._list(names)
            recent = self._log_since(after)
            if len(recent) < len(names) and len(place) == len(names):
                # fewer hosts changed since than were asked for (a poll while a domain installs: none): found from
                # the log, in the order asked, without a look at each name
                changed = [names[i] for i in sorted({place[n] for _, n in recent if n in place})]
            else:
                rev = self._host_rev
                changed = [n for n in names if rev.get(n, 0) > after]
        return cursor, b"[" + b",".join(self._host_part(n) for n in changed) + b"]", True

    def _cursor_seq(self, since: str | None) -> int | None:
        epoch, _, seq = (since or "").partition(".")
        if epoch != self._epoch or not seq.isdigit() or int(seq) > self._seq:
            return None
        return int(seq)

    @_read
    def jobs(self, hosts: list[str] | None = None) -> list[Job]:
        return [self._jobs[j].public() for j in self._job_ids(hosts)]

    @_read
    def jobs_json(self, hosts: list[str] | None = None) -> bytes:
        """`jobs(hosts)` as a JSON array of `Job` objects, for the API, without a model per job."""
        return b"[" + b",".join(_encode(self._jobs[j].row()) for j in self._job_ids(hosts)) + b"]"

    def _job_ids(self, hosts: list[str] | None) -> list[str]:
        """The jobs running on any of `hosts` (None: every job), in id order: found from the hosts (each knows
        its job), so a domain's read costs its hosts, not the fleet's jobs."""
        if hosts is None:
            return sorted(self._jobs)
        return sorted({j for j in (self._host(n).job for n in hosts) if j is not None})

    @_locked
    def request_checkpoint(self, job_ids: list[str]) -> float:
        jobs = [self._job(j) for j in job_ids]
        t = self._t
        self._dirty = True
        for job in jobs:
            job.checkpoint_requested_at = t
            if job.state != "running":
                job.last_checkpoint = t  # nothing runs, so nothing can be lost
            elif job.checkpoint_due is None and not job.stuck:  # one on its way also answers this request
                job.checkpoint_due = t + self.sim.jobs.checkpoint_duration_s
        return t

    @_locked
    def drain(self, hosts: list[str], op: str) -> None:
        self._check_op(op)
        targets = [self._host(n) for n in hosts]
        todo: list[_Host] = []
        for h in targets:
            if h.operation == op and h.state in MAINTENANCE_STATES:
                continue  # already out under this operation
            if h.state != HostState.SERVING or h.operation is not None:
                raise self._refuse(h, op, f"cannot drain {h.name}: {self._describe(h)}")
            todo.append(h)
        if not todo:
            return
        self._dirty = True
        for h in todo:  # take them all out first, so a displaced job is not re-placed on one of them
            h.state, h.operation, h.until, h.fail_at = HostState.DRAINING, op, self._t + self.sim.drain_s, None
            h.last_error = None  # a new operation starts clean
            self._phase(op, h.domain, "drain", start=self._t)
        for h in todo:
            if h.job is not None:
                self._interrupt(self._jobs[h.job], h.name, f"drained by {op}")

    def upgrade(self, host: str, steps: list[Step], op: str) -> None:
        self.upgrade_hosts({host: steps}, op)

    @_locked
    def upgrade_hosts(self, work: Mapping[str, Sequence[Step | Mapping[str, Any]]], op: str) -> None:
        """Start the upgrades of many drained hosts in one call, in the order given; a host refused does
        not stop the others, and the first refusal is raised once every host was tried."""
        self._check_op(op)
        self._known(list(work))
        made: dict[tuple[Any, Any], Step] = {}  # a domain's hosts share their steps: one Step a pair

        def step(s: Step | Mapping[str, Any]) -> Step:
            if isinstance(s, Step):
                return s
            key = (s.get("component"), s.get("version")) if isinstance(s, Mapping) and len(s) == 2 else None
            if key is None or type(key[0]) is not str or type(key[1]) is not str:
                return Step.model_validate(s)  # refuses, naming the field, what is not a step
            found = made.get(key)
            if found is None:
                found = made[key] = Step.model_validate(s)
            return found

        checked = {n: [step(s) for s in steps] for n, steps in work.items()}
        for host, steps in checked.items():
            for s in steps:
                if s.component not in self._components:
                    raise FleetError(f"cannot upgrade {host}: unknown component {s.component!r}")
        self._each(checked, lambda host, steps: self._upgrade_one(self._hosts[host], steps, op))

    def _upgrade_one(self, h: _Host, steps: list[Step], op: str) -> None:
        if h.state == HostState.UPGRADING and h.operation == op:
            return  # re-attach to the upgrade in flight
        todo = [s for s in steps if h.versions.get(s.component) != s.version]
        if not todo and h.operation == op and h.state in MAINTENANCE_STATES:
            return
        if h.state != HostState.DRAINED or h.operation != op:
            raise self._refuse(h, op, f"cannot upgrade {h.name}: {self._describe(h)}; "
                                      f"it must be drained and held by {op}")
        if not todo:
            return
        self._dirty = True
        fail_index = self._rng.randrange(len(todo)) if self._rng.random() < self._rates["upgrade_fail_rate"] else None
        started = todo if fail_index is None else todo[: fail_index + 1]
        duration = sum(self._components[s.component].duration_s for s in started)
        if any(self._components[s.component].reboot for s in started):
            duration += self.sim.reboot_s  # one reboot for the whole batch
        for s in started:
            key = (h.name, s.component, s.version)
            self._installs[key] = self._installs.get(key, 0) + 1
            self._rows.append(("install", self._t, {"host": h.name, "component": s.component, "version": s.version}))
        h.state, h.until = HostState.UPGRADING, self._t + duration
        h.upgrade = {"steps": [[s.component, s.version] for s in todo], "fail_index": fail_index}
        self._phase(op, h.domain, "upgrade", start=self._t)

    @_locked
    def start_check(self, host: str, expected: dict[str, str], op: str) -> CheckResult:
        """Start a deep check; a repeat for the same (host, op, expected) returns the existing check
        while the host's versions have not changed since it started."""
        self.start_checks({host: expected}, op)
        return self._checks[(self._host(host).name, op)].public()

    @_locked
    def start_checks(self, expected: dict[str, dict[str, str]], op: str) -> None:
        """`start_check` for many hosts in one call, in the order given; a host refused does not stop
        the others, and the first refusal is raised once every host was tried."""
        self._check_op(op)
        checked = {self._host(n).name: dict(want) for n, want in expected.items()}
        for comp, version in dict.fromkeys(cv for want in checked.values() for cv in want.items()):  # a domain: a few
            self._token(comp, "component")
            self._token(version, "version")
        self._each(checked, lambda host, want: self._check_one(self._hosts[host], want, op))

    def _check_one(self, h: _Host, expected: dict[str, str], op: str) -> None:
        existing = self._checks.get((h.name, op))
        if (
            existing is not None
            and existing.expected == expected
            and (existing.status == "pending" or existing.versions_at_start == h.versions)
        ):
            return
        if h.state != HostState.DRAINED or h.operation != op:
            raise self._refuse(h, op, f"cannot check {h.name}: {self._describe(h)}; "
                                      f"it must be drained and held by {op}")
        self._dirty = True
        self._checks[(h.name, op)] = self._track(_Check(host=h.name, op=op, expected=dict(expected),
                                                        started_at=self._t, versions_at_start=dict(h.versions)))
        h.state, h.until = HostState.CHECKING, self._t + self.sim.check_s
        self._phase(op, h.domain, "check", start=self._t)

    @staticmethod
    def _each(work: dict[str, T], start: Callable[[str, T], None]) -> None:
        """`start(host, what)` for every host; the first refusal is raised after the last host was tried."""
        first: FleetError | None = None
        for host, what in work.items():
            try:
                start(host, what)
            except FleetError as exc:
                first = first or exc
        if first is not None:
            raise first

    @_read
    def check_results(self, hosts: list[str], op: str) -> list[CheckResult]:
        """The latest check per host for `op`; hosts never checked under `op` are left out."""
        out: list[CheckResult] = []
        for name in hosts:
            check = self._checks.get((self._host(name).name, op))
            if check is not None:
                out.append(check.public())
        return out

    @_read
    def check_results_json(self, hosts: list[str], op: str) -> bytes:
        """`check_results` as a JSON array of `CheckResult` objects, for the API (a domain's thousands
        encoded at once rather than a model each)."""
        rows = []
        for name in hosts:
            c = self._checks.get((self._host(name).name, op))
            if c is not None:
                rows.append({"host": c.host, "status": c.status, "reason": c.reason, "versions": c.versions})
        return _encode(rows)

    @_read
    def check_changes(self, hosts: list[str], op: str, since: str | None) -> tuple[str, bytes, bool]:
        """(cursor, JSON array of check results, delta), as `host_changes` is for hosts: the latest check per
        host of `hosts` for `op` that changed after `since`; all of them when `since` is not this engine's."""
        cursor = f"{self._epoch}.{self._seq}"
        after = self._cursor_seq(since)
        if after is None:
            return cursor, self.check_results_json(hosts, op), False
        self._list(hosts)
        rev = self._check_rev.get(op, {})
        changed = [n for n in hosts if rev.get(n, 0) > after]
        return cursor, self.check_results_json(changed, op), True

    @_locked
    def return_to_service(self, hosts: list[str], op: str) -> None:
        self._check_op(op)
        targets = [self._host(n) for n in hosts]
        todo: list[_Host] = []
        for h in targets:
            if h.state == HostState.SERVING or (h.state == HostState.RETURNING and h.operation == op):
                continue
            if h.state not in (HostState.DRAINED, HostState.DRAINING) or h.operation != op:
                raise self._refuse(h, op, f"cannot return {h.name}: {self._describe(h)}; "
                                          f"it must be drained and held by {op}")
            todo.append(h)
        if not todo:
            return
        self._dirty = True
        for h in todo:
            check = self._checks.get((h.name, op))
            verified = check is not None and check.status == "passed" and check.versions == h.versions
            record = {"host": h.name, "op": op, "at": self._t, "verified": verified, "versions": dict(h.versions)}
            self._returns.append(record)
            self._rows.append(("return", self._t, record))
            h.state, h.until = HostState.RETURNING, self._t + self.sim.return_s
            self._phase(op, h.domain, "return", start=self._t)

    @_locked
    def offboard(self, host: str, reason: str, op: str) -> None:
        self._check_op(op)
        h = self._host(host)
        if not isinstance(reason, str) or not reason.strip() or len(reason) > 1000:
            raise FleetError(f"cannot offboard {host}: give a reason (1 to 1000 characters)")
        if h.state == HostState.REPAIR:
            return
        if h.operation not in (None, op):
            raise self._refuse(h, op, f"cannot offboard {host}: {self._describe(h)}")
        self._dirty = True
        check = self._checks.get((h.name, op))
        if h.state == HostState.CHECKING and check is not None and check.status == "pending":
            check.status, check.reason, check.done_at = "failed", "interrupted: host offboarded", self._t
        h.state, h.operation, h.reason = HostState.REPAIR, op, reason
        h.until, h.upgrade, h.fail_at = None, None, None
        if h.job is not None:
            self._interrupt(self._jobs[h.job], h.name, f"offboarded by {op}: {reason}")

    @_read
    def capacity(self) -> Capacity:
        serving, by_state, domains_out = self._picture()
        return Capacity(
            now=self._t,
            total_hosts=len(self._hosts),
            serving_hosts=serving,
            by_state=dict(by_state),
            domains_out=list(domains_out),
        )

    # ---- beyond the protocol -------------------------------------------------------------------
    @_locked
    def set_job(self, job_id: str, *, dodge_until: float | None = None, stuck: bool | None = None,
                clear_dodge: bool = False) -> Job:
        """What a job can say about itself: a dodge deadline, or (for fault tests) that it hangs."""
        job = self._job(job_id)
        if dodge_until is not None:
            job.dodge_until = float(dodge_until)
        if clear_dodge:
            job.dodge_until = None
        if stuck is not None:
            job.stuck = bool(stuck)
            if job.stuck:
                job.checkpoint_due = None
        self._dirty = True
        return job.public()

    @_locked
    def add_job(self, job_id: str, hosts: int, checkpoint_interval_s: float | None = None) -> Job:
        """A job arrives: it needs `hosts` hosts and starts as soon as that many serve free (studies use
        it for job sizes and arrivals beyond `simulator.jobs`)."""
        self._token(job_id, "job id")
        if job_id in self._jobs:
            raise FleetError(f"job {job_id!r} exists already")
        if not isinstance(hosts, int) or not 1 <= hosts <= len(self._hosts):
            raise FleetError(f"job {job_id!r}: hosts must be 1 to {len(self._hosts)}, not {hosts!r}")
        interval = (self.sim.jobs.checkpoint_interval_s if checkpoint_interval_s is None
                    else float(checkpoint_interval_s))
        if interval <= 0:
            raise FleetError(f"job {job_id!r}: checkpoint_interval_s must be > 0, not {checkpoint_interval_s!r}")
        job = self._track(_Job(id=job_id, hosts=[], gpus=hosts * self.sim.gpus_per_host, state="pending",
                               last_checkpoint=self._t, checkpoint_interval=interval, size=hosts))
        self._jobs[job_id] = job
        self._dirty = True
        return job.public()

    @_locked
    def fail(self, host: str) -> Host:
        """Fault injection: a serving host breaks now (it comes back after `repair_s`)."""
        h = self._host(host)
        if h.state != HostState.SERVING:
            raise FleetError(f"only a serving host can fail: {self._describe(h)}")
        self._fail(h)
        self._dirty = True
        return h.public()

    @_locked
    def repaired(self, host: str) -> Host:
        """The repair team is done: the host waits, drained, for Railyard's health gate."""
        h = self._host(host)
        if h.state != HostState.REPAIR:
            raise FleetError(f"{h.name} is not in repair: {self._describe(h)}")
        h.state, h.reason, h.last_error, h.until = HostState.DRAINED, None, None, None
        self._dirty = True
        return h.public()

    @_locked
    def handover(self, hosts: list[str], from_op: str, to_op: str) -> None:
        """Hosts held by `from_op` pass to `to_op` without coming back in between."""
        self._check_op(from_op)
        self._check_op(to_op)
        moving = []
        for h in (self._host(n) for n in hosts):  # all checked before any moves: never half handed over
            if h.operation == to_op or (h.operation is None and h.state == HostState.SERVING):
                continue  # already handed over, or not taken out yet: nothing to hand over here
            if h.operation != from_op:
                raise self._refuse(h, from_op, f"cannot hand {h.name} from {from_op} to {to_op}: {self._describe(h)}")
            moving.append(h)
        for h in moving:
            h.operation = to_op
            self._dirty = True

    @_locked
    def advance(self) -> float:
        """Process everything due up to fleet-now, and save it (the server's clock uses `tick`)."""
        return self._t

    @_read
    def tick(self, save_after_s: float = 1.0) -> None:
        """The server's clock, between calls (~10 times a second, and at the end of each transition:
        `next_transition_in`): brings about what fell due as a read does, so that the end of a domain's phase,
        thousands of hosts, is saved by the next write, which a train's next step soon is: written once with
        that step's own change to the same hosts, and not while the step's poll waits for the lock. What reads
        and ticks brought about is saved here once it has waited `save_after_s` real seconds without a write.
        The JSON of the hosts changed since the last tick is made here too, ready for the reads that follow."""
        since = self._unsaved_since
        if since is not None and self._clock() - since >= save_after_s:
            self._persist()
        self._flush()
        for _seq, name in self._log_since(self._json_seq):  # a phase's end: what the train's poll reads next
            self._host_part(name)
        self._json_seq = self._seq

    def checkpoint(self) -> None:
        """Fold the database's write-ahead log into it (`_Store.checkpoint`), outside the engine's lock: the
        server's clock does it between ticks, so that no call waits for it. Changes nothing in the world."""
        store = self._store
        if store is not None:
            store.checkpoint()

    def next_transition_in(self) -> float | None:
        """Real seconds until the next host's transition (a drain, an install, a check, a return, a repair)
        ends, or None: the server advances the world then, so that the end of a domain's phase (thousands of
        hosts changed and saved) is brought about as it falls due, not inside the read that first looks.
        Changes nothing. The collector is paused while it holds the lock, as for every call (`_under_lock`)."""
        with gcpause.paused(), self._lock:
            self._flush()
            first = self._until.first()
            if first is None:
                return None
            return max(0.0, (first - self._fleet_now()) / self.speed)

    @_locked
    def settings(
        self,
        host_failure_per_hour: float | None = None,
        upgrade_fail_rate: float | None = None,
        check_fail_rate: float | None = None,
    ) -> dict[str, float]:
        """Change the fault rates at run time (None keeps a rate); returns the rates now in force."""
        for name, value, top in (
            ("upgrade_fail_rate", upgrade_fail_rate, 1.0),
            ("check_fail_rate", check_fail_rate, 1.0),
            ("host_failure_per_hour", host_failure_per_hour, math.inf),
        ):
            if value is not None and not (0 <= value <= top):
                raise FleetError(f"{name} must be between 0 and {top}, not {value!r}")
        if upgrade_fail_rate is not None:
            self._rates["upgrade_fail_rate"] = float(upgrade_fail_rate)
        if check_fail_rate is not None:
            self._rates["check_fail_rate"] = float(check_fail_rate)
        if host_failure_per_hour is not None:
            self._rates["host_failure_per_hour"] = float(host_failure_per_hour)
            for h in self._sorted_hosts():  # failures are memoryless, so redrawing is exact
                if h.state == HostState.SERVING:
                    h.fail_at = self._draw_failure()
        self._dirty = self._dirty or any(v is not None
                                         for v in (host_failure_per_hour, upgrade_fail_rate, check_fail_rate))
        return dict(self._rates)

    @_read
    def samples(self) -> list[dict[str, Any]]:
        """The capacity time series: one sample per change of the host states."""
        return [dict(s) for s in self._samples]

    @_read
    def audit(self) -> dict[str, Any]:
        """What happened, for the tests and the benchmarks to judge (see the module docs)."""
        total = len(self._hosts)
        counts: dict[tuple[str, str, str], int] = self._installs
        stops = [self._stop_summary(op, dom, phases) for (op, dom), phases in sorted(self._stops.items())]
        return {
            "now": self._t,
            "speed": self.speed,
            "total_hosts": total,
            "max_domains_out": max((len(s["domains_out"]) for s in self._samples), default=0),
            "min_serving_fraction": min((s["serving"] / total for s in self._samples), default=1.0),
            "interruptions": [dict(i) for i in self._interruptions],
            "lost_gpu_hours": sum(i["lost_gpu_hours"] for i in self._interruptions),
            "max_lost_s": max((i["lost_s"] for i in self._interruptions), default=0.0),
            "returns": [dict(r) for r in self._returns],
            "unverified_returns": [r["host"] for r in self._returns if not r["verified"]],
            "refusals": [dict(r) for r in self._refusals],
            "placements": [dict(p) for p in self._placements],
            "installs": [
                {"host": h, "component": c, "version": v, "count": n} for (h, c, v), n in sorted(counts.items())
            ],
            "stops": stops,
            "work_seconds": sum(s["work_s"] for s in stops) / self.speed,
        }

    def close(self) -> None:
        with self._lock:
            self._settle()
            if self._store is not None:
                self._store.close()
                self._store = None

    # ---- time ------------------------------------------------------------------------------------
    def _fleet_now(self) -> float:
        return self._base_fleet + (self._clock() - self._base_real) * self.speed

    def _advance_locked(self) -> None:
        self._run_until(max(self._t, self._fleet_now()))

    def _run_until(self, target: float) -> None:
        """Fire every due event in time order (several at one instant fire together), up to `target`."""
        while True:
            due = self._next_due()
            if due is None or due > target:
                break
            self._t = max(self._t, due)
            self._fire(due)
            self._place_pending()
            self._sample()
        self._t = max(self._t, target)

    def _settle(self, world: bool = True) -> None:
        """After a call: place waiting jobs, fire what became due at once, sample and persist (`world` False:
        the clock and the audit only, see `_read`)."""
        self._place_pending()
        self._run_until(self._t)
        self._sample()
        self._persist(world)

    def _next_due(self) -> float | None:
        self._flush()
        return self._due.first()

    def _take_due(self, t: float) -> tuple[list[_Job], list[_Host]]:
        """The jobs and hosts whose next event is at or before `t`, each in name order."""
        jobs: list[str] = []
        hosts: list[str] = []
        due = self._due.pop_until(t)
        self._touched.update(due)  # their next events are found again once they have changed
        for kind, name in due:
            (jobs if kind == "jobs" else hosts).append(name)
        return [self._jobs[k] for k in sorted(jobs)], [self._hosts[n] for n in sorted(hosts)]

    def _fire(self, t: float) -> None:
        self._dirty = True
        jobs, hosts = self._take_due(t)  # what is due; nothing else would change here
        for j in jobs:
            if j.state != "running" or j.stuck:
                continue
            if j.checkpoint_due is not None and j.checkpoint_due <= t:
                j.last_checkpoint, j.checkpoint_due = j.checkpoint_due, None
            if j.last_checkpoint + j.checkpoint_interval <= t:
                j.last_checkpoint += j.checkpoint_interval
        for h in hosts:
            if h.until is not None and h.until <= t:
                self._finish(h, t)
            elif h.state == HostState.SERVING and h.fail_at is not None and h.fail_at <= t:
                self._fail(h)

    def _finish(self, h: _Host, t: float) -> None:
        """A host's transition ends."""
        h.until = None
        if h.state == HostState.DRAINING:
            h.state = HostState.DRAINED
            self._phase(h.operation, h.domain, "drain", end=t)
        elif h.state == HostState.UPGRADING:
            self._finish_upgrade(h)
            self._phase(h.operation, h.domain, "upgrade", end=t)
        elif h.state == HostState.CHECKING:
            self._finish_check(h, t)
            self._phase(h.operation, h.domain, "check", end=t)
        elif h.state == HostState.RETURNING:
            self._phase(h.operation, h.domain, "return", end=t)
            h.state, h.operation = HostState.SERVING, None
            h.fail_at = self._draw_failure()
        elif h.state == HostState.FAILED:  # repaired
            h.state, h.reason = HostState.SERVING, None
            h.fail_at = self._draw_failure()

    def _finish_upgrade(self, h: _Host) -> None:
        plan = h.upgrade or {"steps": [], "fail_index": None}
        steps, fail_index = plan["steps"], plan["fail_index"]
        applied = steps if fail_index is None else steps[:fail_index]
        for comp, version in applied:
            h.versions[comp] = version
        h.changed()
        if fail_index is None:
            h.last_error = None
        else:
            comp, version = steps[fail_index]
            h.last_error = f"install {comp} {version} failed: {self._rng.choice(_INSTALL_ERRORS)}"
        h.state, h.upgrade = HostState.DRAINED, None

    def _finish_check(self, h: _Host, t: float) -> None:
        check = self._checks.get((h.name, h.operation or ""))
        h.state = HostState.DRAINED
        if check is None or check.status != "pending":
            return
        wrong = [(c, want) for c, want in check.expected.items() if h.versions.get(c) != want]
        if wrong:
            check.status = "failed"
            check.reason = "; ".join(
                f"version mismatch: {c} is {h.versions.get(c, 'missing')}, expected {want}" for c, want in wrong
            )
        elif self._rng.random() < self._rates["check_fail_rate"]:
            check.status, check.reason = "failed", self._rng.choice(_CHECK_FAILURES)(self._rng)
        else:
            check.status = "passed"
        check.versions, check.done_at = dict(h.versions), t

    def _fail(self, h: _Host) -> None:
        reason = self._rng.choice(_HOST_FAILURES)(self._rng)
        h.state, h.reason, h.fail_at = HostState.FAILED, reason, None
        h.until = self._t + self.sim.repair_s
        if h.job is not None:
            self._interrupt(self._jobs[h.job], h.name, f"host failed: {reason}")

    def _draw_failure(self) -> float | None:
        rate = self._rates["host_failure_per_hour"]
        return self._t + self._rng.expovariate(rate / 3600.0) if rate > 0 else None

    # ---- jobs ------------------------------------------------------------------------------------
    def _interrupt(self, job: _Job, host: str, reason: str) -> None:
        """The whole job stops and loses the work since its last checkpoint; it waits to be re-placed."""
        lost = max(0.0, self._t - job.last_checkpoint)
        record = {
            "job": job.id,
            "at": self._t,
            "host": host,
            "reason": reason,
            "lost_s": lost,
            "lost_gpu_hours": lost / 3600.0 * job.gpus,
        }
        self._interruptions.append(record)
        self._rows.append(("interruption", self._t, record))
        for name in job.hosts:
            self._hosts[name].job = None
        job.hosts, job.state, job.checkpoint_due = [], "pending", None

    def _place_pending(self, order: list[str] | None = None) -> None:
        self._flush()
        pending = [self._jobs[k] for k in sorted(self._pending)]
        if not pending:
            return
        if order is None and self._derived.get("placed", (-1, None))[0] == self._gen:
            return  # nothing changed since the last try placed nothing
        # the free hosts, in order, found once: each job placed takes the first ones still free. Only the first
        # `wanted` can be taken, and a job that does not fit in what is left of them would not fit in the rest.
        wanted = sum(job.size or self.sim.jobs.hosts_per_job for job in pending)
        if order is not None:
            free = [n for n in order if self._hosts[n].state == HostState.SERVING and self._hosts[n].job is None]
        elif len(self._free) <= wanted:
            free = sorted(self._free)
        else:
            free = heapq.nsmallest(wanted, self._free)  # the names are in `self._names`' (sorted) order
        for job in pending:
            need = job.size or self.sim.jobs.hosts_per_job
            if len(free) < need:
                continue
            self._dirty = True
            job.hosts, job.state, job.last_checkpoint = free[:need], "running", self._t  # resumes from its checkpoint
            del free[:need]
            self._placements.append({"job": job.id, "at": self._t, "hosts": need})
            for n in job.hosts:
                self._hosts[n].job = job.id
        self._derived["placed"] = (self._gen, None)

    # ---- world ---------------------------------------------------------------------------------
    def _seed_world(self) -> None:
        # The fleet clock is a unix time that runs `speed` times faster than real time, so
        # calendar rules (windows, freezes) read the same on the simulator as on a real fleet.
        start = self.sim.start_at
        if start is not None and start.tzinfo is None:
            start = start.replace(tzinfo=timezone.utc)
        self._t = start.timestamp() if start else time.time()
        for d in self.config.domains:
            for name in d.hosts:
                self._hosts[name] = self._track(_Host(
                    name=name,
                    domain=d.name,
                    sku=d.sku,
                    gpus=self.sim.gpus_per_host,
                    state=HostState.SERVING,
                    versions=dict(self.sim.initial_versions),
                ))
        self._names = sorted(self._hosts)
        for h in self._sorted_hosts():
            h.fail_at = self._draw_failure()
        spec = self.sim.jobs
        for i in range(spec.count):
            self._jobs[f"job-{i + 1:02d}"] = self._track(_Job(
                id=f"job-{i + 1:02d}",
                hosts=[],
                gpus=spec.hosts_per_job * self.sim.gpus_per_host,
                state="pending",
                last_checkpoint=self._t,
                checkpoint_interval=spec.checkpoint_interval_s,
            ))
        names = sorted(self._hosts)
        offset = (spec.hosts_per_job // 2) % len(names)
        self._place_pending(order=names[offset:] + names[:offset])  # jobs straddle two domains
        self._dirty = True

    def _snapshot(self) -> tuple[str, list[tuple[str, str, str]]]:
        """The world to save: the rest as JSON text, and the (kind, key, JSON) row of every host, job and check
        that changed since the last save (`_unsaved`): a change to a 76,800-host fleet writes the hosts it
        changed, and looks at no other. Each object is encoded as the dataclass it is: its declared fields,
        never the tracking attributes (`_sink`, `_key`) set beside them."""
        self._flush()
        rows: list[tuple[str, str, str]] = []
        for kind, key in sorted(self._unsaved):
            if kind == "hosts":
                rows.append((kind, key, _encode(self._hosts[key]).decode()))  # its fields: a dataclass's
            elif kind == "jobs":
                rows.append((kind, key, _encode(self._jobs[key]).decode()))
            else:
                host, _, op = key.partition("\t")
                rows.append((kind, key, _encode(self._checks[(host, op)]).decode()))
        return json.dumps(self._snapshot_rest()), rows

    def _track(self, obj: TrackedT) -> TrackedT:
        """`obj` (a new host, job or check) from now on notes its changes; it is itself one."""
        if isinstance(obj, _Host):
            key = ("hosts", obj.name)
        elif isinstance(obj, _Job):
            key = ("jobs", obj.id)
        else:
            assert isinstance(obj, _Check)
            key = ("checks", f"{obj.host}\t{obj.op}")
        object.__setattr__(obj, "_key", key)
        object.__setattr__(obj, "_sink", self._touched)
        self._touched.add(key)
        return obj

    def _flush(self) -> None:
        """Move what the objects noted to the next save, and give each host changed the next sequence number.
        (A domain's phase end is thousands of hosts at once: what each needs is looked up once, not per host.)"""
        touched = self._touched
        if not touched:
            return
        self._seq += 1
        seq = self._seq
        hosts, rev, log, host_json = self._hosts, self._host_rev, self._host_log, self._host_json
        free, not_serving, count = self._free, self._not_serving, self._count
        due, until, serving, host_due = self._due.set, self._until.set, HostState.SERVING, self._host_due
        for item in touched:
            kind, key = item
            if kind == "hosts":
                rev[key] = seq
                log.append((seq, key))
                host_json.pop(key, None)
                h = hosts[key]
                count(h)
                if h.state == serving:
                    not_serving.discard(key)
                    if h.job is None:
                        free.add(key)
                    else:
                        free.discard(key)
                else:
                    free.discard(key)
                    not_serving.add(key)
                due(item, host_due(h))
                until(key, h.until)
            elif kind == "jobs":
                job = self._jobs[key]
                due(item, self._job_due(job))
                if job.state == "pending":
                    self._pending.add(key)
                else:
                    self._pending.discard(key)
            else:
                host, _, op = key.partition("\t")
                self._check_rev.setdefault(op, {})[host] = seq
        self._unsaved |= touched
        touched.clear()
        self._gen += 1  # what is derived from the hosts (the fleet's JSON, the picture) is made again
        if len(log) > 2 * len(hosts) + 1024:  # each host's latest entry is all "since" needs
            self._host_log = [e for e in log if rev[e[1]] == e[0]]  # still in seq order

    @staticmethod
    def _host_due(h: _Host) -> float | None:
        """When the host's next event is: its transition's end, or its next failure while serving."""
        fail = h.fail_at if h.state == HostState.SERVING else None
        if h.until is None:
            return fail
        return h.until if fail is None else min(h.until, fail)

    @staticmethod
    def _job_due(j: _Job) -> float | None:
        """When the job's next checkpoint (on its cadence, or one requested) completes."""
        if j.state != "running" or j.stuck:
            return None
        t = j.last_checkpoint + j.checkpoint_interval
        return t if j.checkpoint_due is None else min(t, j.checkpoint_due)

    def _count(self, h: _Host) -> None:
        """Count the host in the picture as it is now, in place of what it was counted as."""
        out = h.domain if h.state in MAINTENANCE_STATES and not (h.operation or "").startswith("repair/") else None
        old = self._counted.get(h.name)
        if old == (h.state, out):
            return
        if old is not None:
            self._states[old[0]] -= 1
            if old[1] is not None:
                self._out[old[1]] -= 1
        self._states[h.state] += 1
        if out is not None:
            self._out[out] += 1
        self._counted[h.name] = (h.state, out)

    def _host_part(self, name: str) -> bytes:
        """One host's API JSON, kept until the host changes."""
        hit = self._host_json.get(name)
        if hit is None:
            hit = self._host_json[name] = _encode(self._hosts[name].row())
        return hit

    def _snapshot_rest(self) -> dict[str, Any]:
        return {
            "version": SNAPSHOT_VERSION,
            "t": self._t,
            "stops": [{"op": op, "domain": dom, "phases": ph} for (op, dom), ph in self._stops.items()],
            "rates": self._rates,
            "rng": self._rng.getstate(),
        }

    def _restore(self, world: dict[str, Any], rows: list[tuple[str, float, dict[str, Any]]]) -> None:
        if world.get("version") not in (1, SNAPSHOT_VERSION):
            raise FleetError(f"simulator database has snapshot version {world.get('version')!r}, "
                             f"expected {SNAPSHOT_VERSION}")
        stored = {h["name"] for h in world["hosts"]}
        if stored != set(self.config.host_domain()):
            raise FleetError(
                "simulator database was made for a different fleet (its hosts differ from the config); "
                "use another --db or delete it"
            )
        for raw in world["hosts"]:
            h = _Host(**raw)
            h.state = HostState(h.state)
            self._hosts[h.name] = self._track(h)
        self._names = sorted(self._hosts)
        self._jobs = {j["id"]: self._track(_Job(**j)) for j in world["jobs"]}
        self._checks = {(c["host"], c["op"]): self._track(_Check(**c)) for c in world["checks"]}
        self._stops = {(s["op"], s["domain"]): s["phases"] for s in world["stops"]}
        self._rates.update(world["rates"])
        version, internal, gauss = world["rng"]
        self._rng.setstate((version, tuple(internal), gauss))
        self._t = world["t"]
        for kind, _t, data in rows:
            if kind == "sample":
                self._samples.append(data)
            elif kind == "interruption":
                self._interruptions.append(data)
            elif kind == "return":
                self._returns.append(data)
            elif kind == "install":
                key = (data["host"], data["component"], data["version"])
                self._installs[key] = self._installs.get(key, 0) + 1

    def _persist(self, world: bool = True) -> None:
        """Save what changed: the world's changed rows (unless `world` is False), the clock, the audit's rows."""
        self._flush()
        save_world = world and bool(self._dirty or self._unsaved)
        if self._store is not None and (save_world or (world and self._rows) or self._t != self._saved_t):
            # the audit's rows go with the world they describe (a read's: with the next write)
            self._store.save(self._snapshot() if save_world else None, self._t, self._rows if world else [])
            self._saved_t = self._t
        if world:
            self._rows.clear()
            self._unsaved.clear()
            self._dirty = False
            self._unsaved_since = None
        elif self._unsaved_since is None and (self._unsaved or self._rows or self._dirty):
            self._unsaved_since = self._clock()

    # ---- audit -----------------------------------------------------------------------------------
    def _sample(self) -> None:
        """Record the capacity picture if it changed since the last sample."""
        if self._derived.get("sampled", (-1, None))[0] == self._gen:
            return  # the world has not changed since the last look
        self._derived["sampled"] = (self._gen, None)
        serving, by_state, domains_out = self._picture()
        sample = {"t": self._t, "serving": serving, "by_state": dict(by_state), "domains_out": list(domains_out)}
        last = self._samples[-1] if self._samples else None
        if last is not None and all(last[k] == sample[k] for k in ("serving", "by_state", "domains_out")):
            return
        self._samples.append(sample)
        self._rows.append(("sample", self._t, sample))

    def _phase(self, op: str | None, domain: str, phase: str, *, start: float | None = None,
               end: float | None = None) -> None:
        if op is None:
            return
        phases = self._stops.get((op, domain))
        if phases is None:  # (asked for each of a domain's thousands of hosts: the empty record made once)
            phases = self._stops[(op, domain)] = {p: [None, None] for p in _PHASES}
        span = phases[phase]
        if start is not None and (span[0] is None or start < span[0]):
            span[0] = start
        if end is not None and (span[1] is None or end > span[1]):
            span[1] = end

    def _stop_summary(self, op: str, domain: str, phases: dict[str, list[float | None]]) -> dict[str, Any]:
        out: dict[str, Any] = {"op": op, "domain": domain}
        work = 0.0
        for p in _PHASES:
            start, end = phases[p]
            took = end - start if start is not None and end is not None else 0.0
            out[f"{p}_s"] = took
            work += took
        starts = [s for s, _ in phases.values() if s is not None]
        ends = [e for _, e in phases.values() if e is not None]
        out["work_s"] = work
        out["started_at"] = min(starts, default=None)
        out["ended_at"] = max(ends, default=None)
        out["complete"] = phases["return"][1] is not None
        return out

    # ---- helpers -------------------------------------------------------------------------------
    @property
    def _dirty(self) -> bool:
        """Whether the world changed since it was last persisted; setting it also ends the life of
        everything `_cached` (a new generation of the world)."""
        return self._changed

    @_dirty.setter
    def _dirty(self, value: bool) -> None:
        if value:
            self._gen += 1
        self._changed = value

    def _cached(self, key: str, build: Callable[[], Any]) -> Any:
        """`build()`, computed once per generation of the world."""
        hit = self._derived.get(key)
        if hit is not None and hit[0] == self._gen:
            return hit[1]
        value = build()
        self._derived[key] = (self._gen, value)
        return value

    def _picture(self) -> tuple[int, dict[str, int], list[str]]:
        """(serving hosts, hosts per state, domains out): counted as hosts change (`_count`). A host held by a
        repair operation (`repair/...`) is one broken host, not a domain out."""
        self._flush()
        by_state = {st.value: self._states.get(st, 0) for st in HostState}
        return by_state[HostState.SERVING.value], by_state, sorted(d for d, n in self._out.items() if n > 0)

    def _sorted_hosts(self) -> list[_Host]:
        return [self._hosts[n] for n in self._names]

    def _log_since(self, seq: int) -> list[tuple[int, str]]:
        """The (seq, name) entries of `_host_log` after `seq`: each host changed since, at least once."""
        return self._host_log[bisect.bisect_right(self._host_log, (seq, "\U0010ffff")):]

    def _list(self, names: list[str]) -> dict[str, int]:
        """Refuses unless every one of `names` is a host (`_known`), once for each of the last lists asked for;
        returns each name's place in the list (a name twice: its last)."""
        key = tuple(names)
        place = self._lists.get(key)
        if place is None:
            self._known(names)
            place = self._lists[key] = {n: i for i, n in enumerate(names)}
            while len(self._lists) > LISTS_KEPT:
                self._lists.popitem(last=False)
        else:
            self._lists.move_to_end(key)
        return place

    def _known(self, names: list[str]) -> None:
        """Refuses unless every one of `names` is a host: a domain's thousands checked in one set operation."""
        if not self._hosts.keys() >= set(names):
            for n in names:
                self._host(n)

    def _host(self, name: str) -> _Host:
        h = self._hosts.get(name) if isinstance(name, str) else None
        if h is None:
            raise FleetNotFound(f"unknown host {name!r}")
        return h

    def _job(self, job_id: str) -> _Job:
        job = self._jobs.get(job_id) if isinstance(job_id, str) else None
        if job is None:
            raise FleetNotFound(f"unknown job {job_id!r}")
        return job

    def _refuse(self, h: _Host, op: str, message: str) -> FleetError:
        """A call that would have touched a host in the wrong state or held by another operation:
        refused, and kept in the audit (`refusals`), the oracle for 'never two operations on a host'."""
        self._refusals.append({"t": self._t, "host": h.name, "op": op, "holder": h.operation,
                               "state": str(h.state), "message": message})
        return FleetError(message)

    @staticmethod
    def _check_op(op: str) -> None:
        if not isinstance(op, str) or not op or len(op) > 250 or not op.isprintable():
            raise FleetError(f"operation id {op!r} must be 1 to 250 printable characters")

    @staticmethod
    def _token(value: str, what: str) -> None:
        try:
            check_token(value)
        except ValueError as exc:
            raise FleetError(f"bad {what}: {exc}") from None

    @staticmethod
    def _describe(h: _Host) -> str:
        holder = f"held by operation {h.operation!r}" if h.operation else "held by no operation"
        why = f" ({h.reason})" if h.reason and h.state in (HostState.FAILED, HostState.REPAIR) else ""
        return f"host {h.name} is {h.state.value}{why}, {holder}"


__all__ = ["SimEngine"]
