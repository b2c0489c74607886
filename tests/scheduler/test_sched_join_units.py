"""``slo`` judges a batch join in the profile's units, not in the online corrections'.

The corrections are learned per half-octave of a step's total tokens. Hand case: 512² steps
take 1 s and 1024² steps 4 s in the profile, and a mixed [512², 1024²] step is their sum,
5 s (no gain). The device was then seen running the mixed class (5,120 tokens) at 0.6 × and
the two shapes alone at 1.0 ×: learned, the mixed step costs 3.0 s, so a 1024² joining a
512² step looks 2.0 s dearer where 0.9 × its own 4 s is allowed — a fake 50 % gain (on the
real demo this packed 256² requests with 1024² ones and they missed). The join must be
refused: the profile says the step grows by its full 4 s.
"""

import pytest
from sched_factories import HandEngine, req, table_cost

from ditmem.scheduler import make_policy
from ditmem.scheduler.plan import StepReport

M = "qwen-image"


def _learned_cost():
    cost = table_cost(seconds_1024=1.0, seconds_4096=4.0)
    for tokens, ratio in (([1024, 4096], 0.6), ([1024], 1.0), ([4096], 1.0)):
        for _ in range(60):
            base = cost.base_step_time(M, tokens)
            cost.observe(StepReport(now=0.0, batch=[f"x{i}" for i in range(len(tokens))],
                                    model=M, tokens=tokens, step_s=ratio * base))
    return cost


def test_the_corrections_alone_would_make_the_mixed_step_look_cheap():
    cost = _learned_cost()
    assert cost.base_step_time(M, [1024, 4096]) == pytest.approx(5.0)
    assert cost.step_time(M, [1024]) == pytest.approx(1.0, rel=1e-3)
    assert cost.step_time(M, [4096]) == pytest.approx(4.0, rel=1e-3)
    assert cost.step_time(M, [1024, 4096]) == pytest.approx(3.0, rel=1e-2)


def test_a_large_request_does_not_join_a_small_ones_step_on_a_learned_fake_gain():
    cost = _learned_cost()
    eng = HandEngine(cost)
    big = req("big", 0.0, size=1024, steps=4, cost=cost)
    eng.start(big, steps_done=1)
    small = eng.arrive(req("small", 1.0, size=512, steps=4, cost=cost))
    plan = make_policy("slo", cost).schedule(1.0, eng.view())
    assert plan.batch == [small.id]


def test_a_join_the_profile_prices_as_a_gain_still_happens():
    # two 512² requests: the profile's batch of 2 costs 1.5 s (a 25 % gain on the joiner)
    cost = table_cost(seconds_1024=1.0, seconds_4096=4.0,
                      batch_points=[{"tokens": 1024, "batch": 2, "seconds": 1.5}])
    eng = HandEngine(cost)
    a = eng.arrive(req("a", 0.0, size=512, steps=4, cost=cost))
    b = eng.arrive(req("b", 0.0, size=512, steps=4, cost=cost))
    plan = make_policy("slo", cost).schedule(0.0, eng.view())
    assert sorted(plan.batch) == sorted([a.id, b.id])


def _learned_mixed_gain_cost():
    # the profile prices the mixed [512², 1024²] step at 4.5 s (batch-2 point at the mean
    # size: a 0.5-s gain on the two apart, 5 s), so a 1024² may join a 512² step (it adds
    # 3.5 s <= 0.9 x its own 4 s); the mixed class was then seen at 0.6 x: learned 2.7 s,
    # shorter than the 1024² alone (4 s, its class seen at 1.0 x)
    cost = table_cost(seconds_1024=1.0, seconds_4096=4.0,
                      batch_points=[{"tokens": 2560, "batch": 2, "seconds": 4.5}])
    for tokens, ratio in (([1024, 4096], 0.6), ([1024], 1.0), ([4096], 1.0)):
        for _ in range(60):
            base = cost.base_step_time(M, tokens)
            cost.observe(StepReport(now=0.0, batch=[f"x{i}" for i in range(len(tokens))],
                                    model=M, tokens=tokens, step_s=ratio * base))
    assert cost.base_step_time(M, [1024, 4096]) == pytest.approx(4.5)
    assert cost.step_time(M, [1024, 4096]) == pytest.approx(2.7, rel=1e-2)
    assert cost.step_time(M, [4096]) == pytest.approx(4.0, rel=1e-3)
    return cost


@pytest.mark.parametrize("slo_ms, joins", [(6_000, False), (8_000, True)])
def test_a_packed_step_is_never_predicted_shorter_than_the_joiners_own(slo_ms, joins):
    # small (4 x 1-s steps) is the head; after a packed step of T s it has 3 s of steps
    # left: at 2.7 s it would finish at 5.7 s, but the step takes at least big's own 4 s:
    # 7 s. Due at 6 s, big must not join; due at 8 s, it may.
    cost = _learned_mixed_gain_cost()
    eng = HandEngine(cost)
    small = eng.arrive(req("small", 0.0, size=512, steps=4, slo_ms=slo_ms, cost=cost))
    big = eng.arrive(req("big", 0.0, size=1024, steps=4, slo_ms=100_000, cost=cost))
    plan = make_policy("slo", cost).schedule(0.0, eng.view())
    assert plan.batch == ([small.id, big.id] if joins else [small.id])


def test_the_lanes_iteration_length_counts_a_packed_step_as_its_longest_member():
    from ditmem.scheduler.plan import StepPlan
    from ditmem.scheduler.policies.tail_lane import plan_seconds

    cost = _learned_mixed_gain_cost()
    eng = HandEngine(cost)
    eng.arrive(req("small", 0.0, size=512, cost=cost))
    eng.arrive(req("big", 0.0, size=1024, cost=cost))
    seconds = plan_seconds(cost, eng.view(), {}, StepPlan(batch=["small", "big"]))
    assert seconds == pytest.approx(4.0, rel=1e-3)  # big alone; the learned mix says 2.7
