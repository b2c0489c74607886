"""slo's late joiners and the forecast in the give-up rule (issue 13, session 11): a request
already given up joins an on-time request's step while that request keeps slack >= 0 after
it; forecast work alone can set a request aside, where the forecast is charged (the top
priority class only, by default, since session 19) — hand-computed schedules.
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
    pol = make_policy("slo", cost, forecast="off", **options)
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


#: Session 11's schedule when A is set aside for forecast work alone: B 0–1, C (arrives 1,
#: due 2.5) 1–2, D (arrives 2, due 9, on time) 2–4, late A 4–8.
A_SET_ASIDE = {"B": 1.0, "C": 2.0, "D": 4.0, "A": 8.0}
#: ... when A is kept: B 0–1, C 1–2, A (due 6.5) 2–6 before D (due 9) 6–8.
A_KEPT = {"B": 1.0, "C": 2.0, "A": 6.0, "D": 8.0}
#: ... when A is priority 0: its pick is swapped (``shield0``) for B (1 s covers the 0.5-s
#: overrun); A runs 0–4; at 1 C's arrival makes A's prefix (C 1 s + A 3 s by 6.5, 5.5 − 2 s
#: left) overrun by 0.5 again and C is set aside the same way; D 4–6, late B 6–7, C 7–8.
A_P0_SWAPPED = {"A": 4.0, "D": 6.0, "B": 7.0, "C": 8.0}


@pytest.mark.parametrize("a_priority, top, forecast, expected", [
    (0, 0, "top", A_P0_SWAPPED),
    (1, 0, "top", A_KEPT),
    (2, 0, "top", A_KEPT),
    (1, 1, "top", A_SET_ASIDE),
    (0, 0, "all", A_P0_SWAPPED),
    (1, 0, "all", A_SET_ASIDE),
])
def test_the_forecast_gives_up_only_where_it_is_charged(a_priority, top, forecast, expected):
    """Steps of 1 s, one request a step; the forecast charges 2 s before any deadline more
    than 3 s away. At 0: B (due 1.5) fits; A (due 6.5) with B needs 5 s by 6.5. Where A's
    deadline is charged the forecast — A of the top class among the arrivals (priority 0
    where priority 0 arrives; priority 1 where nothing higher does), or any priority with
    ``forecast="all"`` — 6.5 − 2 = 4.5 s are left: an overrun of 0.5 s, all of it forecast
    work, and someone is set aside (A itself at priority 1; at priority 0, B and then C by
    the swap); where it is not (A priority 1 or 2 below a top class 0, under the default
    ``"top"``) the 5 s fit in 6.5 and A is kept and met."""
    finish = forecast_trace_finish(a_priority, top, forecast=forecast)
    assert finish == pytest.approx(expected)


def test_forecast_mode_is_checked():
    with pytest.raises(ValueError, match="forecast must be one of"):
        make_policy("slo", table_cost(), forecast=False)
    with pytest.raises(ValueError, match="forecast_shield0 needs a forecast"):
        make_policy("slo", table_cost(), forecast="off", forecast_shield0=True)
