"""The acquire decision on its own (`railyard.ledger.leasing.decide`): no database, each step in order."""

from __future__ import annotations

from railyard.domain.models import Budget
from railyard.ledger.leasing import Ask, _View, decide

BUDGET = Budget(total_hosts=12, maintenance_hosts=3, failure_hosts=2, max_domains_down=1)


def ask(**kw):
    base = dict(op_id="t/r1/pod-a", domain="pod-a", want=["a1", "a2", "a3"], budget=BUDGET, pool=None,
                unavail=set(), u_pool=[], u_known=True, takeover=set(), probe=False)
    return Ask(**(base | kw))


def test_a_free_domain_is_granted_and_a_probe_leases_nothing():
    d = decide(ask(), _View())
    assert (d.act, d.taking, d.reason) == ("grant", ["a1", "a2", "a3"], "t/r1/pod-a took pod-a (3 hosts)")
    assert decide(ask(probe=True), _View()).act == "free"


def test_the_steps_refuse_in_order():
    mine = {h: ("t/r1/pod-a", "train_stop") for h in ("a1", "a2", "a3")}
    assert decide(ask(), _View(rows=mine)).reason == "t/r1/pod-a already holds pod-a"
    ahead = _View(ahead=("e/r9/pod-a", 100.0), domains_out={"pod-b"})
    assert decide(ask(), ahead).reason == "yielding to e/r9/pod-a, waiting since 100"
    held = _View(rows={"a2": ("u/r2/pod-a", "train_stop")}, domains_out={"pod-a"}, n_maint=1)
    assert decide(ask(), held).reason == "1 host(s) of pod-a held by u/r2/pod-a"
    assert decide(ask(), _View(domains_out={"pod-b"}, n_maint=3)).reason == "max_domains_down=1 reached: pod-b out"
    d = decide(ask(unavail={"b1", "b2", "b3"}, u_pool=["b1", "b2", "b3"]), _View())
    assert (d.act, d.reason) == ("stop", "failure buffer exhausted: 3 hosts broken, in repair or out with no "
                                         "lease > budget 2")


def test_a_takeover_hands_the_hosts_over_then_grants_with_nothing_to_lease():
    theirs = {h: ("t/r1/pod-a", "train_stop") for h in ("a1", "a2", "a3")}
    e = ask(op_id="e/r5/pod-a", takeover={"t/r1/pod-a"})
    d = decide(e, _View(rows=theirs, domains_out={"pod-a"}, n_maint=3))
    assert d.act == "take_over" and d.handed == {h: "t/r1/pod-a" for h in ("a1", "a2", "a3")}
    ours = {h: ("e/r5/pod-a", "emergency") for h in theirs}
    d = decide(e, _View(rows=ours, domains_out={"pod-a"}, n_maint=3), taken_over=d.handed)
    assert (d.act, d.taking) == ("grant", None)
    assert d.reason == "e/r5/pod-a took over 3 host(s) of pod-a from t/r1/pod-a"


def test_a_refusal_on_a_pools_bounds_is_judged_again_on_exact_counts():
    pooled = ask(pool={"a1", "a2", "a3", "c1"}, unavail={"c1"}, u_pool=["c1"])
    v = _View(n_maint=3, domains_out=set())  # three leases, but none of them in the pool
    assert decide(pooled, v).act == "judge_again"
    assert decide(pooled, v, exact=(1, 0)).act == "grant"
    assert decide(pooled, v, exact=(1, 1)).reason == "maintenance buffer: 1 hosts out + 3 of pod-a > budget 3"
