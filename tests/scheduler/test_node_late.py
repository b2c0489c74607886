"""How ``slo`` runs late requests on a node, hand-computed on the round-number profile
(``node_factories``: a 512² step 1 s at any degree, a 1024² step 4 s at degree 1 and 2 s at
degree 2; encode and decode free).

L, a 512² of 4 steps, is late on arrival (its SLO window is shorter than its 4 s of work);
B, B1 and B2 are 1024² of 4 steps with long windows.
"""

import pytest
from node_factories import by_id, run
from sched_factories import req


def test_by_default_a_late_request_waits_behind_on_time_work():
    """Two devices; B1 and B2 (due at 100 and 102 s) each run at degree 1 and take both
    devices (two requests that scale finish no sooner at degree 2 one after the other). L
    (SLO 1 s) waits behind them until it starves (10 SLO windows past its deadline, 11 s):
    it starts at 12 s, after three of their steps."""
    trace = [req("b1", 0.0, size=1024, steps=4, slo_ms=100_000),
             req("b2", 0.0, size=1024, steps=4, slo_ms=102_000),
             req("l", 0.0, size=512, steps=4, slo_ms=1_000)]
    out = by_id(run(trace, "slo", 2, forecast=False))
    assert out["l"].started == pytest.approx(12.0, abs=0.05)
    assert out["l"].finished > 16.0


def test_by_default_a_late_request_rides_a_larger_step():
    """One device. B (100 s) and L (SLO 3 s: it starves only at 33 s). The profile prices
    the pair's step at 4 s (a batch-2 point: 4 s at 2,560 tokens, a 0.8 gain), the same as
    B alone: L joining B's step costs B nothing, so L joins B's 4-s steps: both 0–16 s
    (each of L's steps takes 4 s, not its own 1 s)."""
    from node_factories import node_cost

    nc = node_cost(batch_points=[{"tokens": 2560, "batch": 2, "seconds": 4.0}])
    trace = [req("b", 0.0, size=1024, steps=4, slo_ms=100_000),
             req("l", 0.0, size=512, steps=4, slo_ms=3_000)]
    out = by_id(run(trace, "slo", 1, nc, forecast=False))
    assert (out["b"].finished, out["l"].finished) == pytest.approx((16.0, 16.0))


def test_a_request_that_cannot_make_it_alone_does_not_hold_back_the_others_last_steps():
    """The decode guard holds a last step back when it would leave no device for the tightest
    slack seen. A request whose SLO window is shorter than its work alone (L: 3 s for 4 s;
    a client may send such an ``slo_ms``) has no slack to protect: it must not make the guard
    hold back B1's and B2's last steps (L starves only at 33 s, so it does not go first by
    that rule). Without L they end at 16 s; with it, the same, and L (late) runs after them
    (before the fix their last steps were held back at 12 s, L took both devices, and they
    ended at 18 and 20 s)."""
    trace = [req("b1", 0.0, size=1024, steps=4, slo_ms=100_000),
             req("b2", 0.0, size=1024, steps=4, slo_ms=100_000)]
    alone = by_id(run(list(trace), "slo", 2, forecast=False))
    both = by_id(run(trace + [req("l", 0.0, size=512, steps=4, slo_ms=3_000)], "slo", 2,
                     forecast=False))
    assert alone["b1"].finished == pytest.approx(16.0)
    assert alone["b2"].finished == pytest.approx(16.0)
    assert both["b1"].finished == pytest.approx(16.0)
    assert both["b2"].finished == pytest.approx(16.0)
    assert both["l"].started >= 16.0 - 1e-9
