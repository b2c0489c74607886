"""``give_up_forecast="ranked"`` (issue 13, session 12): the give-up rule keeps a request for
an overrun within the forecast work of arrivals the rule would set aside before it —
hand-computed charges and decisions. (Session 12's ``"fits"``, a capped forecast charge, bit
in 0 of 99,462 prefix checks on seed-mix and was removed in session 16.)"""

import pytest
from sched_factories import (
    PAGE,
    TwoSecondForecast,
    req,
    table_cost,
)

from ditmem.scheduler import Request, make_policy
from ditmem.scheduler.policies.forecast import ArrivalForecast
from ditmem.scheduler.request import PRIORITY_WEIGHTS
from ditmem.scheduler.simulator import simulate

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
