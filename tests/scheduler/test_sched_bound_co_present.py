"""The co-present packing credit (``tail_bound.co_present_works``, ``work="co-present"`` and
``"co-present-proportional"``): a request's steps can only be packed with requests present
at the same time. Checked by hand (no credit for partners that are never present, the full
credit for those that are, the miss budget that makes a lingering partner cost a miss),
against the brute-force optimum over packed schedules on tiny traces, against fifo, slo and
srtf runs that pack (noise off) under their own tail limits, and against the trace-wide
rules it tightens (never looser than ``"profile"`` / ``"proportional"``)."""

import dataclasses
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sched_factories import req, table_cost
from test_sched_bound_packed import JOBS, _trace, best_schedule
from test_sched_bound_packed import cost_model as mixed_cost

from ditmem.scheduler import make_policy
from ditmem.scheduler.bound import trace_work
from ditmem.scheduler.metrics import percentile
from ditmem.scheduler.simulator import simulate
from ditmem.scheduler.tail_bound import (
    CO_PRESENT_SPLITS,
    co_present_works,
    min_misses_tail,
    min_misses_within,
)

# A 512² step costs 1.0 s alone and 1.5 s as a pair (0.75 a member under either split);
# batches hold two. No encode or decode: a request's work is steps × its per-step charge.
PAIR = [{"tokens": 1024, "batch": 2, "seconds": 1.5}]
KINDS = tuple(CO_PRESENT_SPLITS)


def pair_cost():
    return table_cost(batch_points=PAIR, max_batch=2)


@pytest.mark.parametrize("work", KINDS)
def test_never_co_present_gets_no_credit_and_co_present_does(work):
    cost = pair_cost()
    # 2 steps each; flows capped at 10 s: [0, 10] and [100, 110] never meet.
    apart = [req("a", 0.0, steps=2, slo_ms=3000, cost=cost),
             req("b", 100.0, steps=2, slo_ms=3000, cost=cost)]
    got = co_present_works(apart, cost, work, 10.0, 10.0, 0)
    assert got.on_time == got.tail == got.max == pytest.approx([2.0, 2.0])  # batch-1 times
    # the trace-wide rules credit both with the pair they can never form
    assert trace_work(apart, cost, "proportional")(apart[0]) == pytest.approx(1.5)
    assert trace_work(apart, cost, "profile")(apart[0]) == pytest.approx(1.5)
    # b arriving at 1 s can share a's steps: 2 × 0.75 s each
    near = [apart[0], req("b", 1.0, steps=2, slo_ms=3000, cost=cost)]
    got = co_present_works(near, cost, work, 10.0, 10.0, 0)
    assert got.on_time == got.tail == got.max == pytest.approx([1.5, 1.5])


@pytest.mark.parametrize("work", KINDS)
def test_a_lone_urgent_request_misses_under_the_co_present_bound(work):
    """x (2 steps, due 1.6 s after arrival at 0) fits only if packed (2 × 0.75 = 1.5 s);
    the only other request arrives at 30 s and every flow is capped at 10 s, so no
    schedule packs x: 1 miss (brute force), which the trace-wide rules cannot see."""
    cost = pair_cost()
    trace = [req("x", 0.0, steps=2, slo_ms=1600, cost=cost),
             req("z", 30.0, steps=2, slo_ms=30_000, cost=cost)]
    assert best_schedule(trace, cost, 10.0, 10.0, 0) == 1
    assert min_misses_tail([trace], cost, 10.0, 10.0, 0, work=work) == 1
    assert min_misses_tail([trace], cost, 10.0, 10.0, 0, work="proportional") == 0
    assert min_misses_tail([trace], cost, 10.0, 10.0, 0, work="profile") == 0
    # with every flow allowed 40 s, z may be packed with x (z arrives before x's 40-s limit,
    # but only after x's deadline: x on time still has no partner — 1 miss)
    assert min_misses_tail([trace], cost, 40.0, 40.0, 0, work=work) == 1


@pytest.mark.parametrize("work", KINDS)
def test_the_miss_budget_by_hand(work):
    """z (at 0, 2 steps, due 2.5 s) and x (at 2.6 s, 2 steps, due 1.6 s later); flows ≤ 10 s,
    none exempt. x is on time only when packed with z, and z is present after 2.6 s only
    if it is late: either way one miss (brute force). Without the budget z's tight end is
    its 10-s tail limit, so x may be packed and nothing is forced; with a budget of 0 misses
    z ends by its deadline, x has no partner and misses (contradiction); with 1, z may
    linger: the least consistent count is 1."""
    cost = pair_cost()
    z = req("z", 0.0, steps=2, slo_ms=2500, cost=cost)
    x = req("x", 2.6, steps=2, slo_ms=1600, cost=cost)
    trace = [z, x]
    assert best_schedule(trace, cost, 10.0, 10.0, 0) == 1
    assert co_present_works(trace, cost, work, 10.0, 10.0, 0).on_time == pytest.approx([2, 1.5])
    assert co_present_works(trace, cost, work, 10.0, 10.0, 0, 0).on_time == pytest.approx([2, 2])
    assert co_present_works(trace, cost, work, 10.0, 10.0, 0, 1).on_time == pytest.approx(
        [2, 1.5])
    assert min_misses_tail([trace], cost, 10.0, 10.0, 0, work=work) == 1
    assert min_misses_tail([trace], cost, 10.0, 10.0, 0, work="proportional") == 0
    # With one flow allowed above 10 s (up to 20 s), the union budget e + m lets z linger
    # as the exempt one without a miss being counted (lingering past 2.5 s is a miss all
    # the same): the bound drops to 0 while the optimum stays 1 — sound, looser.
    assert best_schedule(trace, cost, 20.0, 10.0, 1) == 1
    assert min_misses_tail([trace], cost, 20.0, 10.0, 1, work=work) == 0


def test_bad_arguments_are_refused():
    cost = pair_cost()
    trace = [req("a", 0.0, steps=2, slo_ms=3000, cost=cost)]
    with pytest.raises(ValueError, match="work must be one of"):
        co_present_works(trace, cost, "profile", 10.0, 10.0, 0)
    with pytest.raises(ValueError, match="tail_flow <= max_flow"):
        co_present_works(trace, cost, "co-present", 5.0, 10.0, 0)
    with pytest.raises(ValueError, match="exempt and misses"):
        co_present_works(trace, cost, "co-present", 10.0, 10.0, 0, -1)
    with pytest.raises(ValueError, match="min_misses_tail only"):
        min_misses_within(trace, cost, 10.0, work="co-present")


# ---- never above the brute-force optimum over packed schedules (tiny traces) -------------


@settings(max_examples=40, deadline=None)
@given(JOBS, st.sampled_from([3.0, 5.0, 8.0]), st.sampled_from([1.0, 1.5, math.inf]),
       st.integers(0, 2), st.sampled_from(KINDS))
def test_never_above_the_brute_force_optimum(jobs, tail_flow, stretch, exempt, work):
    cost = mixed_cost()  # mixed 512²/1024² batches of up to four, encodes and tiled decodes
    trace = _trace(cost, jobs)
    max_flow = tail_flow * stretch
    best = best_schedule(trace, cost, max_flow, tail_flow, exempt)
    try:
        bound = min_misses_tail([trace], cost, max_flow, tail_flow, exempt, work=work)
    except ValueError:
        assert best is None  # the bound says no schedule keeps the limits: none does
        return
    if best is not None:
        assert bound <= best


# ---- never beaten by a policy that packs, under its own tail limits ---------------------


def _runs(cost, trace):
    """fifo, slo and srtf on ``trace`` (noise off; the simulator packs by default)."""
    for name in ("fifo", "slo", "srtf"):
        yield name, simulate([dataclasses.replace(r) for r in trace], make_policy(name, cost))


def _check_runs(cost, trace, q):
    """Each run's misses against the bound with its own limits: P_q as the tail (its
    flows above it exempt) and its maximum, or no maximum. Returns the packed steps run."""
    packed = 0
    for name, res in _runs(cost, trace):
        packed += sum(n for b, n in res.batch_sizes.items() if b > 1)
        flows = [r.finished - r.request.arrival for r in res.records]
        tail = percentile(flows, q)
        above = sum(f > tail + 1e-9 for f in flows)
        missed = sum(not r.met for r in res.records)
        for top in (max(flows), math.inf):
            for work in KINDS:
                bound = min_misses_tail([trace], cost, top, tail, above, work=work)
                assert bound <= missed, (name, work, top, bound, missed)
    return packed


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1.5), st.sampled_from([512, 512, 1024]),
                          st.integers(1, 4), st.sampled_from([1.2, 2.0, 3.0])),
                min_size=2, max_size=14),
       st.sampled_from([50.0, 90.0]))
def test_never_beaten_by_a_packing_policy(gaps, q):
    cost = mixed_cost()
    trace, t = [], 0.0
    for k, (gap, size, steps, scale) in enumerate(gaps):
        t += gap
        trace.append(req(f"r{k}", t, size=size, steps=steps, scale=scale, cost=cost))
    _check_runs(cost, trace, q)


@pytest.mark.parametrize("seed", [31, 32])
def test_never_beaten_on_longer_traces_where_the_policies_pack(seed):
    cost = mixed_cost()
    rng = random.Random(seed)
    trace, t = [], 0.0
    for k in range(40):
        t += rng.expovariate(1 / 0.9)
        trace.append(req(f"s{seed}-{k}", t, size=rng.choice([512, 512, 1024]),
                         steps=rng.choice([1, 2, 4]), scale=rng.choice([1.5, 2.0, 3.0]),
                         cost=cost))
    assert _check_runs(cost, trace, 90.0) > 0  # the bound held against packed steps


# ---- never looser than the trace-wide rule of the same split ----------------------------


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 30), st.sampled_from([512, 1024]), st.integers(1, 5),
                          st.sampled_from([1.2, 2.0, 3.0])), min_size=1, max_size=25),
       st.floats(4.0, 30.0), st.sampled_from([1.0, 2.0, math.inf]), st.integers(0, 3))
def test_never_looser_than_the_trace_wide_rule(jobs, tail_flow, stretch, exempt):
    cost = mixed_cost()
    trace = [req(f"r{k}", a, size=size, steps=steps, scale=scale, cost=cost)
             for k, (a, size, steps, scale) in enumerate(jobs)]
    max_flow = tail_flow * stretch
    for work, base in (("co-present", "profile"), ("co-present-proportional", "proportional")):
        wide = trace_work(trace, cost, base)
        got = co_present_works(trace, cost, work, max_flow, tail_flow, exempt)
        for ws in (got.on_time, got.tail, got.max):
            assert all(w >= wide(r) - 1e-12 for w, r in zip(ws, trace, strict=True))
        try:
            loose = min_misses_tail([trace], cost, max_flow, tail_flow, exempt, work=base)
        except ValueError:
            loose = None  # infeasible already with the looser works: so with these
        try:
            tight = min_misses_tail([trace], cost, max_flow, tail_flow, exempt, work=work)
        except ValueError:
            continue  # infeasible with these works: as tight as a bound gets
        assert loose is not None and tight >= loose


@pytest.mark.parametrize(("work", "packed"), [("co-present", 2.0),
                                              ("co-present-proportional", 3.2)])
def test_mixed_shapes_share_a_step_when_co_present(work, packed):
    """A 1024² (4.0 s a step alone) beside a 512² (1.0 s): their pair costs the larger of
    the pair curve at the mean (1.5 s × 2,560 / 1,024 tokens = 3.75 s), the 1024² alone
    (4.0 s) and the pair gain on the sum (0.75 × 5 = 3.75 s) = 4.0 s — 2.0 s a member
    (equal split) or 4.0 × 4 / 5 = 3.2 s for the 1024² (proportional)."""
    cost = pair_cost()
    assert cost.step_time("qwen-image", [4096, 1024]) == pytest.approx(4.0)
    big = req("x", 0.0, size=1024, steps=1, slo_ms=9000, cost=cost)
    near = co_present_works([big, req("y", 0.5, steps=1, slo_ms=9000, cost=cost)], cost,
                            work, 10.0, 10.0, 0)
    apart = co_present_works([big, req("y", 50.0, steps=1, slo_ms=9000, cost=cost)], cost,
                             work, 10.0, 10.0, 0)
    assert near.on_time[0] == pytest.approx(packed)
    assert apart.on_time[0] == pytest.approx(4.0)
