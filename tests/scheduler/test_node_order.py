"""``slo``'s order for on-time requests that are not urgent (``order_slack``), hand-computed.

Profile (node_factories): a 512² request steps in 1 s, a 1024² in 4 s at degree 1; encode
and decode free. One device, so only the order can differ.
"""

import pytest
from node_factories import by_id, node_cost, run
from sched_factories import req

from ditmem.scheduler.node.policies import make_node_policy
from ditmem.scheduler.node.topology import Node


def _trace(y_slo_s: float):
    """X: 1024², 4 steps (16 s), arrives at 0, SLO 100 s. Y: 512², 4 steps (4 s), arrives
    at 1 while X's first step runs, SLO ``y_slo_s``: due before X."""
    return [req("x", 0.0, size=1024, steps=4, slo_ms=100_000),
            req("y", 1.0, size=512, steps=4, slo_ms=y_slo_s * 1e3)]


def _finish(y_slo_s: float, **options) -> tuple[float, float]:
    out = by_id(run(_trace(y_slo_s), "slo", 1, node_cost(), forecast=False, batching=False,
                    **options))
    return out["x"].finished, out["y"].finished


def test_by_arrival_keeps_the_older_request_on_the_device():
    """At t = 4 (X's first step ends) Y has 41 − 4 − 4 = 33 s of slack, more than 0.35 of
    its 40-s window (14 s): not urgent. By arrival (``order_slack=0``) X keeps the device:
    X ends at 16, Y at 20 (due 41: met). By deadline (the default, ``order_slack=1``) Y
    goes first: Y 4-8, X 8-20."""
    assert _finish(40.0, order_slack=0.0) == pytest.approx((16.0, 20.0))
    assert _finish(40.0) == pytest.approx((20.0, 8.0))


def test_halfway_order_weighs_the_window():
    """``order_slack=0.5``: keys X 0 + 50 = 50, Y 1 + 20 = 21, so Y first: Y 4-8, X 8-20.
    With Y's SLO 200 s (key 101) X goes first: X 16, Y 20."""
    assert _finish(40.0, order_slack=0.5) == pytest.approx((20.0, 8.0))
    assert _finish(200.0, order_slack=0.5) == pytest.approx((16.0, 20.0))


def test_urgent_request_still_goes_first():
    """Y with a 10-s SLO (due 11): at t = 4 its slack is 11 − 4 − 4 = 3 s < 0.35 × 10, so it
    is urgent and is placed first whatever the order: Y 4-8 (met), X 8-20."""
    assert _finish(10.0, order_slack=0.0) == pytest.approx((20.0, 8.0))
    assert _finish(10.0) == pytest.approx((20.0, 8.0))


@pytest.mark.parametrize("bad", [-0.1, 1.5])
def test_order_slack_out_of_range_is_a_value_error(bad):
    nc = node_cost()
    with pytest.raises(ValueError, match="order_slack"):
        make_node_policy("slo", nc, Node(1, nc.links), order_slack=bad)
