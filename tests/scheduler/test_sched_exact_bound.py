"""``scheduler.exact_bound``: the exact fewest misses of the preemptive one-device model,
against a brute force over every late and exempt set, a hand-computed trace, and packed
schedules the simulator runs."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sched_factories import best_misses_joint, edf_feasible, poisson_trace, req, table_cost

pytest.importorskip("scipy", reason="the exact bound solves a MILP with scipy (bounds extra)")

from ditmem.scheduler import make_policy  # noqa: E402
from ditmem.scheduler.bound import clairvoyant_misses  # noqa: E402
from ditmem.scheduler.exact_bound import (  # noqa: E402
    Infeasible,
    horn_violations,
    min_misses_exact,
    min_misses_percentile,
)
from ditmem.scheduler.metrics import percentile  # noqa: E402
from ditmem.scheduler.simulator import simulate  # noqa: E402
from ditmem.scheduler.tail_bound import allowed_above  # noqa: E402

_JOBS = st.lists(st.tuples(st.floats(0, 10), st.integers(1, 5), st.sampled_from((1.2, 2.0, 3.0))),
                 min_size=1, max_size=6)


@settings(max_examples=60, deadline=None)
@given(_JOBS, st.floats(3.0, 14.0), st.sampled_from((1.0, 1.5, math.inf)), st.integers(0, 2))
def test_equals_the_brute_force_optimum(jobs, tail_flow, stretch, exempt):
    cost = table_cost()
    trace = [req(f"r{i}", a, steps=s, scale=scale, cost=cost)
             for i, (a, s, scale) in enumerate(sorted(jobs))]
    work = [r.standalone_s for r in trace]
    max_flow = tail_flow * stretch
    best = best_misses_joint(trace, work, max_flow, tail_flow, exempt)
    limits = ((tail_flow, exempt), (max_flow, 0))
    if best is None:
        with pytest.raises(ValueError, match="flow limits"):
            min_misses_exact(trace, limits=limits)
        return
    got = min_misses_exact(trace, limits=limits)
    assert got.optimal
    assert got.misses == best


@settings(max_examples=40, deadline=None)
@given(_JOBS)
def test_without_limits_it_equals_the_brute_force_and_never_beats_the_clairvoyant(jobs):
    cost = table_cost()
    trace = [req(f"r{i}", a, steps=s, scale=scale, cost=cost)
             for i, (a, s, scale) in enumerate(sorted(jobs))]
    best = best_misses_joint(trace, [r.standalone_s for r in trace], math.inf, math.inf, 0)
    got = min_misses_exact(trace).misses
    assert got == best
    assert got <= clairvoyant_misses(trace, cost)


def test_a_tail_limit_costs_one_miss_by_hand():
    """A: 4 s at 0, due 10; B: 1 s at 0, due 1.5; C: 1 s at 1, due 2.5 (1-s steps).
    Unlimited: B 0-1, C 1-2, A 2-6, none late. Every flow within 5 s: A must end by 5 and C
    by 6, and B, C and A on time need 6 s by 5: one of B, C is late (C: B 0-1, A 1-5, C 5-6).
    One exemption lets A run to 10: none late again."""
    cost = table_cost(seconds_1024=1.0)
    a = req("A", 0.0, steps=4, slo_ms=10_000, cost=cost)
    b = req("B", 0.0, steps=1, slo_ms=1_500, cost=cost)
    c = req("C", 1.0, steps=1, slo_ms=1_500, cost=cost)
    assert [r.standalone_s for r in (a, b, c)] == [4.0, 1.0, 1.0]
    assert min_misses_exact([a, b, c]).misses == 0
    assert min_misses_exact([a, b, c], limits=[(5.0, 0)]).misses == 1
    assert min_misses_exact([a, b, c], limits=[(5.0, 1)]).misses == 0
    # one exemption up to 5.5 s only: A must end by 5.5, so B, C, A need 6 s by 5.5
    assert min_misses_exact([a, b, c], limits=[(5.0, 1), (5.5, 0)]).misses == 1
    with pytest.raises(Infeasible, match="flow limits"):  # B and A by 4.5: 5 s of work
        min_misses_exact([a, b], limits=[(4.5, 0)])


def test_horn_violations_name_the_overloaded_interval():
    """Two 2-s jobs released at 1, both due at 4: [1, 4] holds 4 s of work in 3 s."""
    import numpy as np

    arrival, work, due = np.array([0.0, 1.0, 1.0]), np.array([1.0, 2.0, 2.0]), np.array(
        [9.0, 4.0, 4.0])
    assert horn_violations(arrival, work, due)[0] == (1.0, 4.0)
    assert horn_violations(arrival, np.array([1.0, 1.5, 1.5]), due) == []


def test_the_packed_bound_is_never_beaten_by_a_policy_that_packs():
    """co-present works: no simulated schedule (exact timings, packed steps) misses fewer,
    and none that keeps every flow within fifo's maximum misses fewer than the bound with
    that limit."""
    points = [{"tokens": 1024, "batch": b, "seconds": s} for b, s in ((2, 1.3), (4, 2.0))]
    cost = table_cost(encode_s=0.05, decode_s_per_mp=0.2, batch_points=points)
    rng = random.Random(3)
    for trial in range(5):
        trace = poisson_trace(rng, 40, 1.2, cost, prefix=f"t{trial}")
        bound = min_misses_exact(trace, cost, work="co-present-proportional").misses
        assert bound <= min_misses_exact(trace).misses  # packing can only help
        fifo = simulate(trace, make_policy("fifo", cost))
        worst = max(r.finished - r.request.arrival for r in fifo.records)
        within = min_misses_exact(trace, cost, work="co-present-proportional",
                                  limits=[(worst, 0)]).misses
        assert within >= bound
        for name, opts in (("fifo", {}), ("slo", {}), ("slo", {"tail": "fifo"}), ("srtf", {})):
            res = fifo if name == "fifo" else simulate(trace, make_policy(name, cost, **opts))
            missed = sum(not r.met for r in res.records)
            assert bound <= missed, (trial, name, bound, missed)
            if max(r.finished - r.request.arrival for r in res.records) <= worst + 1e-9:
                assert within <= missed, (trial, name, within, missed)


def test_bad_arguments_are_refused():
    cost = table_cost()
    r = req("r", 0.0, cost=cost)
    with pytest.raises(ValueError, match="work"):
        min_misses_exact([r], work="fast")
    with pytest.raises(ValueError, match="flow must be > 0"):
        min_misses_exact([r], limits=[(0.0, 1)])
    with pytest.raises(ValueError, match="count must be an integer"):
        min_misses_exact([r], limits=[(5.0, -1)])
    with pytest.raises(ValueError, match="time_limit_s"):
        min_misses_exact([r], time_limit_s=0)
    with pytest.raises(ValueError, match="cost model"):
        min_misses_exact([r], work="co-present")
    with pytest.raises(ValueError, match="deadline"):
        min_misses_exact([req("bare", 0.0)])
    assert min_misses_exact([]).misses == 0


def _tier_brute_force(trace, limits):
    """Fewest misses keeping ``limits`` ((T, e): at most e flows above T), brute force over
    each request's on-time flag and tier (flows cut at the thresholds)."""
    import itertools

    cuts = sorted({t for t, _ in limits})
    uppers = [*cuts, math.inf]
    n = len(trace)
    best = None
    for late in itertools.product((False, True), repeat=n):
        misses = sum(late)
        if best is not None and misses >= best:
            continue
        for tiers in itertools.product(range(len(uppers)), repeat=n):
            if any(sum(uppers[k - 1] >= t if k else False for k in tiers) > e
                   for t, e in limits):
                continue
            jobs = []
            for r, is_late, k in zip(trace, late, tiers, strict=True):
                end = r.arrival + uppers[k]
                jobs.append((r.arrival, end if is_late else min(r.deadline, end),
                             r.standalone_s))
            if edf_feasible(jobs):
                best = misses
                break
    return best


@settings(max_examples=20, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 8), st.integers(1, 4), st.sampled_from((1.2, 2.0, 3.0))),
                min_size=1, max_size=5),
       st.floats(2.0, 8.0), st.floats(1.1, 2.0), st.integers(1, 2))
def test_two_tiers_equal_the_brute_force(jobs, low, stretch, count):
    cost = table_cost()
    trace = [req(f"r{i}", a, steps=s, scale=scale, cost=cost)
             for i, (a, s, scale) in enumerate(sorted(jobs))]
    limits = [(low, count), (low * stretch, count - 1)]
    best = _tier_brute_force(trace, limits)
    if best is None:
        with pytest.raises(ValueError, match="flow limits"):
            min_misses_exact(trace, limits=limits)
        return
    assert min_misses_exact(trace, limits=limits).misses == best


def test_the_percentile_bound_holds_for_simulated_schedules():
    """Any schedule whose P90 is at most its own P90 misses at least ``lower``; the cells are
    never looser than the one necessary count; the reached schedule is never below it."""
    cost = table_cost(encode_s=0.05, decode_s_per_mp=0.2)
    rng = random.Random(5)
    for trial in range(4):
        trace = poisson_trace(rng, 20, 1.3, cost, prefix=f"p{trial}", max_steps=5,
                              priorities=False)
        for name in ("fifo", "srtf", "slo"):
            res = simulate(trace, make_policy(name, cost))
            flows = [r.finished - r.request.arrival for r in res.records]
            value = percentile(flows, 90)
            got = min_misses_percentile(trace, q=90, value=value, cells=4)
            missed = sum(not r.met for r in res.records)
            assert got.lower <= missed, (trial, name)
            assert got.upper is None or got.upper >= got.lower
            single = min_misses_exact(trace, limits=[(value, allowed_above(len(trace), 90))])
            assert got.lower >= single.misses


def test_percentile_arguments_are_refused():
    r = req("r", 0.0, cost=table_cost())
    with pytest.raises(ValueError, match="q must be"):
        min_misses_percentile([r], q=120, value=1.0)
    with pytest.raises(ValueError, match="value must be"):
        min_misses_percentile([r], q=99, value=0.0)
    with pytest.raises(ValueError, match="cells"):
        min_misses_percentile([r], q=99, value=1.0, cells=0)
