"""slo's priority-0 and late-request rules, hand-computed: the give-up swap (``shield0``),
the targeted promotion of an at-risk priority-0 request (``rescue0``) and the order of late
requests (``late_rank``). A 512² step costs 1 s."""

import pytest
from sched_factories import PAGE, HandEngine, req, table_cost

from ditmem.scheduler import make_policy
from ditmem.scheduler.experiment import Scenario, explain_misses
from ditmem.scheduler.simulator import simulate


def outcome(reqs, cost, **kw):
    res = simulate(reqs, make_policy("slo", cost, forecast="off", **kw), page_bytes=PAGE)
    return {r.request.id: (r.finished, r.met) for r in res.records}


def test_shield_swaps_a_priority0_give_up_for_a_lower_priority_one():
    cost = table_cost()
    reqs = [
        req("A", 0.0, steps=10, priority=0, slo_ms=12_000, cost=cost),
        req("B", 0.0, steps=4, priority=1, slo_ms=6_000, cost=cost),
    ]
    # 14 s of work, A due at 12 s: one must miss. Largest work per weight sets aside A
    # (10/3 > 4/2); B's 4 s alone covers the 2 s excess, so the shield sets aside B instead.
    assert outcome(reqs, cost, shield0=False) == {"B": (4.0, True), "A": (14.0, False)}
    assert outcome(reqs, cost) == {"A": (10.0, True), "B": (14.0, False)}


def test_shield_does_not_swap_when_no_single_lower_priority_request_covers_the_excess():
    cost = table_cost()
    reqs = [
        req("A", 0.0, steps=10, priority=0, slo_ms=10_000, cost=cost),
        req("B", 0.0, steps=3, priority=1, slo_ms=6_000, cost=cost),
        req("C", 0.0, steps=3, priority=1, slo_ms=6_000, cost=cost),
    ]
    # 16 s of work by 10 s: a 6 s excess that neither 3 s request covers alone, so A (10/3
    # per weight) is set aside — one miss, not two.
    expected = {"B": (3.0, True), "C": (6.0, True), "A": (16.0, False)}
    assert outcome(reqs, cost) == expected
    assert outcome(reqs, cost, shield0=False) == expected


def test_shield_keeps_the_earlier_of_two_equal_priority0_requests():
    # 20 s of work by 19 s: a 1 s overrun, within the timing-error tolerance (2 × 3 % of
    # 20 s, ``give_up_sds``), which the test takes away so the swap decides at 0
    cost = table_cost()
    reqs = [
        req("A1", 0.0, steps=10, priority=0, slo_ms=12_000, cost=cost),
        req("A2", 0.0, steps=10, priority=0, slo_ms=19_000, cost=cost),
    ]
    exact = {"give_up_sds": 0.0}
    assert outcome(reqs, cost, shield0=False, **exact) == {"A2": (10.0, True),
                                                           "A1": (20.0, False)}
    assert outcome(reqs, cost, **exact) == {"A1": (10.0, True), "A2": (20.0, False)}


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
    # L needs 4 s by 15 s: feasible alone, but not with 1.6 s forecast ahead of it (late;
    # L is priority 1, so only where every deadline is charged the forecast).
    eng.arrive(req("L", 10.0, steps=4, slo_ms=5_000, cost=cost))
    # late_rank="lane" (default) runs L first; "arrival" the oldest late request
    alive = make_policy("slo", cost, forecast="all").schedule(10.0, eng.view())
    oldest = make_policy("slo", cost, forecast="all", late_rank="arrival").schedule(
        10.0, eng.view())
    assert alive.batch == ["L"]
    assert oldest.batch == ["F0"]


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


def test_a_joiner_leaves_a_priority0_request_its_margin():
    # P (priority 0): 10 steps of 1 s, due at 11.25 s (slack 1.25 s); J (priority 2) far
    # due. A pair steps in 1.5 s: each join takes 0.5 s of P's slack. Margin 0: J joins at
    # 0 s (P's slack after it 0.75 >= 0) and 1.5 s (0.25 >= 0), then not (-0.25); P alone
    # until 11.0 s. Margin 0.2: a join must leave P slack of 0.2 × its remaining work (or
    # what P alone would keep, if less). While P runs alone a join would leave 0.75 s:
    # refused with 4 or more steps left (0.8 > 0.75), taken at 7 s (3 left: 0.6); at 8.5 s
    # a join would leave 0.25 < min(0.4, 0.75), refused; at 9.5 s 0.25 >= min(0.2, 0.75),
    # taken. Both finish P at 11.0 s without noise.
    from ditmem.scheduler.experiment import _Recording
    from ditmem.scheduler.noise import TimingNoise

    def run(margin, bias):
        cost = table_cost(batch_points=[{"tokens": 1024, "batch": 2, "seconds": 1.5}])
        reqs = [
            req("P", 0.0, steps=10, priority=0, slo_ms=11_250, cost=cost),
            req("J", 0.0, steps=10, priority=2, slo_ms=100_000, cost=cost),
        ]
        # join_sds=0: the margin alone (the default also keeps every request's timing error,
        # test_sched_policies.test_a_joiner_leaves_every_request_its_timing_error)
        pol = _Recording(make_policy("slo", cost, forecast="off", join_margin0=margin,
                                     join_sds=0.0))
        res = simulate(reqs, pol, page_bytes=PAGE, noise=TimingNoise(sigma=0.0, bias=bias))
        pairs = [start for start, _, batch in pol.steps if len(batch) == 2]
        p = next(r for r in res.records if r.request.id == "P")
        return pairs, p.finished, p.met

    early, p_end, _ = run(0.0, 0.0)
    assert early == pytest.approx([0.0, 1.5]) and p_end == pytest.approx(11.0)
    late, p_end, _ = run(0.2, 0.0)
    assert late == pytest.approx([7.0, 9.5]) and p_end == pytest.approx(11.0)
    # The device 3 % slower than the profile: the early joins spend P's slack before the
    # error shows, and P misses (2 × 1.545 + 8 × 1.03 = 11.33 s > 11.25 s before the
    # correction catches up); with the margin the joins wait until the online correction
    # has seen 7 slow steps, one join is left (8.24 s) and P finishes in time.
    assert run(0.0, 0.03)[2] is False
    pairs, p_end, met = run(0.2, 0.03)
    assert met and pairs == pytest.approx([8.24]) and p_end < 11.25
    with pytest.raises(ValueError, match="join_margin0"):
        make_policy("slo", table_cost(), join_margin0=-0.1)


def test_forecast_shield0_keeps_a_priority0_request_the_forecast_would_give_up():
    cost = table_cost()

    def late_at_10(arrival_priority: int, **kw) -> bool:
        eng = HandEngine(cost)
        # Four 1 s requests with 3 s windows arrived at 5-6.5 s: the forecast learns 4 s of
        # work per 5 s span due within 3 s of arriving, i.e. 0.8 × (5 - 3) = 1.6 s expected
        # ahead of a deadline 5 s away. At 10 s they are lost (late, outside the give-up heap).
        for i, t in enumerate((5.0, 5.5, 6.0, 6.5)):
            eng.arrive(req(f"F{i}", t, steps=1, priority=arrival_priority, slo_ms=3_000,
                           cost=cost))
        # L (priority 0) needs 4 s by 15 s: 4 + 1.6 > 5, an excess of 0.6 s, and no present
        # request to swap it for.
        eng.arrive(req("L", 10.0, steps=4, priority=0, slo_ms=5_000, cost=cost))
        pol = make_policy("slo", cost, **kw)
        pol.schedule(10.0, eng.view())
        return "L" in pol.lane.ids()

    # Default: the forecast's 1.6 s gives L up.
    assert late_at_10(2)
    # The forecast arrivals are priority 2: the 0.6 s excess is within their 1.6 s, work the
    # shield would give up for L once present — L stays on time.
    assert not late_at_10(2, forecast_shield0=True)
    # Forecast priority-0 arrivals outrank nobody: L is given up either way.
    assert late_at_10(0, forecast_shield0=True)
    with pytest.raises(ValueError, match="forecast_shield0"):
        make_policy("slo", cost, forecast_shield0=True, forecast="off")


def test_lone_p0_unpacked_counts_a_shapeless_p0_request_at_batch1():
    # Every shape packs 4 in 2 × its step (gain 0.5). X (p1, 1024², one 4-s step) is due
    # at 5 s; P (p0, 512², 8 × 1 s) at 9 s. Credited, X counts 2 s and P 4 s: 6 <= 9, no
    # give-up; X runs 0-4 s (P joins its step: the table prices a 1024² + 512² step at X's
    # 4 s) and P's other 7 steps end at 11 s: missed. With lone_p0_unpacked P shares
    # its shape with nobody and counts 8 s: 2 + 8 > 9; the most work per weight is P's (8/3 >
    # 4/2), a priority-0 pick that the shield swaps for X, whose 4 s alone cover the 1-s
    # overrun — so P runs 0-8 s and X finishes at 12 s.
    pts = [{"tokens": 1024, "batch": b, "seconds": s} for b, s in ((2, 1.2), (3, 1.6), (4, 2.0))]
    cost = table_cost(batch_points=pts)
    reqs = [
        req("X", 0.0, size=1024, steps=1, priority=1, slo_ms=5_000, cost=cost),
        req("P", 0.0, steps=8, priority=0, slo_ms=9_000, cost=cost),
    ]
    assert cost.step_time("qwen-image", [4096, 1024]) == pytest.approx(4.0)
    assert outcome(reqs, cost) == {"X": (4.0, True), "P": (11.0, False)}
    assert outcome(reqs, cost, lone_p0_unpacked=True) == {"P": (8.0, True), "X": (12.0, False)}
    # A far-due 512² request (P's shape) is present: P keeps its credit, X is not given up
    # and heads the step (P and Z join it), as without the option.
    eng = HandEngine(cost)
    for r in reqs + [req("Z", 0.0, steps=1, priority=2, slo_ms=100_000, cost=cost)]:
        eng.arrive(r)
    plan = make_policy("slo", cost, forecast="off", lone_p0_unpacked=True).schedule(0.0, eng.view())
    assert plan.batch[0] == "X"
