"""``scheduler.exact_bound``: the exact fewest misses of the preemptive one-device model,
against a brute force over every late and exempt set, a hand-computed trace, and packed
schedules the simulator runs."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sched_factories import best_misses_joint, req, table_cost

pytest.importorskip("scipy", reason="the exact bound solves a MILP with scipy (bounds extra)")

from ditmem.scheduler import make_policy  # noqa: E402
from ditmem.scheduler.bound import clairvoyant_misses  # noqa: E402
from ditmem.scheduler.exact_bound import horn_violations, min_misses_exact  # noqa: E402
from ditmem.scheduler.simulator import simulate  # noqa: E402

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
    if best is None:
        with pytest.raises(ValueError, match="flow limits"):
            min_misses_exact(trace, tail_flow=tail_flow, exempt=exempt, max_flow=max_flow)
        return
    got = min_misses_exact(trace, tail_flow=tail_flow, exempt=exempt, max_flow=max_flow)
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
    assert min_misses_exact([a, b, c], tail_flow=5.0).misses == 1
    assert min_misses_exact([a, b, c], tail_flow=5.0, exempt=1).misses == 0
    with pytest.raises(ValueError, match="flow limits"):  # B and A by 4.5: 5 s of work
        min_misses_exact([a, b], tail_flow=4.5, max_flow=4.5)


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
        trace, t = [], 0.0
        for i in range(40):
            t += rng.expovariate(1 / 1.2)
            trace.append(req(f"t{trial}-{i}", t, size=rng.choice((512, 512, 1024)),
                             steps=rng.randint(1, 6), priority=rng.choice((0, 1, 2)),
                             scale=rng.choice((1.5, 3.0)), cost=cost))
        bound = min_misses_exact(trace, cost, work="co-present-proportional").misses
        assert bound <= min_misses_exact(trace).misses  # packing can only help
        fifo = simulate(trace, make_policy("fifo", cost))
        worst = max(r.finished - r.request.arrival for r in fifo.records)
        within = min_misses_exact(trace, cost, work="co-present-proportional",
                                  tail_flow=worst, max_flow=worst).misses
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
    with pytest.raises(ValueError, match="tail_flow"):
        min_misses_exact([r], tail_flow=0.0)
    with pytest.raises(ValueError, match="tail_flow <= max_flow"):
        min_misses_exact([r], tail_flow=5.0, max_flow=4.0)
    with pytest.raises(ValueError, match="exempt"):
        min_misses_exact([r], exempt=-1)
    with pytest.raises(ValueError, match="cost model"):
        min_misses_exact([r], work="co-present")
    with pytest.raises(ValueError, match="deadline"):
        min_misses_exact([req("bare", 0.0)])
    assert min_misses_exact([]).misses == 0
