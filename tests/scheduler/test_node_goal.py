"""``slo``'s latency goal for scaling requests (``goal``), hand-computed on 4 devices.

Profile (node_factories): a 1024² request steps in 4 s at degree 1, 2 s at 2 and 1.25 s at
4 (efficiency 0.8: it scales); encode and decode free; noise off. Two 1024² requests of 4
steps, X and Y, arrive together with a 60-s SLO window.
"""

import pytest
from node_factories import by_id, node_cost, run
from sched_factories import req

from ditmem.scheduler.node.policies import make_node_policy
from ditmem.scheduler.node.topology import Node


def _finish(**options) -> tuple[float, float]:
    trace = [req("x", 0.0, size=1024, steps=4, slo_ms=60_000),
             req("y", 0.0, size=1024, steps=4, slo_ms=60_000)]
    out = by_id(run(trace, "slo", 4, node_cost(), forecast=False, **options))
    return out["x"].finished, out["y"].finished


def test_default_shares_the_node_between_a_crowd_of_two():
    """Without a goal step 4 caps a crowd of two scaling requests at the degree finishing
    both soonest: degree 2 each (both at 4 × 2 = 8 s; degree 4 in turn would end at 5 and
    10 s)."""
    assert _finish() == pytest.approx((8.0, 8.0))


def test_goal_runs_the_first_at_the_least_degree_meeting_its_goal_and_the_other_after():
    """``goal=0.1``: each is due at 0 + 0.1 × 60 = 6 s. At t = 0 degree 2 misses that (4 × 2 ×
    1.1 margin = 8.8 s), degree 4 meets it (4 × 1.25 × 1.1 = 5.5 s), so both are reachable;
    X goes first (same goal, same arrival, by id) and takes all 4 devices; Y finds none
    left, and by X's first step end it has lost its goal (1.25 + 5.5 > 6). X runs 3 steps
    at degree 4 (to 3.75 s); for its last step degree 2 meets the goal (3.75 + 2 × 1.1 =
    5.95 <= 6), so X takes a pair (ends 5.75 s) and Y, lost, the other pair (one step, to
    5.75 s), then the whole node (3 × 1.25: 9.5 s). One request within its goal instead of
    none; the re-sharding moves cost well under a millisecond."""
    assert _finish(goal=0.1) == pytest.approx((5.75, 9.5), abs=2e-3)


def test_a_goal_no_request_can_reach_changes_nothing():
    """``goal=0.05`` (due at 3 s < 5.5 s at degree 4): no target by goal, so step 4 keeps its
    crowd rule: the default's 8 / 8 s."""
    assert _finish(goal=0.05) == pytest.approx(_finish())


@pytest.mark.parametrize("bad", [-0.1, 1.0])
def test_goal_out_of_range_is_a_value_error(bad):
    nc = node_cost()
    with pytest.raises(ValueError, match="goal"):
        make_node_policy("slo", nc, Node(4, nc.links), goal=bad)
