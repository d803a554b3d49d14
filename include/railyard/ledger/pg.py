"""The ledger's hot paths on PostgreSQL, as server-side functions: one round trip per lease operation.

`Ledger.acquire_domain` and `Ledger.release` (railyard.ledger) decide in Python, which costs several
round trips while the ledger lock is held, and the client's CPU. On PostgreSQL with psycopg2 they call
the functions below instead, which make the same decisions with the same messages and write the
same rows (tests/adapters/test_ledger_pg_functions.py runs random scenarios through both and compares).

Why an acquire commits asynchronously and then flushes: every acquire takes the ledger lock (a row
lock), and PostgreSQL releases a transaction's locks only once its commit record is on disk. With a
synchronous commit each acquire would wait for the previous one's disk flush, one flush after the
other (~300 a second on a disk that flushes in 3 ms), however many writers there are. So the acquire
commits with `synchronous_commit = off` (the lock goes as soon as the lease is visible), and the
same call then commits a second transaction synchronously, which flushes the log up to itself, the
acquire's commit included; concurrent acquirers share those flushes. The call returns only after
that, so a decision is on disk before anyone is told of it, as before. Whoever saw the lease before
it was on disk (the next acquirer) wrote its own commit later in the same log: a crash that loses
the lease loses everything decided after seeing it too. Releases commit synchronously, as before.

What the functions do not handle they refuse with SQLSTATE `RY001`, having changed nothing, and the
caller runs the Python path: a refusal that must be judged again on every lease (a pool, or many
unavailable hosts; see `Ledger.acquire_domain`), and host names that are not printable ASCII or hold
a quote or a backslash (whose JSON in the audit is not simply the name in quotes).

The functions' names carry a hash of their text, so that two versions of Railyard on one database
each call their own; they are created once per database, under an advisory lock.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError

log = logging.getLogger(__name__)

FALLBACK = "RY001"  # SQLSTATE: not decided here, nothing changed; run the Python path
_LOCK_KEY = 0x7261696C79617264  # "railyard": serialises the creation of the functions

_PARAMS = """p_op text, p_train text, p_domain text, p_kind text, p_actor text, p_prio integer,
  p_now double precision, p_cutoff double precision, p_want text[], p_skip text[], p_u_pool text[],
  p_n_u_pool bigint, p_u_known boolean, p_exact boolean, p_takeover text[], p_total bigint, p_maint bigint,
  p_fail bigint, p_max_down bigint, p_probe boolean"""
_ARGS = """p_op, p_train, p_domain, p_kind, p_actor, p_prio, p_now, p_cutoff, p_want, p_skip, p_u_pool,
  p_n_u_pool, p_u_known, p_exact, p_takeover, p_total, p_maint, p_fail, p_max_down, p_probe"""
# Host names whose JSON is the name in quotes (printable ASCII, no '"' nor '\'), as a PostgreSQL regex.
_PLAIN = r"""'^[ !#-[\]-~]*$'"""

# What acquire_domain decides on (ledger._View): the leases of the hosts asked for, domains out and
# leases per kind (from the partial indexes), the waiter ahead (first by `since`: from its index, no
# sort), whether the operation waits. One statement, so one snapshot, as in Python. Written out where it
# is used, so that PL/pgSQL keeps its plan (a SQL function would be planned again at every call).
# Whether the operation is recorded comes from its row lock, taken before (that row cannot appear meanwhile:
# operations are made under the ledger lock), and what a grant leases is derived from the hosts read here.
_VIEW = """
  -- and what Python derives from it, derived here: hosts already ours (n_mine), hosts held by others not
  -- for repair (n_blocking); domains out without a DISTINCT aggregate (its sort), from the index's order
  SELECT w.hosts, w.ops, w.kinds, w.n_mine, w.n_blocking, m.doms, m.n_maint, r.n_repair,
    a.op_id AS ahead_op, a.since AS ahead_since,
    EXISTS (SELECT 1 FROM waiters WHERE op_id = p_op) AS waiting,
    {broken} AS n_broken_known
  INTO v
  FROM (SELECT coalesce(array_agg(host), '{}') AS hosts, array_agg(op_id) AS ops, array_agg(kind) AS kinds,
               count(*) FILTER (WHERE op_id = p_op) AS n_mine,
               count(*) FILTER (WHERE op_id <> p_op AND kind <> 'repair') AS n_blocking
        FROM leases WHERE host = ANY(p_want)) w,
       (SELECT coalesce(array_agg(domain), '{}') AS doms, coalesce(sum(n), 0) AS n_maint
        FROM (SELECT domain, count(*)::integer AS n FROM leases WHERE kind <> 'repair' GROUP BY domain) g) m,
       (SELECT count(*) AS n_repair FROM leases WHERE kind = 'repair') r
  LEFT JOIN LATERAL (SELECT op_id, since FROM waiters
                     WHERE priority > p_prio AND seen_at > p_cutoff AND op_id <> p_op
                     ORDER BY since LIMIT 1) a ON true"""

# The unavailable hosts of the pool that no lease accounts for (as broken): read only when the caller
# named some, in the view's statement all the same (one snapshot). Otherwise the view is planned without
# it: every node of a plan costs at every execution, whether it runs or not.
_BROKEN = "(SELECT count(*) FROM unnest(p_u_pool) u WHERE NOT EXISTS (SELECT 1 FROM leases l WHERE l.host = u))"
_VIEWS = "IF cardinality(p_u_pool) = 0 THEN {none}; ELSE {some}; END IF"

# {json}, {decide}, {acquire}, {release}: the versioned names (see `_names`); {view}: _VIEW, in _VIEWS.
# Sorted as Python sorts: code points, COLLATE "C".
_SQL = r"""
-- json.dumps of a list of host names that match {plain}. Inlined where it is used.
CREATE OR REPLACE FUNCTION {json}(a text[]) RETURNS text LANGUAGE sql STABLE AS $f$
  SELECT CASE WHEN cardinality(a) = 0 THEN '[]' ELSE '["' || array_to_string(a, '", "') || '"]' END
$f$;

-- Ledger.acquire_domain, step for step (ledger.py), in the caller's transaction. Its plans, and the
-- release's, are made under the settings the lease connection keeps for its session (`_SESSION`).
CREATE OR REPLACE FUNCTION {decide}({params}, OUT outcome text, OUT reason text) LANGUAGE plpgsql
AS $f$
DECLARE
  v record;
  n_want bigint := cardinality(p_want);
  handed_hosts text[];
  handed_ops text[];
  n_handed bigint;
  from_ops text;
  n_out bigint;
  n_broken bigint;
  floor_hosts bigint;
  serving bigint;
  lease text[];  -- what a grant leases (NULL: nothing, and no audit row)
  op_exists boolean;
  free text[];  -- the hosts asked for that a grant would lease: in the order of p_want (sorted)
BEGIN
  IF array_to_string(p_want, '') !~ {plain} THEN
    RAISE EXCEPTION 'railyard: a host name the audit would spell differently' USING ERRCODE = 'RY001';
  END IF;
  PERFORM 1 FROM ledger_lock WHERE id = 1 FOR UPDATE;  -- the ledger lock (ledger._lock)
  IF cardinality(p_takeover) = 0 THEN  -- one row: by its key (a plan for any number of rows may scan them all)
    PERFORM 1 FROM operations WHERE id = p_op FOR UPDATE;
    op_exists := FOUND;
  ELSE
    PERFORM 1 FROM operations WHERE id = ANY(array_append(p_takeover, p_op)) ORDER BY id FOR UPDATE;
    op_exists := EXISTS (SELECT 1 FROM operations WHERE id = p_op);
  END IF;
  {view};
  -- the steps of railyard.ledger.leasing.decide, in its order and with its messages
  IF v.n_mine = n_want THEN  -- 1. this operation's already
    outcome := 'granted';
    reason := format('%s already holds %s', p_op, p_domain);
    RETURN;
  END IF;
  IF v.ahead_op IS NOT NULL THEN  -- 2. a higher priority waits first
    outcome := 'wait';
    reason := format('yielding to %s, waiting since %s', v.ahead_op, round(v.ahead_since)::bigint);
  ELSE
    IF cardinality(p_takeover) > 0 THEN  -- 3. hosts taken over are handed over, then step 1 again
      SELECT array_agg(h ORDER BY h COLLATE "C"), array_agg(o ORDER BY h COLLATE "C") INTO handed_hosts, handed_ops
      FROM unnest(v.hosts, v.ops) AS x(h, o) WHERE o = ANY(p_takeover);
    END IF;
    IF handed_hosts IS NOT NULL AND p_probe THEN
      outcome := 'free';
    ELSIF handed_hosts IS NOT NULL THEN
      UPDATE leases SET op_id = p_op, kind = p_kind, since = p_now WHERE host = ANY(handed_hosts);
      FOR i IN 1 .. cardinality(handed_hosts) LOOP
        INSERT INTO audit (at, actor, op_id, action, hosts, reason) VALUES
          (p_now, p_actor, p_op, 'handover', {json}(ARRAY[handed_hosts[i]]), 'taken over from ' || handed_ops[i]),
          (p_now, p_actor, handed_ops[i], 'handed_over', {json}(ARRAY[handed_hosts[i]]), 'taken over by ' || p_op);
      END LOOP;
      n_handed := cardinality(handed_hosts);
      from_ops := array_to_string(ARRAY(SELECT DISTINCT o COLLATE "C" FROM unnest(handed_ops) o ORDER BY 1), ', ');
      {view};
      IF v.n_mine = n_want THEN
        outcome := 'granted';
        reason := format('%s took over %s host(s) of %s from %s', p_op, n_handed, p_domain, from_ops);
      END IF;
    END IF;
    n_out := cardinality(v.doms) + CASE WHEN p_domain = ANY(v.doms) THEN 0 ELSE 1 END;
    IF cardinality(v.hosts) = 0 AND cardinality(p_skip) = 0 THEN
      free := p_want;  -- none held, none skipped: the usual case, without a query
    ELSE
      free := ARRAY(SELECT u FROM unnest(p_want) WITH ORDINALITY AS x(u, o) WHERE u <> ALL(v.hosts) AND u <> ALL(p_skip)
                    ORDER BY o);
    END IF;
    IF outcome IS NOT NULL THEN
      NULL;  -- a takeover: probed, or nothing left to lease
    ELSIF v.n_blocking > 0 THEN  -- 4. held by another operation (but a repair)
      outcome := 'wait';
      reason := format('%s host(s) of %s held by %s', v.n_blocking, p_domain, array_to_string(ARRAY(
        SELECT DISTINCT o COLLATE "C" FROM unnest(v.ops, v.kinds) AS x(o, k) WHERE o <> p_op AND k <> 'repair'
        ORDER BY 1), ', '));
    ELSIF n_out > p_max_down THEN  -- 5. domains out, this one included
      outcome := 'wait';
      reason := format('max_domains_down=%s reached: %s out', p_max_down,
                       array_to_string(ARRAY(SELECT d FROM unnest(v.doms) d ORDER BY d COLLATE "C"), ', '));
    ELSE
      -- 6. the buffers (railyard.ledger.leasing._judge)
      n_broken := CASE WHEN p_u_known THEN v.n_broken_known ELSE p_n_u_pool END + v.n_repair;
      floor_hosts := p_total - p_maint - p_fail;
      serving := p_total - v.n_maint - n_broken - cardinality(free);
      IF n_broken > p_fail THEN
        outcome := 'stop';
        reason := format('failure buffer exhausted: %s hosts broken, in repair or out with no lease > budget %s',
                         n_broken, p_fail);
      ELSIF v.n_maint + cardinality(free) > p_maint THEN
        outcome := 'wait';
        reason := format('maintenance buffer: %s hosts out + %s of %s > budget %s', v.n_maint, cardinality(free),
                         p_domain, p_maint);
      ELSIF serving < floor_hosts THEN
        outcome := 'wait';
        reason := format('serving would drop to %s < floor %s', serving, floor_hosts);
      END IF;
      IF outcome IS NOT NULL AND NOT p_exact THEN  -- judged on bounds: the Python path judges it again
        RAISE EXCEPTION 'railyard: a refusal to judge on every lease' USING ERRCODE = 'RY001';
      END IF;
      IF outcome = 'stop' THEN
        RETURN;
      ELSIF outcome IS NULL AND p_probe THEN  -- 7. granted (a probe leases nothing)
        outcome := 'free';
      ELSIF outcome IS NULL THEN
        outcome := 'granted';
        reason := format('%s took %s (%s hosts)', p_op, p_domain, cardinality(free));
        lease := free;
      END IF;
    END IF;
  END IF;
  IF outcome = 'granted' THEN
    -- railyard.ledger.leasing._write_grant: the operation (new, or active again), off the waiters, its new leases and
    -- the audit row (not for a takeover that left nothing to lease)
    IF v.waiting THEN
      DELETE FROM waiters WHERE op_id = p_op;
    END IF;
    IF NOT op_exists AND lease IS NOT NULL THEN  -- the usual grant, as one statement
      WITH o AS (INSERT INTO operations (id, kind, train, domain, state, created_at, updated_at, detail)
                 VALUES (p_op, p_kind, p_train, p_domain, 'active', p_now, p_now, '{}')),
           l AS (INSERT INTO leases (host, op_id, domain, since, kind)
                 SELECT h, p_op, p_domain, p_now, p_kind FROM unnest(lease) h)
      INSERT INTO audit (at, actor, op_id, action, hosts, reason)
      VALUES (p_now, p_actor, p_op, 'lease', {json}(lease), format('took %s for %s', p_domain, p_train));
      RETURN;
    END IF;
    IF op_exists THEN
      UPDATE operations SET state = 'active', updated_at = p_now WHERE id = p_op;
    ELSE
      INSERT INTO operations (id, kind, train, domain, state, created_at, updated_at, detail)
      VALUES (p_op, p_kind, p_train, p_domain, 'active', p_now, p_now, '{}');
    END IF;
    IF lease IS NOT NULL THEN
      INSERT INTO leases (host, op_id, domain, since, kind)
      SELECT h, p_op, p_domain, p_now, p_kind FROM unnest(lease) h;
      INSERT INTO audit (at, actor, op_id, action, hosts, reason)
      VALUES (p_now, p_actor, p_op, 'lease', {json}(lease), format('took %s for %s', p_domain, p_train));
    END IF;
    RETURN;
  END IF;
  -- Leases._wait: refused for now; the operation takes (or keeps) its place among the waiters, as does
  -- a probe that would be granted (Leases._free)
  IF outcome = 'free' THEN
    reason := format('%s can be taken now', p_domain);
  END IF;
  IF v.waiting THEN
    UPDATE waiters SET seen_at = p_now WHERE op_id = p_op;
  ELSE
    INSERT INTO waiters (op_id, priority, since, seen_at) VALUES (p_op, p_prio, p_now, p_now);
    IF outcome <> 'free' THEN  -- when the wait began, and why: the run report's wait for capacity
      INSERT INTO audit (at, actor, op_id, action, hosts, reason)
      VALUES (p_now, 'railyard', p_op, 'wait', '[]', reason);
    END IF;
  END IF;
END $f$;

-- An acquire as its own transactions (see the module's docstring): CALLed outside a transaction block.
CREATE OR REPLACE PROCEDURE {acquire}({params}, INOUT r_outcome text DEFAULT NULL, INOUT r_reason text DEFAULT NULL)
LANGUAGE plpgsql AS $f$
DECLARE
  d record;
BEGIN
  d := {decide}({args});  -- a simple expression: no executor for it
  r_outcome := d.outcome;
  r_reason := d.reason;
  PERFORM set_config('synchronous_commit', 'off', true);
  COMMIT;  -- visible, and the ledger lock released, without waiting for the disk
  -- A transaction that writes to the log (an xid alone would not) commits synchronously: it flushes the
  -- log up to itself. A logical message: no row for the writers to contend for.
  PERFORM pg_logical_emit_message(true, 'railyard', '');
END $f$;

-- Ledger.release on PostgreSQL: the lock on the operation's row, not the ledger lock. Returns the
-- hosts released.
CREATE OR REPLACE FUNCTION {release}(p_op text, p_only text[], p_actor text, p_reason text, p_now double precision)
RETURNS text[] LANGUAGE plpgsql AS $f$
DECLARE
  held text[];
  dropped text[];
  done boolean;  -- it holds nothing any more
BEGIN
  IF p_only IS NULL THEN  -- all it holds: what the delete finds is what it held, and it is done
    -- the operation's row is locked by marking it done (or, when it is not active, by FOR UPDATE)
    UPDATE operations SET state = 'done', updated_at = p_now WHERE id = p_op AND state = 'active';
    IF NOT FOUND THEN
      PERFORM 1 FROM operations WHERE id = p_op FOR UPDATE;
    END IF;
    WITH d AS (DELETE FROM leases WHERE op_id = p_op RETURNING host)
    SELECT coalesce(array_agg(host ORDER BY host COLLATE "C"), '{}') INTO dropped FROM d;
  ELSE  -- only some hosts: done when they are all it held
    PERFORM 1 FROM operations WHERE id = p_op FOR UPDATE;
    held := ARRAY(SELECT host FROM leases WHERE op_id = p_op ORDER BY host COLLATE "C");
    dropped := ARRAY(SELECT h FROM unnest(held) h WHERE h = ANY(p_only) ORDER BY h COLLATE "C");
    done := cardinality(dropped) = cardinality(held);
    IF done AND cardinality(dropped) > 0 THEN
      DELETE FROM leases WHERE op_id = p_op;
    ELSIF cardinality(dropped) > 0 THEN
      DELETE FROM leases WHERE op_id = p_op AND host = ANY(dropped);
    END IF;
    IF done THEN
      UPDATE operations SET state = 'done', updated_at = p_now WHERE id = p_op AND state = 'active';
    END IF;
  END IF;
  IF array_to_string(dropped, '') !~ {plain} THEN  -- undoes the delete with the rest
    RAISE EXCEPTION 'railyard: a host name the audit would spell differently' USING ERRCODE = 'RY001';
  END IF;
  IF cardinality(dropped) > 0 THEN
    INSERT INTO audit (at, actor, op_id, action, hosts, reason)
    VALUES (p_now, p_actor, p_op, 'release', {json}(dropped), p_reason);
  END IF;
  RETURN dropped;
END $f$;
"""


@dataclass(frozen=True)
class Functions:
    """How to call the installed functions: psycopg2 statement texts, and what to PREPARE first."""

    acquire: str  # CALL: not preparable; its literals typed by the procedure's parameters (its name is its own)
    release: str  # EXECUTE of `prepare`
    prepare: tuple[str, str]  # (name, PREPARE statement) for `release`


def _names() -> dict[str, str]:
    tag = hashlib.sha1((_PARAMS + _VIEW + _BROKEN + _VIEWS + _SQL).encode()).hexdigest()[:10]
    return {k: f"railyard_{k}_{tag}" for k in ("json", "decide", "acquire", "release")}


def _render() -> tuple[dict[str, str], str]:
    names = _names()
    view = _VIEW.strip()
    views = _VIEWS.format(none=view.replace("{broken}", "0::bigint"), some=view.replace("{broken}", _BROKEN))
    sql = _SQL
    for k, v in (names | {"params": _PARAMS, "args": _ARGS, "view": views, "plain": _PLAIN}).items():
        sql = sql.replace("{" + k + "}", v)
    return names, sql


def functions() -> Functions:
    n = _names()
    stmt = f"{n['release']}_stmt"
    return Functions(
        acquire=f"CALL {n['acquire']}({', '.join(['%s'] * len(_PARAMS.split(',')))}, NULL, NULL)",
        release=f"EXECUTE {stmt}(%s, %s::text[], %s, %s, %s::float8)",
        prepare=(stmt, f"PREPARE {stmt}(text, text[], text, text, float8) "
                       f"AS SELECT {n['release']}($1, $2, $3, $4, $5)"),
    )


def install(engine: Engine) -> Functions | None:
    """Create the functions unless they exist (several processes may start at once); None when this
    database will not have them (the Python path then does everything)."""
    names, sql = _render()
    exists = "SELECT count(*) FROM pg_proc WHERE proname = %s AND pg_function_is_visible(oid)"
    raw = engine.raw_connection()
    try:
        cur: Any = raw.cursor()
        try:
            cur.execute(exists, (names["release"],))
            if cur.fetchone()[0] == 0:
                cur.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
                cur.execute(exists, (names["release"],))  # another process may have made them meanwhile
                if cur.fetchone()[0] == 0:
                    cur.execute(sql)  # all of them in this transaction
            raw.commit()
        finally:
            cur.close()
    except Exception as exc:  # e.g. no right to create functions: slower, not wrong
        log.warning("ledger: PostgreSQL functions not installed (%s); the Python path is used", exc)
        raw.rollback()
        return None
    finally:
        raw.close()
    return functions()


def text_array(items: Iterable[str]) -> str:
    """A PostgreSQL array literal of `items`: one string for the driver to quote, and one constant for
    the server to parse, rather than an ARRAY[...] of quoted strings."""
    items = list(items)
    if not items:
        return "{}"
    text = "".join(items)
    if '"' not in text and "\\" not in text:  # the usual names: nothing to escape
        return '{"' + '","'.join(items) + '"}'
    return "{" + ",".join('"' + x.replace("\\", "\\\\").replace('"', '\\"') + '"' for x in items) + "}"


class Channel:
    """The lease calls' own connection: one psycopg2 connection per process and thread, in autocommit
    mode for good, with its session's settings (`_SESSION`) and the release statement prepared on it once.

    A lease operation is one round trip; checking a connection out of SQLAlchemy's pool and back for it
    (events, the reset on return, autocommit switched on and off) cost the client about as much CPU as
    psycopg2's own work for the call. The connection comes from the engine (its URL, its connect
    arguments), detached from the pool. One idle for over a second is pinged first, as the pool does
    (`ledger._make_engine`), so a connection the server dropped meanwhile is replaced, not failed on.
    A process forked after a call gets a connection of its own: it never touches its parent's."""

    def __init__(self, engine: Engine, fns: Functions):
        self.engine = engine
        self.fns = fns
        self._local = threading.local()

    def connection(self) -> Any:  # a psycopg2 connection, in autocommit mode
        loc = self._local
        conn = getattr(loc, "conn", None)
        if conn is not None and loc.pid != os.getpid():
            _FORKED.append(loc.raw)  # the parent's: never closed here (that would end the parent's session)
            loc.conn = loc.raw = conn = None
        if conn is not None and not conn.closed and time.monotonic() - loc.used > PING_IDLE_S:
            try:
                with conn.cursor() as cur:
                    cur.execute("SELECT 1")
            except Exception:
                self.close()
                conn = None
        if conn is None or conn.closed:
            raw = self.engine.raw_connection()
            conn = raw.driver_connection
            assert conn is not None
            raw.detach()  # ours now (kept with it: a detached one is closed when dropped); the pool opens another
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute(_SESSION)
                cur.execute(self.fns.prepare[1])
            loc.conn, loc.raw, loc.pid, loc.used = conn, raw, os.getpid(), time.monotonic()
        return conn

    def cursor(self) -> Any:
        """The connection's cursor, kept with it (one statement at a time per thread)."""
        conn = self.connection()
        loc = self._local
        if getattr(loc, "cur_of", None) is not conn:
            loc.cur, loc.cur_of = conn.cursor(), conn
        return loc.cur

    def done(self) -> None:
        self._local.used = time.monotonic()

    def connection_broken(self) -> bool:
        """After an error: True (and the connection dropped) when it is no longer usable."""
        conn = getattr(self._local, "conn", None)
        if conn is None or conn.closed:
            self.close()
            return True
        return False

    def close(self) -> None:
        """Close this thread's connection (the next call opens another)."""
        raw = getattr(self._local, "raw", None)
        self._local.conn = self._local.raw = None
        if raw is not None and getattr(self._local, "pid", None) == os.getpid():
            try:
                raw.close()
            except Exception:
                pass


# The lease connection's session, under which the functions' plans are made (once per connection, whatever
# the arguments: planning costs more than running them). Plain index scans only: a plan for any array of
# hosts, or for leases of a table not yet analysed, would otherwise read every lease (a bitmap scan would
# not mark the index entries of released leases dead, and would step over more of them at every call);
# jit off, as those plans look costly to the planner. For the session rather than in each function's SET
# clauses, which cost the call a save and a restore of each setting, every time. Elsewhere (a psql prompt)
# the functions decide the same, on plans of their own.
_SESSION = ("SET plan_cache_mode = force_generic_plan; SET enable_seqscan = off; SET enable_bitmapscan = off; "
            "SET jit = off")
_FORKED: list[Any] = []  # connections inherited across a fork: kept, so that no finaliser closes them
PING_IDLE_S = 1.0


def acquire(chan: Channel, *, op_id: str, train: str, domain: str, kind: str, actor: str,
            priority: int, now: float, cutoff: float, want: Sequence[str], skip: Sequence[str],
            u_pool: Sequence[str], n_u_pool: int, u_known: bool, exact: bool, takeover: Sequence[str],
            budget: Any, probe: bool) -> tuple[str, str] | None:  # budget: ledger.Budget
    """`Ledger.acquire_domain` on the server: (outcome, reason), or None for the Python path."""
    row = call(chan, chan.fns.acquire, (
        op_id, train, domain, kind, actor, priority, now, cutoff, text_array(want), text_array(skip),
        text_array(u_pool), n_u_pool, u_known, exact, text_array(takeover), budget.total_hosts,
        budget.maintenance_hosts, budget.failure_hosts, budget.max_domains_down, probe))
    return None if row is None else (row[0], row[1])


def release(chan: Channel, *, op_id: str, only: Iterable[str] | None, actor: str, reason: str,
            now: float) -> list[str] | None:
    """`Ledger.release` on the server: the hosts released, or None for the Python path."""
    row = call(chan, chan.fns.release, (op_id, None if only is None else text_array(sorted(only)), actor, reason, now))
    return None if row is None else list(row[0])


def call(chan: Channel, sql: str, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """Run `sql` (one of `chan.fns`) on the channel's connection, a CALL that commits or a statement that
    is its own transaction, and return its row; None when the server answered RY001 (run the Python
    path). Other errors come as SQLAlchemy's, as from the Python path; a connection that broke is closed
    and the next call opens another."""
    import psycopg2

    try:
        cur = chan.cursor()
        cur.execute(sql, args)
        row: tuple[Any, ...] = cur.fetchone()
        chan.done()
        return row
    except psycopg2.Error as exc:
        if exc.pgcode == FALLBACK:
            chan.done()
            return None
        broken = chan.connection_broken()
        raise DBAPIError.instance(sql, args, exc, psycopg2.Error, connection_invalidated=broken) from exc
