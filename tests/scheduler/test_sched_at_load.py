"""``workloads.trace_load`` and ``workloads.at_load``: a trace's own load, and its arrivals
scaled to an exact load — hand-computed (512² of 2 steps: 2 s each alone on the table
profile, no encode or decode)."""

import pytest
from sched_factories import req, table_cost

from ditmem.scheduler.workloads import at_load, trace_load, with_load, workload


def _trace(cost, times):
    return [cost.assign_deadline(req(f"r{k}", t, size=512, steps=2, cost=cost))
            for k, t in enumerate(times)]


def test_the_load_of_a_trace_is_its_arrival_rate_times_its_mean_standalone_time():
    cost = table_cost(encode_s=0.0, decode_s_per_mp=0.0)
    trace = _trace(cost, [5.0, 7.0, 13.0])  # 2 gaps over 8 s: 0.25 arrivals/s, 2 s each
    assert trace_load(trace, cost) == pytest.approx(0.5)
    assert trace_load(trace, cost, devices=2) == pytest.approx(0.25)


def test_arrivals_are_scaled_about_the_first_and_deadlines_follow():
    cost = table_cost(encode_s=0.0, decode_s_per_mp=0.0)
    trace = _trace(cost, [5.0, 7.0, 13.0])
    out = at_load(trace, cost, 0.8)  # 0.5 → 0.8: gaps × 0.625
    assert [r.arrival for r in out] == pytest.approx([5.0, 6.25, 10.0])
    assert [r.deadline - r.arrival for r in out] == pytest.approx([6.0] * 3)  # 3 × 2 s
    assert trace_load(out, cost) == pytest.approx(0.8)
    assert [r.arrival for r in trace] == [5.0, 7.0, 13.0]  # copies: the input is untouched
    assert [r.id for r in out] == ["r0", "r1", "r2"]


def test_a_short_poisson_sample_lands_at_the_load_it_is_named_for():
    """The demos' trace (seed-mix, 150 requests, seed 0, drawn at 0.8) arrives at ~0.72 as
    drawn; scaled it is at 0.8, with the same order and mix."""
    cost = table_cost()
    reqs = workload("seed-mix", cost, load=0.8, requests=150, seed=0, scale="cpu")
    drawn = with_load(reqs, cost, 0.8, seed=0)
    assert abs(trace_load(drawn, cost) - 0.8) > 0.04
    exact = at_load(drawn, cost, 0.8)
    assert trace_load(exact, cost) == pytest.approx(0.8)
    assert [r.id for r in exact] == [r.id for r in drawn]


def test_bad_input_is_named():
    cost = table_cost()
    with pytest.raises(ValueError, match="load must be > 0"):
        at_load(_trace(cost, [0.0, 1.0]), cost, 0.0)
    with pytest.raises(ValueError, match="2 requests or more"):
        trace_load(_trace(cost, [0.0]), cost)
    with pytest.raises(ValueError, match="all arrive at once"):
        trace_load(_trace(cost, [1.0, 1.0]), cost)
