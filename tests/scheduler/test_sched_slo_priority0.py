"""slo's priority-0 and late-request rules, hand-computed: the give-up swap (``shield0``),
the targeted promotion of an at-risk priority-0 request (``rescue0``) and the order of late
requests (``alive_first``). A 512² step costs 1 s."""

import pytest
from sched_factories import PAGE, HandEngine, req, table_cost

from ditmem.scheduler import make_policy
from ditmem.scheduler.experiment import Scenario, explain_misses
from ditmem.scheduler.simulator import simulate


def outcome(reqs, cost, **kw):
    res = simulate(reqs, make_policy("slo", cost, forecast=False, **kw), page_bytes=PAGE)
    return {r.request.id: (r.finished, r.met) for r in res.records}


def test_shield_swaps_a_priority0_give_up_for_a_lower_priority_one():
    cost = table_cost()
    reqs = [
        req("A", 0.0, steps=10, priority=0, slo_ms=12_000, cost=cost),
        req("B", 0.0, steps=4, priority=1, slo_ms=6_000, cost=cost),
    ]
    # 14 s of work, A due at 12 s: one must miss. Largest work per weight² sets aside A
    # (10/9 > 4/4); B's 4 s alone covers the 2 s excess, so the shield sets aside B instead.
    assert outcome(reqs, cost, shield0=False) == {"B": (4.0, True), "A": (14.0, False)}
    assert outcome(reqs, cost) == {"A": (10.0, True), "B": (14.0, False)}


def test_shield_does_not_swap_when_no_single_lower_priority_request_covers_the_excess():
    cost = table_cost()
    reqs = [
        req("A", 0.0, steps=10, priority=0, slo_ms=10_000, cost=cost),
        req("B", 0.0, steps=3, priority=1, slo_ms=6_000, cost=cost),
        req("C", 0.0, steps=3, priority=1, slo_ms=6_000, cost=cost),
    ]
    # 16 s of work by 10 s: a 6 s excess that neither 3 s request covers alone, so A (10/9
    # per weight²) is set aside — one miss, not two.
    expected = {"B": (3.0, True), "C": (6.0, True), "A": (16.0, False)}
    assert outcome(reqs, cost) == expected
    assert outcome(reqs, cost, shield0=False) == expected


def test_shield_keeps_the_earlier_of_two_equal_priority0_requests():
    cost = table_cost()
    reqs = [
        req("A1", 0.0, steps=10, priority=0, slo_ms=12_000, cost=cost),
        req("A2", 0.0, steps=10, priority=0, slo_ms=19_000, cost=cost),
    ]
    assert outcome(reqs, cost, shield0=False) == {"A2": (10.0, True), "A1": (20.0, False)}
    assert outcome(reqs, cost) == {"A1": (10.0, True), "A2": (20.0, False)}


def test_rescue_promotes_an_at_risk_priority0_only_while_others_can_wait():
    cost = table_cost()
    reqs = [
        req("X", 0.0, steps=2, priority=1, slo_ms=5_000, cost=cost),
        req("Y", 0.0, steps=6, priority=0, slo_ms=9_000, cost=cost),
    ]
    # Deadline order runs X first. Y's slack is 1 s (< 0.25 × 6 s) and X can wait a step
    # (slack 3 s): Y runs at 0 s and 1 s; at 2 s its slack 1 s is no longer below 0.25 × 4 s.
    assert outcome(reqs, cost, rescue0=0) == {"X": (2.0, True), "Y": (8.0, True)}
    promoted = {"X": (4.0, True), "Y": (8.0, True)}
    assert outcome(reqs, cost, rescue0=0.25, rescue_guard=1) == promoted
    # The default guard wants 10 of Y's steps of slack from X: X has 3 s, so no promotion.
    assert outcome(reqs, cost, rescue0=0.25) == {"X": (2.0, True), "Y": (8.0, True)}
    urgent = [req("X", 0.0, steps=2, priority=1, slo_ms=2_500, cost=cost), reqs[1]]
    # X's slack (0.5 s) cannot absorb one of Y's 1 s steps: deadline order stands.
    assert outcome(urgent, cost, rescue0=0.25, rescue_guard=1) == {
        "X": (2.0, True),
        "Y": (8.0, True),
    }


def test_late_requests_that_can_still_make_it_alone_run_first():
    cost = table_cost()
    eng = HandEngine(cost)
    # Four 1 s requests with 3 s windows arrived at 5-6.5 s: at 10 s they are lost (due by
    # 9.5 s). They also teach the forecast a rate: 4 s of work per 5 s span due within 3 s
    # of arriving, i.e. 1.6 s expected to slot in ahead of a deadline 5 s away.
    for i, t in enumerate((5.0, 5.5, 6.0, 6.5)):
        eng.arrive(req(f"F{i}", t, steps=1, slo_ms=3_000, cost=cost))
    # L needs 4 s by 15 s: feasible alone, but not with 1.6 s forecast ahead of it (late).
    eng.arrive(req("L", 10.0, steps=4, slo_ms=5_000, cost=cost))
    # (alive_first orders the late requests of the deadline order, order="edf")
    alive = make_policy("slo", cost, order="edf").schedule(10.0, eng.view())
    lane = make_policy("slo", cost, order="edf", alive_first=False).schedule(10.0, eng.view())
    assert alive.batch == ["L"]
    assert lane.batch == ["F0"]
    # order="fifo": with nothing on time, the oldest request runs; the default is "edf"
    assert make_policy("slo", cost, order="fifo").schedule(10.0, eng.view()).batch == ["F0"]
    assert make_policy("slo", cost).schedule(10.0, eng.view()).batch == ["L"]


def test_explain_misses_reports_what_ran_in_the_window():
    cost = table_cost()
    trace = [
        req("A", 0.0, steps=10, priority=1, slo_ms=100_000, cost=cost),
        req("B", 0.5, steps=1, priority=0, slo_ms=2_000, cost=cost),
    ]
    sc = Scenario(cost=cost, trace=trace, trace_timed=True, noise=0.0)
    # fifo runs A from 0 to 10 s, then B: B (window 0.5-2.5 s) is 8.5 s late behind 2 s of A.
    (miss,) = explain_misses(sc, "fifo", 0.0)
    assert (miss["id"], miss["late_by_s"]) == ("B", pytest.approx(8.5))
    assert miss["ran"] == {"512² p1 due after": pytest.approx(2.0)}
    # slo preempts A at its first step boundary (1 s) and B finishes at 2 s: no miss.
    assert explain_misses(sc, "slo", 0.0) == []
