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
