"""``ArrivalForecast``: the expected work of future earlier-due arrivals, against sums worked
by hand, and the top priority class it reports (which deadlines ``slo`` charges it to)."""

import pytest

from ditmem.scheduler.policies.forecast import ArrivalForecast
from ditmem.scheduler.request import Request


def _req(rid, arrival, window, work, priority=1):
    return Request(rid, arrival, priority=priority, deadline=arrival + window,
                   standalone_s=work)


def test_work_before_sums_the_arrivals_that_would_be_due_first():
    fc = ArrivalForecast()
    # two arrivals over a 10-s span (the longest window, 4 s, is shorter): 2 s of work with a
    # 1-s window and 3 s with a 4-s window
    fc.see([_req("a", 0.0, 1.0, 2.0), _req("b", 10.0, 4.0, 3.0)])
    # within delta = 3 s only "a"-like arrivals land first, over the next 3 − 1 = 2 s:
    # 2 s × 2 / 10 s span
    assert fc.work_before(3.0, 10.0) == pytest.approx(0.4)
    # within 6 s both: (2 × 5 + 3 × 2) / 10
    assert fc.work_before(6.0, 10.0) == pytest.approx(1.6)
    # priority 0 sees only priority ≤ 0 arrivals: none here
    assert fc.work_before(6.0, 10.0, priority=0) == 0.0


def test_top_priority_follows_the_recent_arrivals():
    fc = ArrivalForecast(memory=2)
    assert fc.top_priority() is None
    fc.see([_req("a", 0.0, 1.0, 1.0, priority=2), _req("b", 1.0, 1.0, 1.0, priority=1)])
    assert fc.top_priority() == 1
    fc.see([_req("c", 2.0, 1.0, 1.0, priority=0)])
    assert fc.top_priority() == 0
    # memory 2: "c" and "d" remain, the top is still 0; two more without priority 0 drop it
    fc.see([_req("d", 3.0, 1.0, 1.0, priority=2)])
    assert fc.top_priority() == 0
    fc.see([_req("e", 4.0, 1.0, 1.0, priority=2), _req("f", 5.0, 1.0, 1.0, priority=1)])
    assert fc.top_priority() == 1
