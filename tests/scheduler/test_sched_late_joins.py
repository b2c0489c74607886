"""slo's late joiners and the forecast in the give-up rule (issue 13, session 11): a request
already given up joins an on-time request's step while that request keeps slack >= 0 after
it; forecast work alone can set a request aside — hand-computed schedules.
(``late_joins_free``, a joiner taking no slack at all, and ``give_up_forecast``, were
measured, not adopted, and removed in session 17.)"""

import pytest
from sched_factories import PAGE, forecast_trace_finish, req, table_cost

from ditmem.scheduler import make_policy
from ditmem.scheduler.simulator import simulate

#: 512² steps: 1 s alone, 1.6 s for two (a joiner's step grows by 0.6 < 0.9 of its own).
PAIR = [{"tokens": 1024, "batch": 2, "seconds": 1.6}]


def finish_times(**options):
    cost = table_cost(batch_points=PAIR)
    trace = [req("L", 0.0, steps=4, slo_ms=1_000, cost=cost),
             req("A", 0.0, steps=4, slo_ms=5_500, cost=cost),
             req("B", 3.0, steps=1, slo_ms=1_500, cost=cost)]
    pol = make_policy("slo", cost, forecast=False, **options)
    res = simulate(trace, pol, page_bytes=PAGE)
    return {rec.request.id: rec.finished for rec in res.records}


def test_late_joiner_takes_an_on_time_requests_slack_by_default():
    """L (4 steps, due 1) is late at once; A (4 steps, due 5.5) runs from 0 with 1.5 s of
    slack. Default: L joins A's steps while A keeps slack >= 0 after the step — at 0
    (5.5 − 1.6 − 3 = 0.9) and at 1.6 (3.9 − 1.6 − 2 = 0.3), not at 3.2 (2.3 − 1.6 − 1 < 0).
    B (1 step, due 4.5) arrives at 3.0, inside the second pair step; at 3.2 B and A need
    1 + 2 = 3 s by 5.5 with 2.3 left: A, the larger, is given up. B runs 3.2–4.2; then
    the two late ones (lost both) share steps: L's and A's last two steps 4.2–5.8–7.4."""
    assert finish_times() == {"L": pytest.approx(7.4), "A": pytest.approx(7.4),
                              "B": pytest.approx(4.2)}


def test_the_forecast_alone_can_give_a_request_up():
    """Steps of 1 s, one request a step; the forecast charges 2 s before any deadline more
    than 3 s away. At 0: B (due 1.5) fits; A (due 6.5) with B needs 5 s by 6.5 with
    6.5 − 2 = 4.5 left: an overrun of 0.5 s, all of it forecast work, and A is set aside:
    B 0–1, C (arrives 1, due 2.5) 1–2, D (arrives 2, due 9, on time) 2–4, late A 4–8."""
    assert forecast_trace_finish() == pytest.approx({"B": 1.0, "C": 2.0, "D": 4.0, "A": 8.0})
