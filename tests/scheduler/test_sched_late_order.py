"""slo's late work in spare time (issue 13, session 11): nearly-done late requests first
(``late_rank="remaining"``) and late decodes before late steps (``late_decodes_first``),
hand-computed schedules."""

import pytest
from sched_factories import PAGE, req, table_cost, tiled_cost

from ditmem.scheduler import make_policy
from ditmem.scheduler.simulator import simulate


def finish_times(result):
    return {rec.request.id: rec.finished for rec in result.records}


def run(policy, reqs, cost, **kw):
    return simulate(reqs, make_policy(policy, cost, **kw), page_bytes=PAGE)


def test_slo_runs_nearly_done_late_requests_first_by_hand():
    """Issue 13 (session 11): ``late_rank="remaining"`` runs the late request with the least
    remaining work first in spare time, not the one given up first. A (10 steps of 1 s, due
    5) arrives at 0 and is late at once; B (2 steps, due 1) arrives at 0.5 and is late at
    once, given up after A: lane [A, B]. A's first step runs 0–1. At 1 both are lost (1 + 9
    > 5, 1 + 2 > 1.5): by lane order A runs on to 10 and B ends at 12 (flows 10, 11.5); by
    remaining work B (2 s) runs 1–3 and A's 9 steps end at 12 (flows 12, 2.5). The promises (A:
    max(5 + 3 · 5, 0 + 10 / 0.1) = 100 s, B: max(1.5 + 3, 0.5 + 11 / 0.1) = 110.5 s)
    never bind."""
    cost = table_cost()

    def trace():
        return [req("A", 0.0, steps=10, slo_ms=5_000, cost=cost),
                req("B", 0.5, steps=2, slo_ms=1_000, cost=cost)]

    res = run("slo", trace(), cost, forecast=False)
    assert finish_times(res) == {"A": 10.0, "B": 12.0}
    res = run("slo", trace(), cost, forecast=False, late_rank="remaining")
    assert finish_times(res) == {"A": 12.0, "B": 3.0}


def test_slo_decodes_a_lost_late_request_before_late_steps_by_hand():
    """Issue 13 (session 11): ``late_decodes_first`` grants a pending late decode its tiles
    before a plan that runs only requests past saving. L1 (2 steps, decode 2 s in 4 tiles,
    due 1) arrives at 0, L2 (6 steps, due 1.5) at 0.5: both late at once, lane [L1, L2];
    L1's steps run 0–2. Default: L2 steps from 2 and L1's late decode waits for its
    ``late_share`` credit (1/9 s per s of loop, a 0.5-s tile at 2 + 4.5): its first tile
    runs after L2's step at 7 (7–7.5), L2's last step 7.5–8.5, then with no step planned
    L1's three tiles 8.5–10 and L2's decode 10–12. With the option the plan at 2 ([L2],
    past saving) grants L1's 2 s of tiles (the lane is [L2], given up at 1 and promised
    max(1.5 + 3 · 1, 1 + (3 + 8) / 0.1) = 111 s: far): L1 decodes 2–4, L2 steps 4–10 and
    decodes 10–12."""
    cost = tiled_cost()

    def trace():
        return [req("L1", 0.0, steps=2, slo_ms=1_000, cost=cost),
                req("L2", 0.5, steps=6, slo_ms=1_000, cost=cost)]

    finish = {}
    for first in (False, True):
        pol = make_policy("slo", cost, forecast=False, late_decodes_first=first)
        finish[first] = finish_times(simulate(trace(), pol, decode="tiled"))
    assert finish[False] == {"L1": pytest.approx(10.0), "L2": pytest.approx(12.0)}
    assert finish[True] == {"L1": pytest.approx(4.0), "L2": pytest.approx(12.0)}
