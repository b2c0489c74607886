"""``give_up_forecast="fits"`` and ``"ranked"`` (issue 13, session 12): the give-up rule
charges each deadline prefix only the forecast work that fits before its own deadline after
the present work due before it, or keeps a request for an overrun within the forecast work
of arrivals the rule would set aside before it — hand-computed charges and decisions."""

import pytest
from sched_factories import (
    PAGE,
    HandEngine,
    TwoSecondForecast,
    forecast_trace_finish,
    req,
    table_cost,
)

from ditmem.scheduler import Request, make_policy
from ditmem.scheduler.policies.forecast import ArrivalForecast
from ditmem.scheduler.policies.forecast_fit import FittedCharge
from ditmem.scheduler.request import PRIORITY_WEIGHTS
from ditmem.scheduler.simulator import simulate


def test_the_charge_is_capped_at_the_room_before_each_deadline():
    """Prefixes (room R, forecast F, own work w): (3, 0, 3), (4, 2, 2), (8, 2, 4), (10, 5, 0).
    G_1 = 0; G_2 = 0 + min(2 − 0, 4 − 3 − 0) = 1 (the arrivals due in (3, 4] have 1 s
    after the first request's 3); G_3 = 1 + min(0, 8 − 5 − 1) = 1; G_4 = 1 + min(3, 10 − 9
    − 1) = 1. Dropping the second request (2 s): G_2 = min(2, 4 − 3) = 1 still, G_3 = 1,
    G_4 = 1 + min(3, 10 − 7 − 1) = 3."""
    ch = FittedCharge()
    got = [ch.push(3.0, 0.0, 3.0), ch.push(4.0, 2.0, 2.0), ch.push(8.0, 2.0, 4.0),
           ch.push(10.0, 5.0, 0.0)]
    assert got == pytest.approx([0.0, 1.0, 1.0, 1.0])
    ch.drop(1)
    assert ch.charge == pytest.approx([0.0, 1.0, 1.0, 3.0])
    assert ch.last() == pytest.approx(3.0)
    with pytest.raises(ValueError, match="index"):
        ch.drop(4)
    with pytest.raises(ValueError, match="work"):
        ch.push(1.0, 0.0, -1.0)


def _decide(**options):
    """One decision at 0: B (p0, 3 steps of 1 s, due 3), E (p2, 2 steps, due 4), A (p2, 4
    steps, due 8)."""
    cost = table_cost()
    eng = HandEngine(cost)
    for r in (req("B", 0.0, steps=3, priority=0, slo_ms=3_000, cost=cost),
              req("E", 0.0, steps=2, priority=2, slo_ms=4_000, cost=cost),
              req("A", 0.0, steps=4, priority=2, slo_ms=8_000, cost=cost)):
        eng.arrive(r)
    pol = make_policy("slo", cost, batching=False, **options)
    pol.forecast = TwoSecondForecast()
    plan = pol.schedule(0.0, eng.view())
    return plan.batch, pol.late_ids()


def test_fits_keeps_a_priority0_request_the_forecast_arrivals_could_not_displace():
    """The forecast's 2 s are due after 3 s, i.e. after B. Default ("all"): the prefix to
    E's deadline holds 3 + 2 = 5 s against 4 − 2 = 2: E (2 / 1² > 3 / 3²) and then B (no
    lower-priority request present covers the 1 s left) are set aside; A's prefix, 4 s
    <= 8 − 2, fits. Take back: B back makes A's prefix 7 > 6 (no), E back fits (2 <= 2,
    6 <= 6): B, priority 0, stays late for arrivals due after it, and E runs. "fits":
    those arrivals have 4 − 3 = 1 s before E's deadline, so E's prefix holds 5 > 4 − 1:
    E is set aside (its own work is the overrun); then 3 <= 3 and A's prefix 7 <= 8 − 1.
    B runs, E is the one late."""
    assert _decide() == (["E"], ("B",))
    assert _decide(give_up_forecast="fits") == (["B"], ("E",))


def test_fits_still_charges_arrivals_that_fit():
    """The session-11 trace (``test_sched_late_joins``): B (due 1.5, 1 step) and A (due 6.5,
    4 steps) at 0, C (due 2.5, 1 step) at 1, D (due 9, 2 steps) at 2; the forecast's 2 s
    are due after 3 s, with 6.5 − 1 = 5.5 s free for them before A's deadline, so "fits"
    charges all 2 s as the default does: A is set aside at 0 and ends at 8 (B 0–1, C 1–2,
    D 2–4, A 4–8), where "none" keeps it (A 2–6, D 6–8)."""
    assert forecast_trace_finish(give_up_forecast="fits") == pytest.approx(
        {"B": 1.0, "C": 2.0, "D": 4.0, "A": 8.0})
    assert forecast_trace_finish(give_up_forecast="none") == pytest.approx(
        {"B": 1.0, "C": 2.0, "A": 6.0, "D": 8.0})


def test_fits_needs_one_forecast_over_all_priorities():
    with pytest.raises(ValueError, match="forecast_by_priority"):
        make_policy("slo", table_cost(), give_up_forecast="fits", forecast_by_priority=True)


# ---- give_up_forecast="ranked": only arrivals the rule would not set aside first ----------

def test_the_forecast_counts_the_arrivals_ranked_at_or_above_a_key():
    """Two arrivals: at 0, 2 s standalone, window 5 s, p2 (key 2 / 1² = 2); at 10, 1 s,
    window 4 s, p0 (key 1 / 3² = 0.11). At 10 the span is 10 s: within 8 s the expected
    work is (2 × (8 − 5) + 1 × (8 − 4)) / 10 = 1.0 s; of arrivals with key >= 1 only the
    first, 0.6 s; with key >= 3 none; with key <= 0.11 both, or the first only when
    priority 0 is left out (``least=1``)."""
    f = ArrivalForecast()
    a = Request("a", 0.0, "qwen-image", 512, 512, 1, 4, 2, deadline=5.0, standalone_s=2.0)
    b = Request("b", 10.0, "qwen-image", 512, 512, 1, 4, 0, deadline=14.0, standalone_s=1.0)
    f.see([a, b])
    assert f.work_before(8.0, 10.0) == pytest.approx(1.0)
    assert f.work_ranked_before(8.0, 10.0, 1.0, 2.0) == pytest.approx(0.6)
    assert f.work_ranked_before(8.0, 10.0, 3.0, 2.0) == pytest.approx(0.0)
    assert f.work_ranked_before(8.0, 10.0, 1 / 9, 2.0) == pytest.approx(1.0)
    assert f.work_ranked_before(8.0, 10.0, 1.0, 2.0, priority=1) == pytest.approx(0.0)
    assert f.work_ranked_before(8.0, 10.0, 1 / 9, 2.0, least=1) == pytest.approx(0.6)


class _RankedForecast(TwoSecondForecast):
    """``TwoSecondForecast``'s 2 s are one arrival at ``priority`` (``standalone`` s: its key)."""

    def __init__(self, priority: int, standalone: float = 2.0):
        self.priority = priority
        self.key = standalone / PRIORITY_WEIGHTS[priority] ** 2

    def work_ranked_before(self, delta, now, key, power, priority=2, least=0):
        ranked = self.key >= key and least <= self.priority <= priority
        return self.work_before(delta, now) if ranked else 0.0


def test_ranked_keeps_a_request_only_for_arrivals_it_outranks():
    """The session-11 trace again (all p1: A's key 4 / 2² = 1). The forecast's 2 s are one
    p2 arrival (key 2 >= 1): the rule would set that arrival aside before A, so every
    overrun within it (0.5 at 0, 1.5 at 1, 1.5 and 1 at 2: as with "none") keeps A: A
    2–6, D 6–8. As one p1 arrival (key 0.5 < 1) A would be set aside for it: A is given up
    at 0 as by default (D 2–4, A 4–8). As one p0 arrival of key 18 / 3² = 2 >= 1: with
    ``shield0`` (default) that arrival would be swapped for A, not set aside before it,
    so A is given up as by default; without ``shield0`` A is kept."""
    cost = table_cost()

    def finish(priority, standalone=2.0, **options):
        trace = [req("B", 0.0, steps=1, slo_ms=1_500, cost=cost),
                 req("A", 0.0, steps=4, slo_ms=6_500, cost=cost),
                 req("C", 1.0, steps=1, slo_ms=1_500, cost=cost),
                 req("D", 2.0, steps=2, slo_ms=7_000, cost=cost)]
        pol = make_policy("slo", cost, batching=False, give_up_forecast="ranked", **options)
        pol.forecast = _RankedForecast(priority, standalone)
        return {r.request.id: r.finished for r in simulate(trace, pol, page_bytes=PAGE).records}

    assert finish(2) == pytest.approx({"B": 1.0, "C": 2.0, "A": 6.0, "D": 8.0})
    assert finish(1) == pytest.approx({"B": 1.0, "C": 2.0, "D": 4.0, "A": 8.0})
    assert finish(0, 18.0) == pytest.approx({"B": 1.0, "C": 2.0, "D": 4.0, "A": 8.0})
    assert finish(0, 18.0, shield0=False) == pytest.approx(
        {"B": 1.0, "C": 2.0, "A": 6.0, "D": 8.0})
