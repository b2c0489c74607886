"""``tail_verdict.p99_verdict``: the demo's tail criterion settled on a hand trace."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "scheduler"))
from sched_factories import req, table_cost  # noqa: E402

pytest.importorskip("scipy", reason="the exact bound solves a MILP with scipy (bounds extra)")

from ditmem.tools.tail_verdict import describe_verdict, p99_verdict  # noqa: E402


def _trace(cost):
    # A: 4 s at 0, due 10; B: 1 s at 0, due 1.5; C: 1 s at 1, due 2.5. Unlimited: B, C, A,
    # none late. A P99 of 5 s on 3 flows (rank 1.98) needs the largest flow ≤ ~5.01 s, so A
    # ends by 5.01 and B, C, A need 6 s by then: one of B, C is late.
    return [req("A", 0.0, steps=4, slo_ms=10_000, cost=cost),
            req("B", 0.0, steps=1, slo_ms=1_500, cost=cost),
            req("C", 1.0, steps=1, slo_ms=1_500, cost=cost)]


def test_a_tight_fifo_p99_forbids_the_criterion():
    cost = table_cost(seconds_1024=1.0)
    v = p99_verdict(_trace(cost), cost, 5.0)
    assert v["clairvoyant_misses"] == 0 and v["p99_lower_misses"] == 1 and v["forbidden"]
    assert "FORBIDDEN" in describe_verdict(v)


def test_a_loose_fifo_p99_leaves_room_and_an_impossible_one_is_said_so():
    cost = table_cost(seconds_1024=1.0)
    v = p99_verdict(_trace(cost), cost, 100.0)
    assert v["p99_lower_misses"] == 0 and not v["forbidden"]
    assert "not forbidden" in describe_verdict(v)
    v = p99_verdict(_trace(cost), cost, 0.5)  # every flow is at least 1 s
    assert v["p99_lower_misses"] is None and v["forbidden"]
    assert "no schedule keeps that P99" in describe_verdict(v)
    with pytest.raises(ValueError, match="fifo_p99_s"):
        p99_verdict(_trace(cost), cost, 0.0)


def test_the_node_p95_target_on_two_large_requests():
    from node_factories import node_cost

    from ditmem.tools.tail_verdict import describe_node_verdict, p95_node_verdict

    # two 1024² (4 steps of 4 s, 2 s at degree 2) at 0 on a pair, due at 16 s: 32 device-s.
    # P95 of 2 flows (rank 0.95) ≤ 12 s needs both by ~12.2 s: 24.4 device-s of room, none
    # keeps it; ≤ 17 s: both on time.
    cost = node_cost().cost
    trace = [req(i, 0.0, size=1024, steps=4, slo_ms=16_000, cost=cost) for i in "ab"]
    tight = p95_node_verdict(trace, cost, 2, 12.0, 0.99)
    assert tight["p95_lower_misses"] is None and tight["forbidden"]
    assert "no schedule keeps that P95" in describe_node_verdict(tight)
    loose = p95_node_verdict(trace, cost, 2, 17.0, 0.99)
    assert loose["p95_lower_misses"] == 0 and not loose["forbidden"]
    assert "not forbidden" in describe_node_verdict(loose)
