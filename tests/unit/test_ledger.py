"""The operations ledger, on both databases it runs on: SQLite (the default) and a real PostgreSQL
(one private server per module, tests/support/postgres.py, a fresh database per test).

Concurrency on PostgreSQL with many processes is in tests/adapters/test_ledger_pg.py.
"""

from __future__ import annotations

import itertools
import random
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg2
import pytest
from sqlalchemy import event, inspect, text

from railyard.ledger import WAITER_TTL_S, Budget, Ledger, audit, leases, metadata, operations
from tests.support.postgres import PostgresServer, running_postgres

BUDGET = Budget(total_hosts=32, maintenance_hosts=8, failure_hosts=2, max_domains_down=1)
DOMAINS = {f"d{i}": [f"h{i}{j}" for j in range(8)] for i in range(4)}
_db_names = itertools.count()


@pytest.fixture(scope="module")
def pg_server() -> Iterator[PostgresServer]:
    yield from running_postgres()


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/l.db"
    pg: PostgresServer = request.getfixturevalue("pg_server")
    return pg.create_database(f"t{next(_db_names)}_{request.node.name.split('[')[0][5:40]}")


@pytest.fixture
def ledger(url: str) -> Iterator[Callable[[], Ledger]]:
    """Ledger(url), as often as a test wants one; every engine is disposed afterwards."""
    made: list[Ledger] = []

    def make() -> Ledger:
        led = Ledger(url)
        made.append(led)
        return led

    yield make
    for led in made:
        led.dispose()


def take(ledger: Ledger, op: str, dom: str, budget: Budget = BUDGET, unavailable=(), **kw):
    return ledger.acquire_domain(op, train="t", domain=dom, hosts=DOMAINS[dom], budget=budget,
                                 unavailable=unavailable, **kw)


def test_one_domain_at_a_time_and_release(ledger):
    led = ledger()
    assert take(led, "op1", "d0").granted
    d = take(led, "op2", "d1")
    assert d.outcome == "wait" and "max_domains_down=1" in d.reason and "d0" in d.reason
    assert take(led, "op1", "d0").granted  # idempotent re-take
    assert led.release("op1") == sorted(DOMAINS["d0"])
    assert led.operation("op1")["state"] == "done"
    assert take(led, "op2", "d1").granted
    actions = [r["action"] for r in led.audit_rows()]
    assert actions == ["lease", "wait", "release", "lease"]  # op2's wait, once, with its reason
    assert [r["reason"] for r in led.audit_rows(action="wait")] == [d.reason]


def test_one_operation_per_host(ledger):
    led = ledger()
    two = Budget(total_hosts=32, maintenance_hosts=16, failure_hosts=2, max_domains_down=2)
    assert take(led, "train", "d0", two).granted
    d = take(led, "emergency", "d0", two)
    assert d.outcome == "wait" and "held by train" in d.reason
    assert led.holdings("emergency") == {}


def test_broken_hosts_count_against_the_budget(ledger):
    led = ledger()
    d = take(led, "op1", "d0", unavailable=["h10", "h11", "h12"])
    assert d.outcome == "stop" and (
        "failure buffer exhausted: 3 hosts broken, in repair or out with no lease > budget 2" in d.reason)
    # two broken hosts elsewhere fit the failure buffer; the domain's own broken host is not leased
    d = take(led, "op1", "d0", unavailable=["h10", "h03"])
    assert d.granted and "h03" not in led.holdings("op1") and len(led.holdings("op1")) == 7


def test_floor_refuses_when_serving_would_drop_too_low(ledger):
    led = ledger()
    tight = Budget(total_hosts=32, maintenance_hosts=8, failure_hosts=0, max_domains_down=1)
    d = take(led, "op1", "d0", tight, unavailable=["h10"])
    assert d.outcome == "stop"


def test_concurrent_takers_never_hold_two_domains(ledger, url):
    ledger()
    granted: list[str] = []
    lock = threading.Lock()

    def worker(i: int) -> None:
        led = ledger()
        d = take(led, f"op{i}", f"d{i}")
        if d.granted:
            with lock:
                granted.append(f"d{i}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(granted) == 1
    assert set(ledger().domains_out()) == set(granted)


def test_detail_once_keeps_the_first_value(ledger):
    led = ledger()
    take(led, "op1", "d0")
    assert led.set_detail_once("op1", "checkpoint_requested_at", 10.0) == 10.0
    assert led.set_detail_once("op1", "checkpoint_requested_at", 99.0) == 10.0
    assert led.detail("op1") == {"checkpoint_requested_at": 10.0}
    # entries of a mapping: each added once, none changed after
    assert led.add_detail_entries("op1", "at_risk", {"j1": 1.5}) == {"j1": 1.5}
    assert led.add_detail_entries("op1", "at_risk", {"j1": 9.0, "j2": 2.0}) == {"j1": 1.5, "j2": 2.0}
    assert led.detail("op1")["at_risk"] == {"j1": 1.5, "j2": 2.0}
    with pytest.raises(KeyError, match="unknown operation"):
        led.add_detail_entries("nope", "at_risk", {"j1": 1.0})


# ---- leases, releases, waiters, handovers, repairs ----------------------------------------------------
def test_partial_release_keeps_the_operation_active(ledger):
    led = ledger()
    assert take(led, "op1", "d0").granted
    assert led.release("op1", ["h00", "h01", "nobody"]) == ["h00", "h01"]
    assert led.operation("op1")["state"] == "active" and len(led.holdings("op1")) == 6
    assert led.release("op1", ["h00"]) == []  # already released: nothing changes
    assert led.release("op1") == [f"h0{j}" for j in range(2, 8)]
    assert led.operation("op1")["state"] == "done" and led.holdings() == {}
    assert [(r["action"], r["hosts"]) for r in led.audit_rows("op1")] == [
        ("lease", DOMAINS["d0"]), ("release", ["h00", "h01"]), ("release", [f"h0{j}" for j in range(2, 8)])]


def test_a_waiting_emergency_goes_first_and_waiters_are_listed(ledger):
    led = ledger()
    two = Budget(total_hosts=32, maintenance_hosts=16, failure_hosts=2, max_domains_down=1)
    assert take(led, "train-a", "d0", two).granted
    d = take(led, "emerg", "d1", two, kind="emergency")
    assert d.outcome == "wait" and "max_domains_down=1" in d.reason
    d = take(led, "train-b", "d2", two)
    assert d.outcome == "wait" and d.reason.startswith("yielding to emerg, waiting since ")
    assert [(w["op_id"], w["priority"]) for w in led.waiting()] == [("emerg", 100), ("train-b", 10)]
    since = led.waiting()[0]["since"]
    assert take(led, "emerg", "d1", two, kind="emergency").outcome == "wait"  # refreshed, not re-queued
    assert led.waiting()[0]["since"] == since
    led.release("train-a")
    assert take(led, "emerg", "d1", two, kind="emergency").granted
    assert [w["op_id"] for w in led.waiting()] == ["train-b"]  # the grant took emerg off the queue
    assert led.operation("emerg")["kind"] == "emergency"
    assert {r["op_id"] for r in led.audit_rows() if r["action"] == "lease"} == {"train-a", "emerg"}


def test_a_waiter_that_stopped_asking_is_ignored(ledger):
    led = ledger()
    assert take(led, "train-a", "d0").granted
    assert take(led, "emerg", "d1", kind="emergency").outcome == "wait"
    with led.engine.begin() as c:  # its sensor went away WAITER_TTL_S ago
        c.execute(text("UPDATE waiters SET seen_at = seen_at - :d"), {"d": WAITER_TTL_S + 1})
    assert led.waiting() == []
    led.release("train-a")
    assert take(led, "train-b", "d2").granted


def test_an_emergency_takes_over_a_trains_hosts_in_one_step(ledger):
    led = ledger()
    two = Budget(total_hosts=32, maintenance_hosts=16, failure_hosts=2, max_domains_down=1)
    assert take(led, "train", "d0", two).granted
    d = led.acquire_domain("emerg", train="t", domain="d0", hosts=["h00", "h01", "h02"], budget=two,
                           kind="emergency", take_over_from=["train"])
    assert d.granted and d.reason == "emerg took over 3 host(s) of d0 from train"
    assert led.holdings("emerg") == {h: "emerg" for h in ["h00", "h01", "h02"]}
    assert len(led.holdings("train")) == 5 and led.operation("train")["state"] == "active"
    rows = [(r["op_id"], r["action"], r["hosts"]) for r in led.audit_rows()][1:]
    assert rows == [x for h in ["h00", "h01", "h02"]
                    for x in (("emerg", "handover", [h]), ("train", "handed_over", [h]))]
    # the whole domain: the train's hosts are handed over, nothing is leased twice or waited for
    d = take(led, "emerg2", "d0", two, kind="emergency", take_over_from=["train", "emerg"])
    assert d.granted and set(led.holdings("emerg2")) == set(DOMAINS["d0"])
    with led.engine.connect() as c:
        kinds = {r.kind for r in c.execute(leases.select())}
    assert kinds == {"emergency"}


def test_takeover_of_part_of_a_domain_then_takes_the_rest(ledger):
    led = ledger()
    two = Budget(total_hosts=32, maintenance_hosts=16, failure_hosts=2, max_domains_down=2)
    assert led.acquire_domain("train", train="t", domain="d0", hosts=["h00", "h01"], budget=two).granted
    d = take(led, "emerg", "d0", two, kind="emergency", take_over_from=["train"])
    assert d.granted and d.reason == "emerg took d0 (6 hosts)"
    assert set(led.holdings("emerg")) == set(DOMAINS["d0"]) and led.holdings("train") == {}


def test_handover_passes_leases_without_releasing_them(ledger):
    led = ledger()
    assert take(led, "stop", "d0").granted
    moved = led.handover(["h00", "h01", "h99"], "stop", "repair-1", kind="repair", reason="failed check",
                         detail={"why": "x"}, domain="d0")
    assert moved == ["h00", "h01"]
    assert led.holdings("repair-1") == {"h00": "repair-1", "h01": "repair-1"}
    assert led.operation("stop")["state"] == "active" and led.operation("repair-1")["kind"] == "repair"
    assert led.detail("repair-1") == {"why": "x"}
    assert led.handover(["h00"], "stop", "repair-1", kind="repair", reason="again") == []  # idempotent
    moved = led.handover(DOMAINS["d0"], "stop", "next", kind="train_stop", reason="all")
    assert moved == [f"h0{j}" for j in range(2, 8)]
    assert led.operation("stop")["state"] == "done"
    assert [(r["op_id"], r["action"]) for r in led.audit_rows()] == [
        ("stop", "lease"), ("repair-1", "handover"), ("next", "handover")]
    assert led.handover(["h02"], "next", "next", kind="train_stop", reason="to itself") == ["h02"]
    assert led.operation("next")["state"] == "active"  # still holds everything
    # repairs are not domains out: another train may take a domain while hosts of d0 are repaired
    led.release("next")
    assert set(led.domains_out()) == {"d0"} and take(led, "op2", "d1").granted


def test_repairs_count_against_the_failure_buffer_not_the_domains(ledger):
    led = ledger()
    assert led.lease_repair("r1", "h10", domain="d1", reason="xid 79")
    assert led.lease_repair("r1", "h10", domain="d1", reason="xid 79")  # idempotent
    assert not led.lease_repair("r2", "h10", domain="d1", reason="other")  # one operation per host
    assert led.lease_repair("r2", "h11", domain="d1", reason="ecc")
    # hosts in repair inside the domain are skipped and counted once; they do not block the domain
    d = take(led, "op", "d1", unavailable=["h10"])
    assert d.granted and set(led.holdings("op")) == set(DOMAINS["d1"]) - {"h10", "h11"}
    led.release("op")
    assert led.lease_repair("r3", "h20", domain="d2", reason="psu")
    d = take(led, "op2", "d0")
    assert d.outcome == "stop" and (
        "failure buffer exhausted: 3 hosts broken, in repair or out with no lease > budget 2" in d.reason)
    assert led.operation("r1")["kind"] == "repair" and led.detail("r1") == {"reason": "xid 79"}


def test_the_pool_decides_what_counts(ledger):
    """With `pool_hosts`, only the pool's hosts count: leases and broken hosts of another SKU do not."""
    led = ledger()
    h100 = DOMAINS["d0"] + DOMAINS["d1"]
    b = Budget(total_hosts=16, maintenance_hosts=8, failure_hosts=1, max_domains_down=2)
    for i, h in enumerate(DOMAINS["d2"][:4]):  # repairs in the other pool
        assert led.lease_repair(f"r{i}", h, domain="d2", reason="x")
    assert take(led, "other", "d3", Budget(32, 16, 8, 2)).granted  # a domain of the other pool is out
    d = take(led, "op", "d0", b, unavailable=DOMAINS["d2"] + ["h10"], pool_hosts=h100)
    assert d.granted, d.reason
    led.release("op")
    d = take(led, "op", "d0", b, unavailable=["h10", "h11"], pool_hosts=h100)
    assert d.outcome == "stop" and (
        d.reason == "failure buffer exhausted: 2 hosts broken, in repair or out with no lease > budget 1")
    d = take(led, "op", "d0", b, unavailable=["h10", "h11"], pool_hosts=set(h100 + DOMAINS["d2"]))
    assert d.outcome == "stop" and (
        d.reason == "failure buffer exhausted: 6 hosts broken, in repair or out with no lease > budget 1")


def test_releases_state_and_results(ledger):
    led = ledger()
    assert led.release_state("driver-570") is None
    led.set_release_state("driver-570", phase="canary", halted=False, reason="start", actor="a", fleet_now=100.0,
                          action="release_promote", promoted=True)
    led.set_release_state("driver-570", phase="canary", halted=True, reason="3 failures", actor="railyard",
                          fleet_now=200.0, action="release_halt")
    s = led.release_state("driver-570")
    assert (s["phase"], s["halted"], s["promoted_at"], s["reason"]) == ("canary", 1, 100.0, "3 failures")
    led.record_release_result("driver-570", "h00", "op1", True, "", 10.0)
    led.record_release_result("driver-570", "h01", "op1", False, "xid", 5.0)
    led.record_release_result("driver-570", "h01", "op1", True, "retried", 11.0)  # one row per host and op
    assert [(r["host"], r["passed"], r["reason"]) for r in led.release_results("driver-570")] == [
        ("h00", 1, ""), ("h01", 1, "retried")]
    assert [r["action"] for r in led.audit_rows("release/driver-570")] == ["release_promote", "release_halt"]
    # a domain's verdicts in one write, each replacing that host's earlier one for the release and the op
    led.record_release_results("op2", [("driver-570", "h00", False, "xid 79"), ("fw-96", "h00", True, ""),
                                       ("driver-570", "h01", True, "")], 20.0)
    led.record_release_results("op2", [("driver-570", "h00", True, "retried")], 21.0)
    assert [(r["host"], r["op_id"], r["passed"], r["reason"]) for r in led.release_results("driver-570")] == [
        ("h00", "op1", 1, ""), ("h01", "op1", 1, "retried"), ("h01", "op2", 1, ""), ("h00", "op2", 1, "retried")]
    assert [(r["host"], r["passed"]) for r in led.release_results("fw-96")] == [("h00", 1)]


def test_a_runs_failures_are_read_by_its_operations_whatever_the_history(ledger, url):
    """Each health check asks for its run's failures: its operations are found by the prefix of their ids,
    then their audit rows by operation. Other runs are never counted, one whose id only extends the prefix
    ('r10' beside 'r1') or differs in case included; on SQLite, no statement reads `audit` or `operations`
    whole (what the planner does there is checked: each statement's plan)."""
    led = ledger()
    for run, dom in (("r10", "d0"), ("R1", "d1"), ("r1", "d2"), ("r2", "d3")):
        assert take(led, f"t/{run}/{dom}", dom).granted
        led.note(f"t/{run}/{dom}", "offboard", [DOMAINS[dom][0]], f"bad gpu in {run}")
        led.release(f"t/{run}/{dom}")
    assert led.run_failures("t/r1/") == (8, 1, ["h20: bad gpu in r1"])
    assert led.run_failures("t/r3/") == (0, 0, [])
    if not url.startswith("sqlite"):
        return
    seen: list[tuple[str, object]] = []

    def record(_conn, _cursor, statement, parameters, _context, _many):  # type: ignore[no-untyped-def]
        seen.append((statement, parameters))

    event.listen(led.engine, "before_cursor_execute", record)
    try:
        led.run_failures("t/r1/")
    finally:
        event.remove(led.engine, "before_cursor_execute", record)
    assert len(seen) == 2, seen
    with led.engine.connect() as c:
        plans = [" / ".join(r[3] for r in c.exec_driver_sql("EXPLAIN QUERY PLAN " + q, p)) for q, p in seen]
    assert not [p for p in plans if re.search(r"\bSCAN (audit|operations)\b", p)], plans
    assert "ix_audit_op_id" in plans[1], plans


def test_operations_dodges_visits_and_failures(ledger):
    led = ledger()
    assert led.record_dodge("t/r1/d0", train="t", domain="d0", until=50.0, jobs=["j1"])
    assert not led.record_dodge("t/r1/d0", train="t", domain="d0", until=60.0, jobs=["j1"])
    assert led.claim_dodged("t/r1/", "slot-1")["id"] == "t/r1/d0"
    assert led.claim_dodged("t/r1/", "slot-1")["detail"]["slot"] == "slot-1"  # the same one on a retry
    assert led.claim_dodged("t/r1/", "slot-2") is None
    assert take(led, "t/r1/d1", "d1").granted
    led.handover(["h10"], "t/r1/d1", "repair/h10", kind="repair", reason="check failed")
    led.note("t/r1/d1", "offboard", ["h11"], "bad gpu")
    assert led.run_failures("t/r1/") == (8, 1, ["h11: bad gpu"])
    assert [o["id"] for o in led.operations_like("t/r1/", state="active")] == ["t/r1/d1"]
    assert led.open_operation("e1", kind="emergency", detail={"a": 1}, actor="u", action="emergency", reason="x")
    assert not led.open_operation("e1", kind="emergency", detail={"a": 1}, actor="u", action="emergency", reason="x")
    led.record_visit("t", "d1", 123.0, "t/r1/d1")
    led.record_visit("t", "d1", 124.0, "t/r2/d1")
    assert led.last_visits("t") == {"d1": 124.0}
    led.set_switch("freeze", True, reason="incident", actor="u")
    assert led.switch("freeze")["reason"] == "incident"
    led.set_switch("freeze", False, reason="over", actor="u")
    assert led.switch("freeze") is None
    led.record_verification("t/r1/d1", "h12", True, {"gpu-driver": "570"}, None)
    assert led.verification("t/r1/d1", "h12") == (True, {"gpu-driver": "570"}, None)
    led.mark_for_revisit("t/r1/d1", "taken over")
    assert led.operation("t/r1/d1")["state"] == "dodged" and led.verification("t/r1/d1", "h12") is None
    assert led.audit_count() == len(led.audit_rows())


def test_indexes_are_added_to_a_ledger_made_before_them(ledger):
    """An existing ledger gets the new indexes when it is opened (create_all adds none to old tables)."""
    led = ledger()
    take(led, "op1", "d0")
    wanted = {t.name: {ix.name for ix in t.indexes} for t in (audit, leases, operations)}
    assert all(wanted.values())
    with led.engine.begin() as c:
        for names in wanted.values():
            for name in names - {"ix_leases_op_host"}:
                c.execute(text(f"DROP INDEX {name}"))
        c.execute(text("CREATE INDEX ix_leases_op_id ON leases (op_id)"))  # the one ix_leases_op_host replaced
    led.dispose()
    again = ledger()
    insp = inspect(again.engine)
    for table, names in wanted.items():
        assert names <= {ix["name"] for ix in insp.get_indexes(table)}, table
    assert "ix_leases_op_id" not in {ix["name"] for ix in insp.get_indexes("leases")}
    assert again.holdings("op1") and take(again, "op1", "d0").granted
    assert set(metadata.tables) >= {"leases", "audit", "operations", "waiters", "ledger_lock"}


# ---- every decision, against the rules written out plainly ---------------------------------------------
def reference(rows: dict[str, tuple[str, str, str]], *, op_id: str, domain: str, want: list[str], budget: Budget,
              pool: set[str] | None, unavailable: set[str]) -> tuple[str, str] | None:
    """The capacity rules of `acquire_domain` over every lease (host -> (op, kind, domain)), as the
    ledger first wrote them: None when granted."""
    in_pool = (lambda h: True) if pool is None else (lambda h: h in pool)  # noqa: E731
    others = {h for h in want if h in rows and rows[h][0] != op_id}
    repairing = {h for h, r in rows.items() if r[1] == "repair"}
    if others - repairing:
        holders = sorted({rows[h][0] for h in others - repairing})
        return "wait", f"{len(others - repairing)} host(s) of {domain} held by {', '.join(holders)}"
    maint = {h: r for h, r in rows.items() if r[1] != "repair"}
    out = {r[2] for r in maint.values()}
    if len(out | {domain}) > budget.max_domains_down:
        return "wait", f"max_domains_down={budget.max_domains_down} reached: {', '.join(sorted(out))} out"
    broken = {h for h in (unavailable - set(maint)) | repairing if in_pool(h)}
    held = [h for h in maint if in_pool(h)]
    if len(broken) > budget.failure_hosts:
        return "stop", (f"failure buffer exhausted: {len(broken)} hosts broken, in repair or out with no lease "
                        f"> budget {budget.failure_hosts}")
    taking = [h for h in want if h not in broken and h not in rows]
    if len(held) + len(taking) > budget.maintenance_hosts:
        return "wait", (f"maintenance buffer: {len(held)} hosts out + {len(taking)} of {domain} > budget "
                        f"{budget.maintenance_hosts}")
    floor = budget.total_hosts - budget.maintenance_hosts - budget.failure_hosts
    serving = budget.total_hosts - len(held) - len(broken) - len(taking)
    if serving < floor:
        return "wait", f"serving would drop to {serving} < floor {floor}"
    return None


def test_random_decisions_match_the_rules(ledger, url):
    """Random fleets, repairs, pools and broken hosts: every decision and message is the rules' own."""
    rnd = random.Random(7)
    led = ledger()
    n = 60 if url.startswith("sqlite") else 40
    fleet = {f"r{d}": [f"r{d}n{j}" for j in range(4)] for d in range(8)}
    hosts = [h for hs in fleet.values() for h in hs]
    for i in range(n):
        rows: dict[str, tuple[str, str, str]] = {}
        with led.engine.begin() as c:
            c.execute(leases.delete())
            c.execute(text("DELETE FROM waiters"))
        for d, hs in fleet.items():  # some domains out, some hosts in repair
            if rnd.random() < 0.25:
                op = f"old{i}-{d}"
                for h in hs:
                    if rnd.random() < 0.9:
                        rows[h] = (op, "train_stop", d)
            for h in hs:
                if h not in rows and rnd.random() < 0.08:
                    rows[h] = (f"rep{i}-{h}", "repair", d)
        with led.engine.begin() as c:
            if rows:
                c.execute(leases.insert(), [{"host": h, "op_id": o, "kind": k, "domain": d, "since": 0.0}
                                            for h, (o, k, d) in rows.items()])
        domain = rnd.choice(sorted(fleet))
        pool = None if rnd.random() < 0.4 else set(h for d in rnd.sample(sorted(fleet), rnd.randint(2, 8))
                                                   for h in fleet[d]) | set(fleet[domain])
        unavailable = {h for h in hosts if rnd.random() < 0.1}
        budget = Budget(total_hosts=len(pool or hosts), maintenance_hosts=rnd.randint(2, 12),
                        failure_hosts=rnd.randint(0, 5), max_domains_down=rnd.randint(1, 4))
        op = f"op{i}"
        want = fleet[domain]
        expect = reference(rows, op_id=op, domain=domain, want=want, budget=budget, pool=pool, unavailable=unavailable)
        d = led.acquire_domain(op, train="t", domain=domain, hosts=want, budget=budget,
                               pool_hosts=None if pool is None else sorted(pool), unavailable=sorted(unavailable))
        got = None if d.granted else (d.outcome, d.reason)
        assert got == expect, (i, domain, budget, sorted(rows.items()))
        if d.granted:
            taking = [h for h in want if h not in rows and not (h in unavailable and (pool is None or h in pool))]
            assert sorted(h for h, o in led.holdings().items() if o == op) == sorted(taking)


def test_acquire_reads_no_lease_row_of_other_hosts(url):
    """A grant on a fleet with many repairs reads counts and the domain's own leases, not every lease.
    The Python path's statements (SQLite's, and PostgreSQL's without its functions, whose statements
    SQLAlchemy does not see; their decisions are compared in tests/adapters/test_ledger_pg_functions.py)."""
    led = Ledger(url, pg_functions=False)
    with led.engine.begin() as c:
        c.execute(leases.insert(), [{"host": f"x{i}", "op_id": f"rep{i}", "kind": "repair", "domain": f"r{i % 9}",
                                     "since": 0.0} for i in range(500)])
    seen: list[tuple[str, int]] = []

    @event.listens_for(led.engine, "after_cursor_execute")
    def record(conn, cursor, statement, parameters, context, executemany):  # noqa: ANN001
        seen.append((" ".join(statement.split()), cursor.rowcount))

    big = Budget(total_hosts=10_000, maintenance_hosts=64, failure_hosts=1000, max_domains_down=2)
    assert take(led, "op", "d0", big).granted
    assert take(led, "op2", "d1", big, pool_hosts=[f"x{i}" for i in range(500)] + DOMAINS["d1"]).granted
    assert led.release("op") == DOMAINS["d0"]
    assert len(seen) >= 3, seen  # the statements were seen: nothing below passes for want of them
    whole = [s for s, _ in seen if re.search(r"FROM leases$", s)]
    assert not whole, whole
    if led.engine.dialect.name == "postgresql":  # PostgreSQL reports the rows a SELECT returned
        assert sum(n for s, n in seen if s.startswith("SELECT")) < 40, seen
    led.dispose()


def test_a_connection_the_server_dropped_is_replaced(pg_server):
    """No ping on every call: a connection idle for a while is checked before use, and one the server
    closed is replaced (with its prepared statements) instead of failing the call."""
    led = Ledger(pg_server.create_database(f"t{next(_db_names)}_reconnect"))
    try:
        assert take(led, "op1", "d0").granted
        with led.engine.connect() as c:
            pid = c.execute(text("SELECT pg_backend_pid()")).scalar_one()
        other = psycopg2.connect(host=str(pg_server.socket_dir), user="postgres", dbname="postgres")
        try:
            with other.cursor() as cur:
                cur.execute("SELECT pg_terminate_backend(%s)", (pid,))
                assert cur.fetchone() == (True,)
        finally:
            other.close()
        time.sleep(1.2)  # longer than the idle time after which a connection is pinged
        assert led.release("op1") == DOMAINS["d0"]
        assert take(led, "op2", "d1").granted
    finally:
        led.dispose()


def test_a_probe_decides_but_leases_nothing(ledger):
    """What a capacity trigger asks: `free` where a take would be granted, the same refusal otherwise;
    never a lease, never an operation, and the prober keeps its place among the waiters."""
    led = ledger()
    assert take(led, "op1", "d0").granted
    d = take(led, "op2", "d1", probe=True)
    assert d.outcome == "wait" and "max_domains_down=1" in d.reason
    assert [w["op_id"] for w in led.waiting()] == ["op2"]
    led.release("op1")
    before = led.audit_count()
    d = take(led, "op2", "d1", probe=True)
    assert d.outcome == "free" and not d.granted
    assert led.holdings() == {} and led.operation("op2") is None and led.audit_count() == before
    assert [w["op_id"] for w in led.waiting()] == ["op2"]
    assert take(led, "op2", "d1").granted  # the task then takes it
    assert take(led, "op2", "d1", probe=True).granted  # already held: granted, as a take says
    two = Budget(total_hosts=32, maintenance_hosts=16, failure_hosts=2, max_domains_down=2)
    d = take(led, "em", "d1", two, kind="emergency", take_over_from=["op2"], probe=True)
    assert d.outcome == "free" and set(led.holdings().values()) == {"op2"}  # a takeover probe moves nothing


def test_a_domains_verdicts_are_kept_each_as_given_and_replaced_per_host(ledger):
    """The verdicts are written one statement per verdict shared (most of a domain's hosts pass at one set of
    versions): every host still gets its own row, its own versions and reason, and a later check replaces only
    the hosts it judged."""
    led = ledger()
    new = {"driver": "550.1", "kernel": "6.1"}
    old = {"driver": "535.9", "kernel": "6.1"}
    verdicts = ([(f"h0{j}", True, dict(new), None) for j in range(5)]
                + [("h05", False, dict(old), "version mismatch: driver is 535.9, expected 550.1"),
                   ("h06", False, dict(new), "Xid 79 on GPU 3"),
                   ("h07", True, {"kernel": "6.1", "driver": "550.1"}, None)])
    led.record_verifications("op1", verdicts)
    led.record_verifications("op2", [("h00", False, dict(old), "not at target")])  # another operation's
    got = led.verifications("op1")
    assert got == {h: (ok, v, why) for h, ok, v, why in verdicts}
    assert led.verifications("op2") == {"h00": (False, old, "not at target")}
    # a second check of two hosts: theirs replaced, the others' kept
    led.record_verifications("op1", [("h05", True, dict(new), None), ("h01", False, dict(new), "NCCL bandwidth low")])
    got = led.verifications("op1")
    assert got["h05"] == (True, new, None) and got["h01"] == (False, new, "NCCL bandwidth low")
    assert {h: got[h] for h in got if h not in ("h05", "h01")} == {
        h: (ok, v, why) for h, ok, v, why in verdicts if h not in ("h05", "h01")}
    assert len(got) == 8


def test_versions_before_keep_each_hosts_first_record_in_one_statement_per_set_of_versions(ledger):
    """A domain's versions before its upgrade are written one statement per set of versions its hosts share:
    each host still gets its own row, a retry that finds hosts half upgraded keeps their first record and adds
    only the hosts never recorded, and another operation's hosts are apart."""
    led = ledger()
    old = {"kernel": "6.1", "driver": "535.9"}
    odd = {"driver": "535.9", "kernel": "6.0", "firmware": "96.00"}
    first = {f"h0{j}": dict(old) for j in range(6)} | {"h06": dict(odd)}
    led.record_versions_before("op1", first)
    led.record_versions_before("op2", {"h00": {"driver": "550.1"}})
    assert led.versions_before("op1") == first
    # the retry: two hosts already at the new versions, one never recorded
    led.record_versions_before("op1", {"h00": {"driver": "550.1", "kernel": "6.1"}, "h01": dict(old),
                                       "h07": dict(odd)})
    assert led.versions_before("op1") == first | {"h07": odd}
    assert led.versions_before("op2") == {"h00": {"driver": "550.1"}}
