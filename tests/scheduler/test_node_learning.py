"""What a node policy learns from measured jobs: step factors per shape class and degree,
encode factors, and packing judged in the profile's units. Hand-computed on the round-number
profile of ``node_factories`` (512² = 1,024 tokens steps in 1 s, 1024² = 4,096 in 4 s;
perfect speed-up at degree 2 for 1024², none for 512²)."""

import pytest
from node_factories import by_id, node_cost, run
from sched_factories import req

from ditmem.scheduler.node.cost import NodeCost
from ditmem.scheduler.node.policies import make_node_policy
from ditmem.scheduler.node.simulator import simulate_node
from ditmem.scheduler.node.topology import Node
from ditmem.scheduler.noise import TimingNoise

M = "qwen-image"


def _teach(nc: NodeCost, tokens: list[int], degree: int, factor: float, times: int = 200):
    for _ in range(times):
        nc.observe_step(M, tokens, degree, 2, 2 * nc.base_step_time(M, tokens, degree) * factor)


def test_each_class_and_degree_keeps_its_own_factor():
    """A real node's drift (session 11): small steps slower than large ones, degree 2 slower
    than degree 1. One factor per model would price both classes at a blend."""
    nc = node_cost()
    _teach(nc, [1024], 2, 1.3)
    _teach(nc, [4096], 2, 1.1)
    assert nc.step_time(M, [1024], 2) == pytest.approx(1.0 * 1.3, 1e-3)
    assert nc.step_time(M, [4096], 2) == pytest.approx(2.0 * 1.1, 1e-3)
    assert nc.alone_step(req("a", size=512), 2) == pytest.approx(1.3, 1e-3)
    # an unmeasured class at a measured degree: the degree's factor (last fed: 1.1)
    assert nc.step_time(M, [16384], 2) / nc.base_step_time(M, [16384], 2) == pytest.approx(
        1.1, 1e-2)
    # an unmeasured degree: the model's factor
    assert nc.step_correction(M, [1024], 1) == pytest.approx(nc.correction(M))
    # the profile's units are untouched
    assert nc.base_step_time(M, [4096], 2) == pytest.approx(2.0)
    assert nc.base_alone_step(req("a", size=1024), 1) == pytest.approx(4.0)


def test_encodes_learn_their_factor_from_a_job_spread_over_its_group():
    """Three 0.5-s encodes on a degree-2 group: round-robin loads 1.0 / 0.5 s, predicted
    1.0 s; measured 2.4 s is a factor 2.4."""
    nc = node_cost(encode_s=0.5)
    r = req("a", size=512)
    assert nc.encode_time(r) == pytest.approx(0.5)
    for _ in range(200):
        nc.observe_encode([r, req("b", size=512), req("c", size=512)], 2, 2.4)
    assert nc.encode_time(r) == pytest.approx(0.5 * 2.4, 1e-3)
    assert nc.remaining(r, 0, 1) == pytest.approx(4 * 1.0 + 0.5 * 2.4, 1e-3)
    nc.observe_encode([], 2, 1.0)  # nothing to learn from
    nc.observe_encode([r], 1, float("nan"))
    assert nc.encode_time(r) == pytest.approx(1.2, 1e-3)


def test_a_simulated_node_learns_drift_in_encodes_and_classes():
    """The simulator's truth drifts by kind and class (encodes ×2.4, 512² steps ×1.3, 1024²
    steps ×1.1); after a run the policy's model has learned each."""
    nc = node_cost(encode_s=0.2)
    node = Node(2, nc.links)
    pol = make_node_policy("slo", nc, node)
    trace = [req(f"r{i}", 3.0 * i, size=512 if i % 2 else 1024, steps=4, slo_ms=60_000)
             for i in range(40)]
    noise = TimingNoise(0.0, 0.0, 0, {"encode": 1.4, "step:512x512": 0.3,
                                      "step:1024x1024": 0.1})
    simulate_node(trace, pol, node, noise=noise)
    # 40 encodes at alpha 0.1: 98.5 % of the way from 1 to 2.4
    assert nc.encode_time(req("x", size=512)) == pytest.approx(0.2 * 2.4, rel=0.02)
    assert nc.step_correction(M, [1024], 1) == pytest.approx(1.3, 1e-3)
    assert nc.step_correction(M, [4096], 1) == pytest.approx(1.1, 1e-3)


def test_a_join_is_judged_in_the_profiles_units():
    """Two 1024² requests on one device; the profile prices the pair at 7.7 s (a joiner
    adds 3.7 s = 0.925 of its step: less than the 10 % gain ``min_gain`` asks). Teach the
    node that pairs run ×0.8 of the profile and singles ×1.0: in learned units the join
    looks like a 23 % saving (6.16 s vs 4 s + 4 s), but the factors are the device's drift,
    not a packing gain: no join. X alone 0-16, Y 16-32."""
    nc = node_cost(batch_points=[{"tokens": 4096, "batch": 2, "seconds": 7.7}])
    _teach(nc, [4096, 4096], 1, 0.8)
    _teach(nc, [4096], 1, 1.0)
    assert nc.step_time(M, [4096, 4096], 1) - nc.step_time(M, [4096], 1) < 0.9 * 4.0
    trace = [req("x", 0.0, size=1024, steps=4, slo_ms=100_000),
             req("y", 0.0, size=1024, steps=4, slo_ms=100_000)]
    out = by_id(run(trace, "slo", 1, nc, forecast=False))
    assert (out["x"].finished, out["y"].finished) == pytest.approx((16.0, 32.0), rel=0.01)
