"""The offline bound: per-request work under the profile, Moore–Hodgson windows, and that no
policy ever beats the bound on random traces (with batching that pays)."""

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sched_factories import req, table_cost

from ditmem.scheduler import CostModel, Policy, StepPlan, make_policy
from ditmem.scheduler.bound import clairvoyant_misses, min_misses, min_work, trace_work
from ditmem.scheduler.simulator import simulate

# A 512² step costs 1.0 s alone, 1.5 s as a pair, 2.4 s as four; a 1024² step 4.0 s alone and
# 7.0 s as a pair (batching pays; a batch of 3 is not measured and so costs the sum).
BATCH_POINTS = [
    {"tokens": 1024, "batch": 2, "seconds": 1.5},
    {"tokens": 4096, "batch": 2, "seconds": 7.0},
    {"tokens": 1024, "batch": 4, "seconds": 2.4},
]


def batched_cost() -> CostModel:
    return table_cost(batch_points=BATCH_POINTS, encode_s=0.05, decode_s_per_mp=0.2)


def test_profile_share_by_hand():
    cost = batched_cost()
    # Same-shape partners only: the best is four 512² requests, 2.4 / 4 s each.
    assert cost.profile_step_share("qwen-image", 1024, 1024, 1024) == pytest.approx(0.6)
    # Alone a 1024² request takes 4.0 s. With 1024² partners: a pair 7.0 / 2, four (one
    # measured point: scaled by mean tokens) 2.4 × 4 / 4.
    assert cost.profile_step_share("qwen-image", 4096, 4096, 4096) == pytest.approx(2.4)
    # With 512² partners: a pair's mean is 2,560 tokens (log-log between 1.5 s and 7.0 s),
    # four have a mean of 1,792 tokens: 2.4 × 1.75 / 4 = 1.05 is the least.
    pair = 1.5 * (7.0 / 1.5) ** (math.log(2.5) / math.log(4)) / 2
    assert pair > 1.05
    assert cost.profile_step_share("qwen-image", 4096, 1024, 1024) == pytest.approx(1.05)
    assert cost.profile_step_share("qwen-image", 4096, 1024, 4096) == pytest.approx(1.05)
    r = req("a", steps=5, cost=cost)  # 0.05 encode + 5 × 0.6 + 0.2 × 0.262 MP decode
    assert min_work(r, cost) == pytest.approx(0.05 + 3.0 + 0.2 * 512 * 512 / 1e6)
    with pytest.raises(ValueError, match="no FLOPs bound"):
        min_work(r, cost, work="flops")
    with pytest.raises(ValueError, match="work must be"):
        min_work(r, cost, work="fastest")


def test_h200_profile_share_is_the_full_same_shape_batch_for_the_largest():
    cost = CostModel.load("h200")
    n = 16384  # 2048²: the largest, so its best partners are its own shape
    full = cost.step_time("qwen-image", [n] * 4) / 4
    assert cost.profile_step_share("qwen-image", n, 1024, n) == pytest.approx(full)
    assert cost.min_step_share("qwen-image", n) < full < cost.step_time("qwen-image", [n])


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(["table", "h200"]),
    st.lists(st.sampled_from([512, 768, 1024, 2048]), min_size=1, max_size=4),
)
def test_no_batch_costs_less_than_its_members_profile_shares(kind, sizes):
    cost = batched_cost() if kind == "table" else CostModel.load("h200")
    tokens = [(s // 16) ** 2 for s in sizes]
    lo, hi = 1024, 16384  # partner range of a trace holding 512² … 2048²
    shares = sum(cost.profile_step_share("qwen-image", n, lo, hi) for n in tokens)
    assert cost.step_time("qwen-image", tokens) >= shares - 1e-12


def test_moore_hodgson_windows_see_every_deadline():
    cost = table_cost()  # a 512² step costs 1 s, no encode or decode
    two_small = [req(f"s{i}", 0.0, steps=3, slo_ms=5_000, cost=cost) for i in range(2)]
    big = req("x", 0.0, steps=12, slo_ms=14_000, cost=cost)
    trace = two_small + [big]
    # By 5 s only one 3 s request fits; then 3 + 12 > 14: the big one misses too. The last
    # deadline alone (18 s of work in 14 s) only shows one.
    assert min_misses(trace, cost, windows="single") == 1
    assert min_misses(trace, cost) == 2
    for policy in ("fifo", "srtf", "slo"):
        misses = sum(not r.met for r in simulate(trace, make_policy(policy, cost)).records)
        assert misses >= 2, policy
    with pytest.raises(ValueError, match="windows must be"):
        min_misses(trace, cost, windows="all")


def test_profile_bound_is_at_least_the_flops_bound_on_h200():
    cost = CostModel.load("h200")
    reqs = [
        req(f"r{i}", 0.5 * i, size=s, steps=28, cost=cost)
        for i, s in enumerate([512, 1024, 2048, 512, 2048, 1024, 2048] * 3)
    ]
    profile, flops = trace_work(reqs, cost), trace_work(reqs, cost, "flops")
    assert all(profile(r) > flops(r) for r in reqs)
    assert min_misses(reqs, cost) >= min_misses(reqs, cost, work="flops") >= 1


@pytest.mark.parametrize("seed", [11, 12, 13])
def test_no_policy_beats_the_profile_bound_with_batching(seed):
    cost = batched_cost()
    rng = random.Random(seed)
    reqs = [
        req(
            f"t{seed}-{i}",
            rng.uniform(0, 50),
            size=rng.choice([512, 512, 1024]),
            steps=rng.choice([1, 2, 6]),
            priority=rng.choice([0, 1, 2]),
            cost=cost,
            scale=rng.choice([1.2, 2.0, 3.0]),
        )
        for i in range(40)
    ]
    bound = min_misses(reqs, cost)
    assert bound >= min_misses(reqs, cost, windows="single")
    batched = 0
    for policy in ("fifo", "srtf", "slo"):
        result = simulate(reqs, make_policy(policy, cost))
        batched += sum(n for b, n in result.batch_sizes.items() if b > 1)
        misses = sum(not r.met for r in result.records)
        assert misses >= bound, (policy, misses, bound)
    # Both clairvoyant schedules are feasible in the bound's relaxation: never below it.
    assert clairvoyant_misses(reqs, cost) >= bound
    assert clairvoyant_misses(reqs, cost, "profile") >= bound
    assert batched > 0  # slo packed steps: the bound held against batching


class _Lockstep(Policy):
    """Admits everything waiting and steps all started requests as one batch."""

    name = "lockstep"

    def schedule(self, now, view):
        admit = [r.id for r in view.waiting.iter_by("arrival", len(view.waiting))]
        return StepPlan(batch=[s.id for s in view.active] + admit, admit=admit)


@pytest.mark.parametrize("slack_ms, bound", [(1.0, 0), (-10.0, 1)])
def test_profile_bound_is_attained_by_a_full_batch(slack_ms, bound):
    cost = batched_cost()
    # Four 512² requests in lockstep cost exactly four profile works (encodes, ten 2.4 s
    # steps, decodes): with 1 ms to spare all meet; 10 ms short, the bound proves a miss.
    work = 4 * min_work(req("probe", steps=10, cost=cost), cost)
    reqs = [req(f"q{i}", 0.0, steps=10, slo_ms=work * 1000 + slack_ms, cost=cost) for i in range(4)]
    assert min_misses(reqs, cost) == bound
    result = simulate(reqs, _Lockstep(cost))
    assert result.batch_sizes == {4: 10}
    assert sum(not r.met for r in result.records) == 4 * bound
