"""The proportional split (``work="proportional"``): a packed step's time shared among its
members in proportion to their batch-1 step times. Checked by hand, against a brute-force
search over the schedules of encodes, whole packed steps and tiled decodes on tiny traces
(never beaten; equal to it on cases built to be tight; ``best_schedule`` says which
schedules it leaves out), and against the equal-split profile share it tightens."""

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sched_factories import req, table_cost

from ditmem.scheduler import CostModel, make_policy
from ditmem.scheduler.bound import (
    clairvoyant_flows,
    clairvoyant_misses,
    min_misses,
    min_misses_packed,
    packed_step_ratio,
    trace_work,
)
from ditmem.scheduler.simulator import simulate
from ditmem.scheduler.tail_bound import min_misses_tail

# A 512² step (1,024 tokens) costs 1.0 s alone, 1.5 s as a pair, 2.4 s as four (one measured
# point for four: scaled by the mean tokens); a 1024² step (4,096 tokens) 4.0 s alone and
# 7.0 s as a pair. A batch of 3 is not measured and costs the sum of its members alone.
BATCH_POINTS = [
    {"tokens": 1024, "batch": 2, "seconds": 1.5},
    {"tokens": 4096, "batch": 2, "seconds": 7.0},
    {"tokens": 1024, "batch": 4, "seconds": 2.4},
]
ENCODE, DECODE_PER_MP = 0.05, 0.2


def cost_model():
    return table_cost(batch_points=BATCH_POINTS, encode_s=ENCODE, decode_s_per_mp=DECODE_PER_MP)


def decode_s(size: int) -> float:
    return DECODE_PER_MP * size * size / 1e6


def test_ratio_by_hand():
    cost = cost_model()
    # Same-shape 512² partners: a pair 1.5 / 2 = 0.75, four 2.4 / 4 = 0.6.
    assert packed_step_ratio(cost, "qwen-image", 1024, [1024]) == pytest.approx(0.6)
    # Among 1024² requests: a pair 7.0 / 8.0; four (the one batch-4 point scaled by tokens:
    # 2.4 × 4 = 9.6 s) 9.6 / 16 = 0.6.
    assert packed_step_ratio(cost, "qwen-image", 4096, [4096]) == pytest.approx(0.6)
    assert cost.step_time("qwen-image", [4096, 4096]) / 8.0 == pytest.approx(7.0 / 8.0)
    # One 1024² with three 512²: four members of 1,792 tokens on average, 2.4 × 1792 / 1024 =
    # 4.2 s (above the 4.0 s of the 1024² alone), against 4 + 3 × 1 = 7 s alone: 0.6.
    # A 1024² with one 512²: mean 2,560 tokens, the pair curve log-log between 1.5 s at 1,024
    # and 7.0 s at 4,096, i.e. 1.5 · (7 / 1.5)^(log 2.5 / log 4), against 4 + 1 alone.
    pair = 1.5 * (7.0 / 1.5) ** (math.log(2.5) / math.log(4)) / 5.0
    assert pair > 0.6
    assert packed_step_ratio(cost, "qwen-image", 4096, [1024, 4096]) == pytest.approx(0.6)
    # No batch pays: 1.
    flat = table_cost()
    assert packed_step_ratio(flat, "qwen-image", 1024, [1024, 4096]) == 1.0


def test_work_by_hand_against_the_equal_split():
    cost = cost_model()
    big, small = req("b", size=1024, steps=5, cost=cost), req("s", size=512, steps=5, cost=cost)
    work = trace_work([big, small], cost, "proportional")
    # 5 steps at 4.0 × 0.6 = 2.4 s: the 1024² pays its share of the 4.2-s step it runs in.
    assert work(big) == pytest.approx(ENCODE + 5 * 2.4 + decode_s(1024))
    assert work(small) == pytest.approx(ENCODE + 5 * 0.6 + decode_s(512))
    # The equal split (profile share) charges the 1024² only a quarter of a 4.2-s step:
    # 1.05 s, though it waits for the whole step.
    profile = trace_work([big, small], cost, "profile")
    assert profile(big) == pytest.approx(ENCODE + 5 * 1.05 + decode_s(1024))
    with pytest.raises(ValueError, match="work must be one of"):
        min_misses([big], cost, work="shared")


def test_too_many_batches_is_refused():
    cost = table_cost(max_batch=64)
    with pytest.raises(ValueError, match="batches of up to 64"):
        packed_step_ratio(cost, "qwen-image", 1024, list(range(1000, 1100)))


# ---- a brute-force optimum over schedules of whole operations --------------------------


DECODE_PARTS = 2  # a decode may run as two tiles with other work between them


def best_schedule(trace, cost, max_flow=math.inf, tail_flow=math.inf, exempt=0):
    """The fewest misses over every schedule that runs operations one at a time, each as
    early as its predecessor and its request's arrival allow (semi-active schedules, which
    hold an optimum of any count of misses): an encode of an arrived request, a packed step
    of any subset (up to ``max_batch``) of the encoded requests with steps left, and a
    decode after a request's last step, in ``DECODE_PARTS`` tiles that other operations may
    come between (tiled decodes). Only the schedules keeping every flow ≤ ``max_flow`` and
    at most ``exempt`` above ``tail_flow`` count (None when there is none). Still a
    restricted class — no pause inside a step (block chunks) and no decode beside a step
    (the decode worker) — so its optimum is ≥ the true one and the bound must stay ≤ it."""
    model = trace[0].model
    limit = cost.max_batch(model)
    n = len(trace)
    tokens = [cost.tokens(r) for r in trace]
    enc = [cost.encode_time(r) for r in trace]
    dec = [cost.decode_time(r) / DECODE_PARTS for r in trace]
    best = [None]
    seen: dict[tuple, float] = {}  # a state reached again no sooner is no better

    def score(finish):
        flows = [finish[i] - trace[i].arrival for i in range(n)]
        if max(flows) > max_flow + 1e-9 or sum(f > tail_flow + 1e-9 for f in flows) > exempt:
            return None
        return sum(finish[i] > trace[i].deadline + 1e-9 for i in range(n))

    def go(now, left, encoded, tiles, finish):
        key = (tuple(left), tuple(encoded), tuple(tiles), tuple(finish))
        if seen.get(key, math.inf) <= now + 1e-12:
            return
        seen[key] = now
        late = sum((f if f is not None else now) > trace[i].deadline + 1e-9
                   for i, f in enumerate(finish))
        if best[0] is not None and late >= best[0]:
            return  # no better from here
        flows = [(f if f is not None else max(now, trace[i].arrival)) - trace[i].arrival
                 for i, f in enumerate(finish)]
        if max(flows) > max_flow + 1e-9 or sum(f > tail_flow + 1e-9 for f in flows) > exempt:
            return  # the limits are broken already
        if all(f is not None for f in finish):
            s = score(finish)
            if s is not None and (best[0] is None or s < best[0]):
                best[0] = s
            return
        for i in range(n):  # an encode
            if not encoded[i]:
                t = max(now, trace[i].arrival) + enc[i]
                go(t, left, encoded[:i] + [True] + encoded[i + 1:], tiles, finish)
        for i in range(n):  # a decode tile
            if left[i] == 0 and finish[i] is None:
                t = now + dec[i]
                more = tiles[:i] + [tiles[i] - 1] + tiles[i + 1:]
                done = finish[:i] + [t] + finish[i + 1:] if more[i] == 0 else finish
                go(t, left, encoded, more, done)
        open_ = [i for i in range(n) if left[i] > 0 and encoded[i]]
        for mask in range(1, 1 << len(open_)):
            members = [open_[k] for k in range(len(open_)) if mask >> k & 1]
            if len(members) > limit:
                continue
            t = now + cost.step_time(model, [tokens[i] for i in members])
            new_left = [x - 1 if i in members else x for i, x in enumerate(left)]
            go(t, new_left, encoded, tiles, finish)

    go(0.0, [r.steps for r in trace], [False] * n, [DECODE_PARTS] * n, [None] * n)
    return best[0]


def _trace(cost, jobs):
    return [req(f"r{k}", a, size=size, steps=steps, slo_ms=1000 * slack, cost=cost)
            for k, (a, size, steps, slack) in enumerate(jobs)]


JOBS = st.lists(
    st.tuples(st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.0]), st.sampled_from([512, 1024]),
              st.integers(1, 2), st.sampled_from([1.5, 2.5, 4.0, 6.0, 9.0])),
    min_size=1, max_size=4,
).filter(lambda jobs: sum(s for _, _, s, _ in jobs) <= 6)


@settings(max_examples=40, deadline=None)
@given(JOBS)
def test_the_bound_is_never_above_the_brute_force_optimum(jobs):
    cost = cost_model()
    trace = _trace(cost, jobs)
    best = best_schedule(trace, cost)
    assert min_misses(trace, cost, work="proportional") <= best
    # the batch-1 time is never below the proportional work (ρ ≤ 1)
    assert (min_misses(trace, cost, work="proportional")
            <= min_misses_tail([trace], cost, math.inf, 1e9, 0, work="standalone"))


@settings(max_examples=40, deadline=None)
@given(JOBS, st.sampled_from([3.0, 5.0, 8.0]), st.sampled_from([1.0, 1.5, math.inf]),
       st.integers(0, 2))
def test_the_joint_bound_is_never_above_the_brute_force_optimum(jobs, tail_flow, stretch,
                                                                 exempt):
    cost = cost_model()
    trace = _trace(cost, jobs)
    max_flow = tail_flow * stretch
    best = best_schedule(trace, cost, max_flow, tail_flow, exempt)
    try:
        bound = min_misses_tail([trace], cost, max_flow, tail_flow, exempt, work="proportional")
    except ValueError:
        assert best is None  # the bound says no schedule keeps the limits: none does
        return
    if best is not None:
        assert bound <= best


def _tight_case(slack):
    """One 1024² and three 512², all at 0, 2 steps each, due ``slack`` s after arrival."""
    cost = cost_model()
    jobs = [(0.0, 1024, 2, slack)] + [(0.0, 512, 2, slack)] * 3
    return cost, _trace(cost, jobs)


def test_tight_on_a_mixed_batch_built_to_be_tight():
    # The best batch for both shapes is {1024², 512² × 3}: ρ = 0.6 for each, so the split
    # charges exactly its 4.2 s. All four on time need 4 encodes, 2 such steps and 4
    # decodes: 0.2 + 8.4 + 0.2 · (1.048576 + 3 × 0.262144) = 8.96700 s.
    need = 4 * ENCODE + 2 * 4.2 + decode_s(1024) + 3 * decode_s(512)
    cost, trace = _tight_case(need + 1e-6)
    assert min_misses(trace, cost, work="proportional") == 0 == best_schedule(trace, cost)
    cost, trace = _tight_case(need - 0.01)
    assert min_misses(trace, cost, work="proportional") == 1 == best_schedule(trace, cost)
    # The equal split credits the 1024² a quarter of that step and forbids nothing here;
    # the larger of the two is the proportional one.
    assert min_misses(trace, cost, work="profile") == 0
    assert min_misses_packed(trace, cost) == 1


def test_tight_on_identical_requests_and_tail_limits():
    # Four 512² at 0, 2 steps: packed by four, 4 encodes + 2 × 2.4 + 4 decodes = 5.2097 s.
    cost = cost_model()
    need = 4 * ENCODE + 2 * 2.4 + 4 * decode_s(512)
    for slack, misses in ((need + 1e-6, 0), (need - 0.01, 1)):
        trace = _trace(cost, [(0.0, 512, 2, slack)] * 4)
        assert min_misses(trace, cost, work="proportional") == misses
        assert best_schedule(trace, cost) == misses
    # With every flow ≤ need − 0.01 except one exempt: the others must finish by then, the
    # exempt one may run late (1 miss, as the brute force).
    trace = _trace(cost, [(0.0, 512, 2, 100.0)] * 4)
    tail = need - 0.01
    assert min_misses_tail([trace], cost, 100.0, tail, 1, work="proportional") == 0
    assert best_schedule(trace, cost, 100.0, tail, 1) == 0
    with pytest.raises(ValueError, match="no schedule keeps"):
        min_misses_tail([trace], cost, 100.0, tail, 0, work="proportional")
    assert best_schedule(trace, cost, 100.0, tail, 0) is None


@pytest.mark.parametrize("seed", [21, 22, 23])
def test_no_policy_beats_the_proportional_bound_with_batching(seed):
    cost = cost_model()
    rng = random.Random(seed)
    trace = [req(f"t{seed}-{i}", rng.uniform(0, 40), size=rng.choice([512, 512, 1024]),
                 steps=rng.choice([1, 2, 6]), cost=cost, scale=rng.choice([1.2, 2.0, 3.0]))
             for i in range(40)]
    bound = min_misses(trace, cost, work="proportional")
    batched = 0
    for policy in ("fifo", "srtf", "slo"):
        result = simulate(trace, make_policy(policy, cost))
        batched += sum(n for b, n in result.batch_sizes.items() if b > 1)
        assert sum(not r.met for r in result.records) >= bound, policy
    assert batched > 0  # some policy packed steps: the bound held against packing
    assert clairvoyant_misses(trace, cost) >= bound


def test_clairvoyant_flows_by_hand():
    cost = table_cost()  # a 512² step costs 1 s, no encode or decode
    # a (4 s, due 10) and b (1 s from 1, due 2.5): EDF runs a, b, a: flows 5 and 1.
    trace = [req("a", 0.0, steps=4, slo_ms=10_000, cost=cost),
             req("b", 1.0, steps=1, slo_ms=1_500, cost=cost)]
    assert clairvoyant_flows(trace, cost) == pytest.approx([5.0, 1.0])
    # c (3 s, due 3) and d (1 s from 0.5, due 1.5): c must be set aside; it runs before d
    # arrives and after d: flows 4 and 1, one miss.
    trace = [req("c", 0.0, steps=3, slo_ms=3_000, cost=cost),
             req("d", 0.5, steps=1, slo_ms=1_000, cost=cost)]
    assert clairvoyant_misses(trace, cost) == 1
    assert clairvoyant_flows(trace, cost) == pytest.approx([4.0, 1.0])


@pytest.mark.parametrize("seed", [31, 32])
def test_clairvoyant_flows_keep_the_kept_deadlines(seed):
    cost = cost_model()
    rng = random.Random(seed)
    trace = [req(f"f{seed}-{i}", rng.uniform(0, 30), size=rng.choice([512, 1024]),
                 steps=rng.choice([1, 3]), cost=cost, scale=rng.choice([1.5, 3.0]))
             for i in range(30)]
    flows = clairvoyant_flows(trace, cost)
    late = sum(r.arrival + f > r.deadline + 1e-9 for r, f in zip(trace, flows, strict=True))
    assert late == clairvoyant_misses(trace, cost)
    # no request finishes sooner than its own batch-1 time after its arrival
    assert all(f >= r.standalone_s - 1e-9 for r, f in zip(trace, flows, strict=True))


def test_the_equal_split_is_the_tighter_rule_on_h200_flops():
    cost = CostModel.load("h200")
    n = 16384  # 2048²; a 512² far later makes 1,024-token partners possible
    alone = cost.step_time("qwen-image", [n])
    eq = cost.profile_step_share("qwen-image", n, 1024, n) / alone
    prop = packed_step_ratio(cost, "qwen-image", n, [1024, n])
    assert prop < eq < 1  # the FLOPs split charges a large member more than the proportional
    probe = req("p", size=2048, steps=28, cost=cost)
    fixed = cost.encode_time(probe) + cost.decode_time(probe)
    slack = 4 * fixed + 4 * 28 * alone * (eq + prop) / 2  # between the two works of four
    trace = [req(f"b{i}", 0.0, size=2048, steps=28, slo_ms=1000 * slack, cost=cost)
             for i in range(4)] + [req("s", 5000.0, size=512, steps=28, cost=cost)]
    assert min_misses(trace, cost, work="proportional") == 0
    assert min_misses(trace, cost, work="profile") == 1
    assert min_misses_packed(trace, cost) == 1
