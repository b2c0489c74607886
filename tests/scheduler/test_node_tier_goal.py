"""``slo``'s per-tier goal measured at run time (``tier_goal``), hand-computed.

Profile (node_factories): a 1024² request steps in 4 s at degree 1, 2 s at 2 and 1.25 s at
4 (efficiency 0.8: it scales); a 512² in 1 s; encode and decode free; noise off.
"""

import pytest
from node_factories import by_id, node_cost, run
from sched_factories import req

from ditmem.scheduler.node.policies import make_node_policy
from ditmem.scheduler.node.policies.tier_goal import TierGoals, tier_of
from ditmem.scheduler.node.topology import Node


def _seen(goals: TierGoals, n512: int, n1024: int, n2048: int = 0) -> dict[int, str]:
    """Count arrivals per tier (standalone 1, 4, 16 s); one id of each tier by size."""
    ids = {}
    for size, n, alone in ((512, n512, 1.0), (1024, n1024, 4.0), (2048, n2048, 16.0)):
        for i in range(n):
            r = req(f"{size}-{i}", float(i), size=size, steps=4)
            goals.see(r, alone)
            ids.setdefault(size, r.id)
    return ids


def test_the_percentile_lies_in_the_largest_tier_at_its_own_quantile():
    """seed-mix's shares 0.6 / 0.3 / 0.1: the P95 (tail 0.05) is in the 2048² tier, at its
    1 - 0.05 / 0.1 = 0.5 quantile (its median); 8 : 2 with no 2048²: the 1024² tier at
    1 - 0.05 / 0.2 = 0.75."""
    g = TierGoals()
    _seen(g, 6, 3, 1)
    t, q = g.position()
    assert t[1] == 2048 and q == pytest.approx(0.5)
    g = TierGoals()
    _seen(g, 8, 2)
    t, q = g.position()
    assert t[1] == 1024 and q == pytest.approx(0.75)
    # a top tier under the tail share (1 of 40): the P95 is in the next one, at
    # 1 - (0.05 - 0.025) / (3 / 40) = 2/3
    g = TierGoals()
    _seen(g, 36, 3, 1)
    t, q = g.position()
    assert t[1] == 1024 and q == pytest.approx(2 / 3)


def test_goal_is_the_measured_quantile_of_that_tier_over_its_window():
    """20 : 5 (the 0.75 quantile of the 1024² tier): no goal before 5 of them finished;
    latencies 10, 20, 30, 40, 50 s give the 4th (index int(0.75 × 5) = 3): 40 s; with a
    window of 3 (30, 40, 50; a goal from 3 finished) index int(0.75 × 3) = 2: 50 s. Other
    tiers have none."""
    for window, want in ((100, 40.0), (3, 50.0)):
        g = TierGoals(window=window)
        _seen(g, 20, 0)
        big = [req(f"b{i}", 0.0, size=1024, steps=4) for i in range(5)]
        for r in big:
            g.see(r, 4.0)
        for i, r in enumerate(big[:4]):
            g.finished(r.id, 10.0 * (i + 1))
        if window >= 5:
            assert g.goals() == {}
        g.finished(big[4].id, 50.0)
        assert g.goals() == {tier_of(big[0]): want}


def _pairs_then_xy(**options) -> tuple[float, float]:
    """Three warm-up pairs of 1024² (4 steps, 60-s window) at 0, 20 and 40 s, then X and Y
    at 60 s; X's and Y's latencies."""
    trace = []
    for k, t in enumerate((0.0, 20.0, 40.0)):
        trace += [req(f"w{k}a", t, size=1024, steps=4, slo_ms=60_000),
                  req(f"w{k}b", t, size=1024, steps=4, slo_ms=60_000)]
    trace += [req("x", 60.0, size=1024, steps=4, slo_ms=60_000),
              req("y", 60.0, size=1024, steps=4, slo_ms=60_000)]
    out = by_id(run(trace, "slo", 4, node_cost(), forecast=False, **options))
    for k in range(3):  # no goal yet (< 5 finished): the crowd rule, degree 2 each, 8 s
        assert out[f"w{k}a"].latency == pytest.approx(8.0, abs=2e-3)
    return out["x"].latency, out["y"].latency


def test_default_runs_the_pair_at_degree_two():
    assert _pairs_then_xy() == pytest.approx((8.0, 8.0), abs=2e-3)


def test_measured_goal_serves_the_one_that_can_reach_it_first():
    """One tier, so the P95 is its 0.95 quantile; six latencies of 8 s: goal 8 s, X and Y
    due at 68. At 60 degree 2 misses (4 × 2 × 1.1 = 8.8 s), degree 4 meets it (5.5 s): X
    (by id) takes the quad, Y has none left. At 61.25 degree 2 meets X's goal (3 × 2 × 1.1:
    67.85 <= 68), so X takes a pair and Y (its goal reachable only at degree 4, no quad
    left: lost) the other pair through 67.25, when X ends (7.25 s); Y's last step at 4
    (68.5: 8.5 s). The default (above): 8 and 8."""
    x, y = _pairs_then_xy(tier_goal=True)
    assert (x, y) == pytest.approx((7.25, 8.5), abs=2e-3)


@pytest.mark.parametrize(
    "bad", [{"tier_goal_percentile": 0.0}, {"tier_goal_percentile": 100.0},
            {"tier_goal_window": 0}])
def test_bad_tier_goal_settings_are_value_errors(bad):
    nc = node_cost()
    name = "percentile" if "tier_goal_percentile" in bad else "window"
    with pytest.raises(ValueError, match=name):
        make_node_policy("slo", nc, Node(4, nc.links), tier_goal=True, **bad)


def _gated(span: float) -> dict:
    """20 512² (1 s alone) and 5 1024² (4 s alone, 2 × 2.4 = 4.8 device-s at degree 2)
    arriving over ``span`` seconds on an 8-device node; five 1024² finished in 10 s each."""
    g = TierGoals(devices=8)
    for i in range(20):
        g.see(req(f"s{i}", span * i / 19, size=512, steps=4), 1.0, 2.0)
    big = [req(f"b{i}", span * i / 4, size=1024, steps=4) for i in range(5)]
    for r in big:
        g.see(r, 4.0, 4.8)
    for r in big:
        g.finished(r.id, r.arrival + 10.0)
    return g


def test_the_goal_closes_when_the_measured_load_leaves_no_room_for_its_tier_wide():
    """Load with the 1024² tier at degree 2: (20 × 1 + 5 × 4.8) / span = 44 / span devices.
    Over 10 s: 4.4 <= 8, the goal is given (10 s); over 5 s: 8.8 > 8, none (at degree 1
    it would be (20 + 20) / 5 = 8: the gate counts the wider work, not the plain load)."""
    g = _gated(10.0)
    assert g.load(tier_of(req("b", 0.0, size=1024, steps=4))) == pytest.approx(4.4)
    assert list(g.goals().values()) == [10.0]
    g = _gated(5.0)
    assert g.load(tier_of(req("b", 0.0, size=1024, steps=4))) == pytest.approx(8.8)
    assert g.load() == pytest.approx(8.0)
    assert g.goals() == {}
