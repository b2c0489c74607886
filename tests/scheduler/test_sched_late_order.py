"""slo's late work in spare time (issue 13, session 11): late requests in lane order, late
decodes on their ``late_share`` credit — hand-computed schedules. (The options measured
against them, ``late_rank="remaining"`` and ``late_decodes_first``, were not adopted and
were removed in session 17.)"""

import pytest
from sched_factories import PAGE, req, table_cost, tiled_cost, tiles_only

from ditmem.scheduler import make_policy
from ditmem.scheduler.simulator import simulate


def finish_times(result):
    return {rec.request.id: rec.finished for rec in result.records}


def run(policy, reqs, cost, **kw):
    return simulate(reqs, make_policy(policy, cost, **kw), page_bytes=PAGE)


def test_slo_runs_late_requests_in_lane_order_by_hand():
    """A (10 steps of 1 s, due 5) arrives at 0 and is late at once; B (2 steps, due 1)
    arrives at 0.5 and is late at once, given up after A: lane [A, B]. A's first step runs
    0–1. At 1 both are lost (1 + 9 > 5, 1 + 2 > 1.5): by lane order A runs on to 10 and B
    ends at 12 (flows 10, 11.5). With ``late_rank="arrival"`` the same (A is older). The
    promises (A: max(5 + 3 · 5, 0 + 10 / 0.1) = 100 s, B: max(1.5 + 3, 0.5 + 11 / 0.1) =
    110.5 s) never bind."""
    cost = table_cost()

    def trace():
        return [req("A", 0.0, steps=10, slo_ms=5_000, cost=cost),
                req("B", 0.5, steps=2, slo_ms=1_000, cost=cost)]

    res = run("slo", trace(), cost, forecast="off")
    assert finish_times(res) == {"A": 10.0, "B": 12.0}
    res = run("slo", trace(), cost, forecast="off", late_rank="arrival")
    assert finish_times(res) == {"A": 10.0, "B": 12.0}


def test_slo_decodes_a_late_request_on_its_late_share_credit_by_hand():
    """L1 (2 steps, decode 2 s in 4 tiles, due 1) arrives at 0, L2 (6 steps, due 1.5) at
    0.5: both late at once, lane [L1, L2]; L1's steps run 0–2.

    Both are the tail lane's members, whose promises count each decode right after the
    last step (session 18): L1 decodes whole 2–4, L2 steps 4–10 and decodes 10–12.

    A late decode outside the lane waits for its ``late_share`` credit instead (the plans'
    lists emptied): L2 steps from 2 and L1's decode waits for the credit (1/9 s per s of
    loop, a 0.5-s tile at 2 + 4.5): its first tile runs after L2's step at 7 (7–7.5), L2's
    last step 7.5–8.5, then with no step planned L1's three tiles 8.5–10 and L2's decode
    10–12."""
    cost = tiled_cost()

    def trace():
        return [req("L1", 0.0, steps=2, slo_ms=1_000, cost=cost),
                req("L2", 0.5, steps=6, slo_ms=1_000, cost=cost)]

    pol = make_policy("slo", cost, forecast="off")
    finish = finish_times(simulate(trace(), pol, decode="tiled"))
    assert finish == {"L1": pytest.approx(4.0), "L2": pytest.approx(12.0)}
    pol = tiles_only(make_policy("slo", cost, forecast="off"))
    finish = finish_times(simulate(trace(), pol, decode="tiled"))
    assert finish == {"L1": pytest.approx(10.0), "L2": pytest.approx(12.0)}
