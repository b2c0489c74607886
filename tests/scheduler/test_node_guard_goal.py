"""slo's FIFO promise beside its latency goal on a node (step 0 with step 4's ``goal``,
scheduler/node/policies/slo.py): a critical request that can still reach its goal runs at
its goal degree. Hand-computed on the node factory's round-number profile (1024² steps
4 s at degree 1, 2 s at degree 2; 512² steps 1 s at any degree), noise-free."""

import pytest
from node_factories import node_cost, run
from sched_factories import req


def _pair(nc):
    """A 1024² (4 steps: 16 s alone, 8 s at degree 2; SLO 48 s) and a 512² (8 steps: 8 s;
    SLO 24 s), both at 0. FIFO on two degree-1 replicas finishes them at 16 and 8 s, so
    both are promised 16 s (the running maximum FIFO flow)."""
    return [req("L", 0, size=1024, steps=4, cost=nc.cost),
            req("S", 0, size=512, steps=8, cost=nc.cost)]


def _finished(result):
    return {r.request.id: r.finished for r in result.records}


def test_a_critical_request_with_a_reachable_goal_runs_at_its_goal_degree():
    nc = node_cost()
    # Guard alone: L is critical from t = 0 (its promise, 16 s, is its whole time at
    # degree 1), so it runs at the least degree keeping it — 1 — beside S; once S ends at
    # 8 s the free device doubles L's group (step 7): two steps at degree 2, L at 12 s
    # (and the half millisecond its re-sharding takes).
    out = _finished(run(_pair(nc), "slo", 2, nc, forecast=False, guard=True))
    assert out["L"] == pytest.approx(12.0, abs=1e-3)
    assert out["S"] == pytest.approx(8.0)
    # With goal 0.2 (finish by 0.2 × 48 = 9.6 s: at each of its step boundaries 0, 2, 4 s
    # degree 2 still does with the 10 % margin, degree 1 does not) the critical L runs at
    # its goal degree on both devices and ends at 8 s, within its promise; S is not urgent
    # before 7.6 s (slack under 0.35 × 24 s), so it waits and runs 8-16 s, inside its
    # 24-s deadline.
    out = _finished(run(_pair(nc), "slo", 2, nc, forecast=False, guard=True, goal=0.2))
    assert out["L"] == pytest.approx(8.0)
    assert out["S"] == pytest.approx(16.0, abs=1e-3)
